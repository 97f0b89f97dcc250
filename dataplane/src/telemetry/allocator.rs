//! What ringway asks of its global allocator: its counters (the admin
//! endpoint's `/memory`), so that memory can be accounted for from
//! outside the process, and to give freed memory back to the system after
//! a big one-off load ([`purge`]).
//!
//! The `ringway` binary installs jemalloc and registers its hooks here
//! ([`install`]); the library, and its tests on the system allocator,
//! work without them.

use std::sync::OnceLock;

use serde_json::{json, Value};

/// What the binary's allocator offers.
pub struct Hooks {
    /// The allocator's counters, as JSON (see `main.rs`).
    pub stats: fn() -> Value,
    /// Returns every freed page to the system now.
    pub purge: fn(),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Registers the allocator's hooks (once; later calls are ignored).
pub fn install(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

/// The allocator's counters, if the binary registered them.
pub fn stats() -> Option<Value> {
    HOOKS.get().map(|h| (h.stats)())
}

/// Gives the pages the allocator keeps for reuse back to the system (no-op
/// without hooks). For after a one-off burst, such as loading a large
/// config at startup: parsing it takes several times the memory the
/// snapshot keeps, and an allocator otherwise keeps those freed pages
/// until they decay (jemalloc: only while the thread that freed them keeps
/// allocating, unless its background thread runs).
pub fn purge() {
    if let Some(h) = HOOKS.get() {
        (h.purge)();
    }
}

/// `/memory`: the process's resident and peak memory (/proc/self/status,
/// bytes) and the allocator's counters (null without hooks).
pub fn report() -> Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut process = serde_json::Map::new();
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if !matches!(
            key,
            "VmRSS" | "VmHWM" | "RssAnon" | "RssFile" | "VmData" | "VmSize"
        ) {
            continue;
        }
        if let Some(kb) = value
            .trim()
            .strip_suffix("kB")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            process.insert(key.to_string(), json!(kb * 1024));
        }
    }
    json!({ "process": process, "allocator": stats() })
}
