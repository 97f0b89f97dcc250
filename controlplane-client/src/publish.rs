//! Hands snapshots (configuration, certificates) from the control thread to
//! the data-plane cores.
//!
//! Readers never take a lock: the current snapshot lives in an `ArcSwap`
//! (a per-connection `load` is a few atomics), and a `tokio::sync::watch`
//! carrying the version wakes tasks that must react to a change. Only the
//! `sync` part of tokio is used on the reader side, so a feed can be awaited
//! from any executor (the data plane's own included) without a tokio runtime.
//!
//! Generic over what is handed over; it uses only the [`model`](crate::model)
//! (for the [`Snapshot`] aliases), and whoever publishes something else
//! implements [`Published`] next to it.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::model::snapshot::Snapshot;

/// Something a [`Publisher`] hands out: it starts from an empty value and
/// carries the version the publisher stamps on it. Implemented by
/// [`Snapshot`] here and by the certificate snapshot in its own module;
/// sealed.
pub trait Published: sealed::Stamp + Send + Sync + 'static {}

pub(crate) mod sealed {
    pub trait Stamp {
        /// Version 0, before anything is published.
        fn initial() -> Self;
        fn stamp(&mut self, version: u64);
    }
}

impl sealed::Stamp for Snapshot {
    fn initial() -> Self {
        Snapshot::empty()
    }
    fn stamp(&mut self, version: u64) {
        self.set_version(version);
    }
}
impl Published for Snapshot {}

/// The configuration snapshot's publisher (control thread).
pub type SnapshotPublisher = Publisher<Snapshot>;
/// The configuration snapshot's feed (cores).
pub type SnapshotFeed = Feed<Snapshot>;
/// A borrowed view of the current snapshot; cheaper than cloning the `Arc`
/// (no shared refcount write), meant for short, non-`await`ing use.
pub type SnapshotGuard = Guard<Snapshot>;
/// A borrowed view of a feed's current value; see [`SnapshotGuard`].
pub type Guard<T> = arc_swap::Guard<Arc<T>>;

/// The publishing side. Cloning gives another handle to the same slot;
/// subscribers see [`Closed`] once every handle is dropped.
pub struct Publisher<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Publisher<T> {
    fn clone(&self) -> Self {
        Publisher {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<T> {
    /// Shared with every feed; kept apart from the sender so feeds don't keep
    /// the channel open.
    current: Arc<ArcSwap<T>>,
    version_tx: watch::Sender<u64>,
    /// Last version handed out; held across stamp + swap + notify so
    /// versions appear in order even with several publishing handles.
    last_version: Mutex<u64>,
}

impl<T: Published> Publisher<T> {
    /// Starts with the empty value at version 0.
    pub fn new() -> Publisher<T> {
        let (version_tx, _) = watch::channel(0);
        Publisher {
            inner: Arc::new(Inner {
                current: Arc::new(ArcSwap::from_pointee(T::initial())),
                version_tx,
                last_version: Mutex::new(0),
            }),
        }
    }

    /// Stamps the next version on `value`, makes it current and wakes the
    /// feeds. Returns the version.
    pub fn publish(&self, mut value: T) -> u64 {
        let mut last = self
            .inner
            .last_version
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let version = *last + 1;
        value.stamp(version);
        self.inner.current.store(Arc::new(value));
        *last = version;
        // Swap before notify: a woken reader always finds at least this one.
        self.inner.version_tx.send_replace(version);
        version
    }

    pub fn current(&self) -> Arc<T> {
        self.inner.current.load_full()
    }

    pub fn version(&self) -> u64 {
        *self.inner.version_tx.borrow()
    }

    /// A feed that will wake for versions published after this call.
    pub fn subscribe(&self) -> Feed<T> {
        Feed {
            current: self.inner.current.clone(),
            version_rx: self.inner.version_tx.subscribe(),
        }
    }
}

impl<T: Published> Default for Publisher<T> {
    fn default() -> Self {
        Publisher::new()
    }
}

/// The reading side, one per core (or per task that reacts to changes).
pub struct Feed<T> {
    current: Arc<ArcSwap<T>>,
    version_rx: watch::Receiver<u64>,
}

impl<T> Clone for Feed<T> {
    fn clone(&self) -> Self {
        Feed {
            current: self.current.clone(),
            version_rx: self.version_rx.clone(),
        }
    }
}

/// Every [`Publisher`] handle is gone; no new versions will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("snapshot publisher closed")]
pub struct Closed;

impl<T> Feed<T> {
    /// The latest published value (still readable after [`Closed`]).
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// Like [`current`](Self::current) without touching the shared refcount;
    /// for per-connection lookups. Don't hold it across an `await`.
    pub fn load(&self) -> Guard<T> {
        self.current.load()
    }

    /// The latest published version.
    pub fn version(&self) -> u64 {
        *self.version_rx.borrow()
    }

    /// Waits until a version newer than the last one this feed observed is
    /// published (versions published in between coalesce into one wake-up).
    pub async fn changed(&mut self) -> Result<(), Closed> {
        self.version_rx.changed().await.map_err(|_| Closed)?;
        self.version_rx.borrow_and_update();
        Ok(())
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<SnapshotPublisher>();
    send::<SnapshotFeed>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Workload;
    use std::time::Duration;

    fn one_workload(uid: &str) -> Snapshot {
        Snapshot::new(
            vec![Workload {
                uid: uid.into(),
                addresses: vec!["10.0.0.1".parse().unwrap()].into(),
                ..Workload::default()
            }],
            vec![],
            vec![],
        )
        .unwrap()
    }

    #[test]
    fn starts_empty_and_stamps_versions() {
        let publisher = SnapshotPublisher::new();
        let feed = publisher.subscribe();
        assert_eq!(publisher.version(), 0);
        assert_eq!(feed.current().version(), 0);
        assert!(feed.current().is_empty());

        assert_eq!(publisher.publish(one_workload("a")), 1);
        assert_eq!(publisher.clone().publish(one_workload("b")), 2);
        assert_eq!(publisher.version(), 2);
        assert_eq!(feed.version(), 2);
        let snap = feed.load();
        assert_eq!(snap.version(), 2);
        assert!(snap.workload_by_uid("b").is_some());
        assert!(snap.workload_by_uid("a").is_none());
        assert_eq!(publisher.current().version(), 2);
    }

    /// The feed is awaited on a thread with no tokio runtime (as on a data-plane
    /// core) while another thread publishes. Each publish comes once the
    /// reader is really waiting (its `changed` polled and pending), so that
    /// it is the publish's wake-up that ends the wait.
    #[test]
    fn feed_wakes_on_publish_from_another_thread() {
        use std::future::Future;
        let publisher = SnapshotPublisher::new();
        let mut feed = publisher.subscribe();
        let (waiting_tx, waiting) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            futures_lite::future::block_on(async {
                let mut seen = Vec::new();
                loop {
                    {
                        let mut changed = std::pin::pin!(feed.changed());
                        let mut told = false;
                        std::future::poll_fn(|cx| {
                            let r = changed.as_mut().poll(cx);
                            if r.is_pending() && !told {
                                told = true;
                                waiting_tx.send(()).unwrap();
                            }
                            r
                        })
                        .await
                        .expect("publisher alive");
                    }
                    let snap = feed.current();
                    seen.push(snap.version());
                    if snap.workload_by_uid("last").is_some() {
                        break;
                    }
                }
                // After the last handle is dropped the feed reports Closed,
                // and the final snapshot is still readable.
                assert_eq!(feed.changed().await, Err(Closed));
                assert!(feed.current().workload_by_uid("last").is_some());
                seen
            })
        });
        let reader_waits = || {
            waiting
                .recv_timeout(Duration::from_secs(10))
                .expect("the reader waits on the feed")
        };
        reader_waits();
        publisher.publish(one_workload("first"));
        reader_waits();
        let last = publisher.publish(one_workload("last"));
        drop(publisher);
        let seen = reader.join().unwrap();
        assert_eq!(seen, [last - 1, last], "one wake-up per publish");
    }

    #[test]
    fn changed_does_not_fire_for_already_seen_versions() {
        let publisher = SnapshotPublisher::new();
        publisher.publish(Snapshot::empty());
        let mut feed = publisher.subscribe();
        let pending =
            futures_lite::future::block_on(futures_lite::future::poll_once(feed.changed()));
        assert!(
            pending.is_none(),
            "subscribe marks the current version seen"
        );
        publisher.publish(Snapshot::empty());
        publisher.publish(Snapshot::empty());
        futures_lite::future::block_on(feed.changed()).unwrap();
        assert_eq!(feed.version(), 3);
        let pending =
            futures_lite::future::block_on(futures_lite::future::poll_once(feed.changed()));
        assert!(pending.is_none(), "two publishes coalesce into one wake-up");
    }
}
