//! The immutable view of the mesh that data-plane cores read per connection.
//!
//! Built on the control thread (validation and indexing happen there, off
//! the data path); afterwards every lookup is a hash probe on borrowed keys
//! with no allocation.
//!
//! Snapshots are persistent: [`Snapshot::apply`] derives a new version from
//! an old one plus a [`SnapshotDelta`] (what xDS delivers), sharing every
//! untouched part, so a one-workload change to a 100k-workload snapshot
//! costs microseconds instead of a rebuild. Every map is a `table::Table`:
//! sharded SwissTables behind `Arc`s, copied per touched shard (that module
//! says why this rather than a HAMT such as `imbl`, with measurements).
//!
//! Part of the model: it uses nothing outside `model/`.

mod policies;
mod table;

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::model::authz::{CompiledPolicy, Listed};
use crate::model::{NetworkCidr, NetworkMode, Policy, Service, Str, UnreadablePolicy, Workload};
use policies::PolicyEntry;
use table::{Hasher, Keyed, Table};

/// Why a resource can't be part of a snapshot.
///
/// Positions (`first`, `second`, `service`, `workload`) index the vectors
/// the item came in: those given to [`Snapshot::new`], or a
/// [`SnapshotDelta`]'s `upsert_*` lists. `None` means the other party was
/// already in the snapshot the delta applies to (Display: "existing").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("workload #{second} has uid {uid:?}, already used by workload #{first}")]
    DuplicateWorkloadUid {
        uid: String,
        first: usize,
        second: usize,
    },
    #[error("service #{second} has key {key:?}, already used by service #{first}")]
    DuplicateServiceKey {
        key: String,
        first: usize,
        second: usize,
    },
    #[error("policy #{second} has key {key:?}, already used by policy #{first}")]
    DuplicatePolicyKey {
        key: String,
        first: usize,
        second: usize,
    },
    /// `second` is the service refused.
    #[error(
        "service #{second} ({second_key:?}) claims VIP {ip} on network {network:?}, \
         already claimed by {} ({first_key:?})",
        Item("service", *.first)
    )]
    DuplicateServiceVip {
        network: String,
        ip: IpAddr,
        first: Option<usize>,
        first_key: String,
        second: usize,
        second_key: String,
    },
}

/// "workload #3", or "existing workload" for one already in the snapshot.
struct Item(&'static str, Option<usize>);

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(i) => write!(f, "{} #{i}", self.0),
            None => write!(f, "existing {}", self.0),
        }
    }
}

/// Changes to apply to a snapshot (one xDS delta response's worth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotDelta {
    pub upsert_workloads: Vec<Workload>,
    pub upsert_services: Vec<Service>,
    pub upsert_policies: Vec<Policy>,
    /// Policies the source could not read: kept so that they deny where
    /// they apply (numbered after `upsert_policies` in errors).
    pub upsert_unreadable_policies: Vec<UnreadablePolicy>,
    /// By uid.
    pub remove_workloads: Vec<String>,
    /// By "ns/hostname".
    pub remove_services: Vec<String>,
    /// By "ns/name".
    pub remove_policies: Vec<String>,
    /// On-demand names ("network/IP") the control plane said do not exist,
    /// each remembered until its instant (see [`Snapshot::known_missing`]).
    pub missing: Vec<(String, Instant)>,
}

/// An upserted item [`Snapshot::apply`] refused; the snapshot keeps what it
/// had under that name (the previous version, or nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The workload's uid, the service's "ns/hostname", the policy's "ns/name".
    pub name: String,
    pub error: SnapshotError,
}

/// What [`Snapshot::apply`] made of a delta.
#[derive(Debug)]
pub struct DeltaOutcome {
    /// Version 0 until published.
    pub snapshot: Snapshot,
    /// Workloads, then services, in list order; then those that waited in
    /// vain for another item (see [`Snapshot::apply`]); then policies.
    pub rejected: Vec<Rejected>,
}

/// One consistent, validated configuration. Read-only once built; cloning is
/// O(1) and shares everything.
#[derive(Default, Clone)]
pub struct Snapshot {
    version: u64,
    /// When the config message this snapshot was built from arrived (see
    /// [`Snapshot::received_at`]).
    received_at: Option<Instant>,
    // Primary stores, by xDS resource name.
    workloads: Table<Arc<Workload>>,
    services: Table<Named<Arc<Service>>>,
    policies: Table<Named<PolicyEntry>>,
    // Derived indexes.
    /// Network → ip → workload. Nested so that the per-IP probe compares
    /// inline IPs only, never a string behind a pointer.
    workloads_by_addr: ByNetwork<AddrEntry>,
    /// Addresses that several workloads claim (IP reuse, WorkloadEntries
    /// mirroring pods): every holder, oldest first. As in ztunnel, the one
    /// configured last answers lookups whatever its health or kind (checked
    /// against ztunnel); when it goes, the next newest does. Rare, so kept
    /// apart from the per-IP index the data path probes.
    shared_addrs: Arc<SharedAddrs>,
    /// Network → ip → service.
    services_by_vip: ByNetwork<VipEntry>,
    /// Every CIDR VIP, longest prefix first; rebuilt when a service with
    /// one changes (they are few).
    services_by_cidr: Arc<[(NetworkCidr, Arc<Service>)]>,
    /// Hostname → services with it (never empty), sorted by namespace.
    services_by_hostname: Table<Named<Arc<[Arc<Service>]>>>,
    /// Service key → workloads naming it (never empty), sorted by uid. Keys
    /// need not be known services: a workload may arrive before its service.
    endpoints: Table<Named<Arc<[Arc<Workload>]>>>,
    /// Namespace ("" for GLOBAL scope) → the policies that apply to every
    /// workload in it (never empty), sorted by key: DENY ones at `[0]`,
    /// ALLOW ones at `[1]` (a decision reads them in two passes).
    /// WORKLOAD_SELECTOR policies are found by name only.
    policies_by_namespace: [Table<Named<Arc<[Listed]>>>; 2],
    /// See [`Snapshot::policy_epoch`].
    policy_epoch: u64,
    /// On-demand names the control plane answered as unknown, and until
    /// when that answer stands.
    missing: Arc<HashMap<String, Instant, Hasher>>,
}

impl Snapshot {
    /// Version 0, nothing in it: what cores see before the first publish.
    pub fn empty() -> Snapshot {
        Snapshot::default()
    }

    /// Validates and indexes; the first problem fails the whole set.
    /// Host-network workloads share the node's IP, so (as in ztunnel) they
    /// are reachable by uid but not by address. Same result as [`apply`](Self::apply)ing everything to
    /// an empty snapshot.
    pub fn new(
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Policy>,
    ) -> Result<Snapshot, SnapshotError> {
        let delta = SnapshotDelta {
            upsert_workloads: workloads,
            upsert_services: services,
            upsert_policies: policies,
            ..SnapshotDelta::default()
        };
        let mut first_error = None;
        let snap = apply(&Snapshot::empty(), delta, &mut |r| {
            first_error = Some(r.error);
            false
        });
        match first_error {
            Some(e) => Err(e),
            None => Ok(snap),
        }
    }

    /// New snapshot = self + delta, sharing unchanged structure. Bad items
    /// are rejected individually (listed in `rejected`, named by uid / key);
    /// the good ones still apply (xDS partial acceptance). Upsert replaces an
    /// existing entry with the same key (an address change moves its index
    /// entries). Removing an unknown name is not an error.
    ///
    /// Order: removals first (so a name both removed and upserted ends up
    /// upserted), then workload, service and policy upserts in list order,
    /// each checked against the state so far. A name upserted twice keeps
    /// its first occurrence; the others are rejected. Workloads may share
    /// addresses (the newest answers, see `shared_addrs`). A service whose
    /// VIP only conflicts with the previous version of a service this delta
    /// also upserts waits until that one has been applied, then is checked
    /// again. Still refused: a cycle (two services trading VIPs in one
    /// delta), and a service waiting on one that is refused.
    ///
    /// Cost: proportional to the delta (plus the endpoint lists of the
    /// services it touches), not to the snapshot.
    pub fn apply(&self, delta: SnapshotDelta) -> DeltaOutcome {
        let mut rejected = Vec::new();
        let snapshot = apply(self, delta, &mut |r| {
            rejected.push(r);
            true
        });
        DeltaOutcome { snapshot, rejected }
    }

    /// When the config message (an xDS response, a changed file) this
    /// snapshot was built from was received, if its source stamped it:
    /// cores measure from it how long a change took to reach them
    /// (`ringway_core_config_propagation_seconds`).
    pub fn received_at(&self) -> Option<Instant> {
        self.received_at
    }

    /// This snapshot, stamped as built from a message received `at`.
    pub fn received(mut self, at: Instant) -> Snapshot {
        self.received_at = Some(at);
        self
    }

    /// Assigned by the publisher; 0 for a snapshot never published.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub(crate) fn set_version(&mut self, version: u64) {
        self.version = version;
    }

    /// The workload owning `ip` on `network` ("" = default network).
    #[inline]
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        let t = find_named(&self.workloads_by_addr, network)?;
        t.find(t.hash(&ip), |e| e.ip == ip).map(|e| &e.workload)
    }

    pub fn workload_by_uid(&self, uid: &str) -> Option<&Arc<Workload>> {
        let t = &self.workloads;
        t.find(t.hash(uid), |w| w.uid == uid)
    }

    #[inline]
    pub fn service_by_vip(&self, network: &str, ip: IpAddr) -> Option<&Arc<Service>> {
        let t = find_named(&self.services_by_vip, network)?;
        t.find(t.hash(&ip), |e| e.ip == ip).map(|e| &e.service)
    }

    /// The service an outbound connection to `ip` is for: by exact VIP,
    /// else the longest CIDR VIP containing it.
    #[inline]
    pub fn service_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Service>> {
        self.service_by_vip(network, ip).or_else(|| {
            self.services_by_cidr
                .iter()
                .find(|(c, _)| c.network == network && c.cidr.contains(ip))
                .map(|(_, s)| s)
        })
    }

    pub fn service_by_host(&self, namespace: &str, hostname: &str) -> Option<&Arc<Service>> {
        self.services_by_hostname(hostname)
            .iter()
            .find(|s| s.namespace == namespace)
    }

    /// By "ns/hostname".
    pub fn service_by_key(&self, key: &str) -> Option<&Arc<Service>> {
        find_named(&self.services, key)
    }

    /// Every service with this hostname, in any namespace, sorted by
    /// namespace (ServiceEntry lets namespaces reuse a hostname).
    #[inline]
    pub fn services_by_hostname(&self, hostname: &str) -> &[Arc<Service>] {
        find_named(&self.services_by_hostname, hostname).map_or(&[], |list| &list[..])
    }

    /// Workloads whose `services` map names `service_key` ("ns/hostname"),
    /// healthy or not, sorted by uid. Health filtering is the caller's, as
    /// it depends on the service's load-balancer health policy.
    #[inline]
    pub fn endpoints(&self, service_key: &str) -> &[Arc<Workload>] {
        find_named(&self.endpoints, service_key).map_or(&[], |list| &list[..])
    }

    /// In no particular order.
    pub fn workloads(&self) -> impl ExactSizeIterator<Item = &Arc<Workload>> + '_ {
        self.workloads.iter()
    }

    /// In no particular order.
    pub fn services(&self) -> impl ExactSizeIterator<Item = &Arc<Service>> + '_ {
        self.services.iter().map(|e| &e.value)
    }

    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty() && self.services.is_empty() && self.policies.is_empty()
    }

    /// Same workloads, services and policies, whatever the versions. Lets a
    /// source skip publishing a no-op change (a comment edit, a re-push).
    /// Parts shared by the two snapshots are not compared entry by entry.
    /// Whether the control plane said, recently, that on-demand name `key`
    /// ("network/IP") does not exist: a connection to it need not ask (and
    /// wait) again until the answer expires.
    pub fn known_missing(&self, key: &str) -> bool {
        self.missing
            .get(key)
            .is_some_and(|until| Instant::now() < *until)
    }

    pub fn same_content(&self, other: &Snapshot) -> bool {
        // Indexes are derived from the primary stores, so those suffice.
        self.workloads.same_entries(&other.workloads)
            && self.services.same_entries(&other.services)
            && self.policies.same_entries(&other.policies)
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("workloads", &self.workloads.len())
            .field("services", &self.services.len())
            .field("policies", &self.policies.len())
            .finish()
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Snapshot>();
    send_sync::<DeltaOutcome>();
};

// ---------------------------------------------------------------------------
// Table entries
// ---------------------------------------------------------------------------

/// A value stored under a string key it doesn't carry itself (a service's
/// "ns/hostname" is derived, an endpoint list has none).
#[derive(Clone, PartialEq)]
struct Named<T> {
    key: Arc<str>,
    value: T,
}

impl<T> Keyed for Named<T> {
    fn hash_key(&self, hasher: &Hasher) -> u64 {
        hasher.hash_one(&*self.key)
    }
    fn same_key(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

fn find_named<'a, T>(table: &'a Table<Named<T>>, key: &str) -> Option<&'a T> {
    table
        .find(table.hash(key), |e| &*e.key == key)
        .map(|e| &e.value)
}

/// By uid.
impl Keyed for Arc<Workload> {
    fn hash_key(&self, hasher: &Hasher) -> u64 {
        hasher.hash_one(self.uid.as_str())
    }
    fn same_key(&self, other: &Self) -> bool {
        self.uid == other.uid
    }
}

/// Network name → that network's table, keyed by IP.
type ByNetwork<T> = Table<Named<Table<T>>>;

/// The network's table, created if missing.
fn network_mut<'a, T>(index: &'a mut ByNetwork<T>, network: &str) -> &'a mut Table<T> {
    let hash = index.hash(network);
    if index.find(hash, |e| &*e.key == network).is_none() {
        index.insert(Named {
            key: Arc::from(network),
            value: Table::default(),
        });
    }
    let entry = index.find_mut(hash, |e| &*e.key == network);
    &mut entry.expect("inserted above").value
}

/// Removes the entry for `ip` on `network` if `eq` holds, and the network's
/// table once empty.
fn remove_addr<T: Keyed + Clone>(
    index: &mut ByNetwork<T>,
    network: &str,
    ip: IpAddr,
    eq: impl FnMut(&T) -> bool,
) {
    let hash = index.hash(network);
    let Some(entry) = index.find_mut(hash, |e| &*e.key == network) else {
        return;
    };
    let t = &mut entry.value;
    t.remove(t.hash(&ip), eq);
    if t.is_empty() {
        index.remove(hash, |e| &*e.key == network);
    }
}

/// (network, IP) → every workload holding it, oldest first.
type SharedAddrs = HashMap<(Str, IpAddr), Vec<Arc<Workload>>, Hasher>;

/// One address of a workload, keyed by IP within its network's table.
#[derive(Clone, PartialEq)]
struct AddrEntry {
    ip: IpAddr,
    workload: Arc<Workload>,
}

impl Keyed for AddrEntry {
    fn hash_key(&self, hasher: &Hasher) -> u64 {
        hasher.hash_one(self.ip)
    }
    fn same_key(&self, other: &Self) -> bool {
        self.ip == other.ip
    }
}

/// One VIP of a service, keyed by IP within its network's table.
#[derive(Clone, PartialEq)]
struct VipEntry {
    ip: IpAddr,
    service: Arc<Service>,
}

impl Keyed for VipEntry {
    fn hash_key(&self, hasher: &Hasher) -> u64 {
        hasher.hash_one(self.ip)
    }
    fn same_key(&self, other: &Self) -> bool {
        self.ip == other.ip
    }
}

// ---------------------------------------------------------------------------
// Applying changes
// ---------------------------------------------------------------------------

/// Where an upserted item stands while a delta is applied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Not looked at yet.
    Pending,
    /// Blocked only by the old version of another pending item; retried.
    Deferred,
    Accepted,
    Rejected,
}

/// What a conflict check concluded.
enum Verdict {
    Ok,
    /// Retry once the rest of the delta is in; the error stands otherwise.
    Wait(SnapshotError),
    Refuse(SnapshotError),
}

type PosMap<'a> = HashMap<&'a str, usize, Hasher>;

/// Applies `delta` to `base`. Each refused upsert goes to `reject`; when it
/// returns false the rest of the delta is skipped (what `new` wants).
fn apply(
    base: &Snapshot,
    delta: SnapshotDelta,
    reject: &mut dyn FnMut(Rejected) -> bool,
) -> Snapshot {
    let SnapshotDelta {
        upsert_workloads,
        upsert_services,
        upsert_policies,
        upsert_unreadable_policies,
        remove_workloads,
        remove_services,
        remove_policies,
        missing,
    } = delta;
    let mut b = Builder::new(base);
    if !missing.is_empty() {
        let now = Instant::now();
        let mut map: HashMap<String, Instant, Hasher> = b
            .next
            .missing
            .iter()
            .filter(|(_, until)| now < **until)
            .map(|(k, until)| (k.clone(), *until))
            .collect();
        map.extend(missing);
        b.next.missing = Arc::new(map);
    }

    for uid in &remove_workloads {
        b.remove_workload(uid);
    }
    for key in &remove_services {
        b.remove_service(key);
    }
    for key in &remove_policies {
        b.remove_policy(key);
    }

    let workloads: Vec<Arc<Workload>> = upsert_workloads.into_iter().map(Arc::new).collect();
    let services: Vec<(Arc<str>, Arc<Service>)> = upsert_services
        .into_iter()
        .map(|s| (Arc::from(s.key()), Arc::new(s)))
        .collect();
    // Name → first position, to spot duplicates and name the other party of
    // a conflict.
    let mut wl_pos = PosMap::with_capacity_and_hasher(workloads.len(), Hasher::default());
    for (i, w) in workloads.iter().enumerate() {
        wl_pos.entry(w.uid.as_str()).or_insert(i);
    }
    let mut sv_pos = PosMap::with_capacity_and_hasher(services.len(), Hasher::default());
    for (i, (key, _)) in services.iter().enumerate() {
        sv_pos.entry(key).or_insert(i);
    }
    let mut wl_status = vec![Status::Pending; workloads.len()];
    let mut sv_status = vec![Status::Pending; services.len()];
    let mut deferred: Vec<Option<SnapshotError>> = vec![None; workloads.len() + services.len()];

    // Rounds: the first looks at everything in order; later ones retry what
    // waited, as long as the previous round applied something.
    let mut progress = true;
    while progress {
        progress = false;
        for (i, w) in workloads.iter().enumerate() {
            if !matches!(wl_status[i], Status::Pending | Status::Deferred) {
                continue;
            }
            // Several workloads may hold one address (see `shared_addrs`):
            // only a repeated uid is refused.
            let verdict = if wl_pos[w.uid.as_str()] != i {
                Verdict::Refuse(SnapshotError::DuplicateWorkloadUid {
                    uid: w.uid.to_string(),
                    first: wl_pos[w.uid.as_str()],
                    second: i,
                })
            } else {
                Verdict::Ok
            };
            match verdict {
                Verdict::Ok => {
                    b.put_workload(w.clone());
                    wl_status[i] = Status::Accepted;
                    progress = true;
                }
                Verdict::Wait(e) => {
                    wl_status[i] = Status::Deferred;
                    deferred[i] = Some(e);
                }
                Verdict::Refuse(error) => {
                    wl_status[i] = Status::Rejected;
                    let name = w.uid.to_string();
                    if !reject(Rejected { name, error }) {
                        return b.finish();
                    }
                }
            }
        }
        for (j, (key, s)) in services.iter().enumerate() {
            if !matches!(sv_status[j], Status::Pending | Status::Deferred) {
                continue;
            }
            let verdict = if sv_pos[&**key] != j {
                Verdict::Refuse(SnapshotError::DuplicateServiceKey {
                    key: key.to_string(),
                    first: sv_pos[&**key],
                    second: j,
                })
            } else {
                b.check_service(s, key, j, &sv_pos, &sv_status)
            };
            match verdict {
                Verdict::Ok => {
                    b.put_service(key.clone(), s.clone());
                    sv_status[j] = Status::Accepted;
                    progress = true;
                }
                Verdict::Wait(e) => {
                    sv_status[j] = Status::Deferred;
                    deferred[workloads.len() + j] = Some(e);
                }
                Verdict::Refuse(error) => {
                    sv_status[j] = Status::Rejected;
                    if !reject(Rejected {
                        name: key.to_string(),
                        error,
                    }) {
                        return b.finish();
                    }
                }
            }
        }
    }
    // Still waiting: blocked by items that were refused, or a cycle.
    let waiting = wl_status
        .iter()
        .chain(&sv_status)
        .zip(deferred)
        .enumerate()
        .filter(|(_, (status, _))| **status == Status::Deferred);
    for (i, (_, error)) in waiting {
        let name = match i.checked_sub(workloads.len()) {
            None => workloads[i].uid.to_string(),
            Some(j) => services[j].0.to_string(),
        };
        let error = error.expect("a deferred item has its error");
        if !reject(Rejected { name, error }) {
            return b.finish();
        }
    }

    // Readable policies, then unreadable ones, numbered in that order.
    let entries: Vec<(String, PolicyEntry)> = upsert_policies
        .into_iter()
        .map(|p| (p.key(), PolicyEntry::readable(p)))
        .chain(
            upsert_unreadable_policies
                .iter()
                .map(|p| (p.key(), PolicyEntry::unreadable(p))),
        )
        .collect();
    let mut pol_first = PosMap::with_capacity_and_hasher(entries.len(), Hasher::default());
    for (i, (key, entry)) in entries.iter().enumerate() {
        if let Some(&first) = pol_first.get(key.as_str()) {
            let error = SnapshotError::DuplicatePolicyKey {
                key: key.clone(),
                first,
                second: i,
            };
            if !reject(Rejected {
                name: key.clone(),
                error,
            }) {
                return b.finish();
            }
            continue;
        }
        pol_first.insert(key, i);
        b.put_policy(Arc::from(key.as_str()), entry.clone());
    }

    b.finish()
}

/// The snapshot being derived, plus what its per-key lists need rebuilt.
struct Builder {
    next: Snapshot,
    /// Every workload version taken out of or put into the indexes; the
    /// endpoint lists of the services they name are rebuilt by `finish`.
    changed_workloads: Vec<Arc<Workload>>,
    /// Same for services and their hostname lists.
    changed_services: Vec<Arc<Service>>,
    /// Same for policies and their namespace lists.
    changed_policies: Vec<Arc<CompiledPolicy>>,
    /// A policy was added, replaced or removed: the snapshot takes a new
    /// policy epoch.
    policies_changed: bool,
}

impl Builder {
    fn new(base: &Snapshot) -> Builder {
        let mut next = base.clone();
        next.version = 0;
        next.received_at = None;
        Builder {
            next,
            changed_workloads: Vec::new(),
            changed_services: Vec::new(),
            changed_policies: Vec::new(),
            policies_changed: false,
        }
    }

    /// Who else holds an address: "wait" if it is the old version of an
    /// item this delta still has to upsert, else a refusal naming its
    /// position if this delta put it there.
    fn holder_verdict(
        pos: &PosMap<'_>,
        status: &[Status],
        name: &str,
        error: impl FnOnce(Option<usize>) -> SnapshotError,
    ) -> Verdict {
        match pos.get(name).map(|&p| (p, status[p])) {
            Some((_, Status::Pending | Status::Deferred)) => Verdict::Wait(error(None)),
            Some((p, Status::Accepted)) => Verdict::Refuse(error(Some(p))),
            Some((_, Status::Rejected)) | None => Verdict::Refuse(error(None)),
        }
    }

    /// A service's VIPs must be its own: another service holding one is
    /// refused (or waited for, if this delta moves it). A VIP may equal a
    /// workload's address, as in ztunnel: the service is found first.
    fn check_service(
        &self,
        s: &Service,
        key: &str,
        j: usize,
        sv_pos: &PosMap<'_>,
        sv_status: &[Status],
    ) -> Verdict {
        let mut wait = None;
        for vip in &s.vips {
            let Some(other) = self.next.service_by_vip(&vip.network, vip.ip) else {
                continue;
            };
            if other.namespace == s.namespace && other.hostname == s.hostname {
                continue; // its own previous version, or listed twice
            }
            let other_key = other.key();
            let verdict = Self::holder_verdict(sv_pos, sv_status, &other_key, |first| {
                SnapshotError::DuplicateServiceVip {
                    network: vip.network.to_string(),
                    ip: vip.ip,
                    first,
                    first_key: other_key.clone(),
                    second: j,
                    second_key: key.to_owned(),
                }
            });
            match verdict {
                Verdict::Refuse(e) => return Verdict::Refuse(e),
                Verdict::Wait(e) => wait = wait.or(Some(e)),
                Verdict::Ok => {}
            }
        }
        wait.map_or(Verdict::Ok, Verdict::Wait)
    }

    /// Indexes `w` by its addresses. An address another workload holds
    /// is shared: both are kept (in `shared_addrs`, oldest first) and the
    /// newest, `w`, answers lookups.
    fn put_workload(&mut self, w: Arc<Workload>) {
        if let Some(old) = self.next.workloads.insert(w.clone()) {
            self.unindex_workload(old);
        }
        if w.network_mode != NetworkMode::HostNetwork && !w.addresses.is_empty() {
            let t = network_mut(&mut self.next.workloads_by_addr, &w.network);
            for &ip in &w.addresses {
                let entry = AddrEntry {
                    ip,
                    workload: w.clone(),
                };
                let Some(held) = t.insert(entry) else {
                    continue;
                };
                if Arc::ptr_eq(&held.workload, &w) {
                    continue; // listed twice by `w`
                }
                let shared = Arc::make_mut(&mut self.next.shared_addrs);
                shared
                    .entry((w.network.clone(), ip))
                    .or_insert_with(|| vec![held.workload])
                    .push(w.clone());
            }
        }
        self.changed_workloads.push(w);
    }

    fn remove_workload(&mut self, uid: &str) {
        let t = &mut self.next.workloads;
        if let Some(old) = t.remove(t.hash(uid), |w| w.uid == uid) {
            self.unindex_workload(old);
        }
    }

    /// Takes `old` out of the address index; where it shared an address,
    /// the newest remaining holder answers for it.
    fn unindex_workload(&mut self, old: Arc<Workload>) {
        if old.network_mode != NetworkMode::HostNetwork {
            for &ip in &old.addresses {
                let key = (old.network.clone(), ip);
                if !self.next.shared_addrs.contains_key(&key) {
                    remove_addr(&mut self.next.workloads_by_addr, &old.network, ip, |e| {
                        e.ip == ip && Arc::ptr_eq(&e.workload, &old)
                    });
                    continue;
                }
                let shared = Arc::make_mut(&mut self.next.shared_addrs);
                let holders = shared.get_mut(&key).expect("checked above");
                holders.retain(|h| !Arc::ptr_eq(h, &old));
                let newest = holders
                    .last()
                    .cloned()
                    .expect("a shared address has holders");
                if holders.len() < 2 {
                    shared.remove(&key);
                }
                network_mut(&mut self.next.workloads_by_addr, &old.network).insert(AddrEntry {
                    ip,
                    workload: newest,
                });
            }
        }
        self.changed_workloads.push(old);
    }

    fn put_service(&mut self, key: Arc<str>, s: Arc<Service>) {
        let entry = Named {
            key,
            value: s.clone(),
        };
        if let Some(old) = self.next.services.insert(entry) {
            self.unindex_service(old.value);
        }
        for vip in &s.vips {
            network_mut(&mut self.next.services_by_vip, &vip.network).insert(VipEntry {
                ip: vip.ip,
                service: s.clone(),
            });
        }
        self.changed_services.push(s);
    }

    fn remove_service(&mut self, key: &str) {
        let t = &mut self.next.services;
        if let Some(old) = t.remove(t.hash(key), |e| &*e.key == key) {
            self.unindex_service(old.value);
        }
    }

    fn unindex_service(&mut self, old: Arc<Service>) {
        for vip in &old.vips {
            remove_addr(&mut self.next.services_by_vip, &vip.network, vip.ip, |e| {
                e.ip == vip.ip && Arc::ptr_eq(&e.service, &old)
            });
        }
        self.changed_services.push(old);
    }

    /// Rebuilds the endpoint, hostname and policy lists the changes
    /// touched.
    fn finish(mut self) -> Snapshot {
        self.reindex_policies();
        // Service key → uids whose membership may have changed.
        let mut touched: HashMap<&str, Vec<&str>, Hasher> = HashMap::default();
        for w in &self.changed_workloads {
            for key in w.services.keys() {
                touched.entry(key).or_default().push(&w.uid);
            }
        }
        let next = &mut self.next;
        for (key, mut uids) in touched {
            uids.sort_unstable();
            uids.dedup();
            let list = merge_list(
                next.endpoints(key),
                &uids,
                |w| &w.uid,
                |uid| {
                    next.workload_by_uid(uid)
                        .filter(|w| w.services.contains_key(key))
                        .cloned()
                },
            );
            put_list(&mut next.endpoints, key, list);
        }

        if self
            .changed_services
            .iter()
            .any(|s| !s.cidr_vips.is_empty())
        {
            let mut all: Vec<(NetworkCidr, Arc<Service>)> = next
                .services()
                .flat_map(|s| s.cidr_vips.iter().map(move |c| (c.clone(), s.clone())))
                .collect();
            all.sort_by_key(|e| std::cmp::Reverse(e.0.cidr.prefix_len));
            next.services_by_cidr = all.into();
        }

        // Hostname → namespaces whose service may have changed.
        let mut touched: HashMap<&str, Vec<&str>, Hasher> = HashMap::default();
        for s in &self.changed_services {
            touched.entry(&s.hostname).or_default().push(&s.namespace);
        }
        let mut key = String::new();
        for (hostname, mut namespaces) in touched {
            namespaces.sort_unstable();
            namespaces.dedup();
            let list = merge_list(
                next.services_by_hostname(hostname),
                &namespaces,
                |s| &s.namespace,
                |ns| {
                    key.clear();
                    key.push_str(ns);
                    key.push('/');
                    key.push_str(hostname);
                    next.service_by_key(&key).cloned()
                },
            );
            put_list(&mut next.services_by_hostname, hostname, list);
        }
        self.next
    }
}

/// `old` (sorted and unique by `sort_key`) with the entries whose sort key
/// is in `changed` (sorted, unique) replaced by `current(key)`, or dropped if
/// that is None. Unchanged runs are copied as they are: no comparisons
/// beyond one binary search per change, so a change to a service with 10k
/// endpoints doesn't re-sort them.
fn merge_list<'k, T: Clone>(
    old: &[T],
    changed: &[&'k str],
    sort_key: impl Fn(&T) -> &str,
    mut current: impl FnMut(&'k str) -> Option<T>,
) -> Vec<T> {
    let mut list = Vec::with_capacity(old.len() + changed.len());
    let mut rest = old;
    for &key in changed {
        let at = rest.partition_point(|e| sort_key(e) < key);
        list.extend_from_slice(&rest[..at]);
        rest = &rest[at..];
        if rest.first().is_some_and(|e| sort_key(e) == key) {
            rest = &rest[1..]; // the previous version
        }
        list.extend(current(key));
    }
    list.extend_from_slice(rest);
    list
}

/// Stores a rebuilt per-key list; an empty one removes the key.
fn put_list<T: Clone>(table: &mut Table<Named<Arc<[T]>>>, key: &str, list: Vec<T>) {
    let hash = table.hash(key);
    if list.is_empty() {
        table.remove(hash, |e| &*e.key == key);
    } else if let Some(entry) = table.find_mut(hash, |e| &*e.key == key) {
        entry.value = list.into(); // keeps the key's allocation
    } else {
        table.insert(Named {
            key: Arc::from(key),
            value: list.into(),
        });
    }
}

#[cfg(test)]
mod tests;
