//! `ringway-perf calibrate`: proves the load generator is not the
//! bottleneck by comparing its direct TCP throughput on loopback with
//! iperf3's, alternating the two over several rounds. Ours must reach
//! `min_ratio` (default 90 %) of iperf3.

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::Processes;
use crate::stats::{median, ratio};
use crate::supervise::{Ready, Spec, Supervised};
use crate::throughput::{self, Direction};

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct Params {
    /// Seconds per run (iperf3 -t; our run is sized to take about as long).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Rounds; each runs iperf3 and ringway-perf once, order alternating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Parallel streams for both tools (iperf3 -P).
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// iperf3's write size (-l); the default matches ours (1 MiB), which is
    /// also iperf3's faster setting on loopback.
    #[arg(long, default_value = "1M")]
    pub iperf3_len: String,
    /// Ours ÷ iperf3 below this fails the calibration.
    #[arg(long, default_value_t = 0.9)]
    pub min_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub params: Params,
    pub iperf3_version: String,
    pub iperf3_gbit_per_s: Vec<f64>,
    pub ours_gbit_per_s: Vec<f64>,
    pub iperf3_median: Option<f64>,
    pub ours_median: Option<f64>,
    /// ours ÷ iperf3 (medians).
    pub ratio: Option<f64>,
    pub pass: bool,
}

impl Calibration {
    pub fn summary(&self) -> String {
        let f = |v: Option<f64>| v.map_or("–".into(), |x| format!("{x:.2}"));
        format!(
            "loopback, {} stream(s), {} rounds of {}s: iperf3 (-l {}) {} Gbit/s, ringway-perf {} Gbit/s → {} of iperf3 ({}, need ≥ {:.0}%)",
            self.params.streams,
            self.params.rounds,
            self.params.seconds,
            self.params.iperf3_len,
            f(self.iperf3_median),
            f(self.ours_median),
            self.ratio.map_or("–".into(), |r| format!("{:.0}%", r * 100.0)),
            if self.pass { "PASS" } else { "FAIL" },
            self.params.min_ratio * 100.0,
        )
    }
}

/// An `iperf3 -s` on loopback, stopped on drop; its output goes to a
/// scratch log, removed then.
struct Iperf3Server {
    server: Supervised,
    port: u16,
}

impl Iperf3Server {
    fn start() -> anyhow::Result<Iperf3Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let args = [
            "-s",
            "-B",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--forceflush",
        ];
        let name = format!("ringway-perf-iperf3-{}-{port}", std::process::id());
        let spec = Spec::new(
            &name,
            "iperf3",
            args.map(String::from).to_vec(),
            &std::env::temp_dir(),
        )
        .ready(Ready::Output(vec!["Server listening"]));
        let server = Supervised::start(None, spec)?;
        Ok(Iperf3Server { server, port })
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.server.log());
    }
}

fn iperf3_version() -> anyhow::Result<String> {
    let out = Command::new("iperf3")
        .arg("--version")
        .output()
        .map_err(|_| {
            anyhow::anyhow!(
                "iperf3 is not installed: apt-get install -y iperf3 (scripts/bench.sh does)"
            )
        })?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("iperf3")
        .trim()
        .to_string())
}

fn iperf3_client(port: u16, p: &Params) -> anyhow::Result<f64> {
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J"])
        .args(["-t", &format!("{}", p.seconds.max(1.0))])
        .args(["-P", &p.streams.to_string()])
        .args(["-l", &p.iperf3_len])
        .output()
        .context("run iperf3 -c")?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 -J output: {}", String::from_utf8_lossy(&out.stderr)))?;
    if let Some(e) = json.get("error") {
        bail!("iperf3: {e}");
    }
    json.pointer("/end/sum_received/bits_per_second")
        .and_then(|v| v.as_f64())
        .map(|bps| bps / 1e9)
        .context("iperf3 -J: no end.sum_received.bits_per_second")
}

/// Runs the comparison; `progress` gets one line per measurement.
pub fn run(p: &Params, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Calibration> {
    if p.rounds == 0 || p.streams == 0 {
        bail!("calibrate needs ≥ 1 round and ≥ 1 stream");
    }
    let version = iperf3_version()?;
    let iperf = Iperf3Server::start()?;
    let ours_addr: SocketAddr = crate::server::spawn(&["127.0.0.1:0".parse().unwrap()])?[0];
    let dialer = Dialer::direct(ours_addr);
    let mut theirs = Vec::new();
    let mut ours = Vec::new();
    for round in 0..p.rounds {
        // iperf3 first in round 1: its rate sizes our runs.
        let iperf_first = round % 2 == 0;
        for is_iperf in [iperf_first, !iperf_first] {
            if is_iperf {
                let g = iperf3_client(iperf.port, p)?;
                progress(&format!(
                    "calibrate round {}/{}: iperf3       {g:7.2} Gbit/s",
                    round + 1,
                    p.rounds
                ));
                theirs.push(g);
            } else {
                let rate = median(&theirs).unwrap_or(10.0);
                let per_stream = (rate * 1e9 / 8.0 * p.seconds / p.streams as f64) as u64;
                let bytes = (per_stream.max(16 << 20) >> 20) << 20;
                let r = throughput::run(
                    &dialer,
                    throughput::Params {
                        streams: p.streams,
                        bytes_per_stream: bytes,
                        direction: Direction::Up,
                    },
                    &Processes::default(),
                )?;
                progress(&format!(
                    "calibrate round {}/{}: ringway-perf {:7.2} Gbit/s",
                    round + 1,
                    p.rounds,
                    r.gbit_per_s
                ));
                ours.push(r.gbit_per_s);
            }
        }
        // Let TIME_WAIT and the page allocator settle a moment.
        std::thread::sleep(Duration::from_millis(100));
    }
    let (im, om) = (median(&theirs), median(&ours));
    let r = ratio(om, im);
    Ok(Calibration {
        params: p.clone(),
        iperf3_version: version,
        iperf3_gbit_per_s: theirs,
        ours_gbit_per_s: ours,
        iperf3_median: im,
        ours_median: om,
        ratio: r,
        pass: r.is_some_and(|r| r >= p.min_ratio),
    })
}
