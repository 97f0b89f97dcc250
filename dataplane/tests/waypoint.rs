//! Waypoints end to end (facts §3.1 steps 2 and 6): a service with a
//! waypoint, and a workload with a waypoint, reached from node A's client
//! through ringway A. The waypoint is an independent HBONE server (Python's
//! h2 + ssl, tests/py/hbone_server.py, echo mode) on node B at 10.250.0.3
//! holding the waypoint's own identity: what it logs is what a real
//! waypoint would have been asked for.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;

use common::nodes::{
    base_config, connect_from_client, py_server_with, Nodes, CLIENT_ID, SERVER_IP,
};

const WAYPOINT_IP: &str = "10.250.0.3";
const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/server-ns/sa/waypoint";
const VIP: &str = "10.96.0.10";

/// The base mesh plus a waypoint workload and service "web" (VIP:80 →
/// 8080, backed by the server workload). `service_waypoint` /
/// `workload_waypoint` are YAML flow maps for the service's and the server
/// workload's `waypoint` field, or "" for none.
fn config(service_waypoint: &str, workload_waypoint: &str) -> String {
    let mut cfg = base_config();
    cfg.push_str("  services:\n    server-ns/web.server-ns.svc.cluster.local: {80: 8080}\n");
    if !workload_waypoint.is_empty() {
        cfg.push_str(&format!("  waypoint: {workload_waypoint}\n"));
    }
    cfg.push_str(&format!(
        r#"- uid: cluster1//v1/Pod/server-ns/waypoint
  name: waypoint
  namespace: server-ns
  serviceAccount: waypoint
  workloadIps: ["{WAYPOINT_IP}"]
  protocol: HBONE
  node: node-b
services:
- name: web
  namespace: server-ns
  hostname: web.server-ns.svc.cluster.local
  vips: ["{VIP}"]
  ports: {{80: 8080}}
"#
    ));
    if !service_waypoint.is_empty() {
        cfg.push_str(&format!("  waypoint: {service_waypoint}\n"));
    }
    cfg
}

/// Node pair with ringway A only; the fake waypoint listens on node B at
/// 10.250.0.3:15008 and logs to the returned path.
fn rig(tag: &str, cfg: &str) -> (Nodes, std::process::Child, std::path::PathBuf) {
    let nodes = Nodes::with_config(tag, cfg, false, &[]);
    nodes.b.ip(&[
        "addr",
        "add",
        &format!("{WAYPOINT_IP}/24"),
        "dev",
        &nodes.veths.1,
    ]);
    nodes
        .a
        .ip(&["route", "add", "10.96.0.0/16", "dev", &nodes.veths.0]);
    let certs = nodes.issue(&nodes.ca_dir(), WAYPOINT_ID, "waypoint", "1h");
    let log = nodes.dir.path().join("waypoint.jsonl");
    let server = py_server_with(
        &nodes,
        &certs,
        &log,
        &["--listen", &format!("{WAYPOINT_IP}:15008")],
    );
    (nodes, server, log)
}

/// Sends `msg` from the client workload to `dst`, half-closes, returns
/// what came back.
fn echo_from_client(nodes: &Nodes, dst: &str, msg: &'static [u8]) -> std::io::Result<Vec<u8>> {
    let dst = dst.to_owned();
    nodes.a.enter(move || {
        let mut c = connect_from_client(&dst)?;
        c.write_all(msg)?;
        c.shutdown(Shutdown::Write)?;
        let mut got = Vec::new();
        c.read_to_end(&mut got)?;
        Ok(got)
    })
}

fn streams(log: &std::path::Path) -> Vec<serde_json::Value> {
    common::read_json_lines(log)
        .into_iter()
        .filter(|e| e["kind"] == "stream")
        .collect()
}

#[test]
fn a_service_with_a_waypoint_is_tunnelled_to_it_with_the_vip_as_authority() {
    let cfg = config(
        &format!("{{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: 15008}}"),
        "",
    );
    let (nodes, mut server, log) = rig("wps", &cfg);
    let got = echo_from_client(&nodes, &format!("{VIP}:80"), b"through the waypoint");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(got.unwrap(), b"through the waypoint");
    let seen = streams(&log);
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(
        seen[0]["authority"],
        format!("{VIP}:80"),
        "the VIP stays the authority"
    );
    assert_eq!(seen[0]["peer_identity"], CLIENT_ID);
    let forwarded = seen[0]["headers"]["forwarded"].as_str().unwrap_or_default();
    assert!(
        forwarded.starts_with("for=\"10.250.0.1:")
            && forwarded.ends_with(";host=web.server-ns.svc.cluster.local"),
        "ztunnel's forwarded names the service dialled: {forwarded}"
    );
    let logs = nodes.a().wait_access_logs(1);
    assert_eq!(logs[0]["route"], "service_waypoint", "{logs:#?}");
    assert_eq!(logs[0]["dst.identity"], WAYPOINT_ID, "{logs:#?}");
    assert_eq!(
        logs[0]["dst.addr"],
        format!("{WAYPOINT_IP}:15008"),
        "{logs:#?}"
    );
}

#[test]
fn a_workload_with_a_waypoint_is_tunnelled_to_it_when_addressed_directly() {
    let cfg = config(
        "",
        &format!("{{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: 15008}}"),
    );
    let (nodes, mut server, log) = rig("wpw", &cfg);
    let direct = echo_from_client(&nodes, &format!("{SERVER_IP}:9443"), b"to the pod");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(direct.unwrap(), b"to the pod");
    let seen = streams(&log);
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0]["authority"], format!("{SERVER_IP}:9443"));
    let logs = nodes.a().wait_access_logs(1);
    assert_eq!(logs[0]["route"], "workload_waypoint", "{logs:#?}");
    assert_eq!(logs[0]["dst.identity"], WAYPOINT_ID, "{logs:#?}");
}

#[test]
fn a_waypoint_that_cannot_be_found_refuses_the_connection() {
    // The service names a waypoint service nobody defined: the connection
    // must fail, not bypass the waypoint (that would skip its L7 policy).
    let cfg = config(
        "{destination: server-ns/missing.server-ns.svc.cluster.local}",
        "",
    );
    let (nodes, mut server, log) = rig("wpm", &cfg);
    let got = echo_from_client(&nodes, &format!("{VIP}:80"), b"must not pass");
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        got.as_ref().map_or(true, |b| b.is_empty()),
        "bytes came back through a missing waypoint: {got:?}"
    );
    assert!(streams(&log).is_empty());
    let logs = nodes.a().wait_access_logs(1);
    let error = logs[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("waypoint server-ns/missing.server-ns.svc.cluster.local")
            && error.contains("no such service"),
        "{logs:#?}"
    );
}
