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
//!
//! Sources still to come (xDS, CA client) build [`Snapshot`]s and publish
//! them the same way.

pub mod local;
pub mod model;
pub mod publish;
pub mod snapshot;

pub use publish::{Closed, SnapshotFeed, SnapshotGuard, SnapshotPublisher};
pub use snapshot::{Snapshot, SnapshotError};
