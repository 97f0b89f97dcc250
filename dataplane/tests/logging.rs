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

/// Item 5 of issue 25: a peer that makes a core refuse thousands of
/// connections gets a handful of lines a second and one "suppressed N"
/// line per second; every refusal is still counted, and N is exact.
#[test]
fn a_flood_of_refusals_writes_a_bounded_number_of_lines_and_counts_them_all() {
    const REFUSALS: u64 = 2000;
    let ns = NetNs::new("logrl");
    // Captured, and nothing listens there: each connection's upstream dial
    // is refused, and so is the connection.
    ns.capture_outbound("9321");
    let rw = ns.ringway(&["--cores", "1"]);
    let took = ns.enter(|| {
        let started = Instant::now();
        // From 127.0.0.2: ringway's own dials (from 127.0.0.1) then never
        // reuse a client's address pair, whose NAT entry would send them
        // back to 15001.
        let from: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
        let to: std::net::SocketAddr = "127.0.0.1:9321".parse().unwrap();
        for i in 0..REFUSALS {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.bind(&from.into()).unwrap();
            sock.connect(&to.into()).unwrap();
            let mut s: TcpStream = sock.into();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let r = s.read(&mut [0u8; 1]);
            assert!(common::peer_closed(&r), "connection {i}: {r:?}");
        }
        started.elapsed()
    });
    let failures = |rw: &common::Ringway| -> u64 {
        rw.per_core("ringway_core_connection_failures_total")
            .iter()
            .sum()
    };
    common::wait_for(
        "every refusal counted",
        common::PATIENCE,
        || match failures(&rw) {
            REFUSALS => Ok(()),
            n => Err(format!("{n} counted")),
        },
    );
    // The last window's report comes when it ends (a second at most).
    let summaries = |rw: &common::Ringway| -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
        let logs = rw.logs();
        let written = logs
            .iter()
            .filter(|l| l["scope"] == "access" && l["level"] == "error")
            .cloned()
            .collect();
        let said = logs
            .into_iter()
            .filter(|l| l["kind"] == "failed outbound connections")
            .collect();
        (written, said)
    };
    let (written, said) = common::wait_for("the suppressed count", common::PATIENCE, || {
        let (written, said) = summaries(&rw);
        let reported: u64 = said.iter().map(|l| l["suppressed"].as_u64().unwrap()).sum();
        if written.len() as u64 + reported == REFUSALS {
            Ok((written, said))
        } else {
            Err(format!("{} written + {reported} reported", written.len()))
        }
    });
    let windows = took.as_secs() + 2;
    eprintln!(
        "{REFUSALS} refusals in {took:?}: {} lines written, {} \"suppressed\" lines",
        written.len(),
        said.len()
    );
    assert!(
        written.len() as u64 <= 100 * windows,
        "{} lines in about {windows} windows",
        written.len()
    );
    assert!(!said.is_empty() && said.len() as u64 <= windows);
    assert!(said.iter().all(|l| l["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("suppressed ") && m.contains("similar lines"))));
    // Every written line still says what failed.
    assert!(written
        .iter()
        .all(|l| l["error"].as_str().is_some_and(|e| e.contains("9321"))));
    let (status, scrape) = rw.http_get("stats", "/metrics");
    assert!(status.contains(" 200 "));
    let suppressed: u64 = scrape
        .lines()
        .find_map(|l| {
            l.strip_prefix("ringway_log_lines_suppressed_total ")?
                .parse()
                .ok()
        })
        .expect("no ringway_log_lines_suppressed_total");
    assert_eq!(suppressed + written.len() as u64, REFUSALS);
}
