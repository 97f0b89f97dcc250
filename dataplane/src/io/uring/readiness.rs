//! Readiness waits on the core's ring: one-shot `POLL_ADD`s ([`Ready`],
//! for rare waits such as a connect) and standing multishot ones
//! ([`Registration`], for listeners and for the splice path's sockets
//! while a connection is in bulk mode).
//!
//! Core-local (!Send).

use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, types};

use super::{tag, Op, Poller, Slot};

/// State of one registered fd: readiness seen but not yet consumed, and
/// who waits for it.
#[derive(Default)]
pub(super) struct Standing {
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

impl Standing {
    /// A completion of the standing poll: `res` is the revents mask or
    /// -errno; `more` is false once the kernel ended the poll.
    pub(super) fn complete(&mut self, res: i32, more: bool, wakers: &mut Vec<Waker>) {
        let mut bits = 0;
        if res < 0 {
            self.error = Some(res);
            bits = READ_SIDE | WRITE_SIDE;
        } else {
            bits |= res as u32;
            self.ready |= res as u32;
        }
        if !more {
            // The kernel ended the poll (overflow, error): wake everyone so
            // the next wait re-arms it.
            self.armed = false;
            bits = READ_SIDE | WRITE_SIDE;
        }
        if bits & READ_SIDE != 0 {
            wakers.append(&mut self.readers);
        }
        if bits & WRITE_SIDE != 0 {
            wakers.append(&mut self.writers);
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

impl Ready {
    pub(super) fn new(poller: Rc<Poller>, fd: RawFd, events: i16) -> Self {
        Self {
            poller,
            fd,
            events,
            key: None,
        }
    }
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
                    .user_data(tag(key, Op::Poll));
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
                    Slot::Orphan | Slot::Standing(_) | Slot::Sock(_) => {
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
                self.poller.cancel_poll(key);
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
                .user_data(tag(key, Op::Poll));
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
        self.poller.cancel_poll(key);
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

    use super::super::tests::until;

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
            let cfg = super::super::RingConfig {
                entries: 1,
                recv_buffers: 4,
                recv_buffer_size: 4096,
                ..Default::default()
            };
            let p = Poller::new(cfg, doorbell).expect("readiness ring");
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
            // The poll's removal is submitted at the end of this pass and
            // completes (dropping the kernel's reference to the socket) in
            // the executor's next enter: wait on the executor, not on a
            // blocking read that would stop it.
            client.set_nonblocking(true).unwrap();
            until(
                "the client sees EOF: the poll no longer holds the socket",
                || matches!((&client).read(&mut [0u8; 4]), Ok(0)),
            )
            .await;
            // The cancellation completes; a reap frees the key.
            until("the registration's slot is freed", || slots_in_use(&p) == 0).await;
        });
    }
}
