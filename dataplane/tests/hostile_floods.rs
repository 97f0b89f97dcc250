//! Issue 25, item 7: HTTP/2 frame floods against ringway B's 15008, over
//! real mutual TLS, each beside a bystander (common::bystander) whose
//! CONNECT + echo must keep succeeding within twice its baseline.
//!
//! The attacker (tests/py/hostile_h2.py, mode `flood`) completes TLS and
//! the preface, ACKs the server's SETTINGS, then sends one kind of frame
//! as fast as the socket takes it, answering the server's keepalive PINGs
//! between batches, or (`--no-read`) reading nothing at all.
//!
//! Two outcomes are right, and each case says which it expects:
//! - cut off: a flood that breaks the protocol or a limit (a header block
//!   that never ends, a window past 2^31-1) gets GOAWAY at once, and a
//!   peer that keeps reconnecting gets the same each time;
//! - absorbed at bounded cost: PING, SETTINGS and WINDOW_UPDATE are legal
//!   in any number. h2 (0.4.20, proto/ping_pong.rs and settings.rs) keeps
//!   one pending PONG and one pending SETTINGS ACK, and reads no further
//!   frame until it has written that answer, so ringway's output never
//!   queues beyond the socket's cap: a peer that does not read stops
//!   being read, then is cut by the keepalive (its PING cannot go out);
//!   a peer that reads is answered frame for frame, at a cost per frame
//!   this test measures, like any peer that sends bytes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::bystander::{self, Sampler};
use common::nodes::Nodes;

/// The tests of this file measure latency: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// GOAWAY and RST_STREAM codes (RFC 9113 §7).
const FLOW_CONTROL_ERROR: u64 = 3;
const ENHANCE_YOUR_CALM: u64 = 11;

/// Keepalive: a PING every second, 2 s to answer it; 3 s for the
/// handshakes, which include the first PING's answer (hbone::liveness).
const TIMERS: [&str; 6] = [
    "--hbone-keepalive-interval",
    "1s",
    "--hbone-keepalive-timeout",
    "2s",
    "--handshake-timeout",
    "3s",
];

struct Rig {
    nodes: Nodes,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
    pid: i32,
    baseline: Duration,
}

fn rig(tag: &str) -> Rig {
    let extra: Vec<&str> = bystander::ONE_CORE.iter().chain(&TIMERS).copied().collect();
    let nodes = Nodes::new(tag, true, &extra);
    bystander::serve_echo(&nodes);
    let tls = bystander::client_tls(&nodes, "bystander");
    let pid = nodes.b().pid();
    // Warm up (the first handshakes fill caches), then the baseline.
    bystander::probe(&nodes, &tls, 5, None);
    let baseline = bystander::median_ok(&bystander::probe(&nodes, &tls, 15, None), "baseline");
    Rig {
        nodes,
        tls,
        pid,
        baseline,
    }
}

/// What one flood did to ringway and the bystander.
struct Outcome {
    /// The attacker's reports, one per connection it made.
    reports: Vec<serde_json::Value>,
    during: Duration,
    probes: usize,
    /// RSS (KiB) and fds before, and their peaks during.
    before: (u64, usize),
    peak: (u64, usize),
    /// Ringway's CPU time over the flood.
    cpu: Duration,
}

impl Outcome {
    fn frames(&self) -> u64 {
        self.reports
            .iter()
            .map(|r| r["frames_sent"].as_u64().unwrap())
            .sum()
    }
}

/// Floods with `args` (after `--mode flood`) for `secs`, reconnecting
/// when cut off, while the bystander probes.
fn flood(rig: &Rig, frame: &str, read: bool, secs: f64) -> Outcome {
    let before = bystander::usage(rig.pid);
    let cpu_before = bystander::cpu_time(rig.pid);
    let sampler = Sampler::start(rig.pid);
    let attacking = Arc::new(AtomicBool::new(true));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut args: Vec<String> = ["--mode", "flood", "--frame", frame, "--drain", "2"]
        .map(String::from)
        .into();
    if !read {
        args.push("--no-read".into());
    }
    let hostile = bystander::Hostile::new(&rig.nodes, &format!("flood-{frame}-{read}"));
    let attacker = {
        let attacking = attacking.clone();
        std::thread::spawn(move || {
            let mut reports = Vec::new();
            // Until the time is up, reconnecting whenever cut off.
            while Instant::now() + Duration::from_millis(200) < end {
                let left = end.saturating_duration_since(Instant::now()).as_secs_f64();
                let mut args = args.clone();
                args.extend(["--duration".into(), format!("{left:.3}")]);
                reports.push(bystander::report(hostile.spawn(&args)));
            }
            attacking.store(false, Ordering::Relaxed);
            reports
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let probes = bystander::probe(&rig.nodes, &rig.tls, 5, Some(attacking));
    let reports = attacker.join().unwrap();
    let peak = sampler.stop();
    let outcome = Outcome {
        reports,
        during: bystander::median_ok(&probes, frame),
        probes: probes.len(),
        before,
        peak,
        cpu: bystander::cpu_time(rig.pid) - cpu_before,
    };
    eprintln!(
        "{frame} (read: {read}): {} connections, {} frames, ringway CPU {:?} ({:.2} µs a frame); \
         bystander median {:?} over {} probes (baseline {:?}); RSS {} → peak {} KiB, fds {} → {}\n  \
         first report: {}",
        outcome.reports.len(),
        outcome.frames(),
        outcome.cpu,
        outcome.cpu.as_secs_f64() * 1e6 / outcome.frames().max(1) as f64,
        outcome.during,
        outcome.probes,
        rig.baseline,
        before.0,
        peak.0,
        before.1,
        peak.1,
        outcome.reports[0]
    );
    outcome
}

/// The bounds every flood must keep: the bystander within twice its
/// baseline; no fd beyond the attacker's connection, the bystander's and
/// its tunnel's (and a moment's overlap of a reconnect); RSS within
/// `rss_mib` of where it was.
fn assert_bounded(rig: &Rig, o: &Outcome, rss_mib: u64) {
    assert!(
        o.during <= bystander::twice(rig.baseline),
        "bystander median {:?} during the flood, {:?} before",
        o.during,
        rig.baseline
    );
    assert!(
        o.peak.1 <= o.before.1 + 6,
        "fds {} → {}",
        o.before.1,
        o.peak.1
    );
    assert!(
        o.peak.0 <= o.before.0 + rss_mib * 1024,
        "RSS {} → {} KiB",
        o.before.0,
        o.peak.0
    );
}

/// Ringway B's warnings and errors.
fn errors(rig: &Rig) -> String {
    let logs = rig.nodes.b().logs();
    let bad = logs
        .iter()
        .filter(|l| l["level"] != "info")
        .map(|l| l.to_string());
    bad.collect::<Vec<_>>().join("\n")
}

#[test]
fn floods_that_break_the_protocol_get_goaway_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rig = rig("hflcut");
    // (1) A header block that never ends, in empty CONTINUATIONs (never
    // near the 64 KiB header list limit) and in 16 KiB ones (past it):
    // h2 counts the frames of a block against what the limit needs
    // (at least 5), so both are cut within a few frames.
    for frame in ["continuation", "continuation-big"] {
        let o = flood(&rig, frame, true, 4.0);
        for r in &o.reports {
            assert_eq!(r["goaway_code"], ENHANCE_YOUR_CALM, "{frame}: {r}");
            let closed = r["closed_after"].as_f64().expect("not closed");
            assert!(closed < 1.0, "{frame}: open {closed} s: {r}");
            assert!(r["frames_sent"].as_u64().unwrap() < 100_000, "{r}");
        }
        assert!(
            o.reports.len() >= 3,
            "{frame}: {} connections",
            o.reports.len()
        );
        // A 64 KiB block at most per connection, one at a time.
        assert_bounded(&rig, &o, 16);
    }
    // (4) A window past 2^31-1: on the connection, GOAWAY
    // FLOW_CONTROL_ERROR; on a stream, that stream is reset with it
    // (RFC 9113 §6.9.1) and the connection lives on, its later updates to
    // the closed stream ignored.
    let o = flood(&rig, "window-overflow", true, 3.0);
    for r in &o.reports {
        assert_eq!(r["goaway_code"], FLOW_CONTROL_ERROR, "{r}");
        assert!(r["closed_after"].as_f64().expect("not closed") < 1.0, "{r}");
    }
    assert_bounded(&rig, &o, 16);
    let o = flood(&rig, "window-overflow-stream", true, 3.0);
    let r = &o.reports[0];
    assert_eq!(
        r["rst_codes"],
        serde_json::json!([FLOW_CONTROL_ERROR]),
        "{r}"
    );
    assert_bounded(&rig, &o, 16);
    let scrape = rig.nodes.b().http_get("stats", "/metrics").1;
    assert!(scrape.contains("ringway_core_"), "no scrape");
}

#[test]
fn control_frame_floods_are_answered_at_bounded_cost() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rig = rig("hflctl");
    // (2, 3, 4) A peer that reads: every PING and SETTINGS answered, and
    // the connection lives on (they are legal in any number, as data is).
    for (frame, answer) in [
        ("ping", "ping_ack"),
        ("settings", "settings_ack"),
        ("window", ""),
        ("window-stream", ""),
    ] {
        let o = flood(&rig, frame, true, 4.0);
        assert_eq!(o.reports.len(), 1, "{frame}: reconnected");
        let r = &o.reports[0];
        // Open all through the flood (once it stops, so do the attacker's
        // PING answers, and the keepalive may cut it while it drains).
        let flooded = r["flooded_for"].as_f64().unwrap();
        assert!(
            r["closed_after"].as_f64().is_none_or(|c| c >= flooded),
            "{frame}: closed during the flood: {r}\n{}",
            errors(&rig)
        );
        assert!(r["goaway_code"].is_null(), "{frame}: {r}");
        let sent = r["frames_sent"].as_u64().unwrap();
        assert!(sent >= 10_000, "{frame}: a weak flood: {r}");
        if !answer.is_empty() {
            // One answer per frame, but for those still in flight.
            let answered = r["received"][answer].as_u64().unwrap_or(0);
            assert!(
                answered + 20_000 >= sent,
                "{frame}: {answered} answers: {r}"
            );
        }
        // No frame of these is kept once handled.
        assert_bounded(&rig, &o, 8);
    }
    // A peer that never reads: ringway answers until its socket is full,
    // then reads no more from it. Its PINGs go unanswered: the first by
    // the handshake bound (3 s), a later one by the keepalive's (1 s + 2
    // s), so it is cut within 3 s, and a second of slack.
    for frame in ["ping", "settings"] {
        let o = flood(&rig, frame, false, 6.0);
        let r = &o.reports[0];
        let closed = r["closed_after"].as_f64().or(r["flooded_for"].as_f64());
        assert!(
            r["write_error"].is_string() || r["closed_after"].is_number(),
            "{frame}: never cut: {r}"
        );
        assert!(closed.unwrap() < 4.0, "{frame}: open too long: {r}");
        assert!(
            r["longest_write_stall"].as_f64().unwrap() >= 0.5,
            "{frame}: ringway kept reading: {r}"
        );
        assert_bounded(&rig, &o, 8);
    }
    let cut = rig
        .nodes
        .b()
        .per_core("ringway_core_hbone_settings_ack_timeouts_total");
    assert!(cut.iter().sum::<u64>() >= 2, "handshake-bound cuts {cut:?}");
}
