//! deploy/: the Helm chart, the manifests rendered from it and the
//! seccomp profile, checked by scripts/check-deploy.sh against Kubernetes'
//! schemas, a fresh render, and this build's `ringway --help` (every flag
//! and environment variable the manifests give ringway must exist), and
//! the seccomp profile applied by runc to this build's binary.
//!
//! The script installs kubernetes-validate and helm when they are missing
//! (PyPI); if it cannot, this test fails rather than skipping.

use std::path::Path;
use std::process::Command;

#[test]
fn deploy_material_validates_and_matches_this_ringway() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-deploy.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("RINGWAY_BIN", env!("CARGO_BIN_EXE_ringway"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "scripts/check-deploy.sh failed ({}): its FAILED lines above say what",
        out.status
    );
    assert!(
        stdout.contains("deploy check:") && stdout.contains(" 0 failed"),
        "no summary line:\n{stdout}"
    );
}
