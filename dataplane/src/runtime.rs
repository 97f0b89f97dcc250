//! The per-core runtime: one executor (`executor/`) per selected CPU, each with
//! its own readiness ring, copy pools, listeners, snapshot slot and
//! counters. Nothing on the data path is shared between cores; the only
//! cross-thread inputs are the snapshot feed and the shutdown signal, both
//! read without locks.

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail};
use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::security::certmanager::{wait_for_cert, CertRequests};
use ringway_controlplane::security::certs::{CertFeed, CertSnapshot};
use ringway_controlplane::security::tls::TlsConfigs;
use ringway_controlplane::sources::xds::{lookup_on_demand, OnDemandSender};
use ringway_controlplane::{Snapshot, SnapshotFeed};
use tokio::sync::watch;

use crate::accesslog::{ConnLog, OpenConnections};
use crate::config::{CorePlan, ProxyConfig};
use crate::copy::Copier;
use crate::executor::{self, timer};
use crate::listeners::{self, BoundListener, SelfAddrs, TrafficPath};
use crate::uring::Poller;

/// Everything one core's connections read. Core-local (!Send): built on the
/// core from a [`CoreSeed`].
pub struct CoreInputs {
    pub index: usize,
    pub cfg: ProxyConfig,
    pub poller: Rc<Poller>,
    pub copier: Copier,
    pub self_addrs: SelfAddrs,
    pub open: Rc<OpenConnections>,
    /// This core's HBONE connection pool.
    pub pool: crate::hbone::pool::Pool,
    /// Istio TCP metrics and per-core stats, read by the scraper.
    pub metrics: crate::metrics::CoreMetrics,
    /// Inbound connections admitted by policy, re-checked on snapshot
    /// changes (late rejection).
    pub admitted: Rc<crate::authorization::Registry>,
    /// True once shutdown began (stop accepting, send GOAWAY, drain).
    pub shutdown: watch::Receiver<bool>,
    /// Flips to true at the drain deadline: every connection still open is
    /// cancelled (and so logged and closed).
    pub force_close: watch::Receiver<bool>,
    /// The core's current snapshot. Connections clone the `Rc` (no atomic
    /// traffic between cores); the watcher task swaps it on publish.
    #[allow(clippy::redundant_allocation)] // the Rc is the point: core-local refcount
    snapshot: RefCell<Rc<Arc<Snapshot>>>,
    /// Requests to the control thread: urgent certificates, on-demand
    /// destinations. Lock-free queues; the core never blocks on them.
    pub control: ControlHandles,
    /// Ready-built TLS configs per identity, swapped like the snapshot.
    #[allow(clippy::redundant_allocation)]
    certs: RefCell<Rc<Arc<CertSnapshot>>>,
    /// Dedicated mode: the proxy workload's uid in the snapshot of the
    /// version noted, found once per version (a scan of the workloads).
    proxy_workload_uid: RefCell<Option<(u64, Option<ringway_controlplane::model::Str>)>>,
}

impl CoreInputs {
    /// The snapshot a new connection decides with; it keeps this version
    /// for its whole life even if a newer one arrives meanwhile.
    #[allow(clippy::redundant_allocation)]
    pub fn snapshot(&self) -> Rc<Arc<Snapshot>> {
        self.snapshot.borrow().clone()
    }

    /// The workload an outbound connection from `src` speaks for: in
    /// dedicated mode the configured one, wherever the connection comes
    /// from; otherwise the workload of this node at `src`.
    ///
    /// In-pod mode: the workload of the pod the connection came from.
    pub fn source_workload<'s>(
        &self,
        snap: &'s Snapshot,
        src: Option<std::net::IpAddr>,
        pod: Option<&crate::inpod::PodScope>,
    ) -> Option<&'s Arc<ringway_controlplane::model::Workload>> {
        if let Some(pod) = pod {
            return pod.workload(snap);
        }
        let Some(pw) = &self.cfg.proxy_workload else {
            return src.and_then(|ip| crate::authorization::local_workload(snap, &self.cfg, ip));
        };
        let mut cached = self.proxy_workload_uid.borrow_mut();
        let uid = match &*cached {
            Some((version, uid)) if *version == snap.version() => uid.clone(),
            _ => {
                let uid = snap.workloads().find(|w| pw.is(w)).map(|w| w.uid.clone());
                if uid.is_none() {
                    tracing::warn!(
                        core = self.index,
                        workload = %pw,
                        "dedicated mode: the proxy workload is not in the config; outbound \
                         connections are refused until it is"
                    );
                }
                *cached = Some((snap.version(), uid.clone()));
                uid
            }
        };
        uid.and_then(|uid| snap.workload_by_uid(&uid))
    }

    #[allow(clippy::redundant_allocation)]
    pub fn certs(&self) -> Rc<Arc<CertSnapshot>> {
        self.certs.borrow().clone()
    }

    /// The TLS configs for `id`; when missing (or expired), asks the
    /// certificate manager urgently and waits at most
    /// `--cert-wait-timeout`. None means fail closed.
    pub async fn cert_for(&self, id: &Identity) -> Option<Arc<TlsConfigs>> {
        let now = std::time::SystemTime::now();
        if let Some(c) = self.certs().get(id).filter(|c| c.not_after > now) {
            return Some(c.clone());
        }
        let requests = self.control.cert_requests.as_ref()?;
        let mut feed = self.control.cert_feed.clone();
        wait_for_cert(
            &mut feed,
            requests,
            id,
            crate::executor::timer::sleep(self.cfg.cert_wait_timeout),
        )
        .await
    }

    /// On-demand mode: asks the control plane about an unknown destination
    /// and waits (bounded) for a snapshot that resolves it. Returns that
    /// snapshot, or None (not on demand, timed out, or unknown).
    pub async fn resolve_on_demand(&self, ip: std::net::IpAddr) -> Option<Arc<Snapshot>> {
        let tx = self.control.on_demand.as_ref()?;
        let mut feed = self.control.snapshot_feed.clone();
        let timeout = crate::executor::timer::sleep(self.cfg.on_demand_timeout);
        lookup_on_demand(&mut feed, tx, &self.cfg.network, ip, timeout)
            .await
            .then(|| feed.current())
    }
}

/// Handles to the control thread (Send, cloned into each core).
#[derive(Clone)]
pub struct ControlHandles {
    pub snapshot_feed: SnapshotFeed,
    pub cert_feed: CertFeed,
    /// Set when a certificate manager serves urgent requests.
    pub cert_requests: Option<CertRequests>,
    /// Set in on-demand xDS mode.
    pub on_demand: Option<OnDemandSender>,
}

/// Spawns a connection-scoped task on this core that the drain deadline
/// (or its pod's removal, in-pod mode) cancels like the connection itself.
pub fn spawn_cancellable(
    core: &Rc<CoreInputs>,
    pod: Option<&crate::inpod::PodScope>,
    fut: impl std::future::Future<Output = ()> + 'static,
) {
    crate::executor::spawn_detached(futures_lite::future::or(fut, cancelled(core, pod)));
}

/// Resolves when connections must end now: at the drain deadline (or when
/// the core is gone), or when their pod was removed and its drain is over.
fn cancelled(
    core: &CoreInputs,
    pod: Option<&crate::inpod::PodScope>,
) -> impl Future<Output = ()> + 'static {
    let mut force_close = core.force_close.clone();
    let deadline = async move {
        let _ = force_close.wait_for(|closing| *closing).await;
    };
    let pod_closed = pod.map(|p| p.closed());
    futures_lite::future::or(deadline, async move {
        match pod_closed {
            Some(closed) => closed.await,
            None => std::future::pending().await,
        }
    })
}

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
    pub metrics: crate::metrics::CoreMetrics,
    /// In-pod mode: the enrolled pods, whose listeners this core serves.
    pub pods: Option<crate::inpod::PodFeed>,
}

/// Runs one accepted connection on its traffic path, until it ends or the
/// drain deadline cancels it.
///
/// Not an `async fn`: a task is as large as its future, and an async fn
/// keeps room for its arguments (the access log among them) for its whole
/// life even after moving them on. Here the path's future is built and
/// boxed first, so the task holds only the box and the drain watch; each
/// path's box is sized for that path alone.
pub fn serve(core: Rc<CoreInputs>, conn: OwnedFd, log: ConnLog) -> impl Future<Output = ()> {
    let deadline = cancelled(&core, log.pod.as_deref().map(|p| &**p));
    let path: Pin<Box<dyn Future<Output = ()>>> = match log.path() {
        TrafficPath::Outbound => match crate::outbound::serve(core, conn, log) {
            Some(route) => Box::pin(route),
            None => Box::pin(std::future::ready(())),
        },
        TrafficPath::InboundPassthrough => {
            Box::pin(crate::inbound_passthrough::serve(core, conn, log))
        }
        TrafficPath::Inbound => Box::pin(crate::hbone::server::serve(core, conn, log)),
        TrafficPath::Socks5 => Box::pin(crate::socks5::serve(core, conn, log)),
    };
    async move {
        futures_lite::future::or(path, deadline).await;
    }
}

async fn core_main(seed: CoreSeed, ready: mpsc::Sender<usize>) -> anyhow::Result<()> {
    let CoreSeed {
        index,
        cfg,
        listeners,
        mut feed,
        mut cert_feed,
        control,
        mut shutdown,
        self_addrs,
        metrics,
        pods,
    } = seed;
    let (force_tx, force_close) = watch::channel(false);
    let cfg_pool = cfg.pool;
    let poller: Rc<Poller> = executor::poller();
    let core = Rc::new(CoreInputs {
        index,
        copier: Copier::new(poller.clone(), cfg.copy_mode),
        cfg,
        poller,
        self_addrs,
        open: Rc::new(OpenConnections::new(metrics.stats.clone())),
        metrics,
        pool: crate::hbone::pool::Pool::new(cfg_pool),
        admitted: Rc::default(),
        shutdown: shutdown.clone(),
        control,
        force_close,
        snapshot: RefCell::new(Rc::new(feed.current())),
        proxy_workload_uid: RefCell::new(None),
        certs: RefCell::new(Rc::new(cert_feed.current())),
    });

    // Follow snapshot publications: swap the core's slot (never block),
    // then authorize again the open inbound connections the change may
    // concern, closing those now denied.
    let watcher = {
        let core = core.clone();
        crate::executor::spawn_local(async move {
            while feed.changed().await.is_ok() {
                let snap = feed.current();
                tracing::debug!(
                    core = core.index,
                    version = snap.version(),
                    "snapshot applied"
                );
                let received_at = snap.received_at();
                let old = std::mem::replace(&mut *core.snapshot.borrow_mut(), Rc::new(snap));
                if let Some(at) = received_at {
                    core.metrics.stats.propagation.record(at.elapsed());
                }
                let new = core.snapshot();
                // In batches, yielding between them: thousands of open
                // connections must not stall the core's other tasks.
                let mut r = crate::authorization::Recheck::default();
                for batch in core.admitted.keys().chunks(256) {
                    r += core.admitted.recheck(batch, &old, &new, &core.cfg);
                    crate::executor::yield_if_needed().await;
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

    let cert_watcher = {
        let core = core.clone();
        crate::executor::spawn_local(async move {
            while cert_feed.changed().await.is_ok() {
                *core.certs.borrow_mut() = Rc::new(cert_feed.current());
            }
        })
    };
    // Release idle and broken pooled HBONE connections.
    let reaper = {
        let core = core.clone();
        crate::executor::spawn_local(async move {
            let every = crate::hbone::client::reap_interval(core.pool.cfg.idle_timeout);
            loop {
                crate::executor::timer::sleep(every).await;
                core.pool.reap();
            }
        })
    };
    // Counts kept where they are made (the executor, the late-rejection
    // registry), copied for the scraper once a second.
    let stats = {
        let core = core.clone();
        crate::executor::spawn_local(async move {
            loop {
                let s = &core.metrics.stats;
                s.task_panics.set(crate::executor::task_panics());
                s.late_rejections.set(core.admitted.late_rejections());
                s.snapshot_version.set(core.snapshot().version());
                s.pool_connections.set(core.pool.connections() as u64);
                let (pipes, buffers) = crate::copy::held();
                s.pipes_held.set(pipes as u64);
                s.buffers_held.set(buffers as u64);
                s.tasks.set(crate::executor::task_count() as u64);
                crate::executor::timer::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let accept_tasks: Vec<_> = listeners
        .into_iter()
        .map(|l| crate::executor::spawn_local(listeners::accept_loop(core.clone(), l, None)))
        .collect();
    let pod_follower =
        pods.map(|feed| crate::executor::spawn_local(follow_pods(core.clone(), feed)));
    let _ = ready.send(index);

    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    // Drain: dropping the accept tasks closes this core's listening sockets
    // (the pods' with the follower, which owns them).
    drop(accept_tasks);
    drop(pod_follower);
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
        let _ = force_tx.send(true);
        // Let the cancelled connections run their drop (close, access log).
        let _ = timer::timeout(Duration::from_secs(1), core.open.all_closed()).await;
    }
    drop((watcher, cert_watcher, reaper, stats));
    Ok(())
}

/// One enrolled pod on this core: its accept loops (which own this core's
/// listeners in the pod's namespace) and the scope its connections share.
struct CorePod {
    scope: Rc<crate::inpod::PodScope>,
    _accepting: Vec<executor::Task<()>>,
}

/// Follows the published pod set: starts accepting on a new pod's
/// listeners, and for a removed pod closes them at once, lets its
/// connections finish for `--drain-timeout`, then closes the rest and
/// its pooled tunnels. Reports each step to the manager, which acks the
/// agent only when every core has done it.
async fn follow_pods(core: Rc<CoreInputs>, mut feed: crate::inpod::PodFeed) {
    let mut running: std::collections::HashMap<String, CorePod> = Default::default();
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
            drop(_accepting);
            scope.entry.stopped.fetch_add(1, Ordering::AcqRel);
            let core = core.clone();
            crate::executor::spawn_detached(async move {
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
                core.pool.retain(|key| {
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
            let Some(listeners) = entry.take_listeners(core.index) else {
                continue;
            };
            let scope = Rc::new(crate::inpod::PodScope::new(entry.clone()));
            let accepting = listeners
                .into_iter()
                .map(|l| {
                    crate::executor::spawn_local(listeners::accept_loop(
                        core.clone(),
                        l,
                        Some(scope.clone()),
                    ))
                })
                .collect();
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

/// Locked memory one core's ring needs: the kernel charges io_uring's
/// submission and completion queues (1024 + 8192 entries, about 200 KiB)
/// to RLIMIT_MEMLOCK unless the process may lock memory anyway.
const MEMLOCK_PER_CORE: u64 = 256 << 10;

/// Raises the soft RLIMIT_MEMLOCK to the hard one, then fails fast, naming
/// the limit and the fix, if `cores` rings still do not fit (io_uring_setup
/// would only say ENOMEM).
pub fn check_memlock(cores: usize) -> anyhow::Result<()> {
    let needed = MEMLOCK_PER_CORE * cores as u64;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            lim = raised;
        }
    }
    // SAFETY: plain syscall without arguments.
    if lim.rlim_cur < needed && unsafe { libc::geteuid() } != 0 {
        bail!(
            "RLIMIT_MEMLOCK is {} KiB; {cores} io_uring core(s) need about {} KiB. Raise it (`ulimit -l {}`, or LimitMEMLOCK= in systemd), run as root, or use fewer --cores",
            lim.rlim_cur / 1024,
            needed / 1024,
            needed / 1024
        );
    }
    Ok(())
}

/// Fails fast, naming the cause and the fix, when this process cannot set
/// up an io_uring at all: a container's seccomp profile blocking it
/// (containerd 2 and Docker 25+ do by default), the `kernel.io_uring_disabled`
/// sysctl, or a kernel without it. Otherwise each core would only fail
/// with a bare errno.
pub fn check_io_uring() -> anyhow::Result<()> {
    match io_uring::IoUring::new(2) {
        Ok(_) => Ok(()),
        Err(e) => {
            let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .ok()
                .and_then(|v| v.trim().parse::<u8>().ok());
            bail!("{}", io_uring_diagnosis(&e, sysctl))
        }
    }
}

/// Why io_uring_setup failed with `e`, and what to do about it, given
/// `kernel.io_uring_disabled` (None: not readable or not present).
pub fn io_uring_diagnosis(e: &std::io::Error, sysctl: Option<u8>) -> String {
    let fix_seccomp = "run ringway with a seccomp profile that allows io_uring_setup, \
        io_uring_enter and io_uring_register on top of the runtime default: ringway \
        ships one as deploy/seccomp/ringway.json (install it on the node as \
        /var/lib/kubelet/seccomp/profiles/ringway.json; the Helm chart's default \
        seccompProfile refers to it), or use seccompProfile: Unconfined";
    match (e.raw_os_error(), sysctl) {
        (_, Some(2)) => format!(
            "io_uring is disabled on this host (sysctl kernel.io_uring_disabled=2): \
             set it to 0 (`sysctl -w kernel.io_uring_disabled=0`); ringway needs io_uring ({e})"
        ),
        (Some(libc::EPERM), Some(1)) => format!(
            "io_uring is restricted on this host (sysctl kernel.io_uring_disabled=1) and this \
             process is neither in kernel.io_uring_group nor CAP_SYS_ADMIN: set the sysctl to \
             0 or run ringway in that group ({e})"
        ),
        (Some(libc::EPERM), _) => format!(
            "io_uring_setup is not permitted ({e}): most likely the container runtime's \
             default seccomp profile blocks io_uring; {fix_seccomp}"
        ),
        (Some(libc::ENOSYS), _) => format!(
            "io_uring_setup is not available ({e}): either this kernel lacks io_uring \
             (ringway needs Linux 5.19 or later) or a seccomp profile answers ENOSYS for it; \
             {fix_seccomp}"
        ),
        (Some(libc::ENOMEM), _) => format!(
            "io_uring_setup ran out of locked memory ({e}): raise RLIMIT_MEMLOCK \
             (`ulimit -l`, LimitMEMLOCK= in systemd, or the container's memlock ulimit)"
        ),
        _ => format!("cannot set up an io_uring: {e}"),
    }
}

/// Raise RLIMIT_NOFILE to its hard limit: a busy node proxy holds several
/// fds per connection (two sockets, and pipes while bytes move).
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max
    {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way io_uring can be unavailable names its cause and its fix.
    #[test]
    fn io_uring_failures_say_why_and_what_to_do() {
        let err = |errno| std::io::Error::from_raw_os_error(errno);
        let cases = [
            (libc::EPERM, None, "allows io_uring_setup, io_uring_enter"),
            (libc::EPERM, None, "deploy/seccomp/ringway.json"),
            (
                libc::EPERM,
                Some(0),
                "default seccomp profile blocks io_uring",
            ),
            (libc::EPERM, Some(1), "kernel.io_uring_group"),
            (libc::EPERM, Some(2), "sysctl -w kernel.io_uring_disabled=0"),
            (libc::ENOSYS, None, "Linux 5.19 or later"),
            (libc::ENOMEM, None, "RLIMIT_MEMLOCK"),
            (libc::EINVAL, None, "cannot set up an io_uring"),
        ];
        for (errno, sysctl, expected) in cases {
            let why = io_uring_diagnosis(&err(errno), sysctl);
            assert!(why.contains(expected), "{errno} {sysctl:?}: {why}");
        }
        // And here, where the tests run, it works.
        check_io_uring().unwrap();
    }

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
