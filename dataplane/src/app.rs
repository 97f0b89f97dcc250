//! Wiring for the `ringway` binary: load the config, bind listeners, start
//! the control thread (config watch, signals) and the per-core executors,
//! then wait for them to drain and stop.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, Context};
use ringway_controlplane::ca::BuiltinCa;
use ringway_controlplane::certs::{self, CertPublisher};
use ringway_controlplane::{local, SnapshotPublisher};
use tokio::sync::watch;

use crate::config::{allowed_cpus, format_cpus, plan_cores, Args, ProxyConfig};
use crate::listeners::{bind_all, SelfAddrs, TrafficPath};
use crate::runtime::{check_memlock, raise_nofile, start_cores, CoreSeed};
use crate::socket;

/// SIGTERM/SIGINT must reach the control thread only: delivered to a core
/// thread they would interrupt its io_uring calls (EINTR) for nothing.
/// Threads inherit the mask, so block here before any thread starts; the
/// control thread unblocks them for itself.
fn set_termination_signals_blocked(blocked: bool) {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let how = if blocked {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    set_termination_signals_blocked(true);
    let cfg = ProxyConfig::from_args(&args);

    // Config first: an invalid file must stop startup with a clear message.
    let publisher = SnapshotPublisher::new();
    let snapshot = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            local::load_snapshot(&text, &path.display().to_string()).map_err(|e| anyhow!("{e}"))?
        }
        None => {
            tracing::info!(
                "no --config given: using the embedded default config (examples/local.yaml)"
            );
            local::load_snapshot(local::EXAMPLE_CONFIG, "embedded examples/local.yaml")
                .map_err(|e| anyhow!("{e}"))?
        }
    };
    publisher.publish(snapshot);
    {
        let snap = publisher.current();
        tracing::info!(
            workloads = snap.workloads().count(),
            services = snap.services().count(),
            policies = snap.policies().count(),
            "config loaded"
        );
    }

    // Certificates before cores: a core must never serve HBONE without them.
    let ca = Arc::new(
        BuiltinCa::load_or_create(&args.ca_dir, &args.trust_domain)
            .with_context(|| format!("built-in CA in {}", args.ca_dir.display()))?,
    );
    let cert_publisher = CertPublisher::new();
    let needed = certs::wanted_identities(&publisher.current(), args.node_name.as_deref());
    cert_publisher.publish(
        certs::issue_all(&ca, needed, args.cert_ttl).context("issuing workload certificates")?,
    );

    let plan = plan_cores(args.cores.as_deref(), &allowed_cpus(), !args.no_pin)?;
    check_memlock()?;
    raise_nofile();

    let mut specs = vec![
        (TrafficPath::Outbound, args.outbound_addr.clone()),
        (
            TrafficPath::InboundPassthrough,
            args.inbound_passthrough_addr.clone(),
        ),
        (TrafficPath::Inbound, args.inbound_addr.clone()),
    ];
    let socks5 = args.socks5_addrs();
    if !socks5.is_empty() {
        specs.push((TrafficPath::Socks5, socks5));
    }
    let per_core = bind_all(&specs, plan.cpus.len())?;
    let bound: Vec<(TrafficPath, std::net::SocketAddr)> =
        per_core[0].iter().map(|l| (l.path, l.addr)).collect();
    let self_addrs = SelfAddrs {
        ports: bound.iter().map(|(_, a)| a.port()).collect(),
        local_ips: socket::local_interface_addrs(),
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    start_control_thread(
        &args,
        publisher.clone(),
        ControlCerts {
            ca,
            publisher: cert_publisher.clone(),
        },
        shutdown_tx,
        cfg.drain_timeout,
    )?;

    let seeds = per_core
        .into_iter()
        .enumerate()
        .map(|(index, listeners)| CoreSeed {
            index,
            cfg: cfg.clone(),
            listeners,
            feed: publisher.subscribe(),
            cert_feed: cert_publisher.subscribe(),
            shutdown: shutdown_rx.clone(),
            self_addrs: self_addrs.clone(),
        })
        .collect();
    let handles = start_cores(&plan, seeds)?;

    let mut by_path: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, addr) in &bound {
        by_path
            .entry(path.name())
            .or_default()
            .push(addr.to_string());
    }
    if let Some(file) = &args.bound_addrs_file {
        let json = serde_json::json!({ "listeners": by_path, "cores": plan.cpus.len(), "pid": std::process::id() });
        std::fs::write(file, json.to_string())
            .with_context(|| format!("cannot write --bound-addrs-file {}", file.display()))?;
    }
    tracing::info!(
        cores = %format_cpus(&plan.cpus),
        pinned = plan.pin,
        copy_mode = ?cfg.copy_mode,
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
    if failed {
        anyhow::bail!("one or more cores failed");
    }
    tracing::info!("ringway stopped");
    Ok(())
}

/// `ringway cert issue`: mint a certificate from the built-in CA.
pub fn issue_cert(spiffe_id: &str, ca_dir: &Path, out: &Path, ttl: Duration) -> anyhow::Result<()> {
    let cert = ringway_controlplane::ca::issue_to_dir(ca_dir, spiffe_id, out, ttl)
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

/// What the control thread needs to keep certificates fresh.
struct ControlCerts {
    ca: Arc<BuiltinCa>,
    publisher: CertPublisher,
}

/// The control thread: a current-thread tokio runtime that owns the config
/// watcher, the certificate manager and the signal handlers. Returns once
/// the handlers are installed, so a SIGTERM right after startup drains
/// instead of killing.
fn start_control_thread(
    args: &Args,
    publisher: SnapshotPublisher,
    certs: ControlCerts,
    shutdown: watch::Sender<bool>,
    drain: Duration,
) -> anyhow::Result<()> {
    let config_path = args.config.clone();
    let poll = args.config_poll_interval;
    let node = args.node_name.clone();
    let ttl = args.cert_ttl;
    let (installed_tx, installed_rx) = mpsc::channel::<anyhow::Result<()>>();
    std::thread::Builder::new()
        .name("ringway-control".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = installed_tx.send(Err(anyhow!("cannot start the control runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                    (Ok(t), Ok(i)) => (t, i),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = installed_tx.send(Err(anyhow!("cannot install signal handlers: {e}")));
                        return;
                    }
                };
                // Handlers first, then unblock: a SIGTERM that arrived
                // during startup is pending and now drains instead of killing.
                set_termination_signals_blocked(false);
                let _ = installed_tx.send(Ok(()));
                tokio::spawn(certs::run_builtin_cert_manager(
                    certs.ca,
                    publisher.subscribe(),
                    certs.publisher,
                    node,
                    ttl,
                ));
                if let Some(path) = config_path {
                    tokio::spawn(local::watch_file(path, poll, publisher));
                }
                tokio::select! {
                    _ = term.recv() => tracing::info!(?drain, "SIGTERM: no longer accepting; draining open connections"),
                    _ = int.recv() => tracing::info!(?drain, "SIGINT: no longer accepting; draining open connections"),
                }
                let _ = shutdown.send(true);
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                tracing::warn!("second signal during drain: exiting now");
                std::process::exit(1);
            });
        })
        .context("cannot spawn the control thread")?;
    installed_rx
        .recv()
        .map_err(|_| anyhow!("the control thread died during startup"))?
}
