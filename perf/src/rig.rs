//! The perf rigs' processes (ringway, a peer proxy) started inside
//! network namespaces; the namespace plumbing itself is the shared
//! `ringway-rig` crate, which the integration tests use too.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub use ringway_rig::{check, in_netns, require_root, veth, Netns};

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
    // SAFETY: kill takes no memory; the group is the child's own (made at spawn).
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
    // SAFETY: kill takes no memory; the group is the child's own (made at spawn).
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
