//! HBONE under bulk load: many concurrent transfers through ringway A →
//! HBONE → ringway B with random sizes (1–64 MiB), random stream counts and
//! both directions, on two cores pinned, on one core, and unpinned. A
//! watchdog fails the test as soon as any direction of any transfer makes
//! no progress for a second, and reports where the bytes stopped (each
//! side's count, both nodes' socket queues, both ringways' threads and log
//! tails). Every byte is checked.
//!
//! It was written for issue 10: glommio parked an executor that still had
//! runnable tasks, and tunnels stopped for seconds; ringway now runs on
//! its own executor (`src/executor/`), and this test keeps it honest.
//! Before that fix the one-core scenario stalled in most runs.
//!
//! `RINGWAY_STRESS_SECS` sets each scenario's budget (default 12 s),
//! `RINGWAY_STRESS_SEED` replays a run (the seed is printed), and
//! `RINGWAY_STRESS_HOLD=1` keeps a stalled rig alive for ten minutes after
//! the report (ringway pids printed) for gdb, strace or /proc.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::nodes::{connect_from_client, Nodes, SERVER_IP};
use common::Ringway;

/// No progress for this long fails the test.
const STALL: Duration = Duration::from_secs(1);
/// With `RINGWAY_STRESS_HOLD`, how long a stall is kept for inspection.
const HOLD: Duration = Duration::from_secs(600);
const PORT: u16 = 9400;
/// Payload period: prime, so that lost, repeated or reordered bytes
/// (anything but a shift by whole periods) fail the comparison.
const PERIOD: usize = (1 << 20) + 7;
const IO_CHUNK: usize = 256 << 10;
/// The 24-byte header a client sends first: id, up size, down size.
const HEADER: usize = 24;

#[test]
fn bulk_hbone_transfers_never_stall_two_cores_pinned() {
    stress("stp", &["--cores", "2", "--pin"]);
}

#[test]
fn bulk_hbone_transfers_never_stall_one_core() {
    stress("st1", &["--cores", "1"]);
}

#[test]
fn bulk_hbone_transfers_never_stall_unpinned() {
    stress("stu", &["--cores", "2", "--no-pin"]);
}

/// One direction of one transfer: bytes the sender has handed to its
/// socket, bytes the receiver has checked.
#[derive(Default)]
struct Flow {
    size: u64,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Flow {
    fn new(size: u64) -> Self {
        Flow {
            size,
            ..Default::default()
        }
    }
    fn done(&self) -> bool {
        self.received.load(Ordering::Relaxed) >= self.size
    }
    fn progress(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

struct Transfer {
    id: u64,
    /// Client (node A) → server (node B).
    up: Flow,
    /// Server → client.
    down: Flow,
}

/// What the server threads know by transfer id.
type Registry = Arc<Mutex<std::collections::HashMap<u64, Arc<Transfer>>>>;

/// Where errors from any transfer thread land.
type Errors = Arc<Mutex<Vec<String>>>;

fn stress(tag: &str, extra: &[&str]) {
    let secs: u64 = std::env::var("RINGWAY_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let seed: u64 = std::env::var("RINGWAY_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("{tag}: seed {seed} (RINGWAY_STRESS_SEED to replay), {secs} s");
    let mut rng = fastrand::Rng::with_seed(seed);
    let pattern: Arc<Vec<u8>> = Arc::new((0..PERIOD).map(|_| rng.u8(..)).collect());

    let nodes = Nodes::new(tag, true, extra);
    let registry: Registry = Arc::default();
    let errors: Errors = Arc::default();
    let listener = nodes
        .b
        .enter(|| TcpListener::bind(format!("{SERVER_IP}:{PORT}")).unwrap());
    {
        let (registry, errors, pattern) = (registry.clone(), errors.clone(), pattern.clone());
        thread::spawn(move || serve(listener, registry, errors, pattern));
    }

    let started = Instant::now();
    let (mut rounds, mut transfers, mut bytes) = (0u32, 0u64, 0u64);
    let mut next_id = 1u64;
    while rounds < 2 || started.elapsed() < Duration::from_secs(secs) {
        let n = rng.usize(1..=12);
        let batch: Vec<Arc<Transfer>> = (0..n)
            .map(|_| {
                let mib = |rng: &mut fastrand::Rng| rng.u64(1 << 20..=64 << 20);
                let (up, down) = match rng.u8(0..4) {
                    0 => (mib(&mut rng), 0),
                    1 => (0, mib(&mut rng)),
                    _ => (mib(&mut rng), mib(&mut rng)),
                };
                let id = next_id;
                next_id += 1;
                Arc::new(Transfer {
                    id,
                    up: Flow::new(up),
                    down: Flow::new(down),
                })
            })
            .collect();
        for t in &batch {
            registry.lock().unwrap().insert(t.id, t.clone());
            bytes += t.up.size + t.down.size;
        }
        let clients: Vec<_> = batch
            .iter()
            .map(|t| {
                let stream = nodes
                    .a
                    .enter(|| connect_from_client(&format!("{SERVER_IP}:{PORT}")));
                let stream = stream.unwrap_or_else(|e| panic!("transfer {}: connect: {e}", t.id));
                let (t, errors, pattern) = (t.clone(), errors.clone(), pattern.clone());
                thread::spawn(move || {
                    if let Err(e) = client(stream, &t, &pattern) {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("transfer {} (client side): {e}", t.id));
                    }
                })
            })
            .collect();
        watch(&nodes, &batch, &errors, rounds);
        for c in clients {
            c.join().unwrap();
        }
        for t in &batch {
            registry.lock().unwrap().remove(&t.id);
        }
        rounds += 1;
        transfers += n as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{tag}: {rounds} rounds, {transfers} transfers, {} MiB in {secs:.1} s ({:.0} MiB/s), no stall",
        bytes >> 20,
        (bytes >> 20) as f64 / secs
    );
}

/// Sleeps until every transfer of the batch is done; panics with a report
/// when a direction stalls or a transfer fails.
fn watch(nodes: &Nodes, batch: &[Arc<Transfer>], errors: &Errors, round: u32) {
    let mut last: Vec<[((u64, u64), Instant); 2]> = batch
        .iter()
        .map(|t| {
            [
                (t.up.progress(), Instant::now()),
                (t.down.progress(), Instant::now()),
            ]
        })
        .collect();
    loop {
        if let Some(e) = errors.lock().unwrap().first() {
            panic!(
                "round {round}: {e}\n{}",
                report(nodes, batch, "a transfer failed")
            );
        }
        if batch.iter().all(|t| t.up.done() && t.down.done()) {
            return;
        }
        let now = Instant::now();
        for (t, seen) in batch.iter().zip(&mut last) {
            let [seen_up, seen_down] = seen;
            for (flow, seen, name) in [
                (&t.up, seen_up, "up (client → server)"),
                (&t.down, seen_down, "down (server → client)"),
            ] {
                let p = flow.progress();
                if flow.done() || p != seen.0 {
                    *seen = (p, now);
                } else if now - seen.1 >= STALL {
                    let why = format!(
                        "round {round}: transfer {} {name} made no progress for {:?}: sender handed {} of {} bytes to its socket, receiver got {}\n{}",
                        t.id,
                        now - seen.1,
                        p.0,
                        flow.size,
                        p.1,
                        report(nodes, batch, "stall")
                    );
                    if std::env::var_os("RINGWAY_STRESS_HOLD").is_some() {
                        eprintln!(
                            "{why}\nSTALL HELD for {HOLD:?}: ringway A pid {}, B pid {}",
                            nodes.a().pid(),
                            nodes.b().pid()
                        );
                        thread::sleep(HOLD);
                    }
                    panic!("{why}");
                }
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Everything that tells where bytes stopped.
fn report(nodes: &Nodes, batch: &[Arc<Transfer>], what: &str) -> String {
    let mut out = format!("--- {what}: every transfer of the round (sent/received of size)\n");
    for t in batch {
        let (u, d) = (t.up.progress(), t.down.progress());
        out += &format!(
            "  #{}: up {}/{} of {}, down {}/{} of {}\n",
            t.id, u.0, u.1, t.up.size, d.0, d.1, t.down.size
        );
    }
    for (name, ns) in [("node A", &nodes.a), ("node B", &nodes.b)] {
        let ss = Command::new("ip")
            .args(["netns", "exec", &ns.name, "ss", "-tnmi"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| e.to_string());
        out += &format!("--- {name}: ss -tnmi\n{ss}");
    }
    for (name, rw) in [("A", nodes.a()), ("B", nodes.b())] {
        out += &format!("--- ringway {name}: threads\n{}", threads(rw));
        out += &format!("--- ringway {name}: rings and eventfds\n{}", rings(rw));
        let log = std::fs::read_to_string(&rw.log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        out += &format!(
            "--- ringway {name}: last log lines\n{}\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n"),
            rw.stderr()
        );
    }
    out
}

/// The process's io_uring instances (queue heads and tails, completions
/// not yet reaped, polls in flight by opcode, overflow) and eventfd
/// counts: a lost wake-up shows as completions nobody reaps.
fn rings(rw: &Ringway) -> String {
    let mut out = String::new();
    let dir = format!("/proc/{}/fd", rw.pid());
    let Ok(fds) = std::fs::read_dir(&dir) else {
        return format!("cannot read {dir}\n");
    };
    let mut fds: Vec<_> = fds.flatten().collect();
    fds.sort_by_key(|f| f.file_name().to_string_lossy().parse::<u32>().unwrap_or(0));
    for fd in fds {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        let name = fd.file_name().to_string_lossy().into_owned();
        let info = std::fs::read_to_string(format!("/proc/{}/fdinfo/{name}", rw.pid()))
            .unwrap_or_default();
        if target.contains("io_uring") {
            let keep: Vec<&str> = info
                .lines()
                .filter(|l| {
                    [
                        "SqHead", "SqTail", "CqMask", "CqHead", "CqTail", "CQEs", "SQEs",
                    ]
                    .iter()
                    .any(|k| l.starts_with(k))
                })
                .map(str::trim)
                .collect();
            let mut ops = std::collections::BTreeMap::<&str, usize>::new();
            let mut overflow = 0;
            let mut section = "";
            for l in info.lines() {
                if l.starts_with("PollList") || l.starts_with("CqOverflowList") {
                    section = l;
                } else if section.starts_with("PollList") && l.trim_start().starts_with("op=") {
                    let op = l.trim_start().split(',').next().unwrap_or("");
                    *ops.entry(op).or_default() += 1;
                } else if section.starts_with("CqOverflowList") && l.contains("user_data") {
                    overflow += 1;
                } else if !l.starts_with(' ') {
                    section = "";
                }
            }
            out += &format!(
                "  fd {name} io_uring: {} polls {ops:?} overflowed {overflow}\n",
                keep.join(" ")
            );
        } else if target.contains("eventfd") {
            let count = info
                .lines()
                .find(|l| l.starts_with("eventfd-count"))
                .unwrap_or("?")
                .trim();
            out += &format!("  fd {name} eventfd: {count}\n");
        }
    }
    out
}

/// Each thread of a ringway: name, state, kernel wait channel.
fn threads(rw: &Ringway) -> String {
    let mut out = String::new();
    let dir = format!("/proc/{}/task", rw.pid());
    let Ok(tasks) = std::fs::read_dir(&dir) else {
        return format!("cannot read {dir}\n");
    };
    for task in tasks.flatten() {
        let p = task.path();
        let read = |f: &str| {
            std::fs::read_to_string(p.join(f))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let stat = read("stat");
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        out += &format!(
            "  {} {}: {state} wchan={}\n",
            task.file_name().to_string_lossy(),
            read("comm"),
            read("wchan")
        );
    }
    out
}

/// Node B's application: per connection, read the header, then send the
/// down bytes and check the up bytes at the same time.
fn serve(l: TcpListener, registry: Registry, errors: Errors, pattern: Arc<Vec<u8>>) {
    for s in l.incoming() {
        let Ok(mut s) = s else { return };
        let (registry, errors, pattern) = (registry.clone(), errors.clone(), pattern.clone());
        thread::spawn(move || {
            let run = || -> Result<(), String> {
                set_timeouts(&s)?;
                let mut h = [0u8; HEADER];
                s.read_exact(&mut h)
                    .map_err(|e| format!("reading the header: {e}"))?;
                let word = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().unwrap());
                let id = word(0);
                let t = registry
                    .lock()
                    .unwrap()
                    .get(&id)
                    .cloned()
                    .ok_or(format!("unknown transfer {id}"))?;
                if (word(1), word(2)) != (t.up.size, t.down.size) {
                    return Err(format!("transfer {id}: header corrupted: {h:?}"));
                }
                duplex(s, &t, false, &pattern)
                    .map_err(|e| format!("transfer {id} (server side): {e}"))
            };
            if let Err(e) = run() {
                errors.lock().unwrap().push(e);
            }
        });
    }
}

/// Node A's application: header, then up and down at the same time.
fn client(mut s: TcpStream, t: &Arc<Transfer>, pattern: &Arc<Vec<u8>>) -> Result<(), String> {
    set_timeouts(&s)?;
    let mut h = Vec::with_capacity(HEADER);
    for w in [t.id, t.up.size, t.down.size] {
        h.extend_from_slice(&w.to_le_bytes());
    }
    s.write_all(&h).map_err(|e| format!("header: {e}"))?;
    duplex(s, t, true, pattern)
}

/// Sends this side's direction of `t` and checks the other one, at the
/// same time (the client sends up, the server down).
fn duplex(
    mut s: TcpStream,
    t: &Arc<Transfer>,
    client: bool,
    pattern: &Arc<Vec<u8>>,
) -> Result<(), String> {
    let w = s.try_clone().map_err(|e| e.to_string())?;
    let sender = {
        let (t, pattern) = (t.clone(), pattern.clone());
        thread::spawn(move || match client {
            true => send(w, &t.up, up_offset(t.id), &pattern),
            false => send(w, &t.down, down_offset(t.id), &pattern),
        })
    };
    let got = match client {
        true => receive(&mut s, &t.down, down_offset(t.id), pattern),
        false => receive(&mut s, &t.up, up_offset(t.id), pattern),
    };
    got.and(sender.join().unwrap())
}

/// Where in the pattern each direction starts: distinct per transfer, so
/// bytes delivered to the wrong stream fail the comparison too.
fn up_offset(id: u64) -> usize {
    (id as usize * 2 * 7919) % PERIOD
}
fn down_offset(id: u64) -> usize {
    (id as usize * 2 * 7919 + 7919) % PERIOD
}

fn set_timeouts(s: &TcpStream) -> Result<(), String> {
    // Far beyond the watchdog: only there so no thread outlives a failure.
    let t = Some(Duration::from_secs(30));
    s.set_read_timeout(t)
        .and_then(|_| s.set_write_timeout(t))
        .map_err(|e| e.to_string())
}

/// Writes `flow.size` pattern bytes from `start`, then FIN.
fn send(mut s: TcpStream, flow: &Flow, start: usize, pattern: &[u8]) -> Result<(), String> {
    let mut pos = 0u64;
    while pos < flow.size {
        let off = (start + (pos % PERIOD as u64) as usize) % PERIOD;
        let n = (PERIOD - off).min(IO_CHUNK).min((flow.size - pos) as usize);
        let w = s
            .write(&pattern[off..off + n])
            .map_err(|e| format!("send after {pos} of {} bytes: {e}", flow.size))?;
        pos += w as u64;
        flow.sent.store(pos, Ordering::Relaxed);
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))
}

/// Reads to EOF, comparing every byte with the pattern from `start`.
fn receive(s: &mut TcpStream, flow: &Flow, start: usize, pattern: &[u8]) -> Result<(), String> {
    let mut buf = vec![0u8; IO_CHUNK];
    let mut pos = 0u64;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("receive after {pos} of {} bytes: {e}", flow.size))?;
        if n == 0 {
            break;
        }
        if pos + n as u64 > flow.size {
            return Err(format!(
                "{} bytes past the end ({} expected)",
                pos + n as u64 - flow.size,
                flow.size
            ));
        }
        let mut got = &buf[..n];
        let mut at = pos;
        while !got.is_empty() {
            let off = (start + (at % PERIOD as u64) as usize) % PERIOD;
            let k = (PERIOD - off).min(got.len());
            if got[..k] != pattern[off..off + k] {
                return Err(format!(
                    "bytes {at}..{} differ from what was sent",
                    at + k as u64
                ));
            }
            got = &got[k..];
            at += k as u64;
        }
        pos += n as u64;
        flow.received.store(pos, Ordering::Relaxed);
    }
    if pos != flow.size {
        return Err(format!("EOF after {pos} of {} bytes", flow.size));
    }
    Ok(())
}
