//! The scenarios as the suite runs them: one enum over every scenario's
//! parameters, one `run` that returns the raw result plus the metrics it
//! contributes to the results table.

use std::io;

use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::Processes;
use crate::report::{fmt_num, MetricDef};
use crate::units::fmt_size;
use crate::{connect, idle, kernel, rr, rr_conc, throughput};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Throughput,
    Rr,
    Connect,
    Idle,
    /// `rr` while the proxies' system calls and context switches are
    /// counted (see `kernel`).
    RrKernel,
    /// Request/response at several concurrency levels (one scenario per
    /// level, see `rr_conc`).
    RrConc,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Scenario {
    Throughput(throughput::Params),
    Rr(rr::Params),
    Connect(connect::Params),
    Idle(idle::Params),
    #[serde(rename = "rr-kernel")]
    RrKernel(rr::Params),
    #[serde(rename = "rr-conc")]
    RrConc(rr_conc::Params),
}

/// Prefix of the per-type system-call rows of `rr-kernel`.
pub const SYSCALL_ROW: &str = "rr-kernel.syscall.";

/// Prefix of the load generator's rows of `rr-conc` (how busy its client
/// threads were), followed by the connection count.
pub const GENERATOR_ROW: &str = "rr-conc-generator.";

/// One run's outcome.
pub struct Measured {
    /// The scenario's full result, for results.json.
    pub raw: serde_json::Value,
    pub metrics: Vec<(MetricDef, f64)>,
    /// For the progress line.
    pub summary: String,
    /// Something worth a note in the report (e.g. failed connections).
    pub warning: Option<String>,
}

impl Scenario {
    pub fn label(&self) -> String {
        match self {
            Scenario::Throughput(p) => format!(
                "throughput {}×{} {}",
                p.streams,
                fmt_size(p.bytes_per_stream),
                p.direction.as_str()
            ),
            Scenario::Rr(p) => format!(
                "rr {} B × {} conn, {}",
                p.size,
                p.connections,
                p.limit.describe("req")
            ),
            Scenario::Connect(p) => {
                format!("connect × {}, {}", p.concurrency, p.limit.describe("conn"))
            }
            Scenario::Idle(p) => format!("idle {} connections", p.connections),
            Scenario::RrKernel(p) => format!(
                "rr kernel counts {} B × {} conn, {}",
                p.size,
                p.connections,
                p.limit.describe("req")
            ),
            Scenario::RrConc(p) => format!(
                "rr-conc {} B × {} conn, {}",
                p.size,
                p.connections,
                p.limit.describe("req")
            ),
        }
    }

    /// Prefix of this scenario's metric ids.
    pub fn id(&self) -> String {
        match self {
            Scenario::Throughput(p) => format!("throughput.{}.{}", p.streams, p.direction.as_str()),
            Scenario::Rr(_) => "rr".into(),
            Scenario::Connect(_) => "connect".into(),
            Scenario::Idle(_) => "idle".into(),
            Scenario::RrKernel(_) => "rr-kernel".into(),
            Scenario::RrConc(p) => format!("rr-conc.{}", p.connections),
        }
    }

    /// Only meaningful through a proxy (it measures the proxy).
    pub fn needs_proxy(&self) -> bool {
        matches!(self, Scenario::Idle(_) | Scenario::RrKernel(_))
    }

    /// Runs on freshly started proxy processes (memory from a clean slate).
    pub fn needs_fresh_proxy(&self) -> bool {
        matches!(self, Scenario::Idle(_))
    }

    pub fn run(&self, dialer: &Dialer, procs: &Processes) -> io::Result<Measured> {
        let label = self.label();
        let id = self.id();
        let def = |suffix: &str, name: &str, higher: bool, digits: usize| {
            MetricDef::new(format!("{id}.{suffix}"), &label, name, higher, digits)
        };
        let mut metrics = Vec::new();
        let mut push = |d: MetricDef, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                metrics.push((d, v));
            }
        };
        let (raw, summary, warning) = match self {
            Scenario::Throughput(p) => {
                let r = throughput::run(dialer, *p, procs)?;
                push(def("gbps", "Gbit/s", true, 2), Some(r.gbit_per_s));
                push(
                    def("cpu_per_gib", "proxy CPU s/GiB", false, 3),
                    r.proxy_cpu_s_per_gib,
                );
                let s = format!(
                    "{:7.2} Gbit/s{}",
                    r.gbit_per_s,
                    cpu_note(r.proxy_cpu_s_per_gib, "s/GiB")
                );
                (serde_json::to_value(&r)?, s, None)
            }
            Scenario::Rr(p) => {
                let r = rr::run(dialer, *p, procs)?;
                push(def("rps", "requests/s", true, 0), Some(r.requests_per_s));
                for (name, v) in r.latency.points() {
                    push(latency_def(&id, &label, name), Some(v));
                }
                push(
                    def("cpu_per_1k", "proxy CPU s/1k requests", false, 4),
                    r.proxy_cpu_s_per_1k_requests,
                );
                let s = format!(
                    "{:8.0} req/s  p50 {:.1} µs  p99 {:.1} µs{}",
                    r.requests_per_s,
                    r.latency.p50_us,
                    r.latency.p99_us,
                    cpu_note(r.proxy_cpu_s_per_1k_requests, "s/1k req")
                );
                (serde_json::to_value(&r)?, s, None)
            }
            Scenario::Connect(p) => {
                let r = connect::run(dialer, *p, procs)?;
                push(
                    def("cps", "connections/s", true, 0),
                    Some(r.connections_per_s),
                );
                for (name, v) in r.connect_to_first_byte.points() {
                    push(latency_def(&id, &label, name), Some(v));
                }
                push(
                    def("cpu_per_1k", "proxy CPU s/1k connections", false, 4),
                    r.proxy_cpu_s_per_1k_connections,
                );
                let warning = (r.errors > 0).then(|| {
                    format!(
                        "{} of {} connections failed (first: {})",
                        r.errors,
                        r.errors + r.connections,
                        r.first_error.as_deref().unwrap_or("?")
                    )
                });
                let s = format!(
                    "{:8.0} conn/s  p50 {:.1} µs  p99 {:.1} µs{}{}",
                    r.connections_per_s,
                    r.connect_to_first_byte.p50_us,
                    r.connect_to_first_byte.p99_us,
                    cpu_note(r.proxy_cpu_s_per_1k_connections, "s/1k conn"),
                    if r.errors > 0 {
                        format!("  ({} errors)", r.errors)
                    } else {
                        String::new()
                    }
                );
                (serde_json::to_value(&r)?, s, warning)
            }
            Scenario::Idle(p) => {
                let r = idle::run(dialer, *p, procs)?;
                push(
                    def("kib_per_conn", "proxy KiB per idle connection", false, 1),
                    r.proxy_bytes_per_connection.map(|b| b / 1024.0),
                );
                push(
                    def("rss_open_mib", "proxy RSS with all open, MiB", false, 1),
                    r.proxy_rss_open.map(|b| b as f64 / (1 << 20) as f64),
                );
                push(
                    def("cpu_per_1k", "proxy CPU s/1k connections opened", false, 4),
                    r.proxy_cpu_s_per_1k_connections,
                );
                let s = format!(
                    "{} KiB/conn  RSS {} → {} MiB (closed: {} MiB)",
                    fmt_num(r.proxy_bytes_per_connection.map(|b| b / 1024.0), 1),
                    fmt_num(r.proxy_rss_before.map(mib), 1),
                    fmt_num(r.proxy_rss_open.map(mib), 1),
                    fmt_num(r.proxy_rss_closed.map(mib), 1),
                );
                (serde_json::to_value(&r)?, s, None)
            }
            Scenario::RrKernel(p) => {
                let r = kernel::run(dialer, *p, procs)?;
                let k = &r.per_1k_requests;
                push(
                    def("cpu_ms_per_1k", "proxy CPU ms/1k requests", false, 1),
                    k.proxy_cpu_ms,
                );
                push(
                    def("syscalls_per_1k", "syscalls/1k requests", false, 0),
                    k.syscalls,
                );
                push(
                    def(
                        "io_uring_per_1k",
                        "io_uring submissions/1k requests",
                        false,
                        0,
                    ),
                    k.io_uring_submissions,
                );
                push(
                    def("cs_per_1k", "context switches/1k requests", false, 0),
                    Some(k.ctx_switches),
                );
                push(
                    def("cs_vol_per_1k", "voluntary switches/1k requests", false, 0),
                    Some(k.voluntary_ctx_switches),
                );
                push(
                    def(
                        "cs_invol_per_1k",
                        "involuntary switches/1k requests",
                        false,
                        0,
                    ),
                    Some(k.involuntary_ctx_switches),
                );
                push(
                    def("rps", "requests/s while counting", true, 0),
                    Some(r.rr.requests_per_s),
                );
                for (name, v) in &k.syscalls_by_type {
                    push(
                        MetricDef::new(
                            format!("{SYSCALL_ROW}{name}"),
                            &label,
                            &format!("{name}/1k requests"),
                            false,
                            0,
                        ),
                        Some(*v),
                    );
                }
                let s = format!(
                    "{:8.0} req/s  per 1k requests: {} syscalls, {} io_uring, {:.0} context switches{}",
                    r.rr.requests_per_s,
                    fmt_num(k.syscalls, 0),
                    fmt_num(k.io_uring_submissions, 0),
                    k.ctx_switches,
                    cpu_note(r.rr.proxy_cpu_s_per_1k_requests, "s/1k req")
                );
                let warning = r
                    .syscalls
                    .is_none()
                    .then(|| format!("system calls {}", r.syscall_counter));
                (serde_json::to_value(&r)?, s, warning)
            }
            Scenario::RrConc(p) => {
                let r = rr_conc::run(dialer, *p, procs)?;
                push(def("rps", "requests/s", true, 0), Some(r.requests_per_s));
                push(
                    def("cpu_ms_per_1k", "proxy CPU ms/1k requests", false, 2),
                    r.proxy_cpu_ms_per_1k_requests,
                );
                push(latency_def(&id, &label, "p50"), Some(r.latency.p50_us));
                push(latency_def(&id, &label, "p99"), Some(r.latency.p99_us));
                push(
                    MetricDef::new(
                        format!("{GENERATOR_ROW}{}", p.connections),
                        &label,
                        "load generator busy %",
                        false,
                        0,
                    ),
                    Some(r.client_busy * 100.0),
                );
                let s = format!(
                    "{:8.0} req/s  p50 {:.1} µs  p99 {:.1} µs{}  generator {} thread(s) {:.0}% busy",
                    r.requests_per_s,
                    r.latency.p50_us,
                    r.latency.p99_us,
                    r.proxy_cpu_ms_per_1k_requests
                        .map_or(String::new(), |c| format!("  proxy CPU {c:.2} ms/1k req")),
                    r.threads,
                    r.client_busy * 100.0,
                );
                (serde_json::to_value(&r)?, s, None)
            }
        };
        Ok(Measured {
            raw,
            metrics,
            summary,
            warning,
        })
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn cpu_note(v: Option<f64>, unit: &str) -> String {
    v.map_or(String::new(), |c| format!("  proxy CPU {c:.4} {unit}"))
}

/// Latency rows: "rr.p99" named "p99 µs".
pub fn latency_def(id: &str, label: &str, percentile: &str) -> MetricDef {
    let key = percentile.replace('.', "");
    MetricDef::new(
        format!("{id}.{key}"),
        label,
        &format!("{percentile} µs"),
        false,
        1,
    )
}
