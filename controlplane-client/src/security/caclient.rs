//! Client for an Istio-compatible CA (istiod, or `ringway-devcp`'s dev CA):
//! `istio.v1.auth.IstioCertificateService/CreateCertificate` over gRPC.
//!
//! One call per certificate: a fresh EC P-256 key is generated locally and
//! never leaves the process; the CA gets a PKCS#10 request with an empty
//! subject whose only SAN is the SPIFFE URI, the lifetime we ask for
//! (`validity_duration`, seconds) and, as gRPC metadata, the bearer token
//! (`authorization: Bearer <JWT>`, re-read from its file on every call so a
//! rotated projected token is picked up) and `clusterid`. When the identity
//! is not the node proxy's own, the request's `metadata` struct carries
//! `ImpersonatedIdentity` (the requested SPIFFE ID), as ztunnel does in
//! shared mode; istiod grants it only to trusted node agents for pods on
//! their node.
//!
//! # What is checked in the answer
//!
//! The answer (`cert_chain`: leaf first, root last) is refused unless the
//! chain is non-empty and parses, the leaf names exactly the identity we asked
//! for ("CA returned a certificate for X, asked for Y"), the leaf carries our
//! public key, it is not expired (nor valid only in the future beyond a small
//! clock-skew allowance), and the chain verifies up to the trust bundle.
//!
//! # Trust bundle
//!
//! Which roots workload certificates (ours and our peers') must chain to is
//! [`TrustBundle`]. The default follows Istio's proxies: the trust bundle is
//! the CA's root certificate file (`root-cert.pem`, the same file that
//! authenticates the CA's TLS endpoint), re-read on every call so a rotated
//! root is picked up. ztunnel instead trusts the last certificate of each
//! answer; that is available as [`TrustBundle::FromResponse`] and is what a
//! plaintext (`http://`) test setup without a root file uses. With a file
//! bundle, the answer's certificates that are in the bundle are not repeated
//! in the chain we present; with `FromResponse`, the last one never is.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use ringway_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ringway_proto::ca::IstioCertificateRequest;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::ParsedCertificate;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::model::identity::{Identity, IdentityError};
use crate::security::certmanager::{CertFetchError, CertSource};
use crate::security::pki::{self, der_to_pem};
use crate::security::tls::{self, TlsError, WorkloadCert};

/// Istio's default `SECRET_TTL`: the lifetime asked for.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
/// Istio's default `CLUSTER_ID`.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// Request-metadata key naming the identity a node proxy asks for on behalf
/// of a workload.
pub const IMPERSONATED_IDENTITY_KEY: &str = "ImpersonatedIdentity";
/// gRPC metadata key for the cluster ID.
pub const CLUSTER_ID_HEADER: &str = "clusterid";
/// How far in the future a certificate's `not_before` may lie (the CA's
/// clock running ahead of ours) before the answer is refused.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// Where the roots that workload certificates chain to come from; see the
/// module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustBundle {
    /// The CA's root certificate file ([`CaClientConfig::root_cert`]),
    /// re-read on every call. Istio's choice, and the default.
    CaRootFile,
    /// Another PEM file with one or more roots, re-read on every call.
    File(PathBuf),
    /// The last certificate of each answer (what ztunnel does). It does not
    /// authenticate anything by itself: trust then rests entirely on the
    /// connection to the CA.
    FromResponse,
}

/// How to reach and talk to the CA.
#[derive(Debug, Clone)]
pub struct CaClientConfig {
    /// `https://host:port` (Istio: `CA_ADDRESS`, usually
    /// `https://istiod.istio-system.svc:15012`), or `http://host:port` for a
    /// plaintext test CA.
    pub address: String,
    /// PEM root(s) that authenticate the CA's TLS certificate (Istio:
    /// `CA_ROOT_CA`, default `./var/run/secrets/istio/root-cert.pem`).
    /// Required for `https://`; re-read on every call, and the connection is
    /// rebuilt when it changes.
    pub root_cert: Option<PathBuf>,
    /// The name the CA's certificate must carry; defaults to the host of
    /// `address`.
    pub tls_server_name: Option<String>,
    /// Roots for workload certificates.
    pub trust_bundle: TrustBundle,
    /// File holding the JWT sent as `authorization: Bearer <JWT>` (Istio:
    /// `AUTH_TOKEN`, default `./var/run/secrets/tokens/istio-token`); read
    /// on every call. `None` sends no token.
    pub token_file: Option<PathBuf>,
    /// Sent as `clusterid` metadata.
    pub cluster_id: String,
    /// The node proxy's own identity: certificates for any other identity are
    /// requested with `ImpersonatedIdentity`. `None` (shared mode, the node
    /// proxy never serves as itself) impersonates for every identity.
    pub own_identity: Option<Identity>,
    /// Lifetime asked for (`validity_duration`); the CA may shorten it.
    pub validity: Duration,
    /// Bound on one call, connecting included.
    pub timeout: Duration,
    /// Extra gRPC metadata on every call (Istio: `CA_HEADER_*`).
    pub extra_metadata: Vec<(String, String)>,
}

impl CaClientConfig {
    /// Istio's defaults for everything but the address: no root file (set
    /// one for `https://`), the CA root as trust bundle, no token, cluster
    /// `Kubernetes`, impersonation for every identity, 24 h certificates,
    /// 10 s per call.
    pub fn new(address: impl Into<String>) -> CaClientConfig {
        CaClientConfig {
            address: address.into(),
            root_cert: None,
            tls_server_name: None,
            trust_bundle: TrustBundle::CaRootFile,
            token_file: None,
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            own_identity: None,
            validity: DEFAULT_VALIDITY,
            timeout: Duration::from_secs(10),
            extra_metadata: Vec::new(),
        }
    }
}

/// Why a certificate could not be obtained from the CA.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error("CA client configuration: {0}")]
    Config(String),
    #[error("not requesting a certificate for an invalid identity: {0}")]
    InvalidIdentity(#[from] IdentityError),
    #[error("building the certificate signing request: {0}")]
    Csr(#[from] rcgen::Error),
    #[error("reading {what} {}: {source}", path.display())]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {} is empty", .0.display())]
    EmptyToken(PathBuf),
    #[error("invalid gRPC metadata {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("connecting to the CA at {address}: {source}")]
    Connect {
        address: String,
        source: tonic::transport::Error,
    },
    #[error("CA call failed: {}: {}", .0.code(), .0.message())]
    Rpc(Box<tonic::Status>),
    #[error("the CA returned an empty certificate chain")]
    EmptyChain,
    #[error("the CA's certificate chain is unusable: {0}")]
    BadChain(TlsError),
    #[error("CA returned a certificate for {actual}, asked for {asked}")]
    IdentityMismatch {
        asked: Box<Identity>,
        actual: Box<Identity>,
    },
    #[error("the CA's certificate for {0} does not carry our public key")]
    KeyMismatch(Box<Identity>),
    #[error("the CA's certificate for {identity} {problem}")]
    Validity {
        identity: Box<Identity>,
        problem: String,
    },
    #[error("the CA's answer has only a leaf, so it names no root; configure a trust bundle file")]
    NoRootInResponse,
    #[error(
        "the CA's certificate for {identity} does not verify up to the trust bundle: {reason}"
    )]
    Untrusted {
        identity: Box<Identity>,
        reason: String,
    },
}

impl From<tonic::Status> for CaClientError {
    fn from(status: tonic::Status) -> Self {
        CaClientError::Rpc(Box::new(status))
    }
}

/// Talks to one CA. Cheap to share (`Arc`); calls may run concurrently.
pub struct CaClient {
    config: CaClientConfig,
    endpoint: Endpoint,
    tls: bool,
    /// The channel and the root file content it was built with.
    channel: Mutex<Option<(Option<Vec<u8>>, Channel)>>,
}

impl fmt::Debug for CaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaClient")
            .field("address", &self.config.address)
            .field("tls", &self.tls)
            .field("trust_bundle", &self.config.trust_bundle)
            .finish_non_exhaustive()
    }
}

impl CaClient {
    /// Checks the configuration; connects lazily, on the first call.
    pub fn new(config: CaClientConfig) -> Result<CaClient, CaClientError> {
        let bad = |reason: String| CaClientError::Config(reason);
        let endpoint = Endpoint::from_shared(config.address.clone())
            .map_err(|e| bad(format!("invalid CA address {:?}: {e}", config.address)))?
            .connect_timeout(config.timeout)
            .timeout(config.timeout);
        let tls = match endpoint.uri().scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(bad(format!(
                    "CA address {:?} must start with https:// (or http:// for a plaintext test CA)",
                    config.address
                )))
            }
        };
        if tls && config.root_cert.is_none() {
            return Err(bad(format!(
                "{} needs a root certificate file to authenticate the CA",
                config.address
            )));
        }
        if config.trust_bundle == TrustBundle::CaRootFile && config.root_cert.is_none() {
            return Err(bad(
                "the trust bundle is the CA root file, but no root file is configured".into(),
            ));
        }
        if config.validity < Duration::from_secs(1) {
            return Err(bad("the requested validity must be at least 1 s".into()));
        }
        if !tls {
            tracing::warn!(address = %config.address, "talking to the CA in plaintext; for tests only");
        }
        Ok(CaClient {
            config,
            endpoint,
            tls,
            channel: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &CaClientConfig {
        &self.config
    }

    /// Generates a key, has the CA certify it for `id`, and checks the
    /// answer (see the module docs).
    pub async fn fetch_cert(&self, id: &Identity) -> Result<WorkloadCert, CaClientError> {
        id.validate()?;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let csr = build_csr(id, &key)?;

        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(self.config.validity.as_secs()).unwrap_or(i64::MAX),
            metadata: self.impersonates(id).then(|| impersonation_metadata(id)),
        });
        let metadata = request.metadata_mut();
        if let Some(path) = &self.config.token_file {
            let token = read_token(path)?;
            insert_metadata(metadata, "authorization", &format!("Bearer {token}"))?;
        }
        insert_metadata(metadata, CLUSTER_ID_HEADER, &self.config.cluster_id)?;
        for (k, v) in &self.config.extra_metadata {
            insert_metadata(metadata, k, v)?;
        }

        let mut client = IstioCertificateServiceClient::new(self.channel()?);
        let response = client.create_certificate(request).await?.into_inner();
        let roots_pem = match &self.config.trust_bundle {
            TrustBundle::CaRootFile => {
                // `new` made sure it is set.
                let path = self.config.root_cert.as_ref().expect("checked in new");
                Some(read_string("trust bundle", path)?)
            }
            TrustBundle::File(path) => Some(read_string("trust bundle", path)?),
            TrustBundle::FromResponse => None,
        };
        let cert = check_response(id, &key, &response.cert_chain, roots_pem.as_deref())?;
        tracing::debug!(identity = %id, not_after = ?cert.not_after(), "CA issued a certificate");
        Ok(cert)
    }

    fn impersonates(&self, id: &Identity) -> bool {
        self.config.own_identity.as_ref() != Some(id)
    }

    /// The cached channel, rebuilt when the CA root file changed.
    fn channel(&self) -> Result<Channel, CaClientError> {
        let root = match (&self.config.root_cert, self.tls) {
            (Some(path), true) => {
                Some(
                    std::fs::read(path).map_err(|source| CaClientError::ReadFile {
                        what: "CA root certificate",
                        path: path.clone(),
                        source,
                    })?,
                )
            }
            _ => None,
        };
        let mut cached = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((built_with, channel)) = cached.as_ref() {
            if *built_with == root {
                return Ok(channel.clone());
            }
            tracing::info!(address = %self.config.address, "CA root certificate changed; reconnecting");
        }
        let mut endpoint = self.endpoint.clone();
        if let Some(root) = &root {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(root));
            if let Some(name) = &self.config.tls_server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|source| CaClientError::Connect {
                    address: self.config.address.clone(),
                    source,
                })?;
        }
        let channel = endpoint.connect_lazy();
        *cached = Some((root, channel.clone()));
        Ok(channel)
    }
}

impl CertSource for CaClient {
    async fn fetch(&self, id: &Identity) -> Result<WorkloadCert, CertFetchError> {
        self.fetch_cert(id).await.map_err(|e| match e {
            CaClientError::InvalidIdentity(_) => CertFetchError::permanent(e),
            e => CertFetchError::transient(e),
        })
    }
}

/// A PKCS#10 request (PEM) for `key` with an empty subject and `id` as its
/// only SAN, as ztunnel sends.
pub fn build_csr(id: &Identity, key: &KeyPair) -> Result<String, rcgen::Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(id.to_string().try_into()?)];
    params.serialize_request(key)?.pem()
}

fn impersonation_metadata(id: &Identity) -> prost_types::Struct {
    let value = prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(id.to_string())),
    };
    prost_types::Struct {
        fields: BTreeMap::from([(IMPERSONATED_IDENTITY_KEY.to_owned(), value)]),
    }
}

fn insert_metadata(
    metadata: &mut tonic::metadata::MetadataMap,
    key: &str,
    value: &str,
) -> Result<(), CaClientError> {
    let bad = |reason: String| CaClientError::Metadata {
        key: key.to_owned(),
        reason,
    };
    let k = AsciiMetadataKey::from_bytes(key.as_bytes()).map_err(|e| bad(e.to_string()))?;
    // Never echo the value: it may be the token.
    let v = AsciiMetadataValue::try_from(value).map_err(|_| bad("not printable ASCII".into()))?;
    metadata.insert(k, v);
    Ok(())
}

fn read_string(what: &'static str, path: &PathBuf) -> Result<String, CaClientError> {
    std::fs::read_to_string(path).map_err(|source| CaClientError::ReadFile {
        what,
        path: path.clone(),
        source,
    })
}

fn read_token(path: &PathBuf) -> Result<String, CaClientError> {
    let token = read_string("token file", path)?;
    let token = token.trim();
    if token.is_empty() {
        return Err(CaClientError::EmptyToken(path.clone()));
    }
    Ok(token.to_owned())
}

/// Checks a `cert_chain` answer for `asked` (see the module docs) and turns
/// it into a [`WorkloadCert`] with `key`. `roots_pem` is the trust bundle, or
/// `None` to take the answer's last certificate as the root.
pub fn check_response(
    asked: &Identity,
    key: &KeyPair,
    cert_chain: &[String],
    roots_pem: Option<&str>,
) -> Result<WorkloadCert, CaClientError> {
    if cert_chain.iter().all(|c| c.trim().is_empty()) {
        return Err(CaClientError::EmptyChain);
    }
    // One certificate per element is what istiod sends; concatenated PEM in
    // an element is accepted too.
    let certs = pki::parse_certs(&cert_chain.concat(), "CA's certificate chain")
        .map_err(|e| CaClientError::BadChain(e.into()))?;

    let (_, leaf) = x509_parser::parse_x509_certificate(&certs[0])
        .map_err(|e| CaClientError::BadChain(TlsError::BadCertificate(e.to_string())))?;
    let actual = tls::peer_identity(&certs[..1]).map_err(CaClientError::BadChain)?;
    if actual != *asked {
        return Err(CaClientError::IdentityMismatch {
            asked: Box::new(asked.clone()),
            actual: Box::new(actual),
        });
    }
    if leaf.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(CaClientError::KeyMismatch(Box::new(asked.clone())));
    }
    let (not_before, not_after) = pki::validity_of(&leaf);
    let now = SystemTime::now();
    let validity_problem = |problem: String| CaClientError::Validity {
        identity: Box::new(asked.clone()),
        problem,
    };
    if not_after <= now {
        return Err(validity_problem(format!(
            "expired at {}",
            leaf.validity().not_after
        )));
    }
    if not_before > now + MAX_CLOCK_SKEW {
        return Err(validity_problem(format!(
            "is not valid before {}",
            leaf.validity().not_before
        )));
    }

    let roots: Vec<CertificateDer<'static>> = match roots_pem {
        Some(pem) => {
            pki::parse_certs(pem, "trust bundle").map_err(|e| CaClientError::BadChain(e.into()))?
        }
        None if certs.len() < 2 => return Err(CaClientError::NoRootInResponse),
        None => vec![certs[certs.len() - 1].clone()],
    };
    let store =
        pki::root_store(roots.iter().cloned()).map_err(|e| CaClientError::BadChain(e.into()))?;
    // What we will present: the leaf and whatever else is not a root.
    let presented: Vec<&CertificateDer<'static>> = certs
        .iter()
        .enumerate()
        .filter(|(i, c)| *i == 0 || !roots.contains(c))
        .map(|(_, c)| c)
        .collect();
    let intermediates: Vec<CertificateDer<'static>> =
        presented[1..].iter().map(|c| (*c).clone()).collect();

    // At the leaf's start if the CA's clock runs a little ahead of ours.
    let at = UnixTime::since_unix_epoch(
        now.max(not_before)
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let untrusted = |reason: String| CaClientError::Untrusted {
        identity: Box::new(asked.clone()),
        reason,
    };
    let parsed = ParsedCertificate::try_from(&certs[0]).map_err(|e| untrusted(e.to_string()))?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &parsed,
        &store,
        &intermediates,
        at,
        pki::crypto_provider().signature_verification_algorithms.all,
    )
    .map_err(|e| untrusted(e.to_string()))?;

    let chain_pem: String = presented
        .iter()
        .map(|c| der_to_pem("CERTIFICATE", c))
        .collect();
    let roots_pem: String = roots.iter().map(|c| der_to_pem("CERTIFICATE", c)).collect();
    WorkloadCert::from_pem(&key.serialize_pem(), &chain_pem, &roots_pem)
        .map_err(CaClientError::BadChain)
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CaClient>();
    send_sync::<CaClientError>();
};
