//! Property: the compiled authorization evaluator decides exactly like the
//! plain reference evaluator: same verdict, same deciding policy, same
//! dry-run reports, on random policies and random connections.
//!
//! The values are drawn from small pools (a few identities, addresses,
//! ports and strings that overlap with them) so that random policies
//! actually match random connections in every field, positively and
//! negatively, with and without a peer identity.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use proptest::prelude::*;
use ringway_controlplane::model::authz::reference::{self, RefDryRun, RefVerdict};
use ringway_controlplane::model::authz::{
    authorize, ByAction, CompiledPolicy, Conn, Listed, Selected, Verdict,
};
use ringway_controlplane::model::{
    Cidr, Clause, Match, Policy, PolicyAction, PolicyScope, Rule, ServiceAccountMatch, StringMatch,
};
use ringway_controlplane::Identity;

const IDENTITIES: &[&str] = &[
    "spiffe://cluster.local/ns/a/sa/alice",
    "spiffe://cluster.local/ns/b/sa/bob",
    "spiffe://cluster.local/ns/a/sa/bob",
    "spiffe://other.td/ns/b/sa/carol",
];
const ADDRESSES: &[&str] = &[
    "10.0.1.5",
    "10.0.1.6",
    "10.0.2.7",
    "192.168.9.9",
    "2001:db8::5",
    "2001:db8:1::7",
    "::ffff:10.0.1.5",
];
const PORTS: &[u16] = &[8080, 9090, 15008, 1];
/// Ports in policies: the probes' and two more, so that a rule's port set
/// can outgrow what a prefilter keeps inline (4).
const POLICY_PORTS: &[u16] = &[8080, 9090, 15008, 1, 2, 3];
/// Pieces of the identities above (and of nothing), for string matches.
const STRINGS: &[&str] = &[
    "",
    "a",
    "b",
    "alice",
    "bob",
    "cluster.local",
    "cluster.local/",
    "cluster.local/ns/a/sa/alice",
    "cluster.local/ns/b/sa/bob",
    "cluster.local/ns/a/",
    "/sa/bob",
    "sa/bob",
    "other.td/ns/b/sa/carol",
    "spiffe://cluster.local/ns/a/sa/alice",
    "ns/a",
];

fn string_match() -> impl Strategy<Value = StringMatch> {
    let s = prop::sample::select(STRINGS).prop_map(str::to_owned);
    prop_oneof![
        s.clone().prop_map(StringMatch::Exact),
        s.clone().prop_map(StringMatch::Prefix),
        s.prop_map(StringMatch::Suffix),
        Just(StringMatch::Presence),
    ]
}

fn cidr() -> impl Strategy<Value = Cidr> {
    (prop::sample::select(ADDRESSES), 0u8..=128).prop_map(|(a, len)| {
        let ip: IpAddr = a.parse().unwrap();
        let max = if ip.is_ipv4() { 32 } else { 128 };
        // Favour long prefixes (hosts and small nets) over /0.
        let len = max - (len % (max + 1)) / 4;
        Cidr::new(ip, len).unwrap()
    })
}

fn account() -> impl Strategy<Value = ServiceAccountMatch> {
    (
        prop::sample::select(&["a", "b", ""][..]),
        prop::sample::select(&["alice", "bob", "carol", ""][..]),
    )
        .prop_map(|(ns, sa)| ServiceAccountMatch {
            namespace: ns.into(),
            service_account: sa.into(),
        })
}

/// Mostly empty lists, sometimes one or two entries.
fn few<T: std::fmt::Debug + Clone>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Vec<T>> {
    prop_oneof![
        4 => Just(Vec::new()),
        2 => prop::collection::vec(s, 1..=2),
    ]
}

fn a_match() -> impl Strategy<Value = Match> {
    let ports = || few(prop::sample::select(POLICY_PORTS));
    (
        (few(string_match()), few(string_match())),
        (few(string_match()), few(string_match())),
        (few(account()), few(account())),
        (few(cidr()), few(cidr())),
        (few(cidr()), few(cidr())),
        (ports(), ports()),
    )
        .prop_map(|(ns, pr, sa, src, dst, port)| Match {
            namespaces: ns.0,
            not_namespaces: ns.1,
            principals: pr.0,
            not_principals: pr.1,
            service_accounts: sa.0,
            not_service_accounts: sa.1,
            source_ips: src.0,
            not_source_ips: src.1,
            destination_ips: dst.0,
            not_destination_ips: dst.1,
            destination_ports: port.0,
            not_destination_ports: port.1,
        })
}

/// A match narrowed the way the compiler's prefilter can use: exact
/// principals, exact namespaces and destination ports, from pools that hit
/// the probes' identities and ports (so a wrong prefilter shows).
fn narrow_match() -> impl Strategy<Value = Match> {
    const PRINCIPALS: &[&str] = &[
        "cluster.local/ns/a/sa/alice",
        "cluster.local/ns/b/sa/bob",
        "cluster.local/ns/a/sa/bob",
        "other.td/ns/b/sa/carol",
        "cluster.local/ns/z/sa/nobody",
    ];
    let exact = |pool: &'static [&'static str]| {
        prop_oneof![
            1 => Just(Vec::new()),
            3 => prop::collection::vec(
                prop::sample::select(pool).prop_map(|s| StringMatch::Exact(s.into())),
                1..=3,
            ),
        ]
    };
    (
        exact(PRINCIPALS),
        exact(&["a", "b", "z", ""]),
        prop::collection::vec(prop::sample::select(POLICY_PORTS), 0..=5),
    )
        .prop_map(|(principals, namespaces, destination_ports)| Match {
            principals,
            namespaces,
            destination_ports,
            ..Match::default()
        })
}

fn policy(i: usize) -> impl Strategy<Value = Policy> {
    let any_match = prop_oneof![a_match(), narrow_match()];
    let clause = prop::collection::vec(any_match, 0..=3).prop_map(|matches| Clause { matches });
    let rule = prop::collection::vec(clause, 0..=2).prop_map(|clauses| Rule { clauses });
    (
        // Up to 6 rules: beyond 3 the prefilter merges alternatives.
        prop::collection::vec(rule, 0..=6),
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(move |(rules, deny, dry_run)| Policy {
            name: format!("p{i}"),
            namespace: "ns".into(),
            scope: PolicyScope::Namespace,
            action: if deny {
                PolicyAction::Deny
            } else {
                PolicyAction::Allow
            },
            dry_run,
            rules,
        })
}

fn policies() -> impl Strategy<Value = Vec<Policy>> {
    (0usize..=6).prop_flat_map(|n| (0..n).map(policy).collect::<Vec<_>>())
}

#[derive(Debug, Clone)]
struct Probe {
    src: IpAddr,
    dst: SocketAddr,
    peer: Option<Identity>,
}

fn probe() -> impl Strategy<Value = Probe> {
    (
        prop::sample::select(ADDRESSES),
        prop::sample::select(ADDRESSES),
        prop::sample::select(PORTS),
        prop::option::weighted(0.7, prop::sample::select(IDENTITIES)),
    )
        .prop_map(|(src, dst, port, peer)| Probe {
            src: src.parse().unwrap(),
            dst: SocketAddr::new(dst.parse().unwrap(), port),
            peer: peer.map(|p| p.parse().unwrap()),
        })
}

fn describe(v: &Verdict<'_>) -> String {
    match v {
        Verdict::AllowedNoPolicies => "allow".into(),
        Verdict::AllowedBy(p) => format!("allow {}", p.key()),
        Verdict::DeniedBy(p) | Verdict::DeniedUnreadable(p) => format!("deny {}", p.key()),
        Verdict::NotAllowed => "deny".into(),
    }
}

fn describe_ref(v: &RefVerdict) -> String {
    match v {
        RefVerdict::AllowedNoPolicies => "allow".into(),
        RefVerdict::AllowedBy(k) => format!("allow {k}"),
        RefVerdict::DeniedBy(k) => format!("deny {k}"),
        RefVerdict::NotAllowed => "deny".into(),
    }
}

proptest! {
    // 10k cases a run; failures are printed (shrunk), never written into
    // the source tree.
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn compiled_agrees_with_reference(policies in policies(), probes in prop::collection::vec(probe(), 1..=4)) {
        let compiled: Vec<Arc<CompiledPolicy>> =
            policies.iter().map(|p| Arc::new(CompiledPolicy::compile(p))).collect();
        // Split between the namespace list, the global list and the
        // workload's own names, to exercise all three selections.
        let third = compiled.len() / 3;
        let named: Vec<ringway_controlplane::model::Str> =
            compiled[2 * third..].iter().map(|p| p.key().into()).collect();
        let table = compiled.clone();
        // As the snapshot indexes them: each list split by action.
        let split = |part: &[Arc<CompiledPolicy>]| -> (Vec<Listed>, Vec<Listed>) {
            part.iter()
                .cloned()
                .map(Listed::new)
                .partition(|l| l.policy().action() == PolicyAction::Deny)
        };
        let (ns, global) = (split(&compiled[..third]), split(&compiled[third..2 * third]));
        let selected = Selected {
            namespace: ByAction { deny: &ns.0, allow: &ns.1 },
            global: ByAction { deny: &global.0, allow: &global.1 },
            named: &named,
            table: &table,
        };
        let refs: Vec<&Policy> = policies.iter().collect();
        for probe in &probes {
            let conn = Conn { src: probe.src, dst: probe.dst, peer: probe.peer.as_ref() };
            let mut reports = Vec::new();
            let verdict = authorize(&selected, &conn, &mut |d| reports.push(d.to_string()));
            let (ref_verdict, ref_reports) = reference::authorize(&refs, &conn);
            let ref_reports: Vec<String> = ref_reports
                .iter()
                .map(|r| match r {
                    RefDryRun::DenyMatch(k) => format!("dry-run: deny policy match {k}"),
                    RefDryRun::AllowMatch(k) => format!("dry-run: allow policy match {k}"),
                    RefDryRun::NoAllowMatch => "dry-run: no allow policies match".into(),
                })
                .collect();
            prop_assert_eq!(describe(&verdict), describe_ref(&ref_verdict), "{:?}", probe);
            prop_assert_eq!(verdict.allowed(), ref_verdict.allowed());
            prop_assert_eq!(reports, ref_reports, "{:?}", probe);
        }
    }
}

/// The pools above do produce every outcome: a property that only ever
/// saw "allow" would prove nothing.
#[test]
fn random_cases_cover_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut allow_none, mut allow_by, mut deny_by, mut not_allowed, mut dry) = (0, 0, 0, 0, 0);
    for _ in 0..2_000 {
        let policies = policies().new_tree(&mut runner).unwrap().current();
        let probe = probe().new_tree(&mut runner).unwrap().current();
        let refs: Vec<&Policy> = policies.iter().collect();
        let conn = Conn {
            src: probe.src,
            dst: probe.dst,
            peer: probe.peer.as_ref(),
        };
        let (v, reports) = reference::authorize(&refs, &conn);
        match v {
            RefVerdict::AllowedNoPolicies => allow_none += 1,
            RefVerdict::AllowedBy(_) => allow_by += 1,
            RefVerdict::DeniedBy(_) => deny_by += 1,
            RefVerdict::NotAllowed => not_allowed += 1,
        }
        dry += usize::from(!reports.is_empty());
    }
    for (what, n) in [
        ("allowed, no policies", allow_none),
        ("allowed by a policy", allow_by),
        ("denied by a policy", deny_by),
        ("not allowed", not_allowed),
        ("dry-run reports", dry),
    ] {
        assert!(n >= 50, "only {n} of 2000 random cases were {what}");
    }
}
