//! The same-node fast path: HBONE to a workload of this node is served
//! in-process as inbound (the same policies and log lines, no TLS, one TCP
//! hop less). Node A holds the client (10.250.0.1) and a second HBONE
//! workload, "local" (10.250.0.5); node A's capture sends the client's
//! connections to it through ringway A.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};

use common::nodes::{base_config, connect_from_client, Nodes, CLIENT_ID};

const LOCAL_IP: &str = "10.250.0.5";
const LOCAL_ID: &str = "spiffe://cluster.local/ns/local-ns/sa/local";

fn config(policies: &str) -> String {
    format!(
        r#"{}- uid: cluster1//v1/Pod/local-ns/local
  name: local
  namespace: local-ns
  serviceAccount: local
  workloadIps: ["{LOCAL_IP}"]
  protocol: HBONE
  node: node-a
{policies}"#,
        base_config()
    )
}

/// Node A with the local workload's address, its echo application on 8080
/// and the capture of the client's connections to it (a local address, so
/// node A's veth rule does not see them).
fn rig(tag: &str, cfg: &str, extra: &[&str]) -> Nodes {
    let nodes = Nodes::with_config(tag, cfg, false, extra);
    nodes
        .a
        .ip(&["addr", "add", &format!("{LOCAL_IP}/32"), "dev", "lo"]);
    nodes.a.nft(&format!(
        "table inet local_capture {{
           chain out {{ type nat hook output priority -101; policy accept;
             ip daddr {LOCAL_IP} tcp dport 8080 meta mark & 0xfff != 0x539 redirect to :15001
           }}
         }}"
    ));
    nodes
        .a
        .enter(|| common::serve_echo(TcpListener::bind(format!("{LOCAL_IP}:8080")).unwrap()));
    nodes
}

fn echo(nodes: &Nodes, msg: &'static [u8]) -> std::io::Result<Vec<u8>> {
    nodes.a.enter(move || {
        let mut c = connect_from_client(&format!("{LOCAL_IP}:8080"))?;
        c.write_all(msg)?;
        c.shutdown(Shutdown::Write)?;
        let mut got = Vec::new();
        c.read_to_end(&mut got)?;
        Ok(got)
    })
}

#[test]
fn a_workload_on_this_node_is_served_in_process_with_both_log_lines() {
    let nodes = rig("fpy", &config(""), &[]);
    assert_eq!(echo(&nodes, b"same node").unwrap(), b"same node");
    let logs = nodes.a().wait_access_logs(2);
    let out = logs.iter().find(|l| l["path"] == "outbound").unwrap();
    let inb = logs.iter().find(|l| l["path"] == "inbound").unwrap();
    assert_eq!(out["route"], "same_node", "{logs:#?}");
    assert_eq!(
        out["dst.addr"],
        format!("{LOCAL_IP}:8080"),
        "no hop to 15008"
    );
    assert_eq!(out["src.identity"], CLIENT_ID);
    assert_eq!(out["dst.identity"], LOCAL_ID);
    assert!(
        out.get("hbone_conn").is_none(),
        "no HBONE connection: {out}"
    );
    assert_eq!(inb["src.identity"], CLIENT_ID, "{logs:#?}");
    assert_eq!(inb["bytes_recv"], 9, "the client's bytes, seen inbound");
    assert_eq!(inb["bytes_sent"], 9);
    assert_eq!(out["bytes_sent"], 9);
}

#[test]
fn the_destinations_policies_decide_on_the_fast_path_too() {
    let deny = format!(
        r#"  authorizationPolicies: [local-ns/deny-client]
policies:
- name: deny-client
  namespace: local-ns
  scope: WorkloadSelector
  action: Deny
  rules: [[[{{principals: [{{exact: "{}"}}]}}]]]
"#,
        &CLIENT_ID["spiffe://".len()..]
    );
    let nodes = rig("fpd", &config(&deny), &[]);
    let got = echo(&nodes, b"denied");
    assert!(
        got.as_ref().map_or(true, |b| b.is_empty()),
        "a denied connection carried bytes: {got:?}"
    );
    let logs = nodes.a().wait_access_logs(2);
    let inb = logs.iter().find(|l| l["path"] == "inbound").unwrap();
    let error = inb["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("401: authorization policy: explicitly denied by local-ns/deny-client"),
        "{logs:#?}"
    );
}

#[test]
fn without_the_fast_path_the_same_connection_takes_the_hbone_hop() {
    // Ringway A's 15008 must answer on the local workload's address too.
    let inbound = format!("--inbound-addr={LOCAL_IP}:15008");
    let nodes = rig("fpn", &config(""), &["--no-fast-path", &inbound]);
    assert_eq!(echo(&nodes, b"via 15008").unwrap(), b"via 15008");
    let logs = nodes.a().wait_access_logs(2);
    let out = logs.iter().find(|l| l["path"] == "outbound").unwrap();
    assert_eq!(out["route"], "hbone", "{logs:#?}");
    assert_eq!(out["dst.addr"], format!("{LOCAL_IP}:15008"));
}

#[test]
fn a_workload_on_another_node_never_takes_the_fast_path() {
    // The same address, but the config puts the workload on node B: its
    // traffic must go out as HBONE (here to nobody, so it fails), never as
    // plaintext straight to the application.
    let cfg = config("").replace(
        "  workloadIps: [\"10.250.0.5\"]\n  protocol: HBONE\n  node: node-a",
        "  workloadIps: [\"10.250.0.5\"]\n  protocol: HBONE\n  node: node-b",
    );
    assert_ne!(cfg, config(""), "the local workload moved to node B");
    let nodes = rig("fpo", &cfg, &[]);
    let got = echo(&nodes, b"must not pass in plaintext");
    assert!(
        got.as_ref().map_or(true, |b| b.is_empty()),
        "reached the application directly: {got:?}"
    );
    let logs = nodes.a().wait_access_logs(1);
    let out = logs.iter().find(|l| l["path"] == "outbound").unwrap();
    assert_eq!(out["route"], "hbone", "{logs:#?}");
}
