//! A read gate under an HTTP/2 connection: while it is shut, h2 reads no
//! more of the connection's bytes (they wait in the kernel's socket buffer
//! and TCP pushes back on the peer), yet h2 keeps writing (responses, DATA
//! towards the peer, WINDOW_UPDATEs): h2 flushes its queues whenever a
//! read is pending.
//!
//! Who shuts the gate is decided above this layer (the core's memory
//! budget, `core::memory`); this layer only asks. A shut gate asks again
//! once a second, and looks at the socket then: a peer that closed or
//! reset the connection meanwhile (its FIN waits behind the unread bytes)
//! ends it, rather than leaving it and what it holds behind.

use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::io::executor::timer::{self, Sleep};
use crate::io::socket;

/// How often a shut gate looks whether the peer left.
const LOOK_EVERY: Duration = Duration::from_secs(1);

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What decides whether a connection may read now.
pub trait ReadGate {
    /// Ready when the connection may read; Pending (the waker kept and
    /// woken when that may have changed) while it must not.
    fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// Whether reads were held back at any moment since `t` (or are now):
    /// an answer the peer sent may be waiting unread, so silence since `t`
    /// says nothing about the peer.
    fn held_back_since(&self, t: Instant) -> bool;
}

/// `T` with its reads behind a [`ReadGate`]; writes pass straight through.
pub struct Gated<T> {
    inner: T,
    gate: Option<Rc<dyn ReadGate>>,
    /// The TCP socket under `inner`, looked at while the gate is shut.
    fd: RawFd,
    look: Option<Pin<Box<Sleep>>>,
}

impl<T> Gated<T> {
    /// `gate` None: never held back. `fd`: the TCP socket `inner` reads.
    pub fn new(inner: T, fd: RawFd, gate: Option<Rc<dyn ReadGate>>) -> Self {
        Gated {
            inner,
            gate,
            fd,
            look: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gated<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(gate) = &this.gate {
            // Shut: look again once a second (the gate may have changed its
            // mind on what no wake-up told it), and end if the peer left.
            while gate.poll_open(cx).is_pending() {
                let look = this
                    .look
                    .get_or_insert_with(|| Box::pin(timer::sleep(LOOK_EVERY)));
                if look.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.look = None;
                if socket::peer_gone(this.fd) {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the peer closed the connection while its reads were held back",
                    )));
                }
            }
            this.look = None;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gated<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Told each time a tunnel gives window back to its peer, so that what
/// its stream holds is counted at once (`core::memory`).
pub trait Released {
    /// `queued`: bytes the tunnel has released but still holds on its
    /// way to the workload (queued on the socket, not yet in the kernel).
    fn released(&self, queued: usize);
}
