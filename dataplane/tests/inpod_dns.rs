//! The DNS proxy in in-pod mode (issue 23): a pod enrolled through the
//! in-test node agent, with istio-cni's rules (DNS capture on, its
//! default), resolves with `dig` to a resolver on port 53 as its
//! application would; the rules send the query to ringway on
//! 127.0.0.1:15053 inside the pod. Mesh names are answered from the mesh
//! as the pod's own workload sees them; the rest is forwarded from inside
//! the pod to the upstream resolver, which this test runs in a second
//! namespace reachable only from the pod. Removing the pod takes its DNS
//! sockets away.
//!
//! Needs root (namespaces, setns, nftables) and `dig`; fails loudly
//! otherwise.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::inpod::*;
use common::zds::Agent;
use common::NetNs;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};

/// Names the upstream resolver was asked, and how often.
type Asked = Arc<Mutex<HashMap<String, usize>>>;

/// The upstream resolver, on `addr` inside `ns` (UDP and TCP): A for
/// `ext.example.org`, NXDOMAIN for everything else, and a note of every
/// name asked.
fn start_upstream(ns: &NetNs, addr: SocketAddr) -> Asked {
    let (udp, tcp) = ns.enter(move || {
        (
            UdpSocket::bind(addr).unwrap(),
            TcpListener::bind(addr).unwrap(),
        )
    });
    let asked: Asked = Default::default();
    let answer = {
        let asked = asked.clone();
        move |bytes: &[u8]| -> Option<Vec<u8>> {
            let query = Message::from_vec(bytes).ok()?;
            let q = query.queries.first()?;
            let name = q.name().to_lowercase().to_ascii();
            *asked.lock().unwrap().entry(name.clone()).or_default() += 1;
            let mut m = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
            m.metadata.recursion_desired = query.metadata.recursion_desired;
            m.metadata.recursion_available = true;
            m.add_queries(query.queries.iter().cloned());
            if name == "ext.example.org." && q.query_type() == RecordType::A {
                m.insert_answers(vec![Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A::new(192, 0, 2, 7)),
                )]);
            } else {
                m.metadata.response_code = ResponseCode::NXDomain;
            }
            m.to_vec().ok()
        }
    };
    let on_udp = answer.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            if let Some(reply) = on_udp(&buf[..n]) {
                let _ = udp.send_to(&reply, from);
            }
        }
    });
    common::serve_dns_tcp(tcp, answer);
    asked
}

/// `dig` inside `pod` to `server` (port 53 unless `extra` says `-p`), as
/// the pod's application asks its resolver: the status and the A records.
fn dig(pod: &Pod, server: &str, name: &str, extra: &[&str]) -> (String, Vec<String>, String) {
    let port = match extra.iter().position(|a| *a == "-p") {
        Some(i) => extra[i + 1],
        None => "53",
    };
    let extra: Vec<&str> = match extra.iter().position(|a| *a == "-p") {
        Some(i) => [&extra[..i], &extra[i + 2..]].concat(),
        None => extra.to_vec(),
    };
    let out = Command::new("ip")
        .args(["netns", "exec", &pod.ns.name, "dig", &format!("@{server}")])
        .args(["-p", port, "+tries=1", "+timeout=3", "+noall", "+comments"])
        .args(["+answer"])
        .args(extra)
        .args([name, "A"])
        .output()
        .expect("run dig (dnsutils)");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = common::dig_status(&raw);
    let mut addrs: Vec<String> = raw
        .lines()
        .filter(|l| !l.starts_with(';'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5 && f[3] == "A").then(|| f[4].to_string())
        })
        .collect();
    addrs.sort();
    (status, addrs, raw)
}

/// The sockets listening on `port` inside `ns` (UDP and TCP), by local
/// address.
fn listening(ns: &NetNs, port: u16) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "ss", "-Hlntu"])
        .arg(format!("sport = :{port}"))
        .output()
        .expect("run ss");
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(format!("{} {}", f.first()?, f.get(4)?))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// ringway in in-pod mode, DNS on by default, forwarding to `upstream`.
fn start(
    dir: &std::path::Path,
    agent: &Agent,
    cfg: &std::path::Path,
    upstream: &str,
) -> common::Ringway {
    common::Ringway::start(
        None,
        &[
            "--inpod",
            "--inpod-uds",
            agent.path.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--ca-dir",
            dir.join("ca").to_str().unwrap(),
            "--node-name",
            "node1",
            "--drain-timeout",
            "1s",
            "--dns-upstream",
            upstream,
            "--dns-forward-timeout",
            "2s",
        ],
    )
}

/// A pod in namespace `shop` resolves through ringway in its own network
/// namespace: a Service by its full name and by its short name (the pod's
/// namespace's search suffix), over UDP and TCP; another name forwarded to
/// the upstream from inside the pod (marked, so the pod's DNS capture lets
/// it out). Removing the pod closes its DNS sockets.
#[test]
fn a_pods_dns_is_answered_in_its_namespace_and_goes_with_it() {
    let found = Command::new("dig").arg("-v").output().is_ok();
    assert!(
        found,
        "`dig` is missing: install dnsutils; this test does not skip"
    );
    let dir = tempfile::tempdir().unwrap();
    // Pod A is enrolled; B stands for the cluster's resolver, reachable
    // from A only (so forwarding works only from inside the pod).
    let (a, b) = pod_pair("idn", 11);
    let script = ringway_rig::script("inpod-rules.sh");
    let removed = Command::new("bash")
        .arg(&script)
        .args([&b.ns.name, "--remove"])
        .status()
        .unwrap();
    assert!(removed.success());
    let upstream: SocketAddr = format!("{}:53", b.ip).parse().unwrap();
    let asked = start_upstream(&b.ns, upstream);

    let mesh = mesh(&[("client", "shop", &a.ip, "node1")]).replace(
        "policies: []\n",
        "services:\n- name: web\n  namespace: shop\n  hostname: web.shop.svc.cluster.local\n  \
         vips: [\"/10.96.1.1\"]\n  ports: {80: 8080}\npolicies: []\n",
    );
    let cfg = common::write_config(dir.path(), "mesh.yaml", &mesh);
    let agent = Agent::listen(&dir.path().join("zds.sock"));
    let up = upstream.to_string();
    let rw = start(dir.path(), &agent, &cfg, &up);
    let conn = agent.accept(Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    assert_eq!(
        conn.add("pod-a", &a.ns.name, "shop", "client", "sa-client"),
        ""
    );
    // The ack means serving: DNS on 127.0.0.1:15053 in the pod, and on
    // [::1]:15053 too (the pod has IPv6 loopback), UDP and TCP.
    assert_eq!(
        listening(&a.ns, 15053),
        [
            "tcp 127.0.0.1:15053",
            "tcp [::1]:15053",
            "udp 127.0.0.1:15053",
            "udp [::1]:15053"
        ]
    );
    wait_ready(&rw, true);

    // The pod asks "its resolver" on port 53: the rules hand the query to
    // ringway, which answers mesh names itself (the upstream would say
    // NXDOMAIN, and never hears of them).
    let resolver = b.ip.as_str();
    let (status, addrs, raw) = dig(&a, resolver, "web.shop.svc.cluster.local", &[]);
    assert_eq!(
        (status.as_str(), addrs),
        ("NOERROR", vec!["10.96.1.1".into()]),
        "{raw}"
    );
    let (_, addrs, raw) = dig(&a, resolver, "web", &[]);
    assert_eq!(addrs, ["10.96.1.1"], "short name from pod of shop: {raw}");
    let (_, addrs, raw) = dig(&a, resolver, "web.shop", &[]);
    assert_eq!(addrs, ["10.96.1.1"], "{raw}");
    let (_, addrs, raw) = dig(&a, resolver, "web", &["+tcp"]);
    assert_eq!(addrs, ["10.96.1.1"], "over TCP: {raw}");

    // Other names go upstream, from inside the pod.
    let (status, addrs, raw) = dig(&a, resolver, "ext.example.org", &[]);
    assert_eq!(
        (status.as_str(), addrs),
        ("NOERROR", vec!["192.0.2.7".into()]),
        "{raw}"
    );
    let (status, _, raw) = dig(&a, resolver, "nothing.example.org", &["+tcp"]);
    assert_eq!(status, "NXDOMAIN", "{raw}");
    {
        let asked = asked.lock().unwrap();
        assert_eq!(asked.get("ext.example.org."), Some(&1), "{asked:?}");
        assert_eq!(asked.get("nothing.example.org."), Some(&1), "{asked:?}");
        assert!(
            asked.keys().all(|n| !n.starts_with("web")),
            "mesh names reached the upstream: the pod's DNS was not captured: {asked:?}"
        );
    }
    // The asking workload is the pod's own, whatever the source address:
    // from the pod's loopback (no workload has it) the short name still
    // expands in the pod's namespace.
    let (_, addrs, raw) = dig(&a, "127.0.0.1", "web", &["-p", "15053", "-b", "127.0.0.1"]);
    assert_eq!(addrs, ["10.96.1.1"], "from 127.0.0.1 in the pod: {raw}");
    let (_, addrs, raw) = dig(&a, "::1", "web", &["-p", "15053"]);
    assert_eq!(addrs, ["10.96.1.1"], "on [::1]: {raw}");

    // Removed: nothing listens on 15053 in the pod, and its queries get no
    // answer (the capture still sends them there).
    assert_eq!(conn.del("pod-a"), "");
    assert_eq!(listening(&a.ns, 15053), Vec::<String>::new());
    let (status, _, raw) = dig(&a, resolver, "web.shop.svc.cluster.local", &[]);
    assert_eq!(status, "NO REPLY", "{raw}");
    drop((conn, rw));
}

/// A pod whose DNS port is taken inside it fails to start like one whose
/// other listeners cannot bind: NACKed naming the DNS socket, readiness
/// 503 while it is retried, then served once the port is free.
#[test]
fn a_pod_whose_dns_port_is_taken_is_nacked_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _b) = pod_pair("idf", 12);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(&[("one", "ns", &a.ip, "node1")]),
    );
    let agent = Agent::listen(&dir.path().join("zds.sock"));
    let rw = start(dir.path(), &agent, &cfg, "192.0.2.53:53");
    let conn = agent.accept(Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    wait_ready(&rw, true);

    // Bound without SO_REUSEPORT: ringway's sockets cannot join it.
    let squatter =
        a.ns.enter(|| UdpSocket::bind("127.0.0.1:15053").expect("take 15053 in the pod"));
    let nack = conn.add("uid-one", &a.ns.name, "ns", "one", "sa-one");
    assert!(
        nack.contains("DNS") && nack.contains("127.0.0.1:15053"),
        "NACK names the DNS socket: {nack:?}"
    );
    wait_ready(&rw, false);
    assert_eq!(
        listening(&a.ns, 15001),
        Vec::<String>::new(),
        "all or nothing"
    );
    drop(squatter);
    wait_ready(&rw, true);
    assert!(
        listening(&a.ns, 15053).contains(&"udp 127.0.0.1:15053".to_string()),
        "served after the retry"
    );
    assert_eq!(conn.del("uid-one"), "");
}
