//! `dns-bench`: the DNS proxy under `dnsperf` (issue 23), ringway beside
//! Istio's ztunnel in one run.
//!
//! Each proxy runs in a network namespace of its own on the same LOCAL_XDS
//! mesh, with the client pod's address on the namespace's loopback and a
//! fast upstream resolver (threads of this process) on 127.0.0.1:53 there.
//! ringway serves node-level DNS on 127.0.0.1:15053 (`--dns-addr`,
//! `--dns-upstream 127.0.0.1:53`) and finds the asking pod by the source
//! address; ztunnel, in dedicated mode for that pod, serves its fixed
//! localhost:15053 and reads the upstream from `/etc/resolv.conf`, which
//! `ip netns exec` bind-mounts from `/etc/netns/<ns>/resolv.conf`.
//!
//! For each round, proxy (the order rotates every round) and workload
//! (mesh names answered by the proxy; forwarded names, 50 000 distinct
//! ones with TTL 0, so ztunnel's resolver cache cannot answer them):
//! - saturation: dnsperf with many queries outstanding: queries/s, and
//!   the proxy's CPU per 1 000 queries (from /proc);
//! - latency: dnsperf at a fixed rate well below saturation, each
//!   response's latency (`-v`): p50 and p99.
//!
//! Also the proxies' RSS after the runs and, for ringway, the memory of
//! its node-level DNS sockets per core (idle RSS with `--dns-addr` minus
//! without, per core). Medians over rounds, ringway ÷ ztunnel.
//!
//! Run: `scripts/dns-bench.sh` (root; installs dnsperf).

use std::fmt::Write as _;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use ringway_benchkit::median;
use ringway_perf::procstat::{cpu_seconds, rss_bytes};
use ringway_perf::rig::Netns;
use ringway_perf::supervise::Supervised;
use ringway_perf::ztunnel;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "DNS proxy queries/s, latency, CPU and memory: ringway beside ztunnel")]
struct Args {
    /// Rounds; the order of the proxies rotates every round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of each dnsperf run.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Workers of each proxy (ringway `--cores`, ztunnel
    /// `ZTUNNEL_WORKER_THREADS`).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// dnsperf clients (sockets) at saturation.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// dnsperf threads at saturation.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Queries outstanding at saturation.
    #[arg(long, default_value_t = 256)]
    outstanding: usize,
    /// Queries/s of the latency runs.
    #[arg(long, default_value_t = 2000)]
    latency_rate: u64,
    /// The ringway binary (default: `ringway` beside this program).
    #[arg(long)]
    ringway: Option<PathBuf>,
    /// The ztunnel binary (default: RINGWAY_ZTUNNEL, else the peer beside
    /// the repository).
    #[arg(long)]
    ztunnel: Option<PathBuf>,
    /// Where results go (results.md, results.json, logs).
    #[arg(long, default_value = "dns-results")]
    out: PathBuf,
}

/// The client pod, and the address both proxies' DNS serves on.
const CLIENT: &str = "10.76.0.1";
const DNS_PORT: u16 = 15053;
const FORWARDED_NAMES: usize = 50_000;

const MESH: &str = r#"
workloads:
- uid: k8s//v1/Pod/shop/client
  name: client
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.76.0.1"]
  protocol: HBONE
  services: {}
- uid: k8s//v1/Pod/shop/db-0
  name: db-0
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.76.1.1"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
- uid: k8s//v1/Pod/shop/db-1
  name: db-1
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.76.1.2"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
services:
- name: web
  namespace: shop
  hostname: web.shop.svc.cluster.local
  vips: ["/10.96.6.1", "/fd96::6:1"]
  ports: {80: 8080}
- name: api
  namespace: shop
  hostname: api.shop.svc.cluster.local
  vips: ["/10.96.6.2"]
  ports: {80: 8080}
- name: db
  namespace: shop
  hostname: db.shop.svc.cluster.local
  vips: []
  ports: {5432: 5432}
- name: wild
  namespace: shop
  hostname: "*.wild.example"
  vips: ["/10.96.6.9"]
  ports: {443: 443}
policies: []
"#;

/// The mesh questions: full names, short names, headless, wildcard, AAAA.
const MESH_QUERIES: &str = "web.shop.svc.cluster.local A
web A
api.shop A
db.shop.svc.cluster.local A
x.wild.example A
web.shop.svc.cluster.local AAAA
";

/// The fast upstream: answers every question with one A record, TTL 0,
/// from `threads` threads on one socket at 127.0.0.1:53 inside `ns`.
fn start_upstream(ns: &Netns, threads: usize) -> anyhow::Result<()> {
    let sock = ns.enter(|| UdpSocket::bind("127.0.0.1:53"))??;
    let sock = Arc::new(sock);
    for _ in 0..threads {
        let sock = sock.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                if let Some(reply) = answer(&buf[..n]) {
                    let _ = sock.send_to(&reply, from);
                }
            }
        });
    }
    Ok(())
}

/// The reply to one query: its header and question, QR and RA set, one
/// A record (TTL 0) under the question's name; None if it does not parse.
fn answer(query: &[u8]) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let mut end = 12;
    loop {
        let len = usize::from(*query.get(end)?);
        if len == 0 {
            end += 1;
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        end += 1 + len;
    }
    end += 4;
    let question = query.get(12..end)?;
    let mut out = Vec::with_capacity(end + 16);
    out.extend_from_slice(&query[..2]);
    out.push(0x80 | (query[2] & 0x01)); // QR, RD echoed
    out.push(0x80); // RA
    out.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 0]);
    out.extend_from_slice(question);
    out.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 192, 0, 2, 1]);
    Some(out)
}

/// What one dnsperf run said.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Run {
    qps: f64,
    completed: u64,
    lost: u64,
    /// Response latencies (seconds), latency runs only.
    p50: Option<f64>,
    p99: Option<f64>,
    /// The proxy's CPU seconds over the run.
    cpu_secs: f64,
    load_avg: String,
}

fn field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(key))
        .map(str::trim)
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// dnsperf from the client address in `ns` against its DNS port, with
/// `extra` arguments; the proxy `pid`'s CPU over the run.
fn dnsperf(
    ns: &str,
    queries: &Path,
    seconds: u64,
    extra: &[String],
    pid: u32,
) -> anyhow::Result<Run> {
    let cpu0 = cpu_seconds(pid)?;
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "dnsperf",
            "-s",
            "127.0.0.1",
            "-a",
            CLIENT,
        ])
        .args(["-p", &DNS_PORT.to_string(), "-t", "2"])
        .arg("-d")
        .arg(queries)
        .args(["-l", &seconds.to_string()])
        .args(extra)
        .output()
        .context("dnsperf (apt-get install dnsperf)")?;
    let cpu_secs = cpu_seconds(pid)? - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "dnsperf failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let num =
        |key: &str| -> Option<f64> { field(&text, key)?.split_whitespace().next()?.parse().ok() };
    let qps = num("Queries per second:").context("no qps in dnsperf's output")?;
    // Per-response lines of -v: `> NOERROR name type latency`.
    let mut lat: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    lat.sort_by(f64::total_cmp);
    Ok(Run {
        qps,
        completed: num("Queries completed:").unwrap_or(0.0) as u64,
        lost: num("Queries lost:").unwrap_or(0.0) as u64,
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        cpu_secs,
        load_avg: load_avg(),
    })
}

/// One proxy under test.
struct Proxy {
    name: &'static str,
    // Stopped before its namespace goes (fields drop in order).
    process: Supervised,
    ns: Netns,
}

/// Removes `/etc/netns/<ns>` (ztunnel's resolv.conf) on drop.
struct EtcNetns(PathBuf);

impl Drop for EtcNetns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn client_ns(prefix: &str) -> anyhow::Result<Netns> {
    let ns = Netns::new(prefix)?;
    ns.ip(&["addr", "add", &format!("{CLIENT}/32"), "dev", "lo"])?;
    start_upstream(&ns, 1)?;
    Ok(ns)
}

fn ringway_args(cfg: &Path, cores: usize, dns: bool) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--config".into(),
        cfg.display().to_string(),
        "--cores".into(),
        cores.to_string(),
    ];
    if dns {
        a.extend([
            "--dns-addr".into(),
            format!("127.0.0.1:{DNS_PORT}"),
            "--dns-upstream".into(),
            "127.0.0.1:53".into(),
        ]);
    }
    a
}

/// ringway's idle RSS with and without its DNS sockets on `cores` cores:
/// (with, without).
fn dns_socket_memory(
    bin: &Path,
    cfg: &Path,
    cores: usize,
    work: &Path,
) -> anyhow::Result<(u64, u64)> {
    let mut rss = Vec::new();
    for dns in [true, false] {
        let ns = client_ns("rwdnsmem")?;
        let name = format!("ringway-mem-dns-{dns}");
        let p = Supervised::ringway(
            &ns,
            bin,
            &name,
            &ringway_args(cfg, cores, dns),
            "warn",
            work,
        )?;
        std::thread::sleep(Duration::from_secs(2));
        rss.push(rss_bytes(p.pid())?);
    }
    Ok((rss[0], rss[1]))
}

fn ms(s: Option<f64>) -> String {
    s.map_or("–".into(), |s| format!("{:.3} ms", s * 1e3))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringway_perf::rig::require_root("dns-bench (network namespaces)")?;
    let ringway = match &args.ringway {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("ringway"),
    };
    let zt_bin = ztunnel::locate(args.ztunnel.as_deref())?;
    std::fs::create_dir_all(&args.out)?;
    let work = args.out.canonicalize()?;
    let cfg = work.join("mesh.yaml");
    std::fs::write(&cfg, MESH)?;
    let mesh_q = work.join("queries-mesh.txt");
    std::fs::write(&mesh_q, MESH_QUERIES)?;
    let fwd_q = work.join("queries-forwarded.txt");
    let mut fwd = String::new();
    for i in 0..FORWARDED_NAMES {
        let _ = writeln!(fwd, "n{i}.ext.bench.example A");
    }
    std::fs::write(&fwd_q, fwd)?;
    let load_start = load_avg();

    let (mem_with, mem_without) = dns_socket_memory(&ringway, &cfg, 2, &work)?;
    eprintln!(
        "ringway idle RSS, 2 cores: {} KiB with DNS, {} KiB without",
        mem_with / 1024,
        mem_without / 1024
    );

    let rw_ns = client_ns("rwdns")?;
    let rw = Supervised::ringway(
        &rw_ns,
        &ringway,
        "ringway",
        &ringway_args(&cfg, args.workers, true),
        "warn",
        &work,
    )?;
    let zt_ns = client_ns("ztdns")?;
    let etc = EtcNetns(Path::new("/etc/netns").join(&zt_ns.name));
    std::fs::create_dir_all(&etc.0)?;
    std::fs::write(etc.0.join("resolv.conf"), "nameserver 127.0.0.1\n")?;
    let mut env = ztunnel::env(&cfg, "shop/client/default", "warn");
    env.push(("ZTUNNEL_WORKER_THREADS", args.workers.to_string()));
    // Through `ip netns exec` (which execs ztunnel, so the pid is its own)
    // for the private /etc/resolv.conf.
    let mut spec = ztunnel::spec(&zt_bin, "ztunnel", env, &work);
    spec.args = ["netns", "exec", &zt_ns.name]
        .iter()
        .map(|s| s.to_string())
        .chain([zt_bin.display().to_string(), "proxy".into()])
        .collect();
    spec.program = "ip".into();
    let zt = Supervised::start(None, spec)?;
    let proxies = [
        Proxy {
            name: "ringway",
            ns: rw_ns,
            process: rw,
        },
        Proxy {
            name: "ztunnel",
            ns: zt_ns,
            process: zt,
        },
    ];

    // Warm-up and a check that both answer.
    for p in &proxies {
        for q in [&mesh_q, &fwd_q] {
            let r = dnsperf(
                &p.ns.name,
                q,
                1,
                &["-Q".into(), "200".into()],
                p.process.pid(),
            )?;
            if r.completed == 0 || r.lost > r.completed / 100 {
                bail!("{} does not answer {}: {r:?}", p.name, q.display());
            }
        }
    }

    let workloads = [("mesh", &mesh_q), ("forwarded", &fwd_q)];
    // results[proxy][workload] = (saturation runs, latency runs)
    let mut results: Vec<Vec<(Vec<Run>, Vec<Run>)>> = vec![vec![Default::default(); 2]; 2];
    let saturate = [
        "-T".to_string(),
        args.threads.to_string(),
        "-c".to_string(),
        args.clients.to_string(),
        "-q".into(),
        args.outstanding.to_string(),
    ];
    let paced = [
        "-c".to_string(),
        "4".into(),
        "-Q".into(),
        args.latency_rate.to_string(),
        "-v".into(),
    ];
    for round in 0..args.rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for &pi in &order {
            let p = &proxies[pi];
            for (wi, (wname, q)) in workloads.iter().enumerate() {
                let sat = dnsperf(&p.ns.name, q, args.seconds, &saturate, p.process.pid())?;
                let lat = dnsperf(&p.ns.name, q, args.seconds, &paced, p.process.pid())?;
                eprintln!(
                    "round {} {} {wname}: {:.0} q/s ({} lost), {:.3} CPU-ms/1k q; paced p50 {} p99 {}; load {}",
                    round + 1,
                    p.name,
                    sat.qps,
                    sat.lost,
                    sat.cpu_secs * 1e6 / sat.completed.max(1) as f64,
                    ms(lat.p50),
                    ms(lat.p99),
                    lat.load_avg
                );
                results[pi][wi].0.push(sat);
                results[pi][wi].1.push(lat);
            }
        }
    }
    let rss: Vec<u64> = proxies
        .iter()
        .map(|p| rss_bytes(p.process.pid()).unwrap_or(0))
        .collect();
    let load_end = load_avg();

    // Medians.
    let med = |runs: &[Run], f: &dyn Fn(&Run) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let qps = |r: &Run| Some(r.qps);
    let cpu = |r: &Run| Some(r.cpu_secs * 1e6 / r.completed.max(1) as f64);
    // Queries/s one fully busy CPU would answer at that cost.
    let capacity = |r: &Run| Some(r.completed as f64 / r.cpu_secs.max(1e-9));
    let seconds = args.seconds as f64;
    let busy = move |r: &Run| Some(100.0 * r.cpu_secs / seconds);
    let p50 = |r: &Run| r.p50;
    let p99 = |r: &Run| r.p99;
    let mut md = String::new();
    let (commit, dirty) = ringway_perf::machine::checkout(Path::new("."));
    let _ = writeln!(
        md,
        "# DNS proxy: ringway and ztunnel under dnsperf\n\n\
         ringway {} ({}), ztunnel {}. {} rounds of {} s runs, proxy order rotating; \
         medians. {} worker(s) each (ringway `--cores {}`, ztunnel `ZTUNNEL_WORKER_THREADS={}`). \
         Saturation: dnsperf `-T {} -c {} -q {}`; latency: dnsperf `-c 4 -Q {}` (paced), each response's latency. \
         Load average (1/5/15 min) {load_start} at the start, {load_end} at the end.\n",
        commit.as_deref().map_or("?", |c| &c[..c.len().min(7)]),
        if dirty == Some(true) { "dirty" } else { "clean" },
        ztunnel::version(&zt_bin).unwrap_or_default(),
        args.rounds,
        args.seconds,
        args.workers,
        args.workers,
        args.workers,
        args.threads,
        args.clients,
        args.outstanding,
        args.latency_rate,
    );
    let _ = writeln!(
        md,
        "| names | proxy | queries/s (dnsperf) | proxy CPU busy | queries/s per busy CPU | p50 (paced) | p99 (paced) | CPU-ms per 1k queries |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    let mut json_rows = Vec::new();
    for (wi, (wname, _)) in workloads.iter().enumerate() {
        let m = |pi: usize, f: &dyn Fn(&Run) -> Option<f64>, sat: bool| {
            let (s, l) = &results[pi][wi];
            med(if sat { s } else { l }, f)
        };
        for (pi, p) in proxies.iter().enumerate() {
            let _ = writeln!(
                md,
                "| {wname} | {} | {:.0} | {:.0} % | {:.0} | {} | {} | {:.1} |",
                p.name,
                m(pi, &qps, true).unwrap_or(0.0),
                m(pi, &busy, true).unwrap_or(0.0),
                m(pi, &capacity, true).unwrap_or(0.0),
                ms(m(pi, &p50, false)),
                ms(m(pi, &p99, false)),
                m(pi, &cpu, true).unwrap_or(0.0),
            );
        }
        let _ = writeln!(
            md,
            "| {wname} | **ringway ÷ ztunnel** | **{}** | {} | **{}** | {} | **{}** | {} |",
            ratio(m(0, &qps, true), m(1, &qps, true)),
            ratio(m(0, &busy, true), m(1, &busy, true)),
            ratio(m(0, &capacity, true), m(1, &capacity, true)),
            ratio(m(0, &p50, false), m(1, &p50, false)),
            ratio(m(0, &p99, false), m(1, &p99, false)),
            ratio(m(0, &cpu, true), m(1, &cpu, true)),
        );
        json_rows.push(json!({
            "names": wname,
            "ringway": {"saturation": results[0][wi].0, "paced": results[0][wi].1},
            "ztunnel": {"saturation": results[1][wi].0, "paced": results[1][wi].1},
        }));
    }
    let _ = writeln!(
        md,
        "\nRSS after the runs: ringway {} KiB, ztunnel {} KiB ({}).\n\n\
         ringway's node-level DNS sockets (a UDP socket and a TCP listener per core, and the \
         per-core forwarding table), idle, 2 cores: RSS {} KiB with `--dns-addr`, {} KiB without: \
         {:.0} KiB per core (sockets' buffers are kernel memory, outside RSS, and empty when \
         idle; the per-core forwarding table grows with use). In-pod DNS (per enrolled pod) is \
         not measured here.",
        rss[0] / 1024,
        rss[1] / 1024,
        ratio(Some(rss[0] as f64), Some(rss[1] as f64)),
        mem_with / 1024,
        mem_without / 1024,
        (mem_with as f64 - mem_without as f64) / 2.0 / 1024.0,
    );
    print!("{md}");
    std::fs::write(work.join("results.md"), &md)?;
    let j = json!({
        "machine": ringway_perf::machine::describe(Some(&ringway)),
        "commit": commit,
        "dirty": dirty,
        "ztunnel": ztunnel::version(&zt_bin),
        "args": format!("{args:?}"),
        "load_avg_start": load_start,
        "load_avg_end": load_end,
        "results": json_rows,
        "rss_bytes": {"ringway": rss[0], "ztunnel": rss[1]},
        "ringway_idle_rss_2_cores": {"with_dns": mem_with, "without_dns": mem_without},
    });
    std::fs::write(work.join("results.json"), serde_json::to_string_pretty(&j)?)?;
    drop(proxies);
    drop(etc);
    eprintln!("results: {}/results.md, results.json", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_answers_one_a_record_with_ttl_0() {
        // ID 0x1234, RD, one question: a.b IN A.
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(&[1, b'a', 1, b'b', 0, 0, 1, 0, 1]);
        let r = answer(&q).unwrap();
        assert_eq!(&r[..4], &[0x12, 0x34, 0x81, 0x80], "QR, RD, RA");
        assert_eq!(
            &r[4..12],
            &[0, 1, 0, 1, 0, 0, 0, 0],
            "one question, one answer"
        );
        assert_eq!(&r[12..21], &q[12..21], "the question");
        let rr = &r[21..];
        assert_eq!(&rr[..10], &[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0], "A IN TTL 0");
        assert_eq!(&rr[10..], &[0, 4, 192, 0, 2, 1]);
        // A response, a short packet and a compressed question: nothing.
        let mut resp = q.clone();
        resp[2] |= 0x80;
        assert!(answer(&resp).is_none());
        assert!(answer(&q[..11]).is_none());
        let mut ptr = q[..12].to_vec();
        ptr.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert!(answer(&ptr).is_none());
    }

    #[test]
    fn quantiles_of_sorted_latencies() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(51.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn dnsperf_summary_fields() {
        let out = "  Queries completed:    137983 (99.95%)\n  Queries per second:   68446.528738\n";
        assert_eq!(field(out, "Queries per second:"), Some("68446.528738"));
        assert_eq!(field(out, "Queries completed:"), Some("137983 (99.95%)"));
    }
}
