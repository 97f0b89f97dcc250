//! Admission of accepted connections: a core's count of them per listener
//! path and per peer address, against its caps ([`ConnCaps`]), and the
//! wake-up of accept loops that stopped at a cap when one closes. Kept
//! by the core (`CoreInputs::admission`), used by `proxy::accept`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::core::config::ConnCaps;
use crate::io::listener::TrafficPath;
use crate::telemetry::ratelog::RateLog;

/// A core's count of accepted connections per listener path, against its
/// [`ConnCaps`]. A connection counts from accept until its task ends
/// ([`Admitted`]); HBONE streams are not counted here (they are not
/// sockets the listener handed over).
pub struct Admission {
    caps: ConnCaps,
    open: [Cell<usize>; 4],
    /// Accepted connections per peer address, over the inbound paths.
    peers: RefCell<HashMap<IpAddr, usize>>,
    /// Accept loops waiting for a connection to close (a cap bit, or the
    /// fd table was full).
    waiters: RefCell<Vec<Waker>>,
    /// At most one "not accepting" line per second per core.
    pub log: RateLog,
}

impl Admission {
    pub fn new(caps: ConnCaps) -> Self {
        Admission {
            caps,
            open: Default::default(),
            peers: RefCell::default(),
            waiters: RefCell::default(),
            log: RateLog::new("connection caps reached", 1),
        }
    }

    /// Accepted connections of `path` open on this core.
    pub fn open(&self, path: TrafficPath) -> usize {
        self.open[path.index()].get()
    }

    /// The cap `path` is at (its own or the total), if any.
    pub fn full(&self, path: TrafficPath) -> Option<usize> {
        let own = self.caps.of(path);
        if own != 0 && self.open(path) >= own {
            return Some(own);
        }
        let total = self.caps.total;
        let open: usize = self.open.iter().map(Cell::get).sum();
        (total != 0 && open >= total).then_some(total)
    }

    /// Counts a connection from `peer` in; Err(cap) when `peer` already
    /// holds its share of `path` (nothing counted then).
    pub fn admit(
        self: &Rc<Self>,
        path: TrafficPath,
        peer: Option<IpAddr>,
    ) -> Result<Admitted, usize> {
        let peer_cap = self.caps.of_peer(path);
        let peer = peer.filter(|_| peer_cap != 0);
        if let Some(ip) = peer {
            let mut peers = self.peers.borrow_mut();
            let held = peers.entry(ip).or_default();
            if *held >= peer_cap {
                return Err(peer_cap);
            }
            *held += 1;
        }
        let slot = &self.open[path.index()];
        slot.set(slot.get() + 1);
        Ok(Admitted {
            admission: self.clone(),
            path,
            peer,
        })
    }

    /// Resolves at the next close of an accepted connection on this core.
    pub fn closed(&self) -> impl Future<Output = ()> + '_ {
        let mut registered = false;
        futures_lite::future::poll_fn(move |cx| {
            if registered {
                return Poll::Ready(());
            }
            registered = true;
            self.waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
    }
}

/// One accepted connection's place under the caps, given back when its
/// task ends (which has closed its socket).
pub struct Admitted {
    admission: Rc<Admission>,
    path: TrafficPath,
    /// Set when counted against a per-peer cap.
    peer: Option<IpAddr>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let a = &self.admission;
        let slot = &a.open[self.path.index()];
        slot.set(slot.get() - 1);
        if let Some(ip) = self.peer {
            let mut peers = a.peers.borrow_mut();
            if let Some(held) = peers.get_mut(&ip) {
                *held -= 1;
                if *held == 0 {
                    peers.remove(&ip);
                }
            }
        }
        // Taken out before waking: a woken task may register again.
        let waiters = std::mem::take(&mut *a.waiters.borrow_mut());
        waiters.into_iter().for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(total: usize, inbound: usize, per_peer: usize) -> ConnCaps {
        ConnCaps {
            total,
            inbound,
            per_peer,
            ..ConnCaps::default()
        }
    }

    /// A path's own cap bites before the total; the total covers every
    /// path; a closed connection frees its place.
    #[test]
    fn caps_count_per_path_and_in_total() {
        let a = Rc::new(Admission::new(caps(3, 2, 0)));
        let i1 = a.admit(TrafficPath::Inbound, None).unwrap();
        let _i2 = a.admit(TrafficPath::Inbound, None).unwrap();
        assert_eq!(a.full(TrafficPath::Inbound), Some(2));
        assert_eq!(a.full(TrafficPath::Outbound), None);
        let _o = a.admit(TrafficPath::Outbound, None).unwrap();
        assert_eq!(a.full(TrafficPath::Outbound), Some(3));
        drop(i1);
        assert_eq!(a.full(TrafficPath::Inbound), None);
        assert_eq!(a.open(TrafficPath::Inbound), 1);
    }

    /// One peer address gets its share over both inbound paths; another
    /// peer, and outbound sources, are not held to it.
    #[test]
    fn one_peer_gets_its_share_and_no_more() {
        let a = Rc::new(Admission::new(caps(10, 0, 2)));
        let (p, q): (IpAddr, IpAddr) = ("10.0.0.9".parse().unwrap(), "10.0.0.1".parse().unwrap());
        let first = a.admit(TrafficPath::Inbound, Some(p)).unwrap();
        let _second = a.admit(TrafficPath::InboundPassthrough, Some(p)).unwrap();
        assert_eq!(a.admit(TrafficPath::Inbound, Some(p)).err(), Some(2));
        assert!(a.admit(TrafficPath::Inbound, Some(q)).is_ok());
        assert!(a.admit(TrafficPath::Outbound, Some(p)).is_ok());
        drop(first);
        assert!(a.admit(TrafficPath::Inbound, Some(p)).is_ok());
    }
}
