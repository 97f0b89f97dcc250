//! The admin endpoint (15000): /config_dump lists what was loaded in
//! ztunnel's shape, /logging changes the filter at runtime, /cores shows
//! each core, /quitquitquit drains, and it stays on loopback unless told.

mod common;

use std::process::Command;
use std::time::Duration;

use common::nodes::{base_config, Nodes, CLIENT_ID};

/// A POST (the helper only GETs): (status line, body).
fn post(rw: &common::Ringway, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let addr = rw.listeners["listeners"]["admin"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let request = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n");
    let text = common::in_netns(rw.netns.as_ref().unwrap(), move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    });
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[test]
fn config_dump_lists_what_was_loaded_and_the_certificates() {
    let nodes = Nodes::new("adm", false, &[]);
    let rw = nodes.a();
    let (status, body) = rw.http_get("admin", "/config_dump");
    assert!(status.contains("200"), "{status}");
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The same config, loaded independently and written in the schema.
    let loaded =
        ringway_controlplane::sources::local::load_snapshot(&base_config(), "mesh.yaml").unwrap();
    let expected = ringway_controlplane::sources::local::dump::dump(&loaded);
    for key in ["workloads", "services", "policies"] {
        assert_eq!(dump[key], expected[key], "{key}");
        assert_eq!(
            dump["staticConfig"][key], expected[key],
            "staticConfig.{key}"
        );
    }
    assert_eq!(
        dump["workloads"][0]["uid"],
        "cluster1//v1/Pod/client-ns/client"
    );
    // The local HBONE workload's certificate (this node: node-a).
    let certs = dump["certificates"].as_array().unwrap();
    assert_eq!(certs.len(), 1, "{certs:?}");
    assert_eq!(certs[0]["identity"], CLIENT_ID);
    common::wait_for("the certificate to be available", common::PATIENCE, || {
        let (_, body) = rw.http_get("admin", "/config_dump");
        let d: serde_json::Value = serde_json::from_str(&body).unwrap();
        match &d["certificates"][0]["state"] {
            s if s == "Available" => Ok(()),
            s => Err(s.clone()),
        }
    });
    assert_eq!(dump["config"]["localNode"], "node-a");
    assert!(dump["version"]["snapshotVersion"].as_u64().unwrap() > 0);

    // The per-core view.
    let (_, cores) = rw.http_get("admin", "/cores");
    let cores: serde_json::Value = serde_json::from_str(&cores).unwrap();
    assert!(!cores["cores"].as_array().unwrap().is_empty(), "{cores}");
    assert!(cores["cores"][0]["openConnections"].is_u64(), "{cores}");
    // The core's own loops (accepting, following the config, reaping) are
    // tasks too; the gauges are copied once a second.
    let cores = common::wait_for("the first copy of the task gauge", common::PATIENCE, || {
        let (_, cores) = rw.http_get("admin", "/cores");
        let cores: serde_json::Value = serde_json::from_str(&cores).unwrap();
        if cores["cores"][0]["tasks"].as_u64().unwrap() >= 3 {
            Ok(cores)
        } else {
            Err(cores)
        }
    });
    assert!(cores["cores"][0]["pipesHeld"].is_u64(), "{cores}");
}

#[test]
fn logging_changes_the_filter_and_quitquitquit_drains() {
    let nodes = Nodes::new("adl", false, &[]);
    let rw = nodes.a();
    let (status, body) = rw.http_get("admin", "/logging");
    assert!(
        status.contains("200") && body.contains("info"),
        "{status} {body}"
    );
    let (status, body) = post(rw, "/logging?level=access%3Dwarn%2Cdebug");
    assert!(status.contains("200"), "{status} {body}");
    assert!(
        body.contains("access=warn") && body.contains("debug"),
        "{body}"
    );
    let (status, _) = post(rw, "/logging?level=access%3Dnonsense");
    assert!(status.contains("400"), "{status}");
    assert!(rw.http_get("admin", "/logging").1.contains("access=warn"));
    assert!(post(rw, "/config_dump").0.contains("405"));
    assert!(rw.http_get("admin", "/quitquitquit").0.contains("405"));

    let (status, _) = post(rw, "/quitquitquit");
    assert!(status.contains("200"), "{status}");
    let mut nodes = nodes;
    let exit = nodes
        .rw_a
        .as_mut()
        .unwrap()
        .wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "{exit:?}");
    let logs = nodes.a().logs();
    assert!(
        logs.iter().any(|l| l["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("/quitquitquit: no longer accepting"))),
        "{logs:#?}"
    );
}

#[test]
fn the_admin_endpoint_stays_on_loopback_unless_told() {
    let out = Command::new(common::ringway_bin())
        .args(["--admin-addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--admin-addr 0.0.0.0:0 is not a loopback address"),
        "{err}"
    );
}
