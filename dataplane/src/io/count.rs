//! Counts a core keeps where the work happens: a single-writer counter the
//! scraper may read from another thread ([`Counter`]), the bytes one
//! direction of a connection moved ([`ByteCount`]), and a count of open
//! things that someone waits to see reach zero ([`OpenCount`]).
//!
//! They sit with the I/O plumbing because the byte movers (splice copy,
//! the HBONE pump) count into them at every write; what the counts mean
//! (access log, Istio metrics, drain) is decided further up.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

/// A counter (or gauge) that one core writes and any thread reads.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Only the owning core calls this: with a single writer a relaxed
    /// load-then-store loses nothing, and needs no locked instruction.
    pub fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    /// A gauge's new value (owning core only).
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bytes one direction of a connection moved: the access log's count and,
/// once the connection's metric labels are known, its label set's
/// Prometheus counter (so a long-lived connection shows in every scrape).
#[derive(Default)]
pub struct ByteCount {
    n: Cell<u64>,
    metric: Option<Arc<Counter>>,
}

impl ByteCount {
    pub fn add(&self, k: u64) {
        self.n.set(self.n.get() + k);
        if let Some(m) = &self.metric {
            m.add(k);
        }
    }

    pub fn get(&self) -> u64 {
        self.n.get()
    }

    /// From now on, bytes are also added to `metric`.
    pub fn count_into(&mut self, metric: Arc<Counter>) {
        self.metric = Some(metric);
    }
}

/// A core-local count of open things that someone may wait to see reach
/// zero (a core's connections at drain, a removed pod's).
#[derive(Default)]
pub struct OpenCount {
    count: Cell<usize>,
    idle_waiter: RefCell<Option<Waker>>,
}

impl OpenCount {
    pub fn get(&self) -> usize {
        self.count.get()
    }

    pub fn enter(&self) {
        self.count.set(self.count.get() + 1);
    }

    pub fn leave(&self) {
        self.count.set(self.count.get() - 1);
        if self.count.get() == 0 {
            if let Some(w) = self.idle_waiter.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// Resolves once the count is zero.
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
