//! The identities' certificates and mTLS.
//!
//! - [`pki`]: low-level X.509 / PEM helpers (parsing, trust stores, chain
//!   verification) that everything below shares.
//! - [`tls`]: rustls server/client configs for HBONE mTLS, built once per
//!   identity ([`TlsConfigs`](tls::TlsConfigs)), and the peer-identity check.
//! - [`crl`]: certificate revocation lists (`CRL_PATH`) the verifiers in
//!   [`tls`] consult, and their file watcher.
//! - [`ca`]: the built-in CA (Istio's cacerts layout) that signs workload
//!   certificates.
//! - [`certs`]: [`CertSnapshot`](certs::CertSnapshot), TLS configs by
//!   identity, published to the cores like the configuration snapshot.
//! - [`certmanager`]: keeps a node's [`CertSnapshot`](certs::CertSnapshot)
//!   current from a pluggable certificate source.
//! - [`caclient`]: an Istio CA (istiod) as such a source.
//!
//! Within this folder imports go one way, in the order `caclient`,
//! `certmanager`, `certs`, `ca`, `tls`, `crl`, `pki`: a module uses only modules
//! after it. From the rest of the crate it may use
//! [`model`](crate::model), [`publish`](crate::publish) and the shared
//! backoff helper; never the config sources or the dev control plane.

pub mod ca;
pub mod caclient;
pub mod certmanager;
pub mod certs;
pub mod crl;
pub mod pki;
pub mod tls;
