//! ztunnel's environment variables, read with ztunnel's names, units and
//! defaults, so a DaemonSet written for ztunnel keeps its tuning when its
//! image becomes ringway's (issue 24).
//!
//! [`ZTUNNEL_VARS`] is the one list of what ringway does with each of
//! them: the startup check ([`apply`]) and `docs/ztunnel-settings.md` are
//! both derived from it (a unit test keeps the doc in step). A variable
//! ringway cannot honour stops startup or warns, naming it; none is
//! silently ignored.
//!
//! Precedence, for a setting both name: a flag on the command line, then
//! ringway's own `RINGWAY_*` variable, then ztunnel's variable, then the
//! default. A `RINGWAY_*` variable and a ztunnel one that disagree stop
//! startup, naming both: which of two deployment layers wins is not
//! something to guess.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::parser::ValueSource;
use clap::ArgMatches;

use super::cli::{parse_duration, Args, IstioProxyConfig, LogFormat, WorkerThreads};

/// What ringway does with a ztunnel variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Read with ztunnel's meaning, into the ringway setting named.
    Honoured,
    /// Read, and not needed: ringway says so at startup (info).
    Unneeded,
    /// Ringway lacks the behaviour: set to anything but `accepts` (what
    /// ringway does anyway), startup logs a warning naming it.
    Warned { accepts: &'static [&'static str] },
    /// Ringway lacks the behaviour and running without it would surprise
    /// an operator: set to anything but `accepts`, startup fails naming it.
    Refused { accepts: &'static [&'static str] },
    /// Owned by other work of issue 24; not checked here.
    Elsewhere,
}

/// One ztunnel variable. A `name` ending in `*` is a prefix.
#[derive(Clone, Copy, Debug)]
pub struct ZtunnelVar {
    pub name: &'static str,
    pub handling: Handling,
    /// The ringway flag it sets, or what ringway does instead.
    pub ringway: &'static str,
    /// Why, and where ztunnel's meaning and ringway's differ.
    pub note: &'static str,
}

const fn honoured(name: &'static str, ringway: &'static str, note: &'static str) -> ZtunnelVar {
    ZtunnelVar {
        name,
        handling: Handling::Honoured,
        ringway,
        note,
    }
}

const fn warned(
    name: &'static str,
    accepts: &'static [&'static str],
    note: &'static str,
) -> ZtunnelVar {
    ZtunnelVar {
        name,
        handling: Handling::Warned { accepts },
        ringway: "none",
        note,
    }
}

const fn refused(
    name: &'static str,
    accepts: &'static [&'static str],
    note: &'static str,
) -> ZtunnelVar {
    ZtunnelVar {
        name,
        handling: Handling::Refused { accepts },
        ringway: "none",
        note,
    }
}

/// Every variable ztunnel reads (its `src/config.rs` and logging), and
/// what ringway does with it.
pub const ZTUNNEL_VARS: &[ZtunnelVar] = &[
    honoured("PROXY_MODE", "`--inpod` / `--proxy-workload`", "`shared` is ztunnel's in-pod mode and turns `--inpod` on; `dedicated` needs `PROXY_WORKLOAD_INFO`; unset keeps ringway's default (node-level capture unless `--inpod`)."),
    honoured("PROXY_WORKLOAD_INFO", "`--proxy-workload`", "`namespace/name/service-account`. ztunnel reads it only with `PROXY_MODE=dedicated`; ringway runs dedicated whenever it is set, and warns when `PROXY_MODE` is unset."),
    refused("ENABLE_PROXY", &["true"], "`false` (DNS proxy only) is not a mode ringway has: it always proxies."),
    honoured("XDS_ADDRESS", "`--xds-address`", "A missing scheme gets `https://`, as in ztunnel. Unset: ProxyConfig `discoveryAddress`, else no xDS (ztunnel would dial istiod; see `KUBERNETES_SERVICE_HOST`)."),
    honoured("CA_ADDRESS", "`--ca-address`", "A missing scheme gets `https://`. Unset: the built-in CA."),
    honoured("KUBERNETES_SERVICE_HOST", "a warning without a config source", "ztunnel then defaults XDS_ADDRESS and CA_ADDRESS to istiod; ringway warns when it has no config source instead of guessing one."),
    honoured("LOCAL_XDS_PATH", "`--config`", "Watched for edits."),
    honoured("LOCAL_XDS", "none (inline `--config`)", "Inline YAML, loaded once. With `LOCAL_XDS_PATH` too, startup fails, as in ztunnel."),
    honoured("XDS_ON_DEMAND", "`--xds-on-demand`", ""),
    honoured("FAKE_CA", "built-in CA", "`true`: the built-in CA signs, `CA_ADDRESS` is not used."),
    honoured("AUTH_TOKEN", "`--auth-token`", "A file. ztunnel also takes the token itself inline; ringway refuses a value that is not a file."),
    honoured("XDS_ROOT_CA", "`--xds-root-ca`", "A PEM file. ztunnel's `SYSTEM` and inline PEM are refused."),
    honoured("CA_ROOT_CA", "`--ca-root-ca`", "A PEM file. ztunnel's `SYSTEM` and inline PEM are refused."),
    refused("ALT_XDS_HOSTNAME", &[], "ringway verifies the xDS server by the address's host only."),
    refused("ALT_CA_HOSTNAME", &[], "ringway verifies the CA by the address's host only."),
    refused("XDS_HEADER_*", &[], "ringway sends no extra headers to xDS; a control plane that needs them would refuse it."),
    refused("CA_HEADER_*", &[], "ringway sends no extra headers to the CA."),
    honoured("CLUSTER_ID", "`--cluster-id`", "Default `Kubernetes`."),
    honoured("ISTIO_META_CLUSTER_ID", "`--cluster-id`", "Wins over `CLUSTER_ID`, as in ztunnel."),
    honoured("CLUSTER_DOMAIN", "`--cluster-domain`", "Default `cluster.local`."),
    honoured("NETWORK", "`--network`", ""),
    honoured("NODE_NAME", "`--node-name`", ""),
    honoured("INSTANCE_IP", "xDS node id", ""),
    honoured("POD_NAME", "xDS node id", ""),
    honoured("POD_NAMESPACE", "xDS node id", ""),
    ZtunnelVar {
        name: "SERVICE_ACCOUNT",
        handling: Handling::Unneeded,
        ringway: "none",
        note: "ztunnel's own identity; ringway needs none of its own (logged at startup).",
    },
    honoured("TRUST_DOMAIN", "`--trust-domain`", ""),
    honoured("SECRET_TTL", "`--cert-ttl`", "A duration, default 24h."),
    honoured("ZTUNNEL_WORKER_THREADS", "`--cores` (a count)", "`N`, `N%` of the CPU limit (rounded up), or 0 for every CPU ringway may use. More than the CPUs ringway may use is capped, with a warning: one executor per CPU."),
    honoured("ZTUNNEL_CPU_LIMIT", "caps the default `--cores`", "Whole CPUs (downward API `limits.cpu`, divisor 1): the base of `N%`, and at most this many executors by default."),
    honoured("ZTUNNEL_RESOURCE_CPU_LIMIT", "as `ZTUNNEL_CPU_LIMIT`", "Read when `ZTUNNEL_CPU_LIMIT` is not set."),
    honoured("POOL_MAX_STREAMS_PER_CONNECTION", "`--pool-max-streams`", "Default 100."),
    honoured("POOL_UNUSED_RELEASE_TIMEOUT", "`--pool-idle-timeout`", "A duration, default 5m."),
    honoured("HTTP2_STREAM_WINDOW_SIZE", "`--h2-stream-window`", "Plain bytes, default 4194304."),
    honoured("HTTP2_CONNECTION_WINDOW_SIZE", "`--h2-connection-window`", "Plain bytes, default 16777216."),
    honoured("HTTP2_FRAME_SIZE", "`--h2-max-frame-size`", "Plain bytes, default 1048576."),
    honoured("KEEPALIVE_ENABLED", "`--tcp-keepalive 0s`", "`false` turns TCP keepalive off."),
    honoured("KEEPALIVE_TIME", "`--tcp-keepalive`", "A duration, default 180s."),
    honoured("KEEPALIVE_INTERVAL", "`--tcp-keepalive-interval`", "A duration, default 180s."),
    honoured("KEEPALIVE_RETRIES", "`--tcp-keepalive-retries`", "Default 9."),
    honoured("USER_TIMEOUT_ENABLED", "`--tcp-user-timeout`", "TCP_USER_TIMEOUT = keepalive time + interval × retries, as ztunnel; default off."),
    honoured("CONNECTION_TERMINATION_DEADLINE", "`--drain-timeout`", "A duration, default 5s."),
    honoured("TERMINATION_GRACE_PERIOD_SECONDS", "`--drain-timeout`", "When `CONNECTION_TERMINATION_DEADLINE` is unset: the grace period less 5 s (less 1 s at 10 s or under, at least 1 s), as ztunnel."),
    honoured("INPOD_ENABLED", "`--inpod`", ""),
    honoured("INPOD_UDS", "`--inpod-uds`", ""),
    ZtunnelVar {
        name: "INPOD_PORT_REUSE",
        handling: Handling::Elsewhere,
        ringway: "`--inpod-port-reuse` (see issue 24 hand-over)",
        note: "Upgrade hand-over: pods' ports are always shared with SO_REUSEPORT.",
    },
    honoured("PACKET_MARK", "`--mark`", "Default 1337, ztunnel's in-pod mark (ringway marks in every mode)."),
    honoured("ENABLE_ORIG_SRC", "`--orig-src`", ""),
    honoured("IPV6_ENABLED", "DNS `localhost`", "`false`: the DNS proxy's `localhost` is 127.0.0.1 only. ringway's node-level listeners are IPv4 (`0.0.0.0`) unless given `[::]` addresses; in-pod it serves IPv6 where the pod has it."),
    warned("PREFERED_SERVICE_NAMESPACE", &[], "ringway does not rank services by namespace."),
    warned("LOCALHOST_APP_TUNNEL", &["true"], "ringway has no switch for it."),
    honoured("ENABLE_RESPONSE_BAGGAGE", "`--no-response-baggage`", "Default true."),
    honoured("UNSTABLE_ENABLE_SOCKS5", "`--socks5`", "127.0.0.1:15080."),
    honoured("CRL_PATH", "`--crl-path`", "One PEM or DER file of one or more CRLs, reloaded on change; a file that does not load stops startup, later keeps the last good CRLs. Open HBONE connections of a newly revoked peer are closed, as ztunnel does."),
    honoured("TLS12_ENABLED", "`--tls12`", "HBONE also offers and accepts TLS 1.2 with ztunnel's four ECDHE AES-GCM suites; TLS 1.3 stays preferred."),
    refused("COMPLIANCE_POLICY", &[], "ringway cannot restrict itself to a compliance policy (e.g. `pqc`)."),
    warned("AUTHZ_POLICY_INFO_LOGGING", &["false"], "ringway logs authorization decisions at debug level only."),
    warned("TRANSPARENT_NETWORK_POLICIES", &["false"], "ringway has no such mode."),
    honoured("PROXY_CONFIG", "see the rows above", "YAML or JSON ProxyConfig: `concurrency` (as `ZTUNNEL_WORKER_THREADS`, which wins), `proxyAdminPort` (`--admin-addr` 127.0.0.1:port), `statsPort` (`--stats-addr`), `discoveryAddress` (as `XDS_ADDRESS`, which wins), `proxyMetadata` (`DNS_CAPTURE`, `DNS_PROXY_ADDR`). ztunnel's mesh config file (`./etc/istio/config/mesh`) is not read: a warning if it exists."),
    honoured("ISTIO_META_*", "xDS node metadata", "Also proxy metadata: `ISTIO_META_DNS_CAPTURE`, `ISTIO_META_DNS_PROXY_ADDR` (`--dns-addr`)."),
    honoured("ISTIO_METAJSON_*", "xDS node metadata", ""),
    honoured("RUST_LOG", "log filter", "Also `/logging` on the admin endpoint."),
    honoured("LOG_FORMAT", "`--log-format`", "`json`, anything else is text, as ztunnel."),
];

/// What startup says about the environment besides errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    Warn(String),
    Info(String),
}

/// Reads ztunnel's variables from `env` (a snapshot of the environment)
/// into `args` (parsed by `cmd` into `matches`), and checks every variable
/// of [`ZTUNNEL_VARS`] that is set. Errors name the variables.
pub fn apply(
    cmd: &clap::Command,
    matches: &ArgMatches,
    args: &mut Args,
    env: &[(String, String)],
) -> anyhow::Result<Vec<Notice>> {
    let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    let mut o = Overlay {
        cmd,
        matches,
        env: &get,
        notices: Vec::new(),
    };
    check_table(env, &mut o.notices)?;
    if Path::new(MESH_CONFIG).exists() {
        o.notices.push(Notice::Warn(format!(
            "{MESH_CONFIG} exists: ztunnel would read its defaultConfig; ringway reads only \
             PROXY_CONFIG, so put the settings there"
        )));
    }
    let pc = IstioProxyConfig::read(&get)?;
    o.mode(args)?;
    o.config_source(args, &pc)?;
    o.transport(args)?;
    o.cores(args, &pc)?;
    o.endpoints(args, &pc)?;
    o.files(args)?;
    Ok(o.notices)
}

/// Istio's mesh config, which ztunnel reads relative to its working
/// directory for a `defaultConfig` below PROXY_CONFIG's.
const MESH_CONFIG: &str = "./etc/istio/config/mesh";

/// Warned and refused variables that are set; unneeded ones noted.
fn check_table(env: &[(String, String)], notices: &mut Vec<Notice>) -> anyhow::Result<()> {
    let mut refused = Vec::new();
    for (key, value) in env.iter().filter(|(_, v)| !v.trim().is_empty()) {
        let Some(var) = lookup(key) else { continue };
        let accepted =
            |accepts: &[&str]| accepts.iter().any(|a| a.eq_ignore_ascii_case(value.trim()));
        match var.handling {
            Handling::Warned { accepts } if !accepted(accepts) => {
                notices.push(Notice::Warn(format!(
                    "ztunnel's {key}={value:?} is not honoured by ringway and has no effect: {}",
                    var.note.trim_end_matches('.')
                )))
            }
            Handling::Refused { accepts } if !accepted(accepts) => refused.push(format!(
                "{key}={value:?}: {}",
                var.note.trim_end_matches('.')
            )),
            Handling::Unneeded => notices.push(Notice::Info(format!(
                "ztunnel's {key} is set and not needed by ringway: {}",
                var.note
            ))),
            _ => {}
        }
    }
    if !refused.is_empty() {
        refused.sort();
        bail!(
            "ztunnel settings ringway cannot honour (docs/ztunnel-settings.md): {}; unset them",
            refused.join("; ")
        );
    }
    Ok(())
}

/// The table's entry for an environment variable, prefixes included.
pub fn lookup(key: &str) -> Option<&'static ZtunnelVar> {
    ZTUNNEL_VARS
        .iter()
        .find(|v| match v.name.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == v.name,
        })
}

struct Overlay<'a> {
    cmd: &'a clap::Command,
    matches: &'a ArgMatches,
    env: &'a dyn Fn(&str) -> Option<String>,
    notices: Vec<Notice>,
}

impl Overlay<'_> {
    /// A ztunnel variable's value; blank counts as unset, as for flags.
    fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    fn arg(&self, id: &str) -> &clap::Arg {
        self.cmd
            .get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("no flag {id}"))
    }

    fn flag(&self, id: &str) -> String {
        format!("--{}", self.arg(id).get_long().unwrap_or(id))
    }

    /// Gives the flag `id` (field `field`) ztunnel's `value`, read from
    /// `var`, unless the command line or ringway's own variable set it.
    fn set<T: PartialEq + std::fmt::Debug>(
        &mut self,
        var: &str,
        id: &str,
        field: &mut T,
        value: T,
    ) -> anyhow::Result<()> {
        match self.matches.value_source(id) {
            Some(ValueSource::CommandLine) => {
                if *field != value {
                    self.notices.push(Notice::Info(format!(
                        "{} on the command line wins over ztunnel's {var}",
                        self.flag(id)
                    )));
                }
            }
            Some(ValueSource::EnvVariable) => {
                let own = self
                    .arg(id)
                    .get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if own == var {
                    *field = value;
                } else if *field != value {
                    bail!(
                        "{own} ({field:?}) and ztunnel's {var} ({value:?}) disagree: \
                         set one of them (docs/ztunnel-settings.md)"
                    );
                }
            }
            _ => *field = value,
        }
        Ok(())
    }

    /// [`Self::set`] from `var` as `parse` reads it, when `var` is set.
    fn take<T: PartialEq + std::fmt::Debug>(
        &mut self,
        var: &str,
        id: &str,
        field: &mut T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> anyhow::Result<()> {
        let Some(raw) = self.var(var) else {
            return Ok(());
        };
        let value = parse(raw.trim()).map_err(|e| anyhow!("ztunnel's {var}={raw:?}: {e}"))?;
        self.set(var, id, field, value)
    }

    /// PROXY_MODE, PROXY_WORKLOAD_INFO, FAKE_CA.
    fn mode(&mut self, args: &mut Args) -> anyhow::Result<()> {
        match self
            .var("PROXY_MODE")
            .map(|m| m.trim().to_owned())
            .as_deref()
        {
            None => {
                if args.proxy_workload.is_some()
                    && self.matches.value_source("proxy_workload") == Some(ValueSource::EnvVariable)
                {
                    self.notices.push(Notice::Warn(
                        "PROXY_WORKLOAD_INFO is set without PROXY_MODE: ztunnel would ignore it \
                         and run shared; ringway runs dedicated for it (set PROXY_MODE=dedicated \
                         to say so)"
                            .into(),
                    ));
                }
            }
            Some("dedicated") => {
                if args.proxy_workload.is_none() {
                    bail!("PROXY_MODE=dedicated needs PROXY_WORKLOAD_INFO (namespace/name/service-account)");
                }
            }
            Some("shared") => {
                if args.proxy_workload.is_some() {
                    bail!(
                        "PROXY_MODE=shared contradicts PROXY_WORKLOAD_INFO / --proxy-workload \
                         (dedicated mode): set one"
                    );
                }
                if !args.inpod {
                    self.notices.push(Notice::Info(
                        "PROXY_MODE=shared: in-pod mode, as ztunnel's shared mode".into(),
                    ));
                    args.inpod = true;
                }
            }
            Some(other) => {
                bail!("PROXY_MODE={other:?}: ztunnel's modes are \"shared\" and \"dedicated\"")
            }
        }
        if let Some(raw) = self.var("FAKE_CA") {
            if ztunnel_bool(&raw).map_err(|e| anyhow!("FAKE_CA={raw:?}: {e}"))? {
                match self.matches.value_source("ca_address") {
                    Some(ValueSource::CommandLine) => {
                        bail!("FAKE_CA=true and --ca-address contradict each other: set one")
                    }
                    _ if args.ca_address.is_some() => {
                        self.notices.push(Notice::Info(
                            "FAKE_CA=true: the built-in CA signs and CA_ADDRESS is not used, as in ztunnel"
                                .into(),
                        ));
                        args.ca_address = None;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// LOCAL_XDS_PATH, LOCAL_XDS, ProxyConfig's discoveryAddress,
    /// ISTIO_META_CLUSTER_ID, SECRET_TTL.
    fn config_source(&mut self, args: &mut Args, pc: &IstioProxyConfig) -> anyhow::Result<()> {
        let (path, inline) = (self.var("LOCAL_XDS_PATH"), self.var("LOCAL_XDS"));
        if path.is_some() && inline.is_some() {
            bail!("only one of LOCAL_XDS_PATH or LOCAL_XDS may be set, as in ztunnel");
        }
        self.take("LOCAL_XDS_PATH", "config", &mut args.config, |s| {
            Ok(Some(PathBuf::from(s)))
        })?;
        if let Some(text) = inline {
            match self.matches.value_source("config") {
                Some(ValueSource::CommandLine) => self.notices.push(Notice::Info(
                    "--config on the command line wins over ztunnel's LOCAL_XDS".into(),
                )),
                Some(ValueSource::EnvVariable) => bail!(
                    "LOCAL_XDS (inline config) and RINGWAY_CONFIG both give the local config: \
                     set one"
                ),
                _ => args.config_inline = Some(text),
            }
        }
        let local = args.config.is_some() || args.config_inline.is_some();
        if let (Some(addr), None) = (&pc.discovery_address, &args.xds_address) {
            if !local && !addr.trim().is_empty() {
                args.xds_address = Some(addr.trim().to_owned());
            }
        }
        if local && args.xds_address.is_some() {
            bail!(
                "a local config (--config, LOCAL_XDS_PATH or LOCAL_XDS) and xDS (--xds-address, \
                 XDS_ADDRESS or PROXY_CONFIG discoveryAddress) are both given: ringway takes its \
                 config from one"
            );
        }
        for addr in [&mut args.xds_address, &mut args.ca_address]
            .into_iter()
            .flatten()
        {
            if !addr.contains("://") {
                *addr = format!("https://{addr}");
            }
        }
        if !local && args.xds_address.is_none() && self.var("KUBERNETES_SERVICE_HOST").is_some() {
            self.notices.push(Notice::Warn(
                "running in Kubernetes without XDS_ADDRESS: ztunnel would take its config from \
                 istiod (https://istiod.istio-system.svc:15012); ringway serves its embedded \
                 example config. Set XDS_ADDRESS and CA_ADDRESS"
                    .into(),
            ));
        }
        if let Some(id) = self.var("ISTIO_META_CLUSTER_ID") {
            if self.matches.value_source("cluster_id") == Some(ValueSource::CommandLine) {
                self.notices.push(Notice::Info(
                    "--cluster-id on the command line wins over ISTIO_META_CLUSTER_ID".into(),
                ));
            } else {
                args.cluster_id = id.trim().to_owned();
            }
        }
        self.take("SECRET_TTL", "cert_ttl", &mut args.cert_ttl, parse_duration)?;
        Ok(())
    }

    /// Sockets, HTTP/2, the pool, draining, baggage, SOCKS5, IPv6.
    fn transport(&mut self, args: &mut Args) -> anyhow::Result<()> {
        self.take("PACKET_MARK", "mark", &mut args.mark, |s| {
            s.parse::<u32>().map_err(|e| e.to_string())
        })?;
        self.take(
            "POOL_MAX_STREAMS_PER_CONNECTION",
            "pool_max_streams",
            &mut args.pool_max_streams,
            |s| match s.parse::<u16>() {
                Ok(0) | Err(_) => Err("a count of streams from 1 to 65535".into()),
                Ok(n) => Ok(n as usize),
            },
        )?;
        self.take(
            "POOL_UNUSED_RELEASE_TIMEOUT",
            "pool_idle_timeout",
            &mut args.pool_idle_timeout,
            parse_duration,
        )?;
        let window = |s: &str| match s.parse::<u32>() {
            Ok(n) if (1..=0x7fff_ffff).contains(&n) => Ok(n),
            _ => Err("a window in bytes, 1 to 2147483647".to_owned()),
        };
        self.take(
            "HTTP2_STREAM_WINDOW_SIZE",
            "h2_stream_window",
            &mut args.h2_stream_window,
            window,
        )?;
        self.take(
            "HTTP2_CONNECTION_WINDOW_SIZE",
            "h2_connection_window",
            &mut args.h2_connection_window,
            window,
        )?;
        self.take(
            "HTTP2_FRAME_SIZE",
            "h2_max_frame_size",
            &mut args.h2_max_frame_size,
            |s| match s.parse::<u32>() {
                Ok(n) if (16_384..=16_777_215).contains(&n) => Ok(n),
                _ => Err("a frame size in bytes, 16384 to 16777215".to_owned()),
            },
        )?;
        let nonzero = |s: &str| match parse_duration(s)? {
            d if d.is_zero() => Err("must be more than zero".to_owned()),
            d => Ok(d),
        };
        self.take(
            "KEEPALIVE_TIME",
            "tcp_keepalive",
            &mut args.tcp_keepalive,
            nonzero,
        )?;
        self.take(
            "KEEPALIVE_INTERVAL",
            "tcp_keepalive_interval",
            &mut args.tcp_keepalive_interval,
            nonzero,
        )?;
        self.take(
            "KEEPALIVE_RETRIES",
            "tcp_keepalive_retries",
            &mut args.tcp_keepalive_retries,
            |s| match s.parse::<u32>() {
                Ok(n) if (1..=127).contains(&n) => Ok(n),
                _ => Err("a count of probes, 1 to 127 (Linux's limit)".to_owned()),
            },
        )?;
        let current = args.tcp_keepalive;
        self.take(
            "KEEPALIVE_ENABLED",
            "tcp_keepalive",
            &mut args.tcp_keepalive,
            |s| {
                Ok(match ztunnel_bool(s)? {
                    false => Duration::ZERO,
                    true if current.is_zero() => DEFAULT_KEEPALIVE,
                    true => current,
                })
            },
        )?;
        self.take(
            "USER_TIMEOUT_ENABLED",
            "tcp_user_timeout",
            &mut args.tcp_user_timeout,
            ztunnel_bool,
        )?;
        if self.var("CONNECTION_TERMINATION_DEADLINE").is_some() {
            self.take(
                "CONNECTION_TERMINATION_DEADLINE",
                "drain_timeout",
                &mut args.drain_timeout,
                parse_duration,
            )?;
        } else {
            self.take(
                "TERMINATION_GRACE_PERIOD_SECONDS",
                "drain_timeout",
                &mut args.drain_timeout,
                |s| {
                    s.parse::<u64>()
                        .map(drain_within_grace)
                        .map_err(|_| "whole seconds".to_owned())
                },
            )?;
        }
        self.take(
            "ENABLE_RESPONSE_BAGGAGE",
            "no_response_baggage",
            &mut args.no_response_baggage,
            |s| ztunnel_bool(s).map(|on| !on),
        )?;
        self.take(
            "UNSTABLE_ENABLE_SOCKS5",
            "socks5",
            &mut args.socks5,
            ztunnel_bool,
        )?;
        self.take("TLS12_ENABLED", "tls12", &mut args.tls12, ztunnel_bool)?;
        if let Some(raw) = self.var("IPV6_ENABLED") {
            args.ipv6_enabled =
                ztunnel_bool(&raw).map_err(|e| anyhow!("IPV6_ENABLED={raw:?}: {e}"))?;
        }
        self.take("LOG_FORMAT", "log_format", &mut args.log_format, |s| {
            Ok(if s.eq_ignore_ascii_case("json") {
                LogFormat::Json
            } else {
                LogFormat::Text
            })
        })?;
        Ok(())
    }

    /// ZTUNNEL_WORKER_THREADS, ProxyConfig's concurrency, the CPU limit.
    fn cores(&mut self, args: &mut Args, pc: &IstioProxyConfig) -> anyhow::Result<()> {
        for var in ["ZTUNNEL_CPU_LIMIT", "ZTUNNEL_RESOURCE_CPU_LIMIT"] {
            if let Some(raw) = self.var(var) {
                match raw.trim().parse::<usize>() {
                    Ok(n) if n > 0 => args.cpu_limit = Some(n),
                    _ => bail!("{var}={raw:?}: a whole number of CPUs, at least 1"),
                }
                break;
            }
        }
        let (var, threads) = match self.var("ZTUNNEL_WORKER_THREADS") {
            Some(raw) => (
                "ZTUNNEL_WORKER_THREADS",
                parse_worker_threads(raw.trim())
                    .map_err(|e| anyhow!("ZTUNNEL_WORKER_THREADS={raw:?}: {e}"))?,
            ),
            None => match pc.concurrency {
                Some(n) => ("PROXY_CONFIG concurrency", WorkerThreads::Count(n as usize)),
                None => return Ok(()),
            },
        };
        match self.matches.value_source("cores") {
            Some(ValueSource::CommandLine) => self.notices.push(Notice::Info(format!(
                "--cores on the command line wins over ztunnel's {var}"
            ))),
            Some(ValueSource::EnvVariable) => {
                let own = args.cores.as_deref().unwrap_or("").trim();
                if WorkerThreads::Count(own.parse().unwrap_or(usize::MAX)) != threads {
                    bail!(
                        "RINGWAY_CORES ({own:?}) and ztunnel's {var} ({threads:?}) disagree: \
                         set one of them (docs/ztunnel-settings.md)"
                    );
                }
            }
            _ => args.worker_threads = Some(threads),
        }
        Ok(())
    }

    /// ProxyConfig's proxyAdminPort and statsPort.
    fn endpoints(&mut self, args: &mut Args, pc: &IstioProxyConfig) -> anyhow::Result<()> {
        if let Some(port) = pc.proxy_admin_port {
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            self.set(
                "PROXY_CONFIG proxyAdminPort",
                "admin_addr",
                &mut args.admin_addr,
                addr,
            )?;
        }
        if let Some(port) = pc.stats_port {
            let addr = SocketAddr::new(args.stats_addr.ip(), port);
            self.set(
                "PROXY_CONFIG statsPort",
                "stats_addr",
                &mut args.stats_addr,
                addr,
            )?;
        }
        Ok(())
    }

    /// AUTH_TOKEN, XDS_ROOT_CA and CA_ROOT_CA name files in ringway; ztunnel
    /// also takes the content itself, or SYSTEM: refused, not misread.
    fn files(&mut self, args: &Args) -> anyhow::Result<()> {
        for (var, id, path) in [
            ("AUTH_TOKEN", "auth_token", &args.auth_token),
            ("XDS_ROOT_CA", "xds_root_ca", &args.xds_root_ca),
            ("CA_ROOT_CA", "ca_root_ca", &args.ca_root_ca),
        ] {
            let from_env = self.matches.value_source(id) == Some(ValueSource::EnvVariable);
            match path {
                Some(p) if from_env && !Path::new(p).is_file() => bail!(
                    "{var}={:?} is not a file: ringway reads {var} as a file name only (ztunnel's \
                     SYSTEM or inline content are not supported)",
                    p.display()
                ),
                _ => {}
            }
        }
        Ok(())
    }
}

/// ztunnel's keepalive time when KEEPALIVE_ENABLED=true turns it back on.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(180);

/// `true` or `false`, as ztunnel's parser takes them (any case here).
fn ztunnel_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        t if t.eq_ignore_ascii_case("true") => Ok(true),
        t if t.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// ZTUNNEL_WORKER_THREADS: "N" (0 = every CPU) or "N%" (more than 0, at
/// most 100).
fn parse_worker_threads(s: &str) -> Result<WorkerThreads, String> {
    match s.strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(WorkerThreads::Percent(p)),
            _ => Err("a percentage must be more than 0 and at most 100".into()),
        },
        None => s
            .parse::<usize>()
            .map(WorkerThreads::Count)
            .map_err(|_| "a count of threads, or a percentage like 50%".into()),
    }
}

/// The drain deadline within a Kubernetes grace period, as ztunnel picks
/// it: a few seconds before the SIGKILL so connections end cleanly.
fn drain_within_grace(secs: u64) -> Duration {
    let keep = if secs > 10 {
        secs - 5
    } else {
        secs.saturating_sub(1)
    };
    Duration::from_secs(keep.max(1))
}

/// Executors from ztunnel's settings.
#[derive(Debug, PartialEq, Eq)]
pub struct WorkerCount {
    pub count: usize,
    /// Why, for the startup log and /config_dump.
    pub how: String,
    /// More were asked for than ringway may use (worth a warning).
    pub capped: bool,
}

/// How many executors ztunnel's settings ask for, given `allowed` CPUs;
/// None for ringway's own default.
pub fn worker_count(args: &Args, allowed: usize) -> Option<WorkerCount> {
    let base = args.cpu_limit.unwrap_or(allowed);
    let (wanted, how) = match args.worker_threads? {
        WorkerThreads::Count(0) => (allowed, "0 = every allowed CPU".to_owned()),
        WorkerThreads::Count(n) => (n, format!("{n} worker threads")),
        WorkerThreads::Percent(p) => {
            let n = ((base as f64 * p / 100.0).ceil() as usize).max(1);
            (n, format!("{p}% of {base} CPUs, rounded up"))
        }
    };
    if wanted > allowed {
        return Some(WorkerCount {
            count: allowed,
            how: format!(
                "{how}, capped at the {allowed} CPUs ringway may use (one executor per CPU)"
            ),
            capped: true,
        });
    }
    Some(WorkerCount {
        count: wanted,
        how,
        capped: false,
    })
}

/// The end of `ringway --help`: which ztunnel variables are read, so
/// tooling (scripts/check-deploy.sh) can tell them from typos.
pub fn help_text() -> String {
    let names = |pick: fn(Handling) -> bool| {
        ZTUNNEL_VARS
            .iter()
            .filter(|v| pick(v.handling))
            .map(|v| v.name)
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "ztunnel's environment variables are read with ztunnel's meaning; a flag, then a \
         RINGWAY_* variable, wins (docs/ztunnel-settings.md):\n  honoured: {}\n  \
         refused unless set to what ringway does: {}\n  warned about likewise: {}",
        names(|h| matches!(h, Handling::Honoured | Handling::Unneeded)),
        names(|h| matches!(h, Handling::Refused { .. })),
        names(|h| matches!(h, Handling::Warned { .. })),
    )
}

/// The markdown table of `docs/ztunnel-settings.md`.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| ztunnel variable | ringway | handling | notes |\n|---|---|---|---|\n");
    for v in ZTUNNEL_VARS {
        let handling = match v.handling {
            Handling::Honoured => "honoured".to_owned(),
            Handling::Unneeded => "not needed (info at startup)".to_owned(),
            Handling::Warned { accepts } => with_accepts("warning", accepts),
            Handling::Refused { accepts } => with_accepts("**startup error**", accepts),
            Handling::Elsewhere => "see issue 24".to_owned(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name, v.ringway, handling, v.note
        ));
    }
    out
}

fn with_accepts(what: &str, accepts: &[&str]) -> String {
    match accepts {
        [] => format!("{what} when set"),
        values => format!(
            "{what} unless {}",
            values
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::cli::Cli;
    use clap::{CommandFactory, FromArgMatches};

    /// ztunnel-facts §10.2: every variable ztunnel reads.
    const ZTUNNEL_FACTS_10_2: &[&str] = &[
        "PROXY_MODE",
        "PROXY_WORKLOAD_INFO",
        "ENABLE_PROXY",
        "XDS_ADDRESS",
        "CA_ADDRESS",
        "LOCAL_XDS_PATH",
        "LOCAL_XDS",
        "XDS_ON_DEMAND",
        "FAKE_CA",
        "AUTH_TOKEN",
        "XDS_ROOT_CA",
        "CA_ROOT_CA",
        "ALT_XDS_HOSTNAME",
        "ALT_CA_HOSTNAME",
        "XDS_HEADER_X",
        "CA_HEADER_X",
        "CLUSTER_ID",
        "ISTIO_META_CLUSTER_ID",
        "CLUSTER_DOMAIN",
        "NETWORK",
        "NODE_NAME",
        "INSTANCE_IP",
        "POD_NAME",
        "POD_NAMESPACE",
        "SERVICE_ACCOUNT",
        "TRUST_DOMAIN",
        "SECRET_TTL",
        "ZTUNNEL_WORKER_THREADS",
        "ZTUNNEL_RESOURCE_CPU_LIMIT",
        "ZTUNNEL_CPU_LIMIT",
        "POOL_MAX_STREAMS_PER_CONNECTION",
        "POOL_UNUSED_RELEASE_TIMEOUT",
        "HTTP2_STREAM_WINDOW_SIZE",
        "HTTP2_CONNECTION_WINDOW_SIZE",
        "HTTP2_FRAME_SIZE",
        "KEEPALIVE_ENABLED",
        "KEEPALIVE_TIME",
        "KEEPALIVE_INTERVAL",
        "KEEPALIVE_RETRIES",
        "USER_TIMEOUT_ENABLED",
        "CONNECTION_TERMINATION_DEADLINE",
        "TERMINATION_GRACE_PERIOD_SECONDS",
        "INPOD_UDS",
        "INPOD_PORT_REUSE",
        "PACKET_MARK",
        "ENABLE_ORIG_SRC",
        "IPV6_ENABLED",
        "PREFERED_SERVICE_NAMESPACE",
        "LOCALHOST_APP_TUNNEL",
        "ENABLE_RESPONSE_BAGGAGE",
        "UNSTABLE_ENABLE_SOCKS5",
        "CRL_PATH",
        "TLS12_ENABLED",
        "COMPLIANCE_POLICY",
        "AUTHZ_POLICY_INFO_LOGGING",
        "PROXY_CONFIG",
        "ISTIO_META_DNS_CAPTURE",
        "ISTIO_META_DNS_PROXY_ADDR",
        "RUST_LOG",
        "LOG_FORMAT",
    ];

    #[test]
    fn every_ztunnel_variable_is_in_the_table() {
        for name in ZTUNNEL_FACTS_10_2 {
            assert!(lookup(name).is_some(), "{name} is not in ZTUNNEL_VARS");
        }
        let mut names: Vec<_> = ZTUNNEL_VARS.iter().map(|v| v.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a variable is listed twice");
    }

    /// Every flag the table names exists.
    #[test]
    fn the_table_names_real_flags() {
        let cmd = Cli::command();
        for v in ZTUNNEL_VARS {
            for flag in v.ringway.split('`').filter(|s| s.starts_with("--")) {
                let long = flag.trim_start_matches("--");
                let long = long.split(' ').next().unwrap();
                assert!(
                    cmd.get_arguments().any(|a| a.get_long() == Some(long)),
                    "{}: no flag --{long}",
                    v.name
                );
            }
        }
    }

    /// docs/ztunnel-settings.md carries the table as it is in code.
    #[test]
    fn the_doc_has_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ztunnel-settings.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let table = markdown_table();
        if !doc.contains(&table) {
            if std::env::var_os("RINGWAY_BLESS").is_some() {
                let start = doc.find("| ztunnel variable |").expect("a table");
                let end = doc[start..]
                    .find("\n\n")
                    .map(|e| start + e + 1)
                    .unwrap_or(doc.len());
                let fixed = format!("{}{table}{}", &doc[..start], &doc[end..]);
                std::fs::write(path, fixed).unwrap();
            }
            panic!("docs/ztunnel-settings.md's table differs from ZTUNNEL_VARS (RINGWAY_BLESS=1 rewrites it):\n{table}");
        }
    }

    fn parse(flags: &[&str], env: &[(&str, &str)]) -> anyhow::Result<(Args, Vec<Notice>)> {
        let mut argv = vec!["ringway"];
        argv.extend_from_slice(flags);
        let cmd = Cli::command();
        let matches = cmd.clone().try_get_matches_from(argv).unwrap();
        let mut args = Cli::from_arg_matches(&matches).unwrap().run;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let notices = apply(&cmd, &matches, &mut args, &env)?;
        Ok((args, notices))
    }

    fn ok(env: &[(&str, &str)]) -> Args {
        parse(&[], env).unwrap().0
    }

    fn err(flags: &[&str], env: &[(&str, &str)]) -> String {
        format!("{:#}", parse(flags, env).unwrap_err())
    }

    /// Each honoured variable, in ztunnel's units, lands in its setting.
    #[test]
    fn honoured_variables_set_their_flags() {
        let d = ok(&[]);
        assert_eq!(d.mark, 1337);
        assert_eq!(d.keepalive().unwrap().retries, 9);

        assert_eq!(ok(&[("PACKET_MARK", "4242")]).mark, 4242);
        assert_eq!(
            ok(&[("POOL_MAX_STREAMS_PER_CONNECTION", "7")]).pool_max_streams,
            7
        );
        assert_eq!(
            ok(&[("POOL_UNUSED_RELEASE_TIMEOUT", "90s")]).pool_idle_timeout,
            Duration::from_secs(90)
        );
        let h2 = ok(&[
            ("HTTP2_STREAM_WINDOW_SIZE", "1000000"),
            ("HTTP2_CONNECTION_WINDOW_SIZE", "3000000"),
            ("HTTP2_FRAME_SIZE", "65536"),
        ]);
        assert_eq!(
            (
                h2.h2_stream_window,
                h2.h2_connection_window,
                h2.h2_max_frame_size
            ),
            (1_000_000, 3_000_000, 65536)
        );
        let k = ok(&[
            ("KEEPALIVE_TIME", "30s"),
            ("KEEPALIVE_INTERVAL", "10s"),
            ("KEEPALIVE_RETRIES", "3"),
            ("USER_TIMEOUT_ENABLED", "true"),
        ])
        .keepalive()
        .unwrap();
        assert_eq!(
            (k.time, k.interval, k.retries, k.user_timeout),
            (Duration::from_secs(30), Duration::from_secs(10), 3, true)
        );
        assert_eq!(k.user_timeout_value(), Duration::from_secs(60));
        assert!(ok(&[("KEEPALIVE_ENABLED", "false")]).keepalive().is_none());
        assert_eq!(
            ok(&[("CONNECTION_TERMINATION_DEADLINE", "12s")]).drain_timeout,
            Duration::from_secs(12)
        );
        for (grace, drain) in [("30", 25), ("10", 9), ("1", 1), ("0", 1)] {
            assert_eq!(
                ok(&[("TERMINATION_GRACE_PERIOD_SECONDS", grace)]).drain_timeout,
                Duration::from_secs(drain),
                "grace {grace}"
            );
        }
        assert_eq!(
            ok(&[
                ("TERMINATION_GRACE_PERIOD_SECONDS", "30"),
                ("CONNECTION_TERMINATION_DEADLINE", "2s")
            ])
            .drain_timeout,
            Duration::from_secs(2),
            "the explicit deadline wins"
        );
        assert_eq!(
            ok(&[("SECRET_TTL", "1h")]).cert_ttl,
            Duration::from_secs(3600)
        );
        assert!(ok(&[("UNSTABLE_ENABLE_SOCKS5", "true")]).socks5);
        assert!(ok(&[("TLS12_ENABLED", "true")]).tls12);
        assert!(!ok(&[("TLS12_ENABLED", "false")]).tls12);
        assert!(!ok(&[("IPV6_ENABLED", "false")]).ipv6_enabled);
        assert!(ok(&[("ENABLE_RESPONSE_BAGGAGE", "false")]).no_response_baggage);
        assert!(!ok(&[("ENABLE_RESPONSE_BAGGAGE", "true")]).no_response_baggage);
        assert_eq!(ok(&[("LOG_FORMAT", "json")]).log_format, LogFormat::Json);
        assert_eq!(
            ok(&[("LOCAL_XDS_PATH", "/etc/mesh.yaml")]).config,
            Some(PathBuf::from("/etc/mesh.yaml"))
        );
        assert_eq!(
            ok(&[("LOCAL_XDS", "workloads: []\n")])
                .config_inline
                .as_deref(),
            Some("workloads: []\n")
        );
        assert_eq!(ok(&[("ISTIO_META_CLUSTER_ID", "east")]).cluster_id, "east");
        assert!(ok(&[("PROXY_MODE", "shared")]).inpod);
        let fake = parse(
            &["--ca-address", "https://ca:15012"],
            &[("FAKE_CA", "true")],
        );
        assert!(format!("{:#}", fake.unwrap_err()).contains("FAKE_CA"));
    }

    /// ZTUNNEL_WORKER_THREADS and ProxyConfig concurrency, against the CPUs.
    #[test]
    fn worker_threads_as_ztunnel_counts_them() {
        let count =
            |env: &[(&str, &str)], allowed| worker_count(&ok(env), allowed).map(|c| c.count);
        assert_eq!(count(&[], 8), None, "ringway's own default");
        assert_eq!(count(&[("ZTUNNEL_WORKER_THREADS", "3")], 8), Some(3));
        assert_eq!(count(&[("ZTUNNEL_WORKER_THREADS", "0")], 8), Some(8));
        assert_eq!(count(&[("ZTUNNEL_WORKER_THREADS", "50%")], 8), Some(4));
        assert_eq!(
            count(
                &[
                    ("ZTUNNEL_WORKER_THREADS", "30%"),
                    ("ZTUNNEL_CPU_LIMIT", "5")
                ],
                8
            ),
            Some(2),
            "30% of a 5-CPU limit, rounded up"
        );
        assert_eq!(
            count(
                &[
                    ("ZTUNNEL_WORKER_THREADS", "50%"),
                    ("ZTUNNEL_RESOURCE_CPU_LIMIT", "2")
                ],
                8
            ),
            Some(1)
        );
        assert_eq!(
            count(&[("ZTUNNEL_WORKER_THREADS", "16")], 4),
            Some(4),
            "capped"
        );
        assert_eq!(count(&[("PROXY_CONFIG", "concurrency: 2")], 8), Some(2));
        assert_eq!(
            count(
                &[
                    ("PROXY_CONFIG", "concurrency: 2"),
                    ("ZTUNNEL_WORKER_THREADS", "5")
                ],
                8
            ),
            Some(5),
            "ZTUNNEL_WORKER_THREADS wins over concurrency"
        );
        assert_eq!(ok(&[("ZTUNNEL_CPU_LIMIT", "3")]).cpu_limit, Some(3));
        assert!(err(&[], &[("ZTUNNEL_WORKER_THREADS", "150%")]).contains("ZTUNNEL_WORKER_THREADS"));
        let (args, notices) = parse(&["--cores", "1"], &[("ZTUNNEL_WORKER_THREADS", "3")]).unwrap();
        assert_eq!(args.worker_threads, None, "--cores wins");
        assert!(notices
            .iter()
            .any(|n| matches!(n, Notice::Info(m) if m.contains("--cores"))));
    }

    /// PROXY_CONFIG's ports and discovery address.
    #[test]
    fn proxy_config_fields() {
        let a = ok(&[(
            "PROXY_CONFIG",
            r#"{"proxyAdminPort": 15999, "statsPort": 15888, "discoveryAddress": "istiod.x:15012"}"#,
        )]);
        assert_eq!(a.admin_addr, "127.0.0.1:15999".parse().unwrap());
        assert_eq!(a.stats_addr.port(), 15888);
        assert_eq!(a.xds_address.as_deref(), Some("https://istiod.x:15012"));
        assert_eq!(
            ok(&[
                ("PROXY_CONFIG", "discoveryAddress: istiod.x:15012\n"),
                ("LOCAL_XDS_PATH", "/etc/mesh.yaml")
            ])
            .xds_address,
            None,
            "a local config is not replaced by discoveryAddress"
        );
        let (a, notices) = parse(
            &["--admin-addr", "127.0.0.1:0"],
            &[("PROXY_CONFIG", "proxyAdminPort: 15999")],
        )
        .unwrap();
        assert_eq!(a.admin_addr.port(), 0, "the flag wins");
        assert!(!notices.is_empty());
    }

    /// Warned variables warn, refused ones fail naming every one, values
    /// that match what ringway does pass quietly.
    #[test]
    fn warned_and_refused_variables() {
        let (_, notices) = parse(&[], &[("PREFERED_SERVICE_NAMESPACE", "istio-system")]).unwrap();
        assert!(
            matches!(&notices[..], [Notice::Warn(m)] if m.contains("PREFERED_SERVICE_NAMESPACE")),
            "{notices:?}"
        );
        let e = err(
            &[],
            &[("COMPLIANCE_POLICY", "pqc"), ("ALT_CA_HOSTNAME", "istiod")],
        );
        assert!(
            e.contains("COMPLIANCE_POLICY") && e.contains("ALT_CA_HOSTNAME"),
            "{e}"
        );
        assert!(err(&[], &[("XDS_HEADER_X_TENANT", "a")]).contains("XDS_HEADER_X_TENANT"));
        assert!(err(&[], &[("ENABLE_PROXY", "false")]).contains("ENABLE_PROXY"));
        for quiet in [
            ("TLS12_ENABLED", "false"),
            ("ENABLE_PROXY", "true"),
            ("LOCALHOST_APP_TUNNEL", "true"),
            ("COMPLIANCE_POLICY", ""),
            ("CRL_PATH", "/etc/crl.pem"),
            ("INPOD_PORT_REUSE", "true"),
        ] {
            let (_, notices) = parse(&[], &[quiet]).unwrap();
            assert!(notices.is_empty(), "{quiet:?}: {notices:?}");
        }
        let (_, notices) = parse(&[], &[("SERVICE_ACCOUNT", "ztunnel")]).unwrap();
        assert!(matches!(&notices[..], [Notice::Info(m)] if m.contains("SERVICE_ACCOUNT")));
        assert!(err(&[], &[("PROXY_MODE", "sidecar")]).contains("PROXY_MODE"));
        assert!(err(&[], &[("PROXY_MODE", "dedicated")]).contains("PROXY_WORKLOAD_INFO"));
        assert!(err(&[], &[("LOCAL_XDS_PATH", "/a"), ("LOCAL_XDS", "x: 1")]).contains("LOCAL_XDS"));
        assert!(err(&[], &[("PACKET_MARK", "0x539")]).contains("PACKET_MARK"));
        assert!(err(&[], &[("HTTP2_FRAME_SIZE", "1M")]).contains("HTTP2_FRAME_SIZE"));
        assert!(err(&[], &[("KEEPALIVE_ENABLED", "yes")]).contains("KEEPALIVE_ENABLED"));
    }
}
