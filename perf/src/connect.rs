//! The connect scenario: a new connection per request (connect, 1-byte
//! request, 1-byte response, close), from W workers at once. Reports
//! connections per second and a connect-to-first-byte histogram (from the
//! start of connect() — including a SOCKS5 handshake — until the response
//! byte arrived).

use std::io::{self, Read, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use serde::Serialize;

use crate::dial::Dialer;
use crate::latency::{self, Percentiles};
use crate::procstat::{CpuMeter, Processes};
use crate::rr::{Limit, Window};
use crate::wire::{Op, HEADER_LEN};

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Params {
    /// Workers, each with one connection in flight.
    pub concurrency: usize,
    pub limit: Limit,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConnectResult {
    pub concurrency: usize,
    /// Completed connections (request answered).
    pub connections: u64,
    /// Failed attempts; the first failure is kept.
    pub errors: u64,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub connections_per_s: f64,
    pub connect_to_first_byte: Percentiles,
    pub proxy_cpu_s: Option<f64>,
    pub proxy_cpu_s_per_1k_connections: Option<f64>,
}

/// Header and the 1-byte request, sent in one write.
fn request() -> [u8; HEADER_LEN + 1] {
    let mut m = [0x33u8; HEADER_LEN + 1];
    m[..HEADER_LEN].copy_from_slice(
        &Op::Rr {
            request: 1,
            response: 1,
        }
        .encode(),
    );
    m
}

/// One connection: dial, ask, wait for the answer, close.
pub fn one(dialer: &Dialer) -> io::Result<()> {
    let mut s = dialer.connect()?;
    s.write_all(&request())?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(())
}

struct Worker {
    hist: latency::Hist,
    window: Window,
    errors: u64,
    first_error: Option<io::Error>,
}

pub fn run(dialer: &Dialer, p: Params, procs: &Processes) -> io::Result<ConnectResult> {
    if p.concurrency == 0 {
        return Err(io::Error::other("connect needs ≥ 1 worker"));
    }
    let barrier = Arc::new(Barrier::new(p.concurrency + 1));
    let handles: Vec<_> = (0..p.concurrency)
        .map(|i| {
            let (d, b) = (dialer.clone(), barrier.clone());
            let share = p.limit.share(i, p.concurrency);
            thread::spawn(move || worker(&d, p, share, &b))
        })
        .collect();
    // "Ready", then "go" once the CPU meter runs.
    barrier.wait();
    let cpu = CpuMeter::start(procs);
    barrier.wait();
    let cpu = cpu?;
    let mut workers = Vec::new();
    for h in handles {
        workers.push(
            h.join()
                .map_err(|_| io::Error::other("connect worker panicked"))?,
        );
    }
    let proxy_cpu_s = cpu.finish()?;
    let mut window = Window::default();
    for w in &workers {
        window.merge(w.window);
    }
    let seconds = window.seconds();
    let all = latency::merge(workers.iter().map(|w| &w.hist));
    let errors = workers.iter().map(|w| w.errors).sum();
    let first_error = workers.iter_mut().find_map(|w| w.first_error.take());
    let connections = all.len();
    if connections == 0 {
        return Err(first_error.unwrap_or_else(|| io::Error::other("no connection completed")));
    }
    Ok(ConnectResult {
        concurrency: p.concurrency,
        connections,
        errors,
        first_error: first_error.map(|e| e.to_string()),
        seconds,
        connections_per_s: connections as f64 / seconds,
        connect_to_first_byte: Percentiles::of(&all),
        proxy_cpu_s,
        proxy_cpu_s_per_1k_connections: proxy_cpu_s.map(|c| c / connections as f64 * 1000.0),
    })
}

fn worker(dialer: &Dialer, p: Params, share: Option<u64>, barrier: &Barrier) -> Worker {
    let mut w = Worker {
        hist: latency::new_hist(),
        window: Window::default(),
        errors: 0,
        first_error: None,
    };
    barrier.wait();
    barrier.wait();
    let start = Instant::now();
    for t0 in p.limit.budget(share) {
        match one(dialer) {
            Ok(()) => latency::record(&mut w.hist, t0.elapsed()),
            Err(e) => {
                w.errors += 1;
                w.first_error.get_or_insert(e);
                // Errors that repeat at once (refused, no ports) must not
                // turn into a busy loop that starves everything else.
                if w.errors > 100 && w.hist.is_empty() {
                    break;
                }
                thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    w.window = Window::new(start, Instant::now());
    w
}
