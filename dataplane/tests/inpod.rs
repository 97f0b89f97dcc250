//! In-pod mode end to end: an in-test node agent (real SEQPACKET socket,
//! real SCM_RIGHTS, real pod network namespaces with in-pod redirection
//! rules) enrolls pods into two ringway processes, one per simulated node;
//! pod-to-pod traffic then crosses HBONE from inside the pods' namespaces
//! with the pods' identities.
//!
//! Needs root (namespaces, setns, nftables); fails loudly otherwise.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::inpod::*;
use common::zds::Agent;
use common::NetNs;

/// Two nodes, each with one enrolled pod: the pods talk over HBONE from
/// inside their namespaces, with the identities the agent named; the
/// application sees the connection come from inside its own pod.
/// Then the server pod is removed: its listeners go at once, its open
/// connection is closed after the drain time.
#[test]
fn enrolled_pods_talk_over_hbone_and_removal_drains() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pod_pair("ip1", 1);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[
            ("client", "ns-a", &a.ip, "node1"),
            ("server", "ns-b", &b.ip, "node2"),
        ]),
    );
    let agent1 = Agent::listen(&dir.path().join("zds1.sock"));
    let agent2 = Agent::listen(&dir.path().join("zds2.sock"));
    let rw1 = start_node(dir.path(), "node1", &agent1, &cfg);
    let rw2 = start_node(dir.path(), "node2", &agent2, &cfg);
    let c1 = agent1.accept(Duration::from_secs(10));
    let c2 = agent2.accept(Duration::from_secs(10));
    // A fresh agent has no pods to replay.
    assert_eq!(c1.snapshot_sent(), "");
    assert_eq!(c2.snapshot_sent(), "");
    wait_ready(&rw1, true);
    assert_eq!(
        c1.add("pod-a", &a.ns.name, "ns-a", "client", "sa-client"),
        ""
    );
    assert_eq!(
        c2.add("pod-b", &b.ns.name, "ns-b", "server", "sa-server"),
        ""
    );
    serve_app(&b, 8080);

    // The ack means every core listens: 15008 answers in pod B now.
    connect_marked(&a, &format!("{}:15008", b.ip)).expect("pod B's HBONE listener");

    let mut s = connect(&a, &format!("{}:8080", b.ip)).unwrap();
    let greeting = round_trip(&mut s, "hello through the mesh");
    // ringway B reached the app from inside pod B, from the client's own
    // address (original source, the in-pod default; the rules' connmark
    // brings the replies back).
    assert_eq!(greeting, format!("peer={}", a.ip));
    // Lines are written when connections end.
    drop(s);

    let out = rw1.wait_log("outbound access line", |l| {
        l["scope"] == "access" && l["direction"] == "outbound"
    });
    assert_eq!(out["src.identity"], spiffe("ns-a", "sa-client"), "{out}");
    assert_eq!(out["dst.identity"], spiffe("ns-b", "sa-server"), "{out}");
    assert_eq!(out["dst.addr"], format!("{}:15008", b.ip), "{out}");
    let inb = rw2.wait_log("inbound stream access line", |l| {
        l["scope"] == "access" && l["direction"] == "inbound" && l["dst.hbone_addr"].is_string()
    });
    assert_eq!(inb["src.identity"], spiffe("ns-a", "sa-client"), "{inb}");
    assert_eq!(inb["dst.hbone_addr"], format!("{}:8080", b.ip), "{inb}");
    assert_eq!(inb["dst.workload"], "server", "{inb}");

    // A connection held open while pod B is removed.
    let held = connect(&a, &format!("{}:8080", b.ip)).unwrap();
    let mut held_reader = BufReader::new(held.try_clone().unwrap());
    let mut line = String::new();
    held_reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("peer="), "{line}");

    let removed = Instant::now();
    assert_eq!(c2.del("pod-b"), "");
    // Drained, not cut: the open connection still carries bytes after the
    // del is acknowledged, until --drain-timeout (1 s).
    let mut w = held.try_clone().unwrap();
    std::io::Write::write_all(&mut w, b"still here").unwrap();
    let mut echo = [0u8; 10];
    held_reader.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"still here");
    // Listeners are gone as soon as the del is acknowledged.
    let refused = connect_marked(&a, &format!("{}:15008", b.ip));
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "pod B's 15008 still answers after del: {refused:?}"
    );
    // The open connection is closed after --drain-timeout (1 s).
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    let r = held_reader.read(&mut buf);
    assert!(common::peer_closed(&r), "held connection: {r:?}");
    let took = removed.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "closed after {took:?}, not after the 1 s drain"
    );
    rw2.wait_log("removal log", |l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.contains("pod removed"))
    });
    // New connections from A to B fail now (nothing listens in B): ringway
    // A resets them, which the client sees at connect or at its first read.
    match connect(&a, &format!("{}:8080", b.ip)) {
        Ok(mut again) => {
            let mut buf = [0u8; 16];
            let r = again.read(&mut buf);
            assert!(
                common::peer_closed(&r),
                "connection to a removed pod: {r:?}"
            );
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    drop((c1, rw1, rw2));
}

/// The agent restarts: ringway reconnects, keeps the pods replayed, and
/// after `snapshot_sent` removes the one that was not. A `keep` after the
/// replay is refused.
#[test]
fn agent_restart_reconciles_the_pods() {
    let dir = tempfile::tempdir().unwrap();
    let (a, c) = pod_pair("ip2", 2);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[("one", "ns", &a.ip, "node1"), ("two", "ns", &c.ip, "node1")]),
    );
    let sock = dir.path().join("zds.sock");
    let agent = Agent::listen(&sock);
    let rw = start_node(dir.path(), "node1", &agent, &cfg);
    let conn = agent.accept(Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    assert_eq!(conn.add("uid-one", &a.ns.name, "ns", "one", "sa-one"), "");
    assert_eq!(conn.add("uid-two", &c.ns.name, "ns", "two", "sa-two"), "");
    connect_marked(&c, &format!("{}:15008", c.ip)).expect("pod two listens");

    // The agent goes away and comes back (same socket path).
    drop(conn);
    drop(agent);
    let agent = Agent::listen(&sock);
    let conn = agent.accept(Duration::from_secs(10));
    // It replays pod one (with its namespace again) and not pod two.
    assert_eq!(conn.add("uid-one", &a.ns.name, "ns", "one", "sa-one"), "");
    // A keep for a pod ringway never had: nothing to keep (ACK, as ztunnel).
    assert_eq!(conn.keep("uid-ghost"), "");
    assert_eq!(conn.snapshot_sent(), "");
    // keep belongs to the replay.
    let nack = conn.keep("uid-one");
    assert!(nack.contains("after snapshot_sent"), "{nack:?}");
    let gone = connect_marked(&c, &format!("{}:15008", c.ip));
    assert!(gone.is_err(), "pod two still listens after reconcile");
    connect_marked(&a, &format!("{}:15008", a.ip)).expect("pod one still listens");
    rw.wait_log("reconcile log", |l| {
        l["message"] == "node agent's pods reconciled" && l["removed"] == 1
    });
    wait_ready(&rw, true);
}

/// A pod that cannot start (its 15008 is taken inside its namespace) is
/// NACKed with the reason and keeps readiness at 503; it is retried and
/// runs once the port is free. A descriptor that is not a network
/// namespace is NACKed and saying so.
#[test]
fn a_pod_that_fails_to_start_is_retried_and_holds_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _b) = pod_pair("ip3", 3);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[("one", "ns", &a.ip, "node1")]),
    );
    let agent = Agent::listen(&dir.path().join("zds.sock"));
    let rw = start_node(dir.path(), "node1", &agent, &cfg);
    let conn = agent.accept(Duration::from_secs(10));
    // Before the agent's replay, ringway does not know its pods: not ready.
    let (status, _) = rw.http_get("readiness", "/healthz/ready");
    assert!(status.contains(" 503 "), "{status}");
    assert_eq!(conn.snapshot_sent(), "");
    wait_ready(&rw, true);

    let squatter =
        a.ns.enter(|| TcpListener::bind("0.0.0.0:15008").expect("take 15008 in the pod"));
    let nack = conn.add("uid-one", &a.ns.name, "ns", "one", "sa-one");
    assert!(nack.contains("15008"), "NACK names the port: {nack:?}");
    wait_ready(&rw, false);
    let (_, dump) = rw.http_get("admin", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let state = &dump["workloadState"]["uid-one"];
    assert_eq!(state["state"], "Pending", "{state}");
    assert_eq!(state["info"]["name"], "one", "{state}");
    assert!(
        state["error"].as_str().unwrap().contains("15008"),
        "{state}"
    );
    drop(squatter);
    // Retried (100 ms, doubling) until it runs; then ready again.
    wait_ready(&rw, true);
    connect_marked(&a, &format!("{}:15008", a.ip)).expect("pod listens after the retry");
    rw.wait_log("retry log", |l| l["message"] == "pod started on retry");
    let (_, dump) = rw.http_get("admin", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["workloadState"]["uid-one"]["state"], "Up", "{dump}");

    let not_netns = std::fs::File::open("/dev/null").unwrap();
    let nack = conn.add_fd("uid-bad", &not_netns, "ns", "bad", "sa");
    assert!(nack.contains("not a network namespace"), "{nack:?}");
    wait_ready(&rw, false);
    assert_eq!(conn.del("uid-bad"), "");
    wait_ready(&rw, true);
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The network namespaces (`net:[inode]`) that descriptors of `pid` hold.
fn netns_held(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with("net:["))
        .collect()
}

/// How a descriptor of a namespace handle reads (`net:[inode]`).
fn netns_link(ns: &NetNs) -> String {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(format!("/run/netns/{}", ns.name))
        .unwrap_or_else(|e| panic!("{}: {e}", ns.name))
        .ino();
    format!("net:[{ino}]")
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// 100 pods added and removed, three times over, while a pod pair keeps
/// talking: every del gives back every descriptor, memory settles, and
/// the traffic never fails.
#[test]
fn a_hundred_pods_come_and_go_without_leaking() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pod_pair("ip4", 4);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[
            ("client", "ns", &a.ip, "node1"),
            ("server", "ns", &b.ip, "node1"),
        ]),
    );
    let agent = Agent::listen(&dir.path().join("zds.sock"));
    let rw = start_node(dir.path(), "node1", &agent, &cfg);
    let conn = agent.accept(Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    assert_eq!(
        conn.add("client", &a.ns.name, "ns", "client", "sa-client"),
        ""
    );
    assert_eq!(
        conn.add("server", &b.ns.name, "ns", "server", "sa-server"),
        ""
    );
    serve_app(&b, 8080);
    let pods: Vec<NetNs> = (0..100).map(|i| NetNs::new(&format!("ip4x{i}"))).collect();

    // Traffic between the pair while pods come and go; paused (and idle)
    // while descriptors are counted, so that only the pods' show.
    use std::sync::atomic::{AtomicU8, Ordering};
    const RUN: u8 = 0;
    const PAUSE: u8 = 1;
    const PAUSED: u8 = 2;
    const STOP: u8 = 3;
    let state = std::sync::Arc::new(AtomicU8::new(RUN));
    let traffic = {
        let state = state.clone();
        let (from, to) = (a.ns.name.clone(), format!("{}:8080", b.ip));
        std::thread::spawn(move || {
            let mut n = 0u32;
            loop {
                match state.load(Ordering::Acquire) {
                    STOP => return n,
                    PAUSE | PAUSED => {
                        state.store(PAUSED, Ordering::Release);
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    _ => {}
                }
                let mut s = connect_in(&from, &to).expect("pair traffic: connect");
                round_trip(&mut s, "ping");
                n += 1;
            }
        })
    };
    let pause = |on: bool| {
        if on {
            state.store(PAUSE, Ordering::Release);
            common::wait_for("the pair's traffic to pause", common::PATIENCE, || {
                match state.load(Ordering::Acquire) {
                    PAUSED => Ok(()),
                    // Still finishing an exchange (or it failed: joined below).
                    s => Err(format!("state {s}")),
                }
            });
        } else {
            state.store(RUN, Ordering::Release);
        }
    };

    // Pools are per core, and REUSEPORT spreads the pair's connections over
    // the cores at random: wait until every core has its pooled tunnel,
    // so round 0 counts them too (on a loaded machine a core may not have
    // served the pair yet when the first round is counted).
    common::wait_for(
        "every core to pool a tunnel for the pair",
        common::PATIENCE,
        || {
            let pooled = rw.per_core("ringway_core_hbone_pool_connections");
            if !pooled.is_empty() && pooled.iter().all(|&n| n > 0) {
                Ok(())
            } else {
                Err(format!("pooled tunnels per core: {pooled:?}"))
            }
        },
    );
    let pid = rw.pid();
    let churned: std::collections::HashSet<String> = pods.iter().map(netns_link).collect();
    let mut after_round = Vec::new();
    for round in 0..3 {
        for (i, p) in pods.iter().enumerate() {
            let uid = format!("churn-{i}");
            assert_eq!(
                conn.add(&uid, &p.name, "ns", &uid, "sa"),
                "",
                "round {round} add {i}"
            );
        }
        let with_pods = open_fds(pid);
        for i in 0..pods.len() {
            assert_eq!(conn.del(&format!("churn-{i}")), "", "round {round} del {i}");
        }
        // Listener closing is acked; namespace handles go when the last
        // core lets go of the pod (its drain task): wait until ringway
        // holds none of the removed pods' namespaces, and the pair's last
        // connection has closed, then count (twice, to be sure nothing
        // was still closing in between).
        pause(true);
        let fds = common::wait_for(
            "the removed pods' drains and the pair's last connection",
            common::PATIENCE,
            || {
                // Idle, the pair still has its pooled tunnels: each counts as
                // one open connection at its accepting end.
                let open: u64 = rw.per_core("ringway_core_open_connections").iter().sum();
                let pooled: u64 = rw
                    .per_core("ringway_core_hbone_pool_connections")
                    .iter()
                    .sum();
                let before = open_fds(pid);
                let held = netns_held(pid)
                    .iter()
                    .filter(|n| churned.contains(*n))
                    .count();
                let after = open_fds(pid);
                if held > 0 {
                    Err(format!("{held} removed pods' namespaces still held"))
                } else if open != pooled {
                    Err(format!(
                        "{open} connections open, {pooled} of them pooled tunnels"
                    ))
                } else if before != after {
                    Err(format!("descriptors changing: {before}, then {after}"))
                } else {
                    Ok(after)
                }
            },
        );
        let rss = rss_kib(pid);
        pause(false);
        eprintln!(
            "round {round}: fds with 100 pods {with_pods}, after removal {fds}, rss {rss} KiB"
        );
        after_round.push((with_pods, fds, rss));
    }
    state.store(STOP, Ordering::Release);
    let exchanges = traffic.join().expect("pair traffic never failed");
    assert!(exchanges > 0);
    eprintln!("{exchanges} exchanges between the pair while pods came and went");
    let (first, last) = (after_round[0], after_round[2]);
    // 100 pods × 3 listeners × cores, plus one namespace handle each.
    assert!(
        first.0 >= first.1 + 300,
        "pods did not hold listeners: {after_round:?}"
    );
    assert_eq!(
        first.1, last.1,
        "descriptors leak across rounds: {after_round:?}"
    );
    assert!(
        last.2 <= first.2 + 2048,
        "memory grows across rounds (KiB): {after_round:?}"
    );
    drop(conn);
}

/// An enrolled pod whose workload the mesh config does not have (yet):
/// its listeners run, but its traffic is refused, fail closed, with the
/// reason in the access log; inbound to it too.
#[test]
fn a_pod_missing_from_the_config_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pod_pair("ip5", 8);
    // Only pod B is in the mesh; pod A is enrolled but unknown.
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[("server", "ns", &b.ip, "node1")]),
    );
    let agent = Agent::listen(&dir.path().join("zds.sock"));
    let rw = start_node(dir.path(), "node1", &agent, &cfg);
    let conn = agent.accept(Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    assert_eq!(
        conn.add("uid-a", &a.ns.name, "ns", "client", "sa-client"),
        ""
    );
    assert_eq!(
        conn.add("uid-b", &b.ns.name, "ns", "server", "sa-server"),
        ""
    );
    serve_app(&b, 8080);
    match connect(&a, &format!("{}:8080", b.ip)) {
        Ok(mut s) => {
            let mut buf = [0u8; 16];
            let r = s.read(&mut buf);
            assert!(
                common::peer_closed(&r),
                "unknown pod's traffic got through: {r:?}"
            );
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let line = rw.wait_log("refusal", |l| {
        l["scope"] == "access" && l["direction"] == "outbound"
    });
    let error = line["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("not in the mesh config"),
        "outbound from an unknown pod: {line}"
    );
    // Plaintext into pod A (captured to its 15006) is refused too: there is
    // no workload whose policies could admit it.
    serve_app(&a, 8080);
    match connect_marked(&b, &format!("{}:8080", a.ip)) {
        Ok(mut s) => {
            let mut buf = [0u8; 16];
            let r = s.read(&mut buf);
            assert!(
                common::peer_closed(&r),
                "inbound to an unknown pod got through: {r:?}"
            );
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}
