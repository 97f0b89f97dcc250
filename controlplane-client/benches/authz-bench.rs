//! `authz-bench`: what one authorization decision costs with 10,000
//! policies of 10 rules each applying to the destination workload, through
//! the compiled evaluator (`Snapshot::authorize`, what the data path calls)
//! and through the plain reference evaluator (`authz::reference`), in the
//! same run.
//!
//! The mesh is the shape of ztunnel's own RBAC benchmark: every policy is
//! GLOBAL and DENY, each rule one clause with one match on namespaces and
//! principals (a prefix, a suffix and an exact string each), source and
//! destination 198.51.100.0/24 and destination port 0. No policy matches
//! the benchmark's connections, so a decision walks every rule of every
//! policy and ends "no allow policies, allowed".
//!
//! Shapes (one row each):
//! - `plaintext`: 127.0.0.1 → 127.0.0.2:12345, no peer identity;
//! - `mTLS`: the same with a peer identity, so string checks could run;
//! - `mTLS, strings decide`: addresses and port inside every rule, so only
//!   the namespace and principal checks fail (every string check runs);
//! - `early deny`: the first policy in evaluation order matches the
//!   plaintext connection (the best case).
//!
//! Each shape alternates compiled and reference over `ROUNDS` rounds (the
//! order flips every round), each timing a batch of at least 200 ms; the
//! table shows medians over rounds and reference ÷ compiled. Both
//! evaluators must agree on every shape before anything is timed. Also
//! measured: building the snapshot (compiling and indexing the policies)
//! and the heap it holds, counted exactly by a counting allocator.
//!
//! Prints a Markdown table, then one line of JSON.
//!
//! Run: `cargo bench -p ringway-controlplane --bench authz-bench`
//! (`-- --quick` for fewer, shorter rounds; `-- --policies N` for another
//! policy count, e.g. one whose compiled form fits in the CPU caches).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ringway_benchkit::{
    fmt_dur, fmt_ns, live_bytes, median, median_duration, ns_per_call, Counting,
};
use ringway_controlplane::model::authz::reference::{self, RefVerdict};
use ringway_controlplane::model::authz::{Conn, Verdict};
use ringway_controlplane::model::snapshot::Snapshot;
use ringway_controlplane::model::{
    Cidr, Clause, Match, Policy, PolicyAction, PolicyScope, Rule, StringMatch, Workload,
};
use ringway_controlplane::Identity;
use serde_json::json;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// ztunnel's shape; `--policies N` for another count.
const POLICIES: usize = 10_000;
const RULES: usize = 10;
/// Where istiod puts GLOBAL policies (its root namespace).
const ROOT_NAMESPACE: &str = "istio-system";
/// The destination workload's namespace, and the peer's.
const NAMESPACE: &str = "default";
const PEER: &str = "spiffe://cluster.local/ns/default/sa/default";

// ---------------------------------------------------------------------------
// The policies
// ---------------------------------------------------------------------------

fn strings() -> Vec<StringMatch> {
    vec![
        StringMatch::Prefix("random-prefix-2b123".into()),
        StringMatch::Suffix("random-postix-2b723".into()),
        StringMatch::Exact("random-exac-2bc13".into()),
    ]
}

/// 198.51.100.0/24 (TEST-NET-2).
fn test_net() -> Cidr {
    Cidr::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0)), 24).unwrap()
}

fn one_match(m: Match) -> Rule {
    Rule {
        clauses: vec![Clause { matches: vec![m] }],
    }
}

/// Matches no connection of the benchmark.
fn bench_rule() -> Rule {
    one_match(Match {
        namespaces: strings(),
        principals: strings(),
        source_ips: vec![test_net()],
        destination_ips: vec![test_net()],
        destination_ports: vec![0],
        ..Match::default()
    })
}

fn bench_policy(i: usize) -> Policy {
    Policy {
        // Zero-padded: the snapshot orders a namespace's policies by key,
        // so policy 0 is evaluated first.
        name: format!("policy-{i:05}"),
        namespace: ROOT_NAMESPACE.into(),
        scope: PolicyScope::Global,
        action: PolicyAction::Deny,
        dry_run: false,
        rules: vec![bench_rule(); RULES],
    }
}

/// The benchmark's policies; with `early_deny`, the first one denies every
/// connection from 127.0.0.0/8 instead.
fn policies(n: usize, early_deny: bool) -> Vec<Policy> {
    let mut v: Vec<Policy> = (0..n).map(bench_policy).collect();
    if early_deny {
        let loopback = Cidr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8).unwrap();
        v[0].rules = vec![one_match(Match {
            source_ips: vec![loopback],
            ..Match::default()
        })];
    }
    v
}

fn workload() -> Workload {
    Workload {
        uid: "Kubernetes//Pod/default/bench".into(),
        name: "bench".into(),
        namespace: NAMESPACE.into(),
        ..Workload::default()
    }
}

// ---------------------------------------------------------------------------
// Measurement
// ---------------------------------------------------------------------------

struct Settings {
    policies: usize,
    rounds: usize,
    batch: Duration,
    builds: usize,
}

struct Shape {
    name: &'static str,
    early_deny: bool,
    src: IpAddr,
    dst: SocketAddr,
    peer: bool,
}

struct Row {
    shape: &'static str,
    verdict: String,
    /// Policies that apply to the workload (both evaluators look at each,
    /// though after an enforced denial only for its action and dry-run
    /// flag).
    selected: usize,
    compiled_ns: f64,
    reference_ns: f64,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.reference_ns / self.compiled_ns
    }
}

/// Whether both evaluators reached the same decision.
fn same(v: &Verdict<'_>, r: &RefVerdict) -> bool {
    match (v, r) {
        (Verdict::AllowedNoPolicies, RefVerdict::AllowedNoPolicies)
        | (Verdict::NotAllowed, RefVerdict::NotAllowed) => true,
        (Verdict::AllowedBy(p), RefVerdict::AllowedBy(k))
        | (Verdict::DeniedBy(p), RefVerdict::DeniedBy(k)) => p.key() == k,
        _ => false,
    }
}

fn median_ns(v: &[f64]) -> f64 {
    median(v).expect("at least one round")
}

fn measure(snap: &Snapshot, shape: &Shape, peer: &Identity, s: &Settings) -> Row {
    let w = snap
        .workload_by_uid(&workload().uid)
        .expect("the bench workload");
    let conn = Conn {
        src: shape.src,
        dst: shape.dst,
        peer: shape.peer.then_some(peer),
    };
    // The reference gets the model policies in the compiled evaluator's
    // order: the workload's namespace's, then the global ones (it names
    // none).
    let selected = snap.policies_for(w);
    assert!(w.authorization_policies.is_empty());
    // The reference splits by action itself and keeps the order within
    // each action, so each list's parts can come one after the other.
    let refs: Vec<&Policy> = [selected.namespace, selected.global]
        .iter()
        .flat_map(|lists| lists.deny.iter().chain(lists.allow))
        .map(|l| &**snap.policy(l.policy().key()).expect("a readable policy"))
        .collect();

    let mut dry_runs = 0;
    let verdict = snap.authorize(w, &conn, &mut |_| dry_runs += 1);
    let (expected, ref_dry_runs) = reference::authorize(&refs, &conn);
    assert!(
        same(&verdict, &expected),
        "{}: compiled {verdict} but reference {expected:?}",
        shape.name
    );
    assert_eq!(
        (dry_runs, ref_dry_runs.len()),
        (0, 0),
        "no dry-run policies"
    );
    let want_deny = shape.early_deny.then(|| refs[0].key());
    assert_eq!(
        verdict.policy().map(str::to_string),
        want_deny,
        "{}: {verdict}",
        shape.name
    );

    let mut compiled = Vec::with_capacity(s.rounds);
    let mut plain = Vec::with_capacity(s.rounds);
    for round in 0..s.rounds {
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                compiled.push(ns_per_call(s.batch, || {
                    let v = black_box(snap).authorize(black_box(w), black_box(&conn), &mut |d| {
                        black_box(d);
                    });
                    black_box(v);
                }));
            } else {
                plain.push(ns_per_call(s.batch, || {
                    black_box(reference::authorize(black_box(&refs), black_box(&conn)));
                }));
            }
        }
    }
    Row {
        shape: shape.name,
        verdict: verdict.to_string(),
        selected: refs.len(),
        compiled_ns: median_ns(&compiled),
        reference_ns: median_ns(&plain),
    }
}

/// Snapshot build time (median) and heap bytes: the policies as the
/// source hands them over, and the snapshot that owns them.
struct Build {
    time: Duration,
    payload_bytes: isize,
    snapshot_bytes: isize,
}

fn measure_build(policies: &[Policy], builds: usize) -> Build {
    let mut samples = Vec::with_capacity(builds);
    for _ in 0..builds {
        let (w, p) = (workload(), policies.to_vec());
        let start = Instant::now();
        let snap = Snapshot::new(vec![w], vec![], p).expect("valid mesh");
        samples.push(start.elapsed());
        drop(black_box(snap));
    }
    let base = live_bytes();
    let p = policies.to_vec();
    let payload_bytes = live_bytes() - base;
    let snap = Snapshot::new(vec![workload()], vec![], p).expect("valid mesh");
    let snapshot_bytes = live_bytes() - base;
    drop(snap);
    Build {
        time: median_duration(&samples),
        payload_bytes,
        snapshot_bytes,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let policy_count = std::env::args()
        .skip_while(|a| a != "--policies")
        .nth(1)
        .map_or(POLICIES, |n| n.parse().expect("--policies N"));
    assert!(policy_count > 0, "--policies N: at least 1");
    let s = if quick {
        Settings {
            policies: policy_count,
            rounds: 3,
            batch: Duration::from_millis(50),
            builds: 3,
        }
    } else {
        Settings {
            policies: policy_count,
            rounds: 5,
            batch: Duration::from_millis(200),
            builds: 5,
        }
    };
    let peer: Identity = PEER.parse().expect("a SPIFFE id");
    let loopback = |last| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
    let inside = |last| IpAddr::V4(Ipv4Addr::new(198, 51, 100, last));
    let shapes = [
        Shape {
            name: "plaintext",
            early_deny: false,
            src: loopback(1),
            dst: SocketAddr::new(loopback(2), 12345),
            peer: false,
        },
        Shape {
            name: "mTLS",
            early_deny: false,
            src: loopback(1),
            dst: SocketAddr::new(loopback(2), 12345),
            peer: true,
        },
        Shape {
            name: "mTLS, strings decide",
            early_deny: false,
            src: inside(1),
            dst: SocketAddr::new(inside(2), 0),
            peer: true,
        },
        Shape {
            name: "early deny",
            early_deny: true,
            src: loopback(1),
            dst: SocketAddr::new(loopback(2), 12345),
            peer: false,
        },
    ];

    let no_match = policies(s.policies, false);
    let build = measure_build(&no_match, s.builds);
    let snaps = [false, true].map(|early| {
        Snapshot::new(vec![workload()], vec![], policies(s.policies, early)).expect("valid mesh")
    });
    drop(no_match);

    let rows: Vec<Row> = shapes
        .iter()
        .map(|shape| {
            let row = measure(&snaps[shape.early_deny as usize], shape, &peer, &s);
            eprintln!(
                "{:<22} compiled {:>9}  reference {:>9}  ({:.1}×)",
                row.shape,
                fmt_ns(row.compiled_ns),
                fmt_ns(row.reference_ns),
                row.ratio()
            );
            row
        })
        .collect();

    println!(
        "Authorization decision cost: {} GLOBAL DENY policies × {RULES} rules \
         on one workload; medians of {} alternating rounds, batches ≥ {}.\n",
        s.policies,
        s.rounds,
        fmt_dur(s.batch)
    );
    println!(
        "| shape | decision | policies selected | compiled ns/decision | reference ns/decision | reference ÷ compiled | compiled ns per selected policy |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.1}× | {:.2} |",
            r.shape,
            r.verdict,
            r.selected,
            r.compiled_ns,
            r.reference_ns,
            r.ratio(),
            r.compiled_ns / r.selected as f64,
        );
    }
    println!(
        "\nSnapshot with the {} policies and one workload: built (compiled and indexed) \
         in {} (median of {}); heap {:.1} MiB, of which the model policies {:.1} MiB \
         ({:.0} B per policy in all, {:.0} B compiled form and index).",
        s.policies,
        fmt_dur(build.time),
        s.builds,
        build.snapshot_bytes as f64 / (1 << 20) as f64,
        build.payload_bytes as f64 / (1 << 20) as f64,
        build.snapshot_bytes as f64 / s.policies as f64,
        (build.snapshot_bytes - build.payload_bytes) as f64 / s.policies as f64,
    );
    let summary = json!({
        "bench": "authz",
        "policies": s.policies,
        "rules_per_policy": RULES,
        "rounds": s.rounds,
        "shapes": rows.iter().map(|r| json!({
            "shape": r.shape,
            "decision": r.verdict,
            "compiled_ns": r.compiled_ns.round(),
            "reference_ns": r.reference_ns.round(),
            "reference_over_compiled": (r.ratio() * 100.0).round() / 100.0,
        })).collect::<Vec<_>>(),
        "build_ms": build.time.as_secs_f64() * 1e3,
        "snapshot_bytes": build.snapshot_bytes,
        "model_bytes": build.payload_bytes,
    });
    println!("\n{summary}");
}
