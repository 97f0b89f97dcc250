//! Low-level X.509 and PEM helpers that both the certificate authority and
//! the TLS configs need: reading certificates out of PEM, trust stores,
//! chain verification, validity periods, writing DER back as PEM, and the
//! one crypto provider everything verifies and handshakes with.
//!
//! It knows nothing about identities, CAs or TLS configs, so everything that
//! handles certificates can use it without depending on each other.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use x509_parser::certificate::X509Certificate;

/// Why certificates could not be read or trusted.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("bad PEM in the {what}: {detail}")]
    Pem { what: &'static str, detail: String },
    #[error("no certificate in the {0}")]
    NoCertificate(&'static str),
    #[error("invalid root certificate: {0}")]
    BadRoot(String),
}

/// ring with only the two TLS 1.3 AES-GCM suites ztunnel allows; key exchange
/// groups are ring's defaults. Built once.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let ring = rustls::crypto::ring::default_provider();
            Arc::new(CryptoProvider {
                cipher_suites: vec![
                    rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
                    rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
                ],
                ..ring
            })
        })
        .clone()
}

/// [`crypto_provider`] with the four ECDHE AES-GCM TLS 1.2 suites added:
/// what HBONE uses with ztunnel's `TLS12_ENABLED=true`, for peers that
/// cannot speak TLS 1.3. Configs built on it offer and accept both
/// versions, TLS 1.3 first.
pub fn crypto_provider_with_tls12() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            use rustls::crypto::ring::cipher_suite as suite;
            let mut provider = (*crypto_provider()).clone();
            provider.cipher_suites.extend([
                suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ]);
            Arc::new(provider)
        })
        .clone()
}

/// Every certificate in `pem` (other PEM sections are skipped); at least one.
pub fn parse_certs(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Pem {
            what,
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(PkiError::NoCertificate(what));
    }
    Ok(certs)
}

/// A trust store of `certs`.
pub fn root_store(
    certs: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    for root in certs {
        roots
            .add(root)
            .map_err(|e| PkiError::BadRoot(e.to_string()))?;
    }
    Ok(roots)
}

/// Verifies `chain` (leaf first) up to `roots` now, as a server certificate,
/// with the same code the TLS client verifier uses.
pub(crate) fn verify_chain(
    chain: &[CertificateDer<'_>],
    roots: &RootCertStore,
) -> Result<(), rustls::Error> {
    let leaf = ParsedCertificate::try_from(&chain[0])?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &leaf,
        roots,
        &chain[1..],
        UnixTime::now(),
        crypto_provider().signature_verification_algorithms.all,
    )
}

/// `(not_before, not_after)` of `cert`.
pub(crate) fn validity_of(cert: &X509Certificate<'_>) -> (SystemTime, SystemTime) {
    let v = cert.validity();
    (
        unix_to_system(v.not_before.timestamp()),
        unix_to_system(v.not_after.timestamp()),
    )
}

fn unix_to_system(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// `der` as one PEM section labelled `label`, with LF line endings.
pub(crate) fn der_to_pem(label: &str, der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new(label, der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}
