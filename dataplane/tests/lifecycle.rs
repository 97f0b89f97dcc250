//! Startup validation, config reloads and SIGTERM drain, against a real
//! ringway process.

mod common;

use common::{ask, serve_tag};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{NetNs, PATIENCE};

/// Every listener on a free loopback port.
fn listen_any_port() -> Vec<&'static str> {
    [
        &["--readiness-addr", "127.0.0.1:0"][..],
        &common::LOOPBACK_TRAFFIC[..],
    ]
    .concat()
}

fn run_ringway(args: &[&str]) -> (i32, String) {
    let ca = tempfile::tempdir().unwrap();
    let out = Command::new(common::ringway_bin())
        .args(listen_any_port())
        .arg("--ca-dir")
        .arg(ca.path())
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn invalid_config_at_start_names_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        dir.path(),
        "bad.yaml",
        "workloads:\n- uid: a\n  name: a\n  namespace: ns\n  workloadIps: [\"10.0.0.300\"]\n",
    );
    let (code, out) = run_ringway(&["--config", cfg.to_str().unwrap()]);
    assert_ne!(code, 0, "must exit non-zero: {out}");
    assert!(
        out.contains("workloadIps"),
        "error must name the field: {out}"
    );
    assert!(out.contains("line 5"), "error must name the line: {out}");
}

#[test]
fn unknown_field_at_start_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(dir.path(), "bad.yaml", "workloads: []\nservises: []\n");
    let (code, out) = run_ringway(&["--config", cfg.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(out.contains("servises"), "{out}");
}

#[test]
fn nonexistent_core_fails_fast() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let spec = format!("{cpus}-{cpus}");
    let (code, out) = run_ringway(&["--cores", &spec]);
    assert_ne!(code, 0);
    assert!(out.contains(&format!("CPU {cpus} does not exist")), "{out}");
}

#[test]
fn embedded_default_starts_without_any_file() {
    let mut rw = common::Ringway::start_embedded(None, &listen_any_port());
    rw.wait_log("the embedded default", |l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.contains("embedded default config"))
    });
    rw.signal(libc::SIGTERM);
    assert!(rw.wait_exit(Duration::from_secs(10)).success());
}

/// A config whose service VIP 127.10.0.1:80 is served by a TCP workload on
/// 127.0.0.5, target port `port`.
fn vip_config(port: u16) -> String {
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
      80: {port}
- uid: cluster1//v1/Pod/default/meshed
  name: meshed
  namespace: default
  workloadIps: ["127.0.0.6"]
  protocol: HBONE
services:
- name: backend
  namespace: default
  hostname: backend.default.svc.cluster.local
  vips: ["/127.10.0.1"]
  ports:
    80: {port}
"#
    )
}

#[test]
fn vip_routing_and_bad_edit_keeps_last_good_snapshot() {
    let ns = NetNs::new("cfg");
    ns.capture_outbound("80, 9000-9999");
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(dir.path(), "local.yaml", &vip_config(9101));
    let cfg_s = cfg.to_str().unwrap().to_string();
    // The client speaks from 127.0.0.1, which is no workload: let it out.
    let rw = ns.ringway(&[
        "--config",
        &cfg_s,
        "--config-poll-interval",
        "100ms",
        "--allow-unknown-source",
    ]);
    ns.enter(|| {
        serve_tag("127.0.0.5:9101", "first");
        serve_tag("127.0.0.5:9102", "second");
    });
    let through_vip = || ns.enter(|| ask("127.10.0.1:80"));
    assert_eq!(through_vip().unwrap(), "first");

    // A broken edit: logged, and the previous snapshot keeps routing.
    std::fs::write(&cfg, "workloads:\n- uid: [oops\n").unwrap();
    rw.wait_log("the bad edit's report", |l| l["level"] == "error");
    assert_eq!(through_vip().unwrap(), "first");

    // A good edit takes effect.
    std::fs::write(&cfg, vip_config(9102)).unwrap();
    common::wait_for(
        "the good edit to be applied",
        PATIENCE,
        || match through_vip().unwrap() {
            got if got == "second" => Ok(()),
            got => Err(got),
        },
    );

    // An HBONE workload is never reached in plaintext.
    let r = ns.enter(|| {
        let l = TcpListener::bind("127.0.0.6:9103").unwrap();
        let r = ask("127.0.0.6:9103");
        l.set_nonblocking(true).unwrap();
        (r, l.accept().is_ok())
    });
    assert!(
        !r.1,
        "the HBONE workload must not receive a plaintext connection"
    );
    rw.wait_log("the fail-closed refusal", |l| {
        l["dst.addr"] == "127.0.0.6:9103"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("fail closed"))
    });
}

#[test]
fn sigterm_drains_open_connections_then_exits() {
    let ns = NetNs::new("drain");
    ns.capture_outbound("9000-9999");
    let mut rw = ns.ringway(&["--drain-timeout", "20s"]);
    let l = ns.enter(|| TcpListener::bind("127.0.0.1:9201").unwrap());
    let ns_name = ns.name.clone();
    let client = common::in_netns(&ns.name, || {
        let mut c = TcpStream::connect("127.0.0.1:9201").unwrap();
        c.write_all(b"before").unwrap();
        c
    });
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 6];
    s.read_exact(&mut b).unwrap();

    // Probe connections that race the listener close get proxied: let the
    // upstream accept and close them so they finish.
    thread::spawn(move || {
        for c in l.incoming() {
            drop(c);
        }
    });
    rw.signal(libc::SIGTERM);
    // New connections are no longer accepted (the capture rule leads to a
    // closed port: connect is refused)...
    common::wait_for(
        "new connections to be refused",
        PATIENCE,
        || match common::in_netns(&ns_name, || TcpStream::connect("127.0.0.1:9201")) {
            Ok(_) => Err("still accepting after SIGTERM"),
            Err(_) => Ok(()),
        },
    );
    // ...but the open one still works in both directions.
    let mut client = client;
    client.write_all(b"during").unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"during");
    s.write_all(b"reply!").unwrap();
    client.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"reply!");
    assert!(
        rw.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "must wait for the open connection"
    );
    // Closing it lets ringway finish well before the 20 s deadline.
    drop(client);
    drop(s);
    let started = Instant::now();
    assert!(rw.wait_exit(Duration::from_secs(10)).success());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn drain_deadline_closes_lingering_connections() {
    let ns = NetNs::new("dl");
    ns.capture_outbound("9000-9999");
    let mut rw = ns.ringway(&["--drain-timeout", "1s"]);
    let l = ns.enter(|| TcpListener::bind("127.0.0.1:9202").unwrap());
    let mut client = common::in_netns(&ns.name, || TcpStream::connect("127.0.0.1:9202").unwrap());
    let (_s, _) = l.accept().unwrap();
    let started = Instant::now();
    rw.signal(libc::SIGTERM);
    let status = rw.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}: {}", rw.stderr());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let read = client.read(&mut [0u8; 1]);
    assert!(
        common::peer_closed(&read),
        "the lingering connection is closed: {read:?}"
    );
    rw.wait_log("the drain-deadline closure", |l| {
        l["error"]
            .as_str()
            .is_some_and(|e| e.contains("drain deadline"))
    });
}

#[test]
fn too_little_locked_memory_fails_fast_with_a_clear_message() {
    common::require_root();
    // An unprivileged user with a 64 KiB memlock limit: io_uring_setup
    // would only say ENOMEM; ringway must refuse at startup and say why.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // The build tree may sit where that user cannot reach (e.g. /root).
    let bin = dir.path().join("ringway");
    std::fs::copy(common::ringway_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = format!(
        "ulimit -l 64 && exec {} --outbound-addr 127.0.0.1:0 --inbound-passthrough-addr 127.0.0.1:0 --inbound-addr 127.0.0.1:0 --ca-dir {}/ca",
        bin.display(),
        dir.path().display()
    );
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "must not start: {text}");
    assert!(
        text.contains("RLIMIT_MEMLOCK"),
        "the error must name the limit: {text}"
    );
}
