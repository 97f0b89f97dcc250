//! The DNS proxy's Istio series (`istio_dns_*`), with ztunnel's labels:
//! `request_query_type` (the type asked, lowercase), `request_protocol`
//! (udp or tcp), `source_canonical_service` and `source_canonical_revision`
//! (of the asking workload, "unknown" when it is not known).
//!
//! Kept as the TCP series are: each core has its own label sets in a
//! core-local map and writes their counters alone (no locked
//! instruction); a new set reaches the scraper over a lock-free queue and
//! the scrape merges the cores.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::io::count::Counter;

/// Bucket bounds of `istio_dns_upstream_request_duration_seconds`:
/// ztunnel's (5 ms, 1 ms, 10 ms, 100 ms, 1 s, 5 s), in increasing order.
/// ztunnel lists 5 ms before 1 ms, so its `le="0.001"` bucket repeats the
/// 5 ms count; here each bucket counts what its bound says.
pub const DURATION_BUCKETS_S: [f64; 6] = [0.001, 0.005, 0.01, 0.1, 1.0, 5.0];

/// One label set's DNS counters on one core.
#[derive(Debug)]
pub struct DnsSeries {
    labels: Box<str>,
    pub requests: Counter,
    pub upstream_requests: Counter,
    pub upstream_failures: Counter,
    /// Per bucket (the last is +Inf), rendered cumulative.
    duration_buckets: [Counter; DURATION_BUCKETS_S.len() + 1],
    duration_sum_ns: Counter,
}

impl DnsSeries {
    /// How long an upstream took to answer (or to fail).
    pub fn upstream_took(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = DURATION_BUCKETS_S.partition_point(|&b| b < s);
        self.duration_buckets[i].add(1);
        self.duration_sum_ns
            .add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// What a DNS series' labels are made of.
pub struct DnsLabels<'a> {
    /// The record type asked, as DNS names it ("A", "AAAA", "TXT").
    pub query_type: &'a dyn std::fmt::Display,
    /// "udp" or "tcp".
    pub protocol: &'static str,
    pub canonical_service: &'a str,
    pub canonical_revision: &'a str,
}

/// A core's DNS series.
pub struct CoreDnsMetrics {
    enabled: bool,
    sets: RefCell<HashMap<Box<str>, Arc<DnsSeries>>>,
    scratch: RefCell<String>,
    hub: crossbeam_channel::Sender<Arc<DnsSeries>>,
}

impl CoreDnsMetrics {
    /// The series of `l` on this core (created, and handed to the scraper,
    /// the first time); None with --no-metrics.
    pub fn series(&self, l: &DnsLabels<'_>) -> Option<Arc<DnsSeries>> {
        if !self.enabled {
            return None;
        }
        let mut key = self.scratch.borrow_mut();
        key.clear();
        let _ = write!(key, "request_query_type=\"");
        let start = key.len();
        // A record type's name (`A`, `AAAA`, `Unknown(65280)`): nothing to
        // escape; lowercased in place, as ztunnel labels it.
        let _ = write!(key, "{}", l.query_type);
        key[start..].make_ascii_lowercase();
        let _ = write!(key, "\",request_protocol=\"{}\"", l.protocol);
        for (name, value) in [
            ("source_canonical_service", l.canonical_service),
            ("source_canonical_revision", l.canonical_revision),
        ] {
            let _ = write!(key, ",{name}=\"");
            escape_into(&mut key, if value.is_empty() { "unknown" } else { value });
            key.push('"');
        }
        if let Some(s) = self.sets.borrow().get(key.as_str()) {
            return Some(s.clone());
        }
        let series = Arc::new(DnsSeries {
            labels: key.as_str().into(),
            requests: Counter::default(),
            upstream_requests: Counter::default(),
            upstream_failures: Counter::default(),
            duration_buckets: Default::default(),
            duration_sum_ns: Counter::default(),
        });
        self.sets
            .borrow_mut()
            .insert(key.as_str().into(), series.clone());
        let _ = self.hub.send(series.clone());
        Some(series)
    }
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The scraper's side of the DNS series.
pub struct DnsHub {
    new_sets: crossbeam_channel::Receiver<Arc<DnsSeries>>,
    sender: crossbeam_channel::Sender<Arc<DnsSeries>>,
    sets: Mutex<Vec<Arc<DnsSeries>>>,
}

impl Default for DnsHub {
    fn default() -> Self {
        let (sender, new_sets) = crossbeam_channel::unbounded();
        DnsHub {
            new_sets,
            sender,
            sets: Mutex::default(),
        }
    }
}

impl DnsHub {
    pub fn core(&self, enabled: bool) -> CoreDnsMetrics {
        CoreDnsMetrics {
            enabled,
            sets: RefCell::default(),
            scratch: RefCell::new(String::with_capacity(256)),
            hub: self.sender.clone(),
        }
    }

    /// Appends the four series, label sets merged across cores (nothing
    /// before the first query, as ztunnel shows them).
    pub fn render(&self, out: &mut String) {
        let mut sets = self.sets.lock().expect("not poisoned");
        sets.extend(self.new_sets.try_iter());
        if sets.is_empty() {
            return;
        }
        const N: usize = DURATION_BUCKETS_S.len() + 1;
        // labels → [requests, upstream, failures, sum_ns, buckets...]
        let mut merged: BTreeMap<&str, [u64; 4 + N]> = BTreeMap::new();
        for s in sets.iter() {
            let m = merged.entry(&s.labels).or_insert([0; 4 + N]);
            m[0] += s.requests.get();
            m[1] += s.upstream_requests.get();
            m[2] += s.upstream_failures.get();
            m[3] += s.duration_sum_ns.get();
            for (i, b) in s.duration_buckets.iter().enumerate() {
                m[4 + i] += b.get();
            }
        }
        for (i, (name, help)) in [
            (
                "istio_dns_requests_total",
                "Total number of DNS requests (unstable)",
            ),
            (
                "istio_dns_upstream_requests_total",
                "Total number of DNS requests forwarded to upstream (unstable)",
            ),
            (
                "istio_dns_upstream_failures_total",
                "Total number of DNS requests that failed to forward upstream (unstable)",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (labels, v) in &merged {
                if i == 0 || v[i] > 0 {
                    let _ = writeln!(out, "{name}{{{labels}}} {}", v[i]);
                }
            }
        }
        let name = "istio_dns_upstream_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Total time in seconds Istio takes to get DNS response from upstream (unstable).\n# TYPE {name} histogram"
        );
        for (labels, v) in &merged {
            if v[1] == 0 {
                continue;
            }
            let mut cumulative = 0;
            for i in 0..N {
                cumulative += v[4 + i];
                let le = DURATION_BUCKETS_S
                    .get(i)
                    .map_or("+Inf".to_string(), |b| b.to_string());
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", v[3] as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_merge_across_cores_with_ztunnels_labels() {
        let hub = DnsHub::default();
        let (a, b) = (hub.core(true), hub.core(true));
        let l = DnsLabels {
            query_type: &"AAAA",
            protocol: "udp",
            canonical_service: "web",
            canonical_revision: "",
        };
        a.series(&l).unwrap().requests.add(1);
        let s = b.series(&l).unwrap();
        s.requests.add(2);
        s.upstream_requests.add(1);
        s.upstream_took(Duration::from_millis(3));
        assert!(Arc::ptr_eq(&s, &b.series(&l).unwrap()));
        assert!(hub.core(false).series(&l).is_none(), "--no-metrics");
        let mut out = String::new();
        hub.render(&mut out);
        let labels = "request_query_type=\"aaaa\",request_protocol=\"udp\",source_canonical_service=\"web\",source_canonical_revision=\"unknown\"";
        assert!(
            out.contains(&format!("istio_dns_requests_total{{{labels}}} 3")),
            "{out}"
        );
        assert!(out.contains(&format!("istio_dns_upstream_requests_total{{{labels}}} 1")));
        assert!(!out.contains("istio_dns_upstream_failures_total{"), "{out}");
        let h = "istio_dns_upstream_request_duration_seconds";
        assert!(
            out.contains(&format!("{h}_bucket{{{labels},le=\"0.001\"}} 0")),
            "{out}"
        );
        assert!(out.contains(&format!("{h}_bucket{{{labels},le=\"0.005\"}} 1")));
        assert!(out.contains(&format!("{h}_bucket{{{labels},le=\"+Inf\"}} 1")));
        assert!(out.contains(&format!("{h}_count{{{labels}}} 1")));
    }
}
