//! Authorization, compiled and decided: policies, a workload and
//! connections drawn from the fuzzer's bytes. The policies reach the
//! snapshot in two deltas (the second upserts, replaces and removes), as
//! a config source sends them; each connection is decided by
//! [`Snapshot::authorize`] on that snapshot and on one built from scratch
//! with the resulting set, and by the plain [`reference`] evaluator over
//! the policies selected for the workload. All three must agree: the
//! verdict, the deciding policy and the dry-run reports. Also asserted on
//! its own: an enforced DENY that matches always wins, and with ALLOW
//! policies present nothing is allowed that none of them matches.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::Draw;
use crate::model::authz::reference::{self, RefDryRun, RefVerdict};
use crate::model::authz::{Conn, Verdict};
use crate::model::identity::Identity;
use crate::model::snapshot::{Snapshot, SnapshotDelta};
use crate::model::{
    Cidr, Clause, Match, Policy, PolicyAction, PolicyScope, Rule, ServiceAccountMatch, Str,
    StringMatch, UnreadablePolicy, Workload,
};

const POLICY_NAMESPACES: [&str; 3] = ["ns1", "ns2", "istio-system"];
const WORKLOAD_NAMESPACES: [&str; 2] = ["ns1", "ns2"];
const POLICY_NAMES: [&str; 4] = ["a", "b", "c", "d"];
const TRUST_DOMAINS: [&str; 2] = ["cluster.local", "td"];
const ACCOUNTS: [&str; 3] = ["alice", "bob", "default"];
/// What string matches compare against: namespaces, principals and their
/// pieces, so prefixes and suffixes hit as often as they miss.
const STRINGS: [&str; 12] = [
    "ns1",
    "ns2",
    "ns",
    "1",
    "",
    "cluster.local/ns/ns1/sa/alice",
    "cluster.local/ns/ns2/sa/bob",
    "td/ns/ns1/sa/alice",
    "cluster.local/",
    "/sa/alice",
    "alice",
    "spiffe://cluster.local/ns/ns1/sa/alice",
];
const IPS: [&str; 9] = [
    "10.0.0.1",
    "10.0.0.2",
    "10.0.1.5",
    "192.168.1.1",
    "fd00::1",
    "fd00::2",
    "::ffff:10.0.0.1",
    "0.0.0.0",
    "::",
];
const PORTS: [u16; 5] = [80, 8080, 443, 0, 65535];

fn ip(d: &mut Draw<'_>) -> IpAddr {
    d.pick(&IPS).parse().expect("an address")
}

fn port(d: &mut Draw<'_>) -> u16 {
    match d.below(PORTS.len() + 1) {
        i if i < PORTS.len() => PORTS[i],
        _ => d.u16(),
    }
}

fn identity(d: &mut Draw<'_>) -> Identity {
    Identity::new(
        d.pick(&TRUST_DOMAINS),
        d.pick(&["ns1", "ns2", "a"]),
        d.pick(&ACCOUNTS),
    )
}

fn string_match(d: &mut Draw<'_>) -> StringMatch {
    match d.below(4) {
        0 => StringMatch::Exact(d.text(&STRINGS)),
        1 => StringMatch::Prefix(d.text(&STRINGS)),
        2 => StringMatch::Suffix(d.text(&STRINGS)),
        _ => StringMatch::Presence,
    }
}

fn cidr(d: &mut Draw<'_>) -> Cidr {
    let addr = ip(d);
    let len = d.byte() % 129;
    Cidr::new(addr, len).unwrap_or(Cidr::host(addr))
}

fn account(d: &mut Draw<'_>) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: d.pick(&["ns1", "ns2", "a"]).to_owned(),
        service_account: d.pick(&ACCOUNTS).to_owned(),
    }
}

/// One or two entries, when `mask` has `bit`.
fn list<T>(
    d: &mut Draw<'_>,
    mask: u16,
    bit: u16,
    mut one: impl FnMut(&mut Draw<'_>) -> T,
) -> Vec<T> {
    if mask & (1 << bit) == 0 {
        return Vec::new();
    }
    (0..1 + d.below(2)).map(|_| one(d)).collect()
}

fn matcher(d: &mut Draw<'_>) -> Match {
    let m = d.u16();
    Match {
        namespaces: list(d, m, 0, string_match),
        not_namespaces: list(d, m, 1, string_match),
        principals: list(d, m, 2, string_match),
        not_principals: list(d, m, 3, string_match),
        service_accounts: list(d, m, 4, account),
        not_service_accounts: list(d, m, 5, account),
        source_ips: list(d, m, 6, cidr),
        not_source_ips: list(d, m, 7, cidr),
        destination_ips: list(d, m, 8, cidr),
        not_destination_ips: list(d, m, 9, cidr),
        destination_ports: list(d, m, 10, port),
        not_destination_ports: list(d, m, 11, port),
    }
}

fn scope(d: &mut Draw<'_>) -> PolicyScope {
    d.pick(&[
        PolicyScope::Namespace,
        PolicyScope::Global,
        PolicyScope::WorkloadSelector,
    ])
}

/// A policy as a source delivers it: readable, or (one in eight) one it
/// could not read.
#[derive(Clone)]
enum Item {
    Readable(Policy),
    Unreadable(UnreadablePolicy),
}

impl Item {
    fn key(&self) -> String {
        match self {
            Item::Readable(p) => p.key(),
            Item::Unreadable(u) => u.key(),
        }
    }

    /// What the reference evaluates: an unreadable policy denies wherever
    /// it applies, as a DENY policy whose one rule always holds.
    fn as_reference(&self) -> Policy {
        match self {
            Item::Readable(p) => p.clone(),
            Item::Unreadable(u) => Policy {
                name: u.name.clone(),
                namespace: u.namespace.clone(),
                scope: u.scope.unwrap_or(PolicyScope::Namespace),
                action: PolicyAction::Deny,
                dry_run: u.dry_run,
                rules: vec![Rule::default()],
            },
        }
    }
}

fn item(d: &mut Draw<'_>) -> Item {
    let namespace = d.pick(&POLICY_NAMESPACES).to_owned();
    let name = d.pick(&POLICY_NAMES).to_owned();
    let flags = d.byte();
    let dry_run = flags & 1 == 1;
    if flags & 0b1110 == 0b1110 {
        let scope = (flags & 0x10 == 0).then(|| scope(d));
        return Item::Unreadable(UnreadablePolicy {
            namespace,
            name,
            scope,
            dry_run,
            error: "fuzz: unreadable".into(),
        });
    }
    let scope = scope(d);
    let action = if flags & 2 == 0 {
        PolicyAction::Allow
    } else {
        PolicyAction::Deny
    };
    let rules = (0..d.below(3))
        .map(|_| Rule {
            clauses: (0..d.below(3))
                .map(|_| Clause {
                    matches: (0..d.below(3)).map(|_| matcher(d)).collect(),
                })
                .collect(),
        })
        .collect();
    Item::Readable(Policy {
        name,
        namespace,
        scope,
        action,
        dry_run,
        rules,
    })
}

/// Up to `max` policies with distinct keys (a delta upserts a name once).
fn batch(d: &mut Draw<'_>, max: usize) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    for _ in 0..d.below(max + 1) {
        let i = item(d);
        if out.iter().all(|o| o.key() != i.key()) {
            out.push(i);
        }
    }
    out
}

fn delta(items: &[Item]) -> SnapshotDelta {
    let mut delta = SnapshotDelta::default();
    for i in items {
        match i {
            Item::Readable(p) => delta.upsert_policies.push(p.clone()),
            Item::Unreadable(u) => delta.upsert_unreadable_policies.push(u.clone()),
        }
    }
    delta
}

fn applied(base: &Snapshot, delta: SnapshotDelta) -> Snapshot {
    let outcome = base.apply(delta);
    assert!(
        outcome.rejected.is_empty(),
        "distinct, valid policies refused: {:?}",
        outcome.rejected
    );
    outcome.snapshot
}

/// A verdict as both evaluators can say it: allowed, how, and by which
/// policy.
fn describe(v: &Verdict<'_>) -> (bool, &'static str, String) {
    let key = v.policy().unwrap_or("").to_owned();
    let how = match v {
        Verdict::AllowedNoPolicies => "no allow policies",
        Verdict::AllowedBy(_) => "allowed by",
        Verdict::DeniedBy(_) | Verdict::DeniedUnreadable(_) => "denied by",
        Verdict::NotAllowed => "none allowed",
    };
    (v.allowed(), how, key)
}

fn describe_ref(v: &RefVerdict) -> (bool, &'static str, String) {
    match v {
        RefVerdict::AllowedNoPolicies => (true, "no allow policies", String::new()),
        RefVerdict::AllowedBy(k) => (true, "allowed by", k.clone()),
        RefVerdict::DeniedBy(k) => (false, "denied by", k.clone()),
        RefVerdict::NotAllowed => (false, "none allowed", String::new()),
    }
}

fn decide(
    snapshot: &Snapshot,
    workload: &Workload,
    conn: &Conn<'_>,
) -> ((bool, &'static str, String), Vec<String>) {
    let mut reports = Vec::new();
    let verdict = snapshot.authorize(workload, conn, &mut |r| reports.push(r.to_string()));
    // The access log's wording must render for any verdict.
    assert!(!verdict.to_string().is_empty());
    (describe(&verdict), reports)
}

/// The policies that apply to `workload`, in the order the snapshot
/// selects them: its namespace's and the global ones (each by key), then
/// the names it lists.
fn selected(set: &BTreeMap<String, Item>, workload: &Workload) -> Vec<Policy> {
    let all: Vec<Policy> = set.values().map(Item::as_reference).collect();
    let mut out: Vec<Policy> = all
        .iter()
        .filter(|p| p.scope == PolicyScope::Namespace && p.namespace == *workload.namespace)
        .cloned()
        .collect();
    out.extend(
        all.iter()
            .filter(|p| p.scope == PolicyScope::Global)
            .cloned(),
    );
    out.extend(
        workload
            .authorization_policies
            .iter()
            .filter_map(|k| set.get(k.as_str()).map(Item::as_reference)),
    );
    out
}

/// Policies, a workload and connections from `data`, decided three ways.
pub fn decide_all(data: &[u8]) {
    let mut d = Draw::new(data);
    let namespace = d.pick(&WORKLOAD_NAMESPACES);
    let named: Vec<Str> = (0..d.below(3))
        .map(|_| {
            let ns = d.pick(&POLICY_NAMESPACES);
            let name = d.pick(&POLICY_NAMES);
            Str::from(format!("{ns}/{name}"))
        })
        .collect();
    let workload = Workload {
        uid: "w".into(),
        name: "w".into(),
        namespace: namespace.into(),
        addresses: Box::new(["10.0.0.2".parse().expect("an address")]),
        authorization_policies: named.into(),
        ..Workload::default()
    };
    let first = batch(&mut d, 4);
    let removed: Vec<String> = (0..d.below(3))
        .map(|_| format!("{}/{}", d.pick(&POLICY_NAMESPACES), d.pick(&POLICY_NAMES)))
        .collect();
    let second = batch(&mut d, 3);

    let mut delta1 = delta(&first);
    delta1.upsert_workloads.push(workload.clone());
    let mut delta2 = delta(&second);
    delta2.remove_policies = removed.clone();
    let stepwise = applied(&applied(&Snapshot::empty(), delta1), delta2);

    // The set the two deltas leave: removals first, then upserts.
    let mut set: BTreeMap<String, Item> = first.into_iter().map(|i| (i.key(), i)).collect();
    for k in &removed {
        set.remove(k);
    }
    for i in second {
        set.insert(i.key(), i);
    }
    let items: Vec<Item> = set.values().cloned().collect();
    let mut whole = delta(&items);
    whole.upsert_workloads.push(workload.clone());
    let fresh = applied(&Snapshot::empty(), whole);
    assert_eq!(
        stepwise.policy_count(),
        set.len(),
        "policies after two deltas"
    );
    let policies = selected(&set, &workload);
    let refs: Vec<&Policy> = policies.iter().collect();

    let stored = stepwise.workload_by_uid("w").expect("the workload").clone();
    for _ in 0..1 + d.below(3) {
        let peer = d.bit().then(|| identity(&mut d));
        let src = ip(&mut d);
        let dst = SocketAddr::new(ip(&mut d), port(&mut d));
        let conn = Conn {
            src,
            dst,
            peer: peer.as_ref(),
        };
        let (verdict, reports) = decide(&stepwise, &stored, &conn);
        let (again, again_reports) = decide(&fresh, &workload, &conn);
        assert_eq!(verdict, again, "two deltas and one decide alike");
        assert_eq!(reports, again_reports, "dry-run reports after two deltas");

        let (want, want_reports) = reference::authorize(&refs, &conn);
        assert_eq!(
            verdict,
            describe_ref(&want),
            "compiled and reference disagree"
        );
        let want_reports: Vec<String> = want_reports
            .iter()
            .map(|r| match r {
                RefDryRun::DenyMatch(k) => format!("dry-run: deny policy match {k}"),
                RefDryRun::AllowMatch(k) => format!("dry-run: allow policy match {k}"),
                RefDryRun::NoAllowMatch => "dry-run: no allow policies match".into(),
            })
            .collect();
        assert_eq!(reports, want_reports, "dry-run reports disagree");

        let enforced = |action| {
            policies
                .iter()
                .filter(move |p| p.action == action && !p.dry_run)
        };
        if enforced(PolicyAction::Deny).any(|p| reference::policy_matches(p, &conn)) {
            assert!(!verdict.0, "a matching DENY always wins");
        }
        if enforced(PolicyAction::Allow).next().is_some()
            && !enforced(PolicyAction::Allow).any(|p| reference::policy_matches(p, &conn))
        {
            assert!(!verdict.0, "ALLOW policies apply and none matched");
        }
    }
}

/// Seeds for [`decide_all`]: byte strings laid out after its draws,
/// aimed at the table tests' shapes (no policy; an ALLOW by namespace; a
/// global DENY by principal; an ALLOW by CIDR and port; a dry run beside
/// an unreadable policy; a policy replaced in the second delta), each
/// followed by connections. Any bytes are a valid input: these only start
/// the fuzzer near real configurations. Named for the files
/// `RINGWAY_FUZZ_SEEDS` writes.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    // The draws, in order: workload namespace, the names it lists, the
    // first batch (count, then per policy: namespace, name, flags, scope,
    // rules → clauses → matches (mask, fields)), removals, the second
    // batch, then connections.
    let conns: &[u8] = &[2, 1, 0, 0, 0, 1, 0, 0, 3, 4, 1, 0, 0, 0];
    let policies: [(&str, Vec<u8>); 6] = [
        ("none", vec![0, 0, 0, 0, 0]),
        (
            "allow-namespace",
            vec![0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0x00, 0x01, 0, 0, 0, 0, 0],
        ),
        (
            "deny-principal",
            vec![0, 0, 1, 2, 1, 2, 1, 1, 1, 1, 0x00, 0x04, 0, 1, 8, 0, 0],
        ),
        (
            "allow-cidr-port",
            vec![
                0, 1, 0, 0, 1, 0, 0, 0, 2, 1, 1, 1, 0x04, 0x40, 0, 0, 8, 0, 1, 0, 0,
            ],
        ),
        (
            "dry-run-and-unreadable",
            vec![
                0, 0, 2, 0, 1, 3, 0, 1, 1, 1, 0x00, 0x04, 0, 3, 1, 2, 0x0e, 0, 0,
            ],
        ),
        (
            "replaced",
            vec![
                0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 1, 1, 0, 1, 0, 0,
            ],
        ),
    ];
    policies
        .into_iter()
        .map(|(name, mut bytes)| {
            bytes.extend_from_slice(conns);
            (format!("seed-{name}"), bytes)
        })
        .collect()
}
