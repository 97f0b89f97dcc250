//! The real Istio ztunnel as a test peer: a prebuilt binary beside the
//! repository (`shared/peers/ztunnel/`, with the root of its test-only fake
//! CA), run standalone in a network namespace on a LOCAL_XDS file. It is a
//! tool the tests run, never a build dependency of ringway.
//!
//! Where it is: `RINGWAY_ZTUNNEL=<path>`; unset, the default path beside
//! the repository. `RINGWAY_ZTUNNEL=absent` says on purpose that there is
//! none: the tests that need it say loudly that they did not run. Unset
//! with nothing at the default path is a failure, never a silent pass.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The ztunnel binary, or `None` (after a loud line on stderr) when
/// `RINGWAY_ZTUNNEL=absent`. `test` names the caller in that line.
pub fn locate(test: &str) -> Option<PathBuf> {
    match std::env::var_os("RINGWAY_ZTUNNEL") {
        Some(v) if v == "absent" => {
            // Straight to the stderr handle: the test harness captures
            // eprintln! of a passing test, and this must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!! ztunnel peer absent: {test} NOT RUN (RINGWAY_ZTUNNEL=absent) !!!!!!!!\n"
            );
            None
        }
        Some(v) => {
            let p = PathBuf::from(v);
            assert!(
                p.is_file(),
                "RINGWAY_ZTUNNEL={} is not a file (set it to the ztunnel binary, or to `absent` to skip {test} loudly)",
                p.display()
            );
            Some(p)
        }
        None => {
            let p =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/peers/ztunnel/ztunnel");
            assert!(
                p.is_file(),
                "{test} needs the real Istio ztunnel as its peer: looked at {} (not found). \
                 Set RINGWAY_ZTUNNEL=<path to the ztunnel binary> (its fake CA's root-cert.pem \
                 and ca-key.pem beside it), or RINGWAY_ZTUNNEL=absent to skip this test loudly",
                p.display()
            );
            Some(p)
        }
    }
}

/// An Istio cacerts folder `dir/cacerts` whose CA is the root of ztunnel's
/// fake CA (`root-cert.pem` and `ca-key.pem` beside the binary): ringway
/// started with `--ca-dir` on it, and certificates from
/// `ringway cert issue --ca-dir` on it, are trusted by ztunnel and the
/// other way round.
pub fn shared_ca(ztunnel: &Path, dir: &Path) -> PathBuf {
    let peer = ztunnel.parent().unwrap();
    let ca = dir.join("cacerts");
    std::fs::create_dir_all(&ca).unwrap();
    let root = peer.join("root-cert.pem");
    let read = |p: &Path| {
        std::fs::read(p).unwrap_or_else(|e| {
            panic!(
                "the ztunnel peer's fake CA: cannot read {}: {e}",
                p.display()
            )
        })
    };
    let root_pem = read(&root);
    for name in ["ca-cert.pem", "root-cert.pem", "cert-chain.pem"] {
        std::fs::write(ca.join(name), &root_pem).unwrap();
    }
    std::fs::write(ca.join("ca-key.pem"), read(&peer.join("ca-key.pem"))).unwrap();
    ca
}

/// A running ztunnel in dedicated mode, its log in a file; killed on drop.
pub struct Ztunnel {
    child: Option<Child>,
    pub log_path: PathBuf,
}

impl Ztunnel {
    /// Starts `bin proxy` in `netns` on the LOCAL_XDS file `config`,
    /// speaking for `workload` (`namespace/name/service-account`), logging
    /// to `log`; returns once the config is applied and the listeners are
    /// up. A config ztunnel rejects fails here with its log.
    pub fn start(bin: &Path, netns: &str, config: &Path, workload: &str, log: &Path) -> Ztunnel {
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(bin)
            .arg("proxy")
            .env("FAKE_CA", "true")
            .env("XDS_ADDRESS", "")
            .env("LOCAL_XDS_PATH", config)
            .env("PROXY_MODE", "dedicated")
            .env("PROXY_WORKLOAD_INFO", workload)
            .env("ENABLE_ORIG_SRC", "false")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(File::create(log).unwrap())
            .stderr(File::create(log.with_extension("stderr")).unwrap())
            .spawn()
            .expect("spawn ztunnel");
        let mut z = Ztunnel {
            child: Some(child),
            log_path: log.to_path_buf(),
        };
        // It logs "ready" before it reads the file: wait for the file, then
        // for readiness (all listeners bound).
        z.wait_up(
            &format!("ztunnel to come up on {}", config.display()),
            &["local config initialized", "marking server ready"],
        );
        z
    }

    /// Starts `bin proxy` in `netns` in shared in-pod mode: pods come from
    /// the node agent at `uds` (an in-test agent), the mesh from the
    /// LOCAL_XDS file `config`, certificates from its fake CA, with `env`
    /// added. Returns once it runs (it then connects to the agent on its
    /// own, retrying).
    pub fn start_inpod(
        bin: &Path,
        netns: &str,
        config: &Path,
        uds: &Path,
        node: &str,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Ztunnel {
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(bin)
            .arg("proxy")
            .env("FAKE_CA", "true")
            .env("XDS_ADDRESS", "")
            .env("LOCAL_XDS_PATH", config)
            .env("INPOD_ENABLED", "true")
            .env("INPOD_UDS", uds)
            .env("NODE_NAME", node)
            .env("ENABLE_ORIG_SRC", "false")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(log).unwrap())
            .stderr(File::create(log.with_extension("stderr")).unwrap())
            .spawn()
            .expect("spawn ztunnel");
        let mut z = Ztunnel {
            child: Some(child),
            log_path: log.to_path_buf(),
        };
        z.wait_up(
            "ztunnel (in-pod) to come up",
            &["local config initialized", "in-pod mode enabled"],
        );
        z
    }

    /// Sends it a signal (`ip netns exec` execs into ztunnel: the child's
    /// pid is ztunnel's).
    pub fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: kill takes no memory; a stale pid is an error (ESRCH).
        unsafe { libc::kill(pid, sig) };
    }

    /// Waits (up to `within`) for it to exit.
    pub fn wait_exit(&mut self, within: std::time::Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        super::wait_for("ztunnel to exit", within, || {
            child.try_wait().unwrap().ok_or("still running")
        })
    }

    /// Waits until its log has every one of `lines`; fails at once if it
    /// exits.
    fn wait_up(&mut self, what: &str, lines: &[&str]) {
        super::wait_for(what, super::PATIENCE, || {
            let text = self.log();
            if lines.iter().all(|l| text.contains(l)) {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "{what}: ztunnel exited ({status}):\n{text}\n{}",
                    std::fs::read_to_string(self.log_path.with_extension("stderr"))
                        .unwrap_or_default()
                );
            }
            Err(text)
        })
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Ztunnel {
    fn drop(&mut self) {
        // `ip netns exec` execs into ztunnel: this pid is ztunnel's.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
