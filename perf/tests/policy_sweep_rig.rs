//! `ringway-perf suite --policies` end to end on the two-node rig, with
//! tiny sizes: one HBONE column per policy count, each ringway B loads its
//! policies (it logs how many), the counts move to other pairs between
//! rounds, the client's connections all get through, and results carry the
//! policy-cost table. Checks the plumbing, not the
//! numbers' size.
//!
//! Needs root and a built ringway, like `suite_rig`.

mod common;

use common::{require_root, ringway_bin, run_suite, variant_keys};

#[test]
fn policy_sweep_on_the_two_node_rig() {
    require_root();
    let ringway = ringway_bin();
    let out = tempfile::tempdir().unwrap();
    let (_, json) = run_suite(
        &ringway,
        out.path(),
        &[
            "--scenarios",
            "connect",
            "--rounds",
            "2",
            "--connect-duration",
            "300ms",
            "--no-calibrate",
            "--policies",
            "1000,0",
            "--policies",
            "10",
            "--proxy-log-level",
            "info",
        ],
    );
    // Ascending counts; one passthrough column (no policies apply to it).
    assert_eq!(
        variant_keys(&json),
        [
            "direct",
            "passthrough",
            "hbone/p0",
            "hbone/p10",
            "hbone/p1000"
        ]
    );
    assert_eq!(json["failed_runs"], 0);
    for r in json["runs"].as_array().unwrap() {
        assert_eq!(r["result"]["errors"], 0, "{r}");
    }
    let cps = json["policy_cost"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "connect.cps")
        .expect("a connect.cps row");
    let points = cps["points"].as_array().unwrap();
    let counts: Vec<u64> = points
        .iter()
        .map(|p| p["policies"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [0, 10, 1000]);
    assert_eq!(points[0]["vs_first"].as_f64(), Some(1.0));
    assert!(points[2]["vs_first"].as_f64().unwrap() > 0.0);

    // Each ringway B loaded its count: pair i starts with the i-th count
    // (ascending), and round 2 moves every count one pair along (pair i
    // restarts with count i − 1).
    let counts = [0, 10, 1000];
    for i in 0..3 {
        let log =
            std::fs::read_to_string(out.path().join(format!("logs/ringway-b{i}.log"))).unwrap();
        let loaded: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("config loaded"))
            .collect();
        let expect = [counts[i], counts[(i + 2) % 3]];
        assert_eq!(loaded.len(), 2, "ringway-b{i}: {loaded:?}\n{log}");
        for (line, n) in loaded.iter().zip(expect) {
            assert!(
                line.contains(&format!("\"policies\":{n}")),
                "ringway-b{i}: {line}"
            );
        }
    }
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(
        md.contains("## Authorization policies on the destination"),
        "{md}"
    );
    assert!(
        md.contains("| scenario | metric | 0 policies | 10 policies | 1000 policies |"),
        "{md}"
    );
}
