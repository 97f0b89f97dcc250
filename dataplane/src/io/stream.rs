//! Async byte streams over our own nonblocking sockets, driven by the
//! per-core ring: what rustls and h2 run on. Bytes that must be decrypted
//! cannot be spliced, so the HBONE paths read and write through userspace
//! here; plain passthrough stays on [`crate::io::copy`].
//!
//! In completion mode (the default) a stream is a [`RingSocket`]: reads
//! take bytes the ring already received, writes queue bytes for the next
//! enter, and neither makes a system call. In readiness mode it reads and
//! writes with `recv`/`sendmsg` when the ring says the socket is ready.
//! Core-local (!Send).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::io::socket;
use crate::io::uring::{Poller, Registration, RingSocket};

/// Bytes pulled from the socket per read when the caller asks for less.
/// rustls reads TLS in slices of at most 4 KiB beyond a partial record, so
/// without read-ahead a 16 KiB record costs several `recv` calls.
const READ_AHEAD: usize = 64 << 10;
/// The first read, and reads while messages stay small.
pub const READ_SMALL: usize = 8 << 10;

/// Read sizing for reads that allocate their buffer per read (the HBONE
/// pump, the TLS read-ahead): small reads take a small-size-class buffer
/// instead of a large allocation per message; once a read fills its
/// buffer (bulk) the next ones use `full`, until a short read again.
pub struct ReadSizer {
    full: usize,
    next: usize,
    /// The last read returned less than it asked for.
    short: bool,
}

impl ReadSizer {
    pub const fn new(full: usize) -> Self {
        Self {
            full,
            next: READ_SMALL,
            short: false,
        }
    }

    /// One `read(2)` of up to the next size, appended to `buf`. A short
    /// read (0 < n < size) means the socket is drained for now: see
    /// [`ReadSizer::was_short`].
    pub fn read(&mut self, fd: RawFd, buf: &mut BytesMut) -> io::Result<usize> {
        let want = self.next;
        let n = socket::read_into(fd, buf, want)?;
        self.short = n < want;
        self.next = if self.short { READ_SMALL } else { self.full };
        Ok(n)
    }

    /// The last read returned less than it asked for: for TCP, the receive
    /// queue was empty when it returned.
    pub fn was_short(&self) -> bool {
        self.short
    }
}

/// A nonblocking TCP socket with tokio's I/O traits.
pub struct FdStream {
    // Declared before `fd`: the ring's operations on the socket are
    // cancelled (and a graceful close's last bytes handed over) before the
    // socket closes.
    io: StreamIo,
    fd: OwnedFd,
}

enum StreamIo {
    Ring(RingSocket),
    Ready(ReadyIo),
}

/// Readiness mode: the syscalls' state.
struct ReadyIo {
    reg: Registration,
    /// Read-ahead bytes not yet handed out; allocated per fill and dropped
    /// as soon as it is drained, so an idle stream holds no buffer.
    ahead: Option<BytesMut>,
    sizer: ReadSizer,
}

impl FdStream {
    /// A stream on `fd`, in the core's I/O mode.
    pub fn new(fd: OwnedFd, poller: Rc<Poller>) -> Self {
        let io = if poller.completion() {
            let mut sock = RingSocket::new(&poller, fd.as_raw_fd(), poller.caps());
            // A stream closes gracefully unless told otherwise (a reset is
            // SO_LINGER 0 on the descriptor, which discards bytes anyway):
            // what h2 or rustls wrote last (a GOAWAY, a close_notify) goes.
            sock.linger();
            StreamIo::Ring(sock)
        } else {
            StreamIo::Ready(ReadyIo {
                reg: Registration::new(&poller, fd.as_raw_fd()),
                ahead: None,
                sizer: ReadSizer::new(READ_AHEAD),
            })
        };
        Self { io, fd }
    }
}

impl ReadyIo {
    /// One `read(2)`: straight into `buf` when it is large, else into a
    /// fresh read-ahead buffer. Ok = bytes (or EOF) are in `buf`; a short
    /// read tells the registration the socket is drained.
    fn fill(&mut self, fd: RawFd, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        if buf.remaining() >= READ_AHEAD {
            let unfilled = buf.initialize_unfilled();
            let want = unfilled.len();
            let n = socket::read(fd, unfilled)?;
            buf.advance(n);
            if n > 0 && n < want {
                self.reg.drained();
            }
            return Ok(());
        }
        let mut ahead = BytesMut::new();
        if self.sizer.read(fd, &mut ahead)? > 0 {
            if self.sizer.was_short() {
                self.reg.drained();
            }
            self.ahead = Some(ahead);
            self.drain_ahead(buf);
        }
        Ok(())
    }

    fn drain_ahead(&mut self, buf: &mut ReadBuf<'_>) {
        let Some(a) = &mut self.ahead else { return };
        let n = a.len().min(buf.remaining());
        buf.put_slice(&a[..n]);
        // advance, not split_to: a split would allocate a shared header.
        bytes::Buf::advance(a, n);
        if a.is_empty() {
            self.ahead = None;
        }
    }

    /// Waits for `events`; Ready(Ok) means "try the syscall again".
    fn wait(&self, events: i16, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.reg.poll_ready(cx, events).map(|r| r.map(|_| ()))
    }

    /// Retries `write` until it makes progress, waiting for POLLOUT on
    /// EAGAIN.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        fd: RawFd,
        write: impl Fn(RawFd) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match write(fd) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if socket::would_block(&e) => {
                    ready!(self.wait(libc::POLLOUT, cx))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsRawFd for FdStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for FdStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsyncRead for FdStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let fd = this.fd.as_raw_fd();
        let r = match &mut this.io {
            StreamIo::Ring(sock) => return sock.poll_read(cx, buf),
            StreamIo::Ready(r) => r,
        };
        if r.ahead.is_some() {
            r.drain_ahead(buf);
            return Poll::Ready(Ok(()));
        }
        loop {
            ready!(r.reg.poll_readable(cx))?;
            match r.fill(fd, buf) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(e) if socket::would_block(&e) => r.reg.drained(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let fd = this.fd.as_raw_fd();
        match &mut this.io {
            StreamIo::Ring(sock) => sock.poll_write(cx, data),
            StreamIo::Ready(r) => r.poll_write_with(cx, fd, |fd| socket::write(fd, data)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let fd = this.fd.as_raw_fd();
        match &mut this.io {
            StreamIo::Ring(sock) => sock.poll_write_vectored(cx, bufs),
            StreamIo::Ready(r) => r.poll_write_with(cx, fd, |fd| socket::writev(fd, bufs)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Completion mode: queued bytes are handed to the kernel by the next
    /// enter, which always comes before the core sleeps, so a flush has
    /// nothing to wait for (waiting for the send's completion would hold
    /// h2's connection task through a sleep for nothing).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends FIN once everything queued is in the kernel.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let StreamIo::Ring(sock) = &this.io {
            ready!(sock.poll_flushed(cx))?;
        }
        match socket::shutdown_write(this.fd.as_raw_fd()) {
            Err(e) if e.raw_os_error() != Some(libc::ENOTCONN) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// Reads some bytes from a plain socket, waiting for readiness.
pub async fn read_some(reg: &Registration, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        reg.readable().await?;
        match socket::read(reg.fd(), buf) {
            Ok(n) if n > 0 && n < buf.len() => {
                reg.drained();
                return Ok(n);
            }
            Err(e) if socket::would_block(&e) => reg.drained(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Writes all of `buf` to a plain socket, waiting for readiness.
pub async fn write_all(reg: &Registration, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match socket::write(reg.fd(), buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if socket::would_block(&e) => {
                reg.ready(libc::POLLOUT).await?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
