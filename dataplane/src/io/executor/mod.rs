//! The per-core executor: one thread, one io_uring, no other wait.
//!
//! Why not glommio (which ringway used until issue 10): the data plane does
//! its socket I/O itself (nonblocking syscalls, readiness from its own
//! ring, `uring.rs`) and used glommio only for tasks and timers. glommio's
//! loop still drove three rings of its own on every pass: it re-armed a
//! preemption timer, flushed each ring with a separate `io_uring_enter`,
//! read the readiness ring's eventfd through one of them and called
//! `membarrier` before sleeping. Counted with `ringway-perf rr-kernel`,
//! that was 17.7 `io_uring_enter` and 1.5 `membarrier` calls per 1-byte
//! request/response on passthrough, against ztunnel's 5–6 system calls in
//! all. Here the readiness ring *is* the executor's ring: the loop runs
//! what is runnable, reaps completions from shared memory (no syscall),
//! and only when nothing is left does it make one `io_uring_enter` that
//! submits what the tasks queued and sleeps until a completion, the next
//! timer, or a wake-up from another thread.
//!
//! - Tasks are `!Send` futures in a slab; their wakers are `Send` (a tokio
//!   `watch` sender on the control thread wakes them). A wake on the owning
//!   thread is a queue push; a wake from another thread goes through a
//!   lock-free queue and, only if the core sleeps, an eventfd write that
//!   the ring watches.
//! - Timers are a per-core ordered map; the nearest one is the sleep's
//!   timeout, so there is no timer to re-arm per pass.
//! - Fairness: tasks run in FIFO order, each pass runs what was queued when
//!   it began, and [`yield_if_needed`] lets long loops give way after
//!   [`PREEMPT_AFTER`].

mod task;
pub mod timer;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::io::uring::{Poller, RingConfig};

pub use task::{dropping_panicked_task, Task};

/// A long-running task (an accept loop, a bulk copy, a batch of policy
/// re-checks) gives way at [`yield_if_needed`] once the current pass has
/// run this long, so completions are reaped and other tasks run.
pub const PREEMPT_AFTER: Duration = Duration::from_micros(500);

/// State shared with other threads: what they need to wake a task here.
struct Shared {
    /// Tasks woken from other threads, run on the next pass.
    remote: crossbeam_channel::Sender<Arc<task::Header>>,
    remote_rx: crossbeam_channel::Receiver<Arc<task::Header>>,
    /// True while the core sleeps (or is about to) in `io_uring_enter`; a
    /// remote waker that clears it must write the eventfd.
    parked: AtomicBool,
    /// Nonblocking eventfd the ring watches: the cross-thread doorbell.
    doorbell: OwnedFd,
}

impl Shared {
    /// Called after queueing a task. The fence pairs with the one in
    /// `turn`: either the core sees the queued task before it sleeps, or
    /// this sees `parked` and rings.
    fn ring_doorbell(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parked.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an fd we own.
            // EAGAIN (counter saturated) still leaves it readable.
            unsafe {
                libc::write(
                    self.doorbell.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }
}

/// The executor of the current thread.
struct Local {
    shared: Arc<Shared>,
    queue: RefCell<VecDeque<Arc<task::Header>>>,
    tasks: RefCell<slab::Slab<task::Slot>>,
    timers: RefCell<timer::Timers>,
    poller: Rc<Poller>,
    /// When the current pass began; [`yield_if_needed`] compares with it.
    pass_start: Cell<Instant>,
    /// The future `block_on` runs has completed: stop before sleeping.
    root_done: Cell<bool>,
    /// Detached tasks that panicked (and were ended) on this core.
    task_panics: Cell<u64>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
}

fn with_local<R>(f: impl FnOnce(&Rc<Local>) -> R) -> R {
    CURRENT.with(|c| {
        let c = c.borrow();
        let local = c
            .as_ref()
            .expect("ringway executor API used outside a ringway executor thread");
        f(local)
    })
}

/// Whether this thread runs a ringway executor (a core), where the
/// executor API may be used.
pub fn on_core() -> bool {
    // try_with: asked from a destructor while the thread's locals go.
    CURRENT
        .try_with(|c| c.try_borrow().is_ok_and(|c| c.is_some()))
        .unwrap_or(false)
}

/// Tasks alive on this core now (connections, pooled connections' drivers,
/// the core's own loops).
pub fn task_count() -> usize {
    with_local(|l| l.tasks.borrow().len())
}

/// How many detached (connection) tasks panicked on this core so far.
pub fn task_panics() -> u64 {
    with_local(|l| l.task_panics.get())
}

/// The current core's readiness ring.
pub fn poller() -> Rc<Poller> {
    with_local(|l| l.poller.clone())
}

/// Spawns `fut` on the current core. Dropping the returned [`Task`] cancels
/// it; [`spawn_detached`] is for tasks that run to their end.
pub fn spawn_local<T: 'static>(fut: impl Future<Output = T> + 'static) -> Task<T> {
    with_local(|l| task::spawn(l, fut))
}

/// Spawns `fut` on the current core to run to its end, without a handle
/// (and without the allocation a handle needs).
pub fn spawn_detached(fut: impl Future<Output = ()> + 'static) {
    with_local(|l| task::spawn_detached(l, fut))
}

/// Yields once if the current pass has run for [`PREEMPT_AFTER`] already.
pub async fn yield_if_needed() {
    let late = CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|l| l.pass_start.get().elapsed() >= PREEMPT_AFTER)
    });
    if late {
        yield_now().await;
    }
}

/// Yields to the other runnable tasks once.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx: &mut Context<'_>| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Where and how to run one core.
pub struct Builder {
    name: String,
    cpu: Option<usize>,
    ring: RingConfig,
}

impl Builder {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            cpu: None,
            ring: RingConfig::default(),
        }
    }

    /// Pins the thread to `cpu` (it fails to start if the CPU is not ours).
    pub fn pin(mut self, cpu: Option<usize>) -> Self {
        self.cpu = cpu;
        self
    }

    /// Submission queue size (the completion queue is 8× larger).
    pub fn ring_entries(mut self, entries: u32) -> Self {
        self.ring.entries = entries;
        self
    }

    /// The ring's sizes: queue entries and receive buffers.
    pub fn ring(mut self, ring: RingConfig) -> Self {
        self.ring = ring;
        self
    }

    /// Starts the thread and runs `make()`'s future on it to completion.
    pub fn spawn<F, Fut, T>(self, make: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let Builder { name, cpu, ring } = self;
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || -> Result<T, String> {
                if let Some(cpu) = cpu {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                        return Err(format!("cannot pin to CPU {cpu}: not in this process's CPUs"));
                    }
                }
                let local = Local::new(ring).map_err(|e| {
                    format!("cannot create the core's io_uring (is io_uring disabled by sysctl or seccomp?): {e}")
                })?;
                Ok(local.block_on(make()))
            })?;
        Ok(JoinHandle { thread })
    }
}

/// Waits for a core's thread; its result, or why it failed to start or
/// panicked.
pub struct JoinHandle<T> {
    thread: std::thread::JoinHandle<Result<T, String>>,
}

impl<T> JoinHandle<T> {
    pub fn join(self) -> Result<T, String> {
        match self.thread.join() {
            Ok(r) => r,
            Err(panic) => Err(panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .map_or_else(|| "panicked".to_string(), |m| format!("panicked: {m}"))),
        }
    }
}

impl Local {
    fn new(ring: RingConfig) -> io::Result<Rc<Self>> {
        // SAFETY: plain syscall; the fd is owned right below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: eventfd returned a fresh fd that nothing else owns.
        let doorbell = unsafe { OwnedFd::from_raw_fd(efd) };
        let poller = Poller::new(ring, doorbell.as_raw_fd())?;
        let (remote, remote_rx) = crossbeam_channel::unbounded();
        Ok(Rc::new(Self {
            shared: Arc::new(Shared {
                remote,
                remote_rx,
                parked: AtomicBool::new(false),
                doorbell,
            }),
            queue: RefCell::new(VecDeque::with_capacity(256)),
            tasks: RefCell::new(slab::Slab::with_capacity(256)),
            timers: RefCell::new(timer::Timers::default()),
            poller,
            pass_start: Cell::new(Instant::now()),
            root_done: Cell::new(false),
            task_panics: Cell::new(0),
        }))
    }

    /// Runs `root` and everything it spawns until `root` completes. Tasks
    /// still alive then are dropped with the executor.
    fn block_on<T: 'static>(self: Rc<Self>, root: impl Future<Output = T> + 'static) -> T {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
        let this = self.clone();
        let mut root = std::pin::pin!(spawn_local(async move {
            let v = root.await;
            this.root_done.set(true);
            v
        }));
        let root_waker = std::task::Waker::noop();
        let out = loop {
            // The root's own wake-ups come through its task, which the
            // executor runs; the handle only needs to be looked at.
            if let Poll::Ready(v) = root.as_mut().poll(&mut Context::from_waker(root_waker)) {
                break v;
            }
            self.turn();
        };
        // Drop what is left while the executor is still current: their
        // destructors may cancel polls or timers.
        let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
        drop(tasks);
        self.queue.borrow_mut().clear();
        while self.shared.remote_rx.try_recv().is_ok() {}
        CURRENT.with(|c| *c.borrow_mut() = None);
        out
    }

    /// One pass: run what is runnable, collect wake-ups from other
    /// threads, timers and the ring, and sleep only when nothing is left.
    fn turn(&self) {
        let now = Instant::now();
        self.pass_start.set(now);
        // What is queued now runs now; what these tasks wake runs next pass.
        let n = self.queue.borrow().len();
        for _ in 0..n {
            let Some(h) = self.queue.borrow_mut().pop_front() else {
                break;
            };
            task::run(self, h);
        }
        if self.root_done.get() {
            return;
        }
        self.collect();
        if !self.queue.borrow().is_empty() {
            // Busy: get queued polls into the kernel without waiting.
            self.poller.flush();
            return;
        }
        // Sleep. Tell remote wakers first, then look once more, so a wake
        // between the look and the sleep rings the doorbell.
        self.shared.parked.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.shared.remote_rx.is_empty() {
            self.shared.parked.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = self
            .timers
            .borrow()
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        if timeout != Some(Duration::ZERO) {
            self.poller.park(timeout);
        }
        self.shared.parked.store(false, Ordering::SeqCst);
        self.collect();
    }

    /// Moves every source of wake-ups into the run queue.
    fn collect(&self) {
        while let Ok(h) = self.shared.remote_rx.try_recv() {
            self.queue.borrow_mut().push_back(h);
        }
        timer::fire(self, Instant::now());
        self.poller.reap();
    }
}

#[cfg(test)]
mod tests;
