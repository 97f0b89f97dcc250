//! The LOCAL_XDS loader: the bytes as a config file's text through
//! `load_snapshot`'s steps. Asserted: a refusal names the file; the loader's
//! fast path (block lists parsed a batch at a time) reads the same items
//! as the whole-document parse whenever it reads any; every item loaded
//! survives model → xDS → model unchanged (what `ringway-devcp` serves),
//! but for a workload without a name (see [`config`]);
//! the admin `config_dump` renders.

use crate::sources::local::dump::dump;
use crate::sources::local::{self, EXAMPLE_CONFIG};
use crate::sources::xds::convert;

const ORIGIN: &str = "fuzz.yaml";

/// `data` as the text of a local config file.
pub fn config(data: &[u8]) {
    // The file source reads text; other bytes never reach the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `load_snapshot`, with the fast path held against the whole parse.
    let parsed = match local::parse_in_batches(text, ORIGIN) {
        Some(batched) => {
            let whole =
                local::parse_whole(text, ORIGIN).expect("what batches read, the whole reads");
            assert!(batched == whole, "batched and whole-document parses differ");
            Ok(batched)
        }
        None => local::parse_whole(text, ORIGIN),
    };
    let snapshot = match parsed.and_then(|p| local::snapshot_of(p, ORIGIN)) {
        Ok(s) => s,
        Err(e) => {
            assert!(e.to_string().starts_with(ORIGIN), "{e}");
            return;
        }
    };
    for w in snapshot.workloads() {
        let back = convert::workload_from_proto(convert::workload_to_proto(w));
        // The one known difference between the sources (found by this
        // target, left for a decision): a file may leave a workload's
        // `name` out, as ztunnel's local schema allows, while over xDS
        // (istiod always names workloads) the converter refuses it.
        if w.name.is_empty() {
            assert!(back.is_err(), "a nameless workload over xDS");
            continue;
        }
        assert_eq!(
            back.expect("a loaded workload converts"),
            **w,
            "workload model → xDS → model"
        );
    }
    for s in snapshot.services() {
        let back = convert::service_from_proto(convert::service_to_proto(s))
            .expect("a loaded service converts");
        assert_eq!(back, **s, "service model → xDS → model");
    }
    for p in snapshot.policies() {
        let back = convert::policy_from_proto(convert::policy_to_proto(p))
            .expect("a loaded policy converts");
        assert_eq!(back, **p, "policy model → xDS → model");
    }
    assert!(!dump(&snapshot).to_string().is_empty());
}

/// Seeds: the embedded example config, the mesh the xDS seeds come from,
/// the same items in flow style (the whole-document path), and a few
/// refused ones (a duplicate uid, a bad address, an unknown field).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mesh = super::xds::SEED_MESH;
    let flow = "workloads: [{uid: a, name: a, namespace: ns1, workloadIps: [10.0.0.1], \
                services: {\"ns1/s.ns1.svc\": {80: 8080}}}]\n\
                services: [{name: s, namespace: ns1, hostname: s.ns1.svc, vips: [10.96.0.1], ports: {80: 8080}}]\n\
                policies: [{name: p, namespace: ns1, scope: Namespace, action: Deny, \
                rules: [[[{sourceIps: [10.0.0.0/8], notDestinationPorts: [80]}]]]}]\n";
    let duplicate =
        "workloads:\n- {uid: a, name: a, namespace: n}\n- {uid: a, name: b, namespace: n}\n";
    let bad_ip = "workloads:\n- uid: a\n  name: a\n  namespace: n\n  workloadIps: [10.0.0.300]\n";
    let unknown = "services:\n- {name: s, namespace: n, hostname: h, ipFamily: IPv4}\n";
    [
        ("example", EXAMPLE_CONFIG),
        ("mesh", mesh),
        ("flow", flow),
        ("duplicate-uid", duplicate),
        ("bad-ip", bad_ip),
        ("unknown-field", unknown),
    ]
    .into_iter()
    .map(|(name, text)| (format!("seed-{name}"), text.as_bytes().to_vec()))
    .collect()
}
