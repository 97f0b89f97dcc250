//! A slow reader must not grow ringway's memory. In completion I/O mode the
//! kernel moves bytes into ringway's buffers whenever they arrive (a
//! multishot receive does not stop at the TCP window), so each socket holds
//! at most `--socket-cap` received-and-not-sent bytes and at most as much
//! queued to send: past that it stops receiving and TCP's window closes on
//! the sender. Here many senders write as fast as they can to sinks that
//! read 1 KiB a second, through a real ringway, and ringway's resident
//! memory must stay within those caps.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::nodes::{connect_from_client, Nodes, SERVER_IP};
use common::NetNs;

/// Connections pushed at once.
const CONNECTIONS: usize = 16;
/// How long the senders push.
const PUSH: Duration = Duration::from_secs(4);
const CAP: usize = 64 << 10;

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib << 10
}

/// Accepts `CONNECTIONS` connections on `l` and reads 1 KiB a second from
/// each until `stop`.
fn slow_sinks(l: TcpListener, stop: Arc<AtomicBool>) -> Vec<thread::JoinHandle<u64>> {
    (0..CONNECTIONS)
        .map(|_| {
            let (mut s, _) = l.accept().unwrap();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let mut got = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    s.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    if let Ok(n) = s.read(&mut buf) {
                        got += n as u64;
                    }
                    thread::sleep(Duration::from_secs(1));
                }
                got
            })
        })
        .collect()
}

/// Writes 512-byte messages as fast as the connection takes them, for
/// [`PUSH`]; returns the bytes the kernel took.
fn push(mut c: TcpStream, pushed: Arc<AtomicU64>) {
    c.set_nodelay(true).unwrap();
    c.set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let msg = [0x5au8; 512];
    let end = Instant::now() + PUSH;
    while Instant::now() < end {
        if let Ok(n) = c.write(&msg) {
            pushed.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    // Held open until the sinks stop: closing would let ringway free it all.
    thread::sleep(Duration::from_millis(500));
}

/// Warms ringway's per-core pools (the receive buffer ring, pipes) with
/// bulk traffic over `connect`, so the measurement sees only what the
/// stalled connections hold.
fn warm(connect: impl Fn() -> TcpStream, l: &TcpListener) {
    let mut c = connect();
    let (mut s, _) = l.accept().unwrap();
    let sink = thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let chunk = vec![1u8; 64 << 10];
    for _ in 0..512 {
        c.write_all(&chunk).unwrap();
    }
    drop(c);
    assert_eq!(sink.join().unwrap(), 512 * (64 << 10));
}

/// Pushes through ringway to slow sinks and returns (memory growth of
/// each of `pids`, bytes the senders got rid of).
fn stalled(
    pids: &[u32],
    connect: impl Fn() -> TcpStream + Send + Sync + 'static,
    l: TcpListener,
) -> (Vec<u64>, u64) {
    let connect = Arc::new(connect);
    warm(|| connect(), &l);
    thread::sleep(Duration::from_millis(300));
    let before: Vec<u64> = pids.iter().map(|&p| rss(p)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let c = connect();
            let pushed = pushed.clone();
            thread::spawn(move || push(c, pushed))
        })
        .collect();
    let sinks = slow_sinks(l, stop.clone());
    thread::sleep(PUSH);
    let grown = pids
        .iter()
        .zip(&before)
        .map(|(&p, &b)| rss(p).saturating_sub(b))
        .collect();
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().unwrap();
    }
    for s in sinks {
        s.join().unwrap();
    }
    (grown, pushed.load(Ordering::Relaxed))
}

/// What the caps allow all the stalled connections to hold, plus room for
/// the allocator's own rounding.
fn bound() -> u64 {
    (CONNECTIONS * 2 * 2 * CAP) as u64 + (4 << 20)
}

#[test]
fn a_slow_reader_does_not_grow_passthrough_memory() {
    let ns = NetNs::new("bppt");
    ns.capture_outbound("9000-9999");
    let cap = format!("{}K", CAP >> 10);
    let rw = ns.ringway(&[
        "--cores",
        "1",
        "--socket-cap",
        &cap,
        "--recv-buffers",
        "64",
        "--recv-buffer-size",
        "16K",
    ]);
    let pid = rw.child.as_ref().unwrap().id();
    let (grown, pushed) = ns.enter(move || {
        let l = TcpListener::bind("127.0.0.1:9300").unwrap();
        stalled(
            &[pid],
            || TcpStream::connect("127.0.0.1:9300").expect("connect through ringway"),
            l,
        )
    });
    let grown = grown[0];
    eprintln!("passthrough: {CONNECTIONS} stalled connections took {pushed} bytes; ringway grew by {grown} bytes");
    assert!(
        pushed < (CONNECTIONS as u64) * (64 << 20),
        "the senders were never held back: {pushed} bytes"
    );
    assert!(
        grown <= bound(),
        "ringway grew by {grown} bytes, more than the caps allow ({})",
        bound()
    );
}

#[test]
fn a_slow_reader_does_not_grow_hbone_memory() {
    // Small HTTP/2 windows, so what h2 may buffer per stream stays small
    // next to the caps: this is about ringway's own buffers.
    let cap = format!("{}K", CAP >> 10);
    let nodes = Nodes::new(
        "bphb",
        true,
        &[
            "--cores",
            "1",
            "--socket-cap",
            &cap,
            "--recv-buffers",
            "64",
            "--recv-buffer-size",
            "16K",
            "--h2-stream-window",
            "64K",
            "--h2-connection-window",
            "1M",
        ],
    );
    let pid_a = nodes.a().child.as_ref().unwrap().id();
    let pid_b = nodes.b().child.as_ref().unwrap().id();
    let l = nodes
        .b
        .enter(|| TcpListener::bind(format!("{SERVER_IP}:8090")).unwrap());
    let a = nodes.a.name.clone();
    let (grown, pushed) = stalled(
        &[pid_a, pid_b],
        move || {
            let a = a.clone();
            common::in_netns(&a, || {
                connect_from_client(&format!("{SERVER_IP}:8090")).expect("connect through ringway")
            })
        },
        l,
    );
    let (grown_a, grown_b) = (grown[0], grown[1]);
    eprintln!(
        "hbone: {CONNECTIONS} stalled connections took {pushed} bytes; ringway A grew by {grown_a}, B by {grown_b}"
    );
    // Per stream, h2's window rides on top of the caps.
    let bound = bound() + (CONNECTIONS as u64) * (64 << 10) + (1 << 20);
    assert!(
        pushed < (CONNECTIONS as u64) * (64 << 20),
        "the senders were never held back: {pushed} bytes"
    );
    for (node, grown) in [("A", grown_a), ("B", grown_b)] {
        assert!(
            grown <= bound,
            "ringway {node} grew by {grown} bytes, more than the caps allow ({bound})"
        );
    }
}
