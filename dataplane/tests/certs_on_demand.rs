//! Certificates on demand without `--node-name`: ringway prefetches only
//! the workloads at the host's own addresses, is ready without waiting for
//! the rest of the mesh's identities, and fetches a remote workload's
//! certificate when its first connection needs it.
//!
//! The rig: namespace "node" (ringway, with the server workload's address
//! on its loopback and the edge workload's on its veth) and namespace
//! "pod" (a workload whose address is its own, not the node's), joined by
//! a veth; the node captures the pod's traffic to port 9000 into ringway's
//! outbound listener, as a node-level CNI would.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::{NetNs, PATIENCE};

const NODE_IP: &str = "10.250.1.1";
const POD_IP: &str = "10.250.1.2";
const SERVER_IP: &str = "10.250.2.1";
const SERVER_ID: &str = "spiffe://cluster.local/ns/cod-server/sa/server";
const EDGE_ID: &str = "spiffe://cluster.local/ns/cod-edge/sa/edge";
const POD_ID: &str = "spiffe://cluster.local/ns/cod-pod/sa/pod";
/// Remote workloads, each its own service account.
const REMOTE: usize = 2000;

fn workload(uid: &str, ns: &str, sa: &str, ip: &str) -> String {
    let name = uid.rsplit('/').next().unwrap();
    format!(
        "- uid: {uid}\n  name: {name}\n  namespace: {ns}\n  serviceAccount: {sa}\n  \
         workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: node-x\n"
    )
}

/// `workloads` (uid, namespace, service account, address) and `REMOTE`
/// others, each its own service account, at 10.<net>.x.y.
fn mesh(workloads: &[(&str, &str, &str, &str)], net: u8) -> String {
    let mut yaml = String::from("workloads:\n");
    for (uid, ns, sa, ip) in workloads {
        yaml += &workload(uid, ns, sa, ip);
    }
    for i in 0..REMOTE {
        let ip = format!("10.{net}.{}.{}", i / 250, i % 250 + 1);
        yaml += &workload(&format!("c//Pod/far/w{i}"), "far", &format!("sa{i}"), &ip);
    }
    yaml + "services: []\npolicies: []\n"
}

fn message_identities(rw: &common::Ringway, message: &str) -> BTreeSet<String> {
    rw.logs()
        .iter()
        .filter(|l| l["message"] == message)
        .filter_map(|l| l["identity"].as_str().map(str::to_owned))
        .collect()
}

fn dumped_certificates(rw: &common::Ringway) -> Vec<(String, String)> {
    let (status, body) = rw.http_get("admin", "/config_dump");
    assert!(status.contains("200"), "{status}");
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    dump["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["identity"].as_str().unwrap().to_owned(),
                c["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn only_local_workloads_are_prefetched_and_others_fetched_on_first_use() {
    let node = NetNs::new("codn");
    let pod = NetNs::new("codp");
    let (node_if, _) = common::veth(&node, NODE_IP, &pod, POD_IP);
    node.ip(&["addr", "add", &format!("{SERVER_IP}/32"), "dev", "lo"]);
    pod.ip(&["route", "add", "10.250.2.0/24", "via", NODE_IP]);
    node.nft(&format!(
        "table inet ringway_test {{
           chain pre {{ type nat hook prerouting priority -100; policy accept;
             iifname \"{node_if}\" meta l4proto tcp tcp dport 9000 redirect to :15001;
           }}
         }}"
    ));
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh(
        &[
            (
                "c//Pod/cod-server/server",
                "cod-server",
                "server",
                SERVER_IP,
            ),
            ("c//Pod/cod-edge/edge", "cod-edge", "edge", NODE_IP),
            ("c//Pod/cod-pod/pod", "cod-pod", "pod", POD_IP),
        ],
        251,
    );
    let cfg = common::write_config(dir.path(), "mesh.yaml", &mesh);

    let started = Instant::now();
    let rw = node.ringway(&["--config", cfg.to_str().unwrap(), "--cores", "1"]);
    common::wait_for("readiness", PATIENCE, || {
        let (status, _) = rw.http_get("readiness", "/healthz/ready");
        if status.contains("200") {
            Ok(())
        } else {
            Err(status)
        }
    });
    let ready_after = started.elapsed();

    // Ready with the certificates of the two workloads at the node's
    // addresses, and none of the 2001 others'.
    let dumped = dumped_certificates(&rw);
    assert_eq!(
        dumped,
        [
            (EDGE_ID.to_owned(), "Available".to_owned()),
            (SERVER_ID.to_owned(), "Available".to_owned()),
        ],
        "ready after {ready_after:?}"
    );

    // The pod's first connection: its certificate is fetched then, and
    // the connection goes through (pod → ringway's outbound → HBONE as
    // the pod → ringway's inbound → the server).
    node.enter(|| common::serve_tag("10.250.2.1:9000", "cod-server"));
    let reply = pod
        .enter(|| common::ask_from(POD_IP, "10.250.2.1:9000"))
        .expect("the pod's first connection");
    assert_eq!(reply, "cod-server");
    let fetched = rw.wait_log("the pod's certificate fetched on demand", |l| {
        l["message"] == "workload certificate ready" && l["identity"] == POD_ID
    });
    assert_eq!(fetched["level"], "info", "{fetched}");
    // Startup issued the local two only (the log is written by its own
    // thread: these lines are older than the one just waited for).
    let local = BTreeSet::from([SERVER_ID.to_owned(), EDGE_ID.to_owned()]);
    assert_eq!(
        message_identities(&rw, "issued workload certificate"),
        local
    );
    // And it is served now, listed beside the local ones.
    let dumped: Vec<String> = dumped_certificates(&rw)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(dumped, [EDGE_ID, POD_ID, SERVER_ID]);
    // A second connection uses it as it is.
    let again = pod.enter(|| common::ask_from(POD_IP, "10.250.2.1:9000"));
    assert_eq!(again.unwrap(), "cod-server");
    assert_eq!(
        rw.logs()
            .iter()
            .filter(|l| l["message"] == "workload certificate ready" && l["identity"] == POD_ID)
            .count(),
        1
    );
    eprintln!("ready after {ready_after:?} with {} identities", REMOTE + 3);
}

/// In-pod mode without `--node-name`: this node's workloads are the pods
/// the node agent enrolled, so readiness waits for no certificate before
/// the first pod and each enrolment brings its pod's, not the mesh's.
#[test]
fn in_pod_prefetches_the_enrolled_pods_only() {
    use common::inpod::{connect, pod_pair, round_trip, serve_app, spiffe, wait_ready};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pod_pair("cod", 9);
    let cfg = common::write_config(
        dir.path(),
        "mesh.yaml",
        &mesh(
            &[
                (
                    "Kubernetes//Pod/ns-a/client",
                    "ns-a",
                    "sa-client",
                    a.ip.as_str(),
                ),
                (
                    "Kubernetes//Pod/ns-b/server",
                    "ns-b",
                    "sa-server",
                    b.ip.as_str(),
                ),
            ],
            252,
        ),
    );
    let agent = common::zds::Agent::listen(&dir.path().join("zds.sock"));
    let rw = common::Ringway::start(
        None,
        &[
            "--inpod",
            "--inpod-uds",
            agent.path.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--ca-dir",
            dir.path().join("ca").to_str().unwrap(),
            "--cores",
            "1",
        ],
    );
    let conn = agent.accept(std::time::Duration::from_secs(10));
    assert_eq!(conn.snapshot_sent(), "");
    wait_ready(&rw, true);
    assert_eq!(dumped_certificates(&rw), []);

    assert_eq!(
        conn.add("pod-a", &a.ns.name, "ns-a", "client", "sa-client"),
        ""
    );
    let client = (spiffe("ns-a", "sa-client"), "Available".to_owned());
    common::wait_for("the enrolled pod's certificate", PATIENCE, || {
        let dumped = dumped_certificates(&rw);
        if dumped == [client.clone()] {
            Ok(())
        } else {
            Err(format!("{dumped:?}"))
        }
    });
    wait_ready(&rw, true);

    assert_eq!(
        conn.add("pod-b", &b.ns.name, "ns-b", "server", "sa-server"),
        ""
    );
    let server = (spiffe("ns-b", "sa-server"), "Available".to_owned());
    common::wait_for("both pods' certificates", PATIENCE, || {
        let dumped = dumped_certificates(&rw);
        if dumped == [client.clone(), server.clone()] {
            Ok(())
        } else {
            Err(format!("{dumped:?}"))
        }
    });
    serve_app(&b, 8080);
    let mut s = connect(&a, &format!("{}:8080", b.ip)).unwrap();
    assert_eq!(round_trip(&mut s, "hello"), format!("peer={}", a.ip));
    assert!(
        !rw.logs()
            .iter()
            .any(|l| l["message"] == "issued workload certificate"),
        "nothing is issued at startup before the agent names the pods"
    );
}
