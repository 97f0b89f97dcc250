//! Passthrough behaviour through a real ringway process inside a private
//! network namespace with a real nftables REDIRECT capture rule.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use common::{recv_all, send_pattern, NetNs};

const MIB: usize = 1 << 20;

/// A namespace with capture of 9000-9999 (and any `extra` ports) and
/// ringway running with `args`.
fn rig(tag: &str, args: &[&str]) -> (NetNs, common::Ringway) {
    let ns = NetNs::new(tag);
    ns.capture_outbound("9000-9999");
    let rw = ns.ringway(args);
    (ns, rw)
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

fn transfer_both_ways(mode: &str) {
    let (ns, rw) = rig(mode, &["--copy-mode", mode, "--cores", "2"]);
    let size = 64 * MIB;
    let (c2s, s2c, server_got, client_got) = ns.enter(move || {
        let l = TcpListener::bind("127.0.0.1:9001").unwrap();
        let server = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let w = s.try_clone().unwrap();
            let sender = thread::spawn(move || send_pattern(w, size, 2));
            let got = recv_all(s);
            (sender.join().unwrap(), got)
        });
        let c = connect("127.0.0.1:9001");
        let w = c.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 1));
        let client_got = recv_all(c);
        let c2s = sender.join().unwrap();
        let (s2c, server_got) = server.join().unwrap();
        (c2s, s2c, server_got, client_got)
    });
    assert_eq!(server_got.0, size, "server received every byte");
    assert_eq!(client_got.0, size, "client received every byte");
    assert_eq!(server_got.1 .0, c2s.0, "client→server bytes intact");
    assert_eq!(client_got.1 .0, s2c.0, "server→client bytes intact");
    let logs = rw.wait_access_logs(1);
    let log = &logs[0];
    assert_eq!(log["path"], "outbound");
    assert_eq!(log["dst.addr"], "127.0.0.1:9001");
    assert_eq!(log["bytes_sent"], size as u64);
    assert_eq!(log["bytes_recv"], size as u64);
    assert_eq!(log["outcome"], "closed", "{log}");
}

#[test]
fn transfer_64mib_each_way_splice() {
    transfer_both_ways("splice");
}

#[test]
fn transfer_64mib_each_way_copy() {
    transfer_both_ways("copy");
}

#[test]
fn half_close_client_first() {
    let (ns, rw) = rig("hcc", &[]);
    ns.enter(|| {
        let l = TcpListener::bind("127.0.0.1:9002").unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap(); // returns only on the client's FIN
            assert_eq!(got, b"request");
            // Our direction is still open after the client's FIN.
            s.write_all(b"response after your FIN").unwrap();
        });
        let mut c = connect("127.0.0.1:9002");
        c.write_all(b"request").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"response after your FIN");
        server.join().unwrap();
    });
    assert_eq!(rw.wait_access_logs(1)[0]["outcome"], "closed");
}

#[test]
fn half_close_server_first() {
    let (ns, _rw) = rig("hcs", &[]);
    ns.enter(|| {
        let l = TcpListener::bind("127.0.0.1:9003").unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"banner").unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        });
        let mut c = connect("127.0.0.1:9003");
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap(); // server's FIN arrives while we still write
        assert_eq!(got, b"banner");
        c.write_all(b"late reply").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(server.join().unwrap(), b"late reply");
    });
}

fn reset(s: TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

#[test]
fn upstream_reset_reaches_client() {
    let (ns, rw) = rig("rstu", &[]);
    ns.enter(|| {
        let l = TcpListener::bind("127.0.0.1:9004").unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            reset(s);
        });
        let mut c = connect("127.0.0.1:9004");
        c.write_all(b"hello").unwrap();
        server.join().unwrap();
        let mut buf = [0u8; 16];
        let err = c
            .read(&mut buf)
            .expect_err("the reset must reach the client, not a clean EOF");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    });
    let log = &rw.wait_access_logs(1)[0];
    assert!(
        log["error"].as_str().unwrap().contains("reset by upstream"),
        "{log}"
    );
}

#[test]
fn client_reset_reaches_upstream() {
    let (ns, rw) = rig("rstc", &[]);
    ns.enter(|| {
        let l = TcpListener::bind("127.0.0.1:9005").unwrap();
        let c = connect("127.0.0.1:9005");
        let (mut s, _) = l.accept().unwrap();
        (&c).write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        reset(c);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let err = s
            .read(&mut [0u8; 8])
            .expect_err("upstream must see a reset, not EOF");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    });
    let log = &rw.wait_access_logs(1)[0];
    assert!(
        log["error"]
            .as_str()
            .unwrap()
            .contains("reset by downstream"),
        "{log}"
    );
}

#[test]
fn upstream_refused_resets_client_and_logs() {
    let (ns, rw) = rig("refu", &[]);
    ns.enter(|| {
        // Nothing listens on 9006.
        let mut c = connect("127.0.0.1:9006");
        let r = c.read(&mut [0u8; 8]);
        assert!(
            matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "{r:?}"
        );
    });
    let log = &rw.wait_access_logs(1)[0];
    let err = log["error"].as_str().unwrap();
    assert!(
        err.contains("upstream connect to 127.0.0.1:9006 failed") && err.contains("refused"),
        "{log}"
    );
}

#[test]
fn connection_to_own_listener_is_refused() {
    let ns = NetNs::new("loop");
    // A broken capture rule that also redirects traffic aimed at 15006.
    ns.capture_outbound("9000-9999, 15006");
    let rw = ns.ringway(&[]);
    ns.enter(|| {
        let mut c = connect("127.0.0.1:15006");
        let read = c.read(&mut [0u8; 8]);
        assert!(common::peer_closed(&read), "{read:?}");
    });
    let log = &rw.wait_access_logs(1)[0];
    assert!(
        log["error"].as_str().unwrap().contains("forwarding loop"),
        "{log}"
    );
}

#[test]
fn uncaptured_connection_to_outbound_is_refused() {
    let (ns, rw) = rig("nocap", &[]);
    ns.enter(|| {
        let mut c = connect("127.0.0.1:15001");
        let read = c.read(&mut [0u8; 8]);
        assert!(common::peer_closed(&read), "{read:?}");
    });
    // Conntrack still answers SO_ORIGINAL_DST for an un-NATed connection
    // (with the listener's own address), which the loop guard refuses.
    let log = &rw.wait_access_logs(1)[0];
    let err = log["error"].as_str().unwrap();
    assert!(
        err.contains("forwarding loop") || err.contains("no original destination"),
        "{log}"
    );
}

#[test]
fn thousand_concurrent_connections_use_both_cores() {
    let (ns, rw) = rig("conc", &["--cores", "2"]);
    const N: usize = 1000;
    ns.enter(|| {
        common::raise_nofile();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let l = tokio::net::TcpListener::bind("127.0.0.1:9007")
                .await
                .unwrap();
            tokio::spawn(async move {
                loop {
                    let (mut s, _) = l.accept().await.unwrap();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 64];
                        loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => s.write_all(&buf[..n]).await.unwrap(),
                            }
                        }
                    });
                }
            });
            // Open all N first so they are concurrently proxied.
            let mut conns = Vec::with_capacity(N);
            for _ in 0..N {
                conns.push(
                    tokio::net::TcpStream::connect("127.0.0.1:9007")
                        .await
                        .unwrap(),
                );
            }
            let mut tasks = Vec::new();
            for (i, mut c) in conns.into_iter().enumerate() {
                tasks.push(tokio::spawn(async move {
                    let msg = format!("conn-{i:05}");
                    c.write_all(msg.as_bytes()).await.unwrap();
                    let mut buf = vec![0u8; msg.len()];
                    tokio::time::timeout(Duration::from_secs(30), c.read_exact(&mut buf))
                        .await
                        .expect("echo timed out")
                        .unwrap();
                    assert_eq!(buf, msg.as_bytes());
                    c
                }));
            }
            let mut held = Vec::new();
            for t in tasks {
                held.push(t.await.unwrap());
            }
            assert_eq!(held.len(), N);
        });
    });
    let logs = rw.wait_access_logs(N);
    let on_core = |c: u64| logs.iter().filter(|l| l["core"] == c).count();
    let (c0, c1) = (on_core(0), on_core(1));
    assert_eq!(c0 + c1, N);
    assert!(
        c0 > N / 10 && c1 > N / 10,
        "connections should spread over both cores: {c0}/{c1}"
    );
    assert!(
        logs.iter().all(|l| l["outcome"] == "closed"),
        "every connection closed cleanly"
    );
}

/// Two namespaces joined by a veth pair: a "pod" with ringway capturing
/// its egress, and a "server" host. IPv4 and IPv6 original destinations.
#[test]
fn original_dst_across_veth_ipv4_and_ipv6() {
    let pod = NetNs::new("pod");
    let srv = NetNs::new("srv");
    let (a, b) = (
        format!("rwp{}", std::process::id() % 100000),
        format!("rws{}", std::process::id() % 100000),
    );
    let out = std::process::Command::new("ip")
        .args([
            "link", "add", &a, "netns", &pod.name, "type", "veth", "peer", "name", &b, "netns",
            &srv.name,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pod.ip(&["addr", "add", "10.248.0.2/24", "dev", &a]);
    srv.ip(&["addr", "add", "10.248.0.1/24", "dev", &b]);
    pod.ip(&["addr", "add", "fd00:248::2/64", "dev", &a, "nodad"]);
    srv.ip(&["addr", "add", "fd00:248::1/64", "dev", &b, "nodad"]);
    pod.ip(&["link", "set", &a, "up"]);
    srv.ip(&["link", "set", &b, "up"]);
    pod.nft(&format!(
        "table inet ringway_test {{
           chain out {{ type nat hook output priority -100; policy accept;
             oifname \"{a}\" meta l4proto tcp meta mark & 0xfff != 0x539 redirect to :15001;
             }}
         }}"
    ));
    let rw = pod.ringway(&["--outbound-addr", "0.0.0.0:15001,[::]:15001"]);

    let servers: Vec<SocketAddr> = vec![
        "10.248.0.1:8080".parse().unwrap(),
        "[fd00:248::1]:8080".parse().unwrap(),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    let srv_name = srv.name.clone();
    let s2 = servers.clone();
    let server = thread::spawn(move || {
        common::in_netns(&srv_name, move || {
            let ls: Vec<_> = s2.iter().map(|a| TcpListener::bind(a).unwrap()).collect();
            tx.send(()).unwrap();
            let mut peers = Vec::new();
            for l in ls {
                let (mut s, peer) = l.accept().unwrap();
                let mut b = [0u8; 4];
                s.read_exact(&mut b).unwrap();
                s.write_all(&b).unwrap();
                peers.push(peer.ip());
            }
            peers
        })
    });
    rx.recv().unwrap();
    pod.enter(move || {
        for a in servers {
            let mut c = TcpStream::connect(a).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
        }
    });
    let peers = server.join().unwrap();
    // The server saw the pod's own addresses (ringway dials from the pod).
    assert_eq!(
        peers,
        vec![
            "10.248.0.2".parse::<std::net::IpAddr>().unwrap(),
            "fd00:248::2".parse().unwrap()
        ]
    );
    let logs = rw.wait_access_logs(2);
    let dsts: Vec<_> = logs
        .iter()
        .map(|l| l["dst.addr"].as_str().unwrap().to_string())
        .collect();
    assert!(dsts.contains(&"10.248.0.1:8080".to_string()), "{dsts:?}");
    assert!(dsts.contains(&"[fd00:248::1]:8080".to_string()), "{dsts:?}");
}

/// Inbound capture: traffic arriving at the workload's namespace for port
/// 8080 is REDIRECTed to 15006 and delivered to the app (a local workload)
/// by ringway.
#[test]
fn inbound_passthrough_redirect() {
    let client = NetNs::new("icl");
    let node = NetNs::new("ind");
    let (a, b) = (
        format!("rwc{}", std::process::id() % 100000),
        format!("rwn{}", std::process::id() % 100000),
    );
    let out = std::process::Command::new("ip")
        .args([
            "link",
            "add",
            &a,
            "netns",
            &client.name,
            "type",
            "veth",
            "peer",
            "name",
            &b,
            "netns",
            &node.name,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    client.ip(&["addr", "add", "10.249.0.1/24", "dev", &a]);
    node.ip(&["addr", "add", "10.249.0.2/24", "dev", &b]);
    client.ip(&["link", "set", &a, "up"]);
    node.ip(&["link", "set", &b, "up"]);
    node.nft(&format!(
        "table inet ringway_test {{
           chain pre {{ type nat hook prerouting priority -100; policy accept;
             iifname \"{b}\" tcp dport 8080 redirect to :15006;
             }}
         }}"
    ));
    // Inbound traffic is delivered to local workloads only.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        dir.path(),
        "app.yaml",
        r#"
workloads:
- uid: app
  name: app
  namespace: default
  workloadIps: ["10.249.0.2"]
  protocol: TCP
"#,
    );
    let rw = node.ringway(&["--config", cfg.to_str().unwrap()]);
    let app = node.enter(|| TcpListener::bind("10.249.0.2:8080").unwrap());
    let app_thread = thread::spawn(move || {
        let (mut s, _) = app.accept().unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        s.write_all(got.to_uppercase().as_bytes()).unwrap();
    });
    client.enter(|| {
        let mut c = connect("10.249.0.2:8080");
        c.write_all(b"inbound hello").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert_eq!(got, "INBOUND HELLO");
    });
    app_thread.join().unwrap();
    let log = &rw.wait_access_logs(1)[0];
    assert_eq!(log["path"], "inbound_passthrough");
    assert_eq!(log["dst.addr"], "10.249.0.2:8080");
    assert!(
        log["src.addr"].as_str().unwrap().starts_with("10.249.0.1:"),
        "{log}"
    );
    assert_eq!(log["outcome"], "closed");
}
