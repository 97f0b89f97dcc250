//! The SOCKS5 front door (15080) against a real ringway process, each test
//! in its own network namespace. SOCKS5 needs no capture rules: clients
//! dial the listener explicitly, and the connection takes the outbound
//! path (plan, loop refusal, HBONE or passthrough, access log).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{in_netns, recv_all, send_pattern, NetNs, Ringway};

const MIB: usize = 1 << 20;

/// A namespace with ringway running its SOCKS5 listener (plus `args`).
fn rig(tag: &str, args: &[&str]) -> (NetNs, Ringway, SocketAddr) {
    let ns = NetNs::new(tag);
    let mut full = vec!["--socks5"];
    full.extend_from_slice(args);
    let rw = ns.ringway(&full);
    let proxy = socks_addr(&rw, 0);
    (ns, rw, proxy)
}

/// The `i`th bound SOCKS5 address, from --bound-addrs-file.
fn socks_addr(rw: &Ringway, i: usize) -> SocketAddr {
    rw.listeners["listeners"]["socks5"][i]
        .as_str()
        .unwrap_or_else(|| panic!("no socks5 listener: {}", rw.listeners))
        .parse()
        .unwrap()
}

/// A CONNECT destination as a client would send it.
#[derive(Clone)]
enum Dst {
    Addr(SocketAddr),
    Name(String, u16),
}

fn request(dst: &Dst) -> Vec<u8> {
    let mut m = vec![5, 1, 0];
    let port = match dst {
        Dst::Addr(SocketAddr::V4(a)) => {
            m.push(1);
            m.extend(a.ip().octets());
            a.port()
        }
        Dst::Addr(SocketAddr::V6(a)) => {
            m.push(4);
            m.extend(a.ip().octets());
            a.port()
        }
        Dst::Name(name, port) => {
            m.push(3);
            m.push(name.len() as u8);
            m.extend(name.as_bytes());
            *port
        }
    };
    m.extend(port.to_be_bytes());
    m
}

fn dial(proxy: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(proxy).unwrap_or_else(|e| panic!("connect {proxy}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Reads one reply: (REP, BND.ADDR:BND.PORT).
fn read_reply(s: &mut TcpStream) -> std::io::Result<(u8, SocketAddr)> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head)?;
    assert_eq!((head[0], head[2]), (5, 0), "reply header {head:?}");
    let addr = match head[3] {
        1 => {
            let mut b = [0u8; 6];
            s.read_exact(&mut b)?;
            SocketAddr::from(([b[0], b[1], b[2], b[3]], u16::from_be_bytes([b[4], b[5]])))
        }
        4 => {
            let mut b = [0u8; 18];
            s.read_exact(&mut b)?;
            let ip: [u8; 16] = b[..16].try_into().unwrap();
            SocketAddr::from((ip, u16::from_be_bytes([b[16], b[17]])))
        }
        other => panic!("reply with address type {other}"),
    };
    Ok((head[1], addr))
}

/// Greeting + CONNECT; returns the stream and the reply.
fn socks_connect(proxy: SocketAddr, dst: &Dst) -> (TcpStream, u8, SocketAddr) {
    let mut s = dial(proxy);
    s.write_all(&[5, 1, 0]).unwrap();
    let mut sel = [0u8; 2];
    s.read_exact(&mut sel).unwrap();
    assert_eq!(sel, [5, 0], "no-auth selected");
    s.write_all(&request(dst)).unwrap();
    let (rep, bound) = read_reply(&mut s).unwrap();
    (s, rep, bound)
}

/// Accepts connections on `l` and echoes each until EOF (then FIN).
fn echo_server(l: TcpListener) {
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            let _ = s.shutdown(Shutdown::Write);
                            return;
                        }
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// Sends `msg`, half-closes, and returns everything echoed back.
fn echo_roundtrip(mut s: TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    got
}

fn assert_alive(rw: &mut Ringway) {
    let status = rw.child.as_mut().unwrap().try_wait().unwrap();
    assert!(status.is_none(), "ringway exited: {status:?}");
    let stderr = rw.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn connect_by_ipv4_and_ipv6() {
    let (ns, rw, proxy) = rig("v46", &[]);
    ns.enter(move || {
        echo_server(TcpListener::bind("127.0.0.1:9001").unwrap());
        echo_server(TcpListener::bind("[::1]:9002").unwrap());

        let (s, rep, bound) = socks_connect(proxy, &Dst::Addr("127.0.0.1:9001".parse().unwrap()));
        assert_eq!(rep, 0);
        assert!(
            bound.ip().is_loopback() && bound.is_ipv4() && bound.port() != 0,
            "BND is the upstream socket's local address: {bound}"
        );
        assert_eq!(echo_roundtrip(s, b"over v4"), b"over v4");

        let (s, rep, bound) = socks_connect(proxy, &Dst::Addr("[::1]:9002".parse().unwrap()));
        assert_eq!(rep, 0);
        assert!(
            bound.is_ipv6() && bound.ip().is_loopback() && bound.port() != 0,
            "{bound}"
        );
        assert_eq!(echo_roundtrip(s, b"over v6"), b"over v6");

        // A client that does not wait: greeting, request and payload in
        // one write. The payload must reach the upstream, not the parser.
        let mut s = dial(proxy);
        let mut all = vec![5, 1, 0];
        all.extend(request(&Dst::Addr("127.0.0.1:9001".parse().unwrap())));
        all.extend(b"optimistic data");
        s.write_all(&all).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut sel = [0u8; 2];
        s.read_exact(&mut sel).unwrap();
        assert_eq!(sel, [5, 0]);
        assert_eq!(read_reply(&mut s).unwrap().0, 0);
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"optimistic data");
    });
    let logs = rw.wait_access_logs(3);
    for l in &logs {
        assert_eq!(l["path"], "socks5", "{l}");
        assert_eq!(l["route"], "passthrough", "{l}");
        assert_eq!(l["outcome"], "closed", "{l}");
        assert!(
            l["src.addr"].as_str().unwrap().contains("127.0.0.1:"),
            "{l}"
        );
    }
    let dsts: Vec<&str> = logs
        .iter()
        .map(|l| l["dst.addr"].as_str().unwrap())
        .collect();
    assert!(dsts.contains(&"127.0.0.1:9001"), "{dsts:?}");
    assert!(dsts.contains(&"[::1]:9002"), "{dsts:?}");
    let v6 = logs.iter().find(|l| l["dst.addr"] == "[::1]:9002").unwrap();
    assert_eq!(v6["bytes_sent"], 7);
    assert_eq!(v6["bytes_recv"], 7);
}

const SERVICE_CONFIG: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/echo
  name: echo
  namespace: default
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  services:
    "default/echo.default.svc.cluster.local": {80: 8080}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/127.10.0.1"]
  ports: {80: 8080}
policies: []
"#;

#[test]
fn connect_by_service_hostname() {
    let ns = NetNs::new("svc");
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(dir.path(), "svc.yaml", SERVICE_CONFIG);
    // SOCKS5 clients on loopback are no workload: let them out.
    let rw = ns.ringway(&[
        "--socks5",
        "--config",
        cfg.to_str().unwrap(),
        "--allow-unknown-source",
    ]);
    let proxy = socks_addr(&rw, 0);
    ns.enter(move || {
        echo_server(TcpListener::bind("127.0.0.2:8080").unwrap());
        let dst = Dst::Name("echo.default.svc.cluster.local".into(), 80);
        let (s, rep, _) = socks_connect(proxy, &dst);
        assert_eq!(rep, 0);
        assert_eq!(echo_roundtrip(s, b"by name"), b"by name");

        // Unknown name: host unreachable, then closed.
        let dst = Dst::Name("nope.default.svc.cluster.local".into(), 80);
        let (mut s, rep, bound) = socks_connect(proxy, &dst);
        assert_eq!(rep, 4, "host unreachable");
        assert_eq!(bound, "0.0.0.0:0".parse().unwrap());
        assert!(matches!(s.read(&mut [0u8; 8]), Ok(0)), "closed after");
    });
    let logs = rw.wait_access_logs(2);
    let ok = logs.iter().find(|l| l["outcome"] == "closed").unwrap();
    assert_eq!(ok["path"], "socks5");
    assert_eq!(ok["route"], "service", "{ok}");
    assert_eq!(ok["dst.service"], "echo.default.svc.cluster.local", "{ok}");
    assert_eq!(ok["dst.addr"], "127.0.0.2:8080", "{ok}");
    let bad = logs.iter().find(|l| l["error"].is_string()).unwrap();
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("nope.default.svc.cluster.local"),
        "{bad}"
    );
}

#[test]
fn refused_upstream_and_own_listeners() {
    let (ns, rw, proxy) = rig("refl", &[]);
    ns.enter(move || {
        // Nothing listens on 9006.
        let (mut s, rep, _) = socks_connect(proxy, &Dst::Addr("127.0.0.1:9006".parse().unwrap()));
        assert_eq!(rep, 5, "connection refused");
        assert!(matches!(s.read(&mut [0u8; 8]), Ok(0)));
        // ringway's own listeners: the outbound one and the SOCKS5 one.
        for own in ["127.0.0.1:15001", &proxy.to_string()] {
            let (mut s, rep, _) = socks_connect(proxy, &Dst::Addr(own.parse().unwrap()));
            assert_eq!(rep, 2, "{own}: not allowed (loop)");
            assert!(matches!(s.read(&mut [0u8; 8]), Ok(0)));
        }
    });
    let logs = rw.wait_access_logs(3);
    let errors: Vec<&str> = logs.iter().map(|l| l["error"].as_str().unwrap()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("upstream connect to 127.0.0.1:9006 failed")
                && e.contains("refused")),
        "{errors:?}"
    );
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.contains("forwarding loop"))
            .count(),
        2,
        "{errors:?}"
    );
    assert!(logs.iter().all(|l| l["path"] == "socks5"));
}

/// What a misbehaving client got back.
#[derive(Debug)]
enum Answer {
    /// Bytes, then EOF.
    Closed(Vec<u8>),
    /// Bytes, then a reset.
    Reset(Vec<u8>),
}

impl Answer {
    fn bytes(&self) -> &[u8] {
        match self {
            Answer::Closed(b) | Answer::Reset(b) => b,
        }
    }
}

/// Sends `bytes` (optionally half-closing), then reads until ringway closes.
fn misbehave(proxy: SocketAddr, bytes: &[u8], fin: bool) -> Answer {
    let mut s = dial(proxy);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if fin {
        // ringway may already have reset a garbage handshake (ENOTCONN
        // here): the read below sees how it ended either way.
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Answer::Closed(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Answer::Reset(got),
            Err(e) => panic!("{bytes:?}: ringway neither answered nor closed: {e}"),
        }
    }
}

#[test]
fn garbage_and_truncated_handshakes() {
    let (ns, mut rw, proxy) = rig("junk", &[]);
    let cases = ns.enter(move || {
        echo_server(TcpListener::bind("127.0.0.1:9010").unwrap());
        let mut n = 0;
        let mut check = |bytes: &[u8], fin: bool, want: &[u8]| {
            n += 1;
            let a = misbehave(proxy, bytes, fin);
            // The expected reply, or (for a client that is still sending)
            // a reset that may overtake it; never anything else.
            match &a {
                Answer::Closed(b) => assert_eq!(b, want, "{bytes:?}"),
                Answer::Reset(b) => assert!(want.starts_with(b), "{bytes:?}: {a:?}"),
            }
            a
        };
        let fail = |rep: u8| vec![5, 0, 5, rep, 0, 1, 0, 0, 0, 0, 0, 0];
        // Not SOCKS5 at all: closed without a word.
        check(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false, b"");
        check(&[4, 1, 0, 80, 127, 0, 0, 1, 0], true, b"");
        // No acceptable method.
        check(&[5, 2, 1, 2], true, &[5, 0xFF]);
        check(&[5, 0], true, &[5, 0xFF]);
        // Garbage after a valid greeting: general failure.
        let mut m = vec![5, 1, 0];
        m.extend(b"GET / HTTP/1.1\r\n\r\n");
        check(&m, true, &fail(1)[..]);
        // BIND and UDP ASSOCIATE: command not supported.
        check(&[5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80], true, &fail(7));
        check(&[5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0], true, &fail(7));
        // Unknown address type.
        check(&[5, 1, 0, 5, 1, 0, 9, 1, 2, 3, 4, 0, 80], true, &fail(8));
        // Empty domain name.
        check(&[5, 1, 0, 5, 1, 0, 3, 0, 0, 80], true, &fail(1));
        // Truncated: half a greeting, a greeting and half a request, a
        // domain shorter than announced, nothing at all.
        check(&[5, 3, 0], true, b"");
        check(&[5, 1, 0, 5, 1, 0, 1, 127, 0], true, &[5, 0]);
        check(&[5, 1, 0, 5, 1, 0, 3, 20, b'a', b'b'], true, &[5, 0]);
        check(&[], true, b"");
        // All 256 values of each request byte position, on a fresh
        // connection each: always an answer or a close, never a hang.
        for pos in 0..4usize {
            for v in [0u8, 1, 2, 3, 4, 5, 0x7f, 0x80, 0xfe, 0xff] {
                let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1, 0x23, 0x32]; // :9010
                req[pos] = v;
                let mut m = vec![5, 1, 0];
                m.extend(&req);
                let a = misbehave(proxy, &m, true);
                n += 1;
                assert!(
                    a.bytes().starts_with(&[5, 0]) || a.bytes().is_empty(),
                    "{a:?}"
                );
            }
        }
        // Still healthy: a proper CONNECT works.
        let (s, rep, _) = socks_connect(proxy, &Dst::Addr("127.0.0.1:9010".parse().unwrap()));
        assert_eq!(rep, 0);
        assert_eq!(echo_roundtrip(s, b"still here"), b"still here");
        n + 1
    });
    assert_alive(&mut rw);
    // Exactly one access-log line per connection, whatever happened to it.
    // Every case has its line; that no second line follows is shown by a
    // marker connection made once every case has ended (none open on any
    // core): lines leave through one queue in the order they are logged,
    // so a late extra line would come before the marker's.
    let logs = rw.wait_access_logs(cases);
    rw.wait_idle();
    let marker = ns.enter(move || {
        let mut s = dial(proxy);
        let me = s.local_addr().unwrap().to_string();
        s.shutdown(Shutdown::Write).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
        me
    });
    rw.wait_log("the marker connection", |l| {
        l["scope"] == "access" && l["src.addr"] == marker.as_str()
    });
    let all = rw.access_logs();
    assert_eq!(all.len(), cases + 1, "{all:#?}");
    assert!(logs.iter().all(|l| l["path"] == "socks5"));
    let errors: Vec<String> = logs
        .iter()
        .filter_map(|l| l["error"].as_str().map(String::from))
        .collect();
    for needle in [
        "not a SOCKS5 greeting",
        "no acceptable method",
        "not a SOCKS5 request",
        "only CONNECT",
        "unknown address type",
        "empty domain name",
        "truncated",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "no log for {needle}: {errors:#?}"
        );
    }
}

#[test]
fn stalled_handshake_is_dropped_after_the_timeout() {
    let (ns, rw, proxy) = rig("stall", &["--handshake-timeout", "1s"]);
    let timings = ns.enter(move || {
        let mut out = Vec::new();
        // Mid-greeting, and after the greeting (no request).
        for partial in [&[5u8][..], &[5, 1, 0]] {
            let mut s = dial(proxy);
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let started = Instant::now();
            s.write_all(partial).unwrap();
            let mut got = Vec::new();
            let r = s.read_to_end(&mut got);
            out.push((r.map_err(|e| e.kind()), got, started.elapsed()));
        }
        out
    });
    for (r, got, elapsed) in &timings {
        assert!(r.is_ok() || *r == Err(ErrorKind::ConnectionReset), "{r:?}");
        assert!(
            got.is_empty() || got == &[5, 0],
            "nothing but the method selection: {got:?}"
        );
        assert!(
            *elapsed >= Duration::from_millis(900) && *elapsed < Duration::from_secs(5),
            "dropped after --handshake-timeout: {elapsed:?}"
        );
    }
    let logs = rw.wait_access_logs(2);
    assert!(
        logs.iter().all(|l| l["error"]
            .as_str()
            .is_some_and(|e| e.contains("handshake not completed"))),
        "{logs:#?}"
    );
}

#[test]
fn transfer_64mib_each_way_through_socks5() {
    let (ns, rw, proxy) = rig("big", &["--cores", "2"]);
    let size = 64 * MIB;
    let (c2s, s2c, server_got, client_got) = ns.enter(move || {
        let l = TcpListener::bind("127.0.0.1:9020").unwrap();
        let server = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let w = s.try_clone().unwrap();
            let sender = thread::spawn(move || send_pattern(w, size, 21));
            let got = recv_all(s);
            (sender.join().unwrap(), got)
        });
        let (c, rep, _) = socks_connect(proxy, &Dst::Addr("127.0.0.1:9020".parse().unwrap()));
        assert_eq!(rep, 0);
        let w = c.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 12));
        let client_got = recv_all(c);
        let c2s = sender.join().unwrap();
        let (s2c, server_got) = server.join().unwrap();
        (c2s, s2c, server_got, client_got)
    });
    assert_eq!(server_got.0, size, "server received every byte");
    assert_eq!(client_got.0, size, "client received every byte");
    assert_eq!(server_got.1 .0, c2s.0, "client→server bytes intact");
    assert_eq!(client_got.1 .0, s2c.0, "server→client bytes intact");
    let log = &rw.wait_access_logs(1)[0];
    assert_eq!(log["path"], "socks5");
    assert_eq!(log["bytes_sent"], size as u64);
    assert_eq!(log["bytes_recv"], size as u64);
    assert_eq!(log["outcome"], "closed", "{log}");
}

const CLIENT_IP: &str = "10.251.0.1";
const SERVER_IP: &str = "10.251.0.2";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/client-ns/sa/client";
const SERVER_ID: &str = "spiffe://cluster.local/ns/server-ns/sa/server";

/// Two nodes (as in tests/hbone.rs): the SOCKS5 client on node A speaks
/// from the client workload's address; node B's ringway terminates HBONE.
#[test]
fn socks5_to_an_hbone_workload() {
    let a = NetNs::new("s5a");
    let b = NetNs::new("s5b");
    common::veth(&a, CLIENT_IP, &b, SERVER_IP);
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &format!(
            r#"
workloads:
- uid: cluster1//v1/Pod/client-ns/client
  name: client
  namespace: client-ns
  serviceAccount: client
  workloadIps: ["{CLIENT_IP}"]
  protocol: HBONE
  node: node-a
- uid: cluster1//v1/Pod/server-ns/server
  name: server
  namespace: server-ns
  serviceAccount: server
  workloadIps: ["{SERVER_IP}"]
  protocol: HBONE
  node: node-b
"#
        ),
    );
    let ca = dir.path().join("ca");
    let node_args = |node: &str, ip: &str| -> Vec<String> {
        [
            "--config",
            cfg.to_str().unwrap(),
            "--ca-dir",
            ca.to_str().unwrap(),
            "--node-name",
            node,
            "--inbound-addr",
            &format!("{ip}:15008"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut a_args = node_args("node-a", CLIENT_IP);
    a_args.extend([
        "--socks5-addr".into(),
        format!("127.0.0.1:15080,{CLIENT_IP}:15080"),
    ]);
    let b_args = node_args("node-b", SERVER_IP);
    let rw_a = a.ringway(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let rw_b = b.ringway(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    let (loopback_proxy, workload_proxy) = (socks_addr(&rw_a, 0), socks_addr(&rw_a, 1));
    assert_eq!(workload_proxy.ip().to_string(), CLIENT_IP);

    let l = b.enter(|| TcpListener::bind(format!("{SERVER_IP}:8080")).unwrap());
    let size = 8 * MIB;
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let w = s.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 31));
        let got = recv_all(s);
        (sender.join().unwrap(), got)
    });
    let target: SocketAddr = format!("{SERVER_IP}:8080").parse().unwrap();
    let (c2s, client_got, loopback_rep, dead_rep) = in_netns(&a.name, move || {
        // Reached from the client workload's address: HBONE under its identity.
        let (c, rep, bound) = socks_connect(workload_proxy, &Dst::Addr(target));
        assert_eq!(rep, 0);
        assert_eq!(
            bound,
            "0.0.0.0:0".parse().unwrap(),
            "tunnelled: no local address"
        );
        let w = c.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 13));
        let got = recv_all(c);
        let c2s = sender.join().unwrap();
        // From 127.0.0.1 there is no workload to speak for: fail closed.
        let (_, loopback_rep, _) = socks_connect(loopback_proxy, &Dst::Addr(target));
        // Nothing listens on node B's 8099: the peer answers 503.
        let dead: SocketAddr = format!("{SERVER_IP}:8099").parse().unwrap();
        let (_, dead_rep, _) = socks_connect(workload_proxy, &Dst::Addr(dead));
        (c2s, got, loopback_rep, dead_rep)
    });
    let (s2c, server_got) = server.join().unwrap();
    assert_eq!(server_got.0, size);
    assert_eq!(client_got.0, size);
    assert_eq!(server_got.1 .0, c2s.0, "client→server bytes intact");
    assert_eq!(client_got.1 .0, s2c.0, "server→client bytes intact");
    assert_eq!(loopback_rep, 2, "fail closed: not allowed");
    assert_eq!(dead_rep, 4, "peer could not reach the target");

    let logs = rw_a.wait_access_logs(3);
    let ok = logs
        .iter()
        .find(|l| l["outcome"] == "closed")
        .expect("the tunnel's log");
    assert_eq!(ok["path"], "socks5");
    assert_eq!(ok["route"], "hbone", "{ok}");
    assert_eq!(ok["src.identity"], CLIENT_ID, "{ok}");
    assert_eq!(ok["dst.identity"], SERVER_ID, "{ok}");
    assert_eq!(ok["bytes_sent"], size as u64);
    assert!(logs.iter().any(|l| l["error"]
        .as_str()
        .is_some_and(|e| e.contains("fail closed"))));
    let b_logs = rw_b.wait_access_logs(1);
    assert!(
        b_logs
            .iter()
            .any(|l| l["route"] == "hbone" && l["src.identity"] == CLIENT_ID),
        "{b_logs:#?}"
    );
}

/// Dedicated mode (ztunnel's PROXY_MODE=dedicated + PROXY_WORKLOAD_INFO):
/// a SOCKS5 client on loopback is no workload, yet with `--proxy-workload`
/// its connection to an HBONE workload goes out under that workload's
/// identity. Ringway serves the HBONE destination itself (its own 15008),
/// so the inbound access log shows the identity the tunnel presented.
#[test]
fn dedicated_mode_speaks_for_the_configured_workload() {
    let config = r#"
workloads:
- uid: cluster1//v1/Pod/shop/cart
  name: cart
  namespace: shop
  serviceAccount: cart-sa
  workloadIps: ["10.9.9.9"]
  protocol: HBONE
- uid: cluster1//v1/Pod/shop/db
  name: db
  namespace: shop
  serviceAccount: db
  workloadIps: ["127.0.0.5"]
  protocol: HBONE
"#;
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(dir.path(), "dedicated.yaml", config);
    let cfg = cfg.to_str().unwrap();
    for (tag, dedicated) in [("ded", true), ("nod", false)] {
        let ns = NetNs::new(tag);
        // --no-fast-path: the HBONE hop to ringway's own 15008, so that the
        // identity is the one mTLS presented, not one passed in-process.
        let mut args = vec!["--socks5", "--config", cfg, "--no-fast-path"];
        if dedicated {
            args.extend(["--proxy-workload", "shop/cart/cart-sa"]);
        }
        let rw = ns.ringway(&args);
        let proxy = socks_addr(&rw, 0);
        let reply = ns.enter(move || {
            echo_server(TcpListener::bind("127.0.0.5:8080").unwrap());
            let dst = Dst::Addr("127.0.0.5:8080".parse().unwrap());
            let (s, rep, _) = socks_connect(proxy, &dst);
            (rep, (rep == 0).then(|| echo_roundtrip(s, b"as cart")))
        });
        if dedicated {
            assert_eq!(reply, (0, Some(b"as cart".to_vec())));
            let logs = rw.wait_access_logs(2);
            let inbound = logs.iter().find(|l| l["path"] == "inbound").unwrap();
            assert_eq!(
                inbound["src.identity"], "spiffe://cluster.local/ns/shop/sa/cart-sa",
                "{logs:#?}"
            );
            let outbound = logs.iter().find(|l| l["path"] == "socks5").unwrap();
            assert_eq!(outbound["route"], "hbone", "{logs:#?}");
        } else {
            // Without it the loopback client is no workload: refused.
            assert_ne!(reply.0, 0);
            let logs = rw.wait_access_logs(1);
            let error = logs[0]["error"].as_str().unwrap_or_default();
            assert!(error.contains("unknown source 127.0.0.1"), "{logs:#?}");
        }
    }
}
