//! The certificates the cores use: an immutable [`CertSnapshot`] of ready-built
//! TLS configs per local identity, handed over like the configuration
//! snapshot ([`CertPublisher`] on the control thread, [`CertFeed`] on the
//! cores), plus the helpers around it: startup issuance ([`issue_all`]),
//! which identities a node needs ([`wanted_identities`]) and when to renew
//! ([`refresh_at`]). The certificate manager that keeps a node's snapshot
//! current is built on these; this module does not depend on it.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::identity::Identity;
use crate::model::snapshot::Snapshot;
use crate::model::TunnelProtocol;
use crate::publish::{sealed, Feed, Published, Publisher};
use crate::security::ca::{BuiltinCa, CaError, CLOCK_SKEW_ALLOWANCE};
use crate::security::tls::{build_tls_configs, TlsConfigs, TlsError};

/// Publishes [`CertSnapshot`]s (control thread).
pub type CertPublisher = Publisher<CertSnapshot>;
/// Reads [`CertSnapshot`]s (cores); needs no tokio runtime.
pub type CertFeed = Feed<CertSnapshot>;

/// TLS configs by local identity. Immutable once published.
#[derive(Default, Clone)]
pub struct CertSnapshot {
    version: u64,
    configs: HashMap<Identity, Arc<TlsConfigs>>,
}

impl CertSnapshot {
    pub fn empty() -> CertSnapshot {
        CertSnapshot::default()
    }

    /// Keyed by each config's identity (a later duplicate wins).
    pub fn new(configs: impl IntoIterator<Item = Arc<TlsConfigs>>) -> CertSnapshot {
        CertSnapshot {
            version: 0,
            configs: configs
                .into_iter()
                .map(|c| (c.identity.clone(), c))
                .collect(),
        }
    }

    /// Assigned by the publisher; 0 for a snapshot never published.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The configs to use for a connection as (outbound) or to (inbound)
    /// `identity`.
    pub fn get(&self, identity: &Identity) -> Option<&Arc<TlsConfigs>> {
        self.configs.get(identity)
    }

    /// In no particular order.
    pub fn identities(&self) -> impl ExactSizeIterator<Item = &Identity> + '_ {
        self.configs.keys()
    }

    /// In no particular order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Arc<TlsConfigs>> + '_ {
        self.configs.values()
    }

    pub fn len(&self) -> usize {
        self.configs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }
}

impl fmt::Debug for CertSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<String> = self.configs.keys().map(ToString::to_string).collect();
        ids.sort();
        f.debug_struct("CertSnapshot")
            .field("version", &self.version)
            .field("identities", &ids)
            .finish()
    }
}

impl sealed::Stamp for CertSnapshot {
    fn initial() -> Self {
        CertSnapshot::empty()
    }
    fn stamp(&mut self, version: u64) {
        self.version = version;
    }
}
impl Published for CertSnapshot {}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(transparent)]
    Issue(#[from] CaError),
    #[error("certificate for {identity}: {source}")]
    Tls {
        identity: Box<Identity>,
        source: TlsError,
    },
}

/// Signs a certificate for `identity` and builds its TLS configs.
pub fn issue_configs(
    ca: &BuiltinCa,
    identity: &Identity,
    validity: Duration,
) -> Result<Arc<TlsConfigs>, CertError> {
    let issued = ca.issue(identity, validity)?;
    let tls_err = |source| CertError::Tls {
        identity: Box::new(identity.clone()),
        source,
    };
    let cert = issued.to_workload_cert().map_err(tls_err)?;
    Ok(Arc::new(build_tls_configs(&cert).map_err(tls_err)?))
}

/// Issues every identity up front (at startup, so certificates exist before
/// the cores start). Fails on the first error.
pub fn issue_all(
    ca: &BuiltinCa,
    identities: impl IntoIterator<Item = Identity>,
    validity: Duration,
) -> Result<CertSnapshot, CertError> {
    let mut configs = Vec::new();
    for identity in identities {
        let c = issue_configs(ca, &identity, validity)?;
        log_issued(&c);
        configs.push(c);
    }
    Ok(CertSnapshot::new(configs))
}

/// The identities this node needs certificates for: those of the HBONE
/// workloads whose `node` is `node` (every node when `None`). A TCP
/// (non-mesh) workload neither serves HBONE nor sends through ringway, so
/// it gets none, as in ztunnel; a certificate that turns out to be needed
/// anyway is still fetched on first use.
pub fn wanted_identities(snapshot: &Snapshot, node: Option<&str>) -> BTreeSet<Identity> {
    snapshot
        .workloads()
        .filter(|w| w.protocol == TunnelProtocol::Hbone)
        .filter(|w| node.is_none_or(|n| w.node == n))
        .map(|w| w.identity())
        .collect()
}

/// When a certificate is re-issued: half-way through its lifetime, counted
/// from issuance (our `not_before` is backdated by [`CLOCK_SKEW_ALLOWANCE`]).
pub fn refresh_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let issued = not_before + CLOCK_SKEW_ALLOWANCE;
    let start = if issued < not_after {
        issued
    } else {
        not_before
    };
    let lifetime = not_after.duration_since(start).unwrap_or_default();
    start + lifetime / 2
}

fn log_issued(c: &TlsConfigs) {
    let valid_for = c
        .not_after
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tracing::info!(
        identity = %c.identity,
        valid_for_secs = valid_for.as_secs(),
        "issued workload certificate"
    );
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<CertSnapshot>();
    send_sync::<CertError>();
    send_sync::<CertPublisher>();
    send::<CertFeed>();
};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::Workload;

    pub(crate) const TD: &str = "cluster.local";

    pub(crate) fn workload(uid: &str, ip: &str, node: &str, ns: &str, sa: &str) -> Workload {
        Workload {
            uid: uid.into(),
            addresses: vec![ip.parse().unwrap()].into(),
            node: node.into(),
            namespace: ns.into(),
            service_account: sa.into(),
            protocol: TunnelProtocol::Hbone,
            ..Workload::default()
        }
    }

    pub(crate) fn snapshot(workloads: Vec<Workload>) -> Snapshot {
        Snapshot::new(workloads, vec![], vec![]).unwrap()
    }

    #[test]
    fn issue_all_and_lookups() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(tmp.path(), TD).unwrap();
        let a = Identity::new(TD, "a", "x");
        let b = Identity::new(TD, "b", "y");
        let snap = issue_all(&ca, [a.clone(), b.clone()], Duration::from_secs(3600)).unwrap();
        assert_eq!(snap.len(), 2);
        assert!(!snap.is_empty());
        assert_eq!(snap.version(), 0);
        assert_eq!(snap.get(&a).unwrap().identity, a);
        assert_eq!(snap.get(&b).unwrap().identity, b);
        assert!(snap.get(&Identity::new(TD, "c", "z")).is_none());
        assert_eq!(snap.iter().count(), 2);

        let err = issue_all(
            &ca,
            [Identity::new("other", "a", "x")],
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert!(err.to_string().contains("signs for trust domain"), "{err}");

        let publisher = CertPublisher::new();
        let feed = publisher.subscribe();
        assert!(feed.current().is_empty());
        assert_eq!(publisher.publish(snap), 1);
        assert_eq!(feed.load().version(), 1);
        assert_eq!(feed.current().len(), 2);
    }

    #[test]
    fn refresh_is_half_way_through_the_lifetime_from_issuance() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let day = Duration::from_secs(86400);
        // Our own certificates: backdated by the skew allowance.
        let not_before = t0 - CLOCK_SKEW_ALLOWANCE;
        assert_eq!(refresh_at(not_before, t0 + day), t0 + day / 2);
        // Even for lifetimes shorter than the allowance.
        assert_eq!(
            refresh_at(not_before, t0 + Duration::from_secs(2)),
            t0 + Duration::from_secs(1)
        );
        // Degenerate: shorter than the allowance altogether.
        assert_eq!(
            refresh_at(t0, t0 + Duration::from_secs(10)),
            t0 + Duration::from_secs(5)
        );
    }

    #[test]
    fn wanted_identities_follow_the_node() {
        let snap = snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
            workload("w3", "10.0.0.3", "n1", "a", "x"),
            workload("w4", "10.0.0.4", "n2", "c", "z"),
            Workload {
                protocol: TunnelProtocol::None,
                ..workload("w5", "10.0.0.5", "n1", "tcp", "only")
            },
        ]);
        let on_n1: Vec<String> = wanted_identities(&snap, Some("n1"))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            on_n1,
            [
                "spiffe://cluster.local/ns/a/sa/x",
                "spiffe://cluster.local/ns/b/sa/y"
            ]
        );
        assert_eq!(wanted_identities(&snap, None).len(), 3);
        assert!(wanted_identities(&snap, Some("n3")).is_empty());
    }
}
