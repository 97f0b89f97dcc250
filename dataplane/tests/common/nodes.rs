//! The two-node rig: network namespaces "node A" (the client workload,
//! 10.250.0.1, egress captured to ringway A) and "node B" (the HBONE
//! server workload, 10.250.0.2, behind ringway B's 15008), joined by a veth
//! pair, sharing one trust root. Independent peers (Python's h2 + ssl, in
//! tests/py/) can stand in for either ringway: node A's capture leaves port
//! 15008 alone, so a test's own HBONE client there reaches node B directly.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{NetNs, Ringway};

pub const CLIENT_IP: &str = "10.250.0.1";
pub const SERVER_IP: &str = "10.250.0.2";
pub const CLIENT_ID: &str = "spiffe://cluster.local/ns/client-ns/sa/client";
pub const SERVER_ID: &str = "spiffe://cluster.local/ns/server-ns/sa/server";

/// The mesh: the client workload on node A, the HBONE server on node B.
pub fn base_config() -> String {
    format!(
        r#"
workloads:
- uid: cluster1//v1/Pod/client-ns/client
  name: client
  namespace: client-ns
  serviceAccount: client
  workloadIps: ["{CLIENT_IP}"]
  protocol: HBONE
  node: node-a
  workloadName: client
  canonicalName: client
  canonicalRevision: v1
  clusterId: Kubernetes
- uid: cluster1//v1/Pod/server-ns/server
  name: server
  namespace: server-ns
  serviceAccount: server
  workloadIps: ["{SERVER_IP}"]
  protocol: HBONE
  node: node-b
"#
    )
}

/// Two nodes, their ringways and a shared CA directory.
pub struct Nodes {
    pub a: NetNs,
    pub b: NetNs,
    pub dir: tempfile::TempDir,
    pub rw_a: Option<Ringway>,
    pub rw_b: Option<Ringway>,
    pub b_args: Vec<String>,
    /// The veth ends: node A's, node B's.
    pub veths: (String, String),
}

impl Nodes {
    /// `with_b`: start ringway on node B (otherwise the test puts its own
    /// HBONE server there).
    pub fn new(tag: &str, with_b: bool, extra: &[&str]) -> Nodes {
        Self::with_config(tag, &base_config(), with_b, extra)
    }

    /// [`new`](Self::new) with another mesh config (both ringways watch
    /// the one file: see [`set_config`](Self::set_config)).
    pub fn with_config(tag: &str, config: &str, with_b: bool, extra: &[&str]) -> Nodes {
        Self::with_setup(tag, config, with_b, extra, |_| Vec::new())
    }

    /// [`with_config`](Self::with_config), running `setup` in the test's
    /// directory before any ringway starts (the CA directory is `ca` in
    /// it); the arguments it returns are added to both ringways'.
    pub fn with_setup(
        tag: &str,
        config: &str,
        with_b: bool,
        extra: &[&str],
        setup: impl FnOnce(&Path) -> Vec<String>,
    ) -> Nodes {
        let a = NetNs::new(&format!("{tag}a"));
        let b = NetNs::new(&format!("{tag}b"));
        let (ia, ib) = super::veth(&a, CLIENT_IP, &b, SERVER_IP);
        a.nft(&format!(
            "table inet ringway_test {{
               chain out {{ type nat hook output priority -100; policy accept;
                 oifname \"{ia}\" meta l4proto tcp meta mark & 0xfff != 0x539 tcp dport != 15008 redirect to :15001;
               }}
             }}"
        ));
        let dir = tempfile::tempdir().unwrap();
        let cfg = super::write_config(dir.path(), "mesh.yaml", config);
        let ca = dir.path().join("ca");
        let more = setup(dir.path());
        let mut nodes = Nodes {
            a,
            b,
            dir,
            rw_a: None,
            rw_b: None,
            b_args: vec![],
            veths: (ia, ib),
        };
        let args = |node: &str| -> Vec<String> {
            let mut v: Vec<String> = [
                "--config",
                cfg.to_str().unwrap(),
                "--ca-dir",
                ca.to_str().unwrap(),
                "--node-name",
                node,
                "--inbound-addr",
                &format!(
                    "{}:15008",
                    if node == "node-a" {
                        CLIENT_IP
                    } else {
                        SERVER_IP
                    }
                ),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            v.extend(extra.iter().map(|s| s.to_string()));
            v.extend(more.iter().cloned());
            v
        };
        let a_args = args("node-a");
        nodes.rw_a = Some(
            nodes
                .a
                .ringway(&a_args.iter().map(String::as_str).collect::<Vec<_>>()),
        );
        nodes.b_args = args("node-b");
        if with_b {
            nodes.start_b();
        }
        nodes
    }

    pub fn start_b(&mut self) {
        let args: Vec<&str> = self.b_args.iter().map(String::as_str).collect();
        self.rw_b = Some(self.b.ringway(&args));
    }

    /// Replaces the mesh config both ringways watch (applied within their
    /// poll interval).
    pub fn set_config(&self, yaml: &str) {
        let path = self.dir.path().join("mesh.yaml");
        let tmp = self.dir.path().join("mesh.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// Node B's end of the veth.
    pub fn veth_b(&self) -> String {
        self.veths.1.clone()
    }

    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }

    pub fn a(&self) -> &Ringway {
        self.rw_a.as_ref().unwrap()
    }

    pub fn b(&self) -> &Ringway {
        self.rw_b.as_ref().unwrap()
    }

    /// Mints a certificate with `ringway cert issue` from `ca` into a new dir.
    pub fn issue(&self, ca: &Path, id: &str, name: &str, ttl: &str) -> PathBuf {
        super::issue_cert(ca, id, self.dir.path().join(name), ttl)
    }
}

/// Starts the Python HBONE server on node B's 15008 (echo mode) with the
/// given certificate; returns once it listens.
pub fn py_server(nodes: &Nodes, certs: &Path, log: &Path) -> std::process::Child {
    py_server_with(nodes, certs, log, &[])
}

/// [`py_server`] with extra `hbone_server.py` flags.
pub fn py_server_with(
    nodes: &Nodes,
    certs: &Path,
    log: &Path,
    extra: &[&str],
) -> std::process::Child {
    let root = nodes.ca_dir().join("root-cert.pem");
    let mut server = Command::new("ip")
        .args(["netns", "exec", &nodes.b.name, "/usr/bin/python3"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/hbone_server.py"))
        .args(["--listen", &format!("{SERVER_IP}:15008"), "--mode", "echo"])
        .args(["--cert", certs.join("cert-chain.pem").to_str().unwrap()])
        .args(["--key", certs.join("key.pem").to_str().unwrap()])
        .args([
            "--ca",
            root.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(
        line.starts_with("READY"),
        "python HBONE server did not start: {line}"
    );
    server
}

/// Runs the Python HBONE client inside `ns`; returns (exit code, JSON).
pub fn py_client(ns: &NetNs, args: &[String]) -> (i32, serde_json::Value) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, "/usr/bin/python3"]);
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/hbone_client.py"));
    cmd.args(args).arg("--timeout").arg("20");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| serde_json::json!({"stdout": stdout, "stderr": String::from_utf8_lossy(&out.stderr)}));
    (out.status.code().unwrap_or(-1), json)
}

pub fn client_args(certs: &Path, ca_root: &Path, authority: &str) -> Vec<String> {
    vec![
        "--connect".into(),
        format!("{SERVER_IP}:15008"),
        "--authority".into(),
        authority.into(),
        "--cert".into(),
        certs.join("cert-chain.pem").to_str().unwrap().into(),
        "--key".into(),
        certs.join("key.pem").to_str().unwrap().into(),
        "--ca".into(),
        ca_root.to_str().unwrap().into(),
    ]
}

/// Connects from the client workload's address (so ringway knows whose
/// identity to use).
pub fn connect_from_client(dst: &str) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(
        &format!("{CLIENT_IP}:0")
            .parse::<SocketAddr>()
            .unwrap()
            .into(),
    )?;
    sock.connect(&dst.parse::<SocketAddr>().unwrap().into())?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}
