//! The one supervisor of every process the rigs and benchmarks start
//! (ringways, ztunnels, a peer proxy, iperf3): it starts the process,
//! inside a network namespace or not, with its stdout and stderr in a log
//! file; waits until it is ready, failing with the log's tail if it exits
//! first or takes too long; restarts it with the same command line; and
//! stops and reaps it on drop.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::rig::Netns;

/// When a started process counts as ready.
#[derive(Clone, Debug)]
pub enum Ready {
    /// The file exists (ringway's `--bound-addrs-file`, written once every
    /// core listens).
    File(PathBuf),
    /// As [`Ready::File`], and then the readiness listener named in that
    /// file answers `GET /healthz/ready` with 200.
    Healthz(PathBuf),
    /// The address accepts TCP connections (from inside the namespace).
    Tcp(SocketAddr),
    /// What the process printed since this start contains every line.
    Output(Vec<&'static str>),
}

/// How to run a process: the command line, its environment, where its
/// output goes and when it is ready.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Its stdout and stderr: truncated at the first start, appended to at
    /// restarts.
    pub log: PathBuf,
    pub ready: Ready,
    pub timeout: Duration,
    /// Runs in a process group of its own, stopped as a whole (SIGTERM,
    /// SIGKILL 5 s later); otherwise the process is killed (SIGKILL).
    pub group: bool,
}

impl Spec {
    /// `program args…`, logging to `log_dir/<name>.log`, ready once it
    /// printed `ready` lines (none: at once), within 30 s.
    pub fn new(name: &str, program: impl Into<PathBuf>, args: Vec<String>, log_dir: &Path) -> Spec {
        Spec {
            name: name.to_string(),
            program: program.into(),
            args,
            env: Vec::new(),
            log: log_dir.join(format!("{name}.log").replace(['/', ' '], "_")),
            ready: Ready::Output(Vec::new()),
            timeout: Duration::from_secs(30),
            group: false,
        }
    }

    /// ringway with `args` and `RUST_LOG=log_level`, ready once every core
    /// listens (its `--bound-addrs-file` is `log_dir/<name>.bound.json`).
    pub fn ringway(
        bin: &Path,
        name: &str,
        args: &[String],
        log_level: &str,
        log_dir: &Path,
    ) -> Spec {
        let bound = bound_file(log_dir, name);
        let mut args = args.to_vec();
        args.extend(["--bound-addrs-file".into(), bound.display().to_string()]);
        Spec::new(name, bin, args, log_dir)
            .env("RUST_LOG", log_level)
            .ready(Ready::File(bound))
    }

    /// Ready only once the readiness endpoint says so, not as soon as
    /// every core listens (a ringway of [`Spec::ringway`]).
    pub fn healthz(self) -> Spec {
        match self.ready.clone() {
            Ready::File(p) => self.ready(Ready::Healthz(p)),
            _ => self,
        }
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Spec {
        self.env.push((key.to_string(), value.into()));
        self
    }

    pub fn ready(mut self, ready: Ready) -> Spec {
        self.ready = ready;
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Spec {
        self.timeout = timeout;
        self
    }

    /// The file a ringway started with [`Spec::ringway`] writes its bound
    /// addresses to.
    pub fn bound_file(&self) -> Option<&Path> {
        match &self.ready {
            Ready::File(p) | Ready::Healthz(p) => Some(p),
            _ => None,
        }
    }
}

/// Where [`Spec::ringway`] has ringway `name` write its bound addresses.
pub fn bound_file(log_dir: &Path, name: &str) -> PathBuf {
    log_dir.join(format!("{name}.bound.json"))
}

/// The first address of listener `kind` ("admin", "readiness", "stats",
/// …) in a ringway's bound-addresses file.
pub fn bound_addr(bound: &Path, kind: &str) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(bound).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["listeners"][kind][0].as_str()?.parse().ok()
}

/// A running process, stopped and reaped on drop.
pub struct Supervised {
    pub spec: Spec,
    pub child: Child,
    /// From spawning the latest start to its being ready.
    pub startup: Duration,
}

impl Supervised {
    /// Starts `spec` (inside `ns`, if given) and waits until it is ready.
    pub fn start(ns: Option<&Netns>, spec: Spec) -> anyhow::Result<Supervised> {
        let (child, startup) = launch(ns, &spec, false)?;
        Ok(Supervised {
            spec,
            child,
            startup,
        })
    }

    /// [`Spec::ringway`], started in `ns`.
    pub fn ringway(
        ns: &Netns,
        bin: &Path,
        name: &str,
        args: &[String],
        log_level: &str,
        log_dir: &Path,
    ) -> anyhow::Result<Supervised> {
        Supervised::start(Some(ns), Spec::ringway(bin, name, args, log_level, log_dir))
    }

    /// Stops the process and starts it again with the same command line
    /// (its log is appended to), e.g. to measure memory from a clean slate.
    pub fn restart(&mut self, ns: Option<&Netns>) -> anyhow::Result<()> {
        stop(&mut self.child, self.spec.group);
        (self.child, self.startup) = launch(ns, &self.spec, true)?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn log(&self) -> &Path {
        &self.spec.log
    }

    /// Sends SIGINT (to a tool that prints its results when interrupted,
    /// such as `perf stat`) and waits up to `within` for it to exit.
    pub fn interrupt(&mut self, within: Duration) -> anyhow::Result<()> {
        // SAFETY: kill(2) of our own child, not reaped yet (so its pid is
        // still its own); no memory is involved.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + within;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("{} did not exit after SIGINT", self.spec.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Fails, with the tail of its log, if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log ({}):\n{}",
                self.spec.name,
                self.spec.log.display(),
                tail(&self.spec.log, 20)
            );
        }
        Ok(())
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        stop(&mut self.child, self.spec.group);
    }
}

fn launch(ns: Option<&Netns>, spec: &Spec, append: bool) -> anyhow::Result<(Child, Duration)> {
    if let Some(bound) = spec.bound_file() {
        let _ = std::fs::remove_file(bound);
    }
    let mut o = std::fs::OpenOptions::new();
    o.create(true).write(true);
    match append {
        true => o.append(true),
        false => o.truncate(true),
    };
    let file = o
        .open(&spec.log)
        .with_context(|| format!("log file {}", spec.log.display()))?;
    // Only what this start prints counts (a restart appends).
    let offset = file.metadata()?.len();
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    if spec.group {
        cmd.process_group(0);
    }
    let started = Instant::now();
    let mut child = match ns {
        Some(ns) => ns.spawn(&mut cmd)?,
        None => cmd
            .spawn()
            .with_context(|| format!("cannot start {}", spec.program.display()))?,
    };
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{} exited during startup ({status}); its log ({}):\n{}",
                spec.name,
                spec.log.display(),
                tail(&spec.log, 20)
            );
        }
        match is_ready(ns, spec, offset) {
            Ok(true) => return Ok((child, started.elapsed())),
            Ok(false) => {}
            Err(e) => {
                stop(&mut child, spec.group);
                return Err(e);
            }
        }
        if started.elapsed() > spec.timeout {
            stop(&mut child, spec.group);
            bail!(
                "{} was not ready within {:?}; see {}",
                spec.name,
                spec.timeout,
                spec.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn is_ready(ns: Option<&Netns>, spec: &Spec, offset: u64) -> anyhow::Result<bool> {
    let in_ns = |f: Box<dyn FnOnce() -> bool + Send>| -> anyhow::Result<bool> {
        match ns {
            Some(ns) => ns.enter(f),
            None => Ok(f()),
        }
    };
    Ok(match &spec.ready {
        Ready::File(p) => p.exists(),
        Ready::Healthz(p) => match bound_addr(p, "readiness") {
            Some(addr) => in_ns(Box::new(move || {
                matches!(
                    crate::http::http_get(addr, "/healthz/ready", Duration::from_secs(2)),
                    Ok((200, _))
                )
            }))?,
            None => false,
        },
        &Ready::Tcp(addr) => in_ns(Box::new(move || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        }))?,
        Ready::Output(lines) => {
            let text = read_from(&spec.log, offset);
            lines.iter().all(|l| text.contains(l))
        }
    })
}

/// Stops `child`: its process group with SIGTERM, then SIGKILL after 5 s
/// (`group`), or the process with SIGKILL; then reaps it.
fn stop(child: &mut Child, group: bool) {
    if !group {
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    let pgid = child.id() as libc::pid_t;
    // SAFETY: kill(2) of the process group this child leads (it was
    // spawned with process_group(0)); no memory is involved.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above; whatever of the group is left.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
}

/// A file's text from byte `offset` on.
fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.read_to_string(&mut text);
        }
    }
    text
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(name: &str, script: &str, dir: &Path) -> Spec {
        Spec::new(name, "sh", vec!["-c".into(), script.into()], dir)
    }

    #[test]
    fn waits_for_output_restarts_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sh(
            "echo",
            "echo starting; sleep 0.05; echo up; exec sleep 30",
            dir.path(),
        )
        .ready(Ready::Output(vec!["up"]));
        let mut p = Supervised::start(None, spec).unwrap();
        assert!(p.startup >= Duration::from_millis(50), "{:?}", p.startup);
        let first = p.pid();
        p.check_alive().unwrap();
        p.restart(None).unwrap();
        assert_ne!(p.pid(), first);
        let log = std::fs::read_to_string(p.log()).unwrap();
        assert_eq!(log.matches("up\n").count(), 2, "{log}");
        let pid = p.pid();
        drop(p);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "reaped");
    }

    #[test]
    fn fails_with_the_log_when_it_exits_or_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let spec =
            sh("dies", "echo no config; exit 3", dir.path()).ready(Ready::Output(vec!["up"]));
        let e = format!("{:#}", Supervised::start(None, spec).err().unwrap());
        assert!(
            e.contains("exited during startup") && e.contains("no config"),
            "{e}"
        );
        let spec = sh("slow", "exec sleep 30", dir.path())
            .ready(Ready::File(dir.path().join("never")))
            .timeout(Duration::from_millis(100));
        let e = format!("{:#}", Supervised::start(None, spec).err().unwrap());
        assert!(e.contains("not ready within"), "{e}");
    }

    #[test]
    fn ready_on_tcp_and_stops_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // A wrapper shell with a child: both go with the group.
        let mut spec = sh("group", "sleep 30 & wait", dir.path()).ready(Ready::Tcp(addr));
        spec.group = true;
        let p = Supervised::start(None, spec).unwrap();
        let pid = p.pid();
        drop(p);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        drop(l);
    }

    #[test]
    fn reads_bound_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let f = bound_file(dir.path(), "rw");
        std::fs::write(
            &f,
            r#"{"cores":2,"listeners":{"admin":["127.0.0.1:4000"],"readiness":[]}}"#,
        )
        .unwrap();
        assert_eq!(
            bound_addr(&f, "admin"),
            Some("127.0.0.1:4000".parse().unwrap())
        );
        assert_eq!(bound_addr(&f, "readiness"), None);
        let s = Spec::ringway(Path::new("/bin/ringway"), "rw", &[], "warn", dir.path());
        assert_eq!(s.bound_file(), Some(f.as_path()));
        assert_eq!(s.args[s.args.len() - 2], "--bound-addrs-file");
        assert!(s.env.contains(&("RUST_LOG".into(), "warn".into())));
    }
}
