//! `snapshot-bench`: what a configuration [`Snapshot`] costs to build, to
//! update by delta, to keep in memory and to look things up in, on synthetic
//! meshes shaped like a large Kubernetes cluster (10k services; 10k and 100k
//! pods, each backing one service through one port mapping).
//!
//! Memory is counted exactly by a counting global allocator (bytes live on
//! the heap, see `ringway_benchkit`), not sampled from RSS. Times
//! are medians of repeated runs. Prints a Markdown table.
//!
//! Run: `cargo bench -p ringway-controlplane --bench snapshot-bench`
//! (`-- --quick` for fewer repetitions).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ringway_benchkit::{fmt_dur, live_bytes, median_duration as median, Counting};
use ringway_controlplane::model::snapshot::{Snapshot, SnapshotDelta};
use ringway_controlplane::model::{
    Locality, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload,
};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

// ---------------------------------------------------------------------------
// Synthetic mesh
// ---------------------------------------------------------------------------

const SERVICES: usize = 10_000;
const NAMESPACES: usize = 100;

fn namespace(i: usize) -> String {
    format!("ns-{}", i % NAMESPACES)
}

fn service_hostname(s: usize) -> String {
    format!("svc-{s}.{}.svc.cluster.local", namespace(s))
}

fn service_key(s: usize) -> String {
    format!("{}/{}", namespace(s), service_hostname(s))
}

/// 10.96.0.0/12, like a cluster's service CIDR.
fn vip(s: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a60_0000u32 + s as u32 + 1))
}

/// 10.0.0.0/12, like a cluster's pod CIDR; `generation` moves a pod.
fn pod_ip(i: usize, generation: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        0x0a00_0000u32 + generation * 0x0020_0000 + i as u32 + 1,
    ))
}

fn service(s: usize) -> Service {
    let ns = namespace(s);
    Service {
        name: format!("svc-{s}").into(),
        hostname: service_hostname(s).into(),
        vips: vec![NetworkAddress {
            network: String::new().into(),
            ip: vip(s),
        }],
        ports: vec![PortMapping {
            service_port: 80,
            target_port: 8080,
        }],
        subject_alt_names: vec![],
        namespace: ns.into(),
        ..Service::default()
    }
}

/// A pod as istiod describes it: ~45-char uid, names, one IPv4, one service
/// with one port mapping, node, locality. Pod `i` backs service `i % 10k`.
fn workload(i: usize, generation: u32) -> Workload {
    let s = i % SERVICES;
    let ns = namespace(s);
    let app = format!("svc-{s}");
    let pod = format!("{app}-7d9f8c6b5-{:05x}", i & 0xfffff);
    Workload {
        uid: format!("Kubernetes//Pod/{ns}/{pod}").into(),
        name: pod.into(),
        service_account: app.clone().into(),
        addresses: vec![pod_ip(i, generation)].into(),
        protocol: TunnelProtocol::Hbone,
        node: format!("node-{:04}.cluster.internal", i % 1000).into(),
        canonical_name: app.clone().into(),
        canonical_revision: "v1".into(),
        workload_name: app.into(),
        cluster_id: "Kubernetes".into(),
        services: BTreeMap::from([(
            service_key(s),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        )])
        .into(),
        locality: Some(Locality {
            region: "us-east-1".into(),
            zone: format!("us-east-1{}", ['a', 'b', 'c'][i % 3]).into(),
            subzone: String::new().into(),
        }),
        namespace: ns.into(),
        ..Workload::default()
    }
}

// ---------------------------------------------------------------------------
// Measurement helpers
// ---------------------------------------------------------------------------

/// xorshift64*: deterministic lookup keys without a rand dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Median ns per lookup over `rounds` passes of `keys.len()` random keys.
fn per_lookup<K>(keys: &[K], rounds: usize, mut f: impl FnMut(&K) -> usize) -> f64 {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let mut hits = 0usize;
        for k in keys {
            hits += f(k);
        }
        black_box(hits);
        samples.push(start.elapsed());
    }
    median(&samples).as_nanos() as f64 / keys.len() as f64
}

struct Row {
    workloads: usize,
    build: Duration,
    payload_per_workload: f64,
    snapshot_per_workload: f64,
    upsert_new: Duration,
    upsert_move: Duration,
    remove: Duration,
    /// Adding a pod to a service with 10k endpoints (its endpoint list is
    /// rebuilt).
    big_service: Duration,
    /// 4096 distinct keys, looked up over and over: the indexes' touched
    /// parts stay in cache.
    hot: [f64; 4],
    /// 256k random keys per pass: mostly cache misses.
    cold: [f64; 4],
}

/// ns per lookup for `workload_by_addr`, `service_by_vip`, `endpoints` and
/// `services_by_hostname`, on `keys` random keys that all hit. Each lookup
/// reads the result (a field of the workload, the endpoint count) as a
/// caller would.
fn lookups(snap: &Snapshot, n: usize, keys: usize, rounds: usize) -> [f64; 4] {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let addr_keys: Vec<IpAddr> = (0..keys).map(|_| pod_ip(rng.below(n), 0)).collect();
    let vip_keys: Vec<IpAddr> = (0..keys).map(|_| vip(rng.below(SERVICES))).collect();
    let svc_keys: Vec<String> = (0..keys)
        .map(|_| service_key(rng.below(SERVICES)))
        .collect();
    let host_keys: Vec<String> = (0..keys)
        .map(|_| service_hostname(rng.below(SERVICES)))
        .collect();
    [
        per_lookup(&addr_keys, rounds, |ip| {
            snap.workload_by_addr("", *ip)
                .map_or(0, |w| w.addresses.len())
        }),
        per_lookup(&vip_keys, rounds, |ip| {
            snap.service_by_vip("", *ip).map_or(0, |s| s.ports.len())
        }),
        per_lookup(&svc_keys, rounds, |k| snap.endpoints(k).len()),
        per_lookup(&host_keys, rounds, |h| snap.services_by_hostname(h).len()),
    ]
}

fn measure(n: usize, quick: bool) -> Row {
    let builds = if quick { 3 } else { 7 };
    let deltas = if quick { 201 } else { 2001 };
    let lookup_rounds = if quick { 5 } else { 21 };

    let workloads: Vec<Workload> = (0..n).map(|i| workload(i, 0)).collect();
    let services: Vec<Service> = (0..SERVICES).map(service).collect();
    // Memory: the model payload alone (measured on clones, whose strings
    // have no spare capacity), then the snapshot built from them (which
    // owns that payload).
    let base = live_bytes();
    let (w, s) = (workloads.clone(), services.clone());
    let payload = live_bytes() - base;
    let snap = Snapshot::new(w, s, vec![]).expect("valid mesh");
    let held = live_bytes() - base;
    let services_only = {
        let b = live_bytes();
        let s = Snapshot::new(vec![], services.clone(), vec![]).unwrap();
        let bytes = live_bytes() - b;
        drop(s);
        bytes
    };
    let payload_services: isize = {
        let b = live_bytes();
        let v: Vec<Service> = services.clone();
        let bytes = live_bytes() - b;
        drop(v);
        bytes
    };
    let payload_workloads = payload - payload_services;
    let snapshot_workloads = held - services_only;

    // Full build: inputs cloned outside the timed region.
    let mut samples = Vec::new();
    for _ in 0..builds {
        let (w, s) = (workloads.clone(), services.clone());
        let start = Instant::now();
        let built = Snapshot::new(w, s, vec![]).expect("valid mesh");
        samples.push(start.elapsed());
        drop(black_box(built));
    }
    let build = median(&samples);

    let (upsert_new, upsert_move, remove) = measure_deltas(&snap, n, deltas);
    let hot = lookups(&snap, n, 4096, lookup_rounds);
    let cold = lookups(&snap, n, 1 << 18, lookup_rounds.div_ceil(4));
    drop(snap);
    let big_service = measure_big_service(workloads, services, deltas);

    Row {
        workloads: n,
        build,
        payload_per_workload: payload_workloads as f64 / n as f64,
        snapshot_per_workload: snapshot_workloads as f64 / n as f64,
        upsert_new,
        upsert_move,
        remove,
        big_service,
        hot,
        cold,
    }
}

/// One-workload deltas on `snap`: add a new pod, move an existing pod to a
/// new address, remove an existing pod. The resulting snapshots are dropped
/// outside the timed region (the publisher drops the old one later, off the
/// critical path).
fn measure_deltas(snap: &Snapshot, n: usize, runs: usize) -> (Duration, Duration, Duration) {
    let mut rng = Rng(42);
    let mut time = |make: &mut dyn FnMut(usize) -> SnapshotDelta| {
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let delta = make(rng.below(n));
            let start = Instant::now();
            let out = snap.apply(delta);
            samples.push(start.elapsed());
            assert!(out.rejected.is_empty(), "{:?}", out.rejected[0].error);
            drop(black_box(out));
        }
        median(&samples)
    };
    let upsert_new = time(&mut |i| SnapshotDelta {
        upsert_workloads: vec![workload(n + i, 1)],
        ..SnapshotDelta::default()
    });
    let upsert_move = time(&mut |i| SnapshotDelta {
        upsert_workloads: vec![workload(i, 2)],
        ..SnapshotDelta::default()
    });
    let remove = time(&mut |i| SnapshotDelta {
        remove_workloads: vec![workload(i, 0).uid.to_string()],
        ..SnapshotDelta::default()
    });
    (upsert_new, upsert_move, remove)
}

/// The worst case for a one-pod delta: the pod backs a service with
/// `BIG_SERVICE` endpoints, whose sorted endpoint list is rebuilt.
fn measure_big_service(
    mut workloads: Vec<Workload>,
    services: Vec<Service>,
    runs: usize,
) -> Duration {
    const BIG_SERVICE: usize = 10_000;
    let n = workloads.len();
    let ports = vec![PortMapping {
        service_port: 80,
        target_port: 8080,
    }];
    for w in workloads.iter_mut().take(BIG_SERVICE) {
        w.services = BTreeMap::from([(service_key(0), ports.clone())]).into();
    }
    let snap = Snapshot::new(workloads, services, vec![]).expect("valid mesh");
    assert!(snap.endpoints(&service_key(0)).len() >= BIG_SERVICE.min(n));
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        let mut w = workload(n + i, 1);
        w.services = BTreeMap::from([(service_key(0), ports.clone())]).into();
        let delta = SnapshotDelta {
            upsert_workloads: vec![w],
            ..SnapshotDelta::default()
        };
        let start = Instant::now();
        let out = snap.apply(delta);
        samples.push(start.elapsed());
        assert!(out.rejected.is_empty());
        drop(black_box(out));
    }
    median(&samples)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: Vec<usize> = std::env::args()
        .skip_while(|a| a != "--workloads")
        .nth(1)
        .map(|s| {
            s.split(',')
                .map(|n| n.parse().expect("--workloads N[,N...]"))
                .collect()
        })
        .unwrap_or_else(|| vec![10_000, 100_000]);

    let rows: Vec<Row> = sizes.iter().map(|&n| measure(n, quick)).collect();

    println!("Snapshot costs, {SERVICES} services, medians:\n");
    println!(
        "| workloads | full build | delta: add 1 | delta: move 1 | delta: remove 1 | \
         full / slowest of those | delta: add 1 to a 10k-endpoint service | \
         model bytes/workload | snapshot bytes/workload | index overhead/workload |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let worst = r.upsert_new.max(r.upsert_move).max(r.remove);
        println!(
            "| {} | {} | {} | {} | {} | {:.0}× | {} ({:.0}×) | {:.0} B | {:.0} B | {:.0} B |",
            r.workloads,
            fmt_dur(r.build),
            fmt_dur(r.upsert_new),
            fmt_dur(r.upsert_move),
            fmt_dur(r.remove),
            r.build.as_secs_f64() / worst.as_secs_f64(),
            fmt_dur(r.big_service),
            r.build.as_secs_f64() / r.big_service.as_secs_f64(),
            r.payload_per_workload,
            r.snapshot_per_workload,
            r.snapshot_per_workload - r.payload_per_workload,
        );
    }
    // Where the model's bytes go (the snapshot cannot shrink these).
    let one = workload(1, 0);
    let services_map = {
        let b = live_bytes();
        let m = black_box(one.services.clone());
        let bytes = live_bytes() - b;
        drop(m);
        bytes
    };
    println!(
        "\nModel payload per workload: `Arc<Workload>` {} B inline, of which the \
         one-entry `services` list allocates {services_map} B \
         including its key and port mapping; the strings and address allocate the rest.",
        std::mem::size_of::<Workload>() + 16,
    );
    println!(
        "\nData-path lookups, ns per lookup (random keys, all hits; hot: 4096 keys \
         reused, cached; cold: 256k keys, mostly cache misses):\n"
    );
    println!(
        "| workloads | keys | workload_by_addr | service_by_vip | endpoints(key) | services_by_hostname |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    for r in &rows {
        for (name, [a, v, e, h]) in [("hot", r.hot), ("cold", r.cold)] {
            println!(
                "| {} | {name} | {a:.0} | {v:.0} | {e:.0} | {h:.0} |",
                r.workloads
            );
        }
    }
}
