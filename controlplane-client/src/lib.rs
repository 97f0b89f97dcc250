//! ringway's control-plane side: what the mesh looks like and how that view
//! reaches the data-plane cores.
//!
//! - [`model`]: workloads, services and authorization policies, free of any
//!   wire format.
//! - [`snapshot`]: [`Snapshot`], an immutable, validated, indexed set of them;
//!   cores look things up in it per connection.
//! - [`publish`]: [`SnapshotPublisher`] (control thread) and [`SnapshotFeed`]
//!   (cores): lock-free hand-over of the current snapshot plus change
//!   notification that works on any executor.
//! - [`local`]: the local YAML source (ztunnel's LOCAL_XDS schema), the
//!   embedded default config, and a file watcher.
//! - [`identity`]: [`Identity`], a parsed `spiffe://td/ns/NS/sa/SA`.
//! - [`ca`]: [`BuiltinCa`], the local CA (Istio's cacerts layout) that signs
//!   workload certificates.
//! - [`tls`]: rustls server/client configs for HBONE mTLS, built once per
//!   identity ([`TlsConfigs`]), and [`peer_identity`].
//! - [`certs`]: [`CertSnapshot`] (configs by identity), published to the cores
//!   like [`Snapshot`].
//!
//! Sources still to come (xDS, CA client) build [`Snapshot`]s and publish
//! them the same way.

mod backoff;
pub mod ca;
pub mod caclient;
pub mod certmanager;
pub mod certs;
pub mod devcp;
pub mod identity;
pub mod local;
pub mod model;
pub mod pki;
pub mod publish;
pub mod snapshot;
pub mod tls;
pub mod xds;

pub use ca::{BuiltinCa, CaError, IssuedCert};
pub use certs::{CertFeed, CertPublisher, CertSnapshot};
pub use identity::{Identity, IdentityError};
pub use publish::{Closed, Feed, Publisher, SnapshotFeed, SnapshotGuard, SnapshotPublisher};
pub use snapshot::{DeltaOutcome, Rejected, Snapshot, SnapshotDelta, SnapshotError};
pub use tls::{build_tls_configs, peer_identity, TlsConfigs, TlsError, WorkloadCert};
