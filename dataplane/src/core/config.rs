//! What every core needs to know, fixed at startup: built by the command
//! line (`app::cli`) from the flags, each part in the settings type of the
//! layer that uses it.

use std::time::Duration;

use ringway_controlplane::model::WorkloadName;

use crate::dns::DnsProxySettings;
use crate::hbone::liveness::ServerTimeouts;
use crate::hbone::pool::PoolConfig;
use crate::hbone::H2Settings;
use crate::io::copy::CopyMode;
use crate::io::listener::TrafficPath;
use crate::io::socket::ConnectOpts;
use crate::io::uring::RingConfig;

/// What every core needs to know, fixed at startup.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub copy_mode: CopyMode,
    /// Passthrough pairs go to the in-kernel redirect first.
    pub sockmap_redirect: bool,
    /// The core's ring: I/O mode, receive buffers, per-socket caps.
    pub ring: RingConfig,
    pub connect: ConnectOpts,
    pub drain_timeout: Duration,
    pub network: String,
    pub h2: H2Settings,
    pub pool: PoolConfig,
    pub handshake_timeout: Duration,
    /// Inbound HBONE connections' keepalive and idle bounds.
    pub hbone_server: ServerTimeouts,
    /// A proxied connection (passthrough, tunnel, SOCKS5) that moves no
    /// byte either way for this long is closed (`--idle-timeout`); None:
    /// never, as ztunnel.
    pub idle_timeout: Option<Duration>,
    pub on_demand_timeout: Duration,
    pub cert_wait_timeout: Duration,
    /// Inbound serves only workloads on this node (None: every workload).
    pub node_name: Option<String>,
    /// Outbound from unknown sources may leave as plain TCP.
    pub allow_unknown_source: bool,
    /// Dedicated mode: the one workload outbound connections speak for.
    pub proxy_workload: Option<WorkloadName>,
    /// Inbound connections to applications leave from the client's address.
    pub orig_src: bool,
    /// HBONE to a workload of this node is served in-process.
    pub fast_path: bool,
    /// The DNS proxy, when it serves.
    pub dns: Option<DnsProxySettings>,
    /// Inbound HBONE answers carry the destination's `baggage` (ztunnel's
    /// `ENABLE_RESPONSE_BAGGAGE`): off, peers learn nothing of it.
    pub response_baggage: bool,
    /// Inbound HBONE: dials in flight per connection and per core, and
    /// early resets before GOAWAY.
    pub dials: crate::core::limits::DialLimits,
    /// Per-core caps on accepted connections (`app` derives the total
    /// from RLIMIT_NOFILE once it is raised).
    pub conn_caps: ConnCaps,
    /// Bytes a core may hold for inbound HBONE peers before their heaviest
    /// connections stop reading (`core::memory`); 0: no budget.
    pub memory_budget: u64,
}

/// Per-core caps on accepted connections, so that one peer's flood cannot
/// take the whole fd table (which upstream dials, pipes, the control
/// channels and the side ports share). 0: no cap of its own (the total
/// still applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnCaps {
    pub total: usize,
    pub outbound: usize,
    pub inbound_passthrough: usize,
    pub inbound: usize,
    pub socks5: usize,
    /// Connections one peer address may hold per core over the inbound
    /// paths (15006, 15008) together, so that one peer cannot fill a cap that every other
    /// peer then waits behind. 0: none.
    pub per_peer: usize,
}

/// Descriptors an accepted connection may hold: its socket, its upstream
/// and a splice pipe (two fds).
pub const FDS_PER_CONNECTION: u64 = 4;

/// Descriptors kept out of the connection budget: rings, listeners, the
/// control thread's channels (xDS, CA), the side ports 15000/15020/15021
/// and their clients, log files.
pub const FD_RESERVE: u64 = 256;

impl ConnCaps {
    /// The cap on `path`'s listeners (the total when it has none of its
    /// own, or a larger one).
    pub fn of(&self, path: TrafficPath) -> usize {
        let own = match path {
            TrafficPath::Outbound => self.outbound,
            TrafficPath::InboundPassthrough => self.inbound_passthrough,
            TrafficPath::Inbound => self.inbound,
            TrafficPath::Socks5 => self.socks5,
        };
        match (own, self.total) {
            (0, t) => t,
            (o, 0) => o,
            (o, t) => o.min(t),
        }
    }

    /// The per-peer cap on `path` (0: none): inbound paths only; outbound
    /// sources are this node's own pods (in-pod mode, all one address).
    pub fn of_peer(&self, path: TrafficPath) -> usize {
        match path {
            TrafficPath::Inbound | TrafficPath::InboundPassthrough => self.per_peer,
            TrafficPath::Outbound | TrafficPath::Socks5 => 0,
        }
    }

    /// The default total per core: what `nofile` leaves after the reserve,
    /// shared by `cores`, at [`FDS_PER_CONNECTION`] each; at least 16.
    pub fn default_total(nofile: u64, cores: usize) -> usize {
        let per_core =
            nofile.saturating_sub(FD_RESERVE) / (cores.max(1) as u64 * FDS_PER_CONNECTION);
        per_core.clamp(16, usize::MAX as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_total_leaves_the_reserve_and_shares_the_rest() {
        // A container's 1024: (1024 - 256) / (4 x 2 cores).
        assert_eq!(ConnCaps::default_total(1024, 2), 96);
        assert_eq!(ConnCaps::default_total(100, 4), 16);
        assert_eq!(ConnCaps::default_total(1 << 20, 8), ((1 << 20) - 256) / 32);
        let caps = ConnCaps {
            total: 96,
            inbound: 40,
            socks5: 200,
            ..ConnCaps::default()
        };
        assert_eq!(caps.of(TrafficPath::Inbound), 40);
        assert_eq!(caps.of(TrafficPath::Socks5), 96);
        assert_eq!(caps.of(TrafficPath::Outbound), 96);
    }
}
