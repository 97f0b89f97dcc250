//! What bounds the work one peer can make a core do on inbound HBONE:
//! dials in flight (per h2 connection and per core), streams the peer
//! resets before they are answered, and the log lines refusals write.
//!
//! A reset frees h2's concurrency slot at once, so h2's stream cap does
//! not bound dials: without these, HEADERS then RST in a loop makes the
//! core dial as fast as the peer can send (each dial to a black-holed
//! port holding an fd for the connect timeout).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::io::count::Counter;
use crate::io::latch::Latch;
use crate::telemetry::ratelog::RateLog;

/// The limits, from the flags.
#[derive(Clone, Copy, Debug)]
pub struct DialLimits {
    /// Dials in flight on one h2 connection (`--max-dials-per-connection`).
    pub per_connection: usize,
    /// Dials in flight on one core (`--max-dials-per-core`).
    pub per_core: usize,
    /// Streams a peer may reset before their answer within
    /// [`EARLY_RESET_WINDOW`] (`--max-early-resets`) before its connection
    /// gets GOAWAY (ENHANCE_YOUR_CALM).
    pub early_resets: u32,
}

impl Default for DialLimits {
    fn default() -> Self {
        DialLimits {
            per_connection: 200,
            per_core: 1024,
            early_resets: 100,
        }
    }
}

/// Early resets are counted over windows this long: a rate, not a count
/// over the connection's life, so a pooled connection that carries
/// clients who sometimes give up early is not cut off after hours.
pub const EARLY_RESET_WINDOW: Duration = Duration::from_secs(10);

/// A core's dials in flight. The gauge is what the scraper reads.
#[derive(Default)]
pub struct CoreDials {
    in_flight: Cell<usize>,
}

/// One h2 connection's dials in flight and early resets.
pub struct ConnDials {
    in_flight: Cell<usize>,
    resets: Cell<u32>,
    window_start: Cell<Instant>,
    limit: u32,
    /// Set when the peer reset too many streams early: the connection's
    /// loop sends GOAWAY (ENHANCE_YOUR_CALM) and closes.
    pub calm: Rc<Latch>,
}

impl ConnDials {
    pub fn new(limits: &DialLimits) -> Rc<Self> {
        Rc::new(ConnDials {
            in_flight: Cell::new(0),
            resets: Cell::new(0),
            window_start: Cell::new(Instant::now()),
            limit: limits.early_resets,
            calm: Latch::new(),
        })
    }

    /// The peer reset a stream before it was answered. True when this one
    /// crossed the limit (the latch is set then).
    pub fn early_reset(&self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.window_start.get()) >= EARLY_RESET_WINDOW {
            self.window_start.set(now);
            self.resets.set(0);
        }
        let n = self.resets.get() + 1;
        self.resets.set(n);
        if n > self.limit && !self.calm.is_set() {
            self.calm.set();
            return true;
        }
        false
    }
}

/// Why a dial was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverCap {
    Connection,
    Core,
}

/// A dial in flight: counted on its connection and its core until
/// dropped (connected, failed, or abandoned with its stream).
pub struct DialPermit {
    core: Rc<CoreDials>,
    conn: Rc<ConnDials>,
    gauge: std::sync::Arc<crate::telemetry::metrics::CoreStats>,
}

impl DialPermit {
    /// A permit if both caps have room.
    pub fn take(
        limits: &DialLimits,
        core: &Rc<CoreDials>,
        conn: &Rc<ConnDials>,
        gauge: &std::sync::Arc<crate::telemetry::metrics::CoreStats>,
    ) -> Result<DialPermit, OverCap> {
        if conn.in_flight.get() >= limits.per_connection {
            return Err(OverCap::Connection);
        }
        if core.in_flight.get() >= limits.per_core {
            return Err(OverCap::Core);
        }
        conn.in_flight.set(conn.in_flight.get() + 1);
        core.in_flight.set(core.in_flight.get() + 1);
        gauge.dials_in_flight.set(core.in_flight.get() as u64);
        Ok(DialPermit {
            core: core.clone(),
            conn: conn.clone(),
            gauge: gauge.clone(),
        })
    }

    /// The connection the dial is for.
    pub fn conn(&self) -> &ConnDials {
        &self.conn
    }
}

impl Drop for DialPermit {
    fn drop(&mut self) {
        self.conn.in_flight.set(self.conn.in_flight.get() - 1);
        self.core.in_flight.set(self.core.in_flight.get() - 1);
        self.gauge
            .dials_in_flight
            .set(self.core.in_flight.get() as u64);
    }
}

/// A counter bumped and a line maybe logged: the pair every refusal here
/// makes (the line at most once a second per core: see [`RateLog`]).
pub fn count_and_log(counter: &Counter, limiter: &RateLog, log: impl FnOnce(u64)) {
    counter.add(1);
    if let Some(suppressed) = limiter.allow() {
        log(suppressed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_respect_both_caps_and_give_back_on_drop() {
        let limits = DialLimits {
            per_connection: 2,
            per_core: 3,
            early_resets: 1,
        };
        let core = Rc::new(CoreDials::default());
        let stats = std::sync::Arc::new(crate::telemetry::metrics::CoreStats::default());
        let a = ConnDials::new(&limits);
        let b = ConnDials::new(&limits);
        let a1 = DialPermit::take(&limits, &core, &a, &stats).unwrap();
        let _a2 = DialPermit::take(&limits, &core, &a, &stats).unwrap();
        assert_eq!(
            DialPermit::take(&limits, &core, &a, &stats).err(),
            Some(OverCap::Connection)
        );
        let _b1 = DialPermit::take(&limits, &core, &b, &stats).unwrap();
        assert_eq!(
            DialPermit::take(&limits, &core, &b, &stats).err(),
            Some(OverCap::Core)
        );
        assert_eq!(stats.dials_in_flight.get(), 3);
        drop(a1);
        assert_eq!(stats.dials_in_flight.get(), 2);
        assert!(DialPermit::take(&limits, &core, &b, &stats).is_ok());
    }

    #[test]
    fn early_resets_past_the_limit_set_the_latch_once() {
        let limits = DialLimits {
            early_resets: 2,
            ..DialLimits::default()
        };
        let c = ConnDials::new(&limits);
        assert!(!c.early_reset());
        assert!(!c.early_reset());
        assert!(!c.calm.is_set());
        assert!(c.early_reset());
        assert!(c.calm.is_set());
        assert!(!c.early_reset(), "crossed once");
    }
}
