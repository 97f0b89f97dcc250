//! Async byte streams over our own nonblocking sockets, driven by the
//! per-core readiness ring: what rustls and h2 run on. Bytes that must be
//! decrypted cannot be spliced, so the HBONE paths read and write through
//! userspace here; plain passthrough stays on [`crate::copy`].
//! Core-local (!Send).

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::socket;
use crate::uring::{Poller, Ready};

/// A nonblocking TCP socket with tokio's I/O traits.
pub struct FdStream {
    fd: OwnedFd,
    poller: Rc<Poller>,
    read_wait: Option<Ready>,
    write_wait: Option<Ready>,
}

impl FdStream {
    pub fn new(fd: OwnedFd, poller: Rc<Poller>) -> Self {
        Self {
            fd,
            poller,
            read_wait: None,
            write_wait: None,
        }
    }

    /// Waits on `slot` for `events`; Ready(Ok) means "try the syscall again".
    fn wait(
        poller: &Rc<Poller>,
        fd: RawFd,
        slot: &mut Option<Ready>,
        events: i16,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let fut = slot.get_or_insert_with(|| poller.ready(fd, events));
        let r = ready!(Pin::new(fut).poll(cx));
        *slot = None;
        Poll::Ready(r.map(|_| ()))
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
                    let fd = self.fd.as_raw_fd();
                    ready!(Self::wait(
                        &self.poller,
                        fd,
                        &mut self.write_wait,
                        libc::POLLOUT,
                        cx
                    ))?;
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
        loop {
            let dst = buf.initialize_unfilled();
            match socket::read(this.fd.as_raw_fd(), dst) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if socket::would_block(&e) => {
                    ready!(Self::wait(
                        &this.poller,
                        this.fd.as_raw_fd(),
                        &mut this.read_wait,
                        libc::POLLIN,
                        cx
                    ))?;
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
pub async fn read_some(poller: &Rc<Poller>, fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match socket::read(fd, buf) {
            Err(e) if socket::would_block(&e) => {
                poller.ready(fd, libc::POLLIN | libc::POLLRDHUP).await?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Writes all of `buf` to a plain socket, waiting for readiness.
pub async fn write_all(poller: &Rc<Poller>, fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match socket::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if socket::would_block(&e) => {
                poller.ready(fd, libc::POLLOUT).await?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
