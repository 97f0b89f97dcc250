//! Rate limits for the log lines a peer can make a core write (refusals,
//! failed connections, caps that bite): a flood of them must not become a
//! flood of lines. Per core and per kind of line: the first few lines of
//! each one-second window are written; the rest are counted, and when the
//! window ends one line says how many were suppressed. The counters that
//! go with the lines (metrics) keep the full count; only the text is
//! limited.
//!
//! A kind's state lives in the core's thread (per thread is per core), so
//! a [`RateLog`] is a plain name that any site on a core can use without
//! plumbing; its cost is one map lookup per line that would be written.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The window the line budgets count in.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Lines suppressed so far, all cores (the scrape's
/// `ringway_log_lines_suppressed_total`).
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Log lines suppressed by rate limits so far, all cores together.
pub fn suppressed_total() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// A kind of rate-limited line: its name (which the "suppressed" line
/// repeats) and how many lines of it a core writes per [`WINDOW`].
#[derive(Clone, Copy, Debug)]
pub struct RateLog {
    pub kind: &'static str,
    pub per_window: u32,
}

impl RateLog {
    pub const fn new(kind: &'static str, per_window: u32) -> Self {
        RateLog { kind, per_window }
    }

    /// Whether a line of this kind may be written now, on this core:
    /// Some(lines suppressed since the last one written and not yet
    /// reported), or None when it is suppressed (counted, and reported by
    /// one line when the window ends).
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        // try_with: a connection's log may be dropped while the thread's
        // locals are destroyed; its line is then written.
        let verdict = KINDS
            .try_with(|k| {
                let mut k = k.borrow_mut();
                let w = k.entry(self.kind).or_default();
                w.note(now, self.per_window)
            })
            .unwrap_or(Verdict::Write(0));
        match verdict {
            Verdict::Write(n) => Some(n),
            Verdict::Suppress { first } => {
                SUPPRESSED.fetch_add(1, Ordering::Relaxed);
                if first {
                    self.report_at_window_end();
                }
                None
            }
        }
    }

    /// Schedules the "suppressed N" line for when the current window ends.
    /// Off a core (no executor: unit tests, the control thread) the count
    /// waits for the next line written instead.
    fn report_at_window_end(&self) {
        if !crate::io::executor::on_core() {
            return;
        }
        let kind = self.kind;
        let end = KINDS
            .with(|k| k.borrow().get(kind).and_then(|w| w.start))
            .map_or(WINDOW, |s| {
                (s + WINDOW).saturating_duration_since(Instant::now())
            });
        crate::io::executor::spawn_detached(async move {
            crate::io::executor::timer::sleep(end).await;
            let n = KINDS.with(|k| k.borrow_mut().get_mut(kind).map_or(0, Window::close));
            if n > 0 {
                tracing::warn!(
                    kind,
                    suppressed = n,
                    "suppressed {n} similar lines in the last {}s: {kind}",
                    WINDOW.as_secs()
                );
            }
        });
    }
}

thread_local! {
    /// This core's windows, by kind.
    static KINDS: RefCell<HashMap<&'static str, Window>> = RefCell::default();
}

/// One kind's current window on one core.
#[derive(Default, Debug)]
struct Window {
    /// When the window began (its first line); None before any line.
    start: Option<Instant>,
    written: u32,
    /// Suppressed in this window and not reported yet.
    suppressed: u64,
    /// A report of `suppressed` is scheduled for the window's end.
    reporting: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Write it; the count suppressed before it and not reported.
    Write(u64),
    /// Do not; `first`: the first suppressed in its window (schedule the
    /// report).
    Suppress { first: bool },
}

impl Window {
    fn note(&mut self, now: Instant, per_window: u32) -> Verdict {
        let expired = self.start.is_none_or(|s| now.duration_since(s) >= WINDOW);
        if expired {
            // A new window. Whatever the last one suppressed and no report
            // took (none scheduled, or not run yet) rides on this line.
            self.start = Some(now);
            self.written = 0;
            self.reporting = false;
        }
        if self.written < per_window {
            self.written += 1;
            return Verdict::Write(std::mem::take(&mut self.suppressed));
        }
        self.suppressed += 1;
        let first = !self.reporting;
        self.reporting = true;
        Verdict::Suppress { first }
    }

    /// The window's end: the count to report (then zero).
    fn close(&mut self) -> u64 {
        self.reporting = false;
        std::mem::take(&mut self.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_writes_its_budget_then_counts_what_it_suppresses() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut w = Window::default();
        // (time in ms, verdict)
        let table = [
            (0, Verdict::Write(0)),
            (10, Verdict::Write(0)),
            (20, Verdict::Suppress { first: true }),
            (30, Verdict::Suppress { first: false }),
            (999, Verdict::Suppress { first: false }),
        ];
        for (at, want) in table {
            assert_eq!(w.note(ms(at), 2), want, "at {at} ms");
        }
        // The report at the window's end takes the count.
        assert_eq!(w.close(), 3);
        assert_eq!(w.note(ms(1000), 2), Verdict::Write(0));
        assert_eq!(w.note(ms(1001), 2), Verdict::Write(0));
        assert_eq!(w.note(ms(1002), 2), Verdict::Suppress { first: true });
        // No report ran (say, off a core): the next window's first line
        // carries the count.
        assert_eq!(w.note(ms(2500), 2), Verdict::Write(1));
    }

    #[test]
    fn kinds_are_limited_apart_and_the_total_counts_every_suppressed_line() {
        let a = RateLog::new("test kind a", 1);
        let b = RateLog::new("test kind b", 1);
        let before = suppressed_total();
        assert_eq!(a.allow(), Some(0));
        assert_eq!(a.allow(), None);
        assert_eq!(a.allow(), None);
        assert_eq!(b.allow(), Some(0), "another kind has its own budget");
        assert!(suppressed_total() >= before + 2);
    }
}
