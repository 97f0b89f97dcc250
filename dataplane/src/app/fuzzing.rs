//! The fuzz harness for inbound CONNECT validation and the PROXY header
//! (issue 25, item 6): what `fuzz/fuzz_targets/inbound_connect.rs` calls,
//! and what `tests/fuzz_corpus.rs` replays the committed corpus through on
//! stable. Not an API (`#[doc(hidden)]`); it panics when an invariant
//! breaks. It sits in `app` because the decision reads the configuration
//! the flags give (`cli`), built here as ringway starts with no flags.
//!
//! The bytes are one CONNECT stream as h2 hands it to
//! `proxy::inbound::admit`: a first byte picks the tunnel (the dialled
//! address, the TCP peer, the peer's mTLS identity, `--node-name`), then
//! lines: the method, `:authority`, and `name: value` headers. They go
//! through the same decisions in the same order: the method, the target
//! from `:authority` (`authority_target`), the `forwarded`, `traceparent`
//! and `baggage` readers, the self-call check, the local workload, the
//! upstream (`inbound_upstream`), authorization (`authorization::admit`),
//! and the PROXY header when the workload's application tunnel asks for
//! one. Asserted: refusals are 400/401/503 as `admit` answers them; an
//! `ip:port` authority is the target as written, a hostname one the port
//! the named service maps on the dialled workload; the upstream is always
//! the dialled workload's own address; a workload behind a waypoint admits
//! only the waypoint's identity; an admitted stream is one the policies
//! allow, and registered for late rejection until it ends; the PROXY
//! header decodes back to the peer, the target and the identity.

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::OnceLock;

use bytes::Bytes;
use clap::Parser;
use http::uri::{Authority, Parts};
use http::{HeaderName, HeaderValue, Method, Request};
use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::model::routing::{inbound_service_port, inbound_upstream};
use ringway_controlplane::sources::local::load_snapshot;
use ringway_controlplane::Snapshot;

use crate::app::cli::Cli;
use crate::core::authorization::{self, Inbound, Refused, Registry};
use crate::core::config::ProxyConfig;
use crate::hbone::{self, proxy_header};
use crate::inpod::PodPorts;
use crate::proxy::inbound::authority_target;

/// The node's workloads: one backing a service under two namespaces'
/// mappings, one behind an application tunnel (PROXY), one behind a
/// waypoint, the waypoint itself, one on another node; and policies.
const MESH: &str = r#"workloads:
  - uid: server
    name: server
    namespace: ns1
    serviceAccount: server
    workloadIps: [10.0.0.2, "fd00::2"]
    protocol: HBONE
    node: node-b
    services:
      "ns1/echo.ns1.svc.cluster.local": {80: 8080, 443: 8443}
      "ns2/echo.ns1.svc.cluster.local": {80: 9090}
  - uid: tunnelled
    name: tunnelled
    namespace: ns1
    workloadIps: [10.0.0.4]
    protocol: HBONE
    node: node-b
    applicationTunnel: {protocol: PROXY, port: 15088}
    authorizationPolicies: [ns1/only-ns1]
    services: {"ns1/echo.ns1.svc.cluster.local": {80: 8080}}
  - uid: guarded
    name: guarded
    namespace: ns1
    workloadIps: [10.0.0.5]
    protocol: HBONE
    node: node-b
    waypoint: {destination: ns1/waypoint.ns1.svc.cluster.local}
  - uid: waypoint
    name: waypoint
    namespace: ns1
    serviceAccount: waypoint
    workloadIps: [10.0.0.6]
    protocol: HBONE
    node: node-b
    services: {"ns1/waypoint.ns1.svc.cluster.local": {15008: 15008}}
  - uid: elsewhere
    name: elsewhere
    namespace: ns2
    workloadIps: [10.0.0.7]
    protocol: HBONE
    node: node-c
services:
  - {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: [10.96.0.1], ports: {80: 8080, 443: 8443}, waypoint: {destination: 10.0.0.6}}
  - {name: echo, namespace: ns2, hostname: echo.ns1.svc.cluster.local, vips: [10.96.0.9], ports: {80: 9090}}
  - {name: waypoint, namespace: ns1, hostname: waypoint.ns1.svc.cluster.local, vips: [10.96.0.2], ports: {15008: 15008}}
policies:
  - {name: deny-bob, namespace: ns1, scope: Namespace, action: Deny, rules: [[[{principals: [{suffix: /sa/bob}]}]]]}
  - {name: only-ns1, namespace: ns1, scope: WorkloadSelector, action: Allow, rules: [[[{namespaces: [{exact: ns1}]}]]]}
"#;

const DIALLED: [&str; 8] = [
    "10.0.0.2:15008",
    "[fd00::2]:15008",
    "10.0.0.4:15008",
    "10.0.0.5:15008",
    "10.0.0.6:15008",
    "10.0.0.7:15008",
    "10.0.0.9:15008",
    "[::ffff:10.0.0.2]:15008",
];
const PEER_ADDRS: [&str; 4] = [
    "10.0.0.1:40000",
    "10.0.0.6:40001",
    "[fd00::1]:40002",
    "10.9.9.9:1",
];
const PEERS: [&str; 4] = [
    "spiffe://cluster.local/ns/ns1/sa/alice",
    "spiffe://cluster.local/ns/ns2/sa/bob",
    "spiffe://cluster.local/ns/ns1/sa/waypoint",
    "spiffe://td.example/ns/ns1/sa/alice",
];

struct Fixture {
    snapshot: Snapshot,
    /// As started with no flags, and with `--node-name node-b`.
    configs: [ProxyConfig; 2],
    peers: Vec<Identity>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let cfg = Cli::try_parse_from(["ringway"])
            .expect("no flags parse")
            .run
            .proxy_config();
        let mut on_node = cfg.clone();
        on_node.node_name = Some("node-b".into());
        Fixture {
            snapshot: load_snapshot(MESH, "fuzz-connect.yaml").expect("the fuzz mesh"),
            configs: [cfg, on_node],
            peers: PEERS
                .iter()
                .map(|p| p.parse().expect("an identity"))
                .collect(),
        }
    })
}

/// `data` as one CONNECT stream on an accepted HBONE connection.
pub fn inbound_connect(data: &[u8]) {
    let Some((&steer, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let conn_dst: SocketAddr = DIALLED[usize::from(steer & 7)].parse().expect("an address");
    let conn_src: SocketAddr = PEER_ADDRS[usize::from((steer >> 3) & 3)]
        .parse()
        .expect("an address");
    // A core holds the peer's identity in an `Rc`.
    let peer = Rc::new(f.peers[usize::from((steer >> 5) & 3)].clone());
    let cfg = &f.configs[usize::from(steer >> 7)];

    let mut lines = rest.split(|&b| b == b'\n');
    let Ok(method) = Method::from_bytes(lines.next().unwrap_or_default()) else {
        return; // h2 refuses the HEADERS
    };
    let mut parts = Parts::default();
    let authority = lines.next().unwrap_or_default();
    if !authority.is_empty() {
        match Authority::from_maybe_shared(Bytes::copy_from_slice(authority)) {
            Ok(a) => parts.authority = Some(a),
            Err(_) => return, // h2 resets the stream
        }
    }
    let Ok(mut request) = Request::builder().method(method).uri(parts).body(()) else {
        return;
    };
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        request.headers_mut().append(name, value);
    }
    let _ = decide(f, cfg, conn_src, conn_dst, &peer, &request);
}

/// What `admit` answers the stream: the upstream it dials, or the status.
fn decide(
    f: &Fixture,
    cfg: &ProxyConfig,
    conn_src: SocketAddr,
    conn_dst: SocketAddr,
    peer: &Rc<Identity>,
    request: &Request<()>,
) -> Result<SocketAddr, u16> {
    let snapshot = &f.snapshot;
    let headers = request.headers();
    let forwarded = headers.get("forwarded").and_then(|v| v.to_str().ok());
    if let Some(fw) = forwarded {
        for name in ["for", "host"] {
            if let Some(v) = hbone::forwarded_param(fw, name) {
                assert!(fw.contains(v), "a parameter is part of the header");
            }
        }
    }
    if let Some(t) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        if hbone::valid_traceparent(t) {
            assert_eq!(t.len(), 55, "{t}");
        }
    }
    if let Some(b) = headers.get("baggage").and_then(|v| v.to_str().ok()) {
        for (k, _) in hbone::parse_baggage(b) {
            assert!(!k.contains(','), "{k}");
        }
    }
    if request.method() != Method::CONNECT {
        return Err(400);
    }
    let authority = request.uri().authority();
    let target = match authority_target(snapshot, cfg, conn_dst, authority) {
        Ok(t) => t,
        Err((status, why)) => {
            assert!(!why.is_empty());
            let status = status.as_u16();
            assert!(status == 400 || status == 503, "{status}");
            assert!(authority.is_some() || status == 400, "no authority: 400");
            return Err(status);
        }
    };
    let authority = authority.expect("a target comes from an authority");
    match authority.as_str().parse::<SocketAddr>() {
        Ok(written) => assert_eq!(target, written, "an ip:port authority is the target"),
        Err(_) => {
            assert_eq!(
                target.ip(),
                conn_dst.ip(),
                "a hostname targets the dialled workload"
            );
            let local = authorization::local_workload(snapshot, cfg, conn_dst.ip())
                .expect("a hostname resolves on a local workload only");
            let port = authority.port_u16().expect("a port");
            assert_eq!(
                inbound_service_port(snapshot, local, authority.host(), port),
                Some(target.port())
            );
        }
    }
    if PodPorts::default()
        .all()
        .iter()
        .any(|(_, p)| *p == target.port())
    {
        return Err(400);
    }
    let Some(local) = authorization::local_workload(snapshot, cfg, conn_dst.ip()) else {
        return Err(503);
    };
    let upstream = match inbound_upstream(snapshot, &cfg.network, local, conn_dst.ip(), target) {
        Ok(u) => u,
        Err(_) => {
            assert_ne!(
                target.ip(),
                conn_dst.ip(),
                "the dialled address is always allowed"
            );
            return Err(400);
        }
    };
    assert_eq!(
        upstream.addr.ip(),
        conn_dst.ip(),
        "only the dialled workload is dialled"
    );
    let inbound = Inbound {
        src: conn_src.ip(),
        dst: SocketAddr::new(conn_dst.ip(), target.port()),
        peer: Some(peer.clone()),
    };
    let registry = Rc::new(Registry::default());
    let ticket = match authorization::admit(&registry, snapshot, cfg, inbound) {
        Ok(t) => t,
        Err(Refused::NotLocal(ip)) => panic!("{ip} was local a moment ago"),
        Err(Refused::Denied(why)) => {
            assert!(!why.is_empty());
            return Err(401);
        }
        Err(Refused::BypassedWaypoint(_)) => {
            assert!(local.waypoint.is_some(), "only a workload with a waypoint");
            return Err(401);
        }
    };
    assert_eq!(registry.len(), 1, "an admitted stream is registered");
    if local.waypoint.is_some() {
        assert_eq!(
            peer.service_account.as_str(),
            "waypoint",
            "only the waypoint gets in"
        );
    }
    let conn = ringway_controlplane::model::authz::Conn {
        src: conn_src.ip(),
        dst: SocketAddr::new(conn_dst.ip(), target.port()),
        peer: Some(peer),
    };
    assert!(snapshot.authorize(local, &conn, &mut |_| {}).allowed());
    if upstream.proxy_protocol {
        let header = proxy_header::encode(conn_src, target, &peer.to_string());
        decodes_to(&header, conn_src, target, &peer.to_string());
    }
    drop(ticket);
    assert!(registry.is_empty(), "an ended stream is forgotten");
    Ok(upstream.addr)
}

/// Reads a PROXY v2 header back (written here, apart from the encoder) and
/// checks it says `src`, `dst` and `identity`.
fn decodes_to(h: &[u8], src: SocketAddr, dst: SocketAddr, identity: &str) {
    assert_eq!(&h[..12], b"\r\n\r\n\0\r\nQUIT\n", "signature");
    assert_eq!(h[12], 0x21, "v2 PROXY");
    let len = usize::from(u16::from_be_bytes([h[14], h[15]]));
    assert_eq!(len, h.len() - 16, "the length covers the rest");
    let ip = |b: &[u8]| -> IpAddr {
        match b.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes")),
            _ => IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes")).to_canonical(),
        }
    };
    let width = match h[13] {
        0x11 => 4,
        0x21 => 16,
        other => panic!("family {other:#x}"),
    };
    let body = &h[16..];
    let (s, d) = (ip(&body[..width]), ip(&body[width..2 * width]));
    assert_eq!((s, d), (src.ip().to_canonical(), dst.ip().to_canonical()));
    let ports = &body[2 * width..2 * width + 4];
    assert_eq!(u16::from_be_bytes([ports[0], ports[1]]), src.port());
    assert_eq!(u16::from_be_bytes([ports[2], ports[3]]), dst.port());
    let tlv = &body[2 * width + 4..];
    assert_eq!(tlv[0], proxy_header::TLV_PEER_IDENTITY);
    let n = usize::from(u16::from_be_bytes([tlv[1], tlv[2]]));
    assert_eq!(&tlv[3..], identity.as_bytes());
    assert_eq!(n, identity.len());
}

/// Seeds: what ringway's and ztunnel's clients send: an `ip:port` target
/// with `forwarded`, `traceparent` and `baggage`, a service hostname (both
/// namespaces' mappings), the PROXY-tunnelled workload, the waypoint path
/// to a guarded workload, a gateway's `x-forwarded-network`; and refused
/// ones: GET, no authority, a target elsewhere, ringway's own port.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    // Steer bits: dialled (0-2), peer address (3-4), identity (5-6),
    // --node-name (7).
    let steer = |dialled: u8, from: u8, id: u8, node: bool| {
        dialled | from << 3 | id << 5 | u8::from(node) << 7
    };
    let headers = "forwarded: for=\"10.0.0.1:40000\";host=echo.ns1.svc.cluster.local\n\
                   traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n\
                   baggage: k8s.namespace.name=ns1,k8s.deployment.name=client,service.name=client";
    let cases: [(&str, u8, String); 12] = [
        ("ip-port", steer(0, 0, 0, false), format!("CONNECT\n10.0.0.2:8080\n{headers}")),
        ("ipv6", steer(1, 2, 0, true), "CONNECT\n[fd00::2]:8080\n".into()),
        ("hostname", steer(0, 0, 0, true), "CONNECT\necho.ns1.svc.cluster.local:80\n".into()),
        ("hostname-443", steer(0, 0, 0, false), "CONNECT\necho.ns1.svc.cluster.local:443\n".into()),
        ("proxy-tunnel", steer(2, 0, 0, false), "CONNECT\n10.0.0.4:8080\n".into()),
        ("via-waypoint", steer(3, 1, 2, false), "CONNECT\n10.0.0.5:8080\n".into()),
        ("bypassed-waypoint", steer(3, 0, 0, false), "CONNECT\n10.0.0.5:8080\n".into()),
        ("waypoint-for-service", steer(4, 0, 0, false), "CONNECT\n10.96.0.1:80\n".into()),
        (
            "gateway",
            steer(0, 3, 3, false),
            "CONNECT\n10.0.0.2:8080\nx-forwarded-network: net2\nbaggage: k8s.namespace.name=ns9,k8s.pod.name=p".into(),
        ),
        ("denied-bob", steer(0, 0, 1, false), "CONNECT\n10.0.0.2:8080\n".into()),
        ("self-call", steer(0, 0, 0, false), "CONNECT\n10.0.0.2:15008\n".into()),
        ("get", steer(5, 0, 0, true), "GET\n10.0.0.7:80\n".into()),
    ];
    let mut out: Vec<(String, Vec<u8>)> = cases
        .into_iter()
        .map(|(name, steer, text)| {
            let mut bytes = vec![steer];
            bytes.extend_from_slice(text.as_bytes());
            (format!("seed-{name}"), bytes)
        })
        .collect();
    out.push(("seed-no-authority".into(), b"\x00CONNECT\n".to_vec()));
    out
}
