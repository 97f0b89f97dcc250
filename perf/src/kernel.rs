//! The kernel work a proxy does per request: the `rr` scenario while its
//! proxy processes' system calls (by type), io_uring submissions and
//! context switches are counted, over exactly the timed part of the run.
//!
//! * System calls: `perf stat -a` on `raw_syscalls:sys_enter` (every
//!   system call: the total) and on the `syscalls:sys_enter_<name>`
//!   tracepoints of the types to break out (plus
//!   `io_uring:io_uring_submit_req`), each with a filter on the proxies'
//!   thread ids (`common_pid == <tid> || …`). System-wide counting on the
//!   CPUs keeps the cost off the proxies' context switches: the same events
//!   attached per thread (`perf stat -p`) are switched in and out with the
//!   thread, hundreds of them at every switch, which slowed a proxy's
//!   request rate several times over here. The events start disabled and
//!   are switched on and off through perf's control FIFO (`--control
//!   fifo:…`, acknowledged), around the timed requests. Threads that start
//!   after the window opened are not counted (the result says how many
//!   appeared).
//! * Which types: setting up and tearing down a tracepoint event costs
//!   perf tens of milliseconds of wall time on a loaded machine, and there
//!   are about 360 system calls. So [`discover`] (the suite runs it once
//!   per proxy column while warming up) counts a short exchange on all of
//!   them and remembers every type it saw; measured runs then count those
//!   types by name, and whatever else the total holds shows up as
//!   `other`. A run before any discovery counts every type (and learns).
//! * io_uring: a proxy built on io_uring (ringway) does most of its socket
//!   work as io_uring requests, not system calls; `io_uring_submit_req`
//!   counts every request it submits, so the two add up to its kernel
//!   operations.
//! * Context switches: voluntary and involuntary, summed over the proxies'
//!   threads from `/proc/<tid>/status` before and after (no perf needed).
//!
//! Without a usable `perf` (not installed, no tracefs), the system-call
//! counts are missing and the result says why; everything else is still
//! measured.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::{self, Processes};
use crate::rr::{self, RrResult};
use crate::supervise::{Spec, Supervised};

/// The tracepoint that counts io_uring requests.
const IO_URING_EVENT: &str = "io_uring:io_uring_submit_req";
const SYSCALL_EVENTS: &str = "syscalls:sys_enter_*";
/// Every system call: the total.
const TOTAL_EVENT: &str = "raw_syscalls:sys_enter";
/// The by-type row of the system calls the named types do not cover.
pub const OTHER: &str = "other";

/// The system-call types seen so far (by [`discover`] or any run that
/// counted every type): the ones later runs count by name.
static KNOWN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Counts every system-call type of `procs` over a short exchange (200
/// requests) and adds the types seen to those later runs count by name.
/// Returns them (this exchange's types).
pub fn discover(dialer: &Dialer, p: rr::Params, procs: &Processes) -> io::Result<Vec<String>> {
    let p = rr::Params {
        limit: rr::Limit::Count(200),
        ..p
    };
    let r = count(dialer, p, procs, &BTreeSet::new())?;
    r.syscalls
        .map(|m| m.into_keys().filter(|k| k != OTHER).collect())
        .ok_or_else(|| io::Error::other(format!("system calls {}", r.syscall_counter)))
}
#[derive(Clone, Debug, Serialize)]
pub struct KernelResult {
    /// The requests counted over (requests, rate, latency, proxy CPU).
    pub rr: RrResult,
    /// The proxies' threads at the start, whose work is counted.
    pub threads: usize,
    /// Threads that appeared during the window (not counted).
    pub new_threads: usize,
    pub voluntary_ctx_switches: u64,
    pub involuntary_ctx_switches: u64,
    /// System calls by name (`read`, `epoll_wait`, …); None when they
    /// could not be counted (see `syscall_counter`).
    pub syscalls: Option<BTreeMap<String, u64>>,
    pub syscalls_total: Option<u64>,
    pub io_uring_submissions: Option<u64>,
    /// How system calls were counted, or why they were not.
    pub syscall_counter: String,
    pub per_1k_requests: Per1k,
}

/// Everything above per 1000 requests.
#[derive(Clone, Debug, Serialize)]
pub struct Per1k {
    pub proxy_cpu_ms: Option<f64>,
    pub ctx_switches: f64,
    pub voluntary_ctx_switches: f64,
    pub involuntary_ctx_switches: f64,
    pub syscalls: Option<f64>,
    pub io_uring_submissions: Option<f64>,
    pub syscalls_by_type: BTreeMap<String, f64>,
}

/// Runs `rr` with `p` through `dialer` and counts the kernel work of
/// `procs` over its timed part: system calls by the types known so far
/// (every type when none is known yet), the rest as `other`.
pub fn run(dialer: &Dialer, p: rr::Params, procs: &Processes) -> io::Result<KernelResult> {
    let known = KNOWN.lock().unwrap().clone();
    count(dialer, p, procs, &known)
}

/// `named`: the system-call types to count by name (empty: every type).
fn count(
    dialer: &Dialer,
    p: rr::Params,
    procs: &Processes,
    named: &BTreeSet<String>,
) -> io::Result<KernelResult> {
    if procs.is_empty() {
        return Err(io::Error::other("kernel counts need proxy processes"));
    }
    let tids = procs.threads();
    let mut counter = Counter::start(&tids, named);
    let mut before = Vec::new();
    let r = rr::run_probed(dialer, p, procs, &mut |phase| match phase {
        rr::Phase::Start => {
            before = tids
                .iter()
                .map(|&t| procstat::ctx_switches(t).ok())
                .collect();
            counter.switch("enable");
        }
        rr::Phase::Stop => counter.switch("disable"),
    });
    // Context switches right after the window (perf's disable ack is
    // microseconds; the proxies are idle by then).
    let (mut vol, mut invol) = (0, 0);
    for (t, b) in tids.iter().zip(&before) {
        if let (Some((v0, i0)), Ok((v1, i1))) = (b, procstat::ctx_switches(*t)) {
            vol += v1.saturating_sub(*v0);
            invol += i1.saturating_sub(*i0);
        }
    }
    let new_threads = procs.threads().iter().filter(|t| !tids.contains(t)).count();
    let counted = counter.finish();
    let rr = r?;
    let (syscalls, total, io_uring, method) = match counted {
        Ok(c) => {
            if named.is_empty() {
                KNOWN
                    .lock()
                    .unwrap()
                    .extend(c.syscalls.keys().filter(|k| *k != OTHER).cloned());
            }
            (Some(c.syscalls), Some(c.total), c.io_uring, c.method)
        }
        Err(e) => (None, None, None, e),
    };
    let n = rr.requests.max(1) as f64;
    let per = |x: u64| x as f64 * 1000.0 / n;
    Ok(KernelResult {
        threads: tids.len(),
        new_threads,
        voluntary_ctx_switches: vol,
        involuntary_ctx_switches: invol,
        per_1k_requests: Per1k {
            proxy_cpu_ms: rr.proxy_cpu_s_per_1k_requests.map(|s| s * 1000.0),
            ctx_switches: per(vol + invol),
            voluntary_ctx_switches: per(vol),
            involuntary_ctx_switches: per(invol),
            syscalls: total.map(per),
            io_uring_submissions: io_uring.map(per),
            syscalls_by_type: syscalls
                .iter()
                .flatten()
                .map(|(k, &v)| (k.clone(), per(v)))
                .collect(),
        },
        syscalls_total: total,
        syscalls,
        io_uring_submissions: io_uring,
        syscall_counter: method,
        rr,
    })
}

/// Counts the system calls of the threads `tids` while `f` runs (perf's
/// events are switched on right before it and off right after): the
/// total, the `named` types by name (the rest as [`OTHER`]) and io_uring
/// submissions. For scenarios other than `rr` (e.g. new connections per
/// request). `named` should not be empty: an empty set sets up every
/// system-call tracepoint, which takes perf a long while. The count is an
/// error (why) when perf is not usable; `f` runs either way.
pub fn count_around<T>(
    tids: &[u32],
    named: &[&str],
    f: impl FnOnce() -> T,
) -> (T, Result<Counted, String>) {
    let named: BTreeSet<String> = named.iter().map(|s| s.to_string()).collect();
    let mut counter = Counter::start(tids, &named);
    counter.switch("enable");
    let out = f();
    counter.switch("disable");
    (out, counter.finish())
}

/// A `perf stat` around a window, or why there is none ("not counted:
/// …", for the result).
struct Counter(Result<PerfStat, String>);

impl Counter {
    fn start(tids: &[u32], named: &BTreeSet<String>) -> Counter {
        Counter(PerfStat::start(tids, named).map_err(|e| format!("not counted: {e:#}")))
    }

    /// `enable` or `disable` the events; a failure ends the counting.
    fn switch(&mut self, cmd: &str) {
        if let Ok(c) = &mut self.0 {
            if let Err(e) = c.command(cmd) {
                self.0 = Err(format!("not counted: perf {cmd}: {e:#}"));
            }
        }
    }

    fn finish(self) -> Result<Counted, String> {
        self.0
            .and_then(|c| c.finish().map_err(|e| format!("not counted: {e:#}")))
    }
}

/// What `perf stat` counted.
#[derive(Debug, Default, PartialEq)]
pub struct Counted {
    /// By system call name, counts above zero only; what the named types
    /// do not cover is [`OTHER`].
    pub syscalls: BTreeMap<String, u64>,
    /// Every system call.
    pub total: u64,
    pub io_uring: Option<u64>,
    pub method: String,
}

/// What one `perf stat -x,` output holds.
#[derive(Debug, Default, PartialEq)]
pub struct PerfCsv {
    /// `syscalls:sys_enter_<name>` counts above zero, by name.
    pub syscalls: BTreeMap<String, u64>,
    /// `raw_syscalls:sys_enter`.
    pub total: Option<u64>,
    pub io_uring: Option<u64>,
}

impl PerfCsv {
    /// By type, with the rest of the total as [`OTHER`]; and the total.
    pub fn by_type(mut self) -> (BTreeMap<String, u64>, u64) {
        let named: u64 = self.syscalls.values().sum();
        let total = self.total.unwrap_or(named).max(named);
        if total > named {
            self.syscalls.insert(OTHER.into(), total - named);
        }
        (self.syscalls, total)
    }
}

/// `perf stat -x,` output: one `count,unit,event,…` line per event.
/// Events that were not counted (`<not counted>`, `<not supported>`) are
/// left out; so are zero counts of a type.
pub fn parse_perf_csv(text: &str) -> PerfCsv {
    let mut syscalls = BTreeMap::new();
    let mut io_uring = None;
    let mut total = None;
    for line in text.lines() {
        let mut f = line.split(',');
        let (Some(count), Some(_unit), Some(event)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(count) = count.trim().parse::<u64>() else {
            continue;
        };
        if let Some(name) = event.strip_prefix("syscalls:sys_enter_") {
            if count > 0 {
                *syscalls.entry(name.to_string()).or_insert(0) += count;
            }
        } else if event == IO_URING_EVENT {
            io_uring = Some(io_uring.unwrap_or(0) + count);
        } else if event == TOTAL_EVENT {
            total = Some(total.unwrap_or(0) + count);
        }
    }
    PerfCsv {
        syscalls,
        total,
        io_uring,
    }
}

/// A tracepoint filter that matches the threads `tids`.
pub fn tid_filter(tids: &[u32]) -> String {
    tids.iter()
        .map(|t| format!("common_pid == {t}"))
        .collect::<Vec<_>>()
        .join(" || ")
}

/// A running `perf stat`, events disabled until [`PerfStat::command`]
/// `enable`.
struct PerfStat {
    perf: Supervised,
    ctl: File,
    ack: File,
    dir: PathBuf,
    method: String,
}

impl PerfStat {
    /// Counts `named` system-call types by name (empty: every type).
    fn start(tids: &[u32], named: &BTreeSet<String>) -> anyhow::Result<PerfStat> {
        anyhow::ensure!(!tids.is_empty(), "no threads to count");
        match Self::launch(tids, named, true) {
            Ok(p) => Ok(p),
            // A kernel without the io_uring tracepoints: system calls only.
            Err(e) => Self::launch(tids, named, false).map_err(|e2| e2.context(format!("{e:#}"))),
        }
    }

    fn launch(tids: &[u32], named: &BTreeSet<String>, io_uring: bool) -> anyhow::Result<PerfStat> {
        use anyhow::Context;
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ringway-perf-stat-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let (ctl, ack) = (dir.join("ctl"), dir.join("ack"));
        for f in [&ctl, &ack] {
            mkfifo(f)?;
        }
        let filter = tid_filter(tids);
        let mut args: Vec<String> = [
            "stat",
            "-a",
            "-x,",
            "--no-big-num",
            "-D",
            "-1",
            "-o",
            dir.join("out.csv").to_str().unwrap(),
            "--control",
            &format!("fifo:{},{}", ctl.display(), ack.display()),
        ]
        .map(String::from)
        .to_vec();
        let mut events = vec![TOTAL_EVENT.to_string()];
        match named.is_empty() {
            true => events.push(SYSCALL_EVENTS.into()),
            false => events.extend(named.iter().map(|n| format!("syscalls:sys_enter_{n}"))),
        }
        if io_uring {
            events.push(IO_URING_EVENT.into());
        }
        for e in &events {
            args.extend(["-e", e, "--filter", &filter].map(String::from));
        }
        // Ready at once: its control FIFO tells when it is set up (below).
        let perf = Supervised::start(None, Spec::new("perf", "perf", args, &dir))
            .context("cannot run perf (apt-get install linux-perf)")?;
        let mut p = PerfStat {
            perf,
            // Placeholders until the FIFOs open below.
            ctl: File::open("/dev/null")?,
            ack: File::open("/dev/null")?,
            dir,
            method: format!(
                "perf stat -a -e {TOTAL_EVENT} -e 'syscalls:sys_enter_<type>'{}, each with \
                 --filter 'common_pid == <each proxy thread> || …' ({})",
                if io_uring {
                    format!(" -e {IO_URING_EVENT}")
                } else {
                    String::new()
                },
                perf_version()
            ),
        };
        // perf opens the control FIFO before its events; the events take a
        // moment (hundreds of them), and perf answers the first command
        // only once they are set up.
        let deadline = Instant::now() + Duration::from_secs(60);
        p.ack = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&ack)?;
        p.ctl = loop {
            match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&ctl)
            {
                Ok(f) => break f,
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    p.alive_until(deadline)?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e.into()),
            }
        };
        // A no-op command proves perf is ready (and counting nothing yet).
        p.command("disable")?;
        Ok(p)
    }

    /// Fails if perf has exited (with its output) or `deadline` passed.
    fn alive_until(&mut self, deadline: Instant) -> anyhow::Result<()> {
        self.perf.check_alive()?;
        anyhow::ensure!(Instant::now() < deadline, "perf did not answer in time");
        Ok(())
    }

    /// Sends `enable` / `disable` and waits for perf's ack.
    fn command(&mut self, cmd: &str) -> anyhow::Result<()> {
        self.ctl.write_all(format!("{cmd}\n").as_bytes())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = Vec::new();
        loop {
            let mut buf = [0u8; 64];
            match self.ack.read(&mut buf) {
                Ok(n) if n > 0 => {
                    // perf writes "ack\n\0".
                    got.extend(buf[..n].iter().filter(|&&b| b != 0));
                    if got.contains(&b'\n') {
                        anyhow::ensure!(
                            got.starts_with(b"ack"),
                            "perf answered {:?} to {cmd}",
                            String::from_utf8_lossy(&got)
                        );
                        return Ok(());
                    }
                }
                // No writer yet (0) or nothing to read yet.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            self.alive_until(deadline)?;
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stops perf (SIGINT: it prints its counts) and reads them.
    fn finish(mut self) -> anyhow::Result<Counted> {
        // Closing hundreds of tracepoint events takes perf a few seconds.
        self.perf.interrupt(Duration::from_secs(120))?;
        let text = std::fs::read_to_string(self.dir.join("out.csv"))?;
        let csv = parse_perf_csv(&text);
        anyhow::ensure!(
            csv.total.is_some(),
            "perf printed no system-call count: {}",
            std::fs::read_to_string(self.perf.log()).unwrap_or_default()
        );
        let io_uring = csv.io_uring;
        let (syscalls, total) = csv.by_type();
        Ok(Counted {
            syscalls,
            total,
            io_uring,
            method: std::mem::take(&mut self.method),
        })
    }
}

impl Drop for PerfStat {
    fn drop(&mut self) {
        // perf itself is stopped as its field drops.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mkfifo(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.to_str().unwrap()).map_err(io::Error::other)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `perf --version`, or "perf".
fn perf_version() -> String {
    Command::new("perf")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "perf".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_stat_csv() {
        let text = "\n# started on Tue Dec  1\n\n\
            40400,,raw_syscalls:sys_enter,1532099953,100.00,,\n\
            20299,,syscalls:sys_enter_epoll_wait,1532099953,100.00,,\n\
            0,,syscalls:sys_enter_read,1532099953,100.00,,\n\
            <not counted>,,syscalls:sys_enter_write,0,0.00,,\n\
            20005,,syscalls:sys_enter_recvfrom,1532099953,100.00,,\n\
            12,,io_uring:io_uring_submit_req,1532099953,100.00,,\n";
        let csv = parse_perf_csv(text);
        assert_eq!(csv.syscalls.len(), 2, "{csv:?}");
        assert_eq!(csv.syscalls["epoll_wait"], 20299);
        assert_eq!(csv.syscalls["recvfrom"], 20005);
        assert_eq!(csv.io_uring, Some(12));
        assert_eq!(csv.total, Some(40400));
        // What the named types miss is "other".
        let (by_type, total) = csv.by_type();
        assert_eq!(total, 40400);
        assert_eq!(by_type[OTHER], 96);
        let csv = parse_perf_csv("1,,syscalls:sys_enter_read,1,100.00,,\n");
        assert_eq!(csv.syscalls["read"], 1);
        assert_eq!(csv.io_uring, None, "no io_uring line: not counted");
        assert_eq!(csv.total, None);
        let (by_type, total) = csv.by_type();
        assert_eq!((by_type.len(), total), (1, 1), "no total: the named ones");
    }

    #[test]
    fn filter_names_every_thread() {
        assert_eq!(
            tid_filter(&[10, 12]),
            "common_pid == 10 || common_pid == 12"
        );
    }
}
