//! `ringway-perf suite` end to end on the two-node rig, with tiny sizes:
//! two namespaces, ringway pairs for a two-value `--cores` sweep, and a
//! peer column started with `--peer-cmd` (ringway's own SOCKS5 front door
//! when the binary has it, else the built-in SOCKS5 relay). Checks the
//! results folder, not the numbers' size.
//!
//! Needs root (network namespaces, nftables) and a built ringway
//! (target/{debug,release}/ringway, or RINGWAY_BIN). Fails, never skips,
//! when either is missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::{require_root, ringway_bin, run_suite, tiny_run, variant_keys};

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.trim_start().starts_with("<svg"), "{}", path.display());
    assert!(text.trim_end().ends_with("</svg>"), "{}", path.display());
}

#[test]
fn quick_suite_on_the_two_node_rig() {
    require_root();
    let ringway = ringway_bin();
    let perf = env!("CARGO_BIN_EXE_ringway-perf");
    let help = Command::new(&ringway).arg("--help").output().unwrap();
    let has_socks = String::from_utf8_lossy(&help.stdout).contains("--socks5-addr");
    let peer_cmd = if has_socks {
        let side = ringway_perf::rig::side_listener_args(&ringway).unwrap();
        format!(
            "{} --config {{config}} --ca-dir {{ca_dir}} --node-name node-a --socks5-addr 127.0.0.1:15080 \
             --outbound-addr 127.0.0.1:0 --inbound-addr 127.0.0.1:0 --inbound-passthrough-addr 127.0.0.1:0 {}",
            ringway.display(),
            side.join(" ")
        )
    } else {
        eprintln!(
            "NOTE: {} has no --socks5-addr; the peer column uses `ringway-perf socks-relay`",
            ringway.display()
        );
        format!("{perf} socks-relay --listen 127.0.0.1:15080")
    };
    let out = tempfile::tempdir().unwrap();
    let (stderr, json) = run_suite(
        &ringway,
        out.path(),
        &[
            &tiny_run("1,2")[..],
            &[
                "--cores",
                "1",
                "--cores",
                "2",
                "--peer-socks",
                "127.0.0.1:15080",
                "--peer-name",
                "the peer",
                "--peer-cmd",
                &peer_cmd,
            ],
        ]
        .concat(),
    );
    assert_eq!(
        variant_keys(&json),
        [
            "direct",
            "passthrough@1",
            "hbone@1",
            "passthrough@2",
            "hbone@2",
            "peer"
        ]
    );
    let metric = |id: &str| common::metric(&json, id);
    for id in [
        "throughput.1.up.gbps",
        "throughput.2.up.gbps",
        "rr.rps",
        "rr.p99",
        "rr-conc.1.rps",
        "rr-conc.8.rps",
        "rr-conc.8.p99",
        "connect.cps",
    ] {
        for v in metric(id)["values"].as_array().unwrap() {
            let m = v["median"]
                .as_f64()
                .unwrap_or_else(|| panic!("{id} {}: no median", v["variant"]));
            assert!(m.is_finite() && m > 0.0, "{id} {}: {m}", v["variant"]);
            if v["variant"] == "direct" {
                assert_eq!(v["ratio_vs_direct"].as_f64(), Some(1.0));
            } else {
                assert!(v["ratio_vs_direct"].as_f64().unwrap() > 0.0);
            }
        }
    }
    // Proxy-only metrics and the kernel counts: every proxy column, never
    // direct.
    for id in [
        "idle.kib_per_conn",
        "rr.cpu_per_1k",
        "rr-conc.8.cpu_ms_per_1k",
        "throughput.1.up.cpu_per_gib",
        "rr-kernel.cs_per_1k",
        "rr-kernel.cpu_ms_per_1k",
    ] {
        for v in metric(id)["values"].as_array().unwrap() {
            assert_eq!(
                v["variant"] == "direct",
                v["median"].is_null(),
                "{id} {}",
                v["variant"]
            );
        }
    }
    // Raw samples: one run per scenario per applicable variant (idle and
    // rr-kernel only through proxies; rr-conc once per connection count).
    assert_eq!(json["runs"].as_array().unwrap().len(), 6 * 6 + 5 + 5);
    assert_eq!(json["failed_runs"], 0);
    assert!(json["machine"]["nproc"].as_u64().unwrap() >= 1);
    let scaling = json["scaling"].as_array().unwrap();
    assert!(scaling
        .iter()
        .any(|r| r["mode"] == "hbone" && r["id"] == "throughput.2.up.gbps"));
    assert!(scaling
        .iter()
        .any(|r| r["mode"] == "hbone" && r["id"] == "connect.cps"));

    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(
        md.contains("| scenario | metric | direct | ringway passthrough (cores 1) |"),
        "{md}"
    );
    assert!(md.contains("the peer"));
    assert!(md.contains("## Core scaling"));
    assert!(md.contains("## Load generator under rr-conc"), "{md}");
    for svg in [
        "throughput.svg",
        "rr-conc.svg",
        "rr-latency.svg",
        "connect-latency.svg",
    ] {
        assert_svg(&out.path().join(svg));
    }
    // One progress line per measurement.
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("] round 1/1 "))
            .count(),
        46,
        "{stderr}"
    );
}
