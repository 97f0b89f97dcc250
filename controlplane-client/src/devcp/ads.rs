//! The dev control plane's Delta ADS server: serves a local YAML config
//! (ztunnel's LOCAL_XDS schema) as `istio.workload.Address` and
//! `istio.security.Authorization` resources, the way istiod does.
//!
//! Per stream and per type it keeps what the client holds (name → version,
//! seeded from `initial_resource_versions`) and sends only differences:
//!
//! - wildcard subscriptions (an empty first subscribe list, or "*") get every
//!   resource of the type;
//! - explicit names (on-demand) get the resources they resolve to: a primary
//!   name (workload uid, service "ns/hostname", policy "ns/name") or a
//!   "network/IP" alias, answered under the primary name with the alias in
//!   `Resource.aliases`, as istiod does; a requested name that resolves to
//!   nothing is answered in `removed_resources`;
//! - names the client holds that no longer exist (or are no longer
//!   subscribed) are removed;
//! - versions are content hashes, so a reconnecting client that presents its
//!   versions is not sent what it already has, even across restarts.
//!
//! ACKs are counted; NACKs are logged with their `error_detail`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ring::digest;
use ringway_proto::discovery::aggregated_discovery_service_server::AggregatedDiscoveryService;
use ringway_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::model::{Policy, Service, Workload};
use crate::sources::local::{self, ConfigError};
use crate::sources::xds::convert::{self, AddressResource};

/// One type's resources, by primary name.
#[derive(Debug, Clone, Default)]
struct TypeResources {
    by_name: BTreeMap<String, Resource>,
    /// "network/IP" → primary names (Address only).
    aliases: HashMap<String, Vec<String>>,
    /// Service primary name → the workloads behind it. istiod answers a
    /// request for a service (by name or VIP) with its endpoints too, or an
    /// on-demand client could find the VIP and still have nowhere to go.
    related: HashMap<String, Vec<String>>,
}

impl TypeResources {
    fn insert(&mut self, res: Resource) {
        for alias in &res.aliases {
            self.aliases
                .entry(alias.clone())
                .or_default()
                .push(res.name.clone());
        }
        self.by_name.insert(res.name.clone(), res);
    }

    /// Primary names `name` stands for: itself if it is one, else the
    /// resources carrying it as an alias.
    fn resolve(&self, name: &str) -> Vec<&str> {
        let primary: Vec<&str> = match self.by_name.get_key_value(name) {
            Some((k, _)) => vec![k.as_str()],
            None => self
                .aliases
                .get(name)
                .map(|v| v.iter().map(String::as_str).collect())
                .unwrap_or_default(),
        };
        let mut out = primary.clone();
        for p in primary {
            for r in self.related.get(p).into_iter().flatten() {
                if self.by_name.contains_key(r) && !out.contains(&r.as_str()) {
                    out.push(r.as_str());
                }
            }
        }
        out
    }
}

/// A complete config, as xDS resources with content-hash versions.
#[derive(Debug, Clone, Default)]
pub struct XdsResources {
    address: TypeResources,
    authorization: TypeResources,
}

impl XdsResources {
    /// Converts model items (e.g. from [`local::parse`]). Items are not
    /// cross-validated here; see [`load_config`].
    pub fn from_model(
        workloads: &[Workload],
        services: &[Service],
        policies: &[Policy],
    ) -> XdsResources {
        let mut out = XdsResources::default();
        for w in workloads {
            let item = AddressResource::Workload(w.clone());
            let version = content_version(&item);
            out.address
                .insert(convert::address_resource(&item, version));
        }
        for s in services {
            let item = AddressResource::Service(s.clone());
            let version = content_version(&item);
            out.address
                .insert(convert::address_resource(&item, version));
        }
        for s in services {
            let key = s.key();
            let endpoints: Vec<String> = workloads
                .iter()
                .filter(|w| w.services.contains_key(&key))
                .map(|w| w.uid.to_string())
                .collect();
            out.address.related.insert(key, endpoints);
        }
        for p in policies {
            let version = content_version(p);
            out.authorization
                .insert(convert::authorization_resource(p, version));
        }
        out
    }

    /// Builds from raw resources (tests, or a server fed by something other
    /// than YAML). Names, versions and aliases are taken as given.
    pub fn from_resources(
        address: impl IntoIterator<Item = Resource>,
        authorization: impl IntoIterator<Item = Resource>,
    ) -> XdsResources {
        let mut out = XdsResources::default();
        for r in address {
            out.address.insert(r);
        }
        for r in authorization {
            out.authorization.insert(r);
        }
        out
    }

    fn of_type(&self, type_url: &str) -> Option<&TypeResources> {
        match type_url {
            ADDRESS_TYPE_URL => Some(&self.address),
            AUTHORIZATION_TYPE_URL => Some(&self.authorization),
            _ => None,
        }
    }

    /// Resource names of one type, sorted.
    pub fn names(&self, type_url: &str) -> Vec<String> {
        self.of_type(type_url)
            .map(|t| t.by_name.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn get(&self, type_url: &str, name: &str) -> Option<&Resource> {
        self.of_type(type_url)?.by_name.get(name)
    }

    /// (changed or added, removed) names going from `self` to `next`.
    fn diff_summary(&self, next: &XdsResources) -> (usize, usize) {
        let mut changed = 0;
        let mut removed = 0;
        for (a, b) in [
            (&self.address, &next.address),
            (&self.authorization, &next.authorization),
        ] {
            for (name, res) in &b.by_name {
                if a.by_name.get(name).map(|r| &r.version) != Some(&res.version) {
                    changed += 1;
                }
            }
            removed += a
                .by_name
                .keys()
                .filter(|n| !b.by_name.contains_key(*n))
                .count();
        }
        (changed, removed)
    }
}

/// Hex SHA-256 prefix of the item's full content: equal content, equal
/// version, in any process.
fn content_version(item: &impl std::fmt::Debug) -> String {
    let d = digest::digest(&digest::SHA256, format!("{item:?}").as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses and validates a YAML config (the same checks as the local config
/// source, so what is served would also load locally).
pub fn load_config(text: &str, origin: &str) -> Result<XdsResources, ConfigError> {
    local::load_snapshot(text, origin)?;
    let (workloads, services, policies) = local::parse(text, origin)?;
    Ok(XdsResources::from_model(&workloads, &services, &policies))
}

/// Counters of the server, for logs and tests.
#[derive(Debug, Default)]
pub struct AdsStats {
    pub streams: AtomicU64,
    pub responses: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
    last_nack: Mutex<Option<String>>,
}

impl AdsStats {
    /// The `error_detail.message` of the most recent NACK.
    pub fn last_nack(&self) -> Option<String> {
        self.last_nack
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The Delta ADS service. Cloning shares the config and the streams.
#[derive(Clone)]
pub struct DevAds {
    config: Arc<watch::Sender<Arc<XdsResources>>>,
    stats: Arc<AdsStats>,
}

impl DevAds {
    pub fn new(initial: XdsResources) -> DevAds {
        DevAds {
            config: Arc::new(watch::channel(Arc::new(initial)).0),
            stats: Arc::default(),
        }
    }

    /// Replaces the config; every stream pushes what changed.
    pub fn set_config(&self, next: XdsResources) {
        let (changed, removed) = self.config.borrow().diff_summary(&next);
        tracing::info!(changed, removed, "config updated");
        self.config.send_replace(Arc::new(next));
    }

    pub fn config(&self) -> Arc<XdsResources> {
        self.config.borrow().clone()
    }

    pub fn stats(&self) -> &AdsStats {
        &self.stats
    }
}

/// Loads `path` now (an unreadable or invalid file at start is an error)
/// and returns the service.
pub fn load_file(path: &std::path::Path) -> Result<DevAds, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let resources = load_config(&text, &path.display().to_string()).map_err(|e| e.to_string())?;
    Ok(DevAds::new(resources))
}

/// Re-reads `path` every `interval` and, when its content changed and is
/// valid, replaces the served config (invalid content is logged; the last
/// good config stays). Runs until aborted.
pub async fn watch_file(path: PathBuf, interval: Duration, ads: DevAds) {
    let origin = path.display().to_string();
    let mut last = std::fs::read(&path).ok();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let content = match std::fs::read(&path) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("{origin}: {e}");
                continue;
            }
        };
        if last.as_deref() == Some(content.as_slice()) {
            continue;
        }
        // A writer may be midway (truncate, then write): use the content
        // once two reads a moment apart agree (a few tries at most).
        let settle = (interval / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
        let mut content = content;
        for _ in 0..10 {
            tokio::time::sleep(settle).await;
            match std::fs::read(&path) {
                Ok(again) if again == content => break,
                Ok(again) => content = again,
                Err(_) => break,
            }
        }
        let parsed = std::str::from_utf8(&content)
            .map_err(|e| format!("{origin}: not UTF-8: {e}"))
            .and_then(|text| load_config(text, &origin).map_err(|e| e.to_string()));
        last = Some(content);
        match parsed {
            Ok(resources) => ads.set_config(resources),
            Err(e) => tracing::error!("rejected config, still serving the last good one: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for DevAds {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = ResponseStream;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(Status::unimplemented(
            "state-of-the-world ADS is not served; use DeltaAggregatedResources",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "?".to_owned(), |a: SocketAddr| a.to_string());
        let md = request.metadata();
        let has_token = md.get("authorization").is_some();
        let cluster = md
            .get("clusterid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let id = self.stats.streams.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(stream = id, %peer, cluster, has_token, "delta ADS stream opened");
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let stream = StreamState {
            id,
            ads: self.clone(),
            subs: HashMap::new(),
            nonce: 0,
            node_id: String::new(),
        };
        tokio::spawn(stream.run(inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One client's subscription to one type.
#[derive(Debug, Default)]
struct Subscription {
    wildcard: bool,
    /// Explicit names, primary or alias.
    names: BTreeSet<String>,
    /// What the client holds: primary name → version.
    sent: HashMap<String, String>,
}

struct StreamState {
    id: u64,
    ads: DevAds,
    subs: HashMap<String, Subscription>,
    nonce: u64,
    node_id: String,
}

impl StreamState {
    async fn run(
        mut self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
        tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) {
        let mut config_rx = self.ads.config.subscribe();
        config_rx.borrow_and_update();
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        let config = config_rx.borrow().clone();
                        if let Some(resp) = self.handle_request(req, &config) {
                            if tx.send(Ok(resp)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::info!(stream = self.id, node = %self.node_id, "client closed the stream");
                        return;
                    }
                    Err(status) => {
                        tracing::info!(stream = self.id, node = %self.node_id, "stream ended: {}", status.message());
                        return;
                    }
                },
                changed = config_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let config = config_rx.borrow_and_update().clone();
                    // Addresses before the policies that may name them.
                    for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
                        if let Some(resp) = self.push(type_url, &config, &BTreeSet::new(), false) {
                            if tx.send(Ok(resp)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                () = tx.closed() => return,
            }
        }
    }

    fn handle_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        config: &XdsResources,
    ) -> Option<DeltaDiscoveryResponse> {
        if let Some(node) = &req.node {
            if self.node_id.is_empty() {
                self.node_id = node.id.clone();
                tracing::info!(stream = self.id, node = %node.id, "client identified");
            }
        }
        let type_url = req.type_url.clone();
        if config.of_type(&type_url).is_none() {
            tracing::warn!(
                stream = self.id,
                "ignoring request for unsupported type {type_url:?}"
            );
            return None;
        }
        if !req.response_nonce.is_empty() {
            match &req.error_detail {
                Some(err) => {
                    self.ads.stats.nacks.fetch_add(1, Ordering::Relaxed);
                    *self
                        .ads
                        .stats
                        .last_nack
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(err.message.clone());
                    tracing::warn!(
                        stream = self.id,
                        node = %self.node_id,
                        type_url,
                        nonce = %req.response_nonce,
                        "NACK: {}",
                        err.message
                    );
                }
                None => {
                    self.ads.stats.acks.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(stream = self.id, type_url, nonce = %req.response_nonce, "ACK");
                }
            }
        }
        let first = !self.subs.contains_key(&type_url);
        let sub = self.subs.entry(type_url.clone()).or_default();
        let mut fresh = BTreeSet::new();
        if first {
            sub.sent = req.initial_resource_versions.clone();
            // An empty first subscribe list is the legacy wildcard.
            sub.wildcard = req.resource_names_subscribe.is_empty();
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                sub.wildcard = true;
            } else if sub.names.insert(name.clone()) {
                fresh.insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(name);
                fresh.remove(name);
            }
        }
        let subscription_changed =
            !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty();
        if !first && !subscription_changed {
            return None; // a plain ACK/NACK
        }
        if !fresh.is_empty() {
            tracing::debug!(stream = self.id, ?fresh, "subscribed");
        }
        // The first request is always answered, even with nothing.
        self.push(&type_url, config, &fresh, first)
    }

    /// What the client of `type_url` lacks: resources whose version it
    /// doesn't hold (plus those `fresh` names resolve to, re-sent even if
    /// held, so the request is visibly answered) and removals.
    fn push(
        &mut self,
        type_url: &str,
        config: &XdsResources,
        fresh: &BTreeSet<String>,
        always: bool,
    ) -> Option<DeltaDiscoveryResponse> {
        let resources_of_type = config.of_type(type_url)?;
        let sub = self.subs.get_mut(type_url)?;
        let mut desired: BTreeMap<&str, &Resource> = BTreeMap::new();
        if sub.wildcard {
            desired.extend(
                resources_of_type
                    .by_name
                    .iter()
                    .map(|(k, v)| (k.as_str(), v)),
            );
        }
        let mut forced: BTreeSet<&str> = BTreeSet::new();
        let mut unknown: Vec<String> = Vec::new();
        for name in &sub.names {
            let primaries = resources_of_type.resolve(name);
            if primaries.is_empty() && fresh.contains(name) {
                unknown.push(name.clone());
            }
            for p in primaries {
                desired.insert(p, &resources_of_type.by_name[p]);
                if fresh.contains(name) {
                    forced.insert(p);
                }
            }
        }
        let mut resources = Vec::new();
        for (name, res) in &desired {
            if forced.contains(name) || sub.sent.get(*name) != Some(&res.version) {
                resources.push((*res).clone());
            }
        }
        let mut removed: Vec<String> = sub
            .sent
            .keys()
            .filter(|n| !desired.contains_key(n.as_str()))
            .cloned()
            .collect();
        removed.sort();
        for name in &removed {
            sub.sent.remove(name);
        }
        for res in &resources {
            sub.sent.insert(res.name.clone(), res.version.clone());
        }
        removed.extend(unknown);
        if resources.is_empty() && removed.is_empty() && !always {
            return None;
        }
        self.nonce += 1;
        self.ads.stats.responses.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            stream = self.id,
            type_url,
            resources = resources.len(),
            removed = removed.len(),
            nonce = self.nonce,
            "pushing"
        );
        Some(DeltaDiscoveryResponse {
            system_version_info: String::new(),
            resources,
            type_url: type_url.to_owned(),
            nonce: format!("{}-{}", self.id, self.nonce),
            removed_resources: removed,
            control_plane: None,
        })
    }
}
