//! Per-core readiness reactor: the core's io_uring, owned by one executor
//! (`executor/`), that carries `IORING_OP_POLL_ADD`s.
//!
//! Why not `IORING_OP_SPLICE`: the kernel always punts it to io-wq worker
//! threads, which park one kernel thread per idle connection
//! (`stack-notes.md` §4). So the data plane does plain nonblocking syscalls
//! (`splice`, `read`, `write`, `accept4`) on the executor thread and only
//! asks this ring to tell it when an fd is ready again. Submissions are
//! queued, not submitted: the executor submits them all with its next
//! `io_uring_enter`, which is also its sleep. Completions are reaped from
//! shared memory on every pass, without a syscall.
//!
//! Two kinds of waits:
//! - [`Poller::ready`]: one `POLL_ADD` per wait. For rare waits (connect).
//! - [`Registration`]: one multishot `POLL_ADD` for as long as the fd is in
//!   use; every wake-up of the socket posts a completion that sets ready
//!   bits, so waiting costs no syscall. HBONE sockets and listeners use it:
//!   a one-shot poll per wait cost ~25 % more CPU per small request.
//!   Splice does not (see `copy.rs`): a busy socket would post a
//!   completion per arriving segment.
//!
//! Core-local (!Send): every type here lives on exactly one executor thread.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, types, IoUring};
use slab::Slab;

/// user_data of POLL_REMOVE submissions; their completions carry no waiter.
const CANCEL_TAG: u64 = u64::MAX;
/// user_data of the standing poll on the executor's doorbell eventfd.
const DOORBELL_TAG: u64 = u64::MAX - 1;

/// What one reap saw of the doorbell.
#[derive(Default)]
struct Doorbell {
    /// Another thread woke the core: reset the eventfd's counter.
    rang: bool,
    /// The kernel ended the standing poll: arm it again.
    ended: bool,
}

enum Slot {
    /// A poll is in flight; the waker of the future waiting for it.
    Waiting(Option<Waker>),
    /// The kernel answered (revents mask, or -errno) before the future looked.
    Done(i32),
    /// The waiting future (or registration) was dropped; the slot is freed
    /// when the last (cancelled) completion arrives, so a user_data is never
    /// reused while in flight.
    Orphan,
    /// A [`Registration`]'s standing multishot poll.
    Standing(Standing),
}

/// State of one registered fd: readiness seen but not yet consumed, and
/// who waits for it.
#[derive(Default)]
struct Standing {
    /// revents bits posted by the kernel and not yet consumed by a wait.
    ready: u32,
    /// The multishot poll is in the kernel (a completion without
    /// IORING_CQE_F_MORE ends it; the next wait re-arms).
    armed: bool,
    /// A negative result (-errno) the kernel reported for the poll.
    error: Option<i32>,
    readers: Vec<Waker>,
    writers: Vec<Waker>,
}

/// Bits that end every wait, whatever it waits for; never consumed.
const STICKY: u32 = (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) as u32;
/// Everything a registration asks the kernel for.
const ALL_EVENTS: u32 = (libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP | libc::POLLPRI) as u32;
const READ_SIDE: u32 = (libc::POLLIN | libc::POLLRDHUP | libc::POLLPRI) as u32 | STICKY;
const WRITE_SIDE: u32 = libc::POLLOUT as u32 | STICKY;

/// The per-core readiness ring.
pub struct Poller {
    ring: RefCell<IoUring>,
    slots: RefCell<Slab<Slot>>,
    /// The executor's doorbell eventfd (owned by the executor).
    doorbell: RawFd,
    /// Scratch list for `reap`, kept to avoid an allocation per wake-up.
    wakers: RefCell<Vec<Waker>>,
}

impl Poller {
    /// Creates the ring, and watches `doorbell` (an eventfd other threads
    /// write to wake this core) with a standing poll. `entries` bounds the
    /// submissions queued between two enters, not the number of polls in
    /// flight (completions are never lost: what does not fit the completion
    /// queue waits in the kernel's overflow list, IORING_FEAT_NODROP, until
    /// [`Poller::reap`] flushes it).
    pub fn new(entries: u32, doorbell: RawFd) -> io::Result<Rc<Self>> {
        let ring = IoUring::builder()
            .setup_cqsize(entries.saturating_mul(8))
            .build(entries)?;
        let poller = Rc::new(Self {
            ring: RefCell::new(ring),
            slots: RefCell::new(Slab::with_capacity(256)),
            doorbell,
            wakers: RefCell::new(Vec::new()),
        });
        poller.arm_doorbell()?;
        Ok(poller)
    }

    fn arm_doorbell(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.doorbell), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(DOORBELL_TAG);
        self.push(&sqe)
    }

    /// Submits what tasks queued, without waiting (the core is busy).
    pub fn flush(&self) {
        let mut ring = self.ring.borrow_mut();
        if ring.submission().is_empty() && !ring.submission().cq_overflow() {
            return;
        }
        if let Err(e) = ring.submit() {
            tracing::warn!(error = %e, "readiness ring submit failed; retrying at the next pass");
        }
    }

    /// The core's only sleep: submits what is queued and waits for one
    /// completion, at most `timeout`. One `io_uring_enter`.
    pub fn park(&self, timeout: Option<std::time::Duration>) {
        let ring = self.ring.borrow_mut();
        let r = match timeout {
            None => ring.submit_and_wait(1),
            Some(t) => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(1, &args)
            }
        };
        if let Err(e) = r {
            match e.raw_os_error() {
                Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN) => {}
                _ => tracing::warn!(error = %e, "readiness ring wait failed"),
            }
        }
    }

    /// Drains the completion queue and wakes the waiters; returns how many
    /// completions it processed. Reads shared memory only, unless the
    /// kernel has completions in its overflow list.
    pub fn reap(&self) -> usize {
        let mut ring = self.ring.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        // Reused across reaps: no allocation per wake-up.
        let mut wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        let mut seen = 0;
        let mut doorbell = Doorbell::default();
        loop {
            seen += Self::drain(&mut ring, &mut slots, &mut wakers, &mut doorbell);
            // Completions that did not fit the queue (a burst on many
            // sockets between two reaps) wait in the kernel's overflow list
            // until an enter asks for events, and no new completion gets
            // past them: a standing poll whose last completion sits there
            // looks armed forever and its socket is never polled again.
            // `submit` asks for events when the overflow flag is set; then
            // drain what it moved into the queue. One flag load per reap.
            if !ring.submission().cq_overflow() {
                break;
            }
            if let Err(e) = ring.submit() {
                tracing::warn!(error = %e, "readiness ring submit failed; retrying at the next reap");
                break;
            }
        }
        drop(slots);
        drop(ring);
        if doorbell.rang {
            let mut buf = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from the nonblocking
            // eventfd the executor owns; only resets its counter.
            unsafe {
                libc::read(
                    self.doorbell,
                    (&mut buf as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
        if doorbell.ended {
            if let Err(e) = self.arm_doorbell() {
                tracing::error!(error = %e, "cannot re-arm the core's doorbell poll");
            }
        }
        for w in wakers.drain(..) {
            w.wake();
        }
        *self.wakers.borrow_mut() = wakers;
        seen
    }

    /// One pass over the completion queue: records what each completion
    /// says in its slot and collects the wakers to wake.
    fn drain(
        ring: &mut IoUring,
        slots: &mut Slab<Slot>,
        wakers: &mut Vec<Waker>,
        doorbell: &mut Doorbell,
    ) -> usize {
        let mut seen = 0;
        for cqe in ring.completion() {
            seen += 1;
            let key = cqe.user_data();
            if key == CANCEL_TAG {
                continue;
            }
            if key == DOORBELL_TAG {
                doorbell.rang = true;
                doorbell.ended |= !io_uring::cqueue::more(cqe.flags());
                continue;
            }
            let key = key as usize;
            let more = io_uring::cqueue::more(cqe.flags());
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
                    // A multishot poll may still post events before its
                    // cancellation completes; only its last CQE frees the key.
                    if !more {
                        slots.remove(key);
                    }
                }
                Slot::Done(_) => {}
                Slot::Standing(st) => {
                    let res = cqe.result();
                    let mut bits = 0;
                    if res < 0 {
                        st.error = Some(res);
                        bits = READ_SIDE | WRITE_SIDE;
                    } else {
                        bits |= res as u32;
                        st.ready |= res as u32;
                    }
                    if !more {
                        // The kernel ended the poll (overflow, error): wake
                        // everyone so the next wait re-arms it.
                        st.armed = false;
                        bits = READ_SIDE | WRITE_SIDE;
                    }
                    if bits & READ_SIDE != 0 {
                        wakers.append(&mut st.readers);
                    }
                    if bits & WRITE_SIDE != 0 {
                        wakers.append(&mut st.writers);
                    }
                }
            }
        }
        seen
    }

    /// Queues `entry`; the executor submits it with its next enter (the
    /// sleep, or a flush at the end of a busy pass), batched with the rest.
    /// Err only if the entry is not queued: once it is, the caller must
    /// treat the poll as in flight (its completion will come).
    fn push(&self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        let mut ring = self.ring.borrow_mut();
        // SAFETY: POLL_ADD / POLL_REMOVE reference no user memory.
        if unsafe { ring.submission().push(entry) }.is_err() {
            ring.submit()?;
            // SAFETY: as above.
            unsafe { ring.submission().push(entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        Ok(())
    }

    /// Orphans `key` and removes its poll from the kernel (submitted by the
    /// end of this pass: until the poll is gone it holds the socket's file
    /// open). The slot is freed when the poll's last completion arrives.
    fn cancel(&self, key: usize) {
        self.slots.borrow_mut()[key] = Slot::Orphan;
        let sqe = opcode::PollRemove::new(key as u64)
            .build()
            .user_data(CANCEL_TAG);
        if let Err(e) = self.push(&sqe) {
            tracing::warn!(error = %e, "could not remove a readiness poll");
        }
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
                    Slot::Orphan | Slot::Standing(_) => {
                        unreachable!("a live Ready future owns a one-shot slot")
                    }
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
                drop(slots);
                self.poller.cancel(key);
            }
            _ => {}
        }
    }
}

/// A standing readiness registration for one fd: one multishot `POLL_ADD`,
/// armed at the first wait and removed on drop, so repeated waits cost no
/// syscall. Waits are edge-style: a wait returns once the kernel reported
/// one of its events since the last wait that consumed them, so callers
/// must wait only after the syscall said EAGAIN (and may see a spurious
/// wake-up, which costs one more EAGAIN). One reader and one writer may
/// wait at a time (more are allowed, they are all woken).
///
/// The poll holds a reference to the socket's file, so the socket is only
/// really closed once the registration is dropped too.
pub struct Registration {
    poller: Rc<Poller>,
    fd: RawFd,
    key: std::cell::Cell<Option<usize>>,
    /// The last read emptied the receive queue (see [`Registration::drained`]).
    drained: std::cell::Cell<bool>,
}

impl Registration {
    pub fn new(poller: &Rc<Poller>, fd: RawFd) -> Self {
        Self {
            poller: poller.clone(),
            fd,
            key: std::cell::Cell::new(None),
            drained: std::cell::Cell::new(false),
        }
    }

    /// Records that a read just emptied the socket's receive queue: it
    /// returned EAGAIN, or fewer bytes than it asked for (TCP returns less
    /// only when nothing more is queued). The read readiness seen so far
    /// is stale, so it is dropped, and [`Registration::poll_readable`]
    /// waits for new data instead of letting the next read fail with
    /// EAGAIN: that speculative read cost up to three `recvfrom` calls per
    /// small TLS record (issue 10). Never loses a wake-up: completions are
    /// reaped only between task polls, so whatever is reaped after this
    /// call reports data that arrived after the read; a socket that still
    /// held data (a read cut short for another reason) costs one spurious
    /// wake-up at most, since a poll armed later reports current state.
    pub fn drained(&self) {
        self.drained.set(true);
        let Some(key) = self.key.get() else { return };
        if let Some(Slot::Standing(st)) = self.poller.slots.borrow_mut().get_mut(key) {
            // POLLRDHUP stays: a FIN that came with the last bytes is not
            // drained by reading them, and no new wake-up will report it.
            st.ready &= !((libc::POLLIN | libc::POLLPRI) as u32);
        }
    }

    /// Ready when a read is worth trying: at once, unless the last read
    /// drained the socket; then when new data, a hang-up or an error
    /// arrives.
    pub fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.drained.get() {
            std::task::ready!(self.poll_ready(cx, libc::POLLIN | libc::POLLRDHUP))?;
            self.drained.set(false);
        }
        Poll::Ready(Ok(()))
    }

    /// Async form of [`Registration::poll_readable`].
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_readable(cx)).await
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Waits until the kernel reports one of `events` (or an error/hang-up)
    /// that no earlier wait consumed; resolves to the bits it saw.
    pub async fn ready(&self, events: i16) -> io::Result<i16> {
        std::future::poll_fn(|cx| self.poll_ready(cx, events)).await
    }

    /// Poll form of [`Registration::ready`], for hand-written futures
    /// (the waker is kept in the registration, nothing to store).
    pub fn poll_ready(&self, cx: &mut Context<'_>, events: i16) -> Poll<io::Result<i16>> {
        let mut slots = self.poller.slots.borrow_mut();
        let key = match self.key.get() {
            Some(k) => k,
            None => {
                let k = slots.insert(Slot::Standing(Standing::default()));
                self.key.set(Some(k));
                k
            }
        };
        let Slot::Standing(st) = &mut slots[key] else {
            unreachable!("a live registration owns a standing slot");
        };
        if let Some(e) = st.error {
            return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
        }
        let wanted = events as u16 as u32 | STICKY;
        // A read wait never consumes POLLRDHUP: once the peer has shut
        // down its side, every read is worth trying (it returns the rest,
        // then EOF), and a reader that skips reads after a short one
        // ([`Registration::drained`]) must still find the EOF.
        let kept = if wanted & libc::POLLIN as u32 != 0 {
            STICKY | libc::POLLRDHUP as u32
        } else {
            STICKY
        };
        let hit = st.ready & wanted;
        if hit != 0 {
            st.ready &= !(hit & !kept);
            return Poll::Ready(Ok(hit as i16));
        }
        let waiters = if wanted & libc::POLLOUT as u32 != 0 {
            &mut st.writers
        } else {
            &mut st.readers
        };
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        if !st.armed {
            let sqe = opcode::PollAdd::new(types::Fd(self.fd), ALL_EVENTS)
                .multi(true)
                .build()
                .user_data(key as u64);
            if let Err(e) = self.poller.push(&sqe) {
                return Poll::Ready(Err(e));
            }
            st.armed = true;
        }
        Poll::Pending
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(key) = self.key.get() else { return };
        let mut slots = self.poller.slots.borrow_mut();
        let armed = matches!(&slots[key], Slot::Standing(st) if st.armed);
        if !armed {
            slots.remove(key);
            return;
        }
        drop(slots);
        self.poller.cancel(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use crate::io::executor::{poller, spawn_local, timer};

    fn on_executor<F: Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
        crate::io::executor::Builder::new("uring-test")
            .ring_entries(64)
            .spawn(f)
            .expect("executor")
            .join()
            .expect("executor ran");
    }

    fn nonblocking_pair() -> (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ) {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    fn slots_in_use(p: &Poller) -> usize {
        p.slots.borrow().len()
    }

    /// Lets the executor run (and reap) until `done` holds, for at most
    /// ten seconds; panics naming `what` if it never does.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "never happened: {what}"
            );
            timer::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The readiness bits `reg` holds, reaped and not consumed yet.
    fn pending_bits(p: &Poller, reg: &Registration) -> u32 {
        reg.key
            .get()
            .and_then(|k| match p.slots.borrow().get(k) {
                Some(Slot::Standing(st)) => Some(st.ready),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// One standing poll serves many waits: each wait sleeps until the peer
    /// writes again, and the poll is never re-armed in between.
    #[test]
    fn registration_wakes_every_wait_without_rearming() {
        on_executor(|| async {
            let p = poller();
            let (mut ours, theirs) = nonblocking_pair();
            let reg = Registration::new(&p, ours.as_raw_fd());
            let mut theirs = Some(theirs);
            for round in 0..50u8 {
                let mut buf = [0u8; 8];
                let e = ours.read(&mut buf).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                let mut peer = theirs.take().unwrap();
                let writer = spawn_local(async move {
                    timer::sleep(Duration::from_millis(2)).await;
                    peer.write_all(&[round]).unwrap();
                    peer
                });
                let bits = reg.ready(libc::POLLIN).await.expect("readiness");
                assert!(bits & libc::POLLIN != 0, "woken without POLLIN: {bits:#x}");
                assert_eq!(ours.read(&mut buf).unwrap(), 1);
                assert_eq!(buf[0], round);
                theirs = Some(writer.await);
                let key = reg.key.get().expect("armed at the first wait");
                let armed = matches!(&p.slots.borrow()[key], Slot::Standing(st) if st.armed);
                assert!(armed, "the multishot poll ended after round {round}");
            }
        });
    }

    /// A readiness event that arrived while nobody waited is not lost, and
    /// once consumed it does not wake the next wait.
    #[test]
    fn registration_keeps_unconsumed_events_and_consumes_them_once() {
        on_executor(|| async {
            let p = poller();
            let (ours, mut theirs) = nonblocking_pair();
            let reg = Registration::new(&p, ours.as_raw_fd());
            // Arm with a wait that the peer's write ends.
            theirs.write_all(b"x").unwrap();
            reg.ready(libc::POLLIN).await.unwrap();
            // A second write lands while nobody waits, and is reaped...
            theirs.write_all(b"y").unwrap();
            until("the second write's readiness is reaped", || {
                pending_bits(&p, &reg) & libc::POLLIN as u32 != 0
            })
            .await;
            // ...and the next wait returns at once.
            let quick = timer::timeout(Duration::from_secs(1), reg.ready(libc::POLLIN)).await;
            assert!(matches!(quick, Ok(Ok(_))), "buffered event lost");
            // Nothing new: the following wait must block (an event kept
            // twice would end it at once, so a short window shows it).
            let blocked = timer::timeout(Duration::from_millis(30), reg.ready(libc::POLLIN)).await;
            assert!(blocked.is_err(), "an event was delivered twice");
        });
    }

    /// After a short read the next read waits for new data (no EAGAIN
    /// attempt), yet a FIN that came with the data, and whose wake-up the
    /// wait before the read already consumed, is still found.
    #[test]
    fn a_drained_reader_waits_for_new_data_and_still_sees_eof() {
        on_executor(|| async {
            let p = poller();
            let (mut ours, mut theirs) = nonblocking_pair();
            let reg = Registration::new(&p, ours.as_raw_fd());
            let mut buf = [0u8; 64];
            // Drained: the wait blocks until the peer writes.
            assert_eq!(
                ours.read(&mut buf).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            reg.drained();
            let idle = timer::timeout(Duration::from_millis(30), reg.readable()).await;
            assert!(idle.is_err(), "a drained socket reported readable");
            theirs.write_all(b"abc").unwrap();
            timer::timeout(Duration::from_secs(1), reg.readable())
                .await
                .expect("new data must end the wait")
                .unwrap();
            assert_eq!(ours.read(&mut buf).unwrap(), 3);
            reg.drained();
            // Data and FIN together, then one wait consumes the wake-up.
            theirs.write_all(b"de").unwrap();
            theirs.shutdown(std::net::Shutdown::Write).unwrap();
            let both = (libc::POLLIN | libc::POLLRDHUP) as u32;
            until("the data and the FIN are reaped", || {
                pending_bits(&p, &reg) & both == both
            })
            .await;
            timer::timeout(Duration::from_secs(1), reg.readable())
                .await
                .expect("data and FIN must end the wait")
                .unwrap();
            assert_eq!(
                ours.read(&mut buf).unwrap(),
                2,
                "short read of the last bytes"
            );
            reg.drained();
            timer::timeout(Duration::from_secs(1), reg.readable())
                .await
                .expect("the FIN was lost: a drained reader never saw EOF")
                .unwrap();
            assert_eq!(ours.read(&mut buf).unwrap(), 0);
        });
    }

    /// More readiness at once than the completion queue holds: the
    /// completions that overflow (the standing polls they end) are flushed
    /// from the kernel by the reap, so every waiter still wakes.
    #[test]
    fn overflowing_the_completion_queue_loses_no_wake_up() {
        on_executor(|| async {
            // One submission entry, eight completion entries; a ring of its
            // own, so this test reaps it (the executor reaps only its own).
            // SAFETY: eventfd takes no memory; the fd it returns is closed below.
            let doorbell = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            assert!(doorbell >= 0);
            let p = Poller::new(1, doorbell).expect("readiness ring");
            let reaper = {
                let p = p.clone();
                spawn_local(async move {
                    loop {
                        p.flush();
                        p.reap();
                        timer::sleep(Duration::from_millis(1)).await;
                    }
                })
            };
            let pairs: Vec<_> = (0..24).map(|_| nonblocking_pair()).collect();
            let regs: Vec<_> = pairs
                .iter()
                .map(|(ours, _)| Registration::new(&p, ours.as_raw_fd()))
                .collect();
            // Arm every poll, then make every socket readable without
            // yielding: nothing can reap in between.
            let waker = futures_lite::future::block_on(std::future::poll_fn(|cx| {
                Poll::Ready(cx.waker().clone())
            }));
            for reg in &regs {
                let pending = reg.poll_ready(&mut Context::from_waker(&waker), libc::POLLIN);
                assert!(pending.is_pending(), "nothing was written yet");
            }
            for (_, theirs) in &pairs {
                (&*theirs).write_all(b"x").unwrap();
            }
            for (i, reg) in regs.iter().enumerate() {
                let woke = timer::timeout(Duration::from_secs(2), reg.ready(libc::POLLIN)).await;
                assert!(
                    matches!(woke, Ok(Ok(bits)) if bits & libc::POLLIN != 0),
                    "socket {i} never reported readable: {woke:?}"
                );
            }
            drop(reaper);
            drop(regs);
            // SAFETY: `doorbell` is this test's eventfd, closed once, after its ring is gone.
            unsafe { libc::close(doorbell) };
        });
    }

    /// Dropping the registration removes the kernel's poll (which holds the
    /// file): closing the socket then really closes it, the peer sees EOF,
    /// and the slot is freed.
    #[test]
    fn dropping_a_registration_lets_the_socket_close() {
        on_executor(|| async {
            let p = poller();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            server.set_nonblocking(true).unwrap();
            let reg = Registration::new(&p, server.as_raw_fd());
            client.write_all(b"hi").unwrap();
            reg.ready(libc::POLLIN).await.unwrap();
            // Read it: closing with unread bytes would send RST, not FIN.
            let mut got = [0u8; 2];
            server.read_exact(&mut got).unwrap();
            assert_eq!(slots_in_use(&p), 1);
            drop(reg);
            drop(server);
            // The poll's removal is submitted at the end of this pass.
            crate::io::executor::yield_now().await;
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut buf = [0u8; 4];
            let n = client
                .read(&mut buf)
                .expect("EOF, not a timeout: the poll kept the socket open");
            assert_eq!(n, 0);
            // The cancellation completes; a reap frees the key.
            until("the registration's slot is freed", || slots_in_use(&p) == 0).await;
        });
    }
}
