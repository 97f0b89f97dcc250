//! A core's TLS glue: the certificates it serves and presents (identity →
//! ready-built rustls configs), swapped in as the certificate manager
//! publishes, and the urgent path for one it does not have yet. Both HBONE
//! directions read it: the inbound path for the dialled workload's
//! certificate, the client for the source workload's.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::security::certmanager::{wait_for_cert, CertRequests};
use ringway_controlplane::security::certs::{CertFeed, CertSnapshot};
use ringway_controlplane::security::tls::TlsConfigs;

/// One core's certificates. Core-local (!Send).
pub struct Certificates {
    /// The current certificate snapshot. Connections clone the `Rc` (no
    /// atomic traffic between cores); [`follow`](Self::follow) swaps it.
    #[allow(clippy::redundant_allocation)] // the Rc is the point: core-local refcount
    current: RefCell<Rc<Arc<CertSnapshot>>>,
    /// What an urgent wait watches for the certificate to appear.
    feed: CertFeed,
    /// Set when a certificate manager serves urgent requests.
    requests: Option<CertRequests>,
    /// How long a connection waits for a certificate it needs now.
    wait_timeout: Duration,
}

impl Certificates {
    pub fn new(feed: CertFeed, requests: Option<CertRequests>, wait_timeout: Duration) -> Self {
        Certificates {
            current: RefCell::new(Rc::new(feed.current())),
            feed,
            requests,
            wait_timeout,
        }
    }

    #[allow(clippy::redundant_allocation)]
    pub fn current(&self) -> Rc<Arc<CertSnapshot>> {
        self.current.borrow().clone()
    }

    /// The TLS configs for `id`; when missing (or expired), asks the
    /// certificate manager urgently and waits at most
    /// `--cert-wait-timeout`. None means fail closed. Marks the
    /// certificate used, which keeps one fetched on demand.
    pub async fn get(&self, id: &Identity) -> Option<Arc<TlsConfigs>> {
        let now = SystemTime::now();
        if let Some(c) = self.current().get(id).filter(|c| c.not_after > now) {
            c.used.mark();
            return Some(c.clone());
        }
        let requests = self.requests.as_ref()?;
        let mut feed = self.feed.clone();
        wait_for_cert(
            &mut feed,
            requests,
            id,
            crate::io::executor::timer::sleep(self.wait_timeout),
        )
        .await
    }

    /// Follows `feed`'s publications into this core's slot, until the
    /// publisher is gone.
    pub async fn follow(&self, mut feed: CertFeed) {
        while feed.changed().await.is_ok() {
            *self.current.borrow_mut() = Rc::new(feed.current());
        }
    }
}
