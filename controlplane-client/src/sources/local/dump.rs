//! A snapshot written back in the local config schema, ztunnel's own
//! (`/config_dump`'s `workloads`, `services` and `policies` are in this
//! shape, as ztunnel's are): what is loaded, in a form the loader reads
//! back unchanged (tested).

use serde_json::{json, Map, Value};

use crate::model::snapshot::Snapshot;
use crate::model::{
    ApplicationTunnelProtocol, Cidr, GatewayAddress, IpFamilies, LbHealthPolicy, LbMode, LbScope,
    Match, NetworkMode, Policy, PolicyAction, PolicyScope, PortMapping, Service, StringMatch,
    TunnelProtocol, Visibility, Workload, WorkloadStatus, WorkloadType,
};

/// `workloads`, `services` (with their `endpoints`) and `policies`, sorted
/// by key so that two dumps of the same config compare equal.
pub fn dump(snap: &Snapshot) -> Value {
    let mut workloads: Vec<_> = snap.workloads().collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut services: Vec<_> = snap.services().collect();
    services.sort_by_key(|s| s.key());
    let mut policies: Vec<_> = snap.policies().collect();
    policies.sort_by_key(|p| p.key());
    json!({
        "workloads": workloads.iter().map(|w| workload(w)).collect::<Vec<_>>(),
        "services": services.iter().map(|s| service(snap, s)).collect::<Vec<_>>(),
        "policies": policies.iter().map(|p| policy(p)).collect::<Vec<_>>(),
    })
}

fn ports(p: &[PortMapping]) -> Value {
    p.iter()
        .map(|m| (m.service_port.to_string(), json!(m.target_port)))
        .collect::<Map<_, _>>()
        .into()
}

fn gateway(g: &GatewayAddress) -> Value {
    json!({ "destination": g.destination.to_string(), "hboneMtlsPort": g.hbone_mtls_port })
}

fn status(s: WorkloadStatus) -> &'static str {
    match s {
        WorkloadStatus::Healthy => "Healthy",
        WorkloadStatus::Unhealthy => "Unhealthy",
    }
}

fn workload(w: &Workload) -> Value {
    let mut o = json!({
        "uid": w.uid,
        "name": w.name,
        "namespace": w.namespace,
        "serviceAccount": w.service_account,
        "trustDomain": w.trust_domain,
        "workloadIps": w.addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "protocol": match w.protocol { TunnelProtocol::Hbone => "HBONE", TunnelProtocol::None => "TCP" },
        "node": w.node,
        "network": w.network,
        "hostname": w.hostname,
        "canonicalName": w.canonical_name,
        "canonicalRevision": w.canonical_revision,
        "workloadName": w.workload_name,
        "workloadType": match w.workload_type {
            WorkloadType::Deployment => "deployment",
            WorkloadType::CronJob => "cronjob",
            WorkloadType::Pod => "pod",
            WorkloadType::Job => "job",
        },
        "status": status(w.status),
        "clusterId": w.cluster_id,
        "networkMode": match w.network_mode {
            NetworkMode::Standard => "Standard",
            NetworkMode::HostNetwork => "HostNetwork",
        },
        "capacity": w.capacity,
        "nativeTunnel": w.native_tunnel,
        "authorizationPolicies": w.authorization_policies,
        "services": w.services.iter().map(|(k, p)| (k.to_string(), ports(p))).collect::<Map<_, _>>(),
    });
    let o = o.as_object_mut().expect("an object");
    if let Some(l) = &w.locality {
        o.insert(
            "locality".into(),
            json!({ "region": l.region, "zone": l.zone, "subzone": l.subzone }),
        );
    }
    if let Some(g) = &w.waypoint {
        o.insert("waypoint".into(), gateway(g));
    }
    if let Some(g) = &w.network_gateway {
        o.insert("networkGateway".into(), gateway(g));
    }
    if let Some(t) = &w.application_tunnel {
        let protocol = match t.protocol {
            ApplicationTunnelProtocol::None => "NONE",
            ApplicationTunnelProtocol::Proxy => "PROXY",
        };
        o.insert(
            "applicationTunnel".into(),
            json!({ "protocol": protocol, "port": t.port }),
        );
    }
    Value::Object(o.clone())
}

fn service(snap: &Snapshot, s: &Service) -> Value {
    let key = s.key();
    let endpoints: Map<_, _> = snap
        .endpoints(&key)
        .iter()
        .map(|w| {
            let port = w.services.get(&key).map_or(json!({}), |p| ports(p));
            (
                w.uid.to_string(),
                json!({ "workloadUid": w.uid, "port": port, "status": status(w.status) }),
            )
        })
        .collect();
    let mut o = json!({
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "vips": s.vips.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        "ports": ports(&s.ports),
        "subjectAltNames": s.subject_alt_names,
        "canonical": s.canonical,
        "endpoints": endpoints,
        "visibility": match s.visibility { Visibility::Public => "Public", Visibility::Namespace => "Namespace" },
        "cidrVips": s.cidr_vips.iter().map(|c| json!({ "network": c.network, "cidr": c.cidr.to_string() })).collect::<Vec<_>>(),
        "weightedWaypoints": s.weighted_waypoints.iter().map(|w| json!({ "destination": gateway(&w.waypoint), "weight": w.weight })).collect::<Vec<_>>(),
    });
    let o = o.as_object_mut().expect("an object");
    if let Some(g) = &s.waypoint {
        o.insert("waypoint".into(), gateway(g));
    }
    if let Some(lb) = &s.load_balancer {
        let scope = |s: &LbScope| match s {
            LbScope::Region => "Region",
            LbScope::Zone => "Zone",
            LbScope::Subzone => "Subzone",
            LbScope::Node => "Node",
            LbScope::Cluster => "Cluster",
            LbScope::Network => "Network",
        };
        o.insert(
            "loadBalancer".into(),
            json!({
                "routingPreferences": lb.routing_preferences.iter().map(scope).collect::<Vec<_>>(),
                "mode": match lb.mode {
                    LbMode::Standard => "Standard",
                    LbMode::Strict => "Strict",
                    LbMode::Failover => "Failover",
                    LbMode::Passthrough => "Passthrough",
                },
                "healthPolicy": match lb.health_policy {
                    LbHealthPolicy::OnlyHealthy => "OnlyHealthy",
                    LbHealthPolicy::AllowAll => "AllowAll",
                },
            }),
        );
    }
    if let Some(f) = s.ip_families {
        let f = match f {
            IpFamilies::Ipv4 => "IPv4",
            IpFamilies::Ipv6 => "IPv6",
            IpFamilies::Dual => "Dual",
        };
        o.insert("ipFamilies".into(), json!(f));
    }
    Value::Object(o.clone())
}

fn policy(p: &Policy) -> Value {
    json!({
        "name": p.name,
        "namespace": p.namespace,
        "scope": match p.scope {
            PolicyScope::Global => "Global",
            PolicyScope::Namespace => "Namespace",
            PolicyScope::WorkloadSelector => "WorkloadSelector",
        },
        "action": match p.action { PolicyAction::Allow => "Allow", PolicyAction::Deny => "Deny" },
        "dryRun": p.dry_run,
        "rules": p.rules.iter().map(|r| {
            r.clauses.iter().map(|c| c.matches.iter().map(matcher).collect::<Vec<_>>()).collect::<Vec<_>>()
        }).collect::<Vec<_>>(),
    })
}

/// One match: only its non-empty fields, as a config would write it.
fn matcher(m: &Match) -> Value {
    let strings = |v: &[StringMatch]| -> Value {
        v.iter()
            .map(|s| match s {
                StringMatch::Exact(x) => json!({ "exact": x }),
                StringMatch::Prefix(x) => json!({ "prefix": x }),
                StringMatch::Suffix(x) => json!({ "suffix": x }),
                StringMatch::Presence => json!({ "presence": {} }),
            })
            .collect::<Vec<_>>()
            .into()
    };
    let accounts = |v: &[crate::model::ServiceAccountMatch]| -> Value {
        v.iter()
            .map(|a| json!({ "namespace": a.namespace, "serviceAccount": a.service_account }))
            .collect::<Vec<_>>()
            .into()
    };
    let cidrs =
        |v: &[Cidr]| -> Value { v.iter().map(|c| c.to_string()).collect::<Vec<_>>().into() };
    let mut o = Map::new();
    let mut put = |k: &str, empty: bool, v: Value| {
        if !empty {
            o.insert(k.into(), v);
        }
    };
    put(
        "namespaces",
        m.namespaces.is_empty(),
        strings(&m.namespaces),
    );
    put(
        "notNamespaces",
        m.not_namespaces.is_empty(),
        strings(&m.not_namespaces),
    );
    put(
        "principals",
        m.principals.is_empty(),
        strings(&m.principals),
    );
    put(
        "notPrincipals",
        m.not_principals.is_empty(),
        strings(&m.not_principals),
    );
    put(
        "serviceAccounts",
        m.service_accounts.is_empty(),
        accounts(&m.service_accounts),
    );
    put(
        "notServiceAccounts",
        m.not_service_accounts.is_empty(),
        accounts(&m.not_service_accounts),
    );
    put("sourceIps", m.source_ips.is_empty(), cidrs(&m.source_ips));
    put(
        "notSourceIps",
        m.not_source_ips.is_empty(),
        cidrs(&m.not_source_ips),
    );
    put(
        "destinationIps",
        m.destination_ips.is_empty(),
        cidrs(&m.destination_ips),
    );
    put(
        "notDestinationIps",
        m.not_destination_ips.is_empty(),
        cidrs(&m.not_destination_ips),
    );
    put(
        "destinationPorts",
        m.destination_ports.is_empty(),
        json!(m.destination_ports),
    );
    put(
        "notDestinationPorts",
        m.not_destination_ports.is_empty(),
        json!(m.not_destination_ports),
    );
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::local::{load_snapshot, EXAMPLE_CONFIG};

    const RICH: &str = r#"
workloads:
- uid: c1//v1/Pod/shop/cart
  name: cart
  namespace: shop
  serviceAccount: cart-sa
  workloadIps: ["10.0.0.1", "fd00::1"]
  protocol: HBONE
  node: n1
  canonicalName: cart
  canonicalRevision: v3
  workloadName: cart
  workloadType: deployment
  status: Unhealthy
  clusterId: c1
  locality: {region: r1, zone: z1, subzone: s1}
  capacity: 3
  authorizationPolicies: [shop/allow-cart]
  waypoint: {destination: shop/wp.shop.svc.cluster.local, hboneMtlsPort: 15008}
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    shop/cart.shop.svc.cluster.local: {80: 8080, 443: 8443}
- uid: c1//v1/Pod/shop/wp
  name: wp
  namespace: shop
  serviceAccount: wp
  workloadIps: ["10.0.0.9"]
  protocol: HBONE
  networkMode: HostNetwork
  services:
    shop/wp.shop.svc.cluster.local: {15008: 15008}
services:
- name: cart
  namespace: shop
  hostname: cart.shop.svc.cluster.local
  vips: ["/10.96.0.1", "net2/10.96.0.2"]
  ports: {80: 8080, 443: 0}
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/cart-sa"]
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  loadBalancer: {routingPreferences: [Region, Zone], mode: Failover, healthPolicy: AllowAll}
  canonical: true
  cidrVips: [{network: "", cidr: "10.97.0.0/16"}]
  ipFamilies: Dual
  visibility: Namespace
- name: wp
  namespace: shop
  hostname: wp.shop.svc.cluster.local
  vips: ["/10.96.0.9"]
  ports: {15008: 15008}
policies:
- name: allow-cart
  namespace: shop
  scope: WorkloadSelector
  action: Allow
  dryRun: true
  rules:
  - - - namespaces: [{exact: shop}, {prefix: "kube-"}]
        notPrincipals: [{presence: {}}, {suffix: "/sa/bad"}]
        serviceAccounts: [{namespace: shop, serviceAccount: front}]
        sourceIps: ["10.0.0.0/8", "fd00::1"]
        notDestinationIps: ["10.1.0.0/16"]
        destinationPorts: [8080]
        notDestinationPorts: [9090]
    - - notNamespaces: [{exact: evil}]
"#;

    /// What is loaded, dumped, loads back as the same config.
    #[test]
    fn a_dump_loads_back_as_the_same_config() {
        for yaml in [EXAMPLE_CONFIG, RICH] {
            let loaded = load_snapshot(yaml, "config.yaml").unwrap();
            let dumped = dump(&loaded);
            let text = serde_json::to_string_pretty(&dumped).unwrap();
            let again = load_snapshot(&text, "dump.json").unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert!(loaded.same_content(&again), "{text}");
            assert_eq!(dump(&again), dumped);
        }
    }

    #[test]
    fn services_list_their_endpoints_as_ztunnel_does() {
        let loaded = load_snapshot(RICH, "config.yaml").unwrap();
        let d = dump(&loaded);
        let cart = &d["services"][0];
        assert_eq!(cart["hostname"], "cart.shop.svc.cluster.local");
        let ep = &cart["endpoints"]["c1//v1/Pod/shop/cart"];
        assert_eq!(ep["workloadUid"], "c1//v1/Pod/shop/cart");
        assert_eq!(ep["port"]["443"], 8443);
        assert_eq!(ep["status"], "Unhealthy");
        assert_eq!(d["workloads"][0]["workloadIps"][1], "fd00::1");
        assert_eq!(
            d["policies"][0]["rules"][0][0][0]["namespaces"][1]["prefix"],
            "kube-"
        );
    }
}
