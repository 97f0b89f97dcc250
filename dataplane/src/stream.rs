//! Async byte streams over our own nonblocking sockets, driven by the
//! per-core readiness ring: what rustls and h2 run on. Bytes that must be
//! decrypted cannot be spliced, so the HBONE paths read and write through
//! userspace here; plain passthrough stays on [`crate::copy`].
//! Core-local (!Send).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::socket;
use crate::uring::{Poller, Registration};

/// Bytes pulled from the socket per read when the caller asks for less.
/// rustls reads TLS in slices of at most 4 KiB beyond a partial record, so
/// without read-ahead a 16 KiB record costs several `recv` calls.
const READ_AHEAD: usize = 64 << 10;
/// Read-ahead after a short read: small messages (request/response) take a
/// small-size-class buffer instead of a 64 KiB one each.
const READ_AHEAD_SMALL: usize = 8 << 10;

/// A nonblocking TCP socket with tokio's I/O traits.
pub struct FdStream {
    // Declared before `fd`: the poll is removed before the socket closes.
    reg: Registration,
    fd: OwnedFd,
    /// Read-ahead bytes not yet handed out; allocated per fill and dropped
    /// as soon as it is drained, so an idle stream holds no buffer.
    ahead: Option<Ahead>,
    /// Size of the next read-ahead: READ_AHEAD after a read that filled its
    /// buffer, READ_AHEAD_SMALL after a short one.
    ahead_size: usize,
}

struct Ahead {
    buf: Vec<u8>,
    start: usize,
}

impl FdStream {
    pub fn new(fd: OwnedFd, poller: Rc<Poller>) -> Self {
        Self {
            reg: Registration::new(&poller, fd.as_raw_fd()),
            fd,
            ahead: None,
            ahead_size: READ_AHEAD_SMALL,
        }
    }

    /// One `read(2)`: straight into `buf` when it is large, else into a
    /// fresh read-ahead buffer. Ok = bytes (or EOF) are in `buf`.
    fn fill(&mut self, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        let fd = self.fd.as_raw_fd();
        if buf.remaining() >= READ_AHEAD {
            let n = socket::read(fd, buf.initialize_unfilled())?;
            buf.advance(n);
            return Ok(());
        }
        let size = self.ahead_size;
        let mut ahead = Vec::with_capacity(size);
        // SAFETY: read(2) writes at most `size` bytes into the spare
        // capacity; only the `n` it reports become visible.
        let n = socket::read(fd, unsafe {
            std::slice::from_raw_parts_mut(ahead.as_mut_ptr(), size)
        })?;
        self.ahead_size = if n == size {
            READ_AHEAD
        } else {
            READ_AHEAD_SMALL
        };
        if n > 0 {
            unsafe { ahead.set_len(n) };
            self.ahead = Some(Ahead {
                buf: ahead,
                start: 0,
            });
            self.drain_ahead(buf);
        }
        Ok(())
    }

    fn drain_ahead(&mut self, buf: &mut ReadBuf<'_>) {
        let Some(a) = &mut self.ahead else { return };
        let n = (a.buf.len() - a.start).min(buf.remaining());
        buf.put_slice(&a.buf[a.start..a.start + n]);
        a.start += n;
        if a.start == a.buf.len() {
            self.ahead = None;
        }
    }

    /// Waits for `events`; Ready(Ok) means "try the syscall again".
    fn wait(&self, events: i16, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.reg.poll_ready(cx, events).map(|r| r.map(|_| ()))
    }
}

impl FdStream {
    /// Retries `write` until it makes progress, waiting for POLLOUT on
    /// EAGAIN.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        write: impl Fn(RawFd) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match write(self.fd.as_raw_fd()) {
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
        if this.ahead.is_some() {
            this.drain_ahead(buf);
            return Poll::Ready(Ok(()));
        }
        loop {
            match this.fill(buf) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(e) if socket::would_block(&e) => {
                    ready!(this.wait(libc::POLLIN | libc::POLLRDHUP, cx))?;
                }
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
        self.get_mut()
            .poll_write_with(cx, |fd| socket::write(fd, data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, |fd| socket::writev(fd, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match socket::shutdown_write(self.fd.as_raw_fd()) {
            Err(e) if e.raw_os_error() != Some(libc::ENOTCONN) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// Reads some bytes from a plain socket, waiting for readiness.
pub async fn read_some(reg: &Registration, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match socket::read(reg.fd(), buf) {
            Err(e) if socket::would_block(&e) => {
                reg.ready(libc::POLLIN | libc::POLLRDHUP).await?;
            }
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
