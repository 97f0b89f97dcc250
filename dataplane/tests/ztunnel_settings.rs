//! ztunnel's environment variables on a real ringway process (issue 24):
//! honoured ones show in `/config_dump` under ztunnel's field names and
//! reach the sockets; a refused one stops startup naming it; a warned one
//! logs a warning naming it; a `RINGWAY_*` variable that disagrees with
//! ztunnel's stops startup naming both; a flag wins over both. The pure
//! mapping of every variable is unit-tested in `app::ztunnel_env`.
//!
//! Needs root (transparent listeners): fails, never skips, without it.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::Duration;

use common::Ringway;

fn start(extra: &[&str], env: &[(&str, &str)]) -> Ringway {
    common::require_root();
    let mut args = common::LOOPBACK_TRAFFIC.to_vec();
    args.extend_from_slice(extra);
    Ringway::start_with_command(&args, |cmd| {
        for (k, v) in env {
            cmd.env(k, v);
        }
    })
}

fn config_dump(rw: &Ringway) -> serde_json::Value {
    let (status, body) = rw.http_get("admin", "/config_dump");
    assert!(status.contains("200"), "{status}");
    serde_json::from_str(&body).unwrap()
}

/// ringway that must not start: (exit status, stderr).
fn refused_start(env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let ca = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(common::ringway_bin());
    cmd.args(common::LOOPBACK_TRAFFIC)
        .args(["--admin-addr", "127.0.0.1:0", "--stats-addr", "127.0.0.1:0"])
        .args(["--readiness-addr", "127.0.0.1:0", "--ca-dir"])
        .arg(ca.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ringway");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn honoured_variables_show_in_config_dump() {
    let rw = start(
        &[],
        &[
            ("PACKET_MARK", "4242"),
            ("POOL_MAX_STREAMS_PER_CONNECTION", "7"),
            ("POOL_UNUSED_RELEASE_TIMEOUT", "90s"),
            ("HTTP2_STREAM_WINDOW_SIZE", "1000000"),
            ("HTTP2_CONNECTION_WINDOW_SIZE", "3000000"),
            ("HTTP2_FRAME_SIZE", "65536"),
            ("KEEPALIVE_TIME", "33s"),
            ("KEEPALIVE_INTERVAL", "7s"),
            ("KEEPALIVE_RETRIES", "4"),
            ("USER_TIMEOUT_ENABLED", "true"),
            ("TERMINATION_GRACE_PERIOD_SECONDS", "30"),
            ("SECRET_TTL", "2h"),
            ("IPV6_ENABLED", "false"),
            ("ENABLE_RESPONSE_BAGGAGE", "false"),
            ("TLS12_ENABLED", "true"),
            ("ZTUNNEL_WORKER_THREADS", "1"),
            ("ISTIO_META_CLUSTER_ID", "east"),
            ("CLUSTER_DOMAIN", "corp.example"),
        ],
    );
    let c = &config_dump(&rw)["config"];
    assert_eq!(c["packetMark"], 4242, "{c}");
    assert_eq!(c["poolMaxStreamsPerConn"], 7, "{c}");
    assert_eq!(c["poolUnusedReleaseTimeout"], "90s", "{c}");
    assert_eq!(c["windowSize"], 1_000_000, "{c}");
    assert_eq!(c["connectionWindowSize"], 3_000_000, "{c}");
    assert_eq!(c["frameSize"], 65536, "{c}");
    let s = &c["socketConfig"];
    assert_eq!(s["keepaliveEnabled"], true, "{c}");
    assert_eq!(s["keepaliveTime"], "33s", "{c}");
    assert_eq!(s["keepaliveInterval"], "7s", "{c}");
    assert_eq!(s["keepaliveRetries"], 4, "{c}");
    assert_eq!(s["userTimeoutEnabled"], true, "{c}");
    assert_eq!(c["selfTerminationDeadline"], "25s", "grace − 5 s: {c}");
    assert_eq!(c["secretTtl"], "7200s", "{c}");
    assert_eq!(c["ipv6Enabled"], false, "{c}");
    assert_eq!(c["enableResponseBaggage"], false, "{c}");
    assert_eq!(c["tls12Enabled"], true, "{c}");
    assert_eq!(c["cores"].as_array().unwrap().len(), 1, "{c}");
    assert!(
        c["coresReason"]
            .as_str()
            .unwrap()
            .contains("ztunnel's worker threads"),
        "{c}"
    );
    assert_eq!(c["clusterId"], "east", "{c}");
    assert_eq!(c["clusterDomain"], "corp.example", "{c}");
}

/// KEEPALIVE_* and USER_TIMEOUT_ENABLED on ringway's listening socket,
/// which every accepted connection inherits (io::listener's unit test).
#[test]
fn keepalive_variables_reach_the_sockets() {
    let rw = start(
        &[],
        &[
            ("KEEPALIVE_TIME", "33s"),
            ("KEEPALIVE_INTERVAL", "7s"),
            ("KEEPALIVE_RETRIES", "4"),
            ("USER_TIMEOUT_ENABLED", "true"),
        ],
    );
    let addr: std::net::SocketAddr = rw.listeners["listeners"]["outbound"][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let listener = listener_of(rw.pid(), addr);
    let s = socket2::SockRef::from(&listener);
    assert!(s.keepalive().unwrap());
    assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(33));
    assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
    assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
    assert_eq!(
        s.tcp_user_timeout().unwrap(),
        Some(Duration::from_secs(33 + 4 * 7)),
        "ztunnel's TCP_USER_TIMEOUT: time + interval × retries"
    );
}

/// A copy of the listening socket bound to `addr` in process `pid`
/// (pidfd_getfd; root may take any process's descriptors).
fn listener_of(pid: i32, addr: std::net::SocketAddr) -> OwnedFd {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: pidfd is a descriptor this process just opened and owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Ok(n) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: pidfd_getfd takes the pidfd, a descriptor number of that
        // process and flags, and returns a new descriptor of ours or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: a descriptor pidfd_getfd just gave this process.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let s = socket2::SockRef::from(&fd);
        let listening = s.is_listener().unwrap_or(false);
        let local = s.local_addr().ok().and_then(|a| a.as_socket());
        if listening && local == Some(addr) {
            return fd;
        }
    }
    panic!("no listening socket on {addr} in process {pid}");
}

/// ztunnel's inline local config (LOCAL_XDS) is what ringway serves.
/// Started by hand: the common helper always gives --config, which wins.
#[test]
fn local_xds_inline_is_the_config() {
    common::require_root();
    const MESH: &str = "workloads:\n- uid: k//v1/Pod/ns-a/app\n  name: app\n  namespace: ns-a\n  workloadIps: [\"10.9.0.1\"]\n  protocol: TCP\nservices: []\npolicies: []\n";
    let dir = tempfile::tempdir().unwrap();
    let bound = dir.path().join("bound.json");
    let child = Command::new(common::ringway_bin())
        .args(common::LOOPBACK_TRAFFIC)
        .args(["--admin-addr", "127.0.0.1:0", "--stats-addr", "127.0.0.1:0"])
        .args(["--readiness-addr", "127.0.0.1:0", "--allow-unknown-source"])
        .arg("--ca-dir")
        .arg(dir.path().join("ca"))
        .arg("--bound-addrs-file")
        .arg(&bound)
        .env("LOCAL_XDS", MESH)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn ringway");
    let child = KillOnDrop(child);
    let listeners = common::wait_for("ringway to bind", common::PATIENCE, || {
        let text = std::fs::read_to_string(&bound).map_err(|e| e.to_string())?;
        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
    });
    let admin = listeners["listeners"]["admin"][0].as_str().unwrap();
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    use std::io::{Read, Write};
    s.write_all(b"GET /config_dump HTTP/1.1\r\nhost: ringway\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let dump: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(dump["workloads"][0]["uid"], "k//v1/Pod/ns-a/app", "{dump}");
    drop(child);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A flag on the command line wins over ztunnel's variable, and says so.
#[test]
fn a_flag_wins_over_the_ztunnel_variable() {
    let rw = start(
        &["--drain-timeout", "3s"],
        &[("CONNECTION_TERMINATION_DEADLINE", "9s")],
    );
    assert_eq!(config_dump(&rw)["config"]["selfTerminationDeadline"], "3s");
    rw.wait_log("the flag-wins note", |l| {
        l["message"].as_str().is_some_and(|m| {
            m.contains("--drain-timeout") && m.contains("CONNECTION_TERMINATION_DEADLINE")
        })
    });
}

#[test]
fn a_refused_variable_stops_startup_naming_it() {
    common::require_root();
    let (status, stderr) = refused_start(&[("COMPLIANCE_POLICY", "pqc")]);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("COMPLIANCE_POLICY"), "{stderr}");
    let (status, stderr) = refused_start(&[("ALT_XDS_HOSTNAME", "istiod.example")]);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("ALT_XDS_HOSTNAME"), "{stderr}");
}

#[test]
fn a_warned_variable_logs_a_warning_naming_it() {
    let rw = start(&[], &[("PREFERED_SERVICE_NAMESPACE", "istio-system")]);
    let line = rw.wait_log("the warning", |l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.contains("PREFERED_SERVICE_NAMESPACE"))
    });
    assert_eq!(line["level"], "warn", "{line}");
}

/// RINGWAY_MARK and PACKET_MARK that disagree: an error naming both;
/// agreeing, ringway starts.
#[test]
fn ringway_and_ztunnel_variables_that_disagree_stop_startup() {
    common::require_root();
    let (status, stderr) = refused_start(&[("RINGWAY_MARK", "0x10"), ("PACKET_MARK", "1337")]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("RINGWAY_MARK") && stderr.contains("PACKET_MARK"),
        "{stderr}"
    );
    let rw = start(&[], &[("RINGWAY_MARK", "1337"), ("PACKET_MARK", "1337")]);
    assert_eq!(config_dump(&rw)["config"]["packetMark"], 1337);
}

/// PROXY_CONFIG as Istio passes it: `concurrency` sizes the executors and
/// `proxyMetadata` turns the DNS proxy on, where ztunnel's would be.
#[test]
fn proxy_config_sets_concurrency_and_metadata() {
    let rw = start(
        &[],
        &[(
            "PROXY_CONFIG",
            r#"{"concurrency": 1, "proxyMetadata": {"DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:0"}}"#,
        )],
    );
    let c = &config_dump(&rw)["config"];
    assert_eq!(c["cores"].as_array().unwrap().len(), 1, "{c}");
    assert!(
        c["coresReason"]
            .as_str()
            .unwrap()
            .contains("1 worker threads"),
        "{c}"
    );
    assert_eq!(c["dnsProxy"], true, "{c}");
}

/// ENABLE_RESPONSE_BAGGAGE=false keeps the destination's baggage off the
/// 200 of an inbound HBONE CONNECT. Given here as its flag, which the
/// variable sets (`honoured_variables_show_in_config_dump`): the two
/// nodes' ringways share one environment, this test's.
#[test]
fn response_baggage_off_leaves_the_200_without_it() {
    use common::nodes::{base_config, client_args, py_client, Nodes, CLIENT_ID, SERVER_IP};
    let nodes = Nodes::with_config("zenv", &base_config(), true, &["--no-response-baggage"]);
    nodes.b.enter(|| {
        common::serve_echo(std::net::TcpListener::bind(format!("{SERVER_IP}:8081")).unwrap())
    });
    let certs = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "client", "1h");
    let root = nodes.ca_dir().join("root-cert.pem");
    let args = client_args(&certs, &root, &format!("{SERVER_IP}:8081"));
    let (_, out) = py_client(&nodes.a, &args);
    assert_eq!(out["status"][0], 200, "{out}");
    assert!(out["response_headers"][0].is_object(), "{out}");
    assert!(
        out["response_headers"][0].get("baggage").is_none(),
        "baggage sent though turned off: {out}"
    );
}
