//! The container image: scripts/check-image.sh packages this build's
//! `ringway` with scripts/build-image.sh (an OCI image made with umoci from
//! the host's Debian, no base image pulled), checks it against
//! deploy/image/Dockerfile and the chart's default image and command, and
//! runs it under runc with deploy/seccomp/ringway.json, the chart's
//! capabilities and a read-only root in a network namespace of its own:
//! `ringway --help` must run, the entrypoint on the embedded default must
//! answer 200 on /healthz/ready, and SIGTERM must stop it.
//!
//! The release image is the same but for the binary (build-image.sh
//! without --binary builds it); packaging this test build's binary keeps
//! the test to seconds. Needs root: without it the test fails, it does not
//! skip.

mod common;

#[test]
fn image_runs_under_runc_with_the_seccomp_profile() {
    common::require_root();
    common::run_check_script("check-image.sh", "image check:");
}
