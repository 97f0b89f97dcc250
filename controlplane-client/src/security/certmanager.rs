//! The certificate manager: keeps a [`CertSnapshot`] of TLS configs for the
//! identities this node serves, fetching certificates from a pluggable
//! [`CertSource`] (the built-in CA signing locally, or an Istio CA through
//! the CA client, which implements [`CertSource`] on top of this module).
//!
//! It runs as one task on the control thread's tokio runtime:
//!
//! - **Prefetch.** Identities of the workloads on this node are fetched
//!   ahead of need at [`Priority::Prefetch`]: `node ==` the configured node
//!   name, or, when the caller follows them with
//!   [`follow_local`](CertManager::follow_local), the [`LocalWorkloads`] it
//!   publishes (without a node name: those at this host's addresses, or
//!   the enrolled pods). With neither, every workload.
//! - **Requests from cores.** A core that finds no certificate for an
//!   identity sends it on [`CertRequests`]; the identity becomes
//!   [`Priority::Urgent`] and jumps the queue. [`wait_for_cert`] does that
//!   and waits (no tokio runtime needed) until the certificate is published
//!   or the caller's deadline passes, failing closed.
//! - **One keyed priority queue**, at most
//!   [`CertManagerConfig::max_concurrent_fetches`] fetches in flight, never
//!   two for one identity.
//! - **Refresh** at half the lifetime ([`refresh_at`]), at
//!   [`Priority::Background`].
//! - **Failures** back off per identity (from
//!   [`initial_backoff`](CertManagerConfig::initial_backoff), doubling, ±20 %
//!   jitter, capped at [`max_backoff`](CertManagerConfig::max_backoff));
//!   a still-valid certificate keeps being served until it expires.
//! - **Forgetting.** An identity no workload on this node has any more, and
//!   that no core asked for within
//!   [`request_linger`](CertManagerConfig::request_linger), is dropped. One
//!   fetched on demand is kept another linger while connections still use
//!   it (cores set its [`UseMark`](crate::security::tls::UseMark)), so a
//!   busy remote identity is not dropped and fetched again every linger.
//! - **Publishing.** A new [`CertSnapshot`] goes out whenever the set of
//!   served certificates changes (added, renewed, expired or dropped).
//!
//! Per-identity state ([`CertState`]: pending, available, failed) is
//! observable through [`CertManager::statuses`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use ring::rand::SystemRandom;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::backoff::jitter;
use crate::model::identity::Identity;
use crate::publish::SnapshotFeed;
use crate::security::ca::{BuiltinCa, CaError};
use crate::security::certs::{
    local_identities, refresh_at, CertFeed, CertPublisher, CertSnapshot, LocalWorkloads,
};
use crate::security::tls::{build_tls_configs, TlsConfigs, WorkloadCert};

/// Where certificates come from.
pub trait CertSource: Send + Sync + 'static {
    /// A certificate (with its key and roots) for `id`. The manager checks
    /// that it names `id` and builds the TLS configs.
    fn fetch(
        &self,
        id: &Identity,
    ) -> impl Future<Output = Result<WorkloadCert, CertFetchError>> + Send;
}

/// Why a [`CertSource`] produced no certificate. Permanent errors (the
/// identity can never be certified, e.g. a foreign trust domain) are retried
/// only at the maximum backoff.
#[derive(Clone)]
pub struct CertFetchError {
    permanent: bool,
    error: Arc<dyn std::error::Error + Send + Sync>,
}

impl CertFetchError {
    /// Worth retrying soon (the CA is down, a timeout, a bad answer).
    pub fn transient(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CertFetchError {
            permanent: false,
            error: Arc::from(error.into()),
        }
    }

    /// Will fail the same way every time.
    pub fn permanent(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CertFetchError {
            permanent: true,
            error: Arc::from(error.into()),
        }
    }

    pub fn is_permanent(&self) -> bool {
        self.permanent
    }
}

impl fmt::Display for CertFetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for CertFetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertFetchError")
            .field("permanent", &self.permanent)
            .field("error", &self.error.to_string())
            .finish()
    }
}

impl std::error::Error for CertFetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// The built-in CA as a [`CertSource`]: signs locally, `validity` long.
#[derive(Debug, Clone)]
pub struct BuiltinCaSource {
    ca: Arc<BuiltinCa>,
    validity: Duration,
}

impl BuiltinCaSource {
    pub fn new(ca: Arc<BuiltinCa>, validity: Duration) -> BuiltinCaSource {
        BuiltinCaSource { ca, validity }
    }
}

impl CertSource for BuiltinCaSource {
    async fn fetch(&self, id: &Identity) -> Result<WorkloadCert, CertFetchError> {
        match self.ca.issue(id, self.validity) {
            Ok(issued) => issued.to_workload_cert().map_err(CertFetchError::transient),
            Err(e @ (CaError::Identity { .. } | CaError::ForeignTrustDomain { .. })) => {
                Err(CertFetchError::permanent(e))
            }
            Err(e) => Err(CertFetchError::transient(e)),
        }
    }
}

/// The built-in certificate manager: a [`CertManager`] over the built-in CA
/// ([`BuiltinCaSource`], `validity` long) prefetching the identities of the
/// workloads on `node` (all workloads when `None`). Certificates already in
/// `certs` (e.g. from [`issue_all`](crate::security::certs::issue_all)) are adopted; identities that leave the
/// node are dropped; each is re-issued at half its lifetime; failures back
/// off while a still-valid certificate is kept. Returns when the workload
/// feed closes. Cores have no way to ask this one for certificates; build
/// the [`CertManager`] directly for that.
pub async fn run_builtin_cert_manager(
    ca: Arc<BuiltinCa>,
    workloads: SnapshotFeed,
    certs: CertPublisher,
    node: Option<String>,
    validity: Duration,
) {
    let source = Arc::new(BuiltinCaSource::new(ca, validity));
    let config = CertManagerConfig {
        node,
        ..CertManagerConfig::default()
    };
    CertManager::new(source, workloads, certs, config)
        .run()
        .await
}

/// How cores ask for a certificate: send the identity. `Send`, and sending
/// needs no tokio runtime, so it works from the data-plane cores.
pub type CertRequests = mpsc::UnboundedSender<Identity>;

/// Tuning for [`CertManager`].
#[derive(Debug, Clone)]
pub struct CertManagerConfig {
    /// Prefetch the identities of workloads on this node; `None`: of every
    /// workload, unless [`CertManager::follow_local`] says which are local.
    pub node: Option<String>,
    /// Fetches in flight at once (ztunnel: 8).
    pub max_concurrent_fetches: usize,
    /// Delay before the first retry of a failed fetch.
    pub initial_backoff: Duration,
    /// Longest delay between retries.
    pub max_backoff: Duration,
    /// How long an identity a core asked for is kept (and refreshed) after
    /// the last request when no workload on this node has it.
    pub request_linger: Duration,
}

impl Default for CertManagerConfig {
    fn default() -> Self {
        CertManagerConfig {
            node: None,
            max_concurrent_fetches: 8,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(150),
            request_linger: Duration::from_secs(10 * 60),
        }
    }
}

/// Order in the fetch queue, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Renewal of a certificate still being served; retries while one is.
    Background,
    /// An identity of this node without a certificate yet.
    Prefetch,
    /// A core is waiting for it.
    Urgent,
}

/// One identity's state, as reported by [`CertManager::statuses`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertState {
    /// No certificate yet; a fetch is queued, running or about to be.
    Pending,
    /// A certificate is served; it will be renewed at `refresh_at`.
    Available {
        not_after: SystemTime,
        refresh_at: SystemTime,
    },
    /// The last fetch failed; the next try is at `retry_at`. `valid_until`:
    /// the expiry of the certificate still served meanwhile, if any.
    Failed {
        error: String,
        retry_at: SystemTime,
        valid_until: Option<SystemTime>,
    },
}

/// Every tracked identity's state.
pub type CertStatuses = Arc<BTreeMap<Identity, CertState>>;

/// Never fetch one identity again sooner than this after a success.
const MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(1);

/// See the module docs. Build with [`new`](Self::new), hand
/// [`requests`](Self::requests) to the cores, then spawn [`run`](Self::run)
/// on the control thread.
pub struct CertManager<S> {
    source: Arc<S>,
    workloads: SnapshotFeed,
    certs: CertPublisher,
    config: CertManagerConfig,
    requests_tx: CertRequests,
    requests_rx: mpsc::UnboundedReceiver<Identity>,
    statuses: watch::Sender<CertStatuses>,
    local: Option<watch::Receiver<LocalWorkloads>>,
}

impl<S: CertSource> CertManager<S> {
    /// Certificates already in `certs` (e.g. issued at startup) are adopted
    /// and renewed in due course rather than fetched again.
    pub fn new(
        source: Arc<S>,
        workloads: SnapshotFeed,
        certs: CertPublisher,
        config: CertManagerConfig,
    ) -> CertManager<S> {
        let (requests_tx, requests_rx) = mpsc::unbounded_channel();
        let (statuses, _) = watch::channel(CertStatuses::default());
        CertManager {
            source,
            workloads,
            certs,
            config,
            requests_tx,
            requests_rx,
            statuses,
            local: None,
        }
    }

    /// Prefetches the identities of the workloads `local` names, following
    /// its changes, instead of going by [`CertManagerConfig::node`]. Once
    /// its sender is gone, the last value stays.
    pub fn follow_local(mut self, local: watch::Receiver<LocalWorkloads>) -> CertManager<S> {
        self.local = Some(local);
        self
    }

    /// The handle cores use to ask for certificates.
    pub fn requests(&self) -> CertRequests {
        self.requests_tx.clone()
    }

    /// Per-identity state, updated as it changes.
    pub fn statuses(&self) -> watch::Receiver<CertStatuses> {
        self.statuses.subscribe()
    }

    /// Runs until the workload feed closes. Must run on a tokio runtime
    /// (fetches are spawned as tasks); in-flight fetches are dropped on
    /// return.
    pub async fn run(mut self) {
        let mut state = State::new(&self.config, &self.certs.current(), SystemTime::now());
        let mut fetches: JoinSet<Result<WorkloadCert, CertFetchError>> = JoinSet::new();
        let mut in_flight: HashMap<tokio::task::Id, Identity> = HashMap::new();
        let mut workloads_changed = true;
        let by_node = match &self.config.node {
            Some(n) => LocalWorkloads::Node(n.clone()),
            None => LocalWorkloads::All,
        };
        let mut local = self.local.take();
        loop {
            let now = SystemTime::now();
            if workloads_changed {
                let snapshot = self.workloads.current();
                let wanted = match &local {
                    Some(l) => local_identities(&snapshot, &l.borrow()),
                    None => local_identities(&snapshot, &by_node),
                };
                state.set_wanted(&wanted, now);
                workloads_changed = false;
            }
            while let Ok(id) = self.requests_rx.try_recv() {
                state.request(id, now);
            }
            while let Some(done) = fetches.try_join_next_with_id() {
                state.finish(fetch_outcome(done, &mut in_flight), now);
            }
            state.expire_and_forget(now);
            state.enqueue_due(now);
            while fetches.len() < self.config.max_concurrent_fetches.max(1) {
                let Some(id) = state.start_next(now) else {
                    break;
                };
                let source = self.source.clone();
                let fetch_id = id.clone();
                let handle = fetches.spawn(async move { source.fetch(&fetch_id).await });
                in_flight.insert(handle.id(), id);
            }
            if std::mem::take(&mut state.certs_changed) {
                let snapshot = CertSnapshot::new(state.served());
                let count = snapshot.len();
                let version = self.certs.publish(snapshot);
                tracing::debug!(version, identities = count, "published certificates");
            }
            if std::mem::take(&mut state.status_changed) {
                self.statuses.send_replace(Arc::new(state.statuses()));
            }

            let sleep = state.next_wake().map(|at| {
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            });
            tokio::select! {
                changed = self.workloads.changed() => {
                    if changed.is_err() {
                        tracing::info!("workload feed closed; certificate manager stops");
                        return;
                    }
                    workloads_changed = true;
                }
                () = local_changed(&mut local) => workloads_changed = true,
                Some(id) = self.requests_rx.recv() => state.request(id, SystemTime::now()),
                Some(done) = fetches.join_next_with_id(), if !fetches.is_empty() => {
                    state.finish(fetch_outcome(done, &mut in_flight), SystemTime::now());
                }
                _ = sleep_or_forever(sleep) => {}
            }
        }
    }
}

type FetchResult = Result<WorkloadCert, CertFetchError>;

/// Which identity a finished task was for, and its result (a panicked task
/// counts as a transient failure).
fn fetch_outcome(
    done: Result<(tokio::task::Id, FetchResult), tokio::task::JoinError>,
    in_flight: &mut HashMap<tokio::task::Id, Identity>,
) -> Option<(Identity, FetchResult)> {
    match done {
        Ok((task, result)) => in_flight.remove(&task).map(|id| (id, result)),
        Err(e) => {
            let id = in_flight.remove(&e.id())?;
            let error = format!("certificate fetch task failed: {e}");
            Some((id, Err(CertFetchError::transient(error))))
        }
    }
}

/// Completes when the local workloads change; never once their sender is
/// gone (the last value stays) or when there is nothing to follow.
async fn local_changed(local: &mut Option<watch::Receiver<LocalWorkloads>>) {
    if let Some(rx) = local {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn sleep_or_forever(duration: Option<Duration>) {
    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Waits for `id`'s certificate on a core: returns it at once when the
/// current [`CertSnapshot`] has a valid one; otherwise asks the manager
/// (urgently) and waits for a snapshot that has it, until `deadline`
/// completes (pass a timer of the core's executor, e.g. the data plane's
/// `timer::sleep`). Needs no tokio runtime. `None` (fail closed) on deadline, or
/// when the manager or the publisher is gone.
pub async fn wait_for_cert(
    feed: &mut CertFeed,
    requests: &CertRequests,
    id: &Identity,
    deadline: impl Future<Output = ()>,
) -> Option<Arc<TlsConfigs>> {
    let usable = |feed: &CertFeed| {
        feed.load()
            .get(id)
            .filter(|c| c.not_after > SystemTime::now())
            .cloned()
    };
    if let Some(configs) = usable(feed) {
        return Some(configs);
    }
    if requests.send(id.clone()).is_err() {
        tracing::warn!(identity = %id, "certificate manager is gone; no certificate");
        return None;
    }
    let wait = async {
        loop {
            if let Some(configs) = usable(feed) {
                return Some(configs);
            }
            if feed.changed().await.is_err() {
                return usable(feed);
            }
        }
    };
    let mut wait = pin!(wait);
    let mut deadline = pin!(deadline);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(found) = wait.as_mut().poll(cx) {
            return Poll::Ready(found);
        }
        deadline.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Where an identity is in its fetch cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Goes into the queue at this time (refresh, retry, or now).
    Waiting(SystemTime),
    Queued,
    Fetching,
}

struct Failure {
    error: String,
    retry_at: SystemTime,
    /// Backoff before the try after the next one.
    next_backoff: Duration,
}

struct Entry {
    /// What is served for this identity.
    cert: Option<Arc<TlsConfigs>>,
    /// A workload on this node has this identity.
    on_node: bool,
    /// When a core last asked for it.
    requested_at: Option<SystemTime>,
    phase: Phase,
    /// A core asked and has no certificate: queue it as urgent.
    urgent: bool,
    failure: Option<Failure>,
    last_attempt: Option<SystemTime>,
}

impl Entry {
    fn new(now: SystemTime) -> Entry {
        Entry {
            cert: None,
            on_node: false,
            requested_at: None,
            phase: Phase::Waiting(now),
            urgent: false,
            failure: None,
            last_attempt: None,
        }
    }

    fn has_valid_cert(&self, now: SystemTime) -> bool {
        self.cert.as_ref().is_some_and(|c| c.not_after > now)
    }

    fn priority(&self, now: SystemTime) -> Priority {
        if self.urgent {
            Priority::Urgent
        } else if self.has_valid_cert(now) {
            Priority::Background
        } else {
            Priority::Prefetch
        }
    }
}

/// A keyed priority queue: highest priority first, first come first served
/// within a priority; raising an identity's priority moves it.
#[derive(Default)]
struct FetchQueue {
    order: BTreeSet<(std::cmp::Reverse<Priority>, u64, Identity)>,
    index: HashMap<Identity, (Priority, u64)>,
    next_seq: u64,
}

impl FetchQueue {
    /// Adds `id`, or raises it to `priority` if it waits at a lower one.
    fn push(&mut self, id: &Identity, priority: Priority) {
        if let Some(&(current, seq)) = self.index.get(id) {
            if current >= priority {
                return;
            }
            self.order
                .remove(&(std::cmp::Reverse(current), seq, id.clone()));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order
            .insert((std::cmp::Reverse(priority), seq, id.clone()));
        self.index.insert(id.clone(), (priority, seq));
    }

    fn pop(&mut self) -> Option<Identity> {
        let (_, _, id) = self.order.pop_first()?;
        self.index.remove(&id);
        Some(id)
    }

    fn remove(&mut self, id: &Identity) {
        if let Some((priority, seq)) = self.index.remove(id) {
            self.order
                .remove(&(std::cmp::Reverse(priority), seq, id.clone()));
        }
    }
}

/// Everything the manager knows; no I/O, so the run loop stays small.
struct State {
    entries: HashMap<Identity, Entry>,
    queue: FetchQueue,
    initial_backoff: Duration,
    max_backoff: Duration,
    request_linger: Duration,
    rng: SystemRandom,
    /// The served set changed since the last publish.
    certs_changed: bool,
    /// Some state changed since statuses were last sent.
    status_changed: bool,
}

impl State {
    /// Adopts the certificates already published.
    fn new(config: &CertManagerConfig, current: &CertSnapshot, now: SystemTime) -> State {
        let mut entries = HashMap::new();
        for configs in current.iter() {
            let mut entry = Entry::new(now);
            entry.phase = Phase::Waiting(refresh_at(configs.not_before, configs.not_after));
            entry.cert = Some(configs.clone());
            entries.insert(configs.identity.clone(), entry);
        }
        State {
            entries,
            queue: FetchQueue::default(),
            initial_backoff: config.initial_backoff,
            max_backoff: config.max_backoff.max(config.initial_backoff),
            request_linger: config.request_linger,
            rng: SystemRandom::new(),
            certs_changed: false,
            status_changed: true,
        }
    }

    /// The identities of this node's workloads are now `wanted`.
    fn set_wanted(&mut self, wanted: &BTreeSet<Identity>, now: SystemTime) {
        for (id, entry) in &mut self.entries {
            let on_node = wanted.contains(id);
            if entry.on_node != on_node {
                entry.on_node = on_node;
                self.status_changed = true;
            }
        }
        for id in wanted {
            if !self.entries.contains_key(id) {
                let mut entry = Entry::new(now);
                entry.on_node = true;
                self.entries.insert(id.clone(), entry);
                self.status_changed = true;
            }
        }
    }

    /// A core asked for `id`.
    fn request(&mut self, id: Identity, now: SystemTime) {
        let initial_backoff = self.initial_backoff;
        let entry = self.entries.entry(id.clone()).or_insert_with(|| {
            tracing::debug!(identity = %id, "certificate requested for an identity not on this node");
            Entry::new(now)
        });
        entry.requested_at = Some(now);
        if entry.has_valid_cert(now) {
            // The core's snapshot was older than ours.
            return;
        }
        entry.urgent = true;
        self.status_changed = true;
        match entry.phase {
            Phase::Fetching => {}
            Phase::Queued => self.queue.push(&id, Priority::Urgent),
            Phase::Waiting(due) => {
                // Asking again does not bypass the backoff entirely: at most
                // one try per initial backoff.
                let earliest = entry.last_attempt.map_or(now, |t| t + initial_backoff);
                entry.phase = Phase::Waiting(due.min(earliest.max(now)));
            }
        }
    }

    /// Stops serving expired certificates; drops identities nobody needs.
    fn expire_and_forget(&mut self, now: SystemTime) {
        for (id, entry) in &mut self.entries {
            if entry.cert.as_ref().is_some_and(|c| c.not_after <= now) {
                tracing::warn!(identity = %id, "certificate expired; no longer served");
                entry.cert = None;
                self.certs_changed = true;
                self.status_changed = true;
            }
        }
        let linger = self.request_linger;
        let mut forgotten = Vec::new();
        for (id, e) in &mut self.entries {
            if e.on_node || e.requested_at.is_some_and(|t| t + linger > now) {
                continue;
            }
            // Fetched on demand, its linger is over, but connections used
            // it since: they will again, keep it (the cores ask only when
            // they have none, so their use is the only sign).
            if e.requested_at.is_some() && e.cert.as_ref().is_some_and(|c| c.used.take()) {
                e.requested_at = Some(now);
                continue;
            }
            forgotten.push(id.clone());
        }
        for id in forgotten {
            let entry = self.entries.remove(&id).expect("listed above");
            self.queue.remove(&id);
            if entry.cert.is_some() {
                tracing::info!(identity = %id, "dropping certificate: no local workload uses it");
                self.certs_changed = true;
            }
            self.status_changed = true;
        }
    }

    /// Queues every identity whose time has come, in due-time order.
    fn enqueue_due(&mut self, now: SystemTime) {
        let mut due: Vec<(SystemTime, Identity)> = self
            .entries
            .iter()
            .filter_map(|(id, e)| match e.phase {
                Phase::Waiting(at) if at <= now => Some((at, id.clone())),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, id) in due {
            let entry = self.entries.get_mut(&id).expect("listed above");
            self.queue.push(&id, entry.priority(now));
            entry.phase = Phase::Queued;
        }
    }

    /// Takes the next identity to fetch off the queue.
    fn start_next(&mut self, now: SystemTime) -> Option<Identity> {
        let id = self.queue.pop()?;
        let entry = self
            .entries
            .get_mut(&id)
            .expect("queued identities are tracked");
        entry.phase = Phase::Fetching;
        entry.urgent = false;
        entry.last_attempt = Some(now);
        Some(id)
    }

    fn finish(&mut self, outcome: Option<(Identity, FetchResult)>, now: SystemTime) {
        let Some((id, result)) = outcome else {
            return;
        };
        let Some(entry) = self.entries.get_mut(&id) else {
            // Forgotten while fetching.
            return;
        };
        self.status_changed = true;
        let result = result.and_then(|cert| {
            if *cert.identity() != id {
                return Err(CertFetchError::transient(format!(
                    "the certificate source returned a certificate for {}, asked for {id}",
                    cert.identity()
                )));
            }
            build_tls_configs(&cert).map_err(CertFetchError::transient)
        });
        match result {
            Ok(configs) => {
                let valid_for = configs.not_after.duration_since(now).unwrap_or_default();
                tracing::info!(identity = %id, valid_for_secs = valid_for.as_secs(), "workload certificate ready");
                let refresh = refresh_at(configs.not_before, configs.not_after)
                    .max(now + MIN_REFETCH_INTERVAL);
                entry.cert = Some(Arc::new(configs));
                entry.failure = None;
                entry.urgent = false;
                entry.phase = Phase::Waiting(refresh);
                self.certs_changed = true;
            }
            Err(e) => {
                let backoff = if e.is_permanent() {
                    self.max_backoff
                } else {
                    entry
                        .failure
                        .as_ref()
                        .map_or(self.initial_backoff, |f| f.next_backoff)
                };
                let delay = jitter(&self.rng, backoff);
                let retry_at = now + delay;
                let valid_until = entry
                    .cert
                    .as_ref()
                    .filter(|c| c.not_after > now)
                    .map(|c| c.not_after);
                tracing::warn!(
                    identity = %id,
                    error = %e,
                    retry_in_ms = delay.as_millis() as u64,
                    still_serving_until = ?valid_until,
                    "certificate fetch failed"
                );
                entry.failure = Some(Failure {
                    error: e.to_string(),
                    retry_at,
                    next_backoff: (backoff * 2).min(self.max_backoff),
                });
                entry.phase = Phase::Waiting(retry_at);
            }
        }
    }

    /// The certificates to publish.
    fn served(&self) -> impl Iterator<Item = Arc<TlsConfigs>> + '_ {
        self.entries.values().filter_map(|e| e.cert.clone())
    }

    /// When the loop must run again without any event: a refresh or retry,
    /// an expiry, or the end of a request's linger.
    fn next_wake(&self) -> Option<SystemTime> {
        self.entries
            .values()
            .flat_map(|e| {
                let due = match e.phase {
                    Phase::Waiting(at) => Some(at),
                    Phase::Queued | Phase::Fetching => None,
                };
                let expiry = e.cert.as_ref().map(|c| c.not_after);
                let linger_end = if e.on_node {
                    None
                } else {
                    e.requested_at.map(|t| t + self.request_linger)
                };
                [due, expiry, linger_end]
            })
            .flatten()
            .min()
    }

    fn statuses(&self) -> BTreeMap<Identity, CertState> {
        let now = SystemTime::now();
        self.entries
            .iter()
            .map(|(id, e)| {
                let valid = e.cert.as_ref().filter(|c| c.not_after > now);
                let state = match (&e.failure, valid) {
                    (Some(f), _) => CertState::Failed {
                        error: f.error.clone(),
                        retry_at: f.retry_at,
                        valid_until: valid.map(|c| c.not_after),
                    },
                    (None, Some(c)) => CertState::Available {
                        not_after: c.not_after,
                        refresh_at: refresh_at(c.not_before, c.not_after),
                    },
                    (None, None) => CertState::Pending,
                };
                (id.clone(), state)
            })
            .collect()
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<CertFetchError>();
    send::<CertRequests>();
    send::<CertManager<BuiltinCaSource>>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::SnapshotPublisher;
    use crate::security::certs::issue_all;
    use crate::security::certs::tests::{snapshot, workload, TD};

    fn id(sa: &str) -> Identity {
        Identity::new("cluster.local", "ns", sa)
    }

    #[test]
    fn queue_orders_by_priority_then_arrival_and_raises() {
        let mut q = FetchQueue::default();
        q.push(&id("a"), Priority::Prefetch);
        q.push(&id("b"), Priority::Background);
        q.push(&id("c"), Priority::Prefetch);
        q.push(&id("d"), Priority::Prefetch);
        // Lowering is ignored; raising moves it to the front of its class.
        q.push(&id("a"), Priority::Background);
        q.push(&id("d"), Priority::Urgent);
        q.push(&id("b"), Priority::Prefetch);
        let order: Vec<String> = std::iter::from_fn(|| q.pop())
            .map(|i| i.service_account.to_string())
            .collect();
        assert_eq!(order, ["d", "a", "c", "b"]);
        q.push(&id("x"), Priority::Urgent);
        q.remove(&id("x"));
        assert!(q.pop().is_none());
        assert!(q.index.is_empty());
    }

    #[test]
    fn a_request_is_urgent_but_respects_the_minimum_retry_spacing() {
        let config = CertManagerConfig::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut state = State::new(&config, &CertSnapshot::empty(), t0);
        state.set_wanted(&BTreeSet::from([id("a"), id("b")]), t0);
        state.enqueue_due(t0);
        state.request(id("b"), t0);
        assert_eq!(state.start_next(t0), Some(id("b")));
        // b fails: retry after ~1 s, and a fresh request cannot pull it in
        // before a second has passed since the attempt.
        state.finish(
            Some((id("b"), Err(CertFetchError::transient("CA down")))),
            t0,
        );
        let Phase::Waiting(retry) = state.entries[&id("b")].phase else {
            panic!("b should wait for its retry");
        };
        assert!(retry >= t0 + Duration::from_millis(800));
        state.request(id("b"), t0 + Duration::from_millis(100));
        let Phase::Waiting(due) = state.entries[&id("b")].phase else {
            panic!()
        };
        assert_eq!(due, retry.min(t0 + Duration::from_secs(1)));
        assert!(matches!(
            state.statuses()[&id("b")],
            CertState::Failed {
                valid_until: None,
                ..
            }
        ));
        assert_eq!(state.statuses()[&id("a")], CertState::Pending);
    }

    fn ids(snap: &CertSnapshot) -> BTreeSet<String> {
        snap.identities().map(ToString::to_string).collect()
    }

    /// Waits (bounded) until the feed's current snapshot satisfies `done`.
    async fn wait_for(
        feed: &mut CertFeed,
        done: impl Fn(&CertSnapshot) -> bool,
    ) -> Arc<CertSnapshot> {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let current = feed.current();
                if done(&current) {
                    return current;
                }
                feed.changed().await.expect("publisher alive");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out; last: {:?}", feed.current()))
    }

    #[tokio::test]
    async fn manager_follows_the_workloads_on_its_node() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Arc::new(BuiltinCa::load_or_create(tmp.path(), TD).unwrap());
        let workloads = SnapshotPublisher::new();
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
            workload("w3", "10.0.0.3", "n2", "c", "z"),
        ]));
        let certs = CertPublisher::new();
        let mut feed = certs.subscribe();
        let manager = tokio::spawn(run_builtin_cert_manager(
            ca.clone(),
            workloads.subscribe(),
            certs.clone(),
            Some("n1".into()),
            DEFAULT_VALIDITY_FOR_TESTS,
        ));

        let first = wait_for(&mut feed, |s| !s.is_empty()).await;
        assert_eq!(
            ids(&first),
            BTreeSet::from([
                "spiffe://cluster.local/ns/a/sa/x".to_owned(),
                "spiffe://cluster.local/ns/b/sa/y".to_owned()
            ])
        );
        let kept = first.get(&Identity::new(TD, "a", "x")).unwrap().clone();

        // w2 leaves, w4 (another node) arrives: only a/x remains, and it is
        // the same configs, not a re-issue.
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w3", "10.0.0.3", "n2", "c", "z"),
            workload("w4", "10.0.0.4", "n2", "d", "w"),
        ]));
        let second = wait_for(&mut feed, |s| s.len() == 1).await;
        assert_eq!(
            ids(&second),
            BTreeSet::from(["spiffe://cluster.local/ns/a/sa/x".to_owned()])
        );
        assert!(Arc::ptr_eq(
            second.get(&Identity::new(TD, "a", "x")).unwrap(),
            &kept
        ));

        // A workload whose identity the CA refuses is skipped, not fatal.
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w5", "10.0.0.5", "n1", "", "broken"),
            workload("w6", "10.0.0.6", "n1", "e", "v"),
        ]));
        let third = wait_for(&mut feed, |s| s.len() == 2).await;
        assert!(third.get(&Identity::new(TD, "e", "v")).is_some());

        drop(workloads);
        tokio::time::timeout(Duration::from_secs(10), manager)
            .await
            .expect("manager stops when the workload feed closes")
            .unwrap();
    }

    #[tokio::test]
    async fn manager_follows_the_local_workloads_it_is_given() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Arc::new(BuiltinCa::load_or_create(tmp.path(), TD).unwrap());
        let workloads = SnapshotPublisher::new();
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "", "a", "x"),
            workload("w2", "10.0.0.2", "", "b", "y"),
            workload("w3", "10.0.0.3", "", "c", "z"),
        ]));
        let at = |ips: &[&str]| LocalWorkloads::hosted([], ips.iter().map(|i| i.parse().unwrap()));
        let (local, local_rx) = watch::channel(at(&["10.0.0.1"]));
        let certs = CertPublisher::new();
        let mut feed = certs.subscribe();
        let source = Arc::new(BuiltinCaSource::new(ca, DEFAULT_VALIDITY_FOR_TESTS));
        let manager = CertManager::new(
            source,
            workloads.subscribe(),
            certs.clone(),
            CertManagerConfig::default(),
        )
        .follow_local(local_rx);
        let requests = manager.requests();
        let task = tokio::spawn(manager.run());
        let (ax, by, cz) = (
            "spiffe://cluster.local/ns/a/sa/x".to_owned(),
            "spiffe://cluster.local/ns/b/sa/y".to_owned(),
            "spiffe://cluster.local/ns/c/sa/z".to_owned(),
        );

        // Only the workload at a local address, not the whole mesh.
        let first = wait_for(&mut feed, |s| !s.is_empty()).await;
        assert_eq!(ids(&first), BTreeSet::from([ax.clone()]));
        // An address assigned to the host later: its workload is prefetched.
        local.send_replace(at(&["10.0.0.1", "10.0.0.2"]));
        wait_for(&mut feed, |s| {
            ids(s) == BTreeSet::from([ax.clone(), by.clone()])
        })
        .await;
        // A remote identity a connection asks for is fetched on demand and
        // kept beside them.
        requests.send(Identity::new(TD, "c", "z")).unwrap();
        wait_for(&mut feed, |s| s.len() == 3).await;
        // The first address goes away: its identity is dropped (nobody
        // asked for it); the one asked for stays for its linger.
        local.send_replace(at(&["10.0.0.2"]));
        let last = wait_for(&mut feed, |s| s.len() == 2).await;
        assert_eq!(ids(&last), BTreeSet::from([by, cz]));

        drop(workloads);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("manager stops when the workload feed closes")
            .unwrap();
    }

    #[test]
    fn a_certificate_fetched_on_demand_stays_while_connections_use_it() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let config = CertManagerConfig::default();
        let linger = config.request_linger;
        let t0 = SystemTime::now();
        let mut state = State::new(&config, &CertSnapshot::empty(), t0);
        state.set_wanted(&BTreeSet::from([id("local")]), t0);
        state.request(id("remote"), t0);
        state.enqueue_due(t0);
        while let Some(next) = state.start_next(t0) {
            let cert = ca.issue(&next, Duration::from_secs(86400)).unwrap();
            state.finish(Some((next, Ok(cert.to_workload_cert().unwrap()))), t0);
        }
        assert_eq!(state.served().count(), 2);
        let remote = |s: &State| s.entries.get(&id("remote")).and_then(|e| e.cert.clone());

        // Used before its linger ends: kept another linger.
        remote(&state).unwrap().used.mark();
        state.certs_changed = false;
        state.expire_and_forget(t0 + linger);
        assert!(remote(&state).is_some());
        assert!(!state.certs_changed);
        assert_eq!(state.next_wake(), Some(t0 + linger + linger));
        // Then unused for a whole linger: dropped; the local one stays,
        // used or not.
        state.expire_and_forget(t0 + linger + linger - Duration::from_secs(1));
        assert!(remote(&state).is_some());
        state.expire_and_forget(t0 + linger + linger);
        assert!(remote(&state).is_none());
        assert!(state.certs_changed);
        assert!(state.entries[&id("local")].cert.is_some());
        state.expire_and_forget(t0 + linger * 10);
        assert!(state.entries[&id("local")].cert.is_some());
    }

    const DEFAULT_VALIDITY_FOR_TESTS: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn manager_reissues_at_half_lifetime_and_reuses_startup_certs() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Arc::new(BuiltinCa::load_or_create(tmp.path(), TD).unwrap());
        let workloads = SnapshotPublisher::new();
        let snap = snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
        ]);
        // b/y comes from startup with a long lifetime; a/x is short-lived.
        let short = Duration::from_secs(2);
        let startup = issue_all(
            &ca,
            [Identity::new(TD, "b", "y")],
            DEFAULT_VALIDITY_FOR_TESTS,
        )
        .unwrap();
        workloads.publish(snap);
        let certs = CertPublisher::new();
        certs.publish(startup);
        let long_lived = certs
            .current()
            .get(&Identity::new(TD, "b", "y"))
            .unwrap()
            .clone();
        let mut feed = certs.subscribe();
        let manager = tokio::spawn(run_builtin_cert_manager(
            ca,
            workloads.subscribe(),
            certs.clone(),
            None,
            short,
        ));

        let a = Identity::new(TD, "a", "x");
        let first = wait_for(&mut feed, |s| s.get(&a).is_some()).await;
        let first_not_after = first.get(&a).unwrap().not_after;
        let renewed = wait_for(&mut feed, |s| {
            s.get(&a).is_some_and(|c| c.not_after > first_not_after)
        })
        .await;
        assert!(renewed.version() > first.version());
        assert_eq!(renewed.len(), 2);
        assert!(
            Arc::ptr_eq(
                renewed.get(&Identity::new(TD, "b", "y")).unwrap(),
                &long_lived
            ),
            "the startup certificate is reused, not re-issued"
        );
        manager.abort();
    }
}
