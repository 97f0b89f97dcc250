//! The generated gRPC stubs: method paths, and client and server talking to
//! each other in-process (the client drives the server's tower `Service`
//! directly, no network or tonic transport involved).

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use ringway_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ringway_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ringway_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use ringway_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ringway_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ringway_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use ringway_proto::{ADDRESS_TYPE_URL, CREATE_CERTIFICATE_PATH, DELTA_ADS_PATH};
use tonic::codegen::tokio_stream::{self, StreamExt};
use tonic::codegen::{BoxStream, Service};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

/// Forwards to `inner`, remembering the path of every request.
#[derive(Clone)]
struct RecordPaths<S> {
    inner: S,
    paths: Arc<Mutex<Vec<String>>>,
}

impl<S> RecordPaths<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            paths: Arc::default(),
        }
    }

    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }
}

impl<S, B> Service<http::Request<B>> for RecordPaths<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.paths
            .lock()
            .unwrap()
            .push(req.uri().path().to_string());
        self.inner.call(req)
    }
}

fn origin() -> http::Uri {
    http::Uri::from_static("http://in-process")
}

struct FakeCa;

#[tonic::async_trait]
impl IstioCertificateService for FakeCa {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let req = request.into_inner();
        if req.csr.is_empty() {
            return Err(Status::invalid_argument("empty csr"));
        }
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: vec![
                format!("leaf for {} valid {}s", req.csr, req.validity_duration),
                "root".to_string(),
            ],
        }))
    }
}

#[tokio::test]
async fn ca_unary_call_in_process() {
    let server = RecordPaths::new(IstioCertificateServiceServer::new(FakeCa));
    let mut client = IstioCertificateServiceClient::with_origin(server.clone(), origin());

    let resp = client
        .create_certificate(IstioCertificateRequest {
            csr: "CSR".into(),
            validity_duration: 86_400,
            metadata: None,
        })
        .await
        .expect("call")
        .into_inner();
    assert_eq!(resp.cert_chain, ["leaf for CSR valid 86400s", "root"]);

    let err = client
        .create_certificate(IstioCertificateRequest::default())
        .await
        .expect_err("empty csr is rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "empty csr");

    assert_eq!(
        server.paths(),
        [CREATE_CERTIFICATE_PATH, CREATE_CERTIFICATE_PATH]
    );
    assert_eq!(
        CREATE_CERTIFICATE_PATH,
        "/istio.v1.auth.IstioCertificateService/CreateCertificate"
    );
    assert_eq!(
        <IstioCertificateServiceServer<FakeCa> as NamedService>::NAME,
        "istio.v1.auth.IstioCertificateService"
    );
}

/// Answers every Delta request with one response that names the request's
/// subscriptions and echoes its nonce.
struct EchoAds;

#[tonic::async_trait]
impl AggregatedDiscoveryService for EchoAds {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state-of-the-world xDS"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let out = request.into_inner().map(|req| {
            let req = req?;
            Ok(DeltaDiscoveryResponse {
                type_url: req.type_url,
                nonce: format!("after-{}", req.response_nonce),
                resources: req
                    .resource_names_subscribe
                    .into_iter()
                    .map(|name| Resource {
                        name,
                        version: "1".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        });
        Ok(Response::new(Box::pin(out)))
    }
}

#[tokio::test]
async fn delta_ads_stream_in_process() {
    let server = RecordPaths::new(AggregatedDiscoveryServiceServer::new(EchoAds));
    let mut client = AggregatedDiscoveryServiceClient::with_origin(server.clone(), origin());

    let requests = vec![
        DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "b".into()],
            ..Default::default()
        },
        DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE_URL.into(),
            response_nonce: "n1".into(),
            ..Default::default()
        },
    ];
    let mut inbound = client
        .delta_aggregated_resources(tokio_stream::iter(requests))
        .await
        .expect("stream opens")
        .into_inner();

    let first = inbound.message().await.expect("ok").expect("first");
    assert_eq!(first.type_url, ADDRESS_TYPE_URL);
    assert_eq!(first.nonce, "after-");
    let names: Vec<&str> = first.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);

    let second = inbound.message().await.expect("ok").expect("second");
    assert_eq!(second.nonce, "after-n1");
    assert!(second.resources.is_empty());

    assert!(inbound.message().await.expect("clean end").is_none());

    // The state-of-the-world method is routed separately.
    let err = client
        .stream_aggregated_resources(tokio_stream::empty())
        .await
        .expect_err("unimplemented");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    assert_eq!(
        server.paths(),
        [
            DELTA_ADS_PATH,
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        ]
    );
    assert_eq!(
        DELTA_ADS_PATH,
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
    );
    assert_eq!(
        <AggregatedDiscoveryServiceServer<EchoAds> as NamedService>::NAME,
        "envoy.service.discovery.v3.AggregatedDiscoveryService"
    );
}

#[tokio::test]
async fn unknown_method_is_unimplemented() {
    // A CA client pointed at the ADS server: the path is not routed.
    let ads = AggregatedDiscoveryServiceServer::new(EchoAds);
    let mut client = IstioCertificateServiceClient::with_origin(ads, origin());
    let err = client
        .create_certificate(IstioCertificateRequest {
            csr: "CSR".into(),
            ..Default::default()
        })
        .await
        .expect_err("wrong service");
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}
