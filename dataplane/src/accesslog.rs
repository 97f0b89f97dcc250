//! One access-log line per proxied connection, written exactly once: when
//! the connection's [`ConnLog`] is dropped, whatever path it took (success,
//! early refusal, or cancellation at the drain deadline).

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use crate::listeners::TrafficPath;

/// Per-core count of open connections, counted from accept to close, and
/// what drain waits on.
#[derive(Default)]
pub struct OpenConnections {
    count: Cell<usize>,
    idle_waiter: RefCell<Option<Waker>>,
}

impl OpenConnections {
    pub fn get(&self) -> usize {
        self.count.get()
    }

    fn leave(&self) {
        self.count.set(self.count.get() - 1);
        if self.count.get() == 0 {
            if let Some(w) = self.idle_waiter.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// Resolves once no connection is open on this core.
    pub async fn all_closed(&self) {
        futures_lite::future::poll_fn(|cx| {
            if self.count.get() == 0 {
                Poll::Ready(())
            } else {
                *self.idle_waiter.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// The record of one connection, filled in as it progresses.
pub struct ConnLog {
    open: Rc<OpenConnections>,
    core: usize,
    path: TrafficPath,
    started: Instant,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub upstream: Option<SocketAddr>,
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
    /// Bytes from the downstream client delivered upstream.
    pub sent: Cell<u64>,
    /// Bytes from upstream delivered to the downstream client.
    pub received: Cell<u64>,
    outcome: RefCell<Option<(bool, String)>>,
}

impl ConnLog {
    /// The client's address: the one accept4 reported (the accept loop sets
    /// `src`), else asked of the socket; recorded either way.
    pub fn client_addr(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<SocketAddr> {
        let addr = match self.src {
            Some(a) => a,
            None => crate::socket::peer_addr(fd)?,
        };
        self.src = Some(addr);
        Ok(addr)
    }

    pub fn new(open: Rc<OpenConnections>, core: usize, path: TrafficPath) -> Self {
        open.count.set(open.count.get() + 1);
        Self {
            open,
            core,
            path,
            started: Instant::now(),
            src: None,
            dst: None,
            upstream: None,
            src_identity: None,
            dst_identity: None,
            trace: None,
            hbone_conn: None,
            route: "-",
            sent: Cell::new(0),
            received: Cell::new(0),
            outcome: RefCell::new(None),
        }
    }

    pub fn path(&self) -> TrafficPath {
        self.path
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

fn fmt_addr(a: &Option<SocketAddr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_else(|| "-".into())
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        self.open.leave();
        let (ok, outcome) = self
            .outcome
            .borrow_mut()
            .take()
            .unwrap_or((false, "closed at the drain deadline".into()));
        let duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let (src, dst, upstream) = (
            fmt_addr(&self.src),
            fmt_addr(&self.dst),
            fmt_addr(&self.upstream),
        );
        let (sent, received) = (self.sent.get(), self.received.get());
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let (src_identity, dst_identity, trace) = (
            dash(&self.src_identity),
            dash(&self.dst_identity),
            dash(&self.trace),
        );
        let hbone_conn = self.hbone_conn.unwrap_or(0);
        if ok {
            tracing::info!(
                target: "access",
                core = self.core, path = self.path.name(), src, dst, upstream, route = self.route,
                src_identity, dst_identity, trace, hbone_conn,
                bytes_sent = sent, bytes_received = received, duration_ms, outcome,
                "connection complete"
            );
        } else {
            tracing::warn!(
                target: "access",
                core = self.core, path = self.path.name(), src, dst, upstream, route = self.route,
                src_identity, dst_identity, trace, hbone_conn,
                bytes_sent = sent, bytes_received = received, duration_ms, error = outcome,
                "connection failed"
            );
        }
    }
}
