//! Test rig: real network namespaces, real nftables capture rules, a real
//! `ringway` process. Every test makes its own namespace (unique name), so
//! tests can use fixed ports inside it and run in parallel; everything is
//! torn down on drop, including on panic.
//!
//! These tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN). Without it they
//! fail loudly; they never skip.

#![allow(dead_code)]

pub mod bystander;
pub mod inpod;
pub mod nodes;
/// The in-test node agent lives in the shared rig (the benchmark uses it).
pub use ringway_rig::zds;
pub mod ztunnel;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for something that must happen. Far longer than
/// any passing run needs, so that only a real failure reaches it, even on
/// a loaded two-core machine; a passing wait returns as soon as its
/// condition holds, so this costs nothing then.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The three traffic listeners on free loopback ports, so that tests that
/// do not care where they listen run side by side.
pub const LOOPBACK_TRAFFIC: [&str; 6] = [
    "--outbound-addr",
    "127.0.0.1:0",
    "--inbound-passthrough-addr",
    "127.0.0.1:0",
    "--inbound-addr",
    "127.0.0.1:0",
];

/// Waits for a condition instead of sleeping for a guess: calls `probe`
/// until it returns `Ok`, and returns that value. Past `within` it fails
/// the test, naming `what` and the last `Err` (what the probe saw instead).
/// The pause between tries starts at 1 ms and doubles up to 50 ms, so a
/// quick condition is seen at once and a slow one costs little.
pub fn wait_for<T, E: std::fmt::Display>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(1);
    loop {
        match probe() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("gave up after {within:?} waiting for {what}; last seen: {e}")
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
    }
}

/// Log lines as a wait's "last seen", one JSON object a line; formatted
/// only if the wait fails.
pub struct JsonLines(pub Vec<serde_json::Value>);

impl std::fmt::Display for JsonLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} lines:", self.0.len())?;
        self.0.iter().try_for_each(|l| writeln!(f, "{l}"))
    }
}

/// A text file as a wait's "last seen": read only if the wait fails.
pub struct FileText<'a>(pub &'a Path);

impl std::fmt::Display for FileText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = std::fs::read_to_string(self.0).unwrap_or_default();
        write!(f, "{}:\n{text}", self.0.display())
    }
}

/// Fails loudly (never skips) unless this is root with `ip` and `nft`.
pub fn require_root() {
    if let Err(e) = ringway_rig::require_root("this test") {
        panic!("{e:#}; run the suite as root (CI does)");
    }
}

/// Runs one of the `scripts/check-*.sh` scripts on this build's `ringway`
/// (`RINGWAY_BIN`), shows its output, and fails unless it succeeded and
/// ended with its summary line, `<summary> N passed, 0 failed`.
pub fn run_check_script(script: &str, summary: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let out = Command::new("bash")
        .arg(&path)
        .env("RINGWAY_BIN", ringway_bin())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "scripts/{script} failed ({}): its FAILED lines above say what",
        out.status
    );
    assert!(
        stdout.contains(summary) && stdout.contains(" 0 failed"),
        "no summary line:\n{stdout}"
    );
}

fn run(cmd: &mut Command) {
    if let Err(e) = ringway_rig::check(cmd) {
        panic!("{e:#}");
    }
}

/// A network namespace owned by one test: the shared rig's
/// (`ringway-rig`, which the perf harness uses too), with a test's
/// panic-on-failure manners.
pub struct NetNs {
    pub name: String,
    inner: ringway_rig::Netns,
}

impl NetNs {
    pub fn new(tag: &str) -> Self {
        require_root();
        let inner =
            ringway_rig::Netns::new(&format!("rwt-{tag}")).unwrap_or_else(|e| panic!("{e:#}"));
        NetNs {
            name: inner.name.clone(),
            inner,
        }
    }

    /// Loads an nftables ruleset inside the namespace.
    pub fn nft(&self, rules: &str) {
        self.inner.nft(rules).unwrap_or_else(|e| panic!("{e:#}"))
    }

    pub fn ip(&self, args: &[&str]) {
        self.inner.ip(args).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Captures TCP to `ports` (e.g. "9000-9999") from this namespace to
    /// ringway's outbound listener, skipping ringway's own marked sockets:
    /// the same rule shape a CNI installs in a pod.
    pub fn capture_outbound(&self, ports: &str) {
        self.nft(&format!(
            "table inet ringway_test {{
               chain out {{ type nat hook output priority -100; policy accept;
                 meta l4proto tcp meta mark & 0xfff != 0x539 tcp dport {{ {ports} }} redirect to :15001;
             }}
             }}"
        ));
    }

    /// Runs `f` on a thread that has entered this namespace (sockets it
    /// creates live there).
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_netns(&self.name, f)
    }

    /// Starts ringway inside this namespace.
    pub fn ringway(&self, extra: &[&str]) -> Ringway {
        Ringway::start(Some(&self.name), extra)
    }
}

/// Runs `f` on a new thread inside the named namespace.
pub fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    match ringway_rig::in_netns(name, f) {
        Ok(v) => v,
        Err(e) => panic!("{e:#}"),
    }
}

/// Joins two namespaces with a veth pair and gives each end an IPv4
/// address (a /24); returns the interface names (in `a`, in `b`).
pub fn veth(a: &NetNs, a_ip: &str, b: &NetNs, b_ip: &str) -> (String, String) {
    let (a_ip, b_ip) = (format!("{a_ip}/24"), format!("{b_ip}/24"));
    ringway_rig::veth(&a.inner, &[&a_ip], &b.inner, &[&b_ip]).unwrap_or_else(|e| panic!("{e:#}"))
}

/// A running ringway process with JSON logs captured to a file.
pub struct Ringway {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log_path: PathBuf,
    pub listeners: serde_json::Value,
    /// The namespace it runs in (None: the test's own).
    pub netns: Option<String>,
}

pub fn ringway_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ringway")
}

impl Ringway {
    pub fn start(netns: Option<&str>, extra: &[&str]) -> Ringway {
        Self::start_inner(netns, extra, true, None, |_| {})
    }

    /// [`start`](Self::start) with a last say over the command (e.g. a
    /// `pre_exec` that moves ringway into a cgroup before it runs).
    pub fn start_with_command(extra: &[&str], configure: impl FnOnce(&mut Command)) -> Ringway {
        Self::start_inner(None, extra, true, None, configure)
    }

    /// [`start_with_command`](Self::start_with_command) inside `netns`
    /// (the command is then `ip netns exec`, which execs into ringway: a
    /// `pre_exec` setting a limit reaches ringway).
    pub fn start_in_with_command(
        netns: &str,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Ringway {
        Self::start_inner(Some(netns), extra, true, None, configure)
    }

    /// Starts ringway on its embedded default config (no --config).
    pub fn start_embedded(netns: Option<&str>, extra: &[&str]) -> Ringway {
        Self::start_inner(netns, extra, false, None, |_| {})
    }

    /// [`start`](Self::start) with stdout going to `stdout` instead of the
    /// log file (whose lines are then not available).
    pub fn start_with_stdout(netns: Option<&str>, extra: &[&str], stdout: Stdio) -> Ringway {
        Self::start_inner(netns, extra, true, Some(stdout), |_| {})
    }

    fn start_inner(
        netns: Option<&str>,
        extra: &[&str],
        own_config: bool,
        stdout: Option<Stdio>,
        configure: impl FnOnce(&mut Command),
    ) -> Ringway {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("ringway.log");
        let addrs = dir.path().join("bound.json");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, ringway_bin()]);
                c
            }
            None => Command::new(ringway_bin()),
        };
        cmd.args(["--log-format", "json", "--bound-addrs-file"])
            .arg(&addrs);
        if !extra.contains(&"--ca-dir") {
            // Never the default ./ringway-ca: tests must not write into the tree.
            cmd.arg("--ca-dir").arg(dir.path().join("ca"));
        }
        if !extra.contains(&"--readiness-addr") {
            cmd.args(["--readiness-addr", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--stats-addr") {
            cmd.args(["--stats-addr", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--admin-addr") {
            // Port 0 too: in-pod tests run several ringways in one namespace.
            cmd.args(["--admin-addr", "127.0.0.1:0"]);
        }
        if own_config && !extra.contains(&"--config") && !extra.contains(&"--xds-address") {
            // Not the embedded default: its 127.0.0.1 is an HBONE workload.
            // An empty mesh knows no sources, so let them out as plain TCP
            // (the lab opt-out): these tests are about moving bytes. Tests
            // of the mesh's rules pass their own --config.
            let cfg = write_config(
                dir.path(),
                "empty.yaml",
                "workloads: []\nservices: []\npolicies: []\n",
            );
            cmd.arg("--config").arg(cfg);
            if !extra.contains(&"--allow-unknown-source") {
                cmd.arg("--allow-unknown-source");
            }
        }
        cmd.args(extra)
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "1")
            .stdout(stdout.unwrap_or_else(|| File::create(&log_path).unwrap().into()))
            .stderr(File::create(dir.path().join("stderr.txt")).unwrap());
        configure(&mut cmd);
        let mut child = cmd.spawn().expect("spawn ringway");
        // It writes the file once every listener is bound.
        let listeners = wait_for("ringway to bind its listeners", PATIENCE, || {
            if let Some(status) = child.try_wait().unwrap() {
                let err =
                    std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap_or_default();
                panic!(
                    "ringway exited early ({status}): {err}\nlog: {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            let text = std::fs::read_to_string(&addrs).map_err(|e| format!("{addrs:?}: {e}"))?;
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| format!("{text:?}: {e}"))
        });
        Ringway {
            child: Some(child),
            dir,
            log_path,
            listeners,
            netns: netns.map(str::to_owned),
        }
    }

    /// `GET path` on one of its side endpoints ("stats", "readiness"),
    /// from inside its namespace: (status line, body).
    pub fn http_get(&self, endpoint: &str, path: &str) -> (String, String) {
        let addr = self.listeners["listeners"][endpoint][0]
            .as_str()
            .unwrap_or_else(|| panic!("no {endpoint} listener: {}", self.listeners))
            .to_owned();
        let request = format!("GET {path} HTTP/1.1\r\nhost: ringway\r\n\r\n");
        let get = move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(&addr).expect("connect to the endpoint");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text
        };
        let text = match &self.netns {
            Some(ns) => in_netns(ns, get),
            None => get(),
        };
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or("").to_owned(),
            body.to_owned(),
        )
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Sends a signal to ringway itself (ip netns exec execs into it).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill takes no memory; a stale pid is an error (ESRCH).
        unsafe { libc::kill(self.pid(), sig) };
    }

    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        wait_for("ringway to exit", within, || {
            child.try_wait().unwrap().ok_or(FileText(&self.log_path))
        })
    }

    /// What ringway wrote to stderr (panics, fatal errors).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.txt")).unwrap_or_default()
    }

    /// All JSON log lines so far.
    pub fn logs(&self) -> Vec<serde_json::Value> {
        read_json_lines(&self.log_path)
    }

    /// Access-log lines (scope "access").
    pub fn access_logs(&self) -> Vec<serde_json::Value> {
        self.logs()
            .into_iter()
            .filter(|v| v["scope"] == "access")
            .collect()
    }

    /// Waits for a log line (any target) matching `pred`; `what` names it
    /// in the failure message.
    pub fn wait_log(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(&format!("a log line for {what}"), PATIENCE, || {
            let logs = self.logs();
            match logs.iter().find(|l| pred(l)) {
                Some(l) => Ok(l.clone()),
                None => Err(JsonLines(logs)),
            }
        })
    }

    /// Waits until at least `n` access-log lines exist.
    pub fn wait_access_logs(&self, n: usize) -> Vec<serde_json::Value> {
        wait_for(&format!("{n} access-log lines"), PATIENCE, || {
            let logs = self.access_logs();
            if logs.len() >= n {
                Ok(logs)
            } else {
                Err(JsonLines(logs))
            }
        })
    }

    /// One per-core series of its scrape (e.g. `ringway_core_open_connections`):
    /// the value for each core, in core order.
    pub fn per_core(&self, name: &str) -> Vec<u64> {
        let (status, scrape) = self.http_get("stats", "/metrics");
        assert!(status.contains(" 200 "), "{status}");
        let prefix = format!("{name}{{core=\"");
        let values: Vec<u64> = scrape
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|rest| {
                let value = rest.rsplit(' ').next().unwrap();
                value
                    .parse()
                    .unwrap_or_else(|e| panic!("{name}: {rest}: {e}"))
            })
            .collect();
        assert!(!values.is_empty(), "no {name} in\n{scrape}");
        values
    }

    /// Waits until no connection is open on any core: every connection so
    /// far has ended (each queues its access-log line as it ends, a moment
    /// after it stops counting as open).
    pub fn wait_idle(&self) {
        wait_for("no open connection on any core", PATIENCE, || {
            let open = self.per_core("ringway_core_open_connections");
            if open.iter().all(|&n| n == 0) {
                Ok(())
            } else {
                Err(format!("open per core: {open:?}"))
            }
        })
    }
}

/// Raises this test process's soft RLIMIT_NOFILE to the hard one: a
/// test that holds many sockets (a thousand clients, an attacker's flood).
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// The peer closed the connection (FIN or RST), as opposed to a read that
/// timed out: what a refused or force-closed connection must look like.
pub fn peer_closed(r: &std::io::Result<usize>) -> bool {
    match r {
        Ok(n) => *n == 0,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
    }
}

pub fn read_json_lines(path: &Path) -> Vec<serde_json::Value> {
    let Ok(f) = File::open(path) else {
        return vec![];
    };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

impl Drop for Ringway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Mints a certificate for `id` from the CA in `ca` into the new directory
/// `out` with `ringway cert issue` (key.pem, cert.pem, cert-chain.pem,
/// root-cert.pem); returns `out`.
pub fn issue_cert(ca: &Path, id: &str, out: PathBuf, ttl: &str) -> PathBuf {
    let o = Command::new(ringway_bin())
        .args(["cert", "issue", id, "--ca-dir"])
        .arg(ca)
        .arg("--out")
        .arg(&out)
        .args(["--ttl", ttl])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cert issue {id}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Writes a local config file into `dir` and returns its path.
pub fn write_config(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p
}

/// A deterministic pseudo-random byte stream (xorshift) for checksummed
/// transfers.
pub struct Pattern(u64);

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern(seed | 1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let b = self.0.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

/// FNV-1a 64, enough to detect corruption, reordering or loss.
#[derive(Clone, Copy)]
pub struct Checksum(pub u64);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(0xcbf29ce484222325)
    }
}

impl Checksum {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x100000001b3);
        }
    }
}

/// Sends `total` pattern bytes, then FIN; returns their checksum.
pub fn send_pattern(mut s: std::net::TcpStream, total: usize, seed: u64) -> Checksum {
    use std::io::Write;
    let mut pat = Pattern::new(seed);
    let mut sum = Checksum::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = total;
    while left > 0 {
        let n = left.min(buf.len());
        pat.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).unwrap();
        sum.update(&buf[..n]);
        left -= n;
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    sum
}

/// Reads to EOF; returns (bytes, checksum).
pub fn recv_all(mut s: std::net::TcpStream) -> (usize, Checksum) {
    use std::io::Read;
    let mut sum = Checksum::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return (total, sum);
        }
        sum.update(&buf[..n]);
        total += n;
    }
}

/// Serves `tag` to every connection on `addr` (then closes it), from a
/// background thread; tells tests which upstream a connection reached.
pub fn serve_tag(addr: &'static str, tag: &'static str) {
    use std::io::Write;
    let l = std::net::TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let _ = s.write_all(tag.as_bytes());
        }
    });
}

/// [`ask`] from the local address `src` (a workload's, so that ringway
/// knows the source).
pub fn ask_from(src: &str, addr: &str) -> std::io::Result<String> {
    use std::io::Read;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&std::net::SocketAddr::new(src.parse().unwrap(), 0).into())?;
    sock.connect(&addr.parse::<std::net::SocketAddr>().unwrap().into())?;
    let mut c: std::net::TcpStream = sock.into();
    c.set_read_timeout(Some(Duration::from_secs(15)))?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    Ok(s)
}

/// Connects to `addr` and reads everything until the peer closes.
pub fn ask(addr: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut c = std::net::TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(15)))?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    Ok(s)
}

/// Echoes every connection `l` accepts until the peer half-closes, then
/// half-closes too; one thread per connection.
pub fn serve_echo(l: std::net::TcpListener) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        let _ = s.shutdown(std::net::Shutdown::Write);
                        return;
                    }
                }
            });
        }
    });
}

/// A test's DNS server over TCP on `listener`: each connection on its own
/// thread, 2-byte framed messages, `answer`'s reply to each (None closes
/// the connection).
pub fn serve_dns_tcp(
    listener: std::net::TcpListener,
    answer: impl Fn(&[u8]) -> Option<Vec<u8>> + Clone + Send + 'static,
) {
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let answer = answer.clone();
            std::thread::spawn(move || loop {
                let mut len = [0u8; 2];
                if conn.read_exact(&mut len).is_err() {
                    return;
                }
                let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if conn.read_exact(&mut msg).is_err() {
                    return;
                }
                let Some(reply) = answer(&msg) else { return };
                let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                framed.extend_from_slice(&reply);
                if conn.write_all(&framed).is_err() {
                    return;
                }
            });
        }
    });
}

/// The rcode `dig` printed (`NOERROR`, `SERVFAIL`...), or `NO REPLY`.
pub fn dig_status(raw: &str) -> String {
    raw.split("status: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("NO REPLY")
        .to_string()
}
