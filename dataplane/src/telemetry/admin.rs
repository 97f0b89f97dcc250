//! The admin endpoint (15000, loopback only unless `--admin-allow-remote`),
//! served by the control thread like ztunnel's:
//!
//! - `GET /config_dump`: what is loaded, in ztunnel's shape (`workloads`,
//!   `services`, `policies` in the local config schema, `certificates`,
//!   `staticConfig`, `config`, `version`), for `istioctl ztunnel-config`
//!   and scripts written for ztunnel;
//! - `GET|POST /logging[?level=SPEC]`: shows, or replaces, the log filter
//!   (`RUST_LOG` syntax);
//! - `POST /quitquitquit`: starts a graceful drain, as SIGTERM does;
//! - `GET /memory`: the process's resident and peak memory and the
//!   allocator's counters (jemalloc: allocated, active, metadata,
//!   resident, mapped, retained, dirty and muzzy pages), to account for
//!   memory from outside (`ringway-perf`'s `scale-bench` reads it);
//! - `GET /cores`: the per-core view for tuning pinning (connections,
//!   pooled HBONE connections, pipes and buffers held, tasks, the snapshot
//!   version each core runs, task panics, late rejections).

use std::sync::Arc;

use ringway_controlplane::model::time::rfc3339_utc;
use ringway_controlplane::security::certs::{local_identities, CertPublisher, LocalWorkloads};
use ringway_controlplane::sources::local::dump::dump;
use ringway_controlplane::SnapshotPublisher;
use serde_json::{json, Value};

use crate::inpod::manager::InpodStatus;
use crate::telemetry::http::{Answer, JSON, TEXT};
use crate::telemetry::metrics::MetricsHub;

/// What the admin endpoint reads.
pub struct Admin {
    pub snapshots: SnapshotPublisher,
    pub certs: CertPublisher,
    pub metrics: Arc<MetricsHub>,
    /// The flags ringway runs with (`config` in the dump).
    pub config: Value,
    /// Which workloads are this node's (their certificates are prefetched).
    pub local: tokio::sync::watch::Receiver<LocalWorkloads>,
    /// Starts the drain.
    pub quit: Arc<tokio::sync::Notify>,
    /// In-pod mode: the enrolled pods (`workloadState`).
    pub inpod: Option<Arc<InpodStatus>>,
}

impl Admin {
    pub fn answer(&self, method: &str, path: &str, query: &str) -> Answer {
        let get = method == "GET" || method == "HEAD";
        match path {
            "/config_dump" if get => ("200 OK", JSON, pretty(&self.config_dump())),
            "/cores" if get => ("200 OK", JSON, pretty(&self.cores())),
            "/memory" if get => ("200 OK", JSON, pretty(&crate::telemetry::allocator::report())),
            "/logging" if get || method == "POST" => self.logging(query),
            "/quitquitquit" if method == "POST" => {
                tracing::info!("admin: /quitquitquit: no longer accepting; draining");
                self.quit.notify_one();
                ("200 OK", TEXT, "draining\n".into())
            }
            "/config_dump" | "/cores" | "/memory" | "/logging" | "/quitquitquit" => (
                "405 Method Not Allowed",
                TEXT,
                "method not allowed\n".into(),
            ),
            "/" => (
                "200 OK",
                TEXT,
                "ringway admin: /config_dump /cores /memory /logging[?level=...] /quitquitquit (POST)\n"
                    .into(),
            ),
            _ => ("404 Not Found", TEXT, "not found\n".into()),
        }
    }

    fn config_dump(&self) -> Value {
        let snap = self.snapshots.current();
        let mut out = dump(&snap);
        let static_config = out.clone();
        let o = out.as_object_mut().expect("an object");
        o.insert("stagedServices".into(), json!({}));
        o.insert("staticConfig".into(), static_config);
        o.insert("certificates".into(), self.certificates(&snap));
        o.insert("config".into(), self.config.clone());
        if let Some(inpod) = &self.inpod {
            o.insert("workloadState".into(), inpod.workload_state());
        }
        o.insert(
            "version".into(),
            json!({
                "version": env!("CARGO_PKG_VERSION"),
                "component": "ringway",
                "snapshotVersion": snap.version(),
                "buildProfile": if cfg!(debug_assertions) { "debug" } else { "release" },
            }),
        );
        out
    }

    /// Every identity a local HBONE workload needs, `Available` with its
    /// validity once issued, `Initializing` until then; and those fetched
    /// on demand for a connection, while they are kept.
    fn certificates(&self, snap: &ringway_controlplane::Snapshot) -> Value {
        let issued = self.certs.current();
        let mut ids = local_identities(snap, &self.local.borrow());
        ids.extend(issued.identities().cloned());
        let mut rows = Vec::new();
        for id in ids {
            let row = match issued.get(&id) {
                Some(c) => json!({
                    "identity": id.to_string(),
                    "state": "Available",
                    "validFrom": rfc3339_utc(c.not_before),
                    "expirationTime": rfc3339_utc(c.not_after),
                }),
                None => json!({ "identity": id.to_string(), "state": "Initializing" }),
            };
            rows.push(row);
        }
        Value::Array(rows)
    }

    fn cores(&self) -> Value {
        let cores: Vec<Value> = self
            .metrics
            .cores()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                json!({
                    "core": i,
                    "openConnections": s.open_connections.get(),
                    "hbonePoolConnections": s.pool_connections.get(),
                    "snapshotVersion": s.snapshot_version.get(),
                    "pipesHeld": s.pipes_held.get(),
                    "buffersHeld": s.buffers_held.get(),
                    "tasks": s.tasks.get(),
                    "pods": s.pods.get(),
                    "ring": {
                        "enters": s.ring_enters.get(),
                        "completions": s.ring_completions.get(),
                        "sends": s.ring_sends.get(),
                        "quietSends": s.ring_quiet_sends.get(),
                        "shortSends": s.ring_short_sends.get(),
                        "recvStarved": s.ring_starved.get(),
                        "compactedBytes": s.ring_compacted_bytes.get(),
                        "freeRecvBuffers": s.ring_free_buffers.get(),
                    },
                    "taskPanics": s.task_panics.get(),
                    "lateRejections": s.late_rejections.get(),
                })
            })
            .collect();
        json!({ "publishedSnapshotVersion": self.snapshots.current().version(), "cores": cores })
    }

    fn logging(&self, query: &str) -> Answer {
        let level = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("level="))
            .map(percent_decode);
        match crate::telemetry::logfmt::log_filter(level.as_deref()) {
            Ok(now) => {
                if let Some(l) = &level {
                    tracing::info!(filter = %now, requested = %l, "admin: log filter changed");
                }
                ("200 OK", TEXT, format!("current log level is {now}\n"))
            }
            Err(e) => (
                "400 Bad Request",
                TEXT,
                format!(
                    "invalid level: {e}\nusage: /logging?level=<error|warn|info|debug|trace|off> \
                     or <target>=<level>,...\n"
                ),
            ),
        }
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

/// A query value as a client sends it: `%2C` and friends are bytes, and
/// `+` is a space (form encoding; `%2B` is a plus).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        assert_eq!(percent_decode("access%3Dwarn%2Cinfo"), "access=warn,info");
        assert_eq!(percent_decode("a+b%zz%4"), "a b%zz%4");
        assert_eq!(percent_decode("a%2Bb"), "a+b");
    }
}
