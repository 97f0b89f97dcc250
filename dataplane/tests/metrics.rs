//! Istio's TCP metrics on 15020, from both reporters, against the bytes a
//! test moved: the source side on node A, the destination side on node B,
//! one HBONE connection with different byte counts each way. The scrape
//! must pass Prometheus's own checker (promtool, installed by
//! scripts/test.sh), and byte counters must move while the connection is
//! still open.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::nodes::{base_config, connect_from_client, Nodes, CLIENT_ID, SERVER_ID, SERVER_IP};

const UP: usize = 300_000;
const DOWN: usize = 7_000;

/// The value of the one sample of `name` whose labels include all of
/// `want` (panics if none or several).
fn sample(scrape: &str, name: &str, want: &[(&str, &str)]) -> u64 {
    let found: Vec<u64> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let has = |k: &str, v: &str| labels.contains(&format!("{k}=\"{v}\""));
            want.iter()
                .all(|(k, v)| has(k, v))
                .then(|| value.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?} in\n{scrape}");
    found[0]
}

fn promtool(scrape: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}\n{scrape}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn both_reporters_count_the_bytes_moved_even_while_open_and_promtool_agrees() {
    let cfg = format!(
        "{}  workloadName: server\n  canonicalName: server\n  canonicalRevision: v2\n",
        base_config()
    );
    let nodes = Nodes::with_config("met", &cfg, true, &[]);
    // The application: reads UP bytes, answers DOWN bytes, closes.
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let listener = nodes
        .b
        .enter(|| TcpListener::bind(format!("{SERVER_IP}:8080")).unwrap());
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; UP];
        s.read_exact(&mut buf).unwrap();
        got_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        s.write_all(&vec![7u8; DOWN]).unwrap();
    });
    let client = nodes.a.enter(move || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:8080")).unwrap();
        c.write_all(&vec![1u8; UP]).unwrap();
        c
    });
    got_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    // Open, and already counted: opened, and the bytes so far.
    let source = [("reporter", "source"), ("destination_workload", "server")];
    let (status, open_scrape) = nodes.a().http_get("stats", "/metrics");
    assert!(status.contains("200"), "{status}");
    assert_eq!(
        sample(&open_scrape, "istio_tcp_connections_opened_total", &source),
        1
    );
    assert_eq!(
        sample(&open_scrape, "istio_tcp_sent_bytes_total", &source),
        UP as u64
    );
    assert_eq!(
        sample(&open_scrape, "istio_tcp_connections_closed_total", &source),
        0,
        "still open"
    );

    go_tx.send(()).unwrap();
    let down = nodes.a.enter(move || {
        let mut c = client;
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        got.len()
    });
    assert_eq!(down, DOWN);
    nodes.a().wait_access_logs(1);
    nodes.b().wait_access_logs(1);

    // The source reporter (node A).
    let (_, a) = nodes.a().http_get("stats", "/stats/prometheus");
    let labels = [
        ("reporter", "source"),
        ("source_workload", "client"),
        ("source_workload_namespace", "client-ns"),
        ("source_principal", CLIENT_ID),
        ("source_canonical_revision", "v1"),
        ("destination_workload", "server"),
        ("destination_workload_namespace", "server-ns"),
        ("destination_principal", SERVER_ID),
        ("destination_canonical_revision", "v2"),
        ("destination_service", "unknown"),
        ("request_protocol", "tcp"),
        ("connection_security_policy", "mutual_tls"),
    ];
    assert_eq!(sample(&a, "istio_tcp_connections_opened_total", &labels), 1);
    let mut closed = labels.to_vec();
    closed.push(("response_flags", "-"));
    assert_eq!(sample(&a, "istio_tcp_connections_closed_total", &closed), 1);
    assert_eq!(sample(&a, "istio_tcp_sent_bytes_total", &labels), UP as u64);
    assert_eq!(
        sample(&a, "istio_tcp_received_bytes_total", &labels),
        DOWN as u64
    );
    promtool(&a);

    // The destination reporter (node B): the same connection, its side.
    let (_, b) = nodes.b().http_get("stats", "/metrics");
    let labels = [
        ("reporter", "destination"),
        ("source_workload", "client"),
        ("source_principal", CLIENT_ID),
        ("destination_workload", "server"),
        ("destination_principal", SERVER_ID),
        ("connection_security_policy", "mutual_tls"),
    ];
    assert_eq!(sample(&b, "istio_tcp_connections_opened_total", &labels), 1);
    assert_eq!(
        sample(&b, "istio_tcp_received_bytes_total", &labels),
        UP as u64
    );
    assert_eq!(
        sample(&b, "istio_tcp_sent_bytes_total", &labels),
        DOWN as u64
    );
    assert!(b.contains("istio_build{component=\"ringway\""), "{b}");
    assert!(b.contains("\nprocess_open_fds "), "{b}");
    assert!(
        b.contains("ringway_core_open_connections{core=\"0\"}"),
        "{b}"
    );
    promtool(&b);
}

#[test]
fn the_side_endpoints_refuse_what_they_are_not_for() {
    let nodes = Nodes::new("mbad", false, &[]);
    let rw = nodes.a();
    assert!(rw.http_get("stats", "/nope").0.contains("404"));
    let addr = rw.listeners["listeners"]["stats"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let answers = nodes.a.enter(move || {
        let ask = |bytes: Vec<u8>| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(&bytes);
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            text.lines().next().unwrap_or("").to_owned()
        };
        let started = Instant::now();
        let slow = {
            // Says nothing: closed after the 5 s limit, no answer.
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            (text, started.elapsed())
        };
        (
            ask(b"POST /metrics HTTP/1.1\r\n\r\n".to_vec()),
            ask(b"\x16\x03\x01 binary garbage\r\n\r\n".to_vec()),
            ask([b"GET /metrics HTTP/1.1\r\nx: ".to_vec(), vec![b'a'; 20_000]].concat()),
            slow,
        )
    });
    assert!(answers.0.contains("405"), "{answers:?}");
    assert!(answers.1.contains("400"), "{answers:?}");
    assert!(answers.2.contains("431"), "{answers:?}");
    assert!(
        answers.3 .0.is_empty() && answers.3 .1 >= Duration::from_secs(4),
        "{answers:?}"
    );
    // And it still serves.
    assert!(rw.http_get("stats", "/metrics").0.contains("200"));
}

#[test]
fn no_metrics_counts_nothing() {
    let nodes = Nodes::new("mnone", false, &["--no-metrics"]);
    // A connection (failing: nothing serves node B's 15008) that would be
    // counted as opened and failed.
    let _ = nodes.a.enter(|| {
        connect_from_client(&format!("{SERVER_IP}:8080")).map(|mut c| c.read(&mut [0u8; 1]))
    });
    nodes.a().wait_access_logs(1);
    let (_, scrape) = nodes.a().http_get("stats", "/metrics");
    assert!(
        !scrape.contains("istio_tcp_connections_opened_total{"),
        "{scrape}"
    );
    assert!(scrape.contains("ringway_core_open_connections"), "{scrape}");
}
