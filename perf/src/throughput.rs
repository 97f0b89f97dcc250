//! The throughput scenario: N parallel streams move X bytes each, up,
//! down or both ways at once; every byte is accounted for.

use std::io::{self, Read};
use std::net::Shutdown;
use std::thread;
use std::time::Instant;

use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::{CpuMeter, Processes};
use crate::server::{discard, discard_exact, send_bytes};
use crate::wire::Op;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// client → server
    Up,
    /// server → client
    Down,
    /// both at once
    Both,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
            Direction::Both => "both",
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Params {
    pub streams: usize,
    pub bytes_per_stream: u64,
    pub direction: Direction,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputResult {
    pub streams: usize,
    pub bytes_per_stream: u64,
    pub direction: Direction,
    /// Payload bytes that arrived, all streams and directions.
    pub bytes: u64,
    pub seconds: f64,
    pub gbit_per_s: f64,
    /// The proxies' CPU seconds during the run (None without proxies).
    pub proxy_cpu_s: Option<f64>,
    pub proxy_cpu_s_per_gib: Option<f64>,
}

/// Runs the scenario and checks every byte arrived.
pub fn run(dialer: &Dialer, p: Params, procs: &Processes) -> io::Result<ThroughputResult> {
    if p.streams == 0 {
        return Err(io::Error::other("at least one stream"));
    }
    let cpu = CpuMeter::start(procs)?;
    let start = Instant::now();
    let handles: Vec<_> = (0..p.streams)
        .map(|_| {
            let d = dialer.clone();
            thread::spawn(move || one_stream(&d, p.bytes_per_stream, p.direction))
        })
        .collect();
    let mut total = 0;
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("stream thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let seconds = start.elapsed().as_secs_f64();
    let proxy_cpu_s = cpu.finish()?;
    let per_dir = match p.direction {
        Direction::Both => 2,
        _ => 1,
    };
    let expected = p.bytes_per_stream * p.streams as u64 * per_dir;
    if total != expected {
        return Err(io::Error::other(format!(
            "only {total} of {expected} bytes arrived"
        )));
    }
    let gib = total as f64 / (1u64 << 30) as f64;
    Ok(ThroughputResult {
        streams: p.streams,
        bytes_per_stream: p.bytes_per_stream,
        direction: p.direction,
        bytes: total,
        seconds,
        gbit_per_s: total as f64 * 8.0 / seconds / 1e9,
        proxy_cpu_s,
        proxy_cpu_s_per_gib: proxy_cpu_s.filter(|_| gib > 0.0).map(|c| c / gib),
    })
}

/// One stream. No thread ever blocks reading a socket that another thread
/// is busy writing (every write-space event would wake it: measurably
/// slower on loopback), and Nagle stays on as for any bulk sender.
fn one_stream(dialer: &Dialer, bytes: u64, dir: Direction) -> io::Result<u64> {
    let mut s = dialer.connect()?;
    s.set_nodelay(false)?;
    let (up, down) = match dir {
        Direction::Up => (bytes, 0),
        Direction::Down => (0, bytes),
        Direction::Both => (bytes, bytes),
    };
    Op::Bulk { download: down }.write_to(&mut s)?;
    match dir {
        Direction::Up | Direction::Down => {
            // Upload (possibly nothing), FIN, then the download and the
            // trailer: one thread, one direction at a time.
            send_bytes(&mut s, up)?;
            s.shutdown(Shutdown::Write)?;
            discard_exact(&mut s, down)?;
        }
        Direction::Both => {
            let mut w = s.try_clone()?;
            let writer = thread::spawn(move || -> io::Result<()> {
                send_bytes(&mut w, up)?;
                w.shutdown(Shutdown::Write)
            });
            discard_exact(&mut s, down)?;
            writer
                .join()
                .map_err(|_| io::Error::other("writer panicked"))??;
        }
    }
    let mut trailer = [0u8; 8];
    s.read_exact(&mut trailer)?;
    let uploaded = u64::from_be_bytes(trailer);
    if uploaded != up {
        return Err(io::Error::other(format!(
            "server received {uploaded} of {up} bytes"
        )));
    }
    if discard(&mut s)? != 0 {
        return Err(io::Error::other("unexpected bytes after the trailer"));
    }
    Ok(down + uploaded)
}
