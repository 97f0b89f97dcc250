//! Inbound authorization on a core: every path that delivers traffic to a
//! local workload (HBONE 15008, plaintext 15006, and any in-process path
//! added later) asks [`admit`] before a byte reaches the application, and
//! keeps the [`Ticket`] it gets for the connection's life.
//!
//! Late rejection: the core registers every admitted connection. When a new
//! snapshot arrives, [`Registry::recheck`] decides each again whose
//! destination workload or policy set changed, and revokes the ones now
//! denied; the connection's task sees [`Ticket::revoked`] resolve, drops
//! its sockets (an HBONE stream is reset) and logs why. Everything is
//! core-local: no locks, no cross-core traffic.
//!
//! The decision itself (which policies, in which order, what matches) is
//! [`ringway_controlplane::model::authz`]; this module only feeds it and
//! acts on the verdict.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

use ringway_controlplane::model::authz::{Conn, DryRun};
use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::model::routing::is_waypoint_identity;
use ringway_controlplane::model::Workload;
use ringway_controlplane::Snapshot;
use slab::Slab;

use crate::core::config::ProxyConfig;

/// The workload at `ip` if this node serves it: on this node's network
/// and, when `--node-name` is set, on this node.
pub fn local_workload<'s>(
    snap: &'s Snapshot,
    cfg: &ProxyConfig,
    ip: IpAddr,
) -> Option<&'s Arc<Workload>> {
    snap.workload_by_addr(&cfg.network, ip)
        .filter(|w| cfg.node_name.as_ref().is_none_or(|n| w.node == *n))
}

/// An inbound connection as authorization sees it.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The TCP peer (for HBONE, the tunnel's, not `forwarded`'s).
    pub src: IpAddr,
    /// The destination workload's address and the application port.
    pub dst: SocketAddr,
    /// The mTLS peer; None for plaintext.
    pub peer: Option<Rc<Identity>>,
}

impl Inbound {
    fn conn(&self) -> Conn<'_> {
        Conn {
            src: self.src,
            dst: self.dst,
            peer: self.peer.as_deref(),
        }
    }
}

/// Why a connection may not reach its destination.
#[derive(Debug)]
pub enum Refused {
    /// No local workload at the destination address.
    NotLocal(IpAddr),
    /// The policies said no; the text names the deciding policy
    /// (`explicitly denied by ns/name`, `allow policies exist, but none
    /// allowed`, ...).
    Denied(String),
    /// The destination has a waypoint and the mTLS peer is not it: the
    /// traffic went around the waypoint (and so around its policy).
    BypassedWaypoint(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotLocal(ip) => write!(f, "no local workload at {ip}"),
            Refused::Denied(why) => write!(f, "authorization policy: {why}"),
            Refused::BypassedWaypoint(waypoint) => write!(
                f,
                "the destination's traffic must come through its waypoint {waypoint}"
            ),
        }
    }
}

/// Decides `conn` against `snap`: the destination must be a local workload
/// and its policies must allow the connection. Dry-run outcomes are logged
/// (target `authz`).
pub fn decide(snap: &Snapshot, cfg: &ProxyConfig, conn: &Inbound) -> Result<(), Refused> {
    decide_reporting(snap, cfg, conn, &mut |d| log_dry_run(&d, conn))
}

fn decide_reporting<'s>(
    snap: &'s Snapshot,
    cfg: &ProxyConfig,
    conn: &Inbound,
    dry_run: &mut dyn FnMut(DryRun<'s>),
) -> Result<(), Refused> {
    let workload =
        local_workload(snap, cfg, conn.dst.ip()).ok_or(Refused::NotLocal(conn.dst.ip()))?;
    // HBONE only: plaintext has no identity to compare (its policies
    // still apply below).
    if let (Some(gw), Some(peer)) = (&workload.waypoint, conn.peer.as_deref()) {
        if !is_waypoint_identity(snap, &cfg.network, gw, peer) {
            return Err(Refused::BypassedWaypoint(gw.destination.to_string()));
        }
    }
    match snap.authorize(workload, &conn.conn(), dry_run) {
        v if v.allowed() => Ok(()),
        v => Err(Refused::Denied(v.to_string())),
    }
}

fn log_dry_run(d: &DryRun<'_>, conn: &Inbound) {
    let policy = d.policy().map_or("-", |p| p.key());
    let peer = conn.peer.as_deref();
    tracing::event!(
        target: "authz",
        tracing::Level::INFO,
        {
            policy,
            src.addr = %conn.src,
            dst.addr = %conn.dst,
            src.identity = peer.map(tracing::field::display),
        },
        "{}",
        d.message()
    );
}

/// Admits `conn` on this core: decides it against the core's current
/// snapshot and, if allowed, registers it for late rejection.
pub fn admit(
    registry: &Rc<Registry>,
    snap: &Snapshot,
    cfg: &ProxyConfig,
    conn: Inbound,
) -> Result<Ticket, Refused> {
    decide(snap, cfg, &conn)?;
    let key = registry.conns.borrow_mut().insert(Tracked {
        conn,
        revoked: None,
        waker: None,
    });
    Ok(Ticket {
        registry: registry.clone(),
        key,
    })
}

/// One admitted connection.
struct Tracked {
    conn: Inbound,
    /// Set when a later snapshot denies it: why.
    revoked: Option<String>,
    /// The connection's task, waiting in [`Ticket::revoked`].
    waker: Option<Waker>,
}

/// This core's admitted inbound connections.
#[derive(Default)]
pub struct Registry {
    conns: RefCell<Slab<Tracked>>,
    /// Connections closed by late rejection since start.
    late_rejections: Cell<u64>,
}

/// What one [`Registry::recheck`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recheck {
    /// Decided again (their destination or the policies changed).
    pub checked: usize,
    /// Revoked: now denied.
    pub revoked: usize,
}

impl std::ops::AddAssign for Recheck {
    fn add_assign(&mut self, other: Recheck) {
        self.checked += other.checked;
        self.revoked += other.revoked;
    }
}

impl Registry {
    /// Connections open (admitted and not yet closed).
    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections closed by late rejection since start.
    pub fn late_rejections(&self) -> u64 {
        self.late_rejections.get()
    }

    /// The registration keys of the open connections, for
    /// [`recheck`](Self::recheck) in batches.
    pub fn keys(&self) -> Vec<usize> {
        self.conns.borrow().iter().map(|(k, _)| k).collect()
    }

    /// Decides again, against `new`, each open connection among `keys`
    /// whose verdict may differ from the one `old` gave: its destination
    /// workload changed, or the policies that apply to it did. Revokes the
    /// ones now refused; their tasks close them. Keys no longer open are
    /// skipped (one reused meanwhile belongs to a connection admitted
    /// against `new`, and stays allowed). Dry runs are not reported again.
    pub fn recheck(
        &self,
        keys: &[usize],
        old: &Snapshot,
        new: &Snapshot,
        cfg: &ProxyConfig,
    ) -> Recheck {
        let same_policies = old.policy_epoch() == new.policy_epoch();
        let mut out = Recheck::default();
        let mut conns = self.conns.borrow_mut();
        for &key in keys {
            let Some(t) = conns.get_mut(key) else {
                continue;
            };
            if t.revoked.is_some() {
                continue;
            }
            let ip = t.conn.dst.ip();
            let unchanged = match (local_workload(old, cfg, ip), local_workload(new, cfg, ip)) {
                (Some(a), Some(b)) => {
                    Arc::ptr_eq(a, b) && (same_policies || new.same_policies_for(old, b))
                }
                (None, None) => true,
                _ => false,
            };
            if unchanged {
                continue;
            }
            out.checked += 1;
            if let Err(refused) = decide_reporting(new, cfg, &t.conn, &mut |_| {}) {
                out.revoked += 1;
                t.revoked = Some(format!("late rejection: {refused}"));
                if let Some(w) = t.waker.take() {
                    w.wake();
                }
            }
        }
        self.late_rejections
            .set(self.late_rejections.get() + out.revoked as u64);
        out
    }

    /// Revokes the open streams of one inbound HBONE connection, those
    /// admitted with its `peer` (the connection's own `Rc`, shared by its
    /// streams only), for `why`; their tasks log it and reset them. Not a
    /// late rejection (policy did not change): not counted as one.
    pub fn revoke_streams_of(&self, peer: &Rc<Identity>, why: &str) -> usize {
        let mut n = 0;
        for (_, t) in self.conns.borrow_mut().iter_mut() {
            let ours = t.conn.peer.as_ref().is_some_and(|p| Rc::ptr_eq(p, peer));
            if !ours || t.revoked.is_some() {
                continue;
            }
            n += 1;
            t.revoked = Some(why.to_owned());
            if let Some(w) = t.waker.take() {
                w.wake();
            }
        }
        n
    }

    /// Whether a stream admitted with `peer` is still open.
    pub fn has_streams_of(&self, peer: &Rc<Identity>) -> bool {
        self.conns
            .borrow()
            .iter()
            .any(|(_, t)| t.conn.peer.as_ref().is_some_and(|p| Rc::ptr_eq(p, peer)))
    }
}

/// An admitted connection's registration; dropping it (when the
/// connection ends) unregisters it.
pub struct Ticket {
    registry: Rc<Registry>,
    key: usize,
}

impl Ticket {
    /// Resolves, with the reason, once a later snapshot denies the
    /// connection; pending for as long as it stays allowed.
    pub async fn revoked(&self) -> String {
        futures_lite::future::poll_fn(|cx| {
            let mut conns = self.registry.conns.borrow_mut();
            let t = &mut conns[self.key];
            if let Some(why) = &t.revoked {
                return Poll::Ready(why.clone());
            }
            if !t.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                t.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.registry.conns.borrow_mut().remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_controlplane::sources::local::load_snapshot;

    fn cfg(node: Option<&str>) -> ProxyConfig {
        let mut c = crate::app::cli::test_args().proxy_config();
        c.node_name = node.map(str::to_owned);
        c
    }

    const BASE: &str = r#"
workloads:
- uid: srv
  name: srv
  namespace: shop
  serviceAccount: srv
  workloadIps: ["10.0.0.2"]
  protocol: HBONE
  node: node-b
- uid: elsewhere
  name: elsewhere
  namespace: shop
  workloadIps: ["10.0.0.3"]
  protocol: HBONE
  node: node-c
"#;

    fn snap(policies: &str) -> Snapshot {
        load_snapshot(&format!("{BASE}{policies}"), "test").unwrap()
    }

    const DENY_BOB: &str = r#"
policies:
- name: deny-bob
  namespace: shop
  scope: Namespace
  action: Deny
  rules: [[[ {principals: [{exact: "cluster.local/ns/b/sa/bob"}]} ]]]
"#;

    fn from(peer: &str, dst: &str) -> Inbound {
        Inbound {
            src: "10.0.0.1".parse().unwrap(),
            dst: dst.parse().unwrap(),
            peer: Some(Rc::new(peer.parse().unwrap())),
        }
    }

    const ALICE: &str = "spiffe://cluster.local/ns/a/sa/alice";
    const BOB: &str = "spiffe://cluster.local/ns/b/sa/bob";

    #[test]
    fn decides_local_workloads_only() {
        let s = snap(DENY_BOB);
        let c = cfg(Some("node-b"));
        assert!(decide(&s, &c, &from(ALICE, "10.0.0.2:80")).is_ok());
        let denied = decide(&s, &c, &from(BOB, "10.0.0.2:80")).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "authorization policy: explicitly denied by shop/deny-bob"
        );
        // On another node: not ours to serve.
        assert!(matches!(
            decide(&s, &c, &from(ALICE, "10.0.0.3:80")),
            Err(Refused::NotLocal(_))
        ));
        assert!(decide(&s, &cfg(None), &from(ALICE, "10.0.0.3:80")).is_ok());
        assert!(matches!(
            decide(&s, &c, &from(ALICE, "10.0.0.9:80")),
            Err(Refused::NotLocal(_))
        ));
    }

    #[test]
    fn recheck_revokes_what_a_new_snapshot_denies() {
        let registry = Rc::new(Registry::default());
        let c = cfg(None);
        let open = snap("policies: []\n");
        let alice = admit(&registry, &open, &c, from(ALICE, "10.0.0.2:80")).unwrap();
        let bob = admit(&registry, &open, &c, from(BOB, "10.0.0.2:80")).unwrap();
        assert_eq!(registry.len(), 2);

        // Same policies, same workloads: nothing to decide again.
        let same = open.clone();
        assert_eq!(
            registry.recheck(&registry.keys(), &open, &same, &c),
            Recheck::default()
        );

        let strict = snap(DENY_BOB);
        let r = registry.recheck(&registry.keys(), &open, &strict, &c);
        assert_eq!(
            r,
            Recheck {
                checked: 2,
                revoked: 1
            }
        );
        assert_eq!(registry.late_rejections(), 1);
        let why = futures_lite::future::block_on(bob.revoked());
        assert_eq!(
            why,
            "late rejection: authorization policy: explicitly denied by shop/deny-bob"
        );
        // Alice stays allowed: her revocation never resolves.
        let pending = futures_lite::future::block_on(futures_lite::future::poll_once(
            std::pin::pin!(alice.revoked()),
        ));
        assert!(pending.is_none());

        // The destination workload disappears (in a fresh build, which
        // also takes a new policy epoch): Alice's connection closes too.
        let gone = load_snapshot(&format!("workloads: []\n{DENY_BOB}"), "test").unwrap();
        let r = registry.recheck(&registry.keys(), &strict, &gone, &c);
        assert_eq!(r.revoked, 1, "{r:?}");
        drop((alice, bob));
        assert!(registry.is_empty());
    }

    /// istiod sends a new policy first, then the workload that selects it:
    /// the second snapshot keeps the policy epoch, and only the workload
    /// changed. That must still close what the policy denies.
    #[test]
    fn recheck_follows_a_workload_that_starts_selecting_a_policy() {
        let registry = Rc::new(Registry::default());
        let c = cfg(None);
        let unselected = snap(&DENY_BOB.replace("scope: Namespace", "scope: WorkloadSelector"));
        let bob = admit(&registry, &unselected, &c, from(BOB, "10.0.0.2:80")).unwrap();
        let _alice = admit(&registry, &unselected, &c, from(ALICE, "10.0.0.2:80")).unwrap();
        let mut srv = (**unselected.workload_by_uid("srv").unwrap()).clone();
        srv.authorization_policies = vec!["shop/deny-bob".into()].into();
        let selected = unselected
            .apply(ringway_controlplane::SnapshotDelta {
                upsert_workloads: vec![srv],
                ..Default::default()
            })
            .snapshot;
        assert_eq!(selected.policy_epoch(), unselected.policy_epoch());
        let r = registry.recheck(&registry.keys(), &unselected, &selected, &c);
        assert_eq!(
            r,
            Recheck {
                checked: 2,
                revoked: 1
            }
        );
        let why = futures_lite::future::block_on(bob.revoked());
        assert!(why.ends_with("explicitly denied by shop/deny-bob"), "{why}");
        // An unrelated change after that: Alice's connection is not decided
        // again.
        let unrelated = selected
            .apply(ringway_controlplane::SnapshotDelta {
                remove_workloads: vec!["elsewhere".into()],
                ..Default::default()
            })
            .snapshot;
        let r = registry.recheck(&registry.keys(), &selected, &unrelated, &c);
        assert_eq!(r, Recheck::default());
        // A policy for another namespace: a new policy epoch, but not
        // Alice's policies.
        let mut elsewhere = unrelated.policy("shop/deny-bob").unwrap().as_ref().clone();
        elsewhere.namespace = "other".into();
        elsewhere.scope = ringway_controlplane::model::PolicyScope::Namespace;
        let other_ns = unrelated
            .apply(ringway_controlplane::SnapshotDelta {
                upsert_policies: vec![elsewhere],
                ..Default::default()
            })
            .snapshot;
        assert_ne!(other_ns.policy_epoch(), unrelated.policy_epoch());
        let r = registry.recheck(&registry.keys(), &unrelated, &other_ns, &c);
        assert_eq!(r, Recheck::default());
    }
}
