//! In-pod rigs: pod namespaces with istio-cni's in-pod rules (our
//! `scripts/inpod-rules.sh`), an application that says who connected, and
//! connecting from inside a pod as its application would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::zds::Agent;
use super::{NetNs, Ringway};

pub const TD: &str = "cluster.local";

/// A pod: its namespace and address.
pub struct Pod {
    pub ns: NetNs,
    pub ip: String,
}

/// istio-cni's in-pod redirection, installed by our script inside the pod.
pub fn install_inpod_rules(pod: &NetNs) {
    let script = ringway_rig::script("inpod-rules.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(&pod.name)
        .output()
        .expect("run inpod-rules.sh");
    assert!(
        out.status.success(),
        "inpod-rules.sh {}: {}{}",
        pod.name,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two pods joined by a veth pair (10.251.<net>.1 and .2), rules installed.
pub fn pod_pair(tag: &str, net: u8) -> (Pod, Pod) {
    let a = NetNs::new(&format!("{tag}pa"));
    let b = NetNs::new(&format!("{tag}pb"));
    let (ip_a, ip_b) = (format!("10.251.{net}.1"), format!("10.251.{net}.2"));
    super::veth(&a, &ip_a, &b, &ip_b);
    install_inpod_rules(&a);
    install_inpod_rules(&b);
    (Pod { ns: a, ip: ip_a }, Pod { ns: b, ip: ip_b })
}

pub fn mesh(pods: &[(&str, &str, &str, &str)]) -> String {
    let mut y = String::from("workloads:\n");
    for (name, ns, ip, node) in pods {
        y.push_str(&format!(
            "- uid: Kubernetes//Pod/{ns}/{name}\n  name: {name}\n  namespace: {ns}\n  \
             serviceAccount: sa-{name}\n  trustDomain: cluster.local\n  \
             workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n  services: {{}}\n"
        ));
    }
    y.push_str("policies: []\n");
    y
}

/// A ringway in in-pod mode for `node`, enrolled through `agent`.
pub fn start_node(dir: &Path, node: &str, agent: &Agent, config: &Path) -> Ringway {
    Ringway::start(
        None,
        &[
            "--inpod",
            "--inpod-uds",
            agent.path.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--ca-dir",
            dir.join("ca").to_str().unwrap(),
            "--node-name",
            node,
            "--drain-timeout",
            "1s",
        ],
    )
}

/// The application in a pod: says which address the connection came from,
/// then echoes.
pub fn serve_app(pod: &Pod, port: u16) {
    let addr: SocketAddr = format!("{}:{port}", pod.ip).parse().unwrap();
    let l = pod.ns.enter(move || TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let peer = s.peer_addr().unwrap();
                if s.write_all(format!("peer={}\n", peer.ip()).as_bytes())
                    .is_err()
                {
                    return;
                }
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// Connects from inside `from` to `to`, as the pod's application would.
pub fn connect(from: &Pod, to: &str) -> std::io::Result<TcpStream> {
    connect_in(&from.ns.name, to)
}

pub fn connect_in(netns: &str, to: &str) -> std::io::Result<TcpStream> {
    let to: SocketAddr = to.parse().unwrap();
    let s = super::in_netns(netns, move || {
        TcpStream::connect_timeout(&to, Duration::from_secs(10))
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Connects with SO_MARK 0x539 (as ringway's own sockets are marked), so
/// the pod's rules let it pass unredirected: reaches the real listener.
pub fn connect_marked(from: &Pod, to: &str) -> std::io::Result<TcpStream> {
    let to: SocketAddr = to.parse().unwrap();
    from.ns.enter(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_mark(0x539)?;
        s.connect_timeout(&to.into(), Duration::from_secs(5))?;
        Ok(s.into())
    })
}

/// One round trip: the app's greeting (who it saw) and an echo.
pub fn round_trip(s: &mut TcpStream, msg: &str) -> String {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    s.write_all(msg.as_bytes()).unwrap();
    let mut echo = vec![0u8; msg.len()];
    r.read_exact(&mut echo).unwrap();
    assert_eq!(echo, msg.as_bytes());
    greeting.trim().to_owned()
}

pub fn wait_ready(rw: &Ringway, want: bool) {
    super::wait_for(&format!("readiness ready={want}"), super::PATIENCE, || {
        let (status, _) = rw.http_get("readiness", "/healthz/ready");
        if status.contains(" 200 ") == want {
            Ok(())
        } else {
            Err(format!("{status}; {}", super::FileText(&rw.log_path)))
        }
    })
}

pub fn spiffe(ns: &str, sa: &str) -> String {
    format!("spiffe://{TD}/ns/{ns}/sa/{sa}")
}
