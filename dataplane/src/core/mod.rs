//! A core: what one executor's connections read ([`CoreInputs`]): its
//! readiness ring, copy pools, HBONE client and certificates, snapshot
//! slot, counters and settings. Nothing on the data path is shared between
//! cores; the only cross-thread inputs are the snapshot feed, the
//! certificate feed and the shutdown signal, all read without locks. The
//! traffic paths (`proxy/`) take a core; the executors that run cores are
//! started by `app::cores`.
//!
//! - [`config`]: the settings every core runs with.
//! - [`admission`]: accepted connections counted against the caps.
//! - [`authorization`]: admission of inbound connections by policy, and
//!   late rejection.
//! - [`limits`]: what bounds one peer's work on a core (dials in flight,
//!   early resets, refusal log lines).
//! - [`memory`]: the core's budget for bytes held on behalf of inbound
//!   HBONE peers, and which connections stop reading past it.

pub mod admission;
pub mod authorization;
pub mod config;
pub mod limits;
pub mod memory;

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use ringway_controlplane::model::{Str, Workload};
use ringway_controlplane::security::certmanager::CertRequests;
use ringway_controlplane::security::certs::CertFeed;
use ringway_controlplane::sources::xds::{lookup_on_demand, OnDemandSender};
use ringway_controlplane::{Snapshot, SnapshotFeed};
use tokio::sync::watch;

use crate::hbone::client::Client;
use crate::hbone::tls::Certificates;
use crate::inpod::PodScope;
use crate::io::copy::Copier;
use crate::io::listener::SelfAddrs;
use crate::io::uring::Poller;
use crate::telemetry::accesslog::OpenConnections;
use crate::telemetry::metrics::CoreMetrics;
use crate::telemetry::ratelog::RateLog;

use crate::core::authorization::Registry;
use crate::core::config::ProxyConfig;

/// Everything one core's connections read. Core-local (!Send): built on
/// the core (`app::cores`) from what crossed into it at startup.
pub struct CoreInputs {
    pub index: usize,
    pub cfg: ProxyConfig,
    pub poller: Rc<Poller>,
    pub copier: Copier,
    pub self_addrs: SelfAddrs,
    pub open: Rc<OpenConnections>,
    /// Accepted connections against the caps.
    pub admission: Rc<crate::core::admission::Admission>,
    /// This core's outbound HBONE: its connection pool and dialler.
    pub hbone: Client,
    /// This core's certificates, for both HBONE directions.
    pub certs: Rc<Certificates>,
    /// Istio TCP metrics and per-core stats, read by the scraper.
    pub metrics: CoreMetrics,
    /// Inbound connections admitted by policy, re-checked on snapshot
    /// changes (late rejection).
    pub admitted: Rc<Registry>,
    /// HBONE connections (both directions) opened while a CRL was in
    /// force, re-checked when it is reloaded. The same as the client's.
    pub revocations: Rc<crate::hbone::revocation::Revocations>,
    /// True once shutdown began (stop accepting, send GOAWAY, drain).
    pub shutdown: watch::Receiver<bool>,
    /// Flips to true at the drain deadline: every connection still open is
    /// cancelled (and so logged and closed).
    pub force_close: Rc<crate::io::latch::Latch>,
    /// The core's current snapshot. Connections clone the `Rc` (no atomic
    /// traffic between cores); the core's watcher task swaps it on publish
    /// ([`replace_snapshot`](Self::replace_snapshot)).
    #[allow(clippy::redundant_allocation)] // the Rc is the point: core-local refcount
    snapshot: RefCell<Rc<Arc<Snapshot>>>,
    /// Requests to the control thread: on-demand destinations. Lock-free
    /// queues; the core never blocks on them.
    pub control: ControlHandles,
    /// Inbound HBONE dials in flight on this core.
    pub dials: Rc<limits::CoreDials>,
    /// One log line a second for refused dials.
    pub dial_refusals_log: RateLog,
    /// One log line a second for GOAWAYs sent to peers that reset early.
    pub calm_log: RateLog,
    /// Bytes held for inbound HBONE peers, against
    /// `--memory-budget-per-core`.
    pub memory: Rc<memory::CoreMemory>,
    /// Dedicated mode: the proxy workload's uid in the snapshot of the
    /// version noted, found once per version (a scan of the workloads).
    proxy_workload_uid: RefCell<Option<(u64, Option<Str>)>>,
}

impl CoreInputs {
    /// A core's inputs; `snapshot` is the one its first connections decide
    /// with.
    #[allow(clippy::too_many_arguments)] // one per field the core is made of
    pub fn new(
        index: usize,
        cfg: ProxyConfig,
        poller: Rc<Poller>,
        copier: Copier,
        self_addrs: SelfAddrs,
        open: Rc<OpenConnections>,
        hbone: Client,
        certs: Rc<Certificates>,
        metrics: CoreMetrics,
        shutdown: watch::Receiver<bool>,
        force_close: Rc<crate::io::latch::Latch>,
        control: ControlHandles,
        snapshot: Arc<Snapshot>,
    ) -> Self {
        let admission = Rc::new(crate::core::admission::Admission::new(cfg.conn_caps));
        let memory = memory::CoreMemory::new(cfg.memory_budget, metrics.stats.clone(), index);
        CoreInputs {
            index,
            cfg,
            poller,
            copier,
            self_addrs,
            open,
            admission,
            revocations: hbone.revocations.clone(),
            hbone,
            certs,
            metrics,
            admitted: Rc::default(),
            shutdown,
            force_close,
            snapshot: RefCell::new(Rc::new(snapshot)),
            control,
            dials: Rc::default(),
            dial_refusals_log: RateLog::new("inbound HBONE streams refused at a dial cap", 1),
            calm_log: RateLog::new("inbound HBONE connections sent GOAWAY for early resets", 1),
            memory,
            proxy_workload_uid: RefCell::new(None),
        }
    }

    /// The snapshot a new connection decides with; it keeps this version
    /// for its whole life even if a newer one arrives meanwhile.
    #[allow(clippy::redundant_allocation)]
    pub fn snapshot(&self) -> Rc<Arc<Snapshot>> {
        self.snapshot.borrow().clone()
    }

    /// Makes `snap` the snapshot new connections decide with; returns the
    /// one it replaces.
    #[allow(clippy::redundant_allocation)]
    pub fn replace_snapshot(&self, snap: Arc<Snapshot>) -> Rc<Arc<Snapshot>> {
        std::mem::replace(&mut *self.snapshot.borrow_mut(), Rc::new(snap))
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
        pod: Option<&PodScope>,
    ) -> Option<&'s Arc<Workload>> {
        if let Some(pod) = pod {
            return pod.workload(snap);
        }
        let Some(pw) = &self.cfg.proxy_workload else {
            return src
                .and_then(|ip| crate::core::authorization::local_workload(snap, &self.cfg, ip));
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

    /// On-demand mode: asks the control plane about an unknown destination
    /// and waits (bounded) for a snapshot that resolves it. Returns that
    /// snapshot, or None (not on demand, timed out, or unknown).
    pub async fn resolve_on_demand(&self, ip: std::net::IpAddr) -> Option<Arc<Snapshot>> {
        let tx = self.control.on_demand.as_ref()?;
        let mut feed = self.control.snapshot_feed.clone();
        let timeout = crate::io::executor::timer::sleep(self.cfg.on_demand_timeout);
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
    pod: Option<&PodScope>,
    fut: impl Future<Output = ()> + 'static,
) {
    crate::io::executor::spawn_detached(futures_lite::future::or(fut, cancelled(core, pod)));
}

/// Resolves when connections must end now: at the drain deadline (or when
/// the core is gone), or when their pod was removed and its drain is over.
pub fn cancelled(core: &CoreInputs, pod: Option<&PodScope>) -> impl Future<Output = ()> + 'static {
    let deadline = core.force_close.wait();
    let pod_closed = pod.map(|p| p.closed());
    futures_lite::future::or(deadline, async move {
        match pod_closed {
            Some(closed) => closed.await,
            None => std::future::pending().await,
        }
    })
}
