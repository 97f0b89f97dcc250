//! A core-local one-shot signal: set once, every waiter wakes. What a
//! connection races its traffic against (the drain deadline, its pod's
//! removal): the connection's task is woken for every message it moves,
//! and each wake polls the race's other side too, so that side's poll has
//! to cost a flag read, not a lock (a tokio `watch` took ~1 % of the
//! proxy's CPU at 256 busy connections). Core-local (!Send).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Set once; [`Latch::wait`] resolves from then on.
#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    waiters: RefCell<slab::Slab<Waker>>,
}

impl Latch {
    pub fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    /// Sets the latch and wakes every waiter.
    pub fn set(&self) {
        if self.set.replace(true) {
            return;
        }
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, w) in waiters {
            w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    /// Resolves once the latch is set.
    pub fn wait(self: &Rc<Self>) -> Wait {
        Wait {
            latch: self.clone(),
            key: None,
        }
    }
}

/// Future of [`Latch::wait`].
pub struct Wait {
    latch: Rc<Latch>,
    key: Option<usize>,
}

impl Future for Wait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.latch.is_set() {
            self.key = None;
            return Poll::Ready(());
        }
        let this = &mut *self;
        let mut waiters = this.latch.waiters.borrow_mut();
        match this.key {
            Some(k) => {
                if let Some(w) = waiters.get_mut(k) {
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
                }
            }
            None => this.key = Some(waiters.insert(cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            if !self.latch.is_set() {
                self.latch.waiters.borrow_mut().try_remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_wakes_every_waiter_and_dropped_waits_leave_nothing() {
        let latch = Latch::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut a = Box::pin(latch.wait());
        let mut b = Box::pin(latch.wait());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert!(
            a.as_mut().poll(&mut cx).is_pending(),
            "a second poll registers nothing new"
        );
        assert_eq!(latch.waiters.borrow().len(), 2);
        drop(b);
        assert_eq!(latch.waiters.borrow().len(), 1);
        latch.set();
        assert!(a.as_mut().poll(&mut cx).is_ready());
        assert!(Box::pin(latch.wait()).as_mut().poll(&mut cx).is_ready());
        assert!(latch.waiters.borrow().is_empty());
    }
}
