//! The transparent-redirection rig: a private network namespace with
//! nftables capture rules, so traffic reaches ringway exactly as a pod's
//! traffic would (REDIRECT + SO_ORIGINAL_DST). Needs root. Torn down on
//! drop.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct NetnsRig {
    pub name: String,
}

fn check(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl NetnsRig {
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        if unsafe { libc::geteuid() } != 0 {
            bail!("the transparent-redirection rig needs root (network namespaces, nftables)");
        }
        let name = format!("{prefix}-{}", std::process::id());
        check(Command::new("ip").args(["netns", "add", &name]))?;
        let rig = NetnsRig { name };
        check(Command::new("ip").args(["-n", &rig.name, "link", "set", "lo", "up"]))?;
        Ok(rig)
    }

    /// Redirects TCP to each `(dport, proxy_port)`, skipping marked sockets.
    pub fn redirect(&self, rules: &[(u16, u16)]) -> anyhow::Result<()> {
        let mut text = String::from(
            "table inet rwperf { chain out { type nat hook output priority -100; policy accept;\n meta mark & 0xfff == 0x539 return\n",
        );
        for (dport, to) in rules {
            text += &format!(" tcp dport {dport} redirect to :{to}\n");
        }
        text += "} }\n";
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("nft (apt-get install nftables)")?;
        child.stdin.take().unwrap().write_all(text.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("nft failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    fn ns_file(&self) -> anyhow::Result<File> {
        File::open(format!("/var/run/netns/{}", self.name)).context("open netns")
    }

    /// Runs `f` on a thread inside the namespace; threads it spawns stay there.
    pub fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let file = self.ns_file()?;
        std::thread::spawn(move || {
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                panic!("setns: {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("rig thread panicked"))
    }

    /// Starts a process inside the namespace (setns before exec, so the
    /// child's pid is the process we measure).
    pub fn spawn(&self, cmd: &mut Command) -> anyhow::Result<Child> {
        let file = self.ns_file()?;
        let fd = file.as_raw_fd();
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        drop(file);
        Ok(child)
    }
}

impl Drop for NetnsRig {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A ringway under test, killed on drop.
pub struct Proxy {
    pub child: Child,
}

impl Proxy {
    /// Starts ringway in the rig and waits until its listeners are up.
    pub fn start(
        rig: &NetnsRig,
        bin: &Path,
        name: &str,
        args: &[String],
        dir: &Path,
    ) -> anyhow::Result<Proxy> {
        let ready = dir.join(format!("{name}.bound.json"));
        let _ = std::fs::remove_file(&ready);
        let log = File::create(dir.join(format!("{name}.log")))?;
        let child = rig.spawn(
            Command::new(bin)
                .args(args)
                .arg("--bound-addrs-file")
                .arg(&ready)
                .env("RUST_LOG", "warn")
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        let mut proxy = Proxy { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            if let Some(status) = proxy.child.try_wait()? {
                bail!(
                    "{name} exited during startup ({status}); see {}/{name}.log",
                    dir.display()
                );
            }
            if Instant::now() > deadline {
                bail!("{name} did not become ready");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(proxy)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
