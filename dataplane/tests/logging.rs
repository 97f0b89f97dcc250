//! Logs off the data path: a stdout nobody reads must not slow proxying.
//! Each core only queues its lines; a writer thread does the blocking
//! write, and when the queue is full lines are dropped and counted.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{NetNs, Ringway};

/// Connections in the flood: far more access-log lines than a pipe (64 KiB,
/// ~150 lines) and the queue (`--log-queue-lines 200`) hold together.
const CONNECTIONS: usize = 2000;

#[test]
fn a_stalled_stdout_does_not_slow_proxying_and_the_drops_are_reported() {
    let ns = NetNs::new("logst");
    ns.capture_outbound("9300");
    let (reader, writer) = std::io::pipe().unwrap();
    let _rw = Ringway::start_with_stdout(
        Some(&ns.name),
        &["--cores", "1", "--log-queue-lines", "200"],
        Stdio::from(writer),
    );
    ns.enter(|| common::serve_echo(TcpListener::bind("127.0.0.1:9300").unwrap()));
    // Nobody reads ringway's stdout while the flood runs.
    let (worst, took) = ns.enter(|| {
        let started = Instant::now();
        let mut worst = Duration::ZERO;
        for i in 0..CONNECTIONS {
            let t = Instant::now();
            let mut s = TcpStream::connect("127.0.0.1:9300").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"ping").unwrap();
            let mut got = [0u8; 4];
            s.read_exact(&mut got)
                .unwrap_or_else(|e| panic!("connection {i}: no echo: {e}"));
            assert_eq!(&got, b"ping");
            worst = worst.max(t.elapsed());
        }
        (worst, started.elapsed())
    });
    eprintln!("{CONNECTIONS} connections in {took:?}, the slowest {worst:?}");
    assert!(
        worst < Duration::from_secs(2),
        "a connection took {worst:?} with stdout stalled"
    );
    // Now read: the writer catches up and says how many lines it dropped.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { return };
            if line.contains("log lines dropped") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("no report of dropped log lines");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let dropped = v["dropped_total"].as_u64().unwrap();
    assert!(
        dropped > 1000 && dropped < CONNECTIONS as u64 + 100,
        "dropped {dropped}: {line}"
    );
}
