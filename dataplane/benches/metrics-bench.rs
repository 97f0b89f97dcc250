//! `metrics-bench`: what Istio's TCP metrics cost, with 10,000 label sets
//! (100 source × 100 destination workloads) on each core:
//!
//! - per connection, finding its label set (`CoreMetrics::counters`, what
//!   every connection calls once), when the set exists (the usual case)
//!   and when it is new;
//! - per scrape, rendering everything (`MetricsHub::render`, on the
//!   control thread), with one core and with two cores holding the same
//!   sets (merged into one series each).
//!
//! Timings are medians over rounds of batches of at least 200 ms. Prints a
//! Markdown table, then one line of JSON.
//!
//! Run: `cargo bench -p ringway-dataplane --bench metrics-bench`.

use std::time::{Duration, Instant};

use ringway_controlplane::model::{Service, Workload};
use ringway_dataplane::telemetry::metrics::{ConnLabels, MetricsHub, ProcessStats, Reporter};

const SIDE: usize = 100;
const ROUNDS: usize = 7;

fn workload(kind: &str, i: usize) -> Workload {
    Workload {
        uid: format!("c1//v1/Pod/ns{}/{kind}-{i}", i % 10).into(),
        name: format!("{kind}-{i}-7d9f8c6b5-x2x4z").into(),
        namespace: format!("ns{}", i % 10).into(),
        service_account: format!("{kind}-{i}").into(),
        trust_domain: "cluster.local".into(),
        workload_name: format!("{kind}-{i}").into(),
        canonical_name: format!("{kind}-{i}").into(),
        canonical_revision: "v1".into(),
        cluster_id: "Kubernetes".into(),
        ..Workload::default()
    }
}

/// Median of `ROUNDS` rounds of `f` run in batches of at least 200 ms,
/// per call.
fn time_per_call(mut f: impl FnMut()) -> Duration {
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let (start, mut n) = (Instant::now(), 0u32);
        while start.elapsed() < Duration::from_millis(200) {
            f();
            n += 1;
        }
        rounds.push(start.elapsed() / n);
    }
    rounds.sort();
    rounds[ROUNDS / 2]
}

fn main() {
    let srcs: Vec<Workload> = (0..SIDE).map(|i| workload("client", i)).collect();
    let dsts: Vec<Workload> = (0..SIDE).map(|i| workload("server", i)).collect();
    let service = Service {
        name: "server".into(),
        namespace: "ns0".into(),
        hostname: "server.ns0.svc.cluster.local".into(),
        ..Service::default()
    };
    let labels = |s: usize, d: usize| ConnLabels {
        reporter: Reporter::Destination,
        src: Some(&srcs[s]),
        src_principal: None,
        dst: Some(&dsts[d]),
        dst_principal: None,
        service: Some(&service),
        mtls: true,
    };
    let hub = MetricsHub::default();
    let cores = [hub.core(true), hub.core(true)];
    // Fill every set on core 0, timing the inserts.
    let started = Instant::now();
    for s in 0..SIDE {
        for d in 0..SIDE {
            let c = cores[0].counters(&labels(s, d)).unwrap();
            c.opened.add(1);
            c.sent.add(1000);
        }
    }
    let insert = started.elapsed() / (SIDE * SIDE) as u32;
    let (mut s, mut d) = (0, 0);
    let hit = time_per_call(|| {
        s = (s + 7) % SIDE;
        d = (d + 13) % SIDE;
        std::hint::black_box(cores[0].counters(&labels(s, d)));
    });
    let process = ProcessStats {
        open_fds: 100,
        max_fds: 65536,
        log_lines_dropped: 0,
    };
    let mut size = 0;
    let scrape_one =
        time_per_call(|| size = std::hint::black_box(hub.render(&process, None)).len());
    for s in 0..SIDE {
        for d in 0..SIDE {
            cores[1].counters(&labels(s, d)).unwrap().opened.add(1);
        }
    }
    let mut size_two = 0;
    let scrape_two =
        time_per_call(|| size_two = std::hint::black_box(hub.render(&process, None)).len());

    println!("| {} label sets | cost |", SIDE * SIDE);
    println!("|---|---:|");
    println!(
        "| per connection, label set exists | {:.0} ns |",
        hit.as_nanos()
    );
    println!(
        "| per connection, new label set | {:.1} µs |",
        insert.as_secs_f64() * 1e6
    );
    println!(
        "| scrape, 1 core | {:.1} ms ({:.1} MiB) |",
        scrape_one.as_secs_f64() * 1e3,
        size as f64 / (1 << 20) as f64
    );
    println!(
        "| scrape, 2 cores with the same sets | {:.1} ms ({:.1} MiB) |",
        scrape_two.as_secs_f64() * 1e3,
        size_two as f64 / (1 << 20) as f64
    );
    println!(
        "{}",
        serde_json::json!({
            "label_sets": SIDE * SIDE,
            "lookup_hit_ns": hit.as_nanos() as u64,
            "lookup_new_ns": insert.as_nanos() as u64,
            "scrape_1core_ms": scrape_one.as_secs_f64() * 1e3,
            "scrape_2cores_ms": scrape_two.as_secs_f64() * 1e3,
            "scrape_bytes": size_two,
        })
    );
}
