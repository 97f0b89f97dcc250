//! The Delta ADS client: one gRPC stream to istiod (or `ringway-devcp`),
//! turned into snapshots for the cores.
//!
//! Protocol, as ztunnel speaks it (see the module docs of [`super`]):
//!
//! - one `DeltaAggregatedResources` stream; the Address subscription is sent
//!   first, then Authorization, both carrying the node;
//! - every response is ACKed by nonce; a response with bad resources is
//!   NACKed (`error_detail.message` = `"name: reason; ..."`) while its good
//!   resources still apply;
//! - on reconnect, `initial_resource_versions` lists what was last accepted
//!   (rejected resources are left out so the server sends them again);
//! - each response becomes exactly one new [`Snapshot`] version.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use prost::Message;
use ringway_proto::core::Node;
use ringway_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ringway_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ringway_proto::rpc::Status as RpcStatus;
use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{ClientTlsConfig, Endpoint};

use super::convert::{self, address_key, AddressResource, ConvertError};
use crate::model::snapshot::{Snapshot, SnapshotDelta};
use crate::model::{intern, PolicyScope, Str, UnreadablePolicy};
use crate::publish::{SnapshotFeed, SnapshotPublisher};

/// Largest response accepted (as ztunnel: 200 MiB).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 200 * 1024 * 1024;
/// How long a core waits for an on-demand lookup unless told otherwise.
pub const DEFAULT_ON_DEMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Instance IP in the node id when none is known (as ztunnel).
const FALLBACK_INSTANCE_IP: &str = "1.1.1.1";
/// google.rpc.Code INVALID_ARGUMENT, carried in NACKs.
const NACK_CODE: i32 = 3;

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Who we are, as told to the control plane in the `Node` message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    /// `INSTANCE_IP`; the node id uses 1.1.1.1 when absent.
    pub instance_ip: Option<IpAddr>,
    /// `INSTANCE_IPS` metadata; [`instance_ip`](Self::instance_ip) when empty.
    pub instance_ips: Vec<IpAddr>,
    /// `POD_NAME` (metadata `NAME`).
    pub pod_name: String,
    /// `POD_NAMESPACE` (metadata `NAMESPACE`).
    pub pod_namespace: String,
    /// `NODE_NAME` (metadata `NODE_NAME`); istiod uses it to pick the
    /// workloads whose certificates this proxy may request.
    pub node_name: String,
    /// Extra metadata: `ISTIO_META_*` (prefix stripped, as strings) and
    /// `ISTIO_METAJSON_*` (parsed JSON). The fixed keys above win on a clash.
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl NodeInfo {
    /// From the environment variables ztunnel reads: `INSTANCE_IP`,
    /// `POD_NAME`, `POD_NAMESPACE`, `NODE_NAME`, `ISTIO_META_*`,
    /// `ISTIO_METAJSON_*` (invalid JSON is logged and skipped).
    pub fn from_env() -> NodeInfo {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let instance_ip = std::env::var("INSTANCE_IP")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let mut metadata = BTreeMap::new();
        for (k, v) in std::env::vars() {
            if let Some(key) = k.strip_prefix("ISTIO_METAJSON_") {
                match serde_json::from_str(&v) {
                    Ok(json) => {
                        metadata.insert(key.to_owned(), json);
                    }
                    Err(e) => tracing::warn!("ignoring {k}: not valid JSON: {e}"),
                }
            } else if let Some(key) = k.strip_prefix("ISTIO_META_") {
                metadata.insert(key.to_owned(), serde_json::Value::String(v));
            }
        }
        NodeInfo {
            instance_ip,
            instance_ips: instance_ip.into_iter().collect(),
            pod_name: var("POD_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
            node_name: var("NODE_NAME"),
            metadata,
        }
    }

    /// `ztunnel~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local`:
    /// istiod recognises the proxy type by the `ztunnel` prefix.
    pub fn node_id(&self) -> String {
        let ip = self
            .instance_ip
            .map_or_else(|| FALLBACK_INSTANCE_IP.to_owned(), |ip| ip.to_string());
        format!(
            "ztunnel~{ip}~{}.{}~{}.svc.cluster.local",
            self.pod_name, self.pod_namespace, self.pod_namespace
        )
    }

    /// The `Node` sent with the first request of each type.
    pub fn to_node(&self, cluster_id: &str) -> Node {
        use prost_types::value::Kind;
        let mut fields: BTreeMap<String, prost_types::Value> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect();
        let string = |s: &str| prost_types::Value {
            kind: Some(Kind::StringValue(s.to_owned())),
        };
        let ips: Vec<IpAddr> = if self.instance_ips.is_empty() {
            self.instance_ip.into_iter().collect()
        } else {
            self.instance_ips.clone()
        };
        let ips = ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",");
        fields.insert("NAME".into(), string(&self.pod_name));
        fields.insert("NAMESPACE".into(), string(&self.pod_namespace));
        fields.insert("INSTANCE_IPS".into(), string(&ips));
        fields.insert("NODE_NAME".into(), string(&self.node_name));
        if !cluster_id.is_empty() {
            fields.insert("CLUSTER_ID".into(), string(cluster_id));
        }
        Node {
            id: self.node_id(),
            metadata: Some(prost_types::Struct {
                fields: fields.into_iter().collect(),
            }),
            user_agent_name: "ringway".into(),
            user_agent_version_type: Some(
                ringway_proto::core::node::UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").into(),
                ),
            ),
            ..Node::default()
        }
    }
}

fn json_to_value(v: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Reconnect delays: `initial` after a benign end or a healthy stream,
/// doubled after each failure up to `max`, each randomised by ±20 %.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(15),
        }
    }
}

/// Everything the client needs. [`XdsConfig::new`] fills in ztunnel's
/// defaults.
#[derive(Debug, Clone)]
pub struct XdsConfig {
    /// `https://host:port` (TLS, needs [`root_ca`](Self::root_ca)) or
    /// `http://host:port` (plaintext; tests and local setups).
    pub address: String,
    /// PEM file with the root(s) the server certificate must chain to
    /// (`XDS_ROOT_CA`). Re-read at every connect, so a rotated root is
    /// picked up.
    pub root_ca: Option<PathBuf>,
    /// File holding the JWT sent as `authorization: Bearer <token>`
    /// (`AUTH_TOKEN`); re-read at every connect. None: no header.
    pub token_path: Option<PathBuf>,
    /// Sent as the `clusterid` header and the `CLUSTER_ID` metadata.
    pub cluster_id: String,
    pub node: NodeInfo,
    /// `XDS_ON_DEMAND`: subscribe to no addresses up front; cores ask for
    /// the ones they meet (see [`lookup_on_demand`]).
    pub on_demand: bool,
    /// How long the server's "no such address" answer to an on-demand
    /// request stands ([`ON_DEMAND_NEGATIVE_TTL`] unless a test says).
    pub on_demand_negative_ttl: Duration,
    /// `ALT_XDS_HOSTNAME`: a second name the server certificate may carry
    /// (besides the host of [`address`](Self::address)).
    pub alt_hostname: Option<String>,
    /// Extra request headers (`XDS_HEADER_*`).
    pub headers: Vec<(String, String)>,
    /// Largest response accepted; a bigger one ends the stream.
    pub max_message_size: usize,
    /// TCP connect deadline; the whole setup (TLS, HTTP/2 included) gets
    /// twice as long.
    pub connect_timeout: Duration,
    pub backoff: BackoffConfig,
}

impl XdsConfig {
    pub fn new(address: impl Into<String>, node: NodeInfo) -> XdsConfig {
        XdsConfig {
            address: address.into(),
            root_ca: None,
            token_path: None,
            cluster_id: "Kubernetes".into(),
            node,
            on_demand: false,
            on_demand_negative_ttl: ON_DEMAND_NEGATIVE_TTL,
            alt_hostname: None,
            headers: Vec::new(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            connect_timeout: Duration::from_secs(5),
            backoff: BackoffConfig::default(),
        }
    }

    /// Checks what can be checked without connecting.
    pub fn validate(&self) -> Result<(), XdsError> {
        let uri: http::Uri = self
            .address
            .parse()
            .map_err(|e| XdsError::Config(format!("invalid address {:?}: {e}", self.address)))?;
        match uri.scheme_str() {
            Some("https") => {
                if self.root_ca.is_none() {
                    return Err(XdsError::Config(format!(
                        "{}: TLS needs a root CA file",
                        self.address
                    )));
                }
            }
            Some("http") => {}
            _ => {
                return Err(XdsError::Config(format!(
                    "invalid address {:?}: expected http:// or https://",
                    self.address
                )))
            }
        }
        if uri.host().is_none() {
            return Err(XdsError::Config(format!(
                "invalid address {:?}: no host",
                self.address
            )));
        }
        for (k, v) in &self.headers {
            k.parse::<AsciiMetadataKey>()
                .map_err(|_| XdsError::Config(format!("invalid header name {k:?}")))?;
            v.parse::<AsciiMetadataValue>()
                .map_err(|_| XdsError::Config(format!("invalid value for header {k:?}")))?;
        }
        if let Some(alt) = &self.alt_hostname {
            ServerName::try_from(alt.as_str())
                .map_err(|_| XdsError::Config(format!("invalid alternative hostname {alt:?}")))?;
        }
        Ok(())
    }
}

/// A configuration the client can't run with. Connection problems are not
/// errors: they are retried (and counted in [`XdsMetrics`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdsError {
    #[error("xDS configuration: {0}")]
    Config(String),
}

// ---------------------------------------------------------------------------
// Status: readiness and counters
// ---------------------------------------------------------------------------

/// Why a stream (or an attempt at one) ended; the label values of ztunnel's
/// `istio_xds_connection_terminations_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminationReason {
    /// Could not connect (TCP, TLS, HTTP/2, token file...).
    ConnectionError,
    /// The stream failed with a real error.
    Error,
    /// The server ended the stream in a usual way (connection age limit,
    /// GOAWAY, restart). After a stream that delivered responses the client
    /// reconnects at the initial delay.
    Reconnect,
    /// The server closed the stream cleanly.
    Complete,
}

impl TerminationReason {
    pub const ALL: [TerminationReason; 4] = [
        TerminationReason::ConnectionError,
        TerminationReason::Error,
        TerminationReason::Reconnect,
        TerminationReason::Complete,
    ];

    pub fn label(self) -> &'static str {
        match self {
            TerminationReason::ConnectionError => "ConnectionError",
            TerminationReason::Error => "Error",
            TerminationReason::Reconnect => "Reconnect",
            TerminationReason::Complete => "Complete",
        }
    }
}

/// Messages and bytes received for one type URL.
#[derive(Debug, Default)]
pub struct TypeCounters {
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
}

/// Client counters, all monotonic, readable from any thread (relaxed loads).
#[derive(Debug, Default)]
pub struct XdsMetrics {
    pub address: TypeCounters,
    pub authorization: TypeCounters,
    /// Responses of a type we did not subscribe to.
    pub other: TypeCounters,
    terminations: [AtomicU64; 4],
    /// Streams that got as far as the server accepting them.
    pub streams_opened: AtomicU64,
    pub acks_sent: AtomicU64,
    pub nacks_sent: AtomicU64,
    /// Resources rejected (by conversion or by snapshot validation).
    pub resources_rejected: AtomicU64,
    /// Snapshots published by the client.
    pub snapshots_published: AtomicU64,
    /// On-demand names subscribed.
    pub on_demand_subscriptions: AtomicU64,
}

impl XdsMetrics {
    /// The counters for `type_url` (`other` for unknown types).
    pub fn for_type(&self, type_url: &str) -> &TypeCounters {
        match type_url {
            ADDRESS_TYPE_URL => &self.address,
            AUTHORIZATION_TYPE_URL => &self.authorization,
            _ => &self.other,
        }
    }

    pub fn terminations(&self, reason: TerminationReason) -> u64 {
        self.terminations[reason as usize].load(Ordering::Relaxed)
    }

    fn terminated(&self, reason: TerminationReason) {
        self.terminations[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Shared between the client task and whoever reports on it (readiness
/// probe, metrics endpoint, tests). Cheap to clone.
#[derive(Clone)]
pub struct XdsStatus {
    inner: Arc<StatusInner>,
}

struct StatusInner {
    ready: watch::Sender<bool>,
    connected: AtomicBool,
    metrics: XdsMetrics,
}

impl XdsStatus {
    pub fn new() -> XdsStatus {
        XdsStatus {
            inner: Arc::new(StatusInner {
                ready: watch::channel(false).0,
                connected: AtomicBool::new(false),
                metrics: XdsMetrics::default(),
            }),
        }
    }

    /// True once a first response of every type we depend on has been
    /// applied (Authorization always; Address unless on-demand). Stays true
    /// across reconnects: the last snapshot remains usable.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// A receiver of the readiness flag (only `sync` tokio, any executor).
    pub fn ready_watch(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    /// Resolves once ready.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready_watch();
        // The sender lives in `self`, so this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// Whether a stream is currently up.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Relaxed)
    }

    pub fn metrics(&self) -> &XdsMetrics {
        &self.inner.metrics
    }

    fn set_ready(&self) {
        self.inner
            .ready
            .send_if_modified(|r| !std::mem::replace(r, true));
    }

    fn set_connected(&self, up: bool) {
        self.inner.connected.store(up, Ordering::Relaxed);
    }
}

impl Default for XdsStatus {
    fn default() -> Self {
        XdsStatus::new()
    }
}

impl fmt::Debug for XdsStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdsStatus")
            .field("ready", &self.is_ready())
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// On-demand
// ---------------------------------------------------------------------------

/// A core asking for an address it could not resolve.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OnDemandRequest {
    /// "network/IP".
    pub key: String,
}

/// Usable from any thread, no runtime needed (`send` never blocks).
pub type OnDemandSender = mpsc::UnboundedSender<OnDemandRequest>;
pub type OnDemandReceiver = mpsc::UnboundedReceiver<OnDemandRequest>;

pub fn on_demand_channel() -> (OnDemandSender, OnDemandReceiver) {
    mpsc::unbounded_channel()
}

/// How long the control plane's "no such address" answer to an on-demand
/// request stands: connections to that address meanwhile pass through (as
/// to any address outside the mesh) without asking again.
pub const ON_DEMAND_NEGATIVE_TTL: Duration = Duration::from_secs(10);

/// Whether `ip` on `network` names a workload, a service VIP or an address
/// inside a service's CIDR VIP.
pub fn resolves(snapshot: &Snapshot, network: &str, ip: IpAddr) -> bool {
    snapshot.workload_by_addr(network, ip).is_some()
        || snapshot.service_by_addr(network, ip).is_some()
}

/// For a core that met an unknown destination: asks the xDS client for
/// "network/IP" and waits until a published snapshot resolves it (as a
/// workload address or a service VIP), the control plane answers that it
/// does not exist, or `timeout` completes. A "does not exist" answer is
/// remembered for [`ON_DEMAND_NEGATIVE_TTL`]: within it, false at once.
///
/// Completion is judged by the lookup, not by which names a response
/// carried: istiod answers an address request under the resource's primary
/// name (uid or "ns/hostname") with "network/IP" only among its aliases.
///
/// Runtime-agnostic: pass the executor's own timer (e.g.
/// the core executor's `timer::sleep(DEFAULT_ON_DEMAND_TIMEOUT)`). Returns true at once
/// when the address already resolves, false when the client is gone.
pub async fn lookup_on_demand<T: Future>(
    feed: &mut SnapshotFeed,
    tx: &OnDemandSender,
    network: &str,
    ip: IpAddr,
    timeout: T,
) -> bool {
    let key = address_key(network, ip);
    let known = feed.load();
    if resolves(&known, network, ip) {
        return true;
    }
    if known.known_missing(&key) {
        return false; // asked recently: the control plane does not know it
    }
    drop(known);
    if tx.send(OnDemandRequest { key: key.clone() }).is_err() {
        return false;
    }
    let wait = async {
        loop {
            // Checked after every wake-up: versions published between the
            // first check and now make `changed` fire immediately.
            let snap = feed.load();
            if resolves(&snap, network, ip) {
                return true;
            }
            if snap.known_missing(&key) {
                return false;
            }
            drop(snap);
            if feed.changed().await.is_err() {
                return resolves(&feed.load(), network, ip);
            }
        }
    };
    let mut wait = pin!(wait);
    let mut timeout = pin!(timeout);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(found) = wait.as_mut().poll(cx) {
            return Poll::Ready(found);
        }
        if timeout.as_mut().poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// Runs the client on the control thread's tokio runtime, forever:
/// connects, streams, reconnects with backoff, publishing one snapshot per
/// response through `publisher` (applied on top of `publisher.current()`,
/// so it must be the only writer). While disconnected the last snapshot
/// stays current.
///
/// `on_demand` carries the cores' requests (see [`lookup_on_demand`]); pass
/// `None` when not in on-demand mode. Returns only for an invalid
/// configuration.
pub async fn run(
    cfg: XdsConfig,
    publisher: SnapshotPublisher,
    status: XdsStatus,
    on_demand: Option<OnDemandReceiver>,
) -> Result<(), XdsError> {
    cfg.validate()?;
    let mut client = Client {
        node: cfg.node.to_node(&cfg.cluster_id),
        cfg,
        publisher,
        status,
        on_demand_rx: on_demand,
        state: ClientState::default(),
        received_at: std::time::Instant::now(),
    };
    let mut backoff = Backoff::new(client.cfg.backoff);
    loop {
        let end = client.attempt().await;
        client.status.set_connected(false);
        let metrics = client.status.metrics();
        // A stream that delivered something resets the delays; one that
        // ends before any response (even "benignly") keeps growing them, so
        // a server that accepts and drops at once is not hammered.
        if end.healthy {
            backoff.reset();
        }
        let delay = match &end.reason {
            EndReason::ConnectFailed(e) => {
                metrics.terminated(TerminationReason::ConnectionError);
                tracing::warn!(address = %client.cfg.address, "xDS connection failed: {e}");
                backoff.next_delay()
            }
            EndReason::Failed(status) if is_benign(status) => {
                metrics.terminated(TerminationReason::Reconnect);
                tracing::info!(
                    "xDS stream ended ({:?}: {}), reconnecting",
                    status.code(),
                    status.message()
                );
                backoff.next_delay()
            }
            EndReason::Failed(status) => {
                metrics.terminated(TerminationReason::Error);
                tracing::warn!(
                    "xDS stream failed ({:?}: {}), reconnecting",
                    status.code(),
                    status.message()
                );
                backoff.next_delay()
            }
            EndReason::Closed => {
                metrics.terminated(TerminationReason::Complete);
                tracing::info!("xDS stream closed by the server, reconnecting");
                backoff.next_delay()
            }
        };
        tracing::debug!(?delay, "waiting before reconnecting to xDS");
        client.wait_collecting_on_demand(delay).await;
    }
}

/// gRPC ends that are part of normal operation (istiod's connection age
/// limit, a restart, a GOAWAY): counted as `Reconnect`, not `Error`.
fn is_benign(status: &tonic::Status) -> bool {
    use tonic::Code;
    let msg = status.message().to_ascii_lowercase();
    matches!(
        status.code(),
        Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    ) || msg.contains("transport is closing")
        || msg.contains("goaway")
}

struct Backoff {
    cfg: BackoffConfig,
    current: Duration,
}

impl Backoff {
    fn new(cfg: BackoffConfig) -> Backoff {
        Backoff {
            cfg,
            current: cfg.initial,
        }
    }

    fn reset(&mut self) {
        self.current = self.cfg.initial;
    }

    /// The delay to wait now (jittered), doubling the next one.
    fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.cfg.max);
        crate::backoff::jitter(&ring::rand::SystemRandom::new(), base)
    }
}

/// What survives reconnects.
#[derive(Default)]
struct ClientState {
    /// Last accepted version per resource name, per type. One entry per
    /// workload and service of the mesh, so held compactly: a workload's
    /// name is its uid's `Str` from the snapshot (shared, not copied), a
    /// service's the interned key.
    address_versions: HashMap<Str, Str>,
    authorization_versions: HashMap<Str, Str>,
    /// On-demand names subscribed so far (re-sent on reconnect).
    on_demand_names: BTreeSet<String>,
    /// On-demand names the server said do not exist: unsubscribed with the
    /// ACK of that response, so that asking again later is a new
    /// subscription the server answers afresh.
    unsubscribe_on_ack: Vec<String>,
    seen_address: bool,
    seen_authorization: bool,
}

struct Client {
    cfg: XdsConfig,
    node: Node,
    publisher: SnapshotPublisher,
    status: XdsStatus,
    on_demand_rx: Option<OnDemandReceiver>,
    state: ClientState,
    /// When the response being handled arrived (decoded): stamped on the
    /// snapshots it produces.
    received_at: std::time::Instant,
}

enum EndReason {
    ConnectFailed(String),
    Failed(tonic::Status),
    Closed,
}

struct StreamEnd {
    reason: EndReason,
    /// At least one response was processed.
    healthy: bool,
}

impl StreamEnd {
    fn connect_failed(e: impl fmt::Display) -> StreamEnd {
        StreamEnd {
            reason: EndReason::ConnectFailed(e.to_string()),
            healthy: false,
        }
    }
}

impl Client {
    async fn attempt(&mut self) -> StreamEnd {
        let channel = match self.connect().await {
            Ok(c) => c,
            Err(e) => return StreamEnd::connect_failed(e),
        };
        let mut grpc = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.cfg.max_message_size)
            .max_encoding_message_size(self.cfg.max_message_size);

        let (tx, rx) = mpsc::unbounded_channel();
        // Address first, then Authorization, as ztunnel.
        let _ = tx.send(self.initial_request(ADDRESS_TYPE_URL));
        let _ = tx.send(self.initial_request(AUTHORIZATION_TYPE_URL));
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Err(e) = self.add_headers(request.metadata_mut()) {
            return StreamEnd::connect_failed(e);
        }
        let mut inbound = match grpc.delta_aggregated_resources(request).await {
            Ok(resp) => resp.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return StreamEnd::connect_failed(format!(
                    "{:?}: {}",
                    status.code(),
                    status.message()
                ))
            }
            Err(status) => {
                return StreamEnd {
                    reason: EndReason::Failed(status),
                    healthy: false,
                }
            }
        };
        bump(&self.status.metrics().streams_opened);
        self.status.set_connected(true);
        tracing::info!(address = %self.cfg.address, "xDS stream established");

        let mut healthy = false;
        loop {
            let on_demand = async {
                match self.on_demand_rx.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        let reply = self.handle_response(resp);
                        healthy = true;
                        if tx.send(reply).is_err() {
                            // The request stream is gone: the call is over;
                            // the next `message()` reports why.
                            tracing::debug!("xDS request stream closed");
                        }
                    }
                    Ok(None) => return StreamEnd { reason: EndReason::Closed, healthy },
                    Err(status) => return StreamEnd { reason: EndReason::Failed(status), healthy },
                },
                req = on_demand => match req {
                    Some(req) => {
                        if let Some(sub) = self.subscribe_on_demand(req) {
                            let _ = tx.send(sub);
                        }
                    }
                    None => self.on_demand_rx = None,
                },
            }
        }
    }

    async fn connect(&self) -> Result<tonic::transport::Channel, String> {
        let mut endpoint = Endpoint::from_shared(self.cfg.address.clone())
            .map_err(|e| format!("invalid address: {e}"))?
            .connect_timeout(self.cfg.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if self.cfg.address.starts_with("https://") {
            let verifier = self.verifier()?;
            let mut tls = ClientTlsConfig::new();
            if let Some(host) = endpoint.uri().host() {
                // IPv6 literals come bracketed from the URI.
                tls = tls.domain_name(host.trim_start_matches('[').trim_end_matches(']'));
            }
            endpoint = endpoint
                .tls_config_with_verifier(tls, verifier)
                .map_err(|e| format!("TLS setup: {e}"))?;
        }
        let connect = endpoint.connect();
        // `connect_timeout` covers TCP only; bound TLS and HTTP/2 too.
        match tokio::time::timeout(self.cfg.connect_timeout * 2, connect).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(error_chain(&e)),
            Err(_) => Err("timed out".into()),
        }
    }

    fn verifier(&self) -> Result<Arc<dyn ServerCertVerifier>, String> {
        let path = self
            .cfg
            .root_ca
            .as_ref()
            .ok_or("TLS needs a root CA file")?;
        let pem = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let roots = crate::security::pki::parse_certs(&pem, "root CA")
            .and_then(crate::security::pki::root_store)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let alt = match &self.cfg.alt_hostname {
            Some(alt) => Some(
                ServerName::try_from(alt.clone())
                    .map_err(|_| format!("invalid alternative hostname {alt:?}"))?,
            ),
            None => None,
        };
        Ok(Arc::new(AltNameVerifier { inner, alt }))
    }

    fn add_headers(&self, md: &mut tonic::metadata::MetadataMap) -> Result<(), String> {
        if let Some(path) = &self.cfg.token_path {
            let token = std::fs::read_to_string(path)
                .map_err(|e| format!("token file {}: {e}", path.display()))?;
            let value: AsciiMetadataValue = format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| format!("token file {}: not a valid header value", path.display()))?;
            md.insert("authorization", value);
        }
        if !self.cfg.cluster_id.is_empty() {
            let value = self.cfg.cluster_id.parse().map_err(|_| {
                format!(
                    "cluster id {:?}: not a valid header value",
                    self.cfg.cluster_id
                )
            })?;
            md.insert("clusterid", value);
        }
        for (k, v) in &self.cfg.headers {
            let key: AsciiMetadataKey = k.parse().map_err(|_| format!("header name {k:?}"))?;
            let value: AsciiMetadataValue =
                v.parse().map_err(|_| format!("value of header {k:?}"))?;
            md.insert(key, value);
        }
        Ok(())
    }

    fn initial_request(&self, type_url: &str) -> DeltaDiscoveryRequest {
        let (versions, subscribe, unsubscribe) = match type_url {
            ADDRESS_TYPE_URL if self.cfg.on_demand => {
                // "*" then un-"*": an explicit, initially empty subscription
                // (an empty list alone would mean wildcard).
                let mut sub = vec!["*".to_owned()];
                sub.extend(self.state.on_demand_names.iter().cloned());
                (&self.state.address_versions, sub, vec!["*".to_owned()])
            }
            ADDRESS_TYPE_URL => (&self.state.address_versions, vec![], vec![]),
            _ => (&self.state.authorization_versions, vec![], vec![]),
        };
        DeltaDiscoveryRequest {
            node: Some(self.node.clone()),
            type_url: type_url.to_owned(),
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            initial_resource_versions: versions
                .iter()
                .map(|(name, version)| (name.to_string(), version.to_string()))
                .collect(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    fn subscribe_on_demand(&mut self, req: OnDemandRequest) -> Option<DeltaDiscoveryRequest> {
        if !self.cfg.on_demand {
            tracing::debug!(key = %req.key, "on-demand request ignored: not in on-demand mode");
            return None;
        }
        if !self.state.on_demand_names.insert(req.key.clone()) {
            return None;
        }
        bump(&self.status.metrics().on_demand_subscriptions);
        tracing::debug!(key = %req.key, "subscribing on demand");
        Some(DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE_URL.to_owned(),
            resource_names_subscribe: vec![req.key],
            ..DeltaDiscoveryRequest::default()
        })
    }

    /// While waiting to reconnect, queue on-demand names for the next
    /// stream's initial request.
    async fn wait_collecting_on_demand(&mut self, delay: Duration) {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            let on_demand = async {
                match self.on_demand_rx.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut sleep => return,
                req = on_demand => match req {
                    Some(req) => { self.subscribe_on_demand(req); }
                    None => self.on_demand_rx = None,
                },
            }
        }
    }

    /// Applies one response and returns its ACK or NACK.
    fn handle_response(&mut self, resp: DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        self.received_at = std::time::Instant::now();
        let status = self.status.clone();
        let metrics = status.metrics();
        let counters = metrics.for_type(&resp.type_url);
        bump(&counters.messages);
        counters
            .bytes
            .fetch_add(resp.encoded_len() as u64, Ordering::Relaxed);

        let was_ready = status.is_ready();
        let errors = match resp.type_url.as_str() {
            ADDRESS_TYPE_URL => self.apply_addresses(&resp),
            AUTHORIZATION_TYPE_URL => self.apply_authorizations(&resp),
            other => vec![(
                String::from("<response>"),
                format!("unsupported type URL {other:?}"),
            )],
        };
        match resp.type_url.as_str() {
            ADDRESS_TYPE_URL => self.state.seen_address = true,
            AUTHORIZATION_TYPE_URL => self.state.seen_authorization = true,
            _ => {}
        }
        if self.state.seen_authorization && (self.state.seen_address || self.cfg.on_demand) {
            self.status.set_ready();
        }
        // Workloads naming policies that are not there. Not before both
        // types have arrived once: addresses usually come first.
        if status.is_ready() {
            let snapshot = self.publisher.current();
            if !was_ready {
                crate::sources::warn_missing_policies(
                    &snapshot,
                    snapshot.workloads().map(|w| &**w),
                    "xds",
                );
            } else if resp.type_url == ADDRESS_TYPE_URL {
                let upserted = resp
                    .resources
                    .iter()
                    .filter_map(|r| snapshot.workload_by_uid(&r.name));
                crate::sources::warn_missing_policies(&snapshot, upserted.map(|w| &**w), "xds");
            }
        }

        let error_detail = if errors.is_empty() {
            bump(&metrics.acks_sent);
            None
        } else {
            bump(&metrics.nacks_sent);
            let message = errors
                .iter()
                .map(|(name, reason)| format!("{name}: {reason}"))
                .collect::<Vec<_>>()
                .join("; ");
            tracing::warn!(
                type_url = %resp.type_url,
                nonce = %resp.nonce,
                "rejecting {} resource(s): {message}",
                errors.len()
            );
            Some(RpcStatus {
                code: NACK_CODE,
                message,
                details: Vec::new(),
            })
        };
        let resource_names_unsubscribe = match resp.type_url.as_str() {
            ADDRESS_TYPE_URL => std::mem::take(&mut self.state.unsubscribe_on_ack),
            _ => Vec::new(),
        };
        DeltaDiscoveryRequest {
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            error_detail,
            resource_names_unsubscribe,
            ..DeltaDiscoveryRequest::default()
        }
    }

    fn apply_addresses(&mut self, resp: &DeltaDiscoveryResponse) -> Vec<(String, String)> {
        let current = self.publisher.current();
        let mut errors = Vec::new();
        let mut delta = SnapshotDelta::default();
        // Name → version of what this response upserts (last one wins when
        // a name repeats).
        let mut upserted: HashMap<String, String> = HashMap::new();
        let mut workloads: BTreeMap<String, _> = BTreeMap::new();
        let mut services: BTreeMap<String, _> = BTreeMap::new();
        for res in &resp.resources {
            match convert::decode_address_resource(res) {
                Ok(item) if item.name() != res.name => {
                    errors.push((
                        display_name(&res.name),
                        format!(
                            "resource name does not match its content (which is named {:?})",
                            item.name()
                        ),
                    ));
                    self.state.address_versions.remove(res.name.as_str());
                }
                Ok(AddressResource::Workload(w)) => {
                    services.remove(&res.name);
                    if current.service_by_key(&res.name).is_some() {
                        delta.remove_services.push(res.name.clone());
                    }
                    workloads.insert(res.name.clone(), w);
                    upserted.insert(res.name.clone(), res.version.clone());
                }
                Ok(AddressResource::Service(s)) => {
                    workloads.remove(&res.name);
                    if current.workload_by_uid(&res.name).is_some() {
                        delta.remove_workloads.push(res.name.clone());
                    }
                    services.insert(res.name.clone(), s);
                    upserted.insert(res.name.clone(), res.version.clone());
                }
                Err(e) => {
                    errors.push((display_name(&res.name), e.to_string()));
                    self.state.address_versions.remove(res.name.as_str());
                    upserted.remove(&res.name);
                    workloads.remove(&res.name);
                    services.remove(&res.name);
                }
            }
        }
        let mut removals = 0usize;
        for name in &resp.removed_resources {
            self.state.address_versions.remove(name.as_str());
            if upserted.contains_key(name) {
                continue; // removed and re-added in one response: keep it
            }
            // An on-demand name the server does not know: the cores waiting
            // on it give up now, and later connections to it for a while
            // do not ask again. It is forgotten and unsubscribed (with this
            // response's ACK), so that the next ask after that is a new
            // subscription the server answers afresh.
            if self.cfg.on_demand && self.state.on_demand_names.remove(name) {
                delta.missing.push((
                    name.clone(),
                    std::time::Instant::now() + self.cfg.on_demand_negative_ttl,
                ));
                self.state.unsubscribe_on_ack.push(name.clone());
                removals += 1;
            }
            if current.workload_by_uid(name).is_some() {
                delta.remove_workloads.push(name.clone());
                removals += 1;
            }
            if current.service_by_key(name).is_some() {
                delta.remove_services.push(name.clone());
                removals += 1;
            }
        }
        delta.upsert_workloads = workloads.into_values().collect();
        delta.upsert_services = services.into_values().collect();
        let rejected = self.apply_delta(&current, delta, upserted.len(), removals, &mut errors);
        let published = self.publisher.current();
        for (name, version) in upserted {
            if rejected.contains(&name) {
                self.state.address_versions.remove(name.as_str());
            } else {
                let name = match published.workload_by_uid(&name) {
                    Some(w) => w.uid.clone(),
                    None => intern(&name),
                };
                // Replace the key too: `insert` would keep the old one, the
                // uid of the workload's previous version, which nothing
                // else holds any more (64 bytes per updated workload).
                self.state.address_versions.remove(name.as_str());
                self.state.address_versions.insert(name, Str::from(version));
            }
        }
        errors
    }

    fn apply_authorizations(&mut self, resp: &DeltaDiscoveryResponse) -> Vec<(String, String)> {
        let current = self.publisher.current();
        let mut errors = Vec::new();
        let mut delta = SnapshotDelta::default();
        let mut upserted: HashMap<String, String> = HashMap::new();
        let mut policies: BTreeMap<String, _> = BTreeMap::new();
        // Refused resources are NACKed and still kept, unreadable, so that
        // they deny where they apply: a policy ringway cannot read must
        // never widen access (say an ALLOW that would have admitted less,
        // or a DENY whose previous version denied less).
        let mut unreadable: BTreeMap<String, UnreadablePolicy> = BTreeMap::new();
        for res in &resp.resources {
            let error = match convert::decode_authorization_resource(res) {
                Ok(p) if p.key() != res.name => ConvertError::new(format!(
                    "resource name does not match its content (which is named {:?})",
                    p.key()
                )),
                Ok(p) => {
                    unreadable.remove(&res.name);
                    policies.insert(res.name.clone(), p);
                    upserted.insert(res.name.clone(), res.version.clone());
                    continue;
                }
                Err(e) => e,
            };
            errors.push((display_name(&res.name), error.to_string()));
            self.state.authorization_versions.remove(res.name.as_str());
            upserted.remove(&res.name);
            policies.remove(&res.name);
            if let Some(mut u) = convert::unreadable_authorization(res, &error) {
                // Scope unknown: the previous version's, else mesh-wide. A
                // narrower guess could let a global DENY stop denying.
                if u.scope.is_none() {
                    let previous = current.compiled_policy(&res.name).map(|p| p.scope());
                    u.scope = Some(previous.unwrap_or(PolicyScope::Global));
                }
                unreadable.insert(res.name.clone(), u);
            }
        }
        let mut removals = 0usize;
        for name in &resp.removed_resources {
            self.state.authorization_versions.remove(name.as_str());
            if !upserted.contains_key(name) && current.compiled_policy(name).is_some() {
                delta.remove_policies.push(name.clone());
                removals += 1;
            }
        }
        delta.upsert_policies = policies.into_values().collect();
        delta.upsert_unreadable_policies = unreadable.into_values().collect();
        let changes = upserted.len() + delta.upsert_unreadable_policies.len();
        let rejected = self.apply_delta(&current, delta, changes, removals, &mut errors);
        for (name, version) in upserted {
            if rejected.contains(&name) {
                self.state.authorization_versions.remove(name.as_str());
            } else {
                self.state
                    .authorization_versions
                    .insert(Str::from(name), Str::from(version));
            }
        }
        errors
    }

    /// Applies `delta` on `current` and publishes the result when anything
    /// changed. Returns the names the snapshot refused (also added to
    /// `errors`).
    fn apply_delta(
        &self,
        current: &Snapshot,
        delta: SnapshotDelta,
        upserts: usize,
        removals: usize,
        errors: &mut Vec<(String, String)>,
    ) -> HashSet<String> {
        let metrics = self.status.metrics();
        let outcome = current.apply(delta);
        let mut rejected = HashSet::with_capacity(outcome.rejected.len());
        for r in outcome.rejected {
            errors.push((display_name(&r.name), r.error.to_string()));
            rejected.insert(r.name);
        }
        metrics
            .resources_rejected
            .fetch_add(errors.len() as u64, Ordering::Relaxed);
        let accepted = upserts.saturating_sub(rejected.len());
        if accepted > 0 || removals > 0 {
            let version = self
                .publisher
                .publish(outcome.snapshot.received(self.received_at));
            bump(&metrics.snapshots_published);
            tracing::debug!(version, accepted, removals, "published xDS snapshot");
        }
        rejected
    }
}

fn display_name(name: &str) -> String {
    if name.is_empty() {
        "<unnamed>".to_owned()
    } else {
        name.to_owned()
    }
}

/// "outer: inner: innermost" for transport errors, whose `Display` hides
/// the cause (e.g. "transport error" without the TLS reason).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// WebPKI verification against the configured roots, accepting the
/// certificate when it is valid for the dialled host or for the
/// alternative hostname (`ALT_XDS_HOSTNAME`).
#[derive(Debug)]
struct AltNameVerifier {
    inner: Arc<WebPkiServerVerifier>,
    alt: Option<ServerName<'static>>,
}

impl ServerCertVerifier for AltNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let first = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match (&first, &self.alt) {
            (
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )),
                Some(alt),
            ) => self
                .inner
                .verify_server_cert(end_entity, intermediates, alt, ocsp_response, now),
            _ => first,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_and_metadata() {
        let mut node = NodeInfo {
            instance_ip: Some("10.0.0.7".parse().unwrap()),
            pod_name: "ztunnel-abc".into(),
            pod_namespace: "istio-system".into(),
            node_name: "node-1".into(),
            ..NodeInfo::default()
        };
        node.metadata.insert(
            "NAME".into(),
            serde_json::Value::String("overridden".into()),
        );
        node.metadata
            .insert("OWNER".into(), serde_json::json!({"kind": "DaemonSet"}));
        assert_eq!(
            node.node_id(),
            "ztunnel~10.0.0.7~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
        );
        let n = node.to_node("Kubernetes");
        let md = n.metadata.unwrap().fields;
        let s = |k: &str| match &md[k].kind {
            Some(prost_types::value::Kind::StringValue(s)) => s.clone(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(s("NAME"), "ztunnel-abc");
        assert_eq!(s("NAMESPACE"), "istio-system");
        assert_eq!(s("INSTANCE_IPS"), "10.0.0.7");
        assert_eq!(s("NODE_NAME"), "node-1");
        assert_eq!(s("CLUSTER_ID"), "Kubernetes");
        assert!(matches!(
            md["OWNER"].kind,
            Some(prost_types::value::Kind::StructValue(_))
        ));
        let anonymous = NodeInfo::default();
        assert!(anonymous.node_id().starts_with("ztunnel~1.1.1.1~"));
    }

    #[test]
    fn backoff_grows_caps_and_resets() {
        let mut b = Backoff::new(BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(700),
        });
        let within = |d: Duration, base: u64| {
            let ms = d.as_secs_f64() * 1000.0;
            ms >= base as f64 * 0.79 && ms <= base as f64 * 1.21
        };
        for base in [100, 200, 400, 700, 700] {
            let d = b.next_delay();
            assert!(within(d, base), "{d:?} vs {base}");
        }
        b.reset();
        assert!(within(b.next_delay(), 100));
    }

    #[test]
    fn config_validation() {
        let node = NodeInfo::default();
        assert!(XdsConfig::new("http://127.0.0.1:1", node.clone())
            .validate()
            .is_ok());
        assert!(XdsConfig::new("https://istiod:15012", node.clone())
            .validate()
            .is_err());
        let mut tls = XdsConfig::new("https://istiod:15012", node.clone());
        tls.root_ca = Some("/tmp/root.pem".into());
        assert!(tls.validate().is_ok());
        assert!(XdsConfig::new("istiod:15012", node.clone())
            .validate()
            .is_err());
        let mut bad = XdsConfig::new("http://x:1", node);
        bad.headers.push(("bad header".into(), "v".into()));
        assert!(bad.validate().is_err());
    }

    #[test]
    fn benign_ends() {
        assert!(is_benign(&tonic::Status::unknown("h2 protocol error")));
        assert!(is_benign(&tonic::Status::cancelled("")));
        assert!(is_benign(&tonic::Status::unavailable(
            "transport is closing"
        )));
        assert!(!is_benign(&tonic::Status::permission_denied("no")));
        assert!(!is_benign(&tonic::Status::unavailable(
            "connection refused"
        )));
    }
}
