//! xDS: the configuration source istiod speaks, as ztunnel uses it.
//!
//! - [`convert`]: `istio.workload.Address` / `istio.security.Authorization`
//!   protobufs ⇄ [`model`](crate::model) types, with per-resource validation.
//! - [`client`]: the Delta ADS client that runs on the control thread and
//!   publishes one [`Snapshot`](crate::Snapshot) per response, plus the
//!   on-demand lookup helper the cores use.
//!
//! Uses the [`model`](crate::model), [`publish`](crate::publish), the shared
//! backoff helper and, for the channel's TLS roots,
//! [`security::pki`](crate::security::pki).
//!
//! Wire summary (Delta ADS, `DeltaAggregatedResources`):
//!
//! | | Address | Authorization |
//! |---|---|---|
//! | type URL | [`ADDRESS_TYPE_URL`] | [`AUTHORIZATION_TYPE_URL`] |
//! | resource name | workload uid, or service "namespace/hostname" | "namespace/name" |
//! | aliases | "network/IP" of each workload address / service VIP | — |
//! | subscription | wildcard; on-demand: explicit "network/IP" names | wildcard |
//!
//! Typical wiring on the control thread:
//!
//! ```no_run
//! # async fn wiring() -> Result<(), ringway_controlplane::sources::xds::XdsError> {
//! use ringway_controlplane::sources::xds::{self, NodeInfo, XdsConfig, XdsStatus};
//! use ringway_controlplane::SnapshotPublisher;
//!
//! let publisher = SnapshotPublisher::new();
//! let status = XdsStatus::new(); // readiness + counters, clone it freely
//! let mut cfg = XdsConfig::new("https://istiod.istio-system.svc:15012", NodeInfo::from_env());
//! cfg.root_ca = Some("/var/run/secrets/istio/root-cert.pem".into());
//! cfg.token_path = Some("/var/run/secrets/tokens/istio-token".into());
//! xds::run(cfg, publisher, status, None).await
//! # }
//! ```

pub mod client;
pub mod convert;

pub use client::{
    lookup_on_demand, on_demand_channel, resolves, run, BackoffConfig, NodeInfo, OnDemandReceiver,
    OnDemandRequest, OnDemandSender, TerminationReason, TypeCounters, XdsConfig, XdsError,
    XdsMetrics, XdsStatus, DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_ON_DEMAND_TIMEOUT,
};
pub use convert::{AddressResource, ConvertError};
pub use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
