//! In-pod mode (ztunnel's shared in-pod mode): the node agent (istio-cni)
//! enrolls each ambient pod over ZDS and hands over its network namespace;
//! ringway then listens on 15001/15006/15008 (and DNS on 15053) *inside*
//! that namespace, on every core, and makes the pod's outbound,
//! application and DNS upstream sockets there too, marked so the pod's
//! redirection rules let them pass.
//!
//! - [`manager`]: the ZDS side (its own thread): binds a pod's listeners
//!   in its namespace, publishes the set of pods, retries pods that failed,
//!   answers for readiness.
//! - here: what crosses to the cores ([`PodSet`], [`PodEntry`]) and what a
//!   core keeps per pod ([`PodScope`]): the pod's workload, its open
//!   connections, and the signal that closes them when the pod goes.

pub mod manager;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ringway_controlplane::model::snapshot::Snapshot;
use ringway_controlplane::model::{Str, Workload};
use tokio::sync::watch;

use ringway_controlplane::model::WorkloadName;

use crate::io::count::OpenCount;
use crate::io::listener::{BoundListener, DnsListener, TrafficPath};

/// The listener ports opened in every enrolled pod (ztunnel's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodPorts {
    pub outbound: u16,
    pub inbound_passthrough: u16,
    pub inbound: u16,
}

impl Default for PodPorts {
    fn default() -> Self {
        PodPorts {
            outbound: 15001,
            inbound_passthrough: 15006,
            inbound: 15008,
        }
    }
}

impl PodPorts {
    pub fn all(&self) -> [(TrafficPath, u16); 3] {
        [
            (TrafficPath::Outbound, self.outbound),
            (TrafficPath::InboundPassthrough, self.inbound_passthrough),
            (TrafficPath::Inbound, self.inbound),
        ]
    }
}

/// What one core takes of a pod: its sockets there, all made in the pod's
/// namespace by the manager (so any failure to make one is the pod's
/// NACK, not a core's problem).
#[derive(Default)]
pub struct PodSockets {
    /// 15001/15006/15008.
    pub listeners: Vec<BoundListener>,
    /// The DNS proxy, when on.
    pub dns: Option<PodDns>,
}

/// One core's DNS proxy sockets in a pod: UDP and TCP on the pod's DNS
/// address(es), and the upstream sockets forwarded queries leave from,
/// inside the pod and marked, as ztunnel forwards a pod's queries.
pub struct PodDns {
    pub listeners: Vec<DnsListener>,
    /// Unbound UDP sockets by family (true: IPv6), marked.
    pub upstream: Vec<(bool, OwnedFd)>,
}

/// One enrolled pod, as every core sees it. Immutable once published, but
/// for the per-core listener hand-over and the counters the manager waits
/// on.
pub struct PodEntry {
    /// The agent's uid for the pod (Kubernetes' pod uid).
    pub uid: String,
    /// Distinguishes two enrolments of one uid (a pod re-added with a new
    /// namespace).
    pub generation: u64,
    /// The workload it is, as the agent named it.
    pub workload: WorkloadName,
    /// Istio's uid for that workload (`<cluster>//Pod/<ns>/<name>`), tried
    /// first when finding it in a snapshot.
    pub workload_uid: String,
    pub netns: OwnedFd,
    /// The pod's own addresses (read inside its namespace): a destination
    /// there on one of our ports is a loop.
    pub addrs: Vec<IpAddr>,
    /// Each core's listeners, taken once by that core (a channel of one,
    /// so the hand-over needs no lock).
    listeners: Vec<crossbeam_channel::Receiver<PodSockets>>,
    /// Cores accepting on this pod's listeners.
    pub serving: AtomicUsize,
    /// Cores that have closed them again (after the pod was removed).
    pub stopped: AtomicUsize,
}

impl PodEntry {
    pub fn new(
        uid: String,
        generation: u64,
        workload: WorkloadName,
        workload_uid: String,
        netns: OwnedFd,
        addrs: Vec<IpAddr>,
        per_core: Vec<PodSockets>,
    ) -> Self {
        let listeners = per_core
            .into_iter()
            .map(|l| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                tx.send(l).expect("receiver held");
                rx
            })
            .collect();
        PodEntry {
            uid,
            generation,
            workload,
            workload_uid,
            netns,
            addrs,
            listeners,
            serving: AtomicUsize::new(0),
            stopped: AtomicUsize::new(0),
        }
    }

    /// Core `index`'s sockets; None if already taken (or no such core).
    pub fn take_sockets(&self, index: usize) -> Option<PodSockets> {
        self.listeners.get(index)?.try_recv().ok()
    }
}

/// Every enrolled pod, published to the cores as one immutable value.
#[derive(Default)]
pub struct PodSet {
    pub pods: HashMap<String, Arc<PodEntry>>,
}

/// Cores follow this; the manager publishes.
pub type PodFeed = watch::Receiver<Arc<PodSet>>;

/// What one core keeps for one enrolled pod while the pod or any of its
/// connections lives. Core-local.
pub struct PodScope {
    pub entry: Arc<PodEntry>,
    /// The pod's workload uid in the snapshot of the version noted, found
    /// once per version.
    workload: RefCell<Option<(u64, Option<Str>)>>,
    open: OpenCount,
    /// Flips to true when the pod's connections must end now (the pod was
    /// removed and its drain time is up).
    closing: Rc<crate::io::latch::Latch>,
}

impl PodScope {
    pub fn new(entry: Arc<PodEntry>) -> Self {
        PodScope {
            entry,
            workload: RefCell::new(None),
            open: Default::default(),
            closing: crate::io::latch::Latch::new(),
        }
    }

    pub fn netns(&self) -> BorrowedFd<'_> {
        self.entry.netns.as_fd()
    }

    /// The pod's workload in `snap`: the one with Istio's uid for the pod
    /// (`<cluster>//Pod/<ns>/<name>`) and the agent's namespace, name and
    /// service account. None: not in the config (yet); fail closed.
    pub fn workload<'s>(&self, snap: &'s Snapshot) -> Option<&'s Arc<Workload>> {
        let mut cached = self.workload.borrow_mut();
        let uid = match &*cached {
            Some((version, uid)) if *version == snap.version() => uid.clone(),
            _ => {
                // By Istio's uid for the pod only: a scan by name would cost
                // every workload per pod, core and version, and could match
                // a same-named pod of another cluster. `--cluster-id` must
                // be istiod's for the uid to match.
                let pw = &self.entry.workload;
                let uid = snap
                    .workload_by_uid(&self.entry.workload_uid)
                    .filter(|w| pw.is(w))
                    .map(|w| w.uid.clone());
                if uid.is_none() && snap.version() > 0 {
                    tracing::warn!(
                        pod = %self.entry.uid,
                        workload = %pw,
                        uid = %self.entry.workload_uid,
                        "enrolled pod has no workload in the mesh config (is --cluster-id \
                         istiod's?); its traffic is refused until it appears"
                    );
                }
                *cached = Some((snap.version(), uid.clone()));
                uid
            }
        };
        uid.and_then(|uid| snap.workload_by_uid(&uid))
    }

    /// A destination on one of `ports` at the pod's own address leads back
    /// into its listeners.
    pub fn is_self(&self, dst: SocketAddr, ports: &[u16]) -> bool {
        ports.contains(&dst.port()) && self.entry.addrs.contains(&dst.ip())
    }

    pub fn enter(&self) {
        self.open.enter();
    }

    pub fn leave(&self) {
        self.open.leave();
    }

    pub fn open(&self) -> usize {
        self.open.get()
    }

    /// Resolves once none of the pod's connections is open.
    pub async fn all_closed(&self) {
        self.open.all_closed().await
    }

    /// Ends every connection of the pod still open.
    pub fn close(&self) {
        self.closing.set();
    }

    /// The pod was removed and its drain is over.
    pub fn is_closed(&self) -> bool {
        self.closing.is_set()
    }

    /// Resolves when [`close`](Self::close) is called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + 'static {
        self.closing.wait()
    }
}

/// Outside in-pod mode (`pod` None), any local workload; in a pod, only
/// the pod's own workload may be served there (the error says why not).
pub fn is_pods_own(
    pod: Option<&Rc<PodScope>>,
    snap: &Snapshot,
    workload: &Workload,
) -> Result<(), String> {
    let Some(pod) = pod else {
        return Ok(());
    };
    match pod.workload(snap) {
        Some(own) if own.uid == workload.uid => Ok(()),
        Some(own) => Err(format!(
            "workload {} is not pod {}'s own ({}); refused",
            workload.uid, pod.entry.uid, own.uid
        )),
        None => Err(format!(
            "pod {} ({}) is not in the mesh config (fail closed)",
            pod.entry.uid, pod.entry.workload
        )),
    }
}

/// A pod's namespace as part of an HBONE pool key: tunnels made from one
/// pod are never reused by another. Equal when the same enrolment.
#[derive(Clone)]
pub struct PodNetns(pub Rc<PodScope>);

impl PartialEq for PodNetns {
    fn eq(&self, other: &Self) -> bool {
        self.0.entry.generation == other.0.entry.generation
    }
}
impl Eq for PodNetns {}
impl std::hash::Hash for PodNetns {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.entry.generation.hash(state)
    }
}
impl std::fmt::Debug for PodNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {}", self.0.entry.uid)
    }
}

/// Istio's uid for a Kubernetes pod's workload.
pub fn pod_workload_uid(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{cluster}//Pod/{namespace}/{name}")
}

/// Counts a pod's open connections from enrolment of a connection to its
/// end (held by the connection's access-log record).
pub struct PodConn(pub Rc<PodScope>);

impl PodConn {
    pub fn new(scope: Rc<PodScope>) -> Self {
        scope.enter();
        PodConn(scope)
    }
}

impl Drop for PodConn {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl std::ops::Deref for PodConn {
    type Target = Rc<PodScope>;
    fn deref(&self) -> &Rc<PodScope> {
        &self.0
    }
}

/// Counted helper for the manager's waits.
pub(crate) fn load(n: &AtomicUsize) -> usize {
    n.load(Ordering::Acquire)
}
