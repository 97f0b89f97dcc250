//! Where configuration snapshots come from. Each source builds
//! [`Snapshot`](crate::Snapshot)s and publishes them through a
//! [`SnapshotPublisher`](crate::SnapshotPublisher).
//!
//! - [`local`]: the local YAML source (ztunnel's LOCAL_XDS schema), the
//!   embedded default config, and a file watcher.
//! - [`xds`]: the Delta ADS client for istiod, and the protobuf conversions.
//! - [`zds`]: the in-pod enrollment client for the node agent (istio-cni):
//!   pods and their network namespaces, not snapshots.
//!
//! May use [`model`](crate::model), [`publish`](crate::publish), the shared
//! backoff helper and [`security::pki`](crate::security::pki) (roots for the
//! xDS channel's TLS); nothing else of `security`, and never the dev control
//! plane.

pub mod local;
pub mod xds;
pub mod zds;

use crate::model::snapshot::Snapshot;
use crate::model::Workload;

/// Warns about policy names that `workloads` list but `snapshot` lacks: they
/// are skipped when deciding (as in ztunnel), which is worth an operator's
/// attention. At most a few lines, then a count.
pub(crate) fn warn_missing_policies<'a>(
    snapshot: &Snapshot,
    workloads: impl Iterator<Item = &'a Workload>,
    origin: &str,
) {
    const SHOWN: usize = 10;
    let mut missing = 0usize;
    for w in workloads {
        for key in snapshot.missing_policies(w) {
            if missing < SHOWN {
                tracing::warn!(
                    origin,
                    workload = %w.uid,
                    policy = key,
                    "workload lists an authorization policy that is not in the config; \
                     it is skipped until it arrives"
                );
            }
            missing += 1;
        }
    }
    if missing > SHOWN {
        tracing::warn!(
            origin,
            missing,
            "{} more unknown authorization policy references not shown",
            missing - SHOWN
        );
    }
}
