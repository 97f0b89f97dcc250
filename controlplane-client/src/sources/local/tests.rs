use super::*;
use std::sync::Arc;

// The example, compiled in through `EXAMPLE_CONFIG` (include_str! of
// examples/local.yaml).
const EXAMPLE: &str = EXAMPLE_CONFIG;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The error text for `yaml`, which must fail to load.
fn err(yaml: &str) -> String {
    match load_snapshot(yaml, "config.yaml") {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn example_config_parses() {
    let (workloads, services, policies) = parse(EXAMPLE, "examples/local.yaml").unwrap();
    assert_eq!(workloads.len(), 3);
    assert_eq!(services.len(), 1);
    assert_eq!(policies.len(), 1);

    let hbone = &workloads[0];
    assert_eq!(hbone.uid, "cluster1//v1/Pod/default/echo-hbone");
    assert_eq!(hbone.protocol, TunnelProtocol::Hbone);
    assert_eq!(hbone.addresses, [ip("127.0.0.1")].into());
    assert_eq!(
        hbone.spiffe_id(),
        "spiffe://cluster.local/ns/default/sa/echo"
    );
    assert_eq!(
        hbone.services["default/echo.default.svc.cluster.local"],
        [PortMapping {
            service_port: 80,
            target_port: 8080
        }]
    );
    assert_eq!(
        hbone.authorization_policies,
        [Str::from("default/echo-allow-local")].into()
    );
    assert_eq!(
        workloads
            .iter()
            .filter(|w| w.protocol == TunnelProtocol::None)
            .count(),
        2
    );

    let svc = &services[0];
    assert_eq!(
        svc.vips,
        [NetworkAddress {
            network: String::new().into(),
            ip: ip("127.10.0.1")
        }]
    );
    assert_eq!(svc.ports[0].service_port, 80);

    let policy = &policies[0];
    assert_eq!(policy.key(), "default/echo-allow-local");
    assert_eq!(policy.scope, PolicyScope::WorkloadSelector);
    assert_eq!(policy.rules.len(), 1);
    assert_eq!(policy.rules[0].clauses.len(), 2);
    assert_eq!(
        policy.rules[0].clauses[0].matches[0].namespaces,
        [StringMatch::Exact("default".into())]
    );
    assert_eq!(
        policy.rules[0].clauses[1].matches[0].destination_ports,
        [8080]
    );

    let snap = load_snapshot(EXAMPLE, "examples/local.yaml").unwrap();
    assert_eq!(
        snap.workload_by_addr("", ip("127.0.0.2")).unwrap().name,
        "echo-tcp"
    );
    let svc = snap.service_by_vip("", ip("127.10.0.1")).unwrap();
    assert_eq!(snap.endpoints(&svc.key()).len(), 2);
    assert!(snap.policy("default/echo-allow-local").is_some());
}

#[test]
fn full_schema() {
    let yaml = r#"
workloads:
- uid: w1
  name: w1
  namespace: ns1
  serviceAccount: sa1
  trustDomain: example.org
  workloadIps: ["10.0.0.1", "fd00::1"]
  hostname: w1.example
  network: net1
  protocol: HBONE
  node: node-a
  canonicalName: app
  canonicalRevision: v2
  workloadName: app-v2
  workloadType: cronjob
  status: Unhealthy
  clusterId: c1
  authorizationPolicies: [ns1/p1]
  services:
    ns1/svc.example: {80: 8080, 443: 8443}
  locality: {region: r, zone: z, subzone: s}
  networkMode: HostNetwork
  capacity: 3
  waypoint: {destination: ns1/waypoint.ns1.svc.cluster.local}
  networkGateway: {destination: "net1/192.0.2.1", hboneMtlsPort: 15009}
  nativeTunnel: true
  applicationTunnel: {protocol: PROXY, port: 15088}
services:
- name: svc
  namespace: ns1
  hostname: svc.example
  vips: ["net1/10.96.0.1", "10.96.0.2", "/fd00::96"]
  ports: {443: 0, 80: 8080}
  subjectAltNames: [spiffe://example.org/ns/ns1/sa/sa1]
  waypoint: {destination: 10.0.0.50}
  loadBalancer:
    routingPreferences: [Network, ZONE]
    mode: Failover
    healthPolicy: AllowAll
  canonical: true
policies:
- name: p1
  namespace: ns1
  scope: Global
  action: DENY
  dryRun: true
  rules:
  - - - namespaces: [{exact: a}, {Prefix: b}, !Suffix c, {presence: {}}, !Presence []]
        notNamespaces: [{presence: }]
        principals: [{exact: "example.org/ns/ns1/sa/sa1"}]
        notPrincipals: [{suffix: x}]
        serviceAccounts: [{namespace: ns1, serviceAccount: sa1}]
        notServiceAccounts: [{namespace: ns2, serviceAccount: sa2}]
        sourceIps: ["10.0.0.0/8", "10.1.2.3"]
        notSourceIps: ["fd00::/8"]
        destinationIps: ["192.0.2.0/24"]
        notDestinationIps: ["192.0.2.7/32"]
        destinationPorts: [80, 443]
        notDestinationPorts: [9999]
      - {}
    - []
  - []
"#;
    let (workloads, services, policies) = parse(yaml, "full.yaml").unwrap();
    let w = &workloads[0];
    let expected = Workload {
        uid: "w1".into(),
        name: "w1".into(),
        namespace: "ns1".into(),
        service_account: "sa1".into(),
        trust_domain: "example.org".into(),
        addresses: vec![ip("10.0.0.1"), ip("fd00::1")].into(),
        hostname: "w1.example".into(),
        network: "net1".into(),
        protocol: TunnelProtocol::Hbone,
        node: "node-a".into(),
        canonical_name: "app".into(),
        canonical_revision: "v2".into(),
        workload_name: "app-v2".into(),
        workload_type: WorkloadType::CronJob,
        status: WorkloadStatus::Unhealthy,
        cluster_id: "c1".into(),
        authorization_policies: vec!["ns1/p1".into()].into(),
        services: [(
            "ns1/svc.example".to_string(),
            vec![
                PortMapping {
                    service_port: 80,
                    target_port: 8080,
                },
                PortMapping {
                    service_port: 443,
                    target_port: 8443,
                },
            ],
        )]
        .into(),
        locality: Some(Locality {
            region: "r".into(),
            zone: "z".into(),
            subzone: "s".into(),
        }),
        network_mode: NetworkMode::HostNetwork,
        capacity: 3,
        waypoint: Some(Box::new(GatewayAddress {
            destination: GatewayDestination::Hostname(NamespacedHostname {
                namespace: "ns1".into(),
                hostname: "waypoint.ns1.svc.cluster.local".into(),
            }),
            hbone_mtls_port: 15008,
        })),
        network_gateway: Some(Box::new(GatewayAddress {
            destination: GatewayDestination::Address(NetworkAddress {
                network: "net1".into(),
                ip: ip("192.0.2.1"),
            }),
            hbone_mtls_port: 15009,
        })),
        native_tunnel: true,
        application_tunnel: Some(ApplicationTunnel {
            protocol: ApplicationTunnelProtocol::Proxy,
            port: Some(15088),
        }),
    };
    assert_eq!(*w, expected);

    let s = &services[0];
    assert_eq!(
        s.vips,
        [
            NetworkAddress {
                network: "net1".into(),
                ip: ip("10.96.0.1")
            },
            NetworkAddress {
                network: "".into(),
                ip: ip("10.96.0.2")
            },
            NetworkAddress {
                network: "".into(),
                ip: ip("fd00::96")
            },
        ]
    );
    assert_eq!(
        s.ports,
        [
            PortMapping {
                service_port: 80,
                target_port: 8080
            },
            PortMapping {
                service_port: 443,
                target_port: 0
            },
        ],
        "sorted; target 0 allowed on a service"
    );
    assert_eq!(
        s.waypoint.as_ref().unwrap().destination,
        GatewayDestination::Address(NetworkAddress {
            network: "".into(),
            ip: ip("10.0.0.50")
        })
    );
    assert_eq!(
        s.load_balancer,
        Some(LoadBalancer {
            routing_preferences: vec![LbScope::Network, LbScope::Zone],
            mode: LbMode::Failover,
            health_policy: LbHealthPolicy::AllowAll,
        })
    );
    assert!(s.canonical);

    let p = &policies[0];
    assert_eq!(p.scope, PolicyScope::Global);
    assert_eq!(p.action, PolicyAction::Deny);
    assert!(p.dry_run);
    assert_eq!(p.rules.len(), 2);
    assert_eq!(p.rules[0].clauses.len(), 2);
    assert!(p.rules[0].clauses[1].matches.is_empty());
    assert!(p.rules[1].clauses.is_empty());
    let m = &p.rules[0].clauses[0].matches;
    assert_eq!(m.len(), 2);
    assert_eq!(m[1], Match::default());
    let m = &m[0];
    assert_eq!(
        m.namespaces,
        [
            StringMatch::Exact("a".into()),
            StringMatch::Prefix("b".into()),
            StringMatch::Suffix("c".into()),
            StringMatch::Presence,
            StringMatch::Presence,
        ]
    );
    assert_eq!(m.not_namespaces, [StringMatch::Presence]);
    assert_eq!(m.not_principals, [StringMatch::Suffix("x".into())]);
    assert_eq!(
        m.service_accounts,
        [ServiceAccountMatch {
            namespace: "ns1".into(),
            service_account: "sa1".into()
        }]
    );
    assert_eq!(m.not_service_accounts[0].namespace, "ns2");
    assert_eq!(
        m.source_ips,
        [
            Cidr::new(ip("10.0.0.0"), 8).unwrap(),
            Cidr::host(ip("10.1.2.3"))
        ]
    );
    assert_eq!(m.not_source_ips, [Cidr::new(ip("fd00::"), 8).unwrap()]);
    assert_eq!(m.destination_ips[0].prefix_len, 24);
    assert_eq!(m.not_destination_ips[0].prefix_len, 32);
    assert_eq!(m.destination_ports, [80, 443]);
    assert_eq!(m.not_destination_ports, [9999]);
}

#[test]
fn defaults_and_derived_uid() {
    let (workloads, services, policies) =
        parse("workloads:\n- name: web\n  namespace: shop\n", "x").unwrap();
    assert!(services.is_empty() && policies.is_empty());
    let w = &workloads[0];
    assert_eq!(w.uid, "shop/web");
    assert_eq!(w.service_account, DEFAULT_SERVICE_ACCOUNT);
    assert_eq!(w.trust_domain, DEFAULT_TRUST_DOMAIN);
    assert_eq!(w.capacity, 1);
    assert_eq!(w.protocol, TunnelProtocol::None);
    assert_eq!(w.status, WorkloadStatus::Healthy);
    assert_eq!(w.network_mode, NetworkMode::Standard);
    assert!(w.addresses.is_empty() && w.services.is_empty() && w.locality.is_none());

    // Explicitly empty identity fields fall back to the defaults too.
    let (workloads, _, _) = parse(
        "workloads:\n- {uid: u, namespace: n, serviceAccount: '', trustDomain: ''}\n",
        "x",
    )
    .unwrap();
    assert_eq!(
        workloads[0].spiffe_id(),
        "spiffe://cluster.local/ns/n/sa/default"
    );

    // An empty file (or only comments) is an empty config.
    assert!(load_snapshot("", "x").unwrap().is_empty());
    assert!(load_snapshot("# nothing yet\n", "x").unwrap().is_empty());
    assert!(
        load_snapshot("workloads: []\nservices: []\npolicies: []\n", "x")
            .unwrap()
            .is_empty()
    );
}

#[test]
fn bad_ip_names_path_and_line() {
    let yaml = "\
workloads:
- uid: a
  namespace: default
  workloadIps: [\"10.0.0.1\"]
- uid: b
  namespace: default
  workloadIps:
  - 10.0.0.300
";
    assert_eq!(
        err(yaml),
        "config.yaml: workloads[1].workloadIps[0]: invalid IP address \"10.0.0.300\" at line 8 column 5"
    );
    match load_snapshot(yaml, "config.yaml").unwrap_err() {
        ConfigError::Parse { line, column, .. } => {
            assert_eq!((line, column), (Some(8), Some(5)));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    assert_eq!(
        err("workload: []\n"),
        "config.yaml: unknown field `workload`, expected one of `workloads`, `services`, `policies` at line 1 column 1"
    );
    let e = err("workloads:\n- uid: a\n  namespace: n\n  workloadIP: 10.0.0.1\n");
    assert!(
        e.starts_with(
            "config.yaml: workloads[0]: unknown field `workloadIP`, expected one of `uid`,"
        ),
        "{e}"
    );
    assert!(e.ends_with("at line 4 column 3"), "{e}");
    let e = err("services:\n- name: s\n  namespace: n\n  hostname: h\n  loadBalancer: {mode: Strict, healthpolicy: AllowAll}\n");
    assert!(
        e.starts_with("config.yaml: services[0].loadBalancer: unknown field `healthpolicy`"),
        "{e}"
    );
    let e = err("policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{destinationPort: [80]}]]]\n");
    assert!(
        e.starts_with("config.yaml: policies[0].rules[0][0][0]: unknown field `destinationPort`"),
        "{e}"
    );
    let e = err("workloads:\n- uid: a\n  namespace: n\n  waypoint: {destination: a/b, port: 1}\n");
    assert!(
        e.starts_with("config.yaml: workloads[0].waypoint: unknown field `port`"),
        "{e}"
    );
    // Keys ztunnel's schema does not have are refused, never ignored.
    let e = err("services:\n- {name: s, namespace: n, hostname: h, ipFamily: IPv4}\n");
    assert!(e.contains("unknown field `ipFamily`"), "{e}");
}

#[test]
fn bad_enums_list_the_accepted_values() {
    assert_eq!(
        err("workloads:\n- uid: a\n  namespace: n\n  protocol: HBOME\n"),
        "config.yaml: workloads[0].protocol: unknown variant `HBOME`, expected `TCP` or `HBONE` at line 4 column 13"
    );
    assert_eq!(
        err("policies:\n- {name: p, namespace: n, scope: Cluster, action: Allow}\n"),
        "config.yaml: policies[0].scope: unknown variant `Cluster`, expected one of `Global`, `Namespace`, `WorkloadSelector` at line 2 column 34"
    );
    let e = err("workloads:\n- {uid: a, namespace: n, status: Ready}\n");
    assert!(
        e.starts_with("config.yaml: workloads[0].status: unknown variant `Ready`, expected `Healthy` or `Unhealthy`"),
        "{e}"
    );
    let e = err("workloads:\n- {uid: a, namespace: n, workloadType: StatefulSet}\n");
    assert!(e.contains("unknown variant `StatefulSet`"), "{e}");
    let e = err(
        "policies:\n- {name: p, namespace: n, scope: Global, action: Allow, rules: [[[{principals: [{regex: x}]}]]]}\n",
    );
    assert!(
        e.starts_with("config.yaml: policies[0].rules[0][0][0].principals[0]: unknown variant `regex`, expected one of `exact`, `prefix`, `suffix`, `presence`"),
        "{e}"
    );
    let e = err(
        "policies:\n- {name: p, namespace: n, scope: Global, action: Allow, rules: [[[{principals: [{exact: x, prefix: y}]}]]]}\n",
    );
    assert!(
        e.contains("string match has both `exact` and `prefix`; use one"),
        "{e}"
    );
    let e = err(
        "policies:\n- {name: p, namespace: n, scope: Global, action: Allow, rules: [[[{principals: [{presence: yes}]}]]]}\n",
    );
    assert!(e.contains("principals[0]"), "{e}");
}

#[test]
fn duplicates_name_both_items() {
    let yaml = "\
workloads:
- {uid: x, namespace: n, workloadIps: [10.0.0.1]}
- {uid: y, namespace: n, workloadIps: [10.0.0.2]}
- {uid: x, namespace: n, workloadIps: [10.0.0.3]}
";
    assert_eq!(
        err(yaml),
        "config.yaml: workloads[2] (uid \"x\"): duplicate uid, already used by workloads[0]"
    );
    // A derived uid collides the same way.
    assert_eq!(
        err("workloads:\n- {name: w, namespace: n}\n- {name: w, namespace: n}\n"),
        "config.yaml: workloads[1] (uid \"n/w\"): duplicate uid, already used by workloads[0]"
    );
    assert_eq!(
        err("services:\n- {name: a, namespace: n, hostname: h}\n- {name: b, namespace: n, hostname: h}\n"),
        "config.yaml: services[1] (\"n/h\"): duplicate namespace/hostname, already used by services[0]"
    );
    assert_eq!(
        err("policies:\n- {name: p, namespace: n, scope: Global, action: Allow}\n- {name: p, namespace: n, scope: Global, action: Deny}\n"),
        "config.yaml: policies[1] (\"n/p\"): duplicate namespace/name, already used by policies[0]"
    );
    assert_eq!(
        err("services:\n- {name: a, namespace: n, hostname: a, vips: [10.96.0.1]}\n- {name: b, namespace: n, hostname: b, vips: [/10.96.0.1]}\n"),
        "config.yaml: services[1] (\"n/b\"): VIP 10.96.0.1 on network \"\" is already used by services[0] (\"n/a\")"
    );
    // Not duplicates, as in ztunnel: two workloads on one address (the
    // last listed answers), a VIP that is a workload's address.
    let s = load_snapshot(
        "workloads:\n- {uid: x, namespace: n, workloadIps: [10.0.0.1]}\n\
         - {uid: y, namespace: n, workloadIps: [10.0.0.1]}\n\
         services:\n- {name: s, namespace: n, hostname: h, vips: [/10.0.0.1]}\n",
        "config.yaml",
    )
    .unwrap();
    assert_eq!(s.workload_by_addr("", ip("10.0.0.1")).unwrap().uid, "y");
    assert_eq!(s.service_by_vip("", ip("10.0.0.1")).unwrap().hostname, "h");
    // ... but `parse` alone doesn't check across items.
    assert_eq!(parse(yaml, "config.yaml").unwrap().0.len(), 3);
}

#[test]
fn bad_vips_and_gateways() {
    assert_eq!(
        err("services:\n- name: s\n  namespace: n\n  hostname: h\n  vips: [\"net1:10.0.0.1\"]\n"),
        "config.yaml: services[0].vips[0]: invalid VIP \"net1:10.0.0.1\": expected \"network/IP\" or an IP address at line 5 column 10"
    );
    let e = err("services:\n- {name: s, namespace: n, hostname: h, vips: [\"/10.0.0.0/24\"]}\n");
    assert!(
        e.contains("services[0].vips[0]: invalid VIP \"/10.0.0.0/24\""),
        "{e}"
    );
    let e = err("workloads:\n- {uid: a, namespace: n, waypoint: {destination: waypoint}}\n");
    assert!(
        e.starts_with("config.yaml: workloads[0].waypoint.destination: invalid gateway destination \"waypoint\""),
        "{e}"
    );
    let e = err("workloads:\n- {uid: a, namespace: n, waypoint: {hboneMtlsPort: 15008}}\n");
    assert!(
        e.contains("workloads[0].waypoint: missing field `destination`"),
        "{e}"
    );
}

#[test]
fn bad_ports() {
    assert_eq!(
        err("services:\n- name: s\n  namespace: n\n  hostname: h\n  ports: {0: 8080}\n"),
        "config.yaml: services[0].ports: invalid port 0: must be 1..=65535 at line 5 column 11"
    );
    let e = err("services:\n- {name: s, namespace: n, hostname: h, ports: {80: 70000}}\n");
    assert!(
        e.starts_with("config.yaml: services[0].ports.80: invalid port 70000: must be 0..=65535"),
        "{e}"
    );
    let e = err("workloads:\n- uid: a\n  namespace: n\n  services: {\"n/h\": {80: 0}}\n");
    assert!(
        e.starts_with(
            "config.yaml: workloads[0].services.n/h.80: invalid port 0: must be 1..=65535"
        ),
        "{e}"
    );
    let e = err("services:\n- {name: s, namespace: n, hostname: h, ports: {80: 1, 80: 2}}\n");
    assert!(
        e.contains("services[0].ports: duplicate service port 80"),
        "{e}"
    );
    let e = err("policies:\n- {name: p, namespace: n, scope: Global, action: Allow, rules: [[[{destinationPorts: [80, -1]}]]]}\n");
    assert!(
        e.contains("rules[0][0][0].destinationPorts[1]: invalid port -1: must not be negative"),
        "{e}"
    );
    let e = err(
        "workloads:\n- {uid: a, namespace: n, applicationTunnel: {protocol: PROXY, port: 0}}\n",
    );
    assert!(
        e.contains("workloads[0].applicationTunnel.port: invalid port 0"),
        "{e}"
    );
    let e = err("services:\n- {name: s, namespace: n, hostname: h, ports: {http: 80}}\n");
    assert!(e.contains("services[0].ports"), "{e}");
}

#[test]
fn bad_cidrs() {
    let policy = |ip: &str| {
        format!(
            "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Deny\n  rules:\n  - - - sourceIps: [\"{ip}\"]\n"
        )
    };
    assert_eq!(
        err(&policy("10.0.0.0/33")),
        "config.yaml: policies[0].rules[0][0][0].sourceIps[0]: invalid CIDR \"10.0.0.0/33\": prefix length 33 exceeds 32 at line 7 column 21"
    );
    assert!(err(&policy("fd00::/129")).contains("prefix length 129 exceeds 128"));
    assert!(err(&policy("10.0.0/8")).contains("invalid CIDR \"10.0.0/8\": bad address"));
    assert!(err(&policy("10.0.0.0/x")).contains("invalid CIDR \"10.0.0.0/x\": bad prefix length"));
    assert!(err(&policy("localhost")).contains("invalid CIDR \"localhost\""));
}

#[test]
fn item_level_checks_name_the_item() {
    assert_eq!(
        err("workloads:\n- {uid: a, namespace: n}\n- {namespace: n}\n"),
        "config.yaml: workloads[1] (uid \"\"): needs a uid (or a name to derive one from)"
    );
    assert_eq!(
        err("workloads:\n- {uid: a, namespace: \"\"}\n"),
        "config.yaml: workloads[0] (uid \"a\"): namespace is empty"
    );
    assert_eq!(
        err("workloads:\n- {uid: a, namespace: n, authorizationPolicies: [n/p, p]}\n"),
        "config.yaml: workloads[0] (uid \"a\"): authorizationPolicies[1]: \"p\" is not \"namespace/name\""
    );
    assert_eq!(
        err("services:\n- {name: \"\", namespace: n, hostname: h}\n"),
        "config.yaml: services[0] (\"n/h\"): name is empty"
    );
    assert_eq!(
        err("policies:\n- {name: a/b, namespace: n, scope: Global, action: Allow}\n"),
        "config.yaml: policies[0] (\"n/a/b\"): namespace and name must not contain '/'"
    );
    let e = err("workloads:\n- uid: a\n  namespace: n\n  services: {\"h\": {80: 80}}\n");
    assert!(
        e.starts_with("config.yaml: workloads[0].services: invalid service key \"h\": expected \"namespace/hostname\""),
        "{e}"
    );
    assert_eq!(
        err("workloads:\n- uid: a\n"),
        "config.yaml: workloads[0]: missing field `namespace` at line 2 column 3"
    );
}

#[test]
fn yaml_syntax_errors_have_a_position() {
    match load_snapshot("workloads:\n- uid: [a\n", "bad.yaml").unwrap_err() {
        ConfigError::Parse {
            origin,
            line,
            message,
            ..
        } => {
            assert_eq!(origin, "bad.yaml");
            assert!(line.is_some(), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err("workloads: 3\n").starts_with("config.yaml: workloads: invalid type: integer `3`"));
}

// ---------------------------------------------------------------------------
// File watching
// ---------------------------------------------------------------------------

const GOOD_V1: &str = "workloads:\n- {uid: a, namespace: n, workloadIps: [10.0.0.1]}\n";
const GOOD_V2: &str = "workloads:\n- {uid: b, namespace: n, workloadIps: [10.0.0.2]}\n";
const BAD: &str = "workloads:\n- {uid: a, namespace: n, workloadIps: [10.0.0.300]}\n";

fn write(path: &Path, text: &str) {
    // Write-then-rename, as editors and kubelet do.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn file_watcher_poll_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let publisher = SnapshotPublisher::new();
    let mut watcher = FileWatcher::new(path.clone(), publisher.clone());

    assert!(
        matches!(watcher.poll(), PollOutcome::Unreadable(m) if m.contains("config.yaml: cannot read config"))
    );
    assert!(
        matches!(watcher.poll(), PollOutcome::Unchanged),
        "same error not repeated"
    );
    assert_eq!(publisher.version(), 0);

    write(&path, GOOD_V1);
    assert!(matches!(watcher.poll(), PollOutcome::Published(1)));
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    let good = publisher.current();

    write(&path, &format!("# a comment\n{GOOD_V1}"));
    assert!(matches!(watcher.poll(), PollOutcome::Equivalent));
    assert_eq!(publisher.version(), 1);

    write(&path, BAD);
    match watcher.poll() {
        PollOutcome::Rejected(e) => assert!(
            e.to_string().ends_with(
                "config.yaml: workloads[0].workloadIps[0]: invalid IP address \"10.0.0.300\" at line 2 column 40"
            ),
            "{e}"
        ),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    assert_eq!(publisher.version(), 1);
    assert!(Arc::ptr_eq(&publisher.current(), &good), "last good stays");

    std::fs::remove_file(&path).unwrap();
    assert!(matches!(watcher.poll(), PollOutcome::Unreadable(_)));
    assert!(Arc::ptr_eq(&publisher.current(), &good));

    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    assert!(
        matches!(watcher.poll(), PollOutcome::Rejected(e) if e.to_string().contains("not UTF-8"))
    );

    write(&path, GOOD_V2);
    assert!(matches!(watcher.poll(), PollOutcome::Published(2)));
    assert!(publisher.current().workload_by_uid("b").is_some());
}

/// Kubernetes mounts a ConfigMap key as `key -> ..data/key` with
/// `..data -> ..<timestamp>`, and updates by re-pointing `..data`.
#[cfg(unix)]
#[test]
fn file_watcher_follows_configmap_symlink_swap() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(d.join("..v1/config.yaml"), GOOD_V1).unwrap();
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/config.yaml", d.join("config.yaml")).unwrap();

    let publisher = SnapshotPublisher::new();
    let mut watcher = FileWatcher::new(d.join("config.yaml"), publisher.clone());
    assert!(matches!(watcher.poll(), PollOutcome::Published(1)));

    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(d.join("..v2/config.yaml"), GOOD_V2).unwrap();
    symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..v1")).unwrap();

    assert!(matches!(watcher.poll(), PollOutcome::Published(2)));
    assert!(publisher.current().workload_by_uid("b").is_some());
}

/// A watcher started on content already published (ringway's startup:
/// `--config` is loaded first) does not load it again, and still follows
/// edits, including one back to the loaded content.
#[test]
fn file_watcher_from_loaded_content_skips_the_first_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    write(&path, GOOD_V1);
    let publisher = SnapshotPublisher::new();
    publisher.publish(load_snapshot(GOOD_V1, "startup").unwrap());
    let loaded = ContentDigest::of(GOOD_V1.as_bytes());
    assert_eq!(ContentDigest::of_file(&path).unwrap(), loaded);
    let mut watcher = FileWatcher::loaded(path.clone(), publisher.clone(), loaded);
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    assert_eq!(publisher.current().version(), 1);

    write(&path, GOOD_V2);
    assert!(watcher.content_differs());
    assert!(matches!(watcher.poll(), PollOutcome::Published(2)));
    assert_eq!(publisher.current().version(), 2);
    write(&path, GOOD_V1);
    assert!(watcher.content_differs());
    assert!(matches!(watcher.poll(), PollOutcome::Published(3)));
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
}

/// Polls skip hashing while the metadata stays, but a rewrite that keeps
/// even the metadata (faked here) is found within POLLS_TRUSTING_METADATA
/// polls.
#[test]
fn file_watcher_trusts_metadata_for_a_while_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    write(&path, GOOD_V1);
    let publisher = SnapshotPublisher::new();
    let mut watcher = FileWatcher::new(path.clone(), publisher.clone());
    assert!(matches!(watcher.poll(), PollOutcome::Published(1)));
    // Just written: its metadata does not vouch for it yet.
    assert_eq!(watcher.last_meta, None);
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    assert_eq!(watcher.polls_on_meta, 0);
    // Older than a second: trusted.
    watcher.last_meta = FileMeta::of(&path);
    assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    assert_eq!(watcher.polls_on_meta, 1);
    // A real edit changes the metadata: seen at once.
    write(&path, GOOD_V2);
    assert!(watcher.content_differs());
    assert!(matches!(watcher.poll(), PollOutcome::Published(2)));
    // Same length, and the metadata made to look unchanged.
    write(&path, GOOD_V1);
    watcher.last_meta = FileMeta::of(&path);
    watcher.polls_on_meta = 0;
    for _ in 0..POLLS_TRUSTING_METADATA {
        assert!(!watcher.content_differs());
        assert!(matches!(watcher.poll(), PollOutcome::Unchanged));
    }
    assert!(matches!(watcher.poll(), PollOutcome::Published(3)));
    assert!(publisher.current().workload_by_uid("a").is_some());
}

/// The digest streams the file in chunks and equals the one-shot digest,
/// whatever the size (more than one 64 KiB read here).
#[test]
fn content_digest_of_file_matches_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let bytes: Vec<u8> = (0..200_003u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        ContentDigest::of_file(&path).unwrap(),
        ContentDigest::of(&bytes)
    );
    let mut other = bytes.clone();
    other[150_000] ^= 1;
    assert_ne!(ContentDigest::of(&other), ContentDigest::of(&bytes));
    assert_ne!(ContentDigest::of(&bytes[1..]), ContentDigest::of(&bytes));
}

/// On tokio's paused clock: time moves only when every task waits, so
/// "ten polls' worth" below is exactly ten polls of the watcher, however
/// loaded the machine.
#[tokio::test(start_paused = true)]
async fn watch_file_publishes_good_edits_and_keeps_last_good() {
    use tokio::time::{sleep, timeout};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    write(&path, GOOD_V1);

    let publisher = SnapshotPublisher::new();
    let mut feed = publisher.subscribe();
    let interval = Duration::from_millis(20);
    let task = tokio::spawn(watch_file(path.clone(), interval, publisher.clone(), None));

    timeout(Duration::from_secs(5), feed.changed())
        .await
        .expect("first load published")
        .unwrap();
    let first = feed.current();
    assert_eq!(first.version(), 1);
    assert!(first.workload_by_addr("", ip("10.0.0.1")).is_some());

    write(&path, BAD);
    // Ten polls' worth (each one reads the file): the bad edit must not
    // replace the good snapshot.
    sleep(interval * 10).await;
    assert_eq!(feed.version(), 1);
    assert!(Arc::ptr_eq(&feed.current(), &first));

    write(&path, GOOD_V2);
    timeout(Duration::from_secs(5), feed.changed())
        .await
        .expect("good edit published")
        .unwrap();
    let second = feed.current();
    assert_eq!(second.version(), 2);
    assert!(second.workload_by_addr("", ip("10.0.0.2")).is_some());
    assert!(second.workload_by_uid("a").is_none());

    task.abort();
}

/// Service keys that ztunnel's own dump writes (`endpoints`, `visibility`)
/// and the rest of its schema, in the forms the real ztunnel loads (checked
/// against ../shared/peers/ztunnel, which rejects, for instance,
/// `ipFamilies: IPv4Only` and a `cidrVips` entry given as a string).
#[test]
fn ztunnels_service_keys_load() {
    let yaml = r#"
workloads:
- uid: cluster1//v1/Pod/default/local
  name: local
  namespace: default
  workloadIps: ["10.0.0.1"]
  protocol: HBONE
  services:
    "default/example.com": {80: 8080}
services:
- name: local
  namespace: default
  hostname: example.com
  vips: ["/127.10.0.1"]
  ports: {80: 8080}
  endpoints:
    "cluster1//v1/Pod/default/local": {port: {80: 8080}, status: Unhealthy, workloadUid: "cluster1//v1/Pod/default/local"}
  visibility: Namespace
  ipFamilies: IPv4
  cidrVips: [{network: "", cidr: "10.96.0.0/16"}]
  weightedWaypoints: [{destination: {destination: "default/wp.default.svc", hboneMtlsPort: 15009}, weight: 3}]
"#;
    let snap = load_snapshot(yaml, "config.yaml").unwrap();
    let s = snap.service_by_key("default/example.com").unwrap();
    assert_eq!(s.visibility, Visibility::Namespace);
    assert_eq!(s.ip_families, Some(IpFamilies::Ipv4));
    assert_eq!(
        s.cidr_vips,
        [NetworkCidr {
            network: String::new().into(),
            cidr: Cidr::new(ip("10.96.0.0"), 16).unwrap()
        }]
    );
    assert_eq!(s.weighted_waypoints.len(), 1);
    assert_eq!(s.weighted_waypoints[0].weight, 3);
    assert_eq!(s.weighted_waypoints[0].waypoint.hbone_mtls_port, 15009);
    // `endpoints` is read and dropped, as ztunnel drops it: membership and
    // health come from the workloads (this one is healthy).
    let eps = snap.endpoints("default/example.com");
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].status, WorkloadStatus::Healthy);
    // A CIDR VIP routes like a VIP.
    let by_range = snap.service_by_addr("", ip("10.96.3.4")).unwrap();
    assert_eq!(by_range.key(), "default/example.com");
    assert!(snap.service_by_addr("", ip("10.97.0.1")).is_none());
    assert!(snap.service_by_addr("other-net", ip("10.96.3.4")).is_none());
}

#[test]
fn ztunnel_schema_keys_still_reject_what_ztunnel_rejects() {
    let base = "services:\n- {name: s, namespace: ns, hostname: h, ";
    let cases = [
        ("ipFamilies: IPv4Only}", "ipFamilies"),
        ("visibility: Everyone}", "visibility"),
        ("cidrVips: [\"10.0.0.0/8\"]}", "cidrVips"),
        ("weightedWaypoints: [{weight: 1}]}", "destination"),
        ("endpoints: {u: {workloadUid: u, bogus: 1}}}", "bogus"),
    ];
    for (tail, needle) in cases {
        let e = err(&format!("{base}{tail}\n"));
        assert!(e.contains(needle), "{tail}: {e}");
    }
}

// ---------------------------------------------------------------------------
// Parsing in batches
// ---------------------------------------------------------------------------

/// `n` workloads (every shape of line a list item may have: flow and block
/// maps, nested block lists, a block scalar, comments at any indentation,
/// blank lines, an anchor used within its item), one service per 10, and
/// a policy with YAML tags; items indented by `indent`.
fn batched_mesh(n: usize, indent: &str) -> String {
    let mut y = String::from("# a mesh\n\nworkloads:\n");
    for i in 0..n {
        let p = indent;
        y += &format!(
            "{p}- uid: &uid{i} Kubernetes//Pod/ns/w-{i}\n{p}  name: w-{i}\n{p}  namespace: ns\n\
             {p}  workloadIps: [\"10.0.{}.{}\"]\n{p}  protocol: HBONE\n\
             {p}  hostname: |-\n{p}    host-{i}\n\
             # a comment at column 0 inside the list\n\n\
             {p}  authorizationPolicies:\n{p}  - ns/p\n\
             {p}  locality: {{region: r, zone: z}}\n\
             {p}  services:\n{p}    \"ns/s{}.ns.svc\": {{80: 8080}}\n",
            i / 250,
            i % 250 + 1,
            i / 10
        );
    }
    y += "services:   # one per ten workloads\n";
    for s in 0..n.div_ceil(10) {
        y += &format!(
            "- {{name: s{s}, namespace: ns, hostname: s{s}.ns.svc, vips: [\"/10.96.{}.{}\"], ports: {{80: 8080}}}}\n",
            s / 250,
            s % 250 + 1
        );
    }
    y += "policies:\n- name: p\n  namespace: ns\n  scope: WorkloadSelector\n  action: Allow\n  \
          rules: [[[ {principals: [!Exact \"cluster.local/ns/ns/sa/x\"]} ]]]\n";
    y
}

#[test]
fn batches_give_what_the_whole_document_gives() {
    for (n, indent) in [(3, ""), (1500, ""), (700, "  ")] {
        let yaml = batched_mesh(n, indent);
        let lists = split_lists(&yaml).expect("block lists");
        if n > 1000 {
            assert!(lists[0].len() > 4, "{} batches", lists[0].len());
        }
        let batched = parse_in_batches(&yaml, "m").expect("batched");
        let whole = parse_whole(&yaml, "m").unwrap();
        assert_eq!(batched, whole);
        assert_eq!(batched.0.len(), n);
        assert_eq!(batched.0[n - 1].hostname, format!("host-{}", n - 1));
        assert_eq!(batched.2.len(), 1);
        let crlf = yaml.replace('\n', "\r\n");
        assert_eq!(parse_in_batches(&crlf, "m").expect("CRLF"), whole);
    }
    for yaml in [
        EXAMPLE,
        GOOD_V1,
        "workloads: []\nservices: []  # none\npolicies: []\n",
    ] {
        assert_eq!(
            parse_in_batches(yaml, "m").expect("batched"),
            parse_whole(yaml, "m").unwrap()
        );
    }
}

/// Layouts the batches do not read go through the whole document, with
/// the same outcome as before, errors (and their lines) included.
#[test]
fn other_layouts_and_errors_go_through_the_whole_document() {
    let big = batched_mesh(1500, "");
    // An alias to an anchor in an earlier batch.
    let alias = big.replace(
        "- uid: &uid1400 Kubernetes//Pod/ns/w-1400\n  name: w-1400\n",
        "- uid: &uid1400 Kubernetes//Pod/ns/w-1400\n  name: *uid2\n",
    );
    let flow = "workloads: [{uid: a, namespace: n}]\n";
    let nested = "workloads:\n  [{uid: a, namespace: n}]\n";
    let doc = "---\nworkloads:\n- {uid: a, namespace: n}\n";
    let null = "workloads:\nservices: []\n";
    for yaml in [alias.as_str(), flow, nested, doc, null] {
        assert!(parse_in_batches(yaml, "m").is_none(), "{yaml:.80}");
        assert_eq!(parse(yaml, "m"), parse_whole(yaml, "m"));
    }
    assert_eq!(
        parse(&alias, "m").unwrap().0[1400].name,
        "Kubernetes//Pod/ns/w-2"
    );
    // Duplicate or unknown top-level keys, tabs, a character the YAML
    // reader refuses even in a comment no batch holds (found by fuzzing):
    // errors of the whole parse.
    for yaml in [
        "workloads: []\nworkloads: []\n",
        "workload: []\n",
        "workloads:\n\t- {uid: a, namespace: n}\n",
        "# a comment with a NUL \0 in it\nworkloads:\n- {uid: a, namespace: n}\n",
        "workloads:\n- {uid: a, namespace: n}\n# \u{7f}\n",
        "# a lone CR \r starts a line to YAML\nworkloads:\n- {uid: a, namespace: n}\n",
    ] {
        assert!(parse_in_batches(yaml, "m").is_none());
        assert!(parse(yaml, "m").is_err());
    }
    // A bad value deep in a big file: the whole parse's message and line.
    let bad = big.replace("\"10.0.4.151\"", "\"10.0.4.300\"");
    let line = bad.lines().position(|l| l.contains("10.0.4.300")).unwrap() + 1;
    match parse(&bad, "m").unwrap_err() {
        ConfigError::Parse {
            line: l, message, ..
        } => {
            assert_eq!(l, Some(line));
            assert!(
                message.starts_with("workloads[1150].workloadIps[0]"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // An item-level error after a batch boundary: same item number.
    let no_ns = big.replace(
        "  name: w-1300\n  namespace: ns\n",
        "  name: w-1300\n  namespace: \"\"\n",
    );
    assert_eq!(
        parse(&no_ns, "m").unwrap_err().to_string(),
        "m: workloads[1300] (uid \"Kubernetes//Pod/ns/w-1300\"): namespace is empty"
    );
}
