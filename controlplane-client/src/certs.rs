//! The certificates the cores use: an immutable [`CertSnapshot`] of ready-built
//! TLS configs per local identity, handed over like the configuration
//! snapshot ([`CertPublisher`] on the control thread, [`CertFeed`] on the
//! cores), plus the helpers around it: startup issuance ([`issue_all`]),
//! which identities a node needs ([`wanted_identities`]), when to renew
//! ([`refresh_at`]) and the built-in CA's manager
//! ([`run_builtin_cert_manager`], a [`CertManager`] over a [`BuiltinCa`];
//! see [`crate::certmanager`]).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::ca::{BuiltinCa, CaError, CLOCK_SKEW_ALLOWANCE};
use crate::certmanager::{BuiltinCaSource, CertManager, CertManagerConfig};
use crate::identity::Identity;
use crate::publish::{sealed, Feed, Published, Publisher};
use crate::snapshot::Snapshot;
use crate::tls::{build_tls_configs, TlsConfigs, TlsError};
use crate::SnapshotFeed;

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

/// The identities this node needs certificates for: those of the workloads
/// whose `node` is `node`, or of every workload when `node` is `None`.
pub fn wanted_identities(snapshot: &Snapshot, node: Option<&str>) -> BTreeSet<Identity> {
    snapshot
        .workloads()
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

/// The built-in certificate manager: a [`CertManager`] over the built-in CA
/// ([`BuiltinCaSource`], `validity` long) prefetching the identities of the
/// workloads on `node` (all workloads when `None`). Certificates already in
/// `certs` (e.g. from [`issue_all`]) are adopted; identities that leave the
/// node are dropped; each is re-issued at half its lifetime; failures back
/// off while a still-valid certificate is kept. Returns when the workload
/// feed closes. Cores have no way to ask this one for certificates; build
/// the [`CertManager`] directly for that.
pub async fn run_builtin_cert_manager(
    ca: Arc<BuiltinCa>,
    workloads: SnapshotFeed,
    certs: CertPublisher,
    node: Option<String>,
    validity: Duration,
) {
    let source = Arc::new(BuiltinCaSource::new(ca, validity));
    let config = CertManagerConfig {
        node,
        ..CertManagerConfig::default()
    };
    CertManager::new(source, workloads, certs, config)
        .run()
        .await
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
    send_sync::<CertSnapshot>();
    send_sync::<CertError>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Workload;
    use crate::SnapshotPublisher;

    const TD: &str = "cluster.local";

    fn workload(uid: &str, ip: &str, node: &str, ns: &str, sa: &str) -> Workload {
        Workload {
            uid: uid.into(),
            addresses: vec![ip.parse().unwrap()],
            node: node.into(),
            namespace: ns.into(),
            service_account: sa.into(),
            ..Workload::default()
        }
    }

    fn snapshot(workloads: Vec<Workload>) -> Snapshot {
        Snapshot::new(workloads, vec![], vec![]).unwrap()
    }

    fn ids(snap: &CertSnapshot) -> BTreeSet<String> {
        snap.identities().map(ToString::to_string).collect()
    }

    /// Waits (bounded) until the feed's current snapshot satisfies `done`.
    async fn wait_for(
        feed: &mut CertFeed,
        done: impl Fn(&CertSnapshot) -> bool,
    ) -> Arc<CertSnapshot> {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let current = feed.current();
                if done(&current) {
                    return current;
                }
                feed.changed().await.expect("publisher alive");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out; last: {:?}", feed.current()))
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

    #[tokio::test]
    async fn manager_follows_the_workloads_on_its_node() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Arc::new(BuiltinCa::load_or_create(tmp.path(), TD).unwrap());
        let workloads = SnapshotPublisher::new();
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
            workload("w3", "10.0.0.3", "n2", "c", "z"),
        ]));
        let certs = CertPublisher::new();
        let mut feed = certs.subscribe();
        let manager = tokio::spawn(run_builtin_cert_manager(
            ca.clone(),
            workloads.subscribe(),
            certs.clone(),
            Some("n1".into()),
            DEFAULT_VALIDITY_FOR_TESTS,
        ));

        let first = wait_for(&mut feed, |s| !s.is_empty()).await;
        assert_eq!(
            ids(&first),
            BTreeSet::from([
                "spiffe://cluster.local/ns/a/sa/x".to_owned(),
                "spiffe://cluster.local/ns/b/sa/y".to_owned()
            ])
        );
        let kept = first.get(&Identity::new(TD, "a", "x")).unwrap().clone();

        // w2 leaves, w4 (another node) arrives: only a/x remains, and it is
        // the same configs, not a re-issue.
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w3", "10.0.0.3", "n2", "c", "z"),
            workload("w4", "10.0.0.4", "n2", "d", "w"),
        ]));
        let second = wait_for(&mut feed, |s| s.len() == 1).await;
        assert_eq!(
            ids(&second),
            BTreeSet::from(["spiffe://cluster.local/ns/a/sa/x".to_owned()])
        );
        assert!(Arc::ptr_eq(
            second.get(&Identity::new(TD, "a", "x")).unwrap(),
            &kept
        ));

        // A workload whose identity the CA refuses is skipped, not fatal.
        workloads.publish(snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w5", "10.0.0.5", "n1", "", "broken"),
            workload("w6", "10.0.0.6", "n1", "e", "v"),
        ]));
        let third = wait_for(&mut feed, |s| s.len() == 2).await;
        assert!(third.get(&Identity::new(TD, "e", "v")).is_some());

        drop(workloads);
        tokio::time::timeout(Duration::from_secs(10), manager)
            .await
            .expect("manager stops when the workload feed closes")
            .unwrap();
    }

    const DEFAULT_VALIDITY_FOR_TESTS: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn manager_reissues_at_half_lifetime_and_reuses_startup_certs() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Arc::new(BuiltinCa::load_or_create(tmp.path(), TD).unwrap());
        let workloads = SnapshotPublisher::new();
        let snap = snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
        ]);
        // b/y comes from startup with a long lifetime; a/x is short-lived.
        let short = Duration::from_secs(2);
        let startup = issue_all(
            &ca,
            [Identity::new(TD, "b", "y")],
            DEFAULT_VALIDITY_FOR_TESTS,
        )
        .unwrap();
        workloads.publish(snap);
        let certs = CertPublisher::new();
        certs.publish(startup);
        let long_lived = certs
            .current()
            .get(&Identity::new(TD, "b", "y"))
            .unwrap()
            .clone();
        let mut feed = certs.subscribe();
        let manager = tokio::spawn(run_builtin_cert_manager(
            ca,
            workloads.subscribe(),
            certs.clone(),
            None,
            short,
        ));

        let a = Identity::new(TD, "a", "x");
        let first = wait_for(&mut feed, |s| s.get(&a).is_some()).await;
        let first_not_after = first.get(&a).unwrap().not_after;
        let renewed = wait_for(&mut feed, |s| {
            s.get(&a).is_some_and(|c| c.not_after > first_not_after)
        })
        .await;
        assert!(renewed.version() > first.version());
        assert_eq!(renewed.len(), 2);
        assert!(
            Arc::ptr_eq(
                renewed.get(&Identity::new(TD, "b", "y")).unwrap(),
                &long_lived
            ),
            "the startup certificate is reused, not re-issued"
        );
        manager.abort();
    }
}
