//! Every fuzz target's inputs replayed on stable (issues 23 and 25): the
//! seeds, the committed corpus `fuzz/corpus/<target>/` and the reproducers
//! of past crashes `fuzz/regressions/<target>/`, each through the harness
//! the fuzz target calls, so CI exercises the fuzzed paths without
//! nightly. How the corpus was made: `fuzz/README.md`.
//!
//! `RINGWAY_FUZZ_SEEDS=DIR` also writes the seeds to
//! `DIR/<target>/`, to start a fuzz run from.

use std::path::{Path, PathBuf};

use ringway_controlplane::fuzzing as control;
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

#[test]
fn xds_address_corpus() {
    replay(
        "xds_address",
        control::xds::address,
        control::xds::address_seeds(),
    );
}

#[test]
fn xds_authorization_corpus() {
    replay(
        "xds_authorization",
        control::xds::authorization,
        control::xds::authorization_seeds(),
    );
}

#[test]
fn local_config_corpus() {
    replay(
        "local_config",
        control::local::config,
        control::local::seeds(),
    );
}

#[test]
fn authorization_corpus() {
    replay(
        "authorization",
        control::authz::decide_all,
        control::authz::seeds(),
    );
}

#[test]
fn zds_request_corpus() {
    replay("zds_request", control::zds::requests, control::zds::seeds());
}

#[test]
fn inbound_connect_corpus() {
    replay(
        "inbound_connect",
        ringway_dataplane::app::fuzzing::inbound_connect,
        ringway_dataplane::app::fuzzing::seeds(),
    );
}

#[test]
fn socks5_corpus() {
    replay(
        "socks5",
        ringway_dataplane::proxy::fuzzing::socks5,
        ringway_dataplane::proxy::fuzzing::seeds(),
    );
}
