//! Upgrade hand-over in in-pod mode: a node's proxy is replaced while its
//! pods keep connecting, with no refused or reset connection.
//!
//! The sequence is a DaemonSet rolled with surge: the new instance connects
//! to the node agent while the old one still serves, takes the agent's
//! replay (it binds every pod's listeners beside the old ones, with
//! `SO_REUSEPORT`), and only then is the old one sent SIGTERM. It stops
//! accepting, and its open connections carry bytes until its termination
//! deadline. Meanwhile a client in an enrolled pod connects in a tight
//! loop; every attempt must succeed.
//!
//! Real parts: an in-test node agent (SEQPACKET, SCM_RIGHTS), pod network
//! namespaces with istio-cni's in-pod rules, real ringway processes, HBONE
//! between the pods. Needs root; fails loudly otherwise.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::path::Path;

use common::inpod::*;
use common::zds::{Agent, AgentConn};
use common::ztunnel::{self, Ztunnel};
use common::{NetNs, Ringway};

/// How long the old instance keeps its open connections after SIGTERM
/// (`start_node`'s `--drain-timeout`).
const DEADLINE: Duration = Duration::from_secs(1);

/// The agent's replay to a (new) proxy: every pod it has, then the end
/// of the snapshot, each acknowledged.
fn replay(conn: &AgentConn, pods: &[(&str, &Pod, &str, &str)]) {
    for (uid, pod, ns, name) in pods {
        let sa = format!("sa-{name}");
        assert_eq!(conn.add(uid, &pod.ns.name, ns, name, &sa), "", "add {uid}");
    }
    assert_eq!(conn.snapshot_sent(), "");
}

/// What the client pod saw while the proxy was replaced.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    /// The failures (the first hundred), with when they happened.
    errors: Mutex<Vec<(Duration, String)>>,
}

/// A client in `from` opening connections to `to` one after another, each
/// a full exchange with the application (its greeting and an echo), until
/// `stop`.
fn tight_loop(from: String, to: String, stop: Arc<AtomicBool>, tally: Arc<Tally>, t0: Instant) {
    while !stop.load(Ordering::Relaxed) {
        let attempt = || -> std::io::Result<()> {
            let mut s = connect_in(&from, &to)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut r = BufReader::new(s.try_clone()?);
            let mut greeting = String::new();
            r.read_line(&mut greeting)?;
            if !greeting.starts_with("peer=") {
                return Err(std::io::Error::other(format!("greeting {greeting:?}")));
            }
            s.write_all(b"ping")?;
            let mut echo = [0u8; 4];
            r.read_exact(&mut echo)?;
            if &echo != b"ping" {
                return Err(std::io::Error::other("bad echo"));
            }
            Ok(())
        };
        match attempt() {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                let mut errors = tally.errors.lock().unwrap();
                if errors.len() < 100 {
                    errors.push((t0.elapsed(), e.to_string()));
                }
            }
        }
    }
}

/// A long-lived connection exchanging a message every 50 ms; returns the
/// times (from `t0`) of its last good exchange and of its end.
fn hold(from: String, to: String, t0: Instant) -> std::thread::JoinHandle<(Duration, Duration)> {
    let mut s = connect_in(&from, &to).expect("long-lived connection");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    assert!(greeting.starts_with("peer="), "{greeting}");
    std::thread::spawn(move || {
        let mut last_ok = t0.elapsed();
        loop {
            let mut echo = [0u8; 5];
            let exchanged = s
                .write_all(b"alive")
                .and_then(|_| r.read_exact(&mut echo))
                .is_ok()
                && &echo == b"alive";
            if !exchanged {
                return (last_ok, t0.elapsed());
            }
            last_ok = t0.elapsed();
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// Which proxy serves the node.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ringway,
    Ztunnel,
}

/// A node proxy in in-pod mode, enrolled through the test's agent.
enum Proxy {
    Ringway(Ringway),
    /// With the namespace its own ports (admin, metrics) live in, kept
    /// for as long as it runs.
    Ztunnel(Ztunnel, #[allow(dead_code)] NetNs),
}

impl Proxy {
    fn start(kind: Kind, dir: &Path, agent: &Agent, cfg: &Path, tag: &str) -> Proxy {
        match kind {
            Kind::Ringway => Proxy::Ringway(start_node(dir, "node1", agent, cfg)),
            Kind::Ztunnel => {
                let bin = ztunnel::locate("hand-over with ztunnel").expect("checked by the test");
                let node = NetNs::new(tag);
                let z = Ztunnel::start_inpod(
                    &bin,
                    &node.name,
                    cfg,
                    &agent.path,
                    "node1",
                    &dir.join(format!("{tag}.log")),
                    // Its termination deadline, as ringway's --drain-timeout.
                    &[("CONNECTION_TERMINATION_DEADLINE", "1s")],
                );
                Proxy::Ztunnel(z, node)
            }
        }
    }

    fn terminate(&mut self) {
        match self {
            Proxy::Ringway(r) => {
                r.signal(libc::SIGTERM);
                r.wait_exit(common::PATIENCE);
            }
            Proxy::Ztunnel(z, _) => {
                z.signal(libc::SIGTERM);
                z.wait_exit(common::PATIENCE);
            }
        }
    }

    fn log(&self) -> String {
        match self {
            Proxy::Ringway(r) => common::FileText(&r.log_path).to_string(),
            Proxy::Ztunnel(z, _) => z.log(),
        }
    }
}

/// How many sockets listen on `port` in the pod (every proxy's, every
/// core's).
fn listening(pod: &Pod, port: u16) -> usize {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pod.ns.name, "ss", "-Hltn"])
        .arg(format!("sport = :{port}"))
        .output()
        .expect("run ss");
    assert!(out.status.success(), "ss: {out:?}");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

const POD_PORTS: [u16; 3] = [15001, 15006, 15008];

/// The pod's TCP counters that tell how a listener lost a connection
/// (migration, overflow, resets), for a failure's message.
fn tcp_counters(pod: &Pod) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pod.ns.name, "nstat", "-az"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("nstat: {e}"));
    out.lines()
        .filter(|l| {
            [
                "Migrate",
                "ListenOverflows",
                "ListenDrops",
                "Reset",
                "Abort",
                "OutRsts",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|v| v != "0"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `old` serves two pods of one node; `new` is started, takes the
/// agent's replay and binds beside it; then `old` gets SIGTERM. A client
/// pod connecting in a tight loop sees no failure, and its long-lived
/// connections carry bytes until the old one's deadline.
fn hand_over(old_kind: Kind, new_kind: Kind, tag: &str, net: u8) {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    if let Some(bin) = [old_kind, new_kind]
        .contains(&Kind::Ztunnel)
        .then(|| ztunnel::locate("hand-over with ztunnel").expect("checked by the caller"))
    {
        // Both trust each other: ringway's CA on ztunnel's fake root.
        let ca = ztunnel::shared_ca(&bin, dir.path());
        std::fs::rename(ca, dir.path().join("ca")).unwrap();
    }
    let (client, server) = pod_pair(tag, net);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[
            ("client", "ns-a", &client.ip, "node1"),
            ("server", "ns-b", &server.ip, "node1"),
        ]),
    );
    let pods = [
        ("pod-client", &client, "ns-a", "client"),
        ("pod-server", &server, "ns-b", "server"),
    ];
    serve_app(&server, 8080);
    let agent = Agent::listen(&dir.path().join("zds.sock"));

    let mut old = Proxy::start(old_kind, dir.path(), &agent, &cfg, &format!("{tag}o"));
    let old_conn = agent.accept(common::PATIENCE);
    assert_eq!(old_conn.snapshot_sent(), "");
    for (uid, pod, ns, name) in pods {
        let sa = format!("sa-{name}");
        assert_eq!(old_conn.add(uid, &pod.ns.name, ns, name, &sa), "");
    }
    // ztunnel acks before its listeners are up: wait for them.
    let wait_listeners = |at_least: usize| {
        for pod in [&client, &server] {
            for port in POD_PORTS {
                common::wait_for("the pod's listeners", common::PATIENCE, || match listening(
                    pod, port,
                ) {
                    n if n >= at_least => Ok(n),
                    n => Err(format!("{n} sockets on {port} in {}", pod.ns.name)),
                });
            }
        }
    };
    wait_listeners(1);
    if let Proxy::Ringway(r) = &old {
        wait_ready(r, true);
    }
    let old_sockets = listening(&client, 15001);

    let t0 = Instant::now();
    let to = format!("{}:8080", server.ip);
    let held: Vec<_> = (0..3)
        .map(|_| hold(client.ns.name.clone(), to.clone(), t0))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let (from, to, stop, tally) = (
                client.ns.name.clone(),
                to.clone(),
                stop.clone(),
                tally.clone(),
            );
            std::thread::spawn(move || tight_loop(from, to, stop, tally, t0))
        })
        .collect();
    common::wait_for("the loop to get going", common::PATIENCE, || {
        match tally.ok.load(Ordering::Relaxed) {
            n if n >= 50 => Ok(()),
            n => Err(format!("{n} exchanges")),
        }
    });

    // The new instance: the agent replays its pods to it while the old
    // one serves; its listeners open beside the old ones.
    let new = Proxy::start(new_kind, dir.path(), &agent, &cfg, &format!("{tag}n"));
    let new_conn = agent.accept(common::PATIENCE);
    replay(&new_conn, &pods);
    wait_listeners(old_sockets + 1);
    if let Proxy::Ringway(r) = &new {
        wait_ready(r, true);
    }
    let before_term = tally.ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));

    // Only now is the old one told to go.
    let term = t0.elapsed();
    old.terminate();
    let exited = t0.elapsed();
    let at_exit = tally.ok.load(Ordering::Relaxed);
    // The new instance alone, for a while.
    common::wait_for(
        "exchanges through the new instance",
        common::PATIENCE,
        || match tally.ok.load(Ordering::Relaxed) - at_exit {
            n if n >= 100 => Ok(()),
            n => Err(format!("{n} exchanges since the old one exited")),
        },
    );
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().unwrap();
    }
    let ok = tally.ok.load(Ordering::Relaxed);
    let errors = std::mem::take(&mut *tally.errors.lock().unwrap());
    // ztunnel, as the old proxy, may close a connection it accepted as its
    // drain began, unserved, when its deadline comes (ztunnel replacing
    // ztunnel loses connections that way and by resets). That is the old
    // proxy's own doing, not the hand-over's: counted apart, and only then.
    let (theirs, failures): (Vec<_>, Vec<_>) = errors.into_iter().partition(|(at, e)| {
        old_kind == Kind::Ztunnel
            && e.contains("greeting \"\"")
            && *at + Duration::from_millis(300) >= term + DEADLINE
            && *at <= exited + Duration::from_millis(300)
    });
    let failed = tally.failed.load(Ordering::Relaxed) - theirs.len() as u64;
    if !theirs.is_empty() {
        eprintln!("closed unserved by the old ztunnel at its deadline: {theirs:?}");
    }
    eprintln!(
        "hand-over {old_kind:?} -> {new_kind:?}: {ok} exchanges ({} before SIGTERM, {} during \
         the drain, {} after), {failed} failed; SIGTERM at {term:?}, exit at {exited:?}",
        before_term,
        at_exit - before_term,
        ok - at_exit
    );
    assert_eq!(
        failed,
        0,
        "connection attempts failed during the hand-over {old_kind:?} -> {new_kind:?}: {:?}\n\
         kernel counters: client pod {}, server pod {}\nold log: {}\nnew log: {}",
        failures,
        tcp_counters(&client),
        tcp_counters(&server),
        old.log(),
        new.log()
    );

    // The long-lived connections, served by the old instance, carried
    // bytes until its deadline and were closed then.
    for h in held {
        let (last_ok, ended) = h.join().unwrap();
        assert!(
            last_ok + Duration::from_millis(500) >= term + DEADLINE,
            "a long-lived connection stopped carrying bytes at {last_ok:?}, \
             before the deadline ({:?})",
            term + DEADLINE
        );
        assert!(
            ended <= exited + Duration::from_secs(1),
            "a long-lived connection outlived the old instance: ended {ended:?}, exit {exited:?}"
        );
    }
    // The new one served the pods' connections.
    if let Proxy::Ringway(r) = &new {
        assert!(
            r.access_logs().iter().any(|l| l["direction"] == "outbound"),
            "the new instance served no outbound connection"
        );
    }
}

#[test]
fn ringway_replaces_ringway_with_no_refused_connection() {
    hand_over(Kind::Ringway, Kind::Ringway, "ho1", 41);
}

/// A node migrates from ztunnel to ringway without an outage.
#[test]
fn ringway_replaces_ztunnel_with_no_refused_connection() {
    if ztunnel::locate("hand-over ztunnel -> ringway").is_none() {
        return;
    }
    hand_over(Kind::Ztunnel, Kind::Ringway, "ho2", 42);
}

/// And back.
#[test]
fn ztunnel_replaces_ringway_with_no_refused_connection() {
    if ztunnel::locate("hand-over ringway -> ztunnel").is_none() {
        return;
    }
    hand_over(Kind::Ringway, Kind::Ztunnel, "ho3", 43);
}

/// ztunnel's INPOD_PORT_REUSE=false asks for pods' ports bound by one
/// socket alone, which ringway's per-core listeners cannot be: startup
/// stops and says so, rather than ignoring it.
#[test]
fn port_reuse_off_is_refused_by_name() {
    let out = std::process::Command::new(common::ringway_bin())
        .args(["--inpod", "--log-format", "json"])
        .env("INPOD_PORT_REUSE", "false")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "ringway started with INPOD_PORT_REUSE=false"
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("INPOD_PORT_REUSE=false"), "{text}");
}
