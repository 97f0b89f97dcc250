//! The DNS fuzz targets' inputs replayed on stable (issue 23): the seeds,
//! the committed corpus `fuzz/corpus/<target>/` and the reproducers of
//! past crashes `fuzz/regressions/<target>/`, each through the harness
//! the fuzz targets call, so CI exercises the fuzzed path without nightly.
//! How the corpus was made: `fuzz/README.md`.
//!
//! `RINGWAY_FUZZ_SEEDS=DIR` also writes the seeds to
//! `DIR/<target>/`, to start a fuzz run from.

use std::path::{Path, PathBuf};

use ringway_dataplane::dns::fuzzing;

type Harness = fn(&[u8]);

/// The inputs committed for `target`.
fn committed(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a corpus entry").path();
            if path.is_file() {
                let bytes = std::fs::read(&path).expect("a corpus file");
                out.push((path, bytes));
            }
        }
    }
    out
}

fn replay(target: &str, harness: Harness, seeds: Vec<(String, Vec<u8>)>) {
    if let Some(dir) = std::env::var_os("RINGWAY_FUZZ_SEEDS") {
        let dir = Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).expect("the seed directory");
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes).expect("a seed file");
        }
    }
    for (_, bytes) in &seeds {
        harness(bytes);
    }
    let inputs = committed(target);
    assert!(
        !inputs.is_empty(),
        "fuzz/corpus/{target}/ is committed and not empty"
    );
    for (path, bytes) in inputs {
        if std::panic::catch_unwind(|| harness(&bytes)).is_err() {
            panic!("{} fails the {target} harness", path.display());
        }
    }
}

#[test]
fn dns_query_corpus() {
    replay("dns_query", fuzzing::query, fuzzing::query_seeds());
}

#[test]
fn dns_upstream_reply_corpus() {
    replay(
        "dns_upstream_reply",
        fuzzing::upstream_reply,
        fuzzing::upstream_seeds(),
    );
}
