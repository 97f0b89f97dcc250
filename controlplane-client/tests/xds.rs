//! The Delta ADS client against real gRPC servers on loopback: the dev
//! control plane (`devcp`), and a scripted server whose every response the
//! test writes by hand (for exact checks of ACK/NACK, versions, headers).
//!
//! Servers run on their own thread and runtime, so "stopping" one drops
//! every connection and stream at once, like a killed process.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use ringway_controlplane::devcp::{self, ads, DevAds, Router, XdsResources};
use ringway_controlplane::model::{Policy, PolicyAction, PolicyScope, Workload};
use ringway_controlplane::sources::xds::convert::{self, AddressResource};
use ringway_controlplane::sources::xds::{
    self, BackoffConfig, NodeInfo, OnDemandSender, TerminationReason, XdsConfig, XdsStatus,
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use ringway_controlplane::{BuiltinCa, SnapshotPublisher};
use ringway_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ringway_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ringway_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::Stream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A server on its own thread and current-thread runtime.
struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What the server's thread logs (its tracing events, as text).
    log: tempfile::NamedTempFile,
}

impl TestServer {
    fn start<F, Fut>(bind: SocketAddr, serve: F) -> TestServer
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let log = tempfile::NamedTempFile::new().unwrap();
        let writer = Arc::new(log.reopen().unwrap());
        let thread = std::thread::spawn(move || {
            // The thread's own subscriber: what this server logs, and no
            // other test's.
            let _logging = tracing::subscriber::set_default(
                tracing_subscriber::fmt()
                    .with_writer(writer)
                    .with_ansi(false)
                    .finish(),
            );
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = bind_retry(bind).await;
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tokio::select! {
                    () = serve(listener) => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime drops every connection and stream task.
            drop(rt);
        });
        let addr = addr_rx.recv_timeout(WAIT).expect("server did not start");
        TestServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
            log,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the server has logged a line containing `text`.
    fn logged(&self, text: &str) -> bool {
        std::fs::read_to_string(self.log.path())
            .unwrap()
            .contains(text)
    }

    fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn bind_retry(addr: SocketAddr) -> tokio::net::TcpListener {
    let deadline = Instant::now() + WAIT;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("bind {addr}: {e}"),
        }
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The dev control plane, plaintext, optionally watching a file.
fn start_devcp(bind: SocketAddr, ads: DevAds, watch: Option<&Path>) -> TestServer {
    let watch = watch.map(Path::to_owned);
    TestServer::start(bind, move |listener| async move {
        if let Some(path) = watch {
            tokio::spawn(ads::watch_file(
                path,
                Duration::from_millis(20),
                ads.clone(),
            ));
        }
        devcp::serve(
            listener,
            None,
            Router::new(ads, None),
            std::future::pending(),
        )
        .await
        .unwrap();
    })
}

fn node() -> NodeInfo {
    NodeInfo {
        instance_ip: Some("10.244.0.5".parse().unwrap()),
        instance_ips: vec![],
        pod_name: "ztunnel-x1".into(),
        pod_namespace: "istio-system".into(),
        node_name: "node-1".into(),
        metadata: Default::default(),
    }
}

fn client_config(url: &str) -> XdsConfig {
    let mut cfg = XdsConfig::new(url, node());
    cfg.cluster_id = "test-cluster".into();
    cfg.backoff = BackoffConfig {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(200),
    };
    cfg.connect_timeout = Duration::from_secs(2);
    cfg
}

struct TestClient {
    publisher: SnapshotPublisher,
    status: XdsStatus,
    task: tokio::task::JoinHandle<()>,
}

impl TestClient {
    fn start(cfg: XdsConfig, on_demand: Option<xds::OnDemandReceiver>) -> TestClient {
        let publisher = SnapshotPublisher::new();
        let status = XdsStatus::new();
        let task = tokio::spawn({
            let (publisher, status) = (publisher.clone(), status.clone());
            async move {
                xds::run(cfg, publisher, status, on_demand).await.unwrap();
            }
        });
        TestClient {
            publisher,
            status,
            task,
        }
    }

    async fn ready(&self) {
        tokio::time::timeout(WAIT, self.status.wait_ready())
            .await
            .expect("client never became ready");
    }
}

impl Drop for TestClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `cond` until it holds (panics after [`WAIT`]).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/a
  name: a
  namespace: default
  serviceAccount: sa-a
  workloadIps: ["10.0.0.1"]
  protocol: HBONE
  node: node-1
  services:
    "default/web.default.svc.cluster.local": {80: 8080}
- uid: cluster1//v1/Pod/default/b
  name: b
  namespace: default
  workloadIps: ["10.0.0.2"]
  protocol: TCP
services:
- name: web
  namespace: default
  hostname: web.default.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
policies:
- name: allow-all
  namespace: default
  scope: Namespace
  action: Allow
  rules: [[[ {notDestinationPorts: [9999]} ]]]
"#;

/// MESH with workload b gone, workload c added, a's address changed and
/// the policy removed.
const MESH_EDITED: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/a
  name: a
  namespace: default
  serviceAccount: sa-a
  workloadIps: ["10.0.0.11"]
  protocol: HBONE
  node: node-1
  services:
    "default/web.default.svc.cluster.local": {80: 8080}
- uid: cluster1//v1/Pod/default/c
  name: c
  namespace: default
  workloadIps: ["10.0.0.3"]
services:
- name: web
  namespace: default
  hostname: web.default.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
"#;

/// Atomically, as a careful editor or a ConfigMap update does.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn mesh(text: &str) -> XdsResources {
    ads::load_config(text, "test").unwrap()
}

// ---------------------------------------------------------------------------
// A scripted ADS server
// ---------------------------------------------------------------------------

/// Hands each new stream to the test.
#[derive(Clone)]
struct Scripted {
    conns: mpsc::UnboundedSender<ScriptConn>,
}

struct ScriptConn {
    metadata: tonic::metadata::MetadataMap,
    requests: mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>,
}

impl ScriptConn {
    async fn request(&mut self) -> DeltaDiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("no request from the client")
            .expect("the client closed the stream")
    }

    /// Reads the two initial requests (Address, then Authorization).
    async fn initial(&mut self) -> (DeltaDiscoveryRequest, DeltaDiscoveryRequest) {
        let a = self.request().await;
        let b = self.request().await;
        assert_eq!(a.type_url, ADDRESS_TYPE_URL, "Address is subscribed first");
        assert_eq!(b.type_url, AUTHORIZATION_TYPE_URL);
        (a, b)
    }

    fn respond(&self, resp: DeltaDiscoveryResponse) {
        self.responses.send(Ok(resp)).expect("stream gone");
    }

    /// Sends `resp` and returns the client's ACK/NACK for it.
    async fn exchange(&mut self, resp: DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        let nonce = resp.nonce.clone();
        self.respond(resp);
        let reply = self.request().await;
        assert_eq!(reply.response_nonce, nonce, "reply to the right response");
        reply
    }

    fn header(&self, key: &str) -> Option<String> {
        self.metadata
            .get(key)
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Scripted {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(Status::unimplemented("sotw"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (resp_tx, resp_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                if req_tx.send(r).is_err() {
                    break;
                }
            }
        });
        let _ = self.conns.send(ScriptConn {
            metadata,
            requests: req_rx,
            responses: resp_tx,
        });
        Ok(Response::new(UnboundedReceiverStream::new(resp_rx)))
    }
}

fn start_scripted(bind: SocketAddr) -> (TestServer, mpsc::UnboundedReceiver<ScriptConn>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let server = TestServer::start(bind, move |listener| async move {
        let svc = AggregatedDiscoveryServiceServer::new(Scripted { conns: tx })
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(svc, TcpIncoming::from(listener), std::future::pending())
            .await
            .unwrap();
    });
    (server, rx)
}

async fn next_conn(rx: &mut mpsc::UnboundedReceiver<ScriptConn>) -> ScriptConn {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("the client did not (re)connect")
        .expect("server gone")
}

fn workload(uid: &str, addr: &str) -> Workload {
    Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        addresses: vec![ip(addr)].into(),
        ..Workload::default()
    }
}

fn wl_resource(uid: &str, addr: &str, version: &str) -> Resource {
    convert::address_resource(
        &AddressResource::Workload(workload(uid, addr)),
        version.into(),
    )
}

fn policy_resource(name: &str, version: &str) -> Resource {
    convert::authorization_resource(
        &Policy {
            name: name.into(),
            namespace: "default".into(),
            scope: PolicyScope::Namespace,
            action: PolicyAction::Allow,
            dry_run: false,
            rules: vec![],
        },
        version.into(),
    )
}

/// A resource with `proto` (a `ringway_proto::workload::Workload`) as its
/// payload, for hand-made bad content.
fn raw_workload_resource(name: &str, proto: ringway_proto::workload::Workload) -> Resource {
    let addr = ringway_proto::workload::Address {
        r#type: Some(ringway_proto::workload::address::Type::Workload(proto)),
    };
    Resource {
        name: name.into(),
        version: "1".into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: addr.encode_to_vec(),
        }),
        ..Resource::default()
    }
}

fn response(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        ..DeltaDiscoveryResponse::default()
    }
}

fn sorted(m: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------
// Tests against the dev control plane
// ---------------------------------------------------------------------------

#[tokio::test]
async fn initial_sync_of_both_types_makes_the_client_ready() {
    let ads = DevAds::new(mesh(MESH));
    let server = start_devcp(loopback(), ads.clone(), None);
    let client = TestClient::start(client_config(&server.url()), None);
    client.ready().await;

    let snap = client.publisher.current();
    assert_eq!(snap.workloads().len(), 2);
    assert_eq!(snap.services().len(), 1);
    assert_eq!(snap.policy_count(), 1);
    let a = snap.workload_by_addr("", ip("10.0.0.1")).unwrap();
    assert_eq!(a.uid, "cluster1//v1/Pod/default/a");
    assert_eq!(a.spiffe_id(), "spiffe://cluster.local/ns/default/sa/sa-a");
    assert_eq!(
        snap.service_by_vip("", ip("10.96.0.1")).unwrap().key(),
        "default/web.default.svc.cluster.local"
    );
    assert_eq!(
        snap.endpoints("default/web.default.svc.cluster.local")
            .len(),
        1
    );
    assert!(snap.policy("default/allow-all").is_some());
    // One snapshot per response: Address, then Authorization.
    assert_eq!(client.publisher.version(), 2);

    let m = client.status.metrics();
    assert_eq!(
        m.address
            .messages
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        m.authorization
            .messages
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(m.address.bytes.load(std::sync::atomic::Ordering::Relaxed) > 100);
    assert!(client.status.is_connected());
    eventually("server saw both ACKs", || {
        ads.stats().acks.load(std::sync::atomic::Ordering::Relaxed) == 2
    })
    .await;
    assert_eq!(
        ads.stats().nacks.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    server.stop();
}

#[tokio::test]
async fn file_edits_reach_the_client_as_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, MESH).unwrap();
    let ads = ads::load_file(&path).unwrap();
    let server = start_devcp(loopback(), ads.clone(), Some(&path));
    let client = TestClient::start(client_config(&server.url()), None);
    client.ready().await;
    let before = client.publisher.version();

    replace_file(&path, MESH_EDITED);
    eventually("the edit arrived", || {
        let s = client.publisher.current();
        s.workload_by_uid("cluster1//v1/Pod/default/c").is_some() && s.policy_count() == 0
    })
    .await;
    let snap = client.publisher.current();
    assert!(snap.workload_by_uid("cluster1//v1/Pod/default/b").is_none());
    assert!(snap.workload_by_addr("", ip("10.0.0.1")).is_none());
    assert_eq!(
        snap.workload_by_addr("", ip("10.0.0.11")).unwrap().name,
        "a",
        "an address change moves the index entry"
    );
    assert_eq!(
        client.publisher.version(),
        before + 2,
        "one snapshot per pushed response (Address, Authorization)"
    );

    // A broken edit is refused by the server: nothing is pushed. Shown once
    // the server has logged the refusal and a later good edit has arrived
    // (the stream is in order: a push for the broken one would come first).
    replace_file(&path, "workloads: [ {uid: x} ]");
    eventually("the server to refuse the broken edit", || {
        server.logged("rejected config")
    })
    .await;
    replace_file(&path, MESH);
    eventually("the edit back arrived", || {
        let s = client.publisher.current();
        s.workload_by_uid("cluster1//v1/Pod/default/b").is_some() && s.policy_count() == 1
    })
    .await;
    assert_eq!(
        client.publisher.version(),
        before + 4,
        "nothing for the broken edit, one snapshot per response for the good ones"
    );
    assert!(client.status.is_connected());
    server.stop();
}

/// devcp's side of the protocol, checked with a raw stream: only changes are
/// pushed, and `initial_resource_versions` is honoured.
#[tokio::test]
async fn devcp_sends_only_what_the_client_lacks() {
    let ads = DevAds::new(mesh(MESH));
    let server = start_devcp(loopback(), ads.clone(), None);
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();

    async fn open(
        channel: &tonic::transport::Channel,
        first: DeltaDiscoveryRequest,
    ) -> (
        mpsc::UnboundedSender<DeltaDiscoveryRequest>,
        Streaming<DeltaDiscoveryResponse>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(first).unwrap();
        let stream = AggregatedDiscoveryServiceClient::new(channel.clone())
            .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        (tx, stream)
    }
    async fn next(s: &mut Streaming<DeltaDiscoveryResponse>) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, s.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }

    let wildcard = DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE_URL.into(),
        ..Default::default()
    };
    let (tx, mut s) = open(&channel, wildcard.clone()).await;
    let full = next(&mut s).await;
    let mut names: Vec<_> = full.resources.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cluster1//v1/Pod/default/a",
            "cluster1//v1/Pod/default/b",
            "default/web.default.svc.cluster.local"
        ]
    );
    let web = full
        .resources
        .iter()
        .find(|r| r.name.starts_with("default/"))
        .unwrap();
    assert_eq!(web.aliases, ["/10.96.0.1"]);
    tx.send(DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE_URL.into(),
        response_nonce: full.nonce.clone(),
        ..Default::default()
    })
    .unwrap();
    let versions: HashMap<String, String> = full
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();

    ads.set_config(mesh(MESH_EDITED));
    let delta = next(&mut s).await;
    let mut changed: Vec<_> = delta.resources.iter().map(|r| r.name.as_str()).collect();
    changed.sort();
    assert_eq!(
        changed,
        ["cluster1//v1/Pod/default/a", "cluster1//v1/Pod/default/c"],
        "the unchanged service is not re-sent"
    );
    assert_eq!(delta.removed_resources, ["cluster1//v1/Pod/default/b"]);
    drop((tx, s));

    // Reconnect presenting the old versions: the server sends the changes
    // since then, nothing the client already has.
    let (_tx, mut s) = open(
        &channel,
        DeltaDiscoveryRequest {
            initial_resource_versions: versions,
            ..wildcard.clone()
        },
    )
    .await;
    let resumed = next(&mut s).await;
    let mut changed: Vec<_> = resumed.resources.iter().map(|r| r.name.as_str()).collect();
    changed.sort();
    assert_eq!(
        changed,
        ["cluster1//v1/Pod/default/a", "cluster1//v1/Pod/default/c"]
    );
    assert_eq!(resumed.removed_resources, ["cluster1//v1/Pod/default/b"]);

    // Up to date already: an empty answer.
    let current = ads.config();
    let up_to_date: HashMap<String, String> = current
        .names(ADDRESS_TYPE_URL)
        .into_iter()
        .map(|n| {
            let v = current.get(ADDRESS_TYPE_URL, &n).unwrap().version.clone();
            (n, v)
        })
        .collect();
    let (_tx, mut s) = open(
        &channel,
        DeltaDiscoveryRequest {
            initial_resource_versions: up_to_date,
            ..wildcard
        },
    )
    .await;
    let empty = next(&mut s).await;
    assert!(empty.resources.is_empty() && empty.removed_resources.is_empty());
    server.stop();
}

#[tokio::test]
async fn server_restart_keeps_the_snapshot_and_resumes() {
    let ads = DevAds::new(mesh(MESH));
    let server = start_devcp(loopback(), ads, None);
    let addr = server.addr;
    let client = TestClient::start(client_config(&server.url()), None);
    client.ready().await;
    let synced = client.publisher.version();

    server.stop();
    eventually("the client noticed", || !client.status.is_connected()).await;
    let m = client.status.metrics();
    eventually("reconnect attempts fail", || {
        m.terminations(TerminationReason::ConnectionError) >= 2
    })
    .await;
    // Meanwhile the last snapshot stays.
    assert_eq!(client.publisher.version(), synced);
    assert_eq!(client.publisher.current().workloads().len(), 2);
    assert!(client.status.is_ready());

    // Back, with a changed config.
    let server = start_devcp(addr, DevAds::new(mesh(MESH_EDITED)), None);
    eventually("resynced after the restart", || {
        let s = client.publisher.current();
        s.workload_by_uid("cluster1//v1/Pod/default/c").is_some()
            && s.workload_by_uid("cluster1//v1/Pod/default/b").is_none()
            && s.policy_count() == 0
    })
    .await;
    assert!(client.status.is_connected());
    assert_eq!(
        m.streams_opened.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    let ended =
        m.terminations(TerminationReason::Reconnect) + m.terminations(TerminationReason::Error);
    assert_eq!(ended, 1, "the first stream ended once");
    server.stop();
}

/// On-demand: nothing is subscribed up front; a core (here a plain thread
/// with no tokio runtime) asks for an IP and waits for a snapshot that
/// resolves it. devcp answers like istiod: under the primary name, with
/// "network/IP" only in the aliases.
/// A short negative TTL, so the test can see it expire.
const NEGATIVE_TTL: Duration = Duration::from_millis(500);

#[tokio::test]
async fn on_demand_lookup_resolves_through_aliases() {
    let ads = DevAds::new(mesh(MESH));
    let server = start_devcp(loopback(), ads.clone(), None);
    let mut cfg = client_config(&server.url());
    cfg.on_demand = true;
    cfg.on_demand_negative_ttl = NEGATIVE_TTL;
    let (tx, rx) = xds::on_demand_channel();
    let client = TestClient::start(cfg, Some(rx));
    client.ready().await; // Authorization alone makes an on-demand client ready
    assert_eq!(client.publisher.current().workloads().len(), 0);
    assert_eq!(client.publisher.current().policy_count(), 1);

    fn lookup_from_thread(
        feed: ringway_controlplane::SnapshotFeed,
        tx: OnDemandSender,
        ip: IpAddr,
        timeout: Duration,
    ) -> std::thread::JoinHandle<(bool, Duration)> {
        std::thread::spawn(move || {
            let mut feed = feed;
            // A runtime-agnostic timer: a thread fires a oneshot.
            let (fire, fired) = oneshot::channel::<()>();
            std::thread::spawn(move || {
                std::thread::sleep(timeout);
                let _ = fire.send(());
            });
            let start = Instant::now();
            let found = futures_lite::future::block_on(xds::lookup_on_demand(
                &mut feed,
                &tx,
                "",
                ip,
                async move {
                    let _ = fired.await;
                },
            ));
            (found, start.elapsed())
        })
    }

    let t = lookup_from_thread(
        client.publisher.subscribe(),
        tx.clone(),
        ip("10.0.0.2"),
        Duration::from_secs(5),
    );
    let (found, took) = tokio::task::spawn_blocking(move || t.join().unwrap())
        .await
        .unwrap();
    assert!(found, "the workload was fetched on demand");
    assert!(took < Duration::from_secs(5));
    let snap = client.publisher.current();
    assert_eq!(
        snap.workload_by_addr("", ip("10.0.0.2")).unwrap().uid,
        "cluster1//v1/Pod/default/b"
    );
    assert_eq!(snap.workloads().len(), 1, "only what was asked for");

    // A service VIP works the same way.
    let t = lookup_from_thread(
        client.publisher.subscribe(),
        tx.clone(),
        ip("10.96.0.1"),
        Duration::from_secs(5),
    );
    assert!(tokio::task::spawn_blocking(move || t.join().unwrap().0)
        .await
        .unwrap());

    // Already known: true at once, nothing asked.
    let subs = client
        .status
        .metrics()
        .on_demand_subscriptions
        .load(std::sync::atomic::Ordering::Relaxed);
    let t = lookup_from_thread(
        client.publisher.subscribe(),
        tx.clone(),
        ip("10.0.0.2"),
        Duration::from_secs(5),
    );
    assert!(tokio::task::spawn_blocking(move || t.join().unwrap().0)
        .await
        .unwrap());
    assert_eq!(
        client
            .status
            .metrics()
            .on_demand_subscriptions
            .load(std::sync::atomic::Ordering::Relaxed),
        subs
    );

    // Unknown: the server answers "removed", and the lookup ends with it,
    // long before its timeout; asked again within the negative TTL, false
    // at once and nothing sent.
    let subscriptions = || {
        client
            .status
            .metrics()
            .on_demand_subscriptions
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let subs_before = subscriptions();
    let negative_lookup = || {
        let t = lookup_from_thread(
            client.publisher.subscribe(),
            tx.clone(),
            ip("10.9.9.9"),
            Duration::from_secs(5),
        );
        async move {
            tokio::task::spawn_blocking(move || t.join().unwrap())
                .await
                .unwrap()
        }
    };
    for (attempt, limit) in [
        ("first", Duration::from_secs(2)),
        ("again", Duration::from_millis(100)),
    ] {
        let (found, took) = negative_lookup().await;
        assert!(!found, "{attempt}");
        assert!(
            took < limit,
            "{attempt}: waited {took:?} for a negative answer"
        );
        assert!(client.publisher.current().known_missing("/10.9.9.9"));
    }
    assert_eq!(
        subscriptions(),
        subs_before + 1,
        "one subscription for both lookups"
    );
    // Once the answer expires, asking again is a new subscription (the
    // name was unsubscribed with the ACK), answered at once again.
    tokio::time::sleep(NEGATIVE_TTL).await;
    let (found, took) = negative_lookup().await;
    assert!(!found);
    assert!(
        took < Duration::from_secs(2),
        "after the TTL: waited {took:?}"
    );
    assert_eq!(
        subscriptions(),
        subs_before + 2,
        "asked again after the TTL"
    );

    // The subscription follows updates: b's address change is pushed.
    let edited = MESH.replace("10.0.0.2", "10.0.0.22");
    let before = client.publisher.version();
    ads.set_config(mesh(&edited));
    eventually("b was removed from the client", || {
        client.publisher.version() > before
            && client
                .publisher
                .current()
                .workload_by_addr("", ip("10.0.0.2"))
                .is_none()
    })
    .await;
    drop(server);
}

#[tokio::test]
async fn devcp_over_tls_with_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(BuiltinCa::load_or_create(&dir.path().join("ca"), "cluster.local").unwrap());
    // istiod's name and the listen IP, not "localhost".
    let cert = devcp::issue_server_cert(
        &ca,
        &["istiod.istio-system.svc".into()],
        &[ip("127.0.0.1")],
        Duration::from_secs(3600),
    )
    .unwrap();
    let ads = DevAds::new(mesh(MESH));
    let ca_service = devcp::ca::service(ca.clone(), Default::default());
    let server = TestServer::start(loopback(), move |listener| async move {
        devcp::serve(
            listener,
            Some(&cert),
            Router::new(ads, Some(ca_service)),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    let root = dir.path().join("ca").join("root-cert.pem");
    let port = server.addr.port();

    // By IP (an IP SAN).
    let mut cfg = client_config(&format!("https://127.0.0.1:{port}"));
    cfg.root_ca = Some(root.clone());
    let client = TestClient::start(cfg, None);
    client.ready().await;
    assert_eq!(client.publisher.current().workloads().len(), 2);
    drop(client);

    // By a name the certificate lacks: refused, unless the alternative
    // hostname (ALT_XDS_HOSTNAME) is one it has.
    let mut cfg = client_config(&format!("https://localhost:{port}"));
    cfg.root_ca = Some(root.clone());
    let wrong_name = TestClient::start(cfg.clone(), None);
    cfg.alt_hostname = Some("istiod.istio-system.svc".into());
    let alt = TestClient::start(cfg, None);
    alt.ready().await;
    let m = wrong_name.status.metrics();
    eventually("name mismatch counted", || {
        m.terminations(TerminationReason::ConnectionError) >= 1
    })
    .await;
    assert!(!wrong_name.status.is_ready());
    drop((wrong_name, alt));

    // A client trusting another root never connects.
    let other = dir.path().join("other");
    let other_ca = BuiltinCa::load_or_create(&other, "cluster.local").unwrap();
    drop(other_ca);
    let mut cfg = client_config(&format!("https://127.0.0.1:{port}"));
    cfg.root_ca = Some(other.join("root-cert.pem"));
    let untrusting = TestClient::start(cfg, None);
    let m = untrusting.status.metrics();
    eventually("TLS failures are counted", || {
        m.terminations(TerminationReason::ConnectionError) >= 2
    })
    .await;
    assert!(!untrusting.status.is_ready());
    assert_eq!(
        m.streams_opened.load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // The CA is served on the same port.
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(
                    std::fs::read(&root).unwrap(),
                ))
                .domain_name("istiod.istio-system.svc"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://cluster.local/ns/default/sa/sa-a"
            .try_into()
            .unwrap(),
    )];
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    let resp =
        ringway_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient::new(
            channel,
        )
        .create_certificate(ringway_proto::ca::IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.cert_chain.len() >= 2);
    server.stop();
}

// ---------------------------------------------------------------------------
// Tests against the scripted server
// ---------------------------------------------------------------------------

#[tokio::test]
async fn nack_names_bad_resources_and_good_ones_still_apply() {
    let (server, mut conns) = start_scripted(loopback());
    let client = TestClient::start(client_config(&server.url()), None);
    let mut conn = next_conn(&mut conns).await;
    let (addr_req, auth_req) = conn.initial().await;
    assert!(addr_req.resource_names_subscribe.is_empty(), "wildcard");
    assert!(auth_req.resource_names_subscribe.is_empty(), "wildcard");

    let mut bad_ip = convert::workload_to_proto(&workload("bad-ip", "10.0.0.9"));
    bad_ip.addresses[0] = bytes::Bytes::from_static(&[1, 2, 3, 4, 5]);
    let mut bad_enum = convert::workload_to_proto(&workload("bad-enum", "10.0.0.8"));
    bad_enum.tunnel_protocol = 9;
    let mut legacy = convert::workload_to_proto(&workload("legacy", "10.0.0.7"));
    legacy.tunnel_protocol = 2;
    let garbage = Resource {
        name: "garbage".into(),
        version: "1".into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0xff],
        }),
        ..Resource::default()
    };
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "n1",
            vec![
                wl_resource("good", "10.0.0.1", "1"),
                raw_workload_resource("bad-ip", bad_ip),
                raw_workload_resource("bad-enum", bad_enum),
                raw_workload_resource("legacy", legacy),
                garbage,
                // Shares good's address: kept (as ztunnel keeps it), and
                // answers for it, being the newer.
                wl_resource("sharer", "10.0.0.1", "1"),
                // Named after something else than its content.
                Resource {
                    name: "alias-name".into(),
                    ..wl_resource("real-uid", "10.0.0.6", "1")
                },
            ],
            &[],
        ))
        .await;
    assert_eq!(reply.type_url, ADDRESS_TYPE_URL);
    let detail = reply.error_detail.expect("a NACK").message;
    for expected in [
        "bad-ip: addresses[0]: IP address must be 4 or 16 bytes, got 5",
        "bad-enum: tunnel_protocol: unknown enum value 9",
        "legacy: tunnel_protocol: LEGACY_ISTIO_MTLS is not supported",
        "garbage: undecodable istio.workload.Address",
        "alias-name: resource name does not match",
    ] {
        assert!(
            detail.contains(expected),
            "{expected:?} missing from {detail:?}"
        );
    }
    assert!(
        !detail.contains("good:") && !detail.contains("sharer"),
        "{detail}"
    );
    assert_eq!(
        detail.matches("; ").count(),
        4,
        "one entry per bad resource: {detail}"
    );

    let snap = client.publisher.current();
    assert_eq!(snap.workloads().len(), 2);
    assert_eq!(
        snap.workload_by_addr("", ip("10.0.0.1")).unwrap().uid,
        "sharer"
    );

    // Authorization: a policy with an unknown action is refused, the other kept.
    let mut bad_policy = policy_resource("bad", "1");
    let mut p = ringway_proto::security::Authorization::decode(
        bad_policy.resource.as_ref().unwrap().value.as_slice(),
    )
    .unwrap();
    p.action = 7;
    bad_policy.resource.as_mut().unwrap().value = p.encode_to_vec();
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n2",
            vec![policy_resource("ok", "1"), bad_policy],
            &[],
        ))
        .await;
    assert_eq!(
        reply.error_detail.unwrap().message,
        "default/bad: action: unknown enum value 7"
    );
    client.ready().await;
    assert!(client.publisher.current().policy("default/ok").is_some());
    let m = client.status.metrics();
    assert_eq!(m.nacks_sent.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(
        m.resources_rejected
            .load(std::sync::atomic::Ordering::Relaxed),
        6
    );

    // A clean response is ACKed.
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "n3",
            vec![wl_resource("second", "10.0.0.2", "1")],
            &["good"],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    let snap = client.publisher.current();
    assert!(snap.workload_by_uid("good").is_none());
    assert!(snap.workload_by_uid("second").is_some());
    server.stop();
}

/// A policy the client cannot read is NACKed by name, and kept so that it
/// denies where it applies until a readable version arrives: it must never
/// widen access (here, it replaces a readable version that denied less).
#[tokio::test]
async fn unreadable_policies_are_nacked_and_deny_until_replaced() {
    use ringway_controlplane::model::authz::{Conn, Verdict};
    let (server, mut conns) = start_scripted(loopback());
    let client = TestClient::start(client_config(&server.url()), None);
    let mut conn = next_conn(&mut conns).await;
    conn.initial().await;
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "n1",
            vec![wl_resource("web", "10.0.0.1", "1")],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n2",
            vec![policy_resource("allow-nothing", "1")],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    client.ready().await;
    let decide = |client: &TestClient| {
        let snap = client.publisher.current();
        let w = snap.workload_by_uid("web").unwrap().clone();
        let conn = Conn {
            src: ip("10.0.0.9"),
            dst: SocketAddr::new(ip("10.0.0.1"), 8080),
            peer: None,
        };
        let v = snap.authorize(&w, &conn, &mut |_| {});
        (
            v.allowed(),
            matches!(v, Verdict::DeniedUnreadable(_)),
            v.to_string(),
        )
    };
    assert_eq!(decide(&client).2, "allow policies exist, but none allowed");

    // Version 2 carries a source CIDR longer than IPv4 allows.
    let mut bad = policy_resource("allow-nothing", "2");
    let any = bad.resource.as_mut().unwrap();
    let mut p = ringway_proto::security::Authorization::decode(any.value.as_slice()).unwrap();
    p.rules = vec![ringway_proto::security::Rule {
        clauses: vec![ringway_proto::security::Clause {
            matches: vec![ringway_proto::security::Match {
                source_ips: vec![ringway_proto::security::Address {
                    address: bytes::Bytes::from_static(&[10, 0, 0, 0]),
                    length: 40,
                }],
                ..Default::default()
            }],
        }],
    }];
    any.value = p.encode_to_vec();
    let reply = conn
        .exchange(response(AUTHORIZATION_TYPE_URL, "n3", vec![bad], &[]))
        .await;
    let nack = reply.error_detail.expect("a NACK").message;
    assert!(
        nack.starts_with("default/allow-nothing: rules[0].clauses[0].matches[0]: source_ips[0]"),
        "{nack}"
    );
    eventually("the unreadable policy is in the snapshot", || {
        client.publisher.current().unreadable_policies().count() == 1
    })
    .await;
    let (allowed, unreadable, why) = decide(&client);
    assert!(!allowed && unreadable, "{why}");
    assert!(
        why.contains("default/allow-nothing could not be read"),
        "{why}"
    );

    // A readable version 3 takes over again.
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n4",
            vec![policy_resource("allow-nothing", "3")],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    eventually("the readable version replaces it", || {
        client.publisher.current().unreadable_policies().count() == 0
    })
    .await;
    assert_eq!(decide(&client).2, "allow policies exist, but none allowed");

    // Removing a policy removes it, readable or not.
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n5",
            vec![bad_again()],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_some());
    eventually("unreadable again", || {
        client.publisher.current().unreadable_policies().count() == 1
    })
    .await;
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n6",
            vec![],
            &["default/allow-nothing"],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    eventually("the unreadable policy is removed", || {
        client.publisher.current().policy_count() == 0
    })
    .await;
    assert_eq!(decide(&client).2, "no allow policies, allowed");

    // A GLOBAL policy whose next version does not even decode keeps its
    // scope: it keeps applying mesh-wide (here: to `web` in `default`),
    // denying, instead of shrinking to its own namespace.
    let mut global = Policy {
        name: "mesh-allow".into(),
        namespace: "istio-system".into(),
        scope: PolicyScope::Global,
        action: PolicyAction::Allow,
        dry_run: false,
        rules: vec![],
    };
    let reply = conn
        .exchange(response(
            AUTHORIZATION_TYPE_URL,
            "n7",
            vec![convert::authorization_resource(&global, "1".into())],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    eventually("the global ALLOW applies", || {
        decide(&client).2 == "allow policies exist, but none allowed"
    })
    .await;
    global.dry_run = true; // any change; the payload is then garbled
    let mut garbled = convert::authorization_resource(&global, "2".into());
    garbled.resource.as_mut().unwrap().value = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0xff];
    let reply = conn
        .exchange(response(AUTHORIZATION_TYPE_URL, "n8", vec![garbled], &[]))
        .await;
    assert!(reply
        .error_detail
        .unwrap()
        .message
        .starts_with("istio-system/mesh-allow: undecodable"));
    eventually("the undecodable version is enforced", || decide(&client).1).await;
    let snap = client.publisher.current();
    let p = snap.compiled_policy("istio-system/mesh-allow").unwrap();
    assert_eq!(p.scope(), PolicyScope::Global);
    server.stop();
}

/// Version 4 of `default/allow-nothing`, unreadable like version 2.
fn bad_again() -> Resource {
    let mut bad = policy_resource("allow-nothing", "4");
    let any = bad.resource.as_mut().unwrap();
    any.value = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0xff];
    bad
}

#[tokio::test]
async fn reconnect_presents_accepted_versions_only() {
    let (server, mut conns) = start_scripted(loopback());
    let client = TestClient::start(client_config(&server.url()), None);
    let mut conn = next_conn(&mut conns).await;
    let (first, _) = conn.initial().await;
    assert!(first.initial_resource_versions.is_empty());

    let mut bad = convert::workload_to_proto(&workload("b", "10.0.0.2"));
    bad.status = 5;
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "1",
            vec![
                wl_resource("a", "10.0.0.1", "va1"),
                raw_workload_resource("b", bad),
                wl_resource("c", "10.0.0.3", "vc1"),
            ],
            &[],
        ))
        .await;
    assert!(reply.error_detail.is_some());
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "2",
            vec![wl_resource("a", "10.0.0.1", "va2")],
            &["c"],
        ))
        .await;
    assert!(reply.error_detail.is_none());
    conn.exchange(response(
        AUTHORIZATION_TYPE_URL,
        "3",
        vec![policy_resource("p", "vp1")],
        &[],
    ))
    .await;
    client.ready().await;

    // The server ends the stream cleanly; the client comes back.
    drop(conn);
    let mut conn = next_conn(&mut conns).await;
    let (addr_req, auth_req) = conn.initial().await;
    assert_eq!(
        sorted(&addr_req.initial_resource_versions),
        [("a".to_string(), "va2".to_string())],
        "latest accepted versions; rejected b and removed c left out"
    );
    assert_eq!(
        sorted(&auth_req.initial_resource_versions),
        [("default/p".to_string(), "vp1".to_string())]
    );
    assert!(addr_req.node.is_some() && auth_req.node.is_some());
    assert!(addr_req.response_nonce.is_empty());
    // The snapshot survived the reconnect.
    assert!(client.publisher.current().workload_by_uid("a").is_some());
    let m = client.status.metrics();
    assert_eq!(m.terminations(TerminationReason::Complete), 1);
    server.stop();
}

#[tokio::test]
async fn headers_node_and_token_rereading() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "token-one\n").unwrap();
    let (server, mut conns) = start_scripted(loopback());
    let mut cfg = client_config(&server.url());
    cfg.token_path = Some(token.clone());
    cfg.headers.push(("x-extra".into(), "yes".into()));
    let client = TestClient::start(cfg, None);

    let mut conn = next_conn(&mut conns).await;
    assert_eq!(
        conn.header("authorization").as_deref(),
        Some("Bearer token-one")
    );
    assert_eq!(conn.header("clusterid").as_deref(), Some("test-cluster"));
    assert_eq!(conn.header("x-extra").as_deref(), Some("yes"));
    let (addr_req, _) = conn.initial().await;
    let node = addr_req.node.unwrap();
    assert_eq!(
        node.id,
        "ztunnel~10.244.0.5~ztunnel-x1.istio-system~istio-system.svc.cluster.local"
    );
    let md = node.metadata.unwrap().fields;
    let get = |k: &str| match md.get(k).and_then(|v| v.kind.clone()) {
        Some(prost_types::value::Kind::StringValue(s)) => s,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(get("NAME"), "ztunnel-x1");
    assert_eq!(get("NAMESPACE"), "istio-system");
    assert_eq!(get("INSTANCE_IPS"), "10.244.0.5");
    assert_eq!(get("NODE_NAME"), "node-1");
    assert_eq!(get("CLUSTER_ID"), "test-cluster");

    // New token; the server drops the stream with an error.
    std::fs::write(&token, "token-two").unwrap();
    conn.responses
        .send(Err(Status::unavailable("going away")))
        .unwrap();
    let conn = next_conn(&mut conns).await;
    assert_eq!(
        conn.header("authorization").as_deref(),
        Some("Bearer token-two")
    );
    assert_eq!(
        client
            .status
            .metrics()
            .terminations(TerminationReason::Error),
        1
    );

    // An unreadable token file is a connection error (retried).
    std::fs::remove_file(&token).unwrap();
    drop(conn);
    let m = client.status.metrics();
    eventually("missing token counted", || {
        m.terminations(TerminationReason::ConnectionError) >= 1
    })
    .await;
    std::fs::write(&token, "token-three").unwrap();
    let conn = next_conn(&mut conns).await;
    assert_eq!(
        conn.header("authorization").as_deref(),
        Some("Bearer token-three")
    );
    server.stop();
}

#[tokio::test]
async fn malformed_and_oversized_responses_keep_the_last_good_snapshot() {
    let (server, mut conns) = start_scripted(loopback());
    let mut cfg = client_config(&server.url());
    cfg.max_message_size = 1024 * 1024;
    let client = TestClient::start(cfg, None);
    let mut conn = next_conn(&mut conns).await;
    conn.initial().await;
    conn.exchange(response(
        ADDRESS_TYPE_URL,
        "1",
        vec![wl_resource("a", "10.0.0.1", "1")],
        &[],
    ))
    .await;
    conn.exchange(response(AUTHORIZATION_TYPE_URL, "2", vec![], &[]))
        .await;
    client.ready().await;
    let good = client.publisher.version();

    // Garbage only: NACK, no new snapshot.
    let reply = conn
        .exchange(response(
            ADDRESS_TYPE_URL,
            "3",
            vec![Resource {
                name: "junk".into(),
                resource: Some(prost_types::Any {
                    type_url: ADDRESS_TYPE_URL.into(),
                    value: b"\xff\xfe not a protobuf".to_vec(),
                }),
                ..Resource::default()
            }],
            &[],
        ))
        .await;
    assert!(reply.error_detail.unwrap().message.starts_with("junk: "));
    assert_eq!(client.publisher.version(), good);

    // A type we never asked for: NACKed, ignored.
    let reply = conn
        .exchange(response(
            "type.googleapis.com/example.Other",
            "4",
            vec![],
            &[],
        ))
        .await;
    assert!(reply
        .error_detail
        .unwrap()
        .message
        .contains("unsupported type URL"));

    // Large but within the limit: applied.
    let many: Vec<Resource> = (0..3000)
        .map(|i| {
            wl_resource(
                &format!("w{i:05}"),
                &format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256),
                "1",
            )
        })
        .collect();
    let reply = conn
        .exchange(response(ADDRESS_TYPE_URL, "5", many, &[]))
        .await;
    assert!(reply.error_detail.is_none());
    assert_eq!(client.publisher.current().workloads().len(), 3001);
    let good = client.publisher.version();

    // Over the limit: the stream fails, the client reconnects, nothing lost.
    let huge = Resource {
        name: "huge".into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: vec![0u8; 2 * 1024 * 1024],
        }),
        ..Resource::default()
    };
    conn.respond(response(ADDRESS_TYPE_URL, "6", vec![huge], &[]));
    let mut conn = next_conn(&mut conns).await;
    let (addr_req, _) = conn.initial().await;
    assert_eq!(addr_req.initial_resource_versions.len(), 3001);
    assert_eq!(client.publisher.version(), good);
    assert_eq!(client.publisher.current().workloads().len(), 3001);
    let m = client.status.metrics();
    assert_eq!(
        m.terminations(TerminationReason::Error) + m.terminations(TerminationReason::Reconnect),
        1
    );
    server.stop();
}
