//! Latency histograms: one per connection or worker thread while a
//! scenario runs, merged afterwards; reported in microseconds.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Nanoseconds, 3 significant digits, 1 ns .. 1 h.
pub type Hist = Histogram<u64>;

pub fn new_hist() -> Hist {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

pub fn record(h: &mut Hist, d: Duration) {
    h.saturating_record(d.as_nanos().min(u64::MAX as u128) as u64);
}

/// Merges histograms from several threads into one.
pub fn merge<'a>(hists: impl IntoIterator<Item = &'a Hist>) -> Hist {
    let mut all = new_hist();
    for h in hists {
        all.add(h).expect("histograms share bounds");
    }
    all
}

/// The percentiles every latency result reports, in this order.
pub const PERCENTILES: [(&str, f64); 4] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p99", 0.99),
    ("p99.9", 0.999),
];

/// A histogram's summary, microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Percentiles {
    pub fn of(h: &Hist) -> Percentiles {
        let us = |ns: u64| ns as f64 / 1e3;
        Percentiles {
            count: h.len(),
            mean_us: h.mean() / 1e3,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }

    /// (label, µs) for p50, p90, p99, p99.9 and max: chart and table order.
    pub fn points(&self) -> [(&'static str, f64); 5] {
        [
            ("p50", self.p50_us),
            ("p90", self.p90_us),
            ("p99", self.p99_us),
            ("p99.9", self.p999_us),
            ("max", self.max_us),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_histogram_covers_every_thread() {
        let mut fast = new_hist();
        let mut slow = new_hist();
        for _ in 0..900 {
            record(&mut fast, Duration::from_micros(10));
        }
        for _ in 0..100 {
            record(&mut slow, Duration::from_micros(1000));
        }
        let all = merge([&fast, &slow]);
        let p = Percentiles::of(&all);
        assert_eq!(p.count, 1000);
        // 90 % of the samples are 10 µs; the slowest 10 % are 1 ms.
        assert!((p.p50_us - 10.0).abs() < 0.1, "{p:?}");
        assert!((p.p90_us - 10.0).abs() < 0.1, "{p:?}");
        assert!((p.p99_us - 1000.0).abs() < 1.0, "{p:?}");
        assert!((p.max_us - 1000.0).abs() < 1.0, "{p:?}");
        assert!((p.mean_us - 109.0).abs() < 0.5, "{p:?}");
        // Merging leaves the inputs alone and is order-independent.
        assert_eq!(fast.len(), 900);
        assert_eq!(Percentiles::of(&merge([&slow, &fast])), p);
    }

    #[test]
    fn empty_and_extreme_values() {
        let p = Percentiles::of(&merge([]));
        assert_eq!(p.count, 0);
        let mut h = new_hist();
        record(&mut h, Duration::from_secs(7200)); // beyond the bound: clamped
        record(&mut h, Duration::ZERO);
        assert_eq!(h.len(), 2);
        assert!(Percentiles::of(&h).max_us >= 3.5e9);
    }
}
