//! rustls configurations for HBONE mTLS, built once per local identity and
//! shared by every connection and every core through an `Arc`.
//!
//! Both sides speak TLS 1.3 only with AES-GCM suites (ring), offer ALPN `h2`,
//! and never resume sessions, as ztunnel does. The server requires a client
//! certificate that chains to our roots and carries a SPIFFE ID in our trust
//! domain. The client checks that the server's chain leads to our roots and
//! that the leaf names a SPIFFE identity. Both sides then refuse a chain with
//! a certificate on a revocation list ([`crate::security::crl`]), once
//! `CRL_PATH` has put one in force.
//!
//! # The peer-identity contract
//!
//! A [`TlsConfigs::client`] config belongs to the *source* identity and is
//! shared by all its outbound connections, so its verifier cannot know which
//! identity a particular destination must have. After every client handshake
//! completes, and before sending any application data (the HBONE CONNECT
//! included), the data plane must call [`expect_peer_identity`] (or
//! [`peer_identity`] and compare) on the connection's peer certificates with
//! the identity the destination is expected to have, and drop the connection
//! on mismatch. On the server side [`peer_identity`] yields the authenticated
//! source identity used for authorization.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use x509_parser::extensions::GeneralName;

use crate::model::identity::{Identity, IdentityError};
use crate::model::Str;
use crate::security::crl::{CrlStore, Side};
use crate::security::pki::{crypto_provider, parse_certs, root_store, validity_of, PkiError};

/// The only ALPN protocol HBONE uses.
pub const ALPN_H2: &[u8] = b"h2";

/// `Debug` prints the same message as `Display`: rustls shows a verifier's
/// error (`CertificateError::Other`) with `Debug`, so this keeps handshake
/// failures readable in logs.
#[derive(thiserror::Error)]
pub enum TlsError {
    /// Reading the certificates or building the trust store.
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    #[error("unparsable certificate: {0}")]
    BadCertificate(String),
    #[error("the certificate has no spiffe:// URI SAN")]
    NoSpiffeId,
    #[error("the certificate's SPIFFE ID is unacceptable: {0}")]
    InvalidSpiffeId(#[from] IdentityError),
    #[error("peer {peer} is not in our trust domain {ours:?}")]
    ForeignTrustDomain { ours: String, peer: Box<Identity> },
    #[error("certificate is for {actual}, expected {expected}")]
    IdentityMismatch {
        expected: Box<Identity>,
        actual: Box<Identity>,
    },
    #[error("building the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

impl fmt::Debug for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl TlsError {
    /// As a rustls certificate error, so the handshake fails with an alert and
    /// our message is what the local side logs.
    fn into_rustls(self) -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(self))))
    }
}

/// A workload's certificate material, parsed: what [`build_tls_configs`]
/// needs. The key never shows in `Debug`.
pub struct WorkloadCert {
    identity: Identity,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl WorkloadCert {
    /// `chain_pem`: the leaf first, then intermediates; `roots_pem`: one or
    /// more trust anchors. The identity and validity come from the leaf. The
    /// chain is not verified here (an expired certificate still loads; peers
    /// will reject it), and rustls checks that the key matches the leaf when
    /// the configs are built.
    pub fn from_pem(
        key_pem: &str,
        chain_pem: &str,
        roots_pem: &str,
    ) -> Result<WorkloadCert, TlsError> {
        let chain = parse_certs(chain_pem, "certificate chain")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| PkiError::Pem {
            what: "private key",
            detail: e.to_string(),
        })?;
        let roots = root_store(parse_certs(roots_pem, "root certificates")?)?;
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0])
            .map_err(|e| TlsError::BadCertificate(e.to_string()))?;
        let identity = spiffe_id_of(&leaf)?;
        let (not_before, not_after) = validity_of(&leaf);
        Ok(WorkloadCert {
            identity,
            chain,
            key,
            roots: Arc::new(roots),
            not_before,
            not_after,
        })
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    pub fn roots(&self) -> &Arc<RootCertStore> {
        &self.roots
    }

    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }
}

impl fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity.to_string())
            .field("chain_len", &self.chain.len())
            .field("roots", &self.roots.len())
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Ready-built TLS configs for one local identity. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TlsConfigs {
    pub identity: Identity,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// For inbound HBONE (15008): requires a client certificate in our trust
    /// domain.
    pub server: Arc<ServerConfig>,
    /// For outbound HBONE as this identity. Checks only that the server chains
    /// to our roots and has a SPIFFE ID: see the module docs for the
    /// post-handshake identity check the caller owes. The `ServerName` given
    /// to rustls is neither sent (no SNI) nor checked; the destination IP will
    /// do.
    pub client: Arc<ClientConfig>,
    /// Whether a connection used these configs lately: how the certificate
    /// manager keeps a certificate fetched on demand while it is in use.
    pub used: UseMark,
}

/// Set by a core that uses a certificate, taken (and cleared) by the
/// certificate manager when it decides whether to keep one no local
/// workload has. A relaxed load per use, a store only when it was clear:
/// no locks, and the line stays shared between cores.
#[derive(Debug, Default)]
pub struct UseMark(std::sync::atomic::AtomicBool);

impl UseMark {
    /// A connection uses the certificate.
    pub fn mark(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.0.load(Relaxed) {
            self.0.store(true, Relaxed);
        }
    }

    /// Whether it was used since the last take.
    pub fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clone for UseMark {
    fn clone(&self) -> Self {
        UseMark(std::sync::atomic::AtomicBool::new(
            self.0.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

/// Builds both configs for `cert`: TLS 1.3 only (1.2 too after
/// [`enable_tls12`]), AES-GCM suites, ALPN `h2`, no
/// resumption or tickets, no SNI. Their verifiers check the process-wide
/// revocation lists ([`CrlStore::global`]).
pub fn build_tls_configs(cert: &WorkloadCert) -> Result<TlsConfigs, TlsError> {
    let provider = if TLS12_ENABLED.load(Ordering::Relaxed) {
        crate::security::pki::crypto_provider_with_tls12()
    } else {
        crypto_provider()
    };
    build_tls_configs_with(cert, provider)
}

/// ztunnel's `TLS12_ENABLED`: set once at startup, before any certificate
/// is issued; every config built afterwards also speaks TLS 1.2.
static TLS12_ENABLED: AtomicBool = AtomicBool::new(false);

/// Lets HBONE fall back to TLS 1.2 (ztunnel's `TLS12_ENABLED=true`).
pub fn enable_tls12() {
    TLS12_ENABLED.store(true, Ordering::Relaxed);
}

/// [`build_tls_configs`] on another crypto provider (its suites, groups
/// and key loading): what `tls-provider-bench` compares ringway's configs
/// on. ringway itself runs only on [`crypto_provider`].
pub fn build_tls_configs_with(
    cert: &WorkloadCert,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<TlsConfigs, TlsError> {
    build_tls_configs_with_crls(cert, provider, CrlStore::global().clone())
}

/// [`build_tls_configs_with`], checking the revocation lists in `crls`.
pub fn build_tls_configs_with_crls(
    cert: &WorkloadCert,
    provider: Arc<rustls::crypto::CryptoProvider>,
    crls: Arc<CrlStore>,
) -> Result<TlsConfigs, TlsError> {
    // TLS 1.2 only where the provider carries its suites (TLS12_ENABLED).
    let tls12 = provider
        .cipher_suites
        .iter()
        .any(|suite| suite.version() == &rustls::version::TLS12);
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };

    let webpki = WebPkiClientVerifier::builder_with_provider(cert.roots.clone(), provider.clone())
        .build()?;
    let client_verifier = Arc::new(TrustDomainClientVerifier {
        inner: webpki,
        trust_domain: cert.identity.trust_domain.clone(),
        roots: cert.roots.clone(),
        algorithms: provider.signature_verification_algorithms,
        crls: crls.clone(),
    });
    // One parsed key and chain for both directions: a node may hold
    // thousands of identities, and each parsed copy costs ~1 KiB.
    let certified = CertifiedKey::from_der(cert.chain.clone(), cert.key.clone_key(), &provider)?;
    let resolver = Arc::new(SingleCertAndKey::from(certified));
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?
        .with_client_cert_verifier(client_verifier)
        .with_cert_resolver(resolver.clone());
    server.alpn_protocols = vec![ALPN_H2.to_vec()];
    server.session_storage = Arc::new(NoServerSessionStorage {});
    server.send_tls13_tickets = 0;

    let server_verifier = Arc::new(SpiffeServerVerifier {
        roots: cert.roots.clone(),
        algorithms: provider.signature_verification_algorithms,
        crls,
    });
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .dangerous()
        .with_custom_certificate_verifier(server_verifier)
        .with_client_cert_resolver(resolver);
    client.alpn_protocols = vec![ALPN_H2.to_vec()];
    client.resumption = Resumption::disabled();
    client.enable_sni = false;

    Ok(TlsConfigs {
        identity: cert.identity.clone(),
        not_before: cert.not_before,
        not_after: cert.not_after,
        server: Arc::new(server),
        client: Arc::new(client),
        used: UseMark::default(),
    })
}

/// The identity in the first `spiffe://` URI SAN of the leaf (`certs[0]`),
/// parsed strictly. Pass the connection's `peer_certificates()`.
pub fn peer_identity(certs: &[CertificateDer<'_>]) -> Result<Identity, TlsError> {
    let leaf = certs.first().ok_or(TlsError::NoPeerCertificate)?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    spiffe_id_of(&cert)
}

/// [`peer_identity`], failing unless it is `expected`. What an outbound
/// connection checks right after its handshake.
pub fn expect_peer_identity(
    certs: &[CertificateDer<'_>],
    expected: &Identity,
) -> Result<Identity, TlsError> {
    let actual = peer_identity(certs)?;
    if actual != *expected {
        return Err(TlsError::IdentityMismatch {
            expected: Box::new(expected.clone()),
            actual: Box::new(actual),
        });
    }
    Ok(actual)
}

fn spiffe_id_of(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<Identity, TlsError> {
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::BadCertificate(format!("subjectAltName: {e}")))?
        .ok_or(TlsError::NoSpiffeId)?;
    let uri = san
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some(*uri),
            _ => None,
        })
        .ok_or(TlsError::NoSpiffeId)?;
    Ok(uri.parse()?)
}

/// webpki client-certificate verification, plus: the client's SPIFFE trust
/// domain must be ours, and no certificate of its chain is revoked.
#[derive(Debug)]
struct TrustDomainClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: Str,
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    crls: Arc<CrlStore>,
}

impl ClientCertVerifier for TrustDomainClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let peer =
            peer_identity(std::slice::from_ref(end_entity)).map_err(TlsError::into_rustls)?;
        if peer.trust_domain != self.trust_domain {
            return Err(TlsError::ForeignTrustDomain {
                ours: self.trust_domain.to_string(),
                peer: Box::new(peer),
            }
            .into_rustls());
        }
        self.crls.check(
            Side::Inbound,
            end_entity,
            intermediates,
            &self.roots.roots,
            now,
            self.algorithms.all,
        )?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Chain to our roots (with time and serverAuth checks), none of it revoked,
/// and a parseable SPIFFE ID; no host-name check. Which identity is
/// acceptable is decided per connection by the caller (see the module docs).
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    crls: Arc<CrlStore>,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let leaf = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &leaf,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        self.crls.check(
            Side::Outbound,
            end_entity,
            intermediates,
            &self.roots.roots,
            now,
            self.algorithms.all,
        )?;
        peer_identity(std::slice::from_ref(end_entity)).map_err(TlsError::into_rustls)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TlsConfigs>();
    send_sync::<WorkloadCert>();
    send_sync::<TlsError>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::ca::{BuiltinCa, DEFAULT_CERT_VALIDITY};
    use rustls::client::ResolvesClientCert;
    use rustls::crypto::CryptoProvider;
    use rustls::sign::CertifiedKey;
    use rustls::{AlertDescription, Connection, ProtocolVersion};
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;
    use std::path::Path;
    use std::time::Duration;

    const TD: &str = "cluster.local";

    fn ca(dir: &Path, td: &str) -> BuiltinCa {
        BuiltinCa::load_or_create(dir, td).unwrap()
    }

    fn configs(ca: &BuiltinCa, ns: &str, sa: &str) -> TlsConfigs {
        let issued = ca
            .issue(
                &Identity::new(ca.trust_domain(), ns, sa),
                DEFAULT_CERT_VALIDITY,
            )
            .unwrap();
        build_tls_configs(&issued.to_workload_cert().unwrap()).unwrap()
    }

    fn expired_configs(ca: &BuiltinCa, ns: &str, sa: &str) -> TlsConfigs {
        let now = SystemTime::now();
        let day = Duration::from_secs(86400);
        let issued = ca
            .issue_with_validity(
                &Identity::new(ca.trust_domain(), ns, sa),
                now - 2 * day,
                now - day,
            )
            .unwrap();
        build_tls_configs(&issued.to_workload_cert().unwrap()).unwrap()
    }

    /// What happened when a client and a server talked in memory: the
    /// handshake, then "ping" from the client and "pong" back.
    struct Exchange {
        client: Connection,
        server: Connection,
        client_error: Option<rustls::Error>,
        server_error: Option<rustls::Error>,
        server_got_ping: bool,
        client_got_pong: bool,
    }

    fn exchange(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Exchange {
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let mut x = Exchange {
            client: rustls::ClientConnection::new(client, name).unwrap().into(),
            server: rustls::ServerConnection::new(server).unwrap().into(),
            client_error: None,
            server_error: None,
            server_got_ping: false,
            client_got_pong: false,
        };
        x.client.writer().write_all(b"ping").unwrap();
        for _ in 0..10 {
            pump(&mut x.client, &mut x.server, &mut x.server_error);
            if x.server_error.is_none() && !x.server.is_handshaking() && !x.server_got_ping {
                let mut buf = [0u8; 16];
                if let Ok(n) = x.server.reader().read(&mut buf) {
                    assert_eq!(&buf[..n], b"ping");
                    x.server_got_ping = true;
                    x.server.writer().write_all(b"pong").unwrap();
                }
            }
            pump(&mut x.server, &mut x.client, &mut x.client_error);
            if x.client_error.is_none() && !x.client.is_handshaking() {
                let mut buf = [0u8; 16];
                if let Ok(n) = x.client.reader().read(&mut buf) {
                    assert_eq!(&buf[..n], b"pong");
                    x.client_got_pong = true;
                    break;
                }
            }
        }
        x
    }

    /// Moves all pending TLS bytes from `from` to `to` (unless `to` already
    /// failed) and lets `to` process them.
    fn pump(from: &mut Connection, to: &mut Connection, to_error: &mut Option<rustls::Error>) {
        let mut bytes = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut bytes).unwrap();
        }
        let mut rest = &bytes[..];
        while to_error.is_none() && !rest.is_empty() {
            to.read_tls(&mut rest).unwrap();
            if let Err(e) = to.process_new_packets() {
                *to_error = Some(e);
            }
        }
    }

    fn assert_rejected(
        x: &Exchange,
        failing: &str,
        local: impl Fn(&rustls::Error) -> bool,
        alert: AlertDescription,
    ) {
        let (err, other_err) = match failing {
            "server" => (&x.server_error, &x.client_error),
            _ => (&x.client_error, &x.server_error),
        };
        let err = err
            .as_ref()
            .unwrap_or_else(|| panic!("{failing} must fail"));
        assert!(local(err), "{failing} failed with {err:?}");
        assert_eq!(
            other_err.as_ref(),
            Some(&rustls::Error::AlertReceived(alert)),
            "the peer learns why"
        );
        assert!(!x.client_got_pong, "no application data after a rejection");
    }

    #[test]
    fn mutual_tls_handshake_and_peer_identities() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let server = configs(&ca, "shop", "server");
        let client = configs(&ca, "web", "client");
        let x = exchange(client.client.clone(), server.server.clone());
        assert!(
            x.client_error.is_none() && x.server_error.is_none(),
            "{:?} / {:?}",
            x.client_error,
            x.server_error
        );
        assert!(x.server_got_ping && x.client_got_pong);

        for conn in [&x.client, &x.server] {
            assert_eq!(conn.alpn_protocol(), Some(ALPN_H2));
            assert_eq!(conn.protocol_version(), Some(ProtocolVersion::TLSv1_3));
            let suite = conn.negotiated_cipher_suite().unwrap().suite();
            assert!(
                [
                    rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
                    rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
                ]
                .contains(&suite),
                "{suite:?}"
            );
        }
        let seen_by_client = peer_identity(x.client.peer_certificates().unwrap()).unwrap();
        let seen_by_server = peer_identity(x.server.peer_certificates().unwrap()).unwrap();
        assert_eq!(seen_by_client, Identity::new(TD, "shop", "server"));
        assert_eq!(seen_by_server, Identity::new(TD, "web", "client"));
        assert_eq!(server.identity, seen_by_client);

        let certs = x.client.peer_certificates().unwrap();
        expect_peer_identity(certs, &server.identity).unwrap();
        let err = expect_peer_identity(certs, &Identity::new(TD, "shop", "other")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "certificate is for spiffe://cluster.local/ns/shop/sa/server, \
             expected spiffe://cluster.local/ns/shop/sa/other"
        );
        assert!(matches!(
            peer_identity(&[]),
            Err(TlsError::NoPeerCertificate)
        ));
    }

    #[test]
    fn configs_are_tls13_only_without_resumption_or_sni() {
        let tmp = tempfile::tempdir().unwrap();
        let c = configs(&ca(tmp.path(), TD), "a", "b");
        assert_eq!(c.client.alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(c.server.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(!c.client.enable_sni);
        assert_eq!(c.server.send_tls13_tickets, 0);
        assert!(!c.server.session_storage.can_cache());
        assert!(!c.server.ticketer.enabled());
        let provider = c.client.crypto_provider();
        let suites: Vec<_> = provider.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(
            suites,
            [
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
            ]
        );
        assert!(Arc::ptr_eq(provider, c.server.crypto_provider()));
        assert!(c.not_after > SystemTime::now() + Duration::from_secs(23 * 3600));
    }

    #[test]
    fn server_rejects_client_from_a_foreign_trust_domain() {
        let tmp = tempfile::tempdir().unwrap();
        let ours = ca(tmp.path(), TD);
        // Same root and key, signing for another trust domain.
        let foreign = ca(tmp.path(), "other.domain");
        let server = configs(&ours, "shop", "server");
        let client = configs(&foreign, "web", "client");
        let x = exchange(client.client.clone(), server.server.clone());
        assert_rejected(
            &x,
            "server",
            |e| {
                e.to_string().contains(
                    "peer spiffe://other.domain/ns/web/sa/client is not in our trust domain \"cluster.local\"",
                )
            },
            AlertDescription::CertificateUnknown,
        );
        // And the other way round. Our client's verifier had nothing against
        // the foreign server's certificate (which server identity is right is
        // the caller's check): it only reports the server's alert.
        let x = exchange(server.client.clone(), client.server.clone());
        assert_rejected(
            &x,
            "server",
            |e| {
                e.to_string()
                    .contains("is not in our trust domain \"other.domain\"")
            },
            AlertDescription::CertificateUnknown,
        );
    }

    #[test]
    fn untrusted_roots_are_rejected_on_both_sides() {
        let tmp = tempfile::tempdir().unwrap();
        let ours = ca(&tmp.path().join("ours"), TD);
        let stranger = ca(&tmp.path().join("stranger"), TD);
        let good = configs(&ours, "shop", "server");
        let rogue = configs(&stranger, "shop", "server");
        // Both generated roots carry the same subject, so webpki may find the
        // stranger's issuer by name and fail on its signature instead.
        let untrusted = |e: &rustls::Error| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer | CertificateError::BadSignature
                )
            )
        };
        let alert = |x: &Exchange, side: &str| {
            let err = if side == "server" {
                &x.client_error
            } else {
                &x.server_error
            };
            match err {
                Some(rustls::Error::AlertReceived(a)) => *a,
                other => panic!("expected an alert, got {other:?}"),
            }
        };

        // A client that trusts our root but holds a certificate from the
        // stranger's: the server refuses it.
        let issued = stranger
            .issue(&Identity::new(TD, "web", "client"), DEFAULT_CERT_VALIDITY)
            .unwrap();
        let rogue_client = WorkloadCert::from_pem(
            &issued.key_pem,
            &issued.chain_pem.concat(),
            ours.roots_pem(),
        )
        .unwrap();
        let rogue_client = build_tls_configs(&rogue_client).unwrap();
        let x = exchange(rogue_client.client.clone(), good.server.clone());
        let err = x.server_error.as_ref().expect("server must fail");
        assert!(untrusted(err), "{err:?}");
        assert!(
            [AlertDescription::UnknownCA, AlertDescription::DecryptError]
                .contains(&alert(&x, "server"))
        );
        assert!(!x.client_got_pong);

        // Our client facing a server from the stranger's root.
        let x = exchange(good.client.clone(), rogue.server.clone());
        let err = x.client_error.as_ref().expect("client must fail");
        assert!(untrusted(err), "{err:?}");
        assert!(x.server_error.is_some());
        assert!(!x.client_got_pong);
    }

    #[test]
    fn expired_certificates_are_rejected_on_both_sides() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let good = configs(&ca, "shop", "server");
        let old = expired_configs(&ca, "web", "client");
        let expired = |e: &rustls::Error| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. }
                )
            )
        };
        let x = exchange(old.client.clone(), good.server.clone());
        assert_rejected(&x, "server", expired, AlertDescription::CertificateExpired);
        let x = exchange(good.client.clone(), old.server.clone());
        assert_rejected(&x, "client", expired, AlertDescription::CertificateExpired);
    }

    #[derive(Debug)]
    struct NoClientCert;

    impl ResolvesClientCert for NoClientCert {
        fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
            None
        }
        fn has_certs(&self) -> bool {
            false
        }
    }

    #[test]
    fn server_requires_a_client_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let server = configs(&ca, "shop", "server");
        let mut anonymous = (*configs(&ca, "web", "client").client).clone();
        anonymous.client_auth_cert_resolver = Arc::new(NoClientCert);
        let x = exchange(Arc::new(anonymous), server.server.clone());
        assert_rejected(
            &x,
            "server",
            |e| *e == rustls::Error::NoCertificatesPresented,
            AlertDescription::CertificateRequired,
        );
    }

    fn other_client(
        suites: Vec<rustls::SupportedCipherSuite>,
        versions: &[&'static rustls::SupportedProtocolVersion],
        ca: &BuiltinCa,
    ) -> Arc<ClientConfig> {
        let provider = Arc::new(CryptoProvider {
            cipher_suites: suites,
            ..rustls::crypto::ring::default_provider()
        });
        let issued = ca
            .issue(&Identity::new(TD, "web", "client"), DEFAULT_CERT_VALIDITY)
            .unwrap();
        let cert = issued.to_workload_cert().unwrap();
        let verifier = Arc::new(SpiffeServerVerifier {
            roots: cert.roots.clone(),
            algorithms: provider.signature_verification_algorithms,
            crls: CrlStore::new(),
        });
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(cert.chain.clone(), cert.key.clone_key())
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }

    #[test]
    fn server_rejects_tls12_and_other_suites() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let server = configs(&ca, "shop", "server");
        let ring = rustls::crypto::ring::default_provider();

        let tls12 = other_client(ring.cipher_suites.clone(), &[&rustls::version::TLS12], &ca);
        let x = exchange(tls12, server.server.clone());
        assert_rejected(
            &x,
            "server",
            |e| matches!(e, rustls::Error::PeerIncompatible(_)),
            AlertDescription::ProtocolVersion,
        );

        let chacha = other_client(
            vec![rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256],
            &[&rustls::version::TLS13],
            &ca,
        );
        let x = exchange(chacha, server.server.clone());
        assert_rejected(
            &x,
            "server",
            |e| matches!(e, rustls::Error::PeerIncompatible(_)),
            AlertDescription::HandshakeFailure,
        );
    }

    /// With ztunnel's TLS12_ENABLED, a TLS 1.2 peer is served (over one of
    /// the four ECDHE AES-GCM suites) and two such configs still agree on
    /// TLS 1.3.
    #[test]
    fn tls12_enabled_serves_a_tls12_peer_and_prefers_tls13() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let issued = |sa: &str| {
            let cert = ca
                .issue(&Identity::new(TD, "shop", sa), DEFAULT_CERT_VALIDITY)
                .unwrap();
            build_tls_configs_with(
                &cert.to_workload_cert().unwrap(),
                crate::security::pki::crypto_provider_with_tls12(),
            )
            .unwrap()
        };
        let server = issued("server");
        let ring = rustls::crypto::ring::default_provider();
        let tls12 = other_client(ring.cipher_suites.clone(), &[&rustls::version::TLS12], &ca);
        let x = exchange(tls12, server.server.clone());
        assert!(
            x.client_got_pong,
            "{:?} {:?}",
            x.client_error, x.server_error
        );
        assert_eq!(x.server.protocol_version(), Some(ProtocolVersion::TLSv1_2));

        let x = exchange(issued("client").client.clone(), server.server.clone());
        assert!(
            x.client_got_pong,
            "{:?} {:?}",
            x.client_error, x.server_error
        );
        assert_eq!(x.server.protocol_version(), Some(ProtocolVersion::TLSv1_3));
    }

    #[test]
    fn client_rejects_server_without_spiffe_id() {
        // A server certificate from our root whose only SAN is a DNS name.
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let client = configs(&ca, "web", "client");
        let key = std::fs::read_to_string(tmp.path().join("ca-key.pem")).unwrap();
        let key = rcgen::KeyPair::from_pem(&key).unwrap();
        let root_pem = std::fs::read_to_string(tmp.path().join("ca-cert.pem")).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&root_pem, key).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["server.example".to_owned()]).unwrap();
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2090, 1, 1);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = params.signed_by(&leaf_key, &issuer).unwrap();
        let cert = WorkloadCert::from_pem(&leaf_key.serialize_pem(), &leaf.pem(), &root_pem);
        assert!(matches!(cert, Err(TlsError::NoSpiffeId)), "{cert:?}");
        assert!(matches!(
            peer_identity(&[leaf.der().clone()]),
            Err(TlsError::NoSpiffeId)
        ));

        let server = ServerConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes()).unwrap(),
            )
            .unwrap();
        let x = exchange(client.client.clone(), Arc::new(server));
        assert_rejected(
            &x,
            "client",
            |e| e.to_string().contains("no spiffe:// URI SAN"),
            AlertDescription::CertificateUnknown,
        );
    }

    #[test]
    fn from_pem_reports_what_is_wrong() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = ca(tmp.path(), TD);
        let issued = ca
            .issue(&Identity::new(TD, "a", "b"), DEFAULT_CERT_VALIDITY)
            .unwrap();
        let chain = issued.chain_pem.concat();
        let err = WorkloadCert::from_pem(&issued.key_pem, "", &issued.root_pem).unwrap_err();
        assert_eq!(err.to_string(), "no certificate in the certificate chain");
        let err = WorkloadCert::from_pem(&chain, &chain, &issued.root_pem).unwrap_err();
        assert!(
            err.to_string().starts_with("bad PEM in the private key"),
            "{err}"
        );
        let err = WorkloadCert::from_pem(&issued.key_pem, &chain, "junk").unwrap_err();
        assert_eq!(err.to_string(), "no certificate in the root certificates");

        // A key that isn't the leaf's is caught when the configs are built.
        let other = ca
            .issue(&Identity::new(TD, "a", "b"), DEFAULT_CERT_VALIDITY)
            .unwrap();
        let mixed = WorkloadCert::from_pem(&other.key_pem, &chain, &issued.root_pem).unwrap();
        assert!(build_tls_configs(&mixed).is_err());

        let mut lying = issued.clone();
        lying.identity = Identity::new(TD, "a", "c");
        let err = lying.to_workload_cert().unwrap_err();
        assert!(matches!(err, TlsError::IdentityMismatch { .. }), "{err:?}");
    }

    mod revocation {
        use super::*;
        use crate::security::ca::serial_of;
        use crate::security::crl::{CrlError, CrlSet};

        /// Configs for `ns/sa` that check the revocation lists in `store`,
        /// and the serial of their certificate.
        fn revocable(
            ca: &BuiltinCa,
            ns: &str,
            sa: &str,
            store: &Arc<CrlStore>,
        ) -> (TlsConfigs, Vec<u8>) {
            let issued = ca
                .issue(&Identity::new(TD, ns, sa), DEFAULT_CERT_VALIDITY)
                .unwrap();
            let serial = serial_of(issued.leaf_pem()).unwrap();
            let configs = build_tls_configs_with_crls(
                &issued.to_workload_cert().unwrap(),
                crypto_provider(),
                store.clone(),
            )
            .unwrap();
            (configs, serial)
        }

        fn install(ca: &BuiltinCa, store: &CrlStore, revoked: &[Vec<u8>]) {
            let pem = ca.issue_crl(revoked, 1, Duration::from_secs(3600)).unwrap();
            let set = CrlSet::parse(pem.into_bytes(), ca.roots()).unwrap();
            assert_eq!(set.revoked(), revoked.len());
            assert!(set.unverified_issuers().is_empty() && set.stale_issuers().is_empty());
            store.install(set);
        }

        fn ok(x: &Exchange) -> bool {
            x.client_error.is_none() && x.server_error.is_none() && x.client_got_pong
        }

        fn revoked(e: &rustls::Error) -> bool {
            *e == rustls::Error::InvalidCertificate(CertificateError::Revoked)
        }

        #[test]
        fn revoked_peers_are_refused_in_both_directions() {
            let tmp = tempfile::tempdir().unwrap();
            let ca = ca(tmp.path(), TD);
            let store = CrlStore::new();
            let (server, server_serial) = revocable(&ca, "shop", "server", &store);
            let (client, client_serial) = revocable(&ca, "web", "client", &store);
            let (other, _) = revocable(&ca, "web", "other", &store);
            assert!(ok(&exchange(client.client.clone(), server.server.clone())));

            // The client's certificate revoked: the server refuses it.
            install(&ca, &store, std::slice::from_ref(&client_serial));
            let x = exchange(client.client.clone(), server.server.clone());
            assert_rejected(&x, "server", revoked, AlertDescription::CertificateRevoked);
            assert!(
                ok(&exchange(other.client.clone(), server.server.clone())),
                "a certificate not on the CRL is accepted"
            );
            // The revoked client still accepts a good server's certificate:
            // its own revocation is not its verifier's business.
            assert_eq!(store.stats().refused_inbound, 1);
            assert_eq!(store.stats().refused_outbound, 0);

            // The server's certificate revoked: the client refuses it.
            install(&ca, &store, &[server_serial]);
            let x = exchange(other.client.clone(), server.server.clone());
            assert_rejected(&x, "client", revoked, AlertDescription::CertificateRevoked);
            assert!(
                ok(&exchange(client.client.clone(), other.server.clone())),
                "a new CRL replaces the old one: the client is no longer revoked"
            );
            let stats = store.stats();
            assert_eq!((stats.refused_inbound, stats.refused_outbound), (1, 1));
            assert_eq!((stats.reloads_ok, stats.crls, stats.revoked), (2, 1, 1));
            assert!(stats.last_reload > 0);
        }

        #[test]
        fn certificates_from_an_issuer_without_a_crl_are_accepted() {
            let tmp = tempfile::tempdir().unwrap();
            let ours = ca(&tmp.path().join("ours"), TD);
            let other = ca(&tmp.path().join("other"), TD);
            let store = CrlStore::new();
            let (server, _) = revocable(&ours, "shop", "server", &store);
            let (client, _) = revocable(&ours, "web", "client", &store);
            // A CRL from another CA (same subject name, other key), loaded
            // without knowing that CA: it names our root as issuer, so at
            // the handshake its signature fails against our root's key and
            // the handshake is refused (closed), as a forged CRL must be.
            let forged = other.issue_crl(&[], 1, Duration::from_secs(3600)).unwrap();
            let set = CrlSet::parse(forged.clone().into_bytes(), &[]).unwrap();
            assert_eq!(set.unverified_issuers().len(), 1);
            store.install(set);
            // (The client, sharing the store, refuses first: the server's
            // certificate comes from the same root.)
            let x = exchange(client.client.clone(), server.server.clone());
            let err = x.client_error.as_ref().expect("client must refuse");
            assert_eq!(
                *err,
                rustls::Error::InvalidCertRevocationList(
                    rustls::CertRevocationListError::BadSignature
                )
            );
            // Known at load, the same CRL is refused there.
            let err = CrlSet::parse(forged.into_bytes(), ours.roots()).unwrap_err();
            assert!(
                matches!(err, CrlError::BadSignature { index: 0, .. }),
                "{err:?}"
            );
            assert!(
                err.to_string()
                    .contains("does not verify with the issuer's key"),
                "{err}"
            );

            // A CRL whose issuer is in no chain we see changes nothing.
            let mut params = rcgen::CertificateParams::default();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "elsewhere");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().unwrap();
            let issuer = rcgen::Issuer::new(params, key);
            let now = time::OffsetDateTime::now_utc();
            let crl = rcgen::CertificateRevocationListParams {
                this_update: now,
                next_update: now + time::Duration::hours(1),
                crl_number: rcgen::SerialNumber::from(7u64),
                issuing_distribution_point: None,
                revoked_certs: vec![],
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            }
            .signed_by(&issuer)
            .unwrap();
            store.install(CrlSet::parse(crl.der().to_vec(), ours.roots()).unwrap());
            assert!(ok(&exchange(client.client.clone(), server.server.clone())));
        }

        #[test]
        fn one_file_holds_several_crls_pem_or_der() {
            let tmp = tempfile::tempdir().unwrap();
            let a = ca(&tmp.path().join("a"), TD);
            let b = ca(&tmp.path().join("b"), "b.domain");
            let pa = a
                .issue_crl(&[vec![1, 2, 3]], 1, Duration::from_secs(60))
                .unwrap();
            let pb = b
                .issue_crl(&[vec![4], vec![5]], 2, Duration::from_secs(60))
                .unwrap();
            let set = CrlSet::parse(format!("{pa}\n{pb}").into_bytes(), &[]).unwrap();
            assert_eq!((set.len(), set.revoked()), (2, 3));
            let der = |p: &str| {
                rustls::pki_types::CertificateRevocationListDer::from_pem_slice(p.as_bytes())
                    .unwrap()
            };
            let mut both = der(&pa).to_vec();
            both.extend_from_slice(&der(&pb));
            let set = CrlSet::parse(both.clone(), &[]).unwrap();
            assert_eq!((set.len(), set.revoked()), (2, 3));
            both.truncate(both.len() - 1);
            assert!(matches!(
                CrlSet::parse(both, &[]),
                Err(CrlError::Parse { index: 1, .. })
            ));
        }
    }
}
