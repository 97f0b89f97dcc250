//! A core's memory budget for bytes held on behalf of inbound HBONE peers
//! (`--memory-budget-per-core`).
//!
//! What a peer can make a core hold grows with its connections: DATA that
//! h2 received and the tunnel has not yet handed to its workload (a
//! workload that does not read, data sent while the dial is in flight)
//! stays in memory up to the connection's window, 16 MiB by default, per
//! connection. h2 counts those bytes per stream (`FlowControl::
//! used_capacity`, from the frame's arrival until the tunnel releases
//! them); after the release the tunnel may still hold them queued on the
//! workload's socket (up to `--socket-cap` and one frame), which the
//! tunnel reports as it releases. A stream holds the sum, a connection the
//! sum over its streams, the core the sum over its connections.
//!
//! Past the budget the heaviest connections stop reading their socket
//! ([`must_pause`], enforced by `hbone::gate`): their bytes stay in the
//! kernel and TCP pushes back on the peer; their h2 connection window is
//! shut meanwhile (`proxy::inbound`), so the peer gets no new window and
//! resuming brings no burst. A connection holding little
//! keeps reading, so a bystander's small tunnel keeps flowing beside a
//! peer whose workload never reads. A paused connection is woken when
//! what it holds falls, or when the core's total falls under the soft
//! limit, and looks again once a second anyway.
//!
//! Per-connection buffers that do not depend on what the peer sends are
//! not counted here: they are bounded by the connection caps (the socket's
//! receive cap, `--socket-cap`; rustls' record buffers; h2's frame buffer,
//! at most one frame of `--h2-max-frame`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use h2::FlowControl;
use ringway_controlplane::model::identity::Identity;

use crate::hbone::gate::{ReadGate, Released};
use crate::telemetry::metrics::CoreStats;
use crate::telemetry::ratelog::RateLog;

/// The part of the budget kept for connections holding little once the
/// rest is used: 1/8. Past `limit - limit / 8`, a connection may read on
/// only while it holds less than its even share of that reserve, so the
/// core's total stays under the limit plus one read per connection.
pub const RESERVE_DIVISOR: u64 = 8;

/// Whether a connection holding `held` bytes must stop reading while its
/// core holds `total` bytes over `holders` connections (those holding any)
/// against `limit` (0: no budget).
///
/// Only past the soft limit (`limit` less the reserve), and only a
/// connection at or above its share of the reserve: never one holding
/// nothing, so a peer that holds no bytes is never held back for others'.
pub fn must_pause(limit: u64, total: u64, held: u64, holders: usize) -> bool {
    if limit == 0 || held == 0 {
        return false;
    }
    let reserve = limit / RESERVE_DIVISOR;
    if total < limit - reserve {
        return false;
    }
    held >= reserve / holders.max(1) as u64
}

/// One core's account: the budget, what its connections hold, and the
/// paused connections waiting for the total to fall.
pub struct CoreMemory {
    limit: u64,
    total: Cell<u64>,
    /// Connections holding at least a byte.
    holders: Cell<usize>,
    paused: Cell<usize>,
    /// Paused connections' readers, woken when the total falls.
    waiting: RefCell<Vec<Waker>>,
    stats: Arc<CoreStats>,
    core: usize,
    /// At most one "paused" line a second on the core.
    log: RateLog,
}

impl CoreMemory {
    /// `limit` 0: no budget (nothing counted, nothing paused).
    pub fn new(limit: u64, stats: Arc<CoreStats>, core: usize) -> Rc<Self> {
        Rc::new(CoreMemory {
            limit,
            total: Cell::new(0),
            holders: Cell::new(0),
            paused: Cell::new(0),
            waiting: RefCell::default(),
            stats,
            core,
            log: RateLog::new("inbound HBONE connections paused by the memory budget", 1),
        })
    }

    /// Whether a budget is in force.
    pub fn enabled(&self) -> bool {
        self.limit != 0
    }

    /// Bytes held on the core (the last count of each connection).
    pub fn total(&self) -> u64 {
        self.total.get()
    }

    /// A new inbound HBONE connection's account, None without a budget.
    pub fn connection(self: &Rc<Self>, peer: Rc<Identity>) -> Option<Rc<ConnMemory>> {
        self.enabled().then(|| {
            Rc::new(ConnMemory {
                core: self.clone(),
                peer,
                streams: RefCell::default(),
                held: Cell::new(0),
                paused: Cell::new(false),
                resumed_at: Cell::new(None),
                reader: RefCell::new(None),
                watcher: RefCell::new(None),
            })
        })
    }

    /// A connection's count moved from `old` to `new`.
    fn account(&self, old: u64, new: u64) {
        if old == new {
            return;
        }
        self.total.set(self.total.get() - old + new);
        match (old, new) {
            (0, _) => self.holders.set(self.holders.get() + 1),
            (_, 0) => self.holders.set(self.holders.get() - 1),
            _ => {}
        }
        self.stats.memory_held.set(self.total.get());
        if new < old {
            self.fell();
        }
    }

    /// The total fell: paused connections look again once it is under the
    /// soft limit (each decides for itself; most stay paused otherwise).
    fn fell(&self) {
        let soft = self.limit - self.limit / RESERVE_DIVISOR;
        if self.total.get() < soft {
            self.wake_all();
        }
    }

    fn wake_all(&self) {
        // Taken out before waking: a woken reader may register again.
        let waiting = std::mem::take(&mut *self.waiting.borrow_mut());
        waiting.into_iter().for_each(Waker::wake);
    }

    fn set_paused(&self, delta: isize) {
        self.paused
            .set(self.paused.get().wrapping_add_signed(delta));
        self.stats.memory_paused.set(self.paused.get() as u64);
    }
}

/// One inbound HBONE connection's account: its admitted streams' flow
/// control (to read what each holds) and whether its reads are held back.
pub struct ConnMemory {
    core: Rc<CoreMemory>,
    /// For the log line.
    peer: Rc<Identity>,
    streams: RefCell<Vec<Rc<StreamMemory>>>,
    held: Cell<u64>,
    paused: Cell<bool>,
    resumed_at: Cell<Option<Instant>>,
    /// The connection's reader while paused.
    reader: RefCell<Option<Waker>>,
    /// The connection's loop, told of pauses and resumptions.
    watcher: RefCell<Option<Waker>>,
}

/// What one stream held when last looked at.
pub struct StreamMemory {
    flow: FlowControl,
    /// Released but queued towards the workload, as last reported.
    queued: Cell<u64>,
    seen: Cell<u64>,
}

impl StreamMemory {
    fn now(&self) -> u64 {
        self.flow.used_capacity() as u64 + self.queued.get()
    }
}

impl ConnMemory {
    /// Counts `flow`'s stream on this connection until the returned guard
    /// drops (its tunnel ended).
    pub fn track(self: &Rc<Self>, flow: FlowControl) -> StreamHeld {
        let stream = Rc::new(StreamMemory {
            seen: Cell::new(flow.used_capacity() as u64),
            queued: Cell::new(0),
            flow,
        });
        self.streams.borrow_mut().push(stream.clone());
        self.set_held(self.held.get() + stream.seen.get());
        StreamHeld {
            conn: self.clone(),
            stream,
        }
    }

    /// What the connection holds now, every stream looked at.
    fn refresh(&self) {
        let held = self
            .streams
            .borrow()
            .iter()
            .map(|s| {
                let now = s.now();
                s.seen.set(now);
                now
            })
            .sum();
        self.set_held(held);
    }

    fn set_held(&self, held: u64) {
        let old = self.held.replace(held);
        self.core.account(old, held);
        if held < old && self.paused.get() {
            self.wake_reader();
        }
    }

    fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }

    /// Resolves with whether the connection is paused once that differs
    /// from `applied`: its loop then shuts or reopens the h2 window.
    pub async fn paused_changed(&self, applied: bool) -> bool {
        std::future::poll_fn(|cx| {
            let paused = self.paused.get();
            if paused != applied {
                return Poll::Ready(paused);
            }
            *self.watcher.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    fn wake_watcher(&self) {
        if let Some(w) = self.watcher.borrow_mut().take() {
            w.wake();
        }
    }

    fn pause(&self, cx: &mut Context<'_>) {
        let core = &self.core;
        if !self.paused.replace(true) {
            core.set_paused(1);
            self.wake_watcher();
            let stats = &core.stats;
            crate::core::limits::count_and_log(&stats.memory_pauses, &core.log, |n| {
                tracing::warn!(
                    core = core.core,
                    peer = %*self.peer,
                    held = self.held.get(),
                    total = core.total.get(),
                    suppressed = n,
                    "inbound HBONE connection stops reading: the core holds {} bytes for peers \
                     against its budget of {} (--memory-budget-per-core), {} of them for this \
                     one; suppressed {n} such lines",
                    core.total.get(),
                    core.limit,
                    self.held.get()
                );
            });
        }
        *self.reader.borrow_mut() = Some(cx.waker().clone());
        let mut waiting = core.waiting.borrow_mut();
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
    }

    fn resume(&self) {
        if self.paused.replace(false) {
            self.core.set_paused(-1);
            self.wake_watcher();
            self.resumed_at.set(Some(Instant::now()));
        }
    }
}

impl ReadGate for ConnMemory {
    fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        // Every DATA frame read so far has reached its stream by now: h2
        // reads again only once it has handled what it had.
        self.refresh();
        self.decide(cx)
    }

    fn held_back_since(&self, t: Instant) -> bool {
        self.paused.get() || self.resumed_at.get().is_some_and(|r| r >= t)
    }
}

impl ConnMemory {
    /// Pauses or resumes on what is counted now.
    fn decide(&self, cx: &mut Context<'_>) -> Poll<()> {
        let core = &self.core;
        let pause = must_pause(
            core.limit,
            core.total.get(),
            self.held.get(),
            core.holders.get(),
        );
        if pause {
            self.pause(cx);
            Poll::Pending
        } else {
            self.resume();
            Poll::Ready(())
        }
    }
}

impl Drop for ConnMemory {
    fn drop(&mut self) {
        // Its streams are gone (each guard holds the connection).
        self.set_held(0);
        self.resume();
    }
}

/// A tracked stream, counted until dropped.
pub struct StreamHeld {
    conn: Rc<ConnMemory>,
    stream: Rc<StreamMemory>,
}

impl Released for StreamHeld {
    /// The tunnel gave window back: what its stream holds is counted now.
    fn released(&self, queued: usize) {
        self.stream.queued.set(queued as u64);
        let now = self.stream.now();
        let old = self.stream.seen.replace(now);
        let conn = &self.conn;
        // The connection's count is the sum of its streams' last counts.
        conn.set_held((conn.held.get() + now).saturating_sub(old));
    }
}

impl Drop for StreamHeld {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.streams
            .borrow_mut()
            .retain(|s| !Rc::ptr_eq(s, &self.stream));
        let seen = self.stream.seen.get();
        // Fewer holders mean larger shares, which paused connections see
        // when they look again (`hbone::gate`, once a second): a wake-up
        // of every paused connection at each stream's end would cost the
        // core as much as they are many.
        conn.set_held(conn.held.get().saturating_sub(seen));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// (limit, total, held, holders) → pause?
    #[test]
    fn only_heavy_connections_pause_and_only_past_the_soft_limit() {
        let cases: &[(u64, u64, u64, usize, bool, &str)] = &[
            (0, 900 * M, 800 * M, 2, false, "no budget"),
            (
                32 * M,
                27 * M,
                27 * M,
                1,
                false,
                "under the soft limit (28 MiB)",
            ),
            (
                32 * M,
                28 * M,
                28 * M,
                1,
                true,
                "at the soft limit, the only holder",
            ),
            (32 * M, 40 * M, 0, 5, false, "holding nothing: never paused"),
            (
                32 * M,
                30 * M,
                4 << 10,
                40,
                false,
                "a bystander's 4 KiB: under its share",
            ),
            (
                32 * M,
                30 * M,
                200 << 10,
                40,
                true,
                "200 KiB over a 102 KiB share",
            ),
            (
                32 * M,
                30 * M,
                100 << 10,
                40,
                false,
                "100 KiB under a 102 KiB share",
            ),
            (
                256 * M,
                255 * M,
                M,
                10_000,
                true,
                "many holders: small shares",
            ),
        ];
        for &(limit, total, held, holders, pause, why) in cases {
            assert_eq!(must_pause(limit, total, held, holders), pause, "{why}");
        }
    }

    /// Whatever order connections read in, the total stays within the
    /// limit plus one read per connection: simulated reads of `chunk`
    /// bytes by connections that never release.
    #[test]
    fn readers_that_never_release_stay_within_the_limit() {
        let (limit, chunk, conns) = (32 * M, 256 << 10, 40usize);
        let mut held = vec![0u64; conns];
        let mut total = 0;
        for _round in 0..1000 {
            for c in 0..conns {
                let holders = held.iter().filter(|&&h| h > 0).count();
                if !must_pause(limit, total, held[c], holders) && held[c] < 16 * M {
                    held[c] += chunk;
                    total += chunk;
                }
            }
        }
        assert!(
            total <= limit + conns as u64 * chunk,
            "{total} held against {limit}"
        );
        assert!(
            total >= limit - limit / RESERVE_DIVISOR,
            "the budget is used"
        );
    }

    fn peer() -> Rc<Identity> {
        Rc::new("spiffe://cluster.local/ns/a/sa/peer".parse().unwrap())
    }

    fn stats() -> Arc<CoreStats> {
        Arc::new(CoreStats::default())
    }

    #[test]
    fn without_a_budget_nothing_is_tracked() {
        let core = CoreMemory::new(0, stats(), 0);
        assert!(core.connection(peer()).is_none());
    }

    /// The account's arithmetic without h2: holders, total, gauges, and
    /// the wake-up of a paused reader when what it holds falls.
    #[test]
    fn accounts_move_the_total_and_wake_the_paused() {
        let s = stats();
        let core = CoreMemory::new(8 * M, s.clone(), 0);
        let a = core.connection(peer()).unwrap();
        let b = core.connection(peer()).unwrap();
        a.set_held(7 * M + M / 2);
        b.set_held(1);
        assert_eq!(core.total(), 7 * M + M / 2 + 1);
        assert_eq!(core.holders.get(), 2);
        assert_eq!(s.memory_held.get(), core.total());
        let woke = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker = counting_waker(woke.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(a.decide(&mut cx), Poll::Pending, "a is over its share");
        assert_eq!(s.memory_paused.get(), 1);
        assert_eq!(s.memory_pauses.get(), 1);
        assert!(a.held_back_since(Instant::now()));
        // b's byte is under its share: it reads on.
        assert_eq!(b.decide(&mut cx), Poll::Ready(()));
        // a's tunnel drains: woken, and it reads again.
        a.set_held(M);
        assert!(woke.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        assert_eq!(a.decide(&mut cx), Poll::Ready(()));
        assert_eq!(s.memory_paused.get(), 0);
        drop((a, b));
        assert_eq!(core.total(), 0);
        assert_eq!(core.holders.get(), 0);
    }

    fn counting_waker(n: Arc<std::sync::atomic::AtomicUsize>) -> Waker {
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Waker::from(Arc::new(Count(n)))
    }
}
