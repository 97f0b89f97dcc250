//! Connections bounded (issue 25, item 2): an attacker floods node B's
//! ringway, started with a small RLIMIT_NOFILE, with half-open TLS
//! connections to 15008 (TCP connect, never a ClientHello) and plain
//! connections through its inbound passthrough (15006), more than its
//! whole fd table. Ringway's fds must stay within its budget, readiness
//! and metrics must answer, no core may spin, and a bystander on node A
//! (HBONE to B, and plaintext through B's passthrough) must be served
//! within twice its latency before the attack.
//!
//! Two waves: one attacker address (its own share is all it gets: the
//! per-peer cap resets the rest, and the bystander is not slowed), then
//! several addresses at once (the per-core cap: B stops accepting, and
//! the bystander is served again once the attackers leave).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::nodes::{
    base_config, client_args, connect_from_client, py_client, Nodes, CLIENT_ID, SERVER_IP,
};
use common::{wait_for, Ringway, PATIENCE};

/// A plaintext (TCP) workload on node B, reached through its 15006.
const PLAIN_IP: &str = "10.250.0.3";
/// The attacker's addresses on node A (the bystander is 10.250.0.1).
const ATTACKERS: [&str; 4] = ["10.250.0.9", "10.250.0.10", "10.250.0.11", "10.250.0.12"];
/// Ringway B's fd table, soft and hard (so it cannot raise it).
const NOFILE: u64 = 512;
const CORES: u64 = 2;
/// Connections each attacker address tries per path: together more than
/// ringway's whole fd table.
const ATTEMPTS: usize = 600;

fn config() -> String {
    format!(
        r#"{}- uid: cluster1//v1/Pod/plain-ns/plain
  name: plain
  namespace: plain-ns
  serviceAccount: plain
  workloadIps: ["{PLAIN_IP}"]
  protocol: TCP
  node: node-b
"#,
        base_config()
    )
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// utime + stime of the whole process.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// `GET path` on a side port within 3 s: the status line, or what failed
/// (unlike `Ringway::http_get`, a port that does not answer is a value).
fn side_get(rw: &Ringway, endpoint: &str, path: &str) -> Result<String, String> {
    let addr: SocketAddr = rw.listeners["listeners"][endpoint][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: ringway\r\n\r\n");
    common::in_netns(rw.netns.as_deref().unwrap(), move || {
        let limit = Duration::from_secs(3);
        let mut s = TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(limit)).unwrap();
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| e.to_string())?;
        Ok(text.lines().next().unwrap_or("").to_owned())
    })
}

/// One value of a labelled series in B's scrape, summed over cores.
fn metric_sum(rw: &Ringway, name: &str, label: &str) -> u64 {
    let (_, scrape) = rw.http_get("stats", "/metrics");
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Opens up to `n` connections from `src` to each of `dsts`, in turn, on
/// node A, marked so that node A's capture leaves them alone; never sends
/// a byte. Stops early once connects time out (B's backlog is full).
/// Connections ringway resets are kept too (they cost it nothing more).
fn flood(nodes: &Nodes, src: &'static str, dsts: [&'static str; 2], n: usize) -> Vec<TcpStream> {
    nodes.a.enter(move || {
        let src: SocketAddr = format!("{src}:0").parse().unwrap();
        let mut held = Vec::new();
        let mut timeouts = 0;
        for i in 0..2 * n {
            let dst: SocketAddr = dsts[i % 2].parse().unwrap();
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("attacker socket (raise the test's RLIMIT_NOFILE)");
            let mark: u32 = 0x539;
            // SAFETY: setsockopt reads a u32 of the size passed.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_MARK,
                    (&mark as *const u32).cast(),
                    4,
                );
            }
            s.bind(&src.into()).unwrap();
            match s.connect_timeout(&dst.into(), Duration::from_millis(300)) {
                Ok(()) => held.push(s.into()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    ) =>
                {
                    timeouts += 1;
                    if timeouts >= 3 {
                        break;
                    }
                }
                // Reset at once (a cap): the SYN-ACK came, then the RST.
                Err(_) => {}
            }
        }
        held
    })
}

/// A fresh plaintext connection from the client workload through ringway
/// A and B's passthrough to the plain workload, 1 KiB echoed.
fn passthrough_once(nodes: &Nodes) -> Result<Duration, String> {
    nodes.a.enter(|| {
        let t = Instant::now();
        let mut s = connect_from_client(&format!("{PLAIN_IP}:8080")).map_err(|e| e.to_string())?;
        s.write_all(&[7u8; 1024]).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 1024];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        Ok(t.elapsed())
    })
}

/// A fresh HBONE connection (TCP, mTLS, HTTP/2, CONNECT) from node A to
/// B's 15008, 1 KiB echoed; the client's own timing, without Python's
/// start-up.
fn hbone_once(nodes: &Nodes, certs: &std::path::Path) -> Result<Duration, String> {
    let root = nodes.ca_dir().join("root-cert.pem");
    let mut args = client_args(certs, &root, &format!("{SERVER_IP}:8081"));
    args.extend(["--send-bytes".into(), "1024".into(), "--echo".into()]);
    let (code, out) = py_client(&nodes.a, &args);
    if code != 0 || out["status"][0] != 200 {
        return Err(format!("exit {code}: {out}"));
    }
    Ok(Duration::from_millis(out["elapsed_ms"].as_u64().unwrap()))
}

/// Readiness and metrics answered 200.
fn assert_answered(ready: &Result<String, String>, metrics: &Result<String, String>) {
    for (what, got) in [("readiness", ready), ("metrics", metrics)] {
        assert!(
            got.as_deref().is_ok_and(|s| s.contains(" 200 ")),
            "{what}: {got:?}"
        );
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median of 5 tries; None if any failed.
fn bystander(nodes: &Nodes, certs: &std::path::Path) -> (Option<Duration>, Option<Duration>) {
    let pass: Result<Vec<_>, _> = (0..5).map(|_| passthrough_once(nodes)).collect();
    let hbone: Result<Vec<_>, _> = (0..5).map(|_| hbone_once(nodes, certs)).collect();
    if let Err(e) = &pass {
        eprintln!("passthrough bystander failed: {e}");
    }
    if let Err(e) = &hbone {
        eprintln!("HBONE bystander failed: {e}");
    }
    (pass.ok().map(median), hbone.ok().map(median))
}

/// Within twice the baseline; a baseline under 10 ms counts as 10 ms, since
/// a shared test machine's scheduling noise is of that order.
fn within_twice(during: Option<Duration>, baseline: Duration) -> bool {
    during.is_some_and(|d| d <= 2 * baseline.max(Duration::from_millis(10)))
}

/// Nodes A and B (`tag`), B's ringway with `b_extra` and a table of
/// [`NOFILE`] fds; a plain workload behind B's 15006, echo servers for
/// both bystander paths, the attacker's addresses on node A. Returns once
/// the bystander is served, with its client certificate.
fn rig(tag: &str, b_extra: &[&str]) -> (Nodes, std::path::PathBuf) {
    // This process holds the attacker's sockets.
    common::raise_nofile();
    let mut nodes = Nodes::with_config(tag, &config(), false, &[]);
    let (va, vb) = nodes.veths.clone();
    nodes
        .b
        .ip(&["addr", "add", &format!("{PLAIN_IP}/24"), "dev", &vb]);
    for ip in ATTACKERS {
        nodes
            .a
            .ip(&["addr", "add", &format!("{ip}/24"), "dev", &va]);
    }
    nodes.b.nft(&format!(
        "table inet hconn {{
           chain pre {{ type nat hook prerouting priority -100; policy accept;
             iifname \"{vb}\" tcp dport 8080 redirect to :15006;
           }}
         }}"
    ));
    nodes.b.enter(|| {
        common::serve_echo(TcpListener::bind(format!("{PLAIN_IP}:8080")).unwrap());
        common::serve_echo(TcpListener::bind(format!("{SERVER_IP}:8081")).unwrap());
    });
    let mut args = nodes.b_args.clone();
    args.extend(["--cores".into(), CORES.to_string()]);
    args.extend(b_extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rw = Ringway::start_in_with_command(&nodes.b.name, &args, |cmd| {
        // SAFETY: only setrlimit (async-signal-safe) runs in the child.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: NOFILE,
                    rlim_max: NOFILE,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    nodes.rw_b = Some(rw);
    let rw = nodes.b();
    wait_for("B ready", PATIENCE, || {
        side_get(rw, "readiness", "/healthz/ready")
            .and_then(|s| s.contains(" 200 ").then_some(()).ok_or(s))
    });
    let certs = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "client", "1h");
    wait_for("the bystander's first connections", PATIENCE, || {
        passthrough_once(&nodes)?;
        hbone_once(&nodes, &certs)
    });
    (nodes, certs)
}

#[test]
fn a_connection_flood_stays_within_the_fd_budget_and_spares_bystanders() {
    let (nodes, certs) = rig("hconn", &[]);
    let rw = nodes.b();
    let pid = rw.pid();
    let idle_fds = open_fds(pid);
    let (pass_base, hbone_base) = bystander(&nodes, &certs);
    let (pass_base, hbone_base) = (pass_base.unwrap(), hbone_base.unwrap());
    // What the default caps come to: (512 - 256 reserve) / (4 fds x 2 cores).
    let per_core = (NOFILE - 256) / (4 * CORES);
    let budget = idle_fds + (CORES * per_core * 4) as usize;
    eprintln!(
        "before: idle fds {idle_fds}, budget {budget} of {NOFILE}; bystander passthrough {pass_base:?}, HBONE {hbone_base:?}"
    );

    // Wave 1: one attacker address on both paths.
    let cpu0 = (cpu_time(pid), Instant::now());
    const TARGETS: [&str; 2] = ["10.250.0.2:15008", "10.250.0.3:8080"];
    let mut held = flood(&nodes, ATTACKERS[0], TARGETS, ATTEMPTS);
    let attacker_conns = held.len();
    std::thread::sleep(Duration::from_millis(300));
    let fds1 = open_fds(pid);
    let ready1 = side_get(rw, "readiness", "/healthz/ready");
    let metrics1 = side_get(rw, "stats", "/metrics");
    let (pass1, hbone1) = bystander(&nodes, &certs);
    let cpu1 = (cpu_time(pid) - cpu0.0, cpu0.1.elapsed());
    eprintln!(
        "wave 1 (one address, {attacker_conns} connected): fds {fds1}; readiness {ready1:?}; metrics {metrics1:?}; \
         bystander passthrough {pass1:?}, HBONE {hbone1:?}; CPU {:?} over {:?}",
        cpu1.0, cpu1.1
    );
    let peer_refused = metric_sum(rw, "ringway_core_peer_cap_refused_total", "path=\"inbound");
    eprintln!("wave 1: peer cap refusals {peer_refused}");
    assert!(fds1 <= budget, "fds {fds1} over the budget {budget}");
    assert_answered(&ready1, &metrics1);
    assert!(
        within_twice(pass1, pass_base),
        "passthrough bystander {pass1:?} against {pass_base:?}"
    );
    assert!(
        within_twice(hbone1, hbone_base),
        "HBONE bystander {hbone1:?} against {hbone_base:?}"
    );
    assert!(peer_refused > 0, "the per-peer cap never bit");
    // Accepting and resetting ~1000 connections, and 10 bystander
    // connections: well under a core's second.
    assert!(
        cpu1.0 < cpu1.1 / 4,
        "ringway used {:?} of CPU in {:?}",
        cpu1.0,
        cpu1.1
    );

    // Wave 2: every attacker address; together past the per-core caps.
    for ip in &ATTACKERS[1..] {
        held.extend(flood(&nodes, ip, TARGETS, ATTEMPTS / 2));
    }
    let hold = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let fds2 = open_fds(pid);
    let ready2 = side_get(rw, "readiness", "/healthz/ready");
    let metrics2 = side_get(rw, "stats", "/metrics");
    let cpu2 = (cpu_time(pid) - hold.0, hold.1.elapsed());
    let capped = metric_sum(rw, "ringway_core_connection_cap_reached_total", "path=\"");
    eprintln!(
        "wave 2 (all addresses, {} connected): fds {fds2}; readiness {ready2:?}; metrics {metrics2:?}; \
         CPU {:?} over {:?} while held; cap reached {capped}",
        held.len(),
        cpu2.0,
        cpu2.1
    );
    assert!(fds2 <= budget, "fds {fds2} over the budget {budget}");
    assert_answered(&ready2, &metrics2);
    assert!(capped > 0, "the per-core cap never bit");
    // Paused listeners cost nothing: no core spins while the caps hold.
    assert!(
        cpu2.0 < cpu2.1 / 10,
        "ringway used {:?} of CPU in {:?} while paused",
        cpu2.0,
        cpu2.1
    );

    // Said in the log, at most a line a second per core, with the count
    // of lines held back.
    let said: Vec<serde_json::Value> = rw
        .logs()
        .into_iter()
        .filter(|l| {
            let m = l["message"].as_str().or(l["fields"]["message"].as_str());
            m.is_some_and(|m| m.contains("cap reached"))
        })
        .collect();
    let events = peer_refused + capped;
    eprintln!("cap log lines: {} for {events} events", said.len());
    assert!(!said.is_empty(), "no cap line in the log");
    assert!(
        (said.len() as u64) < events / 10,
        "{} cap lines for {events} events: not rate-limited",
        said.len()
    );
    assert!(
        said.iter().any(|l| l.to_string().contains("suppressed")),
        "{said:?}"
    );

    // The attackers leave: the bystander is served again.
    drop(held);
    let t = Instant::now();
    wait_for("the bystander after the attack", PATIENCE, || {
        passthrough_once(&nodes)?;
        hbone_once(&nodes, &certs)
    });
    eprintln!(
        "after: bystander served again {:?} after the attackers left",
        t.elapsed()
    );
}

/// With the caps lifted, a flood does exhaust the fd table: accept then
/// meets EMFILE, and the core waits for a close (or 250 ms) instead of
/// spinning on it; once the attackers leave, ringway serves again.
#[test]
fn fd_exhaustion_does_not_spin_the_accept_loop() {
    let (nodes, certs) = rig(
        "hconnx",
        &[
            "--max-connections-per-core",
            "100000",
            "--max-connections-per-peer",
            "0",
        ],
    );
    let rw = nodes.b();
    let pid = rw.pid();
    const TARGETS: [&str; 2] = ["10.250.0.2:15008", "10.250.0.3:8080"];
    let held = flood(&nodes, ATTACKERS[0], TARGETS, ATTEMPTS);
    let fds = open_fds(pid);
    let hold = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let cpu = (cpu_time(pid) - hold.0, hold.1.elapsed());
    eprintln!(
        "caps off: {} connected, fds {fds} of {NOFILE}; CPU {:?} over {:?} while exhausted",
        held.len(),
        cpu.0,
        cpu.1
    );
    assert!(
        fds as u64 >= NOFILE - 8,
        "the table never filled: {fds} fds"
    );
    assert!(
        cpu.0 < cpu.1 / 10,
        "ringway used {:?} of CPU in {:?} out of fds",
        cpu.0,
        cpu.1
    );
    drop(held);
    wait_for("the bystander after the attack", PATIENCE, || {
        passthrough_once(&nodes)?;
        hbone_once(&nodes, &certs)
    });
    let exhausted = metric_sum(rw, "ringway_core_accept_fd_exhausted_total", "core=");
    eprintln!("caps off: accept met EMFILE {exhausted} times");
    assert!(exhausted > 0, "accept never met EMFILE");
}

/// A half-open connection to 15008 for a workload whose certificate
/// cannot be had (its CA never answers) is cut at the handshake timeout:
/// the certificate wait counts against it, rather than running first for
/// its own `--cert-wait-timeout`.
#[test]
fn the_certificate_wait_counts_against_the_handshake_timeout() {
    let ns = common::NetNs::new("hconnc");
    let dir = tempfile::tempdir().unwrap();
    // A root to trust, for a CA at an address where nothing listens.
    let root = common::issue_cert(
        &dir.path().join("ca"),
        "spiffe://cluster.local/ns/a/sa/b",
        dir.path().join("root"),
        "1h",
    )
    .join("root-cert.pem");
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        "workloads:\n- uid: c//Pod/ns/w\n  name: w\n  namespace: ns\n  serviceAccount: w\n  \
         workloadIps: [\"127.0.0.1\"]\n  protocol: HBONE\nservices: []\npolicies: []\n",
    );
    let _rw = ns.ringway(&[
        "--config",
        cfg.to_str().unwrap(),
        "--ca-address",
        "https://127.0.0.1:9",
        "--ca-root-ca",
        root.to_str().unwrap(),
        "--handshake-timeout",
        "1s",
        "--cert-wait-timeout",
        "8s",
    ]);
    let took = ns.enter(|| {
        let mut s = TcpStream::connect("127.0.0.1:15008").unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let t = Instant::now();
        let r = s.read(&mut [0u8; 1]);
        assert!(common::peer_closed(&r), "{r:?}");
        t.elapsed()
    });
    eprintln!("a connection waiting for a certificate was closed after {took:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed after {took:?}: the handshake timeout is 1s, the certificate wait 8s"
    );
}
