//! `ringway-perf suite --peer ztunnel` end to end with the real Istio
//! ztunnel, tiny sizes: ztunnel's own node pair, both of its columns
//! (passthrough, and HBONE through two ztunnels), the shared fake-CA root,
//! the ringway ÷ ztunnel table and the kernel counts. Checks that every
//! column moved bytes and every section was written, not the numbers'
//! size.
//!
//! Needs root, a built ringway (as suite_rig.rs) and the ztunnel binary:
//! `RINGWAY_ZTUNNEL=<path>`, else `../shared/peers/ztunnel/ztunnel` beside
//! the repository. `RINGWAY_ZTUNNEL=absent` skips it, loudly; a missing
//! binary otherwise fails it.

mod common;

use std::io::Write;
use std::path::Path;

use common::{require_root, ringway_bin, run_suite, tiny_run, variant_keys};

/// The ztunnel binary, or None when RINGWAY_ZTUNNEL=absent.
fn ztunnel() -> Option<std::path::PathBuf> {
    if std::env::var_os("RINGWAY_ZTUNNEL").is_some_and(|v| v == "absent") {
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!!!!! ztunnel peer absent: ztunnel_rig NOT RUN (RINGWAY_ZTUNNEL=absent) !!!!!!!!\n"
        );
        return None;
    }
    let path = ringway_perf::ztunnel::locate(None)
        .unwrap_or_else(|e| panic!("{e:#} (or RINGWAY_ZTUNNEL=absent to skip this test loudly)"));
    Some(path)
}

fn count(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .matches(needle)
        .count()
}

#[test]
fn suite_with_ztunnel_as_the_peer() {
    require_root();
    let Some(zt) = ztunnel() else {
        return;
    };
    let ringway = ringway_bin();
    let out = tempfile::tempdir().unwrap();
    let peer = format!("ztunnel={}", zt.display());
    let (_stderr, json) = run_suite(
        &ringway,
        out.path(),
        &[&["--peer", &peer][..], &tiny_run("1")].concat(),
    );
    assert_eq!(
        variant_keys(&json),
        [
            "direct",
            "passthrough",
            "hbone",
            "ztunnel-passthrough",
            "ztunnel-hbone"
        ]
    );
    assert_eq!(json["failed_runs"], 0, "{:#}", json["notes"]);
    let metric = |id: &str| -> Vec<(String, Option<f64>)> {
        common::metric(&json, id)["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["variant"].as_str().unwrap().to_string(),
                    v["median"].as_f64(),
                )
            })
            .collect()
    };
    for id in [
        "throughput.1.up.gbps",
        "rr.rps",
        "rr-conc.1.rps",
        "rr-conc.8.rps",
        "connect.cps",
    ] {
        for (v, m) in metric(id) {
            assert!(m.is_some_and(|m| m > 0.0), "{id} {v}: {m:?}");
        }
    }
    // Proxy-only rows, for both proxies.
    for id in [
        "idle.kib_per_conn",
        "rr.cpu_per_1k",
        "rr-conc.8.cpu_ms_per_1k",
        "rr-kernel.cs_per_1k",
        "rr-kernel.cpu_ms_per_1k",
    ] {
        for (v, m) in metric(id) {
            assert_eq!(v == "direct", m.is_none(), "{id} {v}");
        }
    }
    // Both ztunnel columns are compared with ringway's column of their path.
    let ratios = json["vs_peers"].as_array().unwrap();
    for (rw, zt) in [
        ("passthrough", "ztunnel-passthrough"),
        ("hbone", "ztunnel-hbone"),
    ] {
        for id in ["rr.rps", "rr-conc.8.rps", "rr-conc.8.cpu_ms_per_1k"] {
            let r = ratios
                .iter()
                .find(|r| r["id"] == id && r["peer"] == zt)
                .unwrap_or_else(|| panic!("no {id} ratio for {zt}"));
            assert_eq!(r["ringway"], rw);
            assert!(r["ratio"].as_f64().unwrap() > 0.0, "{id} {zt}");
        }
    }
    // System calls, when perf is here (the counts are then exact enough
    // that every proxy reads and writes at least once per request).
    let has_perf = std::process::Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_perf {
        for (v, m) in metric("rr-kernel.syscalls_per_1k") {
            if v != "direct" {
                assert!(m.is_some_and(|m| m >= 1000.0), "syscalls/1k {v}: {m:?}");
            }
        }
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "NOTE: no perf on PATH: system calls were not counted"
        );
    }

    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    for section in ["## ringway ÷ ztunnel", "## Kernel work per request"] {
        assert!(md.contains(section), "{section}:\n{md}");
    }
    assert!(md.contains("| ringway ÷ ztunnel |"), "{md}");
    // rr-conc rows in the ringway ÷ ztunnel table, one set per level.
    let vs = &md[md.find("## ringway ÷ ztunnel").unwrap()..];
    for level in ["1 B × 1 conn", "1 B × 8 conn"] {
        assert!(
            vs.contains(&format!("| rr-conc {level}, ")),
            "{level}:\n{md}"
        );
    }
    // Started once, restarted for each idle measurement (A for both
    // columns, B for HBONE), and every start applied the config.
    let logs = out.path().join("logs");
    assert_eq!(
        count(&logs.join("ztunnel-a.log"), "local config initialized"),
        3
    );
    assert_eq!(
        count(&logs.join("ztunnel-b.log"), "local config initialized"),
        2
    );
    assert_eq!(
        json["settings"]["ztunnel"]["path"],
        zt.display().to_string()
    );
}
