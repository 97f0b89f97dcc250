//! scripts/capture-netns.sh, the pod capture rules the demo and the rig
//! install: idempotent, removable, and a clear error without root.

mod common;

use std::process::Command;

use common::NetNs;

/// The `ringway` nftables table of namespace `name` ("" when none).
fn table(name: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns", "exec", name, "nft", "list", "table", "inet", "ringway",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn capture_rules_install_once_however_often_run_and_go_away() {
    let ns = NetNs::new("cap");
    let rig = ringway_rig::Netns::new("rwt-capx").unwrap();
    // Installed twice: the same rules, once.
    for _ in 0..2 {
        let st = Command::new(ringway_rig::script("capture-netns.sh"))
            .args([&ns.name, "8080, 9000-9100"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let rules = table(&ns.name);
    assert_eq!(rules.matches("redirect to :15001").count(), 1, "{rules}");
    assert_eq!(rules.matches("redirect to :15006").count(), 1, "{rules}");
    assert!(rules.contains("tcp dport 15008 return"), "{rules}");
    assert!(
        rules.contains("0x00000539"),
        "ringway's own sockets skip: {rules}"
    );
    // The shared rig installs the same rules.
    rig.capture("").unwrap();
    assert!(table(&rig.name).contains("redirect to :15001"));
    // Removed, and removing again is quiet.
    for _ in 0..2 {
        let st = Command::new(ringway_rig::script("capture-netns.sh"))
            .args([&ns.name, "--remove"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    assert!(table(&ns.name).is_empty());
}

#[test]
fn without_root_the_script_says_so() {
    common::require_root();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(ringway_rig::script("capture-netns.sh"))
        .arg("some-ns")
        .output()
        .expect("setpriv (util-linux)");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs root"), "{err}");
    // And a namespace that does not exist is named.
    let out = Command::new(ringway_rig::script("capture-netns.sh"))
        .arg("rwt-no-such-ns")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no network namespace named rwt-no-such-ns")
    );
}
