//! [`RingSocket`]: a TCP socket whose bytes move by completions on the
//! core's ring. Receiving is one multishot `RECV` into the core's buffer
//! ring for as long as someone reads; sending queues owned bytes that the
//! executor hands to the kernel with its next enter, one send per socket
//! per pass (`SEND`, or `SENDMSG` over several queued pieces).
//!
//! Backpressure. A multishot receive does not stop at the TCP window: the
//! kernel moves bytes into our buffers whenever they arrive. So each socket
//! has a receive cap: once its reader has that much waiting, the receive is
//! cancelled, the kernel's socket buffer fills and the TCP window closes;
//! it is re-armed when the reader has taken half of it. Writes wait once a
//! socket has its send cap queued. Bytes a reader has not taken when the
//! core goes to sleep are copied out of the buffer ring
//! ([`SockState::compact`]), so the ring, which serves every connection on
//! the core, never waits on a slow one.
//!
//! Ordering: at most one send per socket is in the kernel at a time. A
//! short send (the socket buffer is full) waits for `POLLOUT` before the
//! rest goes.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use io_uring::{cqueue, opcode, squeue, types};
use tokio::io::ReadBuf;

use super::bufring::{BufRing, RecvBuf};
use super::{tag, Op, Poller, RingSetup, RingStats, Slot, CANCEL_TAG};

/// Every send: settled during the submitting enter (`MSG_DONTWAIT`), all
/// of it or a completion that says how much (`MSG_WAITALL`), and EPIPE
/// rather than SIGPIPE when the peer is gone.
pub(super) const SEND_FLAGS: i32 = libc::MSG_DONTWAIT | libc::MSG_WAITALL | libc::MSG_NOSIGNAL;
/// `last_fd_seq` before any submission named the descriptor.
const NO_SEQ: u64 = u64::MAX;
/// Pieces gathered into one `SENDMSG`.
const MAX_IOV: usize = 16;
/// Bytes handed to the kernel by one send.
const MAX_SEND: usize = 1 << 20;

/// How many bytes a socket may hold on each side.
#[derive(Clone, Copy, Debug)]
pub struct SocketCaps {
    /// Received bytes not yet taken by the reader, beyond which the
    /// receive is paused.
    pub recv: u32,
    /// Bytes queued to send, beyond which writes wait.
    pub send: u32,
}

impl Default for SocketCaps {
    fn default() -> Self {
        Self {
            recv: 256 << 10,
            send: 256 << 10,
        }
    }
}

/// Received bytes, in a buffer of the core's ring or (after compaction)
/// on the heap.
pub struct Incoming(Piece);

/// Bytes queued to send: received bytes passed on as they are (no copy),
/// bytes from h2, or a copy a write made.
pub struct Outgoing(Piece);

enum Piece {
    Ring(RecvBuf),
    Heap { bytes: Vec<u8>, start: usize },
    Shared(Bytes),
}

impl Piece {
    fn as_slice(&self) -> &[u8] {
        match self {
            Piece::Ring(b) => b,
            Piece::Heap { bytes, start } => &bytes[*start..],
            Piece::Shared(b) => b,
        }
    }
    fn advance(&mut self, n: usize) {
        match self {
            Piece::Ring(b) => b.advance(n),
            Piece::Heap { bytes, start } => *start = (*start + n).min(bytes.len()),
            Piece::Shared(b) => bytes::Buf::advance(b, n.min(b.len())),
        }
    }
    fn is_ring(&self) -> bool {
        matches!(self, Piece::Ring(_))
    }
}

/// The pieces queued on one side of a socket. Most sockets have none or one
/// waiting, and an idle connection should hold no memory for its queues:
/// one piece lives inline, more go to a deque that is freed once empty.
#[derive(Default)]
struct Pieces {
    head: Option<Piece>,
    /// Only while more than one piece waits. Boxed on purpose: 8 bytes in
    /// every socket's state instead of a deque's 32, for a deque most
    /// sockets never need.
    #[allow(clippy::box_collection)]
    rest: Option<Box<VecDeque<Piece>>>,
}

impl Pieces {
    fn len(&self) -> usize {
        self.head.is_some() as usize + self.rest.as_ref().map_or(0, |r| r.len())
    }
    fn is_empty(&self) -> bool {
        self.head.is_none()
    }
    fn push_back(&mut self, p: Piece) {
        if self.head.is_none() {
            self.head = Some(p);
        } else {
            self.rest.get_or_insert_default().push_back(p);
        }
    }
    fn push_front(&mut self, p: Piece) {
        if let Some(old) = self.head.replace(p) {
            self.rest.get_or_insert_default().push_front(old);
        }
    }
    fn pop_front(&mut self) -> Option<Piece> {
        let p = self.head.take()?;
        if let Some(rest) = &mut self.rest {
            self.head = rest.pop_front();
            if rest.is_empty() {
                self.rest = None;
            }
        }
        Some(p)
    }
    fn front(&self) -> Option<&Piece> {
        self.head.as_ref()
    }
    fn front_mut(&mut self) -> Option<&mut Piece> {
        self.head.as_mut()
    }
    fn back(&self) -> Option<&Piece> {
        self.rest
            .as_ref()
            .and_then(|r| r.back())
            .or(self.head.as_ref())
    }
    fn back_mut(&mut self) -> Option<&mut Piece> {
        match self.rest.as_mut().and_then(|r| r.back_mut()) {
            Some(p) => Some(p),
            None => self.head.as_mut(),
        }
    }
    fn iter(&self) -> impl Iterator<Item = &Piece> {
        self.head
            .iter()
            .chain(self.rest.iter().flat_map(|r| r.iter()))
    }
    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Piece> {
        self.head
            .iter_mut()
            .chain(self.rest.iter_mut().flat_map(|r| r.iter_mut()))
    }
    fn clear(&mut self) {
        *self = Pieces::default();
    }
    /// Keeps the first `n` pieces.
    fn truncate(&mut self, n: usize) {
        if n == 0 {
            self.clear();
        } else if let Some(rest) = &mut self.rest {
            rest.truncate(n - 1);
            if rest.is_empty() {
                self.rest = None;
            }
        }
    }
    fn take_all(&mut self) -> impl Iterator<Item = Piece> {
        let Pieces { head, rest } = std::mem::take(self);
        head.into_iter().chain(rest.into_iter().flat_map(|r| *r))
    }
}

impl std::ops::Deref for Incoming {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl Incoming {
    /// Drops the first `n` bytes (consumed).
    pub fn advance(&mut self, n: usize) {
        self.0.advance(n)
    }
}

impl Outgoing {
    pub fn len(&self) -> usize {
        self.0.as_slice().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Incoming> for Outgoing {
    fn from(i: Incoming) -> Self {
        Outgoing(i.0)
    }
}

impl From<Bytes> for Outgoing {
    fn from(b: Bytes) -> Self {
        Outgoing(Piece::Shared(b))
    }
}

impl From<Vec<u8>> for Outgoing {
    fn from(bytes: Vec<u8>) -> Self {
        Outgoing(Piece::Heap { bytes, start: 0 })
    }
}

/// Whether an operation is in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Off,
    Armed,
    /// Cancelled; its last completion has not come yet.
    Cancelling,
}

/// The send in the kernel: the first `pieces` of the outbox, `len` bytes.
struct InFlight {
    seq: u64,
    /// At most [`MAX_SEND`].
    len: u32,
    /// At most [`MAX_IOV`].
    pieces: u16,
    quiet: bool,
}

/// What a submission is, for the Poller's bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Recv,
    CancelRecv,
    Send,
    QuietSend,
    Writable,
    CancelWritable,
}

/// The submissions one socket asks for in a pass.
#[derive(Default)]
pub(super) struct Submit {
    entries: Vec<(squeue::Entry, Kind)>,
}

impl Submit {
    fn push(&mut self, e: squeue::Entry, k: Kind) {
        self.entries.push((e, k));
    }
    pub(super) fn entries(&self) -> impl Iterator<Item = (&squeue::Entry, Kind)> {
        self.entries.iter().map(|(e, k)| (e, *k))
    }
}

/// What a completion may touch besides its socket's state.
pub(super) struct Completion<'a> {
    pub key: usize,
    pub bufs: &'a Rc<BufRing>,
    pub wakers: &'a mut Vec<Waker>,
    pub dirty: &'a mut Vec<usize>,
    pub starved: &'a mut Vec<usize>,
    pub holding: &'a mut Vec<usize>,
    pub stats: &'a mut RingStats,
    pub spare: &'a mut Vec<Vec<u8>>,
}

/// One socket's state in the Poller's slab.
pub(super) struct SockState {
    fd: RawFd,
    /// The [`RingSocket`] is alive; once it is gone the slot only waits for
    /// its operations' last completions.
    alive: bool,
    caps: SocketCaps,
    // Receiving.
    recv: Arm,
    /// Someone reads: keep the receive armed.
    reading: bool,
    /// Over the receive cap: the receive is cancelled until the reader
    /// catches up.
    paused: bool,
    /// The receive ended on an empty buffer ring.
    starved: bool,
    inbox: Pieces,
    pub(super) inbox_bytes: usize,
    /// Listed in the Poller's `holding` (the inbox may hold ring buffers).
    listed: bool,
    eof: bool,
    recv_error: Option<i32>,
    reader: Option<Waker>,
    // Sending.
    outbox: Pieces,
    outbox_bytes: usize,
    in_flight: Option<InFlight>,
    /// The last send was short: wait for POLLOUT before the next.
    blocked: bool,
    writable: Arm,
    send_error: Option<i32>,
    writer: Option<Waker>,
    flusher: Option<Waker>,
    /// Listed in the Poller's `dirty`.
    dirty: bool,
    /// The newest submission that names `fd` (see [`Poller::unsubmitted`]).
    last_fd_seq: u64,
    /// The header and vectors of a SENDMSG over several pieces, made when
    /// one is needed and dropped when it settles: an idle socket holds none.
    vectors: Option<Box<SendVectors>>,
}

/// What one send covers: a single piece, or `n` pieces in [`SendVectors`].
enum Gathered {
    One(*const u8, usize),
    Many(usize, usize),
}

/// A SENDMSG's header and vectors; boxed, so they stay put while the
/// kernel may read them.
struct SendVectors {
    msg: libc::msghdr,
    iov: [libc::iovec; MAX_IOV],
}

impl SendVectors {
    fn new() -> Box<Self> {
        Box::new(Self {
            // SAFETY: msghdr is plain data; all zeroes is "no name, no
            // control, no vectors".
            msg: unsafe { std::mem::zeroed() },
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV],
        })
    }
}

impl SockState {
    fn new(fd: RawFd, caps: SocketCaps) -> Self {
        Self {
            fd,
            alive: true,
            caps,
            recv: Arm::Off,
            reading: false,
            paused: false,
            starved: false,
            inbox: Pieces::default(),
            inbox_bytes: 0,
            listed: false,
            eof: false,
            recv_error: None,
            reader: None,
            outbox: Pieces::default(),
            outbox_bytes: 0,
            in_flight: None,
            blocked: false,
            writable: Arm::Off,
            send_error: None,
            writer: None,
            flusher: None,
            dirty: false,
            last_fd_seq: NO_SEQ,
            vectors: None,
        }
    }

    /// Nothing of this socket is left in the kernel and nobody holds it:
    /// the slot can go.
    pub(super) fn finished(&self) -> bool {
        !self.alive
            && self.recv == Arm::Off
            && self.in_flight.is_none()
            && self.writable == Arm::Off
    }

    fn can_receive(&self) -> bool {
        self.alive && self.reading && !self.eof && self.recv_error.is_none() && !self.starved
    }

    /// The submissions this socket needs before the next enter.
    pub(super) fn prepare(&mut self, key: usize, setup: &RingSetup, group: u16, out: &mut Submit) {
        self.dirty = false;
        let quiet_ok = setup.quiet_sends;
        let fd = types::Fd(self.fd);
        if self.can_receive() {
            if self.paused {
                if self.recv == Arm::Armed {
                    out.push(cancel(tag(key, Op::Recv)), Kind::CancelRecv);
                }
            } else if self.recv == Arm::Off {
                let sqe = opcode::RecvMulti::new(fd, group)
                    .build()
                    .user_data(tag(key, Op::Recv));
                let sqe = if setup.recv_budget {
                    // What the socket may still take before its cap: the
                    // receive ends by itself there.
                    let budget = (self.caps.recv as usize)
                        .saturating_sub(self.inbox_bytes)
                        .max(1);
                    with_recv_budget(sqe, budget.min(u32::MAX as usize) as u32)
                } else {
                    sqe
                };
                out.push(sqe, Kind::Recv);
            }
        } else if !self.alive && self.recv == Arm::Armed {
            out.push(cancel(tag(key, Op::Recv)), Kind::CancelRecv);
        }
        if !self.alive && self.writable == Arm::Armed {
            out.push(cancel(tag(key, Op::Writable)), Kind::CancelWritable);
        }
        let can_send = self.in_flight.is_none()
            && !self.blocked
            && self.send_error.is_none()
            && !self.outbox.is_empty();
        if can_send {
            // A send someone waits for must post its completion: a quiet
            // one would not end the sleep it was submitted with.
            let waited = self.writer.is_some() || self.flusher.is_some() || !self.alive;
            let quiet = quiet_ok && !waited;
            let (pieces, len, sqe) = match self.gather() {
                Gathered::One(ptr, len) => (
                    1,
                    len,
                    opcode::Send::new(fd, ptr, len as u32)
                        .flags(SEND_FLAGS)
                        .build(),
                ),
                Gathered::Many(pieces, len) => {
                    let v = self.vectors.as_deref().expect("gather filled the vectors");
                    (
                        pieces,
                        len,
                        opcode::SendMsg::new(fd, &v.msg)
                            .flags(SEND_FLAGS as u32)
                            .build(),
                    )
                }
            };
            let sqe = sqe.user_data(tag(key, Op::Send));
            let (sqe, kind) = if quiet {
                (sqe.flags(squeue::Flags::SKIP_SUCCESS), Kind::QuietSend)
            } else {
                (sqe, Kind::Send)
            };
            self.in_flight = Some(InFlight {
                seq: 0,
                len: len as u32,
                pieces: pieces as u16,
                quiet,
            });
            out.push(sqe, kind);
        }
        if self.alive
            && self.blocked
            && self.writable == Arm::Off
            && self.send_error.is_none()
            && !self.outbox.is_empty()
        {
            let sqe = opcode::PollAdd::new(fd, libc::POLLOUT as u32)
                .build()
                .user_data(tag(key, Op::Writable));
            out.push(sqe, Kind::Writable);
        }
    }

    /// Points the send vectors at the front of the outbox; returns how
    /// many pieces and bytes they cover.
    fn gather(&mut self) -> Gathered {
        if self.outbox.len() == 1 {
            let s = self.outbox.front().map_or(&[][..], Piece::as_slice);
            return Gathered::One(s.as_ptr(), s.len().min(MAX_SEND));
        }
        let v = self.vectors.get_or_insert_with(SendVectors::new);
        let mut len = 0;
        let mut n = 0;
        for piece in self.outbox.iter() {
            if n == MAX_IOV || len >= MAX_SEND {
                break;
            }
            let s = piece.as_slice();
            let take = s.len().min(MAX_SEND - len);
            v.iov[n] = libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: take,
            };
            len += take;
            n += 1;
        }
        v.msg.msg_iov = v.iov.as_mut_ptr();
        v.msg.msg_iovlen = n as _;
        Gathered::Many(n, len)
    }

    /// The Poller queued submission `kind` as number `seq`.
    pub(super) fn submitted(&mut self, kind: Kind, seq: u64) {
        match kind {
            Kind::Recv => {
                self.recv = Arm::Armed;
                self.last_fd_seq = seq;
            }
            Kind::CancelRecv => self.recv = Arm::Cancelling,
            Kind::Send | Kind::QuietSend => {
                if let Some(f) = &mut self.in_flight {
                    f.seq = seq;
                }
                self.last_fd_seq = seq;
            }
            Kind::Writable => {
                self.writable = Arm::Armed;
                self.last_fd_seq = seq;
            }
            Kind::CancelWritable => self.writable = Arm::Cancelling,
        }
    }

    /// The Poller could not queue submission `kind` (the ring is full even
    /// after a submit): the socket fails rather than waits forever.
    pub(super) fn submit_failed(&mut self, kind: Kind, wakers: &mut Vec<Waker>) {
        let enomem = -libc::ENOMEM;
        match kind {
            Kind::Recv => {
                self.recv_error = Some(enomem);
                wakers.extend(self.reader.take());
            }
            Kind::Send | Kind::QuietSend => {
                self.in_flight = None;
                self.fail_sends(enomem, wakers);
            }
            Kind::Writable => self.fail_sends(enomem, wakers),
            Kind::CancelRecv | Kind::CancelWritable => {}
        }
    }

    /// A completion for this socket.
    pub(super) fn complete(&mut self, op: Op, res: i32, flags: u32, cx: &mut Completion<'_>) {
        match op {
            Op::Recv => self.received(res, flags, cx),
            Op::Send => self.sent(res, cx),
            Op::Writable => {
                self.writable = Arm::Off;
                self.blocked = false;
                if !self.outbox.is_empty() {
                    self.mark_dirty(cx);
                }
            }
            Op::Poll => {}
        }
    }

    fn mark_dirty(&mut self, cx: &mut Completion<'_>) {
        if !self.dirty {
            self.dirty = true;
            cx.dirty.push(cx.key);
        }
    }

    fn received(&mut self, res: i32, flags: u32, cx: &mut Completion<'_>) {
        let more = cqueue::more(flags);
        if let Some(bid) = cqueue::buffer_select(flags) {
            let buf = RecvBuf::new(cx.bufs, bid, res.max(0) as u32);
            if res > 0 && self.alive {
                cx.stats.recvs += 1;
                self.inbox_bytes += buf.len();
                self.inbox.push_back(Piece::Ring(buf));
                if !self.listed {
                    self.listed = true;
                    cx.holding.push(cx.key);
                }
                if self.inbox_bytes >= (self.caps.recv as usize) && !self.paused {
                    self.paused = true;
                    self.mark_dirty(cx);
                }
            }
        }
        if res == 0 {
            self.eof = true;
        } else if res < 0 {
            match -res {
                libc::ENOBUFS => {
                    cx.bufs.grow();
                    if !self.starved {
                        self.starved = true;
                        cx.starved.push(cx.key);
                        cx.stats.starved += 1;
                    }
                }
                libc::ECANCELED => {}
                _ => self.recv_error = Some(res),
            }
        }
        if !more {
            self.recv = Arm::Off;
            if self.inbox_bytes >= (self.caps.recv as usize) {
                // Its budget ran out: the reader has the cap's worth.
                self.paused = true;
            } else if self.can_receive() && !self.paused {
                // Budget left, or ended for another reason (the kernel may
                // end a multishot receive at any time): arm it again.
                self.mark_dirty(cx);
            }
        }
        cx.wakers.extend(self.reader.take());
    }

    fn sent(&mut self, res: i32, cx: &mut Completion<'_>) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        // The kernel is done with the vectors (if any).
        self.vectors = None;
        if res >= 0 {
            let n = res as usize;
            self.consume_outbox(n, cx.spare);
            if n < f.len as usize {
                self.blocked = true;
                cx.stats.short_sends += 1;
            }
        } else if res == -libc::EAGAIN {
            self.blocked = true;
            cx.stats.short_sends += 1;
        } else {
            self.fail_sends(res, cx.wakers);
            return;
        }
        if self.blocked {
            if self.alive {
                // Waiting for room may take long: the rest leaves the ring.
                self.compact_outbox();
            } else {
                // Nobody will read what is left; it goes with the socket.
                self.outbox.clear();
                self.outbox_bytes = 0;
                self.blocked = false;
            }
        }
        if !self.outbox.is_empty() {
            self.mark_dirty(cx);
        }
        self.wake_writers(cx.wakers);
    }

    /// Settles quiet send `seq`, which posted no completion: it went out
    /// whole.
    pub(super) fn settle_quiet(&mut self, seq: u64, cx: &mut Completion<'_>) {
        let whole = match &self.in_flight {
            Some(f) if f.quiet && f.seq == seq => f.len as usize,
            _ => return,
        };
        self.sent(whole as i32, cx);
    }

    fn wake_writers(&mut self, wakers: &mut Vec<Waker>) {
        if self.outbox.is_empty() || self.send_error.is_some() {
            wakers.extend(self.flusher.take());
        }
        if self.outbox_bytes < (self.caps.send as usize) || self.send_error.is_some() {
            wakers.extend(self.writer.take());
        }
    }

    fn fail_sends(&mut self, res: i32, wakers: &mut Vec<Waker>) {
        self.send_error = Some(res);
        // The pieces of a send still in the kernel stay until it settles.
        let keep = self.in_flight.as_ref().map_or(0, |f| f.pieces as usize);
        self.outbox.truncate(keep);
        self.outbox_bytes = self.outbox.iter().map(|p| p.as_slice().len()).sum();
        self.wake_writers(wakers);
    }

    /// Drops the first `n` sent bytes from the outbox.
    fn consume_outbox(&mut self, mut n: usize, spare: &mut Vec<Vec<u8>>) {
        self.outbox_bytes = self.outbox_bytes.saturating_sub(n);
        while n > 0 {
            let Some(front) = self.outbox.front_mut() else {
                break;
            };
            let len = front.as_slice().len();
            if n < len {
                front.advance(n);
                break;
            }
            n -= len;
            if let Some(Piece::Heap { bytes, .. }) = self.outbox.pop_front() {
                super::recycle(spare, bytes);
            }
        }
        // Zero-length pieces (an empty write) would never be sent.
        while self.outbox.front().is_some_and(|p| p.as_slice().is_empty()) {
            self.outbox.pop_front();
        }
    }

    /// Copies the outbox's ring pieces to the heap.
    fn compact_outbox(&mut self) {
        for piece in self.outbox.iter_mut() {
            if piece.is_ring() {
                let bytes = piece.as_slice().to_vec();
                *piece = Piece::Heap { bytes, start: 0 };
            }
        }
    }

    /// Copies the inbox's ring pieces into one heap buffer; returns the
    /// bytes copied.
    pub(super) fn compact(&mut self) -> usize {
        self.listed = false;
        if !self.inbox.iter().any(Piece::is_ring) {
            return 0;
        }
        let mut copied = 0;
        let mut merged: Vec<u8> = Vec::new();
        let mut rest = Pieces::default();
        for piece in self.inbox.take_all() {
            match piece {
                Piece::Ring(b) => {
                    copied += b.len();
                    if merged.is_empty() && rest.is_empty() {
                        merged.reserve_exact(self.inbox_bytes);
                    }
                    merged.extend_from_slice(&b);
                }
                other => {
                    if !merged.is_empty() {
                        rest.push_back(Piece::Heap {
                            bytes: std::mem::take(&mut merged),
                            start: 0,
                        });
                    }
                    rest.push_back(other);
                }
            }
        }
        if !merged.is_empty() {
            rest.push_back(Piece::Heap {
                bytes: merged,
                start: 0,
            });
        }
        self.inbox = rest;
        copied
    }

    /// Buffers came back after the receive ended on an empty ring: true if
    /// it should be armed again.
    pub(super) fn unstarve(&mut self) -> bool {
        self.starved = false;
        self.can_receive() && !self.paused && self.recv == Arm::Off
    }

    /// The reader took `n` bytes: resume a paused receive below half the cap.
    fn taken(&mut self, n: usize) -> bool {
        self.inbox_bytes = self.inbox_bytes.saturating_sub(n);
        if self.paused && self.inbox_bytes <= (self.caps.recv as usize) / 2 {
            self.paused = false;
            return self.recv != Arm::Armed;
        }
        // Cancelled while paused and the cancel raced with the reader.
        false
    }
}

/// Sets a multishot receive's total byte budget (`sqe->optlen`, 6.15+):
/// the receive ends once it has delivered that much.
pub(super) fn with_recv_budget(entry: squeue::Entry, budget: u32) -> squeue::Entry {
    // Byte offset of the sqe's `optlen` (the u32 union after `personality`).
    const OPTLEN: usize = 44;
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the kernel's 64-byte
    // `io_uring_sqe`, plain data with no invalid bit patterns; only the 4
    // bytes of `optlen` change.
    let mut raw: [u8; 64] = unsafe { std::mem::transmute(entry) };
    raw[OPTLEN..OPTLEN + 4].copy_from_slice(&budget.to_le_bytes());
    // SAFETY: as above: any 64 bytes are a valid sqe to hold.
    unsafe { std::mem::transmute::<[u8; 64], squeue::Entry>(raw) }
}

fn cancel(user_data: u64) -> squeue::Entry {
    opcode::AsyncCancel::new(user_data)
        .build()
        .flags(squeue::Flags::SKIP_SUCCESS)
        .user_data(CANCEL_TAG)
}

/// A TCP socket whose bytes move by completions on the core's ring (module
/// doc). The descriptor stays the caller's: it must outlive this handle.
/// Dropping the handle cancels the receive and discards what was not sent
/// (see [`RingSocket::linger`] for sockets closing gracefully).
pub struct RingSocket {
    poller: Rc<Poller>,
    key: usize,
    fd: RawFd,
    /// On drop, hand what is queued to the kernel before the caller closes
    /// the descriptor.
    linger: bool,
}

impl RingSocket {
    pub fn new(poller: &Rc<Poller>, fd: RawFd, caps: SocketCaps) -> Self {
        let key = poller
            .slots
            .borrow_mut()
            .insert(Slot::Sock(Box::new(SockState::new(fd, caps))));
        Self {
            poller: poller.clone(),
            key,
            fd,
            linger: false,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// On drop, send what is queued (as far as the socket takes it at
    /// once) before the descriptor closes, rather than discard it.
    pub fn linger(&mut self) {
        self.linger = true;
    }

    pub(super) fn with<R>(&self, f: impl FnOnce(&mut SockState, &Poller) -> R) -> R {
        let mut slots = self.poller.slots.borrow_mut();
        let Some(Slot::Sock(st)) = slots.get_mut(self.key) else {
            unreachable!("a live RingSocket owns its slot");
        };
        f(st, &self.poller)
    }

    fn dirty(st: &mut SockState, key: usize, poller: &Poller) {
        if !st.dirty {
            st.dirty = true;
            poller.dirty.borrow_mut().push(key);
        }
    }

    /// The next received bytes; Ok(None) at end of stream.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Incoming>>> {
        let key = self.key;
        self.with(|st, poller| {
            if let Some(piece) = st.inbox.pop_front() {
                let n = piece.as_slice().len();
                if st.taken(n) {
                    Self::dirty(st, key, poller);
                }
                return Poll::Ready(Ok(Some(Incoming(piece))));
            }
            if let Some(e) = st.recv_error {
                return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
            }
            if st.eof {
                return Poll::Ready(Ok(None));
            }
            Self::wait_for_bytes(st, key, poller, cx);
            Poll::Pending
        })
    }

    fn wait_for_bytes(st: &mut SockState, key: usize, poller: &Poller, cx: &mut Context<'_>) {
        if !st.reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            st.reader = Some(cx.waker().clone());
        }
        if !st.reading {
            st.reading = true;
        }
        if st.recv == Arm::Off && !st.paused && !st.starved {
            Self::dirty(st, key, poller);
        }
    }

    /// Received bytes already here, without waiting.
    pub fn try_recv(&self) -> Option<Incoming> {
        let key = self.key;
        self.with(|st, poller| {
            let piece = st.inbox.pop_front()?;
            if st.taken(piece.as_slice().len()) {
                Self::dirty(st, key, poller);
            }
            Some(Incoming(piece))
        })
    }

    /// Puts back what a reader took but did not consume, in front.
    pub fn unrecv(&self, inc: Incoming) {
        if inc.is_empty() {
            return;
        }
        self.with(|st, _| {
            st.inbox_bytes += inc.len();
            st.inbox.push_front(inc.0);
        });
    }

    /// Copies received bytes into `buf` (tokio's read contract: nothing
    /// filled means end of stream).
    pub fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let key = self.key;
        self.with(|st, poller| {
            let mut copied = 0;
            while buf.remaining() > 0 {
                let Some(front) = st.inbox.front_mut() else {
                    break;
                };
                let s = front.as_slice();
                let n = s.len().min(buf.remaining());
                buf.put_slice(&s[..n]);
                copied += n;
                if n == s.len() {
                    st.inbox.pop_front();
                } else {
                    front.advance(n);
                }
            }
            if copied > 0 {
                if st.taken(copied) {
                    Self::dirty(st, key, poller);
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = st.recv_error {
                return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
            }
            if st.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            Self::wait_for_bytes(st, key, poller, cx);
            Poll::Pending
        })
    }

    /// Stops receiving (for a switch to splice): cancels the receive and
    /// resolves once the kernel has posted its last completion, so no more
    /// bytes land in ring buffers. What arrived before is still in the
    /// inbox, for [`RingSocket::try_recv`].
    pub fn poll_recv_stopped(&self, cx: &mut Context<'_>) -> Poll<()> {
        let key = self.key;
        self.with(|st, poller| {
            st.reading = false;
            match st.recv {
                Arm::Off => Poll::Ready(()),
                Arm::Armed => {
                    // Marked paused so `prepare` cancels it.
                    st.paused = true;
                    st.reading = true;
                    Self::dirty(st, key, poller);
                    st.reader = Some(cx.waker().clone());
                    Poll::Pending
                }
                Arm::Cancelling => {
                    st.reader = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
    }

    /// After [`RingSocket::poll_recv_stopped`]: the receive is re-armed by
    /// the next read.
    pub fn resume_recv(&self) {
        self.with(|st, _| {
            st.paused = false;
            st.reading = false;
        });
    }

    /// The receive has reported end of stream or an error.
    pub fn recv_ended(&self) -> bool {
        self.with(|st, _| st.eof || st.recv_error.is_some())
    }

    /// Ready when another write would be taken (the queue is below the
    /// send cap), or with the error a send failed with.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|st, _| {
            if let Some(e) = st.send_error {
                return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
            }
            if st.outbox_bytes < (st.caps.send as usize) {
                return Poll::Ready(Ok(()));
            }
            if !st.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.writer = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// Queues owned bytes (no copy); they go with the next enter. Callers
    /// respect [`RingSocket::poll_room`] first.
    pub fn send(&self, out: impl Into<Outgoing>) {
        let out = out.into();
        if out.is_empty() {
            return;
        }
        let key = self.key;
        self.with(|st, poller| {
            if st.send_error.is_some() {
                return;
            }
            st.outbox_bytes += out.len();
            st.outbox.push_back(out.0);
            Self::dirty(st, key, poller);
        })
    }

    /// Copies `data` into the send queue: a write, for callers that lend
    /// their bytes (rustls). Small writes of one pass share a buffer, so
    /// they leave as one send.
    pub fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    pub fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_room(cx))?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        let key = self.key;
        self.with(|st, poller| {
            let in_kernel = st.in_flight.as_ref().map_or(0, |f| f.pieces as usize);
            let tail_free = st.outbox.len() > in_kernel
                && matches!(st.outbox.back(), Some(Piece::Heap { bytes, .. })
                    if bytes.capacity() - bytes.len() >= total);
            if !tail_free {
                let v = poller.take_vec(total);
                st.outbox.push_back(Piece::Heap { bytes: v, start: 0 });
            }
            let Some(Piece::Heap { bytes, .. }) = st.outbox.back_mut() else {
                unreachable!("a heap piece was just ensured at the back");
            };
            for b in bufs {
                bytes.extend_from_slice(b);
            }
            st.outbox_bytes += total;
            Self::dirty(st, key, poller);
        });
        Poll::Ready(Ok(total))
    }

    /// Ready once everything queued has been taken by the kernel (or a
    /// send failed).
    pub fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|st, _| {
            if let Some(e) = st.send_error {
                return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
            }
            if st.outbox.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if !st.flusher.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.flusher = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// Async form of [`RingSocket::poll_flushed`].
    pub async fn flushed(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_flushed(cx)).await
    }

    /// Async form of [`RingSocket::poll_recv`].
    pub async fn recv(&self) -> io::Result<Option<Incoming>> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Async form of [`RingSocket::poll_room`].
    pub async fn room(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_room(cx)).await
    }

    /// Bytes queued to send and not yet taken by the kernel.
    pub fn queued(&self) -> usize {
        self.with(|st, _| st.outbox_bytes)
    }
}

impl Drop for RingSocket {
    fn drop(&mut self) {
        let key = self.key;
        let linger = self.linger;
        let (send_now, unsubmitted, finished) = {
            let mut slots = self.poller.slots.borrow_mut();
            let Some(Slot::Sock(st)) = slots.get_mut(key) else {
                return;
            };
            st.alive = false;
            st.reader = None;
            st.writer = None;
            st.flusher = None;
            st.inbox.clear();
            st.inbox_bytes = 0;
            let keep = st.in_flight.as_ref().map_or(0, |f| f.pieces as usize);
            let send_now = linger
                && st.send_error.is_none()
                && !st.blocked
                && st.in_flight.is_none()
                && !st.outbox.is_empty();
            if !send_now {
                st.outbox.truncate(keep);
            }
            let wants_submit = send_now || st.recv == Arm::Armed || st.writable == Arm::Armed;
            if wants_submit && !st.dirty {
                st.dirty = true;
                self.poller.dirty.borrow_mut().push(key);
            }
            let finished = st.finished() && !send_now;
            if finished {
                slots.remove(key);
            }
            (
                send_now,
                self.poller.unsubmitted(st_last_seq(&slots, key)),
                finished,
            )
        };
        if finished {
            return;
        }
        if send_now || unsubmitted {
            // The caller closes the descriptor right after this: what names
            // it must reach the kernel first (the final send; or an armed
            // receive or send not yet submitted, which would otherwise act
            // on whatever socket reuses the number).
            self.poller.prepare();
            self.poller.submit_now();
        }
    }
}

fn st_last_seq(slots: &slab::Slab<Slot>, key: usize) -> Option<u64> {
    match slots.get(key) {
        Some(Slot::Sock(st)) if st.last_fd_seq != NO_SEQ => Some(st.last_fd_seq),
        _ => None,
    }
}
