//! ringway's control-plane side: what the mesh looks like, where that view
//! comes from, the certificates its identities need, and how all of it
//! reaches the data-plane cores.
//!
//! The crate is layered; each layer may use only the ones above it in this
//! list (`tests/layering.rs` enforces it):
//!
//! - [`model`]: the mesh as plain values, no I/O: workloads, services and
//!   authorization policies ([`model`]), [`Identity`] ([`model::identity`]),
//!   and [`Snapshot`] ([`model::snapshot`]), an immutable, validated, indexed
//!   set of them that cores look things up in per connection. Decisions that
//!   need no I/O live here too, next to the model they read.
//! - [`publish`]: [`Publisher`] (control thread) and [`Feed`] (cores):
//!   lock-free hand-over of the current value plus change notification that
//!   works on any executor; [`SnapshotPublisher`] / [`SnapshotFeed`] for
//!   snapshots.
//! - [`security`]: the identities' certificates and mTLS: X.509 helpers
//!   ([`security::pki`]), the built-in CA ([`BuiltinCa`]), the TLS configs
//!   for HBONE ([`TlsConfigs`], [`peer_identity`]), the published
//!   certificate snapshot ([`CertSnapshot`]), the certificate manager and the
//!   client for an Istio CA.
//! - [`sources`]: where snapshots come from: the local YAML file
//!   ([`sources::local`]) and xDS from istiod ([`sources::xds`]).
//! - [`devcp`]: a development control plane (xDS and CA server) built from
//!   all of the above, behind the `ringway-devcp` binary.
//!
//! - `fuzzing` (hidden): the fuzz harnesses, over `model` and `sources`
//!   (see `fuzz/README.md`).
//!
//! A private `backoff` module holds the retry jitter that `security` and
//! `sources` share; it depends on nothing.

mod backoff;
pub mod devcp;
#[doc(hidden)]
pub mod fuzzing;
pub mod model;
pub mod publish;
pub mod security;
pub mod sources;

pub use model::identity::{Identity, IdentityError};
pub use model::snapshot::{DeltaOutcome, Rejected, Snapshot, SnapshotDelta, SnapshotError};
pub use publish::{Closed, Feed, Publisher, SnapshotFeed, SnapshotGuard, SnapshotPublisher};
pub use security::ca::{BuiltinCa, CaError, IssuedCert};
pub use security::certs::{CertFeed, CertPublisher, CertSnapshot};
pub use security::tls::{
    build_tls_configs, build_tls_configs_with, build_tls_configs_with_crls, peer_identity,
    TlsConfigs, TlsError, WorkloadCert,
};
