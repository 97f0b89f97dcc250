//! The traffic paths, one module each, and the helpers they share. Every
//! path takes an accepted connection and a core ([`crate::core`]), decides
//! from the core's snapshot, and moves bytes with the I/O layer below.
//!
//! - [`accept`]: each listener's accept loop, and the dispatch to a path.
//! - [`outbound`] (15001): captured pod egress, direct or over HBONE.
//! - [`fast_path`]: HBONE to a workload of this node, served in-process.
//! - [`inbound`] (15008): HBONE tunnels into local workloads.
//! - [`inbound_passthrough`] (15006): captured plaintext into local
//!   workloads.
//! - [`socks5`] (15080, off by default): a SOCKS5 front door into the
//!   outbound path.
//! - [`dns`] (15053, when on): the DNS proxy's UDP and TCP sockets, mesh
//!   answers and forwarding upstream.
//! - [`downstream`]: what a client hears of its upstream; refusals and
//!   bounded replies.
//! - [`direct`]: a plain TCP upstream, copied with splice.

pub mod accept;
pub mod direct;
pub mod dns;
pub mod downstream;
pub mod fast_path;
#[doc(hidden)]
pub mod fuzzing;
pub mod inbound;
pub mod inbound_passthrough;
pub mod outbound;
pub mod socks5;
