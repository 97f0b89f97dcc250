//! Moving bytes between two TCP sockets, with TCP semantics kept: each
//! direction ends with its own FIN (half-close), and a reset on one side is
//! propagated as a reset on the other.
//!
//! In completion mode (the default) small messages cross on the core's
//! ring: what a multishot receive put in a ring buffer is sent on from that
//! same buffer, with no copy and no system call of its own. A direction
//! whose receive fills a whole buffer has turned bulk: it stops receiving
//! on the ring and moves bytes with `splice` through a pipe (zero copy, the
//! default) or a userspace buffer (`--copy-mode copy`), waiting on
//! readiness, until its source is drained; then it goes back to the ring.
//! `IORING_OP_SPLICE` is never used: it always runs on io-wq threads.
//!
//! Idle connections hold no pipe and no buffer: a direction borrows a
//! staging area from the core's pool only while bytes are in flight and
//! gives it back as soon as the source would block with the stage empty.
//! Core-local (!Send).

use crate::io::count::ByteCount;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use crate::io::redirect::{Handback, Redirector};
use crate::io::socket::{self, would_block, Pipe};
use crate::io::uring::{Poller, RingSocket};

/// How bytes move through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyMode {
    /// socket → pipe → socket with splice(2); bytes never enter userspace.
    Splice,
    /// read(2)/write(2) through a userspace buffer.
    Copy,
}

/// Pipe size for splice mode: 1 MiB (pipe-max-size) measured clearly better
/// than 64 KiB on loopback (stack-notes §4).
pub const PIPE_SIZE: usize = 1 << 20;
/// Buffer size for copy mode.
pub const BUFFER_SIZE: usize = 256 << 10;
/// Free stages kept per core; more are closed/freed when returned.
const POOL_KEEP: usize = 64;

/// The staging area of one direction: a pipe or a buffer, holding bytes
/// read from the source and not yet written to the destination.
trait Stage {
    fn pending(&self) -> usize;
    fn has_room(&self) -> bool;
    /// Reads from `src` into the stage: bytes read (0 = EOF), and whether
    /// it read less than there was room for (the source is drained, or
    /// nearly: a one-shot poll armed next reports any rest at once).
    fn fill(&mut self, src: RawFd) -> io::Result<(usize, bool)>;
    /// Writes staged bytes to `dst`.
    fn drain(&mut self, dst: RawFd) -> io::Result<usize>;
}

thread_local! {
    /// Pipes and buffers this core holds (pooled or in use): [pipes,
    /// buffers]. Per thread is per core: they never leave it.
    static HELD: [Cell<usize>; 2] = const { [Cell::new(0), Cell::new(0)] };
}

/// The pipes and the copy buffers this core holds now, pooled or in use
/// (the admin's per-core view).
pub fn held() -> (usize, usize) {
    HELD.with(|h| (h[0].get(), h[1].get()))
}

/// A pipe (kind 0) or a buffer (kind 1), counted in [`HELD`] while it
/// exists, however it ends (returned to the pool, dropped, or dropped
/// with a cancelled connection).
struct Held<T, const KIND: usize>(T);

impl<T, const KIND: usize> Held<T, KIND> {
    fn new(value: T) -> Self {
        HELD.with(|h| h[KIND].set(h[KIND].get() + 1));
        Held(value)
    }
}

impl<T, const KIND: usize> Drop for Held<T, KIND> {
    fn drop(&mut self) {
        let _ = HELD.try_with(|h| h[KIND].set(h[KIND].get().saturating_sub(1)));
    }
}

impl<T, const KIND: usize> std::ops::Deref for Held<T, KIND> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T, const KIND: usize> std::ops::DerefMut for Held<T, KIND> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

type HeldPipe = Held<Pipe, 0>;
type HeldBuffer = Held<Box<[u8]>, 1>;

struct PipeStage {
    pipe: HeldPipe,
    pending: usize,
}

impl Stage for PipeStage {
    fn pending(&self) -> usize {
        self.pending
    }
    fn has_room(&self) -> bool {
        self.pending < self.pipe.capacity
    }
    fn fill(&mut self, src: RawFd) -> io::Result<(usize, bool)> {
        let room = self.pipe.capacity - self.pending;
        let n = socket::splice(src, self.pipe.write.as_raw_fd(), room)?;
        self.pending += n;
        Ok((n, n < room))
    }
    fn drain(&mut self, dst: RawFd) -> io::Result<usize> {
        let n = socket::splice(self.pipe.read.as_raw_fd(), dst, self.pending)?;
        self.pending -= n;
        Ok(n)
    }
}

struct BufStage {
    buf: HeldBuffer,
    start: usize,
    end: usize,
}

impl Stage for BufStage {
    fn pending(&self) -> usize {
        self.end - self.start
    }
    fn has_room(&self) -> bool {
        self.end < self.buf.len()
    }
    fn fill(&mut self, src: RawFd) -> io::Result<(usize, bool)> {
        let room = self.buf.len() - self.end;
        let n = socket::read(src, &mut self.buf[self.end..])?;
        self.end += n;
        Ok((n, n < room))
    }
    fn drain(&mut self, dst: RawFd) -> io::Result<usize> {
        let n = socket::write(dst, &self.buf[self.start..self.end])?;
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(n)
    }
}

/// Per-core pools of staging areas plus the readiness ring.
pub struct Copier {
    poller: Rc<Poller>,
    mode: CopyMode,
    /// A received piece this large (a whole ring buffer) means more is
    /// waiting: the direction turns bulk.
    bulk_piece: usize,
    /// `--sockmap-redirect`: pairs are handed to the kernel first.
    redirect: Option<Rc<Redirector>>,
    pipes: RefCell<Vec<HeldPipe>>,
    buffers: RefCell<Vec<HeldBuffer>>,
}

/// How long the readiness path runs a direction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// To end of stream.
    Eof,
    /// Until the source is drained with nothing staged (back to the ring).
    Idle,
}

/// Runs both directions until both are done (None) or one fails; the
/// outcome names the side that failed.
async fn both(
    fwd: impl Future<Output = Result<(), DirError>>,
    rev: impl Future<Output = Result<(), DirError>>,
) -> Option<CopyOutcome> {
    let mut fwd = pin!(fwd);
    let mut rev = pin!(rev);
    let (mut fwd_done, mut rev_done) = (false, false);
    futures_lite::future::poll_fn(|cx| {
        if !fwd_done {
            if let Poll::Ready(r) = fwd.as_mut().poll(cx) {
                match r {
                    Ok(()) => fwd_done = true,
                    Err(DirError::Source(e)) => return Poll::Ready(Some(CopyOutcome::ResetByA(e))),
                    Err(DirError::Dest(e)) => return Poll::Ready(Some(CopyOutcome::ResetByB(e))),
                }
            }
        }
        if !rev_done {
            if let Poll::Ready(r) = rev.as_mut().poll(cx) {
                match r {
                    Ok(()) => rev_done = true,
                    Err(DirError::Source(e)) => return Poll::Ready(Some(CopyOutcome::ResetByB(e))),
                    Err(DirError::Dest(e)) => return Poll::Ready(Some(CopyOutcome::ResetByA(e))),
                }
            }
        }
        if fwd_done && rev_done {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Why a direction stopped early.
#[derive(Debug)]
enum DirError {
    /// Reading the source failed (the source reset or errored).
    Source(io::Error),
    /// Writing the destination failed (the destination reset or errored).
    Dest(io::Error),
}

/// How a proxied connection ended.
#[derive(Debug)]
pub enum CopyOutcome {
    /// Both directions finished with FIN.
    Closed,
    /// `a` reset or failed; `b` was reset in turn.
    ResetByA(io::Error),
    /// `b` reset or failed; `a` was reset in turn.
    ResetByB(io::Error),
}

impl Copier {
    pub fn new(poller: Rc<Poller>, mode: CopyMode, redirect: Option<Rc<Redirector>>) -> Self {
        Self {
            bulk_piece: poller.recv_buffer_size(),
            redirect,
            poller,
            mode,
            pipes: RefCell::new(Vec::new()),
            buffers: RefCell::new(Vec::new()),
        }
    }

    /// Proxies `a` ⇄ `b` until both directions are done or one side resets.
    /// `a_to_b` / `b_to_a` count the bytes delivered each way as they move,
    /// so an access log written on cancellation is still accurate.
    pub async fn bidirectional(
        &self,
        a: &impl AsRawFd,
        b: &impl AsRawFd,
        a_to_b: &ByteCount,
        b_to_a: &ByteCount,
    ) -> CopyOutcome {
        let (a, b) = (a.as_raw_fd(), b.as_raw_fd());
        if let Some(r) = &self.redirect {
            match r.run(&self.poller, a, b, [a_to_b, b_to_a]).await {
                Ok(Handback::Closed) => return CopyOutcome::Closed,
                Ok(Handback::Reset(side, e)) => {
                    let (outcome, other) = if side == 0 {
                        (CopyOutcome::ResetByA(e), b)
                    } else {
                        (CopyOutcome::ResetByB(e), a)
                    };
                    socket::set_reset_on_close(other);
                    return outcome;
                }
                // Taken back (bulk), or refused: the copy path carries on.
                Ok(Handback::Resume) => {}
                Err(e) => tracing::debug!(error = %e, "sockmap redirect refused; copying"),
            }
        }
        let failure = if self.poller.completion() {
            let caps = self.poller.caps();
            let (ra, rb) = (
                RingSocket::new(&self.poller, a, caps),
                RingSocket::new(&self.poller, b, caps),
            );
            let fwd = self.ring_direction(&ra, &rb, a_to_b);
            let rev = self.ring_direction(&rb, &ra, b_to_a);
            both(fwd, rev).await
        } else {
            both(self.direction(a, b, a_to_b), self.direction(b, a, b_to_a)).await
        };
        match failure {
            None => CopyOutcome::Closed,
            Some(outcome) => {
                // The side that did not fail learns about it as a reset when
                // its socket is closed by the caller.
                match &outcome {
                    CopyOutcome::ResetByA(_) => socket::set_reset_on_close(b),
                    CopyOutcome::ResetByB(_) => socket::set_reset_on_close(a),
                    CopyOutcome::Closed => {}
                }
                outcome
            }
        }
    }

    /// One direction in completion mode (module doc): ring pieces are sent
    /// on as they are; a full buffer switches to splice (or copy) until the
    /// source drains.
    async fn ring_direction(
        &self,
        src: &RingSocket,
        dst: &RingSocket,
        moved: &ByteCount,
    ) -> Result<(), DirError> {
        loop {
            let first = match src.recv().await {
                Ok(Some(p)) => p,
                Ok(None) => {
                    dst.flushed().await.map_err(DirError::Dest)?;
                    let _ = socket::shutdown_write(dst.fd());
                    return Ok(());
                }
                Err(e) => return Err(DirError::Source(e)),
            };
            let mut bulk = first.len() >= self.bulk_piece;
            dst.room().await.map_err(DirError::Dest)?;
            moved.add(first.len() as u64);
            dst.send(first);
            while let Some(p) = src.try_recv() {
                bulk |= p.len() >= self.bulk_piece;
                moved.add(p.len() as u64);
                dst.send(p);
            }
            if !bulk {
                continue;
            }
            // Bulk: no more bytes into ring buffers; what came before goes
            // first, then the readiness path takes over until idle.
            std::future::poll_fn(|cx| src.poll_recv_stopped(cx)).await;
            while let Some(p) = src.try_recv() {
                dst.room().await.map_err(DirError::Dest)?;
                moved.add(p.len() as u64);
                dst.send(p);
            }
            dst.flushed().await.map_err(DirError::Dest)?;
            if src.recv_ended() {
                // EOF or an error came with the last pieces: the ring
                // reports it at the next receive.
                src.resume_recv();
                continue;
            }
            let done = self
                .direction_until(src.fd(), dst.fd(), moved, Until::Idle)
                .await?;
            if done {
                return Ok(());
            }
            src.resume_recv();
        }
    }

    /// One direction in readiness mode, to its end.
    async fn direction(&self, src: RawFd, dst: RawFd, moved: &ByteCount) -> Result<(), DirError> {
        self.direction_until(src, dst, moved, Until::Eof)
            .await
            .map(|_| ())
    }

    /// One direction by splice (or copy) on readiness, until its end
    /// (true), or with [`Until::Idle`] until the source is drained and
    /// nothing is staged (false).
    async fn direction_until(
        &self,
        src: RawFd,
        dst: RawFd,
        moved: &ByteCount,
        until: Until,
    ) -> Result<bool, DirError> {
        match self.mode {
            CopyMode::Splice => {
                self.run(
                    src,
                    dst,
                    moved,
                    || {
                        let pipe = self.pipes.borrow_mut().pop();
                        let pipe = match pipe {
                            Some(p) => p,
                            None => Held::new(Pipe::new(PIPE_SIZE)?),
                        };
                        Ok(PipeStage { pipe, pending: 0 })
                    },
                    |stage: PipeStage| {
                        // A pipe that still holds bytes cannot be reused.
                        let mut pool = self.pipes.borrow_mut();
                        if stage.pending == 0 && pool.len() < POOL_KEEP {
                            pool.push(stage.pipe);
                        }
                    },
                    until,
                )
                .await
            }
            CopyMode::Copy => {
                self.run(
                    src,
                    dst,
                    moved,
                    || {
                        let buf = self.buffers.borrow_mut().pop();
                        Ok(BufStage {
                            buf: buf.unwrap_or_else(|| {
                                Held::new(vec![0u8; BUFFER_SIZE].into_boxed_slice())
                            }),
                            start: 0,
                            end: 0,
                        })
                    },
                    |stage: BufStage| {
                        let mut pool = self.buffers.borrow_mut();
                        if pool.len() < POOL_KEEP {
                            pool.push(stage.buf);
                        }
                    },
                    until,
                )
                .await
            }
        }
    }

    /// Waits are one-shot polls ([`Poller::ready`]), not standing
    /// [`crate::io::uring::Registration`]s: a busy socket wakes up per arriving
    /// segment, and a standing poll turns each of those into a completion
    /// and an executor wake-up nobody waits for (measured: more proxy CPU
    /// per GiB of splice than one submit per wait).
    ///
    /// One direction: wait for the source, borrow a stage, move bytes until
    /// the source would block with nothing staged, return the stage, repeat.
    /// On EOF, send FIN to the destination.
    async fn run<S: Stage>(
        &self,
        src: RawFd,
        dst: RawFd,
        moved: &ByteCount,
        take: impl Fn() -> io::Result<S>,
        give_back: impl Fn(S),
        until: Until,
    ) -> Result<bool, DirError> {
        loop {
            let mut stage = take().map_err(DirError::Source)?;
            let mut eof = false;
            let result = loop {
                let mut progressed = false;
                // A short fill: going idle next costs no EAGAIN attempt.
                let mut drained = false;
                if !eof && stage.has_room() {
                    match stage.fill(src) {
                        Ok((0, _)) => eof = true,
                        Ok((_, short)) => {
                            progressed = true;
                            drained = short;
                        }
                        Err(e) if would_block(&e) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => break Err(DirError::Source(e)),
                    }
                }
                if stage.pending() > 0 {
                    match stage.drain(dst) {
                        Ok(n) => {
                            moved.add(n as u64);
                            progressed = true;
                        }
                        Err(e) if would_block(&e) => {
                            if !progressed || !stage.has_room() || eof {
                                if let Err(e) = self.poller.ready(dst, libc::POLLOUT).await {
                                    break Err(DirError::Dest(e));
                                }
                            }
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => break Err(DirError::Dest(e)),
                    }
                }
                if stage.pending() == 0 {
                    if eof {
                        break Ok(true);
                    }
                    if !progressed || drained {
                        // The source is drained and nothing is staged: go idle.
                        break Ok(false);
                    }
                }
                // Long transfers must not starve the other connections.
                crate::io::executor::yield_if_needed().await;
            };
            give_back(stage);
            match result {
                Ok(true) => {
                    // Peer may already be gone; a failing shutdown is not an
                    // error of this direction.
                    let _ = socket::shutdown_write(dst);
                    return Ok(true);
                }
                Ok(false) if until == Until::Idle => return Ok(false),
                Ok(false) => {
                    if let Err(e) = self.poller.ready(src, libc::POLLIN | libc::POLLRDHUP).await {
                        return Err(DirError::Source(e));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl CopyOutcome {
    /// Short outcome word for access logs.
    pub fn describe(&self) -> String {
        match self {
            CopyOutcome::Closed => "closed".into(),
            CopyOutcome::ResetByA(e) => format!("reset by downstream: {e}"),
            CopyOutcome::ResetByB(e) => format!("reset by upstream: {e}"),
        }
    }
}

#[cfg(test)]
mod held_tests {
    use super::*;

    #[test]
    fn held_pipes_and_buffers_are_counted_until_dropped() {
        let before = held();
        let pipe: HeldPipe = Held::new(Pipe::new(PIPE_SIZE).unwrap());
        let buffers: Vec<HeldBuffer> = (0..3)
            .map(|_| Held::new(vec![0u8; 16].into_boxed_slice()))
            .collect();
        assert_eq!(held(), (before.0 + 1, before.1 + 3));
        drop(pipe);
        drop(buffers);
        assert_eq!(held(), before);
    }
}
