//! `scripts/demo.sh` stays green: README sends newcomers to it first. It
//! runs here with this build's ringway, and must exit 0 (it checks its own
//! results, e.g. that port 15008 carried TLS) and leave no namespace behind.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_runs_green_and_cleans_up() {
    common::require_root();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(repo.join("scripts/demo.sh"))
        .env("RINGWAY", common::ringway_bin())
        .current_dir(&repo)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for expected in [
        "server pod got 'GET /hello (pod to pod)' from 10.251.0.1",
        "server pod got 'GET /hello (to the Service)' from 10.251.0.1",
        "non-mesh db got",
        "route=hbone",
        "route=workload",
        "the first starts with a TLS handshake record",
        "appears in 0 of them",
        "cleaned up",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left.lines().any(|l| l.starts_with("rwdemo")),
        "namespaces left: {left}"
    );
}
