//! Per-core HBONE connection pool, keyed by {source identity, destination
//! identity, destination IP}. Core-local (!Send): no locks, no atomics.
//!
//! - Single-flight: concurrent first requests for a key wait on one
//!   connect + TLS + HTTP/2 handshake instead of racing their own.
//! - At most `max_streams` streams per connection; past that another
//!   connection is opened for the same key.
//! - Broken connections (driver ended, keepalive PING unanswered) are
//!   skipped and dropped; idle ones are released after `idle_timeout`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use ringway_controlplane::model::identity::Identity;

use super::HboneError;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub src: Identity,
    pub dst: Identity,
    /// The HBONE address connected to (a waypoint may listen on another
    /// port than 15008).
    pub peer: SocketAddr,
    /// In-pod mode: the pod the tunnel leaves from (its namespace, its
    /// address); tunnels are never shared between pods.
    pub pod: Option<crate::inpod::PodNetns>,
}

#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    pub max_streams: usize,
    pub idle_timeout: Duration,
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// Port of the peer's HBONE listener.
    pub hbone_port: u16,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams: 100,
            idle_timeout: Duration::from_secs(300),
            ping_interval: Duration::from_secs(10),
            ping_timeout: Duration::from_secs(20),
            hbone_port: 15008,
        }
    }
}

/// One pooled HTTP/2 connection.
pub struct PooledConn {
    pub id: u64,
    sender: SendRequest<Bytes>,
    active: Cell<usize>,
    /// Streams ever opened here: a never-used connection is fresh, so a
    /// failure on it is not a stale-connection retry case.
    opened: Cell<u64>,
    last_used: Cell<Instant>,
    /// Set by the connection's driver task when it ends.
    pub(crate) broken: Rc<Cell<bool>>,
}

impl PooledConn {
    pub fn new(id: u64, sender: SendRequest<Bytes>, broken: Rc<Cell<bool>>) -> Self {
        Self {
            id,
            sender,
            active: Cell::new(0),
            opened: Cell::new(0),
            last_used: Cell::new(Instant::now()),
            broken,
        }
    }

    pub fn sender(&self) -> SendRequest<Bytes> {
        self.sender.clone()
    }

    pub fn streams_opened(&self) -> u64 {
        self.opened.get()
    }

    pub fn note_stream_opened(&self) {
        self.opened.set(self.opened.get() + 1);
    }
}

/// A stream slot on a pooled connection; frees the slot on drop.
pub struct Lease {
    pub conn: Rc<PooledConn>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.conn.active.set(self.conn.active.get() - 1);
        self.conn.last_used.set(Instant::now());
    }
}

/// A connect in progress that other requests for the same key wait on.
#[derive(Default)]
struct Connecting {
    result: RefCell<Option<Result<(), HboneError>>>,
    waiters: RefCell<Vec<Waker>>,
}

impl Connecting {
    fn finish(&self, r: Result<(), HboneError>) {
        *self.result.borrow_mut() = Some(r);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    async fn wait(&self) -> Result<(), HboneError> {
        futures_lite::future::poll_fn(|cx| match &*self.result.borrow() {
            Some(r) => Poll::Ready(r.clone()),
            None => {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// If the task running a connect is cancelled, the waiters must not hang.
struct ConnectGuard<'a> {
    pool: &'a Pool,
    key: PoolKey,
    slot: Rc<Connecting>,
    done: bool,
}

impl Drop for ConnectGuard<'_> {
    fn drop(&mut self) {
        self.pool.connecting.borrow_mut().remove(&self.key);
        if !self.done {
            self.slot.finish(Err(HboneError::Cancelled));
        }
    }
}

pub struct Pool {
    pub cfg: PoolConfig,
    conns: RefCell<HashMap<PoolKey, Vec<Rc<PooledConn>>>>,
    connecting: RefCell<HashMap<PoolKey, Rc<Connecting>>>,
    next_id: Cell<u64>,
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> Self {
        Self {
            cfg,
            conns: RefCell::new(HashMap::new()),
            connecting: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
        }
    }

    fn take_slot(&self, key: &PoolKey) -> Option<Lease> {
        let conns = self.conns.borrow();
        let conn = conns
            .get(key)?
            .iter()
            .find(|c| !c.broken.get() && c.active.get() < self.cfg.max_streams)?;
        conn.active.set(conn.active.get() + 1);
        Some(Lease { conn: conn.clone() })
    }

    /// A stream slot for `key`, connecting with `connect` when no pooled
    /// connection has room. `connect` returns the new connection.
    pub async fn lease<F, Fut>(&self, key: &PoolKey, connect: F) -> Result<Lease, HboneError>
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = Result<PooledConn, HboneError>>,
    {
        loop {
            if let Some(lease) = self.take_slot(key) {
                return Ok(lease);
            }
            let existing = self.connecting.borrow().get(key).cloned();
            if let Some(pending) = existing {
                pending.wait().await?;
                continue;
            }
            let slot = Rc::new(Connecting::default());
            self.connecting
                .borrow_mut()
                .insert(key.clone(), slot.clone());
            let mut guard = ConnectGuard {
                pool: self,
                key: key.clone(),
                slot: slot.clone(),
                done: false,
            };
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            let result = connect(id).await;
            guard.done = true;
            match result {
                Ok(conn) => {
                    self.conns
                        .borrow_mut()
                        .entry(key.clone())
                        .or_default()
                        .push(Rc::new(conn));
                    drop(guard);
                    slot.finish(Ok(()));
                }
                Err(e) => {
                    drop(guard);
                    slot.finish(Err(e.clone()));
                    return Err(e);
                }
            }
        }
    }

    /// Drops broken connections and idle ones past the idle timeout.
    /// Pooled connections open now (for the per-core view).
    pub fn connections(&self) -> usize {
        self.conns.borrow().values().map(Vec::len).sum()
    }

    /// Drops the pooled connections whose key `keep` rejects (a removed
    /// pod's); their streams in flight keep going until they end.
    pub fn retain(&self, keep: impl Fn(&PoolKey) -> bool) {
        self.conns.borrow_mut().retain(|k, _| keep(k));
    }

    /// Also drops a removed pod's connections that were still being opened
    /// when the pod's were evicted.
    pub fn reap(&self) {
        let idle = self.cfg.idle_timeout;
        self.conns.borrow_mut().retain(|key, list| {
            if key.pod.as_ref().is_some_and(|p| p.0.is_closed()) {
                return false;
            }
            list.retain(|c| {
                let idle_too_long = c.active.get() == 0 && c.last_used.get().elapsed() >= idle;
                !c.broken.get() && !idle_too_long
            });
            !list.is_empty()
        });
    }
}
