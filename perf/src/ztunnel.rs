//! Istio's ztunnel as the suite's reference proxy (`--peer ztunnel`): where
//! the binary is, the CA both proxies trust, and a ztunnel process run
//! standalone (no Kubernetes, no istiod) in a network namespace of its own.
//!
//! ztunnel runs in *dedicated* mode (it speaks for one workload, named by
//! `PROXY_WORKLOAD_INFO`) on the rig's LOCAL_XDS file, with its test-only
//! fake CA (`FAKE_CA=true`), which signs with the `root-cert.pem` and
//! `ca-key.pem` that ship beside the binary. The rig's ringways get an
//! Istio cacerts folder made from that root ([`write_shared_ca`]), so every
//! proxy in the rig chains to one root.
//!
//! ztunnel binds fixed ports ([`FIXED_PORTS`]), hence a namespace per
//! instance. It marks its own upstream sockets with [`MARK`]
//! (`PACKET_MARK`), so a capture rule can skip them as it skips ringway's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::supervise::{Ready, Spec};

/// Every port ztunnel binds: admin 15000 (localhost), outbound 15001,
/// inbound plaintext 15006, HBONE 15008, stats 15020, readiness 15021,
/// DNS 15053 (localhost), SOCKS5 15080 (when enabled).
pub const FIXED_PORTS: [u16; 8] = [15000, 15001, 15006, 15008, 15020, 15021, 15053, 15080];
/// ztunnel's outbound (capture) listener.
pub const OUTBOUND_PORT: u16 = 15001;
/// The mark on ztunnel's own sockets (`PACKET_MARK`), the same as ringway's.
pub const MARK: u32 = 0x539;

/// The ztunnel binary: `explicit`, else `RINGWAY_ZTUNNEL`, else the
/// prebuilt peer beside the repository (`../shared/peers/ztunnel/ztunnel`).
pub fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let (path, from) = match (explicit, std::env::var_os("RINGWAY_ZTUNNEL")) {
        (Some(p), _) => (p.to_path_buf(), "--peer ztunnel=<path>"),
        (None, Some(v)) => (PathBuf::from(v), "RINGWAY_ZTUNNEL"),
        (None, None) => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/peers/ztunnel/ztunnel"),
            "the default path",
        ),
    };
    if !path.is_file() {
        bail!(
            "no ztunnel binary at {} ({from}): pass --peer ztunnel=<path> or set RINGWAY_ZTUNNEL \
             (the binary, with its fake CA's root-cert.pem and ca-key.pem beside it)",
            path.display()
        );
    }
    Ok(path.canonicalize()?)
}

/// `ztunnel version`, first line.
pub fn version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(|l| l.trim().to_string())
}

/// Makes `dir` an Istio cacerts folder whose CA is the root of ztunnel's
/// fake CA (`root-cert.pem` and `ca-key.pem` beside `bin`): `ca-cert.pem`,
/// `root-cert.pem` and `cert-chain.pem` are that root, `ca-key.pem` its key.
/// A ringway run with `--ca-dir dir` and a ztunnel with `FAKE_CA=true`
/// trust each other.
pub fn write_shared_ca(bin: &Path, dir: &Path) -> anyhow::Result<()> {
    let peer = bin.parent().context("ztunnel binary has no folder")?;
    let read = |name: &str| {
        let p = peer.join(name);
        std::fs::read(&p).with_context(|| {
            format!(
                "ztunnel's fake CA: cannot read {} (it must sit beside the binary)",
                p.display()
            )
        })
    };
    let (root, key) = (read("root-cert.pem")?, read("ca-key.pem")?);
    std::fs::create_dir_all(dir)?;
    for name in ["ca-cert.pem", "root-cert.pem", "cert-chain.pem"] {
        std::fs::write(dir.join(name), &root)?;
    }
    std::fs::write(dir.join("ca-key.pem"), key)?;
    Ok(())
}

/// The environment of a standalone ztunnel speaking for `workload`
/// (`namespace/name/service-account`) on the LOCAL_XDS file `config`.
/// `log_level` is its `RUST_LOG` base level; the two startup lines the rig
/// waits for are always logged.
pub fn env(config: &Path, workload: &str, log_level: &str) -> Vec<(&'static str, String)> {
    vec![
        ("FAKE_CA", "true".into()),
        // No istiod: the workloads come from the file.
        ("XDS_ADDRESS", String::new()),
        ("LOCAL_XDS_PATH", config.display().to_string()),
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", workload.into()),
        // No routing for spoofed sources in the rig.
        ("ENABLE_ORIG_SRC", "false".into()),
        // Its upstream sockets carry the mark the capture rule skips.
        ("PACKET_MARK", MARK.to_string()),
        (
            "RUST_LOG",
            format!("{log_level},ztunnel::readiness=info,ztunnel::xds=info"),
        ),
    ]
}

/// ztunnel logs "ready" before it has read the file: both lines mean the
/// config is applied and every listener is bound.
const CONFIG_LOADED: &str = "local config initialized";
const READY: &str = "marking server ready";

/// A standalone ztunnel (`bin proxy`) with `env`, its output in
/// `log_dir/<name>.log`, ready once it has applied its config and bound
/// its listeners (within 30 s unless [`Spec::timeout`] says otherwise).
pub fn spec(bin: &Path, name: &str, env: Vec<(&'static str, String)>, log_dir: &Path) -> Spec {
    let mut s = Spec::new(name, bin, vec!["proxy".into()], log_dir)
        .ready(Ready::Output(vec![CONFIG_LOADED, READY]));
    s.env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedicated_mode_on_the_local_file_with_marked_sockets() {
        let e = env(
            Path::new("/tmp/mesh.yaml"),
            "client-ns/client/client",
            "warn",
        );
        let get = |k: &str| e.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PROXY_MODE"), Some("dedicated"));
        assert_eq!(get("PROXY_WORKLOAD_INFO"), Some("client-ns/client/client"));
        assert_eq!(get("LOCAL_XDS_PATH"), Some("/tmp/mesh.yaml"));
        assert_eq!(get("XDS_ADDRESS"), Some(""));
        assert_eq!(get("FAKE_CA"), Some("true"));
        assert_eq!(get("PACKET_MARK"), Some("1337"));
        assert!(get("RUST_LOG").unwrap().starts_with("warn,"));
    }

    #[test]
    fn shared_ca_is_the_fake_root() {
        let dir = tempfile::tempdir().unwrap();
        let peer = dir.path().join("peer");
        std::fs::create_dir_all(&peer).unwrap();
        std::fs::write(peer.join("root-cert.pem"), "ROOT").unwrap();
        std::fs::write(peer.join("ca-key.pem"), "KEY").unwrap();
        let bin = peer.join("ztunnel");
        let ca = dir.path().join("ca");
        write_shared_ca(&bin, &ca).unwrap();
        for name in ["ca-cert.pem", "root-cert.pem", "cert-chain.pem"] {
            assert_eq!(std::fs::read_to_string(ca.join(name)).unwrap(), "ROOT");
        }
        assert_eq!(
            std::fs::read_to_string(ca.join("ca-key.pem")).unwrap(),
            "KEY"
        );
        let missing = write_shared_ca(&dir.path().join("ztunnel"), &ca).unwrap_err();
        assert!(
            format!("{missing:#}").contains("root-cert.pem"),
            "{missing:#}"
        );
    }
}
