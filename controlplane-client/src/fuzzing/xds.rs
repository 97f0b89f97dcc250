//! xDS conversion: the payload of one `istio.workload.Address` or
//! `istio.security.Authorization` resource, as istiod would send it, through
//! what the Delta ADS client does with it: decode and convert
//! ([`convert`]), then upsert into a snapshot. Asserted: a converted
//! resource survives model → wire → model unchanged (the dev control plane
//! relies on it); an accepted upsert can be found by its name and
//! addresses, and removing it again leaves the snapshot as it was; an
//! Authorization the converter refuses is kept as unreadable and then
//! denies every connection it applies to (it never widens access); a
//! readable one decides like the reference evaluator.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use prost::Message;
use ringway_proto::discovery::Resource;
use ringway_proto::security as spb;
use ringway_proto::workload as wpb;
use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use crate::model::authz::reference;
use crate::model::authz::{authorize, ByAction, CompiledPolicy, Conn, Listed, Selected};
use crate::model::identity::Identity;
use crate::model::snapshot::{Snapshot, SnapshotDelta};
use crate::model::{NetworkMode, Policy, PolicyAction, PolicyScope, Workload};
use crate::sources::local::load_snapshot;
use crate::sources::xds::convert::{
    self, address_resource, authorization_resource, AddressResource,
};

/// What the fuzzed resource is upserted into: a workload and a service it
/// could collide with, by uid, key or address.
const MESH: &str = "workloads:
  - uid: cluster1//v1/Pod/ns1/server
    name: server
    namespace: ns1
    serviceAccount: server
    workloadIps: [10.0.0.2, \"fd00::2\"]
    protocol: HBONE
    services: {\"ns1/echo.ns1.svc.cluster.local\": {80: 8080}}
services:
  - name: echo
    namespace: ns1
    hostname: echo.ns1.svc.cluster.local
    vips: [10.96.0.1]
    ports: {80: 8080}
";

fn mesh() -> &'static Snapshot {
    static MESH_SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    MESH_SNAPSHOT.get_or_init(|| load_snapshot(MESH, "fuzz-xds-mesh.yaml").expect("the fuzz mesh"))
}

fn resource(name: &str, type_url: &str, payload: &[u8]) -> Resource {
    Resource {
        name: name.to_owned(),
        version: "1".into(),
        resource: Some(prost_types::Any {
            type_url: type_url.to_owned(),
            value: payload.to_vec(),
        }),
        ..Resource::default()
    }
}

/// `data` as the payload of an Address resource.
pub fn address(data: &[u8]) {
    let res = resource("", ADDRESS_TYPE_URL, data);
    let item = match convert::decode_address_resource(&res) {
        Ok(item) => item,
        Err(e) => {
            assert!(!e.message().is_empty(), "a refusal says why");
            return;
        }
    };
    let again = convert::decode_address_resource(&address_resource(&item, "2".into()))
        .expect("a converted address converts back");
    assert_eq!(again, item, "model → wire → model");

    let base = mesh();
    let name = item.name();
    let existed = match &item {
        AddressResource::Workload(_) => base.workload_by_uid(&name).is_some(),
        AddressResource::Service(_) => base.service_by_key(&name).is_some(),
    };
    let mut delta = SnapshotDelta::default();
    match &item {
        AddressResource::Workload(w) => delta.upsert_workloads.push(w.clone()),
        AddressResource::Service(s) => delta.upsert_services.push(s.clone()),
    }
    let outcome = base.apply(delta);
    if let Some(r) = outcome.rejected.first() {
        assert_eq!(r.name, name, "the refusal names the resource");
        assert!(
            outcome.snapshot.same_content(base),
            "a refused upsert changes nothing"
        );
        return;
    }
    let next = outcome.snapshot;
    match &item {
        AddressResource::Workload(w) => {
            let stored = next
                .workload_by_uid(&name)
                .expect("an upserted workload by uid");
            assert_eq!(**stored, *w);
            if w.network_mode != NetworkMode::HostNetwork {
                for ip in w.addresses.iter() {
                    let found = next.workload_by_addr(&w.network, *ip);
                    assert_eq!(
                        found.map(|f| f.uid.as_str()),
                        Some(w.uid.as_str()),
                        "the newest workload answers for {ip}"
                    );
                }
            }
        }
        AddressResource::Service(s) => {
            let stored = next
                .service_by_key(&name)
                .expect("an upserted service by key");
            assert_eq!(**stored, *s);
            for vip in &s.vips {
                let found = next.service_by_vip(&vip.network, vip.ip);
                assert_eq!(found.map(|f| f.key()), Some(name.clone()), "VIP {vip}");
            }
            assert!(next
                .services_by_hostname(&s.hostname)
                .iter()
                .any(|f| f.key() == name));
        }
    }
    if !existed {
        let mut removal = SnapshotDelta::default();
        match &item {
            AddressResource::Workload(_) => removal.remove_workloads.push(name),
            AddressResource::Service(_) => removal.remove_services.push(name),
        }
        let back = next.apply(removal);
        assert!(back.rejected.is_empty());
        assert!(
            back.snapshot.same_content(base),
            "upsert then remove is a no-op"
        );
    }
}

/// The connections a converted policy is decided for.
fn probes() -> [(Conn<'static>, &'static str); 4] {
    static PEERS: OnceLock<[Identity; 2]> = OnceLock::new();
    let [alice, bob] = PEERS.get_or_init(|| {
        [
            "spiffe://cluster.local/ns/ns1/sa/alice"
                .parse()
                .expect("an identity"),
            "spiffe://td/ns/ns2/sa/bob".parse().expect("an identity"),
        ]
    });
    let to = |s: &str| s.parse::<SocketAddr>().expect("an address");
    [
        (
            Conn {
                src: "10.0.0.1".parse().expect("an address"),
                dst: to("10.0.0.2:8080"),
                peer: Some(alice),
            },
            "ns1",
        ),
        (
            Conn {
                src: "10.1.2.3".parse().expect("an address"),
                dst: to("10.0.0.2:80"),
                peer: Some(bob),
            },
            "ns1",
        ),
        (
            Conn {
                src: "192.168.0.9".parse().expect("an address"),
                dst: to("10.0.0.2:8080"),
                peer: None,
            },
            "ns1",
        ),
        (
            Conn {
                src: "fd00::9".parse().expect("an address"),
                dst: to("[fd00::2]:443"),
                peer: Some(alice),
            },
            "ns2",
        ),
    ]
}

/// `data` as the payload of an Authorization resource.
pub fn authorization(data: &[u8]) {
    let header = spb::Authorization::decode(data).ok();
    // Named as its content says when it decodes (else the client would
    // refuse the mismatch first), so conversion itself is what is tested.
    let name = header
        .as_ref()
        .map(|a| format!("{}/{}", a.namespace, a.name))
        .filter(|n| crate::model::is_namespaced(n))
        .unwrap_or_else(|| "ns1/fuzz".to_owned());
    let res = resource(&name, AUTHORIZATION_TYPE_URL, data);
    match convert::decode_authorization_resource(&res) {
        Ok(policy) => readable(&policy),
        Err(e) => {
            assert!(!e.message().is_empty(), "a refusal says why");
            let u = convert::unreadable_authorization(&res, &e)
                .expect("a namespaced name keeps an unreadable policy");
            assert_eq!(u.key(), name);
            let delta = SnapshotDelta {
                upsert_unreadable_policies: vec![u.clone()],
                ..SnapshotDelta::default()
            };
            let outcome = mesh().apply(delta);
            assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
            let snapshot = outcome.snapshot;
            let compiled = snapshot.compiled_policy(&name).expect("kept, unreadable");
            assert!(compiled.unreadable_reason().is_some());
            let applies = |w: &Workload| match u.scope.unwrap_or(PolicyScope::Namespace) {
                PolicyScope::Global => true,
                PolicyScope::Namespace => *w.namespace == *u.namespace,
                PolicyScope::WorkloadSelector => {
                    w.authorization_policies.iter().any(|k| *k == name)
                }
            };
            let server = snapshot
                .workload_by_uid("cluster1//v1/Pod/ns1/server")
                .expect("the mesh's workload");
            if applies(server) && !u.dry_run {
                for (conn, _) in probes() {
                    let v = snapshot.authorize(server, &conn, &mut |_| {});
                    assert!(!v.allowed(), "an unreadable policy denies where it applies");
                }
            }
        }
    }
}

/// A converted policy: round trip, compile, decide like the reference.
fn readable(policy: &Policy) {
    let again = convert::decode_authorization_resource(&authorization_resource(policy, "2".into()))
        .expect("a converted policy converts back");
    assert_eq!(again, *policy, "model → wire → model");
    let compiled = Arc::new(CompiledPolicy::compile(policy));
    let listed = [Listed::new(compiled)];
    let (deny, allow): (&[Listed], &[Listed]) = match policy.action {
        PolicyAction::Deny => (&listed, &[]),
        PolicyAction::Allow => (&[], &listed),
    };
    let table: Vec<Arc<CompiledPolicy>> = Vec::new();
    let selected = Selected {
        namespace: ByAction { deny, allow },
        global: ByAction::default(),
        named: &[],
        table: &table,
    };
    for (conn, _) in probes() {
        let verdict = authorize(&selected, &conn, &mut |_| {});
        let (want, _) = reference::authorize(&[policy], &conn);
        assert_eq!(
            verdict.allowed(),
            want.allowed(),
            "compiled and reference disagree"
        );
        assert_eq!(verdict.policy(), want_key(&want).as_deref());
    }
    let delta = SnapshotDelta {
        upsert_policies: vec![policy.clone()],
        ..SnapshotDelta::default()
    };
    let outcome = mesh().apply(delta);
    assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    assert_eq!(
        outcome.snapshot.policy(&policy.key()).map(|p| &**p),
        Some(policy)
    );
}

fn want_key(v: &reference::RefVerdict) -> Option<String> {
    match v {
        reference::RefVerdict::AllowedBy(k) | reference::RefVerdict::DeniedBy(k) => Some(k.clone()),
        _ => None,
    }
}

/// Seeds for [`address`]: the converter tests' kinds of workload and
/// service (the example config's, with waypoints, gateways, application
/// tunnels, CIDR VIPs), encoded as istiod sends them.
pub fn address_seeds() -> Vec<(String, Vec<u8>)> {
    let snapshot = load_snapshot(SEED_MESH, "seeds.yaml").expect("the seed mesh");
    let mut out = Vec::new();
    for w in snapshot.workloads() {
        let msg = wpb::Address {
            r#type: Some(wpb::address::Type::Workload(convert::workload_to_proto(w))),
        };
        out.push((format!("seed-workload-{}", w.name), msg.encode_to_vec()));
    }
    for s in snapshot.services() {
        let msg = wpb::Address {
            r#type: Some(wpb::address::Type::Service(convert::service_to_proto(s))),
        };
        out.push((format!("seed-service-{}", s.name), msg.encode_to_vec()));
    }
    out
}

/// Seeds for [`authorization`]: the seed mesh's policies as istiod sends
/// them, and one the converter refuses (a CIDR longer than IPv4 allows).
pub fn authorization_seeds() -> Vec<(String, Vec<u8>)> {
    let snapshot = load_snapshot(SEED_MESH, "seeds.yaml").expect("the seed mesh");
    let mut out: Vec<(String, Vec<u8>)> = snapshot
        .policies()
        .map(|p| {
            (
                format!("seed-policy-{}", p.name),
                convert::policy_to_proto(p).encode_to_vec(),
            )
        })
        .collect();
    let mut bad = convert::policy_to_proto(snapshot.policies().next().expect("a policy"));
    bad.name = "bad-cidr".into();
    bad.rules = vec![spb::Rule {
        clauses: vec![spb::Clause {
            matches: vec![spb::Match {
                source_ips: vec![spb::Address {
                    address: vec![10, 0, 0, 0].into(),
                    length: 33,
                }],
                ..spb::Match::default()
            }],
        }],
    }];
    out.push(("seed-policy-bad-cidr".into(), bad.encode_to_vec()));
    out
}

/// Real, valid config: every kind of item the converter handles.
pub const SEED_MESH: &str = r#"workloads:
  - uid: cluster1//v1/Pod/ns1/client
    name: client
    namespace: ns1
    serviceAccount: client
    workloadIps: [10.0.0.1]
    protocol: HBONE
    node: node-a
    workloadName: client
    workloadType: Deployment
    canonicalName: client
    canonicalRevision: v1
    locality: {region: r1, zone: z1}
  - uid: cluster1//v1/Pod/ns1/server
    name: server
    namespace: ns1
    serviceAccount: server
    workloadIps: [10.0.0.2, "fd00::2"]
    protocol: HBONE
    node: node-b
    authorizationPolicies: [ns1/allow-client]
    services: {"ns1/echo.ns1.svc.cluster.local": {80: 8080}}
    waypoint: {destination: ns1/waypoint.ns1.svc.cluster.local}
    applicationTunnel: {protocol: PROXY, port: 15088}
  - uid: cluster1//v1/Pod/ns2/legacy
    name: legacy
    namespace: ns2
    workloadIps: [10.0.0.3]
    protocol: TCP
    status: Unhealthy
    networkGateway: {destination: "net1/192.0.2.1", hboneMtlsPort: 15009}
services:
  - name: echo
    namespace: ns1
    hostname: echo.ns1.svc.cluster.local
    vips: [10.96.0.1, "/fd00:96::1"]
    ports: {80: 8080}
    subjectAltNames: ["spiffe://cluster.local/ns/ns1/sa/server"]
    loadBalancer: {routingPreferences: [Network, ZONE], mode: Failover, healthPolicy: AllowAll}
  - name: waypoint
    namespace: ns1
    hostname: waypoint.ns1.svc.cluster.local
    vips: [10.96.0.2]
    ports: {15008: 15008}
policies:
  - name: allow-client
    namespace: ns1
    scope: WorkloadSelector
    action: Allow
    rules:
      - - - principals: [{exact: cluster.local/ns/ns1/sa/client}]
            destinationPorts: [8080]
  - name: deny-outside
    namespace: ns1
    scope: Namespace
    action: Deny
    rules:
      - - - notSourceIps: [10.0.0.0/8, "fd00::/16"]
          - notNamespaces: [{prefix: ns}]
  - name: strict
    namespace: istio-system
    scope: Global
    action: Deny
    dryRun: true
    rules:
      - - - notPrincipals: [{presence: {}}]
"#;
