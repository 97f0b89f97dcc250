//! Per-core readiness reactor: a second io_uring, owned by one core, that only
//! carries `IORING_OP_POLL_ADD`s.
//!
//! Why not glommio's own ring: it has no public readiness API for arbitrary
//! fds and cannot submit custom SQEs. Why not `IORING_OP_SPLICE`: the kernel
//! always punts it to io-wq worker threads, which park one kernel thread per
//! idle connection (`stack-notes.md` §4). So the data plane does plain
//! nonblocking syscalls (`splice`, `read`, `write`, `accept4`) on the executor
//! thread and only asks this ring to tell it when an fd is ready again. The
//! ring signals completions through an eventfd; a glommio task reads that
//! eventfd (an async read on glommio's ring, so the executor sleeps properly)
//! and wakes the futures whose polls completed.
//!
//! Core-local (!Send): every type here lives on exactly one executor thread.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, types, IoUring};
use slab::Slab;

/// user_data of POLL_REMOVE submissions; their completions carry no waiter.
const CANCEL_TAG: u64 = u64::MAX;

enum Slot {
    /// A poll is in flight; the waker of the future waiting for it.
    Waiting(Option<Waker>),
    /// The kernel answered (revents mask, or -errno) before the future looked.
    Done(i32),
    /// The waiting future was dropped; the slot is freed when the (cancelled)
    /// completion arrives, so a user_data is never reused while in flight.
    Orphan,
}

/// The per-core readiness ring.
pub struct Poller {
    ring: RefCell<IoUring>,
    slots: RefCell<Slab<Slot>>,
    eventfd: OwnedFd,
}

impl Poller {
    /// Creates the ring and its completion eventfd. `entries` bounds the
    /// submissions queued between two `submit` calls, not the number of
    /// polls in flight (completions never overflow: the kernel buffers them
    /// with IORING_FEAT_NODROP).
    pub fn new(entries: u32) -> io::Result<Rc<Self>> {
        let ring = IoUring::builder()
            .setup_cqsize(entries.saturating_mul(8))
            .build(entries)?;
        // Blocking eventfd on purpose: glommio's read of it must wait.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        Ok(Rc::new(Self {
            ring: RefCell::new(ring),
            slots: RefCell::new(Slab::with_capacity(256)),
            eventfd,
        }))
    }

    /// Runs forever on the owning core: sleeps on the eventfd, then wakes
    /// every future whose poll completed. Spawn it once per core.
    pub async fn pump(self: Rc<Self>) {
        let dup = unsafe { libc::dup(self.eventfd.as_raw_fd()) };
        if dup < 0 {
            tracing::error!(error = %io::Error::last_os_error(), "cannot dup the readiness eventfd");
            return;
        }
        let file = unsafe { glommio::io::BufferedFile::from_raw_fd(dup) };
        loop {
            if let Err(e) = file.read_at(0, 8).await {
                // Never give up: a dead pump would stall every connection on
                // this core. Reap anyway and retry after a short pause.
                tracing::warn!(error = %e, "readiness eventfd read failed; retrying");
                let _ = self.reap();
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            let _ = self.reap();
        }
    }

    /// Safety net, spawned once per core next to [`Poller::pump`]: reaps
    /// every `every` in case an eventfd notification was missed, so a lost
    /// wake-up costs milliseconds, not a stalled connection. Completions it
    /// finds are counted and reported at debug level: they point at a bug
    /// (ours, glommio's or the kernel's) worth finding.
    pub async fn sweep(self: Rc<Self>, every: std::time::Duration) {
        let mut late = 0u64;
        loop {
            glommio::timer::sleep(every).await;
            let n = self.reap();
            if n > 0 {
                late += n as u64;
                tracing::debug!(
                    found = n,
                    total = late,
                    "readiness sweep reaped completions the pump had not"
                );
            }
        }
    }

    /// Drains the completion queue and wakes the waiters; returns how many
    /// completions it processed.
    fn reap(&self) -> usize {
        let mut ring = self.ring.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        let mut wakers = Vec::new();
        let mut seen = 0;
        for cqe in ring.completion() {
            seen += 1;
            let key = cqe.user_data();
            if key == CANCEL_TAG {
                continue;
            }
            let key = key as usize;
            let Some(slot) = slots.get_mut(key) else {
                continue;
            };
            match slot {
                Slot::Waiting(waker) => {
                    if let Some(w) = waker.take() {
                        wakers.push(w);
                    }
                    *slot = Slot::Done(cqe.result());
                }
                Slot::Orphan => {
                    slots.remove(key);
                }
                Slot::Done(_) => {}
            }
        }
        drop(slots);
        drop(ring);
        for w in wakers {
            w.wake();
        }
        seen
    }

    fn push(&self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        let mut ring = self.ring.borrow_mut();
        // SAFETY: POLL_ADD / POLL_REMOVE reference no user memory.
        if unsafe { ring.submission().push(entry) }.is_err() {
            ring.submit()?;
            unsafe { ring.submission().push(entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        ring.submit()?;
        Ok(())
    }

    /// Waits until `fd` reports one of `events` (POLLIN, POLLOUT...). Errors
    /// and hangups also complete the wait: the caller learns the details from
    /// its next syscall.
    pub fn ready(self: &Rc<Self>, fd: RawFd, events: i16) -> Ready {
        Ready {
            poller: self.clone(),
            fd,
            events,
            key: None,
        }
    }
}

/// Future returned by [`Poller::ready`]; resolves to the revents mask.
pub struct Ready {
    poller: Rc<Poller>,
    fd: RawFd,
    events: i16,
    key: Option<usize>,
}

impl Future for Ready {
    type Output = io::Result<i16>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match this.key {
            None => {
                let key = this
                    .poller
                    .slots
                    .borrow_mut()
                    .insert(Slot::Waiting(Some(cx.waker().clone())));
                let sqe = opcode::PollAdd::new(types::Fd(this.fd), this.events as u16 as u32)
                    .build()
                    .user_data(key as u64);
                if let Err(e) = this.poller.push(&sqe) {
                    this.poller.slots.borrow_mut().remove(key);
                    return Poll::Ready(Err(e));
                }
                this.key = Some(key);
                Poll::Pending
            }
            Some(key) => {
                let mut slots = this.poller.slots.borrow_mut();
                match &mut slots[key] {
                    Slot::Done(res) => {
                        let res = *res;
                        slots.remove(key);
                        this.key = None;
                        if res < 0 {
                            Poll::Ready(Err(io::Error::from_raw_os_error(-res)))
                        } else {
                            Poll::Ready(Ok(res as i16))
                        }
                    }
                    Slot::Waiting(w) => {
                        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            *w = Some(cx.waker().clone());
                        }
                        Poll::Pending
                    }
                    Slot::Orphan => unreachable!("a live Ready future never orphans its slot"),
                }
            }
        }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut slots = self.poller.slots.borrow_mut();
        match slots.get(key) {
            Some(Slot::Done(_)) => {
                slots.remove(key);
            }
            Some(Slot::Waiting(_)) => {
                slots[key] = Slot::Orphan;
                drop(slots);
                let sqe = opcode::PollRemove::new(key as u64)
                    .build()
                    .user_data(CANCEL_TAG);
                if let Err(e) = self.poller.push(&sqe) {
                    tracing::warn!(error = %e, "could not cancel a pending readiness poll");
                }
            }
            _ => {}
        }
    }
}
