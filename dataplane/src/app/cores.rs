//! The executors: one per planned CPU, each running its core's main loop
//! (`core_main`): accept on its listeners (and, in-pod mode, on every
//! enrolled pod's), follow snapshot and certificate publications (deciding
//! open connections again when policies change) and CRL reloads (closing
//! the HBONE connections of newly revoked peers), reap the HBONE pool,
//! copy its counts for the scraper, and at shutdown drain.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail};
use ringway_controlplane::security::certs::CertFeed;
use ringway_controlplane::security::crl::{CrlStore, Side};
use ringway_controlplane::SnapshotFeed;
use tokio::sync::watch;

use super::plan::CorePlan;
use crate::core::authorization::Recheck;
use crate::core::config::ProxyConfig;
use crate::core::{ControlHandles, CoreInputs};
use crate::hbone::client::{Client, ClientSettings};
use crate::hbone::pool::Pool;
use crate::hbone::revocation::Closed;
use crate::hbone::tls::Certificates;
use crate::inpod::{PodFeed, PodScope};
use crate::io::copy::{self, Copier};
use crate::io::executor::{self, timer};
use crate::io::listener::{BoundListener, DnsListener, SelfAddrs};
use crate::io::uring::Poller;
use crate::proxy::accept::accept_loop;
use crate::proxy::dns::DnsServer;
use crate::telemetry::accesslog::OpenConnections;
use crate::telemetry::metrics::CoreMetrics;

/// What crosses into a core at startup (Send).
pub struct CoreSeed {
    pub index: usize,
    pub cfg: ProxyConfig,
    pub listeners: Vec<BoundListener>,
    pub feed: SnapshotFeed,
    pub cert_feed: CertFeed,
    pub control: ControlHandles,
    pub shutdown: watch::Receiver<bool>,
    pub self_addrs: SelfAddrs,
    pub metrics: CoreMetrics,
    /// In-pod mode: the enrolled pods, whose listeners this core serves.
    pub pods: Option<PodFeed>,
    /// The DNS proxy's sockets on this core (node-level; empty when off).
    pub dns: Vec<DnsListener>,
    /// Shared by every core: whose turn it is to close its listeners.
    pub closing: Arc<ClosingOrder>,
}

/// At drain the cores close their listeners one after another, in core
/// order, never two at once. A closing listener's queued connections move
/// to another listener of its port ([`crate::io::reuseport`]); if two
/// cores closed at the same instant, one could pick the other's socket
/// just as it stops listening, and that connection would be reset. In
/// turn, each queue moves to a socket that stays open (the next proxy's,
/// or a core that has not closed yet and will move it on).
#[derive(Default)]
pub struct ClosingOrder {
    closed: AtomicUsize,
}

impl ClosingOrder {
    /// How long a core waits for the cores before it (a stuck core must
    /// not hold the others' drain).
    const PATIENCE: Duration = Duration::from_millis(200);

    /// Waits until every core before `index` has closed its listeners.
    async fn my_turn(&self, index: usize) {
        let start = std::time::Instant::now();
        while self.closed.load(Ordering::Acquire) < index && start.elapsed() < Self::PATIENCE {
            timer::sleep(Duration::from_millis(1)).await;
        }
    }

    fn closed(&self, index: usize) {
        self.closed.fetch_max(index + 1, Ordering::AcqRel);
    }
}

async fn core_main(seed: CoreSeed, ready: mpsc::Sender<usize>) -> anyhow::Result<()> {
    let CoreSeed {
        index,
        cfg,
        listeners,
        mut feed,
        cert_feed,
        control,
        mut shutdown,
        self_addrs,
        metrics,
        pods,
        dns,
        closing,
    } = seed;
    let force_close = crate::io::latch::Latch::new();
    let poller: Rc<Poller> = executor::poller();
    let setup = poller.setup();
    tracing::info!(
        core = index,
        io_mode = ?setup.io,
        task_run = ?setup.task_run,
        quiet_sends = setup.quiet_sends,
        recv_buffers = setup.recv_buffers,
        recv_buffer_size = setup.recv_buffer_size,
        "core ring ready"
    );
    if setup.io == crate::io::uring::IoMode::Completion && !setup.quiet_sends {
        tracing::warn!(
            core = index,
            "this kernel posts a completion for every send: one more io_uring_enter per message"
        );
    }
    let certs = Rc::new(Certificates::new(
        control.cert_feed.clone(),
        control.cert_requests.clone(),
        cfg.cert_wait_timeout,
    ));
    let hbone = Client::new(
        Pool::new(cfg.pool),
        ClientSettings {
            connect: cfg.connect,
            handshake_timeout: cfg.handshake_timeout,
            h2: cfg.h2,
        },
        poller.clone(),
        certs.clone(),
        index,
    );
    let redirect = if cfg.sockmap_redirect {
        match crate::io::redirect::Redirector::new() {
            Ok(r) => {
                tracing::info!(
                    core = index,
                    "passthrough pairs go to the in-kernel sockmap redirect"
                );
                Some(r)
            }
            Err(why) => {
                tracing::warn!(core = index, reason = %why, "--sockmap-redirect: the kernel refuses the redirect; passthrough copies instead");
                None
            }
        }
    } else {
        None
    };
    let bell = redirect
        .clone()
        .map(|r| executor::spawn_local(r.listen(poller.clone())));
    let copier = Copier::new(poller.clone(), cfg.copy_mode, redirect);
    let core = Rc::new(CoreInputs::new(
        index,
        cfg,
        poller,
        copier,
        self_addrs,
        Rc::new(OpenConnections::new(metrics.stats.clone())),
        hbone,
        certs,
        metrics,
        shutdown.clone(),
        force_close.clone(),
        control,
        feed.current(),
    ));
    // The snapshot the core starts with counts too: when xDS answered before
    // the cores were up, the core begins serving it now. Each version is
    // recorded once, whether it was seen here or by the watcher below.
    let mut timed_version = {
        let snap = core.snapshot();
        if let Some(at) = snap.received_at() {
            core.metrics.stats.propagation.record(at.elapsed());
        }
        snap.version()
    };

    // Follow snapshot publications: swap the core's slot (never block),
    // then authorize again the open inbound connections the change may
    // concern, closing those now denied.
    let watcher = {
        let core = core.clone();
        executor::spawn_local(async move {
            while feed.changed().await.is_ok() {
                let snap = feed.current();
                tracing::debug!(
                    core = core.index,
                    version = snap.version(),
                    "snapshot applied"
                );
                let received_at = snap.received_at();
                let version = snap.version();
                let old = core.replace_snapshot(snap);
                if let Some(at) = received_at.filter(|_| version != timed_version) {
                    core.metrics.stats.propagation.record(at.elapsed());
                }
                timed_version = version;
                let new = core.snapshot();
                // In batches, yielding between them: thousands of open
                // connections must not stall the core's other tasks.
                let mut r = Recheck::default();
                for batch in core.admitted.keys().chunks(256) {
                    r += core.admitted.recheck(batch, &old, &new, &core.cfg);
                    executor::yield_if_needed().await;
                }
                if r.revoked > 0 {
                    tracing::info!(
                        core = core.index,
                        version = new.version(),
                        checked = r.checked,
                        closed = r.revoked,
                        late_rejections = core.admitted.late_rejections(),
                        "authorization re-checked after a config change; closing what is now denied"
                    );
                }
            }
        })
    };

    // Follow CRL installs: look the open HBONE connections' peer chains up
    // in the new set and close the revoked ones (their tasks do, on the
    // latch); revoked pooled connections leave the pool at once.
    let crl_watcher = {
        let core = core.clone();
        executor::spawn_local(async move {
            let store = CrlStore::global();
            let mut installs = store.subscribe();
            while installs.changed().await.is_ok() {
                let Some(set) = store.current() else {
                    continue;
                };
                let mut closed = Closed::default();
                for batch in core.revocations.keys().chunks(256) {
                    closed += core.revocations.recheck(batch, &set);
                    executor::yield_if_needed().await;
                }
                if closed == Closed::default() {
                    continue;
                }
                core.hbone.pool.reap();
                store.record_closed(Side::Inbound, closed.inbound);
                store.record_closed(Side::Outbound, closed.outbound);
                tracing::info!(
                    core = core.index,
                    inbound = closed.inbound,
                    outbound = closed.outbound,
                    "a reloaded CRL revokes peers of open HBONE connections: closing them"
                );
            }
        })
    };
    let cert_watcher = {
        let certs = core.certs.clone();
        executor::spawn_local(async move { certs.follow(cert_feed).await })
    };
    // Release idle and broken pooled HBONE connections.
    let reaper = {
        let core = core.clone();
        executor::spawn_local(async move {
            let every = crate::hbone::client::reap_interval(core.hbone.pool.cfg.idle_timeout);
            loop {
                executor::timer::sleep(every).await;
                core.hbone.pool.reap();
            }
        })
    };
    // Counts kept where they are made (the executor, the late-rejection
    // registry), copied for the scraper once a second.
    let stats = {
        let core = core.clone();
        executor::spawn_local(async move {
            loop {
                let s = &core.metrics.stats;
                s.task_panics.set(executor::task_panics());
                s.late_rejections.set(core.admitted.late_rejections());
                s.snapshot_version.set(core.snapshot().version());
                s.pool_connections.set(core.hbone.pool.connections() as u64);
                let (pipes, buffers) = copy::held();
                s.pipes_held.set(pipes as u64);
                s.buffers_held.set(buffers as u64);
                s.tasks.set(executor::task_count() as u64);
                let ring = core.poller.stats();
                s.ring_enters.set(ring.enters);
                s.ring_completions.set(ring.completions);
                s.ring_sends.set(ring.sends);
                s.ring_quiet_sends.set(ring.quiet_sends);
                s.ring_short_sends.set(ring.short_sends);
                s.ring_starved.set(ring.starved);
                s.ring_compacted_bytes.set(ring.compacted_bytes);
                s.ring_free_buffers
                    .set(core.poller.free_recv_buffers() as u64);
                executor::timer::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let accept_tasks: Vec<_> = listeners
        .into_iter()
        .map(|l| executor::spawn_local(accept_loop(core.clone(), l, None)))
        .collect();
    let pod_follower = pods.map(|feed| executor::spawn_local(follow_pods(core.clone(), feed)));
    // Before readiness: a core reports ready only once it serves DNS too.
    let dns_tasks = match (&core.cfg.dns, dns.is_empty()) {
        (Some(settings), false) => {
            let server = DnsServer::new(core.clone(), settings.clone()).map_err(|e| {
                anyhow!("core {index}: cannot make the DNS proxy's upstream socket: {e}")
            })?;
            server.serve(dns)
        }
        _ => Vec::new(),
    };
    let _ = ready.send(index);

    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    // Drain: dropping the accept tasks closes this core's listening sockets
    // (the pods' with the follower, which owns them), in core order.
    closing.my_turn(index).await;
    drop(accept_tasks);
    drop(pod_follower);
    drop(dns_tasks);
    closing.closed(index);
    let open = core.open.get();
    if open > 0 {
        tracing::info!(core = index, open, timeout = ?core.cfg.drain_timeout, "draining open connections");
    }
    let drained = timer::timeout(core.cfg.drain_timeout, core.open.all_closed()).await;
    if drained.is_err() {
        tracing::warn!(
            core = index,
            open = core.open.get(),
            "drain deadline reached; closing the remaining connections"
        );
        force_close.set();
        // Let the cancelled connections run their drop (close, access log).
        let _ = timer::timeout(Duration::from_secs(1), core.open.all_closed()).await;
    }
    drop((watcher, crl_watcher, cert_watcher, reaper, stats, bell));
    Ok(())
}

/// One enrolled pod on this core: its accept loops (which own this core's
/// listeners in the pod's namespace) and the scope its connections share.
struct CorePod {
    scope: Rc<PodScope>,
    _accepting: Vec<executor::Task<()>>,
}

/// Follows the published pod set: starts accepting on a new pod's
/// listeners, and for a removed pod closes them at once, lets its
/// connections finish for `--drain-timeout`, then closes the rest and
/// its pooled tunnels. Reports each step to the manager, which acks the
/// agent only when every core has done it.
async fn follow_pods(core: Rc<CoreInputs>, mut feed: PodFeed) {
    let mut running: HashMap<String, CorePod> = Default::default();
    loop {
        let set = feed.borrow_and_update().clone();
        let gone: Vec<String> = running
            .iter()
            .filter(|(uid, p)| {
                set.pods
                    .get(*uid)
                    .is_none_or(|e| e.generation != p.scope.entry.generation)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            let pod = running.remove(&uid).expect("listed above");
            let CorePod { scope, _accepting } = pod;
            // Their listeners stop listening as they drop (`Listening`),
            // before the manager hears that this core stopped the pod.
            drop(_accepting);
            scope.entry.stopped.fetch_add(1, Ordering::AcqRel);
            let core = core.clone();
            executor::spawn_detached(async move {
                let drain = core.cfg.drain_timeout;
                if timer::timeout(drain, scope.all_closed()).await.is_err() {
                    tracing::info!(
                        core = core.index,
                        pod = %scope.entry.uid,
                        open = scope.open(),
                        "pod removed: closing its remaining connections"
                    );
                }
                // Closed either way: the pool's reaper drops any tunnel of
                // the pod that was still being opened.
                scope.close();
                let generation = scope.entry.generation;
                core.hbone.pool.retain(|key| {
                    key.pod
                        .as_ref()
                        .is_none_or(|p| p.0.entry.generation != generation)
                });
            });
        }
        for (uid, entry) in &set.pods {
            if running.contains_key(uid) {
                continue;
            }
            let Some(sockets) = entry.take_sockets(core.index) else {
                continue;
            };
            let scope = Rc::new(PodScope::new(entry.clone()));
            let mut accepting: Vec<_> = sockets
                .listeners
                .into_iter()
                .map(|l| executor::spawn_local(accept_loop(core.clone(), l, Some(scope.clone()))))
                .collect();
            // The pod's DNS proxy: served and closed with its listeners.
            if let (Some(dns), Some(settings)) = (sockets.dns, &core.cfg.dns) {
                let server =
                    DnsServer::for_pod(core.clone(), settings.clone(), scope.clone(), dns.upstream);
                accepting.extend(server.serve(dns.listeners));
            }
            entry.serving.fetch_add(1, Ordering::AcqRel);
            running.insert(
                uid.clone(),
                CorePod {
                    scope,
                    _accepting: accepting,
                },
            );
        }
        core.metrics.stats.pods.set(running.len() as u64);
        if feed.changed().await.is_err() {
            // The ZDS thread is gone (it failed; readiness says so). The
            // pods enrolled so far keep being served rather than all being
            // dropped at once; the drain at shutdown ends them.
            std::future::pending::<()>().await;
        }
    }
}

/// Readiness goes 503 for good when it is dropped: when a core's future
/// ends (at drain, or with an error) or unwinds (the core panicked).
struct CoreRunning {
    index: usize,
    ready: Arc<AtomicBool>,
}

impl Drop for CoreRunning {
    fn drop(&mut self) {
        self.ready.store(false, Ordering::Release);
        if std::thread::panicking() {
            tracing::error!(
                core = self.index,
                "core crashed: readiness reports 503 from now on"
            );
        }
    }
}

/// Starts one executor per planned core and waits until every core has its
/// listeners running. A core that dies before signalling readiness (no
/// io_uring, a CPU that is not ours) is detected immediately and its error
/// returned. `ready` (the readiness endpoint's "every core runs") is
/// cleared as soon as any core stops.
pub fn start_cores(
    plan: &CorePlan,
    seeds: Vec<CoreSeed>,
    ready: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<executor::JoinHandle<anyhow::Result<()>>>> {
    let mut starting = Vec::new();
    for (seed, &cpu) in seeds.into_iter().zip(&plan.cpus) {
        // One channel per core: if the executor fails to initialise, its
        // closure (and so the sender) is dropped and recv sees Disconnected.
        let (ready_tx, ready_rx) = mpsc::channel();
        let index = seed.index;
        let handle = executor::Builder::new(format!("ringway-core{index}"))
            .pin(plan.pin.then_some(cpu))
            .ring(seed.cfg.ring)
            .spawn({
                let ready = ready.clone();
                move || async move {
                    let _running = CoreRunning { index, ready };
                    let r = core_main(seed, ready_tx).await;
                    if let Err(e) = &r {
                        tracing::error!(core = index, error = %format!("{e:#}"), "core failed");
                    }
                    r
                }
            })
            .map_err(|e| anyhow!("cannot start the executor for core {index} (cpu {cpu}): {e}"))?;
        starting.push((index, cpu, handle, ready_rx));
    }
    let mut handles = Vec::new();
    for (index, cpu, handle, ready_rx) in starting {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(_) => handles.push(handle),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let why = match handle.join() {
                    Ok(Ok(())) => "it exited early".to_string(),
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(e) => e.to_string(),
                };
                bail!("core {index} (cpu {cpu}) failed to start: {why}");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("core {index} (cpu {cpu}) did not become ready within 30s")
            }
        }
    }
    Ok(handles)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readiness's "every core runs" goes false when a core's thread
    /// unwinds, as it does when the core panics.
    #[test]
    fn a_crashed_core_clears_readiness() {
        let ready = Arc::new(AtomicBool::new(true));
        let r = ready.clone();
        let crashed = std::thread::spawn(move || {
            let _running = CoreRunning { index: 3, ready: r };
            panic!("a core's own loop failed");
        })
        .join();
        assert!(crashed.is_err());
        assert!(!ready.load(Ordering::Acquire));
    }
}
