//! Command line and environment: everything an operator tunes. Parsed once
//! on the main thread; [`Args::proxy_config`] builds the settings every
//! core gets a copy of ([`ProxyConfig`]), each part in the settings type of
//! the layer that reads it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Parser, Subcommand};
use ringway_controlplane::model::WorkloadName;

use super::plan::PinMode;
use crate::core::config::{ConnCaps, ProxyConfig};
use crate::dns::answer::DnsSettings;
use crate::dns::names::ClusterDomain;
use crate::dns::DnsProxySettings;
use crate::hbone::liveness::ServerTimeouts;
use crate::hbone::pool::PoolConfig;
use crate::hbone::H2Settings;
use crate::io::copy::CopyMode;
use crate::io::socket::{ConnectOpts, KeepaliveOpts};
use crate::io::uring::{IoMode, RingConfig, SocketCaps};

/// ringway: a thread-per-core io_uring node proxy for Istio's ambient mesh.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "ringway",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: Args,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Certificates from the built-in CA.
    #[command(subcommand)]
    Cert(CertCommand),
}

#[derive(Subcommand, Debug, Clone)]
pub enum CertCommand {
    /// Mint a workload certificate (key.pem, cert.pem, cert-chain.pem,
    /// root-cert.pem) so other tools can speak HBONE to ringway.
    Issue {
        /// spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>
        spiffe_id: String,
        /// CA directory (Istio cacerts layout; created if empty).
        #[arg(long, env = "RINGWAY_CA_DIR", default_value = "ringway-ca")]
        ca_dir: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Validity.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
    },
}

/// Inbound HBONE dials in flight per core unless the fd budget is lower.
const DEFAULT_DIALS_PER_CORE: usize = 1024;

/// Flags for running the proxy.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Local config file (ztunnel LOCAL_XDS schema: workloads, services,
    /// policies). Watched: a valid edit is applied, an invalid one is logged
    /// and the last good config stays. Without it the embedded default
    /// config (examples/local.yaml) is used.
    #[arg(long, env = "RINGWAY_CONFIG")]
    pub config: Option<PathBuf>,

    /// How often the config file is checked for edits.
    #[arg(long, env = "RINGWAY_CONFIG_POLL", default_value = "1s", value_parser = parse_duration)]
    pub config_poll_interval: Duration,

    /// Cores to run on: a count ("2": the first two CPUs this process may
    /// use) or a CPU list ("0-3,6"; a single CPU is written "3-3"). One
    /// executor per entry. Default: one per CPU this process may use (its
    /// affinity mask within the cgroup cpuset), but no more than the cgroup
    /// CPU quota rounded up (cpu.max, or cpu.cfs_quota_us in cgroup v1;
    /// 1.5 CPUs → 2), the first N of them: more busy executors than the
    /// quota pays for get the container throttled. The log line "cores
    /// planned" says what was chosen and why.
    #[arg(long, env = "RINGWAY_CORES")]
    pub cores: Option<String>,

    /// Pin each executor to its CPU, whatever the CPUs look like. Pays
    /// when ringway has CPUs of its own; where it shares them with the
    /// workloads, as a DaemonSet usually does, a pinned executor waits
    /// behind whatever runs on its CPU (docs/performance/pinning.md). Default
    /// (neither --pin nor --no-pin): pinned only when the CPUs look
    /// exclusive, i.e. the affinity mask leaves out some online CPUs and
    /// the cgroup CPU quota is exactly as many whole CPUs as it allows, as
    /// Kubernetes' static CPU manager policy gives a Guaranteed pod with
    /// an integer CPU request. Where Kubernetes drops that quota
    /// (DisableCPUQuotaWithExclusiveCPUs) exclusive CPUs look like a
    /// shared pool: give --pin there.
    #[arg(long, env = "RINGWAY_PIN")]
    pub pin: bool,

    /// Never pin executors, even on CPUs that look exclusive (see --pin).
    /// Giving both is an error.
    #[arg(long, env = "RINGWAY_NO_PIN")]
    pub no_pin: bool,

    /// Outbound capture listener(s) (original destination via
    /// SO_ORIGINAL_DST). Comma-separated; port 0 picks a free port.
    #[arg(
        long,
        env = "RINGWAY_OUTBOUND_ADDR",
        default_value = "0.0.0.0:15001",
        value_delimiter = ','
    )]
    pub outbound_addr: Vec<SocketAddr>,

    /// Inbound plaintext passthrough listener(s) (SO_ORIGINAL_DST or TPROXY).
    #[arg(
        long,
        env = "RINGWAY_INBOUND_PASSTHROUGH_ADDR",
        default_value = "0.0.0.0:15006",
        value_delimiter = ','
    )]
    pub inbound_passthrough_addr: Vec<SocketAddr>,

    /// Inbound HBONE listener(s) (mTLS HTTP/2 CONNECT).
    #[arg(
        long,
        env = "RINGWAY_INBOUND_ADDR",
        default_value = "0.0.0.0:15008",
        value_delimiter = ','
    )]
    pub inbound_addr: Vec<SocketAddr>,

    /// Enable the SOCKS5 front door (RFC 1928: no-auth, CONNECT only) on
    /// 127.0.0.1:15080. Its connections take the outbound path.
    #[arg(long, env = "RINGWAY_SOCKS5")]
    pub socks5: bool,

    /// SOCKS5 listener address(es), comma-separated; implies --socks5.
    /// Anyone who can reach it can use ringway's outbound path, so keep it
    /// on loopback unless the network is trusted.
    #[arg(long, env = "RINGWAY_SOCKS5_ADDR", value_delimiter = ',')]
    pub socks5_addr: Vec<SocketAddr>,

    /// splice: zero-copy through a pipe; copy: userspace buffer. In
    /// completion I/O mode this is how bulk passthrough moves (small
    /// messages cross on the ring).
    #[arg(long, env = "RINGWAY_COPY_MODE", value_enum, default_value = "splice")]
    pub copy_mode: CopyMode,

    /// completion: sockets receive and send as io_uring operations, no
    /// system call per message; readiness: the ring reports readiness and
    /// bytes move by recv/send/splice calls (the pre-issue-22 engine).
    #[arg(
        long,
        env = "RINGWAY_IO_MODE",
        value_enum,
        default_value = "completion"
    )]
    pub io_mode: IoMode,

    /// Receive buffers per core in the ring's provided-buffer ring (a
    /// power of two, at most 32768). Shared by every connection of the core.
    #[arg(long, env = "RINGWAY_RECV_BUFFERS", default_value_t = 256, value_parser = parse_recv_buffers)]
    pub recv_buffers: u16,

    /// Size of each receive buffer.
    #[arg(long, env = "RINGWAY_RECV_BUFFER_SIZE", default_value = "32K", value_parser = parse_size)]
    pub recv_buffer_size: u32,

    /// Hand each passthrough connection to an in-kernel redirect (BPF
    /// sockmap) once it is set up, so the proxy is not woken per message;
    /// bulk and refused handoffs stay on the copy path. Needs CAP_BPF and
    /// CAP_NET_ADMIN (or CAP_SYS_ADMIN) and bpf(2) allowed by seccomp;
    /// where the kernel refuses, each core says why and copies instead.
    #[arg(long, env = "RINGWAY_SOCKMAP_REDIRECT")]
    pub sockmap_redirect: bool,

    /// Bytes one socket may hold each way in completion mode: received and
    /// not yet sent on (past it the socket stops reading, and TCP's window
    /// closes), and queued to send.
    #[arg(long, env = "RINGWAY_SOCKET_CAP", default_value = "256K", value_parser = parse_size)]
    pub socket_cap: u32,

    /// SO_MARK on ringway's outgoing sockets so capture rules can skip them
    /// (decimal or 0x hex; 0 disables).
    #[arg(long, env = "RINGWAY_MARK", default_value = "0x539", value_parser = parse_u32)]
    pub mark: u32,

    /// Upstream connect timeout.
    #[arg(long, env = "RINGWAY_CONNECT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// TCP keepalive idle time on proxied sockets before the first probe
    /// ("0s" disables keepalive). ztunnel: KEEPALIVE_TIME, KEEPALIVE_ENABLED.
    #[arg(long, env = "RINGWAY_TCP_KEEPALIVE", default_value = "180s", value_parser = parse_duration)]
    pub tcp_keepalive: Duration,

    /// Time between TCP keepalive probes. ztunnel: KEEPALIVE_INTERVAL.
    #[arg(long, env = "RINGWAY_TCP_KEEPALIVE_INTERVAL", default_value = "180s", value_parser = parse_nonzero_duration)]
    pub tcp_keepalive_interval: Duration,

    /// Unanswered keepalive probes before a connection is dropped.
    /// ztunnel: KEEPALIVE_RETRIES.
    #[arg(long, env = "RINGWAY_TCP_KEEPALIVE_RETRIES", default_value_t = 9,
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub tcp_keepalive_retries: u32,

    /// Set TCP_USER_TIMEOUT on proxied sockets to the keepalive idle time
    /// plus every probe, so data a dead peer never acknowledges fails as
    /// soon as an idle connection to it would. ztunnel: USER_TIMEOUT_ENABLED.
    #[arg(long, env = "RINGWAY_TCP_USER_TIMEOUT")]
    pub tcp_user_timeout: bool,

    /// On SIGTERM/SIGINT: stop accepting, let open connections finish for
    /// this long, then close them.
    #[arg(long, env = "RINGWAY_DRAIN_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// This node's network (workload and VIP lookups are scoped by it).
    #[arg(long, env = "NETWORK", default_value = "")]
    pub network: String,

    /// This node's name: certificates are prefetched for the workloads whose
    /// `node` matches, and only they are served inbound (HBONE and
    /// plaintext to any other address is refused). Unset: every workload in
    /// the config counts as local.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Let outbound traffic from sources that are not workloads in the
    /// config leave (plain TCP to non-mesh destinations only; HBONE still
    /// needs a source identity). Off by default, as in ztunnel: a source
    /// ringway does not know is refused, so nothing leaves the node
    /// unauthenticated by accident, e.g. before the first config arrives.
    /// For labs and benchmarks without a full mesh config.
    #[arg(long, env = "RINGWAY_ALLOW_UNKNOWN_SOURCE")]
    pub allow_unknown_source: bool,

    /// Send HBONE to workloads on this node through ringway's own 15008
    /// (TLS and a TCP hop) instead of the same-node fast path, which serves
    /// them in-process as inbound: the same authorization and logs, no TLS,
    /// one TCP hop less. For comparisons and debugging.
    #[arg(long, env = "RINGWAY_NO_FAST_PATH")]
    pub no_fast_path: bool,

    /// Let HBONE fall back to TLS 1.2 (four ECDHE AES-GCM suites) for peers
    /// that cannot speak TLS 1.3; TLS 1.3 stays preferred.
    /// ztunnel: TLS12_ENABLED=true.
    #[arg(long, env = "RINGWAY_TLS12")]
    pub tls12: bool,

    /// Do not send the destination's `baggage` (its workload, namespace,
    /// cluster) in the answer to an inbound HBONE CONNECT.
    /// ztunnel: ENABLE_RESPONSE_BAGGAGE=false.
    #[arg(long, env = "RINGWAY_NO_RESPONSE_BAGGAGE")]
    pub no_response_baggage: bool,

    /// Connect to local applications from the original client's address
    /// (the tunnel's or the plaintext connection's TCP peer, never a
    /// header a client writes), as ztunnel does, instead of from this
    /// node's (or, in-pod, the pod's own). Needs CAP_NET_ADMIN and
    /// return-path routing for the replies: istio-cni's in-pod rules carry
    /// it (`scripts/inpod-rules.sh` too), so in-pod mode defaults to on, as
    /// ztunnel's does; node-level capture needs `scripts/orig-src-rules.sh`
    /// and defaults to off. `--orig-src=false` turns it off.
    #[arg(long, env = "ENABLE_ORIG_SRC", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub orig_src: Option<bool>,

    /// Dedicated mode ("namespace/name/service-account"), like ztunnel's
    /// PROXY_MODE=dedicated with PROXY_WORKLOAD_INFO: every captured or
    /// SOCKS5 connection speaks for this one workload of the config,
    /// whatever address it comes from. Unset: the source workload is found
    /// by the connection's source address.
    #[arg(long, env = "PROXY_WORKLOAD_INFO", value_parser = parse_proxy_workload)]
    pub proxy_workload: Option<WorkloadName>,

    /// In-pod mode (ztunnel's shared mode with INPOD_ENABLED): the node
    /// agent (istio-cni) enrolls each ambient pod over ZDS and ringway
    /// listens on 15001/15006/15008 inside every enrolled pod's network
    /// namespace, on every core, instead of on the node-level capture
    /// addresses (--outbound-addr and friends are then not bound). Needs
    /// CAP_SYS_ADMIN (setns) and CAP_NET_ADMIN. See docs/inpod.md and
    /// docs/deploy.md.
    #[arg(long, env = "INPOD_ENABLED", conflicts_with = "proxy_workload")]
    pub inpod: bool,

    /// The node agent's ZDS socket (unix SOCK_SEQPACKET), shared with
    /// istio-cni by hostPath.
    #[arg(long, env = "INPOD_UDS", default_value = ringway_controlplane::sources::zds::DEFAULT_SOCKET)]
    pub inpod_uds: PathBuf,

    /// ztunnel's INPOD_PORT_REUSE: every pod's listeners are bound with
    /// SO_REUSEPORT, so that at an upgrade the next proxy (ringway or
    /// ztunnel) binds beside them and takes over without a refused
    /// connection. ringway's per-core listeners share each port that way,
    /// so it cannot be turned off: false stops startup in in-pod mode.
    #[arg(long, env = "INPOD_PORT_REUSE", default_value = "true", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub inpod_port_reuse: bool,

    /// Built-in CA directory (Istio cacerts layout: ca-cert.pem, ca-key.pem,
    /// root-cert.pem, cert-chain.pem). A new root is generated there on
    /// first start; copy the directory to share a trust root between nodes.
    #[arg(long, env = "RINGWAY_CA_DIR", default_value = "ringway-ca")]
    pub ca_dir: PathBuf,

    /// Trust domain of the built-in CA's identities.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,

    /// Lifetime of workload certificates (renewed at half-life).
    #[arg(long, env = "RINGWAY_CERT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub cert_ttl: Duration,

    /// HTTP/2 stream window for HBONE (suffix K/M).
    #[arg(long, env = "RINGWAY_H2_STREAM_WINDOW", default_value = "4M", value_parser = parse_size)]
    pub h2_stream_window: u32,

    /// HTTP/2 connection window for HBONE.
    #[arg(long, env = "RINGWAY_H2_CONNECTION_WINDOW", default_value = "16M", value_parser = parse_size)]
    pub h2_connection_window: u32,

    /// HTTP/2 max frame size for HBONE (16K..16M-1).
    #[arg(long, env = "RINGWAY_H2_MAX_FRAME", default_value = "1M", value_parser = parse_frame_size)]
    pub h2_max_frame_size: u32,

    /// Streams per pooled HBONE connection before another is opened.
    #[arg(long, env = "RINGWAY_POOL_MAX_STREAMS", default_value_t = 100)]
    pub pool_max_streams: usize,

    /// Release pooled HBONE connections unused for this long.
    #[arg(long, env = "RINGWAY_POOL_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub pool_idle_timeout: Duration,

    /// TLS + HTTP/2 handshakes, and a SOCKS5 client's greeting and
    /// request, must complete within this (a peer that stalls
    /// mid-handshake is dropped).
    #[arg(long, env = "RINGWAY_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// Inbound HBONE: dials to workloads in flight per h2 connection; a
    /// stream over it is refused (REFUSED_STREAM) at once. The default is
    /// the streams 15008 lets a connection open (200): peers' pools open
    /// up to 100 at once (ztunnel's and ringway's default), and a lower cap
    /// would refuse their bursts.
    #[arg(long, env = "RINGWAY_MAX_DIALS_PER_CONNECTION", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_dials_per_connection: u64,

    /// Inbound HBONE: dials to workloads in flight per core, all peers
    /// together; a stream over it is refused (REFUSED_STREAM) at once.
    /// Default: 1024, or the per-core connection cap when that is lower
    /// (each dial holds a descriptor, so the fd budget bounds it too).
    #[arg(long, env = "RINGWAY_MAX_DIALS_PER_CORE", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_dials_per_core: Option<u64>,

    /// Inbound HBONE: streams a peer may reset before ringway answered
    /// them, per connection and 10 s; past it the connection gets GOAWAY
    /// (ENHANCE_YOUR_CALM) and is closed.
    #[arg(long, env = "RINGWAY_MAX_EARLY_RESETS", default_value_t = 100)]
    pub max_early_resets: u32,
    /// Inbound HBONE (15008): PING each connection this often, as
    /// ztunnel's server does (it has no variable for it); with
    /// --hbone-keepalive-timeout, a peer that vanished without a FIN or
    /// RST stops holding its connection.
    #[arg(long, env = "RINGWAY_HBONE_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub hbone_keepalive_interval: Duration,

    /// Inbound HBONE: close a connection whose PING is not answered
    /// within this (ztunnel's server: 20 s).
    #[arg(long, env = "RINGWAY_HBONE_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = parse_nonzero_duration)]
    pub hbone_keepalive_timeout: Duration,

    /// Inbound HBONE: close (GOAWAY) a connection with no open stream for
    /// this long; 0 = never, the default, as ztunnel's server (its
    /// clients release idle connections after 5 min themselves).
    #[arg(long, env = "RINGWAY_HBONE_IDLE_TIMEOUT", default_value = "0", value_parser = parse_duration)]
    pub hbone_idle_timeout: Duration,

    /// Close a proxied connection (outbound or inbound passthrough, an
    /// HBONE tunnel's stream on either end, SOCKS5) that moved no byte
    /// either way for this long; counted and logged. 0 = never, the
    /// default: ztunnel has no such bound (TCP keepalive still finds dead
    /// peers).
    #[arg(long, env = "RINGWAY_IDLE_TIMEOUT", default_value = "0", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Inbound HBONE: bytes one core may hold for peers (DATA received
    /// and not yet taken by its workload) before the connections holding
    /// the most stop reading their socket until it falls (suffix K/M/G;
    /// 0 = no budget). The default leaves room for sixteen connections at
    /// ztunnel's full 16 MiB window per core.
    #[arg(long, env = "RINGWAY_MEMORY_BUDGET_PER_CORE", default_value = "256M", value_parser = parse_budget)]
    pub memory_budget_per_core: u64,

    /// Port of peers' HBONE listeners.
    #[arg(long, env = "RINGWAY_HBONE_PORT", default_value_t = 15008)]
    pub hbone_port: u16,

    /// xDS server (Delta ADS for Istio's Address and Authorization types),
    /// e.g. https://istiod.istio-system.svc:15012. Replaces --config as the
    /// source of workloads, services and policies.
    #[arg(long, env = "XDS_ADDRESS", conflicts_with = "config")]
    pub xds_address: Option<String>,

    /// PEM root(s) that authenticate the xDS server.
    #[arg(long, env = "XDS_ROOT_CA")]
    pub xds_root_ca: Option<PathBuf>,

    /// Subscribe to no addresses up front; ask the control plane for each
    /// unknown destination IP as connections meet it.
    #[arg(long, env = "XDS_ON_DEMAND")]
    pub xds_on_demand: bool,

    /// Serve the DNS proxy (UDP and TCP) on this address, node-level:
    /// "IP:PORT" or "localhost:PORT" (127.0.0.1). Also from ztunnel's
    /// proxy metadata `DNS_PROXY_ADDR` (env `ISTIO_META_DNS_PROXY_ADDR`
    /// or `DNS_PROXY_ADDR`); `DNS_CAPTURE=true` turns it on at
    /// 127.0.0.1:15053, `DNS_CAPTURE=false` keeps it off.
    #[arg(long, env = "RINGWAY_DNS_ADDR")]
    pub dns_addr: Option<String>,

    /// An upstream resolver for the names the mesh does not answer
    /// ("IP" for port 53, or "IP:PORT"; repeatable, asked in order).
    /// Default: the nameservers of /etc/resolv.conf.
    #[arg(long, env = "RINGWAY_DNS_UPSTREAM", value_delimiter = ',')]
    pub dns_upstream: Vec<String>,

    /// How long a forwarded DNS query waits for its upstream before the
    /// client gets SERVFAIL.
    #[arg(long, env = "RINGWAY_DNS_FORWARD_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub dns_forward_timeout: Duration,

    /// The cluster's DNS domain (Kubernetes names are `*.svc.<domain>`).
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// How long a connection waits for an on-demand lookup before treating
    /// the destination as unknown.
    #[arg(long, env = "RINGWAY_ON_DEMAND_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub on_demand_timeout: Duration,

    /// Istio CA (IstioCertificateService), e.g.
    /// https://istiod.istio-system.svc:15012. Without it the built-in CA
    /// signs workload certificates.
    #[arg(long, env = "CA_ADDRESS")]
    pub ca_address: Option<String>,

    /// PEM root(s) that authenticate the CA server (also the trust bundle
    /// for workload certificates).
    #[arg(long, env = "CA_ROOT_CA")]
    pub ca_root_ca: Option<PathBuf>,

    /// Certificate revocation lists (one PEM or DER file, one or more
    /// CRLs), as ztunnel's CRL_PATH: HBONE peers whose certificate or
    /// intermediate is listed are refused, both ways. Reloaded when the
    /// file changes; a file that does not load is a startup error, and
    /// later keeps the last good CRLs.
    #[arg(long, env = "CRL_PATH")]
    pub crl_path: Option<PathBuf>,

    /// File with the JWT sent as `authorization: Bearer` to xDS and the CA
    /// (re-read on every connect).
    #[arg(long, env = "AUTH_TOKEN")]
    pub auth_token: Option<PathBuf>,

    /// Cluster id sent to the control plane (`clusterid`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,

    /// Connections a core keeps open at once over all its listeners
    /// (HBONE streams not counted); past it the core stops accepting until
    /// one closes. Default: RLIMIT_NOFILE less 256 in reserve, over 4 fds
    /// a connection, shared by the cores.
    #[arg(long, env = "RINGWAY_MAX_CONNECTIONS_PER_CORE")]
    pub max_connections_per_core: Option<usize>,

    /// Cap per core on the outbound listener (15001); default: the total.
    #[arg(
        long,
        env = "RINGWAY_MAX_OUTBOUND_CONNECTIONS_PER_CORE",
        default_value_t = 0
    )]
    pub max_outbound_connections_per_core: usize,

    /// Cap per core on the inbound passthrough listener (15006); default:
    /// the total.
    #[arg(
        long,
        env = "RINGWAY_MAX_INBOUND_PASSTHROUGH_CONNECTIONS_PER_CORE",
        default_value_t = 0
    )]
    pub max_inbound_passthrough_connections_per_core: usize,

    /// Cap per core on the HBONE listener (15008), handshakes included;
    /// default: the total.
    #[arg(
        long,
        env = "RINGWAY_MAX_INBOUND_CONNECTIONS_PER_CORE",
        default_value_t = 0
    )]
    pub max_inbound_connections_per_core: usize,

    /// Cap per core on the SOCKS5 listener; default: the total.
    #[arg(
        long,
        env = "RINGWAY_MAX_SOCKS5_CONNECTIONS_PER_CORE",
        default_value_t = 0
    )]
    pub max_socks5_connections_per_core: usize,

    /// Connections one peer address may hold per core over the inbound
    /// listeners (15006, 15008) together; past it its new connections
    /// are reset at once, so it cannot fill the backlog others wait in.
    /// Default: half the per-core total; 0: no such cap.
    #[arg(long, env = "RINGWAY_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<usize>,

    /// How long a connection waits for a certificate it needs urgently
    /// before failing closed.
    #[arg(long, env = "RINGWAY_CERT_WAIT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub cert_wait_timeout: Duration,

    /// Pin the control thread (xDS, CA, config) to this CPU.
    #[arg(long, env = "RINGWAY_CONTROL_CORE")]
    pub control_core: Option<usize>,

    /// Readiness endpoint (`GET /healthz/ready`): 200 once the first config
    /// of each type is applied, every core's listeners are bound and every
    /// local HBONE workload has its certificate; 503 again if a core stops.
    #[arg(long, env = "RINGWAY_READINESS_ADDR", default_value = "0.0.0.0:15021")]
    pub readiness_addr: SocketAddr,

    /// Prometheus metrics (`GET /metrics` or `/stats/prometheus`): Istio's
    /// `istio_tcp_*` series, process and per-core gauges.
    #[arg(long, env = "RINGWAY_STATS_ADDR", default_value = "0.0.0.0:15020")]
    pub stats_addr: SocketAddr,

    /// Admin endpoint (`/config_dump`, `/logging`, `/quitquitquit`,
    /// `/cores`). Loopback only unless --admin-allow-remote: it can stop
    /// the proxy and shows its whole config.
    #[arg(long, env = "RINGWAY_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    pub admin_addr: SocketAddr,

    /// Let --admin-addr be a non-loopback address.
    #[arg(long, env = "RINGWAY_ADMIN_ALLOW_REMOTE")]
    pub admin_allow_remote: bool,

    /// Do not count Istio's TCP metrics (the scrape then has no istio_tcp_*
    /// series): for measuring what they cost, or nodes that never scrape.
    #[arg(long, env = "RINGWAY_NO_METRICS")]
    pub no_metrics: bool,

    /// Log format.
    #[arg(long, env = "RINGWAY_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log lines that may wait for the writer thread; beyond that, new lines
    /// are dropped and counted (and the count logged) rather than making a
    /// core wait for stdout.
    #[arg(long, env = "RINGWAY_LOG_QUEUE_LINES", default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub log_queue_lines: u32,

    /// Once every core has bound its listeners, write their addresses here
    /// as JSON (useful with port 0, for supervisors and tests).
    #[arg(long, env = "RINGWAY_BOUND_ADDRS_FILE")]
    pub bound_addrs_file: Option<PathBuf>,

    /// The rest come from ztunnel's variables only ([`super::ztunnel_env`]).
    /// How many executors ztunnel's ZTUNNEL_WORKER_THREADS or ProxyConfig
    /// `concurrency` ask for, when --cores does not say.
    #[arg(skip)]
    pub worker_threads: Option<WorkerThreads>,

    /// ZTUNNEL_CPU_LIMIT (or ZTUNNEL_RESOURCE_CPU_LIMIT): the container's
    /// CPU limit from the downward API, in whole CPUs.
    #[arg(skip)]
    pub cpu_limit: Option<usize>,

    /// IPV6_ENABLED: off, the DNS proxy's `localhost` is 127.0.0.1 only.
    #[arg(skip = true)]
    pub ipv6_enabled: bool,

    /// LOCAL_XDS: the local config inline (YAML), not watched.
    #[arg(skip)]
    pub config_inline: Option<String>,
}

/// Executors as ztunnel counts worker threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WorkerThreads {
    /// This many; 0 = one per CPU this process may use.
    Count(usize),
    /// This share of the CPU limit (or of the CPUs), rounded up, at least one.
    Percent(f64),
}

/// Where SOCKS5 listens when only --socks5 is given.
pub const DEFAULT_SOCKS5_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 15080);

impl Args {
    /// Whether applications are reached from the client's address: as
    /// asked, else on in in-pod mode only (see `--orig-src`).
    pub fn orig_src(&self) -> bool {
        self.orig_src.unwrap_or(self.inpod)
    }

    /// Keepalive on proxied sockets; None when --tcp-keepalive is 0.
    pub fn keepalive(&self) -> Option<KeepaliveOpts> {
        (!self.tcp_keepalive.is_zero()).then_some(KeepaliveOpts {
            time: self.tcp_keepalive,
            interval: self.tcp_keepalive_interval,
            retries: self.tcp_keepalive_retries,
            user_timeout: self.tcp_user_timeout,
        })
    }

    /// The SOCKS5 listener addresses; empty when it is off.
    pub fn socks5_addrs(&self) -> Vec<SocketAddr> {
        if !self.socks5_addr.is_empty() {
            self.socks5_addr.clone()
        } else if self.socks5 {
            vec![DEFAULT_SOCKS5_ADDR]
        } else {
            Vec::new()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The longest duration a flag takes: far beyond any timeout or lifetime
/// that means something, and far inside what the clocks can add without
/// overflowing (a deadline is `now + duration`).
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as operators write it: humantime's units ("500ms", "10s",
/// "5m", "24h", "1h 30m"), or a bare number of seconds ("7", "1.5"). The
/// perf harness parses its durations with this too.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let parsed = match s.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|e| e.to_string()),
        Err(_) => humantime::parse_duration(s).map_err(|e| e.to_string()),
    };
    match parsed {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        Ok(_) => Err(format!("duration {s:?} is too long (at most 100 years)")),
        Err(e) => Err(format!(
            "invalid duration {s:?}: {e} (examples: 500ms, 10s, 5m, 1h 30m)"
        )),
    }
}

/// [`parse_duration`], but never zero (a keepalive probe interval).
fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("duration {s:?} must be more than zero")),
        d => Ok(d),
    }
}

/// "64K", "4M" (binary units) or plain bytes, as u32.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("invalid size {s:?} (examples: 65535, 64K, 4M)"))
}

/// A byte budget: "0" (none), plain bytes, or K/M/G (binary units).
fn parse_budget(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("invalid byte budget {s:?} (examples: 0, 64M, 1G)"))
}

fn parse_recv_buffers(s: &str) -> Result<u16, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n <= 32768 => Ok(n as u16),
        _ => Err(format!(
            "receive buffers must be a power of two from 1 to 32768, got {s:?}"
        )),
    }
}

fn parse_frame_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if !(16384..=16_777_215).contains(&n) {
        return Err(format!("HTTP/2 max frame size must be 16K..16M-1, got {n}"));
    }
    Ok(n)
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("invalid number {s:?}"))
}

impl Args {
    /// The pinning flags; both at once is an error. Checked here, not by
    /// clap's `conflicts_with`, which also fires on an environment
    /// variable set to "false" (RINGWAY_NO_PIN=false with --pin).
    pub fn pin_mode(&self) -> anyhow::Result<PinMode> {
        Ok(match (self.pin, self.no_pin) {
            (true, true) => bail!(
                "--pin and --no-pin (RINGWAY_PIN, RINGWAY_NO_PIN) contradict each other: give one"
            ),
            (true, false) => PinMode::On,
            (false, true) => PinMode::Off,
            (false, false) => PinMode::Auto,
        })
    }
}

/// `--proxy-workload`: "namespace/name/service-account".
pub fn parse_proxy_workload(s: &str) -> Result<WorkloadName, String> {
    s.parse()
}

/// ztunnel's default DNS proxy address (its `DNS_PROXY_ADDR` default,
/// "localhost:15053"; ringway binds the IPv4 loopback).
pub const DEFAULT_DNS_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 15053);

/// The DNS proxy as the flags and proxy metadata ask for it.
#[derive(Debug, Clone)]
pub struct DnsPlan {
    pub addrs: Vec<SocketAddr>,
    /// The address was given as `localhost` (ztunnel's default): in-pod,
    /// pods with IPv6 loopback get `[::1]` on the same port too.
    pub localhost: bool,
    pub settings: DnsProxySettings,
}

/// The parts of Istio's `ProxyConfig` (env `PROXY_CONFIG`, YAML or JSON)
/// ztunnel reads; other fields are ignored, as ztunnel ignores them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IstioProxyConfig {
    /// The xDS server when XDS_ADDRESS is not set.
    pub discovery_address: Option<String>,
    /// The admin endpoint's port (on 127.0.0.1).
    pub proxy_admin_port: Option<u16>,
    /// The metrics endpoint's port.
    pub stats_port: Option<u16>,
    /// Worker threads when ZTUNNEL_WORKER_THREADS is not set (0 = all).
    pub concurrency: Option<u16>,
    /// Values as YAML scalars: `DNS_CAPTURE: true` unquoted means "true".
    #[serde(default)]
    pub proxy_metadata: std::collections::HashMap<String, serde_norway::Value>,
}

impl IstioProxyConfig {
    /// `PROXY_CONFIG` from `env`; unset or blank is an empty one. One that
    /// does not parse stops startup with the parser's reason rather than
    /// being skipped.
    pub fn read(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        match env("PROXY_CONFIG").filter(|t| !t.trim().is_empty()) {
            Some(text) => Ok(serde_norway::from_str::<Option<IstioProxyConfig>>(&text)
                .map_err(|e| anyhow::anyhow!("PROXY_CONFIG is not a readable ProxyConfig: {e}"))?
                .unwrap_or_default()),
            None => Ok(IstioProxyConfig::default()),
        }
    }

    /// A `proxyMetadata` value as a string; keys may carry ztunnel's
    /// `ISTIO_META_` prefix, which it strips.
    fn metadata(&self, key: &str) -> Option<String> {
        use serde_norway::Value;
        let value = self
            .proxy_metadata
            .get(key)
            .or_else(|| self.proxy_metadata.get(&format!("ISTIO_META_{key}")))?;
        match value {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// Proxy metadata as ztunnel reads it: `ISTIO_META_<KEY>` from the
/// environment first, then `proxyMetadata` of `PROXY_CONFIG`, then the bare
/// key.
struct Metadata<'e> {
    env: &'e dyn Fn(&str) -> Option<String>,
    proxy_config: IstioProxyConfig,
}

impl<'e> Metadata<'e> {
    fn read(env: &'e dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let proxy_config = IstioProxyConfig::read(env)?;
        Ok(Metadata { env, proxy_config })
    }

    fn get(&self, key: &str) -> Option<String> {
        (self.env)(&format!("ISTIO_META_{key}"))
            .or_else(|| self.proxy_config.metadata(key))
            .or_else(|| (self.env)(key))
    }
}

fn is_localhost(s: &str) -> bool {
    s.trim().starts_with("localhost:")
}

/// "IP:PORT", "[IPv6]:PORT" or "localhost:PORT".
fn parse_dns_addr(s: &str) -> anyhow::Result<SocketAddr> {
    let s = s.trim();
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .map_err(|_| anyhow::anyhow!("invalid DNS proxy address {s:?}: bad port"))?;
        return Ok(SocketAddr::new(
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            port,
        ));
    }
    s.parse().map_err(|_| {
        anyhow::anyhow!(
            "invalid DNS proxy address {s:?} (examples: 127.0.0.1:15053, localhost:15053)"
        )
    })
}

/// "IP" (port 53) or "IP:PORT".
fn parse_upstream(s: &str) -> anyhow::Result<SocketAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    s.parse().map_err(|_| {
        anyhow::anyhow!("invalid --dns-upstream {s:?} (examples: 10.96.0.10, 127.0.0.1:5353)")
    })
}

impl Args {
    /// Whether and where the DNS proxy serves, from the flags and the
    /// environment (`env`: the process's, or a test's). In-pod mode serves
    /// it unless `DNS_CAPTURE` says anything but "true", as ztunnel does
    /// (istio-cni captures pods' DNS by default); node-level mode only when
    /// asked (an address, or `DNS_CAPTURE=true`), since its address would
    /// be the node's own loopback.
    pub fn dns_plan(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<DnsPlan>> {
        let metadata = Metadata::read(env)?;
        let capture = metadata
            .get("DNS_CAPTURE")
            .map(|v| v.trim().eq_ignore_ascii_case("true"));
        let meta_addr = metadata
            .get("DNS_PROXY_ADDR")
            .filter(|a| !a.trim().is_empty());
        // The address as given; None for ztunnel's default (localhost).
        let given = match (&self.dns_addr, capture) {
            (Some(_), Some(false)) => bail!(
                "--dns-addr (RINGWAY_DNS_ADDR) asks for the DNS proxy but DNS_CAPTURE turns it off: give one"
            ),
            (Some(a), _) => Some(Some(a.clone())),
            (None, Some(false)) => None,
            (None, Some(true)) => Some(meta_addr),
            (None, None) if self.inpod => Some(meta_addr),
            (None, None) => meta_addr.map(Some),
        };
        let Some(given) = given else { return Ok(None) };
        let (addr, localhost) = match &given {
            Some(a) => (parse_dns_addr(a)?, is_localhost(a)),
            None => (DEFAULT_DNS_ADDR, true),
        };
        // IPV6_ENABLED=false: `localhost` is the IPv4 loopback only.
        let localhost = localhost && self.ipv6_enabled;
        if self.xds_on_demand {
            bail!(
                "the DNS proxy ({addr}) cannot run with on-demand xDS (XDS_ON_DEMAND): its answers \
                 need every service up front, as in ztunnel, which refuses the same combination; \
                 turn one off"
            );
        }
        let upstreams = if self.dns_upstream.is_empty() {
            crate::proxy::dns::system_upstreams()
        } else {
            self.dns_upstream
                .iter()
                .map(|u| parse_upstream(u))
                .collect::<anyhow::Result<_>>()?
        };
        Ok(Some(DnsPlan {
            addrs: vec![addr],
            localhost,
            settings: DnsProxySettings {
                answers: DnsSettings {
                    cluster: ClusterDomain::new(&self.cluster_domain),
                    ..DnsSettings::default()
                },
                upstreams,
                timeout: self.dns_forward_timeout,
                ..DnsProxySettings::default()
            },
        }))
    }

    /// Inbound HBONE dials in flight per core: as given, else 1024 capped
    /// at the per-core connection total (`conn_total`).
    pub fn dials_per_core(&self, conn_total: usize) -> usize {
        match self.max_dials_per_core {
            Some(n) => n as usize,
            None => DEFAULT_DIALS_PER_CORE.min(conn_total),
        }
    }

    /// The connection caps, the total derived from `nofile` and `cores`
    /// unless given.
    pub fn conn_caps(&self, nofile: u64, cores: usize) -> ConnCaps {
        let total = self
            .max_connections_per_core
            .unwrap_or_else(|| ConnCaps::default_total(nofile, cores));
        ConnCaps {
            total,
            per_peer: self.max_connections_per_peer.unwrap_or(total / 2),
            outbound: self.max_outbound_connections_per_core,
            inbound_passthrough: self.max_inbound_passthrough_connections_per_core,
            inbound: self.max_inbound_connections_per_core,
            socks5: self.max_socks5_connections_per_core,
        }
    }

    /// The settings every core runs with.
    pub fn proxy_config(&self) -> ProxyConfig {
        ProxyConfig {
            copy_mode: self.copy_mode,
            sockmap_redirect: self.sockmap_redirect,
            ring: RingConfig {
                entries: RingConfig::default().entries,
                recv_buffers: self.recv_buffers,
                recv_buffer_size: self.recv_buffer_size,
                io: self.io_mode,
                caps: SocketCaps {
                    recv: self.socket_cap,
                    send: self.socket_cap,
                },
            },
            connect: ConnectOpts {
                mark: self.mark,
                timeout: self.connect_timeout,
                keepalive: self.keepalive(),
            },
            drain_timeout: self.drain_timeout,
            network: self.network.clone(),
            h2: H2Settings {
                stream_window: self.h2_stream_window,
                connection_window: self.h2_connection_window,
                max_frame_size: self.h2_max_frame_size,
            },
            handshake_timeout: self.handshake_timeout,
            hbone_server: ServerTimeouts {
                keepalive_interval: self.hbone_keepalive_interval,
                keepalive_timeout: self.hbone_keepalive_timeout,
                idle: Some(self.hbone_idle_timeout).filter(|d| !d.is_zero()),
            },
            idle_timeout: Some(self.idle_timeout).filter(|d| !d.is_zero()),
            on_demand_timeout: self.on_demand_timeout,
            cert_wait_timeout: self.cert_wait_timeout,
            node_name: self.node_name.clone(),
            allow_unknown_source: self.allow_unknown_source,
            proxy_workload: self.proxy_workload.clone(),
            orig_src: self.orig_src(),
            fast_path: !self.no_fast_path,
            dns: None,
            response_baggage: !self.no_response_baggage,
            dials: crate::core::limits::DialLimits {
                per_connection: self.max_dials_per_connection as usize,
                // Replaced by `app::run` with the fd-derived figure.
                per_core: self.dials_per_core(usize::MAX),
                early_resets: self.max_early_resets,
            },
            // Replaced by `app::run` once RLIMIT_NOFILE is raised.
            conn_caps: self.conn_caps(u64::MAX, 1),
            memory_budget: self.memory_budget_per_core,
            pool: PoolConfig {
                max_streams: self.pool_max_streams.max(1),
                idle_timeout: self.pool_idle_timeout,
                hbone_port: self.hbone_port,
                ..PoolConfig::default()
            },
        }
    }
}

/// The flags as if given none: defaults everywhere (for unit tests).
#[cfg(test)]
pub fn test_args() -> Args {
    Cli::try_parse_from(["ringway"]).unwrap().run
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dials in flight per core: 1024 unless the fd budget's connection
    /// cap is lower, and the flag wins either way.
    #[test]
    fn dial_cap_follows_the_fd_budget() {
        let args = |a: &[&str]| {
            let mut v = vec!["ringway"];
            v.extend_from_slice(a);
            Cli::try_parse_from(v).unwrap().run
        };
        let default = args(&[]);
        assert_eq!(default.dials_per_core(100_000), 1024);
        assert_eq!(default.dials_per_core(120), 120);
        let given = args(&["--max-dials-per-core", "5000"]);
        assert_eq!(given.dials_per_core(120), 5000);
        // A container's 1024 descriptors on 2 cores.
        let total = default.conn_caps(1024, 2).total;
        assert!(default.dials_per_core(total) <= total, "{total}");
    }

    /// The DNS proxy's switches: flags, ztunnel's proxy metadata from the
    /// environment, and the combinations refused.
    #[test]
    fn dns_plan_from_flags_and_metadata() {
        let args = |a: &[&str]| {
            let mut v = vec!["ringway", "--dns-upstream", "10.0.0.10"];
            v.extend_from_slice(a);
            Cli::try_parse_from(v).unwrap().run
        };
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let addrs =
            |a: &Args, e: &dyn Fn(&str) -> Option<String>| a.dns_plan(e).unwrap().map(|p| p.addrs);
        let none = env(&[]);
        assert_eq!(
            addrs(&args(&[]), &none),
            None,
            "off unless asked, node-level"
        );
        assert_eq!(
            addrs(&args(&["--dns-addr", "10.1.0.1:53"]), &none),
            Some(vec!["10.1.0.1:53".parse().unwrap()])
        );
        assert_eq!(
            addrs(&args(&[]), &env(&[("DNS_CAPTURE", "TRUE")])),
            Some(vec![DEFAULT_DNS_ADDR])
        );
        assert_eq!(
            addrs(
                &args(&[]),
                &env(&[
                    ("ISTIO_META_DNS_CAPTURE", "true"),
                    ("ISTIO_META_DNS_PROXY_ADDR", "localhost:5353")
                ])
            ),
            Some(vec!["127.0.0.1:5353".parse().unwrap()])
        );
        assert_eq!(
            addrs(&args(&[]), &env(&[("DNS_PROXY_ADDR", "127.0.0.2:53")])),
            Some(vec!["127.0.0.2:53".parse().unwrap()])
        );
        assert_eq!(
            addrs(
                &args(&[]),
                &env(&[("DNS_CAPTURE", "false"), ("DNS_PROXY_ADDR", "127.0.0.2:53")])
            ),
            None
        );
        let err = |a: &Args, e: &dyn Fn(&str) -> Option<String>| {
            format!("{:#}", a.dns_plan(e).unwrap_err())
        };
        assert!(err(
            &args(&["--dns-addr", "127.0.0.1:53"]),
            &env(&[("DNS_CAPTURE", "false")])
        )
        .contains("DNS_CAPTURE"));
        assert!(err(&args(&["--dns-addr", "nope"]), &none).contains("invalid DNS proxy address"));
        let on_demand = args(&["--dns-addr", "127.0.0.1:53", "--xds-on-demand"]);
        assert!(err(&on_demand, &none).contains("on-demand"));
        let plan = args(&[
            "--dns-addr",
            "127.0.0.1:53",
            "--dns-upstream",
            "127.0.0.1:5353",
        ])
        .dns_plan(&none)
        .unwrap()
        .unwrap();
        assert_eq!(
            plan.settings.upstreams,
            vec![
                "10.0.0.10:53".parse().unwrap(),
                "127.0.0.1:5353".parse().unwrap()
            ]
        );
        assert_eq!(plan.settings.timeout, Duration::from_secs(5));

        // In-pod: on unless DNS_CAPTURE says anything but "true", as ztunnel.
        let inpod = args(&["--inpod"]);
        let plan = inpod.dns_plan(&none).unwrap().unwrap();
        assert_eq!(plan.addrs, vec![DEFAULT_DNS_ADDR]);
        assert!(plan.localhost, "ztunnel's default is localhost:15053");
        assert_eq!(addrs(&inpod, &env(&[("DNS_CAPTURE", "false")])), None);
        assert_eq!(addrs(&inpod, &env(&[("DNS_CAPTURE", "yes")])), None);
        let plan = inpod
            .dns_plan(&env(&[("ISTIO_META_DNS_PROXY_ADDR", "127.0.0.1:5353")]))
            .unwrap()
            .unwrap();
        assert_eq!(plan.addrs, vec!["127.0.0.1:5353".parse().unwrap()]);
        assert!(!plan.localhost);
        assert!(err(&args(&["--inpod", "--xds-on-demand"]), &none).contains("on-demand"));

        // PROXY_CONFIG's proxyMetadata, YAML or JSON, under ISTIO_META_*.
        const YAML: &str = "concurrency: 2\nproxyMetadata:\n  DNS_CAPTURE: \"true\"\n  DNS_PROXY_ADDR: 127.0.0.3:53\n";
        assert_eq!(
            addrs(&args(&[]), &env(&[("PROXY_CONFIG", YAML)])),
            Some(vec!["127.0.0.3:53".parse().unwrap()])
        );
        const JSON: &str = r#"{"proxyMetadata":{"DNS_CAPTURE":"false"}}"#;
        assert_eq!(addrs(&inpod, &env(&[("PROXY_CONFIG", JSON)])), None);
        assert_eq!(
            addrs(
                &inpod,
                &env(&[("PROXY_CONFIG", JSON), ("ISTIO_META_DNS_CAPTURE", "true")])
            ),
            Some(vec![DEFAULT_DNS_ADDR]),
            "ISTIO_META_* overrides PROXY_CONFIG"
        );
        assert_eq!(
            addrs(&args(&[]), &env(&[("PROXY_CONFIG", "concurrency: 2\n")])),
            None,
            "a ProxyConfig without metadata changes nothing"
        );
        assert!(err(
            &args(&[]),
            &env(&[("PROXY_CONFIG", "proxyMetadata: [1, 2")])
        )
        .contains("PROXY_CONFIG"));
        assert!(addrs(
            &args(&["--inpod", "--xds-on-demand"]),
            &env(&[("DNS_CAPTURE", "false")])
        )
        .is_none());
    }

    #[test]
    fn pin_flags_conflict_and_default_to_auto() {
        let parse = |args: &[&str]| {
            let mut full = vec!["ringway"];
            full.extend_from_slice(args);
            Cli::try_parse_from(full).unwrap().run.pin_mode()
        };
        assert_eq!(parse(&[]).unwrap(), PinMode::Auto);
        assert_eq!(parse(&["--pin"]).unwrap(), PinMode::On);
        assert_eq!(parse(&["--no-pin"]).unwrap(), PinMode::Off);
        let e = parse(&["--pin", "--no-pin"]).unwrap_err().to_string();
        assert!(e.contains("contradict"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["10 parsecs", "-1s", "-1", "", "s", "NaN", "inf"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
        }
        // Too long to add to a clock: an error, never a panic at startup.
        for huge in ["100000000000000000000s", "1e300", "1000000000h"] {
            assert!(parse_duration(huge).is_err(), "{huge}");
        }
        let e = Cli::try_parse_from(["ringway", "--drain-timeout", "100000000000000000000s"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--drain-timeout"), "{e}");
    }

    #[test]
    fn budgets() {
        assert_eq!(parse_budget("0").unwrap(), 0);
        assert_eq!(parse_budget("256M").unwrap(), 256 << 20);
        assert_eq!(parse_budget("2G").unwrap(), 2 << 30);
        assert_eq!(parse_budget("64k").unwrap(), 64 << 10);
        assert!(parse_budget("-1").is_err());
        assert!(parse_budget("1T").is_err());
        assert_eq!(test_args().proxy_config().memory_budget, 256 << 20);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("65535").unwrap(), 65535);
        assert!(parse_size("0").is_err());
        assert!(parse_size("8192M").is_err());
        assert!(parse_frame_size("1K").is_err());
        assert_eq!(parse_frame_size("1M").unwrap(), 1 << 20);
    }

    #[test]
    fn socks5_is_off_unless_asked_for() {
        let parse = |args: &[&str]| {
            let mut full = vec!["ringway"];
            full.extend_from_slice(args);
            Cli::try_parse_from(full).unwrap().run.socks5_addrs()
        };
        assert!(parse(&[]).is_empty());
        assert_eq!(
            parse(&["--socks5"]),
            vec!["127.0.0.1:15080".parse().unwrap()]
        );
        assert_eq!(
            parse(&["--socks5-addr", "127.0.0.1:1080,[::1]:1080"]),
            vec![
                "127.0.0.1:1080".parse::<SocketAddr>().unwrap(),
                "[::1]:1080".parse().unwrap()
            ]
        );
        assert_eq!(
            parse(&["--socks5", "--socks5-addr", "127.0.0.1:0"]),
            vec!["127.0.0.1:0".parse().unwrap()]
        );
    }

    /// Original source: asked for, or by default in in-pod mode only.
    #[test]
    fn orig_src_defaults_on_in_pod_only() {
        let parse = |args: &[&str]| {
            let mut full = vec!["ringway"];
            full.extend_from_slice(args);
            Cli::try_parse_from(full).unwrap().run.orig_src()
        };
        assert!(!parse(&[]));
        assert!(parse(&["--orig-src"]));
        assert!(parse(&["--orig-src=true"]));
        assert!(parse(&["--inpod"]));
        assert!(!parse(&["--inpod", "--orig-src=false"]));
        assert!(!parse(&["--orig-src=false"]));
    }

    #[test]
    fn marks() {
        assert_eq!(parse_u32("0x539").unwrap(), 1337);
        assert_eq!(parse_u32("1337").unwrap(), 1337);
        assert!(parse_u32("zz").is_err());
    }
}
