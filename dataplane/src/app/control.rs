//! The control thread: one current-thread tokio runtime (optionally pinned)
//! that owns everything slow or networked — the config source (local file
//! watcher or the xDS client), the certificate manager (built-in CA or the
//! Istio CA client), the readiness endpoint and signal handling. It
//! publishes snapshots; cores never wait on it synchronously.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, Context};
use ringway_controlplane::security::ca::BuiltinCa;
use ringway_controlplane::security::caclient::{CaClient, CaClientConfig};
use ringway_controlplane::security::certmanager::{
    BuiltinCaSource, CertManager, CertManagerConfig, CertRequests, CertSource,
};
use ringway_controlplane::security::certs::{local_identities, CertPublisher, LocalWorkloads};
use ringway_controlplane::security::crl::{self, CrlStore};
use ringway_controlplane::sources::local;
use ringway_controlplane::sources::xds::{self, OnDemandReceiver, XdsConfig, XdsStatus};
use ringway_controlplane::SnapshotPublisher;
use tokio::sync::watch;

use crate::inpod::manager::InpodStatus;
use crate::inpod::PodFeed;
use crate::telemetry::admin::Admin;
use crate::telemetry::http::{serve_http, Answer, SidePort, PROMETHEUS, TEXT};
use crate::telemetry::metrics::{MetricsHub, ProcessStats};

/// How often the control thread looks for a new `CRL_PATH` file (its
/// modification time, size and inode; the content when one changed).
const CRL_POLL: Duration = Duration::from_secs(1);

/// Where workloads, services and policies come from.
pub enum ConfigSource {
    /// The local YAML file (watched), or the embedded default (static).
    Local {
        path: Option<PathBuf>,
        poll: Duration,
        /// The digest of the file content already loaded and published
        /// at startup: the watcher does not load it a second time.
        loaded: Option<local::ContentDigest>,
    },
    /// Delta ADS from istiod (or ringway-devcp).
    Xds {
        cfg: Box<XdsConfig>,
        on_demand: Option<OnDemandReceiver>,
    },
}

/// Where workload certificates come from.
pub enum CertSourceKind {
    Builtin { ca: Arc<BuiltinCa>, ttl: Duration },
    IstioCa(Box<CaClientConfig>),
}

/// Everything the control thread runs.
pub struct Control {
    pub source: ConfigSource,
    pub certs: CertSourceKind,
    /// `CRL_PATH` (already loaded) to watch, and the CA certificates its
    /// CRLs' signatures are checked against on reload.
    pub crl: Option<(PathBuf, Vec<rustls_pki_types::CertificateDer<'static>>)>,
    pub snapshots: SnapshotPublisher,
    pub cert_publisher: CertPublisher,
    pub node: Option<String>,
    /// Which workloads are this node's: their certificates are prefetched
    /// and readiness waits for them. Kept current here (see
    /// [`follow_local_workloads`]) unless the node name says.
    pub local: watch::Sender<LocalWorkloads>,
    /// In-pod mode: the enrolled pods, this node's workloads without a
    /// node name.
    pub pods: Option<PodFeed>,
    pub readiness: std::net::TcpListener,
    /// The metrics endpoint's listener, and what it reports.
    pub stats: std::net::TcpListener,
    pub metrics: Arc<MetricsHub>,
    /// The admin endpoint's listener (loopback unless allowed otherwise),
    /// and what it serves; its /quitquitquit notifies `admin.quit`.
    pub admin_listener: std::net::TcpListener,
    pub admin: Admin,
    /// Set by the main thread once every core has its listeners bound.
    pub cores_ready: Arc<AtomicBool>,
    /// In-pod mode: the enrolled pods' state (ready once the node agent's
    /// pods are known and all of them run).
    pub inpod: Option<Arc<InpodStatus>>,
    pub shutdown: watch::Sender<bool>,
    pub drain: Duration,
    pub pin: Option<usize>,
}

/// What the cores get back from a started control thread.
pub struct Started {
    pub cert_requests: CertRequests,
}

impl Control {
    /// Spawns the control thread and returns once its signal handlers are
    /// installed and the certificate manager accepts requests.
    pub fn start(self) -> anyhow::Result<Started> {
        let (started_tx, started_rx) = mpsc::channel::<anyhow::Result<Started>>();
        std::thread::Builder::new()
            .name("ringway-control".into())
            .spawn(move || {
                if let Some(cpu) = self.pin {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                        tracing::warn!(cpu, "could not pin the control thread");
                    }
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            started_tx.send(Err(anyhow!("cannot start the control runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(self.run(started_tx));
            })
            .context("cannot spawn the control thread")?;
        started_rx
            .recv()
            .map_err(|_| anyhow!("the control thread died during startup"))?
    }

    async fn run(self, started: mpsc::Sender<anyhow::Result<Started>>) {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                let _ = started.send(Err(anyhow!("cannot install signal handlers: {e}")));
                return;
            }
        };
        // Handlers first, then unblock: a SIGTERM that arrived during
        // startup is pending and now drains instead of killing.
        crate::app::signals::set_termination_signals_blocked(false);

        let manager_cfg = CertManagerConfig {
            node: self.node.clone(),
            ..CertManagerConfig::default()
        };
        let local = self.local.subscribe();
        let cert_requests = match self.certs {
            CertSourceKind::Builtin { ca, ttl } => spawn_manager(
                BuiltinCaSource::new(ca, ttl),
                &self.snapshots,
                &self.cert_publisher,
                manager_cfg,
                local.clone(),
            ),
            CertSourceKind::IstioCa(cfg) => match CaClient::new(*cfg) {
                Ok(client) => spawn_manager(
                    client,
                    &self.snapshots,
                    &self.cert_publisher,
                    manager_cfg,
                    local.clone(),
                ),
                Err(e) => {
                    let _ = started.send(Err(anyhow!("CA client: {e}")));
                    return;
                }
            },
        };

        if let Some((path, known)) = self.crl {
            tokio::spawn(crl::watch(
                path,
                CRL_POLL,
                CrlStore::global().clone(),
                known,
            ));
        }

        // Readiness: the config source has delivered, and cores listen.
        let mut xds_status = None;
        let source_ready: Box<dyn Fn() -> bool + Send + Sync> = match self.source {
            ConfigSource::Local { path, poll, loaded } => {
                if let Some(path) = path {
                    tokio::spawn(local::watch_file(
                        path,
                        poll,
                        self.snapshots.clone(),
                        loaded,
                    ));
                }
                Box::new(|| true)
            }
            ConfigSource::Xds { cfg, on_demand } => {
                let status = XdsStatus::new();
                let ready = status.clone();
                xds_status = Some(status.clone());
                let publisher = self.snapshots.clone();
                tokio::spawn(async move {
                    if let Err(e) = xds::run(*cfg, publisher, status, on_demand).await {
                        tracing::error!(error = %e, "xDS client stopped: invalid configuration");
                    }
                });
                Box::new(move || ready.is_ready())
            }
        };
        let cores_ready = self.cores_ready.clone();
        if self.node.is_none() {
            tokio::spawn(follow_local_workloads(
                self.local,
                self.snapshots.subscribe(),
                self.pods,
                LOCAL_ADDRS_EVERY,
            ));
        }
        // And every local HBONE workload has its certificate: before that,
        // its inbound tunnels would be refused. Other identities are
        // fetched when a connection first needs them; none is waited for.
        let (snapshots, certs) = (self.snapshots.clone(), self.cert_publisher.clone());
        let certs_ready = move || {
            let (snap, issued) = (snapshots.current(), certs.current());
            local_identities(&snap, &local.borrow())
                .iter()
                .all(|id| issued.get(id).is_some())
        };
        let inpod = self.inpod.clone();
        let ready = Arc::new(move || {
            source_ready()
                && cores_ready.load(Ordering::Acquire)
                && certs_ready()
                && inpod.as_ref().is_none_or(|p| p.is_ready())
        });
        let metrics = self.metrics.clone();
        let quit = self.admin.quit.clone();
        let admin = Arc::new(self.admin);
        let endpoints = [
            (self.readiness, SidePort::Readiness),
            (self.stats, SidePort::Metrics),
            (self.admin_listener, SidePort::Admin),
        ];
        for (listener, port) in endpoints {
            let what = port.name();
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    let _ = started.send(Err(anyhow!("{what} listener: {e}")));
                    return;
                }
            };
            let (ready, metrics, admin) = (ready.clone(), metrics.clone(), admin.clone());
            let xds = xds_status.clone();
            let inpod_status = self.inpod.clone();
            let answer = move |method: &str, path: &str, query: &str| -> Answer {
                if what == "admin" {
                    return admin.answer(method, path, query);
                }
                if method != "GET" && method != "HEAD" {
                    return (
                        "405 Method Not Allowed",
                        TEXT,
                        "method not allowed\n".into(),
                    );
                }
                match (what, path) {
                    ("readiness", "/healthz/ready") if ready() => {
                        ("200 OK", TEXT, "ready\n".into())
                    }
                    ("readiness", "/healthz/ready") => {
                        ("503 Service Unavailable", TEXT, "not ready\n".into())
                    }
                    ("metrics", "/metrics" | "/stats/prometheus") => {
                        let process = ProcessStats::read();
                        let mut body = metrics.render(&process, xds.as_ref().map(|x| x.metrics()));
                        if let Some(inpod) = &inpod_status {
                            inpod.render(&mut body);
                        }
                        ("200 OK", PROMETHEUS, body)
                    }
                    _ => ("404 Not Found", TEXT, "not found\n".into()),
                }
            };
            tokio::spawn(serve_http(listener, port, answer));
        }
        let _ = started.send(Ok(Started { cert_requests }));
        tokio::spawn(report_dropped_log_lines(Duration::from_secs(5)));

        let drain = self.drain;
        tokio::select! {
            _ = term.recv() => tracing::info!(?drain, "SIGTERM: no longer accepting; draining open connections"),
            _ = int.recv() => tracing::info!(?drain, "SIGINT: no longer accepting; draining open connections"),
            _ = quit.notified() => tracing::info!(?drain, "/quitquitquit: no longer accepting; draining open connections"),
        }
        let _ = self.shutdown.send(true);
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal during drain: exiting now");
        std::process::exit(1);
    }
}

/// Says, every `every` while it keeps happening, how many log lines the
/// writer thread dropped because stdout did not keep up: the lines are
/// gone, but not silently.
async fn report_dropped_log_lines(every: Duration) {
    let mut reported = 0;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let dropped = crate::telemetry::logfmt::dropped_lines();
        if dropped > reported {
            tracing::warn!(
                dropped = dropped - reported,
                dropped_total = dropped,
                "log lines dropped: stdout is not keeping up (the cores never wait for it)"
            );
            reported = dropped;
        }
    }
}

fn spawn_manager<S: CertSource + Send + Sync + 'static>(
    source: S,
    snapshots: &SnapshotPublisher,
    certs: &CertPublisher,
    cfg: CertManagerConfig,
    local: watch::Receiver<LocalWorkloads>,
) -> CertRequests {
    let manager = CertManager::new(Arc::new(source), snapshots.subscribe(), certs.clone(), cfg)
        .follow_local(local);
    let requests = manager.requests();
    tokio::spawn(manager.run());
    requests
}

/// How often the host's addresses are read again without a config change
/// (an address assigned to the host later makes its workload local).
const LOCAL_ADDRS_EVERY: Duration = Duration::from_secs(5);

/// The workloads this node hosts when no node name says which: in in-pod
/// mode the enrolled pods (by workload uid and address), in node-level
/// mode those at the host's own addresses. Node level reads the
/// addresses (getifaddrs, a few microseconds) when the config changes and
/// every `every`; either way `local` changes only when the answer does.
async fn follow_local_workloads(
    local: watch::Sender<LocalWorkloads>,
    mut snapshots: ringway_controlplane::publish::SnapshotFeed,
    pods: Option<PodFeed>,
    every: Duration,
) {
    let update = |now: LocalWorkloads| {
        local.send_if_modified(|current| {
            let changed = *current != now;
            if changed {
                if let LocalWorkloads::Hosted { uids, addrs } = &now {
                    tracing::debug!(pods = uids.len(), addrs = ?addrs, "local workloads changed");
                }
                *current = now;
            }
            changed
        });
    };
    if let Some(mut pods) = pods {
        loop {
            let now = {
                let set = pods.borrow_and_update();
                LocalWorkloads::hosted(
                    set.pods.values().map(|p| p.workload_uid.clone()),
                    set.pods.values().flat_map(|p| p.addrs.iter().copied()),
                )
            };
            update(now);
            if pods.changed().await.is_err() {
                return;
            }
        }
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut config_open = true;
    loop {
        update(LocalWorkloads::hosted(
            [],
            crate::io::socket::local_interface_addrs(),
        ));
        tokio::select! {
            _ = tick.tick() => {}
            changed = snapshots.changed(), if config_open => config_open = changed.is_ok(),
        }
    }
}
