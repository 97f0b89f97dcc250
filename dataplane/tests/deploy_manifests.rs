//! deploy/: the Helm chart, the manifests rendered from it and the
//! seccomp profile, checked by scripts/check-deploy.sh against Kubernetes'
//! schemas, a fresh render, and this build's `ringway --help` (every flag
//! and environment variable the manifests give ringway must exist), and
//! the seccomp profile applied by runc to this build's binary.
//!
//! The script installs kubernetes-validate and helm when they are missing
//! (PyPI); if it cannot, this test fails rather than skipping.

mod common;

#[test]
fn deploy_material_validates_and_matches_this_ringway() {
    common::run_check_script("check-deploy.sh", "deploy check:");
}
