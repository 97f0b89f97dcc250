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
//! - [`forward`]: the upstream resolvers, the table of forwarded queries in
//!   flight and which upstream replies are taken.
//! - `fuzzing` (hidden): the fuzz harness over all of the above, for
//!   `fuzz/` and the corpus replay test.
//!
//! Where the work runs: on the cores (`proxy::dns`). Answers read the mesh
//! snapshot, which every core already holds lock-free, so each core has
//! its own UDP and TCP sockets on the DNS address (`SO_REUSEPORT`) and
//! answers on the core that received the query; forwarded queries leave
//! from the same core's own upstream socket, with no hop to another
//! thread.

pub mod answer;
pub mod forward;
#[doc(hidden)]
pub mod fuzzing;
pub mod message;
pub mod names;

use std::net::SocketAddr;
use std::time::Duration;

/// The DNS proxy's settings, as every core gets them.
#[derive(Debug, Clone)]
pub struct DnsProxySettings {
    /// What changes the mesh's answers.
    pub answers: answer::DnsSettings,
    /// Where names the mesh does not answer go, asked in order.
    pub upstreams: Vec<SocketAddr>,
    /// How long a forwarded query waits for its upstream (then SERVFAIL).
    pub timeout: Duration,
    /// Forwarded queries in flight per core; more get SERVFAIL at once.
    pub max_pending: usize,
    /// TCP clients per core; more are closed at once.
    pub max_tcp_connections: usize,
    /// A TCP client that sends no query for this long is closed.
    pub tcp_idle_timeout: Duration,
}

impl Default for DnsProxySettings {
    fn default() -> Self {
        DnsProxySettings {
            answers: answer::DnsSettings::default(),
            upstreams: Vec::new(),
            timeout: forward::DEFAULT_TIMEOUT,
            max_pending: forward::DEFAULT_MAX_PENDING,
            max_tcp_connections: 1024,
            tcp_idle_timeout: Duration::from_secs(10),
        }
    }
}
