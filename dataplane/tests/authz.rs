//! Authorization end to end, on the two-node rig (tests/common/nodes.rs):
//! which identity may reach which port through HBONE (with the independent
//! Python client presenting each identity), STRICT mTLS refusing
//! plaintext on 15006, late rejection of live tunnels after a config edit,
//! dry runs that only log, and the fail-closed rules for unknown sources
//! and non-local destinations.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::nodes::{
    base_config, client_args, connect_from_client, py_client, Nodes, CLIENT_ID, SERVER_IP,
};
use common::{in_netns, peer_closed, NetNs};

const ALICE: &str = "spiffe://cluster.local/ns/a/sa/alice";
const BOB: &str = "spiffe://cluster.local/ns/b/sa/bob";

/// A policy in the local-config schema, appended to the rig's mesh.
fn with_policies(policies: &str) -> String {
    format!("{}policies:\n{policies}", base_config())
}

/// An echo app on node B at `port` that counts the connections it accepts:
/// what a refusal must keep at zero.
fn echo_app(nodes: &Nodes, port: u16) -> Arc<AtomicUsize> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let l = nodes
        .b
        .enter(move || TcpListener::bind(format!("{SERVER_IP}:{port}")).unwrap());
    let count = accepted.clone();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            count.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    accepted
}

/// The Python HBONE client on node A, as `identity`, to `SERVER_IP:port`:
/// sends 1000 bytes; returns (exit code, status, result JSON).
fn hbone_as(nodes: &Nodes, identity: &str, port: u16) -> (i32, serde_json::Value) {
    let name = identity.rsplit('/').next().unwrap().to_string();
    let certs = nodes.dir.path().join(&name);
    let certs = if certs.exists() {
        certs
    } else {
        nodes.issue(&nodes.ca_dir(), identity, &name, "1h")
    };
    let root = nodes.ca_dir().join("root-cert.pem");
    let mut args = client_args(&certs, &root, &format!("{SERVER_IP}:{port}"));
    args.extend(["--send-bytes".into(), "1000".into()]);
    let (code, out) = py_client(&nodes.a, &args);
    (code, out)
}

fn error_of(l: &serde_json::Value) -> &str {
    l["error"].as_str().unwrap_or("")
}

const DENY_BOB_ON_9000: &str = r#"
- name: deny-bob
  namespace: server-ns
  scope: Namespace
  action: Deny
  dryRun: false
  rules: [[[ {principals: [{exact: "cluster.local/ns/b/sa/bob"}], destinationPorts: [9000]} ]]]
"#;

/// A DENY on a port: Alice gets through, Bob gets 401 and nothing reaches
/// the application; on another port Bob is let in (the port the policy sees
/// is the application's, not 15008).
#[test]
fn identity_and_port_decide_through_hbone() {
    let nodes = Nodes::with_config("idp", &with_policies(DENY_BOB_ON_9000), true, &[]);
    let on_9000 = echo_app(&nodes, 9000);
    let on_9001 = echo_app(&nodes, 9001);

    let (code, out) = hbone_as(&nodes, ALICE, 9000);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(out["received"][0], 1000, "echoed by the app: {out}");
    assert_eq!(on_9000.load(Ordering::SeqCst), 1);

    let (_, out) = hbone_as(&nodes, BOB, 9000);
    assert_eq!(out["status"][0], 401, "{out}");
    assert_eq!(out["received"][0], 0, "{out}");
    assert_eq!(
        on_9000.load(Ordering::SeqCst),
        1,
        "nothing reaches the application after a 401"
    );
    let denied = nodes.b().wait_log("Bob's 401", |l| {
        l["scope"] == "access" && l["src.identity"] == BOB
    });
    assert_eq!(
        error_of(&denied),
        "401: authorization policy: explicitly denied by server-ns/deny-bob",
        "{denied}"
    );
    assert_eq!(denied["dst.hbone_addr"], format!("{SERVER_IP}:9000"));

    let (code, out) = hbone_as(&nodes, BOB, 9001);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(on_9001.load(Ordering::SeqCst), 1);
}

const STRICT: &str = r#"
- name: istio_converted_static_strict
  namespace: istio-system
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules: [[[ {notPrincipals: [{presence: {}}]} ]]]
"#;

/// The mesh with the server workload selecting istiod's STRICT policy.
fn strict_config() -> String {
    with_policies(STRICT).replace(
        "  node: node-b\n",
        "  node: node-b\n  authorizationPolicies: [\"istio-system/istio_converted_static_strict\"]\n",
    )
}

/// Plain TCP from node A that skips node A's capture (marked as ringway
/// marks its own sockets), straight to node B.
fn plaintext(dst: &str) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.set_mark(0x539)?;
    sock.connect_timeout(
        &dst.parse::<SocketAddr>().unwrap().into(),
        Duration::from_secs(5),
    )?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Node B's inbound capture, as a CNI installs it: plaintext arriving for
/// `ports` goes to 15006.
fn capture_inbound(nodes: &Nodes, ports: &str) {
    nodes.b.nft(&format!(
        "table inet ringway_inbound {{
           chain pre {{ type nat hook prerouting priority -100; policy accept;
             iifname \"{}\" tcp dport {{ {ports} }} redirect to :15006;
           }}
         }}",
        nodes.veth_b()
    ));
}

/// STRICT PeerAuthentication (as istiod converts it): plaintext captured to
/// 15006 is refused, HBONE passes. And 15006 delivers only to local
/// workloads: an address on the node that is none is refused too.
#[test]
fn strict_mtls_refuses_plaintext_and_admits_hbone() {
    let nodes = Nodes::with_config("strict", &strict_config(), true, &[]);
    let accepted = echo_app(&nodes, 9000);
    // 10.250.0.9 is on node B but no workload.
    nodes
        .b
        .ip(&["addr", "add", "10.250.0.9/24", "dev", &nodes.veth_b()]);
    capture_inbound(&nodes, "9000, 9002");
    let other = nodes
        .b
        .enter(|| TcpListener::bind("10.250.0.9:9002").unwrap());
    other.set_nonblocking(true).unwrap();

    let (plain, stray) = in_netns(&nodes.a.name, || {
        // The refusal may reset the connection before connect() returns.
        let probe = |dst: &str| match plaintext(dst) {
            Ok(mut c) => {
                let _ = c.write_all(b"hello in plaintext");
                let r = c.read(&mut [0u8; 64]);
                peer_closed(&r)
            }
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        (
            probe(&format!("{SERVER_IP}:9000")),
            probe("10.250.0.9:9002"),
        )
    });
    assert!(plain, "plaintext to a STRICT workload must be closed");
    assert!(stray, "plaintext to a non-workload address must be closed");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "nothing reached the app"
    );
    assert!(other.accept().is_err(), "nothing reached 10.250.0.9");
    let refusal = nodes.b().wait_log("the STRICT refusal", |l| {
        l["scope"] == "access"
            && l["path"] == "inbound_passthrough"
            && l["dst.addr"] == format!("{SERVER_IP}:9000")
    });
    assert_eq!(
        error_of(&refusal),
        "refused: authorization policy: explicitly denied by istio-system/istio_converted_static_strict"
    );
    let stray_log = nodes.b().wait_log("the non-local refusal", |l| {
        l["scope"] == "access" && l["dst.addr"] == "10.250.0.9:9002"
    });
    assert_eq!(
        error_of(&stray_log),
        "refused: no local workload at 10.250.0.9"
    );

    // mTLS through the two ringways: admitted.
    let echoed = in_netns(&nodes.a.name, || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:9000")).unwrap();
        c.write_all(b"over hbone").unwrap();
        let mut got = [0u8; 10];
        c.read_exact(&mut got).map(|_| got)
    });
    assert_eq!(&echoed.unwrap(), b"over hbone");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// A live tunnel whose identity a config edit denies is closed within a
/// second of the new snapshot: both the client's connection and the
/// application's, with the reason in the access log. A tunnel still
/// allowed is left alone.
#[test]
fn late_rejection_closes_a_live_tunnel_after_a_config_edit() {
    let poll = ["--config-poll-interval", "50ms"];
    let nodes = Nodes::with_config("late", &with_policies("  []\n"), true, &poll);
    let accepted = echo_app(&nodes, 9000);
    let _other = echo_app(&nodes, 9001);
    let (mut doomed, mut spared) = in_netns(&nodes.a.name, || {
        let open = |port: u16| {
            let mut c = connect_from_client(&format!("{SERVER_IP}:{port}")).unwrap();
            c.write_all(b"ping").unwrap();
            let mut got = [0u8; 4];
            c.read_exact(&mut got).unwrap();
            c
        };
        (open(9000), open(9001))
    });
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // Deny the client's identity on port 9000 only.
    let deny_client = r#"
- name: deny-client-9000
  namespace: server-ns
  scope: Namespace
  action: Deny
  dryRun: false
  rules: [[[ {principals: [{exact: "cluster.local/ns/client-ns/sa/client"}], destinationPorts: [9000]} ]]]
"#;
    nodes.set_config(&with_policies(deny_client));
    nodes.b().wait_log("the edit applied on node B", |l| {
        l["fields"]["message"] == "published local config"
            || l["message"] == "published local config"
    });
    let applied = Instant::now();
    doomed
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = doomed.read(&mut [0u8; 16]);
    let took = applied.elapsed();
    assert!(peer_closed(&r), "the denied tunnel was not closed: {r:?}");
    assert!(
        took < Duration::from_secs(1),
        "closed {took:?} after the snapshot"
    );

    // The spared tunnel still carries bytes.
    spared.write_all(b"still").unwrap();
    let mut got = [0u8; 5];
    spared.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still");

    let closed = nodes.b().wait_log("the late rejection", |l| {
        l["scope"] == "access" && error_of(l).starts_with("closed: late rejection")
    });
    assert_eq!(
        error_of(&closed),
        "closed: late rejection: authorization policy: explicitly denied by server-ns/deny-client-9000"
    );
    assert_eq!(closed["src.identity"], CLIENT_ID);
    assert_eq!(closed["dst.hbone_addr"], format!("{SERVER_IP}:9000"));
    // Per core: the core holding the doomed tunnel checked it and closed it.
    let summary = nodes.b().wait_log("the re-check summary", |l| {
        l["closed"] == 1 && l["late_rejections"].as_u64().is_some()
    });
    assert!(summary["checked"].as_u64().unwrap() >= 1, "{summary}");
    // New connections as the client to 9000 are refused from now on.
    let again = in_netns(&nodes.a.name, || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:9000")).unwrap();
        let _ = c.write_all(b"ping");
        let r = c.read(&mut [0u8; 4]);
        peer_closed(&r)
    });
    assert!(again);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// A dry-run DENY that matches lets the connection through and says so in
/// the log, naming the policy.
#[test]
fn dry_run_only_logs() {
    let dry = DENY_BOB_ON_9000
        .replace("deny-bob", "deny-bob-dry")
        .replace("dryRun: false", "dryRun: true");
    let nodes = Nodes::with_config("dry", &with_policies(&dry), true, &[]);
    let accepted = echo_app(&nodes, 9000);
    let (code, out) = hbone_as(&nodes, BOB, 9000);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"][0], 200, "{out}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let line = nodes
        .b()
        .wait_log("the dry-run report", |l| l["scope"] == "authz");
    assert_eq!(line["policy"], "server-ns/deny-bob-dry", "{line}");
    assert_eq!(line["src.identity"], BOB, "{line}");
    assert_eq!(line["dst.addr"], format!("{SERVER_IP}:9000"), "{line}");
    let message = line["message"]
        .as_str()
        .or(line["fields"]["message"].as_str())
        .unwrap_or_default();
    assert_eq!(message, "dry-run: deny policy match", "{line}");
}

/// Outbound from a source that is no workload is refused, so nothing
/// leaves before the first config: here ringway waits for an xDS server
/// that never answers. `--allow-unknown-source` lets it out (labs).
#[test]
fn unknown_sources_are_refused_unless_allowed() {
    let ns = NetNs::new("unk");
    ns.capture_outbound("9000-9999");
    ns.enter(|| common::serve_tag("127.0.0.9:9400", "reached"));
    // No config yet: the control plane is unreachable.
    let rw = ns.ringway(&["--xds-address", "http://127.0.0.1:1"]);
    let r = ns.enter(|| common::ask("127.0.0.9:9400"));
    assert!(
        r.as_ref().map_or(true, |s| s.is_empty()),
        "left before any config: {r:?}"
    );
    let refusal = rw.wait_log("the refusal", |l| l["scope"] == "access");
    assert!(
        error_of(&refusal).starts_with("refused: unknown source 127.0.0.1"),
        "{refusal}"
    );
    drop(rw);

    let open = ns.ringway(&["--allow-unknown-source"]);
    assert_eq!(
        ns.enter(|| common::ask("127.0.0.9:9400")).unwrap(),
        "reached"
    );
    drop(open);
}

/// Late rejection on 15006 too: turning STRICT on closes an open plaintext
/// connection, with a reset (it believed it was connected).
#[test]
fn late_rejection_resets_plaintext_when_strict_arrives() {
    let poll = ["--config-poll-interval", "50ms"];
    let nodes = Nodes::with_config("latep", &with_policies("  []\n"), true, &poll);
    let accepted = echo_app(&nodes, 9000);
    capture_inbound(&nodes, "9000");
    let mut c = in_netns(&nodes.a.name, || {
        let mut c = plaintext(&format!("{SERVER_IP}:9000")).unwrap();
        c.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        c
    });
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    nodes.set_config(&strict_config());
    let r = c.read(&mut [0u8; 16]);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset: {r:?}"
    );
    let closed = nodes.b().wait_log("the late rejection", |l| {
        l["scope"] == "access" && l["path"] == "inbound_passthrough" && !error_of(l).is_empty()
    });
    assert_eq!(
        error_of(&closed),
        "closed: late rejection: authorization policy: explicitly denied by \
         istio-system/istio_converted_static_strict"
    );
}

/// An HBONE CONNECT to one of ringway's own ports would come back into
/// ringway: 400, as ztunnel answers it.
#[test]
fn a_tunnel_into_ringways_own_port_is_a_self_call() {
    let nodes = Nodes::with_config("self", &base_config(), true, &[]);
    let (_, out) = hbone_as(&nodes, ALICE, 15008);
    assert_eq!(out["status"][0], 400, "{out}");
    let refusal = nodes.b().wait_log("the refusal", |l| {
        l["scope"] == "access" && l["src.identity"] == ALICE
    });
    assert!(error_of(&refusal).contains("self call"), "{refusal}");
}
