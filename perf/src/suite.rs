//! `ringway-perf suite`: every scenario, every variant, side by side, in
//! one run on the two-node rig (see `nodes`).
//!
//! Variants are columns: direct (no proxy), ringway passthrough, ringway
//! HBONE (per `--cores` value of a sweep, and per `--policies` value: the
//! authorization policies on the destination), and optionally a peer proxy
//! reached through SOCKS5. Each round runs every scenario on every variant;
//! the variant order rotates with the round and the scenario so slow drift
//! on a shared machine hits every column alike. Reported numbers are
//! medians over rounds; ratios compare against direct from the same run.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::calibrate::{self, Calibration};
use crate::charts::{self, Bar, Series};
use crate::machine::{self, Machine};
use crate::nodes::{
    self, split_pinning, Kind as VariantKind, Nodes, NodesConfig, PeerSpec, PeerTarget, Pinning,
    SetSpec, Variant,
};
use crate::report::{fmt_num, markdown_table, with_ratio, Collector, MetricSummary, RowHeads};
use crate::rr::Limit;
use crate::scenario::{Kind, Scenario, GENERATOR_ROW, SYSCALL_ROW};
use crate::throughput::Direction;
use crate::units::{fmt_duration, fmt_size, parse_duration, parse_size};
use crate::{connect, idle, rig, rr, rr_conc, throughput};

#[derive(clap::Args, Debug, Clone)]
pub struct SuiteArgs {
    /// The ringway binary (default: next to this one).
    #[arg(long)]
    pub ringway: Option<PathBuf>,
    /// Results folder (results.json, results.md, *.svg, logs/).
    #[arg(long, default_value = "perf-results")]
    pub out: PathBuf,
    /// About one minute: 3 rounds, 128 MiB per throughput run, 2 s rr,
    /// 1 s connect, 200 idle connections, a short calibration. Explicit
    /// flags still win.
    #[arg(long)]
    pub quick: bool,
    /// Rounds (default 5; quick 3). Each runs every scenario on every variant.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Scenarios to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "throughput,rr,rr-kernel,rr-conc,connect,idle"
    )]
    pub scenarios: Vec<Kind>,
    /// Bytes per throughput run, split evenly over the streams (default
    /// 1G; quick 128M).
    #[arg(long, value_parser = parse_size)]
    pub bytes: Option<u64>,
    /// Throughput stream counts, comma-separated; each is its own scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub streams: Vec<usize>,
    #[arg(long, value_enum, default_value = "up")]
    pub direction: Direction,
    /// rr duration per run (default 10s; quick 2s).
    #[arg(long, value_parser = parse_duration)]
    pub rr_duration: Option<Duration>,
    /// rr request and response size in bytes.
    #[arg(long, default_value_t = 1)]
    pub rr_size: u32,
    /// rr connections, each with one request in flight.
    #[arg(long, default_value_t = 1)]
    pub rr_connections: usize,
    /// rr-kernel duration per run: rr (same size and connections) while
    /// the proxies' system calls and context switches are counted
    /// (default 3s; quick 1s).
    #[arg(long, value_parser = parse_duration)]
    pub rr_kernel_duration: Option<Duration>,
    /// rr-conc: connection counts, comma-separated; each is its own
    /// scenario (request/response, closed loop, one request in flight per
    /// connection; --rr-size bytes each way).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub rr_conc_connections: Vec<usize>,
    /// rr-conc duration per connection count and run (default 2s; quick
    /// 500ms).
    #[arg(long, value_parser = parse_duration)]
    pub rr_conc_duration: Option<Duration>,
    /// rr-conc client threads, each driving its share of the connections
    /// from one epoll loop (default 1; at most one per connection).
    #[arg(long)]
    pub rr_conc_threads: Option<usize>,
    /// connect duration per run (default 5s; quick 1s).
    #[arg(long, value_parser = parse_duration)]
    pub connect_duration: Option<Duration>,
    /// connect workers, each with one connection in flight.
    #[arg(long, default_value_t = 4)]
    pub connect_concurrency: usize,
    /// Idle connections held open (default 1000; quick 200).
    #[arg(long)]
    pub idle_connections: Option<usize>,
    /// Wait before reading the proxy's RSS (default 2s; quick 500ms).
    #[arg(long, value_parser = parse_duration)]
    pub idle_settle: Option<Duration>,
    /// ringway `--cores` for a core-pinning sweep. Repeat the flag, one
    /// value per ringway pair: `--cores 1 --cores 2`. Each value goes to
    /// ringway as is: a count ("2") or a CPU list ("0-1", "1-1,3-3").
    /// Without it, ringway uses every CPU.
    #[arg(long = "cores", value_parser = parse_cores)]
    pub cores: Vec<String>,
    /// Authorization policies on the HBONE destination: one HBONE column
    /// per value ("0,10,1000", or repeat the flag), each through its own
    /// ringway pair whose server workload carries that many policies (see
    /// perf/README.md). Results add a table of every HBONE metric per
    /// value with its ratio to the smallest value. Combined with --cores:
    /// every pair of values.
    #[arg(long = "policies", value_delimiter = ',')]
    pub policies: Vec<usize>,
    /// A known reference proxy, set up completely by the suite:
    /// `ztunnel` (Istio's ztunnel at RINGWAY_ZTUNNEL, else
    /// ../shared/peers/ztunnel/ztunnel beside the repository) or
    /// `ztunnel=<path>`. Adds the columns "ztunnel passthrough" and "ztunnel
    /// hbone" (two ztunnels, like ringway A and B) on a node pair of their
    /// own, captured like ringway's, and puts every ringway on the root of
    /// ztunnel's fake CA. See perf/README.md.
    #[arg(long, value_name = "ztunnel[=PATH]", value_parser = parse_peer)]
    pub peer: Option<KnownPeer>,
    /// SOCKS5 address of a peer proxy (an extra column); needs --peer-cmd.
    #[arg(long, requires = "peer_cmd")]
    pub peer_socks: Option<SocketAddr>,
    /// Command line that starts the peer proxy inside node A's namespace
    /// (through `sh -c`). {config}, {ca_dir}, {client_ip} and {logs} are
    /// replaced with the rig's mesh config, CA directory, the client
    /// workload's address and the log folder.
    #[arg(long, requires = "peer_socks")]
    pub peer_cmd: Option<String>,
    /// Column title of the peer.
    #[arg(long, default_value = "peer")]
    pub peer_name: String,
    /// Where the peer's connections go: plain (non-mesh destination) or
    /// hbone (the HBONE workload behind ringway B).
    #[arg(long, value_enum, default_value = "plain")]
    pub peer_target: PeerTarget,
    /// Adds the column "ringway same-node": the client connects to an
    /// HBONE workload on its own node A, which ringway A serves through
    /// its same-node fast path (no TLS, no hop to a ringway B).
    #[arg(long)]
    pub same_node: bool,
    /// Adds the column "ringway hbone orig-src": HBONE as in "ringway
    /// hbone", to a ringway B of its own that connects to the sink from the
    /// client's address (--orig-src, with scripts/orig-src-rules.sh in node
    /// B), to compare a spoofed-source connect with a plain one.
    #[arg(long)]
    pub orig_src: bool,
    /// Adds a second ringway pair with metrics and the access log off
    /// (`--no-metrics`, RUST_LOG=warn) beside every pair, so what they cost
    /// shows in the same run (give `--proxy-log-level info` for the access
    /// log to be on in the others).
    #[arg(long)]
    pub quiet_set: bool,
    /// Skip the iperf3 comparison of the load generator.
    #[arg(long)]
    pub no_calibrate: bool,
    /// RUST_LOG for the ringways.
    #[arg(long, default_value = "warn")]
    pub proxy_log_level: String,
}

/// A `--cores` value: ringway's syntax, but "1,2" is refused as ambiguous
/// (a sweep of 1 and 2 cores, or CPUs 1 and 2?). A pinning suffix may
/// follow.
pub fn parse_cores(s: &str) -> Result<String, String> {
    let (t, pin) = split_pinning(s.trim());
    let suffix = pin.map_or("", Pinning::suffix);
    let valid = !t.is_empty()
        && t.split(',').all(|part| {
            let mut ends = part.split('-');
            let ok = |x: Option<&str>| x.is_some_and(|x| !x.is_empty() && x.parse::<u32>().is_ok());
            match (ends.next(), ends.next(), ends.next()) {
                (a, None, None) => ok(a),
                (a, b, None) => ok(a) && ok(b),
                _ => false,
            }
        });
    if !valid {
        return Err(format!(
            "invalid --cores {t:?}: a count (\"2\") or a CPU list (\"0-1\", \"1-1,3-3\"), optionally followed by \":pinned\" or \":unpinned\""
        ));
    }
    if t.contains(',') && !t.contains('-') {
        return Err(format!(
            "--cores {t:?} is ambiguous: for a sweep repeat the flag (--cores 1 --cores 2); \
             for a CPU list use ranges (\"0-1\" or \"1-1,3-3\")"
        ));
    }
    Ok(format!("{t}{suffix}"))
}

/// A `--peer` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KnownPeer {
    /// ztunnel, at this path or (None) the default one.
    Ztunnel(Option<PathBuf>),
}

pub fn parse_peer(s: &str) -> Result<KnownPeer, String> {
    match s.split_once('=') {
        None if s == "ztunnel" => Ok(KnownPeer::Ztunnel(None)),
        Some(("ztunnel", p)) if !p.is_empty() => Ok(KnownPeer::Ztunnel(Some(PathBuf::from(p)))),
        _ => Err(format!(
            "unknown --peer {s:?}: `ztunnel` or `ztunnel=<path>` (for another proxy use \
             --peer-socks and --peer-cmd)"
        )),
    }
}

/// CPUs a `--cores` value stands for ("2" → 2, "0-1,3-3" → 3).
pub fn cpu_count(cores: &str) -> Option<usize> {
    let (cores, _) = split_pinning(cores);
    if !cores.contains(['-', ',']) {
        return cores.parse().ok();
    }
    cores
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => Some(b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1),
            None => part.parse::<usize>().ok().map(|_| 1),
        })
        .sum()
}

/// Everything the run used, after `--quick` and defaults.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub quick: bool,
    pub rounds: usize,
    pub scenarios: Vec<Scenario>,
    pub core_sets: Vec<Option<String>>,
    /// `--policies` values, ascending (empty: no policy sweep).
    pub policies: Vec<usize>,
    pub calibrate: Option<calibrate::Params>,
    pub peer: Option<PeerSettings>,
    pub ztunnel: Option<ZtunnelSettings>,
    pub same_node: bool,
    pub orig_src: bool,
    /// A metrics-off, access-log-off pair beside every pair.
    pub quiet_set: bool,
    pub proxy_log_level: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ZtunnelSettings {
    pub path: PathBuf,
    /// `ztunnel version`.
    pub version: Option<String>,
    /// ZTUNNEL_WORKER_THREADS as inherited (None: ztunnel's default, 2).
    pub worker_threads: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeerSettings {
    pub name: String,
    pub socks: SocketAddr,
    pub command: String,
    pub target: PeerTarget,
}

impl Settings {
    pub fn resolve(a: &SuiteArgs) -> anyhow::Result<Settings> {
        let q = a.quick;
        let pick = |v: Option<Duration>, full: u64, quick: u64| {
            v.unwrap_or(Duration::from_millis(if q { quick } else { full }))
        };
        let rounds = a.rounds.unwrap_or(if q { 3 } else { 5 });
        anyhow::ensure!(rounds > 0, "--rounds must be ≥ 1");
        let bytes = a.bytes.unwrap_or(if q { 128 << 20 } else { 1 << 30 });
        let mut scenarios = Vec::new();
        for kind in dedup(&a.scenarios) {
            match kind {
                Kind::Throughput => {
                    for &streams in &dedup(&a.streams) {
                        anyhow::ensure!(streams > 0, "--streams must be ≥ 1");
                        scenarios.push(Scenario::Throughput(throughput::Params {
                            streams,
                            bytes_per_stream: (bytes / streams as u64).max(1),
                            direction: a.direction,
                        }));
                    }
                }
                Kind::Rr => scenarios.push(Scenario::Rr(rr::Params {
                    size: a.rr_size.max(1),
                    connections: a.rr_connections.max(1),
                    limit: Limit::Duration(pick(a.rr_duration, 10_000, 2_000)),
                })),
                Kind::Connect => scenarios.push(Scenario::Connect(connect::Params {
                    concurrency: a.connect_concurrency.max(1),
                    limit: Limit::Duration(pick(a.connect_duration, 5_000, 1_000)),
                })),
                Kind::Idle => scenarios.push(Scenario::Idle(idle::Params {
                    connections: a.idle_connections.unwrap_or(if q { 200 } else { 1000 }),
                    settle: pick(a.idle_settle, 2_000, 500),
                })),
                Kind::RrKernel => scenarios.push(Scenario::RrKernel(rr::Params {
                    size: a.rr_size.max(1),
                    connections: a.rr_connections.max(1),
                    limit: Limit::Duration(pick(a.rr_kernel_duration, 3_000, 1_000)),
                })),
                Kind::RrConc => {
                    anyhow::ensure!(
                        a.rr_conc_threads != Some(0),
                        "--rr-conc-threads must be ≥ 1"
                    );
                    for &connections in &dedup(&a.rr_conc_connections) {
                        anyhow::ensure!(connections > 0, "--rr-conc-connections must be ≥ 1");
                        scenarios.push(Scenario::RrConc(rr_conc::Params {
                            size: a.rr_size.max(1),
                            connections,
                            threads: a
                                .rr_conc_threads
                                .unwrap_or(rr_conc::DEFAULT_THREADS)
                                .min(connections),
                            limit: Limit::Duration(pick(a.rr_conc_duration, 2_000, 500)),
                        }));
                    }
                }
            }
        }
        anyhow::ensure!(!scenarios.is_empty(), "no scenario selected");
        let core_sets = if a.cores.is_empty() {
            vec![None]
        } else {
            dedup(&a.cores).into_iter().map(Some).collect()
        };
        let mut policies = a.policies.clone();
        policies.sort_unstable();
        policies.dedup();
        anyhow::ensure!(
            core_sets.len() * policies.len().max(1) <= nodes::MAX_CORE_SETS,
            "at most {} ringway pairs (--cores values × --policies values)",
            nodes::MAX_CORE_SETS
        );
        let calibrate = (!a.no_calibrate).then_some(calibrate::Params {
            seconds: if q { 2.0 } else { 5.0 },
            rounds: if q { 2 } else { 3 },
            streams: 1,
            iperf3_len: "1M".into(),
            min_ratio: 0.9,
        });
        let peer = match (&a.peer_socks, &a.peer_cmd) {
            (Some(socks), Some(cmd)) => Some(PeerSettings {
                name: a.peer_name.clone(),
                socks: *socks,
                command: cmd.clone(),
                target: a.peer_target,
            }),
            _ => None,
        };
        let ztunnel = match &a.peer {
            Some(KnownPeer::Ztunnel(path)) => {
                let path = crate::ztunnel::locate(path.as_deref())?;
                Some(ZtunnelSettings {
                    version: crate::ztunnel::version(&path),
                    worker_threads: std::env::var("ZTUNNEL_WORKER_THREADS").ok(),
                    path,
                })
            }
            None => None,
        };
        Ok(Settings {
            quick: q,
            rounds,
            scenarios,
            core_sets,
            policies,
            calibrate,
            peer,
            ztunnel,
            same_node: a.same_node,
            orig_src: a.orig_src,
            quiet_set: a.quiet_set,
            proxy_log_level: a.proxy_log_level.clone(),
        })
    }
}

impl Settings {
    /// One ringway pair per `--cores` value and `--policies` value.
    pub fn sets(&self) -> Vec<SetSpec> {
        let policies: Vec<Option<usize>> = match self.policies.is_empty() {
            true => vec![None],
            false => self.policies.iter().copied().map(Some).collect(),
        };
        let quiet: &[bool] = if self.quiet_set {
            &[false, true]
        } else {
            &[false]
        };
        self.core_sets
            .iter()
            .flat_map(|cores| {
                policies.iter().flat_map(move |&policies| {
                    quiet.iter().map(move |&quiet| SetSpec {
                        cores: cores.clone(),
                        policies,
                        quiet,
                    })
                })
            })
            .collect()
    }
}

fn dedup<T: Clone + PartialEq>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

/// Progress lines on stderr, stamped with the time since start.
struct Progress {
    start: Instant,
}

impl Progress {
    fn line(&self, msg: &str) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "[{:6.1}s] {msg}", self.start.elapsed().as_secs_f64());
    }
}

/// One measurement as it happened: the raw sample.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    pub round: usize,
    pub scenario: String,
    pub variant: String,
    pub seconds: f64,
    pub result: Option<serde_json::Value>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScalingPoint {
    pub cores: String,
    pub cpus: Option<usize>,
    pub median: Option<f64>,
    pub per_cpu: Option<f64>,
    pub vs_first: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScalingRow {
    pub mode: String,
    pub id: String,
    pub scenario: String,
    pub metric: String,
    pub points: Vec<ScalingPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PolicyPoint {
    pub policies: usize,
    pub variant: String,
    pub median: Option<f64>,
    /// Ratio to the smallest `--policies` value of the same `--cores`.
    pub vs_first: Option<f64>,
}

/// One metric of the HBONE columns across the `--policies` values.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyRow {
    pub cores: Option<String>,
    pub id: String,
    pub scenario: String,
    pub metric: String,
    pub higher_is_better: bool,
    pub digits: usize,
    pub points: Vec<PolicyPoint>,
}

#[derive(Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Settings,
    pub calibration: Option<Calibration>,
    pub variants: Vec<Variant>,
    pub metrics: Vec<MetricSummary>,
    pub scaling: Vec<ScalingRow>,
    pub policy_cost: Vec<PolicyRow>,
    /// ringway against each other proxy's column of the same path.
    pub vs_peers: Vec<PeerRatio>,
    pub runs: Vec<RunRecord>,
    pub notes: Vec<String>,
    pub failed_runs: usize,
    pub charts: Vec<String>,
    pub duration_s: f64,
}

pub fn run(args: SuiteArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    rig::require_root("ringway-perf suite")?;
    let bin = crate::ringway_bin(args.ringway.as_deref())?;
    crate::raise_fd_limit();
    let out = args.out.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("results folder {}", out.display()))?;
    let progress = Progress {
        start: Instant::now(),
    };
    let machine = machine::describe(Some(&bin));
    progress.line(&format!(
        "ringway-perf suite: {} rounds, {} scenarios, {} CPUs, {} ({}), results in {}",
        settings.rounds,
        settings.scenarios.len(),
        machine.nproc,
        machine.ringway.as_ref().map_or("?", |r| r.version.as_str()),
        bin.display(),
        out.display()
    ));

    let calibration = match &settings.calibrate {
        None => None,
        Some(p) => {
            progress.line("calibrating the load generator against iperf3 on loopback");
            let c = calibrate::run(p, &mut |l| progress.line(l))?;
            progress.line(&c.summary());
            Some(c)
        }
    };

    let mut nodes = Nodes::start(
        &NodesConfig {
            ringway: bin.clone(),
            sets: settings.sets(),
            log_dir: out.join("logs"),
            log_level: settings.proxy_log_level.clone(),
            peer: settings.peer.as_ref().map(|p| PeerSpec {
                name: p.name.clone(),
                command: p.command.clone(),
                socks: p.socks,
                target: p.target,
            }),
            ztunnel: settings.ztunnel.as_ref().map(|z| z.path.clone()),
            same_node: settings.same_node,
            orig_src: settings.orig_src,
            sink_process: None,
        },
        &mut |l| progress.line(l),
    )?;
    let variants = nodes.variants();
    for v in &variants {
        progress.line(&format!(
            "variant {:<28} {}  proxy pids {:?}",
            v.label,
            v.dialer.describe(),
            v.procs.roots
        ));
    }

    let (runs, collector, notes, outcome) = measure(&settings, &mut nodes, &progress);
    // Final pids (the idle scenario restarts proxies).
    let variants = nodes.variants();
    drop(nodes);

    let metrics = collector.summarize(0);
    let scaling = scaling(&metrics, &variants);
    let policy_cost = policy_cost(&metrics, &variants);
    let vs_peers = vs_peers(&metrics, &variants);
    let mut report = Report {
        machine,
        settings,
        calibration,
        variants,
        failed_runs: runs.iter().filter(|r| r.error.is_some()).count(),
        metrics,
        scaling,
        policy_cost,
        vs_peers,
        runs,
        notes,
        charts: Vec::new(),
        duration_s: progress.start.elapsed().as_secs_f64(),
    };
    report.charts = write_charts(&out, &report).unwrap_or_else(|e| {
        progress.line(&format!("charts failed: {e:#}"));
        report.notes.push(format!("charts failed: {e:#}"));
        Vec::new()
    });
    let md = markdown(&report);
    std::fs::write(out.join("results.md"), &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{md}");
    progress.line(&format!(
        "results written to {}/results.{{json,md}} and {} chart(s)",
        out.display(),
        report.charts.len()
    ));
    outcome?;
    if report.failed_runs > 0 {
        anyhow::bail!(
            "{} measurement(s) failed; see the notes in {}/results.md",
            report.failed_runs,
            out.display()
        );
    }
    Ok(())
}

/// Warm-up, then every round. Returns what was measured even when a proxy
/// dies half way (the error comes last).
fn measure(
    settings: &Settings,
    nodes: &mut Nodes,
    progress: &Progress,
) -> (Vec<RunRecord>, Collector, Vec<String>, anyhow::Result<()>) {
    let mut variants = nodes.variants();
    let mut collector = Collector::new(variants.iter().map(|v| v.key.clone()).collect());
    let mut runs = Vec::new();
    let mut notes = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        let kernel = settings.scenarios.iter().find_map(|s| match s {
            Scenario::RrKernel(p) => Some(*p),
            _ => None,
        });
        warm_up(nodes, &variants, kernel, progress)?;
        let counts = settings.policies.len();
        if counts > 1 && !settings.rounds.is_multiple_of(counts) {
            notes.push(format!(
                "{} rounds for {counts} --policies values: the counts move to another ringway pair \
                 every round, so with a multiple of {counts} rounds each would run on every pair \
                 equally often",
                settings.rounds
            ));
        }
        let applicable = |s: &Scenario| {
            variants
                .iter()
                .filter(|v| !s.needs_proxy() || !v.procs.is_empty())
                .count()
        };
        let total = settings.rounds * settings.scenarios.iter().map(applicable).sum::<usize>();
        let mut done = 0;
        let width = variants.iter().map(|v| v.label.len()).max().unwrap_or(10);
        for round in 0..settings.rounds {
            // A policy sweep moves the counts to other ringway pairs
            // (fresh processes): warm those up like at the start.
            if nodes.rotate_policies(round, &mut |l| progress.line(l))? {
                variants = nodes.variants();
                let moved: Vec<Variant> = variants
                    .iter()
                    .filter(|v| matches!(v.kind, VariantKind::Passthrough | VariantKind::Hbone))
                    .cloned()
                    .collect();
                warm_up(nodes, &moved, None, progress)?;
            }
            for (si, scenario) in settings.scenarios.iter().enumerate() {
                let label = scenario.label();
                let n = variants.len();
                for k in 0..n {
                    let vi = (round + si + k) % n;
                    if scenario.needs_proxy() && variants[vi].procs.is_empty() {
                        continue;
                    }
                    if scenario.needs_fresh_proxy() {
                        // Memory from a clean slate: fresh proxy processes.
                        nodes
                            .restart_for(&variants[vi])
                            .with_context(|| format!("restart {}", variants[vi].label))?;
                        variants = nodes.variants();
                    }
                    let v = &variants[vi];
                    done += 1;
                    let (s2, d, p) = (scenario.clone(), v.dialer.clone(), v.procs.clone());
                    let t0 = Instant::now();
                    let r = rig::in_netns(&v.netns, move || s2.run(&d, &p))?;
                    let seconds = t0.elapsed().as_secs_f64();
                    let head = format!(
                        "[{done:>3}/{total}] round {}/{} {label:<30} {:<width$}",
                        round + 1,
                        settings.rounds,
                        v.label
                    );
                    let note =
                        |what: &str| format!("round {}, {label}, {}: {what}", round + 1, v.label);
                    let (result, error) = match r {
                        Ok(m) => {
                            progress.line(&format!("{head} {}", m.summary));
                            for (def, value) in &m.metrics {
                                collector.add(def, vi, *value);
                            }
                            notes.extend(m.warning.map(|w| note(&w)));
                            (Some(m.raw), None)
                        }
                        Err(e) => {
                            progress.line(&format!("{head} FAILED: {e}"));
                            notes.push(note(&format!("FAILED: {e}")));
                            (None, Some(e.to_string()))
                        }
                    };
                    runs.push(RunRecord {
                        round: round + 1,
                        scenario: label.clone(),
                        variant: v.key.clone(),
                        seconds,
                        result,
                        error,
                    });
                    nodes.check_alive()?;
                }
            }
        }
        Ok(())
    })();
    (runs, collector, notes, result)
}

/// A short, unrecorded pass over every variant: TLS pools, page cache, TCP
/// autotuning. A variant that cannot move bytes fails the suite here.
/// With `kernel` (the rr-kernel scenario's parameters), each proxy column
/// also shows which system-call types it makes (`kernel::discover`).
fn warm_up(
    nodes: &mut Nodes,
    variants: &[Variant],
    kernel: Option<rr::Params>,
    progress: &Progress,
) -> anyhow::Result<()> {
    let warm = [
        Scenario::Throughput(throughput::Params {
            streams: 1,
            bytes_per_stream: 32 << 20,
            direction: Direction::Up,
        }),
        Scenario::Rr(rr::Params {
            size: 1,
            connections: 1,
            limit: Limit::Count(200),
        }),
        Scenario::Connect(connect::Params {
            concurrency: 2,
            limit: Limit::Count(100),
        }),
    ];
    for v in variants {
        for s in &warm {
            let (s2, d, p) = (s.clone(), v.dialer.clone(), v.procs.clone());
            rig::in_netns(&v.netns, move || s2.run(&d, &p))?
                .with_context(|| format!("warm-up of {} ({}) failed", v.label, s.label()))?;
        }
        if let Some(p) = kernel.filter(|_| !v.procs.is_empty()) {
            let (d, procs) = (v.dialer.clone(), v.procs.clone());
            match rig::in_netns(&v.netns, move || crate::kernel::discover(&d, p, &procs))? {
                Ok(types) => {
                    progress.line(&format!("system calls of {}: {}", v.label, types.join(" ")))
                }
                Err(e) => progress.line(&format!("system calls of {}: {e}", v.label)),
            }
        }
        nodes.check_alive()?;
        progress.line(&format!("warmed up {}", v.label));
    }
    Ok(())
}

/// Per-core scaling of the ringway variants across the `--cores` sweep.
fn scaling(metrics: &[MetricSummary], variants: &[Variant]) -> Vec<ScalingRow> {
    let mut rows = Vec::new();
    for (mode, kind) in [
        ("passthrough", VariantKind::Passthrough),
        ("hbone", VariantKind::Hbone),
    ] {
        // With a policy sweep, the columns of the smallest --policies value.
        let of_kind: Vec<&Variant> = variants.iter().filter(|v| v.kind == kind).collect();
        let first_policies = of_kind.first().and_then(|v| v.policies);
        let of_kind: Vec<&Variant> = of_kind
            .into_iter()
            .filter(|v| v.policies == first_policies)
            .collect();
        if of_kind.len() < 2 {
            continue;
        }
        for m in metrics.iter().filter(|m| {
            m.def.higher_is_better
                && (m.def.id.ends_with(".gbps")
                    || m.def.id.ends_with(".rps")
                    || m.def.id.ends_with(".cps"))
        }) {
            let first = m.median_of(&of_kind[0].key);
            let points = of_kind
                .iter()
                .map(|v| {
                    let median = m.median_of(&v.key);
                    let cores = v.cores.clone().unwrap_or_else(|| "all".into());
                    let cpus = v.cores.as_deref().and_then(cpu_count);
                    ScalingPoint {
                        per_cpu: median.zip(cpus).map(|(x, c)| x / c as f64),
                        vs_first: crate::stats::ratio(median, first),
                        cores,
                        cpus,
                        median,
                    }
                })
                .collect();
            rows.push(ScalingRow {
                mode: mode.into(),
                id: m.def.id.clone(),
                scenario: m.def.scenario.clone(),
                metric: m.def.name.clone(),
                points,
            });
        }
    }
    rows
}

/// Every metric of the HBONE columns per `--policies` value, against the
/// smallest value, separately for each `--cores` value.
fn policy_cost(metrics: &[MetricSummary], variants: &[Variant]) -> Vec<PolicyRow> {
    let swept: Vec<&Variant> = variants
        .iter()
        .filter(|v| v.kind == VariantKind::Hbone && v.policies.is_some())
        .collect();
    let mut rows = Vec::new();
    for cores in dedup(&swept.iter().map(|v| v.cores.clone()).collect::<Vec<_>>()) {
        let group: Vec<&Variant> = swept.iter().copied().filter(|v| v.cores == cores).collect();
        if group.len() < 2 {
            continue;
        }
        for m in metrics {
            let first = m.median_of(&group[0].key);
            let points: Vec<PolicyPoint> = group
                .iter()
                .map(|v| {
                    let median = m.median_of(&v.key);
                    PolicyPoint {
                        policies: v.policies.unwrap_or(0),
                        variant: v.key.clone(),
                        median,
                        vs_first: crate::stats::ratio(median, first),
                    }
                })
                .collect();
            if points.iter().all(|p| p.median.is_none()) {
                continue;
            }
            rows.push(PolicyRow {
                cores: cores.clone(),
                id: m.def.id.clone(),
                scenario: m.def.scenario.clone(),
                metric: m.def.name.clone(),
                higher_is_better: m.def.higher_is_better,
                digits: m.def.digits,
                points,
            });
        }
    }
    rows
}

/// One metric: a ringway column against another proxy's column of the
/// same path (passthrough or HBONE), from the same run.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRatio {
    pub id: String,
    pub scenario: String,
    pub metric: String,
    pub higher_is_better: bool,
    pub ringway: String,
    pub peer: String,
    pub ringway_median: Option<f64>,
    pub peer_median: Option<f64>,
    /// ringway ÷ peer.
    pub ratio: Option<f64>,
}

/// The ringway column another proxy's column is compared with: the first
/// of its kind (set 0: the first `--cores` value, the smallest
/// `--policies` count).
fn ringway_counterpart<'a>(peer: &Variant, variants: &'a [Variant]) -> Option<&'a Variant> {
    let kind = peer.compare?;
    variants.iter().find(|v| v.kind == kind)
}

/// Every metric of every ringway column that has a counterpart in another
/// proxy, as ringway ÷ that proxy.
fn vs_peers(metrics: &[MetricSummary], variants: &[Variant]) -> Vec<PeerRatio> {
    let mut rows = Vec::new();
    for peer in variants.iter().filter(|v| v.compare.is_some()) {
        let Some(rw) = ringway_counterpart(peer, variants) else {
            continue;
        };
        for m in metrics {
            let (a, b) = (m.median_of(&rw.key), m.median_of(&peer.key));
            if a.is_none() && b.is_none() {
                continue;
            }
            rows.push(PeerRatio {
                id: m.def.id.clone(),
                scenario: m.def.scenario.clone(),
                metric: m.def.name.clone(),
                higher_is_better: m.def.higher_is_better,
                ringway: rw.key.clone(),
                peer: peer.key.clone(),
                ringway_median: a,
                peer_median: b,
                ratio: crate::stats::ratio(a, b),
            });
        }
    }
    rows
}

/// The ringway ÷ other-proxy table of results.md: direct, then for each
/// other proxy's column its ringway counterpart, itself and the ratio.
fn peers_markdown(rows: &[PeerRatio], metrics: &[MetricSummary], variants: &[Variant]) -> String {
    let label = |key: &str| {
        variants
            .iter()
            .find(|v| v.key == key)
            .map_or(key.to_string(), |v| v.label.clone())
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    for r in rows {
        let pair = (r.ringway.clone(), r.peer.clone());
        if !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    // ztunnel's two columns are one proxy: name it once.
    let proxy = |key: &str| match variants.iter().find(|v| v.key == key) {
        Some(v)
            if matches!(
                v.kind,
                VariantKind::ZtunnelPassthrough | VariantKind::ZtunnelHbone
            ) =>
        {
            "ztunnel".to_string()
        }
        _ => label(key),
    };
    let names = dedup(&pairs.iter().map(|(_, p)| proxy(p)).collect::<Vec<_>>());
    let mut s = format!(
        "\n## ringway ÷ {}\n\n\
         Each other proxy's column next to the ringway column of the same path{}, from the same \
         run: median, (× direct), and **ringway ÷ other**. For ↑ rows a ratio above 1 favours ringway; \
         for ↓ rows (latency, CPU, memory, kernel work) a ratio below 1 does.\n\n| scenario | metric | direct |",
        names.join(", "),
        if variants.iter().any(|v| v.cores.is_some() || v.policies.is_some()) {
            " (its first `--cores` / `--policies` column)"
        } else {
            ""
        }
    );
    for (rw, peer) in &pairs {
        s += &format!(
            " {} | {} | ringway ÷ {} |",
            label(rw),
            label(peer),
            proxy(peer)
        );
    }
    s += "\n|---|---|---:|";
    s += &"---:|---:|---:|".repeat(pairs.len());
    s += "\n";
    let mut heads = RowHeads::default();
    for m in metrics {
        let cell = |key: &str| {
            let v = m.values.iter().find(|v| v.variant == key);
            let r = v
                .and_then(|v| v.ratio_vs_direct)
                .filter(|_| key != "direct");
            with_ratio(v.and_then(|v| v.median), m.def.digits, r, 2)
        };
        let mut line = String::new();
        let mut any = false;
        for (rw, peer) in &pairs {
            let ratio = rows
                .iter()
                .find(|r| r.id == m.def.id && &r.ringway == rw && &r.peer == peer)
                .and_then(|r| r.ratio);
            any |= ratio.is_some();
            line += &format!(
                " {} | {} | {} |",
                cell(rw),
                cell(peer),
                ratio.map_or("–".into(), |x| format!("**{x:.2}×**"))
            );
        }
        if !any {
            continue;
        }
        let head = heads.next(&m.def.scenario, &m.def.name, m.def.higher_is_better);
        s += &format!("{head} {} |{line}\n", cell("direct"));
    }
    s
}

/// How many system-call types the kernel section lists by name.
const TOP_SYSCALLS: usize = 10;

/// The rr-kernel section of results.md: the most frequent system calls
/// per 1000 requests for every proxy column, and how they were counted.
fn kernel_markdown(r: &Report) -> String {
    let types: Vec<&MetricSummary> = r
        .metrics
        .iter()
        .filter(|m| m.def.id.starts_with(SYSCALL_ROW))
        .collect();
    // How the counting went: a run that counted, else the first reason.
    let counted = |run: &&RunRecord| {
        run.result
            .as_ref()
            .is_some_and(|x| x.get("syscalls").is_some_and(|c| !c.is_null()))
    };
    let method = r
        .runs
        .iter()
        .find(counted)
        .into_iter()
        .chain(r.runs.iter())
        .filter_map(|run| run.result.as_ref()?.get("syscall_counter")?.as_str())
        .next();
    let Some(method) = method else {
        return String::new();
    };
    let mut s = String::from("\n## Kernel work per request (rr-kernel)\n\n");
    if types.is_empty() {
        return s + &format!("System calls were {method}.\n");
    }
    s += &format!(
        "System calls per 1000 requests by type (the {TOP_SYSCALLS} most frequent in any column; \
         medians over rounds, so they need not add up to the total above), summed over each \
         column's proxy processes. Counted with: {method}. Context switches: \
         voluntary_ctxt_switches + nonvoluntary_ctxt_switches of every proxy thread in \
         /proc/<tid>/status. ringway does most socket work as io_uring requests, counted apart \
         (io_uring submissions) in the table above.\n\n| system call |"
    );
    let proxies: Vec<&Variant> = r.variants.iter().filter(|v| !v.procs.is_empty()).collect();
    for v in &proxies {
        s += &format!(" {} |", v.label);
    }
    s += "\n|---|";
    s += &"---:|".repeat(proxies.len());
    s += "\n";
    let peak = |m: &MetricSummary| {
        proxies
            .iter()
            .filter_map(|v| m.median_of(&v.key))
            .fold(0.0, f64::max)
    };
    let mut ranked = types.clone();
    ranked.sort_by(|a, b| peak(b).total_cmp(&peak(a)));
    for m in ranked.iter().take(TOP_SYSCALLS) {
        s += &format!("| `{}` |", &m.def.id[SYSCALL_ROW.len()..]);
        for v in &proxies {
            s += &format!(" {} |", fmt_num(m.median_of(&v.key), 0));
        }
        s += "\n";
    }
    s
}

/// The rr-conc load generator section of results.md: how busy its client
/// threads were, per connection count and column.
fn generator_markdown(r: &Report) -> String {
    let rows: Vec<&MetricSummary> = r
        .metrics
        .iter()
        .filter(|m| m.def.id.starts_with(GENERATOR_ROW))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Load generator under rr-conc\n\n\
         CPU time of the client threads over the timed requests ÷ (wall time × threads), median over \
         rounds: the share of its time an average client thread was on a CPU. Well below 100 % the \
         generator waited for responses rather than holding them up; compare the direct column's \
         requests/s above, which the same generator reaches without a proxy.\n\n| scenario |",
    );
    for v in &r.variants {
        s += &format!(" {} |", v.label);
    }
    s += "\n|---|";
    s += &"---:|".repeat(r.variants.len());
    s += "\n";
    for m in rows {
        s += &format!("| {} |", m.def.scenario);
        for v in &r.variants {
            s += &format!(" {} |", fmt_num(m.median_of(&v.key), 0));
        }
        s += "\n";
    }
    s
}

/// The policy-cost tables of results.md.
fn policy_markdown(rows: &[PolicyRow]) -> String {
    let mut s = String::from(
        "\n## Authorization policies on the destination\n\n\
         ringway HBONE with N policies on the server workload (N−1 NAMESPACE-scope DENY \
         policies that never match the client, then, from N = 10, one ALLOW policy that does: \
         every connection walks all of them). Each N runs on its own ringway pair and moves to \
         the next pair every round (restarted and warmed up), so the pairs' differences average \
         out. Median; × is the ratio to the smallest N in this run.\n",
    );
    for group in rows.chunk_by(|a, b| a.cores == b.cores) {
        if let Some(c) = &group[0].cores {
            s += &format!("\n`--cores {c}`:\n");
        }
        s += "\n| scenario | metric |";
        for p in &group[0].points {
            s += &format!(" {} policies |", p.policies);
        }
        s += "\n|---|---|";
        s += &"---:|".repeat(group[0].points.len());
        s += "\n";
        let mut heads = RowHeads::default();
        for row in group {
            s += &heads.next(&row.scenario, &row.metric, row.higher_is_better);
            for (i, p) in row.points.iter().enumerate() {
                let x = p.vs_first.filter(|_| i > 0);
                s += &format!(" {} |", with_ratio(p.median, row.digits, x, 3));
            }
            s += "\n";
        }
    }
    s
}

fn write_charts(out: &Path, r: &Report) -> anyhow::Result<Vec<String>> {
    let mut written = Vec::new();
    let color_of = |key: &str| r.variants.iter().position(|v| v.key == key).unwrap_or(0);
    let label_of = |key: &str| {
        r.variants
            .iter()
            .find(|v| v.key == key)
            .map_or(key.to_string(), |v| v.label.clone())
    };
    // Bars of every scenario × variant: throughput (Gbit/s), and rr-conc
    // (requests/s per connection count).
    for (prefix, suffix, file, title, unit) in [
        (
            "throughput ",
            ".gbps",
            "throughput.svg",
            "Throughput (median over rounds)",
            "Gbit/s",
        ),
        (
            "rr-conc ",
            ".rps",
            "rr-conc.svg",
            "Request/response by concurrent connections (median over rounds)",
            "requests/s",
        ),
    ] {
        let id_prefix = prefix.trim_end().to_string() + ".";
        let mut bars = Vec::new();
        for m in r
            .metrics
            .iter()
            .filter(|m| m.def.id.starts_with(&id_prefix) && m.def.id.ends_with(suffix))
        {
            let short = m.def.scenario.trim_start_matches(prefix).to_string();
            for v in &m.values {
                if let Some(x) = v.median {
                    bars.push(Bar {
                        label: format!("{short} · {}", label_of(&v.variant)),
                        color: color_of(&v.variant),
                        value: x,
                    });
                }
            }
        }
        if !bars.is_empty() {
            charts::bars(&out.join(file), title, unit, &bars)?;
            written.push(file.to_string());
        }
    }
    // Latency percentiles of rr and connect.
    for (id, file, title) in [
        (
            "rr",
            "rr-latency.svg",
            "Request/response latency (median over rounds)",
        ),
        (
            "connect",
            "connect-latency.svg",
            "Connect to first byte (median over rounds)",
        ),
    ] {
        let keys = ["p50", "p90", "p99", "p999", "max"];
        let rows: Vec<&MetricSummary> = keys
            .iter()
            .filter_map(|k| r.metrics.iter().find(|m| m.def.id == format!("{id}.{k}")))
            .collect();
        if rows.len() != keys.len() {
            continue;
        }
        let series: Vec<Series> = r
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| Series {
                label: v.label.clone(),
                color: i,
                values: rows.iter().map(|m| m.median_of(&v.key)).collect(),
            })
            .filter(|s| s.values.iter().any(Option::is_some))
            .collect();
        let title = format!("{title}: {}", rows[0].def.scenario);
        charts::percentiles(
            &out.join(file),
            &title,
            &["p50", "p90", "p99", "p99.9", "max"],
            &series,
        )?;
        written.push(file.to_string());
    }
    Ok(written)
}

fn markdown(r: &Report) -> String {
    let m = &r.machine;
    let mut s = String::from("# ringway-perf suite\n\n");
    let ringway = m.ringway.as_ref().map_or("?".to_string(), |rw| {
        format!(
            "{} @ {}{}",
            rw.version,
            rw.commit
                .as_deref()
                .map_or("unknown commit", |c| &c[..c.len().min(12)]),
            if rw.dirty == Some(true) {
                " (+ uncommitted changes)"
            } else {
                ""
            }
        )
    });
    s += &format!(
        "- **when**: {} ({:.0} s){}\n- **machine**: {} CPUs ({}), {} GiB RAM, Linux {}, {}\n- **ringway**: {ringway}\n",
        m.started_utc,
        r.duration_s,
        if r.settings.quick { ", `--quick`" } else { "" },
        m.nproc,
        m.cpu_model,
        m.mem_total_gib,
        m.kernel,
        m.os,
    );
    s += &format!(
        "- **method**: {} rounds; in every round each scenario runs once per variant, in an order that rotates \
         with round and scenario. Values are medians over rounds; `(0.52×)` is the ratio to direct in this run; \
         ↑ higher is better, ↓ lower is better. Proxy CPU and RSS are summed over the variant's proxy processes \
         (hbone: ringway A + ringway B; ztunnel hbone: ztunnel A + ztunnel B). The load generator, the sink and the proxies share the machine.\n\n",
        r.settings.rounds
    );
    let labels: Vec<String> = r.variants.iter().map(|v| v.label.clone()).collect();
    // Per-type system calls and the load generator have sections of their own.
    let main: Vec<MetricSummary> = r
        .metrics
        .iter()
        .filter(|m| !m.def.id.starts_with(SYSCALL_ROW) && !m.def.id.starts_with(GENERATOR_ROW))
        .cloned()
        .collect();
    s += &markdown_table(&main, &labels);
    if !r.vs_peers.is_empty() {
        s += &peers_markdown(&r.vs_peers, &main, &r.variants);
    }
    s += &kernel_markdown(r);
    s += &generator_markdown(r);

    if !r.scaling.is_empty() {
        s += "\n## Core scaling\n\nringway variants per `--cores` value (median; × vs the first value; per CPU).\n\n";
        let cores: Vec<String> = r.scaling[0]
            .points
            .iter()
            .map(|p| p.cores.clone())
            .collect();
        s += "| mode | scenario | metric |";
        for c in &cores {
            s += &format!(" cores {c} |");
        }
        s += "\n|---|---|---|";
        s += &"---:|".repeat(cores.len());
        s += "\n";
        for row in &r.scaling {
            s += &format!("| {} | {} | {} |", row.mode, row.scenario, row.metric);
            let digits = if row.metric == "Gbit/s" { 2 } else { 0 };
            for p in &row.points {
                let mut cell = fmt_num(p.median, digits);
                if let Some(x) = p.vs_first {
                    cell += &format!(" ({x:.2}×");
                    if let Some(pc) = p.per_cpu {
                        cell += &format!(", {} per CPU", fmt_num(Some(pc), digits));
                    }
                    cell += ")";
                }
                s += &format!(" {cell} |");
            }
            s += "\n";
        }
    }

    if !r.policy_cost.is_empty() {
        s += &policy_markdown(&r.policy_cost);
    }

    s += "\n## Load generator calibration\n\n";
    match &r.calibration {
        Some(c) => {
            s += &format!("{} ({}).\n", c.summary(), c.iperf3_version);
            if !c.pass {
                s += "\n**The generator did not reach 90 % of iperf3 on this machine during this run: \
                      treat the direct column's throughput as a lower bound.**\n";
            }
        }
        None => s += "skipped (`--no-calibrate`).\n",
    }

    s += "\n## Variants\n\n";
    for v in &r.variants {
        s += &format!(
            "- **{}**: {}{}\n",
            v.label,
            describe_variant(v),
            if v.procs.is_empty() {
                String::new()
            } else {
                format!(" (measured pids {:?})", v.procs.roots)
            }
        );
    }
    s += "\nScenarios:\n\n";
    for sc in &r.settings.scenarios {
        s += &format!("- `{}`: {}\n", sc.label(), describe_scenario(sc));
    }

    if !r.charts.is_empty() {
        s += "\n## Charts\n\n";
        for c in &r.charts {
            s += &format!("![{c}]({c})\n\n");
        }
    }
    if !r.notes.is_empty() {
        s += "\n## Notes\n\n";
        for n in &r.notes {
            s += &format!("- {n}\n");
        }
    }
    s
}

fn describe_variant(v: &Variant) -> String {
    let path = match v.kind {
        VariantKind::Direct => {
            "no proxy; the client connects to the non-mesh address on an uncaptured port"
        }
        VariantKind::Passthrough => {
            "captured by node A's nftables → ringway A → plain TCP (splice) to the non-mesh address"
        }
        VariantKind::Hbone => {
            "captured → ringway A → HBONE (mTLS HTTP/2 CONNECT) → ringway B → sink"
        }
        VariantKind::SameNode => {
            "captured → ringway A's same-node fast path (in-process inbound: policies, no TLS) → sink on node A"
        }
        VariantKind::HboneOrigSrc => {
            "as ringway hbone, to a ringway B (--orig-src) that connects to the sink from the client's address"
        }
        VariantKind::Peer => "SOCKS5 CONNECT to the peer proxy in node A",
        VariantKind::ZtunnelPassthrough => {
            "in node ZA: captured by nftables → ztunnel A (:15001) → plain TCP to the non-mesh address in node ZB"
        }
        VariantKind::ZtunnelHbone => {
            "in node ZA: captured → ztunnel A → HBONE (mTLS HTTP/2 CONNECT) → ztunnel B (node ZB) → sink"
        }
    };
    let policies = match v.policies {
        Some(n) if n > 0 => format!("; the destination carries {n} authorization policies"),
        _ => String::new(),
    };
    format!("{path}{policies}; `{}`", v.dialer.describe())
}

fn describe_scenario(s: &Scenario) -> String {
    match s {
        Scenario::Throughput(p) => format!(
            "{} parallel stream(s), {} each, {}; Gbit/s of payload that arrived",
            p.streams,
            fmt_size(p.bytes_per_stream),
            p.direction.as_str()
        ),
        Scenario::Rr(p) => format!(
            "{} connection(s), one {}-byte request then a {}-byte response at a time, for {}",
            p.connections,
            p.size,
            p.size,
            p.limit.describe("requests")
        ),
        Scenario::Connect(p) => format!(
            "{} worker(s), each: connect, 1-byte request, 1-byte response, close; latency from connect() to the response byte",
            p.concurrency
        ),
        Scenario::RrKernel(p) => format!(
            "{} connection(s), {}-byte requests and responses for {}, while the proxies' system calls \
             (perf, by type), io_uring submissions and context switches (/proc) are counted; per 1000 requests",
            p.connections,
            p.size,
            p.limit.describe("requests")
        ),
        Scenario::RrConc(p) => format!(
            "{} connection(s) at once, closed loop: each sends a {}-byte request and the next one as soon as \
             the {}-byte response is in, for {}; driven by {} client thread(s) with an epoll loop each; \
             latency from writing a request to its response's last byte",
            p.connections,
            p.size,
            p.size,
            p.limit.describe("requests"),
            p.threads
        ),
        Scenario::Idle(p) => format!(
            "on freshly restarted proxies (one connection primes the path first): {} connections opened \
             and proved with one exchange each, held idle; proxy RSS growth read after {}, divided by {}",
            p.connections,
            fmt_duration(p.settle),
            p.connections
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_values() {
        assert_eq!(parse_cores("2").unwrap(), "2");
        assert_eq!(parse_cores(" 0-1 ").unwrap(), "0-1");
        assert_eq!(parse_cores("1-1,3-3").unwrap(), "1-1,3-3");
        assert_eq!(parse_cores("2:unpinned").unwrap(), "2:unpinned");
        assert_eq!(parse_cores("1:pinned").unwrap(), "1:pinned");
        assert_eq!(split_pinning("2:unpinned"), ("2", Some(Pinning::Unpinned)));
        assert_eq!(split_pinning("2:pinned"), ("2", Some(Pinning::Pinned)));
        assert_eq!(split_pinning("0-1"), ("0-1", None));
        assert!(parse_cores(":unpinned").is_err());
        assert!(parse_cores("1,2").unwrap_err().contains("ambiguous"));
        assert!(parse_cores("").is_err());
        assert!(parse_cores("a").is_err());
        assert!(parse_cores("1-").is_err());
        assert_eq!(cpu_count("2"), Some(2));
        assert_eq!(cpu_count("0-1"), Some(2));
        assert_eq!(cpu_count("0-1,3-3"), Some(3));
        assert_eq!(cpu_count("3-1"), None);
    }

    fn variant(
        key: &str,
        kind: VariantKind,
        cores: Option<&str>,
        policies: Option<usize>,
    ) -> Variant {
        Variant {
            key: key.into(),
            label: key.into(),
            kind,
            set: None,
            cores: cores.map(String::from),
            dialer: crate::dial::Dialer::direct("127.0.0.1:1".parse().unwrap()),
            procs: crate::procstat::Processes::default(),
            policies,
            netns: "rwpa".into(),
            compare: None,
        }
    }

    #[test]
    fn peer_values() {
        assert_eq!(parse_peer("ztunnel"), Ok(KnownPeer::Ztunnel(None)));
        assert_eq!(
            parse_peer("ztunnel=/opt/zt"),
            Ok(KnownPeer::Ztunnel(Some("/opt/zt".into())))
        );
        assert!(parse_peer("ztunnel=").is_err());
        assert!(parse_peer("envoy").unwrap_err().contains("--peer-cmd"));
    }

    #[test]
    fn ztunnel_columns_compare_with_ringway_of_the_same_path() {
        let mut zp = variant(
            "ztunnel-passthrough",
            VariantKind::ZtunnelPassthrough,
            None,
            None,
        );
        zp.compare = Some(VariantKind::Passthrough);
        zp.label = "ztunnel passthrough".into();
        let mut zh = variant("ztunnel-hbone", VariantKind::ZtunnelHbone, None, None);
        zh.compare = Some(VariantKind::Hbone);
        zh.label = "ztunnel hbone".into();
        let variants = [
            variant("direct", VariantKind::Direct, None, None),
            variant("passthrough", VariantKind::Passthrough, None, None),
            variant("hbone", VariantKind::Hbone, None, None),
            zp,
            zh,
        ];
        let mut c = Collector::new(variants.iter().map(|v| v.key.clone()).collect());
        let rps = crate::report::MetricDef::new("rr.rps", "rr", "requests/s", true, 0);
        let sys = crate::report::MetricDef::new(
            format!("{SYSCALL_ROW}splice"),
            "rr kernel",
            "splice/1k requests",
            false,
            0,
        );
        for (vi, x) in [
            (0, 9000.0),
            (1, 4000.0),
            (2, 2000.0),
            (3, 5000.0),
            (4, 2500.0),
        ] {
            c.add(&rps, vi, x);
        }
        c.add(&sys, 1, 6000.0);
        let metrics = c.summarize(0);
        let rows = vs_peers(&metrics, &variants);
        let r = rows
            .iter()
            .find(|r| r.id == "rr.rps" && r.peer == "ztunnel-hbone")
            .unwrap();
        assert_eq!(r.ringway, "hbone");
        assert_eq!(r.ratio, Some(0.8));
        let md = peers_markdown(&rows, &metrics[..1], &variants);
        assert!(md.contains("## ringway ÷ ztunnel\n"), "{md}");
        assert!(
            md.contains("| passthrough | ztunnel passthrough | ringway ÷ ztunnel | hbone |"),
            "{md}"
        );
        assert!(
            md.contains("| rr | requests/s ↑ | 9000 | 4000 (0.44×) | 5000 (0.56×) | **0.80×** | 2000 (0.22×) | 2500 (0.28×) | **0.80×** |"),
            "{md}"
        );
    }

    #[test]
    fn policy_sweep_compares_hbone_columns_against_the_smallest_count() {
        let variants = [
            variant("direct", VariantKind::Direct, None, None),
            variant("passthrough@1", VariantKind::Passthrough, Some("1"), None),
            variant("hbone@1/p0", VariantKind::Hbone, Some("1"), Some(0)),
            variant("hbone@1/p1000", VariantKind::Hbone, Some("1"), Some(1000)),
            variant("passthrough@2", VariantKind::Passthrough, Some("2"), None),
            variant("hbone@2/p0", VariantKind::Hbone, Some("2"), Some(0)),
            variant("hbone@2/p1000", VariantKind::Hbone, Some("2"), Some(1000)),
        ];
        let mut c = Collector::new(variants.iter().map(|v| v.key.clone()).collect());
        let cps =
            crate::report::MetricDef::new("connect.cps", "connect × 4", "connections/s", true, 0);
        for (vi, x) in [
            (0, 900.0),
            (1, 500.0),
            (2, 400.0),
            (3, 380.0),
            (4, 520.0),
            (5, 410.0),
            (6, 400.0),
        ] {
            c.add(&cps, vi, x);
        }
        let metrics = c.summarize(0);
        let rows = policy_cost(&metrics, &variants);
        assert_eq!(rows.len(), 2, "one row per --cores value");
        assert_eq!(rows[0].cores.as_deref(), Some("1"));
        let p: Vec<usize> = rows[0].points.iter().map(|p| p.policies).collect();
        assert_eq!(p, [0, 1000]);
        assert_eq!(rows[0].points[1].vs_first, Some(0.95));
        let md = policy_markdown(&rows);
        assert!(
            md.contains("| scenario | metric | 0 policies | 1000 policies |"),
            "{md}"
        );
        assert!(
            md.contains("| connect × 4 | connections/s ↑ | 400 | 380 (0.950×) |"),
            "{md}"
        );
        assert!(md.contains("`--cores 2`"), "{md}");
        // Core scaling only looks at the columns without policies.
        let scaling = scaling(&metrics, &variants);
        let hbone = scaling.iter().find(|r| r.mode == "hbone").unwrap();
        let keys: Vec<&str> = hbone.points.iter().map(|p| p.cores.as_str()).collect();
        assert_eq!(keys, ["1", "2"]);
        assert_eq!(hbone.points[1].median, Some(410.0));
    }
}
