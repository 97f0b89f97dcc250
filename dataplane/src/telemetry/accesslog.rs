//! One access-log line per proxied connection, written exactly once: when
//! the connection's [`ConnLog`] is dropped, whatever path it took (success,
//! early refusal, or cancellation at the drain deadline).
//!
//! The line carries ztunnel's field names and meanings (`src.addr`,
//! `dst.addr`, `dst.hbone_addr`, `dst.service`, `direction`, `bytes_sent`,
//! `bytes_recv`, `duration`, `error`, ...), so that log queries written for
//! ztunnel work unchanged; ringway adds `core`, `path`, `route`, `trace`,
//! `hbone_conn` and, on success, `outcome`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ringway_controlplane::model::Workload;

use crate::inpod::{PodConn, PodScope};
use crate::io::count::{ByteCount, OpenCount};
use crate::io::listener::TrafficPath;
use crate::telemetry::metrics::{CoreStats, ResponseFlag, TcpCounters};
use crate::telemetry::ratelog::RateLog;

/// Access-log lines of failed connections a core writes per second and
/// path (`TrafficPath::index` order); the rest are counted and reported
/// in one "suppressed" line (see [`RateLog`]).
pub const FAILURE_LINES: [RateLog; 4] = [
    RateLog::new("failed outbound connections", FAILURE_LINES_PER_SECOND),
    RateLog::new(
        "failed inbound passthrough connections",
        FAILURE_LINES_PER_SECOND,
    ),
    RateLog::new(
        "failed inbound HBONE connections and streams",
        FAILURE_LINES_PER_SECOND,
    ),
    RateLog::new("failed SOCKS5 connections", FAILURE_LINES_PER_SECOND),
];

/// Enough to see what is failing, and more than a burst of ordinary
/// failures (a client retrying, a policy change refusing a pod's
/// connections) reaches; a peer repeating a refusal thousands of times a
/// second makes a core write this many lines, not thousands.
pub const FAILURE_LINES_PER_SECOND: u32 = 100;

/// Per-core count of open connections, counted from accept to close, and
/// what drain waits on; mirrored into the core's metrics gauge.
#[derive(Default)]
pub struct OpenConnections {
    count: OpenCount,
    stats: Arc<CoreStats>,
}

impl OpenConnections {
    /// Counting into `stats`' open-connections gauge.
    pub fn new(stats: Arc<CoreStats>) -> Self {
        OpenConnections {
            stats,
            ..OpenConnections::default()
        }
    }

    pub fn get(&self) -> usize {
        self.count.get()
    }

    fn enter(&self) {
        self.count.enter();
        self.stats.open_connections.set(self.count.get() as u64);
    }

    fn leave(&self) {
        self.count.leave();
        self.stats.open_connections.set(self.count.get() as u64);
    }

    /// Resolves once no connection is open on this core.
    pub async fn all_closed(&self) {
        self.count.all_closed().await
    }
}

/// The workload and service names a line shows, copied once when the
/// connection is routed: cloning the snapshot's `Arc`s instead would touch
/// refcounts that every core shares, for each connection. One allocation.
#[derive(Default, Clone)]
pub struct Names {
    text: String,
    /// Where each part ends in `text`, in this order: source workload,
    /// its namespace, destination workload, its namespace, service.
    ends: [u16; 5],
}

impl Names {
    /// The source and destination workloads (when known) and the service
    /// the client dialled (its hostname).
    pub fn new(src: Option<&Workload>, dst: Option<&Workload>, service: Option<&str>) -> Self {
        let src = src.map(|w| (w.name.as_str(), w.namespace.as_str()));
        Self::with_source(src, dst, service)
    }

    /// [`new`](Self::new), with the source named by (workload, namespace)
    /// strings: a source known only from `baggage`.
    pub fn with_source(
        src: Option<(&str, &str)>,
        dst: Option<&Workload>,
        service: Option<&str>,
    ) -> Self {
        let parts = [
            src.map(|s| s.0),
            src.map(|s| s.1),
            dst.map(|w| w.name.as_str()),
            dst.map(|w| w.namespace.as_str()),
            service,
        ];
        let len: usize = parts.iter().flatten().map(|p| p.len()).sum();
        let mut names = Names {
            text: String::with_capacity(len.min(u16::MAX as usize)),
            ends: [0; 5],
        };
        for (i, part) in parts.iter().enumerate() {
            let part = part.unwrap_or("");
            if names.text.len() + part.len() <= u16::MAX as usize {
                names.text.push_str(part);
            }
            names.ends[i] = names.text.len() as u16;
        }
        names
    }

    /// Part `i` (see `ends`); None when unknown (empty).
    fn get(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        let part = &self.text[start..self.ends[i] as usize];
        (!part.is_empty()).then_some(part)
    }
}

/// The record of one connection, filled in as it progresses.
pub struct ConnLog {
    open: Rc<OpenConnections>,
    core: usize,
    path: TrafficPath,
    started: Instant,
    /// The client (outbound) or the tunnel's peer (inbound).
    pub src: Option<SocketAddr>,
    /// ztunnel's `dst.addr`: where the connection went. Outbound: the
    /// original destination until an upstream is chosen, then the upstream
    /// (a peer's HBONE port for a tunnel). Inbound HBONE: the address the
    /// tunnel arrived on (port 15008).
    pub dst: Option<SocketAddr>,
    /// ztunnel's `dst.hbone_addr`: the tunnel's target (its `:authority`).
    pub hbone_addr: Option<SocketAddr>,
    /// Workload and service names, when the route found them.
    pub names: Names,
    /// SPIFFE identity of the source (the mTLS peer inbound, the workload
    /// we speak for outbound).
    pub src_identity: Option<String>,
    /// SPIFFE identity of the destination workload.
    pub dst_identity: Option<String>,
    /// W3C traceparent of the tunnel, when there is one.
    pub trace: Option<String>,
    /// Outbound HBONE: which pooled connection (per core) carried it.
    pub hbone_conn: Option<u64>,
    /// Which way the connection was routed (e.g. "passthrough", "service").
    pub route: &'static str,
    /// Bytes from the client (outbound: the application; inbound: the
    /// tunnel or the plaintext peer) delivered to the other side.
    pub from_client: ByteCount,
    /// Bytes from the other side delivered to the client.
    pub to_client: ByteCount,
    /// The connection's Istio TCP metrics, once its labels are known.
    metrics: Option<Arc<TcpCounters>>,
    outcome: RefCell<Option<(bool, String)>>,
    /// In-pod mode: the enrolled pod whose listener accepted the
    /// connection. Its upstream sockets are made in the pod's namespace,
    /// and it counts among the pod's open connections until it ends.
    pub pod: Option<PodConn>,
}

impl ConnLog {
    /// The client's address: the one accept4 reported (the accept loop sets
    /// `src`), else asked of the socket; recorded either way.
    pub fn client_addr(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<SocketAddr> {
        let addr = match self.src {
            Some(a) => a,
            None => crate::io::socket::peer_addr(fd)?,
        };
        self.src = Some(addr);
        Ok(addr)
    }

    pub fn new(open: Rc<OpenConnections>, core: usize, path: TrafficPath) -> Self {
        open.enter();
        Self {
            open,
            core,
            path,
            started: Instant::now(),
            src: None,
            dst: None,
            hbone_addr: None,
            names: Names::default(),
            src_identity: None,
            dst_identity: None,
            trace: None,
            hbone_conn: None,
            route: "-",
            from_client: ByteCount::default(),
            to_client: ByteCount::default(),
            metrics: None,
            outcome: RefCell::new(None),
            pod: None,
        }
    }

    /// Counts the connection as one of `pod`'s (in-pod mode).
    pub fn in_pod(mut self, pod: Option<&Rc<PodScope>>) -> Self {
        self.pod = pod.map(|p| PodConn::new(p.clone()));
        self
    }

    /// The pod's network namespace, where this connection's sockets are
    /// made; None outside in-pod mode.
    pub fn netns(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.pod.as_ref().map(|p| p.netns())
    }

    pub fn path(&self) -> TrafficPath {
        self.path
    }

    /// Counts this connection in `counters` (its label set): opened now,
    /// bytes as they move, closed (and failed, with its flag) at the end.
    pub fn count(&mut self, counters: Option<Arc<TcpCounters>>) {
        let Some(counters) = counters else {
            return; // --no-metrics
        };
        counters.opened.add(1);
        let (from_client, to_client) = match self.path {
            // As ztunnel counts: outbound, what the client sends is sent.
            TrafficPath::Outbound | TrafficPath::Socks5 => (&counters.sent, &counters.received),
            TrafficPath::Inbound | TrafficPath::InboundPassthrough => {
                (&counters.received, &counters.sent)
            }
        };
        self.from_client.count_into(from_client.clone());
        self.to_client.count_into(to_client.clone());
        self.metrics = Some(counters);
    }

    /// The connection was refused or failed; `why` says what to check.
    pub fn fail(&self, why: impl Into<String>) {
        *self.outcome.borrow_mut() = Some((false, why.into()));
    }

    pub fn finish(&self, outcome: impl Into<String>) {
        *self.outcome.borrow_mut() = Some((true, outcome.into()));
    }

    /// The outcome so far: (succeeded, what happened); None while open.
    pub fn outcome(&self) -> Option<(bool, String)> {
        self.outcome.borrow().clone()
    }
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        self.open.leave();
        let (ok, outcome) = self.outcome.borrow_mut().take().unwrap_or_else(|| {
            let why = if crate::io::executor::dropping_panicked_task() {
                "closed: its task panicked (a ringway bug; the core goes on)"
            } else {
                "closed at the drain deadline"
            };
            (false, why.into())
        });
        if !ok {
            self.open.stats.conn_failures[self.path.index()].add(1);
        }
        if let Some(m) = self.metrics.take() {
            let flag = if ok {
                ResponseFlag::None
            } else {
                ResponseFlag::of_failure(&outcome)
            };
            m.close(flag, !ok);
        }
        // A failure's line is a refusal or an error a peer can repeat at
        // will: rate-limited per core and path (the counters above took
        // it in full). Lines of connections that ended well are not.
        let suppressed = if ok {
            None
        } else {
            match FAILURE_LINES[self.path.index()].allow() {
                Some(n) => Some(n),
                None => return,
            }
        };
        let direction = match self.path {
            TrafficPath::Outbound | TrafficPath::Socks5 => "outbound",
            TrafficPath::Inbound | TrafficPath::InboundPassthrough => "inbound",
        };
        // As ztunnel counts them: outbound the proxy sends what the client
        // sent; inbound it receives what the client sent.
        let (from_client, to_client) = (self.from_client.get(), self.to_client.get());
        let (bytes_sent, bytes_recv) = match direction {
            "outbound" => (from_client, to_client),
            _ => (to_client, from_client),
        };
        let duration = format!("{}ms", self.started.elapsed().as_millis());
        let display = |a: &Option<SocketAddr>| a.map(tracing::field::display);
        let n = |i| self.names.get(i);
        let (src, dst, hbone_addr) = (
            display(&self.src),
            display(&self.dst),
            display(&self.hbone_addr),
        );
        let (src_identity, dst_identity, trace) = (
            self.src_identity.as_deref(),
            self.dst_identity.as_deref(),
            self.trace.as_deref(),
        );
        let (core, path, route, hbone_conn) =
            (self.core, self.path.name(), self.route, self.hbone_conn);
        // One field list for every level and message.
        macro_rules! line {
            ($level:expr, $message:literal, $key:ident = $value:expr) => {
                tracing::event!(
                    target: "access",
                    $level,
                    { src.addr = src, src.workload = n(0), src.namespace = n(1),
                    src.identity = src_identity,
                    dst.addr = dst, dst.hbone_addr = hbone_addr, dst.service = n(4),
                    dst.workload = n(2), dst.namespace = n(3), dst.identity = dst_identity,
                    direction, bytes_sent, bytes_recv, duration, $key = $value,
                    core, path, route, trace, hbone_conn },
                    $message
                )
            };
        }
        let tunnel_connection = self.route == "hbone_connection";
        if ok && tunnel_connection {
            // The streams have their own lines; ztunnel logs none for a
            // tunnel connection that ended well.
            line!(
                tracing::Level::DEBUG,
                "connection closed",
                outcome = outcome
            );
        } else if ok {
            line!(
                tracing::Level::INFO,
                "connection complete",
                outcome = outcome
            );
        } else if tunnel_connection {
            // A tunnel connection (TLS, HTTP/2) that failed before or
            // between its streams: ztunnel's "connection failed".
            line!(tracing::Level::WARN, "connection failed", error = outcome);
        } else {
            line!(
                tracing::Level::ERROR,
                "connection complete",
                error = outcome
            );
        }
        if let Some(n) = suppressed.filter(|&n| n > 0) {
            // Suppressed lines no window-end report took (rare: see
            // `ratelog`): said here rather than lost.
            tracing::warn!(
                kind = FAILURE_LINES[self.path.index()].kind,
                suppressed = n,
                "suppressed {n} similar lines before this one"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(name: &str, namespace: &str) -> Workload {
        Workload {
            name: name.into(),
            namespace: namespace.into(),
            ..Workload::default()
        }
    }

    #[test]
    fn names_keep_each_part_and_report_unknown_as_none() {
        let (a, b) = (workload("client", "shop"), workload("server-0", "db"));
        let n = Names::new(Some(&a), Some(&b), Some("db.db.svc.cluster.local"));
        let parts: Vec<_> = (0..5).map(|i| n.get(i)).collect();
        assert_eq!(
            parts,
            [
                Some("client"),
                Some("shop"),
                Some("server-0"),
                Some("db"),
                Some("db.db.svc.cluster.local")
            ]
        );
        let n = Names::new(None, Some(&b), None);
        let parts: Vec<_> = (0..5).map(|i| n.get(i)).collect();
        assert_eq!(parts, [None, None, Some("server-0"), Some("db"), None]);
        assert!((0..5).all(|i| Names::default().get(i).is_none()));
    }
}
