//! The core's io_uring, owned by one executor (`executor/`): completion
//! I/O for sockets, readiness for the rest.
//!
//! Sockets on the traffic paths are [`RingSocket`]s: bytes arrive by a
//! multishot `RECV` into the core's provided-buffer ring ([`BufRing`]) and
//! leave by `SEND`/`SENDMSG`s that the executor submits with its next
//! `io_uring_enter`, which is also its sleep. A one-byte request that
//! crosses the proxy therefore costs one system call per direction: the
//! enter that sleeps until the request's completion arrives also carries
//! the previous answer's send. Readiness (`POLL_ADD`) stays for what has no
//! completion form worth having here: listeners, connects, and the splice
//! path bulk passthrough switches to (`IORING_OP_SPLICE` always goes to
//! io-wq worker threads, which park a kernel thread per idle connection;
//! `stack-notes.md` §4).
//!
//! How the ring is set up, newest kernels first (each step falls back to
//! the next when the kernel refuses its flags, and the executor logs which
//! it got):
//! 1. `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG | SUBMIT_ALL` (6.1):
//!    completions are produced only inside this thread's enters, never by
//!    interrupting it, and in batches;
//! 2. `COOP_TASKRUN | TASKRUN_FLAG | SUBMIT_ALL` (5.19);
//! 3. no flags.
//!
//! Quiet sends: a send is submitted with `MSG_DONTWAIT` (the kernel
//! settles it during the submitting enter: all sent, part sent, or EAGAIN)
//! and, when no task waits for it, with `IOSQE_CQE_SKIP_SUCCESS`: a send
//! that went out whole posts no completion, so it cannot end the sleep it
//! was submitted with. A short or failed one posts its completion before
//! that enter returns (the kernel fails a NOWAIT request inline), so once
//! the enter has returned and its completions are reaped, a quiet send
//! without one is known to be done and its buffer is released. A probe at
//! start-up checks both halves of that contract on the running kernel;
//! where it does not hold, every send posts a completion (correct, one
//! enter more per direction).
//!
//! Core-local (!Send): every type here lives on exactly one executor thread.

mod bufring;
mod readiness;
mod sock;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::Waker;

use io_uring::{opcode, squeue, types, IoUring};
use slab::Slab;

pub use bufring::{BufRing, RecvBuf};
pub use readiness::{Ready, Registration};
pub use sock::{Incoming, RingSocket, SocketCaps};

use readiness::Standing;
use sock::SockState;

/// user_data of cancellations and other submissions whose completion
/// carries no waiter.
const CANCEL_TAG: u64 = u64::MAX;
/// user_data of the standing poll on the executor's doorbell eventfd.
const DOORBELL_TAG: u64 = u64::MAX - 1;

/// Which of a slot's operations a completion belongs to: the low bits of
/// its user_data (the rest is the slot's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A readiness poll (one-shot or standing).
    Poll = 0,
    /// A socket's multishot receive.
    Recv = 1,
    /// A socket's send.
    Send = 2,
    /// A socket's wait for room to send after a short send.
    Writable = 3,
}

const OP_BITS: u32 = 2;

fn tag(key: usize, op: Op) -> u64 {
    ((key as u64) << OP_BITS) | op as u64
}

fn untag(user_data: u64) -> (usize, Op) {
    let op = match user_data & ((1 << OP_BITS) - 1) {
        0 => Op::Poll,
        1 => Op::Recv,
        2 => Op::Send,
        _ => Op::Writable,
    };
    ((user_data >> OP_BITS) as usize, op)
}

/// What one reap saw of the doorbell.
#[derive(Default)]
struct Doorbell {
    /// Another thread woke the core: reset the eventfd's counter.
    rang: bool,
    /// The kernel ended the standing poll: arm it again.
    ended: bool,
    /// Orphaned polls that posted an event after their removal was asked
    /// for: the kernel refuses a removal that races an event being posted
    /// (-EALREADY) and a multishot poll then lives on, holding its socket
    /// open after ringway closed it (seen with a peer trickling bytes).
    /// Asked again at the end of the pass.
    outlived: Vec<usize>,
}

enum Slot {
    /// A one-shot poll is in flight; the waker of the future waiting for it.
    Waiting(Option<Waker>),
    /// The kernel answered (revents mask, or -errno) before the future looked.
    Done(i32),
    /// The waiting future (or registration) was dropped; the slot is freed
    /// when the last (cancelled) completion arrives, so a user_data is never
    /// reused while in flight.
    Orphan,
    /// A [`Registration`]'s standing multishot poll.
    Standing(Standing),
    /// A [`RingSocket`]: its receive, its sends, and what waits on them.
    /// Boxed: its send header and vectors must not move while a send is in
    /// the kernel, and a slab may move its entries as it grows.
    Sock(Box<SockState>),
}

/// How the ring was set up (see the module doc), for the start-up log and
/// the admin page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskRun {
    /// `SINGLE_ISSUER | DEFER_TASKRUN`.
    Deferred,
    /// `COOP_TASKRUN`.
    Cooperative,
    /// The kernel's default (task work interrupts the thread).
    Default,
}

/// What the ring can do on this kernel, decided once per core at start.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct RingSetup {
    pub io: IoMode,
    pub task_run: TaskRun,
    /// Sends that go out whole post no completion (see the module doc).
    pub quiet_sends: bool,
    /// A multishot receive takes a byte budget (6.15+): it ends by itself
    /// once a socket has received up to its cap, so a burst already queued
    /// in the kernel's socket buffer is not pulled into ours. Without it
    /// the receive is cancelled at the cap, and one burst may overshoot by
    /// up to the buffer ring's size.
    pub recv_budget: bool,
    /// The provided-buffer ring: buffers and their size.
    pub recv_buffers: u16,
    pub recv_buffer_size: u32,
}

/// How sockets on the traffic paths move their bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// Receives and sends are ring operations ([`RingSocket`]): no system
    /// call per message.
    Completion,
    /// The ring reports readiness and bytes move by `recv`/`send`/`splice`
    /// system calls (ringway before issue 22; kept to compare and as a
    /// fallback).
    Readiness,
}

/// Sizes of the per-core ring and its receive buffers, and how sockets
/// use it.
#[derive(Clone, Copy, Debug)]
pub struct RingConfig {
    /// Submission queue entries (the completion queue is 8× larger).
    pub entries: u32,
    /// Provided receive buffers per core (a power of two, at most 32768).
    pub recv_buffers: u16,
    /// Bytes per receive buffer.
    pub recv_buffer_size: u32,
    pub io: IoMode,
    /// What one socket may hold each way (completion mode).
    pub caps: SocketCaps,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            entries: 1024,
            recv_buffers: 256,
            recv_buffer_size: 32 << 10,
            io: IoMode::Completion,
            caps: SocketCaps::default(),
        }
    }
}

/// Counters of what the ring did on this core (admin's per-core view, and
/// the tests that check a path stays off system calls).
#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub struct RingStats {
    /// `io_uring_enter` calls made to sleep, to submit, or to run
    /// deferred work.
    pub enters: u64,
    /// Completions reaped.
    pub completions: u64,
    /// Receive completions that carried bytes.
    pub recvs: u64,
    /// Sends submitted, and how many of them were quiet.
    pub sends: u64,
    pub quiet_sends: u64,
    /// Sends the socket took only part of (or none: EAGAIN).
    pub short_sends: u64,
    /// Receives ended because the buffer ring was empty.
    pub starved: u64,
    /// Received bytes copied out of the buffer ring because their reader
    /// did not take them before the core slept.
    pub compacted_bytes: u64,
    /// Receives cancelled because a socket's reader fell behind its cap.
    pub paused: u64,
}

/// The per-core ring.
pub struct Poller {
    // Declared before `bufs`: the ring (and the kernel's use of the
    // buffers) goes first.
    ring: RefCell<IoUring>,
    slots: RefCell<Slab<Slot>>,
    /// The executor's doorbell eventfd (owned by the executor).
    doorbell: RawFd,
    /// Scratch list for `reap`, kept to avoid an allocation per wake-up.
    wakers: RefCell<Vec<Waker>>,
    bufs: Rc<BufRing>,
    setup: RingSetup,
    caps: SocketCaps,
    /// Socket slots with a receive to arm or cancel, or bytes to send,
    /// before the next enter.
    dirty: RefCell<Vec<usize>>,
    /// Sockets whose receive ended on an empty buffer ring: re-armed once
    /// buffers come back.
    starved: RefCell<Vec<usize>>,
    /// Sockets whose inbox held ring buffers at the last look: compacted
    /// before the core sleeps, so no buffer waits on a slow reader.
    holding: RefCell<Vec<usize>>,
    /// Submissions queued so far, and how many of them the kernel has
    /// consumed (both counts since the ring was made).
    pushed: Cell<u64>,
    consumed: Cell<u64>,
    /// Quiet sends not yet known to be done: (submission number, slot).
    quiet: RefCell<VecDeque<(u64, usize)>>,
    /// Send buffers kept for reuse (copying writes), at most
    /// [`SPARE_VECS`] of them.
    spare: RefCell<Vec<Vec<u8>>>,
    stats: RefCell<RingStats>,
}

/// Copy buffers of this size are kept for reuse; larger ones are freed.
const SPARE_CAPACITY: usize = 64 << 10;
/// Few: one per socket sending at once is enough to avoid an allocation
/// per send, and every spare one is idle memory of the core.
const SPARE_VECS: usize = 8;
/// The smallest copy buffer: a page (one TLS record of a small message fits).
const MIN_COPY: usize = 4 << 10;

impl Poller {
    /// Creates the ring and its receive buffers, and watches `doorbell` (an
    /// eventfd other threads write to wake this core) with a standing poll.
    /// `cfg.entries` bounds the submissions queued between two enters, not
    /// the operations in flight (completions are never lost: what does not
    /// fit the completion queue waits in the kernel's overflow list,
    /// IORING_FEAT_NODROP, until [`Poller::reap`] flushes it).
    pub fn new(cfg: RingConfig, doorbell: RawFd) -> io::Result<Rc<Self>> {
        let (mut ring, task_run) = build_ring(cfg.entries)?;
        let bufs = BufRing::new(&ring, 0, cfg.recv_buffers, cfg.recv_buffer_size).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot register {} receive buffers of {} bytes with the core's ring (kernel 6.0 or newer is needed): {e}",
                    cfg.recv_buffers, cfg.recv_buffer_size
                ),
            )
        })?;
        let quiet_sends = probe_quiet_sends(&mut ring).unwrap_or(false);
        let recv_budget = probe_recv_budget(&mut ring, &bufs).unwrap_or(false);
        let poller = Rc::new(Self {
            ring: RefCell::new(ring),
            slots: RefCell::new(Slab::with_capacity(256)),
            doorbell,
            wakers: RefCell::new(Vec::new()),
            bufs: Rc::new(bufs),
            caps: cfg.caps,
            setup: RingSetup {
                io: cfg.io,
                task_run,
                quiet_sends,
                recv_budget,
                recv_buffers: cfg.recv_buffers,
                recv_buffer_size: cfg.recv_buffer_size,
            },
            dirty: RefCell::new(Vec::new()),
            starved: RefCell::new(Vec::new()),
            holding: RefCell::new(Vec::new()),
            pushed: Cell::new(0),
            consumed: Cell::new(0),
            quiet: RefCell::new(VecDeque::new()),
            spare: RefCell::new(Vec::new()),
            stats: RefCell::new(RingStats::default()),
        });
        poller.arm_doorbell()?;
        Ok(poller)
    }

    /// How this core's ring was set up.
    pub fn setup(&self) -> RingSetup {
        self.setup
    }

    /// Sockets move bytes by completions (not readiness and syscalls).
    pub fn completion(&self) -> bool {
        self.setup.io == IoMode::Completion
    }

    /// What one socket may hold each way.
    pub fn caps(&self) -> SocketCaps {
        self.caps
    }

    /// What the ring has done on this core so far.
    pub fn stats(&self) -> RingStats {
        *self.stats.borrow()
    }

    /// Bytes per receive buffer.
    pub fn recv_buffer_size(&self) -> usize {
        self.bufs.buffer_size()
    }

    /// Receive buffers nobody reads now (in the ring, or waiting to go
    /// back in).
    pub fn free_recv_buffers(&self) -> usize {
        self.bufs.unused()
    }

    /// The working set of receive buffers the ring is kept topped up to.
    pub fn recv_buffer_target(&self) -> usize {
        self.bufs.target()
    }

    fn arm_doorbell(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.doorbell), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(DOORBELL_TAG);
        self.push(&sqe)
    }

    /// Submits what tasks queued, without waiting (the core is busy); also
    /// runs deferred task work the kernel flagged, so its completions are
    /// there for the next reap.
    pub fn flush(&self) {
        self.prepare();
        let mut ring = self.ring.borrow_mut();
        let sq = ring.submission();
        if sq.is_empty() && !sq.taskrun() && !sq.cq_overflow() {
            return;
        }
        drop(sq);
        let r = ring.submit();
        drop(ring);
        self.entered();
        if let Err(e) = r {
            tracing::warn!(error = %e, "core ring submit failed; retrying at the next pass");
        }
    }

    /// The core's only sleep: submits what is queued and waits for one
    /// completion, at most `timeout`. One `io_uring_enter`.
    pub fn park(&self, timeout: Option<std::time::Duration>) {
        self.prepare();
        self.compact();
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
        drop(ring);
        self.entered();
        if let Err(e) = r {
            match e.raw_os_error() {
                Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN) => {}
                _ => tracing::warn!(error = %e, "core ring wait failed"),
            }
        }
    }

    /// Records how far the kernel has consumed the submission queue after
    /// an enter: quiet sends up to there are settled once the completions
    /// this enter posted are reaped.
    fn entered(&self) {
        let mut ring = self.ring.borrow_mut();
        let left = ring.submission().len() as u64;
        self.consumed.set(self.pushed.get() - left);
        self.stats.borrow_mut().enters += 1;
    }

    /// Drains the completion queue and wakes the waiters; returns how many
    /// completions it processed. Reads shared memory only, unless the
    /// kernel has completions in its overflow list.
    pub fn reap(&self) -> usize {
        let mut seen = 0;
        let mut doorbell = Doorbell::default();
        // Reused across reaps: no allocation per wake-up.
        let mut wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        loop {
            seen += self.drain(&mut wakers, &mut doorbell);
            // Completions that did not fit the queue (a burst on many
            // sockets between two reaps) wait in the kernel's overflow list
            // until an enter asks for events, and no new completion gets
            // past them: a standing poll whose last completion sits there
            // looks armed forever and its socket is never polled again.
            // `submit` asks for events when the overflow flag is set; then
            // drain what it moved into the queue. One flag load per reap.
            let mut ring = self.ring.borrow_mut();
            if !ring.submission().cq_overflow() {
                break;
            }
            let r = ring.submit();
            drop(ring);
            self.entered();
            if let Err(e) = r {
                tracing::warn!(error = %e, "core ring submit failed; retrying at the next reap");
                break;
            }
        }
        // Every completion the consumed submissions posted is in hand now:
        // the quiet sends among them that posted none went out whole.
        self.settle_quiet(&mut wakers);
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
        // Still orphaned (no last CQE in this pass): remove it again. The
        // key cannot have been reused, so this names the same poll; a
        // second removal of one already gone only gets -ENOENT.
        for key in doorbell.outlived.drain(..) {
            if matches!(self.slots.borrow().get(key), Some(Slot::Orphan)) {
                self.cancel_poll(key);
            }
        }
        if doorbell.ended {
            if let Err(e) = self.arm_doorbell() {
                tracing::error!(error = %e, "cannot re-arm the core's doorbell poll");
            }
        }
        self.stats.borrow_mut().completions += seen as u64;
        for w in wakers.drain(..) {
            w.wake();
        }
        *self.wakers.borrow_mut() = wakers;
        seen
    }

    /// One pass over the completion queue: records what each completion
    /// says in its slot and collects the wakers to wake.
    fn drain(&self, wakers: &mut Vec<Waker>, doorbell: &mut Doorbell) -> usize {
        let mut ring = self.ring.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        let mut seen = 0;
        for cqe in ring.completion() {
            seen += 1;
            let user_data = cqe.user_data();
            if user_data == CANCEL_TAG {
                continue;
            }
            if user_data == DOORBELL_TAG {
                doorbell.rang = true;
                doorbell.ended |= !io_uring::cqueue::more(cqe.flags());
                continue;
            }
            let (key, op) = untag(user_data);
            let more = io_uring::cqueue::more(cqe.flags());
            let Some(slot) = slots.get_mut(key) else {
                // Only a receive can still hold a buffer for a slot that is
                // gone; give it back rather than lose it.
                if let Some(bid) = io_uring::cqueue::buffer_select(cqe.flags()) {
                    self.bufs.give_back(bid);
                }
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
                    } else {
                        doorbell.outlived.push(key);
                    }
                }
                Slot::Done(_) => {}
                Slot::Standing(st) => st.complete(cqe.result(), more, wakers),
                Slot::Sock(st) => {
                    let (res, flags) = (cqe.result(), cqe.flags());
                    self.completing(key, wakers, |cx| st.complete(op, res, flags, cx));
                    if st.finished() {
                        slots.remove(key);
                    }
                }
            }
        }
        seen
    }

    /// Runs `f` with what a socket's completion may touch besides its own
    /// state (the caller holds the slot).
    fn completing(
        &self,
        key: usize,
        wakers: &mut Vec<Waker>,
        f: impl FnOnce(&mut sock::Completion<'_>),
    ) {
        f(&mut sock::Completion {
            key,
            bufs: &self.bufs,
            wakers,
            dirty: &mut self.dirty.borrow_mut(),
            starved: &mut self.starved.borrow_mut(),
            holding: &mut self.holding.borrow_mut(),
            stats: &mut self.stats.borrow_mut(),
            spare: &mut self.spare.borrow_mut(),
        })
    }

    /// Settles the quiet sends the kernel has consumed and that posted no
    /// completion: they went out whole.
    fn settle_quiet(&self, wakers: &mut Vec<Waker>) {
        let consumed = self.consumed.get();
        let mut quiet = self.quiet.borrow_mut();
        if quiet.is_empty() {
            return;
        }
        let mut slots = self.slots.borrow_mut();
        while let Some(&(seq, key)) = quiet.front() {
            if seq >= consumed {
                break;
            }
            quiet.pop_front();
            let Some(Slot::Sock(st)) = slots.get_mut(key) else {
                continue;
            };
            self.completing(key, wakers, |cx| st.settle_quiet(seq, cx));
            if st.finished() {
                slots.remove(key);
            }
        }
    }

    /// Turns what sockets asked for during this pass into submissions:
    /// receives to arm or cancel, sends, waits for room. Called right
    /// before every enter, so a pass's writes to one socket go out as one
    /// send.
    fn prepare(&self) {
        self.rearm_starved();
        let mut dirty = self.dirty.borrow_mut();
        if dirty.is_empty() {
            return;
        }
        let keys = std::mem::take(&mut *dirty);
        drop(dirty);
        let mut slots = self.slots.borrow_mut();
        for &key in &keys {
            let Some(Slot::Sock(st)) = slots.get_mut(key) else {
                continue;
            };
            let mut out = sock::Submit::default();
            st.prepare(key, &self.setup, self.bufs.group(), &mut out);
            for (sqe, kind) in out.entries() {
                let seq = self.pushed.get();
                if let Err(e) = self.push(sqe) {
                    // Not queued: the socket learns it as an error.
                    tracing::warn!(error = %e, "core ring full; failing a socket operation");
                    st.submit_failed(kind, &mut self.wakers.borrow_mut());
                    continue;
                }
                st.submitted(kind, seq);
                match kind {
                    sock::Kind::QuietSend => {
                        self.quiet.borrow_mut().push_back((seq, key));
                        let mut s = self.stats.borrow_mut();
                        s.sends += 1;
                        s.quiet_sends += 1;
                    }
                    sock::Kind::Send => self.stats.borrow_mut().sends += 1,
                    sock::Kind::CancelRecv => self.stats.borrow_mut().paused += 1,
                    _ => {}
                }
            }
        }
        let mut dirty = self.dirty.borrow_mut();
        if dirty.is_empty() {
            // Hand the (cleared) list back: its capacity is reused.
            let mut keys = keys;
            keys.clear();
            *dirty = keys;
        }
    }

    /// Re-arms the receives that ended on an empty buffer ring, once the
    /// ring has buffers again (its working set has grown since).
    fn rearm_starved(&self) {
        let mut starved = self.starved.borrow_mut();
        if starved.is_empty() || self.bufs.available() == 0 {
            return;
        }
        let mut slots = self.slots.borrow_mut();
        let mut dirty = self.dirty.borrow_mut();
        for key in starved.drain(..) {
            if let Some(Slot::Sock(st)) = slots.get_mut(key) {
                if st.unstarve() {
                    dirty.push(key);
                }
            }
        }
    }

    /// Copies received bytes that their reader has not taken out of the
    /// buffer ring, so a slow or stalled reader never holds ring buffers
    /// while the core sleeps: the ring serves every connection of the core.
    fn compact(&self) {
        let mut holding = self.holding.borrow_mut();
        if holding.is_empty() {
            return;
        }
        let mut slots = self.slots.borrow_mut();
        let mut stats = self.stats.borrow_mut();
        for key in holding.drain(..) {
            if let Some(Slot::Sock(st)) = slots.get_mut(key) {
                stats.compacted_bytes += st.compact() as u64;
            }
        }
    }

    /// Queues `entry`; the executor submits it with its next enter (the
    /// sleep, or a flush at the end of a busy pass), batched with the rest.
    /// Err only if the entry is not queued: once it is, the caller must
    /// treat the operation as in flight (its completion will come).
    fn push(&self, entry: &squeue::Entry) -> io::Result<()> {
        let mut ring = self.ring.borrow_mut();
        // SAFETY: every entry pushed here references either no user memory
        // (polls, cancels, receives into the registered buffer ring) or a
        // send's buffers, which its socket slot keeps alive and in place
        // until the send is settled.
        if unsafe { ring.submission().push(entry) }.is_err() {
            ring.submit()?;
            drop(ring);
            self.entered();
            ring = self.ring.borrow_mut();
            // SAFETY: as above.
            unsafe { ring.submission().push(entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.pushed.set(self.pushed.get() + 1);
        Ok(())
    }

    /// Submits now what is queued, so that no queued operation can outlive
    /// the descriptor it names (a socket closed right after would otherwise
    /// have its number reused by the next socket before the enter).
    fn submit_now(&self) {
        let r = self.ring.borrow_mut().submit();
        self.entered();
        if let Err(e) = r {
            tracing::warn!(error = %e, "core ring submit failed");
        }
    }

    /// True while a submission numbered `seq` has not reached the kernel.
    fn unsubmitted(&self, seq: Option<u64>) -> bool {
        seq.is_some_and(|s| s >= self.consumed.get())
    }

    /// Orphans `key` and removes its poll from the kernel (submitted by the
    /// end of this pass: until the poll is gone it holds the socket's file
    /// open). The slot is freed when the poll's last completion arrives.
    fn cancel_poll(&self, key: usize) {
        self.slots.borrow_mut()[key] = Slot::Orphan;
        let sqe = opcode::PollRemove::new(tag(key, Op::Poll))
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
        Ready::new(self.clone(), fd, events)
    }

    /// A copy buffer for a socket's writes: reused when one is spare.
    fn take_vec(&self, at_least: usize) -> Vec<u8> {
        if at_least <= SPARE_CAPACITY {
            if let Some(v) = self.spare.borrow_mut().pop() {
                return v;
            }
            return Vec::with_capacity(at_least.max(MIN_COPY));
        }
        Vec::with_capacity(at_least)
    }
}

/// Gives a copy buffer back for reuse (or frees it).
fn recycle(spare: &mut Vec<Vec<u8>>, mut v: Vec<u8>) {
    if v.capacity() <= SPARE_CAPACITY && spare.len() < SPARE_VECS {
        v.clear();
        spare.push(v);
    }
}

/// Builds the ring with the best task-run mode the kernel accepts.
fn build_ring(entries: u32) -> io::Result<(IoUring, TaskRun)> {
    let cq = entries.saturating_mul(8);
    let deferred = IoUring::builder()
        .setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_submit_all()
        .build(entries);
    let mut refused = match deferred {
        Ok(r) => return Ok((r, TaskRun::Deferred)),
        Err(e) => e,
    };
    if refused.raw_os_error() == Some(libc::EINVAL) {
        match IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_submit_all()
            .build(entries)
        {
            Ok(r) => return Ok((r, TaskRun::Cooperative)),
            Err(e) => refused = e,
        }
    }
    if refused.raw_os_error() != Some(libc::EINVAL) {
        return Err(refused);
    }
    Ok((
        IoUring::builder().setup_cqsize(cq).build(entries)?,
        TaskRun::Default,
    ))
}

/// Checks that a multishot receive honours a byte budget on this kernel:
/// armed with a budget of one byte over a socket holding three buffers'
/// worth, it must deliver one buffer and end, leaving the rest queued.
fn probe_recv_budget(ring: &mut IoUring, bufs: &BufRing) -> io::Result<bool> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let (mut a, b) = std::os::unix::net::UnixStream::pair()?;
    let chunk = bufs.buffer_size().min(16 << 10);
    a.write_all(&vec![0u8; chunk * 3])?;
    let sqe = sock::with_recv_budget(
        opcode::RecvMulti::new(types::Fd(b.as_raw_fd()), bufs.group())
            .build()
            .user_data(1),
        1,
    );
    // SAFETY: the receive writes only into the registered buffer ring.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("probe: submission queue full"))?;
    ring.submit_and_wait(1)?;
    let mut data = 0;
    let mut ended = false;
    let mut cancel_needed = true;
    for _ in 0..2 {
        for c in ring.completion() {
            if let Some(bid) = io_uring::cqueue::buffer_select(c.flags()) {
                bufs.taken();
                bufs.give_back(bid);
            }
            if c.user_data() != 1 {
                continue;
            }
            if c.result() > 0 {
                data += 1;
            }
            if !io_uring::cqueue::more(c.flags()) {
                ended = true;
                cancel_needed = false;
            }
        }
        if ended {
            break;
        }
        ring.submit()?;
    }
    if cancel_needed {
        let sqe = opcode::AsyncCancel::new(1).build().user_data(2);
        // SAFETY: a cancellation references no memory.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("probe: submission queue full"))?;
        ring.submit_and_wait(2)?;
        for c in ring.completion() {
            if let Some(bid) = io_uring::cqueue::buffer_select(c.flags()) {
                bufs.taken();
                bufs.give_back(bid);
            }
        }
    }
    Ok(ended && data == 1)
}

/// Checks the quiet-send contract (module doc) on this kernel, on a pair
/// of Unix stream sockets: a send that fits posts no completion and its
/// bytes arrive; one that does not fit posts its completion (with the part
/// sent, or EAGAIN) by the time the submitting enter returns. Runs before
/// the ring has any other user.
fn probe_quiet_sends(ring: &mut IoUring) -> io::Result<bool> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    if !ring.params().is_feature_skip_cqe_on_success() {
        return Ok(false);
    }
    let (a, mut b) = std::os::unix::net::UnixStream::pair()?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let small = [7u8; 16];
    let big = vec![1u8; 8 << 20];
    let send = |buf: &[u8], ud: u64| {
        opcode::Send::new(types::Fd(a.as_raw_fd()), buf.as_ptr(), buf.len() as u32)
            .flags(sock::SEND_FLAGS)
            .build()
            .flags(squeue::Flags::SKIP_SUCCESS)
            .user_data(ud)
    };
    let completions = |ring: &mut IoUring, ud: u64| -> Vec<i32> {
        ring.completion()
            .filter(|c| c.user_data() == ud)
            .map(|c| c.result())
            .collect()
    };
    // SAFETY: `small` outlives the submit below, which settles the send
    // (MSG_DONTWAIT: the kernel does not keep it past the enter).
    unsafe { ring.submission().push(&send(&small, 1)) }
        .map_err(|_| io::Error::other("probe: submission queue full"))?;
    ring.submit()?;
    let quiet_whole = completions(ring, 1).is_empty();
    let mut got = [0u8; 32];
    let arrived = matches!(b.read(&mut got), Ok(16));
    // Larger than the socket's buffer: part of it, or nothing, fits.
    // SAFETY: as above, for `big`.
    unsafe { ring.submission().push(&send(&big, 2)) }
        .map_err(|_| io::Error::other("probe: submission queue full"))?;
    ring.submit()?;
    let short = completions(ring, 2);
    let loud_short = matches!(short.as_slice(),
        [r] if *r == -libc::EAGAIN || (*r > 0 && (*r as usize) < big.len()));
    drop(big);
    Ok(quiet_whole && arrived && loud_short)
}

#[cfg(test)]
mod tests;
