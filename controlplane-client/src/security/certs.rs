//! The certificates the cores use: an immutable [`CertSnapshot`] of ready-built
//! TLS configs per local identity, handed over like the configuration
//! snapshot ([`CertPublisher`] on the control thread, [`CertFeed`] on the
//! cores), plus the helpers around it: startup issuance ([`issue_all`]),
//! which identities a node prefetches ([`LocalWorkloads`], [`local_identities`]) and when to renew
//! ([`refresh_at`]). The certificate manager that keeps a node's snapshot
//! current is built on these; this module does not depend on it.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::identity::Identity;
use crate::model::snapshot::Snapshot;
use crate::model::{TunnelProtocol, Workload};
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
/// anyway is still fetched on first use. ringway itself decides with
/// [`local_identities`], which knows the host's workloads without a node
/// name; this stays for tools that want every identity.
pub fn wanted_identities(snapshot: &Snapshot, node: Option<&str>) -> BTreeSet<Identity> {
    let local = match node {
        Some(n) => LocalWorkloads::Node(n.to_owned()),
        None => LocalWorkloads::All,
    };
    local_identities(snapshot, &local)
}

/// Which workloads are this node's own: their certificates are fetched
/// ahead of need (prefetch) and readiness waits for them. Any other
/// identity is fetched when a connection first needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalWorkloads {
    /// Every workload (tools; tests).
    All,
    /// Those whose `node` is this name (`--node-name`), as ztunnel does.
    Node(String),
    /// Without a node name, those ringway can see are here: a workload
    /// with one of these uids, or with one of these addresses. Node-level
    /// mode passes the host's interface addresses; in-pod mode the
    /// enrolled pods' workload uids and addresses.
    Hosted {
        uids: BTreeSet<String>,
        addrs: BTreeSet<IpAddr>,
    },
}

impl LocalWorkloads {
    /// The workloads at `addrs` (and `uids`). Loopback, unspecified and
    /// IPv6 link-local addresses are left out: every host has them, so
    /// they name no workload of this one.
    pub fn hosted(
        uids: impl IntoIterator<Item = String>,
        addrs: impl IntoIterator<Item = IpAddr>,
    ) -> LocalWorkloads {
        let workload_addr = |ip: &IpAddr| {
            !ip.is_loopback()
                && !ip.is_unspecified()
                && !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
        };
        LocalWorkloads::Hosted {
            uids: uids.into_iter().collect(),
            addrs: addrs.into_iter().filter(workload_addr).collect(),
        }
    }

    /// Whether `w` is one of this node's workloads (protocol aside).
    pub fn includes(&self, w: &Workload) -> bool {
        match self {
            LocalWorkloads::All => true,
            LocalWorkloads::Node(n) => *w.node == **n,
            LocalWorkloads::Hosted { uids, addrs } => {
                uids.contains(&*w.uid) || w.addresses.iter().any(|a| addrs.contains(a))
            }
        }
    }
}

/// The identities of this node's HBONE workloads (see [`LocalWorkloads`]):
/// the certificates prefetched, and the ones readiness waits for. A TCP
/// (non-mesh) workload neither serves HBONE nor sends through ringway, so
/// it gets none, as in ztunnel; a certificate that turns out to be needed
/// anyway is still fetched on first use.
pub fn local_identities(snapshot: &Snapshot, local: &LocalWorkloads) -> BTreeSet<Identity> {
    snapshot
        .workloads()
        .filter(|w| w.protocol == TunnelProtocol::Hbone)
        .filter(|w| local.includes(w))
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

    #[test]
    fn which_workloads_are_local() {
        let on = |uid: &str, ips: &[&str], node: &str| Workload {
            addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..workload(uid, "10.9.9.9", node, "ns", uid)
        };
        let host = |uids: &[&str], ips: &[&str]| {
            LocalWorkloads::hosted(
                uids.iter().map(|u| u.to_string()),
                ips.iter().map(|ip| ip.parse().unwrap()),
            )
        };
        let node = |n: &str| LocalWorkloads::Node(n.into());
        // (case, who is local, the workload, local?)
        let table = [
            (
                "all: any node",
                LocalWorkloads::All,
                on("w", &["10.0.0.1"], "n2"),
                true,
            ),
            (
                "all: no address",
                LocalWorkloads::All,
                on("w", &[], ""),
                true,
            ),
            (
                "node: same node",
                node("n1"),
                on("w", &["10.0.0.1"], "n1"),
                true,
            ),
            (
                "node: other node",
                node("n1"),
                on("w", &["10.0.0.1"], "n2"),
                false,
            ),
            (
                "node: none given by the workload",
                node("n1"),
                on("w", &["10.0.0.1"], ""),
                false,
            ),
            (
                "node: address on the host does not count",
                node("n1"),
                on("w", &["10.0.0.1"], "n2"),
                false,
            ),
            (
                "host: address assigned here",
                host(&[], &["10.0.0.1", "10.0.0.2"]),
                on("w", &["10.0.0.2"], "n9"),
                true,
            ),
            (
                "host: address elsewhere",
                host(&[], &["10.0.0.1"]),
                on("w", &["10.0.0.3"], ""),
                false,
            ),
            (
                "host: dual stack, v6 here",
                host(&[], &["fd00::7"]),
                on("w", &["10.0.0.3", "fd00::7"], ""),
                true,
            ),
            (
                "host: no address",
                host(&[], &["10.0.0.1"]),
                on("w", &[], ""),
                false,
            ),
            (
                "host: an enrolled pod's uid",
                host(&["uid-a"], &[]),
                on("uid-a", &["10.0.0.3"], ""),
                true,
            ),
            (
                "host: another pod's uid",
                host(&["uid-a"], &[]),
                on("uid-b", &["10.0.0.3"], ""),
                false,
            ),
            (
                "host: loopback names no workload",
                host(&[], &["127.0.0.1", "::1"]),
                on("w", &["127.0.0.1"], ""),
                false,
            ),
            (
                "host: unspecified names no workload",
                host(&[], &["0.0.0.0"]),
                on("w", &["0.0.0.0"], ""),
                false,
            ),
            (
                "host: link-local names no workload",
                host(&[], &["fe80::1"]),
                on("w", &["fe80::1"], ""),
                false,
            ),
            (
                "host: node name ignored",
                host(&[], &[]),
                on("w", &["10.0.0.1"], "n1"),
                false,
            ),
        ];
        for (case, local, w, want) in table {
            assert_eq!(local.includes(&w), want, "{case}");
        }
    }

    #[test]
    fn local_identities_are_hbone_workloads_at_this_host() {
        let snap = snapshot(vec![
            workload("w1", "10.0.0.1", "n1", "a", "x"),
            workload("w2", "10.0.0.2", "n1", "b", "y"),
            workload("w3", "10.0.0.3", "n2", "a", "x"),
            Workload {
                protocol: TunnelProtocol::None,
                ..workload("w4", "10.0.0.4", "n1", "tcp", "only")
            },
        ]);
        let ids = |local: LocalWorkloads| -> Vec<String> {
            local_identities(&snap, &local)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let host =
            |ips: &[&str]| LocalWorkloads::hosted([], ips.iter().map(|ip| ip.parse().unwrap()));
        assert_eq!(
            ids(host(&["10.0.0.3", "192.168.1.1"])),
            ["spiffe://cluster.local/ns/a/sa/x"]
        );
        // Two workloads of one identity: once.
        assert_eq!(
            ids(host(&["10.0.0.1", "10.0.0.3"])),
            ["spiffe://cluster.local/ns/a/sa/x"]
        );
        // A TCP workload gets no certificate ahead of need.
        assert!(ids(host(&["10.0.0.4"])).is_empty());
        assert!(ids(host(&[])).is_empty());
        assert_eq!(ids(LocalWorkloads::All).len(), 2);
        assert_eq!(
            ids(LocalWorkloads::Node("n1".into())),
            ids(host(&["10.0.0.1", "10.0.0.2"]))
        );
    }
}
