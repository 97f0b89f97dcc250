//! `--sockmap-redirect` through a real ringway, in a private namespace
//! with a real nftables capture: passthrough pairs handed to the kernel
//! once set up. Small messages cross without waking ringway; bulk is taken
//! back to the copy path without losing a byte; FIN and RST still cross;
//! byte counts in the access log are exact. Needs BPF (CAP_BPF and
//! CAP_NET_ADMIN, as root here): where the host cannot have it, set
//! `RINGWAY_SOCKMAP=absent` and the tests check the fallback instead
//! (never a silent pass).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use common::{recv_all, send_pattern, NetNs, Ringway};

/// The host is declared not to have BPF (`RINGWAY_SOCKMAP=absent`).
fn absent() -> bool {
    std::env::var("RINGWAY_SOCKMAP").is_ok_and(|v| v == "absent")
}

fn rig(tag: &str) -> (NetNs, Ringway) {
    let ns = NetNs::new(tag);
    ns.capture_outbound("9000-9999");
    let rw = ns.ringway(&["--cores", "1", "--sockmap-redirect"]);
    let setup = rw.wait_log("the core's sockmap setup", |l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.contains("sockmap redirect"))
    });
    let refused = setup["message"]
        .as_str()
        .is_some_and(|m| m.contains("refuses the redirect"));
    match (refused, absent()) {
        (true, false) => panic!(
            "ringway could not set up the sockmap redirect (set RINGWAY_SOCKMAP=absent where that is expected): {:?}",
            rw.logs()
        ),
        (false, true) => panic!("RINGWAY_SOCKMAP=absent, but ringway set the redirect up: unset it"),
        _ => {}
    }
    (ns, rw)
}

fn enters(rw: &Ringway) -> u64 {
    // The per-core counters are copied for the scraper once a second.
    thread::sleep(Duration::from_millis(1200));
    rw.per_core("ringway_core_ring_enters_total").iter().sum()
}

#[test]
fn small_messages_cross_without_waking_ringway() {
    let (ns, rw) = rig("rdpp");
    const ROUNDS: usize = 2000;
    let (before, after) = ns
        .enter(move || {
            let l = TcpListener::bind("127.0.0.1:9700").unwrap();
            let server = thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() {
                    s.write_all(&[b[0].wrapping_add(1)]).unwrap();
                }
            });
            let mut c = TcpStream::connect("127.0.0.1:9700").unwrap();
            c.set_nodelay(true).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // One exchange: the pair is set up and handed over.
            c.write_all(&[0]).unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
            (c, server)
        })
        .pipe(|(mut c, server)| {
            let before = enters(&rw);
            let mut b = [0u8; 1];
            for i in 0..ROUNDS {
                c.write_all(&[i as u8]).unwrap();
                c.read_exact(&mut b).unwrap();
                assert_eq!(b[0], (i as u8).wrapping_add(1));
            }
            let after = enters(&rw);
            drop(c);
            server.join().unwrap();
            (before, after)
        });
    let woken = after - before;
    if absent() {
        assert!(
            woken >= ROUNDS as u64,
            "the copy path enters per message: {woken}"
        );
    } else {
        // A few timer ticks (the once-a-second counters, the pair's
        // refresh), not one per message.
        assert!(
            woken < 100,
            "{ROUNDS} exchanges woke ringway's core {woken} times"
        );
    }
    let log = &rw.wait_access_logs(1)[0];
    assert_eq!(log["bytes_sent"], ROUNDS as u64 + 1, "{log}");
    assert_eq!(log["bytes_recv"], ROUNDS as u64 + 1, "{log}");
    assert_eq!(log["outcome"], "closed", "{log}");
}

/// `.pipe(f)`: runs the second half of a test outside the namespace
/// thread with what the first half made inside it.
trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}

#[test]
fn bulk_is_taken_back_without_losing_a_byte() {
    let (ns, rw) = rig("rdbk");
    let size = 64 << 20;
    let (c2s, s2c, server_got, client_got) = ns.enter(move || {
        let l = TcpListener::bind("127.0.0.1:9701").unwrap();
        let server = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let w = s.try_clone().unwrap();
            let sender = thread::spawn(move || send_pattern(w, size, 5));
            let got = recv_all(s);
            (sender.join().unwrap(), got)
        });
        let c = TcpStream::connect("127.0.0.1:9701").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let w = c.try_clone().unwrap();
        let sender = thread::spawn(move || send_pattern(w, size, 6));
        let client_got = recv_all(c);
        let c2s = sender.join().unwrap();
        let (s2c, server_got) = server.join().unwrap();
        (c2s, s2c, server_got, client_got)
    });
    assert_eq!(server_got.0, size);
    assert_eq!(client_got.0, size);
    assert_eq!(server_got.1 .0, c2s.0, "client→server bytes intact");
    assert_eq!(client_got.1 .0, s2c.0, "server→client bytes intact");
    let log = &rw.wait_access_logs(1)[0];
    assert_eq!(log["bytes_sent"], size as u64, "{log}");
    assert_eq!(log["bytes_recv"], size as u64, "{log}");
    assert_eq!(log["outcome"], "closed", "{log}");
}

#[test]
fn fin_and_reset_still_cross() {
    let (ns, rw) = rig("rdfr");
    ns.enter(|| {
        let l = TcpListener::bind("127.0.0.1:9702").unwrap();
        // Half-close: the client's FIN reaches the server, which still
        // answers; then the server closes.
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let (s2, _) = l.accept().unwrap();
            // A reset from this side must reach the client as a reset.
            socket2::SockRef::from(&s2)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            thread::sleep(Duration::from_millis(200));
            drop(s2);
        });
        let mut c = TcpStream::connect("127.0.0.1:9702").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"half-closed").unwrap();
        thread::sleep(Duration::from_millis(100));
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"half-closed");
        let mut c2 = TcpStream::connect("127.0.0.1:9702").unwrap();
        c2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = c2.read(&mut [0u8; 8]);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "the server's reset must reach the client: {r:?}"
        );
        server.join().unwrap();
    });
    let logs = rw.wait_access_logs(2);
    let closed = logs
        .iter()
        .find(|l| l["outcome"] == "closed")
        .expect("the half-closed one");
    assert_eq!(closed["bytes_sent"], 11, "{closed}");
    assert_eq!(closed["bytes_recv"], 11, "{closed}");
    assert!(
        logs.iter().any(|l| l["error"]
            .as_str()
            .is_some_and(|o| o.contains("reset by upstream"))),
        "{logs:?}"
    );
}

/// Where the kernel refuses BPF (here: ringway started without CAP_BPF
/// and CAP_SYS_ADMIN), each core says why and passthrough copies as
/// before; nothing fails.
#[test]
fn without_bpf_each_core_says_why_and_copies() {
    use std::os::unix::process::CommandExt;
    const CAP_SYS_ADMIN: libc::c_ulong = 21;
    const CAP_BPF: libc::c_ulong = 39;
    let rw = Ringway::start_with_command(
        &[
            "--cores",
            "1",
            "--sockmap-redirect",
            "--socks5-addr",
            "127.0.0.1:0",
        ],
        |cmd| {
            // SAFETY: prctl between fork and exec, no allocation: drops
            // the two capabilities from the bounding set, so the exec'd
            // ringway (root) does not get them.
            unsafe {
                cmd.pre_exec(|| {
                    for cap in [CAP_BPF, CAP_SYS_ADMIN] {
                        if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        },
    );
    let why = rw.wait_log("the refusal", |l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.contains("refuses the redirect"))
    });
    assert!(why["reason"].is_string(), "a reason is given: {why}");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&got).unwrap();
    });
    let proxy: std::net::SocketAddr = rw.listeners["listeners"]["socks5"][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut sel = [0u8; 2];
    s.read_exact(&mut sel).unwrap();
    let std::net::SocketAddr::V4(t) = target else {
        unreachable!()
    };
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&t.ip().octets());
    req.extend_from_slice(&t.port().to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0, "CONNECT succeeded");
    s.write_all(b"copied, not redirected").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"copied, not redirected");
    server.join().unwrap();
}
