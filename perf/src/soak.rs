//! The soak (issue 25, item 8; a benchmark, not a test): K concurrent
//! HBONE connections per core held through ringway and, beside it in the
//! same run, through ztunnel, with paced request/response traffic on a
//! share of them, for a long time; ringway's mesh config churns under it.
//! Every sample interval it records each proxy pair's RSS, open fds, CPU
//! and the latency of the requests of that interval, so a report shows
//! whether anything grows after warm-up.
//!
//! Both proxies are loaded at the same time, each by its own generator
//! thread in its own node pair: on a shared machine, noise then falls on
//! both columns alike, as the suite's rotation does for short scenarios.
//!
//! Sockets per process: the suite's scenarios run the load generator and
//! the sinks as threads of one process, which at 10 k connections holds
//! 20 k sockets, the rig machines' hard RLIMIT_NOFILE (20,000; no
//! CAP_SYS_RESOURCE to raise it). Here each column's generator
//! (`soak-load`) and each node's sink is a process of its own, and each
//! proxy runs on one core by default, so that no process needs more than
//! about 10 k.

use std::collections::VecDeque;
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::dial::Dialer;
use crate::epoll::{self, Epoll};
use crate::latency::{self, Hist, Percentiles};
use crate::nodes::{Kind, Nodes, NodesConfig, SetSpec};
use crate::procstat::{self, Processes};
use crate::wire::Op;
use crate::{rig, ztunnel};

#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// The ringway binary (default: beside ringway-perf, or on PATH).
    #[arg(long)]
    pub ringway: Option<PathBuf>,
    /// The ztunnel binary to soak beside ringway (default: the one
    /// `--peer ztunnel` finds).
    #[arg(long)]
    pub ztunnel: Option<PathBuf>,
    /// Soak ringway alone.
    #[arg(long)]
    pub no_ztunnel: bool,
    /// Cores of each proxy: ringway's `--cores`, ztunnel's
    /// `ZTUNNEL_WORKER_THREADS`. One by default: at 10 k connections per
    /// core, two cores need 20 k sockets in one process, past the rig
    /// machines' hard RLIMIT_NOFILE (20,000, and no CAP_SYS_RESOURCE to
    /// raise it).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Connections held per core of each proxy.
    #[arg(long, default_value_t = 10_000)]
    pub connections_per_core: usize,
    /// Connections opened per second, as clients arriving over time
    /// would (opened at once, their keepalive probes come at once too).
    #[arg(long, default_value_t = 250)]
    pub open_rate: u32,
    /// `net.core.netdev_max_backlog` for the run (restored after; 0: leave
    /// it). The kernel's default, 1000 packets a CPU, also holds the
    /// loopback's and veth's packets in flight; the keepalive probes of
    /// 10 k connections, which the kernel's timer wheel fires in batches
    /// of a few seconds, overflow it and idle connections die after nine
    /// lost probes (see docs/performance/soak.md). It is host-wide.
    #[arg(long, default_value_t = 65_536)]
    pub netdev_max_backlog: u32,
    /// Share of the connections that carry traffic (the rest stay idle).
    #[arg(long, default_value_t = 0.05)]
    pub active_share: f64,
    /// Requests per second over all active connections of one proxy.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Request and response size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: u32,
    #[arg(long, default_value = "30m", value_parser = crate::units::parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "30s", value_parser = crate::units::parse_duration)]
    pub sample_every: Duration,
    /// ringway's mesh config is rewritten this often (0s: never).
    #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration)]
    pub churn_every: Duration,
    /// Samples before this are warm-up: growth is judged after it.
    #[arg(long, default_value = "5m", value_parser = crate::units::parse_duration)]
    pub warmup: Duration,
    #[arg(long, default_value = "perf-results/soak")]
    pub out: PathBuf,
}

/// One proxy pair at one sample.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub seconds: f64,
    /// Both nodes' processes (and their children), bytes.
    pub rss: u64,
    pub fds: usize,
    /// CPU the pair used since the previous sample, in cores (1.0 = one
    /// CPU busy all the time).
    pub cpu_cores: f64,
    pub requests: u64,
    pub requests_per_s: f64,
    /// Requests that failed since the previous sample.
    pub errors: u64,
    /// Of this interval's requests.
    pub latency: Option<Percentiles>,
    /// Config rewrites so far (ringway only).
    pub churns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProxySoak {
    pub proxy: String,
    pub connections: usize,
    pub active: usize,
    pub open_seconds: f64,
    pub samples: Vec<Sample>,
    /// Connections still answering one exchange at the end.
    pub alive_at_end: usize,
    /// What stopped the generator early, if anything did.
    pub failed: Option<String>,
    pub growth: Option<Growth>,
}

/// How RSS and fds moved after warm-up: the first sample after it
/// against the last, and the least-squares slope over those samples.
#[derive(Clone, Debug, Serialize)]
pub struct Growth {
    pub rss_first: u64,
    pub rss_last: u64,
    pub rss_mib_per_hour: f64,
    pub fds_first: usize,
    pub fds_last: usize,
    pub fds_per_hour: f64,
    pub p99_first_us: Option<f64>,
    pub p99_last_us: Option<f64>,
}

/// What a generator thread shares with the sampler.
#[derive(Default)]
struct Shared {
    hist: Mutex<Option<Hist>>,
    requests: AtomicU64,
    errors: AtomicU64,
}

impl Shared {
    /// This interval's histogram, leaving an empty one.
    fn take(&self) -> Option<Hist> {
        let mut h = self.hist.lock().unwrap();
        h.replace(latency::new_hist())
    }
}

/// One connection of the generator.
struct Conn {
    stream: TcpStream,
    /// When the request in flight started; None when none is.
    since: Option<Instant>,
    got: usize,
}

/// Opens `a.connections` connections (each proves itself with one
/// exchange), then sends requests on the first `a.active` at `a.rate` per
/// second, spread evenly, until `stop`; then checks every connection once
/// more and returns how many answered.
fn generate(
    a: &LoadArgs,
    shared: &Shared,
    opened: &dyn Fn(f64),
    stop: &AtomicBool,
) -> io::Result<usize> {
    let dialer = Dialer::direct(a.target).bind(a.bind);
    let (n, active, rate, size) = (a.connections, a.active, a.rate, a.size as usize);
    let start = Instant::now();
    let mut conns = Vec::with_capacity(n);
    let req = vec![0x33u8; size];
    let mut resp = vec![0u8; size];
    let open_rate = f64::from(a.open_rate.max(1));
    for i in 0..n {
        let due = Duration::from_secs_f64(i as f64 / open_rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let mut s = dialer
            .connect()
            .map_err(|e| io::Error::new(e.kind(), format!("connection {i}: {e}")))?;
        Op::Rr {
            request: size as u32,
            response: size as u32,
        }
        .write_to(&mut s)?;
        s.write_all(&req)?;
        s.read_exact(&mut resp)
            .map_err(|e| io::Error::new(e.kind(), format!("connection {i}: {e}")))?;
        conns.push(Conn {
            stream: s,
            since: None,
            got: 0,
        });
    }
    opened(start.elapsed().as_secs_f64());
    *shared.hist.lock().unwrap() = Some(latency::new_hist());

    let ep = Epoll::new()?;
    for (token, c) in conns.iter().enumerate().take(active) {
        c.stream.set_nonblocking(true)?;
        ep.add(c.stream.as_raw_fd(), epoll::IN, token as u64)?;
    }
    let mut events = epoll::events(256);
    let mut free: VecDeque<usize> = (0..active).collect();
    let mut local = latency::new_hist();
    let began = Instant::now();
    let mut sent: u64 = 0;
    let mut flushed = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // Open loop: the requests due by now go out on free connections;
        // when none is free the schedule slips (counted as latency by the
        // requests that wait).
        let due = (began.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let Some(i) = free.pop_front() else { break };
            let c = &mut conns[i];
            match c.stream.write(&req) {
                Ok(w) if w == size => {
                    c.since = Some(Instant::now());
                    c.got = 0;
                    sent += 1;
                }
                Ok(_) | Err(_) => {
                    // A 64-byte write into an empty socket buffer either
                    // goes whole or the connection is broken.
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    let _ = ep.delete(c.stream.as_raw_fd());
                }
            }
        }
        let k = ep.wait(&mut events, 1)?;
        for ev in &events[..k] {
            let i = ev.u64 as usize;
            let c = &mut conns[i];
            loop {
                match c.stream.read(&mut resp[c.got..]) {
                    Ok(0) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                        let _ = ep.delete(c.stream.as_raw_fd());
                        c.since = None;
                        break;
                    }
                    Ok(r) => {
                        c.got += r;
                        if c.got == size {
                            if let Some(t0) = c.since.take() {
                                latency::record(&mut local, t0.elapsed());
                                shared.requests.fetch_add(1, Ordering::Relaxed);
                            }
                            c.got = 0;
                            free.push_back(i);
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                        let _ = ep.delete(c.stream.as_raw_fd());
                        c.since = None;
                        break;
                    }
                }
            }
        }
        if flushed.elapsed() >= Duration::from_millis(200) {
            if let Some(h) = shared.hist.lock().unwrap().as_mut() {
                let _ = h.add(&local);
            }
            local.reset();
            flushed = Instant::now();
        }
    }
    // Every connection, active or idle, answers one more exchange.
    let mut alive = 0;
    for c in &mut conns {
        let s = &mut c.stream;
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        // An active one may still have a response in flight: drain it.
        if c.since.is_some() {
            let _ = s.read_exact(&mut resp[c.got..]);
        }
        if s.write_all(&req).is_ok() && s.read_exact(&mut resp).is_ok() {
            alive += 1;
        }
    }
    Ok(alive)
}

/// Open fds of the processes and their children.
fn open_fds(procs: &Processes) -> usize {
    procstat::with_descendants(&procs.roots)
        .into_iter()
        .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
        .map(|d| d.count())
        .sum()
}

/// Least-squares slope of `ys` over `xs` (per unit of x).
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let num: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

fn growth(samples: &[Sample], warmup: Duration) -> Option<Growth> {
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.seconds >= warmup.as_secs_f64())
        .collect();
    let (first, last) = (after.first()?, after.last()?);
    let xs: Vec<f64> = after.iter().map(|s| s.seconds / 3600.0).collect();
    let rss: Vec<f64> = after.iter().map(|s| s.rss as f64 / 1048576.0).collect();
    let fds: Vec<f64> = after.iter().map(|s| s.fds as f64).collect();
    let p99 = |s: &Sample| s.latency.as_ref().map(|l| l.p99_us);
    Some(Growth {
        rss_first: first.rss,
        rss_last: last.rss,
        rss_mib_per_hour: slope(&xs, &rss),
        fds_first: first.fds,
        fds_last: last.fds,
        fds_per_hour: slope(&xs, &fds),
        p99_first_us: p99(first),
        p99_last_us: p99(last),
    })
}

/// The hidden `soak-load` subcommand: one column's load generator, a
/// process of its own (see the module's comment), run inside the column's
/// namespace. It reports on stdout, one JSON line each: `opened` once the
/// connections are up, `interval` every `--report-every`, `alive` at the
/// end; it stops when its stdin closes.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    #[arg(long)]
    pub target: SocketAddr,
    #[arg(long)]
    pub bind: Option<IpAddr>,
    #[arg(long)]
    pub connections: usize,
    #[arg(long)]
    pub active: usize,
    #[arg(long)]
    pub rate: u32,
    #[arg(long)]
    pub size: u32,
    #[arg(long)]
    pub open_rate: u32,
    #[arg(long, value_parser = crate::units::parse_duration)]
    pub report_every: Duration,
}

/// A line of `soak-load`'s output.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadReport {
    Opened {
        seconds: f64,
    },
    Interval {
        requests: u64,
        errors: u64,
        latency: Option<Percentiles>,
    },
    Alive {
        connections: usize,
    },
    Failed {
        error: String,
    },
}

fn emit(r: &LoadReport) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap());
    let _ = out.flush();
}

pub fn load(a: LoadArgs) -> anyhow::Result<()> {
    crate::raise_fd_limit();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    std::thread::spawn(move || {
        let _ = io::copy(&mut io::stdin(), &mut io::sink());
        st.store(true, Ordering::Relaxed);
    });
    let shared = Arc::new(Shared::default());
    let (sh, st) = (shared.clone(), stop.clone());
    let every = a.report_every;
    let reporter = std::thread::spawn(move || {
        // Reports start once the connections are open (the histogram
        // exists) and end with the generator.
        let mut last = Instant::now();
        while !st.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() < every {
                continue;
            }
            last = Instant::now();
            if sh.hist.lock().unwrap().is_none() {
                continue;
            }
            let hist = sh.take();
            emit(&LoadReport::Interval {
                requests: sh.requests.load(Ordering::Relaxed),
                errors: sh.errors.load(Ordering::Relaxed),
                latency: hist.filter(|h| !h.is_empty()).map(|h| Percentiles::of(&h)),
            });
        }
    });
    let opened = |seconds: f64| emit(&LoadReport::Opened { seconds });
    let out = generate(&a, &shared, &opened, &stop);
    stop.store(true, Ordering::Relaxed);
    let _ = reporter.join();
    match out {
        Ok(connections) => emit(&LoadReport::Alive { connections }),
        Err(e) => emit(&LoadReport::Failed {
            error: e.to_string(),
        }),
    }
    Ok(())
}

/// One column: a proxy pair, its load generator and what it reported.
struct Column {
    proxy: String,
    procs: Processes,
    child: Child,
    reports: mpsc::Receiver<LoadReport>,
    opened: Option<f64>,
    failed: Option<String>,
    alive: Option<usize>,
    /// The generator's latest counts and the intervals' latency not yet
    /// taken into a sample.
    requests: u64,
    errors: u64,
    latency: Option<Percentiles>,
    samples: Vec<Sample>,
    cpu_before: f64,
    requests_before: u64,
    errors_before: u64,
}

impl Column {
    /// Takes what the generator reported so far.
    fn drain(&mut self) {
        while let Ok(r) = self.reports.try_recv() {
            match r {
                LoadReport::Opened { seconds } => self.opened = Some(seconds),
                LoadReport::Interval {
                    requests,
                    errors,
                    latency,
                } => {
                    self.requests = requests;
                    self.errors = errors;
                    if latency.is_some() {
                        self.latency = latency;
                    }
                }
                LoadReport::Alive { connections } => self.alive = Some(connections),
                LoadReport::Failed { error } => self.failed = Some(error),
            }
        }
    }

    fn ended(&mut self) -> bool {
        self.failed.is_some() || matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

fn spawn_load(
    netns: &str,
    dialer: &Dialer,
    n: usize,
    active: usize,
    a: &SoakArgs,
) -> anyhow::Result<(Child, mpsc::Receiver<LoadReport>)> {
    let me = std::env::current_exe()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns])
        .arg(me)
        .arg("soak-load")
        .args(["--target", &dialer.target.to_string()])
        .args(["--connections", &n.to_string()])
        .args(["--active", &active.to_string()])
        .args(["--rate", &a.rate.to_string()])
        .args(["--size", &a.size.to_string()])
        .args(["--open-rate", &a.open_rate.to_string()])
        .args([
            "--report-every",
            &format!("{}ms", a.sample_every.as_millis()),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(b) = dialer.bind {
        cmd.args(["--bind", &b.to_string()]);
    }
    let mut child = cmd.spawn().context("starting soak-load")?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<LoadReport>(&line) {
                Ok(r) => {
                    if tx.send(r).is_err() {
                        break;
                    }
                }
                Err(_) => eprintln!("soak-load: {line}"),
            }
        }
    });
    Ok((child, rx))
}

/// The host's `net.core.netdev_max_backlog`, set for the soak and put
/// back when dropped.
struct Backlog {
    before: Option<String>,
}

const BACKLOG: &str = "/proc/sys/net/core/netdev_max_backlog";

impl Backlog {
    fn set(want: u32) -> anyhow::Result<Backlog> {
        if want == 0 {
            return Ok(Backlog { before: None });
        }
        let before = std::fs::read_to_string(BACKLOG)?.trim().to_string();
        std::fs::write(BACKLOG, want.to_string())
            .with_context(|| format!("setting {BACKLOG} to {want}"))?;
        Ok(Backlog {
            before: Some(before),
        })
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        if let Some(b) = &self.before {
            let _ = std::fs::write(BACKLOG, b);
        }
    }
}

/// Packets the kernel dropped because a CPU's backlog was full, all CPUs
/// (the second column of `/proc/net/softnet_stat`, hexadecimal).
fn softnet_drops() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/net/softnet_stat").ok()?;
    t.lines()
        .map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .sum()
}

pub fn run(a: SoakArgs) -> anyhow::Result<()> {
    rig::require_root("ringway-perf soak")?;
    let _backlog = Backlog::set(a.netdev_max_backlog)?;
    let drops_before = softnet_drops();
    let bin = crate::ringway_bin(a.ringway.as_deref())?;
    crate::raise_fd_limit();
    let cores = a.cores.unwrap_or(1);
    let n = a.connections_per_core * cores;
    let active = ((n as f64 * a.active_share).round() as usize).clamp(1, n);
    // ringway's default per-core connection cap assumes four fds per
    // connection (a spliced passthrough); an HBONE tunnel holds one on
    // each node. The rig's processes inherit the environment.
    std::env::set_var(
        "RINGWAY_MAX_CONNECTIONS_PER_CORE",
        (a.connections_per_core + a.connections_per_core / 5).to_string(),
    );
    std::env::set_var("ZTUNNEL_WORKER_THREADS", cores.to_string());
    let zt = if a.no_ztunnel {
        None
    } else {
        Some(ztunnel::locate(a.ztunnel.as_deref())?)
    };
    std::fs::create_dir_all(&a.out)?;
    let t0 = Instant::now();
    let say = |l: &str| eprintln!("[{:>7.1}s] {l}", t0.elapsed().as_secs_f64());
    let mut nodes = Nodes::start(
        &NodesConfig {
            ringway: bin.clone(),
            // A policy count gives the pair a config file of its own (the
            // churn rewrites it), not the one ztunnel reads.
            sets: vec![SetSpec {
                cores: Some(cores.to_string()),
                policies: Some(0),
                ..SetSpec::default()
            }],
            log_dir: a.out.join("logs"),
            // Each config the churn publishes is logged, and counted below.
            log_level: "warn,ringway_controlplane=info".into(),
            peer: None,
            ztunnel: zt.clone(),
            same_node: false,
            orig_src: false,
            sink_process: Some(std::env::current_exe()?),
        },
        &mut |l| say(l),
    )?;
    let mut columns = Vec::new();
    for v in nodes.variants() {
        let name = match v.kind {
            Kind::Hbone => "ringway",
            Kind::ZtunnelHbone => "ztunnel",
            _ => continue,
        };
        say(&format!(
            "{name}: opening {n} connections ({active} active, {} requests/s) to {}",
            a.rate,
            v.dialer.describe()
        ));
        let (child, reports) = spawn_load(&v.netns, &v.dialer, n, active, &a)?;
        columns.push(Column {
            proxy: name.into(),
            procs: v.procs.clone(),
            child,
            reports,
            opened: None,
            failed: None,
            alive: None,
            requests: 0,
            errors: 0,
            latency: None,
            samples: Vec::new(),
            cpu_before: 0.0,
            requests_before: 0,
            errors_before: 0,
        });
    }
    anyhow::ensure!(!columns.is_empty(), "no HBONE column in the rig");

    // Wait until every column holds its connections.
    let mut broken = false;
    while !broken && columns.iter().any(|c| c.opened.is_none()) {
        std::thread::sleep(Duration::from_millis(200));
        for c in &mut columns {
            c.drain();
            if c.opened.is_none() && c.ended() {
                say(&format!(
                    "{}: the generator stopped: {}",
                    c.proxy,
                    c.failed.as_deref().unwrap_or("exited")
                ));
                broken = true;
            }
        }
    }
    for c in &mut columns {
        c.cpu_before = c.procs.cpu_seconds()?.unwrap_or(0.0);
        if let Some(s) = c.opened {
            say(&format!("{}: {n} connections open in {s:.1}s", c.proxy));
        }
    }

    let began = Instant::now();
    let mut last_sample = Instant::now();
    let mut last_churn = Instant::now();
    let mut churns = 0u64;
    while !broken && began.elapsed() < a.duration {
        std::thread::sleep(Duration::from_millis(250));
        if !a.churn_every.is_zero() && last_churn.elapsed() >= a.churn_every {
            churns += 1;
            nodes.churn_config(churns as usize)?;
            last_churn = Instant::now();
        }
        if last_sample.elapsed() < a.sample_every {
            continue;
        }
        let dt = last_sample.elapsed().as_secs_f64();
        last_sample = Instant::now();
        for c in &mut columns {
            c.drain();
            if c.ended() {
                say(&format!(
                    "{}: the generator stopped: {}",
                    c.proxy,
                    c.failed.as_deref().unwrap_or("exited")
                ));
                broken = true;
            }
            let cpu = c.procs.cpu_seconds()?.unwrap_or(0.0);
            let s = Sample {
                seconds: began.elapsed().as_secs_f64(),
                rss: c.procs.rss_bytes()?.unwrap_or(0),
                fds: open_fds(&c.procs),
                cpu_cores: (cpu - c.cpu_before) / dt,
                requests: c.requests - c.requests_before,
                requests_per_s: (c.requests - c.requests_before) as f64 / dt,
                errors: c.errors - c.errors_before,
                latency: c.latency.take(),
                churns: if c.proxy == "ringway" { churns } else { 0 },
            };
            say(&format!(
                "{:<8} rss {:>7.1} MiB  fds {:>6}  cpu {:>5.2}  req/s {:>7.0}  p99 {:>8} µs  errors {}",
                c.proxy,
                s.rss as f64 / 1048576.0,
                s.fds,
                s.cpu_cores,
                s.requests_per_s,
                s.latency
                    .as_ref()
                    .map_or("-".into(), |l| format!("{:.0}", l.p99_us)),
                s.errors
            ));
            c.cpu_before = cpu;
            c.requests_before = c.requests;
            c.errors_before = c.errors;
            c.samples.push(s);
        }
    }
    // Closing stdin stops the generators; each checks its connections.
    let mut results = Vec::new();
    for mut c in columns {
        drop(c.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(120);
        while c.alive.is_none() && c.failed.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            c.drain();
            if matches!(c.child.try_wait(), Ok(Some(_))) {
                c.drain();
                break;
            }
        }
        let _ = c.child.kill();
        let _ = c.child.wait();
        let alive = c.alive.unwrap_or(0);
        if let Some(e) = &c.failed {
            say(&format!("{}: generator failed: {e}", c.proxy));
        }
        say(&format!(
            "{}: {alive} of {n} connections alive at the end",
            c.proxy
        ));
        results.push(ProxySoak {
            growth: growth(&c.samples, a.warmup),
            proxy: c.proxy,
            connections: n,
            active,
            open_seconds: c.opened.unwrap_or(f64::NAN),
            samples: c.samples,
            alive_at_end: alive,
            failed: c.failed,
        });
    }
    drop(nodes);
    // What ringway made of the churn: its "published local config" lines.
    let loads = |node: &str| {
        std::fs::read_to_string(a.out.join("logs").join(format!("ringway-{node}0.log")))
            .map(|l| l.matches("published local config").count())
            .unwrap_or(0)
    };
    let report = Report {
        netdev_max_backlog: a.netdev_max_backlog,
        softnet_drops: softnet_drops()
            .zip(drops_before)
            .map(|(after, before)| after.saturating_sub(before)),
        churns,
        ringway_configs_published: [loads("a"), loads("b")],
        machine: crate::machine::describe(Some(&bin)),
        cores,
        connections_per_core: a.connections_per_core,
        open_rate: a.open_rate,
        rate: a.rate,
        size: a.size,
        duration_s: a.duration.as_secs_f64(),
        churn_every_s: a.churn_every.as_secs_f64(),
        warmup_s: a.warmup.as_secs_f64(),
        proxies: results,
    };
    let json = a.out.join("soak.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let md = a.out.join("soak.md");
    std::fs::write(&md, markdown(&report))?;
    say(&format!("wrote {} and {}", json.display(), md.display()));
    anyhow::ensure!(!broken, "a generator stopped early: see above");
    Ok(())
}

#[derive(Serialize)]
pub struct Report {
    pub machine: crate::machine::Machine,
    pub cores: usize,
    pub connections_per_core: usize,
    /// The backlog the run had (0: the host's own), and the packets the
    /// host dropped for a full backlog during it (anyone's).
    pub netdev_max_backlog: u32,
    pub softnet_drops: Option<u64>,
    pub open_rate: u32,
    pub rate: u32,
    pub size: u32,
    pub duration_s: f64,
    pub churn_every_s: f64,
    pub warmup_s: f64,
    /// Config rewrites, and the configs ringway A and B published (the
    /// first load included; rewrites closer than the watcher's poll
    /// interval may fold into one).
    pub churns: u64,
    pub ringway_configs_published: [usize; 2],
    pub proxies: Vec<ProxySoak>,
}

fn markdown(r: &Report) -> String {
    let mut s = format!(
        "# Soak\n\n{} connections per core × {} cores per proxy, {} requests/s of {} B on a share \
         of them, {:.1} min, ringway's config rewritten every {:.0} s (ztunnel's is not: the \
         rig gives it a local file, and churning it through xDS is not built), growth judged \
         after {:.1} min of warm-up.\n\n",
        r.connections_per_core,
        r.cores,
        r.rate,
        r.size,
        r.duration_s / 60.0,
        r.churn_every_s,
        r.warmup_s / 60.0
    );
    s += &format!(
        "net.core.netdev_max_backlog {} during the run (0: the host's); {} packets dropped \
         host-wide for a full backlog meanwhile.\n\n",
        r.netdev_max_backlog,
        r.softnet_drops.map_or("?".into(), |d| d.to_string())
    );
    s += &format!(
        "{} config rewrites; ringway A published {} configs and ringway B {} (the first load \
         included).\n\n",
        r.churns, r.ringway_configs_published[0], r.ringway_configs_published[1]
    );
    for p in &r.proxies {
        s += &format!(
            "## {}\n\n{} connections ({} active), opened in {:.1} s; {} alive at the end.\n\n",
            p.proxy, p.connections, p.active, p.open_seconds, p.alive_at_end
        );
        if let Some(g) = &p.growth {
            s += &format!(
                "After warm-up: RSS {:.1} → {:.1} MiB (slope {:+.1} MiB/h), fds {} → {} (slope {:+.0}/h), \
                 p99 {} → {} µs.\n\n",
                g.rss_first as f64 / 1048576.0,
                g.rss_last as f64 / 1048576.0,
                g.rss_mib_per_hour,
                g.fds_first,
                g.fds_last,
                g.fds_per_hour,
                g.p99_first_us.map_or("-".into(), |v| format!("{v:.0}")),
                g.p99_last_us.map_or("-".into(), |v| format!("{v:.0}")),
            );
        }
        s += "| t (s) | RSS MiB | fds | CPU (cores) | req/s | p50 µs | p99 µs | errors |\n";
        s += "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
        for x in &p.samples {
            let (p50, p99) = x.latency.as_ref().map_or(("-".into(), "-".into()), |l| {
                (format!("{:.0}", l.p50_us), format!("{:.0}", l.p99_us))
            });
            s += &format!(
                "| {:.0} | {:.1} | {} | {:.2} | {:.0} | {} | {} | {} |\n",
                x.seconds,
                x.rss as f64 / 1048576.0,
                x.fds,
                x.cpu_cores,
                x.requests_per_s,
                p50,
                p99,
                x.errors
            );
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        assert!((slope(&[0.0, 1.0, 2.0], &[1.0, 3.0, 5.0]) - 2.0).abs() < 1e-9);
        assert_eq!(slope(&[0.0, 1.0, 2.0], &[4.0, 4.0, 4.0]), 0.0);
        assert_eq!(slope(&[1.0], &[4.0]), 0.0);
    }
}
