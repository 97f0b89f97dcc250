//! Wire-level checks: field numbers and wire types of the fields ringway
//! depends on, round trips, and tolerance of data from newer peers.
//!
//! Encoded bytes are inspected with a small independent protobuf reader
//! (below) rather than with prost itself, so a wrong field number in a
//! `.proto` file cannot hide behind a matching wrong decoder.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message;
use ringway_proto::{ca, core, discovery, rpc, security, workload};

// ---------------------------------------------------------------------------
// A minimal protobuf reader and writer, independent of prost.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    Varint(u64),
    Fixed64(u64),
    Len(Vec<u8>),
    Fixed32(u32),
}

impl Val {
    fn bytes(&self) -> &[u8] {
        match self {
            Val::Len(b) => b,
            other => panic!("expected a length-delimited value, got {other:?}"),
        }
    }

    fn str(&self) -> &str {
        std::str::from_utf8(self.bytes()).expect("utf-8")
    }

    fn varint(&self) -> u64 {
        match self {
            Val::Varint(v) => *v,
            other => panic!("expected a varint, got {other:?}"),
        }
    }
}

fn read_varint(buf: &mut &[u8]) -> u64 {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (byte, rest) = buf.split_first().expect("truncated varint");
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
    }
    panic!("varint too long");
}

/// Splits a message into its top-level `(field number, value)` pairs, in
/// the order they appear on the wire.
fn fields(mut buf: &[u8]) -> Vec<(u32, Val)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = read_varint(&mut buf);
        let number = u32::try_from(key >> 3).expect("field number");
        let val = match key & 7 {
            0 => Val::Varint(read_varint(&mut buf)),
            1 => {
                let (v, rest) = buf.split_at(8);
                buf = rest;
                Val::Fixed64(u64::from_le_bytes(v.try_into().unwrap()))
            }
            2 => {
                let len = usize::try_from(read_varint(&mut buf)).unwrap();
                let (v, rest) = buf.split_at(len);
                buf = rest;
                Val::Len(v.to_vec())
            }
            5 => {
                let (v, rest) = buf.split_at(4);
                buf = rest;
                Val::Fixed32(u32::from_le_bytes(v.try_into().unwrap()))
            }
            wt => panic!("unexpected wire type {wt}"),
        };
        out.push((number, val));
    }
    out
}

/// All values of field `number`, in wire order.
fn field(buf: &[u8], number: u32) -> Vec<Val> {
    fields(buf)
        .into_iter()
        .filter(|(n, _)| *n == number)
        .map(|(_, v)| v)
        .collect()
}

/// The single value of field `number`.
fn one(buf: &[u8], number: u32) -> Val {
    let mut all = field(buf, number);
    assert_eq!(all.len(), 1, "field {number} in {:?}", fields(buf));
    all.pop().unwrap()
}

fn numbers(buf: &[u8]) -> Vec<u32> {
    let mut n: Vec<u32> = fields(buf).into_iter().map(|(n, _)| n).collect();
    n.sort_unstable();
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_key(out, number, 0);
    put_varint(out, v);
}

fn put_len_field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_key(out, number, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

// ---------------------------------------------------------------------------
// Exact encodings of single fields.

#[test]
fn workload_uid_is_field_20() {
    let w = workload::Workload {
        uid: "u1".into(),
        ..Default::default()
    };
    // key = 20 << 3 | 2 = 162 = varint [0xa2, 0x01]
    assert_eq!(w.encode_to_vec(), [0xa2, 0x01, 0x02, b'u', b'1']);
}

#[test]
fn workload_addresses_are_field_3_raw_bytes() {
    let w = workload::Workload {
        addresses: vec![
            Bytes::from_static(&[10, 0, 0, 1]),
            Bytes::from_static(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
        ],
        ..Default::default()
    };
    let mut want = vec![0x1a, 0x04, 10, 0, 0, 1, 0x1a, 0x10, 0xfd];
    want.extend_from_slice(&[0; 14]);
    want.push(2);
    assert_eq!(w.encode_to_vec(), want);
}

#[test]
fn address_oneof_workload_is_1_service_is_2() {
    let a = workload::Address {
        r#type: Some(workload::address::Type::Workload(workload::Workload {
            name: "a".into(),
            ..Default::default()
        })),
    };
    assert_eq!(a.encode_to_vec(), [0x0a, 0x03, 0x0a, 0x01, b'a']);

    let a = workload::Address {
        r#type: Some(workload::address::Type::Service(workload::Service {
            hostname: "h".into(),
            ..Default::default()
        })),
    };
    // Service.hostname is field 3.
    assert_eq!(a.encode_to_vec(), [0x12, 0x03, 0x1a, 0x01, b'h']);
}

#[test]
fn workload_capacity_is_a_uint32_wrapper_at_27() {
    let w = workload::Workload {
        capacity: Some(5),
        ..Default::default()
    };
    // key = 27 << 3 | 2 = 218 = [0xda, 0x01]; wrapper body = field 1 varint 5.
    assert_eq!(w.encode_to_vec(), [0xda, 0x01, 0x02, 0x08, 0x05]);

    // An explicit zero is still present on the wire (unset means "default 1").
    let w = workload::Workload {
        capacity: Some(0),
        ..Default::default()
    };
    assert_eq!(w.encode_to_vec(), [0xda, 0x01, 0x00]);
    let back = workload::Workload::decode(&[0xda, 0x01, 0x00][..]).unwrap();
    assert_eq!(back.capacity, Some(0));
    assert_eq!(workload::Workload::default().capacity, None);
}

#[test]
fn network_address_length_has_presence() {
    let host = workload::NetworkAddress {
        network: "n".into(),
        address: Bytes::from_static(&[1, 2, 3, 4]),
        length: None,
    };
    assert_eq!(
        host.encode_to_vec(),
        [0x0a, 0x01, b'n', 0x12, 0x04, 1, 2, 3, 4]
    );

    let cidr = workload::NetworkAddress {
        length: Some(0),
        ..host
    };
    // optional uint32 length = 3 is written even when zero.
    assert_eq!(one(&cidr.encode_to_vec(), 3), Val::Varint(0));
}

#[test]
fn ca_request_fields() {
    let req = ca::IstioCertificateRequest {
        csr: "PEM".into(),
        validity_duration: 86_400,
        metadata: None,
    };
    // csr = 1 (len), validity_duration = 3 (varint 86400 = [0x80, 0xa3, 0x05]).
    assert_eq!(
        req.encode_to_vec(),
        [0x0a, 0x03, b'P', b'E', b'M', 0x18, 0x80, 0xa3, 0x05]
    );

    let mut fields_map = std::collections::BTreeMap::new();
    fields_map.insert(
        "ImpersonatedIdentity".to_string(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(
                "spiffe://cluster.local/ns/a/sa/b".into(),
            )),
        },
    );
    let req = ca::IstioCertificateRequest {
        metadata: Some(prost_types::Struct { fields: fields_map }),
        ..req
    };
    let buf = req.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 3, 4]);
    let metadata = one(&buf, 4);
    // Struct.fields is a map at field 1; its entry key is field 1.
    let entry = one(metadata.bytes(), 1);
    assert_eq!(one(entry.bytes(), 1).str(), "ImpersonatedIdentity");

    let resp = ca::IstioCertificateResponse {
        cert_chain: vec!["leaf".into(), "root".into()],
    };
    let buf = resp.encode_to_vec();
    let chain = field(&buf, 1);
    let chain: Vec<&str> = chain.iter().map(Val::str).collect();
    assert_eq!(chain, ["leaf", "root"]);
}

#[test]
fn delta_request_fields() {
    let req = discovery::DeltaDiscoveryRequest {
        response_nonce: "n1".into(),
        ..Default::default()
    };
    assert_eq!(req.encode_to_vec(), [0x32, 0x02, b'n', b'1']);

    let req = discovery::DeltaDiscoveryRequest {
        node: Some(core::Node {
            id: "ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: ringway_proto::ADDRESS_TYPE_URL.into(),
        resource_names_subscribe: vec!["sub".into()],
        resource_names_unsubscribe: vec!["unsub".into()],
        initial_resource_versions: HashMap::from([("res".to_string(), "v7".to_string())]),
        response_nonce: "nonce".into(),
        error_detail: Some(rpc::Status {
            code: 3,
            message: "res: bad".into(),
            details: vec![],
        }),
    };
    let buf = req.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(
        one(one(&buf, 1).bytes(), 1).str(),
        "ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local"
    );
    assert_eq!(
        one(&buf, 2).str(),
        "type.googleapis.com/istio.workload.Address"
    );
    assert_eq!(one(&buf, 3).str(), "sub");
    assert_eq!(one(&buf, 4).str(), "unsub");
    // map<string,string> entry: key = 1, value = 2.
    let entry = one(&buf, 5);
    assert_eq!(one(entry.bytes(), 1).str(), "res");
    assert_eq!(one(entry.bytes(), 2).str(), "v7");
    assert_eq!(one(&buf, 6).str(), "nonce");
    // google.rpc.Status: code = 1, message = 2.
    let status = one(&buf, 7);
    assert_eq!(one(status.bytes(), 1).varint(), 3);
    assert_eq!(one(status.bytes(), 2).str(), "res: bad");
}

#[test]
fn delta_response_and_resource_fields() {
    let resource = discovery::Resource {
        version: "v1".into(),
        resource: Some(prost_types::Any {
            type_url: ringway_proto::ADDRESS_TYPE_URL.into(),
            value: vec![0x0a, 0x00],
        }),
        name: "uid-1".into(),
        aliases: vec!["net/10.0.0.1".into()],
        ttl: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        cache_control: Some(discovery::resource::CacheControl { do_not_cache: true }),
        metadata: None,
    };
    let rbuf = resource.encode_to_vec();
    assert_eq!(numbers(&rbuf), [1, 2, 3, 4, 6, 7]);
    assert_eq!(one(&rbuf, 1).str(), "v1");
    assert_eq!(one(&rbuf, 3).str(), "uid-1");
    assert_eq!(one(&rbuf, 4).str(), "net/10.0.0.1");
    assert_eq!(one(one(&rbuf, 6).bytes(), 1).varint(), 30);
    assert_eq!(one(one(&rbuf, 7).bytes(), 1).varint(), 1);
    // Any: type_url = 1, value = 2.
    assert_eq!(
        one(one(&rbuf, 2).bytes(), 1).str(),
        ringway_proto::ADDRESS_TYPE_URL
    );

    let only_name = discovery::Resource {
        name: "x".into(),
        ..Default::default()
    };
    assert_eq!(only_name.encode_to_vec(), [0x1a, 0x01, b'x']);
    let only_alias = discovery::Resource {
        aliases: vec!["y".into()],
        ..Default::default()
    };
    assert_eq!(only_alias.encode_to_vec(), [0x22, 0x01, b'y']);

    let resp = discovery::DeltaDiscoveryResponse {
        system_version_info: "sys".into(),
        resources: vec![resource],
        type_url: ringway_proto::AUTHORIZATION_TYPE_URL.into(),
        nonce: "n".into(),
        removed_resources: vec!["gone".into()],
        control_plane: Some(core::ControlPlane {
            identifier: "istiod-1".into(),
        }),
    };
    let buf = resp.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 4, 5, 6, 7]);
    assert_eq!(one(&buf, 1).str(), "sys");
    assert_eq!(one(&buf, 2).bytes(), rbuf.as_slice());
    assert_eq!(
        one(&buf, 4).str(),
        "type.googleapis.com/istio.security.Authorization"
    );
    assert_eq!(one(&buf, 5).str(), "n");
    assert_eq!(one(&buf, 6).str(), "gone");
    assert_eq!(one(one(&buf, 7).bytes(), 1).str(), "istiod-1");
}

#[test]
fn sotw_fields() {
    let req = discovery::DiscoveryRequest {
        version_info: "v".into(),
        node: Some(core::Node::default()),
        resource_names: vec!["r".into()],
        type_url: "t".into(),
        response_nonce: "n".into(),
        error_detail: Some(rpc::Status::default()),
    };
    let buf = req.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 3, 4, 5, 6]);
    assert_eq!(one(&buf, 5).str(), "n");

    let resp = discovery::DiscoveryResponse {
        version_info: "v".into(),
        resources: vec![prost_types::Any::default()],
        canary: true,
        type_url: "t".into(),
        nonce: "n".into(),
        control_plane: Some(core::ControlPlane::default()),
    };
    let buf = resp.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 3, 4, 5, 6]);
    assert_eq!(one(&buf, 3), Val::Varint(1));
    assert_eq!(one(&buf, 5).str(), "n");
}

#[test]
fn node_fields() {
    let node = core::Node {
        id: "id".into(),
        cluster: "c".into(),
        metadata: Some(prost_types::Struct::default()),
        locality: Some(core::Locality {
            region: "r".into(),
            zone: "z".into(),
            sub_zone: "s".into(),
        }),
        user_agent_name: "ringway".into(),
        user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentVersion(
            "0.1".into(),
        )),
        client_features: vec!["f".into()],
    };
    let buf = node.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 3, 4, 6, 7, 10]);
    assert_eq!(one(&buf, 6).str(), "ringway");
    assert_eq!(one(&buf, 7).str(), "0.1");
    let locality = one(&buf, 4);
    assert_eq!(one(locality.bytes(), 3).str(), "s");
}

#[test]
fn workload_field_numbers() {
    let w = full_workload();
    let buf = w.encode_to_vec();
    assert_eq!(
        numbers(&buf),
        [
            1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 24,
            25, 26, 27
        ]
    );
    assert_eq!(one(&buf, 5), Val::Varint(1)); // HBONE
    assert_eq!(one(&buf, 6).str(), "cluster.local");
    assert_eq!(one(&buf, 7).str(), "sa");
    assert_eq!(one(&buf, 9).str(), "node-1");
    assert_eq!(one(&buf, 12), Val::Varint(2)); // POD
    assert_eq!(one(&buf, 14), Val::Varint(1));
    assert_eq!(one(&buf, 16).str(), "ns/policy");
    assert_eq!(one(&buf, 17), Val::Varint(1)); // UNHEALTHY
    assert_eq!(one(&buf, 18).str(), "Kubernetes");
    assert_eq!(one(&buf, 20).str(), "cluster/ns/pod");
    assert_eq!(one(&buf, 25), Val::Varint(1)); // HOST_NETWORK

    // waypoint: GatewayAddress { hostname = 1 { namespace = 1, hostname = 2 }, hbone_mtls_port = 3 }
    let wp = one(&buf, 8);
    let host = one(wp.bytes(), 1);
    assert_eq!(one(host.bytes(), 1).str(), "istio-system");
    assert_eq!(one(host.bytes(), 2).str(), "waypoint.istio-system.svc");
    assert_eq!(one(wp.bytes(), 3), Val::Varint(15008));

    // network_gateway: GatewayAddress { address = 2 { network = 1, address = 2 } }
    let gw = one(&buf, 19);
    let addr = one(gw.bytes(), 2);
    assert_eq!(one(addr.bytes(), 1).str(), "net2");
    assert_eq!(one(addr.bytes(), 2).bytes(), [192, 168, 0, 1]);

    // services: map entry { key = 1, value = PortList { ports = 1 { 1, 2, 3 } } }
    let entry = one(&buf, 22);
    assert_eq!(one(entry.bytes(), 1).str(), "ns/svc.ns.svc.cluster.local");
    let port_list = one(entry.bytes(), 2);
    let port = one(port_list.bytes(), 1);
    assert_eq!(one(port.bytes(), 1), Val::Varint(80));
    assert_eq!(one(port.bytes(), 2), Val::Varint(8080));
    assert_eq!(one(port.bytes(), 3), Val::Varint(1)); // HTTP11

    // application_tunnel { protocol = 1, port = 2 }
    let tunnel = one(&buf, 23);
    assert_eq!(one(tunnel.bytes(), 1), Val::Varint(1));
    assert_eq!(one(tunnel.bytes(), 2), Val::Varint(15088));

    // locality { region = 1, zone = 2, subzone = 3 }
    let locality = one(&buf, 24);
    assert_eq!(one(locality.bytes(), 3).str(), "sz");

    // extensions { name = 1, config = 2 }
    let ext = one(&buf, 26);
    assert_eq!(one(ext.bytes(), 1).str(), "ext");
}

#[test]
fn service_field_numbers() {
    let s = full_service();
    let buf = s.encode_to_vec();
    assert_eq!(
        numbers(&buf),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    );
    assert_eq!(one(&buf, 9), Val::Varint(3)); // DUAL
    assert_eq!(one(&buf, 11), Val::Varint(1));
    assert_eq!(one(&buf, 12), Val::Varint(1));
    assert_eq!(one(&buf, 14), Val::Varint(1)); // NAMESPACE visibility

    let vip = one(&buf, 4);
    assert_eq!(one(vip.bytes(), 2).bytes(), [10, 96, 0, 1]);

    // load_balancing { routing_preference = 1 (packed), mode = 2, health_policy = 3 }
    let lb = one(&buf, 8);
    assert_eq!(one(lb.bytes(), 1).bytes(), [4, 2]); // NODE, ZONE packed
    assert_eq!(one(lb.bytes(), 2), Val::Varint(2)); // FAILOVER
    assert_eq!(one(lb.bytes(), 3), Val::Varint(1)); // ALLOW_ALL

    // weighted_waypoints { destination = 1, weight = 2 }
    let ww = one(&buf, 13);
    assert_eq!(one(ww.bytes(), 2), Val::Varint(70));
    let dest = one(ww.bytes(), 1);
    assert_eq!(one(dest.bytes(), 3), Val::Varint(15008));
}

#[test]
fn authorization_nesting_and_string_match() {
    let presence = security::StringMatch {
        match_type: Some(security::string_match::MatchType::Presence(())),
    };
    // presence = 4, an empty google.protobuf.Empty.
    assert_eq!(presence.encode_to_vec(), [0x22, 0x00]);
    for (mt, tag) in [
        (security::string_match::MatchType::Exact("x".into()), 0x0a),
        (security::string_match::MatchType::Prefix("x".into()), 0x12),
        (security::string_match::MatchType::Suffix("x".into()), 0x1a),
    ] {
        let m = security::StringMatch {
            match_type: Some(mt),
        };
        assert_eq!(m.encode_to_vec(), [tag, 0x01, b'x']);
    }

    let strict = security::Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: security::Scope::Global as i32,
        action: security::Action::Deny as i32,
        rules: vec![security::Rule {
            clauses: vec![security::Clause {
                matches: vec![security::Match {
                    not_principals: vec![presence],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: false,
        extensions: vec![],
    };
    let buf = strict.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 4, 5]);
    assert_eq!(one(&buf, 4), Val::Varint(1));
    // rules = 5 -> Rule.clauses = 1 -> Clause.matches = 2 -> Match.not_principals = 4
    assert_eq!(
        one(&buf, 5),
        Val::Len(vec![0x0a, 0x06, 0x12, 0x04, 0x22, 0x02, 0x22, 0x00])
    );
}

#[test]
fn authorization_match_field_numbers() {
    let sm = |s: &str| security::StringMatch {
        match_type: Some(security::string_match::MatchType::Exact(s.into())),
    };
    let ip = |b: &'static [u8], len| security::Address {
        address: Bytes::from_static(b),
        length: len,
    };
    let sa = security::ServiceAccountMatch {
        namespace: "ns".into(),
        service_account: "sa".into(),
    };
    let m = security::Match {
        namespaces: vec![sm("a")],
        not_namespaces: vec![sm("b")],
        principals: vec![sm("c")],
        not_principals: vec![sm("d")],
        source_ips: vec![ip(&[10, 0, 0, 0], 8)],
        not_source_ips: vec![ip(&[10, 1, 0, 0], 16)],
        destination_ips: vec![ip(&[10, 2, 0, 0], 16)],
        not_destination_ips: vec![ip(&[10, 3, 0, 0], 16)],
        destination_ports: vec![80, 443],
        not_destination_ports: vec![22],
        service_accounts: vec![sa.clone()],
        not_service_accounts: vec![sa],
        extensions: vec![workload::Extension::default()],
    };
    let buf = m.encode_to_vec();
    assert_eq!(numbers(&buf), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert_eq!(one(one(&buf, 4).bytes(), 1).str(), "d");
    // Address { address = 1, length = 2 }
    let src = one(&buf, 5);
    assert_eq!(one(src.bytes(), 1).bytes(), [10, 0, 0, 0]);
    assert_eq!(one(src.bytes(), 2), Val::Varint(8));
    // proto3 repeated scalars are packed.
    assert_eq!(one(&buf, 9).bytes(), [80, 0xbb, 0x03]);
    // ServiceAccountMatch { namespace = 1, service_account = 2 }
    let sam = one(&buf, 11);
    assert_eq!(one(sam.bytes(), 1).str(), "ns");
    assert_eq!(one(sam.bytes(), 2).str(), "sa");

    // A decoder must also accept unpacked repeated scalars.
    let mut unpacked = Vec::new();
    put_varint_field(&mut unpacked, 9, 80);
    put_varint_field(&mut unpacked, 9, 443);
    let back = security::Match::decode(unpacked.as_slice()).unwrap();
    assert_eq!(back.destination_ports, [80, 443]);
}

// ---------------------------------------------------------------------------
// Round trips.

fn full_workload() -> workload::Workload {
    use workload::*;
    Workload {
        uid: "cluster/ns/pod".into(),
        name: "pod".into(),
        namespace: "ns".into(),
        addresses: vec![
            Bytes::from_static(&[10, 0, 0, 7]),
            Bytes::from(vec![
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7,
            ]),
        ],
        hostname: "pod.example".into(),
        network: "net1".into(),
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        trust_domain: "cluster.local".into(),
        service_account: "sa".into(),
        waypoint: Some(GatewayAddress {
            destination: Some(gateway_address::Destination::Hostname(NamespacedHostname {
                namespace: "istio-system".into(),
                hostname: "waypoint.istio-system.svc".into(),
            })),
            hbone_mtls_port: 15008,
        }),
        network_gateway: Some(GatewayAddress {
            destination: Some(gateway_address::Destination::Address(NetworkAddress {
                network: "net2".into(),
                address: Bytes::from_static(&[192, 168, 0, 1]),
                length: None,
            })),
            hbone_mtls_port: 15009,
        }),
        node: "node-1".into(),
        canonical_name: "app".into(),
        canonical_revision: "v1".into(),
        workload_type: WorkloadType::Pod as i32,
        workload_name: "app-deploy".into(),
        native_tunnel: true,
        application_tunnel: Some(ApplicationTunnel {
            protocol: application_tunnel::Protocol::Proxy as i32,
            port: 15088,
        }),
        services: HashMap::from([(
            "ns/svc.ns.svc.cluster.local".to_string(),
            PortList {
                ports: vec![Port {
                    service_port: 80,
                    target_port: 8080,
                    app_protocol: AppProtocol::Http11 as i32,
                }],
            },
        )]),
        authorization_policies: vec!["ns/policy".into()],
        status: WorkloadStatus::Unhealthy as i32,
        cluster_id: "Kubernetes".into(),
        locality: Some(Locality {
            region: "r".into(),
            zone: "z".into(),
            subzone: "sz".into(),
        }),
        network_mode: NetworkMode::HostNetwork as i32,
        extensions: vec![Extension {
            name: "ext".into(),
            config: Some(prost_types::Any {
                type_url: "type.googleapis.com/x.Y".into(),
                value: vec![1, 2, 3],
            }),
        }],
        capacity: Some(3),
    }
}

fn full_service() -> workload::Service {
    use workload::*;
    let waypoint = GatewayAddress {
        destination: Some(gateway_address::Destination::Address(NetworkAddress {
            network: String::new(),
            address: Bytes::from_static(&[10, 0, 0, 9]),
            length: None,
        })),
        hbone_mtls_port: 15008,
    };
    Service {
        name: "svc".into(),
        namespace: "ns".into(),
        hostname: "svc.ns.svc.cluster.local".into(),
        addresses: vec![NetworkAddress {
            network: "net1".into(),
            address: Bytes::from_static(&[10, 96, 0, 1]),
            length: Some(32),
        }],
        ports: vec![Port {
            service_port: 443,
            target_port: 8443,
            app_protocol: AppProtocol::Tls as i32,
        }],
        subject_alt_names: vec!["spiffe://cluster.local/ns/ns/sa/svc".into()],
        waypoint: Some(waypoint.clone()),
        load_balancing: Some(LoadBalancing {
            routing_preference: vec![
                load_balancing::Scope::Node as i32,
                load_balancing::Scope::Zone as i32,
            ],
            mode: load_balancing::Mode::Failover as i32,
            health_policy: load_balancing::HealthPolicy::AllowAll as i32,
        }),
        ip_families: IpFamilies::Dual as i32,
        extensions: vec![Extension {
            name: "e".into(),
            config: None,
        }],
        canonical: true,
        ingress_use_waypoint: true,
        weighted_waypoints: vec![WeightedWaypoint {
            destination: Some(waypoint),
            weight: 70,
        }],
        visibility: service::Visibility::Namespace as i32,
    }
}

#[test]
fn roundtrip_addresses_through_delta_response() {
    let wl = workload::Address {
        r#type: Some(workload::address::Type::Workload(full_workload())),
    };
    let svc = workload::Address {
        r#type: Some(workload::address::Type::Service(full_service())),
    };
    let resp = discovery::DeltaDiscoveryResponse {
        type_url: ringway_proto::ADDRESS_TYPE_URL.into(),
        nonce: "abc".into(),
        resources: [
            ("cluster/ns/pod", &wl),
            ("ns/svc.ns.svc.cluster.local", &svc),
        ]
        .into_iter()
        .map(|(name, addr)| discovery::Resource {
            name: name.into(),
            version: "1".into(),
            aliases: vec!["net1/10.0.0.7".into()],
            resource: Some(prost_types::Any {
                type_url: ringway_proto::ADDRESS_TYPE_URL.into(),
                value: addr.encode_to_vec(),
            }),
            ..Default::default()
        })
        .collect(),
        removed_resources: vec!["old".into()],
        ..Default::default()
    };

    // Decode from `Bytes`, the way a gRPC codec hands buffers over.
    let wire = Bytes::from(resp.encode_to_vec());
    let back = discovery::DeltaDiscoveryResponse::decode(wire).unwrap();
    assert_eq!(back, resp);

    let decoded: Vec<workload::Address> = back
        .resources
        .iter()
        .map(|r| {
            let any = r.resource.as_ref().unwrap();
            assert_eq!(any.type_url, ringway_proto::ADDRESS_TYPE_URL);
            workload::Address::decode(any.value.as_slice()).unwrap()
        })
        .collect();
    assert_eq!(decoded, [wl, svc]);
    match &decoded[0].r#type {
        Some(workload::address::Type::Workload(w)) => {
            assert_eq!(w.addresses[0].as_ref(), [10, 0, 0, 7]);
            assert_eq!(w.tunnel_protocol(), workload::TunnelProtocol::Hbone);
            assert_eq!(w.capacity, Some(3));
        }
        other => panic!("expected a workload, got {other:?}"),
    }
}

#[test]
fn roundtrip_authorization_and_ca() {
    let authz = security::Authorization {
        name: "allow-get".into(),
        namespace: "ns".into(),
        scope: security::Scope::WorkloadSelector as i32,
        action: security::Action::Allow as i32,
        rules: vec![security::Rule {
            clauses: vec![security::Clause {
                matches: vec![security::Match {
                    principals: vec![security::StringMatch {
                        match_type: Some(security::string_match::MatchType::Suffix(
                            "/sa/client".into(),
                        )),
                    }],
                    destination_ports: vec![8080],
                    source_ips: vec![security::Address {
                        address: Bytes::from_static(&[10, 0, 0, 0]),
                        length: 8,
                    }],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: true,
        extensions: vec![],
    };
    let back = security::Authorization::decode(authz.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, authz);
    assert_eq!(back.action(), security::Action::Allow);
    assert_eq!(back.scope(), security::Scope::WorkloadSelector);

    let req = ca::IstioCertificateRequest {
        csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        validity_duration: 86_400,
        metadata: Some(prost_types::Struct::default()),
    };
    let back = ca::IstioCertificateRequest::decode(req.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, req);
}

// ---------------------------------------------------------------------------
// Forward compatibility: data from newer peers must decode.

#[test]
fn unknown_enum_values_and_fields_are_tolerated() {
    let mut buf = Vec::new();
    put_len_field(&mut buf, 20, b"uid-9");
    put_varint_field(&mut buf, 5, 99); // tunnel_protocol: not a known value
    put_varint_field(&mut buf, 12, 42); // workload_type: not a known value
    put_varint_field(&mut buf, 500, 7); // unknown varint field
    put_len_field(&mut buf, 501, b"\x0a\x03abc"); // unknown message field
    put_key(&mut buf, 502, 1); // unknown fixed64 field
    buf.extend_from_slice(&1u64.to_le_bytes());
    put_key(&mut buf, 503, 5); // unknown fixed32 field
    buf.extend_from_slice(&1u32.to_le_bytes());
    put_varint_field(&mut buf, 15, 1); // reserved (removed) field number
    put_len_field(&mut buf, 1, b"name");

    let w = workload::Workload::decode(buf.as_slice()).expect("decode");
    assert_eq!(w.uid, "uid-9");
    assert_eq!(w.name, "name");
    // The raw value is kept; the typed accessor falls back to the default.
    assert_eq!(w.tunnel_protocol, 99);
    assert!(workload::TunnelProtocol::try_from(w.tunnel_protocol).is_err());
    assert_eq!(w.tunnel_protocol(), workload::TunnelProtocol::None);
    assert_eq!(w.workload_type, 42);
    assert_eq!(w.workload_type(), workload::WorkloadType::Deployment);

    // Unknown values inside a packed repeated enum survive as well.
    let mut lb = Vec::new();
    put_len_field(&mut lb, 1, &[1, 77, 4]);
    put_varint_field(&mut lb, 2, 9);
    let lb = workload::LoadBalancing::decode(lb.as_slice()).expect("decode");
    assert_eq!(lb.routing_preference, [1, 77, 4]);
    assert_eq!(lb.mode(), workload::load_balancing::Mode::UnspecifiedMode);

    // The same for an authorization policy with an unknown action.
    let mut authz = Vec::new();
    put_len_field(&mut authz, 1, b"p");
    put_varint_field(&mut authz, 4, 5);
    put_len_field(&mut authz, 99, b"future");
    let authz = security::Authorization::decode(authz.as_slice()).expect("decode");
    assert_eq!(authz.name, "p");
    assert_eq!(authz.action, 5);
}

#[test]
fn fields_trimmed_from_envoy_messages_are_skipped() {
    // A Resource as a full Envoy would send it, with resource_name = 8 and
    // metadata = 9, and a response with removed_resource_names = 8.
    let mut resource = Vec::new();
    put_len_field(&mut resource, 3, b"r");
    put_len_field(&mut resource, 8, b"\x0a\x01r");
    put_len_field(&mut resource, 4, b"alias");
    put_len_field(&mut resource, 9, b"\x0a\x00");

    let mut resp = Vec::new();
    put_len_field(&mut resp, 2, &resource);
    put_len_field(&mut resp, 8, b"\x0a\x04gone");
    put_len_field(&mut resp, 5, b"nonce");
    let resp = discovery::DeltaDiscoveryResponse::decode(resp.as_slice()).expect("decode");
    assert_eq!(resp.nonce, "nonce");
    assert_eq!(resp.resources.len(), 1);
    assert_eq!(resp.resources[0].name, "r");
    assert_eq!(resp.resources[0].aliases, ["alias"]);

    // A Node with Envoy fields we left out: extensions = 9,
    // listening_addresses = 11, dynamic_parameters = 12, the removed
    // build_version = 5, and user_agent_build_version = 8.
    let mut node = Vec::new();
    put_len_field(&mut node, 1, b"id");
    put_len_field(&mut node, 5, b"old");
    put_len_field(&mut node, 8, b"\x0a\x00");
    put_len_field(&mut node, 9, b"\x0a\x03ext");
    put_len_field(&mut node, 11, b"");
    put_len_field(&mut node, 12, b"\x0a\x01k");
    put_len_field(&mut node, 10, b"feature");
    let mut req = Vec::new();
    put_len_field(&mut req, 1, &node);
    put_len_field(&mut req, 8, b"\x0a\x01x"); // resource_locators_subscribe
    put_len_field(&mut req, 6, b"n");
    let req = discovery::DeltaDiscoveryRequest::decode(req.as_slice()).expect("decode");
    assert_eq!(req.response_nonce, "n");
    let node = req.node.unwrap();
    assert_eq!(node.id, "id");
    assert_eq!(node.client_features, ["feature"]);
}

#[test]
fn type_urls() {
    assert_eq!(
        ringway_proto::ADDRESS_TYPE_URL,
        "type.googleapis.com/istio.workload.Address"
    );
    assert_eq!(
        ringway_proto::AUTHORIZATION_TYPE_URL,
        "type.googleapis.com/istio.security.Authorization"
    );
    // The names the generated types report for themselves agree.
    assert_eq!(
        <workload::Address as prost::Name>::type_url(),
        ringway_proto::ADDRESS_TYPE_URL
    );
    assert_eq!(
        <security::Authorization as prost::Name>::type_url(),
        ringway_proto::AUTHORIZATION_TYPE_URL
    );
}
