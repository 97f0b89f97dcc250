//! `inpod-bench`: what ringway's in-pod mode costs, in one run (issue 13,
//! "Benchmark"). Needs root.
//!
//! 1. **Pod enrolment.** One ringway `--inpod` (every CPU) in a namespace
//!    of its own, enrolled through the in-test node agent
//!    (`ringway_rig::zds`, a real SEQPACKET socket and SCM_RIGHTS). After
//!    `snapshot_sent`, N fresh pod namespaces (`--pods`; lo up and a veth
//!    with an IPv4 address, IPv6 off, unless `--no-pod-veth` or
//!    `--pod-ipv6`) are added one at a time, as istio-cni does: the time
//!    from sending `add` to the ack (ringway acks once every core accepts
//!    on the pod's listeners), then `del` of each. VmRSS and open
//!    descriptors of the process with 0 pods, with N pods and after
//!    deleting them all, each 1 s after the last change: per pod =
//!    (with N − with 0) / N. The first and last pod must answer on
//!    15001/15006/15008 after their ack and refuse after their del.
//! 2. **In-pod vs node-level capture**, side by side, each column on a pod
//!    pair of its own (a veth pair, 10.253.<n>.1 → 10.253.<n>.2):
//!
//!    ```text
//!    in-pod (n=1)      istio-cni's in-pod rules (scripts/inpod-rules.sh) in
//!                      both pods; a ringway --inpod per node (each in a
//!                      namespace of its own) enrolls its pod and listens
//!                      inside it; its default --orig-src (on)
//!    node-level (n=2)  ringway inside the client pod, egress captured to
//!                      its :15001; ringway inside the server pod,
//!                      --inbound-addr <server pod>:15008
//!    in-pod, --orig-src=false (n=3; not with --no-orig-src-column)
//!                      as in-pod, the application sees the server pod's
//!                      own address as its peer, as under node-level
//!    ```
//!
//!    One mesh config lists every workload (with its node), one CA
//!    directory serves every ringway. The sink (`server::spawn`) listens on
//!    the server pod's address inside the server pod; the load generator
//!    runs inside the client pod. After a warm-up, each path must have
//!    gone through both its ringways (each spent CPU, and the client pod
//!    holds an HBONE connection to the server pod's 15008). Scenarios:
//!    throughput (1 stream up), rr (1-byte request/response on one warm
//!    connection), connect (a new connection per request, one at a time),
//!    each with the CPU of that column's two ringways. `--rounds` rounds;
//!    within a round each scenario runs on every column back to back, the
//!    column that goes first rotating from round to round. Medians per
//!    column, and each in-pod column ÷ node-level. Then (unless
//!    `--no-syscalls`) one more connect and rr run per column with the
//!    ringways' system calls counted by `perf` (total, `setns`, `socket`,
//!    io_uring submissions) per connection and per request.
//!
//! Every ringway runs with RUST_LOG=warn (`--log-level`): no access log
//! lines in any column. Namespaces, processes and the scratch directory go
//! away on exit, on error and on SIGINT / SIGTERM / SIGHUP.
//!
//! Output: a Markdown table on stdout (and in `--out DIR/inpod.txt`), every
//! number in `DIR/inpod.json`, the ringways' logs in `DIR/logs/`.
//!
//! Run: `sudo target/release/inpod-bench --out perf-results/inpod --rounds 3`

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Parser;
use ringway_perf::dial::Dialer;
use ringway_perf::latency::{self, Percentiles};
use ringway_perf::nodes::{node_pair, ringway_args, strings, Scratch};
use ringway_perf::procstat::{self, Processes};
use ringway_perf::report::{fmt_num, Collector, MetricDef};
use ringway_perf::rig::{self, Netns};
use ringway_perf::rr::Limit;
use ringway_perf::scenario::{Measured, Scenario};
use ringway_perf::supervise::{bound_file, Supervised};
use ringway_perf::units::{fmt_size, parse_size};
use ringway_perf::{connect, kernel, machine, rr, server, throughput};
use ringway_rig::zds::{Agent, AgentConn};
use serde_json::{json, Value};

#[derive(Parser, Clone)]
#[command(
    name = "inpod-bench",
    about = "ringway in-pod mode: pod add/del latency, memory and descriptors per pod, and in-pod vs node-level capture side by side"
)]
struct Args {
    /// The ringway binary.
    #[arg(long, default_value = "target/release/ringway")]
    ringway: PathBuf,
    /// Results directory (inpod.json, inpod.txt, logs/).
    #[arg(long, default_value = "perf-results/inpod")]
    out: PathBuf,
    /// Pods to enrol for the add/del latency and per-pod memory.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Pods get lo only (no veth, no address).
    #[arg(long)]
    no_pod_veth: bool,
    /// Pods get an IPv6 address too (dual stack: ringway then also
    /// listens on [::] in each pod).
    #[arg(long, conflicts_with = "no_pod_veth")]
    pod_ipv6: bool,
    /// Rounds of the side-by-side comparison.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Throughput: bytes sent per run (one stream, client → server).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    bytes: u64,
    /// rr: requests per run (1 byte each way, one connection).
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// connect: connections per run (one at a time).
    #[arg(long, default_value_t = 2_000)]
    connections: u64,
    /// No third column (in-pod with --orig-src=false).
    #[arg(long)]
    no_orig_src_column: bool,
    /// No system-call counts (they need `perf`).
    #[arg(long)]
    no_syscalls: bool,
    /// RUST_LOG for every ringway.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// Only the pod enrolment part.
    #[arg(long, conflicts_with = "skip_pods")]
    skip_compare: bool,
    /// Only the side-by-side part.
    #[arg(long)]
    skip_pods: bool,
}

// ---------------------------------------------------------------------------
// Cleanup on signals (drop guards cover normal exit, errors and panics).
// Everything this process makes is named after its pid: the namespaces
// (`<prefix>-<pid>-<n>`) and the scratch directory.

/// The scratch directory's prefix (config, CA, ZDS sockets).
const SCRATCH: &str = "inpod-bench";

/// The write end of the self-pipe the signal handler writes to.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let b = sig as u8;
    // SAFETY: write(2) is async-signal-safe; the descriptor stays open.
    unsafe {
        libc::write(
            SIGNAL_PIPE.load(Ordering::Relaxed),
            &b as *const u8 as *const libc::c_void,
            1,
        );
    }
}

/// On SIGINT, SIGTERM or SIGHUP: kills every process this one started
/// (ringways, perf), deletes its namespaces and its scratch directory,
/// and exits. A handler, not a blocked mask: children inherit a signal
/// mask (perf and ringway would then ignore their own SIGINT / SIGTERM),
/// while handlers are reset at exec.
fn cleanup_on_signals() {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors; sigaction installs a handler
    // that only calls write(2).
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return;
        }
        SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
    }
    let read_end = fds[0];
    std::thread::spawn(move || {
        let mut b = 0u8;
        // SAFETY: reads one byte into a local from our pipe.
        let n = unsafe { libc::read(read_end, &mut b as *mut u8 as *mut libc::c_void, 1) };
        if n != 1 {
            return;
        }
        eprintln!("inpod-bench: signal {b}: cleaning up");
        let me = std::process::id();
        for pid in procstat::with_descendants(&[me]) {
            if pid != me {
                // SAFETY: kill(2) of a process we started.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output();
        let list = ip(&["netns", "list"]).map(|o| o.stdout).unwrap_or_default();
        let mine = format!("-{me}-");
        for line in String::from_utf8_lossy(&list).lines() {
            match line.split_whitespace().next() {
                Some(ns) if ns.contains(&mine) => drop(ip(&["netns", "del", ns])),
                _ => {}
            }
        }
        let _ = std::fs::remove_dir_all(Scratch::path(SCRATCH));
        std::process::exit(128 + b as i32);
    });
}

// ---------------------------------------------------------------------------

static T0: OnceLock<Instant> = OnceLock::new();

fn progress(msg: &str) {
    let t = T0.get_or_init(Instant::now).elapsed();
    eprintln!("[inpod-bench {:6.1}s] {msg}", t.as_secs_f64());
}

/// VmRSS (KiB) and open descriptors of `pid`.
fn sample(pid: u32) -> anyhow::Result<(u64, usize)> {
    let rss = procstat::rss_bytes(pid)? / 1024;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((rss, fds))
}

/// Samples in milliseconds, and their percentiles (from a histogram).
fn summary_ms(v: Vec<f64>) -> Value {
    let mut h = latency::new_hist();
    for &ms in &v {
        latency::record(&mut h, Duration::from_secs_f64(ms / 1e3));
    }
    let p = Percentiles::of(&h);
    json!({
        // In request order, to the microsecond.
        "samples_ms": v.iter().map(|x| (x * 1e3).round() / 1e3).collect::<Vec<_>>(),
        "count": p.count,
        "p50_ms": p.p50_us / 1e3,
        "p90_ms": p.p90_us / 1e3,
        "p99_ms": p.p99_us / 1e3,
        "max_ms": p.max_us / 1e3,
        "mean_ms": p.mean_us / 1e3,
    })
}

/// Lines of `log` that contain `needle`.
fn log_lines_with(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// The `cores` ringway wrote into its --bound-addrs-file.
fn cores_of(logs: &Path, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(bound_file(logs, name)).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["cores"].as_u64()
}

/// A ringway `--inpod` (and `extra`) in `node` as `node_name`, with the
/// agent it connects to at `sock` in the scratch folder: both parts
/// enrol pods this way. Returns once ringway took the (empty) snapshot.
fn start_inpod(
    b: &Bench,
    node: &Netns,
    name: &str,
    sock: &str,
    config: &Path,
    node_name: &str,
    extra: Option<String>,
) -> anyhow::Result<(Agent, Supervised, AgentConn)> {
    let agent = Agent::listen(&b.work.join(sock));
    let mut args = strings(&["--inpod", "--inpod-uds", agent.path.to_str().unwrap()]);
    args.extend(ringway_args(config, &b.work.join("ca"), node_name, b.side));
    args.extend(extra);
    let rw = Supervised::ringway(node, b.bin, name, &args, &b.a.log_level, b.logs)?;
    let conn = agent.accept(Duration::from_secs(20));
    ensure!(conn.snapshot_sent().is_empty(), "snapshot_sent refused");
    Ok((agent, rw, conn))
}

fn add_ok(conn: &AgentConn, uid: &str, ns: &str, k8s_ns: &str, name: &str) -> anyhow::Result<()> {
    let sa = format!("sa-{name}");
    let r = conn.add(uid, ns, k8s_ns, name, &sa);
    ensure!(r.is_empty(), "add {uid} ({ns}) was refused: {r}");
    Ok(())
}

/// The ports ringway listens on inside an enrolled pod.
const POD_PORTS: [u16; 3] = [15001, 15006, 15008];

/// Whether the first and the last pod have ringway's listeners must be
/// `want` (after their add, after their del). Anything but "connection
/// refused" says one listens (ringway may reset a plaintext connection to
/// its HBONE port at once, even before connect() returns).
fn pods_listen(pods: &[Netns], want: bool) -> anyhow::Result<()> {
    for p in [pods.first(), pods.last()].into_iter().flatten() {
        for port in POD_PORTS {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let has = rig::in_netns(&p.name, move || {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(_) => true,
                    Err(e) => e.kind() != std::io::ErrorKind::ConnectionRefused,
                }
            })?;
            ensure!(
                has == want,
                "pod namespace {} {} a {port} listener after its {}; its listening sockets:\n{}",
                p.name,
                if has { "still has" } else { "has no" },
                if want { "ack" } else { "del" },
                ss(&p.name, &["-ltn"])
            );
        }
    }
    Ok(())
}

/// What the enrolled pods have, for the report.
fn pod_shape(a: &Args) -> &'static str {
    match (a.no_pod_veth, a.pod_ipv6) {
        (true, _) => "lo only",
        (false, false) => "lo + a veth with an IPv4 address, IPv6 off",
        (false, true) => "lo + a veth with an IPv4 and an IPv6 address",
    }
}

/// `ss ARGS` inside `ns`: its output (empty if it failed).
fn ss(ns: &str, args: &[&str]) -> String {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss"])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Part 1: pod enrolment.

/// What both parts run with: the arguments, the ringway binary, the
/// scratch and log folders, and the side-listener flags.
struct Bench<'a> {
    a: &'a Args,
    bin: &'a Path,
    work: &'a Path,
    logs: &'a Path,
    side: &'a [String],
}

fn pod_enrolment(b: &Bench) -> anyhow::Result<Value> {
    let (a, logs) = (b.a, b.logs);
    let node = Netns::new("rwib-n0")?;
    let hub = match a.no_pod_veth {
        true => None,
        false => Some(Netns::new("rwib-hub")?),
    };
    progress(&format!(
        "creating {} pod namespaces ({})",
        a.pods,
        pod_shape(a)
    ));
    let mut pods = Vec::with_capacity(a.pods);
    for i in 0..a.pods {
        let p = Netns::new("rwib-p")?;
        if let Some(h) = &hub {
            if !a.pod_ipv6 {
                // IPv4 only. Otherwise the veth's link-local IPv6 address,
                // once its DAD is done, makes ringway bind [::] too: how
                // many listeners a pod gets would depend on timing.
                for k in ["all", "default"] {
                    p.sysctl(&format!("net.ipv6.conf.{k}.disable_ipv6"), "1")?;
                }
            }
            let ip = format!("10.254.{}.{}/16", i / 250, i % 250 + 1);
            let (pod_if, _) = rig::veth(&p, &[&ip], h, &[])?;
            if a.pod_ipv6 {
                let ip6 = format!("fd00:254::{:x}/64", i + 1);
                p.ip(&["-6", "addr", "add", &ip6, "dev", &pod_if, "nodad"])?;
            }
        }
        pods.push(p);
    }
    let config = b.work.join("pods.yaml");
    std::fs::write(&config, "workloads: []\nservices: []\npolicies: []\n")?;
    let name = "ringway-pods";
    // Locals drop in reverse order: the agent's connection, ringway, the
    // agent, then the namespaces.
    let (_agent, mut rw, conn) =
        start_inpod(b, &node, name, "zds-pods.sock", &config, "bench-node", None)?;
    let pid = rw.pid();
    let cores = cores_of(logs, name);
    // VmRSS and descriptors 1 s after the last change (ringway alive).
    let mut settled = |what: String| -> anyhow::Result<(u64, usize)> {
        progress(&format!("{what}; settling 1 s"));
        std::thread::sleep(Duration::from_secs(1));
        let s = sample(pid)?;
        rw.check_alive()?;
        Ok(s)
    };
    // Agent request → ack of each pod in turn, in milliseconds.
    let timed = |f: &dyn Fn(usize) -> anyhow::Result<()>| -> anyhow::Result<Vec<f64>> {
        let time = |i| {
            let t = Instant::now();
            f(i).map(|()| t.elapsed().as_secs_f64() * 1e3)
        };
        (0..a.pods).map(time).collect()
    };
    let zero = settled(format!(
        "ringway --inpod pid {pid} ({} cores), agent connected",
        cores.map_or("?".into(), |c| c.to_string())
    ))?;
    let add_ms = timed(&|i| {
        let (uid, name) = (format!("bench-pod-{i}"), format!("pod-{i}"));
        add_ok(&conn, &uid, &pods[i].name, "bench", &name)
    })?;
    let full = settled(format!("{} pods added", a.pods))?;
    // The ack meant every core listens: the first and last pod answer.
    pods_listen(&pods, true)?;
    let del_ms = timed(&|i| {
        let r = conn.del(&format!("bench-pod-{i}"));
        ensure!(r.is_empty(), "del bench-pod-{i} was refused: {r}");
        Ok(())
    })?;
    let after = settled(format!("{} pods deleted", a.pods))?;
    pods_listen(&pods, false)?;
    let late = log_lines_with(rw.log(), "not every core");
    let n = a.pods as f64;
    Ok(json!({
        "pods": a.pods,
        "pod_shape": pod_shape(a),
        "cores": cores,
        "add": summary_ms(add_ms),
        "del": summary_ms(del_ms),
        "rss_kib": { "zero_pods": zero.0, "with_pods": full.0, "after_del": after.0 },
        "fds": { "zero_pods": zero.1, "with_pods": full.1, "after_del": after.1 },
        "per_pod": {
            "rss_kib": (full.0 as f64 - zero.0 as f64) / n,
            "fds": (full.1 as f64 - zero.1 as f64) / n,
        },
        "returned_after_del": {
            "rss_kib_above_zero": after.0 as i64 - zero.0 as i64,
            "fds_above_zero": after.1 as i64 - zero.1 as i64,
        },
        "late_core_warnings": late,
    }))
}

// ---------------------------------------------------------------------------
// Part 2: in-pod vs node-level capture.

const SINK_PORT: u16 = 5201;
const WHOAMI_PORT: u16 = 5202;

/// The mesh: every column's two pods, each on its ringway's node.
fn mesh(specs: &[Spec]) -> String {
    let mut y = String::from("# Generated by inpod-bench.\nworkloads:\n");
    for (ns, (name, ip, node)) in specs.iter().flat_map(|s| s.pods().map(|p| (s.k8s_ns, p))) {
        y += &format!(
            "- uid: Kubernetes//Pod/{ns}/{name}\n  name: {name}\n  namespace: {ns}\n  \
             serviceAccount: sa-{name}\n  trustDomain: cluster.local\n  \
             workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n  services: {{}}\n"
        );
    }
    y + "services: []\npolicies: []\n"
}

/// A listener that writes the peer's address and closes: shows who made
/// the connection that reached the server pod.
fn whoami(addr: SocketAddr) -> anyhow::Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let peer = s
                .peer_addr()
                .map(|p| p.ip().to_string())
                .unwrap_or_default();
            let _ = s.write_all(format!("{peer}\n").as_bytes());
        }
    });
    Ok(())
}

fn ask_whoami(client_ns: &str, to: SocketAddr) -> anyhow::Result<String> {
    rig::in_netns(client_ns, move || -> anyhow::Result<String> {
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim().to_string())
    })?
}

/// Established TCP connections inside `ns` to `dst` (`ss`).
fn established_to(ns: &str, dst: SocketAddr) -> usize {
    let dst = dst.to_string();
    ss(ns, &["-Htn", "state", "established", "dst", &dst])
        .lines()
        .count()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `--inpod`, with `--orig-src=<v>` when Some.
    InPod(Option<bool>),
    /// ringway inside each pod, the client's egress captured.
    NodeLevel,
}

/// One way from a client pod to a server pod: a column.
struct Spec {
    key: &'static str,
    label: &'static str,
    kind: Kind,
    /// Third octet of the pair's subnet, 10.253.<net>.0/24.
    net: u8,
    /// Kubernetes namespace of the pair's workloads.
    k8s_ns: &'static str,
    /// The node names of the client's and the server's ringway.
    nodes: [&'static str; 2],
}

impl Spec {
    fn client(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 253, self.net, 1)
    }
    fn server(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 253, self.net, 2)
    }
    /// The client and the server pod: workload name, address, and the
    /// node of its ringway.
    fn pods(&self) -> [(String, Ipv4Addr, &'static str); 2] {
        let name = |side| format!("{}-{side}", self.key);
        let [c, s] = self.nodes;
        [
            (name("client"), self.client(), c),
            (name("server"), self.server(), s),
        ]
    }
}

const BASELINE: &str = "node";

fn specs(with_no_orig_src: bool) -> Vec<Spec> {
    let mut v = vec![
        Spec {
            key: "inpod",
            label: "in-pod",
            kind: Kind::InPod(None),
            net: 1,
            k8s_ns: "inpod",
            nodes: ["node1", "node2"],
        },
        Spec {
            key: BASELINE,
            label: "node-level",
            kind: Kind::NodeLevel,
            net: 2,
            k8s_ns: "nodelevel",
            nodes: ["node3", "node4"],
        },
    ];
    if with_no_orig_src {
        v.push(Spec {
            key: "inpod-no-orig-src",
            label: "in-pod, --orig-src=false",
            kind: Kind::InPod(Some(false)),
            net: 3,
            k8s_ns: "inpod-plain",
            nodes: ["node5", "node6"],
        });
    }
    v
}

/// A running pod pair and its two ringways: a column. Field order is drop
/// order: processes, agents, then namespaces.
struct Pair<'s> {
    spec: &'s Spec,
    proxies: Vec<Supervised>,
    _conns: Vec<AgentConn>,
    _agents: Vec<Agent>,
    /// The in-pod ringways' own namespaces (their "nodes").
    _nodes: Vec<Netns>,
    client: Netns,
    server: Netns,
}

impl<'s> Pair<'s> {
    fn start(spec: &'s Spec, b: &Bench, config: &Path) -> anyhow::Result<Pair<'s>> {
        let tag = spec.net;
        // Two pods tuned as the suite's nodes (connection-rate runs).
        let (client, server, c_if) = node_pair(
            (&format!("rwib-c{tag}"), &[format!("{}/24", spec.client())]),
            (&format!("rwib-s{tag}"), &[format!("{}/24", spec.server())]),
        )?;
        let sink = SocketAddr::from((spec.server(), SINK_PORT));
        server.enter(move || server::spawn(&[sink]))??;
        let who = SocketAddr::from((spec.server(), WHOAMI_PORT));
        server.enter(move || whoami(who))??;
        let mut pair = Pair {
            spec,
            proxies: Vec::new(),
            _conns: Vec::new(),
            _agents: Vec::new(),
            _nodes: Vec::new(),
            client,
            server,
        };
        let pods = [&pair.client, &pair.server];
        match spec.kind {
            // istio-cni's rules in both pods; a ringway per node, each in a
            // namespace of its own, enrolling its pod.
            Kind::InPod(_) => {
                for pod in pods {
                    rig::script("inpod-rules.sh", &[&pod.name])?;
                }
            }
            // The client pod's egress on its veth to its ringway's 15001,
            // except ringway's own sockets and HBONE (as the tests'
            // two-node rig).
            Kind::NodeLevel => pair.client.nft(&format!(
                "table inet rwib {{\n chain out {{ type nat hook output priority -100; policy accept;\n  \
                 oifname \"{c_if}\" meta l4proto tcp meta mark & 0xfff != 0x539 tcp dport != 15008 redirect to :15001\n }}\n}}\n"
            ))?,
        }
        for (i, (pod, (app, ip, node_name))) in pods.into_iter().zip(spec.pods()).enumerate() {
            let name = format!("ringway-{}-{node_name}", spec.key);
            let p = match spec.kind {
                Kind::InPod(orig_src) => {
                    let node = Netns::new(&format!("rwib-n{tag}{i}"))?;
                    let sock = format!("zds-{}-{i}.sock", spec.key);
                    let extra = orig_src.map(|v| format!("--orig-src={v}"));
                    let (agent, p, conn) =
                        start_inpod(b, &node, &name, &sock, config, node_name, extra)?;
                    add_ok(&conn, &format!("uid-{app}"), &pod.name, spec.k8s_ns, &app)?;
                    pair._conns.push(conn);
                    pair._agents.push(agent);
                    pair._nodes.push(node);
                    p
                }
                // ringway inside the pod itself.
                Kind::NodeLevel => {
                    let mut args = ringway_args(config, &b.work.join("ca"), node_name, b.side);
                    args.extend(["--inbound-addr".into(), format!("{ip}:15008")]);
                    Supervised::ringway(pod, b.bin, &name, &args, &b.a.log_level, b.logs)?
                }
            };
            pair.proxies.push(p);
        }
        progress(&format!(
            "{}: pods {} → {}, ringway pids {:?}",
            spec.label,
            spec.client(),
            spec.server(),
            pair.procs().roots
        ));
        Ok(pair)
    }

    fn procs(&self) -> Processes {
        Processes::new(self.proxies.iter().map(|p| p.pid()).collect())
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.proxies
            .iter_mut()
            .try_for_each(Supervised::check_alive)
    }

    /// Runs `s` on a thread inside the client pod, to the server pod's
    /// sink, charging this column's ringways.
    fn measure(&self, s: &Scenario) -> anyhow::Result<Measured> {
        let dialer = Dialer::direct(SocketAddr::from((self.spec.server(), SINK_PORT)));
        let (s, procs) = (s.clone(), self.procs());
        Ok(rig::in_netns(&self.client.name, move || {
            s.run(&dialer, &procs)
        })??)
    }
}

/// The comparison's scenarios: one stream up, 1 B request/response on
/// one connection, one new connection at a time. The warm-up, the rounds
/// and the system-call counts differ only in how much they run.
fn up(bytes: u64) -> Scenario {
    Scenario::Throughput(throughput::Params {
        streams: 1,
        bytes_per_stream: bytes,
        direction: throughput::Direction::Up,
    })
}

fn rr1(requests: u64) -> Scenario {
    Scenario::Rr(rr::Params {
        size: 1,
        connections: 1,
        limit: Limit::Count(requests),
    })
}

fn connect1(connections: u64) -> Scenario {
    Scenario::Connect(connect::Params {
        concurrency: 1,
        limit: Limit::Count(connections),
    })
}

/// The metrics of the comparison: (id, label, scenario, higher is better,
/// digits, the suite's metric it is read from). The suite's CPU per 1k is
/// in seconds, these in milliseconds.
const METRICS: [(&str, &str, &str, bool, usize, &str); 10] = [
    ("gbit_s", "Gbit/s", "throughput", true, 2, "gbps"),
    (
        "cpu_s_per_gib",
        "CPU s / GiB",
        "throughput",
        false,
        3,
        "cpu_per_gib",
    ),
    ("rr_p50_us", "p50 µs", "rr", false, 1, "p50"),
    ("rr_p99_us", "p99 µs", "rr", false, 1, "p99"),
    ("requests_per_s", "requests/s", "rr", true, 0, "rps"),
    (
        "cpu_ms_per_1k_req",
        "CPU ms / 1k requests",
        "rr",
        false,
        1,
        "cpu_per_1k",
    ),
    (
        "connections_per_s",
        "connections/s",
        "connect",
        true,
        0,
        "cps",
    ),
    (
        "connect_p50_us",
        "connect→first byte p50 µs",
        "connect",
        false,
        1,
        "p50",
    ),
    (
        "connect_p99_us",
        "connect→first byte p99 µs",
        "connect",
        false,
        1,
        "p99",
    ),
    (
        "cpu_ms_per_1k_conn",
        "CPU ms / 1k connections",
        "connect",
        false,
        1,
        "cpu_per_1k",
    ),
];

fn side_by_side(b: &Bench) -> anyhow::Result<Value> {
    let Bench { a, work, logs, .. } = *b;
    let specs = specs(!a.no_orig_src_column);
    let config = work.join("mesh.yaml");
    std::fs::write(&config, mesh(&specs))?;
    let mut pairs = Vec::new();
    for s in &specs {
        pairs.push(Pair::start(s, b, &config)?);
    }
    let base = specs.iter().position(|s| s.key == BASELINE).unwrap();
    let check_alive = |pairs: &mut [Pair]| pairs.iter_mut().try_for_each(Pair::check_alive);

    // Warm-up (certificates, HBONE pools), then proof that each path goes
    // through its ringways: both spent CPU on it, and the client pod holds
    // an HBONE connection to the server pod's 15008. What the server
    // pod's application saw as the peer is recorded (the client's address
    // with --orig-src, else the server pod's own).
    let mut paths = serde_json::Map::new();
    for p in &pairs {
        let (spec, client_ns, server_ip) = (p.spec, &p.client.name, p.spec.server());
        let roots = p.procs().roots;
        let cpu = || {
            roots
                .iter()
                .map(|&pid| procstat::cpu_seconds(pid).unwrap_or(0.0))
        };
        let before: Vec<f64> = cpu().collect();
        let who = ask_whoami(client_ns, SocketAddr::from((server_ip, WHOAMI_PORT)))
            .with_context(|| format!("{}: first connection", spec.label))?;
        for w in [connect1(200), up(64 << 20), rr1(2000)] {
            if let Some(e) = p.measure(&w)?.warning {
                bail!("{}: warm-up: {e}", spec.label);
            }
        }
        let spent: Vec<f64> = cpu().zip(&before).map(|(c, b)| c - b).collect();
        ensure!(
            spent.iter().all(|&c| c > 0.0),
            "{}: a ringway spent no CPU on the warm-up (CPU s {spent:?}): the traffic did not go through both",
            spec.label
        );
        let hbone = established_to(client_ns, SocketAddr::from((server_ip, 15008)));
        ensure!(
            hbone > 0,
            "{}: no HBONE connection from the client pod to {server_ip}:15008 after the warm-up",
            spec.label,
        );
        let peer = if who == spec.client().to_string() {
            "the client pod's address"
        } else if who == server_ip.to_string() {
            "the server pod's own address"
        } else {
            "another address"
        };
        progress(&format!(
            "{}: warmed up; ringways' CPU s {spent:.2?}, {hbone} HBONE connection(s) to {server_ip}:15008, the server application saw {who} ({peer})",
            spec.label
        ));
        paths.insert(
            spec.key.into(),
            json!({
                "server_app_saw_peer": who,
                "hbone_connections_from_client_pod": hbone,
                "warmup_cpu_s": spent,
            }),
        );
    }
    check_alive(&mut pairs)?;

    // The columns' samples of every metric, in the suite's collector.
    let mut samples = Collector::new(specs.iter().map(|s| s.key.to_string()).collect());
    let scenarios = [up(a.bytes), rr1(a.requests), connect1(a.connections)];
    let mut rounds = Vec::new();
    let n = specs.len();
    for round in 0..a.rounds {
        // Each column goes first in turn.
        let order: Vec<usize> = (0..n).map(|i| (i + round) % n).collect();
        progress(&format!(
            "round {}/{}: {} first",
            round + 1,
            a.rounds,
            specs[order[0]].label
        ));
        let mut this = json!({
            "round": round + 1,
            "order": order.iter().map(|&i| specs[i].key).collect::<Vec<_>>(),
        });
        for scenario in &scenarios {
            // "throughput", "rr" or "connect".
            let id = scenario.id();
            let kind = id.split('.').next().unwrap_or_default();
            for &i in &order {
                let m = pairs[i].spec;
                let r = pairs[i].measure(scenario)?;
                if let (Scenario::Connect(_), Some(w)) = (scenario, &r.warning) {
                    bail!("{}: {w}", m.label);
                }
                progress(&format!(
                    "  {:26} {}: {}",
                    m.label,
                    scenario.label(),
                    r.summary.trim()
                ));
                for &(key, label, sc, higher, digits, from) in &METRICS {
                    let from = format!("{id}.{from}");
                    if let Some((_, v)) = r.metrics.iter().find(|(d, _)| sc == kind && d.id == from)
                    {
                        // The suite's CPU per 1k is in seconds, ours in ms.
                        let ms = from.ends_with(".cpu_per_1k");
                        let def = MetricDef::new(key, sc, label, higher, digits);
                        samples.add(&def, i, if ms { v * 1e3 } else { *v });
                    }
                }
                this[m.key][kind] = r.raw;
            }
            check_alive(&mut pairs)?;
        }
        rounds.push(this);
    }

    // System calls, outside the timed rounds (perf's own setup is not free).
    let mut syscalls = Value::Null;
    if !a.no_syscalls {
        let mut per_mode = serde_json::Map::new();
        for p in &pairs {
            let tids = p.procs().threads();
            let named = ["setns", "io_uring_enter", "socket", "connect", "close"];
            // Per connection / request: what the scenario's result counted.
            let count = |s: Scenario, unit: &str| -> anyhow::Result<(Value, u64)> {
                let (r, c) = kernel::count_around(&tids, &named, || p.measure(&s));
                let n = r?.raw[unit].as_u64().unwrap_or(0);
                Ok((per_unit(&c, n), n))
            };
            let (conn, connections) = count(connect1(a.connections.min(1000)), "connections")?;
            let (req, requests) = count(rr1(a.requests.min(5000)), "requests")?;
            progress(&format!(
                "  {:26} system calls: {} per connection ({} setns), {} per request",
                p.spec.label,
                fmt_num(conn["syscalls"].as_f64(), 1),
                fmt_num(conn["by_type"]["setns"].as_f64().or(Some(0.0)), 2),
                fmt_num(req["syscalls"].as_f64(), 2),
            ));
            per_mode.insert(
                p.spec.key.into(),
                json!({
                    "connect": conn, "connections": connections,
                    "rr": req, "requests": requests,
                }),
            );
        }
        syscalls = Value::Object(per_mode);
    }
    check_alive(&mut pairs)?;
    let mut warnings = serde_json::Map::new();
    for p in pairs.iter().flat_map(|p| &p.proxies) {
        let n = log_lines_with(p.log(), "\"level\":\"WARN\"")
            + log_lines_with(p.log(), "\"level\":\"ERROR\"");
        warnings.insert(p.name().to_string(), json!(n));
    }

    // Medians, and ratios over the node-level column.
    let summary = samples.summarize(base);
    let (mut medians, mut raw, mut ratios) = (json!({}), json!({}), json!({}));
    for (mi, s) in specs.iter().enumerate() {
        for (id, ..) in METRICS {
            let row = summary.iter().find(|r| r.def.id == id);
            let v = row.map(|r| &r.values[mi]);
            medians[s.key][id] = json!(v.and_then(|v| v.median));
            raw[s.key][id] = json!(v.map_or(&[][..], |v| &v.samples));
            if mi != base {
                ratios[s.key][id] = json!(v.and_then(|v| v.ratio_vs_direct));
            }
        }
    }
    let columns: Vec<Value> = pairs
        .iter()
        .map(|p| {
            let s = p.spec;
            json!({
                "key": s.key,
                "label": s.label,
                "client": s.client().to_string(),
                "server": s.server().to_string(),
                "nodes": s.nodes,
                "ringway_pids": p.procs().roots,
                "ringway_cores": s.nodes.map(|n| cores_of(logs, &format!("ringway-{}-{n}", s.key))),
                "orig_src": match s.kind { Kind::InPod(v) => json!(v.unwrap_or(true)), Kind::NodeLevel => json!(false) },
                "path": paths[s.key],
            })
        })
        .collect();
    Ok(json!({
        "baseline": BASELINE,
        "columns": columns,
        "metrics": METRICS.iter().map(|m| json!({"id": m.0, "label": m.1, "scenario": m.2, "higher_is_better": m.3})).collect::<Vec<_>>(),
        "samples": raw,
        "medians": medians,
        "ratios_over_node": ratios,
        "rounds": rounds,
        "syscalls": syscalls,
        "ringway_warn_or_error_lines": warnings,
    }))
}

/// Counted system calls per connection / request.
fn per_unit(c: &Result<kernel::Counted, String>, n: u64) -> Value {
    let n = n.max(1) as f64;
    match c {
        Ok(c) => json!({
            "syscalls": c.total as f64 / n,
            "io_uring_submissions": c.io_uring.map(|x| x as f64 / n),
            "by_type": c.syscalls.iter().map(|(k, &v)| (k.clone(), json!(v as f64 / n))).collect::<serde_json::Map<_, _>>(),
            "method": c.method,
        }),
        Err(e) => json!({ "error": e }),
    }
}

// ---------------------------------------------------------------------------
// Report.

/// A Markdown table's head: the `first` columns, then one per label
/// (numbers, right-aligned). The comparison and its system calls have a
/// column per path, so both heads are built the same way.
fn head(first: &[&str], labels: &[String]) -> String {
    format!(
        "| {} | {} |\n|{}{}\n",
        first.join(" | "),
        labels.join(" | "),
        "---|".repeat(first.len()),
        "---:|".repeat(labels.len())
    )
}

fn table(a: &Args, m: &machine::Machine, pods: &Value, cmp: &Value) -> String {
    let mut s = String::new();
    let rw = m.ringway.as_ref();
    s += &format!(
        "# ringway in-pod benchmark\n\nringway {} (commit {}{}), {} CPUs ({}), kernel {}, {}\n\n",
        rw.map_or("?", |r| r.version.as_str()),
        rw.and_then(|r| r.commit.as_deref())
            .map_or("?", |c| &c[..c.len().min(10)]),
        match rw.and_then(|r| r.dirty) {
            Some(true) => ", with uncommitted changes",
            _ => "",
        },
        m.nproc,
        m.cpu_model,
        m.kernel,
        m.started_utc
    );
    let f = |v: &Value, d: usize| fmt_num(v.as_f64(), d);
    if !pods.is_null() {
        s += &format!(
            "## Pod enrolment: {} pods ({}), ringway --inpod on {} cores\n\n",
            pods["pods"],
            pods["pod_shape"].as_str().unwrap_or("?"),
            pods["cores"]
        );
        s += "| agent request → ack | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|\n";
        for k in ["add", "del"] {
            s += &format!("| `{k}` |");
            for p in ["p50_ms", "p90_ms", "p99_ms", "max_ms"] {
                s += &format!(" {} |", f(&pods[k][p], 2));
            }
            s += "\n";
        }
        s += &format!(
            "\n| process | 0 pods | {} pods | after deleting all | per pod |\n|---|---:|---:|---:|---:|\n",
            pods["pods"]
        );
        for (row, k, digits) in [("RSS KiB", "rss_kib", 1), ("open fds", "fds", 2)] {
            let v = &pods[k];
            s += &format!(
                "| {row} | {} | {} | {} | {} |\n",
                v["zero_pods"],
                v["with_pods"],
                v["after_del"],
                f(&pods["per_pod"][k], digits)
            );
        }
        if pods["late_core_warnings"].as_u64().unwrap_or(0) > 0 {
            s += &format!(
                "\nringway logged {} \"not every core …\" warnings\n",
                pods["late_core_warnings"]
            );
        }
        s += "\n";
    }
    if !cmp.is_null() {
        // The baseline (node-level) first, then each in-pod column and its
        // ratio to it.
        let mut cols = cmp["columns"].as_array().cloned().unwrap_or_default();
        cols.sort_by_key(|c| c["key"] != BASELINE);
        s += &format!(
            "## In-pod vs node-level capture (medians of {} rounds)\n\n\
             throughput: 1 stream, {} up; rr: 1 B request/response, {} requests on one connection; \
             connect: {} new connections, one at a time. CPU: both ringways of the path.\n\n",
            a.rounds,
            fmt_size(a.bytes),
            a.requests,
            a.connections
        );
        let label = |c: &Value| c["label"].as_str().unwrap_or("?").to_string();
        let key = |c: &Value| c["key"].as_str().unwrap_or("?").to_string();
        let mut labels = Vec::new();
        for c in &cols {
            labels.push(label(c));
            if key(c) != BASELINE {
                labels.push(format!("{} ÷ node-level", label(c)));
            }
        }
        s += &head(&["scenario", "metric"], &labels);
        for (id, label, scenario, higher, digits, _) in METRICS {
            let better = if higher { "higher" } else { "lower" };
            s += &format!("| {scenario} | {label} ({better} is better) |");
            for k in cols.iter().map(key) {
                s += &format!(" {} |", f(&cmp["medians"][&k][id], digits));
                if k != BASELINE {
                    s += &format!(" {} |", f(&cmp["ratios_over_node"][&k][id], 3));
                }
            }
            s += "\n";
        }
        s += "\nWhat the server pod's application saw as the peer:";
        for c in &cols {
            let saw = c["path"]["server_app_saw_peer"].as_str().unwrap_or("?");
            s += &format!(" {}: {saw};", label(c));
        }
        s.pop();
        s += ".\n";
        if let Some(sys) = cmp["syscalls"].as_object() {
            let labels: Vec<String> = cols.iter().map(label).collect();
            s += "\n";
            s += &head(&["system calls (both ringways)"], &labels);
            let rows: [(&str, &[&str]); 6] = [
                ("per connection", &["connect", "syscalls"]),
                ("per connection: setns", &["connect", "by_type", "setns"]),
                ("per connection: socket", &["connect", "by_type", "socket"]),
                (
                    "per connection: io_uring submissions",
                    &["connect", "io_uring_submissions"],
                ),
                ("per request (rr)", &["rr", "syscalls"]),
                (
                    "per request: io_uring submissions",
                    &["rr", "io_uring_submissions"],
                ),
            ];
            for (label, path) in rows {
                s += &format!("| {label} |");
                for c in &cols {
                    let col = &sys[&key(c)];
                    let v = path.iter().fold(col, |v, p| &v[*p]);
                    // A type never seen was not called.
                    let shown = match (v.as_f64(), path.len() == 3) {
                        (None, true) if col["connect"]["syscalls"].is_number() => "0".into(),
                        _ => f(v, 2),
                    };
                    s += &format!(" {shown} |");
                }
                s += "\n";
            }
            if let Some(e) = sys.values().find_map(|v| v["connect"]["error"].as_str()) {
                s += &format!("\nsystem calls {e}\n");
            }
        }
    }
    s
}

fn main() {
    cleanup_on_signals();
    let a = Args::parse();
    progress("starting");
    if let Err(e) = run(&a) {
        eprintln!("inpod-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    rig::require_root("inpod-bench")?;
    ringway_perf::raise_fd_limit();
    let bin = ringway_perf::ringway_bin(Some(&a.ringway))?;
    if a.pods == 0 && !a.skip_pods {
        bail!("--pods must be at least 1 (or --skip-pods)");
    }
    let machine = machine::describe(Some(&bin));
    std::fs::create_dir_all(&a.out)?;
    let logs = a.out.join("logs");
    std::fs::create_dir_all(&logs)?;
    let work = Scratch::new(SCRATCH)?;
    let side = rig::side_listener_args(&bin)?;
    progress(&format!(
        "ringway {} ({}), out {}",
        machine.ringway.as_ref().map_or("?", |r| r.version.as_str()),
        bin.display(),
        a.out.display()
    ));

    let b = Bench {
        a,
        bin: &bin,
        work: &work.0,
        logs: &logs,
        side: &side,
    };
    let pods = match a.skip_pods {
        true => Value::Null,
        false => pod_enrolment(&b).context("pod enrolment")?,
    };
    let cmp = match a.skip_compare {
        true => Value::Null,
        false => side_by_side(&b).context("in-pod vs node-level")?,
    };
    let text = table(a, &machine, &pods, &cmp);
    let out = json!({
        "machine": machine,
        "settings": {
            "ringway": bin.display().to_string(),
            "pods": a.pods,
            "pod_shape": pod_shape(a),
            "rounds": a.rounds,
            "throughput_bytes": a.bytes,
            "rr_requests": a.requests,
            "connect_connections": a.connections,
            "ringway_rust_log": a.log_level,
        },
        "pod_enrolment": pods,
        "inpod_vs_node": cmp,
    });
    std::fs::write(
        a.out.join("inpod.json"),
        serde_json::to_string_pretty(&out)? + "\n",
    )?;
    std::fs::write(a.out.join("inpod.txt"), &text)?;
    println!("{text}");
    progress(&format!(
        "wrote {} and {}",
        a.out.join("inpod.json").display(),
        a.out.join("inpod.txt").display()
    ));
    Ok(())
}
