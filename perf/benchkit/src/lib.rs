//! What ringway's in-process benchmarks share (the `benches/` of the
//! crates they measure, and perf's `scale-bench`): a counting global
//! allocator (exact heap bytes instead of sampled RSS), batch timing,
//! medians and their formatting. No dependencies, so any crate can take it
//! as a dev-dependency.
//!
//! A benchmark installs the allocator itself:
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// Bytes currently allocated through [`Counting`].
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The most [`LIVE`] has been since the last [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grow(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// The system allocator, counting the bytes it hands out.
pub struct Counting;

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counting on the side touches only atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size() as isize);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grow(layout.size() as isize);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (so from `System`) with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grow(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Heap bytes live now (0 unless the binary installed [`Counting`]).
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The most heap bytes live at once since the last [`reset_peak`].
pub fn peak_bytes() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak from what is live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The median of the finite values (the mean of the middle two of an even
/// count); None without any. Results are medians over rounds: the machine
/// is shared and noisy.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n.is_multiple_of(2) => Some((v[mid - 1] + v[mid]) / 2.0),
        _ => Some(v[mid]),
    }
}

/// [`median`] of durations (at least one).
pub fn median_duration(v: &[Duration]) -> Duration {
    let secs: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(median(&secs).expect("at least one sample"))
}

/// "1.2 ms", "3.4 µs", "56 ns".
pub fn fmt_dur(d: Duration) -> String {
    fmt_ns(d.as_nanos() as f64)
}

/// Nanoseconds in the unit that suits them.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Mean ns per call of `f` over one timed batch of at least `min` wall
/// time. The batch size grows until a batch lasts that long; the shorter
/// batches before it are discarded (they warm caches and branch
/// predictors).
pub fn ns_per_call(min: Duration, mut f: impl FnMut()) -> f64 {
    let mut calls: u64 = 1;
    loop {
        let start = Instant::now();
        for _ in 0..calls {
            f();
        }
        let took = start.elapsed();
        if took >= min {
            return took.as_nanos() as f64 / calls as f64;
        }
        // Aim 20 % past `min`, at least doubling.
        let scale = min.as_secs_f64() / took.as_secs_f64().max(1e-9) * 1.2;
        calls = (calls as f64 * scale.max(2.0)).ceil() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
        let ms = Duration::from_millis;
        assert_eq!(median_duration(&[ms(3), ms(1), ms(2)]), ms(2));
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_ns(56.4), "56 ns");
        assert_eq!(fmt_ns(3_400.0), "3.4 µs");
        assert_eq!(fmt_dur(Duration::from_micros(1_240)), "1.2 ms");
    }

    #[test]
    fn batches_last_at_least_the_minimum() {
        let mut calls = 0u64;
        let ns = ns_per_call(Duration::from_millis(5), || {
            calls += 1;
            std::hint::black_box(calls);
        });
        assert!(ns > 0.0 && ns < 1e6, "{ns}");
        assert!(calls > 1);
    }
}
