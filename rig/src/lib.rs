//! Network-namespace plumbing shared by ringway's integration tests and
//! its perf harness (one implementation, not one per rig): private
//! namespaces, veth links, nftables rules, the capture scripts of
//! `scripts/`, and processes started inside a namespace. Needs root;
//! everything is torn down on drop.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Context};

pub mod zds;

/// Runs `cmd`; its stderr becomes the error.
pub fn check(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Fails with a clear message unless we are root and have `ip` and `nft`.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} needs root (network namespaces, nftables): run it as root, or via sudo");
    }
    for tool in ["ip", "nft"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
            .unwrap_or(false);
        if !found {
            bail!("{what} needs `{tool}` (apt-get install -y iproute2 nftables)");
        }
    }
    Ok(())
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A private network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A fresh namespace named `<prefix>-<pid>-<n>` with `lo` up.
    pub fn new(prefix: &str) -> anyhow::Result<Netns> {
        require_root("the network-namespace rig")?;
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        check(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        check(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Sets a (per-namespace) sysctl.
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        check(Command::new("ip").args([
            "netns",
            "exec",
            &self.name,
            "sysctl",
            "-q",
            "-w",
            &format!("{key}={value}"),
        ]))
    }

    /// Loads an nftables ruleset inside the namespace.
    pub fn nft(&self, rules: &str) -> anyhow::Result<()> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("nft (apt-get install -y nftables)")?;
        child.stdin.take().unwrap().write_all(rules.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "nft failed: {}\n{rules}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Redirects locally generated TCP to each `(dport, proxy_port)`,
    /// skipping the proxy's own marked sockets.
    pub fn redirect(&self, rules: &[(u16, u16)]) -> anyhow::Result<()> {
        let mut text = String::from(
            "table inet rwperf {\n chain out { type nat hook output priority -100; policy accept;\n  meta mark & 0xfff == 0x539 return\n",
        );
        for (dport, to) in rules {
            text += &format!("  tcp dport {dport} redirect to :{to}\n");
        }
        text += " }\n}\n";
        self.nft(&text)
    }

    /// Installs the pod capture rules of `scripts/capture-netns.sh` in this
    /// namespace: egress TCP to ringway's 15001 except its own marked
    /// sockets, and TCP to `inbound_ports` (e.g. "8080, 9000-9100") to
    /// 15006; port 15008 is left alone for HBONE.
    pub fn capture(&self, inbound_ports: &str) -> anyhow::Result<()> {
        let mut cmd = Command::new(script("capture-netns.sh"));
        cmd.arg(&self.name);
        if !inbound_ports.is_empty() {
            cmd.arg(inbound_ports);
        }
        check(&mut cmd)
    }

    fn file(&self) -> anyhow::Result<File> {
        File::open(format!("/var/run/netns/{}", self.name)).context("open netns")
    }

    /// Runs `f` on a thread inside the namespace; threads it spawns (and
    /// sockets it creates) stay there.
    pub fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        in_netns(&self.name, f)
    }

    /// Starts a process inside the namespace (setns before exec, so the
    /// child's pid is the process itself, not an `ip netns exec` wrapper).
    pub fn spawn(&self, cmd: &mut Command) -> anyhow::Result<Child> {
        let file = self.file()?;
        let fd = file.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only
        // calls setns(2), which is async-signal-safe; `file` (and so `fd`)
        // outlives the spawn.
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

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs `f` on a new thread inside the named namespace (as created by
/// `ip netns add`).
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let file = File::open(format!("/var/run/netns/{name}"))
        .with_context(|| format!("network namespace {name}"))?;
    std::thread::spawn(move || -> anyhow::Result<T> {
        // SAFETY: setns(2) on an open namespace file; it only changes this
        // (new, dedicated) thread's network namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns: {}", std::io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("thread inside the namespace panicked"))?
}

/// Joins two namespaces with a veth pair; `a_ips` / `b_ips` are CIDRs
/// ("10.250.0.1/24") for each end. Returns the interface names.
pub fn veth(
    a: &Netns,
    a_ips: &[&str],
    b: &Netns,
    b_ips: &[&str],
) -> anyhow::Result<(String, String)> {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    // Interface names: at most 15 bytes.
    let tag = format!("{}{n}", std::process::id() % 100_000);
    let (ia, ib) = (format!("rwpa{tag}"), format!("rwpb{tag}"));
    check(Command::new("ip").args([
        "link", "add", &ia, "netns", &a.name, "type", "veth", "peer", "name", &ib, "netns", &b.name,
    ]))?;
    for ip in a_ips {
        a.ip(&["addr", "add", ip, "dev", &ia])?;
    }
    for ip in b_ips {
        b.ip(&["addr", "add", ip, "dev", &ib])?;
    }
    a.ip(&["link", "set", &ia, "up"])?;
    b.ip(&["link", "set", &ib, "up"])?;
    Ok((ia, ib))
}

/// One of the repository's `scripts/`.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}
