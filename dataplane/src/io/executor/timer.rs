//! Per-core timers: an ordered map of deadlines. The nearest deadline is
//! the timeout of the core's sleep, so an idle core with timers makes one
//! `io_uring_enter` per expiry and a busy one none.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::{Local, CURRENT};

#[derive(Default)]
pub(super) struct Timers {
    /// (deadline, sequence number) → the waker of the sleep waiting for it.
    pending: BTreeMap<(Instant, u64), Waker>,
    next_seq: u64,
}

impl Timers {
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.pending.keys().next().map(|(d, _)| *d)
    }
}

/// Wakes every sleep whose deadline is `now` or earlier.
pub(super) fn fire(local: &Local, now: Instant) {
    loop {
        let w = {
            let mut t = local.timers.borrow_mut();
            match t.pending.first_entry() {
                Some(e) if e.key().0 <= now => e.remove(),
                _ => break,
            }
        };
        w.wake();
    }
}

/// Completes at `deadline`. Registered on first poll, unregistered on drop.
pub struct Sleep {
    deadline: Instant,
    key: Option<(Instant, u64)>,
}

/// Completes after `d` on the current core's clock.
pub fn sleep(d: Duration) -> Sleep {
    Sleep {
        deadline: Instant::now() + d,
        key: None,
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            self.unregister();
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let key = self.key;
        self.key = Some(CURRENT.with(|c| {
            let c = c.borrow();
            let local = c.as_ref().expect("sleep outside a ringway executor");
            let mut t = local.timers.borrow_mut();
            if let Some(k) = key {
                if let Some(w) = t.pending.get_mut(&k) {
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
                    return k;
                }
            }
            // First poll, or fired (waker taken) but polled a bit early.
            let k = (deadline, t.next_seq);
            t.next_seq += 1;
            t.pending.insert(k, cx.waker().clone());
            k
        }));
        Poll::Pending
    }
}

impl Sleep {
    fn unregister(&mut self) {
        if let Some(k) = self.key.take() {
            // try_with: dropped while the thread's locals are destroyed,
            // there is no executor left to unregister from.
            let _ = CURRENT.try_with(|c| {
                if let Some(local) = c.borrow().as_ref() {
                    local.timers.borrow_mut().pending.remove(&k);
                }
            });
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.unregister();
    }
}

/// `fut` did not complete within its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("timed out")
    }
}

impl std::error::Error for TimedOut {}

/// Awaits `fut` for at most `d`.
pub async fn timeout<T>(d: Duration, fut: impl Future<Output = T>) -> Result<T, TimedOut> {
    futures_lite::future::or(async { Ok(fut.await) }, async {
        sleep(d).await;
        Err(TimedOut)
    })
    .await
}
