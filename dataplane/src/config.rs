//! Command line and environment: everything an operator tunes. Parsed once
//! on the main thread into [`ProxyConfig`], which every core gets a copy of.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::cgroup::{format_cpu_amount, format_cpu_list, plural, CpuQuota};
use crate::copy::CopyMode;
use crate::hbone::pool::PoolConfig;
use crate::hbone::H2Settings;

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

    /// splice: zero-copy through a pipe; copy: userspace buffer.
    #[arg(long, env = "RINGWAY_COPY_MODE", value_enum, default_value = "splice")]
    pub copy_mode: CopyMode,

    /// SO_MARK on ringway's outgoing sockets so capture rules can skip them
    /// (decimal or 0x hex; 0 disables).
    #[arg(long, env = "RINGWAY_MARK", default_value = "0x539", value_parser = parse_u32)]
    pub mark: u32,

    /// Upstream connect timeout.
    #[arg(long, env = "RINGWAY_CONNECT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// TCP keepalive idle time and probe interval on proxied sockets
    /// ("0s" disables).
    #[arg(long, env = "RINGWAY_TCP_KEEPALIVE", default_value = "180s", value_parser = parse_duration)]
    pub tcp_keepalive: Duration,

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
    pub proxy_workload: Option<ProxyWorkload>,

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

    /// File with the JWT sent as `authorization: Bearer` to xDS and the CA
    /// (re-read on every connect).
    #[arg(long, env = "AUTH_TOKEN")]
    pub auth_token: Option<PathBuf>,

    /// Cluster id sent to the control plane (`clusterid`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,

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

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (examples: 500ms, 10s, 5m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
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

/// Whether executors are pinned to their CPUs (`--pin`, `--no-pin`, or
/// neither: decided from the CPUs, see [`plan_cores`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMode {
    Auto,
    On,
    Off,
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

/// What this process may run on, as the kernel and the cgroups say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuFacts {
    /// The affinity mask (sched_getaffinity: taskset, cpusets).
    pub affinity: Vec<usize>,
    /// The machine's online CPUs; None if unknown.
    pub online: Option<Vec<usize>>,
    /// The cgroup cpuset's effective CPUs; None if unknown.
    pub cpuset: Option<Vec<usize>>,
    /// The tightest cgroup CPU quota; None if there is none.
    pub quota: Option<CpuQuota>,
}

impl CpuFacts {
    /// This process's, read from the kernel.
    pub fn read() -> Self {
        let root = std::path::Path::new("/");
        let cgroup = crate::cgroup::read_cgroup_cpu(root);
        CpuFacts {
            affinity: allowed_cpus(),
            online: crate::cgroup::read_online_cpus(root),
            cpuset: cgroup.cpuset,
            quota: cgroup.quota,
        }
    }
}

/// Which CPUs get an executor, whether it is pinned there, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorePlan {
    pub cpus: Vec<usize>,
    pub pin: bool,
    /// Why these CPUs, for the startup log and /config_dump.
    pub cores_reason: String,
    /// Why pinned or not.
    pub pin_reason: String,
    /// Something the operator should fix (more executors than the CPU
    /// quota pays for).
    pub warning: Option<String>,
}

/// Decides the executors' CPUs and pinning from `--cores` (`spec`), the
/// pinning flags and what the process may use (`facts`).
///
/// CPUs this process may use: the affinity mask, within the cgroup cpuset.
/// Without `--cores`, one executor per such CPU, but no more than the
/// cgroup CPU quota rounded up (the first N of them). The quota caps all
/// threads together: with more busy executors than it pays for, the whole
/// cgroup is throttled (stopped until the next period, 100 ms by
/// default), which shows as latency spikes. It is rounded up (1.5 CPUs →
/// 2 executors) so the whole quota can be used, as the JVM and .NET size
/// their thread pools; rounding down would leave paid-for CPU idle, and
/// with an io_uring executor per core an idle executor costs nothing.
/// A fractional quota can therefore still be throttled when every
/// executor is busy; `--cores` set to the whole CPUs avoids that.
///
/// Pinning, unless `--pin` or `--no-pin` says: on only when the CPUs look
/// like ringway's own. That is what Kubernetes' static CPU manager policy
/// gives a Guaranteed pod with an integer CPU request: a cpuset of
/// exclusive CPUs (so the affinity mask leaves out other online CPUs) and
/// a CPU quota of exactly that many CPUs. Each half alone proves nothing:
/// a container in the shared pool of a node with exclusive pods also has
/// a narrowed mask, but its quota (if any) is not the mask's size or it
/// has none; and a quota equal to every online CPU is a shared machine.
/// Pinning on shared CPUs makes an executor wait behind other work on its
/// CPU (docs/performance/pinning.md), so "unsure" means unpinned. One such case is
/// common: Kubernetes' DisableCPUQuotaWithExclusiveCPUs (kubernetes#127525,
/// on by default in recent releases) gives exclusive CPUs no quota at all,
/// and then nothing here tells them from a shared pool, whose containers
/// without a CPU limit have no quota either; `--pin` is the answer there.
pub fn plan_cores(
    spec: Option<&str>,
    facts: &CpuFacts,
    pin_mode: PinMode,
) -> anyhow::Result<CorePlan> {
    let (allowed, allowed_why) = allowed_of(facts);
    if allowed.is_empty() {
        bail!("no CPUs are available to this process");
    }
    let quota = facts.quota.as_ref();
    let (cpus, cores_reason) = match spec.map(str::trim) {
        None | Some("") => {
            let n = allowed.len();
            match quota {
                None => (
                    allowed.clone(),
                    format!(
                        "no cgroup CPU quota → {}, one per allowed CPU ({allowed_why})",
                        plural(n, "executor")
                    ),
                ),
                Some(q) => {
                    let k = q.cpus_rounded_up();
                    let amount = format!(
                        "{q} = {}{}",
                        format_cpu_amount(q.cpus()),
                        if q.is_exactly(k) { "" } else { ", rounded up" }
                    );
                    let at = format!("set in {}", q.file().display());
                    if k < n {
                        (
                            allowed[..k].to_vec(),
                            format!(
                                "{amount} → {} ({allowed_why} allows {n}; {at})",
                                plural(k, "executor")
                            ),
                        )
                    } else {
                        (
                            allowed.clone(),
                            format!(
                                "{amount}, not fewer than the {} → {} ({allowed_why}; {at})",
                                plural(n, "allowed CPU"),
                                plural(n, "executor")
                            ),
                        )
                    }
                }
            }
        }
        Some(s) if s.chars().all(|c| c.is_ascii_digit()) => {
            let n: usize = s.parse().context("invalid --cores count")?;
            if n == 0 {
                bail!("--cores 0: at least one core is needed");
            }
            if n > allowed.len() {
                bail!(
                    "--cores {n}: only {} CPUs are available to this process ({})",
                    allowed.len(),
                    format_cpus(&allowed)
                );
            }
            let cpus = allowed[..n].to_vec();
            let why = format!(
                "--cores {n} → CPUs {}, the first {n} of {allowed_why}",
                format_cpu_list(&cpus)
            );
            (cpus, why)
        }
        Some(s) => {
            let cpus = parse_cores_list(s, &allowed)?;
            let why = format!("--cores {s} → CPUs {}", format_cpu_list(&cpus));
            (cpus, why)
        }
    };
    let warning = quota
        .filter(|q| cpus.len() > q.cpus_rounded_up())
        .map(|q| {
            format!(
                "{} but the {q} pays for {}: when they are all busy the cgroup is throttled (stopped until the next period); --cores {} avoids it",
                plural(cpus.len(), "executor"),
                format_cpu_amount(q.cpus()),
                q.cpus_rounded_up()
            )
        });
    let (pin, pin_reason) = decide_pin(pin_mode, &allowed, facts.online.as_deref(), quota);
    Ok(CorePlan {
        cpus,
        pin,
        cores_reason,
        pin_reason,
        warning,
    })
}

/// The CPUs this process may use (affinity within the cpuset) and how
/// that was found, e.g. "affinity 0-7" or "affinity 0-7 ∩ cpuset 0-3 = 0-3".
fn allowed_of(facts: &CpuFacts) -> (Vec<usize>, String) {
    let affinity = &facts.affinity;
    let a = format_cpu_list(affinity);
    let Some(cpuset) = &facts.cpuset else {
        return (affinity.clone(), format!("affinity {a}"));
    };
    let both: Vec<usize> = affinity
        .iter()
        .copied()
        .filter(|c| cpuset.contains(c))
        .collect();
    let c = format_cpu_list(cpuset);
    if both.len() == affinity.len() {
        (both, format!("affinity {a}"))
    } else if both.is_empty() {
        // The kernel keeps the mask inside the cpuset, so this cpuset is
        // not the one in force: trust the mask.
        (
            affinity.clone(),
            format!("affinity {a}; cpuset {c} shares none of it, ignored"),
        )
    } else {
        let b = format_cpu_list(&both);
        (both, format!("affinity {a} ∩ cpuset {c} = {b}"))
    }
}

/// The pinning decision (see [`plan_cores`]) and its reason.
fn decide_pin(
    mode: PinMode,
    allowed: &[usize],
    online: Option<&[usize]>,
    quota: Option<&CpuQuota>,
) -> (bool, String) {
    match mode {
        PinMode::On => return (true, "pinning on: --pin".into()),
        PinMode::Off => return (false, "pinning off: --no-pin".into()),
        PinMode::Auto => {}
    }
    let a = format_cpu_list(allowed);
    let Some(online) = online else {
        return (
            false,
            format!("pinning off: the online CPUs are unknown, so whether CPUs {a} are ringway's own cannot be told (--pin if they are)"),
        );
    };
    let o = format_cpu_list(online);
    if online.iter().all(|c| allowed.contains(c)) {
        return (
            false,
            format!("pinning off: CPUs are shared (affinity {a} = all online CPUs)"),
        );
    }
    let n = allowed.len();
    match quota {
        None => (
            false,
            format!("pinning off: CPUs {a} of online {o} but no cgroup CPU quota: a shared pool, or exclusive CPUs whose quota Kubernetes dropped (DisableCPUQuotaWithExclusiveCPUs), which cannot be told apart; --pin if they are ringway's own"),
        ),
        Some(q) if !q.is_exactly(n) => (
            false,
            format!(
                "pinning off: CPUs {a} of online {o} but the {q} is {}, not {n}: a shared pool",
                format_cpu_amount(q.cpus())
            ),
        ),
        Some(q) => (
            true,
            format!(
                "pinning on: CPUs {a} of online {o} with a {q} of exactly {} look exclusive (Kubernetes' static CPU manager policy, Guaranteed pod)",
                plural(n, "CPU")
            ),
        ),
    }
}

/// A `--cores` CPU list ("0-3,6-6") resolved against the allowed CPUs.
fn parse_cores_list(s: &str, allowed: &[usize]) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => bail!(
                "--cores {s:?}: {part:?} is neither a count nor a range; write a single CPU as \"{part}-{part}\""
            ),
        };
        let lo: usize = lo
            .parse()
            .with_context(|| format!("--cores: bad CPU number in {part:?}"))?;
        let hi: usize = hi
            .parse()
            .with_context(|| format!("--cores: bad CPU number in {part:?}"))?;
        if lo > hi {
            bail!("--cores: empty range {part:?}");
        }
        for cpu in lo..=hi {
            if !allowed.contains(&cpu) {
                bail!(
                    "--cores: CPU {cpu} does not exist or is not available to this process (available: {})",
                    format_cpus(allowed)
                );
            }
            if !cpus.contains(&cpu) {
                cpus.push(cpu);
            }
        }
    }
    if cpus.is_empty() {
        bail!("--cores {s:?} names no CPU");
    }
    Ok(cpus)
}

pub fn format_cpus(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs in this thread's affinity mask (respects taskset and cgroup
/// cpusets, unlike a plain CPU count).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE, inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// What every core needs to know, fixed at startup.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub copy_mode: CopyMode,
    pub connect: crate::socket::ConnectOpts,
    pub drain_timeout: Duration,
    pub network: String,
    pub h2: H2Settings,
    pub pool: PoolConfig,
    pub handshake_timeout: Duration,
    pub on_demand_timeout: Duration,
    pub cert_wait_timeout: Duration,
    /// Inbound serves only workloads on this node (None: every workload).
    pub node_name: Option<String>,
    /// Outbound from unknown sources may leave as plain TCP.
    pub allow_unknown_source: bool,
    /// Dedicated mode: the one workload outbound connections speak for.
    pub proxy_workload: Option<ProxyWorkload>,
    /// Inbound connections to applications leave from the client's address.
    pub orig_src: bool,
    /// HBONE to a workload of this node is served in-process.
    pub fast_path: bool,
}

/// The workload a dedicated-mode proxy speaks for, as ztunnel's
/// PROXY_WORKLOAD_INFO names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyWorkload {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

impl ProxyWorkload {
    pub fn is(&self, w: &ringway_controlplane::model::Workload) -> bool {
        w.namespace == self.namespace
            && w.name == self.name
            && w.service_account == self.service_account
    }
}

impl std::fmt::Display for ProxyWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.namespace, self.name, self.service_account
        )
    }
}

/// "namespace/name/service-account", three non-empty parts.
pub fn parse_proxy_workload(s: &str) -> Result<ProxyWorkload, String> {
    match s.split('/').collect::<Vec<_>>()[..] {
        [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => {
            Ok(ProxyWorkload {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                service_account: sa.to_owned(),
            })
        }
        _ => Err(format!(
            "{s:?}: expected namespace/name/service-account (three non-empty parts)"
        )),
    }
}

impl ProxyConfig {
    pub fn from_args(args: &Args) -> Self {
        Self {
            copy_mode: args.copy_mode,
            connect: crate::socket::ConnectOpts {
                mark: args.mark,
                timeout: args.connect_timeout,
                keepalive: (!args.tcp_keepalive.is_zero()).then_some(args.tcp_keepalive),
            },
            drain_timeout: args.drain_timeout,
            network: args.network.clone(),
            h2: H2Settings {
                stream_window: args.h2_stream_window,
                connection_window: args.h2_connection_window,
                max_frame_size: args.h2_max_frame_size,
            },
            handshake_timeout: args.handshake_timeout,
            on_demand_timeout: args.on_demand_timeout,
            cert_wait_timeout: args.cert_wait_timeout,
            node_name: args.node_name.clone(),
            allow_unknown_source: args.allow_unknown_source,
            proxy_workload: args.proxy_workload.clone(),
            orig_src: args.orig_src(),
            fast_path: !args.no_fast_path,
            pool: PoolConfig {
                max_streams: args.pool_max_streams.max(1),
                idle_timeout: args.pool_idle_timeout,
                hbone_port: args.hbone_port,
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

    #[test]
    fn proxy_workload_takes_three_non_empty_parts() {
        assert_eq!(
            parse_proxy_workload("shop/cart-7f9c/cart").unwrap(),
            ProxyWorkload {
                namespace: "shop".into(),
                name: "cart-7f9c".into(),
                service_account: "cart".into()
            }
        );
        for bad in ["shop/cart", "shop//cart", "a/b/c/d", "", "/b/c"] {
            let e = parse_proxy_workload(bad).unwrap_err();
            assert!(e.contains("namespace/name/service-account"), "{bad}: {e}");
        }
    }

    /// Facts of a machine where `affinity` is every online CPU and there
    /// are no cgroup limits.
    fn plain(affinity: &[usize]) -> CpuFacts {
        CpuFacts {
            affinity: affinity.to_vec(),
            online: Some(affinity.to_vec()),
            ..CpuFacts::default()
        }
    }

    fn quota(quota_us: u64, period_us: u64) -> Option<CpuQuota> {
        Some(CpuQuota {
            quota_us,
            period_us,
            version: crate::cgroup::CgroupVersion::V2,
            dir: "/sys/fs/cgroup".into(),
        })
    }

    #[test]
    fn cores_count_and_lists() {
        let facts = plain(&[0, 1, 2, 3]);
        let cpus = |spec, pin| plan_cores(spec, &facts, pin).unwrap().cpus;
        assert_eq!(cpus(None, PinMode::On), vec![0, 1, 2, 3]);
        assert_eq!(cpus(Some("2"), PinMode::On), vec![0, 1]);
        assert_eq!(cpus(Some("1-2,0-0"), PinMode::Off), vec![1, 2, 0]);
        assert_eq!(cpus(Some("3-3"), PinMode::Auto), vec![3]);
    }

    #[test]
    fn cores_errors_are_clear() {
        let facts = plain(&[0, 1]);
        let err = |spec| {
            plan_cores(Some(spec), &facts, PinMode::Auto)
                .unwrap_err()
                .to_string()
        };
        let e = err("0-5");
        assert!(e.contains("CPU 2 does not exist"), "{e}");
        let e = err("3");
        assert!(e.contains("only 2 CPUs"), "{e}");
        let e = err("0");
        assert!(e.contains("at least one"), "{e}");
        let e = err("1,0");
        assert!(e.contains("neither a count nor a range"), "{e}");
        assert!(plan_cores(Some("2-1"), &facts, PinMode::Auto).is_err());
        assert!(plan_cores(None, &plain(&[]), PinMode::Auto).is_err());
    }

    /// The whole decision, one row per situation: which CPUs, pinned or
    /// not, and words each reason must contain.
    #[test]
    fn plan_from_affinity_cpuset_quota_and_flags() {
        struct Case {
            name: &'static str,
            affinity: Vec<usize>,
            online: Option<Vec<usize>>,
            cpuset: Option<Vec<usize>>,
            quota: Option<CpuQuota>,
            spec: Option<&'static str>,
            mode: PinMode,
            cpus: Vec<usize>,
            pin: bool,
            cores_reason: &'static [&'static str],
            pin_reason: &'static [&'static str],
            warns: bool,
        }
        let all8: Vec<usize> = (0..8).collect();
        let base = |name| Case {
            name,
            affinity: all8.clone(),
            online: Some(all8.clone()),
            cpuset: None,
            quota: None,
            spec: None,
            mode: PinMode::Auto,
            cpus: all8.clone(),
            pin: false,
            cores_reason: &[],
            pin_reason: &[],
            warns: false,
        };
        let cases = [
            Case {
                cores_reason: &["no cgroup CPU quota → 8 executors", "affinity 0-7"],
                pin_reason: &["pinning off: CPUs are shared (affinity 0-7 = all online CPUs)"],
                ..base("no limits: every CPU, unpinned")
            },
            Case {
                quota: quota(200_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &[
                    "cgroup cpu.max 200000/100000 = 2 CPUs → 2 executors (affinity 0-7 allows 8",
                    "/sys/fs/cgroup/cpu.max",
                ],
                pin_reason: &["all online CPUs"],
                ..base("quota of 2 on 8 CPUs: the first 2, unpinned (shared)")
            },
            Case {
                quota: quota(150_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &["= 1.5 CPUs, rounded up → 2 executors"],
                ..base("fractional quota rounds up")
            },
            Case {
                quota: quota(10_000, 100_000),
                cpus: vec![0],
                cores_reason: &["= 0.1 CPUs, rounded up → 1 executor"],
                ..base("a tenth of a CPU still gets one executor")
            },
            Case {
                quota: Some(CpuQuota {
                    quota_us: 100_000,
                    period_us: 100_000,
                    version: crate::cgroup::CgroupVersion::V1,
                    dir: "/sys/fs/cgroup/cpu/docker/abc".into(),
                }),
                cpus: vec![0],
                cores_reason: &[
                    "cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us 100000/100000 = 1 CPU → 1 executor",
                    "/sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us",
                ],
                ..base("cgroup v1 quota")
            },
            Case {
                affinity: vec![0, 1],
                quota: quota(400_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &["= 4 CPUs, not fewer than the 2 allowed CPUs → 2 executors"],
                pin_reason: &["pinning off: CPUs 0-1 of online 0-7 but the cgroup cpu.max 400000/100000 is 4 CPUs, not 2"],
                ..base("quota above the affinity: the affinity decides")
            },
            Case {
                affinity: vec![4, 5],
                cpuset: Some(vec![4, 5]),
                quota: quota(200_000, 100_000),
                cpus: vec![4, 5],
                pin: true,
                cores_reason: &["= 2 CPUs, not fewer than the 2 allowed CPUs → 2 executors (affinity 4-5"],
                pin_reason: &["pinning on: CPUs 4-5 of online 0-7", "exactly 2 CPUs look exclusive"],
                ..base("static CPU manager: exclusive CPUs, quota to match → pinned")
            },
            Case {
                cpuset: Some(vec![2, 3]),
                quota: quota(200_000, 100_000),
                cpus: vec![2, 3],
                pin: true,
                cores_reason: &["affinity 0-7 ∩ cpuset 2-3 = 2-3"],
                pin_reason: &["CPUs 2-3 of online 0-7"],
                ..base("the cpuset narrows a wider mask")
            },
            Case {
                cpuset: Some(vec![9]),
                cores_reason: &["cpuset 9 shares none of it, ignored"],
                pin_reason: &["all online CPUs"],
                ..base("a cpuset disjoint from the mask is not the one in force")
            },
            Case {
                affinity: vec![2, 3, 4, 5, 6, 7],
                cpus: vec![2, 3, 4, 5, 6, 7],
                pin_reason: &["CPUs 2-7 of online 0-7 but no cgroup CPU quota"],
                ..base("shared pool without a quota (BestEffort): unpinned")
            },
            Case {
                affinity: vec![2, 3, 4, 5, 6, 7],
                quota: quota(250_000, 100_000),
                cpus: vec![2, 3, 4],
                pin_reason: &["is 2.5 CPUs, not 6"],
                ..base("shared pool with a fractional limit (Burstable): unpinned")
            },
            Case {
                affinity: vec![2, 3],
                quota: quota(300_000, 100_000),
                cpus: vec![2, 3],
                pin_reason: &["is 3 CPUs, not 2"],
                ..base("whole quota that is not the mask's size: unpinned")
            },
            Case {
                affinity: vec![4, 5],
                quota: quota(200_000, 100_000),
                cpus: vec![4, 5],
                mode: PinMode::Off,
                pin_reason: &["pinning off: --no-pin"],
                ..base("--no-pin wins over exclusive CPUs")
            },
            Case {
                mode: PinMode::On,
                pin: true,
                pin_reason: &["pinning on: --pin"],
                ..base("--pin wins over shared CPUs")
            },
            Case {
                affinity: vec![4, 5],
                quota: quota(200_000, 100_000),
                spec: Some("5-5"),
                cpus: vec![5],
                pin: true,
                cores_reason: &["--cores 5-5 → CPUs 5"],
                ..base("a --cores list on exclusive CPUs: the same pinning rule")
            },
            Case {
                spec: Some("3-3"),
                cpus: vec![3],
                cores_reason: &["--cores 3-3 → CPUs 3"],
                pin_reason: &["all online CPUs"],
                ..base("a --cores list on shared CPUs implies no pinning")
            },
            Case {
                quota: quota(100_000, 100_000),
                spec: Some("4"),
                cpus: vec![0, 1, 2, 3],
                cores_reason: &["--cores 4 → CPUs 0-3, the first 4 of affinity 0-7"],
                warns: true,
                ..base("--cores above the quota: obeyed, with a warning")
            },
            Case {
                affinity: vec![0, 1, 2, 3],
                online: None,
                quota: quota(400_000, 100_000),
                cpus: vec![0, 1, 2, 3],
                pin_reason: &["online CPUs are unknown"],
                ..base("online CPUs unknown: unpinned")
            },
        ];
        for c in cases {
            let facts = CpuFacts {
                affinity: c.affinity,
                online: c.online,
                cpuset: c.cpuset,
                quota: c.quota,
            };
            let plan = plan_cores(c.spec, &facts, c.mode).unwrap();
            assert_eq!(plan.cpus, c.cpus, "{}: {plan:?}", c.name);
            assert_eq!(plan.pin, c.pin, "{}: {plan:?}", c.name);
            for want in c.cores_reason {
                assert!(
                    plan.cores_reason.contains(want),
                    "{}: {want:?} not in {:?}",
                    c.name,
                    plan.cores_reason
                );
            }
            for want in c.pin_reason {
                assert!(
                    plan.pin_reason.contains(want),
                    "{}: {want:?} not in {:?}",
                    c.name,
                    plan.pin_reason
                );
            }
            assert_eq!(plan.warning.is_some(), c.warns, "{}: {plan:?}", c.name);
            if let Some(w) = &plan.warning {
                assert!(w.contains("--cores 1 avoids it"), "{}: {w}", c.name);
            }
        }
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
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
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
