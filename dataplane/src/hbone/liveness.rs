//! Time bounds of a served (inbound) HBONE connection once its handshake
//! is done: the client's SETTINGS ACK, PING keepalive and an idle timeout.
//!
//! The `h2` server applies our header-list limit only once the client ACKs
//! our SETTINGS (until then its decoder allows 16 MiB), and it does not say
//! when that happens. Two facts make the ACK observable: a PING we send
//! after our SETTINGS is answered only after a compliant client has ACKed
//! them (it must ACK at once, and frames are processed in order), and
//! `Connection::set_initial_window_size` fails while our SETTINGS still
//! wait for their ACK. So: PING at once; no answer within the bound → cut;
//! an answer while our SETTINGS are still unacknowledged → a client that
//! answers PINGs but withholds the ACK, cut too.
//!
//! A connection whose reads the core held back (its memory budget,
//! [`gate`](super::gate)) may have its answer waiting unread: silence then
//! does not count against the peer, and the wait starts again.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use h2::{Ping, PingPong};

use super::gate::ReadGate;
use crate::io::executor::timer;

/// The connection's read gate, if it has one.
pub type Gate = Option<Rc<dyn ReadGate>>;

/// The bounds, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct ServerTimeouts {
    /// PING every this long (ztunnel's HBONE server: 10 s).
    pub keepalive_interval: Duration,
    /// A PING not answered within this closes the connection (ztunnel: 20 s).
    pub keepalive_timeout: Duration,
    /// A connection with no open stream for this long is closed
    /// gracefully (GOAWAY). None: never (ztunnel's server has no such
    /// bound; its clients release idle connections after 5 min).
    pub idle: Option<Duration>,
}

impl Default for ServerTimeouts {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            idle: None,
        }
    }
}

/// What the watch saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The first PING was answered: now check the SETTINGS ACK, then
    /// [`keepalive`].
    Answered,
    /// The first PING, sent right after our SETTINGS, was not answered
    /// within the handshake bound.
    NoSettingsAck,
    /// A keepalive PING was not answered in time.
    NoPong,
    /// No open stream for the idle timeout.
    Idle,
    /// The connection ended under the watch: nothing to do.
    Gone,
}

/// A watch in progress; it owns the PING handle and gives it back.
pub type Watch = Pin<Box<dyn Future<Output = (Liveness, PingPong)>>>;

/// One PING right after the handshake, answered within `bound`.
pub fn first_ping(mut pings: PingPong, bound: Duration, gate: Gate) -> Watch {
    Box::pin(async move {
        let seen = match round_trip(&mut pings, bound, &gate).await {
            Some(true) => Liveness::Answered,
            Some(false) => Liveness::Gone,
            None => Liveness::NoSettingsAck,
        };
        (seen, pings)
    })
}

/// PINGs every interval and the idle timeout, for the connection's life.
/// `open` counts the connection's open streams.
pub fn keepalive(
    mut pings: PingPong,
    t: ServerTimeouts,
    open: Rc<Cell<usize>>,
    gate: Gate,
) -> Watch {
    Box::pin(async move {
        // Wake at the shorter bound; ping only once per interval.
        let step = t
            .idle
            .map_or(t.keepalive_interval, |i| i.min(t.keepalive_interval));
        let mut idle_since = Instant::now();
        let mut pinged = Instant::now();
        loop {
            timer::sleep(step).await;
            let now = Instant::now();
            if open.get() > 0 {
                idle_since = now;
            } else if t.idle.is_some_and(|i| now - idle_since >= i) {
                return (Liveness::Idle, pings);
            }
            if now - pinged >= t.keepalive_interval {
                pinged = now;
                match round_trip(&mut pings, t.keepalive_timeout, &gate).await {
                    Some(true) => {}
                    Some(false) => return (Liveness::Gone, pings),
                    None => return (Liveness::NoPong, pings),
                }
            }
        }
    })
}

/// Some(true): answered; Some(false): the connection is gone; None: no
/// answer within `bound` while the connection was reading.
async fn round_trip(pings: &mut PingPong, bound: Duration, gate: &Gate) -> Option<bool> {
    if pings.send_ping(Ping::opaque()).is_err() {
        return Some(false);
    }
    let pong = std::future::poll_fn(|cx| pings.poll_pong(cx));
    let mut pong = std::pin::pin!(pong);
    loop {
        let since = Instant::now();
        match timer::timeout(bound, pong.as_mut()).await {
            Ok(r) => return Some(r.is_ok()),
            // Held back by us: the answer may be unread; wait again.
            Err(_) if gate.as_ref().is_some_and(|g| g.held_back_since(since)) => {}
            Err(_) => return None,
        }
    }
}

/// Counts a connection's open streams while the wrapped future runs.
pub struct OpenStream(Rc<Cell<usize>>);

impl OpenStream {
    pub fn new(open: &Rc<Cell<usize>>) -> Self {
        open.set(open.get() + 1);
        Self(open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}
