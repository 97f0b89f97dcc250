//! Differential authorization: the same L4 policies and the same probes
//! through ringway and through the real Istio ztunnel, with the same
//! verdict required for every probe. This is the acceptance test that
//! ringway's authorization matches ztunnel's.
//!
//! Two identical nodes, each a client namespace joined by a veth to a
//! server namespace (client 10.250.0.1 plus .11 and .12 for source-IP
//! rules, the server workload 10.250.0.2 with an echo app on 9000 and 9001,
//! and plaintext to those ports captured to 15006 as a CNI does). One
//! server namespace runs ringway, the other ztunnel (common/ztunnel.rs),
//! both under the root of ztunnel's fake CA, on the same LOCAL_XDS file,
//! restarted for every scenario. Probes: the independent Python HBONE
//! client as alice, bob and carol (CONNECT status, and whether the app
//! echoed), and plain TCP from several sources (carried or closed).
//!
//! Needs the ztunnel peer (see common/ztunnel.rs for RINGWAY_ZTUNNEL).
//! Prints a table per scenario to stderr (`-- --nocapture`); fails, after
//! all scenarios ran, with the table of every scenario where a verdict
//! differs, its config and both proxies' log lines for each such probe.

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::nodes::{client_args, py_client, CLIENT_IP, SERVER_IP};
use common::ztunnel::{self, Ztunnel};
use common::{in_netns, peer_closed, veth, write_config, NetNs};

/// The server workload, as ztunnel's PROXY_WORKLOAD_INFO.
const WORKLOAD: &str = "srv/server/server";
const PORTS: [u16; 2] = [9000, 9001];
/// The client's addresses: its own, and two more for source-IP rules.
const SOURCES: [&str; 3] = [CLIENT_IP, "10.250.0.11", "10.250.0.12"];
const IDENTITIES: [(&str, &str); 3] = [
    ("alice", "spiffe://cluster.local/ns/a/sa/alice"),
    ("bob", "spiffe://cluster.local/ns/b/sa/bob"),
    ("carol", "spiffe://cluster.local/ns/b/sa/carol"),
];
const PAYLOAD: u64 = 1000;

/// One scenario: policies (YAML list items, the same text for both
/// proxies) and the policy keys the workload selects.
struct Scenario {
    name: String,
    selected: &'static [&'static str],
    policies: Vec<String>,
}

/// A policy item in the LOCAL_XDS schema (`key` is `namespace/name`).
/// ztunnel's parser is strict: `dryRun` must be written, string matches
/// are YAML tags (`!Exact "..."`, `!Presence []`).
fn policy(key: &str, scope: &str, action: &str, dry_run: bool, rules: &str) -> String {
    let (namespace, name) = key.split_once('/').unwrap();
    format!(
        "- name: {name}\n  namespace: {namespace}\n  scope: {scope}\n  action: {action}\n  dryRun: {dry_run}\n  rules: {rules}\n"
    )
}

/// A Namespace-scope policy in the workload's namespace.
fn srv(name: &str, action: &str, rules: &str) -> String {
    policy(&format!("srv/{name}"), "Namespace", action, false, rules)
}

const DENY_BOB: &str = r#"[[[ {principals: [!Exact "cluster.local/ns/b/sa/bob"]} ]]]"#;
const NS_A: &str = r#"[[[ {namespaces: [!Exact "a"]} ]]]"#;
const STRICT_KEY: &str = "istio-system/istio_converted_static_strict";
const STRICT: &str = "[[[ {notPrincipals: [!Presence []]} ]]]";

fn scenarios() -> Vec<Scenario> {
    let s = |name: &str, policies| Scenario {
        name: name.to_string(),
        selected: &[],
        policies,
    };
    let strict = |rules: &str| policy(STRICT_KEY, "WorkloadSelector", "Deny", false, rules);
    let mut v = vec![
        s("no policies", vec![]),
        s(
            "DENY principal exact on 9000",
            vec![srv(
                "deny-bob",
                "Deny",
                r#"[[[ {destinationPorts: [9000], principals: [!Exact "cluster.local/ns/b/sa/bob"]} ]]]"#,
            )],
        ),
        s(
            // Istio writes principals without the scheme: this one matches nobody.
            "DENY principal written with spiffe://",
            vec![srv(
                "deny-bob-scheme",
                "Deny",
                r#"[[[ {principals: [!Exact "spiffe://cluster.local/ns/b/sa/bob"]} ]]]"#,
            )],
        ),
        s(
            "ALLOW principal prefix or suffix",
            vec![srv(
                "allow-some",
                "Allow",
                r#"[[[ {principals: [!Prefix "cluster.local/ns/b/sa/c", !Suffix "/sa/alice"]} ]]]"#,
            )],
        ),
        s(
            "ALLOW principal presence",
            vec![srv(
                "allow-any-id",
                "Allow",
                "[[[ {principals: [!Presence []]} ]]]",
            )],
        ),
        s("ALLOW namespace", vec![srv("allow-ns-a", "Allow", NS_A)]),
        s(
            "ALLOW service account",
            vec![srv(
                "allow-carol",
                "Allow",
                "[[[ {serviceAccounts: [{namespace: b, serviceAccount: carol}]} ]]]",
            )],
        ),
        s(
            "DENY not_principals",
            vec![srv(
                "deny-not-alice",
                "Deny",
                r#"[[[ {notPrincipals: [!Exact "cluster.local/ns/a/sa/alice"]} ]]]"#,
            )],
        ),
        s(
            "ALLOW not_principals",
            vec![srv(
                "allow-not-b",
                "Allow",
                r#"[[[ {notPrincipals: [!Prefix "cluster.local/ns/b/"]} ]]]"#,
            )],
        ),
        s(
            "DENY not_namespaces",
            vec![srv(
                "deny-not-b",
                "Deny",
                r#"[[[ {notNamespaces: [!Exact "b"]} ]]]"#,
            )],
        ),
        s(
            "DENY not_service_accounts on 9001",
            vec![srv(
                "deny-not-bob",
                "Deny",
                "[[[ {notServiceAccounts: [{namespace: b, serviceAccount: bob}], destinationPorts: [9001]} ]]]",
            )],
        ),
        s(
            // 10.250.0.9/29 has host bits set: both treat it as .8-.15.
            "ALLOW source IPs",
            vec![srv(
                "allow-src",
                "Allow",
                r#"[[[ {sourceIps: ["10.250.0.9/29", "10.250.0.1/32"], destinationPorts: [9001]}, {sourceIps: ["10.250.0.12/32"]} ]]]"#,
            )],
        ),
        s(
            "DENY not_source_ips",
            vec![srv(
                "deny-not-src",
                "Deny",
                r#"[[[ {notSourceIps: ["10.250.0.0/29"]} ]]]"#,
            )],
        ),
        s(
            "ALLOW destination IPs (two rules)",
            vec![srv(
                "allow-dst",
                "Allow",
                r#"[ [[ {destinationIps: ["10.250.0.2/32"], destinationPorts: [9000]} ]], [[ {destinationIps: ["10.99.0.0/16"]} ]] ]"#,
            )],
        ),
        s(
            "DENY not_destination_ips",
            vec![
                srv(
                    "deny-not-here",
                    "Deny",
                    r#"[[[ {notDestinationIps: ["10.250.0.0/24"]} ]]]"#,
                ),
                srv(
                    "deny-not-elsewhere-9001",
                    "Deny",
                    r#"[[[ {notDestinationIps: ["10.99.0.0/16"], destinationPorts: [9001]} ]]]"#,
                ),
            ],
        ),
        s(
            "ALLOW destination ports",
            vec![srv("allow-9001", "Allow", "[[[ {destinationPorts: [9001]} ]]]")],
        ),
        s(
            "DENY not_destination_ports",
            vec![srv(
                "deny-not-9001",
                "Deny",
                "[[[ {notDestinationPorts: [9001]} ]]]",
            )],
        ),
        s(
            "ALLOW two clauses (AND)",
            vec![srv(
                "allow-b-on-9000",
                "Allow",
                r#"[[ [ {namespaces: [!Exact "b"]} ], [ {destinationPorts: [9000]} ] ]]"#,
            )],
        ),
        s(
            "ALLOW two matches in a clause (OR)",
            vec![srv(
                "allow-a-or-9001",
                "Allow",
                r#"[[[ {namespaces: [!Exact "a"]}, {destinationPorts: [9001]} ]]]"#,
            )],
        ),
        s(
            "DENY wins over ALLOW",
            vec![
                srv(
                    "allow-ns-b",
                    "Allow",
                    r#"[[[ {namespaces: [!Exact "b"]} ]]]"#,
                ),
                srv("deny-bob", "Deny", DENY_BOB),
            ],
        ),
    ];
    // Degenerate rule trees: no rules, a Match with no field set, a clause
    // without matches, a rule without clauses.
    for (what, rules) in [
        ("empty rules", "[]"),
        ("a Match with all fields empty", "[[[ {} ]]]"),
        ("a clause without matches", "[[[]]]"),
        ("a rule without clauses", "[[]]"),
    ] {
        for action in ["Allow", "Deny"] {
            v.push(s(
                &format!("{} with {what}", action.to_uppercase()),
                vec![srv("degenerate", action, rules)],
            ));
        }
    }
    v.extend([
        s(
            "dry-run DENY",
            vec![policy(
                "srv/deny-bob-dry",
                "Namespace",
                "Deny",
                true,
                DENY_BOB,
            )],
        ),
        s(
            "dry-run ALLOW",
            vec![policy("srv/allow-a-dry", "Namespace", "Allow", true, NS_A)],
        ),
        Scenario {
            name: "STRICT (istiod's converted PeerAuthentication)".into(),
            selected: &[STRICT_KEY],
            policies: vec![strict(STRICT)],
        },
        Scenario {
            name: "STRICT with a PERMISSIVE port 9001".into(),
            selected: &[STRICT_KEY],
            policies: vec![strict(
                "[[[ {notPrincipals: [!Presence []], notDestinationPorts: [9001]} ]]]",
            )],
        },
        s("STRICT not selected by the workload", vec![strict(STRICT)]),
        Scenario {
            name: "the workload selects a policy that does not exist".into(),
            selected: &["srv/missing"],
            policies: vec![srv("deny-bob", "Deny", DENY_BOB)],
        },
        s(
            "GLOBAL in istio-system",
            vec![policy(
                "istio-system/deny-bob-everywhere",
                "Global",
                "Deny",
                false,
                DENY_BOB,
            )],
        ),
        s(
            "GLOBAL in another namespace",
            vec![policy(
                "other/deny-carol-everywhere",
                "Global",
                "Deny",
                false,
                r#"[[[ {principals: [!Suffix "/sa/carol"]} ]]]"#,
            )],
        ),
        s(
            "Namespace scope in another namespace",
            vec![
                policy("other/allow-ns-a", "Namespace", "Allow", false, NS_A),
                policy("other/deny-bob", "Namespace", "Deny", false, DENY_BOB),
            ],
        ),
    ]);
    v
}

impl Scenario {
    /// The LOCAL_XDS file both proxies read. `trustDomain` and `services`
    /// are explicit because ztunnel requires or defaults them differently.
    fn config(&self) -> String {
        let selected: Vec<String> = self.selected.iter().map(|k| format!("{k:?}")).collect();
        format!(
            r#"workloads:
- uid: cluster1//v1/Pod/srv/server
  name: server
  namespace: srv
  serviceAccount: server
  trustDomain: cluster.local
  workloadIps: ["{SERVER_IP}"]
  protocol: HBONE
  node: local
  services: {{}}
  authorizationPolicies: [{}]
policies:{}
{}"#,
            selected.join(", "),
            if self.policies.is_empty() { " []" } else { "" },
            self.policies.concat()
        )
    }
}

#[derive(Clone, Copy)]
enum Probe {
    /// The Python HBONE client as an identity (index into IDENTITIES).
    Hbone {
        who: usize,
        src: &'static str,
        port: u16,
    },
    /// Plain TCP, captured to 15006.
    Plain { src: &'static str, port: u16 },
}

fn probes() -> Vec<Probe> {
    let mut v = vec![];
    for port in PORTS {
        for who in 0..IDENTITIES.len() {
            v.push(Probe::Hbone {
                who,
                src: CLIENT_IP,
                port,
            });
        }
        v.push(Probe::Hbone {
            who: 0,
            src: SOURCES[1],
            port,
        });
    }
    for port in PORTS {
        for src in SOURCES {
            v.push(Probe::Plain { src, port });
        }
    }
    v
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Probe::Hbone { who, src, port } => {
                write!(f, "hbone {:<5} from {src:<11} -> {port}", IDENTITIES[who].0)
            }
            Probe::Plain { src, port } => write!(f, "plain       from {src:<11} -> {port}"),
        }
    }
}

impl Probe {
    /// Whether a log line is about this probe (for the mismatch report):
    /// its destination, its identity (none for plaintext), and no other
    /// client address (ringway's HBONE stream lines carry no source).
    fn related(&self, line: &str) -> bool {
        let (src, port, id) = match *self {
            Probe::Hbone { who, src, port } => (src, port, Some(IDENTITIES[who].1)),
            Probe::Plain { src, port } => (src, port, None),
        };
        let other_src = SOURCES
            .iter()
            .any(|&o| o != src && line.contains(&format!("{o}:")));
        let id_ok = match id {
            Some(id) => line.contains(id),
            None => IDENTITIES.iter().all(|(_, id)| !line.contains(id)),
        };
        line.contains(&format!("{SERVER_IP}:{port}")) && id_ok && !other_src
    }
}

#[derive(Clone, PartialEq, Eq)]
enum Verdict {
    /// The CONNECT's status; for 200, whether the app's echo came back.
    Status(u64, bool),
    /// No status: the Python client's failure kind (or "reset").
    NoStatus(String),
    Carried,
    Closed,
    /// Neither an answer nor a close within the read timeout.
    Hung,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Status(200, true) => write!(f, "200+echo"),
            Verdict::Status(200, false) => write!(f, "200 no-echo"),
            Verdict::Status(s, _) => write!(f, "{s}"),
            Verdict::NoStatus(kind) => write!(f, "no status: {kind}"),
            Verdict::Carried => write!(f, "carried"),
            Verdict::Closed => write!(f, "closed"),
            Verdict::Hung => write!(f, "hung"),
        }
    }
}

impl Verdict {
    fn allowed(&self) -> bool {
        matches!(self, Verdict::Status(200, true) | Verdict::Carried)
    }
}

/// An echo app on `addr` inside `ns`, for the life of the test process.
fn echo_app(ns: &NetNs, addr: String) {
    common::serve_echo(ns.enter(move || TcpListener::bind(addr).unwrap()));
}

/// One proxy's node: a client namespace and the server workload's
/// namespace (where the proxy runs), joined by a veth.
struct Node {
    client: NetNs,
    server: NetNs,
}

impl Node {
    fn new(tag: &str) -> Node {
        let client = NetNs::new(&format!("{tag}c"));
        let server = NetNs::new(&format!("{tag}s"));
        let (vc, vs) = veth(&client, CLIENT_IP, &server, SERVER_IP);
        for ip in &SOURCES[1..] {
            client.ip(&["addr", "add", &format!("{ip}/24"), "dev", &vc]);
        }
        // Inbound capture as the CNI installs it: plaintext to the pod's
        // ports goes to the proxy's 15006.
        server.nft(&format!(
            "table inet ringway_inbound {{
               chain pre {{ type nat hook prerouting priority -100; policy accept;
                 iifname \"{vs}\" tcp dport {{ {} }} redirect to :15006;
               }}
             }}",
            PORTS.map(|p| p.to_string()).join(", ")
        ));
        for port in PORTS {
            echo_app(&server, format!("{SERVER_IP}:{port}"));
        }
        Node { client, server }
    }
}

/// Client certificates for the identities, from `ringway cert issue` on
/// the shared CA.
fn issue_identities(ca: &Path, dir: &Path) -> Vec<PathBuf> {
    IDENTITIES
        .iter()
        .map(|(name, id)| common::issue_cert(ca, id, dir.join(name), "24h"))
        .collect()
}

struct Rig {
    ringway: Node,
    ztunnel: Node,
    ztunnel_bin: PathBuf,
    dir: tempfile::TempDir,
    ca: PathBuf,
    certs: Vec<PathBuf>,
}

impl Rig {
    fn probe(&self, node: &Node, p: Probe) -> Verdict {
        match p {
            Probe::Hbone { who, src, port } => {
                let mut args = client_args(
                    &self.certs[who],
                    &self.ca.join("root-cert.pem"),
                    &format!("{SERVER_IP}:{port}"),
                );
                args.extend(
                    ["--bind", src, "--send-bytes", &PAYLOAD.to_string()].map(String::from),
                );
                let (_, out) = py_client(&node.client, &args);
                match out["status"][0].as_u64() {
                    Some(status) => Verdict::Status(
                        status,
                        out["received"][0] == PAYLOAD
                            && out["sha256_received"][0] == out["sha256_sent"][0],
                    ),
                    None if out["reset"][0] == true => Verdict::NoStatus("reset".into()),
                    None => Verdict::NoStatus(out["error"].as_str().unwrap_or("?").to_string()),
                }
            }
            Probe::Plain { src, port } => in_netns(&node.client.name, move || plain(src, port)),
        }
    }
}

/// Plain TCP from `src`: sends a few bytes and waits for the echo.
fn plain(src: &str, port: u16) -> Verdict {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&format!("{src}:0").parse::<SocketAddr>().unwrap().into())
        .unwrap();
    let dst: SocketAddr = format!("{SERVER_IP}:{port}").parse().unwrap();
    // A refusal may come as a reset before connect returns.
    if sock
        .connect_timeout(&dst.into(), Duration::from_secs(10))
        .is_err()
    {
        return Verdict::Closed;
    }
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if s.write_all(b"ping").is_err() {
        return Verdict::Closed;
    }
    let mut got = [0u8; 4];
    let mut have = 0;
    while have < got.len() {
        let r = s.read(&mut got[have..]);
        if peer_closed(&r) {
            return Verdict::Closed;
        }
        match r {
            Ok(n) => have += n,
            Err(_) => return Verdict::Hung,
        }
    }
    if &got == b"ping" {
        Verdict::Carried
    } else {
        Verdict::Closed
    }
}

struct Outcome {
    table: String,
    mismatches: usize,
    all_allowed: bool,
}

/// Runs one scenario on both proxies; the table, and the related log lines
/// of every probe where the verdicts differ.
fn run(rig: &Rig, n: usize, s: &Scenario) -> Outcome {
    let cfg = write_config(rig.dir.path(), &format!("s{n}.yaml"), &s.config());
    let rw = rig.ringway.server.ringway(&[
        "--config",
        cfg.to_str().unwrap(),
        "--ca-dir",
        rig.ca.to_str().unwrap(),
        "--inbound-addr",
        &format!("{SERVER_IP}:15008"),
    ]);
    let zt_log = rig.dir.path().join(format!("s{n}-ztunnel.log"));
    let zt = Ztunnel::start(
        &rig.ztunnel_bin,
        &rig.ztunnel.server.name,
        &cfg,
        WORKLOAD,
        &zt_log,
    );
    // Both read every policy of the file.
    let loaded = rw.wait_log("the config", |l| l["message"] == "config loaded");
    assert_eq!(
        loaded["policies"],
        s.policies.len(),
        "{}: ringway read {loaded}",
        s.name
    );
    let want = format!("num_policies={}", s.policies.len());
    assert!(
        zt.log().contains(&want),
        "{}: ztunnel did not log {want}:\n{}",
        s.name,
        zt.log()
    );

    let probes = probes();
    let verdicts: Vec<(Verdict, Verdict)> = std::thread::scope(|sc| {
        let handles: Vec<_> = probes
            .iter()
            .map(|&p| {
                (
                    sc.spawn(move || rig.probe(&rig.ringway, p)),
                    sc.spawn(move || rig.probe(&rig.ztunnel, p)),
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|(a, b)| (a.join().unwrap(), b.join().unwrap()))
            .collect()
    });

    let mut table = format!(
        "scenario {n} \"{}\"\n  {:<36} {:<14} ztunnel\n",
        s.name, "probe", "ringway"
    );
    let mut mismatches = 0;
    let mut details = String::new();
    // Both proxies write a connection's line when it ends, a moment after
    // the probe saw the end (ringway's from its log-writer thread): wait
    // until every probe has its line on both sides (a missing line is a
    // difference, reported below with the rest).
    let logged = |rw_log: &str, zt_text: &str| {
        probes.iter().all(|p| {
            rw_log
                .lines()
                .any(|l| p.related(l) && ringway_access(l).is_some())
                && zt_text
                    .lines()
                    .any(|l| p.related(l) && ztunnel_access(l).is_some())
        })
    };
    let deadline = Instant::now() + common::PATIENCE;
    let (rw_log, zt_text) = loop {
        let (rw_log, zt_text) = (
            std::fs::read_to_string(&rw.log_path).unwrap_or_default(),
            zt.log(),
        );
        if logged(&rw_log, &zt_text) || Instant::now() > deadline {
            break (rw_log, zt_text);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (p, (r, z)) in probes.iter().zip(&verdicts) {
        if r == z {
            if let Err(why) = same_access_log(p, &rw_log, &zt_text) {
                mismatches += 1;
                table += &format!("  {p}: access logs differ: {why}\n");
            }
        }
        let differ = r != z;
        table += &format!(
            "  {:<36} {:<14} {z}{}\n",
            p.to_string(),
            r.to_string(),
            if differ { "   <-- MISMATCH" } else { "" }
        );
        if differ {
            mismatches += 1;
            details += &format!("  {p}: ringway {r}, ztunnel {z}\n");
            for (who, text) in [("ringway", &rw_log), ("ztunnel", &zt_text)] {
                for line in text.lines().filter(|l| p.related(l)) {
                    details += &format!("    {who}: {line}\n");
                }
            }
        }
    }
    if n == 0 {
        // The baseline carried traffic both ways: both scrapes have the
        // same istio_tcp_* series, with the same labels in the same order.
        if let Err(why) = same_series(&rw, &rig.ztunnel.server.name) {
            mismatches += 1;
            table += &format!("  metrics differ: {why}\n");
        }
    }
    if mismatches > 0 {
        table += &format!("  config:\n{}\n  logs:\n{details}", indent(&s.config()));
    }
    Outcome {
        table,
        mismatches,
        all_allowed: verdicts.iter().all(|(r, z)| r.allowed() && z.allowed()),
    }
}

/// The access-log fields both proxies must write alike for a probe (the
/// source port, times and error wording may differ).
const SAME_FIELDS: [&str; 10] = [
    "level",
    "message",
    "src.identity",
    "dst.hbone_addr",
    "dst.workload",
    "dst.namespace",
    "dst.identity",
    "direction",
    "bytes_sent",
    "bytes_recv",
];

/// ztunnel's text access line as fields: `time\tlevel\tscope\tmessage\t
/// key=value key="quoted" ...`; None for other lines.
fn ztunnel_access(line: &str) -> Option<BTreeMap<String, String>> {
    let parts: Vec<&str> = line.splitn(5, '\t').collect();
    if parts.len() < 4 || parts[2] != "access" {
        return None;
    }
    let mut fields = BTreeMap::new();
    fields.insert("level".into(), parts[1].to_string());
    fields.insert("message".into(), parts[3].to_string());
    let mut rest = parts.get(4).copied().unwrap_or("");
    while let Some((key, after)) = rest.trim_start().split_once('=') {
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            // Up to the closing quote that is not escaped.
            let mut end = 0;
            let bytes = quoted.as_bytes();
            while end < bytes.len()
                && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\'))
            {
                end += 1;
            }
            (
                quoted[..end].to_string(),
                quoted.get(end + 1..).unwrap_or(""),
            )
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        fields.insert(key.trim().to_string(), value);
        rest = next;
    }
    Some(fields)
}

/// ringway's JSON access line as fields (numbers as text).
fn ringway_access(line: &str) -> Option<BTreeMap<String, String>> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["scope"] != "access" {
        return None;
    }
    let obj = v.as_object()?;
    Some(
        obj.iter()
            .map(|(k, v)| {
                let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                (k.clone(), text)
            })
            .collect(),
    )
}

/// Both proxies wrote one access line for the probe, with ztunnel's field
/// names: every field ztunnel wrote is in ringway's line, the same for
/// [`SAME_FIELDS`], and an `error` on both or neither.
fn same_access_log(p: &Probe, rw_log: &str, zt_log: &str) -> Result<(), String> {
    let rw: Vec<_> = rw_log
        .lines()
        .filter(|l| p.related(l))
        .filter_map(ringway_access)
        .filter(|f| f.get("level").is_some_and(|l| l != "debug"))
        .collect();
    let zt: Vec<_> = zt_log
        .lines()
        .filter(|l| p.related(l))
        .filter_map(ztunnel_access)
        .collect();
    let (r, z) = match (rw.as_slice(), zt.as_slice()) {
        ([r], [z]) => (r, z),
        _ => {
            return Err(format!(
                "{} ringway and {} ztunnel lines: {rw:?} / {zt:?}",
                rw.len(),
                zt.len()
            ))
        }
    };
    let mut why = vec![];
    for key in z.keys().filter(|k| !r.contains_key(*k)) {
        why.push(format!("ringway lacks {key}"));
    }
    for key in SAME_FIELDS {
        if r.get(key) != z.get(key) && z.contains_key(key) {
            why.push(format!(
                "{key}: ringway {:?}, ztunnel {:?}",
                r.get(key),
                z.get(key)
            ));
        }
    }
    if r.contains_key("error") != z.contains_key("error") {
        why.push(format!(
            "error: ringway {:?}, ztunnel {:?}",
            r.get("error"),
            z.get("error")
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\n    ringway: {r:?}\n    ztunnel: {z:?}",
            why.join("; ")
        ))
    }
}

#[test]
fn ztunnel_access_lines_parse() {
    let line = "2026-12-01T15:18:58.036751Z\terror\taccess\tconnection complete\t\
        src.addr=10.77.0.1:51948 src.identity=\"spiffe://cluster.local/ns/b/sa/bob\" \
        bytes_sent=0 error=\"denied: \\\"x\\\" by: srv/deny\"";
    let f = ztunnel_access(line).unwrap();
    assert_eq!(f["level"], "error");
    assert_eq!(f["message"], "connection complete");
    assert_eq!(f["src.addr"], "10.77.0.1:51948");
    assert_eq!(f["src.identity"], "spiffe://cluster.local/ns/b/sa/bob");
    assert_eq!(f["bytes_sent"], "0");
    assert_eq!(f["error"], "denied: \\\"x\\\" by: srv/deny");
    assert!(ztunnel_access("2026\tinfo\tapp\tstarted").is_none());
}

/// For each `istio_tcp_*` metric: its label names, in order, per series.
fn tcp_series(scrape: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for line in scrape.lines().filter(|l| l.starts_with("istio_tcp_")) {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let labels = rest.rsplit_once('}').map_or("", |(l, _)| l);
        let keys: Vec<String> = labels
            .split("\",")
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
            .collect();
        out.entry(name.to_owned()).or_insert(keys);
    }
    out
}

/// ringway's scrape has every istio_tcp_* metric ztunnel's has, with the
/// same label names in the same order.
fn same_series(rw: &common::Ringway, ztunnel_netns: &str) -> Result<(), String> {
    let (_, ours) = rw.http_get("stats", "/metrics");
    let theirs = in_netns(ztunnel_netns, || {
        let mut s = TcpStream::connect("127.0.0.1:15020").map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        Ok::<_, String>(text)
    })?;
    let (ours, theirs) = (tcp_series(&ours), tcp_series(&theirs));
    if theirs.is_empty() {
        return Err("ztunnel's scrape has no istio_tcp_* series".into());
    }
    for (name, keys) in &theirs {
        match ours.get(name) {
            None => return Err(format!("ringway has no {name}")),
            Some(k) if k != keys => {
                return Err(format!("{name}: ringway labels {k:?}, ztunnel {keys:?}"))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

#[test]
fn authorization_matches_ztunnel() {
    let Some(ztunnel_bin) = ztunnel::locate("differential authorization test") else {
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let ca = ztunnel::shared_ca(&ztunnel_bin, dir.path());
    let certs = issue_identities(&ca, dir.path());
    let rig = Rig {
        ringway: Node::new("dfr"),
        ztunnel: Node::new("dfz"),
        ztunnel_bin,
        dir,
        ca,
        certs,
    };

    let mut failed = BTreeMap::new();
    for (n, s) in scenarios().iter().enumerate() {
        let out = run(&rig, n, s);
        eprint!("{}", out.table);
        if n == 0 {
            // The baseline: without policies everything passes on both, so
            // the rig itself (trust, capture, echo) works.
            assert!(out.all_allowed, "the baseline must pass:\n{}", out.table);
        }
        if out.mismatches > 0 {
            failed.insert(n, out.table);
        }
    }
    eprintln!(
        "differential authorization: {} scenarios x {} probes in {:?}",
        scenarios().len(),
        probes().len(),
        started.elapsed()
    );
    assert!(
        failed.is_empty(),
        "ringway and ztunnel disagree in {} scenario(s):\n{}",
        failed.len(),
        failed.into_values().collect::<String>()
    );
}
