//! The perf rigs' namespace plumbing (the shared `ringway-rig` crate,
//! which the integration tests use too) and the flags that let several
//! ringways share a namespace. The processes themselves: `supervise`.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

pub use ringway_rig::{check, in_netns, require_root, veth, Netns};

/// Runs one of the repository's `scripts/` (as an operator would) with
/// `args`; its stderr becomes the error.
pub fn script(name: &str, args: &[&str]) -> anyhow::Result<()> {
    check(
        Command::new("bash")
            .arg(ringway_rig::script(name))
            .args(args),
    )
}

/// Listener flags newer ringways have, with fixed default ports that would
/// collide when several ringways share a namespace.
const SIDE_LISTENERS: [&str; 4] = [
    "--readiness-addr",
    "--admin-addr",
    "--metrics-addr",
    "--stats-addr",
];

/// `--<flag> 127.0.0.1:0` for each side listener (readiness, admin, …)
/// that this ringway binary knows, so several ringways can share a
/// namespace.
pub fn side_listener_args(bin: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(bin)
        .arg("--help")
        .output()
        .with_context(|| format!("{} --help", bin.display()))?;
    let help = String::from_utf8_lossy(&out.stdout);
    let mut args = Vec::new();
    for flag in SIDE_LISTENERS {
        let known = help
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
            .any(|w| w == flag);
        if known {
            args.push(flag.to_string());
            args.push("127.0.0.1:0".to_string());
        }
    }
    Ok(args)
}

/// Any free port on loopback.
pub const ANY_PORT: &str = "127.0.0.1:0";

/// ringway's traffic listeners: outbound and inbound (HBONE) where given,
/// inbound passthrough on any free loopback port.
pub fn listener_args(outbound: &str, inbound: &str) -> Vec<String> {
    [
        "--outbound-addr",
        outbound,
        "--inbound-addr",
        inbound,
        "--inbound-passthrough-addr",
        ANY_PORT,
    ]
    .map(String::from)
    .to_vec()
}
