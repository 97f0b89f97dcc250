//! Istio's TCP metrics (`istio_tcp_*` with Istio's CommonTrafficLabels, in
//! Istio's order), counted per core and merged when scraped.
//!
//! - Each core keeps its own label sets and counters: a connection finds
//!   its set in a core-local map (keyed by the rendered label text, built in
//!   a reused buffer: no allocation once the set exists) and keeps an `Arc`
//!   to it. Nothing is shared between cores per connection or per byte.
//! - Counters are atomics written by their core alone (a relaxed load and
//!   store, a plain `mov` on x86: no locked instruction) and read by the
//!   scraper on the control thread, which never makes a core wait.
//! - Bytes are added as they move, so a long-lived connection shows in
//!   every scrape, not only when it closes.
//! - A new label set reaches the scraper over a lock-free queue.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringway_controlplane::model::{Service, Workload};
use ringway_controlplane::security::crl::{CrlStats, CrlStore};

use crate::io::count::Counter;
use crate::telemetry::dns_metrics::{CoreDnsMetrics, DnsHub};
use ringway_controlplane::sources::xds::{
    TerminationReason, XdsMetrics, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};

/// Istio's `response_flags`, as ztunnel reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFlag {
    None,
    /// Refused by authorization policy (or a bypassed waypoint).
    Deny,
    /// The upstream could not be connected.
    Connect,
    TlsFailure,
    H2HandshakeFailure,
    IdentityError,
}

const FLAGS: [(&str, ResponseFlag); 6] = [
    ("-", ResponseFlag::None),
    ("DENY", ResponseFlag::Deny),
    ("CONNECT", ResponseFlag::Connect),
    ("TLS_FAILURE", ResponseFlag::TlsFailure),
    ("H2_HANDSHAKE_FAILURE", ResponseFlag::H2HandshakeFailure),
    ("IDENTITY_ERROR", ResponseFlag::IdentityError),
];

impl ResponseFlag {
    fn index(self) -> usize {
        FLAGS
            .iter()
            .position(|(_, f)| *f == self)
            .expect("every flag is listed")
    }

    /// The flag for a failed connection, from the reason the access log
    /// gives (the paths word their failures consistently: `401:` for a
    /// policy denial, `503: connect to` for an upstream that did not
    /// answer, ...).
    pub fn of_failure(why: &str) -> ResponseFlag {
        let lower = why.to_ascii_lowercase();
        if why.starts_with("401")
            || lower.contains("authorization policy")
            || lower.contains("denied")
            || lower.contains("waypoint")
        {
            ResponseFlag::Deny
        } else if lower.contains("tls handshake") {
            ResponseFlag::TlsFailure
        } else if lower.contains("http/2 handshake") {
            ResponseFlag::H2HandshakeFailure
        } else if lower.contains("identity") || lower.contains("certificate") {
            ResponseFlag::IdentityError
        } else if lower.contains("connect") || why.starts_with("503") {
            ResponseFlag::Connect
        } else {
            ResponseFlag::None
        }
    }
}

/// Who reports: the proxy on the client's side or on the server's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reporter {
    Source,
    Destination,
}

/// What a connection's labels are made of.
pub struct ConnLabels<'a> {
    pub reporter: Reporter,
    pub src: Option<&'a Workload>,
    /// The source's identity as the mTLS handshake showed it (or, outbound,
    /// as this proxy presents it).
    pub src_principal: Option<&'a dyn std::fmt::Display>,
    pub dst: Option<&'a Workload>,
    pub dst_principal: Option<&'a dyn std::fmt::Display>,
    pub service: Option<&'a Service>,
    /// Carried over mTLS (HBONE).
    pub mtls: bool,
}

/// One label set's counters on one core.
pub struct TcpCounters {
    /// The rendered labels before `response_flags`, a NUL, the rest.
    labels: Box<str>,
    pub opened: Counter,
    /// `istio_tcp_sent_bytes_total` (as ztunnel counts it: outbound, what
    /// the client sent; inbound, what went back to it).
    pub sent: Arc<Counter>,
    pub received: Arc<Counter>,
    closed: [Counter; FLAGS.len()],
    failed: [Counter; FLAGS.len()],
}

impl TcpCounters {
    /// The connection ended; `failed` with its flag.
    pub fn close(&self, flag: ResponseFlag, failed: bool) {
        self.closed[flag.index()].add(1);
        if failed {
            self.failed[flag.index()].add(1);
        }
    }
}

/// Per-core gauges and counters that are not per label set.
#[derive(Default, Debug)]
pub struct CoreStats {
    pub open_connections: Counter,
    pub task_panics: Counter,
    pub late_rejections: Counter,
    /// The snapshot version the core serves.
    pub snapshot_version: Counter,
    /// Pooled outbound HBONE connections.
    pub pool_connections: Counter,
    /// Splice pipes and copy buffers held (pooled or in use).
    pub pipes_held: Counter,
    pub buffers_held: Counter,
    /// Tasks alive on the core.
    pub tasks: Counter,
    /// What the core's ring did (uring::RingStats, copied once a second).
    pub ring_enters: Counter,
    pub ring_completions: Counter,
    pub ring_sends: Counter,
    pub ring_quiet_sends: Counter,
    pub ring_short_sends: Counter,
    pub ring_starved: Counter,
    pub ring_compacted_bytes: Counter,
    /// Receive buffers in the kernel's hands (the rest are being read).
    pub ring_free_buffers: Counter,
    /// In-pod mode: enrolled pods whose listeners the core serves.
    pub pods: Counter,
    /// From a config message's arrival to this core serving the snapshot
    /// built from it.
    pub propagation: Propagation,
    /// DNS: datagrams from upstream resolvers that matched no query in
    /// flight (unknown ID, another sender, another question).
    pub dns_stray_replies: Counter,
    /// DNS: queries answered SERVFAIL because the core already had its cap
    /// of forwarded queries in flight.
    pub dns_pending_full: Counter,
    /// DNS: TCP clients closed at once because the core had its cap.
    pub dns_tcp_refused: Counter,
    /// Inbound HBONE: dials to workloads in flight (gauge).
    pub dials_in_flight: Counter,
    /// Inbound HBONE: streams refused (REFUSED_STREAM) because their
    /// connection or the core had its cap of dials in flight.
    pub dials_refused: Counter,
    /// Inbound HBONE: dials abandoned because the peer reset the stream.
    pub dials_abandoned: Counter,
    /// Inbound HBONE: connections sent GOAWAY (ENHANCE_YOUR_CALM) for
    /// resetting too many streams before their answer.
    pub calm_goaways: Counter,
    /// Inbound HBONE connections cut because the client did not ACK our
    /// SETTINGS (answer the first PING) within --handshake-timeout.
    pub hbone_settings_ack_timeouts: Counter,
    /// Inbound HBONE connections closed for an unanswered keepalive PING.
    pub hbone_keepalive_timeouts: Counter,
    /// Inbound HBONE connections closed for --hbone-idle-timeout.
    pub hbone_idle_closes: Counter,
    /// Times a listener of each path (`TrafficPath::index`) stopped
    /// accepting because the core had its cap of connections.
    pub conn_cap_reached: [Counter; 4],
    /// Connections of each path reset at accept because their peer held
    /// its share of the core's connections.
    pub peer_cap_refused: [Counter; 4],
    /// accept4 failed with EMFILE/ENFILE: the fd table was full.
    pub accept_fd_exhausted: Counter,
    /// Connections (and inbound HBONE streams) of each path that failed or
    /// were refused: every one, whether its log line was written or not.
    pub conn_failures: [Counter; 4],
    /// Connections of each path closed by `--idle-timeout`.
    pub idle_closes: [Counter; 4],
    /// Inbound HBONE: bytes held for peers, counted against
    /// --memory-budget-per-core (gauge).
    pub memory_held: Counter,
    /// Inbound HBONE connections not reading because of the budget (gauge).
    pub memory_paused: Counter,
    /// Times an inbound HBONE connection stopped reading for the budget.
    pub memory_pauses: Counter,
}

/// Bucket bounds of [`Propagation`], in microseconds.
pub const PROPAGATION_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// A Prometheus histogram of config propagation times, written by its
/// core only (single writer: plain counters, no locked instructions).
#[derive(Default, Debug)]
pub struct Propagation {
    /// Cumulative counts are rendered; these are per bucket (the last one
    /// is +Inf).
    buckets: [Counter; PROPAGATION_BUCKETS_US.len() + 1],
    sum_us: Counter,
}

impl Propagation {
    pub fn record(&self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = PROPAGATION_BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].add(1);
        self.sum_us.add(us);
    }

    fn render(&self, out: &mut String, name: &str, core: usize) {
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.get();
            match PROPAGATION_BUCKETS_US.get(i) {
                Some(us) => {
                    let le = *us as f64 / 1e6;
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{core=\"{core}\",le=\"{le}\"}} {cumulative}"
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{core=\"{core}\",le=\"+Inf\"}} {cumulative}"
                    );
                }
            }
        }
        let sum = self.sum_us.get() as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{core=\"{core}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{core=\"{core}\"}} {cumulative}");
    }
}

/// A core's metrics.
pub struct CoreMetrics {
    /// False with --no-metrics: connections are not counted at all.
    enabled: bool,
    sets: RefCell<HashMap<Box<str>, Arc<TcpCounters>>>,
    scratch: RefCell<String>,
    hub: crossbeam_channel::Sender<Arc<TcpCounters>>,
    pub stats: Arc<CoreStats>,
    /// The DNS proxy's series.
    pub dns: CoreDnsMetrics,
}

impl CoreMetrics {
    /// The counters of `l`'s label set on this core (created, and handed to
    /// the scraper, the first time); None with --no-metrics.
    pub fn counters(&self, l: &ConnLabels<'_>) -> Option<Arc<TcpCounters>> {
        if !self.enabled {
            return None;
        }
        let mut key = self.scratch.borrow_mut();
        key.clear();
        render_labels(&mut key, l);
        if let Some(c) = self.sets.borrow().get(key.as_str()) {
            return Some(c.clone());
        }
        let counters = Arc::new(TcpCounters {
            labels: key.as_str().into(),
            opened: Counter::default(),
            sent: Arc::default(),
            received: Arc::default(),
            closed: Default::default(),
            failed: Default::default(),
        });
        self.sets
            .borrow_mut()
            .insert(key.as_str().into(), counters.clone());
        // Unbounded and lock-free: a core never waits on the scraper.
        let _ = self.hub.send(counters.clone());
        Some(counters)
    }
}

/// The scraper's side: every core's label sets and stats.
pub struct MetricsHub {
    new_sets: crossbeam_channel::Receiver<Arc<TcpCounters>>,
    sender: crossbeam_channel::Sender<Arc<TcpCounters>>,
    sets: Mutex<Vec<Arc<TcpCounters>>>,
    cores: Mutex<Vec<Arc<CoreStats>>>,
    dns: DnsHub,
}

impl Default for MetricsHub {
    fn default() -> Self {
        let (sender, new_sets) = crossbeam_channel::unbounded();
        MetricsHub {
            new_sets,
            sender,
            sets: Mutex::default(),
            cores: Mutex::default(),
            dns: DnsHub::default(),
        }
    }
}

/// Process-level values the scrape adds (read on the control thread).
pub struct ProcessStats {
    pub open_fds: u64,
    pub max_fds: u64,
    pub log_lines_dropped: u64,
}

impl ProcessStats {
    pub fn read() -> ProcessStats {
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass.
        let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur
        } else {
            0
        };
        ProcessStats {
            open_fds,
            max_fds,
            log_lines_dropped: crate::telemetry::logfmt::dropped_lines() as u64,
        }
    }
}

/// A per-core series: name, type, help, and how to read it.
type PerCore = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CoreStats) -> u64,
);

const TCP_METRICS: [(&str, &str); 5] = [
    (
        "istio_tcp_connections_opened_total",
        "The total number of TCP connections opened",
    ),
    (
        "istio_tcp_connections_closed_total",
        "The total number of TCP connections closed",
    ),
    (
        "istio_tcp_received_bytes_total",
        "The size of total bytes received during request in case of a TCP connection",
    ),
    (
        "istio_tcp_sent_bytes_total",
        "The size of total bytes sent during response in case of a TCP connection",
    ),
    (
        "istio_tcp_connections_failed_total",
        "The total number of TCP connections that failed",
    ),
];

impl MetricsHub {
    /// Every core's stats, in core order.
    pub fn cores(&self) -> Vec<Arc<CoreStats>> {
        self.cores.lock().expect("not poisoned").clone()
    }

    /// The metrics of one more core; `enabled` false counts nothing
    /// (--no-metrics).
    pub fn core(&self, enabled: bool) -> CoreMetrics {
        let stats = Arc::new(CoreStats::default());
        self.cores.lock().expect("not poisoned").push(stats.clone());
        CoreMetrics {
            enabled,
            sets: RefCell::default(),
            scratch: RefCell::new(String::with_capacity(1024)),
            hub: self.sender.clone(),
            stats,
            dns: self.dns.core(enabled),
        }
    }

    /// The Prometheus text exposition of everything, label sets merged
    /// across cores.
    pub fn render(&self, process: &ProcessStats, xds: Option<&XdsMetrics>) -> String {
        let mut sets = self.sets.lock().expect("not poisoned");
        sets.extend(self.new_sets.try_iter());
        // labels → [opened, closed per flag, received, sent, failed per flag]
        let mut merged: BTreeMap<&str, [u64; 3 + 2 * FLAGS.len()]> = BTreeMap::new();
        for c in sets.iter() {
            let m = merged.entry(&c.labels).or_default();
            m[0] += c.opened.get();
            m[1] += c.received.get();
            m[2] += c.sent.get();
            for i in 0..FLAGS.len() {
                m[3 + i] += c.closed[i].get();
                m[3 + FLAGS.len() + i] += c.failed[i].get();
            }
        }
        let mut out = String::with_capacity(256 + merged.len() * 5 * 700);
        let series = |out: &mut String, name: &str, labels: &str, flag: &str, v: u64| {
            let (before, after) = labels.split_once('\0').unwrap_or((labels, ""));
            let _ = writeln!(
                out,
                "{name}{{{before},response_flags=\"{flag}\",{after}}} {v}"
            );
        };
        for (m, (name, help)) in TCP_METRICS.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (labels, v) in &merged {
                match m {
                    0 => series(&mut out, name, labels, "-", v[0]),
                    2 => series(&mut out, name, labels, "-", v[1]),
                    3 => series(&mut out, name, labels, "-", v[2]),
                    _ => {
                        let base = if m == 1 { 3 } else { 3 + FLAGS.len() };
                        for (i, (flag, _)) in FLAGS.iter().enumerate() {
                            // "-" always for closed (like opened), others once seen.
                            if v[base + i] > 0 || (m == 1 && i == 0) {
                                series(&mut out, name, labels, flag, v[base + i]);
                            }
                        }
                    }
                }
            }
        }
        // Open connections per reporter: opened minus closed.
        let mut open: BTreeMap<&str, u64> = BTreeMap::new();
        for (labels, v) in &merged {
            let reporter = labels
                .strip_prefix("reporter=\"")
                .and_then(|r| r.split('"').next())
                .unwrap_or("unknown");
            let closed: u64 = v[3..3 + FLAGS.len()].iter().sum();
            *open.entry(reporter).or_default() += v[0].saturating_sub(closed);
        }
        let name = "istio_tcp_sockets_open";
        let _ = writeln!(
            out,
            "# HELP {name} The current number of open TCP connections.\n# TYPE {name} gauge"
        );
        for (reporter, n) in open {
            let _ = writeln!(out, "{name}{{reporter=\"{reporter}\"}} {n}");
        }
        let cores = self.cores.lock().expect("not poisoned");
        let gauge = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} {kind}");
        };
        gauge(
            &mut out,
            "istio_build",
            "gauge",
            "Istio component build info",
        );
        let _ = writeln!(
            out,
            "istio_build{{component=\"ringway\",tag=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        gauge(
            &mut out,
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
        );
        let _ = writeln!(out, "process_open_fds {}", process.open_fds);
        gauge(
            &mut out,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors",
        );
        let _ = writeln!(out, "process_max_fds {}", process.max_fds);
        gauge(
            &mut out,
            "ringway_log_lines_dropped_total",
            "counter",
            "Log lines dropped because stdout did not keep up",
        );
        let _ = writeln!(
            out,
            "ringway_log_lines_dropped_total {}",
            process.log_lines_dropped
        );
        gauge(
            &mut out,
            "ringway_log_lines_suppressed_total",
            "counter",
            "Log lines the cores' rate limits held back (each reported in a \"suppressed N\" line)",
        );
        let _ = writeln!(
            out,
            "ringway_log_lines_suppressed_total {}",
            crate::telemetry::ratelog::suppressed_total()
        );
        self.dns.render(&mut out);
        let per_core: [PerCore; 30] = [
            (
                "ringway_core_open_connections",
                "gauge",
                "Connections open on a core (HBONE streams count one each)",
                |s| s.open_connections.get(),
            ),
            (
                "ringway_core_task_panics_total",
                "counter",
                "Connection tasks on a core that panicked and were ended",
                |s| s.task_panics.get(),
            ),
            (
                "ringway_core_late_rejections_total",
                "counter",
                "Open connections a core closed because a new policy denied them",
                |s| s.late_rejections.get(),
            ),
            (
                "ringway_core_hbone_pool_connections",
                "gauge",
                "Pooled outbound HBONE connections on a core",
                |s| s.pool_connections.get(),
            ),
            (
                "ringway_core_snapshot_version",
                "gauge",
                "The config snapshot version a core serves",
                |s| s.snapshot_version.get(),
            ),
            (
                "ringway_core_pipes_held",
                "gauge",
                "Splice pipes a core holds, pooled or in use",
                |s| s.pipes_held.get(),
            ),
            (
                "ringway_core_buffers_held",
                "gauge",
                "Copy buffers a core holds, pooled or in use",
                |s| s.buffers_held.get(),
            ),
            (
                "ringway_core_tasks",
                "gauge",
                "Tasks alive on a core (the counterpart of tokio's alive tasks)",
                |s| s.tasks.get(),
            ),
            (
                "ringway_core_ring_enters_total",
                "counter",
                "io_uring_enter calls a core made (to sleep, submit, or run deferred completions)",
                |s| s.ring_enters.get(),
            ),
            (
                "ringway_core_ring_completions_total",
                "counter",
                "Completions a core reaped from its ring",
                |s| s.ring_completions.get(),
            ),
            (
                "ringway_core_ring_sends_total",
                "counter",
                "Socket sends a core submitted on its ring",
                |s| s.ring_sends.get(),
            ),
            (
                "ringway_core_ring_quiet_sends_total",
                "counter",
                "Sends submitted without a completion unless short (no wake-up of their own)",
                |s| s.ring_quiet_sends.get(),
            ),
            (
                "ringway_core_ring_short_sends_total",
                "counter",
                "Sends a socket took only part of: the rest waited for room",
                |s| s.ring_short_sends.get(),
            ),
            (
                "ringway_core_ring_recv_starved_total",
                "counter",
                "Receives ended because the core's receive buffer ring was empty",
                |s| s.ring_starved.get(),
            ),
            (
                "ringway_core_ring_compacted_bytes_total",
                "counter",
                "Received bytes copied off the buffer ring because their reader had not taken them",
                |s| s.ring_compacted_bytes.get(),
            ),
            (
                "ringway_core_ring_free_recv_buffers",
                "gauge",
                "Receive buffers in the kernel's hands on a core",
                |s| s.ring_free_buffers.get(),
            ),
            (
                "ringway_core_pods",
                "gauge",
                "In-pod mode: enrolled pods a core accepts for",
                |s| s.pods.get(),
            ),
            (
                "ringway_core_dns_stray_replies_total",
                "counter",
                "Datagrams from upstream resolvers that matched no forwarded query (dropped)",
                |s| s.dns_stray_replies.get(),
            ),
            (
                "ringway_core_dns_pending_full_total",
                "counter",
                "DNS queries answered SERVFAIL because the core had its cap of forwarded queries in flight",
                |s| s.dns_pending_full.get(),
            ),
            (
                "ringway_core_dns_tcp_refused_total",
                "counter",
                "DNS TCP clients closed at once because the core had its cap of connections",
                |s| s.dns_tcp_refused.get(),
            ),
            (
                "ringway_core_inbound_dials_in_flight",
                "gauge",
                "Inbound HBONE dials to workloads in flight on a core",
                |s| s.dials_in_flight.get(),
            ),
            (
                "ringway_core_inbound_dials_refused_total",
                "counter",
                "Inbound HBONE streams refused (REFUSED_STREAM) at the cap of dials in flight per connection or per core",
                |s| s.dials_refused.get(),
            ),
            (
                "ringway_core_inbound_dials_abandoned_total",
                "counter",
                "Inbound HBONE dials abandoned because the peer reset the stream before it was answered",
                |s| s.dials_abandoned.get(),
            ),
            (
                "ringway_core_inbound_calm_goaways_total",
                "counter",
                "Inbound HBONE connections sent GOAWAY (ENHANCE_YOUR_CALM): by ringway for resetting too many streams before their answer, or by h2's own guards (streams reset before they were accepted, header floods)",
                |s| s.calm_goaways.get(),
            ),
            (
                "ringway_core_hbone_settings_ack_timeouts_total",
                "counter",
                "Inbound HBONE connections cut: no SETTINGS ACK within the handshake timeout",
                |s| s.hbone_settings_ack_timeouts.get(),
            ),
            (
                "ringway_core_hbone_keepalive_timeouts_total",
                "counter",
                "Inbound HBONE connections closed: a keepalive PING went unanswered",
                |s| s.hbone_keepalive_timeouts.get(),
            ),
            (
                "ringway_core_hbone_idle_closes_total",
                "counter",
                "Inbound HBONE connections closed after the idle timeout with no open stream",
                |s| s.hbone_idle_closes.get(),
            ),
            (
                "ringway_core_hbone_memory_held_bytes",
                "gauge",
                "Inbound HBONE bytes a core holds for peers (received, not yet taken by the workload), counted against --memory-budget-per-core",
                |s| s.memory_held.get(),
            ),
            (
                "ringway_core_hbone_memory_paused_connections",
                "gauge",
                "Inbound HBONE connections whose reads a core holds back because of its memory budget",
                |s| s.memory_paused.get(),
            ),
            (
                "ringway_core_hbone_memory_pauses_total",
                "counter",
                "Times an inbound HBONE connection stopped reading because of the core's memory budget",
                |s| s.memory_pauses.get(),
            ),
        ];
        if let Some(x) = xds {
            render_xds(&mut out, x);
        }
        for (name, kind, help, get) in per_core {
            gauge(&mut out, name, kind, help);
            for (i, s) in cores.iter().enumerate() {
                let _ = writeln!(out, "{name}{{core=\"{i}\"}} {}", get(s));
            }
        }
        type PerPath = (&'static str, &'static str, fn(&CoreStats) -> &[Counter; 4]);
        let per_path: [PerPath; 4] = [
            (
                "ringway_core_connection_failures_total",
                "Connections (inbound HBONE: streams) a core refused or that failed, per path; their access-log lines are rate-limited, this count is not",
                |s| &s.conn_failures,
            ),
            (
                "ringway_core_idle_closes_total",
                "Connections a core closed because no byte moved either way for --idle-timeout, per path",
                |s| &s.idle_closes,
            ),
            (
                "ringway_core_connection_cap_reached_total",
                "Times a core stopped accepting on a listener because it had its cap of connections (per core and path)",
                |s| &s.conn_cap_reached,
            ),
            (
                "ringway_core_peer_cap_refused_total",
                "Connections a core reset at accept because their peer held its share of the core's connections (per core and path)",
                |s| &s.peer_cap_refused,
            ),
        ];
        for (name, help, get) in per_path {
            gauge(&mut out, name, "counter", help);
            for (i, s) in cores.iter().enumerate() {
                for path in crate::io::listener::TrafficPath::ALL {
                    let n = get(s)[path.index()].get();
                    let _ = writeln!(out, "{name}{{core=\"{i}\",path=\"{}\"}} {n}", path.name());
                }
            }
        }
        let name = "ringway_core_accept_fd_exhausted_total";
        gauge(
            &mut out,
            name,
            "counter",
            "Times accept failed on a core because the process or system was out of file descriptors",
        );
        for (i, s) in cores.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{core=\"{i}\"}} {}",
                s.accept_fd_exhausted.get()
            );
        }
        render_side_ports(&mut out);
        let name = "ringway_core_config_propagation_seconds";
        gauge(
            &mut out,
            name,
            "histogram",
            "From a config message's arrival (xDS response, changed file) to a core serving the snapshot built from it",
        );
        for (i, s) in cores.iter().enumerate() {
            s.propagation.render(&mut out, name, i);
        }
        render_crl(&mut out, &CrlStore::global().stats());
        out
    }
}

/// The side ports' bounds (15021, 15020, 15000): connections displaced at
/// the cap, and closed for a slow request or an answer not taken.
fn render_side_ports(out: &mut String) {
    use crate::telemetry::http::{SidePort, SidePortStats};
    use std::sync::atomic::{AtomicU64, Ordering};
    type Series = (&'static str, &'static str, fn(&SidePortStats) -> &AtomicU64);
    let series: [Series; 3] = [
        (
            "ringway_side_port_displaced_total",
            "Side-port connections closed to make room for a new one at the cap of 64 (the oldest first)",
            |s| &s.displaced,
        ),
        (
            "ringway_side_port_read_timeouts_total",
            "Side-port connections closed because the request did not arrive within 5 s",
            |s| &s.read_timeouts,
        ),
        (
            "ringway_side_port_write_timeouts_total",
            "Side-port connections closed because the client did not take the answer within 10 s",
            |s| &s.write_timeouts,
        ),
    ];
    for (name, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
        for port in SidePort::ALL {
            let n = get(port.stats()).load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{port=\"{}\"}} {n}", port.name());
        }
    }
}

/// The revocation series, once `CRL_PATH` has loaded: ztunnel's refusal
/// counter (per reporter: `destination` refused a client certificate on
/// inbound HBONE, `source` a server certificate on outbound), and ringway's
/// reload health.
fn render_crl(out: &mut String, s: &CrlStats) {
    if !s.loaded {
        return;
    }
    let name = "istio_crl_policy_rejections_total";
    let _ = writeln!(
        out,
        "# HELP {name} Handshakes refused because a peer certificate in the chain is revoked (or its CRL does not verify).\n# TYPE {name} counter"
    );
    let _ = writeln!(
        out,
        "{name}{{reporter=\"destination\"}} {}",
        s.refused_inbound
    );
    let _ = writeln!(out, "{name}{{reporter=\"source\"}} {}", s.refused_outbound);
    let name = "ringway_crl_closed_connections_total";
    let _ = writeln!(
        out,
        "# HELP {name} Open HBONE connections closed because a reloaded CRL revoked the peer's certificate.\n# TYPE {name} counter"
    );
    let _ = writeln!(out, "{name}{{direction=\"inbound\"}} {}", s.closed_inbound);
    let _ = writeln!(
        out,
        "{name}{{direction=\"outbound\"}} {}",
        s.closed_outbound
    );
    let name = "ringway_crl_reloads_total";
    let _ = writeln!(
        out,
        "# HELP {name} Loads of the CRL file (the one at startup included), by result; an error keeps the last good CRLs.\n# TYPE {name} counter"
    );
    let _ = writeln!(out, "{name}{{result=\"ok\"}} {}", s.reloads_ok);
    let _ = writeln!(out, "{name}{{result=\"error\"}} {}", s.reloads_error);
    for (name, help, v) in [
        (
            "ringway_crl_revoked_certificates",
            "Revoked serial numbers in the CRLs in force",
            s.revoked as u64,
        ),
        (
            "ringway_crl_lists",
            "CRLs in force (one per issuer, usually)",
            s.crls as u64,
        ),
        (
            "ringway_crl_last_reload_timestamp_seconds",
            "When the CRLs in force were loaded (Unix seconds)",
            s.last_reload,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}.\n# TYPE {name} gauge\n{name} {v}"
        );
    }
}

/// ztunnel's xDS client series: messages and bytes per type URL, stream
/// terminations per reason.
fn render_xds(out: &mut String, x: &XdsMetrics) {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let types = [
        (ADDRESS_TYPE_URL, &x.address),
        (AUTHORIZATION_TYPE_URL, &x.authorization),
    ];
    for (name, help, bytes) in [
        (
            "istio_xds_message_total",
            "Total number of messages received",
            false,
        ),
        (
            "istio_xds_message_bytes_total",
            "Total number of bytes received",
            true,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
        for (url, c) in types {
            let v = if bytes {
                load(&c.bytes)
            } else {
                load(&c.messages)
            };
            let _ = writeln!(out, "{name}{{url=\"{url}\"}} {v}");
        }
    }
    let name = "istio_xds_connection_terminations_total";
    let _ = writeln!(
        out,
        "# HELP {name} The total number of completed connections to xds server.\n# TYPE {name} counter"
    );
    for reason in TerminationReason::ALL {
        let _ = writeln!(
            out,
            "{name}{{reason=\"{}\"}} {}",
            reason.label(),
            x.terminations(reason)
        );
    }
    for (name, help, v) in [
        (
            "ringway_xds_nacks_total",
            "Responses ringway NACKed",
            load(&x.nacks_sent),
        ),
        (
            "ringway_xds_resources_rejected_total",
            "Resources ringway refused (conversion or validation)",
            load(&x.resources_rejected),
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}.\n# TYPE {name} counter\n{name} {v}"
        );
    }
}

/// Appends `l`'s labels in Istio's order: those before `response_flags`,
/// a NUL, the rest.
fn render_labels(out: &mut String, l: &ConnLabels<'_>) {
    /// Escapes a label value as the text format wants it.
    struct Escaped<'o>(&'o mut String);
    impl std::fmt::Write for Escaped<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            for c in s.chars() {
                match c {
                    '\\' => self.0.push_str("\\\\"),
                    '"' => self.0.push_str("\\\""),
                    '\n' => self.0.push_str("\\n"),
                    c => self.0.push(c),
                }
            }
            Ok(())
        }
    }
    fn put(out: &mut String, name: &str, value: &dyn std::fmt::Display) {
        if !out.is_empty() && !out.ends_with('\0') {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        let before = out.len();
        let _ = write!(Escaped(out), "{value}");
        if out.len() == before {
            out.push_str("unknown");
        }
        out.push('"');
    }
    let reporter = match l.reporter {
        Reporter::Source => "source",
        Reporter::Destination => "destination",
    };
    put(out, "reporter", &reporter);
    const SOURCE: [&str; 8] = [
        "source_workload",
        "source_canonical_service",
        "source_canonical_revision",
        "source_workload_namespace",
        "source_principal",
        "source_app",
        "source_version",
        "source_cluster",
    ];
    const DESTINATION: [&str; 8] = [
        "destination_workload",
        "destination_canonical_service",
        "destination_canonical_revision",
        "destination_workload_namespace",
        "destination_principal",
        "destination_app",
        "destination_version",
        "destination_cluster",
    ];
    for (names, w, principal) in [
        (SOURCE, l.src, l.src_principal),
        (DESTINATION, l.dst, l.dst_principal),
    ] {
        if names == DESTINATION {
            let s = l.service;
            put(out, "destination_service", &s.map_or("", |s| &s.hostname));
            put(
                out,
                "destination_service_namespace",
                &s.map_or("", |s| &s.namespace),
            );
            put(out, "destination_service_name", &s.map_or("", |s| &s.name));
        }
        let principal: &dyn std::fmt::Display = principal.unwrap_or(&"");
        let values: [&dyn std::fmt::Display; 8] = match w {
            Some(w) => [
                &w.workload_name,
                &w.canonical_name,
                &w.canonical_revision,
                &w.namespace,
                principal,
                &w.canonical_name,
                &w.canonical_revision,
                &w.cluster_id,
            ],
            None => [&"", &"", &"", &"", principal, &"", &"", &""],
        };
        for (name, value) in names.iter().zip(values) {
            put(out, name, value);
        }
    }
    put(out, "request_protocol", &"tcp");
    out.push('\0');
    let policy = if l.mtls { "mutual_tls" } else { "unknown" };
    put(out, "connection_security_policy", &policy);
    let (src_loc, dst_loc) = (
        l.src.and_then(|w| w.locality.as_ref()),
        l.dst.and_then(|w| w.locality.as_ref()),
    );
    // Always written, `unknown` when not known: ztunnel's scrape has them
    // on every series (checked against it in tests/ztunnel_diff.rs).
    put(out, "source_region", &src_loc.map_or("", |l| &l.region));
    put(out, "source_zone", &src_loc.map_or("", |l| &l.zone));
    put(
        out,
        "destination_region",
        &dst_loc.map_or("", |l| &l.region),
    );
    put(out, "destination_zone", &dst_loc.map_or("", |l| &l.zone));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crl_series_show_once_a_crl_is_loaded() {
        let mut out = String::new();
        render_crl(&mut out, &CrlStats::default());
        assert!(out.is_empty(), "no CRL_PATH, no series: {out}");
        let stats = CrlStats {
            loaded: true,
            crls: 2,
            revoked: 5,
            reloads_ok: 3,
            reloads_error: 1,
            last_reload: 1_800_000_000,
            refused_inbound: 7,
            refused_outbound: 4,
            closed_inbound: 2,
            closed_outbound: 1,
        };
        render_crl(&mut out, &stats);
        for line in [
            "# TYPE istio_crl_policy_rejections_total counter",
            "istio_crl_policy_rejections_total{reporter=\"destination\"} 7",
            "istio_crl_policy_rejections_total{reporter=\"source\"} 4",
            "ringway_crl_closed_connections_total{direction=\"inbound\"} 2",
            "ringway_crl_closed_connections_total{direction=\"outbound\"} 1",
            "ringway_crl_reloads_total{result=\"ok\"} 3",
            "ringway_crl_reloads_total{result=\"error\"} 1",
            "# TYPE ringway_crl_revoked_certificates gauge",
            "ringway_crl_revoked_certificates 5",
            "ringway_crl_lists 2",
            "ringway_crl_last_reload_timestamp_seconds 1800000000",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
    }

    fn workload(name: &str) -> Workload {
        Workload {
            name: name.into(),
            workload_name: name.into(),
            namespace: "ns".into(),
            ..Workload::default()
        }
    }

    #[test]
    fn failures_map_to_istio_response_flags() {
        for (why, flag) in [
            (
                "401: authorization policy: explicitly denied by ns/p",
                ResponseFlag::Deny,
            ),
            (
                "refused: authorization policy: allow policies exist, but none allowed",
                ResponseFlag::Deny,
            ),
            (
                "503: connect to 10.0.0.1:80 failed: Connection refused",
                ResponseFlag::Connect,
            ),
            (
                "TLS handshake failed: bad certificate",
                ResponseFlag::TlsFailure,
            ),
            (
                "HTTP/2 handshake failed: frame",
                ResponseFlag::H2HandshakeFailure,
            ),
            ("closed at the drain deadline", ResponseFlag::None),
        ] {
            assert_eq!(ResponseFlag::of_failure(why), flag, "{why}");
        }
    }

    /// Two cores with the same label set: one series, their sum; values
    /// escaped; unknown values say so; closed counts by flag.
    #[test]
    fn a_scrape_merges_cores_and_escapes_values() {
        let hub = MetricsHub::default();
        let (a, b) = (hub.core(true), hub.core(true));
        let (src, mut dst) = (workload("client"), workload("db"));
        dst.canonical_name = "we\"ird\\name".into();
        let labels = ConnLabels {
            reporter: Reporter::Source,
            src: Some(&src),
            src_principal: None,
            dst: Some(&dst),
            dst_principal: None,
            service: None,
            mtls: false,
        };
        for (core, bytes) in [(&a, 10), (&b, 5)] {
            let c = core.counters(&labels).unwrap();
            c.opened.add(1);
            c.sent.add(bytes);
        }
        a.counters(&labels).unwrap().close(ResponseFlag::Deny, true);
        assert!(Arc::ptr_eq(
            &a.counters(&labels).unwrap(),
            &a.counters(&labels).unwrap()
        ));
        assert!(hub.core(false).counters(&labels).is_none(), "--no-metrics");
        let text = hub.render(
            &ProcessStats {
                open_fds: 3,
                max_fds: 10,
                log_lines_dropped: 0,
            },
            Some(&XdsMetrics::default()),
        );
        assert!(
            text.contains(
                "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"} 0"
            ),
            "{text}"
        );
        let line = |name: &str| {
            text.lines()
                .filter(|l| l.starts_with(name))
                .collect::<Vec<_>>()
        };
        let sent = line("istio_tcp_sent_bytes_total{");
        assert_eq!(sent.len(), 1, "{text}");
        assert!(sent[0].ends_with(" 15"), "{text}");
        assert!(sent[0].contains("destination_canonical_service=\"we\\\"ird\\\\name\""));
        assert!(sent[0].contains("source_principal=\"unknown\""));
        assert!(sent[0].starts_with(
            "istio_tcp_sent_bytes_total{reporter=\"source\",source_workload=\"client\","
        ));
        let failed = line("istio_tcp_connections_failed_total{");
        assert_eq!(failed.len(), 1);
        assert!(failed[0].contains("response_flags=\"DENY\"") && failed[0].ends_with(" 1"));
        assert_eq!(
            line("istio_tcp_connections_closed_total{").len(),
            2,
            "- and DENY"
        );
    }
}
