//! Protobuf and gRPC wire types for talking to an Istio control plane: the
//! ambient workload and authorization resources, Delta xDS, and the Istio CA.
//! Generated at build time from `.proto` files kept in this crate, so every
//! other ringway crate shares one wire-compatible definition of each message.

/// The generated code, laid out by protobuf package exactly as `prost-build`
/// expects (generated files refer to each other through `super::` paths).
/// Prefer the short aliases at the crate root.
// `Address.type` holds a `Workload` or a `Service` inline, as prost generates
// it; boxing would only add an allocation per decoded resource.
#[allow(clippy::large_enum_variant)]
pub mod generated {
    pub mod istio {
        pub mod workload {
            include!(concat!(env!("OUT_DIR"), "/istio.workload.rs"));
        }
        pub mod security {
            include!(concat!(env!("OUT_DIR"), "/istio.security.rs"));
        }
        pub mod workload_zds {
            include!(concat!(env!("OUT_DIR"), "/istio.workload.zds.rs"));
        }
        pub mod v1 {
            pub mod auth {
                include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.rs"));
            }
        }
    }
    pub mod envoy {
        pub mod config {
            pub mod core {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                }
            }
        }
        pub mod service {
            pub mod discovery {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
                }
            }
        }
    }
    pub mod google {
        pub mod rpc {
            include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        }
    }
}

/// `istio.workload`: `Address`, `Workload`, `Service` and friends.
pub use generated::istio::workload;

/// `istio.workload.zds`: the in-pod enrollment protocol between the node
/// agent (istio-cni) and the node proxy.
pub use generated::istio::workload_zds as zds;

/// `istio.security`: the ambient L4 `Authorization` policy.
pub use generated::istio::security;

/// `istio.v1.auth`: certificate signing, with
/// `istio_certificate_service_client` and `istio_certificate_service_server`.
pub use generated::istio::v1::auth as ca;

/// `envoy.service.discovery.v3`: (Delta) xDS messages, with
/// `aggregated_discovery_service_client` and `aggregated_discovery_service_server`.
pub use generated::envoy::service::discovery::v3 as discovery;

/// `envoy.config.core.v3`: `Node`, `Locality`, `ControlPlane`, `Metadata`.
pub use generated::envoy::config::core::v3 as core;

/// `google.rpc`: `Status`, carried as `error_detail` in NACKs.
pub use generated::google::rpc;

/// Type URL of `istio.workload.Address` resources in xDS.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of `istio.security.Authorization` resources in xDS.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// gRPC path of the Delta ADS stream.
pub const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// gRPC path of the Istio CA's signing call.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";
