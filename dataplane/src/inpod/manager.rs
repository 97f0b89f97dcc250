//! The pods the node agent enrolled, managed on the ZDS thread: a pod's
//! listeners are bound here, inside its namespace (this thread steps in and
//! out; the cores never wait for it), then the new [`PodSet`] is published
//! and the ack waits until every core accepts on them, so an ack means
//! "serving". A pod that cannot start is NACKed, kept, and retried with
//! backoff; while any is pending, readiness answers 503, as ztunnel's does.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringway_controlplane::sources::zds::{PodHandler, PodInfo};
use tokio::sync::watch;

use super::{load, pod_workload_uid, PodDns, PodEntry, PodPorts, PodSet, PodSockets};
use crate::io::listener::{bind_all, bind_dns, BoundListener};
use crate::io::reuseport::Migration;
use ringway_controlplane::model::WorkloadName;

/// What readiness and the admin view read of the manager (any thread).
#[derive(Default)]
pub struct InpodStatus {
    /// Connected to the node agent now.
    pub connected: AtomicBool,
    /// The agent's replay (`snapshot_sent`) was received at least once:
    /// before that, ringway does not know which pods it must serve.
    pub synced: AtomicBool,
    /// Pods enrolled and serving on every core.
    pub running: AtomicUsize,
    /// Pods that failed to start and are being retried.
    pub pending: AtomicUsize,
    /// False once the ZDS thread has ended before shutdown (it panicked):
    /// pods can no longer be added or removed, so readiness fails for good.
    pub lost: AtomicBool,
    /// Pods started (enrolled and serving) and stopped, ever.
    pub started: AtomicUsize,
    pub stopped: AtomicUsize,
    /// Every pod the agent enrolled, for the admin view (ztunnel's
    /// `workloadState`); written by the ZDS thread at each change, read by
    /// the control thread, never by a core.
    pods: std::sync::Mutex<serde_json::Map<String, serde_json::Value>>,
}

impl InpodStatus {
    /// `workloadState` of `/config_dump`: uid → the agent's name for the
    /// pod and `Up` (serving) or `Pending` (failed to start, retried, with
    /// the reason).
    pub fn workload_state(&self) -> serde_json::Value {
        serde_json::Value::Object(self.pods.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// ztunnel's in-pod series (same names and meaning, so dashboards
    /// built for ztunnel work), appended to a scrape.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let series = [
            (
                "workload_manager_active_proxy_count",
                "gauge",
                "Enrolled pods whose listeners serve on every core",
                "",
                &self.running,
            ),
            (
                "workload_manager_pending_proxy_count",
                "gauge",
                "Enrolled pods that failed to start and are being retried",
                "",
                &self.pending,
            ),
            (
                "workload_manager_proxies_started",
                "counter",
                "Pods started since ringway started",
                "_total",
                &self.started,
            ),
            (
                "workload_manager_proxies_stopped",
                "counter",
                "Pods stopped since ringway started",
                "_total",
                &self.stopped,
            ),
        ];
        for (name, kind, help, suffix, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{suffix} {}", value.load(Ordering::Acquire));
        }
    }

    /// Ready once the agent's pods are known (its replay since the last
    /// connect is complete) and all of them run, as ztunnel's readiness.
    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
            && self.pending.load(Ordering::Acquire) == 0
            && !self.lost.load(Ordering::Acquire)
    }
}

/// Settings the manager needs from the flags.
#[derive(Clone, Debug)]
pub struct InpodSettings {
    pub cores: usize,
    pub ports: PodPorts,
    pub keepalive: Option<crate::io::socket::KeepaliveOpts>,
    /// Cluster id, for Istio's workload uid of a pod.
    pub cluster_id: String,
    /// How long an ack waits for every core to pick a change up.
    pub settle: Duration,
    /// The DNS proxy in every pod (None: off).
    pub dns: Option<PodDnsSettings>,
}

/// Where the DNS proxy listens in each pod and how its upstream sockets
/// are made there.
#[derive(Clone, Debug)]
pub struct PodDnsSettings {
    /// The DNS address in the pod (ztunnel's `127.0.0.1:15053`).
    pub addr: std::net::SocketAddr,
    /// The address was given as `localhost`: the IPv6 loopback with the
    /// same port is bound too in pods that have it, as ztunnel binds both.
    pub localhost: bool,
    /// The upstream resolvers: one upstream socket per family they use.
    pub upstreams: Vec<std::net::SocketAddr>,
    /// SO_MARK of the upstream sockets, so the pod's DNS capture lets
    /// ringway's own queries out.
    pub mark: u32,
}

impl PodDnsSettings {
    /// The DNS addresses for a pod with (or without) IPv6 loopback.
    fn addrs(&self, has_v6_loopback: bool) -> Vec<std::net::SocketAddr> {
        let mut addrs = vec![self.addr];
        if self.localhost && has_v6_loopback {
            addrs.push(std::net::SocketAddr::new(
                std::net::Ipv6Addr::LOCALHOST.into(),
                self.addr.port(),
            ));
        }
        addrs
    }

    /// Binds every core's DNS sockets and makes its upstream sockets (run
    /// inside the pod's namespace).
    fn bind(&self, cores: usize, has_v6_loopback: bool) -> anyhow::Result<Vec<PodDns>> {
        use anyhow::Context;
        let listeners = bind_dns(&self.addrs(has_v6_loopback), cores)?;
        let mut families: Vec<bool> = self.upstreams.iter().map(|a| a.is_ipv6()).collect();
        families.sort_unstable();
        families.dedup();
        listeners
            .into_iter()
            .map(|listeners| {
                let upstream = families
                    .iter()
                    .map(|&v6| {
                        let any = if v6 {
                            std::net::SocketAddr::from(([0u16; 8], 0))
                        } else {
                            std::net::SocketAddr::from(([0u8; 4], 0))
                        };
                        crate::io::socket::udp_socket(any, self.mark)
                            .map(|fd| (v6, fd))
                            .context("cannot make the DNS proxy's upstream socket")
                    })
                    .collect::<anyhow::Result<_>>()?;
                Ok(PodDns {
                    listeners,
                    upstream,
                })
            })
            .collect()
    }
}

struct Pending {
    info: PodInfo,
    netns: OwnedFd,
    error: String,
    attempts: u32,
    next_try: Instant,
}

pub struct InpodManager {
    settings: InpodSettings,
    pods: HashMap<String, Arc<PodEntry>>,
    pending: HashMap<String, Pending>,
    publish: watch::Sender<Arc<PodSet>>,
    status: Arc<InpodStatus>,
    next_generation: u64,
    /// What [`report_handover`](Self::report_handover) last said.
    handover_reported: Option<Result<Migration, ()>>,
}

impl InpodManager {
    pub fn new(settings: InpodSettings) -> (Self, watch::Receiver<Arc<PodSet>>, Arc<InpodStatus>) {
        let (publish, feed) = watch::channel(Arc::new(PodSet::default()));
        let status = Arc::new(InpodStatus::default());
        let m = InpodManager {
            settings,
            pods: HashMap::new(),
            pending: HashMap::new(),
            publish,
            status: status.clone(),
            next_generation: 1,
            handover_reported: None,
        };
        (m, feed, status)
    }

    /// Hands the cores the new pod set (only when it changed: each
    /// publication wakes every core), then updates the status.
    fn publish(&self) {
        let set = PodSet {
            pods: self.pods.clone(),
        };
        self.publish.send_replace(Arc::new(set));
        self.update_status();
    }

    /// What readiness, metrics and the admin view read.
    fn update_status(&self) {
        self.status
            .running
            .store(self.pods.len(), Ordering::Release);
        self.status
            .pending
            .store(self.pending.len(), Ordering::Release);
        let info = |w: &WorkloadName| {
            serde_json::json!({
                "name": w.name,
                "namespace": w.namespace,
                "serviceAccount": w.service_account,
            })
        };
        let mut view = serde_json::Map::new();
        for (uid, e) in &self.pods {
            view.insert(
                uid.clone(),
                serde_json::json!({ "state": "Up", "info": info(&e.workload) }),
            );
        }
        for (uid, p) in &self.pending {
            let w = WorkloadName {
                namespace: p.info.namespace.clone(),
                name: p.info.name.clone(),
                service_account: p.info.service_account.clone(),
            };
            view.insert(
                uid.clone(),
                serde_json::json!({
                    "state": "Pending",
                    "info": info(&w),
                    "error": p.error,
                    "attempts": p.attempts,
                }),
            );
        }
        *self.status.pods.lock().unwrap_or_else(|p| p.into_inner()) = view;
    }

    /// Binds the pod's listeners in its namespace, publishes it, and waits
    /// until every core accepts on them.
    fn start(&mut self, uid: &str, info: &PodInfo, netns: &OwnedFd) -> Result<(), String> {
        match crate::io::netns::is_own(netns.as_fd()) {
            Ok(false) => {}
            Ok(true) => {
                return Err(format!(
                    "pod {uid}: the namespace given is ringway's own, not a pod's"
                ))
            }
            Err(e) => return Err(format!("pod {uid}: cannot inspect its namespace: {e}")),
        }
        let s = &self.settings;
        let specs = |ip: std::net::IpAddr| -> Vec<_> {
            s.ports
                .all()
                .into_iter()
                .map(|(path, port)| (path, vec![std::net::SocketAddr::new(ip, port)]))
                .collect()
        };
        let (v4, v6) = (specs([0, 0, 0, 0].into()), specs([0u16; 8].into()));
        let mut bound = crate::io::netns::within(netns.as_fd(), || {
            // As ztunnel binds them: one dual-stack `[::]` socket per port
            // and core (IPv4 peers arrive v4-mapped). At an upgrade the
            // next proxy, ringway or ztunnel, then joins the same
            // SO_REUSEPORT group, so a closing listener's queue has
            // somewhere to go. A pod whose kernel has no IPv6 gets 0.0.0.0.
            let listeners = bind_all(&v6, s.cores, s.keepalive, true).or_else(|v6_error| {
                bind_all(&v4, s.cores, s.keepalive, false)
                    .map_err(|e| e.context(format!("and on [::] first: {v6_error:#}")))
            });
            let addrs = crate::io::socket::local_interface_addrs();
            let has_v6_loopback = addrs.contains(&std::net::Ipv6Addr::LOCALHOST.into());
            let dns = s.dns.as_ref().map(|d| d.bind(s.cores, has_v6_loopback));
            // The next proxy at an upgrade binds beside these; whichever
            // closes first hands its queued connections to the other.
            let mut groups: Vec<std::os::fd::BorrowedFd<'_>> = Vec::new();
            if let Ok(cores) = &listeners {
                groups.extend(cores.first().into_iter().flatten().map(|l| l.fd.as_fd()));
            }
            if let Some(Ok(cores)) = &dns {
                let first = cores.first().into_iter();
                groups.extend(first.flat_map(|d| d.listeners.iter().map(|l| l.tcp.as_fd())));
            }
            let mut handover = None;
            for fd in groups {
                let outcome = crate::io::reuseport::keep_queued_connections(fd);
                let failed = outcome.is_err();
                handover = Some(outcome);
                if failed {
                    break;
                }
            }
            (listeners, dns, addrs, handover)
        })
        .map_err(|e| e.to_string())?;
        if let Some(outcome) = bound.3.take() {
            report_handover(&mut self.handover_reported, outcome);
        }
        let (listeners, dns, addrs, _) = bound;
        let per_core: Vec<Vec<BoundListener>> =
            listeners.map_err(|e| format!("pod {uid}: {e:#}"))?;
        let mut dns: Vec<Option<PodDns>> = match dns {
            Some(d) => d
                .map_err(|e| format!("pod {uid}: {e:#}"))?
                .into_iter()
                .map(Some)
                .collect(),
            None => Vec::new(),
        };
        dns.resize_with(per_core.len(), || None);
        let per_core: Vec<PodSockets> = per_core
            .into_iter()
            .zip(dns)
            .map(|(listeners, dns)| PodSockets { listeners, dns })
            .collect();
        let netns = netns
            .try_clone()
            .map_err(|e| format!("pod {uid}: cannot keep its namespace: {e}"))?;
        let workload = WorkloadName {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            service_account: info.service_account.clone(),
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let entry = Arc::new(PodEntry::new(
            uid.to_owned(),
            generation,
            workload,
            pod_workload_uid(&s.cluster_id, &info.namespace, &info.name),
            netns,
            addrs.into_iter().filter(|ip| !ip.is_loopback()).collect(),
            per_core,
        ));
        self.pods.insert(uid.to_owned(), entry.clone());
        self.publish();
        let started = Instant::now();
        let cores = self.settings.cores;
        if !wait_until(self.settings.settle, || load(&entry.serving) >= cores) {
            // A core that does not follow (stopped, or stuck) would leave
            // its share of the pod's connections queued on a socket nobody
            // accepts. Not served, so not acknowledged: the pod is taken
            // back (its unclaimed sockets close with the entry) and retried.
            let serving = load(&entry.serving);
            self.stop(uid);
            return Err(format!(
                "pod {uid}: only {serving} of {cores} cores picked it up within {:?}",
                self.settings.settle
            ));
        }
        self.status.started.fetch_add(1, Ordering::AcqRel);
        tracing::info!(
            pod = uid,
            workload = %entry.workload,
            addrs = ?entry.addrs,
            took = ?started.elapsed(),
            "pod enrolled: listening in its namespace on every core"
        );
        Ok(())
    }

    /// Unpublishes the pod and waits until every core closed its listeners
    /// (its connections then drain on their own time).
    fn stop(&mut self, uid: &str) -> bool {
        let Some(entry) = self.pods.remove(uid) else {
            return false;
        };
        self.publish();
        self.status.stopped.fetch_add(1, Ordering::AcqRel);
        let serving = load(&entry.serving);
        if !wait_until(self.settings.settle, || load(&entry.stopped) >= serving) {
            tracing::warn!(
                pod = uid,
                "not every core closed the pod's listeners in time"
            );
        }
        tracing::info!(pod = uid, workload = %entry.workload, "pod removed: listeners closed, connections draining");
        true
    }

    fn fail(&mut self, uid: &str, info: PodInfo, netns: OwnedFd, error: String) {
        let attempts = self.pending.get(uid).map_or(0, |p| p.attempts) + 1;
        let backoff = retry_backoff(attempts);
        tracing::warn!(pod = uid, attempts, retry_in = ?backoff, error = %error, "pod failed to start; will retry");
        self.pending.insert(
            uid.to_owned(),
            Pending {
                info,
                netns,
                error,
                attempts,
                next_try: Instant::now() + backoff,
            },
        );
        self.update_status();
    }

    /// The pods enrolled now (for tests and the admin view).
    pub fn running(&self) -> usize {
        self.pods.len()
    }
}

/// Says once how an upgrade will hand this node's pods over, or loudly
/// that it cannot without resets, and again when that changes.
fn report_handover(
    reported: &mut Option<Result<Migration, ()>>,
    outcome: Result<Migration, String>,
) {
    let key = outcome.as_ref().map_err(|_| ()).copied();
    if *reported == Some(key) {
        return;
    }
    *reported = Some(key);
    match outcome {
        Ok(how) => tracing::info!(
            via = how.name(),
            "upgrade hand-over: when a proxy closes a pod's listeners, its queued \
             connections go to the next proxy's"
        ),
        Err(why) => tracing::warn!(
            reason = %why,
            "upgrade hand-over: connections queued on a pod's listeners when a proxy \
             closes them will be reset; allow bpf(2) or make \
             net.ipv4.tcp_migrate_req writable to keep them"
        ),
    }
}

/// 100 ms, doubling, at most 15 s.
fn retry_backoff(attempts: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << attempts.saturating_sub(1).min(8));
    Duration::from_millis(ms.min(15_000))
}

/// Polls `done` until it holds or `limit` passes (the cores make progress
/// on their own threads; this thread only waits for them).
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    let mut pause = Duration::from_micros(50);
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

impl PodHandler for InpodManager {
    fn add(&mut self, uid: &str, info: PodInfo, netns: OwnedFd) -> Result<(), String> {
        if let Some(running) = self.pods.get(uid) {
            // Replayed after a reconnect: the same namespace is the same
            // pod, already served; another one replaces it.
            let same = match (
                crate::io::netns::id(running.netns.as_fd()),
                crate::io::netns::id(netns.as_fd()),
            ) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if same {
                return Ok(());
            }
            self.stop(uid);
        }
        match self.start(uid, &info, &netns) {
            Ok(()) => {
                if self.pending.remove(uid).is_some() {
                    self.update_status();
                }
                Ok(())
            }
            Err(e) => {
                self.fail(uid, info, netns, e.clone());
                Err(e)
            }
        }
    }

    /// Acknowledged either way, as ztunnel does: for a pod ringway does not
    /// have there is nothing to keep (the agent sends an `add` with its
    /// namespace when it has one).
    fn keep(&mut self, uid: &str) -> Result<(), String> {
        if !self.pods.contains_key(uid) && !self.pending.contains_key(uid) {
            tracing::warn!(
                pod = uid,
                "keep for a pod ringway does not have; nothing to keep"
            );
        }
        Ok(())
    }

    fn del(&mut self, uid: &str) -> Result<(), String> {
        let was_pending = self.pending.remove(uid).is_some();
        let was_running = self.stop(uid);
        if was_pending {
            self.update_status();
        }
        if !was_pending && !was_running {
            tracing::info!(
                pod = uid,
                "del for a pod ringway does not have; nothing to do"
            );
        }
        Ok(())
    }

    fn reconcile(&mut self, replayed: &HashSet<String>) {
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !replayed.contains(*uid))
            .cloned()
            .collect();
        for uid in &gone {
            self.stop(uid);
        }
        let before = self.pending.len();
        self.pending.retain(|uid, _| replayed.contains(uid));
        if self.pending.len() != before {
            self.update_status();
        }
        tracing::info!(
            running = self.pods.len(),
            removed = gone.len(),
            pending = self.pending.len(),
            "node agent's pods reconciled"
        );
        self.status.synced.store(true, Ordering::Release);
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.next_try <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let Some(p) = self.pending.remove(&uid) else {
                continue;
            };
            match self.start(&uid, &p.info, &p.netns) {
                Ok(()) => {
                    tracing::info!(pod = uid, attempts = p.attempts + 1, "pod started on retry");
                    self.update_status();
                }
                Err(e) => {
                    if e != p.error {
                        tracing::warn!(pod = uid, error = %e, "pod still fails to start");
                    }
                    let attempts = p.attempts;
                    self.pending.insert(uid.clone(), p);
                    let pending = self.pending.get_mut(&uid).expect("just inserted");
                    pending.attempts = attempts + 1;
                    pending.error = e;
                    pending.next_try = now + retry_backoff(pending.attempts);
                    self.update_status();
                }
            }
        }
    }

    /// A new connection starts with the agent's replay: until its
    /// `snapshot_sent`, ringway does not know which of its pods are still
    /// wanted, so readiness waits for it again, as ztunnel's does.
    fn connected(&mut self, up: bool) {
        self.status.connected.store(up, Ordering::Release);
        self.status.synced.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_fifteen_seconds() {
        assert_eq!(retry_backoff(1), Duration::from_millis(100));
        assert_eq!(retry_backoff(2), Duration::from_millis(200));
        assert_eq!(retry_backoff(5), Duration::from_millis(1600));
        assert_eq!(retry_backoff(50), Duration::from_secs(15));
    }

    /// A namespace descriptor that is not one is NACKed with the reason,
    /// kept pending (readiness 503), and dropped by a del.
    #[test]
    fn a_pod_that_cannot_start_is_pending_until_deleted() {
        let (mut m, feed, status) = InpodManager::new(InpodSettings {
            cores: 1,
            ports: PodPorts::default(),
            keepalive: None,
            cluster_id: "Kubernetes".into(),
            settle: Duration::from_millis(10),
            dns: None,
        });
        status.synced.store(true, Ordering::Release);
        let not_a_netns: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let info = PodInfo {
            name: "p".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        };
        let err = m.add("uid-1", info, not_a_netns).unwrap_err();
        assert!(err.contains("namespace"), "{err}");
        assert!(!status.is_ready());
        assert!(m.keep("uid-1").is_ok(), "a pending pod is known");
        assert!(m.keep("uid-2").is_ok(), "nothing to keep, as in ztunnel");
        assert!(feed.borrow().pods.is_empty());
        m.del("uid-1").unwrap();
        assert!(status.is_ready());
    }
}
