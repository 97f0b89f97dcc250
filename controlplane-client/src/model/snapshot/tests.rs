//! Snapshot tests: lookups, validation, deltas, and incremental vs fresh
//! builds.

use super::*;
use crate::model::{
    NetworkAddress, PolicyAction, PolicyScope, PortMapping, UnreadablePolicy, WorkloadStatus,
};
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
            .collect::<BTreeMap<_, _>>()
            .into(),
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
                network: n.to_string().into(),
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

    // SAFETY: every call is passed on to the system allocator unchanged; only a thread-local count is kept beside it.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract for this GlobalAlloc call, passed on as is.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract for this GlobalAlloc call, passed on as is.
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
    // A built snapshot, then one derived by a delta.
    for i in 0..200 {
        if i == 100 {
            let derived = publisher.current().apply(SnapshotDelta {
                upsert_workloads: vec![workload("new", "", &["10.0.0.77"], &[])],
                ..SnapshotDelta::default()
            });
            publisher.publish(derived.snapshot);
            drop(feed.load());
            assert!(feed.load().workload_by_uid("new").is_some());
        }
        let before = alloc_count::allocations();
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
        drop(s);
        assert_eq!(alloc_count::allocations() - before, 0);
    }
    assert!(
        alloc_count::allocations() - before > 0,
        "the delta allocates"
    );
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
    assert_eq!(s.policy_count(), 2);
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
fn a_shared_address_keeps_every_holder_and_the_newest_answers() {
    // As ztunnel (checked against it): the workload configured last
    // answers for a shared address, whatever its health or kind.
    let s = Snapshot::new(
        vec![
            workload("a", "", &["10.0.0.1"], &[]),
            workload("b", "", &["10.0.0.2", "10.0.0.1"], &[]),
            workload("other-net", "n2", &["10.0.0.1"], &[]),
        ],
        vec![service("default", "on-pod.local", &[("", "10.0.0.2")])],
        vec![],
    )
    .unwrap();
    let at = |s: &Snapshot, net: &str, addr: &str| {
        s.workload_by_addr(net, ip(addr)).map(|w| w.uid.clone())
    };
    assert_eq!(at(&s, "", "10.0.0.1").as_deref(), Some("b"));
    assert_eq!(at(&s, "n2", "10.0.0.1").as_deref(), Some("other-net"));
    assert!(s.workload_by_uid("a").is_some());
    // A VIP may be a workload's address: each lookup finds its own.
    assert_eq!(at(&s, "", "10.0.0.2").as_deref(), Some("b"));
    assert_eq!(
        s.service_by_vip("", ip("10.0.0.2")).unwrap().hostname,
        "on-pod.local"
    );
    assert_snapshot_consistent(&s);

    // A newer, unhealthy claimant answers; an update makes "a" the newest.
    let mut unhealthy = workload("c", "", &["10.0.0.1"], &[]);
    unhealthy.status = WorkloadStatus::Unhealthy;
    let out = s.apply(SnapshotDelta {
        upsert_workloads: vec![unhealthy],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(at(&out.snapshot, "", "10.0.0.1").as_deref(), Some("c"));
    let s = out.snapshot.apply(SnapshotDelta {
        upsert_workloads: vec![workload("a", "", &["10.0.0.1"], &[])],
        ..SnapshotDelta::default()
    });
    let s = s.snapshot;
    assert_eq!(at(&s, "", "10.0.0.1").as_deref(), Some("a"));
    assert_snapshot_consistent(&s);

    // Holders leave newest first, then oldest: the next newest answers
    // each time, and the address goes with the last one.
    let remove = |s: &Snapshot, uid: &str| {
        s.apply(SnapshotDelta {
            remove_workloads: vec![uid.into()],
            ..SnapshotDelta::default()
        })
        .snapshot
    };
    let s = remove(&s, "a");
    assert_eq!(at(&s, "", "10.0.0.1").as_deref(), Some("c"));
    let s = remove(&s, "b");
    assert_eq!(at(&s, "", "10.0.0.1").as_deref(), Some("c"));
    assert!(at(&s, "", "10.0.0.2").is_none());
    let s = remove(&s, "c");
    assert!(at(&s, "", "10.0.0.1").is_none());
    assert!(s.shared_addrs.is_empty());
    assert_snapshot_consistent(&s);
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
            first: Some(0),
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

// ---------------------------------------------------------------------------
// Deltas
// ---------------------------------------------------------------------------

fn uids(list: &[Arc<Workload>]) -> Vec<&str> {
    list.iter().map(|w| w.uid.as_str()).collect()
}

fn namespaces(list: &[Arc<Service>]) -> Vec<&str> {
    list.iter().map(|s| s.namespace.as_str()).collect()
}

fn names(rejected: &[Rejected]) -> Vec<&str> {
    rejected.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn delta_adds_updates_moves_and_removes_workloads() {
    let base = sample();
    let out = base.apply(SnapshotDelta {
        upsert_workloads: vec![
            workload("c", "", &["10.0.0.3"], &["default/web.local"]),
            // "a" moves to a new address and to another service.
            workload("a", "", &["10.0.0.11"], &["default/db.local"]),
        ],
        remove_workloads: vec!["b".into(), "never-existed".into()],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let s = out.snapshot;
    assert_eq!(s.version(), 0);
    assert_eq!(s.workloads().len(), 4); // a, c, remote, orphan
    assert!(s.workload_by_uid("b").is_none());
    assert!(s.workload_by_addr("", ip("10.0.0.2")).is_none());
    assert!(s.workload_by_addr("", ip("10.0.0.1")).is_none());
    assert!(s.workload_by_addr("", ip("fd00::1")).is_none());
    assert_eq!(s.workload_by_addr("", ip("10.0.0.11")).unwrap().uid, "a");
    assert_eq!(s.workload_by_addr("", ip("10.0.0.3")).unwrap().uid, "c");
    assert_eq!(
        s.workload_by_addr("net2", ip("10.0.0.1")).unwrap().uid,
        "remote"
    );
    assert_eq!(uids(s.endpoints("default/web.local")), ["c"]);
    assert_eq!(uids(s.endpoints("default/db.local")), ["a"]);
    assert_eq!(uids(s.endpoints("default/missing.local")), ["orphan"]);
    assert!(Arc::ptr_eq(
        &s.endpoints("default/db.local")[0],
        s.workload_by_uid("a").unwrap()
    ));
    // The base snapshot is untouched.
    assert_eq!(base.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "a");
    assert_eq!(uids(base.endpoints("default/web.local")), ["a", "b"]);
    assert!(base.endpoints("default/db.local").is_empty());
    assert_eq!(base.workloads().len(), 4);

    // Removing the last endpoint of a service empties its list.
    let s = s
        .apply(SnapshotDelta {
            remove_workloads: vec!["c".into(), "orphan".into()],
            ..SnapshotDelta::default()
        })
        .snapshot;
    assert!(s.endpoints("default/web.local").is_empty());
    assert!(s.endpoints("default/missing.local").is_empty());
    assert_eq!(uids(s.endpoints("default/db.local")), ["a"]);
}

#[test]
fn delta_updates_services_and_policies() {
    let base = sample();
    let out = base.apply(SnapshotDelta {
        upsert_services: vec![
            service("default", "db.local", &[("", "10.96.0.3")]), // VIP moves
            service("third", "web.local", &[("", "10.96.0.4")]),
        ],
        upsert_policies: vec![policy("third", "p")],
        remove_services: vec!["other/web.local".into(), "nope/x".into()],
        remove_policies: vec!["other/allow-web".into()],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let s = out.snapshot;
    assert!(s.service_by_vip("", ip("10.96.0.2")).is_none());
    assert_eq!(
        s.service_by_vip("", ip("10.96.0.3")).unwrap().key(),
        "default/db.local"
    );
    assert_eq!(
        namespaces(s.services_by_hostname("web.local")),
        ["default", "third"]
    );
    assert!(s.service_by_host("other", "web.local").is_none());
    assert!(s.service_by_key("other/web.local").is_none());
    assert_eq!(s.services().len(), 3);
    assert!(s.policy("other/allow-web").is_none());
    assert!(s.policy("third/p").is_some());
    assert_eq!(s.policy_count(), 2);
    // Endpoints don't depend on the service object.
    assert_eq!(uids(s.endpoints("default/web.local")), ["a", "b"]);
    assert_eq!(
        namespaces(base.services_by_hostname("web.local")),
        ["default", "other"]
    );

    // The last service of a hostname goes: the hostname goes.
    let s = s
        .apply(SnapshotDelta {
            remove_services: vec!["default/db.local".into()],
            ..SnapshotDelta::default()
        })
        .snapshot;
    assert!(s.services_by_hostname("db.local").is_empty());
    assert!(s.service_by_vip("", ip("10.96.0.3")).is_none());
}

#[test]
fn conflicting_items_are_rejected_and_the_rest_applies() {
    let base = sample();
    let out = base.apply(SnapshotDelta {
        upsert_workloads: vec![
            workload("good", "", &["10.0.0.50"], &["default/web.local"]),
            workload("steals-b", "", &["10.0.0.51", "10.0.0.2"], &[]),
            workload("on-vip", "", &["10.96.0.2"], &[]),
            // An update that conflicts keeps the previous version.
            workload("a", "", &["10.0.0.9"], &[]),
            workload("x", "", &["10.0.0.60"], &[]),
            workload("y", "", &["10.0.0.60"], &[]),
            workload("good", "", &["10.0.0.70"], &[]),
        ],
        upsert_services: vec![
            service("default", "vip-on-pod.local", &[("", "10.0.0.9")]),
            service("default", "vip-taken.local", &[("", "10.96.0.2")]),
            service("default", "vip-on-new-pod.local", &[("", "10.0.0.50")]),
            service("default", "fine.local", &[("", "10.96.0.9")]),
        ],
        upsert_policies: vec![policy("default", "p"), policy("default", "p")],
        ..SnapshotDelta::default()
    });
    // Only true conflicts are refused: a repeated uid, a VIP another
    // service holds, a repeated policy key. Shared addresses are kept.
    assert_eq!(
        names(&out.rejected),
        ["good", "default/vip-taken.local", "default/p"]
    );
    let err = |name: &str| {
        out.rejected
            .iter()
            .find(|r| r.name == name)
            .unwrap()
            .error
            .clone()
    };
    assert_eq!(
        err("good"),
        SnapshotError::DuplicateWorkloadUid {
            uid: "good".into(),
            first: 0,
            second: 6
        }
    );
    assert_eq!(
        err("default/vip-taken.local").to_string(),
        "service #1 (\"default/vip-taken.local\") claims VIP 10.96.0.2 on network \"\", \
         already claimed by existing service (\"default/db.local\")"
    );
    assert!(matches!(
        err("default/p"),
        SnapshotError::DuplicatePolicyKey {
            first: 0,
            second: 1,
            ..
        }
    ));

    let s = &out.snapshot;
    let at = |addr: &str| s.workload_by_addr("", ip(addr)).map(|w| w.uid.as_str());
    // The first occurrence of a duplicate applied.
    assert_eq!(at("10.0.0.50"), Some("good"));
    assert_eq!(at("10.0.0.70"), None);
    // Shared addresses: the newest holder answers, the others stay.
    assert_eq!(at("10.0.0.60"), Some("y"));
    assert_eq!(at("10.0.0.2"), Some("steals-b"));
    assert_eq!(at("10.0.0.51"), Some("steals-b"));
    assert_eq!(at("10.0.0.9"), Some("a"));
    assert!(s.workload_by_uid("b").is_some() && s.workload_by_uid("x").is_some());
    assert!(s.workload_by_uid("orphan").is_some());
    // "a" moved: its old address is free.
    assert_eq!(at("10.0.0.1"), None);
    // A workload on a VIP, and VIPs on workloads: both kept.
    assert_eq!(at("10.96.0.2"), Some("on-vip"));
    assert_eq!(
        s.service_by_vip("", ip("10.96.0.2")).unwrap().hostname,
        "db.local"
    );
    for (vip, host) in [
        ("10.0.0.9", "vip-on-pod.local"),
        ("10.0.0.50", "vip-on-new-pod.local"),
        ("10.96.0.9", "fine.local"),
    ] {
        assert_eq!(s.service_by_vip("", ip(vip)).unwrap().hostname, host);
    }
    assert!(s.service_by_key("default/vip-taken.local").is_none());
    assert_eq!(uids(s.endpoints("default/web.local")), ["b", "good"]);
    assert_eq!(uids(s.endpoints("default/missing.local")), ["orphan"]);
    assert!(s.policy("default/p").is_some());
    assert_snapshot_consistent(s);
}

#[test]
fn addresses_can_change_hands_within_one_delta() {
    let base = sample();
    // "c" takes a's address, listed before the update that frees it; "d"
    // takes b's, freed by a removal; a new service takes db.local's VIP,
    // which db.local gives up later in the same delta.
    let out = base.apply(SnapshotDelta {
        upsert_workloads: vec![
            workload("c", "", &["10.0.0.1"], &[]),
            workload("a", "", &["10.0.0.21", "fd00::1"], &["default/web.local"]),
            workload("d", "", &["10.0.0.2"], &[]),
        ],
        upsert_services: vec![
            service("default", "new.local", &[("", "10.96.0.2")]),
            service("default", "db.local", &[("", "10.96.0.22")]),
        ],
        remove_workloads: vec!["b".into()],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let s = &out.snapshot;
    assert_eq!(s.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "c");
    assert_eq!(s.workload_by_addr("", ip("10.0.0.21")).unwrap().uid, "a");
    assert_eq!(s.workload_by_addr("", ip("10.0.0.2")).unwrap().uid, "d");
    assert_eq!(
        s.service_by_vip("", ip("10.96.0.2")).unwrap().hostname,
        "new.local"
    );
    assert_eq!(
        s.service_by_vip("", ip("10.96.0.22")).unwrap().hostname,
        "db.local"
    );
    assert_snapshot_consistent(s);

    // A straight swap in one delta: each takes the other's address.
    let out = s.apply(SnapshotDelta {
        upsert_workloads: vec![
            workload("c", "", &["10.0.0.2"], &[]),
            workload("d", "", &["10.0.0.1"], &[]),
        ],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let s = &out.snapshot;
    assert_eq!(s.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "d");
    assert_eq!(s.workload_by_addr("", ip("10.0.0.2")).unwrap().uid, "c");
    assert!(
        s.shared_addrs.is_empty(),
        "nothing is shared after the swap"
    );
    assert_snapshot_consistent(s);
}

#[test]
fn a_name_removed_and_upserted_in_one_delta_ends_up_upserted() {
    let out = sample().apply(SnapshotDelta {
        upsert_workloads: vec![workload("b", "", &["10.0.0.42"], &[])],
        upsert_services: vec![service("default", "db.local", &[])],
        upsert_policies: vec![policy("default", "allow-web")],
        remove_workloads: vec!["b".into()],
        remove_services: vec!["default/db.local".into()],
        remove_policies: vec!["default/allow-web".into()],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty());
    let s = out.snapshot;
    assert_eq!(s.workload_by_addr("", ip("10.0.0.42")).unwrap().uid, "b");
    assert!(s.workload_by_addr("", ip("10.0.0.2")).is_none());
    assert_eq!(uids(s.endpoints("default/web.local")), ["a"]);
    assert!(s
        .service_by_key("default/db.local")
        .unwrap()
        .vips
        .is_empty());
    assert!(s.service_by_vip("", ip("10.96.0.2")).is_none());
    assert!(s.policy("default/allow-web").is_some());
}

#[test]
fn host_network_workloads_in_deltas() {
    let mut h = workload("h", "", &["10.0.0.1"], &["default/web.local"]);
    h.network_mode = NetworkMode::HostNetwork;
    let out = sample().apply(SnapshotDelta {
        upsert_workloads: vec![h.clone()],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "shares the node's IP: no conflict");
    let s = out.snapshot;
    assert_eq!(s.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "a");
    assert_eq!(uids(s.endpoints("default/web.local")), ["a", "b", "h"]);
    // Turning into a pod network workload: now it shares a's address,
    // and answers for it as the newest holder.
    h.network_mode = NetworkMode::Standard;
    let out = s.apply(SnapshotDelta {
        upsert_workloads: vec![h],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(
        out.snapshot
            .workload_by_addr("", ip("10.0.0.1"))
            .unwrap()
            .uid,
        "h"
    );
    assert_snapshot_consistent(&out.snapshot);
}

#[test]
fn a_delta_shares_everything_it_does_not_touch() {
    let workloads: Vec<Workload> = (0..5000)
        .map(|i| {
            let a = format!("10.1.{}.{}", i / 250, i % 250);
            workload(
                &format!("w{i}"),
                "",
                &[&a],
                &[&format!("default/s{}", i % 50)],
            )
        })
        .collect();
    let services = (0..50)
        .map(|i| {
            service(
                "default",
                &format!("s{i}"),
                &[("", &format!("10.96.1.{i}"))],
            )
        })
        .collect();
    let base = Snapshot::new(workloads, services, vec![]).unwrap();
    let out = base.apply(SnapshotDelta {
        upsert_workloads: vec![workload("w7", "", &["10.2.0.7"], &["default/s7"])],
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty());
    let s = out.snapshot;
    // One shard of each touched table was copied (two for the address
    // index: old and new address), nothing else.
    assert_eq!(s.workloads.copied_shards(&base.workloads), 1);
    let by_addr = |s: &Snapshot| find_named(&s.workloads_by_addr, "").unwrap().clone();
    assert!(by_addr(&s).copied_shards(&by_addr(&base)) <= 2);
    assert_eq!(s.endpoints.copied_shards(&base.endpoints), 1);
    assert_eq!(s.services.copied_shards(&base.services), 0);
    assert_eq!(s.services_by_vip.copied_shards(&base.services_by_vip), 0);
    assert_eq!(
        s.workloads_by_addr.copied_shards(&base.workloads_by_addr),
        1
    );
    assert_eq!(
        s.services_by_hostname
            .copied_shards(&base.services_by_hostname),
        0
    );
    assert!(Arc::ptr_eq(
        s.workload_by_uid("w8").unwrap(),
        base.workload_by_uid("w8").unwrap()
    ));
    assert_eq!(s.endpoints("default/s7").len(), 100);
    assert!(!s.same_content(&base));
    // Re-pushing the old version gives equal content.
    let back = s
        .apply(SnapshotDelta {
            upsert_workloads: vec![(**base.workload_by_uid("w7").unwrap()).clone()],
            ..SnapshotDelta::default()
        })
        .snapshot;
    assert!(back.same_content(&base));
    assert_snapshot_consistent(&back);
}

#[test]
fn new_is_empty_plus_apply() {
    let fresh = sample();
    let mut unhealthy = workload("b", "", &["10.0.0.2"], &["default/web.local"]);
    unhealthy.status = WorkloadStatus::Unhealthy;
    let out = Snapshot::empty().apply(SnapshotDelta {
        upsert_workloads: fresh.workloads().map(|w| (**w).clone()).collect(),
        upsert_services: fresh.services().map(|s| (**s).clone()).collect(),
        upsert_policies: fresh.policies().map(|p| (**p).clone()).collect(),
        ..SnapshotDelta::default()
    });
    assert!(out.rejected.is_empty());
    assert!(out.snapshot.same_content(&fresh));
    assert_same_lookups(&out.snapshot, &fresh);
}

// ---------------------------------------------------------------------------
// Incremental vs fresh, on random deltas
// ---------------------------------------------------------------------------

/// Every index agrees with a fresh build from the snapshot's own items (and
/// that build succeeds: the result of any delta is conflict-free).
fn assert_snapshot_consistent(s: &Snapshot) {
    let fresh = Snapshot::new(
        oldest_first(s).into_iter().map(|w| (*w).clone()).collect(),
        s.services().map(|x| (**x).clone()).collect(),
        s.policies().map(|p| (**p).clone()).collect(),
    )
    .expect("the result of a delta is a valid configuration");
    assert!(s.same_content(&fresh) && fresh.same_content(s));
    assert_same_lookups(s, &fresh);
}

/// The snapshot's workloads in an order that, built fresh, gives every
/// shared address the same holders in the same order (so the same one
/// answers): each holder list read as "older before newer", sorted
/// topologically. Unshared workloads first.
fn oldest_first(s: &Snapshot) -> Vec<Arc<Workload>> {
    let mut after: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut before_count: HashMap<&str, usize> = HashMap::new();
    for w in s.workloads() {
        before_count.insert(&w.uid, 0);
    }
    for holders in s.shared_addrs.values() {
        for pair in holders.windows(2) {
            after.entry(&pair[0].uid).or_default().push(&pair[1].uid);
            *before_count.get_mut(pair[1].uid.as_str()).unwrap() += 1;
        }
    }
    let mut ready: Vec<&str> = before_count
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(u, _)| *u)
        .collect();
    ready.sort_unstable();
    let mut order = Vec::new();
    while let Some(uid) = ready.pop() {
        order.push(s.workload_by_uid(uid).unwrap().clone());
        for next in after.get(uid).into_iter().flatten() {
            let n = before_count.get_mut(next).unwrap();
            *n -= 1;
            if *n == 0 {
                ready.push(next);
            }
        }
    }
    assert_eq!(
        order.len(),
        s.workloads().len(),
        "holder lists form no cycle"
    );
    order
}

fn assert_same_lookups(a: &Snapshot, b: &Snapshot) {
    // Shared addresses: the same holders, in the same order.
    let holders = |s: &Snapshot| -> BTreeMap<String, Vec<String>> {
        s.shared_addrs
            .iter()
            .map(|((net, ip), h)| {
                (
                    format!("{net}/{ip}"),
                    h.iter().map(|w| w.uid.to_string()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(holders(a), holders(b), "shared addresses");
    let uid = |w: Option<&Arc<Workload>>| w.map(|w| w.uid.clone());
    let key = |s: Option<&Arc<Service>>| s.map(|s| s.key());
    for s in [a, b] {
        let other = if std::ptr::eq(s, a) { b } else { a };
        for w in s.workloads() {
            assert_eq!(uid(other.workload_by_uid(&w.uid)), Some(w.uid.clone()));
            for &addr in &w.addresses {
                assert_eq!(
                    uid(s.workload_by_addr(&w.network, addr)),
                    uid(other.workload_by_addr(&w.network, addr))
                );
            }
            for k in w.services.keys() {
                assert_eq!(uids(s.endpoints(k)), uids(other.endpoints(k)), "{k}");
            }
        }
        for svc in s.services() {
            for vip in &svc.vips {
                assert_eq!(
                    key(s.service_by_vip(&vip.network, vip.ip)),
                    key(other.service_by_vip(&vip.network, vip.ip))
                );
                assert_eq!(
                    uid(s.workload_by_addr(&vip.network, vip.ip)),
                    uid(other.workload_by_addr(&vip.network, vip.ip))
                );
            }
            assert_eq!(
                namespaces(s.services_by_hostname(&svc.hostname)),
                namespaces(other.services_by_hostname(&svc.hostname))
            );
            assert_eq!(
                uids(s.endpoints(&svc.key())),
                uids(other.endpoints(&svc.key()))
            );
        }
        for p in s.policies() {
            assert_eq!(other.policy(&p.key()), Some(p));
        }
        // Each namespace's (and the global) policy list, in order.
        for ns in NAMESPACES.iter().chain(&[""]) {
            let keys = |s: &Snapshot| -> Vec<String> {
                s.policies_by_namespace
                    .iter()
                    .filter_map(|index| find_named(index, ns))
                    .flat_map(|l| l.iter().map(|p| p.policy().key().to_owned()))
                    .collect()
            };
            assert_eq!(keys(s), keys(other), "policies of namespace {ns:?}");
        }
    }
    // Sizes agree, so nothing is indexed that shouldn't be.
    fn entries<T>(index: &ByNetwork<T>) -> Vec<(String, usize)> {
        let mut v: Vec<_> = index
            .iter()
            .map(|e| (e.key.to_string(), e.value.len()))
            .collect();
        v.sort();
        assert!(v.iter().all(|(_, n)| *n > 0), "no empty network tables");
        v
    }
    assert_eq!(entries(&a.workloads_by_addr), entries(&b.workloads_by_addr));
    assert_eq!(entries(&a.services_by_vip), entries(&b.services_by_vip));
    assert_eq!(a.endpoints.len(), b.endpoints.len());
    assert_eq!(a.services_by_hostname.len(), b.services_by_hostname.len());
    for i in 0..2 {
        assert_eq!(
            a.policies_by_namespace[i].len(),
            b.policies_by_namespace[i].len()
        );
    }
}

/// xorshift64*, so the test needs no rand crate and replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const NETWORKS: [&str; 2] = ["", "n2"];
const NAMESPACES: [&str; 3] = ["default", "shop", "ops"];
const HOSTS: [&str; 5] = ["a.local", "b.local", "c.local", "d.local", "e.local"];

/// Small pools, so deltas collide often: 24 pod IPs, 12 VIPs, 4 of them
/// shared with the pods' range.
fn random_workload(rng: &mut Rng) -> Workload {
    let mut w = workload(&format!("w{}", rng.below(30)), "", &[], &[]);
    w.network = NETWORKS[rng.below(2)].into();
    let mut addresses = Vec::new();
    for _ in 0..rng.below(3) {
        addresses.push(ip(&format!("10.0.0.{}", rng.below(24))));
    }
    w.addresses = addresses.into();
    for _ in 0..rng.below(3) {
        let key = format!("{}/{}", NAMESPACES[rng.below(3)], HOSTS[rng.below(5)]);
        w.services.insert(key, vec![]);
    }
    if rng.chance(10) {
        w.network_mode = NetworkMode::HostNetwork;
    }
    if rng.chance(20) {
        w.status = WorkloadStatus::Unhealthy;
    }
    w
}

fn random_service(rng: &mut Rng) -> Service {
    let mut s = service(NAMESPACES[rng.below(3)], HOSTS[rng.below(5)], &[]);
    for _ in 0..rng.below(3) {
        s.vips.push(NetworkAddress {
            network: NETWORKS[rng.below(2)].into(),
            ip: ip(&format!("10.0.0.{}", 20 + rng.below(12))),
        });
    }
    s.canonical = rng.chance(50);
    s
}

fn random_delta(rng: &mut Rng, current: &Snapshot) -> SnapshotDelta {
    let mut d = SnapshotDelta::default();
    for _ in 0..rng.below(6) {
        d.upsert_workloads.push(random_workload(rng));
    }
    for _ in 0..rng.below(3) {
        d.upsert_services.push(random_service(rng));
    }
    for _ in 0..rng.below(2) {
        let mut p = policy(NAMESPACES[rng.below(3)], &format!("p{}", rng.below(4)));
        p.dry_run = rng.chance(50);
        if rng.chance(50) {
            p.action = PolicyAction::Deny;
        }
        p.scope = [
            PolicyScope::Namespace,
            PolicyScope::Global,
            PolicyScope::WorkloadSelector,
        ][rng.below(3)];
        d.upsert_policies.push(p);
    }
    if rng.chance(25) {
        d.upsert_unreadable_policies.push(UnreadablePolicy {
            namespace: NAMESPACES[rng.below(3)].into(),
            name: format!("p{}", rng.below(4)),
            scope: [
                None,
                Some(PolicyScope::Global),
                Some(PolicyScope::WorkloadSelector),
            ][rng.below(3)],
            dry_run: rng.chance(30),
            error: "unreadable".into(),
        });
    }
    // Remove mostly things that exist.
    let mut existing: Vec<String> = current.workloads().map(|w| w.uid.to_string()).collect();
    existing.sort(); // iteration order depends on the hash seed
    for _ in 0..rng.below(3) {
        d.remove_workloads
            .push(if existing.is_empty() || rng.chance(20) {
                format!("w{}", rng.below(30))
            } else {
                existing[rng.below(existing.len())].clone()
            });
    }
    if rng.chance(30) {
        d.remove_services.push(format!(
            "{}/{}",
            NAMESPACES[rng.below(3)],
            HOSTS[rng.below(5)]
        ));
    }
    if rng.chance(20) {
        d.remove_policies
            .push(format!("{}/p{}", NAMESPACES[rng.below(3)], rng.below(4)));
    }
    d
}

/// What applying `delta` must leave, by name: removals, then every upsert
/// not refused (first occurrence of a name).
/// A policy as a delta can leave it.
#[derive(Clone)]
enum Pol {
    Readable(Policy),
    Unreadable(UnreadablePolicy),
}

fn expected_after(
    before: &Snapshot,
    delta: &SnapshotDelta,
    rejected: &[Rejected],
) -> (
    BTreeMap<String, Workload>,
    BTreeMap<String, Service>,
    BTreeMap<String, Pol>,
) {
    let mut w: BTreeMap<_, _> = before
        .workloads()
        .map(|x| (x.uid.to_string(), (**x).clone()))
        .collect();
    let mut s: BTreeMap<_, _> = before
        .services()
        .map(|x| (x.key(), (**x).clone()))
        .collect();
    let mut p: BTreeMap<_, _> = before
        .policies()
        .map(|x| (x.key(), Pol::Readable((**x).clone())))
        .collect();
    for u in before.unreadable_policies() {
        let (namespace, name) = u.key().split_once('/').unwrap();
        p.insert(
            u.key().to_owned(),
            Pol::Unreadable(UnreadablePolicy {
                namespace: namespace.into(),
                name: name.into(),
                scope: Some(u.scope()),
                dry_run: u.dry_run(),
                error: u.unreadable_reason().unwrap().into(),
            }),
        );
    }
    for uid in &delta.remove_workloads {
        w.remove(uid.as_str());
    }
    for key in &delta.remove_services {
        s.remove(key);
    }
    for key in &delta.remove_policies {
        p.remove(key);
    }
    // A duplicate's refusal is about a later occurrence; the first one
    // counts unless refused for another reason.
    let refused = |name: &str| {
        rejected.iter().any(|r| {
            r.name == name
                && !matches!(
                    r.error,
                    SnapshotError::DuplicateWorkloadUid { .. }
                        | SnapshotError::DuplicateServiceKey { .. }
                        | SnapshotError::DuplicatePolicyKey { .. }
                )
        })
    };
    let mut seen = std::collections::HashSet::new();
    for x in &delta.upsert_workloads {
        if seen.insert(x.uid.clone()) && !refused(&x.uid) {
            w.insert(x.uid.to_string(), x.clone());
        }
    }
    for x in &delta.upsert_services {
        if seen.insert(x.key().into()) && !refused(&x.key()) {
            s.insert(x.key(), x.clone());
        }
    }
    for x in &delta.upsert_policies {
        if seen.insert(x.key().into()) && !refused(&x.key()) {
            p.insert(x.key(), Pol::Readable(x.clone()));
        }
    }
    for x in &delta.upsert_unreadable_policies {
        if seen.insert(x.key().into()) && !refused(&x.key()) {
            p.insert(x.key(), Pol::Unreadable(x.clone()));
        }
    }
    (w, s, p)
}

#[test]
fn random_deltas_match_a_fresh_build() {
    let mut total_rejected = 0;
    let mut total_applied = 0;
    for seed in 1..=12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut current = Snapshot::empty();
        // The model's own record of when each workload was last upserted:
        // the newest holder of a shared address must answer for it.
        let (mut age, mut clock) = (HashMap::<String, u64>::new(), 0u64);
        for _ in 0..150 {
            let delta = random_delta(&mut rng, &current);
            let out = current.apply(delta.clone());
            for uid in &delta.remove_workloads {
                age.remove(uid);
            }
            let mut seen = std::collections::HashSet::new();
            for w in &delta.upsert_workloads {
                if seen.insert(w.uid.clone()) {
                    clock += 1;
                    age.insert(w.uid.to_string(), clock);
                }
            }
            total_rejected += out.rejected.len();
            total_applied += delta.upsert_workloads.len() + delta.upsert_services.len();
            let (w, s, p) = expected_after(&current, &delta, &out.rejected);
            // Content: exactly the removals and the accepted upserts.
            let (mut readable, mut unreadable) = (Vec::new(), Vec::new());
            for pol in p.into_values() {
                match pol {
                    Pol::Readable(x) => readable.push(x),
                    Pol::Unreadable(x) => unreadable.push(x),
                }
            }
            let mut oldest_first: Vec<Workload> = w.into_values().collect();
            oldest_first.sort_by_key(|x| age[x.uid.as_str()]);
            let expected = Snapshot::new(oldest_first, s.into_values().collect(), readable)
                .expect("accepted items never conflict");
            let expected = {
                let out = expected.apply(SnapshotDelta {
                    upsert_unreadable_policies: unreadable,
                    ..SnapshotDelta::default()
                });
                assert!(out.rejected.is_empty());
                out.snapshot
            };
            assert!(out.snapshot.same_content(&expected));
            // Indexes: the same as a fresh build's.
            assert_same_lookups(&out.snapshot, &expected);
            // Every refusal names something the delta upserted.
            for r in &out.rejected {
                assert!(
                    delta.upsert_workloads.iter().any(|w| w.uid == r.name)
                        || delta.upsert_services.iter().any(|s| s.key() == r.name)
                        || delta.upsert_policies.iter().any(|p| p.key() == r.name)
                        || delta
                            .upsert_unreadable_policies
                            .iter()
                            .any(|p| p.key() == r.name),
                    "{r:?}"
                );
            }
            current = out.snapshot;
        }
    }
    // The pools are small enough that both outcomes are well exercised.
    assert!(total_rejected > 500, "{total_rejected} rejected");
    assert!(
        total_applied > 3 * total_rejected,
        "{total_applied} applied"
    );
    eprintln!("{total_applied} upserts, {total_rejected} rejected");
}

// ---------------------------------------------------------------------------
// Authorization policies: selection by scope and name, epochs, unreadable
// policies
// ---------------------------------------------------------------------------

mod authz {
    use super::*;
    use crate::model::authz::{Conn, Verdict};
    use crate::model::{Match, Rule, UnreadablePolicy};

    /// A DENY policy that matches every connection to port 9000.
    fn deny_9000(ns: &str, name: &str, scope: PolicyScope) -> Policy {
        Policy {
            scope,
            action: PolicyAction::Deny,
            rules: vec![Rule {
                clauses: vec![crate::model::Clause {
                    matches: vec![Match {
                        destination_ports: vec![9000],
                        ..Match::default()
                    }],
                }],
            }],
            ..policy(ns, name)
        }
    }

    fn in_ns(uid: &str, ns: &str, addr: &str, named: &[&str]) -> Workload {
        Workload {
            namespace: ns.into(),
            authorization_policies: named.iter().map(|&s| s.into()).collect(),
            ..workload(uid, "", &[addr], &[])
        }
    }

    /// The verdict for a plaintext connection to `uid` port 9000.
    fn decide(s: &Snapshot, uid: &str) -> String {
        let w = s.workload_by_uid(uid).unwrap();
        let conn = Conn {
            src: ip("192.0.2.1"),
            dst: SocketAddr::new(w.addresses[0], 9000),
            peer: None,
        };
        s.authorize(w, &conn, &mut |_| {}).to_string()
    }

    fn mesh() -> Snapshot {
        Snapshot::new(
            vec![
                in_ns("shop-1", "shop", "10.1.0.1", &[]),
                in_ns(
                    "shop-2",
                    "shop",
                    "10.1.0.2",
                    &["shop/selected", "shop/nowhere"],
                ),
                in_ns("ops-1", "ops", "10.1.0.3", &[]),
            ],
            vec![],
            vec![
                deny_9000("shop", "ns-wide", PolicyScope::Namespace),
                deny_9000("shop", "selected", PolicyScope::WorkloadSelector),
            ],
        )
        .unwrap()
    }

    use std::net::SocketAddr;

    #[test]
    fn policies_apply_by_scope_and_by_name() {
        let s = mesh();
        assert_eq!(decide(&s, "shop-1"), "explicitly denied by shop/ns-wide");
        assert_eq!(decide(&s, "ops-1"), "no allow policies, allowed");
        // The namespace-wide policy is looked at before the named one.
        assert_eq!(decide(&s, "shop-2"), "explicitly denied by shop/ns-wide");
        let s = s
            .apply(SnapshotDelta {
                remove_policies: vec!["shop/ns-wide".into()],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(decide(&s, "shop-1"), "no allow policies, allowed");
        assert_eq!(decide(&s, "shop-2"), "explicitly denied by shop/selected");
        assert_eq!(
            s.missing_policies(s.workload_by_uid("shop-2").unwrap())
                .collect::<Vec<_>>(),
            ["shop/nowhere"]
        );
        // A global policy (istiod puts them in its root namespace) applies
        // everywhere.
        let s = s
            .apply(SnapshotDelta {
                upsert_policies: vec![deny_9000("istio-system", "mesh", PolicyScope::Global)],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(
            decide(&s, "ops-1"),
            "explicitly denied by istio-system/mesh"
        );
        assert_eq!(
            decide(&s, "shop-1"),
            "explicitly denied by istio-system/mesh"
        );
        // Changing a policy's scope moves it between the lists.
        let s = s
            .apply(SnapshotDelta {
                upsert_policies: vec![deny_9000(
                    "istio-system",
                    "mesh",
                    PolicyScope::WorkloadSelector,
                )],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(decide(&s, "ops-1"), "no allow policies, allowed");
        assert_snapshot_consistent(&s);
    }

    #[test]
    fn policy_epoch_moves_with_policies_only() {
        let empty = Snapshot::empty();
        assert_eq!(empty.policy_epoch(), 0);
        let s = mesh();
        let e0 = s.policy_epoch();
        assert_ne!(e0, 0);
        let s2 = s
            .apply(SnapshotDelta {
                upsert_workloads: vec![in_ns("shop-3", "shop", "10.1.0.9", &[])],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(s2.policy_epoch(), e0, "a workload change keeps the epoch");
        let s3 = s2
            .apply(SnapshotDelta {
                remove_policies: vec!["shop/selected".into()],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_ne!(s3.policy_epoch(), e0);
        // Removing something absent changes nothing.
        let s4 = s3
            .apply(SnapshotDelta {
                remove_policies: vec!["shop/absent".into()],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(s4.policy_epoch(), s3.policy_epoch());
        // Two snapshots built from scratch never share an epoch.
        assert_ne!(mesh().policy_epoch(), mesh().policy_epoch());
    }

    #[test]
    fn an_unreadable_policy_denies_until_a_readable_version_arrives() {
        let s = mesh()
            .apply(SnapshotDelta {
                remove_policies: vec!["shop/ns-wide".into(), "shop/selected".into()],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(decide(&s, "shop-1"), "no allow policies, allowed");
        let bad = UnreadablePolicy {
            namespace: "shop".into(),
            name: "allow-some".into(),
            scope: Some(PolicyScope::Namespace),
            dry_run: false,
            error: "rules[0]...: prefix length 40 exceeds 32".into(),
        };
        let s = s
            .apply(SnapshotDelta {
                upsert_unreadable_policies: vec![bad],
                ..SnapshotDelta::default()
            })
            .snapshot;
        let w = s.workload_by_uid("shop-1").unwrap();
        let conn = Conn {
            src: ip("192.0.2.1"),
            dst: SocketAddr::new(w.addresses[0], 80),
            peer: None,
        };
        let v = s.authorize(w, &conn, &mut |_| {});
        assert!(matches!(v, Verdict::DeniedUnreadable(_)), "{v}");
        assert!(v.to_string().contains("shop/allow-some could not be read"));
        assert_eq!(decide(&s, "ops-1"), "no allow policies, allowed");
        assert!(s.policy("shop/allow-some").is_none());
        assert_eq!(s.unreadable_policies().count(), 1);
        assert_eq!(s.policy_count(), 1);
        // The readable version replaces it.
        let s = s
            .apply(SnapshotDelta {
                upsert_policies: vec![policy("shop", "allow-some")],
                ..SnapshotDelta::default()
            })
            .snapshot;
        assert_eq!(s.unreadable_policies().count(), 0);
        assert_eq!(
            decide(&s, "shop-1"),
            "allow policies exist, but none allowed"
        );
    }
}
