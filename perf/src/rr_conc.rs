//! The concurrency scenario (`rr-conc`): request/response over C
//! connections at once, closed loop. Each connection has one S-byte
//! request in flight and sends the next as soon as the S-byte response
//! is in, so C is the load the client offers (requests outstanding) and
//! requests/s is what the path lets through at that load.
//!
//! The client must not be what limits it at 256 connections on a small
//! machine it shares with the proxies: a thread per connection (as `rr`
//! does) would cost a thread wake-up and a context switch per response.
//! So client threads (default one) each drive their share of the
//! connections from one level-triggered epoll loop: one `epoll_wait`
//! returns every response that arrived, then each costs one `read` and
//! one `write`. One thread is the default because on the two-CPU rig it
//! was enough (direct TCP at 256 connections: about 3× the fastest proxy
//! column's requests/s with the thread about half busy), and a second
//! thread only took CPU from the proxies (see perf/README.md). Each
//! thread reports its own CPU time (`CLOCK_THREAD_CPUTIME_ID`) over the
//! timed requests, so a run says how busy the generator was.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dial::Dialer;
use crate::epoll::{self, Epoll};
use crate::latency::{self, Percentiles};
use crate::procstat::{CpuMeter, Processes};
use crate::rr::{Budget, Limit, Window};
use crate::wire::Op;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Params {
    /// Request and response size in bytes.
    pub size: u32,
    /// Connections, each with one request in flight.
    pub connections: usize,
    /// Client threads, each driving its share of the connections from one
    /// epoll loop (at most `connections` are used).
    pub threads: usize,
    pub limit: Limit,
}

/// Client threads unless told otherwise (see the module's comment).
pub const DEFAULT_THREADS: usize = 1;

#[derive(Clone, Debug, Serialize)]
pub struct RrConcResult {
    pub size: u32,
    pub connections: usize,
    pub threads: usize,
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_s: f64,
    /// From writing a request to reading the last byte of its response.
    pub latency: Percentiles,
    pub proxy_cpu_s: Option<f64>,
    pub proxy_cpu_ms_per_1k_requests: Option<f64>,
    /// CPU seconds the client threads spent over the timed requests.
    pub client_cpu_s: f64,
    /// `client_cpu_s` ÷ (`seconds` × `threads`): the share of its time an
    /// average client thread was on a CPU. Well below 1, the client was
    /// waiting for responses, not holding them up.
    pub client_busy: f64,
    /// Requests completed per thread.
    pub requests_per_thread: Vec<u64>,
}

pub fn run(dialer: &Dialer, p: Params, procs: &Processes) -> io::Result<RrConcResult> {
    if p.connections == 0 || p.size == 0 {
        return Err(io::Error::other(
            "rr-conc needs ≥ 1 connection and ≥ 1-byte requests",
        ));
    }
    let threads = p.threads.clamp(1, p.connections);
    // As in rr: every connection is set up (and has done one untimed
    // exchange) before the CPU meter starts; then everyone goes at once.
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (d, b) = (dialer.clone(), barrier.clone());
            let conns = p.connections / threads + usize::from(t < p.connections % threads);
            let budget_share = p.limit.share(t, threads);
            thread::Builder::new()
                .name(format!("rr-conc-{t}"))
                .spawn(move || worker(&d, p, conns, budget_share, &b))
        })
        .collect::<io::Result<_>>()?;
    barrier.wait();
    let cpu = CpuMeter::start(procs);
    barrier.wait();
    let cpu = cpu?;
    let mut hists = Vec::new();
    let mut window = Window::default();
    let mut client_cpu_s = 0.0;
    let mut requests_per_thread = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(out)) => {
                requests_per_thread.push(out.hist.len());
                hists.push(out.hist);
                window.merge(out.window);
                client_cpu_s += out.cpu_s;
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("rr-conc thread panicked"));
            }
        }
    }
    let proxy_cpu_s = cpu.finish()?;
    if let Some(e) = first_err {
        return Err(e);
    }
    let seconds = window.seconds();
    let all = latency::merge(&hists);
    let requests = all.len();
    if requests == 0 || seconds <= 0.0 {
        return Err(io::Error::other("no request completed"));
    }
    Ok(RrConcResult {
        size: p.size,
        connections: p.connections,
        threads,
        requests,
        seconds,
        requests_per_s: requests as f64 / seconds,
        latency: Percentiles::of(&all),
        proxy_cpu_s,
        proxy_cpu_ms_per_1k_requests: proxy_cpu_s.map(|c| c * 1e6 / requests as f64),
        client_cpu_s,
        client_busy: client_cpu_s / (seconds * threads as f64),
        requests_per_thread,
    })
}

/// What one client thread measured.
struct Out {
    hist: latency::Hist,
    window: Window,
    cpu_s: f64,
}

/// One connection of a client thread and its request in flight.
struct Conn {
    stream: TcpStream,
    /// Request bytes written so far (`size`: all, waiting for the response).
    sent: usize,
    /// Response bytes read so far.
    got: usize,
    /// When the request in flight started.
    t0: Instant,
    /// Watched for writability (a request did not fit in the socket buffer).
    want_out: bool,
}

/// The socket's state after a nonblocking call.
enum Io {
    Done,
    WouldBlock,
}

impl Conn {
    /// Writes what is left of the request; watches for writability while
    /// the socket buffer is full, for the response once all is written.
    fn send(&mut self, ep: &Epoll, token: u64, req: &[u8]) -> io::Result<()> {
        let io = loop {
            if self.sent == req.len() {
                break Io::Done;
            }
            match self.stream.write(&req[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Io::WouldBlock,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        let want_out = matches!(io, Io::WouldBlock);
        if want_out != self.want_out {
            let events = if want_out { epoll::OUT } else { epoll::IN };
            ep.modify(self.stream.as_raw_fd(), events, token)?;
            self.want_out = want_out;
        }
        Ok(())
    }

    /// Reads what has arrived of the response (never past its end).
    fn receive(&mut self, resp: &mut [u8]) -> io::Result<Io> {
        loop {
            if self.got == resp.len() {
                return Ok(Io::Done);
            }
            match self.stream.read(&mut resp[self.got..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed with a response outstanding",
                    ))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Io::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Connects `n` connections, waits at the two barriers, then runs the
/// closed loop until the budget is spent and every request in flight has
/// its response.
fn worker(
    dialer: &Dialer,
    p: Params,
    n: usize,
    share: Option<u64>,
    barrier: &Barrier,
) -> io::Result<Out> {
    let size = p.size as usize;
    let setup = (|| {
        let ep = Epoll::new()?;
        let mut conns = Vec::with_capacity(n);
        let mut resp = vec![0u8; size];
        for token in 0..n {
            let mut s = dialer.connect()?;
            Op::Rr {
                request: p.size,
                response: p.size,
            }
            .write_to(&mut s)?;
            s.write_all(&vec![0x11u8; size])?;
            s.read_exact(&mut resp)?;
            s.set_nonblocking(true)?;
            ep.add(s.as_raw_fd(), epoll::IN, token as u64)?;
            conns.push(Conn {
                stream: s,
                sent: size,
                got: 0,
                t0: Instant::now(),
                want_out: false,
            });
        }
        Ok::<_, io::Error>((ep, conns))
    })();
    // Always meet both barriers, even after a failed setup, so nobody hangs.
    barrier.wait();
    barrier.wait();
    let (ep, mut conns) = setup?;
    let req = vec![0x22u8; size];
    let mut resp = vec![0u8; size];
    let mut hist = latency::new_hist();
    let cpu0 = thread_cpu_s()?;
    let start = Instant::now();
    let mut budget: Budget = p.limit.budget(share);
    let mut in_flight = 0usize;
    for (token, c) in conns.iter_mut().enumerate() {
        let Some(t0) = budget.next() else { break };
        c.t0 = t0;
        c.sent = 0;
        c.send(&ep, token as u64, &req)?;
        in_flight += 1;
    }
    let mut events = epoll::events(n.clamp(1, 1024));
    let timeout_ms = dialer.timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut end = start;
    while in_flight > 0 {
        let ready = ep.wait(&mut events, timeout_ms)?;
        if ready == 0 && end.elapsed() >= dialer.timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no response within {:?} on {in_flight} connection(s)",
                    dialer.timeout
                ),
            ));
        }
        for ev in &events[..ready] {
            let token = ev.u64;
            let c = &mut conns[token as usize];
            if c.sent < size {
                c.send(&ep, token, &req)?;
                continue;
            }
            if let Io::WouldBlock = c.receive(&mut resp)? {
                continue;
            }
            end = Instant::now();
            latency::record(&mut hist, end.duration_since(c.t0));
            c.got = 0;
            match budget.next() {
                Some(t0) => {
                    c.t0 = t0;
                    c.sent = 0;
                    c.send(&ep, token, &req)?;
                }
                None => in_flight -= 1,
            }
        }
    }
    let cpu_s = thread_cpu_s()? - cpu0;
    Ok(Out {
        hist,
        window: Window::new(start, end),
        cpu_s,
    })
}

/// CPU time of the calling thread so far, in seconds.
fn thread_cpu_s() -> io::Result<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the struct we pass.
    epoll::cvt(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) })?;
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_grows_with_work() {
        let a = thread_cpu_s().unwrap();
        let mut x = 1u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        assert_ne!(x, 0);
        assert!(thread_cpu_s().unwrap() > a);
    }
}
