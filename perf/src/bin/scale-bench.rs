//! `scale-bench`: what holding the whole mesh costs the *process*, ringway
//! beside Istio's ztunnel, loading the same LOCAL_XDS file (issue 14).
//!
//! For each mesh size (N HBONE workloads, each backing one of M services,
//! every service with one VIP and one port), it writes one YAML file in
//! ztunnel's LOCAL_XDS schema, which ringway's `--config` reads too, and
//! starts each variant on it, one at a time:
//!
//! * `ringway`: the release binary, `--cores 1 --config FILE`, every
//!   listener on 127.0.0.1:0, a CA directory of its own. No `--node-name`,
//!   so the local workloads are those at the host's addresses: none of the
//!   mesh's, and no certificate is issued at startup (each is fetched on
//!   its first connection; before issue 24, every identity's was issued).
//! * `ringway --node-name`: the same with `--node-name` naming a node no
//!   workload is on: no workload is local, no certificate is issued (a
//!   node of a real cluster holds a few of them).
//! * `ztunnel`: `ztunnel proxy` in dedicated mode with 1 worker thread
//!   (`FAKE_CA=true XDS_ADDRESS= LOCAL_XDS_PATH=FILE PROXY_MODE=dedicated
//!   ZTUNNEL_WORKER_THREADS=1`), speaking for the mesh's first workload,
//!   in a network namespace of its own (it binds fixed ports). Needs root.
//!
//! and reports, per variant and size: time to ready (process start to the
//! readiness endpoint answering 200; for ztunnel, to its log saying both
//! "local config initialized" and "marking server ready", since it says
//! ready before it has parsed the file), VmRSS 2 s and 15 s after ready
//! (ztunnel's allocator gives memory back about 12 s after load), peak
//! (VmHWM), and bytes per workload: (steady RSS − the same variant's
//! steady RSS on an empty mesh) / N. Ratios are ringway ÷ ztunnel. For
//! ringway it also reads jemalloc's counters from the admin endpoint's
//! `/memory` (allocated, active, resident, retained) when the binary has
//! it. After measuring, each proxy's `/config_dump` is counted, so a mesh
//! that a proxy did not (fully) load is an error, not a good number.
//!
//! Prints a Markdown table and writes `results.md` and `results.json` to
//! `--out` (default `scale-results/`). Meshes are generated under
//! `--work` (default a fresh folder in the temp dir) and deleted.
//!
//! Run: `scripts/scale-bench.sh` (builds, then runs this with root for the
//! ztunnel columns), or `target/release/scale-bench [--no-ztunnel]`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use ringway_benchkit::{live_bytes, peak_bytes, reset_peak, Counting};
use ringway_controlplane::security::ca::BuiltinCa;
use ringway_controlplane::security::certs;
use ringway_controlplane::sources::local;
use ringway_perf::http::{get_json, get_ok};
use ringway_perf::procstat::memory_status as proc_status;
use ringway_perf::rig::{self, Netns};
use ringway_perf::supervise::{bound_addr, Spec, Supervised};
use ringway_perf::ztunnel;
use serde_json::{json, Value};

/// Counts this process's heap, for the in-process accounting.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Parser, Debug)]
#[command(about = "Process memory and load time at mesh scale: ringway and ztunnel side by side")]
struct Args {
    /// Mesh sizes as WORKLOADS:SERVICES, comma-separated.
    #[arg(long, default_value = "20000:2000,100000:10000", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Variants to run: ringway, ringway-node, ztunnel, plus the accounting
    /// variants ringway-nodecay (jemalloc returns freed pages at once:
    /// `dirty_decay_ms:0,muzzy_decay_ms:0`) and ringway-bgthread (jemalloc's
    /// background thread purges on time: `background_thread:true`).
    #[arg(
        long,
        value_enum,
        default_value = "ringway,ringway-node,ztunnel",
        value_delimiter = ','
    )]
    variants: Vec<Kind>,
    /// Leave out ztunnel (no root needed then).
    #[arg(long)]
    no_ztunnel: bool,
    /// The ringway binary (default: `ringway` beside this program).
    #[arg(long)]
    ringway: Option<PathBuf>,
    /// The ztunnel binary (default: RINGWAY_ZTUNNEL, else
    /// ../shared/peers/ztunnel/ztunnel beside the repository).
    #[arg(long)]
    ztunnel: Option<PathBuf>,
    /// Seconds after ready of the early RSS sample.
    #[arg(long, default_value_t = 2.0)]
    early: f64,
    /// Seconds after ready of the steady RSS sample.
    #[arg(long, default_value_t = 15.0)]
    steady: f64,
    /// Give up on a proxy that is not ready after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    ready_timeout: f64,
    /// Service accounts (identities) per mesh: one per service (0, the
    /// default), or this many shared round-robin.
    #[arg(long, default_value_t = 0)]
    service_accounts: usize,
    /// Skip counting each proxy's /config_dump after measuring.
    #[arg(long)]
    no_verify: bool,
    /// Skip the in-process heap accounting (ringway's own loading code,
    /// run here under a counting allocator).
    #[arg(long)]
    no_heap: bool,
    /// Certificates issued for the heap accounting (the cost of all the
    /// mesh's identities is extrapolated from these).
    #[arg(long, default_value_t = 500)]
    heap_certs: usize,
    /// Where results go.
    #[arg(long, default_value = "scale-results")]
    out: PathBuf,
    /// Where meshes, CA and logs are written (deleted at the end unless
    /// --keep).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep the work folder (meshes, logs).
    #[arg(long)]
    keep: bool,
    /// Only write the mesh of the first size to this file and exit.
    #[arg(long)]
    write_mesh: Option<PathBuf>,
}

// ---------------------------------------------------------------------------
// The mesh
// ---------------------------------------------------------------------------

/// N workloads and M services (see `snapshot-bench`, whose synthetic mesh
/// this mirrors): 100 namespaces, service `s` in `ns-(s % 100)`, pod `i`
/// backing service `i % M` through 80 → 8080, pods on 1000 nodes in three
/// zones. Identities: one service account per service by default.
#[derive(Clone, Copy, Debug)]
struct Shape {
    workloads: usize,
    services: usize,
    service_accounts: usize,
}

const NAMESPACES: usize = 100;
const NODES: usize = 1000;
/// A node no generated workload is on (`ringway-node`).
const ABSENT_NODE: &str = "node-absent.cluster.internal";

impl Shape {
    fn label(&self) -> String {
        mesh_label(self.workloads, self.services)
    }

    fn namespace(&self, s: usize) -> String {
        format!("ns-{}", s % NAMESPACES)
    }

    fn hostname(&self, s: usize) -> String {
        format!("svc-{s}.{}.svc.cluster.local", self.namespace(s))
    }

    fn service_of(&self, i: usize) -> usize {
        i % self.services.max(1)
    }

    fn pod_name(&self, i: usize) -> String {
        format!("svc-{}-7d9f8c6b5-{:05x}", self.service_of(i), i & 0xfffff)
    }

    /// Pod `i`'s service account.
    fn service_account(&self, i: usize) -> String {
        let s = self.service_of(i);
        if self.service_accounts == 0 {
            format!("svc-{s}")
        } else {
            format!("sa-{}", s % self.service_accounts)
        }
    }

    /// How many distinct identities (namespace, service account) the mesh
    /// has: what a node that runs every workload needs certificates for.
    fn identities(&self) -> usize {
        let mut ids = std::collections::BTreeSet::new();
        for s in 0..self.services.min(self.workloads) {
            ids.insert((self.namespace(s), self.service_account(s)));
        }
        ids.len()
    }

    /// Services in the file: none without workloads (nothing backs them).
    fn listed_services(&self) -> usize {
        match self.workloads {
            0 => 0,
            _ => self.services,
        }
    }

    /// `ns/name/sa` of workload 0, the one ztunnel speaks for.
    fn proxy_workload(&self) -> String {
        format!(
            "{}/{}/{}",
            self.namespace(0),
            self.pod_name(0),
            self.service_account(0)
        )
    }

    /// The LOCAL_XDS YAML, in the stricter of the two dialects (ztunnel
    /// wants `services` and `trustDomain` on every workload).
    fn write<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        writeln!(
            out,
            "# ringway-perf scale-bench: {} workloads, {} services",
            self.workloads, self.services
        )?;
        // A list's key, and `[]` if it has no items.
        let list = |out: &mut W, key: &str, n: usize| {
            writeln!(out, "{key}:{}", if n == 0 { " []" } else { "" })
        };
        list(out, "workloads", self.workloads)?;
        for i in 0..self.workloads {
            let s = self.service_of(i);
            let ns = self.namespace(s);
            let pod = self.pod_name(i);
            // 10.0.0.0/12, like a pod CIDR.
            let ip = std::net::Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1);
            let app = format!("svc-{s}");
            let zone = ['a', 'b', 'c'][i % 3];
            write!(
                out,
                "- uid: Kubernetes//Pod/{ns}/{pod}\n  name: {pod}\n  namespace: {ns}\n  \
                 serviceAccount: {sa}\n  trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  \
                 protocol: HBONE\n  node: node-{node:04}.cluster.internal\n  \
                 canonicalName: {app}\n  canonicalRevision: v1\n  workloadName: {app}\n  \
                 clusterId: Kubernetes\n  locality: {{region: us-east-1, zone: us-east-1{zone}, subzone: \"\"}}\n  \
                 services:\n    \"{ns}/{host}\": {{80: 8080}}\n",
                sa = self.service_account(i),
                node = i % NODES,
                host = self.hostname(s),
            )?;
        }
        list(out, "services", self.listed_services())?;
        for s in 0..self.listed_services() {
            // 10.96.0.0/12, like a service CIDR.
            let vip = std::net::Ipv4Addr::from(0x0a60_0000u32 + s as u32 + 1);
            write!(
                out,
                "- name: svc-{s}\n  namespace: {ns}\n  hostname: {host}\n  \
                 vips: [\"/{vip}\"]\n  ports: {{80: 8080}}\n",
                ns = self.namespace(s),
                host = self.hostname(s),
            )?;
        }
        writeln!(out, "policies: []")?;
        Ok(())
    }

    fn write_file(&self, path: &Path) -> anyhow::Result<u64> {
        let mut f = BufWriter::new(std::fs::File::create(path)?);
        self.write(&mut f)?;
        f.flush()?;
        Ok(std::fs::metadata(path)?.len())
    }
}

/// "empty", or "20k / 2k" (workloads / services).
fn mesh_label(workloads: usize, services: usize) -> String {
    match workloads {
        0 => "empty".into(),
        _ => format!("{} / {}", short(workloads), short(services)),
    }
}

fn short(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

// ---------------------------------------------------------------------------
// /proc and HTTP
// ---------------------------------------------------------------------------

/// Workload and service counts of a `/config_dump` (ringway's and
/// ztunnel's have the same top-level lists).
fn dump_counts(body: &[u8]) -> anyhow::Result<(usize, usize)> {
    let v: Value = serde_json::from_slice(body).context("config_dump is not JSON")?;
    let count = |k: &str| match &v[k] {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    Ok((count("workloads"), count("services")))
}

// ---------------------------------------------------------------------------
// One measured run
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Kind {
    Ringway,
    RingwayNode,
    #[value(name = "ringway-nodecay")]
    RingwayNoDecay,
    #[value(name = "ringway-bgthread")]
    RingwayBgThread,
    Ztunnel,
}

impl Kind {
    /// Its name on the command line, which the results and logs use too.
    fn key(self) -> String {
        let v = self.to_possible_value().expect("no variant is skipped");
        v.get_name().to_string()
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Ringway => {
                "ringway (no --node-name: workloads at the host's addresses are local, none here)"
            }
            Kind::RingwayNode => "ringway --node-name (no local workload, no certificate)",
            Kind::RingwayNoDecay => {
                "ringway, jemalloc gives freed pages back at once \
                 (`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`)"
            }
            Kind::RingwayBgThread => {
                "ringway, jemalloc's background thread purges decayed pages \
                 (`_RJEM_MALLOC_CONF=background_thread:true`)"
            }
            Kind::Ztunnel => "ztunnel (dedicated, 1 worker)",
        }
    }
}

#[derive(Default, Clone, serde::Serialize)]
struct Run {
    variant: String,
    workloads: usize,
    services: usize,
    identities: usize,
    file_bytes: u64,
    ready_secs: f64,
    /// /proc/PID/status at `early` and `steady` seconds after ready.
    early: BTreeMap<String, u64>,
    steady: BTreeMap<String, u64>,
    /// CPU used between the two samples (no traffic: what holding and
    /// watching the config costs), % of one CPU.
    idle_cpu_percent: Option<f64>,
    /// jemalloc's counters at the steady sample (ringway's /memory).
    allocator: Option<Value>,
    /// What /config_dump listed (workloads, services).
    dumped: Option<(usize, usize)>,
    /// Certificates ringway's config_dump lists.
    certificates: Option<usize>,
}

impl Run {
    fn rss_early(&self) -> u64 {
        self.early["VmRSS"]
    }
    fn rss_steady(&self) -> u64 {
        self.steady["VmRSS"]
    }
    fn peak(&self) -> u64 {
        self.steady["VmHWM"]
    }
}

struct Bench {
    args: Args,
    ringway: PathBuf,
    ztunnel: Option<PathBuf>,
    work: PathBuf,
    ca_dir: PathBuf,
}

/// A started proxy: the process, and how to reach its endpoints. Field
/// order is drop order: the process before its namespace.
struct Started {
    proc: Supervised,
    /// ztunnel's namespace (its endpoints are reached from inside it).
    netns: Option<Netns>,
    admin: Option<SocketAddr>,
}

impl Bench {
    fn run(&self, kind: Kind, shape: Shape, mesh: &Path, file_bytes: u64) -> anyhow::Result<Run> {
        let name = format!("{}-{}", kind.key(), shape.workloads);
        let started = match kind {
            Kind::Ztunnel => self.start_ztunnel(shape, mesh, &name)?,
            _ => self.start_ringway(kind, mesh, &name)?,
        };
        let log = started.proc.log().to_path_buf();
        let pid = started.proc.pid();
        let ready = started.proc.startup;
        let t0 = Instant::now() - ready;
        // /proc/PID/status and CPU seconds, `secs` after ready.
        let sample_at = |secs: f64| -> anyhow::Result<(BTreeMap<String, u64>, Option<f64>)> {
            let at = t0 + ready + Duration::from_secs_f64(secs);
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let status = proc_status(pid)
                .with_context(|| format!("{name} exited: see {}", log.display()))?;
            Ok((status, ringway_perf::procstat::cpu_seconds(pid).ok()))
        };
        let (early, cpu_early) = sample_at(self.args.early)?;
        let (steady, cpu_steady) = sample_at(self.args.steady)?;
        let idle_cpu_percent = match (cpu_early, cpu_steady) {
            (Some(a), Some(b)) if self.args.steady > self.args.early => {
                Some(100.0 * (b - a) / (self.args.steady - self.args.early))
            }
            _ => None,
        };
        let mut run = Run {
            variant: kind.key(),
            workloads: shape.workloads,
            services: shape.listed_services(),
            identities: shape.identities(),
            file_bytes,
            ready_secs: ready.as_secs_f64(),
            early,
            steady,
            idle_cpu_percent,
            ..Run::default()
        };
        if let Some(admin) = started.admin {
            if kind != Kind::Ztunnel {
                run.allocator = get_json(admin, "/memory", Duration::from_secs(5))
                    .ok()
                    .map(|v| v["allocator"].clone())
                    .filter(|a| !a.is_null());
            }
            if !self.args.no_verify {
                let get = move || get_ok(admin, "/config_dump", Duration::from_secs(120));
                let body = match &started.netns {
                    Some(ns) => ns.enter(get)?,
                    None => get(),
                }
                .with_context(|| name.clone())?;
                let (w, s) = dump_counts(&body)?;
                if w != run.workloads || s != run.services {
                    bail!(
                        "{name} loaded {w} workloads and {s} services of {} and {}: see {}",
                        run.workloads,
                        run.services,
                        log.display()
                    );
                }
                run.dumped = Some((w, s));
                if kind != Kind::Ztunnel {
                    let v: Value = serde_json::from_slice(&body)?;
                    run.certificates = v["certificates"].as_array().map(|a| a.len());
                }
            }
        }
        drop(started);
        Ok(run)
    }

    fn start_ringway(&self, kind: Kind, mesh: &Path, name: &str) -> anyhow::Result<Started> {
        let mut args = vec!["--cores".into(), "1".into(), "--config".into()];
        args.push(mesh.display().to_string());
        args.extend(["--ca-dir".into(), self.ca_dir.display().to_string()]);
        args.extend(rig::side_listener_args(&self.ringway)?);
        args.extend(rig::listener_args(rig::ANY_PORT, rig::ANY_PORT));
        if kind == Kind::RingwayNode {
            args.extend(["--node-name".into(), ABSENT_NODE.into()]);
        }
        let mut spec = Spec::ringway(&self.ringway, name, &args, "warn", &self.work)
            .healthz()
            .timeout(Duration::from_secs_f64(self.args.ready_timeout));
        match kind {
            Kind::RingwayNoDecay => {
                spec = spec.env("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0");
            }
            Kind::RingwayBgThread => spec = spec.env("_RJEM_MALLOC_CONF", "background_thread:true"),
            _ => {}
        }
        let proc = Supervised::start(None, spec)?;
        let admin = proc.spec.bound_file().and_then(|b| bound_addr(b, "admin"));
        Ok(Started {
            proc,
            netns: None,
            admin,
        })
    }

    fn start_ztunnel(&self, shape: Shape, mesh: &Path, name: &str) -> anyhow::Result<Started> {
        let bin = self.ztunnel.as_ref().context("no ztunnel binary")?;
        let ns = Netns::new("rwscale")?;
        let mut env = ztunnel::env(mesh, &shape.proxy_workload(), "warn");
        env.retain(|(k, _)| !matches!(*k, "ENABLE_ORIG_SRC" | "PACKET_MARK"));
        env.push(("ZTUNNEL_WORKER_THREADS", "1".into()));
        let spec = ztunnel::spec(bin, name, env, &self.work)
            .timeout(Duration::from_secs_f64(self.args.ready_timeout));
        Ok(Started {
            proc: Supervised::start(Some(&ns), spec)?,
            netns: Some(ns),
            admin: Some("127.0.0.1:15000".parse()?),
        })
    }
}

// ---------------------------------------------------------------------------
// In-process heap accounting
// ---------------------------------------------------------------------------

/// Exact heap bytes (requested sizes, before the allocator's rounding) of
/// what ringway's startup builds from the mesh file, run in this process
/// with ringway's own code under a counting allocator.
#[derive(Clone, serde::Serialize)]
struct Heap {
    workloads: usize,
    /// The file's text (`--config` reads it whole; the file watcher keeps
    /// a copy of its bytes to compare at every poll).
    yaml: usize,
    /// `local::parse`: most heap live at once beyond the text (the YAML
    /// parser's events, the raw schema structs, the model items).
    parse_peak: isize,
    /// The parsed model items (workloads, services) alone.
    model: isize,
    /// `local::load_snapshot` (parse, then build the snapshot): peak
    /// beyond the text.
    load_peak: isize,
    /// The snapshot once built (owns the model items; indexes on top).
    snapshot: isize,
    /// A second `load_snapshot` of the same text while the first
    /// snapshot is alive (what ringway's startup does today: `--config`
    /// is loaded, then the file watcher's first poll loads it again):
    /// peak beyond the text.
    second_load_peak: isize,
    /// Heap per certificate: the certificate, its key and both rustls
    /// configs, in a certificate snapshot (`certs::issue_all`), averaged
    /// over `certs_issued` identities.
    per_certificate: f64,
    certs_issued: usize,
    identities: usize,
}

/// `f`'s result, the most heap live while it ran and what it left live,
/// both in bytes above `base`: every step of the accounting is counted
/// this way.
fn counted<T, E: std::fmt::Display>(
    base: isize,
    f: impl FnOnce() -> Result<T, E>,
) -> anyhow::Result<(T, isize, isize)> {
    reset_peak();
    let v = f().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((v, peak_bytes() - base, live_bytes() - base))
}

fn heap_accounting(
    shape: Shape,
    mesh: &Path,
    certs_to_issue: usize,
    work: &Path,
) -> anyhow::Result<Heap> {
    let text = std::fs::read_to_string(mesh)?;
    let (parsed, parse_peak, model) = counted(live_bytes(), || local::parse(&text, "mesh"))?;
    drop(parsed);
    let base = live_bytes();
    let (snap, load_peak, snapshot) = counted(base, || local::load_snapshot(&text, "mesh"))?;
    // The second snapshot goes at once; the first one stays counted.
    let (_, second_load_peak, _) = counted(base, || local::load_snapshot(&text, "mesh"))?;
    let identities = certs::wanted_identities(&snap, None);
    let n_ids = identities.len();
    let ca_dir = work.join("heap-ca");
    let ca = BuiltinCa::load_or_create(&ca_dir, "cluster.local")
        .map_err(|e| anyhow::anyhow!("CA in {}: {e}", ca_dir.display()))?;
    let chosen: Vec<_> = identities.into_iter().take(certs_to_issue).collect();
    let issued = chosen.len();
    let day = Duration::from_secs(24 * 3600);
    let (certs, _, certs_bytes) = counted(live_bytes(), || certs::issue_all(&ca, chosen, day))?;
    let per_certificate = if issued > 0 {
        certs_bytes as f64 / issued as f64
    } else {
        0.0
    };
    drop(certs);
    drop(snap);
    Ok(Heap {
        workloads: shape.workloads,
        yaml: text.len(),
        parse_peak,
        model,
        load_peak,
        snapshot,
        second_load_peak,
        per_certificate,
        certs_issued: issued,
        identities: n_ids,
    })
}

fn heap_report(heaps: &[Heap]) -> String {
    let mut md = String::new();
    if heaps.is_empty() {
        return md;
    }
    let m = |b: isize| mib(b.max(0) as u64);
    let _ = writeln!(
        md,
        "\nringway's loading code, heap counted exactly in this process (bytes requested, \
         before allocator rounding; the YAML text not included in the peaks):\n"
    );
    let _ = writeln!(
        md,
        "| mesh | YAML text | parse: peak | parsed items | load_snapshot: peak | snapshot | second load beside the first: peak | certificates (per identity × identities) |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for h in heaps {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} ({:.0} B/workload) | {} | {} ({:.1} KiB × {}) |",
            short(h.workloads),
            mib(h.yaml as u64),
            m(h.parse_peak),
            m(h.model),
            m(h.load_peak),
            m(h.snapshot),
            h.snapshot as f64 / h.workloads.max(1) as f64,
            m(h.second_load_peak),
            mib((h.per_certificate * h.identities as f64) as u64),
            h.per_certificate / 1024.0,
            h.identities,
        );
    }
    md
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

/// Bytes per workload of `run` over the same variant's empty-mesh run.
fn per_workload(run: &Run, empty: Option<&Run>) -> Option<f64> {
    let empty = empty?;
    (run.workloads > 0)
        .then(|| (run.rss_steady() as f64 - empty.rss_steady() as f64) / run.workloads as f64)
}

fn report(runs: &[Run], kinds: &[Kind]) -> String {
    let mut md = String::new();
    let find = |k: Kind, n: usize| {
        runs.iter()
            .find(|r| r.variant == k.key() && r.workloads == n)
    };
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.workloads).collect();
    sizes.sort();
    sizes.dedup();
    let _ = writeln!(
        md,
        "Process memory and load time, `--cores 1` / 1 worker (idle CPU: % of one CPU \
         between the two samples, no traffic):\n"
    );
    let _ = writeln!(
        md,
        "| mesh (workloads / services) | variant | ready | RSS at 2 s | RSS at 15 s | peak (VmHWM) | bytes/workload (15 s) | idle CPU | ÷ ztunnel: ready | RSS 2 s | RSS 15 s | peak | bytes/workload |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &n in &sizes {
        let zt = find(Kind::Ztunnel, n);
        for &k in kinds {
            let Some(r) = find(k, n) else { continue };
            let shape = mesh_label(r.workloads, r.services);
            let bpw = per_workload(r, find(k, 0));
            let mut row = format!(
                "| {shape} | {} | {:.2} s | {} | {} | {} | {} | {} |",
                k.key(),
                r.ready_secs,
                mib(r.rss_early()),
                mib(r.rss_steady()),
                mib(r.peak()),
                bpw.map_or("–".into(), |b| format!("{b:.0} B")),
                r.idle_cpu_percent
                    .map_or("–".into(), |c| format!("{c:.1} %")),
            );
            match zt.filter(|_| k != Kind::Ztunnel) {
                Some(z) => {
                    let zb = per_workload(z, find(Kind::Ztunnel, 0));
                    let _ = write!(
                        row,
                        " {} | {} | {} | {} | {} |",
                        ratio(r.ready_secs, z.ready_secs),
                        ratio(r.rss_early() as f64, z.rss_early() as f64),
                        ratio(r.rss_steady() as f64, z.rss_steady() as f64),
                        ratio(r.peak() as f64, z.peak() as f64),
                        match (bpw, zb) {
                            (Some(a), Some(b)) => ratio(a, b),
                            _ => "–".into(),
                        }
                    );
                }
                None => row += " | | | | |",
            }
            let _ = writeln!(md, "{row}");
        }
    }
    let _ = writeln!(md, "\nVariants:\n");
    for &k in kinds {
        let _ = writeln!(md, "* `{}`: {}", k.key(), k.label());
    }
    let alloc: Vec<&Run> = runs.iter().filter(|r| r.allocator.is_some()).collect();
    if !alloc.is_empty() {
        let _ = writeln!(
            md,
            "\nringway's allocator at the 15 s sample (jemalloc's counters, admin `/memory`): \
             allocated = live heap bytes; active = the pages holding them; dirty = freed pages \
             jemalloc keeps resident for reuse (given back as they decay); muzzy = freed with \
             MADV_FREE (resident until the kernel needs them); resident = jemalloc's pages in \
             RAM, metadata included; retained = address space kept, not resident; VmRSS − \
             resident = everything else (binary, stacks, rings):\n"
        );
        let counters = [
            "allocated",
            "active",
            "metadata",
            "dirty",
            "muzzy",
            "resident",
            "retained",
        ];
        let _ = writeln!(
            md,
            "| mesh | variant | certificates | {} | VmRSS |\n|---|---|---:|{}---:|",
            counters.join(" | "),
            "---:|".repeat(counters.len())
        );
        for r in alloc {
            let a = r.allocator.as_ref().expect("filtered");
            let _ = write!(
                md,
                "| {} | {} | {} |",
                mesh_label(r.workloads, r.services),
                r.variant,
                r.certificates.map_or("–".into(), |c| c.to_string()),
            );
            for k in counters {
                let _ = write!(md, " {} |", a[k].as_u64().map_or("–".into(), mib));
            }
            let _ = writeln!(md, " {} |", mib(r.rss_steady()));
        }
    }
    let files: Vec<String> = sizes
        .iter()
        .filter_map(|&n| runs.iter().find(|r| r.workloads == n))
        .map(|r| {
            format!(
                "{}: {:.1} MiB of YAML, {} identities",
                mesh_label(r.workloads, r.services),
                r.file_bytes as f64 / (1 << 20) as f64,
                r.identities
            )
        })
        .collect();
    let _ = writeln!(md, "\nMesh files: {}.", files.join("; "));
    md
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut shapes = vec![];
    for s in &args.sizes {
        let (w, m) = s
            .split_once(':')
            .with_context(|| format!("--sizes: {s:?} is not WORKLOADS:SERVICES"))?;
        shapes.push(Shape {
            workloads: w.parse()?,
            services: m.parse()?,
            service_accounts: args.service_accounts,
        });
    }
    if let Some(path) = &args.write_mesh {
        let shape = shapes.first().context("no size")?;
        let bytes = shape.write_file(path)?;
        println!(
            "{}: {} ({bytes} bytes, {} identities, ztunnel PROXY_WORKLOAD_INFO={})",
            path.display(),
            shape.label(),
            shape.identities(),
            shape.proxy_workload()
        );
        return Ok(());
    }
    let mut kinds = args.variants.clone();
    if args.no_ztunnel {
        kinds.retain(|k| *k != Kind::Ztunnel);
    }
    let ztunnel = if kinds.contains(&Kind::Ztunnel) {
        rig::require_root("ztunnel runs in a network namespace of its own (or pass --no-ztunnel)")?;
        Some(ztunnel::locate(args.ztunnel.as_deref())?)
    } else {
        None
    };
    let ringway = ringway_perf::ringway_bin(args.ringway.as_deref())?;
    let work = match &args.work {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("ringway-scale-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;
    let ca_dir = work.join("ca");
    match &ztunnel {
        // One root for both, as in the suite (ringway only reads it here).
        Some(z) => ztunnel::write_shared_ca(z, &ca_dir)?,
        None => std::fs::create_dir_all(&ca_dir)?,
    }
    std::fs::create_dir_all(&args.out)?;
    let bench = Bench {
        ringway,
        ztunnel,
        work: work.clone(),
        ca_dir,
        args,
    };

    let mut runs = Vec::new();
    let mut heaps = Vec::new();
    let mut all = vec![Shape {
        workloads: 0,
        services: 0,
        service_accounts: 0,
    }];
    all.extend(shapes);
    let result = (|| -> anyhow::Result<()> {
        for shape in all {
            let mesh = bench.work.join(format!("mesh-{}.yaml", shape.workloads));
            let bytes = shape.write_file(&mesh)?;
            eprintln!(
                "mesh {}: {:.1} MiB, {} identities",
                shape.label(),
                bytes as f64 / (1 << 20) as f64,
                shape.identities()
            );
            if !bench.args.no_heap && shape.workloads > 0 {
                let h = heap_accounting(shape, &mesh, bench.args.heap_certs, &bench.work)?;
                eprintln!(
                    "  heap: parse peak {}, load peak {}, snapshot {}, {:.1} KiB per certificate",
                    mib(h.parse_peak.max(0) as u64),
                    mib(h.load_peak.max(0) as u64),
                    mib(h.snapshot.max(0) as u64),
                    h.per_certificate / 1024.0
                );
                heaps.push(h);
            }
            for &k in &kinds {
                let run = bench.run(k, shape, &mesh, bytes)?;
                eprintln!(
                    "  {:<16} ready {:.2} s, RSS {} at {} s, {} at {} s, peak {}",
                    k.key(),
                    run.ready_secs,
                    mib(run.rss_early()),
                    bench.args.early,
                    mib(run.rss_steady()),
                    bench.args.steady,
                    mib(run.peak()),
                );
                runs.push(run);
            }
            std::fs::remove_file(&mesh)?;
        }
        Ok(())
    })();
    let md = report(&runs, &kinds) + &heap_report(&heaps);
    println!("{md}");
    std::fs::write(bench.args.out.join("results.md"), &md)?;
    let (commit, dirty) = ringway_perf::machine::checkout(Path::new("."));
    let versions = json!({
        "machine": ringway_perf::machine::describe(Some(&bench.ringway)),
        "ztunnel": bench.ztunnel.as_deref().and_then(ztunnel::version),
        // The checkout scale-bench ran from (the binary may live in a
        // shared target folder).
        "git_commit": commit,
        "git_dirty": dirty,
    });
    let out = json!({
        "settings": {
            "early_secs": bench.args.early,
            "steady_secs": bench.args.steady,
            "service_accounts": bench.args.service_accounts,
            "variants": kinds.iter().map(|k| k.key()).collect::<Vec<_>>(),
        },
        "versions": versions,
        "runs": runs,
        "heap": heaps,
        "error": result.as_ref().err().map(|e| format!("{e:#}")),
    });
    std::fs::write(
        bench.args.out.join("results.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    eprintln!(
        "results: {}/results.md, results.json",
        bench.args.out.display()
    );
    if !bench.args.keep {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        eprintln!("kept {}", work.display());
    }
    result
}
