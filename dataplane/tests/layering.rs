//! The data plane's layering (see `src/lib.rs`), checked on the source text
//! so it cannot silently regress. Layers, lowest first:
//!
//! `io` < `dns` < `inpod` < `telemetry` < `hbone` < `core` < `proxy` < `app`
//!
//! A module imports only from its own layer and the layers below it, and
//! no two modules (one per file) import each other in a circle, inside a
//! layer or across. The crate root only declares. What counts as an
//! import, and what is exempt (test code, the binary's `main.rs`), is
//! `ringway-layering`'s.

use std::path::Path;

use ringway_layering::{assert_layered, layer};

/// The top-level modules under `src/`, lowest first; a new one must find
/// its place here before this test passes.
const LAYERS: [&str; 8] = [
    "io",
    "dns",
    "inpod",
    "telemetry",
    "hbone",
    "core",
    "proxy",
    "app",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer(module))
}

/// Whether module `from` may import module `to` (full module paths such as
/// `proxy::outbound`): only downwards, or within its own layer (where the
/// cycle check applies).
fn may_import(from: &str, to: &str) -> bool {
    if from.is_empty() {
        return true; // the crate root
    }
    matches!((rank(from), rank(to)), (Some(f), Some(t)) if t <= f)
}

fn rule_of(from: &str) -> String {
    let below = match rank(from) {
        Some(0) => "nothing else of the crate".to_owned(),
        Some(r) => LAYERS[..r].join(", "),
        None => "-".to_owned(),
    };
    format!(
        "{}/ imports only from itself and the layers below it: {below}",
        layer(from)
    )
}

#[test]
fn modules_import_only_from_their_layer_and_below_and_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_layered(&src, &LAYERS, may_import, rule_of);
}
