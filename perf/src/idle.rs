//! The idle scenario: open K connections through the proxy, prove each one
//! reaches the server (one 1-byte exchange), leave them idle, and measure
//! how much resident memory the proxy holds for them. Then check they are
//! all still alive and close them.
//!
//! Allocators keep freed memory, so a proxy that already held K
//! connections once shows little growth the second time: the suite
//! restarts the proxy before this scenario. One connection is opened and
//! closed before the baseline is read, so one-time setup (an HBONE pool
//! connection, certificates) is not charged to the K connections.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::{CpuMeter, Processes};
use crate::wire::Op;

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Params {
    pub connections: usize,
    /// Wait after the last connection opened before reading RSS.
    #[serde(serialize_with = "crate::units::serialize_secs")]
    pub settle: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct IdleResult {
    pub connections: usize,
    /// Time to open (and prove) all connections.
    pub open_seconds: f64,
    pub proxy_rss_before: Option<u64>,
    /// With every connection open, after the settle delay.
    pub proxy_rss_open: Option<u64>,
    /// Right after closing them all, after the settle delay again.
    pub proxy_rss_closed: Option<u64>,
    /// (open − before) / connections.
    pub proxy_bytes_per_connection: Option<f64>,
    /// The proxies' CPU seconds to open 1000 connections.
    pub proxy_cpu_s_per_1k_connections: Option<f64>,
}

fn exchange(s: &mut TcpStream) -> io::Result<()> {
    s.write_all(&[0x44])?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
}

fn open(dialer: &Dialer, i: usize) -> io::Result<TcpStream> {
    let with_context = |e: io::Error| io::Error::new(e.kind(), format!("idle connection {i}: {e}"));
    let mut s = dialer.connect().map_err(with_context)?;
    Op::Rr {
        request: 1,
        response: 1,
    }
    .write_to(&mut s)
    .map_err(with_context)?;
    exchange(&mut s).map_err(with_context)?;
    Ok(s)
}

pub fn run(dialer: &Dialer, p: Params, procs: &Processes) -> io::Result<IdleResult> {
    drop(open(dialer, 0)?);
    std::thread::sleep(p.settle);
    let before = procs.rss_bytes()?;
    let cpu = CpuMeter::start(procs)?;
    let start = Instant::now();
    let mut conns = Vec::with_capacity(p.connections);
    for i in 0..p.connections {
        conns.push(open(dialer, i)?);
    }
    let open_seconds = start.elapsed().as_secs_f64();
    let cpu_s = cpu.finish()?;
    std::thread::sleep(p.settle);
    let open = procs.rss_bytes()?;
    for (i, s) in conns.iter_mut().enumerate() {
        exchange(s).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("idle connection {i} died while idle: {e}"),
            )
        })?;
    }
    drop(conns);
    std::thread::sleep(p.settle);
    let closed = procs.rss_bytes()?;
    let k = p.connections.max(1) as f64;
    Ok(IdleResult {
        connections: p.connections,
        open_seconds,
        proxy_rss_before: before,
        proxy_rss_open: open,
        proxy_rss_closed: closed,
        proxy_bytes_per_connection: before.zip(open).map(|(b, o)| (o as f64 - b as f64) / k),
        proxy_cpu_s_per_1k_connections: cpu_s.map(|c| c / k * 1000.0),
    })
}
