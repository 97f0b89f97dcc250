//! What the rig tests share: root, and the ringway binary to run.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The rig needs root; the tests fail (never skip) without it.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (network namespaces, nftables): run the tests as root, as CI does"
    );
}

/// RINGWAY_BIN, else the newest ringway under target/.
pub fn ringway_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RINGWAY_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<this test> → target/<profile>
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let target = profile_dir.parent().unwrap();
    let newest = [
        profile_dir.join("ringway"),
        target.join("release/ringway"),
        target.join("debug/ringway"),
    ]
    .into_iter()
    .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
    .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "no ringway binary under {}: build it first (cargo build -p ringway-dataplane) or set RINGWAY_BIN",
            target.display()
        ),
    }
}

/// Suite arguments for a smoke run: one round, tiny sizes, no calibration.
/// `streams` is the --streams value.
#[allow(dead_code)] // each test binary compiles this module; not all use it
pub fn tiny_run(streams: &str) -> Vec<&str> {
    vec![
        "--rounds",
        "1",
        "--bytes",
        "8M",
        "--streams",
        streams,
        "--rr-duration",
        "300ms",
        "--rr-kernel-duration",
        "300ms",
        "--rr-conc-connections",
        "1,8",
        "--rr-conc-duration",
        "300ms",
        "--connect-duration",
        "300ms",
        "--idle-connections",
        "20",
        "--idle-settle",
        "100ms",
        "--no-calibrate",
    ]
}

/// Runs `ringway-perf suite --ringway RINGWAY --out OUT ARGS...`, which
/// must succeed; returns its progress output and results.json.
pub fn run_suite(ringway: &Path, out: &Path, args: &[&str]) -> (String, serde_json::Value) {
    let started = std::time::Instant::now();
    let run = Command::new(env!("CARGO_BIN_EXE_ringway-perf"))
        .args(["suite", "--ringway"])
        .arg(ringway)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "suite failed:\n{stderr}");
    eprintln!("suite took {:.1}s", started.elapsed().as_secs_f64());
    let json = std::fs::read_to_string(out.join("results.json")).unwrap();
    (stderr, serde_json::from_str(&json).unwrap())
}

/// The results.json row of metric `id`.
#[allow(dead_code)] // each test binary compiles this module; not all use it
pub fn metric<'a>(json: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    json["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no metric {id}"))
}

/// The columns' keys, in order.
pub fn variant_keys(json: &serde_json::Value) -> Vec<String> {
    json["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["key"].as_str().unwrap().to_string())
        .collect()
}
