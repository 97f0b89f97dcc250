//! What operators see: Istio's TCP metrics and per-core stats
//! ([`metrics`]), one access-log line per connection ([`accesslog`]) in
//! ztunnel's formats ([`logfmt`]), the admin endpoint ([`admin`]), the
//! small HTTP server of the side ports 15000/15020/15021 ([`http`]), and
//! the allocator's counters ([`allocator`]), and the per-core rate limits
//! of the log lines peers can cause ([`ratelog`]).

pub mod accesslog;
pub mod admin;
pub mod allocator;
pub mod dns_metrics;
pub mod http;
pub mod logfmt;
pub mod metrics;
pub mod ratelog;
