use super::*;
use ringway_proto::discovery::Resource;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn full_workload() -> Workload {
    Workload {
        uid: "cluster1//v1/Pod/shop/cart-1".into(),
        name: "cart-1".into(),
        namespace: "shop".into(),
        service_account: "cart".into(),
        trust_domain: "example.org".into(),
        addresses: vec![ip("10.0.0.5"), ip("fd00::5")].into(),
        hostname: "cart-1.shop".into(),
        network: "net1".into(),
        protocol: TunnelProtocol::Hbone,
        node: "node-a".into(),
        canonical_name: "cart".into(),
        canonical_revision: "v2".into(),
        workload_name: "cart".into(),
        workload_type: WorkloadType::Pod,
        status: WorkloadStatus::Unhealthy,
        cluster_id: "cluster1".into(),
        authorization_policies: vec!["shop/allow-cart".into()].into(),
        services: [(
            "shop/cart.shop.svc.cluster.local".to_string(),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        )]
        .into_iter()
        .collect(),
        locality: Some(Locality {
            region: "r".into(),
            zone: "z".into(),
            subzone: "s".into(),
        }),
        network_mode: NetworkMode::Standard,
        capacity: 3,
        waypoint: Some(Box::new(GatewayAddress {
            destination: GatewayDestination::Hostname(NamespacedHostname {
                namespace: "shop".into(),
                hostname: "waypoint.shop.svc.cluster.local".into(),
            }),
            hbone_mtls_port: 15008,
        })),
        network_gateway: Some(Box::new(GatewayAddress {
            destination: GatewayDestination::Address(NetworkAddress {
                network: "net2".into(),
                ip: ip("192.0.2.9"),
            }),
            hbone_mtls_port: 15009,
        })),
        native_tunnel: true,
        application_tunnel: Some(ApplicationTunnel {
            protocol: ApplicationTunnelProtocol::Proxy,
            port: Some(15088),
        }),
    }
}

fn full_service() -> Service {
    Service {
        name: "cart".into(),
        namespace: "shop".into(),
        hostname: "cart.shop.svc.cluster.local".into(),
        vips: vec![
            NetworkAddress {
                network: "".into(),
                ip: ip("10.96.0.10"),
            },
            NetworkAddress {
                network: "net2".into(),
                ip: ip("fd00:96::10"),
            },
        ],
        ports: vec![
            PortMapping {
                service_port: 80,
                target_port: 8080,
            },
            PortMapping {
                service_port: 443,
                target_port: 0,
            },
        ],
        subject_alt_names: vec!["spiffe://example.org/ns/shop/sa/cart".into()],
        waypoint: None,
        load_balancer: Some(LoadBalancer {
            routing_preferences: vec![LbScope::Network, LbScope::Zone],
            mode: LbMode::Failover,
            health_policy: LbHealthPolicy::AllowAll,
        }),
        canonical: true,
        cidr_vips: vec![NetworkCidr {
            network: "net2".into(),
            cidr: Cidr::new(ip("10.97.0.0"), 16).unwrap(),
        }],
        weighted_waypoints: vec![WeightedWaypoint {
            waypoint: GatewayAddress {
                destination: GatewayDestination::Hostname(NamespacedHostname {
                    namespace: "shop".into(),
                    hostname: "wp.shop.svc.cluster.local".into(),
                }),
                hbone_mtls_port: 15009,
            },
            weight: 3,
        }],
        ip_families: Some(IpFamilies::Dual),
        visibility: Visibility::Namespace,
    }
}

fn full_policy() -> Policy {
    Policy {
        name: "allow-cart".into(),
        namespace: "shop".into(),
        scope: PolicyScope::WorkloadSelector,
        action: PolicyAction::Deny,
        dry_run: true,
        rules: vec![Rule {
            clauses: vec![
                Clause {
                    matches: vec![Match {
                        namespaces: vec![StringMatch::Exact("shop".into())],
                        not_namespaces: vec![StringMatch::Prefix("kube-".into())],
                        principals: vec![StringMatch::Suffix("/sa/web".into())],
                        not_principals: vec![StringMatch::Presence],
                        service_accounts: vec![ServiceAccountMatch {
                            namespace: "shop".into(),
                            service_account: "web".into(),
                        }],
                        not_service_accounts: vec![],
                        source_ips: vec![Cidr::new(ip("10.1.0.0"), 16).unwrap()],
                        not_source_ips: vec![Cidr::host(ip("10.1.2.3"))],
                        destination_ips: vec![Cidr::new(ip("fd00::"), 8).unwrap()],
                        not_destination_ips: vec![],
                        destination_ports: vec![8080],
                        not_destination_ports: vec![9999],
                    }],
                },
                Clause { matches: vec![] },
            ],
        }],
    }
}

#[test]
fn workload_round_trip() {
    let w = full_workload();
    let back = workload_from_proto(workload_to_proto(&w)).unwrap();
    assert_eq!(back, w);
}

#[test]
fn service_round_trip() {
    let s = full_service();
    assert_eq!(service_from_proto(service_to_proto(&s)).unwrap(), s);
}

#[test]
fn policy_round_trip() {
    let p = full_policy();
    assert_eq!(policy_from_proto(policy_to_proto(&p)).unwrap(), p);
}

#[test]
fn resource_envelopes_round_trip_with_aliases() {
    let item = AddressResource::Workload(full_workload());
    let res = address_resource(&item, "v1".into());
    assert_eq!(res.name, "cluster1//v1/Pod/shop/cart-1");
    assert_eq!(res.aliases, ["net1/10.0.0.5", "net1/fd00::5"]);
    assert_eq!(res.version, "v1");
    assert_eq!(decode_address_resource(&res).unwrap(), item);

    let svc = AddressResource::Service(full_service());
    let res = address_resource(&svc, "v2".into());
    assert_eq!(res.name, "shop/cart.shop.svc.cluster.local");
    assert_eq!(res.aliases, ["/10.96.0.10", "net2/fd00:96::10"]);
    assert_eq!(decode_address_resource(&res).unwrap(), svc);

    let res = authorization_resource(&full_policy(), "v3".into());
    assert_eq!(res.name, "shop/allow-cart");
    assert_eq!(decode_authorization_resource(&res).unwrap(), full_policy());
}

#[test]
fn defaults_for_empty_fields() {
    let w = workload_from_proto(wpb::Workload {
        uid: "u".into(),
        name: "n".into(),
        namespace: "ns".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.service_account, "default");
    assert_eq!(w.capacity, 1, "absent capacity means 1");
    assert_eq!(w.protocol, TunnelProtocol::None);

    let w = workload_from_proto(wpb::Workload {
        uid: "u".into(),
        name: "n".into(),
        namespace: "ns".into(),
        capacity: Some(0),
        waypoint: Some(wpb::GatewayAddress {
            destination: Some(wpb::gateway_address::Destination::Hostname(
                wpb::NamespacedHostname {
                    namespace: "ns".into(),
                    hostname: "wp".into(),
                },
            )),
            hbone_mtls_port: 0,
        }),
        application_tunnel: Some(wpb::ApplicationTunnel {
            protocol: 1,
            port: 0,
        }),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(w.capacity, 0, "an explicit capacity is kept");
    assert_eq!(w.waypoint.unwrap().hbone_mtls_port, 15008);
    assert_eq!(w.application_tunnel.unwrap().port, None);
}

fn base_workload() -> wpb::Workload {
    workload_to_proto(&Workload {
        uid: "u".into(),
        name: "n".into(),
        namespace: "ns".into(),
        ..Workload::default()
    })
}

fn workload_err(w: wpb::Workload) -> String {
    workload_from_proto(w).unwrap_err().to_string()
}

#[test]
fn workload_errors_name_the_field() {
    let mut w = base_workload();
    w.addresses = vec![
        Bytes::from_static(&[10, 0, 0, 1]),
        Bytes::from_static(&[1, 2, 3, 4, 5]),
    ];
    assert_eq!(
        workload_err(w),
        "addresses[1]: IP address must be 4 or 16 bytes, got 5"
    );

    let mut w = base_workload();
    w.tunnel_protocol = wpb::TunnelProtocol::LegacyIstioMtls as i32;
    assert_eq!(
        workload_err(w),
        "tunnel_protocol: LEGACY_ISTIO_MTLS is not supported"
    );

    let mut w = base_workload();
    w.tunnel_protocol = 42;
    assert_eq!(workload_err(w), "tunnel_protocol: unknown enum value 42");

    let mut w = base_workload();
    w.status = 7;
    assert_eq!(workload_err(w), "status: unknown enum value 7");

    let mut w = base_workload();
    w.network_mode = 7;
    assert!(workload_err(w).starts_with("network_mode:"));

    let mut w = base_workload();
    w.uid.clear();
    assert_eq!(workload_err(w), "uid is empty");

    let mut w = base_workload();
    w.namespace.clear();
    assert_eq!(workload_err(w), "namespace is empty");

    let mut w = base_workload();
    w.waypoint = Some(wpb::GatewayAddress {
        destination: None,
        hbone_mtls_port: 15008,
    });
    assert_eq!(
        workload_err(w),
        "waypoint: no destination (neither hostname nor address)"
    );

    let mut w = base_workload();
    w.network_gateway = Some(wpb::GatewayAddress {
        destination: Some(wpb::gateway_address::Destination::Address(
            wpb::NetworkAddress {
                network: "".into(),
                address: Bytes::from_static(&[1, 2, 3]),
                length: None,
            },
        )),
        hbone_mtls_port: 70000,
    });
    assert_eq!(
        workload_err(w),
        "network_gateway: address: IP address must be 4 or 16 bytes, got 3"
    );

    let mut w = base_workload();
    w.services.insert(
        "ns/svc".into(),
        wpb::PortList {
            ports: vec![wpb::Port {
                service_port: 80,
                target_port: 70000,
                app_protocol: 0,
            }],
        },
    );
    assert_eq!(
        workload_err(w),
        "services[\"ns/svc\"]: [0]: target_port: port 70000 is out of range"
    );

    let mut w = base_workload();
    w.services
        .insert("no-slash".into(), wpb::PortList::default());
    assert!(workload_err(w).starts_with("services: key \"no-slash\""));

    // Telemetry-only enum: unknown values fall back.
    let mut w = base_workload();
    w.workload_type = 99;
    assert_eq!(
        workload_from_proto(w).unwrap().workload_type,
        WorkloadType::Deployment
    );
}

#[test]
fn service_checks() {
    let mut s = service_to_proto(&full_service());
    s.hostname.clear();
    assert_eq!(
        service_from_proto(s).unwrap_err().to_string(),
        "hostname is empty"
    );

    let mut s = service_to_proto(&full_service());
    s.load_balancing.as_mut().unwrap().mode = 17;
    assert_eq!(
        service_from_proto(s).unwrap_err().to_string(),
        "load_balancing: mode: unknown enum value 17"
    );

    let mut s = service_to_proto(&full_service());
    s.ports[0].service_port = 0;
    assert_eq!(
        service_from_proto(s).unwrap_err().to_string(),
        "ports: [0]: service_port is 0"
    );

    // A short prefix is a CIDR VIP, a host-length one a VIP, a too-long
    // one refused.
    let mut s = service_to_proto(&full_service());
    s.addresses[0].length = Some(24);
    s.addresses[1].length = Some(128);
    let parsed = service_from_proto(s).unwrap();
    assert_eq!(parsed.vips.len(), 1);
    assert_eq!(parsed.vips[0].ip, ip("fd00:96::10"));
    assert_eq!(
        parsed.cidr_vips[0],
        NetworkCidr {
            network: "".into(),
            cidr: Cidr::new(ip("10.96.0.10"), 24).unwrap()
        }
    );
    let mut s = service_to_proto(&full_service());
    s.visibility = 9;
    assert_eq!(
        service_from_proto(s).unwrap_err().to_string(),
        "visibility: unknown enum value 9"
    );
    let mut s = service_to_proto(&full_service());
    s.addresses[0].length = Some(33);
    assert_eq!(
        service_from_proto(s).unwrap_err().to_string(),
        "addresses[0]: prefix length 33 exceeds 32"
    );

    // Unspecified scopes are dropped from the preferences.
    let mut s = service_to_proto(&full_service());
    s.load_balancing.as_mut().unwrap().routing_preference = vec![0, 2];
    assert_eq!(
        service_from_proto(s)
            .unwrap()
            .load_balancer
            .unwrap()
            .routing_preferences,
        [LbScope::Zone]
    );
}

#[test]
fn policy_checks() {
    let mut p = policy_to_proto(&full_policy());
    p.action = 5;
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "action: unknown enum value 5"
    );

    let mut p = policy_to_proto(&full_policy());
    p.scope = 9;
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "scope: unknown enum value 9"
    );

    let mut p = policy_to_proto(&full_policy());
    p.rules[0].clauses[0].matches[0].source_ips[0].length = 33;
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "rules[0].clauses[0].matches[0]: source_ips[0]: prefix length 33 exceeds 32"
    );

    let mut p = policy_to_proto(&full_policy());
    p.rules[0].clauses[0].matches[0].principals[0].match_type = None;
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "rules[0].clauses[0].matches[0]: principals[0]: string match has no value"
    );

    let mut p = policy_to_proto(&full_policy());
    p.rules[0].clauses[0].matches[0].destination_ips[0].address = Bytes::from_static(&[0; 7]);
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "rules[0].clauses[0].matches[0]: destination_ips[0]: IP address must be 4 or 16 bytes, got 7"
    );

    let mut p = policy_to_proto(&full_policy());
    p.name.clear();
    assert_eq!(
        policy_from_proto(p).unwrap_err().to_string(),
        "name is empty"
    );
}

#[test]
fn malformed_envelopes() {
    let garbage = Resource {
        name: "x".into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: vec![0xff, 0xff, 0xff, 0xff, 0x0f],
        }),
        ..Resource::default()
    };
    let err = decode_address_resource(&garbage).unwrap_err().to_string();
    assert!(
        err.starts_with("undecodable istio.workload.Address"),
        "{err}"
    );

    let wrong_type = Resource {
        name: "x".into(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE_URL.into(),
            value: vec![],
        }),
        ..Resource::default()
    };
    assert!(decode_address_resource(&wrong_type)
        .unwrap_err()
        .to_string()
        .contains("does not match the subscribed type"));

    let empty = Resource {
        name: "x".into(),
        ..Resource::default()
    };
    assert_eq!(
        decode_address_resource(&empty).unwrap_err().to_string(),
        "resource has no payload"
    );

    let neither = Resource {
        name: "x".into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: vec![],
        }),
        ..Resource::default()
    };
    assert_eq!(
        decode_address_resource(&neither).unwrap_err().to_string(),
        "Address holds neither a workload nor a service"
    );
}

#[test]
fn host_network_workloads_have_no_aliases() {
    let mut w = full_workload();
    w.network_mode = NetworkMode::HostNetwork;
    assert!(workload_aliases(&w).is_empty());
    assert_eq!(address_key("", ip("10.0.0.1")), "/10.0.0.1");
}

/// istiod's policy for STRICT PeerAuthentication, built the way it sends
/// it (a WORKLOAD_SELECTOR DENY in the root namespace whose only match is
/// `not_principals: [presence]`), decodes into a policy that refuses
/// plaintext and admits any mTLS peer.
#[test]
fn istiods_strict_policy_refuses_plaintext() {
    use crate::model::authz::{authorize, ByAction, CompiledPolicy, Conn, Selected};
    let wire = spb::Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: spb::Scope::WorkloadSelector as i32,
        action: spb::Action::Deny as i32,
        rules: vec![spb::Rule {
            clauses: vec![spb::Clause {
                matches: vec![spb::Match {
                    not_principals: vec![spb::StringMatch {
                        match_type: Some(spb::string_match::MatchType::Presence(())),
                    }],
                    ..spb::Match::default()
                }],
            }],
        }],
        ..spb::Authorization::default()
    };
    let res = authorization_resource(&policy_from_proto(wire).unwrap(), "1".into());
    let policy = decode_authorization_resource(&res).unwrap();
    assert_eq!(policy.key(), "istio-system/istio_converted_static_strict");
    let compiled = vec![std::sync::Arc::new(CompiledPolicy::compile(&policy))];
    let named: Vec<crate::model::Str> = vec![policy.key().into()];
    let selected = Selected {
        namespace: ByAction::default(),
        global: ByAction::default(),
        named: &named,
        table: &compiled,
    };
    let peer: crate::model::identity::Identity =
        "spiffe://cluster.local/ns/a/sa/alice".parse().unwrap();
    let conn = |peer| Conn {
        src: ip("10.0.0.1"),
        dst: "10.0.0.2:8080".parse().unwrap(),
        peer,
    };
    let plaintext = authorize(&selected, &conn(None), &mut |_| {});
    assert_eq!(
        plaintext.to_string(),
        "explicitly denied by istio-system/istio_converted_static_strict"
    );
    assert!(authorize(&selected, &conn(Some(&peer)), &mut |_| {}).allowed());
}
