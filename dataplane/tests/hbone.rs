//! HBONE end to end: two simulated nodes (network namespaces joined by a
//! veth pair), each with its own ringway, one shared trust root. Node A
//! hosts the client workload (10.250.0.1, captured egress); node B hosts
//! the HBONE server workload (10.250.0.2) behind ringway's 15008.
//! Independent peers: Python's h2 + ssl (tests/py/) on either side.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::nodes::{
    client_args, connect_from_client, py_client, py_server, py_server_with, Nodes, CLIENT_ID,
    CLIENT_IP, SERVER_ID, SERVER_IP,
};
use common::{in_netns, recv_all, send_pattern, PATIENCE};

#[test]
fn ringway_to_ringway_256mib_each_way() {
    let nodes = Nodes::new("big", true, &[]);
    let size = 256 << 20;
    let l = nodes
        .b
        .enter(|| TcpListener::bind(format!("{SERVER_IP}:8080")).unwrap());
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let w = s.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 7));
        let got = recv_all(s);
        (sender.join().unwrap(), got)
    });
    let (c2s, client_got) = in_netns(&nodes.a.name, move || {
        let c = connect_from_client(&format!("{SERVER_IP}:8080")).unwrap();
        let w = c.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 8));
        let got = recv_all(c);
        (sender.join().unwrap(), got)
    });
    let (s2c, server_got) = server.join().unwrap();
    assert_eq!(server_got.0, size);
    assert_eq!(client_got.0, size);
    assert_eq!(server_got.1 .0, c2s.0, "client→server bytes intact");
    assert_eq!(client_got.1 .0, s2c.0, "server→client bytes intact");

    let a = &nodes.a().wait_access_logs(1)[0];
    assert_eq!(a["route"], "hbone", "{a}");
    assert_eq!(a["src.identity"], CLIENT_ID);
    assert_eq!(a["dst.identity"], SERVER_ID);
    assert_eq!(a["bytes_sent"], size as u64);
    assert_eq!(a["bytes_recv"], size as u64);
    // ztunnel's names and meanings for an outbound tunnel.
    assert_eq!(a["direction"], "outbound", "{a}");
    assert_eq!(a["dst.addr"], format!("{SERVER_IP}:15008"), "{a}");
    assert_eq!(a["dst.hbone_addr"], format!("{SERVER_IP}:8080"), "{a}");
    assert_eq!(a["src.workload"], "client", "{a}");
    assert_eq!(a["src.namespace"], "client-ns", "{a}");
    assert_eq!(a["dst.workload"], "server", "{a}");
    assert_eq!(a["dst.namespace"], "server-ns", "{a}");
    assert_eq!(a["message"], "connection complete", "{a}");
    assert_eq!(a["level"], "info", "{a}");
    let b_logs = nodes.b().wait_access_logs(1);
    let b = b_logs
        .iter()
        .find(|l| l["route"] == "hbone")
        .expect("stream log on node B");
    assert_eq!(
        b["src.identity"], CLIENT_ID,
        "server saw the client's mTLS identity"
    );
    assert_eq!(b["dst.hbone_addr"], format!("{SERVER_IP}:8080"));
    assert_eq!(b["dst.addr"], format!("{SERVER_IP}:15008"));
    assert_eq!(b["direction"], "inbound", "{b}");
    assert_eq!(b["src.workload"], "client", "derived from the peer: {b}");
    assert_eq!(b["dst.identity"], SERVER_ID, "{b}");
    assert_eq!(
        b["trace"], a["trace"],
        "traceparent travels with the tunnel"
    );
    assert!(
        b["src.addr"].as_str().unwrap().starts_with(CLIENT_IP),
        "forwarded: for= carries the client: {b}"
    );
}

#[test]
fn concurrent_tunnels_share_pooled_connections() {
    // Two cores, whatever the machine: pools are per core, and the limits
    // below count connections per core.
    let nodes = Nodes::new("pool", true, &["--cores", "2"]);
    const N: usize = 500;
    nodes.b.enter(|| {
        let l = TcpListener::bind(format!("{SERVER_IP}:8081")).unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    // Sequential first: one key, so one handshake per core at most.
    in_netns(&nodes.a.name, || {
        for i in 0..20 {
            let mut c = connect_from_client(&format!("{SERVER_IP}:8081")).unwrap();
            c.write_all(format!("seq-{i}").as_bytes()).unwrap();
            let mut b = vec![0u8; format!("seq-{i}").len()];
            c.read_exact(&mut b).unwrap();
        }
    });
    let logs = nodes.a().wait_access_logs(20);
    let mut conns: Vec<(u64, u64)> = logs
        .iter()
        .map(|l| {
            (
                l["core"].as_u64().unwrap(),
                l["hbone_conn"].as_u64().unwrap(),
            )
        })
        .collect();
    conns.sort();
    conns.dedup();
    assert!(
        conns.len() <= 2,
        "20 sequential tunnels of one key reuse pooled connections: {conns:?}"
    );

    // Then 500 at once, all held open together.
    in_netns(&nodes.a.name, || {
        let mut held = Vec::new();
        for i in 0..N {
            let mut c = connect_from_client(&format!("{SERVER_IP}:8081")).unwrap();
            c.write_all(b"x").unwrap();
            held.push((i, c));
        }
        for (i, c) in held.iter_mut() {
            let mut b = [0u8; 1];
            c.read_exact(&mut b)
                .unwrap_or_else(|e| panic!("tunnel {i}: {e}"));
        }
    });
    let logs = nodes.a().wait_access_logs(20 + N);
    assert!(
        logs.iter().all(|l| l["outcome"] == "closed"),
        "all tunnels closed cleanly"
    );
    let mut conns: Vec<(u64, u64)> = logs[20..]
        .iter()
        .map(|l| {
            (
                l["core"].as_u64().unwrap(),
                l["hbone_conn"].as_u64().unwrap(),
            )
        })
        .collect();
    let total = conns.len();
    conns.sort();
    let mut per_conn = std::collections::BTreeMap::new();
    for c in &conns {
        *per_conn.entry(*c).or_insert(0usize) += 1;
    }
    assert_eq!(total, N);
    // 500 concurrent streams, ≤ 100 per connection: at least 5 connections.
    assert!(
        per_conn.len() >= 5 && per_conn.len() <= 16,
        "connections used: {per_conn:?}"
    );
}

#[test]
fn python_h2_client_against_ringway_server() {
    let nodes = Nodes::new("pyc", true, &[]);
    nodes.b.enter(|| {
        let l = TcpListener::bind(format!("{SERVER_IP}:8082")).unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            let _ = s.shutdown(Shutdown::Write);
                            return;
                        }
                        if s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    let certs = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "pyclient", "1h");
    let root = nodes.ca_dir().join("root-cert.pem");
    let mut args = client_args(&certs, &root, &format!("{SERVER_IP}:8082"));
    args.extend([
        "--send-bytes".into(),
        (4 << 20).to_string(),
        "--streams".into(),
        "8".into(),
    ]);
    args.extend(["--expect-identity".into(), SERVER_ID.into()]);
    args.extend([
        "--header".into(),
        format!("forwarded=for=\"{CLIENT_IP}:5555\""),
    ]);
    let (code, out) = py_client(&nodes.a, &args);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["alpn"], "h2");
    assert_eq!(out["peer_identity"], SERVER_ID);
    for i in 0..8 {
        assert_eq!(out["status"][i], 200, "{out}");
        assert_eq!(out["received"][i], 4 << 20, "{out}");
        assert_eq!(
            out["sha256_received"][i], out["sha256_sent"][i],
            "echo intact"
        );
    }
    let logs = nodes.b().wait_access_logs(8);
    assert!(logs
        .iter()
        .any(|l| l["route"] == "hbone" && l["src.identity"] == CLIENT_ID));
}

#[test]
fn ringway_client_against_python_h2_server() {
    let nodes = Nodes::new("pys", false, &[]);
    let certs = nodes.issue(&nodes.ca_dir(), SERVER_ID, "pyserver", "1h");
    let log = nodes.dir.path().join("pyserver.jsonl");
    let mut server = py_server(&nodes, &certs, &log);
    let result = in_netns(&nodes.a.name, || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:9443"))?;
        c.write_all(b"hello over python h2")?;
        c.shutdown(Shutdown::Write)?;
        let mut got = String::new();
        c.read_to_string(&mut got)?;
        Ok::<_, std::io::Error>(got)
    });
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(result.unwrap(), "hello over python h2");
    let entries = common::read_json_lines(&log);
    let e = entries
        .first()
        .unwrap_or_else(|| panic!("python server saw no stream"));
    assert_eq!(e["authority"], format!("{SERVER_IP}:9443"));
    assert_eq!(
        e["peer_identity"], CLIENT_ID,
        "ringway presented the client workload's identity"
    );
    let h = &e["headers"];
    assert!(
        h["forwarded"]
            .as_str()
            .unwrap()
            .starts_with(&format!("for=\"{CLIENT_IP}:")),
        "{h}"
    );
    let tp = h["traceparent"].as_str().unwrap();
    assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
    let bag = h["baggage"].as_str().unwrap();
    assert!(
        bag.contains("k8s.namespace.name=client-ns") && bag.contains("k8s.deployment.name=client"),
        "{bag}"
    );
    assert!(
        bag.contains("service.name=client") && bag.contains("service.version=v1"),
        "{bag}"
    );
}

/// A pooled connection that looks alive but refuses the next stream
/// (REFUSED_STREAM: the peer never acted on it) costs the client nothing:
/// ringway marks the connection broken and retries once on a new one.
/// Without the retry the second request would fail.
#[test]
fn refused_stream_on_a_pooled_connection_is_retried_on_a_new_one() {
    // One core: pools are per core, and both requests must meet the same
    // pooled connection.
    let nodes = Nodes::new("rty", false, &["--cores", "1"]);
    let certs = nodes.issue(&nodes.ca_dir(), SERVER_ID, "pyserver", "1h");
    let log = nodes.dir.path().join("pyserver.jsonl");
    let mut server = py_server_with(&nodes, &certs, &log, &["--refuse-after", "1"]);
    let echo = |msg: &'static str| {
        in_netns(&nodes.a.name, move || {
            let mut c = connect_from_client(&format!("{SERVER_IP}:9443"))?;
            c.write_all(msg.as_bytes())?;
            c.shutdown(Shutdown::Write)?;
            let mut got = String::new();
            c.read_to_string(&mut got)?;
            Ok::<_, std::io::Error>(got)
        })
    };
    let first = echo("first");
    let second = echo("second");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(first.unwrap(), "first");
    assert_eq!(
        second.unwrap(),
        "second",
        "the refused stream was not retried on a new connection"
    );
    let streams: Vec<_> = common::read_json_lines(&log)
        .into_iter()
        .filter(|e| e["kind"] == "stream")
        .collect();
    let conns: std::collections::BTreeSet<String> =
        streams.iter().map(|e| e["conn"].to_string()).collect();
    assert_eq!(
        conns.len(),
        2,
        "expected the refused stream on the pooled connection, then a new connection: {streams:#?}"
    );
    assert_eq!(streams.len(), 3, "{streams:#?}");
}

#[test]
fn ringway_refuses_server_with_wrong_identity() {
    let nodes = Nodes::new("wid", false, &[]);
    // The server presents a valid cert, but for another identity.
    let certs = nodes.issue(
        &nodes.ca_dir(),
        "spiffe://cluster.local/ns/evil/sa/impostor",
        "impostor",
        "1h",
    );
    let log = nodes.dir.path().join("impostor.jsonl");
    let mut server = py_server(&nodes, &certs, &log);
    let r = in_netns(&nodes.a.name, || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:9443")).unwrap();
        let _ = c.write_all(b"secret");
        let mut buf = [0u8; 16];
        c.read(&mut buf)
    });
    let _ = server.kill();
    let _ = server.wait();
    assert!(common::peer_closed(&r), "no data may flow: {r:?}");
    let seen = common::read_json_lines(&log);
    assert!(
        seen.iter().all(|e| e.get("authority").is_none()),
        "no CONNECT may reach an impostor: {seen:?}"
    );
    let l = &nodes.a().wait_access_logs(1)[0];
    let err = l["error"].as_str().unwrap();
    assert!(
        err.contains("expected spiffe://cluster.local/ns/server-ns/sa/server"),
        "{err}"
    );
}

fn unix_secs(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Waits until the process `pid` (ringway B) holds no TCP connection in
/// its network namespace: none established, being opened, or closed by
/// the peer but not yet by ringway (CLOSE_WAIT). Only listeners and
/// sockets ringway has already closed remain.
fn wait_connections_closed(pid: i32) {
    common::wait_for("ringway B to close its connections", PATIENCE, || {
        let mut held = Vec::new();
        for family in ["tcp", "tcp6"] {
            let table =
                std::fs::read_to_string(format!("/proc/{pid}/net/{family}")).unwrap_or_default();
            // ESTABLISHED, SYN_SENT, SYN_RECV, CLOSE_WAIT.
            held.extend(table.lines().skip(1).map(str::to_owned).filter(|l| {
                let state = l.split_whitespace().nth(3).unwrap_or("");
                matches!(state, "01" | "02" | "03" | "08")
            }));
        }
        if held.is_empty() {
            Ok(())
        } else {
            Err(held.join("\n"))
        }
    })
}

#[test]
fn ringway_server_rejects_bad_peers_and_requests() {
    let nodes = Nodes::new("neg", true, &["--handshake-timeout", "1s"]);
    nodes.b.enter(|| {
        let l = TcpListener::bind(format!("{SERVER_IP}:8083")).unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                drop(s);
            }
        });
    });
    let root = nodes.ca_dir().join("root-cert.pem");
    let good = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "good", "1h");
    let pid_b = nodes.b().pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid_b}/fd"))
            .unwrap()
            .count()
    };
    // Warm up (pool of pipes etc.), then baseline.
    let (code, out) = py_client(
        &nodes.a,
        &client_args(&good, &root, &format!("{SERVER_IP}:8083")),
    );
    assert_eq!(code, 0, "{out}");
    wait_connections_closed(pid_b);
    let baseline = fds();

    // Request-level rejections: the status the spec asks for.
    let status_of = |authority: &str, extra: &[&str]| {
        let mut a = client_args(&good, &root, authority);
        a.extend(extra.iter().map(|s| s.to_string()));
        let (code, out) = py_client(&nodes.a, &a);
        (code, out["status"][0].clone())
    };
    assert_eq!(
        status_of(&format!("{SERVER_IP}:8083"), &["--method", "GET"]).1,
        400,
        "non-CONNECT"
    );
    assert_eq!(
        status_of("not-an-address", &[]).1,
        400,
        "malformed authority"
    );
    assert_eq!(
        status_of("10.250.0.99:8083", &[]).1,
        400,
        "authority is not the dialled workload"
    );
    assert_eq!(
        status_of(&format!("{SERVER_IP}:8099"), &[]).1,
        503,
        "nothing listens there"
    );

    // Handshake-level rejections.
    let td = nodes.issue(
        &nodes.ca_dir(),
        "spiffe://other.domain/ns/x/sa/y",
        "foreign-td",
        "1h",
    );
    let (code, out) = py_client(
        &nodes.a,
        &client_args(&td, &root, &format!("{SERVER_IP}:8083")),
    );
    assert_ne!(code, 0, "foreign trust domain must be refused: {out}");
    assert_ne!(out["status"][0], 200);

    let rogue_ca = nodes.dir.path().join("rogue-ca");
    let rogue = nodes.issue(&rogue_ca, CLIENT_ID, "rogue", "1h");
    let (code, out) = py_client(
        &nodes.a,
        &client_args(&rogue, &root, &format!("{SERVER_IP}:8083")),
    );
    assert_ne!(code, 0, "untrusted root must be refused: {out}");

    let expired = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "expired", "1s");
    // Expired for a verifier once the clock's second is past notAfter's
    // (validity has one-second resolution, and the last second is valid).
    let not_after = {
        let read = |f: &str| std::fs::read_to_string(expired.join(f)).unwrap();
        let cert = ringway_controlplane::WorkloadCert::from_pem(
            &read("key.pem"),
            &read("cert-chain.pem"),
            &read("root-cert.pem"),
        )
        .unwrap();
        unix_secs(cert.not_after())
    };
    common::wait_for(
        "the 1 s certificate to expire",
        PATIENCE,
        || match unix_secs(std::time::SystemTime::now()) {
            now if now > not_after => Ok(()),
            now => Err(format!("now {now}, notAfter {not_after}")),
        },
    );
    let (code, out) = py_client(
        &nodes.a,
        &client_args(&expired, &root, &format!("{SERVER_IP}:8083")),
    );
    assert_ne!(code, 0, "expired cert must be refused: {out}");

    let mut no_cert = client_args(&good, &root, &format!("{SERVER_IP}:8083"));
    no_cert.drain(4..8); // drop --cert/--key
    let (code, out) = py_client(&nodes.a, &no_cert);
    assert_ne!(
        code, 0,
        "a client without a certificate must be refused: {out}"
    );

    // A peer that stalls mid-handshake, and one that sends garbage.
    let stalled = in_netns(&nodes.a.name, || {
        let mut s = TcpStream::connect(format!("{SERVER_IP}:15008")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let started = Instant::now();
        let r = s.read(&mut [0u8; 1]);
        (r.map_err(|e| e.kind()), started.elapsed())
    });
    assert!(matches!(stalled.0, Ok(0) | Err(_)), "{stalled:?}");
    assert!(
        stalled.1 < Duration::from_secs(5),
        "a stalled handshake is dropped after --handshake-timeout: {stalled:?}"
    );
    let garbage = in_netns(&nodes.a.name, || {
        let mut s = TcpStream::connect(format!("{SERVER_IP}:15008")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: nope\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        buf
    });
    assert!(
        !garbage.starts_with(b"HTTP/"),
        "garbage never gets a plaintext answer"
    );

    // Still healthy, nothing leaked.
    let (code, out) = py_client(
        &nodes.a,
        &client_args(&good, &root, &format!("{SERVER_IP}:8083")),
    );
    assert_eq!(code, 0, "{out}");
    wait_connections_closed(pid_b);
    common::wait_for("no leaked descriptors", PATIENCE, || match fds() {
        n if n <= baseline + 2 => Ok(()),
        n => Err(format!("{n} fds, baseline {baseline}")),
    });
    for needle in [
        "not CONNECT",
        "malformed :authority",
        "not the connection's destination",
        "503",
        "TLS handshake",
    ] {
        nodes.b().wait_log(needle, |l| {
            l["scope"] == "access" && l["error"].as_str().is_some_and(|e| e.contains(needle))
        });
    }
}

#[test]
fn pooled_connection_to_a_restarted_peer_is_replaced() {
    let mut nodes = Nodes::new("rst", true, &[]);
    nodes.b.enter(|| {
        let l = TcpListener::bind(format!("{SERVER_IP}:8084")).unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let _ = s.write_all(b"hi");
            }
        });
    });
    let ask = |ns: &str| {
        in_netns(ns, || {
            let mut c = connect_from_client(&format!("{SERVER_IP}:8084"))?;
            let mut s = String::new();
            c.read_to_string(&mut s)?;
            Ok::<_, std::io::Error>(s)
        })
    };
    assert_eq!(ask(&nodes.a.name).unwrap(), "hi");
    // Node B's ringway restarts: A's pooled connection to it is now dead.
    nodes.rw_b = None;
    nodes.start_b();
    for i in 0..4 {
        assert_eq!(
            ask(&nodes.a.name).unwrap_or_else(|e| panic!("request {i} after restart: {e}")),
            "hi"
        );
    }
}
