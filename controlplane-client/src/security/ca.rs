//! The built-in certificate authority: signs workload certificates locally
//! when no external CA (istiod) is configured.
//!
//! It keeps its material in Istio's "plugged-in CA" layout
//! (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`), so a
//! directory made for istiod works here, and a directory generated here can be
//! copied to other nodes (or handed to istiod) to share one root.
//!
//! Leaf certificates follow what istiod issues: a fresh EC P-256 key, an empty
//! subject, one URI SAN carrying the SPIFFE ID, serverAuth + clientAuth.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use crate::model::identity::{Identity, IdentityError};
use crate::security::pki::{self, der_to_pem, validity_of};
use crate::security::tls::{TlsError, WorkloadCert};

/// Lifetime of an issued workload certificate unless told otherwise (as
/// istiod's `SECRET_TTL`).
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
/// How far back `not_before` is set, so a peer whose clock runs a little
/// behind still accepts a fresh certificate.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(60);
/// Lifetime of a generated root.
pub const ROOT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The signing certificate (a root or an intermediate).
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The signing certificate's private key.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The trust anchor(s) every workload gets.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// `ca-cert.pem` followed by its issuers up to the root.
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
const CA_FILES: [&str; 4] = [CA_CERT_FILE, CA_KEY_FILE, ROOT_CERT_FILE, CERT_CHAIN_FILE];

/// Files [`write_issued`] produces.
pub const ISSUED_KEY_FILE: &str = "key.pem";
pub const ISSUED_CERT_FILE: &str = "cert.pem";
pub const ISSUED_CHAIN_FILE: &str = "cert-chain.pem";
pub const ISSUED_ROOT_FILE: &str = "root-cert.pem";

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{}: incomplete CA directory: found {present:?} but not {missing:?}; \
         it must hold all of {CA_FILES:?} (to be loaded) or none of them (to generate a new root)",
        dir.display()
    )]
    PartialLayout {
        dir: PathBuf,
        present: Vec<&'static str>,
        missing: Vec<&'static str>,
    },
    /// A CA file exists but its content is unusable.
    #[error("{}: {reason}", path.display())]
    BadFile { path: PathBuf, reason: String },
    #[error("{}: the CA's files do not fit together: {reason}", dir.display())]
    InconsistentChain { dir: PathBuf, reason: String },
    #[error("invalid trust domain {0:?} for the CA: {1}")]
    TrustDomain(String, IdentityError),
    #[error("refusing to sign {identity}: {source}")]
    Identity {
        identity: String,
        source: IdentityError,
    },
    #[error("this CA signs for trust domain {ca:?}, refusing {identity}")]
    ForeignTrustDomain { ca: String, identity: Identity },
    #[error("invalid certificate validity: {0}")]
    Validity(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid certificate signing request: {0}")]
    Csr(String),
}

/// A workload certificate fresh from the CA, in PEM.
#[derive(Clone)]
pub struct IssuedCert {
    pub identity: Identity,
    /// PKCS#8 "PRIVATE KEY".
    pub key_pem: String,
    /// The leaf first, then the intermediates up to (not including) the root.
    pub chain_pem: Vec<String>,
    /// The trust anchor(s), possibly several concatenated certificates.
    pub root_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl IssuedCert {
    /// The leaf certificate alone.
    pub fn leaf_pem(&self) -> &str {
        &self.chain_pem[0]
    }

    /// Parsed for [`build_tls_configs`](crate::security::tls::build_tls_configs); the
    /// leaf must carry the identity it was issued for.
    pub fn to_workload_cert(&self) -> Result<WorkloadCert, TlsError> {
        let cert = WorkloadCert::from_pem(&self.key_pem, &self.chain_pem.concat(), &self.root_pem)?;
        if *cert.identity() != self.identity {
            return Err(TlsError::IdentityMismatch {
                expected: Box::new(self.identity.clone()),
                actual: Box::new(cert.identity().clone()),
            });
        }
        Ok(cert)
    }
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("identity", &self.identity.to_string())
            .field("key_pem", &"<redacted>")
            .field("chain_len", &self.chain_pem.len())
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// A loaded CA, ready to sign. Loading checks that the files fit together, so
/// every certificate it issues verifies up to its roots.
pub struct BuiltinCa {
    dir: PathBuf,
    trust_domain: String,
    issuer: Issuer<'static, KeyPair>,
    /// What follows a leaf in its chain: `ca-cert.pem` and its issuers,
    /// without the root.
    intermediates_pem: Vec<String>,
    roots_pem: String,
    roots: Vec<CertificateDer<'static>>,
    ca_not_after: SystemTime,
}

impl fmt::Debug for BuiltinCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltinCa")
            .field("dir", &self.dir)
            .field("trust_domain", &self.trust_domain)
            .field("intermediates", &self.intermediates_pem.len())
            .field("roots", &self.roots.len())
            .field("ca_not_after", &self.ca_not_after)
            .finish_non_exhaustive()
    }
}

impl BuiltinCa {
    /// Loads the CA in `dir` (Istio's cacerts layout), or, when `dir` is
    /// missing or holds none of the four files, generates a self-signed
    /// P-256 root there (directory 0700, key 0600) and loads that. A
    /// directory with only some of the files is an error and is left alone.
    ///
    /// `trust_domain` is the one trust domain this CA will sign identities in.
    pub fn load_or_create(dir: &Path, trust_domain: &str) -> Result<BuiltinCa, CaError> {
        Identity::new(trust_domain, "ns", "sa")
            .validate()
            .map_err(|e| CaError::TrustDomain(trust_domain.to_owned(), e))?;
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for name in CA_FILES {
            let path = dir.join(name);
            match path.try_exists() {
                Ok(true) => present.push(name),
                Ok(false) => missing.push(name),
                Err(source) => return Err(CaError::Io { path, source }),
            }
        }
        if present.is_empty() {
            generate_root(dir)?;
            tracing::info!(dir = %dir.display(), "generated a new self-signed root CA");
        } else if !missing.is_empty() {
            return Err(CaError::PartialLayout {
                dir: dir.to_owned(),
                present,
                missing,
            });
        }
        BuiltinCa::load(dir, trust_domain)
    }

    fn load(dir: &Path, trust_domain: &str) -> Result<BuiltinCa, CaError> {
        let ca_cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let root_path = dir.join(ROOT_CERT_FILE);
        let chain_path = dir.join(CERT_CHAIN_FILE);
        let bad = |path: &Path, reason: String| CaError::BadFile {
            path: path.to_owned(),
            reason,
        };

        let ca_certs = read_certs(&ca_cert_path)?;
        let [ca_der] = <[_; 1]>::try_from(ca_certs).map_err(|certs| {
            bad(
                &ca_cert_path,
                format!("expected exactly one certificate, found {}", certs.len()),
            )
        })?;
        let roots = read_certs(&root_path)?;
        let chain = read_certs(&chain_path)?;
        let key = read_key(&key_path)?;

        // The signing certificate itself.
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der)
            .map_err(|e| bad(&ca_cert_path, format!("unparsable certificate: {e}")))?;
        if !ca.is_ca() {
            return Err(bad(
                &ca_cert_path,
                "not a CA certificate (basicConstraints CA:TRUE is missing)".into(),
            ));
        }
        if let Ok(Some(usage)) = ca.key_usage() {
            if !usage.value.key_cert_sign() {
                return Err(bad(
                    &ca_cert_path,
                    "its key usage does not allow signing certificates (keyCertSign)".into(),
                ));
            }
        }
        let (_, ca_not_after) = validity_of(&ca);
        if ca_not_after <= SystemTime::now() {
            return Err(bad(
                &ca_cert_path,
                format!("the CA certificate expired at {}", ca.validity().not_after),
            ));
        }
        if ca.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(bad(
                &key_path,
                format!("this key does not belong to the certificate in {CA_CERT_FILE}"),
            ));
        }

        // cert-chain.pem = ca-cert, then its issuers; roots are not repeated
        // in the leaf chains we hand out.
        if chain.first() != Some(&ca_der) {
            return Err(bad(
                &chain_path,
                format!("must start with the certificate in {CA_CERT_FILE}"),
            ));
        }
        for root in &roots {
            let parsed = x509_parser::parse_x509_certificate(root)
                .map_err(|e| bad(&root_path, format!("unparsable certificate: {e}")))?
                .1;
            if !parsed.is_ca() {
                return Err(bad(&root_path, "a root is not a CA certificate".into()));
            }
        }
        let intermediates_pem: Vec<String> = chain
            .iter()
            .filter(|c| !roots.contains(c))
            .map(|c| der_to_pem("CERTIFICATE", c))
            .collect();

        let issuer = Issuer::from_ca_cert_der(&ca_der, key)
            .map_err(|e| bad(&ca_cert_path, format!("cannot sign with it: {e}")))?;
        let roots_pem = roots.iter().map(|c| der_to_pem("CERTIFICATE", c)).collect();
        let ca = BuiltinCa {
            dir: dir.to_owned(),
            trust_domain: trust_domain.to_owned(),
            issuer,
            intermediates_pem,
            roots_pem,
            roots,
            ca_not_after,
        };

        // The proof that the files fit together: a certificate we sign now
        // must verify up to the roots through cert-chain.pem.
        let probe = ca.issue(
            &Identity::new(trust_domain, "ringway-system", "ca-self-check"),
            Duration::from_secs(300),
        )?;
        verify_issued(&probe).map_err(|reason| CaError::InconsistentChain {
            dir: dir.to_owned(),
            reason: format!(
                "a certificate signed with {CA_CERT_FILE} does not verify up to \
                 {ROOT_CERT_FILE} through {CERT_CHAIN_FILE}: {reason}"
            ),
        })?;
        Ok(ca)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The trust anchors as PEM (what goes into `root-cert.pem`).
    pub fn roots_pem(&self) -> &str {
        &self.roots_pem
    }

    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// When the signing certificate expires.
    /// The roots, then the signing certificate and its issuers below the
    /// roots: every CA certificate in this CA's chains, which a CRL from
    /// one of them must verify against.
    pub fn ca_certs(&self) -> Vec<CertificateDer<'static>> {
        let mut certs = self.roots.clone();
        for pem in &self.intermediates_pem {
            certs.extend(pki::parse_certs(pem, "intermediate").unwrap_or_default());
        }
        certs
    }

    pub fn ca_not_after(&self) -> SystemTime {
        self.ca_not_after
    }

    /// Signs a fresh key for `id`, valid from a minute ago
    /// ([`CLOCK_SKEW_ALLOWANCE`]) until `validity` from now.
    pub fn issue(&self, id: &Identity, validity: Duration) -> Result<IssuedCert, CaError> {
        let (not_before, not_after) = validity_from_now(validity)?;
        self.issue_with_validity(id, not_before, not_after)
    }

    /// Like [`issue`](Self::issue) with explicit bounds (rounded down to whole
    /// seconds, as X.509 stores them); they may lie in the past.
    pub fn issue_with_validity(
        &self,
        id: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedCert, CaError> {
        let (params, not_before, not_after) = self.leaf_params(id, not_before, not_after)?;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let leaf = params.signed_by(&key, &self.issuer)?;
        let mut chain_pem = Vec::with_capacity(1 + self.intermediates_pem.len());
        chain_pem.push(leaf.pem());
        chain_pem.extend(self.intermediates_pem.iter().cloned());
        Ok(IssuedCert {
            identity: id.clone(),
            key_pem: key.serialize_pem(),
            chain_pem,
            root_pem: self.roots_pem.clone(),
            not_before,
            not_after,
        })
    }

    /// A CRL signed by this CA's signing certificate (`ca-cert.pem`),
    /// revoking the certificates with the given serial numbers (big-endian
    /// bytes, as [`serial_of`] returns them), valid from now for `validity`.
    /// PEM. The signing certificate must allow `cRLSign` if it lists key
    /// usages (the generated root does).
    pub fn issue_crl(
        &self,
        revoked: &[Vec<u8>],
        crl_number: u64,
        validity: Duration,
    ) -> Result<String, CaError> {
        let (this_update, next_update) = validity_from_now(validity)?;
        let (_, this_update) = to_x509_time(this_update)?;
        let (_, next_update) = to_x509_time(next_update)?;
        let params = rcgen::CertificateRevocationListParams {
            this_update,
            next_update,
            crl_number: SerialNumber::from_slice(&crl_number.to_be_bytes()),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|serial| rcgen::RevokedCertParams {
                    serial_number: SerialNumber::from_slice(serial),
                    revocation_time: this_update,
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.pem()?)
    }

    /// Signs a workload's PKCS#10 request (PEM), as istiod's
    /// `CreateCertificate` does, valid from a minute ago until `validity`
    /// from now. Returns the chain the way istiod answers: the leaf first,
    /// then the intermediates, then each root as its own element.
    ///
    /// The request's signature must verify (proof that the requester holds
    /// the key), its key must be EC P-256/P-384 or RSA (2048 bits or more),
    /// and it must carry exactly one `spiffe://` URI SAN, an identity in this
    /// CA's trust domain. Nothing else from the request is used: the subject,
    /// other SANs and requested extensions are ignored, and the certificate
    /// gets the same profile as [`issue`](Self::issue).
    ///
    /// `requested`, when given, is the identity to certify instead of the
    /// request's own SAN: like istiod, which names the authenticated (or
    /// impersonated) identity and never takes the identity from the CSR.
    /// Deciding whether the caller may have it is the caller's business.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        requested: Option<&Identity>,
        validity: Duration,
    ) -> Result<Vec<String>, CaError> {
        let csr = parse_csr(csr_pem)?;
        self.check_identity(&csr.identity)?;
        let id = requested.unwrap_or(&csr.identity);
        if *id != csr.identity {
            tracing::debug!(csr = %csr.identity, signing = %id, "signing a CSR for another identity than its SAN");
        }
        let (not_before, not_after) = validity_from_now(validity)?;
        let (params, _, _) = self.leaf_params(id, not_before, not_after)?;
        let leaf = params.signed_by(&csr.key, &self.issuer)?;
        let mut chain = Vec::with_capacity(1 + self.intermediates_pem.len() + self.roots.len());
        chain.push(leaf.pem());
        chain.extend(self.intermediates_pem.iter().cloned());
        chain.extend(self.roots.iter().map(|r| der_to_pem("CERTIFICATE", r)));
        Ok(chain)
    }

    /// `id` must be a valid identity in our trust domain.
    fn check_identity(&self, id: &Identity) -> Result<(), CaError> {
        id.validate().map_err(|source| CaError::Identity {
            identity: id.to_string(),
            source,
        })?;
        if id.trust_domain != self.trust_domain {
            return Err(CaError::ForeignTrustDomain {
                ca: self.trust_domain.clone(),
                identity: id.clone(),
            });
        }
        Ok(())
    }

    /// The workload-certificate profile for `id` (checked), and the bounds
    /// as they will be stored (whole seconds).
    fn leaf_params(
        &self,
        id: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(CertificateParams, SystemTime, SystemTime), CaError> {
        self.check_identity(id)?;
        let (not_before, nb) = to_x509_time(not_before)?;
        let (not_after, na) = to_x509_time(not_after)?;
        if not_after <= not_before {
            return Err(CaError::Validity(
                "not_after must be later than not_before".into(),
            ));
        }

        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(id.to_string().try_into()?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        params.not_before = nb;
        params.not_after = na;
        Ok((params, not_before, not_after))
    }
}

/// From [`CLOCK_SKEW_ALLOWANCE`] ago until `validity` from now.
fn validity_from_now(validity: Duration) -> Result<(SystemTime, SystemTime), CaError> {
    if validity.is_zero() {
        return Err(CaError::Validity("the validity must not be zero".into()));
    }
    let now = SystemTime::now();
    let not_before = now.checked_sub(CLOCK_SKEW_ALLOWANCE).unwrap_or(now);
    let not_after = now
        .checked_add(validity)
        .ok_or_else(|| CaError::Validity(format!("{validity:?} is too long")))?;
    Ok((not_before, not_after))
}

/// What [`BuiltinCa::sign_csr`] takes from a request.
struct ParsedCsr {
    identity: Identity,
    key: CsrPublicKey,
}

/// The requester's public key, in the form rcgen signs.
struct CsrPublicKey {
    /// The subjectPublicKey bits.
    raw: Vec<u8>,
    /// Only its key-algorithm identifier is used (for the SubjectPublicKeyInfo).
    alg: &'static rcgen::SignatureAlgorithm,
}

impl rcgen::PublicKeyData for CsrPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.alg
    }
}

const MIN_RSA_BITS: usize = 2048;

/// Parses and checks a PEM PKCS#10 request; see [`BuiltinCa::sign_csr`].
fn parse_csr(csr_pem: &str) -> Result<ParsedCsr, CaError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    };
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;

    let bad = |reason: String| CaError::Csr(reason);
    let block = pem::parse(csr_pem).map_err(|e| bad(format!("bad PEM: {e}")))?;
    if !matches!(
        block.tag(),
        "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST"
    ) {
        return Err(bad(format!(
            "expected a CERTIFICATE REQUEST PEM block, found {:?}",
            block.tag()
        )));
    }
    let (_, csr) = X509CertificationRequest::from_der(block.contents())
        .map_err(|e| bad(format!("unparsable: {e}")))?;
    csr.verify_signature()
        .map_err(|e| bad(format!("its signature does not verify: {e}")))?;

    let spki = &csr.certification_request_info.subject_pki;
    let alg_oid = &spki.algorithm.algorithm;
    let alg: &'static rcgen::SignatureAlgorithm = if *alg_oid == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        match curve {
            Some(c) if c == OID_EC_P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Some(c) if c == OID_NIST_EC_P384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            other => {
                return Err(bad(format!(
                    "unsupported elliptic curve {}",
                    other.map_or_else(|| "(none)".to_owned(), |c| c.to_id_string())
                )))
            }
        }
    } else if *alg_oid == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => rsa.key_size(),
            _ => return Err(bad("unparsable RSA public key".into())),
        };
        if bits < MIN_RSA_BITS {
            return Err(bad(format!(
                "a {bits}-bit RSA key is too weak (at least {MIN_RSA_BITS})"
            )));
        }
        &rcgen::PKCS_RSA_SHA256
    } else {
        return Err(bad(format!(
            "unsupported key algorithm {} (EC P-256/P-384 or RSA)",
            alg_oid.to_id_string()
        )));
    };

    let mut spiffe = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            spiffe.extend(san.general_names.iter().filter_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some(*uri),
                _ => None,
            }));
        }
    }
    let uri = match spiffe.as_slice() {
        [one] => *one,
        [] => return Err(bad("no spiffe:// URI SAN".into())),
        many => {
            return Err(bad(format!(
                "{} spiffe:// URI SANs; exactly one is allowed",
                many.len()
            )))
        }
    };
    let identity: Identity = uri.parse().map_err(|source| CaError::Identity {
        identity: uri.to_owned(),
        source,
    })?;
    Ok(ParsedCsr {
        identity,
        key: CsrPublicKey {
            raw: spki.subject_public_key.data.to_vec(),
            alg,
        },
    })
}

/// Writes `key.pem` (0600), `cert.pem` (the leaf), `cert-chain.pem` (leaf and
/// intermediates) and `root-cert.pem` into `out`, creating it if needed and
/// replacing earlier files. The formats are what openssl, curl and Python's
/// `ssl` expect.
pub fn write_issued(cert: &IssuedCert, out: &Path) -> Result<(), CaError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(out)
        .map_err(|source| CaError::Io {
            path: out.to_owned(),
            source,
        })?;
    replace_file(&out.join(ISSUED_KEY_FILE), &cert.key_pem, 0o600)?;
    replace_file(&out.join(ISSUED_CERT_FILE), cert.leaf_pem(), 0o644)?;
    replace_file(
        &out.join(ISSUED_CHAIN_FILE),
        &cert.chain_pem.concat(),
        0o644,
    )?;
    replace_file(&out.join(ISSUED_ROOT_FILE), &cert.root_pem, 0o644)?;
    Ok(())
}

/// `ringway cert issue`: loads (or creates) the CA in `ca_dir` for the
/// identity's trust domain, signs `spiffe_id` and writes the result to
/// `out_dir` (see [`write_issued`]).
pub fn issue_to_dir(
    ca_dir: &Path,
    spiffe_id: &str,
    out_dir: &Path,
    validity: Duration,
) -> Result<IssuedCert, CaError> {
    let id: Identity = spiffe_id.parse().map_err(|source| CaError::Identity {
        identity: spiffe_id.to_owned(),
        source,
    })?;
    let ca = BuiltinCa::load_or_create(ca_dir, &id.trust_domain)?;
    let issued = ca.issue(&id, validity)?;
    write_issued(&issued, out_dir)?;
    Ok(issued)
}

fn generate_root(dir: &Path) -> Result<(), CaError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CaError::Io {
            path: dir.to_owned(),
            source,
        })?;

    let now = SystemTime::now();
    let (_, not_before) = to_x509_time(now.checked_sub(CLOCK_SKEW_ALLOWANCE).unwrap_or(now))?;
    let (_, not_after) = to_x509_time(now + ROOT_VALIDITY)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "ringway");
    dn.push(DnType::CommonName, "ringway root CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial()?);
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let root = params.self_signed(&key)?.pem();

    // The key first: if anything after it fails, the directory is left
    // partial, which the next start reports instead of overwriting.
    create_new_file(&dir.join(CA_KEY_FILE), &key.serialize_pem(), 0o600)?;
    create_new_file(&dir.join(CA_CERT_FILE), &root, 0o644)?;
    create_new_file(&dir.join(CERT_CHAIN_FILE), &root, 0o644)?;
    create_new_file(&dir.join(ROOT_CERT_FILE), &root, 0o644)?;
    Ok(())
}

/// Checks an issued chain against its roots with the same verifier the TLS
/// server uses. `Err` is a human-readable reason.
fn verify_issued(cert: &IssuedCert) -> Result<(), String> {
    let chain = pki::parse_certs(&cert.chain_pem.concat(), "certificate chain")
        .map_err(|e| e.to_string())?;
    let roots = pki::parse_certs(&cert.root_pem, "root certificates")
        .and_then(pki::root_store)
        .map_err(|e| e.to_string())?;
    pki::verify_chain(&chain, &roots).map_err(|e| e.to_string())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaError::BadFile {
            path: path.to_owned(),
            reason: format!("bad PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(CaError::BadFile {
            path: path.to_owned(),
            reason: "no CERTIFICATE found".into(),
        });
    }
    Ok(certs)
}

/// Reads a PKCS#8, PKCS#1 (RSA) or SEC1 (EC) private key. ring signs only
/// with PKCS#8, so the other two are wrapped first.
fn read_key(path: &Path) -> Result<KeyPair, CaError> {
    let bad = |reason: String| CaError::BadFile {
        path: path.to_owned(),
        reason,
    };
    let pem = read(path)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        bad(format!(
            "no usable private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY): {e}"
        ))
    })?;
    let candidates: Vec<Vec<u8>> = match &key {
        PrivateKeyDer::Pkcs8(k) => vec![k.secret_pkcs8_der().to_vec()],
        PrivateKeyDer::Pkcs1(k) => vec![pkcs8_wrap(RSA_ALGORITHM, k.secret_pkcs1_der())],
        PrivateKeyDer::Sec1(k) => [EC_P256_ALGORITHM, EC_P384_ALGORITHM]
            .iter()
            .map(|alg| pkcs8_wrap(alg, k.secret_sec1_der()))
            .collect(),
        _ => return Err(bad("unsupported private key format".into())),
    };
    candidates
        .iter()
        .find_map(|der| KeyPair::try_from(&PrivatePkcs8KeyDer::from(der.as_slice())).ok())
        .ok_or_else(|| {
            bad("unsupported key type (supported: EC P-256, EC P-384, RSA, Ed25519)".into())
        })
}

// DER AlgorithmIdentifier contents for PKCS#8 wrapping.
const RSA_ALGORITHM: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, // rsaEncryption
    0x05, 0x00, // NULL
];
const EC_P256_ALGORITHM: &[u8] = &[
    0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, // id-ecPublicKey
    0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, // prime256v1
];
const EC_P384_ALGORITHM: &[u8] = &[
    0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, // id-ecPublicKey
    0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22, // secp384r1
];

/// PrivateKeyInfo ::= SEQUENCE { version 0, AlgorithmIdentifier, OCTET STRING key }
fn pkcs8_wrap(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend(der_tlv(0x30, algorithm));
    body.extend(der_tlv(0x04, key));
    der_tlv(0x30, &body)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// 16 random bytes (well over RFC 5280's 64 bits of entropy advice), top bit
/// clear so the serial is positive without padding.
fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CaError::Validity("the system random generator failed".into()))?;
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The serial number of the first certificate in `pem` (big-endian bytes,
/// as certificates and CRLs carry it): what [`BuiltinCa::issue_crl`] takes.
pub fn serial_of(pem: &str) -> Result<Vec<u8>, CaError> {
    let bad = |reason: String| CaError::BadFile {
        path: PathBuf::from("<certificate>"),
        reason,
    };
    let der = pki::parse_certs(pem, "certificate").map_err(|e| bad(e.to_string()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der[0])
        .map_err(|e| bad(format!("unparsable certificate: {e}")))?;
    Ok(cert.raw_serial().to_vec())
}

/// Rounds down to whole seconds; returns both representations.
fn to_x509_time(t: SystemTime) -> Result<(SystemTime, OffsetDateTime), CaError> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CaError::Validity("times before 1970 are not supported".into()))?
        .as_secs();
    let odt = OffsetDateTime::from_unix_timestamp(secs as i64)
        .map_err(|e| CaError::Validity(e.to_string()))?;
    Ok((UNIX_EPOCH + Duration::from_secs(secs), odt))
}

fn read(path: &Path) -> Result<Vec<u8>, CaError> {
    fs::read(path).map_err(|source| CaError::Io {
        path: path.to_owned(),
        source,
    })
}

fn create_new_file(path: &Path, contents: &str, mode: u32) -> Result<(), CaError> {
    let io_err = |source| CaError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err)?;
    file.write_all(contents.as_bytes()).map_err(io_err)?;
    file.sync_all().map_err(io_err)
}

/// Writes next to `path` and renames over it, so readers never see a half
/// written file and an old key file never keeps looser permissions.
fn replace_file(path: &Path, contents: &str, mode: u32) -> Result<(), CaError> {
    let io_err = |source| CaError::Io {
        path: path.to_owned(),
        source,
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed `mode`; make it exact.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents.as_bytes())?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err)
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<BuiltinCa>();
    send_sync::<IssuedCert>();
    send_sync::<CaError>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};

    const TD: &str = "cluster.local";

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn id(ns: &str, sa: &str) -> Identity {
        Identity::new(TD, ns, sa)
    }

    /// A root or intermediate made directly with rcgen, for layouts that
    /// BuiltinCa does not generate itself.
    struct TestCa {
        params: CertificateParams,
        key: KeyPair,
        pem: String,
    }

    fn ca_params(
        cn: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> CertificateParams {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = not_before;
        params.not_after = not_after;
        params
    }

    fn test_root(cn: &str) -> TestCa {
        let params = ca_params(
            cn,
            rcgen::date_time_ymd(2020, 1, 1),
            rcgen::date_time_ymd(2090, 1, 1),
        );
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa { params, key, pem }
    }

    /// An intermediate CA signed by `root`, and its key.
    fn test_intermediate(root: &TestCa, cn: &str) -> (String, KeyPair) {
        let mut params = ca_params(
            cn,
            rcgen::date_time_ymd(2021, 1, 1),
            rcgen::date_time_ymd(2080, 1, 1),
        );
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = params
            .signed_by(&key, &Issuer::from_params(&root.params, &root.key))
            .unwrap()
            .pem();
        (pem, key)
    }

    fn write_layout(dir: &Path, ca_cert: &str, ca_key: &str, chain: &str, root: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(CA_CERT_FILE), ca_cert).unwrap();
        fs::write(dir.join(CA_KEY_FILE), ca_key).unwrap();
        fs::write(dir.join(CERT_CHAIN_FILE), chain).unwrap();
        fs::write(dir.join(ROOT_CERT_FILE), root).unwrap();
    }

    fn load_err(dir: &Path) -> String {
        BuiltinCa::load_or_create(dir, TD)
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn creates_a_root_and_reloads_the_same_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let ca = BuiltinCa::load_or_create(&dir, TD).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
        for name in CA_FILES {
            assert!(dir.join(name).is_file(), "{name}");
        }
        assert_eq!(ca.trust_domain(), TD);
        assert_eq!(ca.roots().len(), 1);

        let root_der = &ca.roots()[0];
        let (_, root) = x509_parser::parse_x509_certificate(root_der).unwrap();
        assert!(root.is_ca());
        assert_eq!(root.subject().to_string(), "O=ringway, CN=ringway root CA");
        assert_eq!(root.subject(), root.issuer());
        assert_eq!(
            root.public_key().algorithm.algorithm,
            OID_KEY_TYPE_EC_PUBLIC_KEY
        );
        let (not_before, not_after) = validity_of(&root);
        let years = not_after.duration_since(not_before).unwrap().as_secs() / (365 * 24 * 3600);
        assert_eq!(years, 10);

        let key_before = fs::read(dir.join(CA_KEY_FILE)).unwrap();
        let again = BuiltinCa::load_or_create(&dir, TD).unwrap();
        assert_eq!(again.roots_pem(), ca.roots_pem());
        assert_eq!(fs::read(dir.join(CA_KEY_FILE)).unwrap(), key_before);
        // A copy of the directory is the same CA: what another node loads.
        let copy = tmp.path().join("copy");
        fs::create_dir(&copy).unwrap();
        for name in CA_FILES {
            fs::copy(dir.join(name), copy.join(name)).unwrap();
        }
        let copied = BuiltinCa::load_or_create(&copy, TD).unwrap();
        assert_eq!(copied.roots_pem(), ca.roots_pem());
        // An empty existing directory is filled too.
        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let fresh = BuiltinCa::load_or_create(&empty, TD).unwrap();
        assert_ne!(fresh.roots_pem(), ca.roots_pem());
    }

    #[test]
    fn partial_layout_is_an_error_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        fs::remove_file(tmp.path().join(ROOT_CERT_FILE)).unwrap();
        fs::remove_file(tmp.path().join(CERT_CHAIN_FILE)).unwrap();
        let key_before = fs::read(tmp.path().join(CA_KEY_FILE)).unwrap();
        let err = BuiltinCa::load_or_create(tmp.path(), TD).unwrap_err();
        assert!(matches!(err, CaError::PartialLayout { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("incomplete CA directory"), "{text}");
        assert!(
            text.contains("\"root-cert.pem\", \"cert-chain.pem\""),
            "{text}"
        );
        assert!(text.contains("\"ca-cert.pem\", \"ca-key.pem\""), "{text}");
        assert_eq!(fs::read(tmp.path().join(CA_KEY_FILE)).unwrap(), key_before);
        assert!(!tmp.path().join(ROOT_CERT_FILE).exists());
    }

    #[test]
    fn rejects_a_bad_trust_domain() {
        let tmp = tempfile::tempdir().unwrap();
        let err = BuiltinCa::load_or_create(tmp.path(), "Bad/TD").unwrap_err();
        assert!(err.to_string().contains("invalid trust domain"), "{err}");
        assert!(fs::read_dir(tmp.path()).unwrap().next().is_none());
    }

    #[test]
    fn issues_istio_style_leaves() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let who = id("shop", "cart");
        let start = SystemTime::now();
        let issued = ca.issue(&who, DEFAULT_CERT_VALIDITY).unwrap();
        assert_eq!(issued.identity, who);
        assert_eq!(issued.chain_pem.len(), 1, "a root CA adds no intermediates");
        assert_eq!(issued.root_pem, ca.roots_pem());

        let der = crate::security::pki::parse_certs(issued.leaf_pem(), "leaf").unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(san.critical, "SAN is critical with an empty subject");
        assert_eq!(
            san.value.general_names,
            vec![GeneralName::URI("spiffe://cluster.local/ns/shop/sa/cart")]
        );
        assert_eq!(leaf.subject().iter().count(), 0, "empty subject DN");
        let (_, root) = x509_parser::parse_x509_certificate(&ca.roots()[0]).unwrap();
        assert_eq!(leaf.issuer(), root.subject());

        let spki = leaf.public_key();
        assert_eq!(spki.algorithm.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .unwrap()
            .as_oid()
            .unwrap();
        assert_eq!(curve, OID_EC_P256);

        let bc = leaf.basic_constraints().unwrap().expect("basicConstraints");
        assert!(!bc.value.ca);
        assert!(!leaf.is_ca());
        let ku = leaf.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
        let eku = leaf.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth && !eku.any);

        let (not_before, not_after) = validity_of(&leaf);
        assert_eq!(
            (not_before, not_after),
            (issued.not_before, issued.not_after)
        );
        let skew = start.duration_since(not_before).unwrap();
        assert!((59..=61).contains(&skew.as_secs()), "{skew:?}");
        let life = not_after.duration_since(start).unwrap().as_secs();
        assert!(
            (DEFAULT_CERT_VALIDITY.as_secs() - 2..=DEFAULT_CERT_VALIDITY.as_secs() + 2)
                .contains(&life)
        );

        // Fresh key and serial every time.
        let other = ca.issue(&who, DEFAULT_CERT_VALIDITY).unwrap();
        assert_ne!(other.key_pem, issued.key_pem);
        let other_der = crate::security::pki::parse_certs(other.leaf_pem(), "leaf").unwrap();
        let (_, other_leaf) = x509_parser::parse_x509_certificate(&other_der[0]).unwrap();
        assert_ne!(other_leaf.raw_serial(), leaf.raw_serial());
        assert!(leaf.raw_serial().len() >= 16);

        verify_issued(&issued).unwrap();
    }

    #[test]
    fn explicit_validity_and_refusals() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(86400);
        let expired = ca
            .issue_with_validity(&id("a", "b"), now - 2 * day, now - day)
            .unwrap();
        assert!(expired.not_after < now);
        let err = verify_issued(&expired).unwrap_err();
        assert!(err.contains("expired"), "{err}");

        let err = ca.issue_with_validity(&id("a", "b"), now, now).unwrap_err();
        assert!(err.to_string().contains("not_after must be later"), "{err}");
        let err = ca.issue(&id("a", "b"), Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("must not be zero"), "{err}");

        let err = ca
            .issue(&Identity::new("other.td", "a", "b"), DEFAULT_CERT_VALIDITY)
            .unwrap_err();
        assert!(matches!(err, CaError::ForeignTrustDomain { .. }));
        assert!(
            err.to_string()
                .contains("signs for trust domain \"cluster.local\""),
            "{err}"
        );
        let err = ca
            .issue(&Identity::new(TD, "", "b"), DEFAULT_CERT_VALIDITY)
            .unwrap_err();
        assert!(err.to_string().contains("namespace is empty"), "{err}");
        let err = ca
            .issue(&Identity::new(TD, "a/sa/x", "b"), DEFAULT_CERT_VALIDITY)
            .unwrap_err();
        assert!(matches!(err, CaError::Identity { .. }), "{err:?}");
    }

    /// The whole chain is checked: a revoked intermediate (on its root's
    /// CRL) takes every leaf under it down; a leaf on the intermediate's
    /// CRL goes alone.
    #[test]
    fn crls_apply_to_leaves_and_intermediates() {
        use crate::security::crl::{CrlSet, CrlStore, Side};
        let root = test_root("crl root");
        let (int_pem, int_key) = test_intermediate(&root, "crl intermediate");
        let tmp = tempfile::tempdir().unwrap();
        write_layout(
            tmp.path(),
            &int_pem,
            &int_key.serialize_pem(),
            &format!("{int_pem}{}", root.pem),
            &root.pem,
        );
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let leaf = ca.issue(&id("a", "b"), DEFAULT_CERT_VALIDITY).unwrap();
        let sibling = ca.issue(&id("a", "c"), DEFAULT_CERT_VALIDITY).unwrap();
        let roots = pki::root_store(ca.roots().to_vec()).unwrap();
        let algs = pki::crypto_provider().signature_verification_algorithms.all;
        let store = CrlStore::new();
        let check = |cert: &IssuedCert| {
            let chain = pki::parse_certs(&cert.chain_pem.concat(), "chain").unwrap();
            store.check(
                Side::Outbound,
                &chain[0],
                &chain[1..],
                &roots.roots,
                rustls::pki_types::UnixTime::now(),
                algs,
            )
        };
        let known: Vec<_> = ca
            .roots()
            .iter()
            .cloned()
            .chain(pki::parse_certs(&int_pem, "intermediate").unwrap())
            .collect();

        // The intermediate's CRL revokes one leaf.
        let by_int = ca
            .issue_crl(
                &[serial_of(leaf.leaf_pem()).unwrap()],
                1,
                DEFAULT_CERT_VALIDITY,
            )
            .unwrap();
        store.install(CrlSet::parse(by_int.clone().into_bytes(), &known).unwrap());
        let revoked = rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked);
        assert_eq!(check(&leaf), Err(revoked.clone()));
        assert_eq!(check(&sibling), Ok(()));

        // The root's CRL revokes the intermediate: both leaves fall.
        let root_issuer = Issuer::from_params(&root.params, &root.key);
        let now = OffsetDateTime::now_utc();
        let by_root = rcgen::CertificateRevocationListParams {
            this_update: now,
            next_update: now + time::Duration::hours(1),
            crl_number: SerialNumber::from(2u64),
            issuing_distribution_point: None,
            revoked_certs: vec![rcgen::RevokedCertParams {
                serial_number: SerialNumber::from_slice(&serial_of(&int_pem).unwrap()),
                revocation_time: now,
                reason_code: None,
                invalidity_date: None,
            }],
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&root_issuer)
        .unwrap()
        .pem()
        .unwrap();
        let empty_by_int = ca.issue_crl(&[], 2, DEFAULT_CERT_VALIDITY).unwrap();
        let set = CrlSet::parse(format!("{by_root}{empty_by_int}").into_bytes(), &known).unwrap();
        assert_eq!((set.len(), set.revoked()), (2, 1));
        store.install(set);
        assert_eq!(check(&leaf), Err(revoked.clone()));
        assert_eq!(check(&sibling), Err(revoked));
        assert_eq!(store.stats().refused_outbound, 3);
    }

    /// Istio's usual plug-in layout: an intermediate signs, cert-chain.pem is
    /// intermediate + root. The key is in SEC1 ("EC PRIVATE KEY") form, as
    /// `openssl ecparam -genkey` writes it.
    #[test]
    fn loads_an_intermediate_ca() {
        let root = test_root("test root");
        let (int_pem, int_key) = test_intermediate(&root, "test intermediate");
        let sec1 = sec1_from_p256_pkcs8(int_key.serialized_der());
        let key_pem = der_to_pem("EC PRIVATE KEY", &sec1);

        let tmp = tempfile::tempdir().unwrap();
        write_layout(
            tmp.path(),
            &int_pem,
            &key_pem,
            &format!("{int_pem}{}", root.pem),
            &root.pem,
        );
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let issued = ca.issue(&id("a", "b"), DEFAULT_CERT_VALIDITY).unwrap();
        assert_eq!(issued.chain_pem.len(), 2, "leaf + intermediate, no root");
        assert_eq!(issued.chain_pem[1], int_pem);
        assert_eq!(issued.root_pem, root.pem);
        verify_issued(&issued).unwrap();

        // Without the root, cert-chain.pem is still acceptable (roots come
        // from root-cert.pem).
        fs::write(tmp.path().join(CERT_CHAIN_FILE), &int_pem).unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        assert_eq!(
            ca.issue(&id("a", "b"), DEFAULT_CERT_VALIDITY)
                .unwrap()
                .chain_pem
                .len(),
            2
        );

        // A root-cert.pem that is not the intermediate's issuer.
        let stranger = test_root("stranger");
        fs::write(tmp.path().join(ROOT_CERT_FILE), &stranger.pem).unwrap();
        let err = load_err(tmp.path());
        assert!(err.contains("do not fit together"), "{err}");
        assert!(err.contains("UnknownIssuer"), "{err}");
    }

    /// Unwraps ring's P-256 PKCS#8 to the SEC1 key inside, checking that
    /// our wrapper rebuilds the identical bytes.
    fn sec1_from_p256_pkcs8(pkcs8: &[u8]) -> Vec<u8> {
        // SEQUENCE { INTEGER 0, AlgorithmIdentifier, OCTET STRING { sec1 } }
        fn skip_header(der: &[u8]) -> (&[u8], usize) {
            let len_byte = der[1] as usize;
            if len_byte < 0x80 {
                (&der[2..], len_byte)
            } else {
                let n = len_byte & 0x7f;
                let len = der[2..2 + n]
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | b as usize);
                (&der[2 + n..], len)
            }
        }
        let (body, _) = skip_header(pkcs8);
        let alg = der_tlv(0x30, EC_P256_ALGORITHM);
        assert_eq!(&body[..3], &[0x02, 0x01, 0x00]);
        assert_eq!(&body[3..3 + alg.len()], alg.as_slice());
        let octets = &body[3 + alg.len()..];
        assert_eq!(octets[0], 0x04, "OCTET STRING");
        let (content, len) = skip_header(octets);
        let sec1 = content[..len].to_vec();
        assert_eq!(pkcs8_wrap(EC_P256_ALGORITHM, &sec1), pkcs8);
        sec1
    }

    /// A root made by openssl with an RSA key in PKCS#1 form ("RSA PRIVATE
    /// KEY", as in Istio's samples). Needs the openssl CLI (scripts/test.sh
    /// installs it).
    #[test]
    fn loads_an_openssl_rsa_root() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let openssl = |args: &[&str]| {
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
        };
        let Ok(out) = openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "pkcs8.pem",
            "-out",
            "root.pem",
            "-days",
            "30",
            "-subj",
            "/O=Istio/CN=Root CA",
            "-addext",
            "basicConstraints=critical,CA:true",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]) else {
            panic!(
                "this test needs the openssl CLI (apt-get install openssl; scripts/test.sh does)"
            );
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = openssl(&[
            "rsa",
            "-in",
            "pkcs8.pem",
            "-traditional",
            "-out",
            "pkcs1.pem",
        ])
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = fs::read_to_string(dir.join("root.pem")).unwrap();
        let key = fs::read_to_string(dir.join("pkcs1.pem")).unwrap();
        assert!(key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        let ca_dir = dir.join("cacerts");
        write_layout(&ca_dir, &root, &key, &root, &root);
        let ca = BuiltinCa::load_or_create(&ca_dir, TD).unwrap();
        let issued = ca.issue(&id("a", "b"), DEFAULT_CERT_VALIDITY).unwrap();
        assert_eq!(issued.chain_pem.len(), 1);
        verify_issued(&issued).unwrap();
    }

    #[test]
    fn refuses_inconsistent_or_unusable_files() {
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        BuiltinCa::load_or_create(&good, TD).unwrap();
        let read = |name: &str| fs::read_to_string(good.join(name)).unwrap();
        let (cert, key, chain, root) = (
            read(CA_CERT_FILE),
            read(CA_KEY_FILE),
            read(CERT_CHAIN_FILE),
            read(ROOT_CERT_FILE),
        );
        let case = |name: &str| tmp.path().join(name);

        // The key of another CA.
        let other = test_root("other");
        write_layout(
            &case("wrong-key"),
            &cert,
            &other.key.serialize_pem(),
            &chain,
            &root,
        );
        let err = load_err(&case("wrong-key"));
        assert!(
            err.contains("ca-key.pem: this key does not belong to the certificate in ca-cert.pem"),
            "{err}"
        );

        // Not a key at all.
        write_layout(&case("no-key"), &cert, &cert, &chain, &root);
        let err = load_err(&case("no-key"));
        assert!(err.contains("ca-key.pem: no usable private key"), "{err}");

        // A leaf posing as a CA.
        let ca = BuiltinCa::load_or_create(&good, TD).unwrap();
        let leaf = ca.issue(&id("a", "b"), DEFAULT_CERT_VALIDITY).unwrap();
        write_layout(
            &case("leaf"),
            leaf.leaf_pem(),
            &leaf.key_pem,
            leaf.leaf_pem(),
            &root,
        );
        let err = load_err(&case("leaf"));
        assert!(err.contains("ca-cert.pem: not a CA certificate"), "{err}");

        // An expired CA.
        let params = ca_params(
            "old",
            rcgen::date_time_ymd(2001, 1, 1),
            rcgen::date_time_ymd(2002, 1, 1),
        );
        let old_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let old = params.self_signed(&old_key).unwrap().pem();
        write_layout(&case("expired"), &old, &old_key.serialize_pem(), &old, &old);
        let err = load_err(&case("expired"));
        assert!(
            err.contains("ca-cert.pem: the CA certificate expired"),
            "{err}"
        );

        // cert-chain.pem that doesn't start with ca-cert.pem.
        write_layout(&case("chain"), &cert, &key, &other.pem, &root);
        let err = load_err(&case("chain"));
        assert!(
            err.contains("cert-chain.pem: must start with the certificate in ca-cert.pem"),
            "{err}"
        );

        // Two certificates in ca-cert.pem; garbage in root-cert.pem.
        write_layout(&case("two"), &format!("{cert}{cert}"), &key, &chain, &root);
        let err = load_err(&case("two"));
        assert!(
            err.contains("ca-cert.pem: expected exactly one certificate, found 2"),
            "{err}"
        );
        write_layout(&case("garbage"), &cert, &key, &chain, "hello\n");
        let err = load_err(&case("garbage"));
        assert!(err.contains("root-cert.pem: no CERTIFICATE found"), "{err}");
    }

    #[test]
    fn writes_files_for_other_tools() {
        let tmp = tempfile::tempdir().unwrap();
        let ca_dir = tmp.path().join("ca");
        let out = tmp.path().join("out/client");
        let issued = issue_to_dir(
            &ca_dir,
            "spiffe://example.org/ns/shop/sa/cart",
            &out,
            Duration::from_secs(3600),
        )
        .unwrap();
        assert_eq!(
            issued.identity,
            Identity::new("example.org", "shop", "cart")
        );
        assert_eq!(mode(&out.join(ISSUED_KEY_FILE)), 0o600);
        let read = |name: &str| fs::read_to_string(out.join(name)).unwrap();
        assert_eq!(read(ISSUED_KEY_FILE), issued.key_pem);
        assert!(read(ISSUED_KEY_FILE).starts_with("-----BEGIN PRIVATE KEY-----\n"));
        assert_eq!(read(ISSUED_CERT_FILE), issued.leaf_pem());
        assert_eq!(read(ISSUED_CHAIN_FILE), issued.chain_pem.concat());
        assert_eq!(
            read(ISSUED_ROOT_FILE),
            fs::read_to_string(ca_dir.join(ROOT_CERT_FILE)).unwrap()
        );
        let cert = crate::security::tls::WorkloadCert::from_pem(
            &read(ISSUED_KEY_FILE),
            &read(ISSUED_CHAIN_FILE),
            &read(ISSUED_ROOT_FILE),
        )
        .unwrap();
        assert_eq!(cert.identity(), &issued.identity);

        // Re-issuing over the same directory replaces the files; a looser
        // mode on the old key file does not survive.
        fs::set_permissions(out.join(ISSUED_KEY_FILE), fs::Permissions::from_mode(0o644)).unwrap();
        let again = issue_to_dir(
            &ca_dir,
            "spiffe://example.org/ns/shop/sa/cart",
            &out,
            DEFAULT_CERT_VALIDITY,
        )
        .unwrap();
        assert_eq!(read(ISSUED_KEY_FILE), again.key_pem);
        assert_eq!(mode(&out.join(ISSUED_KEY_FILE)), 0o600);
        let leftovers: Vec<_> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        let err = issue_to_dir(
            &ca_dir,
            "spiffe://example.org/ns/shop",
            &out,
            DEFAULT_CERT_VALIDITY,
        )
        .unwrap_err();
        assert!(err.to_string().contains("path must be"), "{err}");

        // An independent implementation agrees the chain is valid.
        let output = std::process::Command::new("openssl")
            .args(["verify", "-purpose", "sslclient", "-CAfile"])
            .arg(out.join(ISSUED_ROOT_FILE))
            .arg(out.join(ISSUED_CERT_FILE))
            .output()
            .expect("this test needs the openssl CLI (scripts/test.sh installs it)");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }

    fn csr_for(key: &KeyPair, sans: &[&str], as_ca: bool) -> String {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "ignored");
        params.subject_alt_names = sans
            .iter()
            .map(|s| SanType::URI((*s).try_into().unwrap()))
            .collect();
        if as_ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        }
        params.serialize_request(key).unwrap().pem().unwrap()
    }

    #[test]
    fn signs_csrs_with_our_profile_only() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        // The request asks to be a CA and has a subject: both ignored.
        let csr = csr_for(&key, &["spiffe://cluster.local/ns/a/sa/b"], true);
        let validity = Duration::from_secs(600);
        let chain = ca.sign_csr(&csr, None, validity).unwrap();
        assert_eq!(chain.len(), 2, "leaf and root");
        assert_eq!(chain[1], ca.roots_pem());

        let der = crate::security::pki::parse_certs(&chain[0], "leaf").unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        assert!(!leaf.is_ca());
        assert_eq!(leaf.subject().iter().count(), 0);
        assert_eq!(
            leaf.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
        assert_eq!(
            crate::security::tls::peer_identity(&der).unwrap(),
            id("a", "b")
        );
        let (_, not_after) = validity_of(&leaf);
        let left = not_after.duration_since(SystemTime::now()).unwrap();
        assert!(
            left <= validity && left >= validity - Duration::from_secs(2),
            "{left:?}"
        );
        let issued = IssuedCert {
            identity: id("a", "b"),
            key_pem: key.serialize_pem(),
            chain_pem: vec![chain[0].clone()],
            root_pem: chain[1].clone(),
            not_before: SystemTime::now(),
            not_after,
        };
        verify_issued(&issued).unwrap();

        // An identity given by the caller wins over the request's SAN.
        let chain = ca.sign_csr(&csr, Some(&id("x", "y")), validity).unwrap();
        let der = crate::security::pki::parse_certs(&chain[0], "leaf").unwrap();
        assert_eq!(
            crate::security::tls::peer_identity(&der).unwrap(),
            id("x", "y")
        );
        let err = ca
            .sign_csr(&csr, Some(&Identity::new("other.td", "x", "y")), validity)
            .unwrap_err();
        assert!(matches!(err, CaError::ForeignTrustDomain { .. }), "{err}");
    }

    #[test]
    fn refuses_bad_csrs() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let day = DEFAULT_CERT_VALIDITY;
        let refuse = |csr: &str| ca.sign_csr(csr, None, day).unwrap_err().to_string();

        let err = refuse(&csr_for(&key, &[], false));
        assert!(err.contains("no spiffe:// URI SAN"), "{err}");
        let err = refuse(&csr_for(
            &key,
            &[
                "spiffe://cluster.local/ns/a/sa/b",
                "spiffe://cluster.local/ns/c/sa/d",
            ],
            false,
        ));
        assert!(err.contains("2 spiffe:// URI SANs"), "{err}");
        let err = refuse(&csr_for(&key, &["spiffe://other.td/ns/a/sa/b"], false));
        assert!(err.contains("signs for trust domain"), "{err}");
        let err = refuse(&csr_for(&key, &["spiffe://cluster.local/ns/a/b"], false));
        assert!(err.contains("refusing to sign"), "{err}");
        let err = refuse(ca.roots_pem());
        assert!(err.contains("expected a CERTIFICATE REQUEST"), "{err}");
        let err = refuse("garbage");
        assert!(err.contains("bad PEM"), "{err}");

        // A flipped bit in the signature.
        let good = csr_for(&key, &["spiffe://cluster.local/ns/a/sa/b"], false);
        let mut der = pem::parse(&good).unwrap().into_contents();
        *der.last_mut().unwrap() ^= 1;
        let err = refuse(&der_to_pem("CERTIFICATE REQUEST", &der));
        assert!(err.contains("signature does not verify"), "{err}");

        // A P-384 key is fine too.
        let key384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let csr = csr_for(&key384, &["spiffe://cluster.local/ns/a/sa/b"], false);
        ca.sign_csr(&csr, None, day).unwrap();
    }
}
