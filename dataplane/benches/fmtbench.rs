//! What formatting one access-log line costs, in isolation: 200,000
//! events shaped like ringway's access line through the ztunnel-shaped
//! formatter into a sink (no I/O).
//!
//!     cargo bench -p ringway-dataplane --bench fmtbench -- json|text

use std::time::Instant;

fn main() {
    // `cargo bench` adds `--bench` to the arguments.
    let json = std::env::args().any(|a| a == "json");
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .event_format(ringway_dataplane::telemetry::logfmt::ZtunnelFormat { json })
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let n = 200_000;
        let t = Instant::now();
        for i in 0..n {
            let addr: std::net::SocketAddr = "10.0.0.1:4000".parse().unwrap();
            tracing::event!(target: "access", tracing::Level::INFO, {
                src.addr = %addr, src.workload = Some("client"), src.namespace = Some("ns"),
                src.identity = Some("spiffe://cluster.local/ns/client-ns/sa/client"),
                dst.addr = %addr, dst.hbone_addr = %addr, dst.workload = Some("server"),
                dst.namespace = Some("server-ns"), dst.identity = Some("spiffe://cluster.local/ns/server-ns/sa/server"),
                direction = "outbound", bytes_sent = i as u64, bytes_recv = 5u64, duration = "2ms",
                outcome = "closed", core = 0usize, path = "outbound", route = "hbone", trace = Some("00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-00"), hbone_conn = Some(3u64)
            }, "connection complete");
        }
        let per = t.elapsed() / n;
        println!(
            "{:.2} us per line ({})",
            per.as_secs_f64() * 1e6,
            if json { "json" } else { "text" }
        );
    });
}
