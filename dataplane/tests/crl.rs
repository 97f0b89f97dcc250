//! Certificate revocation (`--crl-path`, ztunnel's `CRL_PATH`) end to end:
//! two simulated nodes as in `hbone.rs`, one built-in CA made before the
//! ringways start, and real CRLs it signs. A revoked peer is refused on
//! inbound 15008 (a Python HBONE client against ringway) and on outbound
//! (ringway against a Python HBONE server); a rewritten CRL file applies
//! without a restart, to open connections too (a revoked client's inbound
//! tunnel and a pooled connection to a revoked server are closed, others
//! keep carrying bytes); garbage over a good file keeps the good CRLs and
//! says so; the metrics follow. Netns names start with `crl`.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::nodes::{
    base_config, client_args, connect_from_client, py_client, py_server, Nodes, CLIENT_ID,
    SERVER_ID, SERVER_IP,
};
use common::{in_netns, serve_echo, wait_for, Ringway, PATIENCE};
use ringway_controlplane::security::ca::{serial_of, write_issued, DEFAULT_CERT_VALIDITY};
use ringway_controlplane::{BuiltinCa, Identity};

const TD: &str = "cluster.local";

/// The CA in `dir/ca`, created now.
fn ca(dir: &Path) -> BuiltinCa {
    BuiltinCa::load_or_create(&dir.join("ca"), TD).unwrap()
}

/// Issues `spiffe_id` into `dir/name` (key.pem, cert.pem, ...); returns the
/// directory and the certificate's serial.
fn issue(ca: &BuiltinCa, dir: &Path, spiffe_id: &str, name: &str) -> (PathBuf, Vec<u8>) {
    let id: Identity = spiffe_id.parse().unwrap();
    let issued = ca.issue(&id, DEFAULT_CERT_VALIDITY).unwrap();
    let out = dir.join(name);
    write_issued(&issued, &out).unwrap();
    (out, serial_of(issued.leaf_pem()).unwrap())
}

fn serial_in(certs: &Path) -> Vec<u8> {
    serial_of(&std::fs::read_to_string(certs.join("cert.pem")).unwrap()).unwrap()
}

/// Writes a CRL revoking `serials` over `path`, in place (not a rename).
fn write_crl(ca: &BuiltinCa, path: &Path, serials: &[Vec<u8>], number: u64) {
    let pem = ca
        .issue_crl(serials, number, Duration::from_secs(3600))
        .unwrap();
    std::fs::write(path, pem).unwrap();
}

/// The value of the series `line_prefix` (name and labels) on `rw`'s
/// metrics endpoint.
fn metric(rw: &Ringway, series: &str) -> Option<u64> {
    let (status, body) = rw.http_get("stats", "/metrics");
    assert!(status.contains("200"), "{status}");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn wait_metric(rw: &Ringway, series: &str, want: impl Fn(u64) -> bool) -> u64 {
    wait_for(series, PATIENCE, || match metric(rw, series) {
        Some(v) if want(v) => Ok(v),
        other => Err(format!("{other:?}")),
    })
}

/// Setup for [`Nodes::with_setup`]: a CA, a certificate to revoke, and a
/// CRL revoking it. Returns the flag and its value.
fn revoke_at_start(dir: &Path, spiffe_id: &str) -> Vec<String> {
    let ca = ca(dir);
    let (_, serial) = issue(&ca, dir, spiffe_id, "revoked");
    let crl = dir.join("crl.pem");
    write_crl(&ca, &crl, &[serial], 1);
    vec!["--crl-path".into(), crl.to_str().unwrap().into()]
}

/// The inbound rig: both ringways with a CRL revoking a client
/// certificate, an echo application behind node B. Returns the nodes, the
/// CA, the CRL file, the root to verify ringway B with, and the target.
fn inbound_rig(tag: &str) -> (Nodes, BuiltinCa, PathBuf, PathBuf, String) {
    let nodes = Nodes::with_setup(tag, &base_config(), true, &[], |dir| {
        revoke_at_start(dir, CLIENT_ID)
    });
    let ca = ca(nodes.dir.path());
    let crl = nodes.dir.path().join("crl.pem");
    let root = nodes.ca_dir().join("root-cert.pem");
    nodes
        .b
        .enter(|| serve_echo(TcpListener::bind(format!("{SERVER_IP}:8082")).unwrap()));
    (nodes, ca, crl, root, format!("{SERVER_IP}:8082"))
}

#[test]
fn revoked_clients_are_refused_inbound_and_the_crl_reloads() {
    let (nodes, ca, crl, root, target) = inbound_rig("crli");
    let client = |certs: &Path| py_client(&nodes.a, &client_args(certs, &root, &target));
    let b = nodes.b();
    let rejections = "istio_crl_policy_rejections_total{reporter=\"destination\"}";
    assert_eq!(metric(b, rejections), Some(0));
    assert_eq!(
        metric(b, "ringway_crl_reloads_total{result=\"ok\"}"),
        Some(1)
    );
    assert_eq!(metric(b, "ringway_crl_revoked_certificates"), Some(1));
    assert!(metric(b, "ringway_crl_last_reload_timestamp_seconds").unwrap() > 1_700_000_000);

    let good = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "good", "1h");
    let (code, out) = client(&good);
    assert_eq!(code, 0, "a certificate not on the CRL is accepted: {out}");
    assert_eq!(out["status"][0], 200, "{out}");

    let revoked = nodes.dir.path().join("revoked");
    let (code, out) = client(&revoked);
    assert_ne!(
        code, 0,
        "a revoked client certificate must be refused: {out}"
    );
    assert_ne!(out["status"][0], 200, "{out}");
    wait_metric(b, rejections, |v| v >= 1);
    b.wait_log("the revoked handshake", |l| {
        l["scope"] == "access"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("TLS handshake") && e.contains("Revoked"))
    });

    // A new revocation, written over the file: applies without a restart.
    write_crl(&ca, &crl, &[serial_in(&revoked), serial_in(&good)], 2);
    wait_metric(b, "ringway_crl_reloads_total{result=\"ok\"}", |v| v == 2);
    assert_eq!(metric(b, "ringway_crl_revoked_certificates"), Some(2));
    let (code, out) = client(&good);
    assert_ne!(code, 0, "revoked by the reloaded CRL: {out}");
    let fresh = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "fresh", "1h");
    let (code, out) = client(&fresh);
    assert_eq!(code, 0, "{out}");

    // Garbage over the good file: a warning, and the good CRLs stay.
    std::fs::write(&crl, "this is not a CRL\n").unwrap();
    b.wait_log("the refused reload", |l| {
        l["level"] == "warn"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("keeping the last good CRLs"))
    });
    wait_metric(b, "ringway_crl_reloads_total{result=\"error\"}", |v| v >= 1);
    assert_eq!(
        metric(b, "ringway_crl_reloads_total{result=\"ok\"}"),
        Some(2)
    );
    assert_eq!(metric(b, "ringway_crl_revoked_certificates"), Some(2));
    let (code, out) = client(&good);
    assert_ne!(code, 0, "still revoked after a bad reload: {out}");
    let (code, out) = client(&fresh);
    assert_eq!(code, 0, "{out}");
    // A missing file, the same.
    std::fs::remove_file(&crl).unwrap();
    wait_metric(b, "ringway_crl_reloads_total{result=\"error\"}", |v| v >= 2);
    let (code, out) = client(&revoked);
    assert_ne!(code, 0, "still revoked without the file: {out}");
    assert!(metric(b, rejections).unwrap() >= 3);
}

/// Echoes one message through node A's ringway to the Python HBONE server
/// on node B.
fn echo_through_a(nodes: &Nodes) -> std::io::Result<String> {
    in_netns(&nodes.a.name, || {
        let mut c = connect_from_client(&format!("{SERVER_IP}:9443"))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        c.write_all(b"through the tunnel")?;
        c.shutdown(Shutdown::Write)?;
        let mut got = String::new();
        c.read_to_string(&mut got)?;
        Ok(got)
    })
}

#[test]
fn revoked_servers_are_refused_outbound() {
    let nodes = Nodes::with_setup("crlo", &base_config(), false, &[], |dir| {
        revoke_at_start(dir, SERVER_ID)
    });
    let ca = ca(nodes.dir.path());
    let crl = nodes.dir.path().join("crl.pem");
    let a = nodes.a();
    let rejections = "istio_crl_policy_rejections_total{reporter=\"source\"}";
    let log = nodes.dir.path().join("pyserver.jsonl");

    let revoked = nodes.dir.path().join("revoked");
    let mut server = py_server(&nodes, &revoked, &log);
    let result = echo_through_a(&nodes);
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        !matches!(&result, Ok(s) if !s.is_empty()),
        "a revoked server must not get the bytes: {result:?}"
    );
    wait_metric(a, rejections, |v| v >= 1);
    a.wait_log("the revoked handshake", |l| {
        l["scope"] == "access" && l["error"].as_str().is_some_and(|e| e.contains("Revoked"))
    });

    let good = nodes.issue(&nodes.ca_dir(), SERVER_ID, "good", "1h");
    let mut server = py_server(&nodes, &good, &log);
    let result = echo_through_a(&nodes);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(result.unwrap(), "through the tunnel");

    // Revoke the good server too, in a new file moved over the old one
    // (how a mounted ConfigMap changes). A new server process: the pooled
    // connection died with the old one, so this is a new handshake.
    let tmp = nodes.dir.path().join("crl.pem.new");
    write_crl(&ca, &tmp, &[serial_in(&revoked), serial_in(&good)], 2);
    std::fs::rename(&tmp, &crl).unwrap();
    wait_metric(a, "ringway_crl_reloads_total{result=\"ok\"}", |v| v == 2);
    let before = metric(a, rejections).unwrap();
    let mut server = py_server(&nodes, &good, &log);
    let result = echo_through_a(&nodes);
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        !matches!(&result, Ok(s) if !s.is_empty()),
        "revoked by the reloaded CRL: {result:?}"
    );
    wait_metric(a, rejections, |v| v > before);
}

/// A CRL file that does not load stops startup, naming the file (fail
/// closed): no root needed, it fails before anything is bound.
#[test]
fn a_bad_crl_at_startup_is_a_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca(dir.path());
    let other = BuiltinCa::load_or_create(&dir.path().join("other"), TD).unwrap();
    let bad_signature = dir.path().join("forged.pem");
    write_crl(&other, &bad_signature, &[vec![1]], 1);
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "garbage").unwrap();
    let missing = dir.path().join("missing.pem");
    drop(ca);
    for (file, why) in [
        (&bad_signature, "does not verify with the issuer's key"),
        (&garbage, "unparsable"),
        (&missing, "No such file"),
    ] {
        let out = Command::new(common::ringway_bin())
            .arg("--ca-dir")
            .arg(dir.path().join("ca"))
            .arg("--crl-path")
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{file:?} must stop startup");
        let text = format!("{stderr}{stdout}");
        assert!(
            text.contains("CRL_PATH: cannot load") && text.contains(why),
            "{file:?}: {text}"
        );
    }
}

/// The sum of every series of `name` whose labels start with `labels` on
/// `rw`'s metrics endpoint.
fn metric_sum(rw: &Ringway, prefix: &str) -> u64 {
    let (status, body) = rw.http_get("stats", "/metrics");
    assert!(status.contains("200"), "{status}");
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A reloaded CRL closes the open inbound HBONE connections of the client
/// certificates it revokes (the connection and its stream, each logged
/// with why) within a few seconds, and only those: another client of the
/// same identity keeps its tunnel and its bytes flowing.
#[test]
fn a_reloaded_crl_closes_open_inbound_connections_of_revoked_clients() {
    let (nodes, ca, crl, root, target) = inbound_rig("crlci");
    let b = nodes.b();
    let closed = "ringway_crl_closed_connections_total{direction=\"inbound\"}";
    assert_eq!(metric(b, closed), Some(0));
    let doomed = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "doomed", "1h");
    let spared = nodes.issue(&nodes.ca_dir(), CLIENT_ID, "spared", "1h");
    // Half the bytes at once, the other half 15 s later: a tunnel that
    // stays open and carries bytes on both sides of the reload.
    let holding = |certs: &Path| {
        let mut args = client_args(certs, &root, &target);
        for a in ["--send-bytes", "200000", "--echo", "--hold", "15"] {
            args.push(a.into());
        }
        args
    };
    std::thread::scope(|s| {
        let doomed_run = s.spawn(|| py_client(&nodes.a, &holding(&doomed)));
        let spared_run = s.spawn(|| py_client(&nodes.a, &holding(&spared)));
        let opened = "istio_tcp_connections_opened_total{reporter=\"destination\"";
        wait_for("both tunnels open", PATIENCE, || {
            match metric_sum(b, opened) {
                n if n >= 2 => Ok(n),
                n => Err(format!("{n} opened")),
            }
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(!doomed_run.is_finished() && !spared_run.is_finished());

        write_crl(
            &ca,
            &crl,
            &[
                serial_in(&nodes.dir.path().join("revoked")),
                serial_in(&doomed),
            ],
            2,
        );
        wait_for(
            "the revoked client's tunnel closed",
            Duration::from_secs(5),
            || {
                if doomed_run.is_finished() {
                    Ok(())
                } else {
                    Err("still open")
                }
            },
        );
        let (code, out) = doomed_run.join().unwrap();
        assert_ne!(code, 0, "the revoked client's tunnel must be cut: {out}");
        assert_eq!(out["status"][0], 200, "{out}");
        assert!(
            out["received"][0].as_u64().unwrap() >= 100_000,
            "it carried bytes before: {out}"
        );
        assert!(!spared_run.is_finished(), "the other client stays open");
        let (code, out) = spared_run.join().unwrap();
        assert_eq!(code, 0, "the spared tunnel carried all its bytes: {out}");
        assert_eq!(out["received"][0], 200_000, "{out}");
    });
    assert_eq!(metric(b, closed), Some(1));
    let stream = b.wait_log("the revoked stream", |l| {
        l["scope"] == "access" && l["error"] == "closed: peer certificate revoked by a reloaded CRL"
    });
    assert_eq!(stream["src.identity"], CLIENT_ID);
    b.wait_log("the revoked connection", |l| {
        l["scope"] == "access"
            && l["error"].as_str().is_some_and(|e| {
                e.starts_with("peer certificate revoked by a reloaded CRL: closed with 1 open")
            })
    });
    b.wait_log("the core's summary", |l| {
        l["inbound"] == 1
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("a reloaded CRL revokes peers"))
    });
}

/// A reloaded CRL that revokes the server of a pooled outbound HBONE
/// connection closes it, and the tunnel it carries, within a few seconds;
/// a reload that revokes someone else leaves it carrying bytes.
#[test]
fn a_reloaded_crl_closes_pooled_connections_to_revoked_servers() {
    let nodes = Nodes::with_setup("crlco", &base_config(), false, &[], |dir| {
        revoke_at_start(dir, SERVER_ID)
    });
    let ca = ca(nodes.dir.path());
    let crl = nodes.dir.path().join("crl.pem");
    let a = nodes.a();
    let closed = "ringway_crl_closed_connections_total{direction=\"outbound\"}";
    let log = nodes.dir.path().join("pyserver.jsonl");
    let revoked = serial_in(&nodes.dir.path().join("revoked"));
    let good = nodes.issue(&nodes.ca_dir(), SERVER_ID, "good", "1h");
    let mut server = py_server(&nodes, &good, &log);

    let mut tunnel = in_netns(&nodes.a.name, || {
        connect_from_client(&format!("{SERVER_IP}:9443")).unwrap()
    });
    tunnel
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let echo = |t: &mut std::net::TcpStream, msg: &[u8]| {
        t.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        t.read_exact(&mut got).unwrap();
        assert_eq!(got, msg);
    };
    echo(&mut tunnel, b"before");

    // Someone else revoked: the connection stays and carries bytes.
    let other = issue(&ca, nodes.dir.path(), SERVER_ID, "other").1;
    write_crl(&ca, &crl, &[revoked.clone(), other.clone()], 2);
    wait_metric(a, "ringway_crl_reloads_total{result=\"ok\"}", |v| v == 2);
    echo(&mut tunnel, b"after a reload");
    assert_eq!(metric(a, closed), Some(0));

    // The server revoked: the pooled connection and the tunnel are closed.
    write_crl(&ca, &crl, &[revoked, other, serial_in(&good)], 3);
    tunnel
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = tunnel.read(&mut [0u8; 16]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        matches!(&r, Ok(0))
            || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the tunnel to the revoked server must be closed: {r:?}"
    );
    assert_eq!(metric(a, closed), Some(1));
    a.wait_log("the closed pooled connection", |l| {
        l["message"] == "HBONE connection closed"
            && l["why"] == "peer certificate revoked by a reloaded CRL"
    });
}
