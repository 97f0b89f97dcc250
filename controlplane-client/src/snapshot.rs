//! The immutable view of the mesh that data-plane cores read per connection.
//!
//! Built once on the control thread (validation and indexing happen here,
//! off the data path); afterwards every lookup is a hash probe on borrowed
//! keys with no allocation. Entries sit behind `Arc` so a later incremental
//! update can clone the maps (pointer copies) and replace only what changed.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::{NetworkMode, Policy, Service, Workload};

/// Why a set of resources can't form a snapshot. Indices are positions in
/// the vectors given to [`Snapshot::new`], so a source can point at the item.
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
    #[error(
        "workload #{second} (uid {second_uid:?}) claims address {ip} on network {network:?}, \
         already claimed by workload #{first} (uid {first_uid:?})"
    )]
    DuplicateWorkloadAddress {
        network: String,
        ip: IpAddr,
        first: usize,
        first_uid: String,
        second: usize,
        second_uid: String,
    },
    #[error(
        "service #{second} ({second_key:?}) claims VIP {ip} on network {network:?}, \
         already claimed by service #{first} ({first_key:?})"
    )]
    DuplicateServiceVip {
        network: String,
        ip: IpAddr,
        first: usize,
        first_key: String,
        second: usize,
        second_key: String,
    },
    #[error(
        "service #{service} ({service_key:?}) has VIP {ip} on network {network:?}, which is \
         the address of workload #{workload} (uid {workload_uid:?})"
    )]
    VipIsWorkloadAddress {
        network: String,
        ip: IpAddr,
        service: usize,
        service_key: String,
        workload: usize,
        workload_uid: String,
    },
}

/// network → ip → entry. Nested so a lookup borrows the caller's `&str`.
type AddrIndex<T> = HashMap<String, HashMap<IpAddr, T>>;

/// One consistent, validated configuration. Read-only once built.
#[derive(Default)]
pub struct Snapshot {
    version: u64,
    // Primary stores, by xDS resource name.
    workloads: HashMap<String, Arc<Workload>>,
    services: HashMap<String, Arc<Service>>,
    policies: HashMap<String, Arc<Policy>>,
    // Derived indexes.
    workloads_by_addr: AddrIndex<Arc<Workload>>,
    services_by_vip: AddrIndex<Arc<Service>>,
    /// Sorted by namespace.
    services_by_hostname: HashMap<String, Vec<Arc<Service>>>,
    /// Service key → workloads naming it, sorted by uid. Keys need not be
    /// known services: a workload may arrive before its service.
    endpoints: HashMap<String, Vec<Arc<Workload>>>,
}

impl Snapshot {
    /// Version 0, nothing in it: what cores see before the first publish.
    pub fn empty() -> Snapshot {
        Snapshot::default()
    }

    /// Validates and indexes. Host-network workloads share the node's IP, so
    /// (as in ztunnel) they are reachable by uid but not by address and take
    /// part in neither address check.
    pub fn new(
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Policy>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut snap = Snapshot::default();

        // uid → input index, for error messages.
        let mut workload_pos: HashMap<String, usize> = HashMap::with_capacity(workloads.len());
        let mut addr_owner: AddrIndex<usize> = HashMap::new();
        for (i, w) in workloads.into_iter().enumerate() {
            if let Some(&first) = workload_pos.get(&w.uid) {
                return Err(SnapshotError::DuplicateWorkloadUid {
                    uid: w.uid,
                    first,
                    second: i,
                });
            }
            let w = Arc::new(w);
            if w.network_mode != NetworkMode::HostNetwork {
                for &ip in &w.addresses {
                    let owners = get_or_insert(&mut addr_owner, &w.network);
                    match owners.get(&ip) {
                        Some(&first) if first != i => {
                            let first_uid = snap.workloads_by_addr[&w.network][&ip].uid.clone();
                            return Err(SnapshotError::DuplicateWorkloadAddress {
                                network: w.network.clone(),
                                ip,
                                first,
                                first_uid,
                                second: i,
                                second_uid: w.uid.clone(),
                            });
                        }
                        Some(_) => {} // listed twice by the same workload
                        None => {
                            owners.insert(ip, i);
                            get_or_insert(&mut snap.workloads_by_addr, &w.network)
                                .insert(ip, w.clone());
                        }
                    }
                }
            }
            for key in w.services.keys() {
                match snap.endpoints.get_mut(key.as_str()) {
                    Some(list) => list.push(w.clone()),
                    None => {
                        snap.endpoints.insert(key.clone(), vec![w.clone()]);
                    }
                }
            }
            workload_pos.insert(w.uid.clone(), i);
            snap.workloads.insert(w.uid.clone(), w);
        }
        for list in snap.endpoints.values_mut() {
            list.sort_by(|a, b| a.uid.cmp(&b.uid));
        }

        let mut service_pos: HashMap<String, usize> = HashMap::with_capacity(services.len());
        let mut vip_owner: AddrIndex<usize> = HashMap::new();
        for (i, s) in services.into_iter().enumerate() {
            let key = s.key();
            if let Some(&first) = service_pos.get(&key) {
                return Err(SnapshotError::DuplicateServiceKey {
                    key,
                    first,
                    second: i,
                });
            }
            let s = Arc::new(s);
            for vip in &s.vips {
                if let Some(w) = lookup(&snap.workloads_by_addr, &vip.network, vip.ip) {
                    return Err(SnapshotError::VipIsWorkloadAddress {
                        network: vip.network.clone(),
                        ip: vip.ip,
                        service: i,
                        service_key: key,
                        workload: workload_pos[&w.uid],
                        workload_uid: w.uid.clone(),
                    });
                }
                let owners = get_or_insert(&mut vip_owner, &vip.network);
                match owners.get(&vip.ip) {
                    Some(&first) if first != i => {
                        let first_key = snap.services_by_vip[&vip.network][&vip.ip].key();
                        return Err(SnapshotError::DuplicateServiceVip {
                            network: vip.network.clone(),
                            ip: vip.ip,
                            first,
                            first_key,
                            second: i,
                            second_key: key,
                        });
                    }
                    Some(_) => {}
                    None => {
                        owners.insert(vip.ip, i);
                        get_or_insert(&mut snap.services_by_vip, &vip.network)
                            .insert(vip.ip, s.clone());
                    }
                }
            }
            match snap.services_by_hostname.get_mut(s.hostname.as_str()) {
                Some(list) => list.push(s.clone()),
                None => {
                    snap.services_by_hostname
                        .insert(s.hostname.clone(), vec![s.clone()]);
                }
            }
            service_pos.insert(key.clone(), i);
            snap.services.insert(key, s);
        }
        for list in snap.services_by_hostname.values_mut() {
            list.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        }

        let mut policy_pos: HashMap<String, usize> = HashMap::with_capacity(policies.len());
        for (i, p) in policies.into_iter().enumerate() {
            let key = p.key();
            if let Some(&first) = policy_pos.get(&key) {
                return Err(SnapshotError::DuplicatePolicyKey {
                    key,
                    first,
                    second: i,
                });
            }
            policy_pos.insert(key.clone(), i);
            snap.policies.insert(key, Arc::new(p));
        }

        Ok(snap)
    }

    /// Assigned by the publisher; 0 for a snapshot never published.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub(crate) fn set_version(&mut self, version: u64) {
        self.version = version;
    }

    /// The workload owning `ip` on `network` ("" = default network).
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        lookup(&self.workloads_by_addr, network, ip)
    }

    pub fn workload_by_uid(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    pub fn service_by_vip(&self, network: &str, ip: IpAddr) -> Option<&Arc<Service>> {
        lookup(&self.services_by_vip, network, ip)
    }

    pub fn service_by_host(&self, namespace: &str, hostname: &str) -> Option<&Arc<Service>> {
        self.services_by_hostname(hostname)
            .iter()
            .find(|s| s.namespace == namespace)
    }

    /// By "ns/hostname".
    pub fn service_by_key(&self, key: &str) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// Every service with this hostname, in any namespace, sorted by
    /// namespace (ServiceEntry lets namespaces reuse a hostname).
    pub fn services_by_hostname(&self, hostname: &str) -> &[Arc<Service>] {
        self.services_by_hostname
            .get(hostname)
            .map_or(&[], Vec::as_slice)
    }

    /// By "ns/name".
    pub fn policy(&self, key: &str) -> Option<&Arc<Policy>> {
        self.policies.get(key)
    }

    /// Workloads whose `services` map names `service_key` ("ns/hostname"),
    /// healthy or not, sorted by uid. Health filtering is the caller's, as
    /// it depends on the service's load-balancer health policy.
    pub fn endpoints(&self, service_key: &str) -> &[Arc<Workload>] {
        self.endpoints.get(service_key).map_or(&[], Vec::as_slice)
    }

    /// In no particular order.
    pub fn workloads(&self) -> impl ExactSizeIterator<Item = &Arc<Workload>> + '_ {
        self.workloads.values()
    }

    /// In no particular order.
    pub fn services(&self) -> impl ExactSizeIterator<Item = &Arc<Service>> + '_ {
        self.services.values()
    }

    /// In no particular order.
    pub fn policies(&self) -> impl ExactSizeIterator<Item = &Arc<Policy>> + '_ {
        self.policies.values()
    }

    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty() && self.services.is_empty() && self.policies.is_empty()
    }

    /// Same workloads, services and policies, whatever the versions. Lets a
    /// source skip publishing a no-op change (a comment edit, a re-push).
    pub fn same_content(&self, other: &Snapshot) -> bool {
        // Indexes are derived from the primary stores, so those suffice.
        self.workloads == other.workloads
            && self.services == other.services
            && self.policies == other.policies
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

fn lookup<'a, T>(index: &'a AddrIndex<T>, network: &str, ip: IpAddr) -> Option<&'a T> {
    index.get(network)?.get(&ip)
}

fn get_or_insert<'a, T>(index: &'a mut AddrIndex<T>, network: &str) -> &'a mut HashMap<IpAddr, T> {
    if !index.contains_key(network) {
        index.insert(network.to_owned(), HashMap::new());
    }
    index.get_mut(network).expect("inserted above")
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Snapshot>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NetworkAddress, PolicyAction, PolicyScope, PortMapping, WorkloadStatus};
    use std::collections::BTreeMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn workload(uid: &str, network: &str, addrs: &[&str], services: &[&str]) -> Workload {
        Workload {
            uid: uid.into(),
            name: uid.into(),
            namespace: "default".into(),
            network: network.into(),
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            services: services
                .iter()
                .map(|s| {
                    (
                        s.to_string(),
                        vec![PortMapping {
                            service_port: 80,
                            target_port: 8080,
                        }],
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            ..Workload::default()
        }
    }

    fn service(ns: &str, host: &str, vips: &[(&str, &str)]) -> Service {
        Service {
            name: host.split('.').next().unwrap().into(),
            namespace: ns.into(),
            hostname: host.into(),
            vips: vips
                .iter()
                .map(|(n, a)| NetworkAddress {
                    network: n.to_string(),
                    ip: ip(a),
                })
                .collect(),
            ports: vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
            ..Service::default()
        }
    }

    fn policy(ns: &str, name: &str) -> Policy {
        Policy {
            name: name.into(),
            namespace: ns.into(),
            scope: PolicyScope::Namespace,
            action: PolicyAction::Allow,
            dry_run: false,
            rules: vec![],
        }
    }

    fn sample() -> Snapshot {
        let mut unhealthy = workload("b", "", &["10.0.0.2"], &["default/web.local"]);
        unhealthy.status = WorkloadStatus::Unhealthy;
        Snapshot::new(
            vec![
                unhealthy,
                workload("a", "", &["10.0.0.1", "fd00::1"], &["default/web.local"]),
                workload("remote", "net2", &["10.0.0.1"], &[]),
                workload("orphan", "", &["10.0.0.9"], &["default/missing.local"]),
            ],
            vec![
                service(
                    "default",
                    "web.local",
                    &[("", "10.96.0.1"), ("net2", "10.96.0.1")],
                ),
                service("other", "web.local", &[]),
                service("default", "db.local", &[("", "10.96.0.2")]),
            ],
            vec![policy("default", "allow-web"), policy("other", "allow-web")],
        )
        .unwrap()
    }

    /// Counts this thread's heap allocations, to prove lookups don't make any.
    mod alloc_count {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local!(static COUNT: Cell<usize> = const { Cell::new(0) });

        pub struct Counting;

        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = COUNT.try_with(|c| c.set(c.get() + 1));
                unsafe { System.alloc(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        pub fn allocations() -> usize {
            COUNT.with(|c| c.get())
        }
    }

    #[global_allocator]
    static ALLOCATOR: alloc_count::Counting = alloc_count::Counting;

    #[test]
    fn lookups_do_not_allocate() {
        let publisher = crate::publish::SnapshotPublisher::new();
        publisher.publish(sample());
        let feed = publisher.subscribe();
        let (wl, vip, missing) = (ip("fd00::1"), ip("10.96.0.1"), ip("192.0.2.1"));
        drop(feed.load()); // first use on a thread registers with arc-swap
        let before = alloc_count::allocations();
        for _ in 0..100 {
            let s = feed.load();
            assert!(s.workload_by_addr("", wl).is_some());
            assert!(s.workload_by_addr("net2", missing).is_none());
            assert!(s.workload_by_addr("nonet", wl).is_none());
            assert!(s.service_by_vip("net2", vip).is_some());
            assert!(s.workload_by_uid("remote").is_some());
            assert!(s.service_by_host("other", "web.local").is_some());
            assert!(s.service_by_key("default/db.local").is_some());
            assert_eq!(s.services_by_hostname("web.local").len(), 2);
            assert_eq!(s.endpoints("default/web.local").len(), 2);
            assert!(s.policy("default/allow-web").is_some());
        }
        assert_eq!(alloc_count::allocations() - before, 0);
        // ... and the counter does see allocations.
        let before = alloc_count::allocations();
        std::hint::black_box(String::from("x"));
        assert_eq!(alloc_count::allocations() - before, 1);
    }

    #[test]
    fn empty_snapshot() {
        let s = Snapshot::empty();
        assert_eq!(s.version(), 0);
        assert!(s.is_empty());
        assert!(s.workload_by_addr("", ip("10.0.0.1")).is_none());
        assert!(s.endpoints("default/web.local").is_empty());
        assert!(s.services_by_hostname("web.local").is_empty());
    }

    #[test]
    fn lookups_by_address_respect_network() {
        let s = sample();
        assert_eq!(s.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "a");
        assert_eq!(s.workload_by_addr("", ip("fd00::1")).unwrap().uid, "a");
        assert_eq!(
            s.workload_by_addr("net2", ip("10.0.0.1")).unwrap().uid,
            "remote"
        );
        assert!(s.workload_by_addr("net3", ip("10.0.0.1")).is_none());
        assert!(s.workload_by_addr("", ip("10.0.0.3")).is_none());

        let svc = s.service_by_vip("", ip("10.96.0.1")).unwrap();
        assert_eq!(svc.key(), "default/web.local");
        assert!(Arc::ptr_eq(
            svc,
            s.service_by_vip("net2", ip("10.96.0.1")).unwrap()
        ));
        assert!(s.service_by_vip("", ip("10.0.0.1")).is_none());
    }

    #[test]
    fn lookups_by_name() {
        let s = sample();
        assert_eq!(s.workload_by_uid("remote").unwrap().network, "net2");
        assert!(s.workload_by_uid("nope").is_none());
        assert_eq!(
            s.service_by_host("other", "web.local").unwrap().namespace,
            "other"
        );
        assert!(s.service_by_host("third", "web.local").is_none());
        assert_eq!(
            s.service_by_key("default/db.local").unwrap().hostname,
            "db.local"
        );
        let all: Vec<_> = s
            .services_by_hostname("web.local")
            .iter()
            .map(|s| s.namespace.as_str())
            .collect();
        assert_eq!(all, ["default", "other"]);
        assert_eq!(s.policy("other/allow-web").unwrap().namespace, "other");
        assert!(s.policy("allow-web").is_none());
        assert_eq!(s.workloads().len(), 4);
        assert_eq!(s.services().len(), 3);
        assert_eq!(s.policies().len(), 2);
    }

    #[test]
    fn endpoints_include_every_backing_workload() {
        let s = sample();
        let uids: Vec<_> = s
            .endpoints("default/web.local")
            .iter()
            .map(|w| w.uid.as_str())
            .collect();
        assert_eq!(uids, ["a", "b"], "sorted by uid, unhealthy kept");
        assert_eq!(s.endpoints("default/missing.local").len(), 1);
        assert!(s.endpoints("default/db.local").is_empty());
        // The endpoint and the uid index share one allocation.
        assert!(Arc::ptr_eq(
            &s.endpoints("default/web.local")[0],
            s.workload_by_uid("a").unwrap()
        ));
    }

    #[test]
    fn rejects_duplicate_uid() {
        let err = Snapshot::new(
            vec![
                workload("a", "", &["10.0.0.1"], &[]),
                workload("x", "", &["10.0.0.2"], &[]),
                workload("a", "", &["10.0.0.3"], &[]),
            ],
            vec![],
            vec![],
        )
        .unwrap_err();
        assert_eq!(
            err,
            SnapshotError::DuplicateWorkloadUid {
                uid: "a".into(),
                first: 0,
                second: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "workload #2 has uid \"a\", already used by workload #0"
        );
    }

    #[test]
    fn rejects_shared_workload_address_on_same_network_only() {
        let err = Snapshot::new(
            vec![
                workload("a", "", &["10.0.0.1"], &[]),
                workload("b", "", &["10.0.0.2", "10.0.0.1"], &[]),
            ],
            vec![],
            vec![],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload #1 (uid \"b\") claims address 10.0.0.1 on network \"\", \
             already claimed by workload #0 (uid \"a\")"
        );
        // Same IP on another network, or repeated by one workload: fine.
        Snapshot::new(
            vec![
                workload("a", "", &["10.0.0.1", "10.0.0.1"], &[]),
                workload("b", "n2", &["10.0.0.1"], &[]),
            ],
            vec![],
            vec![],
        )
        .unwrap();
    }

    #[test]
    fn host_network_workloads_are_not_indexed_by_address() {
        let mut h1 = workload("h1", "", &["192.168.1.10"], &[]);
        h1.network_mode = NetworkMode::HostNetwork;
        let mut h2 = workload("h2", "", &["192.168.1.10"], &[]);
        h2.network_mode = NetworkMode::HostNetwork;
        let s = Snapshot::new(vec![h1, h2], vec![], vec![]).unwrap();
        assert!(s.workload_by_addr("", ip("192.168.1.10")).is_none());
        assert!(s.workload_by_uid("h2").is_some());
    }

    #[test]
    fn rejects_duplicate_service_and_policy_keys() {
        let err = Snapshot::new(
            vec![],
            vec![
                service("default", "web.local", &[]),
                service("default", "web.local", &[]),
            ],
            vec![],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "service #1 has key \"default/web.local\", already used by service #0"
        );
        let err = Snapshot::new(
            vec![],
            vec![],
            vec![policy("a", "p"), policy("b", "p"), policy("a", "p")],
        )
        .unwrap_err();
        assert_eq!(
            err,
            SnapshotError::DuplicatePolicyKey {
                key: "a/p".into(),
                first: 0,
                second: 2
            }
        );
    }

    #[test]
    fn rejects_vip_conflicts() {
        let err = Snapshot::new(
            vec![workload("a", "", &["10.0.0.1"], &[])],
            vec![service("default", "web.local", &[("", "10.0.0.1")])],
            vec![],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "service #0 (\"default/web.local\") has VIP 10.0.0.1 on network \"\", which is \
             the address of workload #0 (uid \"a\")"
        );
        // Other network: no conflict.
        Snapshot::new(
            vec![workload("a", "", &["10.0.0.1"], &[])],
            vec![service("default", "web.local", &[("n2", "10.0.0.1")])],
            vec![],
        )
        .unwrap();

        let err = Snapshot::new(
            vec![],
            vec![
                service("default", "a.local", &[("", "10.96.0.1")]),
                service("default", "b.local", &[("", "10.96.0.1")]),
            ],
            vec![],
        )
        .unwrap_err();
        assert!(matches!(
            err,
            SnapshotError::DuplicateServiceVip {
                first: 0,
                second: 1,
                ..
            }
        ));
    }

    #[test]
    fn same_content_ignores_version() {
        let a = sample();
        let mut b = sample();
        b.set_version(7);
        assert!(a.same_content(&b));
        assert!(!a.same_content(&Snapshot::empty()));
    }
}
