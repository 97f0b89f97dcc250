//! ringway against a real control plane over gRPC + TLS: `ringway-devcp`
//! serving Delta ADS (Istio's Address/Authorization types) and the Istio CA
//! service, in a private network namespace. Covers config from xDS, pushed
//! deltas, certificates from the CA client used for HBONE, readiness, the
//! control plane going away, and on-demand lookups.

mod common;

use common::{ask_from, serve_tag};

/// The client workload (HBONE, on this node): known to ringway, so its
/// connections may leave.
const CLIENT: &str = "127.0.0.3";

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{in_netns, NetNs, Ringway, PATIENCE};

fn devcp_bin() -> PathBuf {
    let p = Path::new(common::ringway_bin()).with_file_name("ringway-devcp");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p ringway-controlplane --bin ringway-devcp` (scripts/test.sh builds the whole workspace)",
        p.display()
    );
    p
}

fn mesh(target_port: u16) -> String {
    format!(
        r#"
workloads:
- uid: cluster1//v1/Pod/default/backend
  name: backend
  namespace: default
  serviceAccount: backend
  workloadIps: ["127.0.0.5"]
  protocol: TCP
  services:
    "default/backend.default.svc.cluster.local":
      80: {target_port}
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["127.0.0.3"]
  protocol: HBONE
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["127.0.0.2"]
  protocol: HBONE
services:
- name: backend
  namespace: default
  hostname: backend.default.svc.cluster.local
  vips: ["/127.10.0.1"]
  ports:
    80: {target_port}
"#
    )
}

struct Rig {
    ns: NetNs,
    dir: tempfile::TempDir,
    devcp: Option<Child>,
    config: PathBuf,
}

impl Rig {
    fn new(tag: &str, target_port: u16) -> Rig {
        let ns = NetNs::new(tag);
        ns.capture_outbound("80, 9000-9999");
        let dir = tempfile::tempdir().unwrap();
        let config = common::write_config(dir.path(), "mesh.yaml", &mesh(target_port));
        let mut rig = Rig {
            ns,
            dir,
            devcp: None,
            config,
        };
        rig.start_devcp();
        rig
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("cp-ca/root-cert.pem")
    }

    fn start_devcp(&mut self) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns.name])
            .arg(devcp_bin())
            .args([
                "--config",
                self.config.to_str().unwrap(),
                "--listen",
                "127.0.0.1:15012",
            ])
            .args([
                "--ca-dir",
                self.dir.path().join("cp-ca").to_str().unwrap(),
                "--poll-interval-ms",
                "100",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("devcp.log")).unwrap())
            .spawn()
            .unwrap();
        self.devcp = Some(child);
        let log = self.dir.path().join("devcp.log");
        common::wait_for("ringway-devcp to serve", PATIENCE, || {
            if self.root().exists()
                && in_netns(&self.ns.name, || {
                    TcpStream::connect("127.0.0.1:15012").is_ok()
                })
            {
                Ok(())
            } else {
                Err(common::FileText(&log))
            }
        });
    }

    fn stop_devcp(&mut self) {
        if let Some(mut c) = self.devcp.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn ringway(&self, extra: &[&str]) -> Ringway {
        let root = self.root();
        let mut args = vec![
            "--xds-address",
            "https://127.0.0.1:15012",
            "--xds-root-ca",
            root.to_str().unwrap(),
            "--ca-address",
            "https://127.0.0.1:15012",
            "--ca-root-ca",
            root.to_str().unwrap(),
            "--cert-wait-timeout",
            "10s",
        ];
        args.extend_from_slice(extra);
        // The harness returns once listeners are bound; readiness comes later.
        let rw = self.ns.ringway(
            &args
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        rw
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop_devcp();
    }
}

fn readiness(ns: &NetNs, rw: &Ringway) -> Option<u16> {
    let addr: SocketAddr = rw.listeners["listeners"]["readiness"][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    in_netns(&ns.name, move || {
        let mut s = TcpStream::connect(addr).ok()?;
        s.write_all(b"GET /healthz/ready HTTP/1.1\r\nhost: x\r\n\r\n")
            .ok()?;
        let mut r = String::new();
        s.read_to_string(&mut r).ok()?;
        r.split_whitespace().nth(1)?.parse().ok()
    })
}

fn wait_ready(ns: &NetNs, rw: &Ringway) {
    common::wait_for("readiness", PATIENCE, || match readiness(ns, rw) {
        Some(200) => Ok(()),
        other => Err(format!("{other:?}; {}", common::FileText(&rw.log_path))),
    })
}

#[test]
fn config_from_xds_deltas_and_control_plane_down() {
    let mut rig = Rig::new("xds", 9301);
    rig.ns.enter(|| {
        serve_tag("127.0.0.5:9301", "first");
        serve_tag("127.0.0.5:9302", "second");
    });
    // Both mesh workloads are on this node: without --no-fast-path their
    // HBONE would be served in-process, and this test is about the TLS
    // certificates the CA client brings.
    let rw = rig.ringway(&["--no-fast-path"]);
    wait_ready(&rig.ns, &rw);
    assert_eq!(
        rig.ns.enter(|| ask_from(CLIENT, "127.10.0.1:80")).unwrap(),
        "first",
        "VIP routed from xDS config"
    );

    // An edit on the control plane arrives as a delta.
    std::fs::write(&rig.config, mesh(9302)).unwrap();
    common::wait_for("the pushed delta to be applied", PATIENCE, || {
        match rig.ns.enter(|| ask_from(CLIENT, "127.10.0.1:80")).unwrap() {
            got if got == "second" => Ok(()),
            got => Err(got),
        }
    });

    // HBONE between the two mesh workloads, certificates from the CA client.
    rig.ns.enter(|| serve_tag("127.0.0.2:9303", "over-hbone"));
    let via_hbone = rig.ns.enter(|| {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&"127.0.0.3:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        sock.connect(&"127.0.0.2:9303".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let mut c: TcpStream = sock.into();
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).map(|_| s)
    });
    assert_eq!(via_hbone.unwrap(), "over-hbone");
    let hbone = rw.wait_log("the outbound HBONE connection", |l| {
        l["scope"] == "access" && l["route"] == "hbone" && l["path"] == "outbound"
    });
    assert_eq!(
        hbone["src.identity"],
        "spiffe://cluster.local/ns/default/sa/client"
    );
    // The xDS client's counters reach the scrape, as ztunnel's series.
    let (_, scrape) = rw.http_get("stats", "/metrics");
    let received = scrape
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"} ",
            )
        })
        .unwrap_or_else(|| panic!("no xDS series in\n{scrape}"));
    assert!(received.parse::<u64>().unwrap() >= 1, "{scrape}");
    // Every snapshot built from an xDS response is timed from its arrival
    // to the core serving it: the initial load and the pushed edit at
    // least, each within the histogram's last finite bound.
    let count = |le: &str| -> u64 {
        let prefix =
            format!("ringway_core_config_propagation_seconds_bucket{{core=\"0\",le=\"{le}\"}} ");
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {prefix} in\n{scrape}"))
            .parse()
            .unwrap()
    };
    assert!(count("+Inf") >= 2, "{scrape}");
    assert_eq!(count("1"), count("+Inf"), "{scrape}");

    // The control plane goes away: the last snapshot and the certificates
    // keep serving new connections. Not merely before ringway notices:
    // once its xDS client has failed to reconnect.
    let failed_reconnects = || {
        rw.logs()
            .iter()
            .filter(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("xDS connection failed"))
            })
            .count()
    };
    let before = failed_reconnects();
    rig.stop_devcp();
    common::wait_for("a failed xDS reconnect", PATIENCE, || {
        if failed_reconnects() > before {
            Ok(())
        } else {
            Err(common::FileText(&rw.log_path))
        }
    });
    assert_eq!(
        rig.ns.enter(|| ask_from(CLIENT, "127.10.0.1:80")).unwrap(),
        "second"
    );
    assert_eq!(
        readiness(&rig.ns, &rw),
        Some(200),
        "once ready, stays ready across reconnects"
    );
}

#[test]
fn on_demand_lookup_resolves_unknown_destination() {
    let rig = Rig::new("ond", 9311);
    rig.ns.enter(|| serve_tag("127.0.0.5:9311", "on-demand"));
    let rw = rig.ringway(&["--xds-on-demand", "--on-demand-timeout", "10s"]);
    wait_ready(&rig.ns, &rw);
    // Nothing about 127.10.0.1 is known until the connection asks for it.
    let got = rig.ns.enter(|| ask_from(CLIENT, "127.10.0.1:80"));
    assert_eq!(
        got.as_deref().ok(),
        Some("on-demand"),
        "{got:?}: {:#?}",
        rw.logs()
    );
    let log = &rw.wait_access_logs(1)[0];
    assert_eq!(log["route"], "service", "{log}");
}

/// Late rejection through xDS: a live tunnel between the two mesh workloads
/// is closed when istiod (here ringway-devcp) pushes a policy that denies
/// it; a tunnel the policy does not cover stays up.
#[test]
fn pushed_policy_closes_a_live_tunnel() {
    let rig = Rig::new("xlate", 9321);
    let echo = |addr: &'static str| {
        rig.ns.enter(move || {
            let l = std::net::TcpListener::bind(addr).unwrap();
            thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { return };
                    thread::spawn(move || {
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 || s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        })
    };
    echo("127.0.0.2:9322");
    echo("127.0.0.2:9323");
    let rw = rig.ringway(&[]);
    wait_ready(&rig.ns, &rw);
    let open = |port: u16| {
        rig.ns.enter(move || {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.bind(&SocketAddr::new(CLIENT.parse().unwrap(), 0).into())
                .unwrap();
            sock.connect(&SocketAddr::from(([127, 0, 0, 2], port)).into())
                .unwrap();
            let mut c: TcpStream = sock.into();
            c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            c.write_all(b"ping").unwrap();
            let mut got = [0u8; 4];
            c.read_exact(&mut got).unwrap();
            c
        })
    };
    let mut doomed = open(9322);
    let mut spared = open(9323);

    // The control plane learns a policy denying the client on 9322.
    let policy = r#"policies:
- name: deny-client-9322
  namespace: default
  scope: Namespace
  action: Deny
  rules: [[[ {principals: [{exact: "cluster.local/ns/default/sa/client"}], destinationPorts: [9322]} ]]]
"#;
    let pushed = Instant::now();
    std::fs::write(&rig.config, format!("{}{policy}", mesh(9321))).unwrap();
    let r = doomed.read(&mut [0u8; 16]);
    assert!(common::peer_closed(&r), "still open: {r:?}");
    let took = pushed.elapsed();
    // The dev control plane polls its file every 100 ms; the rest is the
    // push, the snapshot and the close.
    assert!(
        took < Duration::from_secs(3),
        "closed {took:?} after the edit"
    );
    spared.write_all(b"alive").unwrap();
    let mut got = [0u8; 5];
    spared.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"alive");
    let closed = rw.wait_log("the late rejection", |l| {
        l["scope"] == "access"
            && l["path"] == "inbound"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("closed: late rejection"))
    });
    assert_eq!(
        closed["error"],
        "closed: late rejection: authorization policy: explicitly denied by default/deny-client-9322"
    );
}
