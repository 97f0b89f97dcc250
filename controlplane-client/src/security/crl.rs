//! Certificate revocation lists (`CRL_PATH`, as ztunnel): the HBONE
//! verifiers refuse a peer whose certificate, or any intermediate in its
//! chain, is listed on a CRL from the file.
//!
//! # Policy
//!
//! - The file holds one or more CRLs, PEM (`X509 CRL` sections; other
//!   sections are skipped) or DER (one or several concatenated).
//! - The revocation check is rustls-webpki's (the path verifier rustls
//!   itself uses): for each certificate of the verified path, leaf and
//!   intermediates, the CRL issued by that certificate's issuer is looked up
//!   by name, its signature is verified with the issuer's key found in the
//!   path (which must allow `cRLSign` if it states a key usage), and the
//!   serial is looked up in it.
//! - A certificate whose issuer has no CRL in the file is accepted (status
//!   unknown is allowed): a file listing only some CAs' revocations does
//!   not cut off the others.
//! - A CRL past its `nextUpdate` still applies, with a warning at load: what
//!   it revokes stays revoked; refusing every certificate of its issuer
//!   would turn a late CRL refresh into a mesh-wide outage.
//! - A CRL whose issuer is one of the certificates the node already knows
//!   (its trust roots, and the built-in CA's chain) must verify with that
//!   issuer's key, or the whole file is refused. Others are verified at
//!   each handshake against the issuer in the peer's path; one that does not
//!   verify fails that handshake (closed).
//!
//! The current set lives in a [`CrlStore`] that the verifiers read at each
//! handshake, so a reloaded file applies to the next handshake. Each
//! install also bumps the store's version ([`CrlStore::subscribe`]): the
//! cores then look up the open HBONE connections' peer chains
//! ([`PeerChain`]) in the new set ([`CrlSet::revokes`]) and close those
//! now revoked.
//!
//! That look-up is by issuer name and serial only: the handshake already
//! verified the chain, and a CRL that names the chain's issuer is either
//! verified at load or (issuer unknown to the node) would fail every new
//! handshake of that issuer's certificates if its signature were bad.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, SignatureVerificationAlgorithm, TrustAnchor,
    UnixTime,
};
use rustls::{CertRevocationListError, CertificateError, OtherError};
use rustls_pki_types::pem::PemObject;
use webpki::{
    CertRevocationList, EndEntityCert, ExpirationPolicy, KeyUsage, OwnedCertRevocationList,
    RevocationCheckDepth, RevocationOptionsBuilder, UnknownStatusPolicy,
};

/// Why a CRL file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CrlError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("no CRL in the file")]
    Empty,
    #[error("bad PEM: {0}")]
    Pem(String),
    #[error("CRL #{index}: unparsable: {detail}")]
    Parse { index: usize, detail: String },
    #[error("CRL #{index} (issuer {issuer}): its signature does not verify with the issuer's key")]
    BadSignature { index: usize, issuer: String },
}

/// Why a handshake's revocation check failed, when it is not one of the
/// cases rustls names.
#[derive(Debug, thiserror::Error)]
#[error("certificate revocation check failed: {0}")]
struct CheckError(webpki::Error);

/// The parsed CRLs of one version of the file.
pub struct CrlSet {
    crls: Vec<CertRevocationList<'static>>,
    revoked: usize,
    /// Issuers of CRLs whose signature could not be checked at load (no
    /// known certificate by that name).
    unverified: Vec<String>,
    /// Issuers of CRLs past their `nextUpdate` at load.
    stale: Vec<String>,
    /// Every revoked (issuer, serial), for re-checking open connections
    /// without their full chains.
    serials: HashSet<CertRef>,
    content: Vec<u8>,
}

/// One certificate of a peer's chain, as a CRL names it: a hash of its
/// issuer's name (DER) and its serial without leading zero bytes. Enough to
/// find it on a CRL, and a few dozen bytes where the certificate is ~1 KiB.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CertRef {
    issuer: u64,
    serial: Box<[u8]>,
}

impl CertRef {
    fn new(issuer_der: &[u8], serial: &[u8]) -> CertRef {
        // SipHash with fixed keys: stable within the process, which is all
        // the set and the connections have to agree on.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        issuer_der.hash(&mut h);
        let start = serial.iter().position(|&b| b != 0).unwrap_or(serial.len());
        CertRef {
            issuer: h.finish(),
            serial: serial[start..].into(),
        }
    }
}

/// What an open HBONE connection keeps of its peer's certificates (leaf
/// and intermediates, as the handshake received them) so that a reloaded
/// CRL can be applied to it. Only made when a CRL is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerChain(Box<[CertRef]>);

impl PeerChain {
    /// The chain's (issuer, serial) list; certificates that do not parse
    /// (they verified, so there are none in practice) are left out.
    pub fn new(certs: &[CertificateDer<'_>]) -> PeerChain {
        PeerChain(
            certs
                .iter()
                .filter_map(|c| {
                    let (_, cert) = x509_parser::parse_x509_certificate(c).ok()?;
                    Some(CertRef::new(cert.issuer().as_raw(), cert.raw_serial()))
                })
                .collect(),
        )
    }
}

impl std::fmt::Debug for CrlSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrlSet")
            .field("crls", &self.crls.len())
            .field("revoked", &self.revoked)
            .field("unverified", &self.unverified)
            .field("stale", &self.stale)
            .finish_non_exhaustive()
    }
}

impl CrlSet {
    /// Reads and parses `path` (see [`CrlSet::parse`]).
    pub fn load(path: &Path, known_issuers: &[CertificateDer<'_>]) -> Result<CrlSet, CrlError> {
        let content = std::fs::read(path).map_err(|source| CrlError::Io {
            path: path.to_owned(),
            source,
        })?;
        CrlSet::parse(content, known_issuers)
    }

    /// Parses one or more CRLs, PEM or DER. A CRL issued by one of
    /// `known_issuers` (matched by name) must verify with its key.
    pub fn parse(
        content: Vec<u8>,
        known_issuers: &[CertificateDer<'_>],
    ) -> Result<CrlSet, CrlError> {
        let ders = split(&content)?;
        let issuers: Vec<_> = known_issuers
            .iter()
            .filter_map(|c| x509_parser::parse_x509_certificate(c).ok().map(|(_, c)| c))
            .collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        let mut set = CrlSet {
            crls: Vec::with_capacity(ders.len()),
            revoked: 0,
            unverified: Vec::new(),
            stale: Vec::new(),
            serials: HashSet::new(),
            content: Vec::new(),
        };
        for (index, der) in ders.iter().enumerate() {
            let parse_err = |detail: String| CrlError::Parse { index, detail };
            let (rest, crl) =
                x509_parser::parse_x509_crl(der).map_err(|e| parse_err(e.to_string()))?;
            if !rest.is_empty() {
                return Err(parse_err("trailing bytes after the CRL".into()));
            }
            let owned =
                OwnedCertRevocationList::from_der(der).map_err(|e| parse_err(format!("{e:?}")))?;
            let issuer = crl.issuer().to_string();
            let named: Vec<_> = issuers
                .iter()
                .filter(|c| c.subject().as_raw() == crl.issuer().as_raw())
                .collect();
            if named.is_empty() {
                set.unverified.push(issuer.clone());
            } else if !named
                .iter()
                .any(|c| crl.verify_signature(c.public_key()).is_ok())
            {
                return Err(CrlError::BadSignature { index, issuer });
            }
            if crl.next_update().is_some_and(|t| t.timestamp() < now) {
                set.stale.push(issuer);
            }
            for revoked in crl.iter_revoked_certificates() {
                set.serials
                    .insert(CertRef::new(crl.issuer().as_raw(), revoked.raw_serial()));
                set.revoked += 1;
            }
            set.crls.push(owned.into());
        }
        set.content = content;
        Ok(set)
    }

    /// How many CRLs the file held.
    pub fn len(&self) -> usize {
        self.crls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.crls.is_empty()
    }

    /// Revoked serials over all CRLs.
    pub fn revoked(&self) -> usize {
        self.revoked
    }

    /// Issuers of CRLs whose signature is checked only at handshakes.
    pub fn unverified_issuers(&self) -> &[String] {
        &self.unverified
    }

    /// Issuers of CRLs that were past their `nextUpdate` when loaded.
    pub fn stale_issuers(&self) -> &[String] {
        &self.stale
    }

    /// Whether a certificate of `chain` is on one of these CRLs: for
    /// connections opened before this set was installed.
    pub fn revokes(&self, chain: &PeerChain) -> bool {
        chain.0.iter().any(|c| self.serials.contains(c))
    }
}

/// The DER of each CRL in `content`.
fn split(content: &[u8]) -> Result<Vec<Vec<u8>>, CrlError> {
    let pem = content
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .is_some_and(|i| content[i..].starts_with(b"-----BEGIN"));
    let ders = if pem {
        CertificateRevocationListDer::pem_slice_iter(content)
            .map(|r| r.map(|d| d.as_ref().to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CrlError::Pem(e.to_string()))?
    } else {
        let mut out = Vec::new();
        let mut rest = content;
        while !rest.is_empty() {
            let len = der_len(rest).ok_or(CrlError::Parse {
                index: out.len(),
                detail: "not a DER SEQUENCE (nor PEM)".into(),
            })?;
            out.push(rest[..len].to_vec());
            rest = &rest[len..];
        }
        out
    };
    if ders.is_empty() {
        return Err(CrlError::Empty);
    }
    Ok(ders)
}

/// The total length of the DER SEQUENCE at the start of `b`, if it fits.
fn der_len(b: &[u8]) -> Option<usize> {
    if b.len() < 2 || b[0] != 0x30 {
        return None;
    }
    let (header, len) = match b[1] {
        n if n < 0x80 => (2, n as usize),
        0x81..=0x84 => {
            let k = (b[1] & 0x7f) as usize;
            let bytes = b.get(2..2 + k)?;
            (
                2 + k,
                bytes.iter().fold(0usize, |acc, &x| (acc << 8) | x as usize),
            )
        }
        _ => return None,
    };
    let total = header.checked_add(len)?;
    (total <= b.len()).then_some(total)
}

/// Which way the refused handshake went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Inbound HBONE: we are the server, checking a client certificate.
    Inbound,
    /// Outbound HBONE: we are the client, checking a server certificate.
    Outbound,
}

/// The CRLs in force, shared by every TLS config and core, and counters for
/// the metrics.
pub struct CrlStore {
    current: ArcSwapOption<CrlSet>,
    /// Bumped by each install; the cores wait on it to re-check their open
    /// connections (the same wake-up the snapshot feeds use).
    version: tokio::sync::watch::Sender<u64>,
    refused: [AtomicU64; 2],
    /// Open connections closed because a reloaded CRL revoked their peer.
    closed: [AtomicU64; 2],
    reloads_ok: AtomicU64,
    reloads_error: AtomicU64,
    last_reload: AtomicU64,
}

/// What the metrics show of a [`CrlStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrlStats {
    pub loaded: bool,
    pub crls: usize,
    pub revoked: usize,
    pub reloads_ok: u64,
    pub reloads_error: u64,
    /// Unix seconds of the last successful load (0: never).
    pub last_reload: u64,
    pub refused_inbound: u64,
    pub refused_outbound: u64,
    pub closed_inbound: u64,
    pub closed_outbound: u64,
}

impl Default for CrlStore {
    fn default() -> Self {
        CrlStore {
            current: ArcSwapOption::empty(),
            version: tokio::sync::watch::Sender::new(0),
            refused: Default::default(),
            closed: Default::default(),
            reloads_ok: AtomicU64::new(0),
            reloads_error: AtomicU64::new(0),
            last_reload: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for CrlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CrlStore").field(&self.stats()).finish()
    }
}

impl CrlStore {
    pub fn new() -> Arc<CrlStore> {
        Arc::new(CrlStore::default())
    }

    /// The process-wide store: the one [`build_tls_configs`] wires into
    /// every config, and the one `CRL_PATH` fills.
    ///
    /// [`build_tls_configs`]: crate::security::tls::build_tls_configs
    pub fn global() -> &'static Arc<CrlStore> {
        static GLOBAL: OnceLock<Arc<CrlStore>> = OnceLock::new();
        GLOBAL.get_or_init(CrlStore::new)
    }

    /// Puts `set` in force for the next handshakes.
    pub fn install(&self, set: CrlSet) {
        self.current.store(Some(Arc::new(set)));
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        self.last_reload.store(now, Ordering::Relaxed);
        self.version.send_modify(|v| *v += 1);
    }

    /// Wakes (`changed()`) after each install; the value is the number of
    /// installs so far.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// What a connection that just verified `certs` keeps for later
    /// reloads, and whether the set in force already revokes it (one
    /// installed after its handshake's check); None without a CRL: then
    /// nothing is kept.
    pub fn peer_chain(&self, certs: &[CertificateDer<'_>]) -> Option<(PeerChain, bool)> {
        let current = self.current.load();
        let set = current.as_ref()?;
        let chain = PeerChain::new(certs);
        let revoked = set.revokes(&chain);
        Some((chain, revoked))
    }

    /// Counts open connections closed because their peer is now revoked.
    pub fn record_closed(&self, side: Side, n: u64) {
        self.closed[side as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a failed reload (the set in force stays).
    pub fn record_error(&self) {
        self.reloads_error.fetch_add(1, Ordering::Relaxed);
    }

    pub fn current(&self) -> Option<Arc<CrlSet>> {
        self.current.load_full()
    }

    pub fn stats(&self) -> CrlStats {
        let current = self.current.load();
        CrlStats {
            loaded: current.is_some(),
            crls: current.as_ref().map_or(0, |s| s.len()),
            revoked: current.as_ref().map_or(0, |s| s.revoked),
            reloads_ok: self.reloads_ok.load(Ordering::Relaxed),
            reloads_error: self.reloads_error.load(Ordering::Relaxed),
            last_reload: self.last_reload.load(Ordering::Relaxed),
            refused_inbound: self.refused[Side::Inbound as usize].load(Ordering::Relaxed),
            refused_outbound: self.refused[Side::Outbound as usize].load(Ordering::Relaxed),
            closed_inbound: self.closed[Side::Inbound as usize].load(Ordering::Relaxed),
            closed_outbound: self.closed[Side::Outbound as usize].load(Ordering::Relaxed),
        }
    }

    /// The revocation check of a chain that already verified up to
    /// `anchors`: nothing to do without CRLs. Runs webpki's path building
    /// again, with the CRLs (each CRL's signature checked against the
    /// issuer in the path); only paid when a CRL is configured.
    pub(crate) fn check(
        &self,
        side: Side,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        anchors: &[TrustAnchor<'_>],
        now: UnixTime,
        algorithms: &[&dyn SignatureVerificationAlgorithm],
    ) -> Result<(), rustls::Error> {
        let current = self.current.load();
        let Some(set) = current.as_ref() else {
            return Ok(());
        };
        let crls: Vec<&CertRevocationList<'_>> = set.crls.iter().collect();
        let Ok(options) = RevocationOptionsBuilder::new(&crls) else {
            return Ok(()); // an empty set: never installed
        };
        let options = options
            .with_depth(RevocationCheckDepth::Chain)
            .with_status_policy(UnknownStatusPolicy::Allow)
            .with_expiration_policy(ExpirationPolicy::Ignore)
            .build();
        let usage = match side {
            Side::Inbound => KeyUsage::client_auth(),
            Side::Outbound => KeyUsage::server_auth(),
        };
        let result = EndEntityCert::try_from(end_entity).and_then(|cert| {
            cert.verify_for_usage(
                algorithms,
                anchors,
                intermediates,
                now,
                usage,
                Some(options),
                None,
            )
            .map(|_| ())
        });
        result.map_err(|e| {
            self.refused[side as usize].fetch_add(1, Ordering::Relaxed);
            match e {
                webpki::Error::CertRevoked => CertificateError::Revoked.into(),
                webpki::Error::InvalidCrlSignatureForPublicKey
                | webpki::Error::UnsupportedCrlSignatureAlgorithmContext(_)
                | webpki::Error::UnsupportedCrlSignatureAlgorithmForPublicKeyContext(_) => {
                    rustls::Error::InvalidCertRevocationList(CertRevocationListError::BadSignature)
                }
                e => CertificateError::Other(OtherError(Arc::new(CheckError(e)))).into(),
            }
        })
    }
}

/// A file's identity for change detection: modification time, size and
/// inode (a replacement by rename changes the inode).
fn stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Watches `path` every `every` and installs each new version into `store`.
/// A version that does not load (missing, unparsable, bad signature) is
/// counted and logged as a warning, and the set in force stays. Runs on the
/// control thread's runtime until dropped.
pub async fn watch(
    path: PathBuf,
    every: Duration,
    store: Arc<CrlStore>,
    known_issuers: Vec<CertificateDer<'static>>,
) {
    let mut seen = stamp(&path);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match CrlSet::load(&path, &known_issuers) {
            Ok(set) => {
                if store
                    .current()
                    .is_some_and(|old| old.content == set.content)
                {
                    continue;
                }
                log_loaded(
                    &path,
                    &set,
                    "reloaded the CRL file: it applies to new handshakes and open connections",
                );
                store.install(set);
            }
            Err(error) => {
                store.record_error();
                tracing::warn!(
                    path = %path.display(),
                    %error,
                    "cannot reload the CRL file: keeping the last good CRLs"
                );
            }
        }
    }
}

/// Logs what a loaded set holds, warning about CRLs past `nextUpdate` and
/// those whose signature waits for the handshakes.
pub fn log_loaded(path: &Path, set: &CrlSet, what: &str) {
    tracing::info!(
        path = %path.display(),
        crls = set.len(),
        revoked = set.revoked(),
        "{what}"
    );
    for issuer in set.stale_issuers() {
        tracing::warn!(
            path = %path.display(),
            %issuer,
            "this CRL is past its nextUpdate; it still applies, but may miss newer revocations"
        );
    }
    for issuer in set.unverified_issuers() {
        tracing::info!(
            path = %path.display(),
            %issuer,
            "no known certificate issued this CRL; its signature is checked against the issuer in each peer's chain"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths() {
        assert_eq!(der_len(&[0x30, 0x00]), Some(2));
        assert_eq!(der_len(&[0x30, 0x01, 0xff]), Some(3));
        assert_eq!(der_len(&[0x30, 0x02, 0xff]), None, "truncated");
        let mut long = vec![0x30, 0x82, 0x01, 0x00];
        long.resize(4 + 256, 0);
        assert_eq!(der_len(&long), Some(260));
        assert_eq!(der_len(&[0x31, 0x00]), None, "not a SEQUENCE");
        assert_eq!(der_len(&[0x30, 0x80]), None, "indefinite length");
    }

    /// What an open connection keeps of its peer is found on a later CRL
    /// by issuer and serial, and only the certificates that CRL lists.
    #[test]
    fn peer_chains_are_looked_up_by_issuer_and_serial() {
        use crate::security::ca::{serial_of, BuiltinCa, DEFAULT_CERT_VALIDITY};
        let dir = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(&dir.path().join("ca"), "cluster.local").unwrap();
        let other = BuiltinCa::load_or_create(&dir.path().join("other"), "cluster.local").unwrap();
        let id = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let chain = |ca: &BuiltinCa| {
            let issued = ca.issue(&id, DEFAULT_CERT_VALIDITY).unwrap();
            let der = CertificateDer::from_pem_slice(issued.leaf_pem().as_bytes()).unwrap();
            (
                PeerChain::new(&[der]),
                serial_of(issued.leaf_pem()).unwrap(),
            )
        };
        let (doomed, serial) = chain(&ca);
        let (spared, _) = chain(&ca);
        let (elsewhere, _) = chain(&other);
        let crl = ca
            .issue_crl(&[serial], 2, Duration::from_secs(3600))
            .unwrap();
        let set = CrlSet::parse(crl.into_bytes(), ca.roots()).unwrap();
        assert!(set.revokes(&doomed));
        assert!(!set.revokes(&spared));
        assert!(!set.revokes(&elsewhere));

        let store = CrlStore::new();
        let der = CertificateDer::from_pem_slice(
            ca.issue(&id, DEFAULT_CERT_VALIDITY)
                .unwrap()
                .leaf_pem()
                .as_bytes(),
        )
        .unwrap();
        assert!(
            store.peer_chain(std::slice::from_ref(&der)).is_none(),
            "no CRL, nothing kept"
        );
        let installs = store.subscribe();
        store.install(set);
        assert!(installs.has_changed().unwrap());
        let (_, revoked) = store.peer_chain(&[der]).unwrap();
        assert!(!revoked);
    }

    #[test]
    fn garbage_and_empty_files_are_refused() {
        assert!(matches!(
            CrlSet::parse(Vec::new(), &[]),
            Err(CrlError::Empty)
        ));
        assert!(matches!(
            CrlSet::parse(b"garbage".to_vec(), &[]),
            Err(CrlError::Parse { .. })
        ));
        let only_cert = b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            CrlSet::parse(only_cert.to_vec(), &[]),
            Err(CrlError::Empty)
        ));
        assert!(matches!(
            CrlSet::parse(vec![0x30, 0x03, 1, 2, 3], &[]),
            Err(CrlError::Parse { index: 0, .. })
        ));
    }
}
