//! Medians and ratios: the machine is shared and noisy, so results are
//! medians over alternating rounds and compared as ratios within one run.
//! (Latency percentiles come from histograms: see `latency`.)

pub use ringway_benchkit::median;

/// `value / baseline`, or None when the baseline is zero or missing.
pub fn ratio(value: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    match (value, baseline) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(ratio(Some(1.0), Some(4.0)), Some(0.25));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }
}
