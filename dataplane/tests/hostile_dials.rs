//! A hostile but authenticated HBONE peer (issue 25, "Dials bounded and
//! cancelled"): it sends CONNECT HEADERS for a black-holed port in bursts
//! and resets them a few ms later, in a paced loop, reconnecting when cut
//! off. Without the race against the reset, each stream left a dial behind
//! holding an fd for the connect timeout. Checked: ringway's dials in
//! flight (its gauge, and its fd count) stay under the caps, the attacker
//! gets GOAWAY (ENHANCE_YOUR_CALM), and a bystander's CONNECT to an echo
//! server keeps its latency.
//!
//! The peers are Rust h2 + tokio-rustls clients on node A, with
//! certificates from the test's built-in CA.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::bystander;
use common::nodes::{Nodes, SERVER_IP};
use h2::client::SendRequest;
use h2::Reason;
use tokio_rustls::rustls::ClientConfig;

/// The black-holed port: node B drops SYNs to it.
const HOLE: u16 = 9999;
const ECHO: u16 = 8080;
/// Streams per burst, and bursts.
const BURST: usize = 100;
const ROUNDS: usize = 60;

/// A TLS + h2 connection to ringway B's 15008; the connection's driver
/// runs as a task whose result says how it ended.
async fn h2_connect(
    tls: &Arc<ClientConfig>,
) -> (
    SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let addr: SocketAddr = format!("{SERVER_IP}:15008").parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .unwrap();
    let (send, conn) = h2::client::Builder::new()
        .max_concurrent_reset_streams(4 * BURST)
        .handshake::<_, Bytes>(tls)
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

fn connect_request(port: u16) -> http::Request<()> {
    http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("{SERVER_IP}:{port}"))
        .body(())
        .unwrap()
}

/// One bystander CONNECT on its own connection's stream: 200, then 4 bytes
/// echoed. Its latency.
async fn probe(send: &mut SendRequest<Bytes>) -> Duration {
    let start = Instant::now();
    let mut ready = send.clone().ready().await.expect("bystander connection");
    let (response, mut body) = ready.send_request(connect_request(ECHO), false).unwrap();
    let response = response.await.expect("bystander's CONNECT answered");
    assert_eq!(response.status(), 200);
    body.send_data(Bytes::from_static(b"ping"), true).unwrap();
    let mut recv = response.into_body();
    let mut got = Vec::new();
    while got.len() < 4 {
        let chunk = recv.data().await.expect("echo").unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, b"ping");
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// What the attacker saw.
#[derive(Debug, Default)]
struct Attack {
    streams: usize,
    connections: usize,
    /// Connections that ended with GOAWAY ENHANCE_YOUR_CALM.
    calmed: usize,
}

/// Bursts of CONNECTs to the hole, each reset 5 ms after it went out, one
/// burst every 10 ms; a new connection when the last was cut off.
async fn attack(tls: Arc<ClientConfig>) -> Attack {
    let mut seen = Attack::default();
    let mut conn = None;
    for _ in 0..ROUNDS {
        let (send, driver) = match conn.take() {
            Some(c) => c,
            None => {
                seen.connections += 1;
                h2_connect(&tls).await
            }
        };
        let mut streams = Vec::with_capacity(BURST);
        let mut failed = false;
        for _ in 0..BURST {
            match send.clone().ready().await {
                Ok(mut s) => match s.send_request(connect_request(HOLE), false) {
                    Ok((_, stream)) => streams.push(stream),
                    Err(_) => failed = true,
                },
                Err(_) => failed = true,
            }
            if failed {
                break;
            }
        }
        seen.streams += streams.len();
        tokio::time::sleep(Duration::from_millis(5)).await;
        for mut s in streams {
            s.send_reset(Reason::CANCEL);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        if failed || driver.is_finished() {
            seen.calmed += usize::from(calmed(driver).await);
        } else {
            conn = Some((send, driver));
        }
    }
    if let Some((send, driver)) = conn {
        drop(send);
        seen.calmed += usize::from(calmed(driver).await);
    }
    seen
}

/// Whether a connection ended with GOAWAY (ENHANCE_YOUR_CALM).
async fn calmed(driver: tokio::task::JoinHandle<Result<(), h2::Error>>) -> bool {
    let ended = tokio::time::timeout(Duration::from_secs(2), driver).await;
    matches!(ended, Ok(Ok(Err(e))) if e.reason() == Some(Reason::ENHANCE_YOUR_CALM))
}

/// Peaks seen while the attack runs.
#[derive(Debug, Default)]
struct Peaks {
    fds: usize,
    dials_in_flight: Option<u64>,
}

/// Samples ringway's fd count and dials-in-flight gauge every 10 ms from
/// inside its namespace until `stop`.
fn sample(nodes: &Nodes, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Peaks> {
    let rw = nodes.b();
    let (pid, ns) = (rw.pid(), rw.netns.clone().unwrap());
    let stats = rw.listeners["listeners"]["stats"][0]
        .as_str()
        .unwrap()
        .to_owned();
    std::thread::spawn(move || {
        common::in_netns(&ns, move || {
            let mut peaks = Peaks::default();
            while !stop.load(Ordering::Relaxed) {
                peaks.fds = peaks.fds.max(fds(pid));
                let dials = bystander::scrape(&stats).and_then(|s| {
                    bystander::sum_series(&s, "ringway_core_inbound_dials_in_flight")
                });
                peaks.dials_in_flight = peaks.dials_in_flight.max(dials);
                std::thread::sleep(Duration::from_millis(10));
            }
            peaks
        })
    })
}

/// ringway's open fds.
fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The sum over cores of a per-core series, if ringway has it.
fn per_core_sum(nodes: &Nodes, name: &str) -> Option<u64> {
    let (_, scrape) = nodes.b().http_get("stats", "/metrics");
    bystander::sum_series(&scrape, name)
}

#[test]
fn reset_streams_do_not_pile_up_dials_and_the_peer_is_calmed() {
    // A cap below the bursts, so that refusals happen too (the default,
    // 200, is the streams a connection may open at once).
    let nodes = Nodes::new("hdial", true, &["--max-dials-per-connection", "64"]);
    // The hole: SYNs to it vanish, so a dial waits out its connect timeout.
    nodes.b.nft(&format!(
        "table inet hdial {{
           chain out {{ type filter hook output priority 0; policy accept;
             tcp dport {HOLE} tcp flags & (syn | ack) == syn drop;
           }}
         }}"
    ));
    nodes
        .b
        .enter(|| common::serve_echo(TcpListener::bind(format!("{SERVER_IP}:{ECHO}")).unwrap()));
    let tls = bystander::client_tls(&nodes, "client");
    let pid = nodes.b().pid();
    let fds_before = fds(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(&nodes, stop.clone());

    let attack_started = Instant::now();
    let (baseline, during, seen) = {
        nodes.a.enter(move || {
            let runtime = || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
            };
            let rt = runtime();
            let (mut bystander, _driver) = rt.block_on(h2_connect(&tls));
            let mut baseline = Vec::new();
            rt.block_on(async {
                for _ in 0..30 {
                    baseline.push(probe(&mut bystander).await);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            // The attacker on a thread of its own (in this namespace too),
            // so its work does not delay the bystander's client.
            let attacker = std::thread::spawn(move || runtime().block_on(attack(tls)));
            let mut during = Vec::new();
            rt.block_on(async {
                while !attacker.is_finished() {
                    during.push(probe(&mut bystander).await);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            (baseline, during, attacker.join().unwrap())
        })
    };
    let attack_took = attack_started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peaks = sampler.join().unwrap();
    // What ringway holds right after the attack: dials still waiting on
    // the hole would show here (they last the 10 s connect timeout).
    let fds_after = fds(pid);
    let in_flight = per_core_sum(&nodes, "ringway_core_inbound_dials_in_flight");
    let refused = per_core_sum(&nodes, "ringway_core_inbound_dials_refused_total");
    let abandoned = per_core_sum(&nodes, "ringway_core_inbound_dials_abandoned_total");
    let goaways = per_core_sum(&nodes, "ringway_core_inbound_calm_goaways_total");
    let (base, dur) = (median(baseline.clone()), median(during.clone()));
    eprintln!(
        "hostile_dials: attack {seen:?}; peaks during it {peaks:?}; \
         fds {fds_before} before, {fds_after} after; \
         dials in flight {in_flight:?}, refused {refused:?}, abandoned {abandoned:?}, \
         calm GOAWAYs {goaways:?}; bystander median {base:?} baseline, {dur:?} during \
         ({} probes), max during {:?}",
        during.len(),
        during.iter().max()
    );

    // One attacking connection at a time, and the bystander's dial.
    let per_connection = 64;
    assert!(
        peaks.fds <= fds_before + 2 * per_connection,
        "fds rose from {fds_before} to {} during the attack",
        peaks.fds
    );
    assert!(
        peaks
            .dials_in_flight
            .is_some_and(|n| n <= per_connection as u64 + 1),
        "dials in flight during the attack: {:?}",
        peaks.dials_in_flight
    );
    assert!(
        fds_after <= fds_before + per_connection,
        "dials piled up: {fds_before} fds before the attack, {fds_after} after"
    );
    assert!(
        in_flight.is_some_and(|n| n <= per_connection as u64),
        "dials in flight {in_flight:?}"
    );
    assert!(
        seen.calmed >= 1,
        "the attacker was never sent GOAWAY (ENHANCE_YOUR_CALM): {seen:?}"
    );
    assert!(goaways.is_some_and(|n| n >= seen.calmed as u64));
    assert!(abandoned.is_some_and(|n| n > 0), "{abandoned:?}");
    // Bursts of 100 on one connection: past 64, refused at once.
    assert!(refused.is_some_and(|n| n > 0), "{refused:?}");
    // Logged, but at most a line a second per core for each kind, each
    // saying how many it stands for.
    let logs = nodes.b().logs();
    let lines = |what: &str| -> Vec<String> {
        logs.iter()
            .filter_map(|l| l["message"].as_str().or(l["fields"]["message"].as_str()))
            .filter(|m| m.contains(what))
            .map(String::from)
            .collect()
    };
    let (refusals, calms) = (
        lines("refused (REFUSED_STREAM)"),
        lines("ENHANCE_YOUR_CALM"),
    );
    let cores = nodes.b().per_core("ringway_core_tasks").len();
    let most = cores * (attack_took.as_secs() as usize + 2);
    assert!(
        !refusals.is_empty() && refusals.len() <= most,
        "{} refusal lines for {refused:?} refusals: {refusals:#?}",
        refusals.len()
    );
    assert!(
        !calms.is_empty() && calms.len() <= most,
        "{} GOAWAY lines: {calms:#?}",
        calms.len()
    );
    assert!(refusals.iter().all(|m| m.contains("suppressed")));
    eprintln!(
        "hostile_dials: {} refusal and {} GOAWAY log lines on {cores} cores in {attack_took:?}",
        refusals.len(),
        calms.len()
    );
    // The bystander: every CONNECT succeeded (probe asserts it), in about
    // its usual time. The baseline is about a millisecond, where
    // scheduling noise alone can double it: with the suite's other test
    // binaries running beside this one it reached 3.1 ms against a 1.5 ms
    // baseline. Hence a floor of 5 ms; what separates before from after
    // here is the descriptor count above, not this.
    assert!(
        dur <= (base * 2).max(Duration::from_millis(5)),
        "bystander median {dur:?} during the attack, {base:?} before"
    );
}
