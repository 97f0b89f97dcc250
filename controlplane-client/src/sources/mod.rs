//! Where configuration snapshots come from. Each source builds
//! [`Snapshot`](crate::Snapshot)s and publishes them through a
//! [`SnapshotPublisher`](crate::SnapshotPublisher).
//!
//! - [`local`]: the local YAML source (ztunnel's LOCAL_XDS schema), the
//!   embedded default config, and a file watcher.
//! - [`xds`]: the Delta ADS client for istiod, and the protobuf conversions.
//!
//! May use [`model`](crate::model), [`publish`](crate::publish), the shared
//! backoff helper and [`security::pki`](crate::security::pki) (roots for the
//! xDS channel's TLS); nothing else of `security`, and never the dev control
//! plane.

pub mod local;
pub mod xds;
