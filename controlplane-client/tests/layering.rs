//! The crate's layering (see `src/lib.rs`), checked on the source text so it
//! cannot silently regress:
//!
//! 1. `model/` imports nothing outside `model/`.
//! 2. `publish` imports only `model`.
//! 3. `security/` imports only `model`, `publish` and `backoff`.
//! 4. `sources/` imports only `model`, `publish`, `backoff` and
//!    `security::pki`.
//! 5. `fuzzing/` imports only `model` and `sources`.
//! 6. `devcp/` may import anything; `backoff` imports nothing.
//! 7. No import cycles between modules (one module per file), anywhere.
//!
//! What counts as an import, and what is exempt (test code, `src/bin/`), is
//! `ringway-layering`'s.

use std::path::Path;

use ringway_layering::{assert_layered, layer};

/// The top-level modules under `src/`; a new one must be added to
/// [`may_import`] before this test passes.
const LAYERS: [&str; 7] = [
    "model", "publish", "backoff", "security", "sources", "fuzzing", "devcp",
];

/// Whether module `from` may import module `to` (full module paths such as
/// `security::tls`), as far as the layers go. Imports inside one layer are
/// left to the cycle check.
fn may_import(from: &str, to: &str) -> bool {
    let (from_layer, to_layer) = (layer(from), layer(to));
    if from_layer == to_layer {
        return true;
    }
    match from_layer {
        "model" | "backoff" => false,
        "publish" => to_layer == "model",
        "security" => matches!(to_layer, "model" | "publish" | "backoff"),
        "sources" => matches!(to_layer, "model" | "publish" | "backoff") || to == "security::pki",
        "fuzzing" => matches!(to_layer, "model" | "sources"),
        // The crate root only declares and re-exports.
        "" | "devcp" => true,
        _ => false,
    }
}

fn rule_of(from: &str) -> String {
    match layer(from) {
        "model" => "model/ imports nothing outside model/",
        "backoff" => "backoff imports nothing",
        "publish" => "publish imports only model",
        "security" => "security/ imports only model, publish and backoff",
        "sources" => "sources/ imports only model, publish, backoff and security::pki",
        "fuzzing" => "fuzzing/ imports only model and sources",
        _ => "see tests/layering.rs",
    }
    .to_owned()
}

#[test]
fn modules_import_only_what_their_layer_allows_and_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_layered(&src, &LAYERS, may_import, rule_of);
}
