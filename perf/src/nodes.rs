//! The two-node HBONE rig the suite measures in: network namespaces "node
//! A" and "node B" joined by a veth pair.
//!
//! ```text
//!  node A (10.250.0.1)                       node B
//!  ┌──────────────────────────────┐          ┌──────────────────────────────────┐
//!  │ load generator (client       │          │ sink server: 0.0.0.0:5201, :53xx │
//!  │ workload, binds 10.250.0.1)  │   veth   │ 10.250.0.3   non-mesh address    │
//!  │ nft: dport 53xx → ringway A  │ ──────── │ 10.250.0.1x  HBONE workload of   │
//!  │ ringway A (per core set)     │          │              ringway B (:15008)  │
//!  │ peer proxy (SOCKS5), if any  │          │ ringway B (per core set)         │
//!  └──────────────────────────────┘          └──────────────────────────────────┘
//! ```
//!
//! * direct: 10.250.0.3:5201 (port 5201 is never captured).
//! * ringway passthrough: 10.250.0.3:53xx, captured → ringway A splices to
//!   the non-mesh destination.
//! * ringway hbone: 10.250.0.1x:53xx, captured → ringway A → HBONE (mTLS
//!   HTTP/2 CONNECT) → ringway B on 10.250.0.1x:15008 → sink.
//!
//! Every ringway set (a `--cores` value of a sweep, times a `--policies`
//! value) gets its own ringway pair, captured port (5300 + i), ringway A
//! outbound port (16001 + 100·i) and HBONE workload address (10.250.0.10 +
//! i), so all of them run side by side and rounds can alternate between
//! them. One mesh (every set's config lists the same workloads; a set with
//! policies adds them to its own copy), one fresh CA directory: every
//! ringway shares one trust root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::Processes;
use crate::rig::{self, listener_args, Netns, ANY_PORT};
use crate::supervise::{Ready, Spec, Supervised};
use crate::ztunnel;

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// On node B, not a mesh workload: passthrough destination.
pub const PLAIN_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 3);
/// Never captured: direct connections and peers' upstream.
pub const DIRECT_PORT: u16 = 5201;
pub const MAX_CORE_SETS: usize = 16;
/// The server workloads' namespace, where the policies of a `--policies`
/// set apply.
pub const SERVER_NAMESPACE: &str = "server-ns";
/// The client workload's identity as ringway B sees it, without
/// `spiffe://`.
pub const CLIENT_PRINCIPAL: &str = "cluster.local/ns/client-ns/sa/client";

/// The HBONE workload of core set `i` (on node B, behind ringway B `i`).
pub fn hbone_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 0, 10 + i as u8)
}

/// The captured destination port that reaches ringway A of core set `i`.
pub fn captured_port(i: usize) -> u16 {
    5300 + i as u16
}

/// ringway A's outbound (capture) listener of core set `i`. Away from
/// ztunnel's fixed ports (15000-15080), so a ztunnel peer can run in node A
/// next to the ringways.
fn outbound_port(i: usize) -> u16 {
    16001 + 100 * i as u16
}

/// Every namespace's `net.ipv4.ip_local_port_range`: wide (connect-rate
/// scenarios open tens of thousands of connections a second), and above
/// ztunnel's fixed ports, so no connection (or its TIME_WAIT) ever holds
/// one of them when a ztunnel (re)starts.
pub const EPHEMERAL_PORTS: (u16, u16) = (16384, 65535);

/// The namespace settings every node of the rig gets.
pub fn tune(ns: &Netns) -> anyhow::Result<()> {
    ns.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    let (lo, hi) = EPHEMERAL_PORTS;
    ns.sysctl("net.ipv4.ip_local_port_range", &format!("{lo} {hi}"))
}

/// Starts the sink on `listen` in `ns`: threads of this process, or
/// (`sink_process`) a `ringway-perf serve` process of its own, returned so
/// that it lives as long as the rig.
fn start_sink(
    ns: &Netns,
    listen: Vec<SocketAddr>,
    sink_process: Option<&Path>,
    name: &str,
    log_dir: &Path,
) -> anyhow::Result<Option<Supervised>> {
    match sink_process {
        None => {
            ns.enter(move || crate::server::spawn(&listen))??;
            Ok(None)
        }
        Some(bin) => {
            let addrs: Vec<String> = listen.iter().map(|a| a.to_string()).collect();
            let ready = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen[0].port());
            let spec = Spec::new(
                name,
                bin,
                strings(&["serve", "--listen", &addrs.join(",")]),
                log_dir,
            )
            .ready(Ready::Tcp(ready));
            Ok(Some(Supervised::start(Some(ns), spec)?))
        }
    }
}

/// Two fresh, [`tune`]d namespaces joined by a veth pair with the given
/// CIDRs on each end; returns them and the name of `a`'s end.
pub fn node_pair(
    (a_prefix, a_ips): (&str, &[String]),
    (b_prefix, b_ips): (&str, &[String]),
) -> anyhow::Result<(Netns, Netns, String)> {
    let a = Netns::new(a_prefix)?;
    let b = Netns::new(b_prefix)?;
    let a_refs: Vec<&str> = a_ips.iter().map(String::as_str).collect();
    let b_refs: Vec<&str> = b_ips.iter().map(String::as_str).collect();
    let (ia, _) = rig::veth(&a, &a_refs, &b, &b_refs)?;
    for ns in [&a, &b] {
        tune(ns)?;
    }
    Ok((a, b, ia))
}

/// The arguments every ringway of a rig gets: its mesh config, the rig's
/// CA, its node name, JSON logs and `side` (see
/// [`rig::side_listener_args`]).
pub fn ringway_args(config: &Path, ca: &Path, node: &str, side: &[String]) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    let mut v = vec!["--config".into(), path(config), "--ca-dir".into(), path(ca)];
    v.extend(strings(&["--node-name", node, "--log-format", "json"]));
    v.extend(side.iter().cloned());
    v
}

/// Pinning a `--cores` value asks for with a suffix (`2:pinned`,
/// `2:unpinned`), so a sweep compares both side by side. Without one,
/// ringway's default applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning {
    Pinned,
    Unpinned,
}

impl Pinning {
    const ALL: [Pinning; 2] = [Pinning::Pinned, Pinning::Unpinned];

    pub fn suffix(self) -> &'static str {
        match self {
            Pinning::Pinned => ":pinned",
            Pinning::Unpinned => ":unpinned",
        }
    }

    /// ringway's flag for it.
    pub fn flag(self) -> &'static str {
        match self {
            Pinning::Pinned => "--pin",
            Pinning::Unpinned => "--no-pin",
        }
    }
}

/// Splits a `--cores` value of a [`SetSpec`] into ringway's `--cores` and
/// the pinning it asks for, if any.
pub fn split_pinning(v: &str) -> (&str, Option<Pinning>) {
    Pinning::ALL
        .into_iter()
        .find_map(|p| v.strip_suffix(p.suffix()).map(|c| (c, Some(p))))
        .unwrap_or((v, None))
}

/// Where the peer proxy's connections go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerTarget {
    /// The non-mesh address: the peer connects straight to the sink.
    Plain,
    /// The HBONE workload of core set 0: the peer must speak HBONE to
    /// ringway B (so it must trust the rig's CA: see {ca_dir}).
    Hbone,
}

#[derive(Clone, Debug)]
pub struct PeerSpec {
    pub name: String,
    /// Shell command line; {ca_dir}, {config}, {client_ip}, {logs} are
    /// replaced before it runs.
    pub command: String,
    pub socks: SocketAddr,
    pub target: PeerTarget,
}

/// One ringway pair: how it runs and what its destination carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SetSpec {
    /// ringway's `--cores` (None: ringway's default, every CPU).
    pub cores: Option<String>,
    /// Authorization policies on the set's HBONE workload (see
    /// [`policies_yaml`]); None: no policy sweep (the same as 0).
    pub policies: Option<usize>,
    /// Metrics and the access log off (`--no-metrics`, RUST_LOG=warn): the
    /// baseline for what they cost, in the same run.
    pub quiet: bool,
}

#[derive(Clone, Debug)]
pub struct NodesConfig {
    pub ringway: PathBuf,
    /// One ringway pair per entry.
    pub sets: Vec<SetSpec>,
    pub log_dir: PathBuf,
    pub log_level: String,
    pub peer: Option<PeerSpec>,
    /// The ztunnel binary: ztunnel passthrough and HBONE columns on a node
    /// pair of their own (see [`ZtunnelNodes`]), and every ringway on the
    /// root of ztunnel's fake CA.
    pub ztunnel: Option<PathBuf>,
    /// The "ringway same-node" column: an HBONE workload on node A itself,
    /// served by ringway A of set 0.
    pub same_node: bool,
    /// The "ringway hbone orig-src" column: a second HBONE workload on
    /// node B behind a ringway B of its own that connects to the sink from
    /// the client's address (`--orig-src`, with its return-path rules).
    pub orig_src: bool,
    /// Run each node's sink as a `ringway-perf serve` process of its own
    /// (this binary) rather than threads of the caller: a process holds at
    /// most RLIMIT_NOFILE sockets, and the soak's sinks and load
    /// generators together hold more than one process may.
    pub sink_process: Option<PathBuf>,
}

/// On node B, the HBONE workload of the orig-src column.
pub const ORIG_SRC_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 50);

/// The optional columns' extra workloads in the mesh config.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras {
    pub same_node: bool,
    pub orig_src: bool,
    /// Workloads elsewhere in the mesh that no traffic goes to: the soak's
    /// config churn adds and removes them.
    pub churn: usize,
}

/// On node A (on `lo`), the HBONE workload of the same-node column.
pub const SAME_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 40);
/// The same-node column's sink port, captured to ringway A of set 0.
pub const SAME_NODE_PORT: u16 = 5400;

/// ztunnel's own copy of nodes A and B, for the ztunnel columns: the same
/// addresses (client 10.250.0.1; 10.250.0.3 non-mesh and 10.250.0.10 the
/// HBONE workload of set 0, both on node ZB), the same captured port
/// (5300), the same sink, the same capture rule (to ztunnel's 15001,
/// skipping its marked sockets) and the same one veth between them. A
/// separate pair because ztunnel binds fixed ports (its 15008 on every
/// address would collide with ringway B's) and because the load generator
/// must run where the capture is; the pair is not linked to A and B, so
/// the addresses can repeat.
///
/// ```text
///  node ZA (10.250.0.1)                 node ZB
///  load generator                       sink on :5201, :5300
///  nft: dport 5300 → :15001   ── veth ─ 10.250.0.3   non-mesh
///  ztunnel A (client-ns/client)         10.250.0.10  server-0, ztunnel B
///                                       (server-ns/server-0, :15008)
/// ```
///
/// Field order is drop order: processes before their namespaces.
pub struct ZtunnelNodes {
    pub a: Supervised,
    pub b: Supervised,
    pub sink: Option<Supervised>,
    pub za: Netns,
    pub zb: Netns,
}

impl ZtunnelNodes {
    fn start(
        bin: &Path,
        config: &Path,
        log_dir: &Path,
        log_level: &str,
        sink_process: Option<&Path>,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<ZtunnelNodes> {
        let (za, zb, iza) = node_pair(
            ("rwpza", &[format!("{CLIENT_IP}/24")]),
            (
                "rwpzb",
                &[format!("{PLAIN_IP}/24"), format!("{}/24", hbone_ip(0))],
            ),
        )?;
        za.nft(&capture_rules(
            &iza,
            &[(captured_port(0), ztunnel::OUTBOUND_PORT)],
        ))?;
        let listen = [
            SocketAddr::from(([0, 0, 0, 0], DIRECT_PORT)),
            SocketAddr::from(([0, 0, 0, 0], captured_port(0))),
        ];
        let sink = start_sink(&zb, listen.to_vec(), sink_process, "sink-zb", log_dir)?;
        let server = format!("{SERVER_NAMESPACE}/server-0/server");
        let env = |workload: &str| ztunnel::env(config, workload, log_level);
        let b = ztunnel::spec(bin, "ztunnel-b", env(&server), log_dir);
        let b = Supervised::start(Some(&zb), b)?;
        let a = ztunnel::spec(bin, "ztunnel-a", env("client-ns/client/client"), log_dir);
        let a = Supervised::start(Some(&za), a)?;
        progress(&format!(
            "started ztunnel pair: node ZA pid {}, node ZB pid {} ({})",
            a.pid(),
            b.pid(),
            bin.display()
        ));
        Ok(ZtunnelNodes { a, b, sink, za, zb })
    }
}

pub struct RingwaySet {
    /// What the pair runs now (a policy sweep moves the counts around).
    pub spec: SetSpec,
    pub a: Supervised,
    pub b: Supervised,
}

/// The running rig. Field order is drop order: processes before the
/// namespaces they live in.
pub struct Nodes {
    pub peer: Option<(PeerSpec, Supervised)>,
    /// Node B's sink when it runs as a process of its own.
    pub sink: Option<Supervised>,
    pub ztunnel: Option<ZtunnelNodes>,
    pub sets: Vec<RingwaySet>,
    /// The sets as configured; `placement[j]` is the pair that runs
    /// `specs[j]` now (see [`Nodes::rotate_policies`]).
    specs: Vec<SetSpec>,
    placement: Vec<usize>,
    pub a: Netns,
    pub b: Netns,
    work: Scratch,
    /// The optional columns in the rig.
    extras: Extras,
    /// The orig-src column's ringway B (node B, `--orig-src`).
    pub orig_src_b: Option<Supervised>,
}

/// A fresh scratch directory (configs, CA, sockets), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Where [`Scratch::new`] puts it: `<temp dir>/<prefix>-<pid>`.
    pub fn path(prefix: &str) -> PathBuf {
        std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()))
    }

    /// [`Scratch::path`], emptied.
    pub fn new(prefix: &str) -> anyhow::Result<Scratch> {
        let p = Scratch::path(prefix);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)?;
        Ok(Scratch(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The mesh config: the client workload on node A, one HBONE server
/// workload per ringway set on node B, and `policies` policies for the
/// server workloads whose rules name the destination port `port` (see
/// [`policies_yaml`]). 10.250.0.3 is deliberately absent.
///
/// It is written so that ztunnel's LOCAL_XDS parser takes it too (the
/// stricter of the two): every workload names its `services` and its
/// `trustDomain` (ztunnel's default is empty, which would give its
/// certificates the identity `spiffe:///ns/…`), policies write `dryRun`
/// and their string matches as YAML tags (`!Exact "…"`).
pub fn mesh_config(sets: usize, policies: usize, port: u16) -> String {
    mesh_config_with(sets, policies, port, Extras::default())
}

/// [`mesh_config`], plus the optional columns' workloads.
pub fn mesh_config_with(sets: usize, policies: usize, port: u16, extras: Extras) -> String {
    let workload = |name: &str, ns: &str, sa: &str, ip: Ipv4Addr, node: &str, app: &str| {
        format!(
            "- uid: cluster1//v1/Pod/{ns}/{name}\n  name: {name}\n  namespace: {ns}\n  serviceAccount: {sa}\n  \
             trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n  \
             workloadName: {app}\n  canonicalName: {app}\n  canonicalRevision: v1\n  services: {{}}\n"
        )
    };
    let mut y = String::from("# Generated by ringway-perf suite.\nworkloads:\n");
    y += &workload(
        "client",
        "client-ns",
        "client",
        CLIENT_IP,
        "node-a",
        "client",
    );
    for i in 0..sets {
        y += &workload(
            &format!("server-{i}"),
            SERVER_NAMESPACE,
            "server",
            hbone_ip(i),
            &format!("node-b{i}"),
            "server",
        );
    }
    if extras.orig_src {
        y += &workload(
            "server-orig-src",
            SERVER_NAMESPACE,
            "server",
            ORIG_SRC_IP,
            "node-b-orig-src",
            "server",
        );
    }
    if extras.same_node {
        y += &workload(
            "local-0",
            SERVER_NAMESPACE,
            "server",
            SAME_NODE_IP,
            "node-a",
            "server",
        );
    }
    for k in 0..extras.churn {
        let ip = Ipv4Addr::new(10, 251, (k / 250) as u8, (k % 250) as u8 + 1);
        y += &workload(
            &format!("churn-{k}"),
            "churn-ns",
            "churn",
            ip,
            "node-elsewhere",
            "churn",
        );
    }
    y += "services: []\n";
    y += &policies_yaml(policies, port);
    y
}

/// `n` NAMESPACE-scope policies in [`SERVER_NAMESPACE`], in ringway's
/// local-config schema, that every connection from the client workload to
/// `port` must walk in full and that still let it in:
///
/// * `policy-0000` … : DENY, two rules each, neither matching the client:
///   one names the principal `cluster.local/ns/other-<i>/sa/x` on `port`
///   (the port matches, the principal compare fails), the other the
///   namespace `other-<i>` from 10.9.0.0/16 (the source address fails);
/// * from 10 policies on, the last one (the highest name: evaluated last)
///   is an ALLOW of [`CLIENT_PRINCIPAL`] on `port`: with an ALLOW policy in
///   place, a connection is let in only by a match, so every DENY is
///   looked at and the ALLOW evaluated. ringway's prefilters (exact
///   principals and namespaces per rule) rule the DENYs out without
///   running their rules: this set measures that path.
///
/// `n` counts both kinds (ringway logs `policies=n` when it loads them).
pub fn policies_yaml(n: usize, port: u16) -> String {
    if n == 0 {
        return "policies: []\n".into();
    }
    let mut y = String::from("policies:\n");
    let head = |y: &mut String, i: usize, action: &str| {
        *y += &format!(
            "- name: policy-{i:05}\n  namespace: {SERVER_NAMESPACE}\n  scope: Namespace\n  \
             action: {action}\n  dryRun: false\n  rules:\n"
        );
    };
    let allow = n >= 10;
    for i in 0..n - usize::from(allow) {
        head(&mut y, i, "Deny");
        y += &format!(
            "  - - - principals: [!Exact \"cluster.local/ns/other-{i}/sa/x\"]\n        \
             destinationPorts: [{port}]\n  \
             - - - namespaces: [!Exact \"other-{i}\"]\n        sourceIps: [\"10.9.0.0/16\"]\n"
        );
    }
    if allow {
        head(&mut y, n - 1, "Allow");
        y += &format!(
            "  - - - principals: [!Exact \"{CLIENT_PRINCIPAL}\"]\n        destinationPorts: [{port}]\n"
        );
    }
    y
}

/// Writes pair `i`'s own copy of the mesh (of `sets` pairs) with
/// `policies` policies on its destination port; returns its path.
fn write_pair_config(
    work: &Path,
    sets: usize,
    i: usize,
    policies: usize,
    extras: Extras,
) -> anyhow::Result<PathBuf> {
    let path = work.join(format!("mesh-{i}.yaml"));
    // Write then rename: a ringway polling the file never reads half of it.
    let tmp = path.with_extension("tmp");
    let yaml = mesh_config_with(sets, policies, captured_port(i), extras);
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The capture rules of a client node (nftables, egress on the veth
/// only): each `(destination port, proxy port)` is redirected to the
/// proxy's listener, except the proxies' own sockets (mark 0x539, set by
/// ringway and by ztunnel's `PACKET_MARK`) and the direct port.
pub fn capture_rules(veth: &str, redirects: &[(u16, u16)]) -> String {
    let mut r = format!(
        "table inet rwperf {{\n chain out {{ type nat hook output priority -100; policy accept;\n  \
         oifname \"{veth}\" meta mark & 0xfff == {:#x} return\n  \
         oifname \"{veth}\" tcp dport {DIRECT_PORT} return\n",
        ztunnel::MARK
    );
    for (dport, to) in redirects {
        r += &format!("  oifname \"{veth}\" tcp dport {dport} redirect to :{to}\n");
    }
    r += " }\n}\n";
    r
}

/// Node A's capture of the same-node column: the client's connections to
/// the local HBONE workload go to ringway A of set 0 (its own, marked,
/// sockets pass).
fn same_node_capture() -> String {
    format!(
        "table inet rwperf_same_node {{\n chain out {{ type nat hook output priority -101; policy accept;\n  \
         ip daddr {SAME_NODE_IP} tcp dport {SAME_NODE_PORT} meta mark & 0xfff != {:#x} redirect to :{}\n }}\n}}\n",
        ztunnel::MARK,
        outbound_port(0)
    )
}

/// Node A's redirects: each set's captured port to its ringway A.
fn ringway_redirects(sets: usize) -> Vec<(u16, u16)> {
    (0..sets)
        .map(|i| (captured_port(i), outbound_port(i)))
        .collect()
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Nodes {
    pub fn start(cfg: &NodesConfig, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Nodes> {
        rig::require_root("the two-node rig")?;
        let n = cfg.sets.len();
        if n == 0 || n > MAX_CORE_SETS {
            bail!("1 to {MAX_CORE_SETS} ringway sets");
        }
        std::fs::create_dir_all(&cfg.log_dir)?;
        let work = Scratch::new("ringway-perf")?;
        let mut b_ips = vec![format!("{PLAIN_IP}/24")];
        b_ips.extend((0..n).map(|i| format!("{}/24", hbone_ip(i))));
        if cfg.orig_src {
            b_ips.push(format!("{ORIG_SRC_IP}/24"));
        }
        let (a, b, ia) = node_pair(("rwpa", &[format!("{CLIENT_IP}/24")]), ("rwpb", &b_ips))?;
        a.nft(&capture_rules(&ia, &ringway_redirects(n)))?;
        if cfg.same_node {
            // A local address: node A's veth rules never see it.
            a.ip(&["addr", "add", &format!("{SAME_NODE_IP}/32"), "dev", "lo"])?;
            a.nft(&same_node_capture())?;
            let at = SocketAddr::from((SAME_NODE_IP, SAME_NODE_PORT));
            a.enter(move || crate::server::spawn(&[at]))??;
        }

        let extras = Extras {
            same_node: cfg.same_node,
            orig_src: cfg.orig_src,
            churn: 0,
        };
        let shared = work.0.join("mesh.yaml");
        std::fs::write(&shared, mesh_config_with(n, 0, 0, extras))?;
        let ca = work.0.join("ca");
        // With ztunnel in the rig, everyone chains to its fake CA's root;
        // otherwise the first ringway creates a CA and the others find it.
        if let Some(bin) = &cfg.ztunnel {
            ztunnel::write_shared_ca(bin, &ca)?;
        }

        let mut listen = vec![SocketAddr::from(([0, 0, 0, 0], DIRECT_PORT))];
        listen.extend((0..n).map(|i| SocketAddr::from(([0, 0, 0, 0], captured_port(i)))));
        let sink = start_sink(
            &b,
            listen,
            cfg.sink_process.as_deref(),
            "sink-b",
            &cfg.log_dir,
        )?;

        let side = rig::side_listener_args(&cfg.ringway)?;
        let common = |node: &str, config: &Path, spec: &SetSpec| -> Vec<String> {
            let mut v = ringway_args(config, &ca, node, &side);
            if let Some(c) = &spec.cores {
                let (c, pin) = split_pinning(c);
                v.extend(strings(&["--cores", c]));
                v.extend(pin.map(|p| p.flag().to_string()));
            }
            if spec.quiet {
                v.push("--no-metrics".into());
            }
            v
        };
        let log_level = |spec: &SetSpec| match spec.quiet {
            true => "warn".to_string(),
            false => cfg.log_level.clone(),
        };
        let start = |ns: &Netns, name: &str, args: &[String], log_level: &str| {
            Supervised::ringway(ns, &cfg.ringway, name, args, log_level, &cfg.log_dir)
        };
        let mut sets = Vec::new();
        for (i, spec) in cfg.sets.iter().enumerate() {
            let cores = &spec.cores;
            // Policies go to a copy of the mesh that only this pair reads.
            let config = match spec.policies {
                Some(p) => write_pair_config(&work.0, n, i, p, extras)?,
                None => shared.clone(),
            };
            let mut a_args = common("node-a", &config, spec);
            a_args.extend(listener_args(
                &format!("127.0.0.1:{}", outbound_port(i)),
                ANY_PORT,
            ));
            let ra = start(&a, &format!("ringway-a{i}"), &a_args, &log_level(spec))?;
            let mut b_args = common(&format!("node-b{i}"), &config, spec);
            b_args.extend(listener_args(ANY_PORT, &format!("{}:15008", hbone_ip(i))));
            let rb = start(&b, &format!("ringway-b{i}"), &b_args, &log_level(spec))?;
            progress(&format!(
                "started ringway pair {i} (cores {}, {} policies): node A pid {}, node B pid {}",
                cores.as_deref().unwrap_or("all"),
                spec.policies.unwrap_or(0),
                ra.pid(),
                rb.pid()
            ));
            sets.push(RingwaySet {
                spec: spec.clone(),
                a: ra,
                b: rb,
            });
        }
        let orig_src_b = if cfg.orig_src {
            // The return path for spoofed sources, as an operator installs
            // it: the repository's script, run in node B.
            rig::script("orig-src-rules.sh", &["add", "--netns", &b.name])?;
            let mut args = common("node-b-orig-src", &shared, &cfg.sets[0]);
            args.extend(listener_args(ANY_PORT, &format!("{ORIG_SRC_IP}:15008")));
            args.push("--orig-src".into());
            let p = start(&b, "ringway-b-orig-src", &args, &cfg.log_level)?;
            progress(&format!(
                "started ringway B with --orig-src: pid {}",
                p.pid()
            ));
            Some(p)
        } else {
            None
        };
        let ztunnel = match &cfg.ztunnel {
            Some(bin) => Some(ZtunnelNodes::start(
                bin,
                &shared,
                &cfg.log_dir,
                &cfg.log_level,
                cfg.sink_process.as_deref(),
                progress,
            )?),
            None => None,
        };
        let mut nodes = Nodes {
            peer: None,
            sink,
            ztunnel,
            sets,
            specs: cfg.sets.clone(),
            placement: (0..n).collect(),
            a,
            b,
            work,
            extras,
            orig_src_b,
        };
        if let Some(spec) = &cfg.peer {
            let command = nodes.expand(&spec.command, &cfg.log_dir);
            progress(&format!(
                "starting peer {:?} in node A: {command}",
                spec.name
            ));
            // Through `sh -c 'exec …'`, so the child is the proxy itself, in
            // a process group of its own that is stopped as a whole.
            let sh = strings(&["-c", &format!("exec {command}")]);
            let mut peer = Spec::new(&spec.name, "sh", sh, &cfg.log_dir)
                .ready(Ready::Tcp(spec.socks))
                .timeout(Duration::from_secs(60));
            peer.group = true;
            let p = Supervised::start(Some(&nodes.a), peer)
                .with_context(|| format!("peer {}", spec.name))?;
            progress(&format!(
                "peer {} ready on {} (pid {})",
                spec.name,
                spec.socks,
                p.pid()
            ));
            nodes.peer = Some((spec.clone(), p));
        }
        Ok(nodes)
    }

    pub fn config_path(&self) -> PathBuf {
        self.work.0.join("mesh.yaml")
    }

    pub fn ca_dir(&self) -> PathBuf {
        self.work.0.join("ca")
    }

    /// Fills the peer command's placeholders.
    fn expand(&self, command: &str, logs: &Path) -> String {
        command
            .replace("{ca_dir}", self.ca_dir().to_str().unwrap())
            .replace("{config}", self.config_path().to_str().unwrap())
            .replace("{client_ip}", &CLIENT_IP.to_string())
            .replace("{logs}", logs.to_str().unwrap())
    }

    /// Fails if any ringway or the peer has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for s in &mut self.sets {
            s.a.check_alive()?;
            s.b.check_alive()?;
        }
        if let Some(p) = &mut self.orig_src_b {
            p.check_alive()?;
        }
        if let Some((_, p)) = &mut self.peer {
            p.check_alive()?;
        }
        if let Some(z) = &mut self.ztunnel {
            z.a.check_alive()?;
            z.b.check_alive()?;
        }
        Ok(())
    }

    /// Restarts the proxy processes a variant is measured on (fresh
    /// processes, e.g. for memory). Their pids change: call
    /// [`Nodes::variants`] again.
    pub fn restart_for(&mut self, v: &Variant) -> anyhow::Result<()> {
        match (v.kind, v.set) {
            (Kind::Passthrough | Kind::SameNode, Some(i)) => {
                self.sets[i].a.restart(Some(&self.a))?
            }
            (Kind::HboneOrigSrc, Some(i)) => {
                if let Some(b) = &mut self.orig_src_b {
                    b.restart(Some(&self.b))?;
                }
                self.sets[i].a.restart(Some(&self.a))?;
            }
            (Kind::Hbone, Some(i)) => {
                self.sets[i].b.restart(Some(&self.b))?;
                self.sets[i].a.restart(Some(&self.a))?;
            }
            (Kind::Peer, _) => {
                if let Some((spec, p)) = &mut self.peer {
                    if spec.target == PeerTarget::Hbone {
                        self.sets[0].b.restart(Some(&self.b))?;
                    }
                    p.restart(Some(&self.a))?;
                }
            }
            (Kind::ZtunnelPassthrough | Kind::ZtunnelHbone, _) => {
                if let Some(z) = &mut self.ztunnel {
                    if v.kind == Kind::ZtunnelHbone {
                        z.b.restart(Some(&z.zb))?;
                    }
                    z.a.restart(Some(&z.za))?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// With a policy sweep, moves each `--cores` group's policy counts one
    /// pair along for `round` (its j-th count runs on its ((j + round) mod
    /// k)-th pair): the pairs' configs are rewritten and the pairs that
    /// change are restarted (ringway B first). Whatever sets one pair apart
    /// from another (its addresses and ports, its processes' history) then
    /// falls on every count alike over k rounds. Returns whether any pair
    /// restarted; the variants' pids and addresses change, their keys do
    /// not.
    pub fn rotate_policies(
        &mut self,
        round: usize,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<bool> {
        let n = self.specs.len();
        let mut moved = false;
        for j in 0..n {
            if self.specs[j].policies.is_none() {
                continue;
            }
            // The group of spec j: the specs with its cores, in order.
            let group: Vec<usize> = (0..n)
                .filter(|&x| self.specs[x].cores == self.specs[j].cores)
                .collect();
            let t = group.iter().position(|&x| x == j).unwrap();
            let pair = group[(t + round) % group.len()];
            self.placement[j] = pair;
            if self.sets[pair].spec == self.specs[j] {
                continue;
            }
            let policies = self.specs[j].policies.unwrap_or(0);
            write_pair_config(&self.work.0, n, pair, policies, self.extras)?;
            let set = &mut self.sets[pair];
            set.b.restart(Some(&self.b))?;
            set.a.restart(Some(&self.a))?;
            set.spec = self.specs[j].clone();
            progress(&format!(
                "ringway pair {pair} now carries {policies} policies: node A pid {}, node B pid {}",
                set.a.pid(),
                set.b.pid()
            ));
            moved = true;
        }
        Ok(moved)
    }

    /// Rewrites the mesh config of every ringway pair that has one of its
    /// own (a set with `policies`) for round `round` of the soak's churn:
    /// the policy count cycles through 0, 12 and 40 (the traffic stays
    /// allowed, and ringway re-checks open connections on each change),
    /// and 0 to 750 workloads elsewhere in the mesh come and go.
    pub fn churn_config(&mut self, round: usize) -> anyhow::Result<()> {
        let n = self.specs.len();
        let extras = Extras {
            churn: (round % 4) * 250,
            ..self.extras
        };
        for pair in 0..n {
            if self.sets[pair].spec.policies.is_some() {
                write_pair_config(&self.work.0, n, pair, [0, 12, 40][round % 3], extras)?;
            }
        }
        Ok(())
    }

    /// Every way through the rig, in column order (the configured sets'
    /// order, wherever they run now). A passthrough column
    /// per `--cores` value (policies never apply to it: its destination is
    /// not in the mesh), an HBONE column per ringway set.
    pub fn variants(&self) -> Vec<Variant> {
        let client = Some(IpAddr::V4(CLIENT_IP));
        let sweep = self.sets.iter().any(|s| s.spec.cores.is_some());
        let suffix = |s: &SetSpec| {
            let mut parts = Vec::new();
            if let (Some(c), true) = (&s.cores, sweep) {
                parts.push(format!("cores {c}"));
            }
            if let Some(p) = s.policies {
                parts.push(format!("{p} policies"));
            }
            if s.quiet {
                parts.push("no metrics, no access log".into());
            }
            match parts.is_empty() {
                true => String::new(),
                false => format!(" ({})", parts.join(", ")),
            }
        };
        let key_suffix = |s: &SetSpec| {
            let mut k = String::new();
            if let (Some(c), true) = (&s.cores, sweep) {
                k += &format!("@{c}");
            }
            if let Some(p) = s.policies {
                k += &format!("/p{p}");
            }
            if s.quiet {
                k += "/quiet";
            }
            k
        };
        let node_a = self.a.name.clone();
        // A column from node A to `dst`; ringway's columns name their set.
        let column = |key: String, label: &str, kind, dst: (Ipv4Addr, u16), pids| Variant {
            key,
            label: label.to_string(),
            kind,
            set: None,
            cores: None,
            dialer: Dialer::direct(SocketAddr::from(dst)).bind(client),
            procs: Processes::new(pids),
            policies: None,
            netns: node_a.clone(),
            compare: None,
        };
        let of_set = |i: usize, v: Variant| Variant {
            set: Some(i),
            cores: self.sets[i].spec.cores.clone(),
            ..v
        };
        let direct = (PLAIN_IP, DIRECT_PORT);
        let mut v = vec![column(
            "direct".into(),
            "direct",
            Kind::Direct,
            direct,
            vec![],
        )];
        for (j, &i) in self.placement.iter().enumerate() {
            let s = &self.sets[i];
            let first_with_cores = self.specs[..j].iter().all(|o| o.cores != s.spec.cores);
            if first_with_cores {
                let plain = SetSpec {
                    cores: s.spec.cores.clone(),
                    policies: None,
                    quiet: s.spec.quiet,
                };
                let key = format!("passthrough{}", key_suffix(&plain));
                let label = format!("ringway passthrough{}", suffix(&plain));
                let dst = (PLAIN_IP, captured_port(i));
                let pids = vec![s.a.pid()];
                v.push(of_set(i, column(key, &label, Kind::Passthrough, dst, pids)));
            }
            let key = format!("hbone{}", key_suffix(&s.spec));
            let label = format!("ringway hbone{}", suffix(&s.spec));
            let dst = (hbone_ip(i), captured_port(i));
            let pids = vec![s.a.pid(), s.b.pid()];
            v.push(Variant {
                policies: s.spec.policies,
                ..of_set(i, column(key, &label, Kind::Hbone, dst, pids))
            });
        }
        if let Some(b) = &self.orig_src_b {
            let dst = (ORIG_SRC_IP, captured_port(0));
            let pids = vec![self.sets[0].a.pid(), b.pid()];
            let label = "ringway hbone orig-src";
            let c = column(
                "hbone-orig-src".into(),
                label,
                Kind::HboneOrigSrc,
                dst,
                pids,
            );
            v.push(of_set(0, c));
        }
        if self.extras.same_node {
            let dst = (SAME_NODE_IP, SAME_NODE_PORT);
            let pids = vec![self.sets[0].a.pid()];
            let label = "ringway same-node";
            v.push(of_set(
                0,
                column("same-node".into(), label, Kind::SameNode, dst, pids),
            ));
        }
        if let Some((spec, p)) = &self.peer {
            let (target, mut pids) = match spec.target {
                PeerTarget::Plain => (SocketAddr::from((PLAIN_IP, DIRECT_PORT)), vec![p.pid()]),
                PeerTarget::Hbone => (
                    SocketAddr::from((hbone_ip(0), DIRECT_PORT)),
                    vec![p.pid(), self.sets[0].b.pid()],
                ),
            };
            pids.dedup();
            v.push(Variant {
                dialer: Dialer::via_socks5(target, spec.socks).bind(client),
                compare: Some(match spec.target {
                    PeerTarget::Plain => Kind::Passthrough,
                    PeerTarget::Hbone => Kind::Hbone,
                }),
                ..column("peer".into(), &spec.name, Kind::Peer, direct, pids)
            });
        }
        if let Some(z) = &self.ztunnel {
            // The same addresses and port as ringway's set 0, in ZA.
            for (kind, key, dst, pids) in [
                (
                    Kind::ZtunnelPassthrough,
                    "passthrough",
                    PLAIN_IP,
                    vec![z.a.pid()],
                ),
                (
                    Kind::ZtunnelHbone,
                    "hbone",
                    hbone_ip(0),
                    vec![z.a.pid(), z.b.pid()],
                ),
            ] {
                let label = format!("ztunnel {key}");
                let dst = (dst, captured_port(0));
                v.push(Variant {
                    netns: z.za.name.clone(),
                    compare: Some(match kind {
                        Kind::ZtunnelPassthrough => Kind::Passthrough,
                        _ => Kind::Hbone,
                    }),
                    ..column(format!("ztunnel-{key}"), &label, kind, dst, pids)
                });
            }
        }
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Direct,
    Passthrough,
    Hbone,
    /// Captured → ringway A's same-node fast path → sink on node A.
    SameNode,
    /// As [`Kind::Hbone`], to a ringway B that connects to the sink from
    /// the client's address.
    HboneOrigSrc,
    /// The `--peer-cmd` proxy, through SOCKS5.
    Peer,
    /// Captured → ztunnel A → the non-mesh destination (nodes ZA, ZB).
    ZtunnelPassthrough,
    /// Captured → ztunnel A → HBONE → ztunnel B → sink.
    ZtunnelHbone,
}

/// One column of the results: a way from the client to the sink.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub key: String,
    pub label: String,
    pub kind: Kind,
    /// The ringway pair (core set) it goes through.
    pub set: Option<usize>,
    pub cores: Option<String>,
    pub dialer: Dialer,
    #[serde(serialize_with = "pids")]
    pub procs: Processes,
    /// HBONE through a `--policies` set: the policies on the destination.
    pub policies: Option<usize>,
    /// The network namespace the load generator runs in.
    pub netns: String,
    /// Another proxy's column: the kind of ringway column it compares with.
    pub compare: Option<Kind>,
}

fn pids<S: serde::Serializer>(p: &Processes, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(p.roots.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_lists_client_and_one_server_per_set() {
        let y = mesh_config(2, 0, 0);
        assert!(y.contains("10.250.0.1\""));
        assert!(y.contains("10.250.0.10\"") && y.contains("node: node-b0"));
        assert!(y.contains("10.250.0.11\"") && y.contains("node: node-b1"));
        assert!(
            !y.contains("10.250.0.3\""),
            "the plain address is not in the mesh"
        );
    }

    /// The generated policies load in ringway's local-config schema, and
    /// the client gets in only through the last one while others are kept
    /// out: what the policy sweep relies on.
    #[test]
    fn policies_load_and_let_only_the_client_in() {
        use ringway_controlplane::model::authz::Conn;
        use ringway_controlplane::sources::local::load_snapshot;
        use ringway_controlplane::Identity;

        let port = captured_port(1);
        let decide = |n: usize, src: Ipv4Addr, peer: &str| -> String {
            let snap = load_snapshot(&mesh_config(2, n, port), "test").expect("loads");
            assert_eq!(snap.policy_count(), n);
            let server = snap
                .workload_by_uid("cluster1//v1/Pod/server-ns/server-1")
                .unwrap();
            let peer: Option<Identity> = (!peer.is_empty()).then(|| peer.parse().unwrap());
            let conn = Conn {
                src: IpAddr::V4(src),
                dst: SocketAddr::from((hbone_ip(1), port)),
                peer: peer.as_ref(),
            };
            snap.authorize(server, &conn, &mut |d| panic!("no dry run: {d}"))
                .to_string()
        };
        let client = "spiffe://cluster.local/ns/client-ns/sa/client";
        let none_allowed = "allow policies exist, but none allowed";
        assert_eq!(decide(0, CLIENT_IP, client), "no allow policies, allowed");
        assert_eq!(decide(5, CLIENT_IP, client), "no allow policies, allowed");
        for n in [10, 1000] {
            let last = format!("allowed by server-ns/policy-{:05}", n - 1);
            assert_eq!(decide(n, CLIENT_IP, client), last, "{n}");
            assert_eq!(
                decide(n, CLIENT_IP, "spiffe://cluster.local/ns/x/sa/y"),
                none_allowed
            );
            assert_eq!(decide(n, CLIENT_IP, ""), none_allowed);
            // Each DENY denies what it names: by principal and port ...
            let other = "spiffe://cluster.local/ns/other-3/sa/x";
            let denied = "explicitly denied by server-ns/policy-00003";
            assert_eq!(decide(n, CLIENT_IP, other), denied);
            // ... and by namespace from 10.9.0.0/16.
            let other_ns = "spiffe://cluster.local/ns/other-3/sa/z";
            assert_eq!(decide(n, Ipv4Addr::new(10, 9, 1, 2), other_ns), denied);
            assert_eq!(decide(n, CLIENT_IP, other_ns), none_allowed);
        }
        let y = policies_yaml(1000, port);
        assert_eq!(y.matches("action: Deny").count(), 999);
        assert_eq!(y.matches("action: Allow").count(), 1);
    }

    #[test]
    fn capture_rules_skip_direct_port_and_marked_sockets() {
        let r = capture_rules("veth0", &ringway_redirects(2));
        assert!(r.contains("tcp dport 5201 return"));
        assert!(r.contains("0x539 return"));
        assert!(r.contains("tcp dport 5300 redirect to :16001"));
        assert!(r.contains("tcp dport 5301 redirect to :16101"));
        let z = capture_rules("vz", &[(captured_port(0), ztunnel::OUTBOUND_PORT)]);
        assert!(z.contains("oifname \"vz\" meta mark & 0xfff == 0x539 return"));
        assert!(z.contains("tcp dport 5300 redirect to :15001"));
    }

    /// No connection may take one of ztunnel's fixed ports as its local
    /// port, or a restarted ztunnel could not bind it.
    #[test]
    fn ztunnel_ports_are_not_ephemeral() {
        let (lo, hi) = EPHEMERAL_PORTS;
        for p in ztunnel::FIXED_PORTS {
            assert!(!(lo..=hi).contains(&p), "{p}");
        }
        assert!(hi as usize - lo as usize > 40_000, "still a wide range");
    }

    /// ztunnel rejects a workload without `services` and defaults its
    /// trust domain to "": the config names both on every workload.
    #[test]
    fn config_serves_ztunnel_too() {
        let y = mesh_config(2, 0, 0);
        assert_eq!(y.matches("- uid: ").count(), 3);
        assert_eq!(y.matches("  services: {}\n").count(), 3);
        assert_eq!(y.matches("  trustDomain: cluster.local\n").count(), 3);
        let p = policies_yaml(10, 5300);
        assert_eq!(p.matches("dryRun: false").count(), 10);
        assert!(!p.contains("exact:"), "string matches are YAML tags: {p}");
    }
}
