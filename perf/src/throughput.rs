//! The throughput scenario: N parallel streams move X bytes each.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread;
use std::time::Instant;

use serde::Serialize;

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

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputResult {
    pub streams: usize,
    pub bytes_per_stream: u64,
    /// Payload bytes that arrived, all streams and directions.
    pub bytes: u64,
    pub seconds: f64,
    pub gbit_per_s: f64,
}

/// Runs the scenario against `target` and checks every byte arrived.
pub fn run(
    target: SocketAddr,
    streams: usize,
    bytes: u64,
    dir: Direction,
) -> io::Result<ThroughputResult> {
    let start = Instant::now();
    let handles: Vec<_> = (0..streams)
        .map(|_| thread::spawn(move || one_stream(target, bytes, dir)))
        .collect();
    let mut total = 0;
    for h in handles {
        total += h
            .join()
            .map_err(|_| io::Error::other("stream thread panicked"))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let per_dir = match dir {
        Direction::Both => 2,
        _ => 1,
    };
    let expected = bytes * streams as u64 * per_dir;
    if total != expected {
        return Err(io::Error::other(format!(
            "only {total} of {expected} bytes arrived"
        )));
    }
    Ok(ThroughputResult {
        streams,
        bytes_per_stream: bytes,
        bytes: total,
        seconds,
        gbit_per_s: total as f64 * 8.0 / seconds / 1e9,
    })
}

fn one_stream(target: SocketAddr, bytes: u64, dir: Direction) -> io::Result<u64> {
    let mut s = TcpStream::connect(target)?;
    s.set_nodelay(true)?;
    let (up, down) = match dir {
        Direction::Up => (bytes, 0),
        Direction::Down => (0, bytes),
        Direction::Both => (bytes, bytes),
    };
    Op::Bulk { download: down }.write_to(&mut s)?;
    let mut w = s.try_clone()?;
    let writer = thread::spawn(move || -> io::Result<()> {
        send_bytes(&mut w, up)?;
        w.shutdown(Shutdown::Write)
    });
    discard_exact(&mut s, down)?;
    let mut trailer = [0u8; 8];
    s.read_exact(&mut trailer)?;
    writer
        .join()
        .map_err(|_| io::Error::other("writer panicked"))??;
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
