//! Retry spacing shared by everything that reconnects or refetches (the
//! certificate manager's per-identity backoff, the xDS client's reconnect
//! backoff). Depends on nothing else in the crate.

use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};

/// `base` ±20 %, so that many clients retrying together spread out.
pub(crate) fn jitter(rng: &SystemRandom, base: Duration) -> Duration {
    let mut bytes = [0u8; 2];
    if rng.fill(&mut bytes).is_err() {
        return base;
    }
    let unit = f64::from(u16::from_le_bytes(bytes)) / f64::from(u16::MAX);
    base.mul_f64(0.8 + 0.4 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let rng = SystemRandom::new();
        for _ in 0..200 {
            let d = jitter(&rng, Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
    }
}
