//! Network-namespace plumbing for the rigs: private namespaces, veth
//! links, nftables capture rules, and processes started inside a
//! namespace (ringway, a peer proxy). Needs root. Everything is torn down
//! on drop.

use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

fn check(cmd: &mut Command) -> anyhow::Result<()> {
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
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} needs root (network namespaces, nftables): run it with sudo");
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

/// A ringway under test, killed on drop.
pub struct Proxy {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    bin: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    log_level: String,
}

/// Opens a log file: truncated on first start, appended to on restarts.
pub(crate) fn open_log(path: &Path, append: bool) -> anyhow::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).write(true);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    o.open(path)
        .with_context(|| format!("log file {}", path.display()))
}

impl Proxy {
    /// Starts ringway in `ns` and waits until every core listens.
    pub fn start(
        ns: &Netns,
        bin: &Path,
        name: &str,
        args: &[String],
        dir: &Path,
        log_level: &str,
    ) -> anyhow::Result<Proxy> {
        let log = dir.join(format!("{name}.log"));
        let child = Self::launch(ns, bin, name, args, dir, log_level, &log, false)?;
        Ok(Proxy {
            name: name.to_string(),
            child,
            log,
            bin: bin.to_path_buf(),
            args: args.to_vec(),
            dir: dir.to_path_buf(),
            log_level: log_level.to_string(),
        })
    }

    /// Stops the process and starts a fresh one with the same arguments
    /// (same listeners, same CA), e.g. to measure memory from a clean slate.
    pub fn restart(&mut self, ns: &Netns) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::launch(
            ns,
            &self.bin,
            &self.name,
            &self.args,
            &self.dir,
            &self.log_level,
            &self.log,
            true,
        )?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        ns: &Netns,
        bin: &Path,
        name: &str,
        args: &[String],
        dir: &Path,
        log_level: &str,
        log: &Path,
        append: bool,
    ) -> anyhow::Result<Child> {
        let ready = dir.join(format!("{name}.bound.json"));
        let _ = std::fs::remove_file(&ready);
        let file = open_log(log, append)?;
        let mut child = ns.spawn(
            Command::new(bin)
                .args(args)
                .arg("--bound-addrs-file")
                .arg(&ready)
                .env("RUST_LOG", log_level)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file),
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} exited during startup ({status}); its log ({}):\n{}",
                    log.display(),
                    tail(log, 20)
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{name} did not become ready in 30 s; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        check_alive(&mut self.child, &self.name, &self.log)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy started from a shell command line inside a namespace (the peer
/// column), ready once `ready_addr` accepts TCP connections. The command
/// runs through `sh -c 'exec …'`, so the child is the proxy itself; it gets
/// its own process group, and the whole group is stopped on drop.
pub struct CommandProxy {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    command_line: String,
    ready_addr: SocketAddr,
}

impl CommandProxy {
    pub fn start(
        ns: &Netns,
        name: &str,
        command_line: &str,
        ready_addr: SocketAddr,
        dir: &Path,
    ) -> anyhow::Result<CommandProxy> {
        let log = dir.join(format!("{name}.log").replace(['/', ' '], "_"));
        let child = Self::launch(ns, name, command_line, ready_addr, &log, false)?;
        Ok(CommandProxy {
            name: name.to_string(),
            child,
            log,
            command_line: command_line.to_string(),
            ready_addr,
        })
    }

    /// Stops the process group and runs the command again.
    pub fn restart(&mut self, ns: &Netns) -> anyhow::Result<()> {
        self.stop();
        self.child = Self::launch(
            ns,
            &self.name,
            &self.command_line,
            self.ready_addr,
            &self.log,
            true,
        )?;
        Ok(())
    }

    fn launch(
        ns: &Netns,
        name: &str,
        command_line: &str,
        ready_addr: SocketAddr,
        log: &Path,
        append: bool,
    ) -> anyhow::Result<Child> {
        let file = open_log(log, append)?;
        let mut child = ns.spawn(
            Command::new("sh")
                .arg("-c")
                .arg(format!("exec {command_line}"))
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .process_group(0),
        )?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} ({command_line}) exited during startup ({status}); its log ({}):\n{}",
                    log.display(),
                    tail(log, 20)
                );
            }
            let up = ns.enter(move || {
                TcpStream::connect_timeout(&ready_addr, Duration::from_millis(200)).is_ok()
            })?;
            if up {
                return Ok(child);
            }
            if Instant::now() > deadline {
                stop_group(&mut child);
                bail!(
                    "{name} did not listen on {ready_addr} within 60 s; see {}",
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        stop_group(&mut self.child);
    }
}

/// SIGTERM to the child's process group (created at spawn), SIGKILL after
/// 5 s.
fn stop_group(child: &mut Child) {
    let pgid = child.id() as libc::pid_t;
    unsafe {
        libc::kill(-pgid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = child.wait();
}

impl Drop for CommandProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` lines of a log file.
/// Fails, with the tail of its log, if the proxy process `name` has exited.
pub fn check_alive(child: &mut Child, name: &str, log: &Path) -> anyhow::Result<()> {
    if let Some(status) = child.try_wait()? {
        bail!(
            "{name} exited ({status}); its log ({}):\n{}",
            log.display(),
            tail(log, 20)
        );
    }
    Ok(())
}

pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
