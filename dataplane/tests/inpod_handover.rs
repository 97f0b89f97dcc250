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

use common::inpod::*;
use common::zds::{Agent, AgentConn};

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
    /// The first few failures, with when they happened.
    errors: Mutex<Vec<String>>,
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
                if errors.len() < 10 {
                    errors.push(format!("{:?}: {e}", t0.elapsed()));
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

#[test]
fn ringway_replaces_ringway_with_no_refused_connection() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pod_pair("ho1", 41);
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

    let mut old = start_node(dir.path(), "node1", &agent, &cfg);
    let old_conn = agent.accept(common::PATIENCE);
    assert_eq!(old_conn.snapshot_sent(), "");
    for (uid, pod, ns, name) in pods {
        let sa = format!("sa-{name}");
        assert_eq!(old_conn.add(uid, &pod.ns.name, ns, name, &sa), "");
    }
    wait_ready(&old, true);

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
    let new = start_node(dir.path(), "node1", &agent, &cfg);
    let new_conn = agent.accept(common::PATIENCE);
    replay(&new_conn, &pods);
    wait_ready(&new, true);
    let before_term = tally.ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));

    // Only now is the old one told to go.
    let term = t0.elapsed();
    old.signal(libc::SIGTERM);
    old.wait_exit(common::PATIENCE);
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
    let failed = tally.failed.load(Ordering::Relaxed);
    eprintln!(
        "hand-over: {ok} exchanges ({} before SIGTERM, {} during the drain, {} after), \
         {failed} failed; SIGTERM at {term:?}, exit at {exited:?}",
        before_term,
        at_exit - before_term,
        ok - at_exit
    );
    assert_eq!(
        failed,
        0,
        "connection attempts failed during the hand-over: {:?}\nold log: {}\nnew log: {}",
        tally.errors.lock().unwrap(),
        common::FileText(&old.log_path),
        common::FileText(&new.log_path)
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
    // Both instances served the pods' connections.
    assert!(
        new.access_logs()
            .iter()
            .any(|l| l["direction"] == "outbound"),
        "the new instance served no outbound connection"
    );
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
