//! Table tests: one row per behaviour, each decided by the compiled
//! evaluator and by the reference, which must agree with the row and with
//! each other.

use std::net::SocketAddr;
use std::sync::Arc;

use super::reference::{self, RefDryRun, RefVerdict};
use super::*;
use crate::model::{
    Cidr, Clause, Match, Policy, PolicyAction, PolicyScope, Rule, ServiceAccountMatch, StringMatch,
    UnreadablePolicy,
};

const ALICE: &str = "spiffe://cluster.local/ns/a/sa/alice";
const BOB: &str = "spiffe://cluster.local/ns/b/sa/bob";

fn id(s: &str) -> Identity {
    s.parse().unwrap()
}

/// A namespace-scoped policy in `ns` from rules → clauses → matches.
pub(super) fn policy(name: &str, action: PolicyAction, rules: Vec<Vec<Vec<Match>>>) -> Policy {
    Policy {
        name: name.into(),
        namespace: "ns".into(),
        scope: PolicyScope::Namespace,
        action,
        dry_run: false,
        rules: rules
            .into_iter()
            .map(|clauses| Rule {
                clauses: clauses
                    .into_iter()
                    .map(|matches| Clause { matches })
                    .collect(),
            })
            .collect(),
    }
}

/// One rule, one clause, these matches (OR).
fn allow(name: &str, matches: Vec<Match>) -> Policy {
    policy(name, PolicyAction::Allow, vec![vec![matches]])
}

fn deny(name: &str, matches: Vec<Match>) -> Policy {
    policy(name, PolicyAction::Deny, vec![vec![matches]])
}

fn dry(mut p: Policy) -> Policy {
    p.dry_run = true;
    p
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}
fn prefix(s: &str) -> StringMatch {
    StringMatch::Prefix(s.into())
}
fn suffix(s: &str) -> StringMatch {
    StringMatch::Suffix(s.into())
}
fn cidr(s: &str) -> Cidr {
    let (ip, len) = s.split_once('/').unwrap();
    Cidr::new(ip.parse().unwrap(), len.parse().unwrap()).unwrap()
}
fn sa(ns: &str, name: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: ns.into(),
        service_account: name.into(),
    }
}

/// A connection: `src` IP, `dst` ip:port, peer identity (or plaintext).
struct Probe {
    src: &'static str,
    dst: &'static str,
    peer: Option<&'static str>,
}

const FROM_ALICE: Probe = Probe {
    src: "10.0.1.5",
    dst: "10.0.2.7:8080",
    peer: Some(ALICE),
};
const FROM_BOB: Probe = Probe {
    src: "10.0.1.6",
    dst: "10.0.2.7:8080",
    peer: Some(BOB),
};
const PLAINTEXT: Probe = Probe {
    src: "192.168.9.9",
    dst: "10.0.2.7:8080",
    peer: None,
};

/// What a row expects: allowed or not, and the deciding policy's name.
#[derive(Debug, PartialEq)]
enum Want {
    AllowNone,
    AllowBy(&'static str),
    DenyBy(&'static str),
    NotAllowed,
}

impl Want {
    fn describe(&self) -> String {
        match self {
            Want::AllowNone => "allow (no allow policies)".into(),
            Want::AllowBy(n) => format!("allow by ns/{n}"),
            Want::DenyBy(n) => format!("deny by ns/{n}"),
            Want::NotAllowed => "deny (none allowed)".into(),
        }
    }
}

fn describe(v: &Verdict<'_>) -> String {
    match v {
        Verdict::AllowedNoPolicies => "allow (no allow policies)".into(),
        Verdict::AllowedBy(p) => format!("allow by {}", p.key()),
        Verdict::DeniedBy(p) | Verdict::DeniedUnreadable(p) => format!("deny by {}", p.key()),
        Verdict::NotAllowed => "deny (none allowed)".into(),
    }
}

fn describe_ref(v: &RefVerdict) -> String {
    match v {
        RefVerdict::AllowedNoPolicies => "allow (no allow policies)".into(),
        RefVerdict::AllowedBy(k) => format!("allow by {k}"),
        RefVerdict::DeniedBy(k) => format!("deny by {k}"),
        RefVerdict::NotAllowed => "deny (none allowed)".into(),
    }
}

/// Decides with both evaluators (which must agree); returns the verdict
/// described like [`Want::describe`] and the dry-run reports.
fn decide(policies: &[Policy], probe: &Probe) -> (String, Vec<String>) {
    let compiled: Vec<Arc<CompiledPolicy>> = policies
        .iter()
        .map(|p| Arc::new(CompiledPolicy::compile(p)))
        .collect();
    let lists = listed(&compiled);
    let selected = Selected {
        namespace: lists.by_action(),
        global: ByAction::default(),
        named: &[],
        table: &Vec::new(),
    };
    let peer = probe.peer.map(id);
    let conn = Conn {
        src: probe.src.parse().unwrap(),
        dst: probe.dst.parse::<SocketAddr>().unwrap(),
        peer: peer.as_ref(),
    };
    let mut reports = Vec::new();
    let verdict = authorize(&selected, &conn, &mut |d| reports.push(d.to_string()));
    let got = describe(&verdict);

    let refs: Vec<&Policy> = policies.iter().collect();
    let (ref_verdict, ref_reports) = reference::authorize(&refs, &conn);
    assert_eq!(
        got,
        describe_ref(&ref_verdict),
        "compiled and reference disagree"
    );
    let ref_reports: Vec<String> = ref_reports
        .iter()
        .map(|r| match r {
            RefDryRun::DenyMatch(k) => format!("dry-run: deny policy match {k}"),
            RefDryRun::AllowMatch(k) => format!("dry-run: allow policy match {k}"),
            RefDryRun::NoAllowMatch => "dry-run: no allow policies match".into(),
        })
        .collect();
    assert_eq!(reports, ref_reports, "dry-run reports disagree");
    (got, reports)
}

/// A list as the snapshot indexes it: split by action, order kept.
struct Lists {
    deny: Vec<Listed>,
    allow: Vec<Listed>,
}

impl Lists {
    fn by_action(&self) -> ByAction<'_> {
        ByAction {
            deny: &self.deny,
            allow: &self.allow,
        }
    }
}

fn listed(policies: &[Arc<CompiledPolicy>]) -> Lists {
    let (deny, allow) = policies
        .iter()
        .cloned()
        .map(Listed::new)
        .partition(|l| l.policy().action() == PolicyAction::Deny);
    Lists { deny, allow }
}

fn check(rows: Vec<(&str, Vec<Policy>, Probe, Want)>) {
    for (what, policies, probe, want) in rows {
        let (got, _) = decide(&policies, &probe);
        assert_eq!(got, want.describe(), "row: {what}");
    }
}

#[test]
fn no_policies_allow() {
    check(vec![
        ("mTLS", vec![], FROM_ALICE, Want::AllowNone),
        ("plaintext", vec![], PLAINTEXT, Want::AllowNone),
    ]);
}

#[test]
fn every_field_and_its_negation() {
    let m = Match::default;
    let rows = vec![
        // principals (spiffe:// stripped)
        (
            "principal exact hit",
            vec![allow(
                "p",
                vec![Match {
                    principals: vec![exact("cluster.local/ns/a/sa/alice")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowBy("p"),
        ),
        (
            "principal exact miss",
            vec![allow(
                "p",
                vec![Match {
                    principals: vec![exact("cluster.local/ns/a/sa/alice")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::NotAllowed,
        ),
        (
            "principal with spiffe:// never matches",
            vec![allow(
                "p",
                vec![Match {
                    principals: vec![exact(ALICE)],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::NotAllowed,
        ),
        (
            "not_principals hit denies",
            vec![deny(
                "d",
                vec![Match {
                    not_principals: vec![exact("cluster.local/ns/a/sa/alice")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::DenyBy("d"),
        ),
        (
            "not_principals miss",
            vec![deny(
                "d",
                vec![Match {
                    not_principals: vec![exact("cluster.local/ns/a/sa/alice")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        // namespaces: from the identity, not the source pod
        (
            "namespace hit",
            vec![allow(
                "p",
                vec![Match {
                    namespaces: vec![exact("b")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::AllowBy("p"),
        ),
        (
            "namespace miss",
            vec![allow(
                "p",
                vec![Match {
                    namespaces: vec![exact("b")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::NotAllowed,
        ),
        (
            "not_namespaces",
            vec![deny(
                "d",
                vec![Match {
                    not_namespaces: vec![exact("a")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::DenyBy("d"),
        ),
        (
            "not_namespaces excludes",
            vec![deny(
                "d",
                vec![Match {
                    not_namespaces: vec![exact("a")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        // service accounts: (namespace, name) of the identity
        (
            "service account hit",
            vec![allow(
                "p",
                vec![Match {
                    service_accounts: vec![sa("a", "alice")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowBy("p"),
        ),
        (
            "service account needs both parts",
            vec![allow(
                "p",
                vec![Match {
                    service_accounts: vec![sa("b", "alice")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::NotAllowed,
        ),
        (
            "not_service_accounts",
            vec![deny(
                "d",
                vec![Match {
                    not_service_accounts: vec![sa("a", "alice")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::DenyBy("d"),
        ),
        (
            "not_service_accounts excludes",
            vec![deny(
                "d",
                vec![Match {
                    not_service_accounts: vec![sa("a", "alice")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        // source IPs
        (
            "source CIDR hit",
            vec![allow(
                "p",
                vec![Match {
                    source_ips: vec![cidr("10.0.1.0/24")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowBy("p"),
        ),
        (
            "source CIDR miss",
            vec![allow(
                "p",
                vec![Match {
                    source_ips: vec![cidr("10.0.1.0/24")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::NotAllowed,
        ),
        (
            "not_source_ips",
            vec![deny(
                "d",
                vec![Match {
                    not_source_ips: vec![cidr("10.0.0.0/8")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::DenyBy("d"),
        ),
        (
            "not_source_ips excludes",
            vec![deny(
                "d",
                vec![Match {
                    not_source_ips: vec![cidr("10.0.0.0/8")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "source host /32",
            vec![deny(
                "d",
                vec![Match {
                    source_ips: vec![cidr("10.0.1.6/32")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::DenyBy("d"),
        ),
        // destination IPs
        (
            "destination CIDR hit",
            vec![deny(
                "d",
                vec![Match {
                    destination_ips: vec![cidr("10.0.2.0/24")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "destination CIDR miss",
            vec![deny(
                "d",
                vec![Match {
                    destination_ips: vec![cidr("10.0.3.0/24")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "not_destination_ips",
            vec![deny(
                "d",
                vec![Match {
                    not_destination_ips: vec![cidr("10.0.3.0/24")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "v6 CIDR never matches v4",
            vec![deny(
                "d",
                vec![Match {
                    destination_ips: vec![cidr("::/0")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        // destination ports
        (
            "port hit",
            vec![deny(
                "d",
                vec![Match {
                    destination_ports: vec![8080],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "port miss",
            vec![deny(
                "d",
                vec![Match {
                    destination_ports: vec![9090],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "not_destination_ports",
            vec![deny(
                "d",
                vec![Match {
                    not_destination_ports: vec![9090],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "not_destination_ports excludes",
            vec![deny(
                "d",
                vec![Match {
                    not_destination_ports: vec![8080],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        // several fields in one match: all must hold
        (
            "fields AND: all hold",
            vec![deny(
                "d",
                vec![Match {
                    destination_ports: vec![8080],
                    namespaces: vec![exact("b")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::DenyBy("d"),
        ),
        (
            "fields AND: one fails",
            vec![deny(
                "d",
                vec![Match {
                    destination_ports: vec![8080],
                    namespaces: vec![exact("b")],
                    ..m()
                }],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "positive and negative of one field",
            vec![deny(
                "d",
                vec![Match {
                    source_ips: vec![cidr("10.0.0.0/8")],
                    not_source_ips: vec![cidr("10.0.1.6/32")],
                    ..m()
                }],
            )],
            FROM_BOB,
            Want::AllowNone,
        ),
    ];
    check(rows);
}

#[test]
fn string_match_kinds() {
    let m = Match::default;
    let p = |s: StringMatch| {
        vec![allow(
            "p",
            vec![Match {
                principals: vec![s],
                ..m()
            }],
        )]
    };
    check(vec![
        (
            "prefix",
            p(prefix("cluster.local/ns/a/")),
            FROM_ALICE,
            Want::AllowBy("p"),
        ),
        (
            "prefix miss",
            p(prefix("cluster.local/ns/a/")),
            FROM_BOB,
            Want::NotAllowed,
        ),
        ("suffix", p(suffix("/sa/bob")), FROM_BOB, Want::AllowBy("p")),
        (
            "suffix miss",
            p(suffix("/sa/bob")),
            FROM_ALICE,
            Want::NotAllowed,
        ),
        (
            "wildcard prefix",
            p(prefix("")),
            FROM_ALICE,
            Want::AllowBy("p"),
        ),
        (
            "presence",
            p(StringMatch::Presence),
            FROM_BOB,
            Want::AllowBy("p"),
        ),
        (
            "exact of the whole principal only",
            p(exact("cluster.local/ns/a")),
            FROM_ALICE,
            Want::NotAllowed,
        ),
    ]);
}

#[test]
fn plaintext_has_no_identity() {
    let m = Match::default;
    check(vec![
        (
            "no principal matches, not even prefix \"\"",
            vec![allow(
                "p",
                vec![Match {
                    principals: vec![prefix("")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::NotAllowed,
        ),
        (
            "presence fails",
            vec![allow(
                "p",
                vec![Match {
                    principals: vec![StringMatch::Presence],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::NotAllowed,
        ),
        (
            "service accounts never match",
            vec![allow(
                "p",
                vec![Match {
                    service_accounts: vec![sa("", "")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::NotAllowed,
        ),
        (
            "namespace is \"\": an empty prefix matches (as in ztunnel)",
            vec![allow(
                "p",
                vec![Match {
                    namespaces: vec![prefix("")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::AllowBy("p"),
        ),
        (
            "namespace presence fails",
            vec![allow(
                "p",
                vec![Match {
                    namespaces: vec![StringMatch::Presence],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::NotAllowed,
        ),
        (
            "source IP rules still apply",
            vec![allow(
                "p",
                vec![Match {
                    source_ips: vec![cidr("192.168.0.0/16")],
                    ..m()
                }],
            )],
            PLAINTEXT,
            Want::AllowBy("p"),
        ),
    ]);
}

/// istiod's policy for STRICT PeerAuthentication (pilot's
/// `istio_converted_static_strict`), with and without a port exception.
#[test]
fn strict_mtls() {
    let m = Match::default;
    let strict = || {
        deny(
            "istio_converted_static_strict",
            vec![Match {
                not_principals: vec![StringMatch::Presence],
                ..m()
            }],
        )
    };
    let strict_but_8080 = || {
        deny(
            "istio_converted_static_strict",
            vec![Match {
                not_principals: vec![StringMatch::Presence],
                not_destination_ports: vec![8080],
                ..m()
            }],
        )
    };
    check(vec![
        (
            "plaintext refused",
            vec![strict()],
            PLAINTEXT,
            Want::DenyBy("istio_converted_static_strict"),
        ),
        ("mTLS passes", vec![strict()], FROM_ALICE, Want::AllowNone),
        (
            "port exception lets plaintext in",
            vec![strict_but_8080()],
            PLAINTEXT,
            Want::AllowNone,
        ),
        (
            "port exception only for its port",
            vec![strict_but_8080()],
            Probe {
                dst: "10.0.2.7:9090",
                ..PLAINTEXT
            },
            Want::DenyBy("istio_converted_static_strict"),
        ),
    ]);
}

#[test]
fn deny_wins_over_allow_and_first_match_decides() {
    let m = Match::default;
    let alice = || Match {
        principals: vec![exact("cluster.local/ns/a/sa/alice")],
        ..m()
    };
    check(vec![
        (
            "deny over allow",
            vec![allow("a", vec![alice()]), deny("d", vec![alice()])],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "first deny in order names the denial",
            vec![deny("d1", vec![alice()]), deny("d2", vec![alice()])],
            FROM_ALICE,
            Want::DenyBy("d1"),
        ),
        (
            "any allow match allows",
            vec![
                allow(
                    "a1",
                    vec![Match {
                        namespaces: vec![exact("zzz")],
                        ..m()
                    }],
                ),
                allow("a2", vec![alice()]),
            ],
            FROM_ALICE,
            Want::AllowBy("a2"),
        ),
        (
            "allow exists, no match",
            vec![allow("a", vec![alice()])],
            FROM_BOB,
            Want::NotAllowed,
        ),
    ]);
}

#[test]
fn rule_structure() {
    let m = Match::default;
    let alice = || Match {
        principals: vec![exact("cluster.local/ns/a/sa/alice")],
        ..m()
    };
    let port = |p| Match {
        destination_ports: vec![p],
        ..m()
    };
    check(vec![
        (
            "no rules never match (allow)",
            vec![policy("a", PolicyAction::Allow, vec![])],
            FROM_ALICE,
            Want::NotAllowed,
        ),
        (
            "no rules never match (deny)",
            vec![policy("d", PolicyAction::Deny, vec![])],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "a rule without clauses matches everything",
            vec![policy("d", PolicyAction::Deny, vec![vec![]])],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "a clause without matches holds",
            vec![policy(
                "d",
                PolicyAction::Deny,
                vec![vec![vec![], vec![port(8080)]]],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "an empty match never matches",
            vec![deny("d", vec![Match::default()])],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "an empty match beside a real one",
            vec![deny("d", vec![Match::default(), port(8080)])],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "clauses AND",
            vec![policy(
                "d",
                PolicyAction::Deny,
                vec![vec![vec![alice()], vec![port(9090)]]],
            )],
            FROM_ALICE,
            Want::AllowNone,
        ),
        (
            "clauses AND, all hold",
            vec![policy(
                "d",
                PolicyAction::Deny,
                vec![vec![vec![alice()], vec![port(8080)]]],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "rules OR",
            vec![policy(
                "d",
                PolicyAction::Deny,
                vec![vec![vec![port(9090)]], vec![vec![alice()]]],
            )],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
        (
            "matches OR",
            vec![deny("d", vec![port(9090), alice()])],
            FROM_ALICE,
            Want::DenyBy("d"),
        ),
    ]);
}

#[test]
fn dry_run_only_reports() {
    let m = Match::default;
    let alice = || Match {
        principals: vec![exact("cluster.local/ns/a/sa/alice")],
        ..m()
    };
    let (got, reports) = decide(&[dry(deny("d", vec![alice()]))], &FROM_ALICE);
    assert_eq!(got, Want::AllowNone.describe());
    assert_eq!(reports, ["dry-run: deny policy match ns/d"]);

    let (got, reports) = decide(&[dry(allow("a", vec![alice()]))], &FROM_BOB);
    assert_eq!(
        got,
        Want::AllowNone.describe(),
        "a dry-run allow is not an allow policy"
    );
    assert_eq!(reports, ["dry-run: no allow policies match"]);

    let (got, reports) = decide(&[dry(allow("a", vec![alice()]))], &FROM_ALICE);
    assert_eq!(got, Want::AllowNone.describe());
    assert_eq!(reports, ["dry-run: allow policy match ns/a"]);

    // Every dry-run deny match is reported, even after a real denial.
    let (got, reports) = decide(
        &[
            deny("d", vec![alice()]),
            dry(deny("d2", vec![alice()])),
            dry(deny("d3", vec![alice()])),
        ],
        &FROM_ALICE,
    );
    assert_eq!(got, Want::DenyBy("d").describe());
    assert_eq!(
        reports,
        [
            "dry-run: deny policy match ns/d2",
            "dry-run: deny policy match ns/d3"
        ]
    );

    // A real allow beside a dry-run one that misses: nothing to report.
    let (got, reports) = decide(
        &[
            allow("a", vec![alice()]),
            dry(allow(
                "b",
                vec![Match {
                    namespaces: vec![exact("zzz")],
                    ..m()
                }],
            )),
        ],
        &FROM_ALICE,
    );
    assert_eq!(got, Want::AllowBy("a").describe());
    assert!(reports.is_empty(), "{reports:?}");
}

#[test]
fn mapped_ipv4_is_ipv4() {
    let m = Match::default;
    let p = vec![deny(
        "d",
        vec![Match {
            source_ips: vec![cidr("10.0.0.0/8")],
            ..m()
        }],
    )];
    let (got, _) = decide(
        &p,
        &Probe {
            src: "::ffff:10.1.2.3",
            ..PLAINTEXT
        },
    );
    assert_eq!(got, Want::DenyBy("d").describe());
}

#[test]
fn unreadable_policies_deny_and_never_widen() {
    let ok = Arc::new(CompiledPolicy::compile(&allow(
        "open",
        vec![Match {
            destination_ports: vec![8080],
            ..Match::default()
        }],
    )));
    let unreadable = |name: &str, scope, dry_run, error: &str| {
        Arc::new(CompiledPolicy::unreadable(&UnreadablePolicy {
            namespace: "ns".into(),
            name: name.into(),
            scope,
            dry_run,
            error: error.into(),
        }))
    };
    let broken = unreadable(
        "bad",
        Some(PolicyScope::Global),
        false,
        "rules[0].clauses[0].matches[0]: source_ips[0]: prefix length 40 exceeds 32",
    );
    let broken_dry = unreadable("bad-dry", None, true, "undecodable");
    let conn = Conn {
        src: "10.0.1.5".parse().unwrap(),
        dst: "10.0.2.7:8080".parse().unwrap(),
        peer: None,
    };
    let decide = |list: &[Arc<CompiledPolicy>]| {
        let lists = listed(list);
        let sel = Selected {
            namespace: lists.by_action(),
            global: ByAction::default(),
            named: &[],
            table: &Vec::new(),
        };
        let mut reports = vec![];
        let v = authorize(&sel, &conn, &mut |d| reports.push(d.to_string()));
        (v.to_string(), v.allowed(), reports)
    };
    let (why, allowed, _) = decide(&[ok.clone(), broken.clone()]);
    assert!(
        !allowed,
        "an unreadable policy must deny even next to an allow that matches"
    );
    assert!(
        why.starts_with("denied: policy ns/bad could not be read (rules[0]"),
        "{why}"
    );
    assert_eq!(broken.action(), PolicyAction::Deny);
    assert_eq!(broken.index_namespace(), Some(""), "global");
    // Dry run: reported, not enforced; unknown scope indexes by namespace.
    let (_, allowed, reports) = decide(&[ok.clone(), broken_dry.clone()]);
    assert!(allowed);
    assert_eq!(reports, ["dry-run: deny policy match ns/bad-dry"]);
    assert_eq!(broken_dry.index_namespace(), Some("ns"));
}

#[test]
fn selection_order_is_namespace_global_named() {
    let m = Match::default;
    let c = |p: Policy| Arc::new(CompiledPolicy::compile(&p));
    let ns = vec![c(deny(
        "in-ns",
        vec![Match {
            destination_ports: vec![8080],
            ..m()
        }],
    ))];
    let global = vec![c(deny(
        "global",
        vec![Match {
            destination_ports: vec![8080],
            ..m()
        }],
    ))];
    let named_policy = c(deny(
        "named",
        vec![Match {
            destination_ports: vec![8080],
            ..m()
        }],
    ));
    let named: Vec<Str> = vec!["ns/missing".into(), "ns/named".into()];
    let table = vec![named_policy];
    let conn = Conn {
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2:8080".parse().unwrap(),
        peer: None,
    };
    let decide = |ns: &[Arc<CompiledPolicy>], global: &[Arc<CompiledPolicy>]| {
        let (ns, global) = (listed(ns), listed(global));
        let sel = Selected {
            namespace: ns.by_action(),
            global: global.by_action(),
            named: &named,
            table: &table,
        };
        authorize(&sel, &conn, &mut |_| {}).to_string()
    };
    assert_eq!(decide(&ns, &global), "explicitly denied by ns/in-ns");
    assert_eq!(decide(&[], &global), "explicitly denied by ns/global");
    assert_eq!(decide(&[], &[]), "explicitly denied by ns/named");
}
