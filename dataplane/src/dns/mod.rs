//! The DNS proxy's decisions and wire format, with no sockets (issue 23).
//!
//! istio-cni sends an enrolled pod's DNS (UDP and TCP port 53) to the node
//! proxy on 15053; ztunnel answers the names the mesh knows and forwards
//! the rest. This module is what ringway answers and how it reads and
//! writes the messages:
//! - [`names`]: the candidate names one question stands for (the asking
//!   pod's search domains, Kubernetes short forms, wildcards), as ztunnel
//!   builds them.
//! - [`answer`]: the decision for one question from the mesh snapshot and
//!   the asking workload: addresses, an empty answer, or "forward
//!   upstream". Pure: no I/O, no clock, no randomness.
//! - [`message`]: parsing a query (UDP datagram or TCP-framed) and building
//!   the response bytes for each outcome, truncated to what the client
//!   said it can receive, with hickory-proto.
//!
//! Where the work will run (next slice): answers read the mesh snapshot,
//! which every core already holds lock-free, so each core gets its own UDP
//! and TCP listeners on 15053 (`SO_REUSEPORT`, bound like the other
//! listeners, in-pod inside each pod's namespace) and answers on the core
//! that received the query, with no hop to another thread. Forwarded
//! queries (upstream resolvers, TCP retry on truncation, timeouts) are
//! decided later: on the cores with their own sockets, or handed to the
//! control thread.

pub mod answer;
pub mod message;
pub mod names;
