//! Inbound HBONE as ztunnel serves it (facts 3.4): a hostname
//! `:authority`, the `baggage` on the 200, and waypoint enforcement. The
//! client is the independent Python HBONE client (tests/py/) on node A,
//! dialling ringway B's 15008 with whatever identity the test gives it.

mod common;

use std::net::TcpListener;

use common::nodes::{base_config, client_args, py_client, Nodes, CLIENT_ID, SERVER_IP};

const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/server-ns/sa/waypoint";
const WEB: &str = "web.server-ns.svc.cluster.local";

/// The base mesh, the server backing service "web" (80 → its own 8081),
/// plus `server_extra` lines appended to the server workload.
fn config(server_extra: &str) -> String {
    format!(
        r#"{}  services:
    server-ns/{WEB}: {{80: 8081}}
{server_extra}- uid: cluster1//v1/Pod/server-ns/waypoint
  name: waypoint
  namespace: server-ns
  serviceAccount: waypoint
  workloadIps: ["10.250.0.3"]
  protocol: HBONE
  node: node-b
services:
- name: web
  namespace: server-ns
  hostname: {WEB}
  vips: ["10.96.0.10"]
  ports: {{80: 8080}}
"#,
        base_config()
    )
}

/// An echo server on node B at `port`.
fn echo_on_b(nodes: &Nodes, port: u16) {
    nodes.b.enter(move || {
        common::serve_echo(TcpListener::bind(format!("{SERVER_IP}:{port}")).unwrap())
    });
}

/// One CONNECT to `authority` from node A as `identity`, sending 64 KiB
/// and expecting them back when the answer is 200. Returns the JSON result.
fn connect_as(nodes: &Nodes, identity: &str, name: &str, authority: &str) -> serde_json::Value {
    let certs = nodes.issue(&nodes.ca_dir(), identity, name, "1h");
    let root = nodes.ca_dir().join("root-cert.pem");
    let mut args = client_args(&certs, &root, authority);
    args.extend(["--send-bytes".into(), (64 << 10).to_string()]);
    let (_, out) = py_client(&nodes.a, &args);
    out
}

#[test]
fn a_hostname_authority_reaches_the_service_port_and_the_200_carries_baggage() {
    let nodes = Nodes::with_config("ihn", &config(""), true, &[]);
    echo_on_b(&nodes, 8081);
    let out = connect_as(&nodes, CLIENT_ID, "client", &format!("{WEB}:80"));
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(out["received"][0], 64 << 10, "{out}");
    assert_eq!(out["sha256_received"][0], out["sha256_sent"][0], "{out}");
    let baggage = out["response_headers"][0]["baggage"]
        .as_str()
        .unwrap_or_else(|| panic!("no baggage on the 200: {out}"));
    assert!(
        baggage.contains("k8s.namespace.name=server-ns"),
        "{baggage}"
    );
    let logs = nodes.b().wait_access_logs(1);
    assert_eq!(
        logs[0]["dst.hbone_addr"],
        format!("{SERVER_IP}:8081"),
        "{logs:#?}"
    );
    assert_eq!(logs[0]["dst.addr"], format!("{SERVER_IP}:15008"));
    assert_eq!(logs[0]["dst.service"], WEB, "{logs:#?}");
    assert_eq!(logs[0]["dst.workload"], "server", "{logs:#?}");
    assert_eq!(logs[0]["direction"], "inbound", "{logs:#?}");

    // A hostname this workload serves no service for, or a port the
    // service lacks: 503, as in ztunnel.
    for authority in ["nope.server-ns.svc.cluster.local:80", &format!("{WEB}:81")] {
        let out = connect_as(&nodes, CLIENT_ID, "client", authority);
        assert_eq!(out["status"][0], 503, "{authority}: {out}");
    }
    let errors: Vec<String> = nodes
        .b()
        .wait_access_logs(3)
        .iter()
        .filter_map(|l| l["error"].as_str().map(String::from))
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no service nope.server-ns.svc.cluster.local")),
        "{errors:#?}"
    );
}

#[test]
fn a_workload_with_a_waypoint_takes_hbone_only_from_its_waypoint() {
    let cfg = config("  waypoint: {destination: \"/10.250.0.3\", hboneMtlsPort: 15008}\n");
    let nodes = Nodes::with_config("iwp", &cfg, true, &[]);
    echo_on_b(&nodes, 8080);
    let target = format!("{SERVER_IP}:8080");
    // The client going around the waypoint: 401, nothing connected.
    let out = connect_as(&nodes, CLIENT_ID, "client", &target);
    assert_eq!(out["status"][0], 401, "{out}");
    // The waypoint itself: served.
    let out = connect_as(&nodes, WAYPOINT_ID, "waypoint", &target);
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(out["sha256_received"][0], out["sha256_sent"][0], "{out}");
    let logs = nodes.b().wait_access_logs(2);
    let refused = logs
        .iter()
        .find(|l| l["src.identity"] == CLIENT_ID)
        .unwrap_or_else(|| panic!("{logs:#?}"));
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("must come through its waypoint /10.250.0.3"),
        "{refused}"
    );
}

#[test]
fn a_sandwiched_waypoint_takes_streams_for_what_it_serves_and_nothing_else() {
    // The server is the waypoint of service "shop" (VIP 10.96.0.20).
    let cfg = format!(
        "{}- name: shop\n  namespace: server-ns\n  hostname: shop.server-ns.svc.cluster.local\n  \
         vips: [\"10.96.0.20\"]\n  ports: {{80: 8080}}\n  \
         waypoint: {{destination: \"/{SERVER_IP}\", hboneMtlsPort: 15008}}\n",
        config("")
    );
    let nodes = Nodes::with_config("isw", &cfg, true, &[]);
    echo_on_b(&nodes, 80);
    // For the service it is the waypoint of: to itself, at the port asked.
    let out = connect_as(&nodes, CLIENT_ID, "client", "10.96.0.20:80");
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(out["sha256_received"][0], out["sha256_sent"][0], "{out}");
    // For a service it is not the waypoint of: 400 (ip mismatch).
    let out = connect_as(&nodes, CLIENT_ID, "client", "10.96.0.10:80");
    assert_eq!(out["status"][0], 400, "{out}");
    let logs = nodes.b().wait_access_logs(2);
    let served = logs.iter().find(|l| l["error"].is_null()).unwrap();
    assert_eq!(served["dst.hbone_addr"], "10.96.0.20:80", "{served}");
    let refused = logs.iter().find(|l| l["error"].is_string()).unwrap();
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .starts_with("400: authority IP 10.96.0.10 is not the connection's destination"),
        "{refused}"
    );
}

#[test]
fn an_application_tunnel_gets_a_proxy_header_with_target_and_identity() {
    let cfg = config("  applicationTunnel: {protocol: PROXY, port: 15088}\n");
    let nodes = Nodes::with_config("iat", &cfg, true, &[]);
    // The application: reads the PROXY v2 header, reports it, echoes the
    // rest.
    let (tx, rx) = std::sync::mpsc::channel();
    let listener = nodes
        .b
        .enter(|| TcpListener::bind(format!("{SERVER_IP}:15088")).unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut fixed = [0u8; 16];
        s.read_exact(&mut fixed).unwrap();
        let mut rest = vec![0u8; u16::from_be_bytes([fixed[14], fixed[15]]) as usize];
        s.read_exact(&mut rest).unwrap();
        tx.send((fixed, rest)).unwrap();
        let mut buf = [0u8; 16 << 10];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
    // Any target: the tunnel port takes it.
    let out = connect_as(&nodes, CLIENT_ID, "client", "10.96.0.10:80");
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(out["sha256_received"][0], out["sha256_sent"][0], "{out}");
    let (fixed, rest) = rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(&fixed[..12], b"\r\n\r\n\0\r\nQUIT\n");
    assert_eq!(
        (fixed[12], fixed[13]),
        (0x21, 0x11),
        "v2 PROXY, TCP over IPv4"
    );
    assert_eq!(&rest[0..4], &[10, 250, 0, 1], "the client's address");
    assert_eq!(&rest[4..8], &[10, 96, 0, 10], "the original target");
    assert_eq!(u16::from_be_bytes([rest[10], rest[11]]), 80);
    assert_eq!(rest[12], 0xD0, "the peer identity TLV");
    let len = u16::from_be_bytes([rest[13], rest[14]]) as usize;
    assert_eq!(std::str::from_utf8(&rest[15..15 + len]).unwrap(), CLIENT_ID);
}

#[test]
fn a_stream_from_another_network_takes_its_source_from_baggage() {
    let nodes = Nodes::with_config("ixn", &config(""), true, &[]);
    echo_on_b(&nodes, 8080);
    let certs = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "client", "1h");
    let root = nodes.ca_dir().join("root-cert.pem");
    let target = format!("{SERVER_IP}:8080");
    let mut args = client_args(&certs, &root, &target);
    args.extend([
        "--send-bytes".into(),
        "1000".into(),
        "--header".into(),
        "x-forwarded-network=west".into(),
        "--header".into(),
        "baggage=k8s.namespace.name=remote-ns,k8s.deployment.name=remote-app".into(),
    ]);
    let (_, out) = py_client(&nodes.a, &args);
    assert_eq!(out["status"][0], 200, "{out}");
    // Same network (or none said): the source is the workload at the
    // tunnel's peer address.
    let out = connect_as(&nodes, CLIENT_ID, "client", &target);
    assert_eq!(out["status"][0], 200, "{out}");
    let logs = nodes.b().wait_access_logs(2);
    let workloads: Vec<&str> = logs
        .iter()
        .map(|l| l["src.workload"].as_str().unwrap_or("-"))
        .collect();
    assert!(workloads.contains(&"remote-app"), "{logs:#?}");
    assert!(workloads.contains(&"client"), "{logs:#?}");
    let remote = logs
        .iter()
        .find(|l| l["src.workload"] == "remote-app")
        .unwrap();
    assert_eq!(remote["src.namespace"], "remote-ns", "{remote}");
}
