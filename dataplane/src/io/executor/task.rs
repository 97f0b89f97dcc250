//! Tasks: `!Send` futures owned by one core, woken by `Send` wakers.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use super::{Local, Shared, CURRENT};

/// What a waker holds: which task, on which core. `Send + Sync`; the
/// future itself never leaves its core.
pub(super) struct Header {
    key: usize,
    /// Set while the task sits in a run queue: a second wake is a no-op.
    scheduled: AtomicBool,
    /// Weak: a waker kept by another thread must not keep a stopped core's
    /// queue alive.
    shared: Weak<Shared>,
}

impl Wake for Header {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        // On the owning core: a queue push, nothing else.
        // try_with: a waker may fire while this thread's locals are being
        // destroyed; then it is not the owning core any more.
        let local = CURRENT
            .try_with(|c| {
                let c = c.borrow();
                match c.as_ref() {
                    Some(l) if std::ptr::eq(Arc::as_ptr(&l.shared), self.shared.as_ptr()) => {
                        l.queue.borrow_mut().push_back(self.clone());
                        true
                    }
                    _ => false,
                }
            })
            .unwrap_or(false);
        if local {
            return;
        }
        // From another thread: the core's lock-free queue, and its doorbell
        // if it sleeps.
        if let Some(shared) = self.shared.upgrade() {
            if shared.remote.send(self.clone()).is_ok() {
                shared.ring_doorbell();
            }
        }
    }
}

/// A task in the executor's slab.
pub(super) struct Slot {
    header: Arc<Header>,
    /// None while the future is being polled (taken out so that it may
    /// spawn or cancel other tasks, which borrows the slab).
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    /// Cancelled while it was being polled: drop it when it comes back.
    cancelled: bool,
    /// A detached task (a connection): a panic in it ends it, not the
    /// core. Joined tasks (the core's own loops) still take the core down:
    /// their callers cannot go on without them.
    isolated: bool,
}

/// Polls the task `h` names, if it still exists.
pub(super) fn run(local: &Local, h: Arc<Header>) {
    // Cleared before the poll: a wake during the poll queues it again.
    h.scheduled.store(false, Ordering::Release);
    let key = h.key;
    let mut fut = {
        let mut tasks = local.tasks.borrow_mut();
        match tasks.get_mut(key) {
            Some(slot) if Arc::ptr_eq(&slot.header, &h) => match slot.future.take() {
                Some(f) => f,
                None => return,
            },
            // A stale wake of a task that ended (its key may be reused).
            _ => return,
        }
    };
    // The queue's reference becomes the waker: no reference count traffic
    // per poll.
    let waker = Waker::from(h);
    let isolated = local.tasks.borrow()[key].isolated;
    let done = if isolated {
        let poll = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fut.as_mut().poll(&mut Context::from_waker(&waker))
        }));
        match poll {
            Ok(p) => p.is_ready(),
            Err(payload) => {
                local.task_panics.set(local.task_panics.get() + 1);
                tracing::error!(
                    target: "executor",
                    panic = panic_message(&*payload),
                    panics_on_this_core = local.task_panics.get(),
                    "a connection's task panicked (a ringway bug): that connection is closed, \
                     the core goes on"
                );
                let mut tasks = local.tasks.borrow_mut();
                tasks.remove(key);
                drop(tasks);
                // Its destructors (the access-log line, sockets) may find
                // broken state: a second panic there is contained too.
                PANICKED.set(true);
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(fut)));
                PANICKED.set(false);
                return;
            }
        }
    } else {
        fut.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
    };
    let dropped = {
        let mut tasks = local.tasks.borrow_mut();
        let slot = &mut tasks[key];
        if done || slot.cancelled {
            tasks.remove(key);
            Some(fut)
        } else {
            slot.future = Some(fut);
            None
        }
    };
    // Outside the borrow: a future's destructor may touch the executor.
    drop(dropped);
}

thread_local! {
    /// True while a panicked task's future is being dropped.
    static PANICKED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the code running now is the clean-up of a task that panicked
/// (an access log says so instead of guessing).
pub fn dropping_panicked_task() -> bool {
    PANICKED.get()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

/// The result of a task, shared between it and its [`Task`] handle.
struct Join<T> {
    result: RefCell<Option<T>>,
    done: Cell<bool>,
    waiter: RefCell<Option<Waker>>,
}

/// Handle to a spawned task: await it for its output, or drop it to cancel
/// the task (tasks nobody awaits are spawned with `spawn_detached`).
pub struct Task<T> {
    join: Rc<Join<T>>,
    header: Arc<Header>,
}

pub(super) fn spawn<T: 'static>(local: &Local, fut: impl Future<Output = T> + 'static) -> Task<T> {
    let join = Rc::new(Join {
        result: RefCell::new(None),
        done: Cell::new(false),
        waiter: RefCell::new(None),
    });
    let j = join.clone();
    let body = async move {
        let v = fut.await;
        *j.result.borrow_mut() = Some(v);
        j.done.set(true);
        if let Some(w) = j.waiter.borrow_mut().take() {
            w.wake();
        }
    };
    Task {
        join,
        header: insert(local, Box::pin(body), false),
    }
}

/// A task nobody awaits or cancels: no join state at all (a connection's
/// task lives as long as the connection, so its size is per-connection
/// memory).
pub(super) fn spawn_detached(local: &Local, fut: impl Future<Output = ()> + 'static) {
    insert(local, Box::pin(fut), true);
}

/// Puts `future` in the slab and queues it to run.
fn insert(local: &Local, future: Pin<Box<dyn Future<Output = ()>>>, isolated: bool) -> Arc<Header> {
    let mut tasks = local.tasks.borrow_mut();
    let entry = tasks.vacant_entry();
    let header = Arc::new(Header {
        key: entry.key(),
        scheduled: AtomicBool::new(true),
        shared: Arc::downgrade(&local.shared),
    });
    entry.insert(Slot {
        header: header.clone(),
        future: Some(future),
        cancelled: false,
        isolated,
    });
    drop(tasks);
    local.queue.borrow_mut().push_back(header.clone());
    header
}

impl<T> Future for Task<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if let Some(v) = self.join.result.borrow_mut().take() {
            return Poll::Ready(v);
        }
        assert!(!self.join.done.get(), "a Task polled after it completed");
        let mut waiter = self.join.waiter.borrow_mut();
        if !waiter.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waiter = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        let h = &self.header;
        if self.join.done.get() {
            return;
        }
        let fut = CURRENT.try_with(|c| {
            let c = c.borrow();
            let local = c.as_ref()?;
            let mut tasks = local.tasks.borrow_mut();
            let slot = tasks.get_mut(h.key).filter(|s| Arc::ptr_eq(&s.header, h))?;
            match slot.future.take() {
                Some(f) => {
                    tasks.remove(h.key);
                    Some(f)
                }
                None => {
                    // It is being polled (it dropped its own handle).
                    slot.cancelled = true;
                    None
                }
            }
        });
        drop(fut.ok().flatten());
    }
}
