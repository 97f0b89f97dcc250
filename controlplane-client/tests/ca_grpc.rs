//! The CA client, the dev CA service and the certificate manager over real
//! gRPC on loopback.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ringway_controlplane::devcp::ca::{service, DevCa, DevCaOptions};
use ringway_controlplane::model::Workload;
use ringway_controlplane::security::ca::{BuiltinCa, ROOT_CERT_FILE};
use ringway_controlplane::security::caclient::{CaClient, CaClientConfig, TrustBundle};
use ringway_controlplane::security::certmanager::{
    wait_for_cert, BuiltinCaSource, CertFetchError, CertManager, CertManagerConfig, CertSource,
    CertState, CertStatuses,
};
use ringway_controlplane::security::tls::{
    build_tls_configs, peer_identity, TlsConfigs, WorkloadCert,
};
use ringway_controlplane::{CertFeed, CertPublisher, CertSnapshot, Identity, Snapshot};
use ringway_controlplane::{SnapshotPublisher, TlsError};
use ringway_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ringway_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use rustls::pki_types::ServerName;
use tokio::sync::{oneshot, watch};
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

const TD: &str = "cluster.local";

fn id(ns: &str, sa: &str) -> Identity {
    Identity::new(TD, ns, sa)
}

fn builtin_ca(dir: &Path) -> Arc<BuiltinCa> {
    Arc::new(BuiltinCa::load_or_create(&dir.join("ca"), TD).unwrap())
}

fn root_file(ca: &BuiltinCa) -> PathBuf {
    ca.dir().join(ROOT_CERT_FILE)
}

/// Certificates as short as a second, for rotation tests.
fn short_options() -> DevCaOptions {
    DevCaOptions {
        min_validity: Duration::from_secs(1),
        ..DevCaOptions::default()
    }
}

/// What the CA saw in one request.
#[derive(Debug, Clone)]
struct Seen {
    authorization: Option<String>,
    cluster_id: Option<String>,
    impersonated: Option<String>,
    validity_secs: i64,
    csr: String,
    at: Instant,
}

/// The dev CA plus knobs: records requests, can fail every call, or can
/// certify another identity than the one asked for.
#[derive(Clone)]
struct TestCa {
    inner: DevCa,
    ca: Arc<BuiltinCa>,
    seen: Arc<Mutex<Vec<Seen>>>,
    failing: Arc<AtomicBool>,
    sign_as: Option<Identity>,
}

impl TestCa {
    fn new(ca: Arc<BuiltinCa>, options: DevCaOptions) -> TestCa {
        TestCa {
            inner: DevCa::new(ca.clone(), options),
            ca,
            seen: Arc::default(),
            failing: Arc::default(),
            sign_as: None,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl IstioCertificateService for TestCa {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let impersonated = request.get_ref().metadata.as_ref().and_then(|m| {
            match m.fields.get("ImpersonatedIdentity")?.kind.as_ref()? {
                prost_types::value::Kind::StringValue(s) => Some(s.clone()),
                _ => None,
            }
        });
        self.seen.lock().unwrap().push(Seen {
            authorization: header("authorization"),
            cluster_id: header("clusterid"),
            impersonated,
            validity_secs: request.get_ref().validity_duration,
            csr: request.get_ref().csr.clone(),
            at: Instant::now(),
        });
        if self.failing.load(Ordering::SeqCst) {
            return Err(tonic::Status::unavailable("test CA is failing"));
        }
        if let Some(other) = &self.sign_as {
            let chain = self
                .ca
                .sign_csr(
                    &request.get_ref().csr,
                    Some(other),
                    Duration::from_secs(3600),
                )
                .unwrap();
            return Ok(tonic::Response::new(IstioCertificateResponse {
                cert_chain: chain,
            }));
        }
        self.inner.create_certificate(request).await
    }
}

/// Serves `svc` on a loopback port until the returned sender fires (or is
/// dropped).
async fn serve<S>(svc: S) -> (SocketAddr, oneshot::Sender<()>)
where
    S: IstioCertificateService,
{
    serve_with(Server::builder(), IstioCertificateServiceServer::new(svc)).await
}

async fn serve_with<S>(
    builder: Server,
    svc: IstioCertificateServiceServer<S>,
) -> (SocketAddr, oneshot::Sender<()>)
where
    S: IstioCertificateService,
{
    let incoming = TcpIncoming::bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let addr = incoming.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        builder
            .serve_with_incoming_shutdown(svc, incoming, async {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
    });
    (addr, stop_tx)
}

fn plaintext_config(addr: SocketAddr, ca: &BuiltinCa) -> CaClientConfig {
    let mut config = CaClientConfig::new(format!("http://{addr}"));
    config.trust_bundle = TrustBundle::File(root_file(ca));
    config.timeout = Duration::from_secs(2);
    config
}

/// A TLS 1.3 handshake in memory; returns what each side saw of the other.
fn handshake(client: &TlsConfigs, server: &TlsConfigs) -> Result<(Identity, Identity), String> {
    use rustls::{ClientConnection, Connection, ServerConnection};
    fn pump(from: &mut Connection, to: &mut Connection) -> Result<(), String> {
        let mut bytes = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut bytes).map_err(|e| e.to_string())?;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            to.read_tls(&mut rest).map_err(|e| e.to_string())?;
            to.process_new_packets().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let mut c: Connection = ClientConnection::new(client.client.clone(), name)
        .unwrap()
        .into();
    let mut s: Connection = ServerConnection::new(server.server.clone()).unwrap().into();
    for _ in 0..10 {
        pump(&mut c, &mut s)?;
        pump(&mut s, &mut c)?;
        if !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
    }
    let ids = |conn: &Connection| -> Result<Identity, TlsError> {
        peer_identity(conn.peer_certificates().unwrap_or_default())
    };
    Ok((
        ids(&c).map_err(|e| e.to_string())?,
        ids(&s).map_err(|e| e.to_string())?,
    ))
}

fn workload(uid: &str, node: &str, ns: &str, sa: &str, ip: u8) -> Workload {
    Workload {
        uid: uid.into(),
        addresses: vec![std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 0, ip))].into(),
        node: node.into(),
        namespace: ns.into(),
        service_account: sa.into(),
        // HBONE: only mesh workloads get certificates prefetched.
        protocol: ringway_controlplane::model::TunnelProtocol::Hbone,
        ..Workload::default()
    }
}

fn snapshot(workloads: Vec<Workload>) -> Snapshot {
    Snapshot::new(workloads, vec![], vec![]).unwrap()
}

async fn wait_for(
    feed: &mut CertFeed,
    what: &str,
    done: impl Fn(&CertSnapshot) -> bool,
) -> Arc<CertSnapshot> {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let current = feed.current();
            if done(&current) {
                return current;
            }
            feed.changed().await.expect("publisher alive");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}; last: {:?}", feed.current()))
}

async fn wait_for_status(
    statuses: &mut watch::Receiver<CertStatuses>,
    what: &str,
    done: impl Fn(&CertStatuses) -> bool,
) -> CertStatuses {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let current = statuses.borrow_and_update().clone();
            if done(&current) {
                return current;
            }
            statuses.changed().await.expect("manager alive");
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; last: {:?}",
            statuses.borrow()
        )
    })
}

// ---------------------------------------------------------------------------
// CA client

#[tokio::test]
async fn issues_over_grpc_and_the_certificates_handshake() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let test_ca = TestCa::new(ca.clone(), DevCaOptions::default());
    let (addr, _stop) = serve(test_ca.clone()).await;

    let client = CaClient::new(plaintext_config(addr, &ca)).unwrap();
    let (a, b) = (id("shop", "cart"), id("shop", "db"));
    let cert_a = client.fetch_cert(&a).await.unwrap();
    let cert_b = client.fetch_cert(&b).await.unwrap();
    assert_eq!(cert_a.identity(), &a);
    assert_eq!(cert_a.chain().len(), 1, "the root is not presented");
    let lifetime = cert_a
        .not_after()
        .duration_since(SystemTime::now())
        .unwrap();
    assert!(lifetime > Duration::from_secs(86400 - 30), "{lifetime:?}");

    // What went over the wire: a P-256 CSR, empty subject, one URI SAN.
    let seen = test_ca.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].validity_secs, 86400);
    assert_eq!(seen[0].cluster_id.as_deref(), Some("Kubernetes"));
    assert_eq!(seen[0].authorization, None);
    let der = pem::parse(&seen[0].csr).unwrap();
    assert_eq!(der.tag(), "CERTIFICATE REQUEST");
    let (_, csr) = X509CertificationRequest::from_der(der.contents()).unwrap();
    assert_eq!(csr.certification_request_info.subject.iter().count(), 0);
    let spki = &csr.certification_request_info.subject_pki;
    assert_eq!(
        spki.algorithm.algorithm,
        x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
    );
    let exts: Vec<_> = csr.requested_extensions().unwrap().collect();
    assert_eq!(exts.len(), 1, "only the SAN extension");
    let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = exts[0] else {
        panic!("{:?}", exts[0]);
    };
    assert_eq!(
        san.general_names,
        [x509_parser::extensions::GeneralName::URI(
            "spiffe://cluster.local/ns/shop/sa/cart"
        )]
    );

    let configs_a = build_tls_configs(&cert_a).unwrap();
    let configs_b = build_tls_configs(&cert_b).unwrap();
    let (server_seen, client_seen) = handshake(&configs_a, &configs_b).unwrap();
    assert_eq!((server_seen, client_seen), (b.clone(), a.clone()));

    // ztunnel's choice of roots (the answer's last certificate) works too.
    let mut config = plaintext_config(addr, &ca);
    config.trust_bundle = TrustBundle::FromResponse;
    let cert = CaClient::new(config).unwrap().fetch_cert(&a).await.unwrap();
    assert_eq!(cert.roots().len(), 1);
    let (seen_b, _) = handshake(&build_tls_configs(&cert).unwrap(), &configs_b).unwrap();
    assert_eq!(seen_b, b);

    // A trust bundle the CA's chain does not lead to.
    let other = builtin_ca(&tmp.path().join("other"));
    let mut config = plaintext_config(addr, &ca);
    config.trust_bundle = TrustBundle::File(root_file(&other));
    let err = CaClient::new(config)
        .unwrap()
        .fetch_cert(&a)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("does not verify up to the trust bundle"),
        "{err}"
    );
}

/// Over TLS, with the CA's serving certificate signed by the same root
/// (Istio's layout: root-cert.pem authenticates istiod and is the bundle).
#[tokio::test]
async fn talks_to_the_ca_over_tls_with_the_root_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(ca.dir().join("ca-key.pem")).unwrap())
            .unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(
        &std::fs::read_to_string(ca.dir().join("ca-cert.pem")).unwrap(),
        key,
    )
    .unwrap();
    let mut params =
        rcgen::CertificateParams::new(vec!["istiod.istio-system.svc".to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = rcgen::KeyPair::generate().unwrap();
    let serving = params.signed_by(&serving_key, &issuer).unwrap();
    let tls = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(serving.pem(), serving_key.serialize_pem()),
    );
    let builder = Server::builder().tls_config(tls).unwrap();
    let (addr, _stop) = serve_with(builder, service(ca.clone(), DevCaOptions::default())).await;

    let mut config = CaClientConfig::new(format!("https://{addr}"));
    config.root_cert = Some(root_file(&ca));
    config.tls_server_name = Some("istiod.istio-system.svc".into());
    let client = CaClient::new(config.clone()).unwrap();
    let cert = client.fetch_cert(&id("a", "b")).await.unwrap();
    assert_eq!(cert.identity(), &id("a", "b"));

    // The wrong name for the CA: the TLS handshake fails.
    config.tls_server_name = Some("elsewhere.example".into());
    let err = CaClient::new(config.clone())
        .unwrap()
        .fetch_cert(&id("a", "b"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("CA call failed"), "{err}");

    // https without a root file, or the root-file bundle without one.
    config.root_cert = None;
    let err = CaClient::new(config).unwrap_err();
    assert!(
        err.to_string().contains("needs a root certificate file"),
        "{err}"
    );
    let err = CaClient::new(CaClientConfig::new("http://127.0.0.1:1")).unwrap_err();
    assert!(
        err.to_string().contains("no root file is configured"),
        "{err}"
    );
    let err = CaClient::new(CaClientConfig::new("ftp://x")).unwrap_err();
    assert!(
        err.to_string().contains("must start with https://"),
        "{err}"
    );
}

#[tokio::test]
async fn refuses_a_certificate_for_another_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let mut test_ca = TestCa::new(ca.clone(), DevCaOptions::default());
    test_ca.sign_as = Some(id("other", "thief"));
    let (addr, _stop) = serve(test_ca).await;
    let client = CaClient::new(plaintext_config(addr, &ca)).unwrap();
    let err = client.fetch_cert(&id("shop", "cart")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "CA returned a certificate for spiffe://cluster.local/ns/other/sa/thief, \
         asked for spiffe://cluster.local/ns/shop/sa/cart"
    );
    // Through the CertSource interface it is a transient failure.
    let err = CertSource::fetch(&client, &id("shop", "cart"))
        .await
        .unwrap_err();
    assert!(!err.is_permanent());
    let err = CertSource::fetch(&client, &Identity::new(TD, "", "x"))
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
}

#[tokio::test]
async fn impersonation_metadata_reaches_the_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let test_ca = TestCa::new(ca.clone(), DevCaOptions::default());
    let (addr, _stop) = serve(test_ca.clone()).await;
    let node = id("istio-system", "ztunnel");
    let pod = id("shop", "cart");

    let mut config = plaintext_config(addr, &ca);
    config.own_identity = Some(node.clone());
    let client = CaClient::new(config).unwrap();
    assert_eq!(client.fetch_cert(&node).await.unwrap().identity(), &node);
    assert_eq!(client.fetch_cert(&pod).await.unwrap().identity(), &pod);

    // Shared mode: no own identity, every request impersonates.
    let shared = CaClient::new(plaintext_config(addr, &ca)).unwrap();
    shared.fetch_cert(&node).await.unwrap();

    let impersonated: Vec<Option<String>> =
        test_ca.seen().into_iter().map(|s| s.impersonated).collect();
    assert_eq!(
        impersonated,
        [None, Some(pod.to_string()), Some(node.to_string())]
    );
}

#[tokio::test]
async fn sends_the_bearer_token_reread_on_every_call() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let test_ca = TestCa::new(ca.clone(), DevCaOptions::default());
    let (addr, _stop) = serve(test_ca.clone()).await;
    let token = tmp.path().join("istio-token");
    std::fs::write(&token, "first.jwt").unwrap();

    let mut config = plaintext_config(addr, &ca);
    config.token_file = Some(token.clone());
    config.cluster_id = "east".into();
    config.extra_metadata = vec![("x-extra".into(), "1".into())];
    let client = CaClient::new(config).unwrap();
    client.fetch_cert(&id("a", "b")).await.unwrap();
    std::fs::write(&token, "second.jwt\n").unwrap();
    client.fetch_cert(&id("a", "b")).await.unwrap();

    let seen = test_ca.seen();
    let auth: Vec<_> = seen.iter().map(|s| s.authorization.clone()).collect();
    assert_eq!(
        auth,
        [
            Some("Bearer first.jwt".to_owned()),
            Some("Bearer second.jwt".to_owned())
        ]
    );
    assert!(seen.iter().all(|s| s.cluster_id.as_deref() == Some("east")));

    // A missing or empty token fails before anything is sent.
    std::fs::write(&token, "  \n").unwrap();
    let err = client.fetch_cert(&id("a", "b")).await.unwrap_err();
    assert!(err.to_string().contains("is empty"), "{err}");
    std::fs::remove_file(&token).unwrap();
    let err = client.fetch_cert(&id("a", "b")).await.unwrap_err();
    assert!(err.to_string().contains("reading token file"), "{err}");
    assert_eq!(test_ca.seen().len(), 2);
}

// ---------------------------------------------------------------------------
// Certificate manager

struct Manager {
    workloads: SnapshotPublisher,
    feed: CertFeed,
    statuses: watch::Receiver<CertStatuses>,
    requests: ringway_controlplane::security::certmanager::CertRequests,
    task: tokio::task::JoinHandle<()>,
}

fn start_manager<S: CertSource>(
    source: Arc<S>,
    workloads: Vec<Workload>,
    config: CertManagerConfig,
) -> Manager {
    let publisher = SnapshotPublisher::new();
    publisher.publish(snapshot(workloads));
    let certs = CertPublisher::new();
    let feed = certs.subscribe();
    let manager = CertManager::new(source, publisher.subscribe(), certs, config);
    let statuses = manager.statuses();
    let requests = manager.requests();
    Manager {
        workloads: publisher,
        feed,
        statuses,
        requests,
        task: tokio::spawn(manager.run()),
    }
}

#[tokio::test]
async fn renews_at_half_life_and_serves_the_old_certificate_until_then() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let (addr, _stop) = serve(TestCa::new(ca.clone(), short_options())).await;
    let mut config = plaintext_config(addr, &ca);
    config.validity = Duration::from_secs(4);
    let client = Arc::new(CaClient::new(config).unwrap());
    let mut m = start_manager(
        client,
        vec![workload("w1", "n1", "shop", "cart", 1)],
        CertManagerConfig::default(),
    );
    let cart = id("shop", "cart");

    let first = wait_for(&mut m.feed, "the first certificate", |s| {
        s.get(&cart).is_some()
    })
    .await;
    let got_first = Instant::now();
    let old = first.get(&cart).unwrap().clone();
    let life = old.not_after.duration_since(SystemTime::now()).unwrap();
    assert!(life <= Duration::from_secs(4), "{life:?}");

    let renewed = wait_for(&mut m.feed, "the renewal", |s| {
        s.get(&cart).is_some_and(|c| !Arc::ptr_eq(c, &old))
    })
    .await;
    let after = got_first.elapsed();
    let new = renewed.get(&cart).unwrap();
    assert!(new.not_after > old.not_after);
    assert!(
        after >= Duration::from_millis(500) && after <= Duration::from_millis(3500),
        "renewed {after:?} after the first"
    );
    assert_eq!(
        renewed.version(),
        first.version() + 1,
        "nothing was published in between: the old one was served until then"
    );
    assert!(old.not_after > SystemTime::now(), "renewed before expiry");
    m.task.abort();
}

/// Wraps a source: records the order fetches start in and makes each slow.
struct SlowSource {
    inner: BuiltinCaSource,
    delay: Duration,
    started: Mutex<Vec<Identity>>,
    /// When set, each fetch also waits for a permit from it: the test
    /// decides when fetches may end.
    gate: Option<tokio::sync::Semaphore>,
}

impl SlowSource {
    fn new(ca: Arc<BuiltinCa>, delay: Duration, gated: bool) -> Self {
        SlowSource {
            inner: BuiltinCaSource::new(ca, Duration::from_secs(3600)),
            delay,
            started: Mutex::default(),
            gate: gated.then(|| tokio::sync::Semaphore::new(0)),
        }
    }
}

impl CertSource for SlowSource {
    async fn fetch(&self, id: &Identity) -> Result<WorkloadCert, CertFetchError> {
        self.started.lock().unwrap().push(id.clone());
        tokio::time::sleep(self.delay).await;
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        self.inner.fetch(id).await
    }
}

#[tokio::test]
async fn an_urgent_request_jumps_the_prefetch_queue() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let source = Arc::new(SlowSource::new(ca, Duration::ZERO, true));
    let workloads = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, sa)| workload(sa, "n1", "ns", sa, i as u8 + 1))
        .chain([workload("far", "n2", "ns", "far", 9)])
        .collect();
    let config = CertManagerConfig {
        node: Some("n1".into()),
        max_concurrent_fetches: 1,
        ..CertManagerConfig::default()
    };
    let mut m = start_manager(source.clone(), workloads, config);

    // "a" is being fetched (held at the gate), b, c, d wait; then a core
    // wants "d", and only then may fetches end: the manager takes in
    // requests before it starts the next fetch.
    tokio::time::timeout(Duration::from_secs(5), async {
        while source.started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    m.requests.send(id("ns", "d")).unwrap();
    source.gate.as_ref().unwrap().add_permits(4);

    let all = wait_for(&mut m.feed, "all four", |s| s.len() == 4).await;
    let order: Vec<String> = source
        .started
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.service_account.to_string())
        .collect();
    assert_eq!(order, ["a", "d", "b", "c"]);
    assert!(all.get(&id("ns", "far")).is_none(), "not this node's");
    m.task.abort();
}

/// `wait_for_cert` on a thread without a tokio runtime, as on a core.
#[tokio::test]
async fn a_core_waits_for_a_certificate_without_a_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let source = Arc::new(SlowSource::new(ca, Duration::from_millis(100), false));
    let m = start_manager(source, vec![], CertManagerConfig::default());

    /// Runs `wait_for_cert` on a plain thread with a `deadline`-long timer.
    fn core_waits(
        m: &Manager,
        who: Identity,
        deadline: Duration,
    ) -> oneshot::Receiver<Option<Arc<TlsConfigs>>> {
        let (tx, rx) = oneshot::channel();
        let mut feed = m.feed.clone();
        let requests = m.requests.clone();
        std::thread::spawn(move || {
            let (timer_tx, timer_rx) = oneshot::channel::<()>();
            std::thread::spawn(move || {
                std::thread::sleep(deadline);
                let _ = timer_tx.send(());
            });
            let found =
                futures_lite::future::block_on(wait_for_cert(&mut feed, &requests, &who, async {
                    let _ = timer_rx.await;
                }));
            let _ = tx.send(found);
        });
        rx
    }

    // Not on any node: fetched because the core asked.
    let visitor = id("guest", "visitor");
    let found = core_waits(&m, visitor.clone(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(found.unwrap().identity, visitor);
    // Now served at once.
    let again = core_waits(&m, visitor.clone(), Duration::ZERO)
        .await
        .unwrap();
    assert!(again.is_some());

    // A foreign trust domain is never certified: the core gives up at its
    // deadline (fail closed).
    let started = Instant::now();
    let foreign = Identity::new("elsewhere.org", "ns", "sa");
    let found = core_waits(&m, foreign.clone(), Duration::from_millis(300))
        .await
        .unwrap();
    assert!(found.is_none());
    assert!(started.elapsed() >= Duration::from_millis(300));
    let mut statuses = m.statuses.clone();
    let s = wait_for_status(&mut statuses, "the refusal", |s| {
        matches!(s.get(&foreign), Some(CertState::Failed { .. }))
    })
    .await;
    let CertState::Failed { error, .. } = &s[&foreign] else {
        unreachable!()
    };
    assert!(error.contains("signs for trust domain"), "{error}");
    m.task.abort();
}

#[tokio::test]
async fn failing_refreshes_back_off_and_keep_the_valid_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let test_ca = TestCa::new(ca.clone(), short_options());
    let (addr, _stop) = serve(test_ca.clone()).await;
    let mut config = plaintext_config(addr, &ca);
    config.validity = Duration::from_secs(5);
    let client = Arc::new(CaClient::new(config).unwrap());
    let manager_config = CertManagerConfig {
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(2),
        ..CertManagerConfig::default()
    };
    let mut m = start_manager(
        client,
        vec![workload("w1", "n1", "shop", "cart", 1)],
        manager_config,
    );
    let cart = id("shop", "cart");
    let first = wait_for(&mut m.feed, "a certificate", |s| s.get(&cart).is_some()).await;
    let kept = first.get(&cart).unwrap().clone();
    test_ca.failing.store(true, Ordering::SeqCst);
    let calls_before = test_ca.seen().len();

    // The refresh fails; the state says so, and the old one is still served.
    let s = wait_for_status(&mut m.statuses, "a failed refresh", |s| {
        matches!(s.get(&cart), Some(CertState::Failed { .. }))
    })
    .await;
    let CertState::Failed {
        error, valid_until, ..
    } = &s[&cart]
    else {
        unreachable!()
    };
    assert!(error.contains("test CA is failing"), "{error}");
    assert_eq!(*valid_until, Some(kept.not_after));
    assert!(Arc::ptr_eq(m.feed.current().get(&cart).unwrap(), &kept));

    // It stops being served when it expires, not before.
    let gone = wait_for(&mut m.feed, "the expiry", |s| s.get(&cart).is_none()).await;
    assert!(SystemTime::now() >= kept.not_after);
    assert_eq!(gone.version(), first.version() + 1);

    // The retries spread out.
    let failed: Vec<Instant> = test_ca.seen()[calls_before..]
        .iter()
        .map(|s| s.at)
        .collect();
    assert!(failed.len() >= 3, "{} retries", failed.len());
    let gaps: Vec<Duration> = failed.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(150), "{gaps:?}");
    assert!(
        gaps.windows(2)
            .all(|g| g[1] > g[0] || g[1] >= Duration::from_millis(1500)),
        "backoff grows until its cap: {gaps:?}"
    );

    // The CA recovers: a new certificate.
    test_ca.failing.store(false, Ordering::SeqCst);
    wait_for(&mut m.feed, "recovery", |s| s.get(&cart).is_some()).await;
    wait_for_status(&mut m.statuses, "available again", |s| {
        matches!(s.get(&cart), Some(CertState::Available { .. }))
    })
    .await;
    m.task.abort();
}

#[tokio::test]
async fn forgets_identities_that_left_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let source = Arc::new(BuiltinCaSource::new(ca, Duration::from_secs(3600)));
    let config = CertManagerConfig {
        node: Some("n1".into()),
        request_linger: Duration::from_millis(800),
        ..CertManagerConfig::default()
    };
    let mut m = start_manager(
        source,
        vec![
            workload("w1", "n1", "a", "x", 1),
            workload("w2", "n1", "b", "y", 2),
            workload("w3", "n2", "c", "z", 3),
        ],
        config,
    );
    let (ax, by) = (id("a", "x"), id("b", "y"));
    let both = wait_for(&mut m.feed, "both", |s| s.len() == 2).await;
    let kept = both.get(&ax).unwrap().clone();

    // A core asks for an identity that is not (yet) on this node.
    let visitor = id("guest", "v");
    m.requests.send(visitor.clone()).unwrap();
    wait_for(&mut m.feed, "the visitor", |s| s.get(&visitor).is_some()).await;

    // w2 leaves: b/y goes at once, a/x stays as it was.
    m.workloads.publish(snapshot(vec![
        workload("w1", "n1", "a", "x", 1),
        workload("w3", "n2", "c", "z", 3),
    ]));
    let after = wait_for(&mut m.feed, "b/y dropped", |s| s.get(&by).is_none()).await;
    assert!(Arc::ptr_eq(after.get(&ax).unwrap(), &kept));
    assert!(!m.statuses.borrow().contains_key(&by));

    // The visitor lingers a while after the core's request, then goes.
    let started = Instant::now();
    let last = wait_for(&mut m.feed, "the visitor dropped", |s| {
        s.get(&visitor).is_none()
    })
    .await;
    assert!(started.elapsed() <= Duration::from_secs(3));
    assert_eq!(
        last.identities().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([ax])
    );

    // The manager stops with the workload feed.
    drop(m.workloads);
    tokio::time::timeout(Duration::from_secs(5), m.task)
        .await
        .expect("manager stops when the workload feed closes")
        .unwrap();
}

#[tokio::test]
async fn with_the_ca_down_certificates_serve_until_they_expire() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = builtin_ca(tmp.path());
    let (addr, stop) = serve(TestCa::new(ca.clone(), short_options())).await;
    let mut config = plaintext_config(addr, &ca);
    config.validity = Duration::from_secs(4);
    config.timeout = Duration::from_millis(500);
    let client = Arc::new(CaClient::new(config).unwrap());
    let manager_config = CertManagerConfig {
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_millis(500),
        ..CertManagerConfig::default()
    };
    let mut m = start_manager(
        client,
        vec![
            workload("w1", "n1", "shop", "cart", 1),
            workload("w2", "n1", "shop", "db", 2),
        ],
        manager_config,
    );
    let first = wait_for(&mut m.feed, "both certificates", |s| s.len() == 2).await;
    stop.send(()).unwrap();

    let cart = id("shop", "cart");
    let kept = first.get(&cart).unwrap().clone();
    // Refreshes fail against the dead CA; both stay until expiry.
    let s = wait_for_status(&mut m.statuses, "failing refreshes", |s| {
        s.values().all(|st| {
            matches!(
                st,
                CertState::Failed {
                    valid_until: Some(_),
                    ..
                }
            )
        })
    })
    .await;
    assert_eq!(s.len(), 2);
    assert!(Arc::ptr_eq(m.feed.current().get(&cart).unwrap(), &kept));
    assert_eq!(m.feed.current().len(), 2);

    let empty = wait_for(&mut m.feed, "expiry", |s| s.is_empty()).await;
    assert!(SystemTime::now() >= kept.not_after);
    assert!(empty.version() > first.version());
    let s = m.statuses.borrow().clone();
    assert!(
        s.values().all(|st| matches!(
            st,
            CertState::Failed {
                valid_until: None,
                ..
            }
        )),
        "{s:?}"
    );
    m.task.abort();
}
