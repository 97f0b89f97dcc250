//! Command-line units: byte sizes ("64K", "1G") and durations ("500ms",
//! "10s", "2m", read by `humantime`), and how results print them.

use std::time::Duration;

/// "64K", "512M", "2G" (binary units) or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?} (examples: 4096, 64K, 512M, 2G)"))
}

/// A duration as `humantime` reads it ("250ms", "10s", "1.5s", "2m",
/// "1m 30s"), or a plain number of seconds ("1.5").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    match t.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|e| e.to_string()),
        Err(_) => humantime::parse_duration(t).map_err(|e| e.to_string()),
    }
    .map_err(|e| format!("invalid duration {s:?}: {e} (examples: 500ms, 10s, 1.5s, 2m)"))
}

/// A byte count for humans: "1 GiB", "128 MiB", "64 KiB", "17 B".
pub fn fmt_size(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift {
            return format!("{:.1} {unit}", n as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{n} B")
}

/// A duration for humans: "250ms", "10s", "1.5s".
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms > 0 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 && ms.is_multiple_of(100) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

/// Durations in results.json: seconds as a number.
pub fn serialize_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("2T").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_size(128 << 20), "128 MiB");
        assert_eq!(fmt_size(1), "1 B");
        assert_eq!(fmt_size(1536), "1.5 KiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(
            parse_duration(" 300ms").unwrap(),
            Duration::from_millis(300)
        );
        assert!(parse_duration("100000000000000000000s").is_err());
        assert!(parse_duration("1e30").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_secs(10)), "10s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
    }
}
