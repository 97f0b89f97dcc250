//! A development control plane: Delta ADS ([`ads`]) from a local YAML file
//! plus the Istio CA service ([`ca`]) on one gRPC port, over TLS with a
//! server certificate from a [`BuiltinCa`]. The `ringway-devcp` binary
//! wires it up; tests use the pieces directly.
//!
//! It authenticates nobody. Keep it on loopback or a test network.
//!
//! # Pointing Istio's ztunnel at it
//!
//! ```text
//! ringway-devcp --config mesh.yaml --ca-dir ./devcp-ca --listen 127.0.0.1:15012
//!
//! XDS_ADDRESS=https://localhost:15012            # or https://istiod.istio-system.svc:15012 via /etc/hosts
//! CA_ADDRESS=https://localhost:15012
//! XDS_ROOT_CA=./devcp-ca/root-cert.pem
//! CA_ROOT_CA=./devcp-ca/root-cert.pem
//! AUTH_TOKEN=/path/to/any-token-file            # must exist; its content is not checked
//! CLUSTER_ID=Kubernetes
//! TRUST_DOMAIN=cluster.local                     # the --trust-domain of the CA
//! PROXY_MODE=dedicated PROXY_WORKLOAD_INFO=<ns>/<name>/<sa>   # a workload of mesh.yaml
//! POD_NAME=ztunnel POD_NAMESPACE=istio-system NODE_NAME=<node of mesh.yaml> INSTANCE_IP=127.0.0.1
//! ```
//!
//! The server certificate carries the `--server-name` DNS names (default
//! `istiod.istio-system.svc` and `localhost`) and the listen IP(s); set
//! `ALT_XDS_HOSTNAME` / `ALT_CA_HOSTNAME` when dialling by another name.
//! ringway's own client takes the same settings through
//! [`XdsConfig`](crate::sources::xds::XdsConfig).
//!
//! The top of the crate: it may use every other module, and nothing in the
//! crate uses it.

pub mod ads;
pub mod ca;

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use ringway_proto::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use ringway_proto::discovery::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::security::ca::{BuiltinCa, CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE};
pub use ads::{load_config, DevAds, XdsResources};

/// Largest message the servers accept or send (as istiod/ztunnel).
pub const MAX_MESSAGE_SIZE: usize = 200 * 1024 * 1024;

/// A TLS server certificate: the chain (leaf first) and its key, in PEM.
#[derive(Clone)]
pub struct ServerCert {
    pub chain_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCert").finish_non_exhaustive()
    }
}

/// Signs a server certificate for `dns_names` and `ips` with the CA in
/// `ca.dir()` (its `ca-cert.pem` and `ca-key.pem`; the key must be PKCS#8,
/// as in a directory [`BuiltinCa::load_or_create`] generated). The chain
/// holds the leaf and the CA's intermediates, so clients trusting
/// `root-cert.pem` accept it.
pub fn issue_server_cert(
    ca: &BuiltinCa,
    dns_names: &[String],
    ips: &[IpAddr],
    validity: Duration,
) -> Result<ServerCert, String> {
    let dir = ca.dir();
    let read = |name: &str| {
        std::fs::read(dir.join(name)).map_err(|e| format!("{}: {e}", dir.join(name).display()))
    };
    let ca_pem = read(CA_CERT_FILE)?;
    let ca_der = CertificateDer::pem_slice_iter(&ca_pem)
        .next()
        .ok_or_else(|| format!("{CA_CERT_FILE}: no certificate"))?
        .map_err(|e| format!("{CA_CERT_FILE}: {e}"))?;
    let key_pem =
        String::from_utf8(read(CA_KEY_FILE)?).map_err(|_| format!("{CA_KEY_FILE}: not UTF-8"))?;
    let key = KeyPair::from_pem(&key_pem)
        .map_err(|e| format!("{CA_KEY_FILE}: unusable (a PKCS#8 key is needed): {e}"))?;
    let issuer =
        Issuer::from_ca_cert_der(&ca_der, key).map_err(|e| format!("{CA_CERT_FILE}: {e}"))?;

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(first) = dns_names.first() {
        dn.push(DnType::CommonName, first.as_str());
    }
    params.distinguished_name = dn;
    let mut sans = Vec::with_capacity(dns_names.len() + ips.len());
    for name in dns_names {
        sans.push(SanType::DnsName(
            name.as_str()
                .try_into()
                .map_err(|e| format!("server name {name:?}: {e}"))?,
        ));
    }
    sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    if sans.is_empty() {
        return Err("a server certificate needs at least one name or IP".into());
    }
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let mut serial = [0u8; 16];
    SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| "the system random generator failed".to_string())?;
    serial[0] = (serial[0] & 0x7f) | 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    params.not_before =
        time::OffsetDateTime::from_unix_timestamp(now - 60).map_err(|e| e.to_string())?;
    params.not_after = time::OffsetDateTime::from_unix_timestamp(now + validity.as_secs() as i64)
        .map_err(|e| e.to_string())?;

    let leaf_key =
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let leaf = params
        .signed_by(&leaf_key, &issuer)
        .map_err(|e| format!("signing the server certificate: {e}"))?;

    // cert-chain.pem = ca-cert and its issuers; roots are left out.
    let chain_file = read(CERT_CHAIN_FILE)?;
    let mut chain_pem = leaf.pem();
    for cert in CertificateDer::pem_slice_iter(&chain_file) {
        let cert = cert.map_err(|e| format!("{CERT_CHAIN_FILE}: {e}"))?;
        if !ca.roots().contains(&cert) {
            chain_pem.push_str(&crate::security::pki::der_to_pem("CERTIFICATE", &cert));
        }
    }
    Ok(ServerCert {
        chain_pem,
        key_pem: leaf_key.serialize_pem(),
    })
}

/// Dispatches by gRPC service: the CA's paths to the CA (when mounted),
/// everything else to ADS (which answers unknown paths "unimplemented").
#[derive(Clone)]
pub struct Router {
    ads: AggregatedDiscoveryServiceServer<DevAds>,
    ca: Option<IstioCertificateServiceServer<ca::DevCa>>,
}

const CA_PATH_PREFIX: &str = "/istio.v1.auth.IstioCertificateService/";

impl Router {
    pub fn new(ads: DevAds, ca: Option<IstioCertificateServiceServer<ca::DevCa>>) -> Router {
        Router {
            ads: AggregatedDiscoveryServiceServer::new(ads)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            ca,
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl Service<http::Request<Body>> for Router {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path().starts_with(CA_PATH_PREFIX) {
            if let Some(ca) = &mut self.ca {
                return Box::pin(ca.call(req));
            }
        }
        Box::pin(self.ads.call(req))
    }
}

/// Serves `router` on `listener` (TLS with `cert`, or plaintext HTTP/2
/// when None) until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cert: Option<&ServerCert>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(cert) = cert {
        builder = builder.tls_config(
            ServerTlsConfig::new().identity(Identity::from_pem(&cert.chain_pem, &cert.key_pem)),
        )?;
    }
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    builder
        .serve_with_incoming_shutdown(router, incoming, shutdown)
        .await
}
