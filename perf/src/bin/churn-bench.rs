//! `churn-bench`: the cost of mesh updates at scale (issue 14, deliverable
//! 3). A Delta ADS server in this process serves a mesh of N workloads and
//! M services to ringway (`--xds-address http://…`, `--cores 1`), then
//! pushes R changed workloads per second for D seconds, in ten pushes a
//! second: half of them pods replaced (the old uid removed, a new uid on a
//! new address added), half of them flipping health. It reports:
//!
//! - time to core: from a response's arrival at ringway to its core serving
//!   the snapshot built from it, read from ringway's
//!   `ringway_core_config_propagation_seconds` histogram (pushes during the
//!   churn only; the bucket bounds make the quantiles upper bounds);
//! - RSS before, during (max) and after the churn, and its growth;
//! - ringway's CPU during the churn (% of one CPU);
//! - NACKs (there must be none).
//!
//! ztunnel is not driven: its xDS client wants istiod's TLS and token, and
//! it exposes no per-core propagation time (docs/performance/mesh-at-scale.md
//! says so).
//!
//! Run: `cargo build --release -p ringway-dataplane -p ringway-perf --bin
//! ringway --bin churn-bench && target/release/churn-bench`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use ringway_controlplane::model::{
    PortMapping, Service, TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};
use ringway_controlplane::sources::xds::convert::{address_resource, AddressResource};
use ringway_perf::http::{get_json, get_ok};
use ringway_perf::procstat::{cpu_seconds, memory_status};
use ringway_perf::rig;
use ringway_perf::supervise::{bound_addr, tail, Spec, Supervised};
use ringway_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ringway_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

#[derive(Parser, Debug)]
#[command(about = "Mesh update cost at scale: time to core, memory and CPU under xDS churn")]
struct Args {
    /// Workloads in the mesh.
    #[arg(long, default_value_t = 100_000)]
    workloads: usize,
    /// Services in the mesh (workload i backs service i % services).
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Changed workloads per second.
    #[arg(long, default_value_t = 1000)]
    rate: usize,
    /// Seconds of churn.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Pushes per second (the rate is spread over them).
    #[arg(long, default_value_t = 10)]
    pushes_per_second: u64,
    /// The ringway binary (default: `ringway` beside this program).
    #[arg(long)]
    ringway: Option<PathBuf>,
    /// Where results go (results.md, results.json).
    #[arg(long, default_value = "churn-results")]
    out: PathBuf,
}

const NAMESPACES: usize = 100;
const CHUNK: usize = 5000;

fn namespace(s: usize) -> String {
    format!("ns-{}", s % NAMESPACES)
}

fn service_key(s: usize) -> String {
    format!(
        "{}/svc-{s}.{}.svc.cluster.local",
        namespace(s),
        namespace(s)
    )
}

/// Pod `i` of generation `generation` (a replaced pod gets a new uid and a
/// new address).
fn workload(i: usize, services: usize, generation: u32, healthy: bool) -> Workload {
    let s = i % services;
    let ns = namespace(s);
    let name = format!("svc-{s}-{generation:x}-{i:05x}");
    let ip = Ipv4Addr::from(0x0a00_0000u32 + (generation << 20) + i as u32 + 1);
    Workload {
        uid: format!("Kubernetes//Pod/{ns}/{name}").into(),
        name: name.as_str().into(),
        namespace: ns.as_str().into(),
        service_account: format!("svc-{s}").into(),
        addresses: [IpAddr::V4(ip)].into(),
        protocol: TunnelProtocol::Hbone,
        node: format!("node-{:04}.cluster.internal", i % 1000).into(),
        canonical_name: format!("svc-{s}").into(),
        canonical_revision: "v1".into(),
        workload_name: format!("svc-{s}").into(),
        workload_type: WorkloadType::Pod,
        status: if healthy {
            WorkloadStatus::Healthy
        } else {
            WorkloadStatus::Unhealthy
        },
        cluster_id: "Kubernetes".into(),
        services: [(
            service_key(s),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        )]
        .into(),
        ..Workload::default()
    }
}

fn service(s: usize) -> Service {
    let ns = namespace(s);
    Service {
        name: format!("svc-{s}").into(),
        namespace: ns.as_str().into(),
        hostname: format!("svc-{s}.{ns}.svc.cluster.local").into(),
        vips: vec![ringway_controlplane::model::NetworkAddress {
            network: "".into(),
            ip: IpAddr::V4(Ipv4Addr::from(0x0a60_0000u32 + s as u32 + 1)),
        }],
        ports: vec![PortMapping {
            service_port: 80,
            target_port: 8080,
        }],
        ..Service::default()
    }
}

fn resource(w: Workload, version: u64) -> Resource {
    address_resource(&AddressResource::Workload(w), version.to_string())
}

// ---------------------------------------------------------------------------
// The Delta ADS server
// ---------------------------------------------------------------------------

/// Serves one client: the initial mesh in chunks when it subscribes, then
/// whatever the bench pushes.
struct ChurnAds {
    initial: Mutex<Option<Vec<Resource>>>,
    pushes: Mutex<Option<mpsc::Receiver<DeltaDiscoveryResponse>>>,
    nacks: Arc<AtomicU64>,
    acks: Arc<AtomicU64>,
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

fn response(
    type_url: &str,
    nonce: u64,
    resources: Vec<Resource>,
    removed: Vec<String>,
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: String::new(),
        resources,
        type_url: type_url.to_owned(),
        nonce: nonce.to_string(),
        removed_resources: removed,
        control_plane: None,
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for ChurnAds {
    type StreamAggregatedResourcesStream = Stream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Stream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("delta only"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (Some(initial), Some(mut pushes)) = (
            self.initial.lock().unwrap().take(),
            self.pushes.lock().unwrap().take(),
        ) else {
            return Err(Status::unavailable("one stream per run"));
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let (nacks, acks) = (self.nacks.clone(), self.acks.clone());
        tokio::spawn(async move {
            let mut initial = Some(initial);
            let mut nonce = 0u64;
            loop {
                tokio::select! {
                    req = inbound.message() => {
                        let Ok(Some(req)) = req else { return };
                        if !req.response_nonce.is_empty() {
                            if req.error_detail.is_some() {
                                nacks.fetch_add(1, Ordering::Relaxed);
                                eprintln!("NACK: {:?}", req.error_detail);
                            } else {
                                acks.fetch_add(1, Ordering::Relaxed);
                            }
                            continue;
                        }
                        if req.type_url == ADDRESS_TYPE_URL {
                            let Some(all) = initial.take() else { continue };
                            let mut all = all.into_iter().peekable();
                            while all.peek().is_some() {
                                let chunk: Vec<Resource> = all.by_ref().take(CHUNK).collect();
                                nonce += 1;
                                if tx.send(Ok(response(ADDRESS_TYPE_URL, nonce, chunk, vec![]))).await.is_err() {
                                    return;
                                }
                            }
                        } else if req.type_url == AUTHORIZATION_TYPE_URL {
                            nonce += 1;
                            if tx.send(Ok(response(AUTHORIZATION_TYPE_URL, nonce, vec![], vec![]))).await.is_err() {
                                return;
                            }
                        }
                    }
                    push = pushes.recv() => {
                        let Some(mut push) = push else { return };
                        nonce += 1;
                        push.nonce = nonce.to_string();
                        if tx.send(Ok(push)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

// ---------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------

/// Cumulative counts of ringway's propagation histogram (its stats
/// listener's /metrics), by upper bound in seconds (+Inf last), summed
/// over cores.
fn propagation(stats: SocketAddr) -> anyhow::Result<Vec<(f64, u64)>> {
    let metrics = String::from_utf8(get_ok(stats, "/metrics", Duration::from_secs(10))?)?;
    // A bucket line's bound and count.
    let bucket = |line: &str| -> Option<(f64, u64)> {
        let rest = line.strip_prefix("ringway_core_config_propagation_seconds_bucket{")?;
        let (labels, count) = rest.split_once("} ")?;
        let le = labels.split("le=\"").nth(1)?.strip_suffix('"')?;
        let le = match le {
            "+Inf" => f64::INFINITY,
            _ => le.parse().unwrap_or(f64::NAN),
        };
        Some((le, count.trim().parse().unwrap_or(0)))
    };
    let mut by_le: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for (le, count) in metrics.lines().filter_map(bucket) {
        by_le.entry(le.to_bits()).or_insert((le, 0)).1 += count;
    }
    let mut v: Vec<_> = by_le.into_values().collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(v)
}

/// The smallest bucket bound under which at least `q` of the samples fall.
fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c as f64 >= q * total as f64)
        .map(|(le, _)| *le)
}

/// jemalloc's live heap bytes, from ringway's admin `/memory`.
fn allocated(admin: SocketAddr) -> anyhow::Result<u64> {
    get_json(admin, "/memory", Duration::from_secs(10))?["allocator"]["allocated"]
        .as_u64()
        .context("no allocator.allocated in /memory")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ringway = ringway_perf::ringway_bin(args.ringway.as_deref())?;
    let scratch = ringway_perf::nodes::Scratch::new("ringway-churn")?;
    let work = &scratch.0;
    let services = args.services.max(1);

    eprintln!(
        "building {} workloads and {services} services",
        args.workloads
    );
    let mut initial = Vec::with_capacity(args.workloads + services);
    for s in 0..services {
        let item = AddressResource::Service(service(s));
        initial.push(address_resource(&item, "1".into()));
    }
    for i in 0..args.workloads {
        initial.push(resource(workload(i, services, 0, true), 1));
    }

    let (push_tx, push_rx) = mpsc::channel(4);
    let nacks = Arc::new(AtomicU64::new(0));
    let acks = Arc::new(AtomicU64::new(0));
    let ads = ChurnAds {
        initial: Mutex::new(Some(initial)),
        pushes: Mutex::new(Some(push_rx)),
        nacks: nacks.clone(),
        acks: acks.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let xds_addr = listener.local_addr()?;
    rt.spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = AggregatedDiscoveryServiceServer::new(ads)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        if let Err(e) = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(server, incoming, std::future::pending())
            .await
        {
            eprintln!("ADS server: {e}");
        }
    });

    // ringway, one core, no local workload (no certificates to issue).
    let mut rw_args = vec!["--cores".into(), "1".into(), "--xds-address".into()];
    rw_args.push(format!("http://{xds_addr}"));
    rw_args.extend(["--node-name".into(), "node-absent.cluster.internal".into()]);
    rw_args.extend(["--ca-dir".into(), work.join("ca").display().to_string()]);
    rw_args.extend(rig::side_listener_args(&ringway)?);
    rw_args.extend(rig::listener_args(rig::ANY_PORT, rig::ANY_PORT));
    let spec = Spec::ringway(&ringway, "ringway", &rw_args, "warn", work)
        .healthz()
        .timeout(Duration::from_secs(180));
    let bound = spec.bound_file().expect("a ringway's").to_path_buf();
    let mut child = Supervised::start(None, spec)?;
    let log = child.log().to_path_buf();
    let pid = child.pid();
    let listener = |k: &str| bound_addr(&bound, k).with_context(|| format!("no {k} listener"));
    let (stats, admin) = (listener("stats")?, listener("admin")?);
    let ready_secs = child.startup.as_secs_f64();
    eprintln!("ringway ready in {ready_secs:.2} s");
    // As scale-bench's steady sample: 15 s after ready, once the pages
    // freed while loading have decayed.
    std::thread::sleep(Duration::from_secs(15));
    let before = memory_status(pid)?;
    let heap_before = allocated(admin)?;
    let buckets_before = propagation(stats)?;
    let cpu_before = cpu_seconds(pid)?;

    // Churn: pods 0, 1, 2, … in turn; even steps replace the pod, odd ones
    // flip its health.
    let per_push = (args.rate as u64 / args.pushes_per_second).max(1) as usize;
    let pushes = args.seconds * args.pushes_per_second;
    let interval = Duration::from_secs(1) / args.pushes_per_second as u32;
    let mut generation = vec![0u32; args.workloads];
    let mut healthy = vec![true; args.workloads];
    let mut next = 0usize;
    let mut version = 2u64;
    let mut rss_max = before["VmRSS"];
    let mut late = 0u64;
    // The live heap every 10 s of churn: growth that levels off is tables
    // and caches settling; growth that does not is a leak.
    let mut heap_series = Vec::new();
    let churn_start = Instant::now();
    for p in 0..pushes {
        let due = churn_start + interval * p as u32;
        match due.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None => late += 1,
        }
        let mut upserts = Vec::with_capacity(per_push);
        let mut removed = Vec::new();
        for k in 0..per_push {
            let i = next % args.workloads;
            next += 1;
            version += 1;
            if k % 2 == 0 {
                let old = workload(i, services, generation[i], healthy[i]);
                removed.push(old.uid.to_string());
                generation[i] = (generation[i] + 1) % 8;
            } else {
                healthy[i] = !healthy[i];
            }
            let w = workload(i, services, generation[i], healthy[i]);
            upserts.push(resource(w, version));
        }
        let msg = response(ADDRESS_TYPE_URL, 0, upserts, removed);
        if push_tx.blocking_send(msg).is_err() {
            bail!("the xDS stream ended:\n{}", tail(&log, 20));
        }
        if p % args.pushes_per_second == 0 {
            rss_max = rss_max.max(memory_status(pid)?["VmRSS"]);
        }
        if p % (10 * args.pushes_per_second) == 0 {
            heap_series.push(allocated(admin)?);
        }
    }
    let churn_secs = churn_start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let cpu_after = cpu_seconds(pid)?;
    rss_max = rss_max.max(memory_status(pid)?["VmRSS"]);
    // Settled as `before` was.
    std::thread::sleep(Duration::from_secs(13));
    let after = memory_status(pid)?;
    let heap_after = allocated(admin)?;
    heap_series.push(heap_after);
    let buckets_after = propagation(stats)?;
    child
        .check_alive()
        .context("ringway exited during the churn")?;
    let during: Vec<(f64, u64)> = buckets_after
        .iter()
        .map(|(le, c)| {
            let b = buckets_before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0, |(_, c)| *c);
            (*le, c - b)
        })
        .collect();
    let samples = during.last().map_or(0, |(_, c)| *c);
    let within_50ms = during
        .iter()
        .find(|(le, _)| (*le - 0.05).abs() < 1e-9)
        .map_or(0, |(_, c)| *c);
    let p50 = quantile(&during, 0.50);
    let p99 = quantile(&during, 0.99);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let show = |q: Option<f64>| q.map_or("–".into(), |s| format!("≤ {} ms", s * 1000.0));
    let cpu_percent = 100.0 * (cpu_after - cpu_before) / (churn_secs + 2.0);
    let nacks = nacks.load(Ordering::Relaxed);
    let md = format!(
        "xDS churn, `--cores 1`: {w} workloads / {s} services loaded in {ready_secs:.2} s, then \
         {rate} changed workloads/s ({per_push} per push, {pps} pushes/s; half replaced, half \
         health flips) for {secs:.0} s ({pushes} pushes, {late} sent late).\n\n\
         | time to core p50 | p99 | pushes served within 50 ms | RSS before | max during | after | growth | live heap growth | CPU during churn | NACKs |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {p50} | {p99} | {within_50ms} / {samples} ({frac:.1} %) | {b:.1} MiB | {m:.1} MiB | {a:.1} MiB | {g:+.1} MiB | {h:+.2} MiB | {cpu:.1} % of a CPU | {nacks} |\n\n\
         RSS before and after: 15 s after ready and after the churn; live heap: jemalloc's allocated bytes (admin /memory), \
         every 10 s of churn and after it: {series} MiB.\n",
        w = args.workloads,
        s = services,
        rate = args.rate,
        pps = args.pushes_per_second,
        secs = churn_secs,
        p50 = show(p50),
        p99 = show(p99),
        frac = if samples == 0 { 0.0 } else { 100.0 * within_50ms as f64 / samples as f64 },
        b = mib(before["VmRSS"]),
        m = mib(rss_max),
        a = mib(after["VmRSS"]),
        g = mib(after["VmRSS"]) - mib(before["VmRSS"]),
        h = (heap_after as f64 - heap_before as f64) / (1024.0 * 1024.0),
        series = heap_series
            .iter()
            .map(|b| format!("{:.1}", mib(*b)))
            .collect::<Vec<_>>()
            .join(", "),
        cpu = cpu_percent,
    );
    println!("{md}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("results.md"), &md)?;
    let j = json!({
        "workloads": args.workloads, "services": services, "rate": args.rate,
        "pushes": pushes, "per_push": per_push, "late_pushes": late,
        "ready_secs": ready_secs, "churn_secs": churn_secs,
        "propagation_buckets": during, "samples": samples, "within_50ms": within_50ms,
        "p50_upper_bound_secs": p50, "p99_upper_bound_secs": p99,
        "rss_before": before["VmRSS"], "rss_max": rss_max, "rss_after": after["VmRSS"],
        "heap_before": heap_before, "heap_after": heap_after, "heap_series": heap_series,
        "cpu_percent": cpu_percent, "nacks": nacks, "acks": acks.load(Ordering::Relaxed),
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&j)?,
    )?;
    drop(scratch);
    if nacks > 0 {
        bail!("ringway NACKed {nacks} pushes: see {}", log.display());
    }
    Ok(())
}
