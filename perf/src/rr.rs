//! The request/response scenario: C connections, each sending S-byte
//! requests and waiting for the S-byte response before the next, for a
//! duration or a request count. Latency per request; histograms merged
//! across connections.

use std::io::{self, Read, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dial::Dialer;
use crate::latency::{self, Percentiles};
use crate::procstat::{CpuMeter, Processes};
use crate::wire::Op;

/// When a scenario stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// Run for this long.
    Duration(#[serde(serialize_with = "crate::units::serialize_secs")] Duration),
    /// Stop after this many requests (or connections), all workers together.
    Count(u64),
}

impl Limit {
    /// Worker `i` of `n`'s share of a count limit.
    pub fn share(self, i: usize, n: usize) -> Option<u64> {
        match self {
            Limit::Duration(_) => None,
            Limit::Count(c) => Some(c / n as u64 + u64::from((i as u64) < c % n as u64)),
        }
    }

    /// A worker's budget of it from now on: `share` is its part of a
    /// count limit (see [`Limit::share`]).
    pub fn budget(self, share: Option<u64>) -> Budget {
        let deadline = match self {
            Limit::Duration(d) => Some(Instant::now() + d),
            Limit::Count(_) => None,
        };
        Budget {
            deadline,
            left: share,
        }
    }

    /// Label for progress lines: "10s" or "5000 req".
    pub fn describe(self, unit: &str) -> String {
        match self {
            Limit::Duration(d) => crate::units::fmt_duration(d),
            Limit::Count(c) => format!("{c} {unit}"),
        }
    }
}

/// What a worker may still do, until a deadline or so many more: the
/// start of each next request (or connection).
pub struct Budget {
    deadline: Option<Instant>,
    left: Option<u64>,
}

impl Iterator for Budget {
    type Item = Instant;

    fn next(&mut self) -> Option<Instant> {
        let now = Instant::now();
        if self.left == Some(0) || self.deadline.is_some_and(|d| now >= d) {
            return None;
        }
        if let Some(n) = &mut self.left {
            *n -= 1;
        }
        Some(now)
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Params {
    /// Request and response size in bytes.
    pub size: u32,
    pub connections: usize,
    pub limit: Limit,
}

#[derive(Clone, Debug, Serialize)]
pub struct RrResult {
    pub size: u32,
    pub connections: usize,
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub latency: Percentiles,
    pub proxy_cpu_s: Option<f64>,
    pub proxy_cpu_s_per_1k_requests: Option<f64>,
}

/// Where [`run_probed`] is in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Every connection is set up; the timed requests start next.
    Start,
    /// The timed requests are done (or failed).
    Stop,
}

pub fn run(dialer: &Dialer, p: Params, procs: &Processes) -> io::Result<RrResult> {
    run_probed(dialer, p, procs, &mut |_| {})
}

/// [`run`], calling `probe` right before the timed requests start and
/// right after they end: whatever it measures covers exactly the requests
/// counted (and the proxy CPU), not the connection setup.
pub fn run_probed(
    dialer: &Dialer,
    p: Params,
    procs: &Processes,
    probe: &mut dyn FnMut(Phase),
) -> io::Result<RrResult> {
    if p.connections == 0 || p.size == 0 {
        return Err(io::Error::other(
            "rr needs ≥ 1 connection and ≥ 1-byte requests",
        ));
    }
    // Every connection is set up (and has done one untimed request) before
    // the CPU meter and the clocks start: two barriers, "set up" and "go".
    let barrier = Arc::new(Barrier::new(p.connections + 1));
    let handles: Vec<_> = (0..p.connections)
        .map(|i| {
            let (d, b) = (dialer.clone(), barrier.clone());
            let share = p.limit.share(i, p.connections);
            thread::spawn(move || connection(&d, p, share, &b))
        })
        .collect();
    barrier.wait();
    probe(Phase::Start);
    let cpu = CpuMeter::start(procs);
    barrier.wait();
    let cpu = cpu?;
    let mut hists = Vec::new();
    let mut window = Window::default();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((hist, w))) => {
                hists.push(hist);
                window.merge(w);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("rr thread panicked"));
            }
        }
    }
    let proxy_cpu_s = cpu.finish();
    probe(Phase::Stop);
    let proxy_cpu_s = proxy_cpu_s?;
    if let Some(e) = first_err {
        return Err(e);
    }
    let seconds = window.seconds();
    let all = latency::merge(&hists);
    let requests = all.len();
    if requests == 0 {
        return Err(io::Error::other("no request completed"));
    }
    Ok(RrResult {
        size: p.size,
        connections: p.connections,
        requests,
        seconds,
        requests_per_s: requests as f64 / seconds,
        latency: Percentiles::of(&all),
        proxy_cpu_s,
        proxy_cpu_s_per_1k_requests: proxy_cpu_s.map(|c| c / requests as f64 * 1000.0),
    })
}

/// When a worker's timed part ran; merged: first start to last end.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    start: Option<Instant>,
    end: Option<Instant>,
}

impl Window {
    pub fn new(start: Instant, end: Instant) -> Window {
        Window {
            start: Some(start),
            end: Some(end),
        }
    }

    pub fn merge(&mut self, o: Window) {
        self.start = self.start.into_iter().chain(o.start).min();
        self.end = self.end.into_iter().chain(o.end).max();
    }

    pub fn seconds(&self) -> f64 {
        match (self.start, self.end) {
            (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
            _ => 0.0,
        }
    }
}

fn connection(
    dialer: &Dialer,
    p: Params,
    share: Option<u64>,
    barrier: &Barrier,
) -> io::Result<(latency::Hist, Window)> {
    let setup = (|| {
        let mut s = dialer.connect()?;
        Op::Rr {
            request: p.size,
            response: p.size,
        }
        .write_to(&mut s)?;
        let mut req = vec![0x11u8; p.size as usize];
        let mut resp = vec![0u8; p.size as usize];
        exchange(&mut s, &req, &mut resp)?;
        req.fill(0x22);
        Ok::<_, io::Error>((s, req, resp))
    })();
    // Always meet both barriers, even after a failed setup, so nobody hangs.
    barrier.wait();
    barrier.wait();
    let (mut s, req, mut resp) = setup?;
    let mut hist = latency::new_hist();
    let start = Instant::now();
    for t0 in p.limit.budget(share) {
        exchange(&mut s, &req, &mut resp)?;
        latency::record(&mut hist, t0.elapsed());
    }
    Ok((hist, Window::new(start, Instant::now())))
}

fn exchange(s: &mut (impl Read + Write), req: &[u8], resp: &mut [u8]) -> io::Result<()> {
    s.write_all(req)?;
    s.read_exact(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_shares_add_up() {
        let l = Limit::Count(10);
        let shares: Vec<u64> = (0..3).map(|i| l.share(i, 3).unwrap()).collect();
        assert_eq!(shares, [4, 3, 3]);
        assert_eq!(Limit::Duration(Duration::from_secs(1)).share(0, 3), None);
    }
}
