//! Table tests for [`plan`]: every branch of the decision, no sockets.

use super::*;
use crate::model::{
    ApplicationTunnel, LoadBalancer, Locality, NamespacedHostname, NetworkAddress, PortMapping,
    DEFAULT_HBONE_MTLS_PORT,
};
use std::collections::BTreeMap;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A pod `uid` in namespace "ns" (service account = uid) at `ips`, speaking
/// HBONE, backing `services` ("ns/host" → [(service port, target port)]).
fn pod(uid: &str, ips: &[&str], services: &[(&str, &[(u16, u16)])]) -> Workload {
    Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "ns".into(),
        service_account: uid.into(),
        addresses: ips.iter().map(|a| ip(a)).collect(),
        protocol: TunnelProtocol::Hbone,
        node: "node-a".into(),
        cluster_id: "c1".into(),
        services: services
            .iter()
            .map(|(k, ports)| {
                let ports = ports
                    .iter()
                    .map(|&(service_port, target_port)| PortMapping {
                        service_port,
                        target_port,
                    })
                    .collect();
                (k.to_string(), ports)
            })
            .collect::<BTreeMap<_, _>>()
            .into(),
        ..Workload::default()
    }
}

fn tcp(mut w: Workload) -> Workload {
    w.protocol = TunnelProtocol::None;
    w
}

fn located(mut w: Workload, region: &str, zone: &str, node: &str) -> Workload {
    w.locality = Some(Locality {
        region: region.into(),
        zone: zone.into(),
        subzone: String::new().into(),
    });
    w.node = node.into();
    w
}

/// Service "ns/<host>" at `vip`, service port 80 → target `target`.
fn svc(host: &str, vip: &str, target: u16) -> Service {
    Service {
        name: host.into(),
        namespace: "ns".into(),
        hostname: host.into(),
        vips: vec![NetworkAddress {
            network: String::new().into(),
            ip: ip(vip),
        }],
        ports: vec![PortMapping {
            service_port: 80,
            target_port: target,
        }],
        ..Service::default()
    }
}

fn lb(mode: LbMode, scopes: &[LbScope]) -> Option<LoadBalancer> {
    Some(LoadBalancer {
        routing_preferences: scopes.to_vec(),
        mode,
        health_policy: LbHealthPolicy::OnlyHealthy,
    })
}

fn waypoint_by_host(host: &str) -> Option<GatewayAddress> {
    Some(GatewayAddress {
        destination: GatewayDestination::Hostname(NamespacedHostname {
            namespace: "ns".into(),
            hostname: host.into(),
        }),
        hbone_mtls_port: DEFAULT_HBONE_MTLS_PORT,
    })
}

fn waypoint_at(ip_: &str, port: u16) -> Option<GatewayAddress> {
    Some(GatewayAddress {
        destination: GatewayDestination::Address(NetworkAddress {
            network: String::new().into(),
            ip: ip(ip_),
        }),
        hbone_mtls_port: port,
    })
}

fn snap(workloads: Vec<Workload>, services: Vec<Service>) -> Snapshot {
    Snapshot::new(workloads, services, vec![]).unwrap()
}

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "ns", sa)
}

fn hbone(peer: &str, authority: &str, sa: &str, route: &'static str) -> Result<Plan, PlanError> {
    Ok(Plan::Hbone {
        peer: addr(peer),
        authority: addr(authority),
        identity: id(sa),
        route,
    })
}

fn direct(upstream: &str, route: &'static str) -> Result<Plan, PlanError> {
    Ok(Plan::Direct {
        upstream: addr(upstream),
        route,
    })
}

/// `plan` from `source` (a uid in `s`, or none) to `dst`, with the load
/// balancer's pick fixed at `n`.
fn decide(s: &Snapshot, source: Option<&str>, dst: &str, n: u64) -> Result<Plan, PlanError> {
    let source = source.map(|uid| &**s.workload_by_uid(uid).expect("source workload"));
    let out = Outbound {
        source,
        network: "",
        dst: addr(dst),
        hbone_port: DEFAULT_HBONE_MTLS_PORT,
    };
    plan(s, out, &mut |total| n.min(total - 1))
}

const WEB: &str = "ns/web.ns.svc.cluster.local";

/// The plan for web's VIP through waypoint-1 (see `waypoint_workloads`).
fn via_waypoint() -> Result<Plan, PlanError> {
    hbone(
        "10.0.9.9:15008",
        "10.96.0.10:80",
        "waypoint-1",
        route::SERVICE_WAYPOINT,
    )
}

#[test]
fn addresses_outside_the_mesh_and_plain_workloads_go_direct() {
    let s = snap(
        vec![
            pod("client", &["10.0.0.1"], &[]),
            tcp(pod("legacy", &["10.0.0.2"], &[])),
        ],
        vec![],
    );
    let cases = [
        ("192.0.2.9:443", direct("192.0.2.9:443", route::PASSTHROUGH)),
        ("10.0.0.2:5432", direct("10.0.0.2:5432", route::WORKLOAD)),
        (
            "10.0.0.1:8080",
            hbone("10.0.0.1:15008", "10.0.0.1:8080", "client", route::HBONE),
        ),
    ];
    for (dst, want) in cases {
        assert_eq!(decide(&s, Some("client"), dst, 0), want, "to {dst}");
    }
}

#[test]
fn the_target_port_comes_from_the_endpoint_then_the_service_then_the_dialled_port() {
    let web = "web.ns.svc.cluster.local";
    // (service target port, the endpoint's own ports, expected upstream)
    type Case = (u16, &'static [(u16, u16)], &'static str);
    let cases: [Case; 4] = [
        // The endpoint's own mapping wins (named ports resolve per pod).
        (8080, &[(80, 9090)], "10.0.1.1:9090"),
        // It has none for this port: the service's.
        (8080, &[(443, 9443)], "10.0.1.1:8080"),
        // Its mapping says 0: the service's.
        (8080, &[(80, 0)], "10.0.1.1:8080"),
        // Both say 0: the port dialled.
        (0, &[(80, 0)], "10.0.1.1:80"),
    ];
    for (svc_target, endpoint_ports, want) in cases {
        let s = snap(
            vec![
                pod("client", &["10.0.0.1"], &[]),
                tcp(pod("web-1", &["10.0.1.1"], &[(WEB, endpoint_ports)])),
            ],
            vec![svc(web, "10.96.0.10", svc_target)],
        );
        assert_eq!(
            decide(&s, Some("client"), "10.96.0.10:80", 0),
            direct(want, route::SERVICE),
            "service target {svc_target}, endpoint ports {endpoint_ports:?}"
        );
    }
}

#[test]
fn a_service_port_nobody_maps_has_no_upstream() {
    let s = snap(
        vec![pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)],
    );
    assert_eq!(
        decide(&s, None, "10.96.0.10:443", 0),
        Err(PlanError::NoHealthyUpstream {
            service: WEB.into(),
            port: 443
        })
    );
}

#[test]
fn hbone_endpoints_are_tunnelled_with_the_endpoint_as_authority() {
    let s = snap(
        vec![pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)],
    );
    assert_eq!(
        decide(&s, None, "10.96.0.10:80", 0),
        hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE)
    );
}

#[test]
fn health_policy_and_passthrough_mode_decide_what_happens_without_healthy_endpoints() {
    let mut sick = pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    sick.status = WorkloadStatus::Unhealthy;
    let base = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    let with = |mode: LbMode, health: LbHealthPolicy| Service {
        load_balancer: Some(LoadBalancer {
            routing_preferences: vec![],
            mode,
            health_policy: health,
        }),
        ..base.clone()
    };
    let no_upstream = Err(PlanError::NoHealthyUpstream {
        service: WEB.into(),
        port: 80,
    });
    let cases = [
        (base.clone(), no_upstream.clone()),
        (
            with(LbMode::Standard, LbHealthPolicy::AllowAll),
            hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE),
        ),
        (
            with(LbMode::Passthrough, LbHealthPolicy::OnlyHealthy),
            direct("10.96.0.10:80", route::SERVICE_PASSTHROUGH),
        ),
        (
            with(LbMode::Failover, LbHealthPolicy::OnlyHealthy),
            no_upstream,
        ),
    ];
    for (service, want) in cases {
        let s = snap(vec![sick.clone()], vec![service.clone()]);
        assert_eq!(
            decide(&s, None, "10.96.0.10:80", 0),
            want,
            "{:?}",
            service.load_balancer
        );
    }
}

#[test]
fn capacity_weights_the_choice() {
    let mut big = pod("web-big", &["10.0.1.2"], &[(WEB, &[(80, 8080)])]);
    big.capacity = 3;
    // Endpoints are listed by uid: web-big (weight 3), then web-small (1).
    let s = snap(
        vec![
            big,
            pod("web-small", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]),
        ],
        vec![svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)],
    );
    let chosen: Vec<String> = (0..4)
        .map(|n| match decide(&s, None, "10.96.0.10:80", n) {
            Ok(Plan::Hbone { identity, .. }) => identity.service_account.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(chosen, ["web-big", "web-big", "web-big", "web-small"]);
}

#[test]
fn locality_preferences_by_mode() {
    let here = |w| located(w, "r1", "z1", "node-a");
    let endpoints = vec![
        // Same region and zone, other node.
        located(
            pod("web-a-zone", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]),
            "r1",
            "z1",
            "node-b",
        ),
        // Same region, other zone.
        located(
            pod("web-b-region", &["10.0.1.2"], &[(WEB, &[(80, 8080)])]),
            "r1",
            "z2",
            "node-c",
        ),
        // Elsewhere.
        located(
            pod("web-c-far", &["10.0.1.3"], &[(WEB, &[(80, 8080)])]),
            "r2",
            "z9",
            "node-d",
        ),
    ];
    let mut workloads = endpoints.clone();
    workloads.push(here(pod("client", &["10.0.0.1"], &[])));
    let with = |mode, scopes: &[LbScope]| Service {
        load_balancer: lb(mode, scopes),
        ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
    };
    use LbScope::*;
    // (service, pick, expected endpoint or None for no upstream)
    let cases: Vec<(Service, u64, Option<&str>)> = vec![
        // FAILOVER: the longest run of matching scopes wins.
        (
            with(LbMode::Failover, &[Region, Zone]),
            0,
            Some("web-a-zone"),
        ),
        (
            with(LbMode::Failover, &[Region, Zone]),
            9,
            Some("web-a-zone"),
        ),
        (with(LbMode::Failover, &[Region]), 0, Some("web-a-zone")),
        (with(LbMode::Failover, &[Region]), 1, Some("web-b-region")),
        (with(LbMode::Failover, &[Region]), 9, Some("web-b-region")),
        // Nobody on this node: FAILOVER falls back to everyone...
        (with(LbMode::Failover, &[Node]), 2, Some("web-c-far")),
        // ... STRICT refuses.
        (with(LbMode::Strict, &[Node]), 0, None),
        (with(LbMode::Strict, &[Region, Zone]), 9, Some("web-a-zone")),
        (
            with(LbMode::Strict, &[Cluster, Network]),
            2,
            Some("web-c-far"),
        ),
        // Without a mode the preferences are ignored.
        (
            with(LbMode::Standard, &[Region, Zone]),
            2,
            Some("web-c-far"),
        ),
    ];
    for (service, n, want) in cases {
        let s = snap(workloads.clone(), vec![service.clone()]);
        let got = decide(&s, Some("client"), "10.96.0.10:80", n);
        let got = match got {
            Ok(Plan::Hbone { identity, .. }) => Some(identity.service_account),
            Err(PlanError::NoHealthyUpstream { .. }) => None,
            other => panic!("{other:?}"),
        };
        assert_eq!(got.as_deref(), want, "{:?} pick {n}", service.load_balancer);
    }
}

#[test]
fn strict_locality_without_a_known_source_refuses() {
    let s = snap(
        vec![pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![Service {
            load_balancer: lb(LbMode::Strict, &[LbScope::Region]),
            ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
        }],
    );
    assert!(matches!(
        decide(&s, None, "10.96.0.10:80", 0),
        Err(PlanError::NoHealthyUpstream { .. })
    ));
}

/// A waypoint deployment: service "waypoint" (VIP 10.96.0.99) with one
/// instance at 10.0.9.9.
fn waypoint_workloads() -> (Workload, Service) {
    let wp = pod(
        "waypoint-1",
        &["10.0.9.9"],
        &[("ns/waypoint.ns.svc.cluster.local", &[(15008, 15008)])],
    );
    let mut s = svc("waypoint.ns.svc.cluster.local", "10.96.0.99", 15008);
    s.ports[0].service_port = 15008;
    (wp, s)
}

#[test]
fn a_service_with_a_waypoint_is_reached_through_it_with_the_vip_as_authority() {
    let (wp, wp_svc) = waypoint_workloads();
    let web_pod = pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    let cases = [
        (
            waypoint_by_host("waypoint.ns.svc.cluster.local"),
            "10.0.9.9:15008",
        ),
        // By VIP of the waypoint's service.
        (waypoint_at("10.96.0.99", 15008), "10.0.9.9:15008"),
        // By the instance's own address, on a custom HBONE port.
        (waypoint_at("10.0.9.9", 15009), "10.0.9.9:15009"),
    ];
    for (gw, peer) in cases {
        let web = Service {
            waypoint: gw.clone(),
            ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
        };
        let s = snap(
            vec![
                pod("client", &["10.0.0.1"], &[]),
                web_pod.clone(),
                wp.clone(),
            ],
            vec![web, wp_svc.clone()],
        );
        assert_eq!(
            decide(&s, Some("client"), "10.96.0.10:80", 0),
            hbone(peer, "10.96.0.10:80", "waypoint-1", route::SERVICE_WAYPOINT),
            "{gw:?}"
        );
        // The waypoint itself, forwarding what it processed, goes to the
        // endpoint.
        assert_eq!(
            decide(&s, Some("waypoint-1"), "10.96.0.10:80", 0),
            hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE),
            "{gw:?} from the waypoint"
        );
    }
}

#[test]
fn a_service_waypoint_is_used_even_without_endpoints() {
    let (wp, wp_svc) = waypoint_workloads();
    let web = Service {
        waypoint: waypoint_by_host("waypoint.ns.svc.cluster.local"),
        ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
    };
    let s = snap(vec![wp], vec![web, wp_svc]);
    assert_eq!(decide(&s, None, "10.96.0.10:80", 0), via_waypoint());
}

#[test]
fn an_unreachable_waypoint_refuses_rather_than_bypassing_it() {
    let (wp, wp_svc) = waypoint_workloads();
    let mut sick = wp.clone();
    sick.status = WorkloadStatus::Unhealthy;
    let web_pod = pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    let cases: Vec<(Option<GatewayAddress>, Vec<Workload>, &str)> = vec![
        (
            waypoint_by_host("missing.ns.svc.cluster.local"),
            vec![wp.clone()],
            "no such service",
        ),
        (
            waypoint_by_host("waypoint.ns.svc.cluster.local"),
            vec![sick],
            "its service has no healthy instance on this network",
        ),
        (
            waypoint_at("10.0.77.7", 15008),
            vec![wp.clone()],
            "no workload or service has its address",
        ),
        (
            waypoint_at("10.0.9.9", 15008),
            vec![tcp(wp.clone())],
            "it does not speak HBONE",
        ),
    ];
    for (gw, mut workloads, why) in cases {
        workloads.push(web_pod.clone());
        let web = Service {
            waypoint: gw.clone(),
            ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
        };
        let s = snap(workloads, vec![web, wp_svc.clone()]);
        match decide(&s, None, "10.96.0.10:80", 0) {
            Err(PlanError::WaypointUnavailable { why: got, of, .. }) => {
                assert_eq!(got, why, "{gw:?}");
                assert_eq!(of, WEB);
            }
            other => panic!("{gw:?}: {other:?}"),
        }
    }
}

#[test]
fn a_workload_waypoint_applies_when_the_workload_is_addressed_directly() {
    let (wp, wp_svc) = waypoint_workloads();
    let mut web_pod = pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    web_pod.waypoint = (waypoint_by_host("waypoint.ns.svc.cluster.local")).map(Box::new);
    let s = snap(
        vec![pod("client", &["10.0.0.1"], &[]), web_pod, wp],
        vec![svc("web.ns.svc.cluster.local", "10.96.0.10", 8080), wp_svc],
    );
    let cases = [
        // Addressed directly: through its waypoint, the pod as authority.
        (
            "client",
            "10.0.1.1:8080",
            hbone(
                "10.0.9.9:15008",
                "10.0.1.1:8080",
                "waypoint-1",
                route::WORKLOAD_WAYPOINT,
            ),
        ),
        // From the waypoint itself: straight to the pod.
        (
            "waypoint-1",
            "10.0.1.1:8080",
            hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE),
        ),
        // Through a service without a waypoint: the workload's waypoint is
        // not consulted (ztunnel's step 6 is for workload addresses only).
        (
            "client",
            "10.96.0.10:80",
            hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE),
        ),
    ];
    for (src, dst, want) in cases {
        assert_eq!(decide(&s, Some(src), dst, 0), want, "{src} → {dst}");
    }
}

#[test]
fn endpoints_on_other_networks_are_skipped_or_refused_never_dialled() {
    let mut remote = pod("web-remote", &["10.8.1.1"], &[(WEB, &[(80, 8080)])]);
    remote.network = "net-2".into();
    let local = pod("web-local", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    let service = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    // Both: the local one, whatever the pick.
    let s = snap(vec![remote.clone(), local], vec![service.clone()]);
    for n in 0..2 {
        assert_eq!(
            decide(&s, None, "10.96.0.10:80", n),
            hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-local", route::HBONE)
        );
    }
    // Only the remote one: refused, naming its network.
    let s = snap(vec![remote], vec![service]);
    assert_eq!(
        decide(&s, None, "10.96.0.10:80", 0),
        Err(PlanError::RemoteNetwork {
            service: WEB.into(),
            network: "net-2".into()
        })
    );
}

#[test]
fn the_endpoint_address_follows_the_family_dialled() {
    let dual = pod("web-1", &["10.0.1.1", "fd00::1:1"], &[(WEB, &[(80, 8080)])]);
    let mut service = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    service.vips.push(NetworkAddress {
        network: String::new().into(),
        ip: ip("fd00::96:10"),
    });
    let s = snap(vec![dual], vec![service]);
    assert_eq!(
        decide(&s, None, "[fd00::96:10]:80", 0),
        hbone(
            "[fd00::1:1]:15008",
            "[fd00::1:1]:8080",
            "web-1",
            route::HBONE
        )
    );
    assert_eq!(
        decide(&s, None, "10.96.0.10:80", 0),
        hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE)
    );
}

#[test]
fn a_cidr_vip_routes_like_a_vip_and_goes_with_its_service() {
    let mut service = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    service.cidr_vips = vec![crate::model::NetworkCidr {
        network: String::new().into(),
        cidr: crate::model::Cidr::new(ip("10.200.0.0"), 16).unwrap(),
    }];
    let s = snap(
        vec![pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![service],
    );
    assert_eq!(
        decide(&s, None, "10.200.7.7:80", 0),
        hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE)
    );
    assert_eq!(
        decide(&s, None, "10.201.0.1:80", 0),
        direct("10.201.0.1:80", route::PASSTHROUGH)
    );
    // Removing the service removes its range.
    let gone = s
        .apply(crate::model::snapshot::SnapshotDelta {
            remove_services: vec![WEB.into()],
            ..Default::default()
        })
        .snapshot;
    assert_eq!(
        decide(&gone, None, "10.200.7.7:80", 0),
        direct("10.200.7.7:80", route::PASSTHROUGH)
    );
}

#[test]
fn waypoint_identities_are_those_of_its_instances() {
    let (wp, wp_svc) = waypoint_workloads();
    let s = snap(vec![wp, pod("client", &["10.0.0.1"], &[])], vec![wp_svc]);
    let cases = [
        (
            waypoint_by_host("waypoint.ns.svc.cluster.local"),
            "waypoint-1",
            true,
        ),
        (
            waypoint_by_host("waypoint.ns.svc.cluster.local"),
            "client",
            false,
        ),
        (waypoint_at("10.96.0.99", 15008), "waypoint-1", true),
        (waypoint_at("10.0.9.9", 15008), "waypoint-1", true),
        (waypoint_at("10.0.9.9", 15008), "client", false),
        (
            waypoint_by_host("missing.ns.svc.cluster.local"),
            "waypoint-1",
            false,
        ),
    ];
    for (gw, sa, want) in cases {
        let gw = gw.unwrap();
        assert_eq!(
            is_waypoint_identity(&s, "", &gw, &id(sa)),
            want,
            "{gw:?} {sa}"
        );
    }
}

#[test]
fn a_hostname_authority_names_a_service_the_local_workload_backs() {
    let mut other_ns = svc("web.ns.svc.cluster.local", "10.96.0.20", 7070);
    other_ns.namespace = "other".into();
    let local = pod(
        "web-1",
        &["10.0.1.1"],
        &[
            (WEB, &[(80, 9090)]),
            ("other/web.ns.svc.cluster.local", &[]),
        ],
    );
    let s = snap(
        vec![local.clone()],
        vec![
            svc("web.ns.svc.cluster.local", "10.96.0.10", 8080),
            other_ns,
        ],
    );
    let host = "web.ns.svc.cluster.local";
    // Its own namespace's service first, the pod's own port mapping first.
    assert_eq!(inbound_service_port(&s, &local, host, 80), Some(9090));
    // A port neither maps.
    assert_eq!(inbound_service_port(&s, &local, host, 81), None);
    // A service it does not back.
    assert_eq!(inbound_service_port(&s, &local, "nope.ns.svc", 80), None);
    // Only the other namespace's service backed: its target port.
    let mut elsewhere = local.clone();
    elsewhere.services = [("other/web.ns.svc.cluster.local".to_string(), vec![])]
        .into_iter()
        .collect();
    assert_eq!(inbound_service_port(&s, &elsewhere, host, 80), Some(7070));
}

#[test]
fn passthrough_services_go_to_the_original_destination_even_with_endpoints() {
    let s = snap(
        vec![pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![Service {
            load_balancer: lb(LbMode::Passthrough, &[]),
            ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
        }],
    );
    assert_eq!(
        decide(&s, None, "10.96.0.10:80", 0),
        direct("10.96.0.10:80", route::SERVICE_PASSTHROUGH)
    );
}

#[test]
fn capacity_zero_is_never_chosen() {
    let mut drained = pod("web-a", &["10.0.1.1"], &[(WEB, &[(80, 8080)])]);
    drained.capacity = 0;
    let service = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    let s = snap(
        vec![
            drained.clone(),
            pod("web-b", &["10.0.1.2"], &[(WEB, &[(80, 8080)])]),
        ],
        vec![service.clone()],
    );
    for n in 0..3 {
        assert_eq!(
            decide(&s, None, "10.96.0.10:80", n),
            hbone("10.0.1.2:15008", "10.0.1.2:8080", "web-b", route::HBONE)
        );
    }
    let s = snap(vec![drained], vec![service]);
    assert!(matches!(
        decide(&s, None, "10.96.0.10:80", 0),
        Err(PlanError::NoHealthyUpstream { .. })
    ));
}

#[test]
fn weighted_waypoints_are_used_when_no_single_waypoint_is_given() {
    let (wp, wp_svc) = waypoint_workloads();
    let web = Service {
        weighted_waypoints: vec![crate::model::WeightedWaypoint {
            waypoint: waypoint_by_host("waypoint.ns.svc.cluster.local").unwrap(),
            weight: 5,
        }],
        ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
    };
    let s = snap(
        vec![wp, pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![web, wp_svc],
    );
    assert_eq!(decide(&s, None, "10.96.0.10:80", 0), via_waypoint());
}

#[test]
fn a_waypoint_source_without_addresses_does_not_panic() {
    let (mut wp, wp_svc) = waypoint_workloads();
    wp.addresses = Box::default();
    let web = Service {
        waypoint: waypoint_by_host("waypoint.ns.svc.cluster.local"),
        ..svc("web.ns.svc.cluster.local", "10.96.0.10", 8080)
    };
    let s = snap(
        vec![wp, pod("web-1", &["10.0.1.1"], &[(WEB, &[(80, 8080)])])],
        vec![web, wp_svc],
    );
    // From the waypoint (found by uid, as dedicated mode finds it): to the
    // endpoint.
    assert_eq!(
        decide(&s, Some("waypoint-1"), "10.96.0.10:80", 0),
        hbone("10.0.1.1:15008", "10.0.1.1:8080", "web-1", route::HBONE)
    );
    // From anyone else: no instance with an address to go to.
    assert!(matches!(
        decide(&s, None, "10.96.0.10:80", 0),
        Err(PlanError::WaypointUnavailable { .. })
    ));
}

#[test]
fn inbound_streams_go_to_the_dialled_workload_with_its_app_tunnel_and_sandwich_exceptions() {
    let (wp, wp_svc) = waypoint_workloads();
    let mut web = svc("web.ns.svc.cluster.local", "10.96.0.10", 8080);
    web.waypoint = waypoint_by_host("waypoint.ns.svc.cluster.local");
    let mut db = pod("db", &["10.0.0.3"], &[]);
    db.waypoint = (waypoint_at("10.0.9.9", 15008)).map(Box::new);
    let plain = pod("plain", &["10.0.0.4"], &[]);
    let mut tunnelled = pod("tunnelled", &["10.0.0.5"], &[]);
    tunnelled.application_tunnel = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: Some(15088),
    });
    let mut port_only = pod("port-only", &["10.0.0.6"], &[]);
    port_only.application_tunnel = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::None,
        port: None,
    });
    let s = snap(vec![wp, db, plain, tunnelled, port_only], vec![wp_svc, web]);
    let up = |local: &str, dialled: &str, target: &str| {
        let local = &**s.workload_by_uid(local).unwrap();
        inbound_upstream(&s, "", local, ip(dialled), addr(target))
    };
    let to = |a: &str, proxy_protocol: bool| {
        Ok(InboundUpstream {
            addr: addr(a),
            proxy_protocol,
        })
    };
    // The usual case: the target is the dialled workload.
    assert_eq!(
        up("plain", "10.0.0.4", "10.0.0.4:8080"),
        to("10.0.0.4:8080", false)
    );
    // Another IP: 400, unless one of the exceptions holds.
    let err = up("plain", "10.0.0.4", "10.0.0.3:8080").unwrap_err();
    assert_eq!(
        err.to_string(),
        "authority IP 10.0.0.3 is not the connection's destination 10.0.0.4, which is neither \
         an application-tunnel workload nor a waypoint of 10.0.0.3"
    );
    // A sandwiched waypoint takes streams for the services and workloads
    // it is the waypoint of, on its own address and the target port.
    assert_eq!(
        up("waypoint-1", "10.0.9.9", "10.96.0.10:80"),
        to("10.0.9.9:80", false)
    );
    assert_eq!(
        up("waypoint-1", "10.0.9.9", "10.0.0.3:5432"),
        to("10.0.9.9:5432", false)
    );
    assert!(
        up("waypoint-1", "10.0.9.9", "10.0.0.4:80").is_err(),
        "not its waypoint"
    );
    // An application tunnel: any target, to its port, behind PROXY.
    assert_eq!(
        up("tunnelled", "10.0.0.5", "10.96.0.10:80"),
        to("10.0.0.5:15088", true)
    );
    assert_eq!(
        up("tunnelled", "10.0.0.5", "10.0.0.5:9000"),
        to("10.0.0.5:15088", true)
    );
    // A tunnel without protocol or port: the target port, no header.
    assert_eq!(
        up("port-only", "10.0.0.6", "10.0.0.3:9000"),
        to("10.0.0.6:9000", false)
    );
}
