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
}
