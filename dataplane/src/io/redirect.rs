//! Passthrough pairs handed to the kernel (`--sockmap-redirect`): the
//! connection's task drives [`sockmap::Redirected`]'s protocol, so the core
//! is woken per connection event (a FIN, a reset, the bell), not per
//! message. Byte counts come from the kernel: at every event, every
//! [`REFRESH`], and when the pair ends or is taken back.
//!
//! When a direction passes its bell mark (bulk: the copy path moves it
//! faster, and the budget bounds what the kernel holds for a slow reader)
//! the pair is taken back without losing a byte, and the connection goes
//! on on the copy path for the rest of its life. Where the kernel refuses
//! the handoff (a socket already past its FIN, a full map) the connection
//! never leaves the copy path. Core-local (!Send).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::io::count::ByteCount;
use crate::io::executor::timer;
use crate::io::socket;
use crate::io::sockmap::{Redirected, Sockmap};
use crate::io::uring::{Poller, Registration};

/// How often a redirected pair's byte counts are brought up to date when
/// nothing else happens on it (each refresh costs a dozen system calls).
pub const REFRESH: Duration = Duration::from_secs(5);
/// How often a pair waiting for its last bytes to leave the kernel looks
/// again (after a FIN, at a take-back).
const SETTLE: Duration = Duration::from_millis(1);

/// One core's redirect: its kernel objects and who waits for its bell.
pub struct Redirector {
    map: Rc<Sockmap>,
    /// Cookies the bell named, not yet seen by their connection.
    rung: RefCell<HashSet<u64>>,
    waiting: RefCell<HashMap<u64, Waker>>,
}

/// How a redirected pair ended.
pub enum Handback {
    /// Both directions finished in the kernel (FIN passed on each way).
    Closed,
    /// Taken back: the copy path goes on with the sockets.
    Resume,
    /// `a` (0) or `b` (1) reset or failed (or a direction stalled past
    /// its budget, which can only end in a reset).
    Reset(usize, io::Error),
}

impl Redirector {
    /// Makes the core's kernel objects; the error says why the kernel
    /// refuses (capabilities, seccomp, kernel config).
    pub fn new() -> Result<Rc<Self>, String> {
        let map = Sockmap::new().map_err(|e| e.to_string())?;
        Ok(Rc::new(Self {
            map: Rc::new(map),
            rung: RefCell::default(),
            waiting: RefCell::default(),
        }))
    }

    /// The core's bell listener: runs for the core's life.
    pub async fn listen(self: Rc<Self>, poller: Rc<Poller>) {
        let reg = Registration::new(&poller, self.map.bell().as_raw_fd());
        loop {
            if let Err(e) = reg.ready(libc::POLLIN).await {
                tracing::error!(error = %e, "sockmap bell failed; redirected pairs are checked by their timers only");
                return;
            }
            for cookie in self.map.rung() {
                self.rung.borrow_mut().insert(cookie);
                if let Some(w) = self.waiting.borrow_mut().remove(&cookie) {
                    w.wake();
                }
            }
        }
    }

    /// Hands `a ⇄ b` to the kernel and drives the pair until it ends or is
    /// taken back. Err: the kernel refused the handoff, nothing changed.
    pub async fn run(
        &self,
        poller: &Rc<Poller>,
        a: RawFd,
        b: RawFd,
        counts: [&ByteCount; 2],
    ) -> io::Result<Handback> {
        // SAFETY: the caller owns both descriptors for the whole copy, and
        // this future ends (dropping the pair, which takes them out of the
        // maps) before the copy does.
        let (fa, fb) = unsafe { (BorrowedFd::borrow_raw(a), BorrowedFd::borrow_raw(b)) };
        let mut pair = self.map.splice_pair(fa, fb)?;
        let cookies = pair.cookies();
        let fds = [(a, b), (b, a)];
        let mut counted = [0u64; 2];
        let mut shut = [false; 2];
        let result = loop {
            let flows = match pair.flows() {
                Ok(f) => f,
                Err(e) => break Handback::Reset(0, e),
            };
            for i in 0..2 {
                counts[i].add(flows[i].delivered.saturating_sub(counted[i]));
                counted[i] = counted[i].max(flows[i].delivered);
            }
            if let Some(i) = (0..2).find(|&i| flows[i].stalled) {
                break Handback::Reset(
                    i,
                    io::Error::other("sockmap redirect stalled past its budget"),
                );
            }
            if flows.iter().any(|f| f.warned) {
                break match self.take_back(&mut pair, counts, &mut counted).await {
                    Ok(()) => Handback::Resume,
                    Err(e) => Handback::Reset(0, e),
                };
            }
            let mut settling = false;
            for i in 0..2 {
                if flows[i].eof && !shut[i] {
                    if flows[i].done() {
                        let _ = socket::shutdown_write(fds[i].1);
                        shut[i] = true;
                    } else {
                        settling = true;
                    }
                }
            }
            if shut == [true, true] {
                break Handback::Closed;
            }
            // Wait for an event: a hang-up or error on a side still open,
            // the bell, or the refresh (or settle) timer.
            let wait = if settling { SETTLE } else { REFRESH };
            let event = self.event(poller, [a, b], shut, cookies, wait).await;
            if let Some((side, revents)) = event {
                if revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                    let err = socket::take_error(fds[side].0)
                        .unwrap_or_else(|| io::Error::from_raw_os_error(libc::ECONNRESET));
                    break Handback::Reset(side, err);
                }
            }
        };
        for c in cookies {
            self.waiting.borrow_mut().remove(&c);
            self.rung.borrow_mut().remove(&c);
        }
        if let Handback::Resume = result {
            // Nothing in flight, nothing kept (checked): leaving the maps
            // loses nothing, and what arrived since waits in the sockets'
            // receive queues for the copy path.
            return Ok(match pair.finish() {
                Ok(_) => Handback::Resume,
                Err(unfinished) => Handback::Reset(0, unfinished.error),
            });
        }
        // A last count before the pair leaves the maps.
        if let Ok(flows) = pair.flows() {
            for i in 0..2 {
                counts[i].add(flows[i].delivered.saturating_sub(counted[i]));
            }
        }
        Ok(result)
    }

    /// Waits for the first of: POLLRDHUP (or an error) on a side not yet
    /// shut, the bell for this pair, `wait`. Some((side, revents)) for a
    /// socket event.
    async fn event(
        &self,
        poller: &Rc<Poller>,
        fds: [RawFd; 2],
        shut: [bool; 2],
        cookies: [u64; 2],
        wait: Duration,
    ) -> Option<(usize, i16)> {
        // Only POLLRDHUP: the kernel wakes POLLIN waiters on every
        // redirected segment (sockmap.rs).
        let side = |i: usize| {
            let ready = (!shut[i]).then(|| poller.ready(fds[i], libc::POLLRDHUP));
            async move {
                match ready {
                    Some(r) => Some((i, r.await.unwrap_or(libc::POLLERR))),
                    None => std::future::pending().await,
                }
            }
        };
        let bell = std::future::poll_fn(|cx| {
            let mut rung = self.rung.borrow_mut();
            if cookies.iter().any(|c| rung.remove(c)) {
                return Poll::Ready(None);
            }
            let mut waiting = self.waiting.borrow_mut();
            for c in cookies {
                waiting.insert(c, cx.waker().clone());
            }
            Poll::Pending
        });
        let timer = async {
            timer::sleep(wait).await;
            None
        };
        futures_lite::future::or(
            futures_lite::future::or(side(0), side(1)),
            futures_lite::future::or(bell, timer),
        )
        .await
    }

    /// Takes the pair back without losing a byte: stop redirecting, wait
    /// until what the kernel took has been written, leave the maps.
    async fn take_back(
        &self,
        pair: &mut Redirected<'_>,
        counts: [&ByteCount; 2],
        counted: &mut [u64; 2],
    ) -> io::Result<()> {
        pair.stop()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let flows = pair.flows()?;
            if flows.iter().any(|f| f.stalled) {
                return Err(io::Error::other(
                    "sockmap redirect stalled before it could be taken back",
                ));
            }
            if flows.iter().all(|f| f.in_flight == 0) {
                for i in 0..2 {
                    counts[i].add(flows[i].delivered.saturating_sub(counted[i]));
                    counted[i] = counted[i].max(flows[i].delivered);
                }
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "sockmap redirect: bytes stayed in the kernel for 10 s at a take-back",
                ));
            }
            timer::sleep(SETTLE).await;
        }
    }
}
