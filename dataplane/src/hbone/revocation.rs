//! Open HBONE connections against a reloaded CRL: each connection whose
//! handshake ran while a CRL was in force registers its peer's chain (as
//! (issuer, serial) pairs, [`PeerChain`]) here. When the control thread
//! installs a new CRL set, the core's watcher ([`Revocations::recheck`])
//! looks every registered chain up in it and sets the revoked ones'
//! latches; the connection's task closes it (inbound: the h2 connection
//! and its streams, logged; outbound: the pooled connection, which is
//! also marked broken so that no new stream picks it). Core-local: no
//! locks, no cross-core traffic. Without a CRL nothing is registered.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ringway_controlplane::security::crl::{CrlSet, CrlStore, PeerChain, Side};
use rustls_pki_types::CertificateDer;
use slab::Slab;

use crate::io::latch::Latch;

/// Why a revoked connection is closed, for the logs.
pub const REVOKED: &str = "peer certificate revoked by a reloaded CRL";

struct Watched {
    chain: PeerChain,
    side: Side,
    revoked: Rc<Latch>,
    /// Outbound: the pooled connection's `broken` flag, set at once so the
    /// pool stops handing it out before its driver task runs.
    broken: Option<Rc<Cell<bool>>>,
}

/// This core's HBONE connections opened while a CRL was in force.
#[derive(Default)]
pub struct Revocations {
    conns: RefCell<Slab<Watched>>,
}

/// A registered connection; dropping it (when the connection ends)
/// unregisters it.
pub struct Watching {
    registry: Rc<Revocations>,
    key: usize,
    /// Set when a reloaded CRL revokes the peer.
    pub revoked: Rc<Latch>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.registry.conns.borrow_mut().remove(self.key);
    }
}

/// What one [`Revocations::recheck`] closed, by direction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    pub inbound: u64,
    pub outbound: u64,
}

impl std::ops::AddAssign for Closed {
    fn add_assign(&mut self, other: Closed) {
        self.inbound += other.inbound;
        self.outbound += other.outbound;
    }
}

impl Revocations {
    /// Registers a connection whose handshake just verified `certs`; None
    /// (nothing kept) when no CRL is in force. A set installed between the
    /// handshake's check and this call applies here at once.
    pub fn watch(
        self: &Rc<Self>,
        store: &CrlStore,
        side: Side,
        certs: Option<&[CertificateDer<'_>]>,
        broken: Option<Rc<Cell<bool>>>,
    ) -> Option<Watching> {
        let (chain, already) = store.peer_chain(certs?)?;
        let revoked = Latch::new();
        let w = Watched {
            chain,
            side,
            revoked: revoked.clone(),
            broken,
        };
        if already {
            Self::revoke(&w);
            store.record_closed(side, 1);
        }
        let key = self.conns.borrow_mut().insert(w);
        Some(Watching {
            registry: self.clone(),
            key,
            revoked,
        })
    }

    /// The registration keys, for [`recheck`](Self::recheck) in batches.
    pub fn keys(&self) -> Vec<usize> {
        self.conns.borrow().iter().map(|(k, _)| k).collect()
    }

    /// Looks the connections among `keys` up in `set` and revokes those it
    /// lists. Keys no longer registered are skipped (one reused meanwhile
    /// was checked against `set` when it registered).
    pub fn recheck(&self, keys: &[usize], set: &CrlSet) -> Closed {
        let conns = self.conns.borrow();
        let mut out = Closed::default();
        for &key in keys {
            let Some(w) = conns.get(key) else {
                continue;
            };
            if w.revoked.is_set() || !set.revokes(&w.chain) {
                continue;
            }
            Self::revoke(w);
            match w.side {
                Side::Inbound => out.inbound += 1,
                Side::Outbound => out.outbound += 1,
            }
        }
        out
    }

    fn revoke(w: &Watched) {
        if let Some(b) = &w.broken {
            b.set(true);
        }
        w.revoked.set();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_controlplane::security::ca::{serial_of, DEFAULT_CERT_VALIDITY};
    use ringway_controlplane::BuiltinCa;
    use rustls_pki_types::pem::PemObject;

    /// Nothing is kept without a CRL; with one, a recheck against a set
    /// that revokes a peer sets its latch (and its pool flag), once, and
    /// leaves the others; a dropped registration is skipped.
    #[test]
    fn a_recheck_revokes_only_the_listed_peers() {
        let dir = tempfile::tempdir().unwrap();
        let ca = BuiltinCa::load_or_create(&dir.path().join("ca"), "cluster.local").unwrap();
        let id = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let leaf = || {
            let issued = ca.issue(&id, DEFAULT_CERT_VALIDITY).unwrap();
            let der = CertificateDer::from_pem_slice(issued.leaf_pem().as_bytes()).unwrap();
            (der, serial_of(issued.leaf_pem()).unwrap())
        };
        let ((doomed, serial), (spared, _), (gone, gone_serial)) = (leaf(), leaf(), leaf());
        let crl = |serials: &[Vec<u8>], n| {
            let pem = ca.issue_crl(serials, n, DEFAULT_CERT_VALIDITY).unwrap();
            CrlSet::parse(pem.into_bytes(), ca.roots()).unwrap()
        };
        let store = CrlStore::new();
        let registry = Rc::new(Revocations::default());
        let none = registry.watch(
            &store,
            Side::Inbound,
            Some(std::slice::from_ref(&doomed)),
            None,
        );
        assert!(none.is_none(), "no CRL, nothing kept");

        store.install(crl(&[vec![0x42]], 1));
        let broken = Rc::new(Cell::new(false));
        let d = registry.watch(
            &store,
            Side::Outbound,
            Some(&[doomed]),
            Some(broken.clone()),
        );
        let s = registry.watch(&store, Side::Inbound, Some(&[spared]), None);
        let g = registry.watch(&store, Side::Inbound, Some(&[gone]), None);
        let (d, s) = (d.unwrap(), s.unwrap());
        let keys = registry.keys();
        drop(g);
        let set = crl(&[serial, gone_serial], 2);
        let closed = registry.recheck(&keys, &set);
        assert_eq!(
            closed,
            Closed {
                inbound: 0,
                outbound: 1
            }
        );
        assert!(d.revoked.is_set() && broken.get());
        assert!(!s.revoked.is_set());
        assert_eq!(registry.recheck(&keys, &set), Closed::default(), "once");
    }
}
