//! The `ringway` binary's wiring ([`run`]): read the flags, plan the cores,
//! load the config, bind listeners, start the control thread and the
//! per-core executors, then wait for them to drain and stop.
//!
//! - [`cli`]: flags and environment, and the settings built from them;
//!   [`ztunnel_env`]: ztunnel's environment variables mapped onto them.
//! - [`plan`]: which CPUs get an executor, and pinning; [`cgroup`]: the
//!   cgroup CPU quota and cpuset it reads.
//! - [`checks`]: what the host must allow (io_uring, locked memory, fds).
//! - [`cores`]: the executors and each core's main loop.
//! - [`control`]: the control thread (config source, certificates, side
//!   ports, signals); [`signals`]: which threads see SIGTERM.

pub mod cgroup;
pub mod checks;
pub mod cli;
pub mod control;
pub mod cores;
#[doc(hidden)]
pub mod fuzzing;
pub mod plan;
pub mod signals;
pub mod ztunnel_env;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use ringway_controlplane::security::ca::BuiltinCa;
use ringway_controlplane::security::caclient::CaClientConfig;
use ringway_controlplane::security::certs::{self, CertPublisher, LocalWorkloads};
use ringway_controlplane::security::crl::{self, CrlSet, CrlStore};
use ringway_controlplane::security::pki;
use ringway_controlplane::sources::local;
use ringway_controlplane::sources::xds::{on_demand_channel, NodeInfo, OnDemandSender, XdsConfig};
use ringway_controlplane::SnapshotPublisher;
use tokio::sync::watch;

use crate::app::cgroup::format_cpu_list;
use crate::app::checks::{check_io_uring, check_memlock, raise_nofile};
use crate::app::cli::{Args, DnsPlan};
use crate::app::control::{CertSourceKind, ConfigSource, Control};
use crate::app::cores::{start_cores, ClosingOrder, CoreSeed};
use crate::app::plan::{allowed_cpu_count, format_cpus, plan_cores, CorePlan, CpuFacts};
use crate::app::signals::set_termination_signals_blocked;
use crate::core::ControlHandles;
use crate::inpod::manager::{InpodManager, InpodSettings, InpodStatus, PodDnsSettings};
use crate::inpod::PodPorts;
use crate::io::listener::{bind_all, bind_dns, SelfAddrs, TrafficPath};
use crate::io::socket;
use crate::telemetry::admin::Admin;
use crate::telemetry::metrics::MetricsHub;

pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.admin_addr.ip().is_loopback() && !args.admin_allow_remote {
        anyhow::bail!(
            "--admin-addr {} is not a loopback address: the admin endpoint shows the whole \
             config and can stop ringway; pass --admin-allow-remote to expose it anyway",
            args.admin_addr
        );
    }
    if args.inpod && !args.inpod_port_reuse {
        anyhow::bail!(
            "INPOD_PORT_REUSE=false (--inpod-port-reuse false) cannot be honoured: ringway \
             listens on every core with its own socket, so pods' ports are always shared \
             with SO_REUSEPORT; leave it unset or true"
        );
    }
    if args.tls12 {
        // Before any certificate's configs are built.
        ringway_controlplane::security::tls::enable_tls12();
        tracing::info!("TLS12_ENABLED: HBONE also offers and accepts TLS 1.2");
    }
    set_termination_signals_blocked(true);
    let mut cfg = args.proxy_config();
    let dns = args.dns_plan(&|k| std::env::var(k).ok())?;
    cfg.dns = dns.as_ref().map(|d| d.settings.clone());

    // Before the slower steps, so a bad --cores or pinning flag fails fast.
    let plan = plan_executors(&args)?;
    tracing::info!(
        cores = %format_cpu_list(&plan.cpus),
        pinned = plan.pin,
        cores_reason = plan.cores_reason.as_str(),
        pin_reason = plan.pin_reason.as_str(),
        "cores planned"
    );
    if let Some(warning) = &plan.warning {
        tracing::warn!("{warning}");
    }

    // The config: an invalid local file must stop startup clearly.
    let publisher = SnapshotPublisher::new();
    let (on_demand_tx, source) = config_source(&args, &publisher)?;

    // Certificates. With the built-in CA, this node's certificates exist
    // before any core runs; with an external CA they are fetched by the
    // manager (prefetch) or on first use (urgent), failing closed meanwhile.
    // This node's workloads: those on --node-name; without it, those at
    // the host's own addresses (in-pod: the enrolled pods, none yet).
    // Every other identity is fetched when a connection first needs it.
    let local_workloads = match (&args.node_name, args.inpod) {
        (Some(node), _) => LocalWorkloads::Node(node.clone()),
        (None, true) => LocalWorkloads::hosted([], []),
        (None, false) => LocalWorkloads::hosted([], socket::local_interface_addrs()),
    };
    let (local_tx, local_rx) = watch::channel(local_workloads);
    let cert_publisher = CertPublisher::new();
    let cert_source = match &args.ca_address {
        Some(addr) => {
            let mut ca = CaClientConfig::new(addr.clone());
            ca.root_cert = args.ca_root_ca.clone();
            ca.token_file = args.auth_token.clone();
            ca.cluster_id = args.cluster_id.clone();
            ca.validity = args.cert_ttl;
            CertSourceKind::IstioCa(Box::new(ca))
        }
        None => {
            let ca = Arc::new(
                BuiltinCa::load_or_create(&args.ca_dir, &args.trust_domain)
                    .with_context(|| format!("built-in CA in {}", args.ca_dir.display()))?,
            );
            let needed = certs::local_identities(&publisher.current(), &local_rx.borrow());
            cert_publisher.publish(
                certs::issue_all(&ca, needed, args.cert_ttl)
                    .context("issuing workload certificates")?,
            );
            CertSourceKind::Builtin {
                ca,
                ttl: args.cert_ttl,
            }
        }
    };

    // Revocation lists (CRL_PATH): in force before any core handshakes. A
    // file that does not load stops startup (fail closed); the control
    // thread then reloads it on change.
    let crl = match &args.crl_path {
        None => None,
        Some(path) => {
            let known = match &cert_source {
                CertSourceKind::Builtin { ca, .. } => ca.ca_certs(),
                CertSourceKind::IstioCa(_) => args
                    .ca_root_ca
                    .as_deref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .and_then(|pem| pki::parse_certs(&pem, "CA roots").ok())
                    .unwrap_or_default(),
            };
            let set = CrlSet::load(path, &known)
                .with_context(|| format!("CRL_PATH: cannot load {}", path.display()))?;
            crl::log_loaded(path, &set, "loaded the CRL file");
            CrlStore::global().install(set);
            Some((path.clone(), known))
        }
    };

    // Loading the config (and issuing certificates) freed several times
    // what it kept: give those pages back now rather than as they decay.
    crate::telemetry::allocator::purge();

    check_memlock(plan.cpus.len())?;
    check_io_uring()?;
    let nofile = raise_nofile();
    cfg.conn_caps = args.conn_caps(nofile, plan.cpus.len());
    cfg.dials.per_core = args.dials_per_core(cfg.conn_caps.total);
    tracing::info!(
        nofile,
        max_connections_per_core = cfg.conn_caps.total,
        max_dials_per_core = cfg.dials.per_core,
        "file descriptor limit"
    );

    // In-pod mode listens inside each enrolled pod, not at the node.
    let mut specs = if args.inpod {
        Vec::new()
    } else {
        vec![
            (TrafficPath::Outbound, args.outbound_addr.clone()),
            (
                TrafficPath::InboundPassthrough,
                args.inbound_passthrough_addr.clone(),
            ),
            (TrafficPath::Inbound, args.inbound_addr.clone()),
        ]
    };
    let socks5 = args.socks5_addrs();
    if !socks5.is_empty() {
        specs.push((TrafficPath::Socks5, socks5));
    }
    let keepalive = args.keepalive();
    let per_core = bind_all(&specs, plan.cpus.len(), keepalive, false)?;
    // In-pod, the DNS sockets are each pod's, bound at its enrolment.
    let mut dns_per_core = match &dns {
        Some(d) if !args.inpod => bind_dns(&d.addrs, plan.cpus.len())?,
        _ => (0..plan.cpus.len()).map(|_| Vec::new()).collect(),
    };
    let dns_bound: Vec<std::net::SocketAddr> = dns_per_core[0].iter().map(|l| l.addr).collect();
    if let Some(d) = &dns {
        let addrs = if args.inpod {
            format!("{} in every enrolled pod", d.addrs[0])
        } else {
            format!("{dns_bound:?}")
        };
        tracing::info!(
            %addrs,
            upstreams = ?d.settings.upstreams,
            timeout = ?d.settings.timeout,
            "DNS proxy on"
        );
    }
    let bound: Vec<(TrafficPath, std::net::SocketAddr)> =
        per_core[0].iter().map(|l| (l.path, l.addr)).collect();
    let pod_ports = PodPorts::default();
    let mut self_addrs = SelfAddrs {
        ports: bound
            .iter()
            .map(|(_, a)| a.port())
            .chain(dns_bound.iter().map(|a| a.port()))
            .collect(),
        local_ips: socket::local_interface_addrs(),
    };
    if args.inpod {
        self_addrs
            .ports
            .extend(pod_ports.all().iter().map(|(_, port)| *port));
    }
    let readiness = std::net::TcpListener::bind(args.readiness_addr).with_context(|| {
        format!(
            "cannot bind the readiness endpoint on {}",
            args.readiness_addr
        )
    })?;
    readiness.set_nonblocking(true)?;
    let readiness_addr = readiness.local_addr()?;
    let stats = std::net::TcpListener::bind(args.stats_addr).with_context(|| {
        format!(
            "cannot bind the metrics endpoint on {} (--stats-addr)",
            args.stats_addr
        )
    })?;
    stats.set_nonblocking(true)?;
    let stats_addr = stats.local_addr()?;
    let metrics = Arc::new(MetricsHub::default());
    let admin_listener = std::net::TcpListener::bind(args.admin_addr).with_context(|| {
        format!(
            "cannot bind the admin endpoint on {} (--admin-addr)",
            args.admin_addr
        )
    })?;
    admin_listener.set_nonblocking(true)?;
    let admin_addr = admin_listener.local_addr()?;
    let admin = Admin {
        snapshots: publisher.clone(),
        certs: cert_publisher.clone(),
        metrics: metrics.clone(),
        config: static_config(&args, &plan, dns.as_ref(), &dns_bound),
        local: local_rx.clone(),
        quit: Arc::new(tokio::sync::Notify::new()),
        inpod: None,
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let cores_ready = Arc::new(AtomicBool::new(false));
    let inpod = args.inpod.then(|| {
        InpodManager::new(InpodSettings {
            cores: plan.cpus.len(),
            ports: pod_ports,
            keepalive,
            cluster_id: args.cluster_id.clone(),
            // Well inside istio-cni's 5 s deadline for an answer: a late ack
            // would be read as the answer to its next request.
            settle: Duration::from_secs(2),
            dns: dns.as_ref().map(|d| PodDnsSettings {
                addr: d.addrs[0],
                localhost: d.localhost,
                upstreams: d.settings.upstreams.clone(),
                mark: args.mark,
            }),
        })
    });
    let mut admin = admin;
    admin.inpod = inpod.as_ref().map(|(_, _, status)| status.clone());
    let started = Control {
        source,
        certs: cert_source,
        crl,
        snapshots: publisher.clone(),
        cert_publisher: cert_publisher.clone(),
        node: args.node_name.clone(),
        local: local_tx,
        pods: inpod.as_ref().map(|(_, feed, _)| feed.clone()),
        readiness,
        stats,
        metrics: metrics.clone(),
        admin_listener,
        admin,
        cores_ready: cores_ready.clone(),
        inpod: inpod.as_ref().map(|(_, _, status)| status.clone()),
        shutdown: shutdown_tx,
        drain: cfg.drain_timeout,
        pin: args.control_core,
    }
    .start()?;

    let control = ControlHandles {
        snapshot_feed: publisher.subscribe(),
        cert_feed: cert_publisher.subscribe(),
        cert_requests: Some(started.cert_requests),
        on_demand: on_demand_tx,
    };
    let closing = Arc::new(ClosingOrder::default());
    let seeds = per_core
        .into_iter()
        .enumerate()
        .map(|(index, listeners)| CoreSeed {
            index,
            cfg: cfg.clone(),
            listeners,
            feed: publisher.subscribe(),
            cert_feed: cert_publisher.subscribe(),
            control: control.clone(),
            shutdown: shutdown_rx.clone(),
            self_addrs: self_addrs.clone(),
            metrics: metrics.core(!args.no_metrics),
            pods: inpod.as_ref().map(|(_, feed, _)| feed.clone()),
            dns: std::mem::take(&mut dns_per_core[index]),
            closing: closing.clone(),
        })
        .collect();
    let handles = start_cores(&plan, seeds, &cores_ready)?;
    cores_ready.store(true, Ordering::Release);
    // The ZDS client starts once every core follows the pod set: an ack
    // then means every core serves the pod.
    let zds_stop = Arc::new(AtomicBool::new(false));
    let zds = match inpod {
        Some((mut manager, _, status)) => {
            let cfg = ringway_controlplane::sources::zds::ZdsConfig::new(args.inpod_uds.clone());
            let stop = zds_stop.clone();
            tracing::info!(socket = %cfg.socket.display(), "in-pod mode: enrolling pods from the node agent over ZDS");
            // Shutdown ends the ZDS connection as it begins, before the
            // cores drain (they stop following the pod set then): an add
            // acknowledged during the drain would be a pod nobody serves.
            let mut draining = shutdown_rx.clone();
            let stop_at_drain = zds_stop.clone();
            std::thread::Builder::new()
                .name("ringway-zds-stop".into())
                .spawn(move || {
                    futures_lite::future::block_on(async {
                        let _ = draining.wait_for(|closing| *closing).await;
                    });
                    stop_at_drain.store(true, Ordering::Release);
                })
                .context("cannot start the ZDS stop thread")?;
            Some(
                std::thread::Builder::new()
                    .name("ringway-zds".into())
                    .spawn(move || {
                        let _lost = ZdsThreadGuard {
                            status,
                            stop: stop.clone(),
                        };
                        ringway_controlplane::sources::zds::run(&cfg, &mut manager, &stop);
                    })
                    .context("cannot start the ZDS thread")?,
            )
        }
        None => None,
    };

    let mut by_path: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, addr) in &bound {
        by_path
            .entry(path.name())
            .or_default()
            .push(addr.to_string());
    }
    for addr in &dns_bound {
        by_path.entry("dns").or_default().push(addr.to_string());
    }
    by_path
        .entry("readiness")
        .or_default()
        .push(readiness_addr.to_string());
    by_path
        .entry("stats")
        .or_default()
        .push(stats_addr.to_string());
    by_path
        .entry("admin")
        .or_default()
        .push(admin_addr.to_string());
    if let Some(file) = &args.bound_addrs_file {
        let json = serde_json::json!({ "listeners": by_path, "cores": plan.cpus.len(), "pid": std::process::id() });
        std::fs::write(file, json.to_string())
            .with_context(|| format!("cannot write --bound-addrs-file {}", file.display()))?;
    }
    tracing::info!(
        cores = %format_cpus(&plan.cpus),
        pinned = plan.pin,
        copy_mode = ?cfg.copy_mode,
        io_mode = ?cfg.ring.io,
        listeners = %serde_json::to_string(&by_path).unwrap_or_default(),
        "ringway ready"
    );

    let mut failed = false;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed = true;
                tracing::error!(core = i, error = %format!("{e:#}"), "core stopped with an error");
            }
            Err(e) => {
                failed = true;
                tracing::error!(core = i, error = %e, "core crashed");
            }
        }
    }
    zds_stop.store(true, Ordering::Release);
    if let Some(zds) = zds {
        let _ = zds.join();
    }
    if failed {
        anyhow::bail!("one or more cores failed");
    }
    tracing::info!("ringway stopped");
    Ok(())
}

/// The executors: --cores, else ztunnel's worker threads
/// (ZTUNNEL_WORKER_THREADS, ProxyConfig concurrency), else ringway's
/// default, at most ZTUNNEL_CPU_LIMIT of them.
fn plan_executors(args: &Args) -> anyhow::Result<CorePlan> {
    let facts = CpuFacts::read();
    let pin = args.pin_mode()?;
    if args.cores.is_some() {
        return plan_cores(args.cores.as_deref(), &facts, pin);
    }
    let allowed = allowed_cpu_count(&facts);
    let (count, how) = match ztunnel_env::worker_count(args, allowed) {
        Some(w) => {
            if w.capped {
                tracing::warn!("ztunnel's worker threads: {}", w.how);
            }
            (w.count, format!("ztunnel's worker threads ({})", w.how))
        }
        None => {
            let plan = plan_cores(None, &facts, pin)?;
            match args.cpu_limit {
                Some(limit) if limit < plan.cpus.len() => {
                    (limit, format!("ztunnel's CPU limit of {limit}"))
                }
                _ => return Ok(plan),
            }
        }
    };
    let mut plan = plan_cores(Some(&count.to_string()), &facts, pin)?;
    plan.cores_reason = format!("{how}: {}", plan.cores_reason);
    Ok(plan)
}

/// Notices the ZDS thread ending before shutdown (a panic): no pod can be
/// added or removed any more, so readiness turns 503 for good and the log
/// says why; the pods already enrolled stay served.
struct ZdsThreadGuard {
    status: Arc<InpodStatus>,
    stop: Arc<AtomicBool>,
}

impl Drop for ZdsThreadGuard {
    fn drop(&mut self) {
        if !self.stop.load(Ordering::Acquire) {
            self.status.lost.store(true, Ordering::Release);
            tracing::error!(
                "the ZDS thread stopped: pods can no longer be enrolled or removed; \
                 readiness reports 503 from now on"
            );
        }
    }
}

/// The `config` of `/config_dump`: the settings ringway runs with.
fn static_config(
    args: &Args,
    plan: &CorePlan,
    dns: Option<&DnsPlan>,
    dns_bound: &[std::net::SocketAddr],
) -> serde_json::Value {
    // In-pod, the address each pod's DNS sockets have.
    let dns_addrs: Vec<String> = match dns {
        Some(d) if args.inpod => d.addrs.iter().map(|a| a.to_string()).collect(),
        _ => dns_bound.iter().map(|a| a.to_string()).collect(),
    };
    serde_json::json!({
        "dnsProxy": dns.is_some(),
        "dnsProxyAddr": dns_addrs,
        "dnsUpstreams": dns.map(|d| d.settings.upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>()),
        "dnsForwardTimeout": dns.map(|d| format!("{:?}", d.settings.timeout)),
        "clusterDomain": args.cluster_domain,
        "proxyMode": if args.proxy_workload.is_some() { "Dedicated" } else { "Shared" },
        "inpodEnabled": args.inpod,
        "inpodUds": args.inpod.then(|| args.inpod_uds.display().to_string()),
        "proxyWorkloadInformation": args.proxy_workload.as_ref().map(|w| w.to_string()),
        "localNode": args.node_name,
        "network": args.network,
        "xdsAddress": args.xds_address,
        "xdsOnDemand": args.xds_on_demand,
        "caAddress": args.ca_address,
        "clusterId": args.cluster_id,
        "localXdsPath": args.config.as_ref().map(|p| p.display().to_string()),
        "adminAddr": args.admin_addr.to_string(),
        "statsAddr": args.stats_addr.to_string(),
        "readinessAddr": args.readiness_addr.to_string(),
        "cores": plan.cpus,
        "pinned": plan.pin,
        "coresReason": plan.cores_reason,
        "pinReason": plan.pin_reason,
        "requireOriginalSource": args.orig_src(),
        "fastPath": !args.no_fast_path,
        // ztunnel's names for the settings its variables tune.
        "packetMark": args.mark,
        "poolMaxStreamsPerConn": args.pool_max_streams,
        "poolUnusedReleaseTimeout": format!("{:?}", args.pool_idle_timeout),
        "windowSize": args.h2_stream_window,
        "connectionWindowSize": args.h2_connection_window,
        "frameSize": args.h2_max_frame_size,
        "socketConfig": {
            "keepaliveEnabled": !args.tcp_keepalive.is_zero(),
            "keepaliveTime": format!("{:?}", args.tcp_keepalive),
            "keepaliveInterval": format!("{:?}", args.tcp_keepalive_interval),
            "keepaliveRetries": args.tcp_keepalive_retries,
            "userTimeoutEnabled": args.tcp_user_timeout,
        },
        "selfTerminationDeadline": format!("{:?}", args.drain_timeout),
        "secretTtl": format!("{:?}", args.cert_ttl),
        "socks5Addr": args.socks5_addrs().first().map(|a| a.to_string()),
        "ipv6Enabled": args.ipv6_enabled,
        "enableResponseBaggage": !args.no_response_baggage,
        "tls12Enabled": args.tls12,
        "cpuLimit": args.cpu_limit,
    })
}

/// The config source from the flags: xDS when --xds-address is set
/// (snapshots arrive later), else the local file or the embedded default,
/// loaded and published now.
fn config_source(
    args: &Args,
    publisher: &SnapshotPublisher,
) -> anyhow::Result<(Option<OnDemandSender>, ConfigSource)> {
    if let Some(addr) = &args.xds_address {
        let mut node = NodeInfo::from_env();
        if let Some(n) = &args.node_name {
            node.node_name = n.clone();
        }
        let mut cfg = XdsConfig::new(addr.clone(), node);
        cfg.root_ca = args.xds_root_ca.clone();
        cfg.token_path = args.auth_token.clone();
        cfg.cluster_id = args.cluster_id.clone();
        cfg.on_demand = args.xds_on_demand;
        cfg.validate()
            .map_err(|e| anyhow!("xDS configuration: {e}"))?;
        let (tx, rx) = if args.xds_on_demand {
            let (tx, rx) = on_demand_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        tracing::info!(address = %addr, on_demand = args.xds_on_demand, "config from xDS");
        return Ok((
            tx,
            ConfigSource::Xds {
                cfg: Box::new(cfg),
                on_demand: rx,
            },
        ));
    }
    let (snapshot, loaded) = match (&args.config, &args.config_inline) {
        (None, Some(text)) => {
            tracing::info!("config from LOCAL_XDS (inline, not watched)");
            let snapshot = local::load_snapshot(text, "LOCAL_XDS").map_err(|e| anyhow!("{e}"))?;
            (snapshot, None)
        }
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            let snapshot = local::load_snapshot(&text, &path.display().to_string())
                .map_err(|e| anyhow!("{e}"))?;
            (snapshot, Some(local::ContentDigest::of(text.as_bytes())))
        }
        (None, None) => {
            tracing::info!(
                "no --config given: using the embedded default config (examples/local.yaml)"
            );
            let snapshot =
                local::load_snapshot(local::EXAMPLE_CONFIG, "embedded examples/local.yaml")
                    .map_err(|e| anyhow!("{e}"))?;
            (snapshot, None)
        }
    };
    publisher.publish(snapshot);
    let snap = publisher.current();
    tracing::info!(
        workloads = snap.workloads().count(),
        services = snap.services().count(),
        policies = snap.policy_count(),
        "config loaded"
    );
    Ok((
        None,
        ConfigSource::Local {
            path: args.config.clone(),
            poll: args.config_poll_interval,
            loaded,
        },
    ))
}

/// `ringway cert issue`: mint a certificate from the built-in CA.
pub fn issue_cert(spiffe_id: &str, ca_dir: &Path, out: &Path, ttl: Duration) -> anyhow::Result<()> {
    let cert = ringway_controlplane::security::ca::issue_to_dir(ca_dir, spiffe_id, out, ttl)
        .with_context(|| format!("issuing {spiffe_id}"))?;
    println!(
        "issued {} (valid until {}) into {}: key.pem cert.pem cert-chain.pem root-cert.pem",
        cert.identity,
        humantime_utc(cert.not_after),
        out.display()
    );
    Ok(())
}

fn humantime_utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("unix {secs}")
}
