//! What the hostile-peer tests share (tests/hostile_floods.rs,
//! tests/hostile_slowloris.rs): a bystander that keeps making normal HBONE
//! CONNECTs to node B while an attacker works, and a sampler of ringway's
//! RSS, fds and CPU time.
//!
//! To measure ringway rather than the test machine, ringway B runs one
//! core pinned to CPU 0 ([`ONE_CORE`]); the attacker and the bystander's
//! client share CPU 1 ([`CLIENT_CPU`]), the attacker niced so that its own
//! CPU use does not delay the bystander's client. What the attacker then
//! costs the bystander is what it costs ringway's one core: exactly the
//! fairness between connections on a core that the tests are about.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringway_controlplane::security::tls::{build_tls_configs, WorkloadCert};
use tokio_rustls::rustls::ClientConfig;

use super::nodes::{Nodes, CLIENT_ID, CLIENT_IP, SERVER_IP};

/// Ringway's flags for one core on CPU 0.
pub const ONE_CORE: [&str; 3] = ["--cores", "0-0", "--pin"];
/// The CPU the test's clients (attacker and bystander) run on.
pub const CLIENT_CPU: usize = 1;
/// The echo server the bystander's CONNECTs reach, on node B.
pub const ECHO_PORT: u16 = 8081;

/// The client workload's TLS config (a certificate from the test's CA).
pub fn client_tls(nodes: &Nodes, name: &str) -> Arc<ClientConfig> {
    let dir = nodes.issue(&nodes.ca_dir(), CLIENT_ID, name, "1h");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let cert = WorkloadCert::from_pem(
        &read("key.pem"),
        &read("cert-chain.pem"),
        &read("root-cert.pem"),
    )
    .unwrap();
    build_tls_configs(&cert).unwrap().client
}

/// Starts the echo server on node B that the bystander tunnels to.
pub fn serve_echo(nodes: &Nodes) {
    nodes.b.enter(|| {
        super::serve_echo(std::net::TcpListener::bind(format!("{SERVER_IP}:{ECHO_PORT}")).unwrap())
    });
}

/// Pins the calling thread to `cpu`, when the machine has it.
pub fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity read and write only the set we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

/// Lowers the calling thread (and the threads it starts after) to the
/// lowest priority: an attacker's threads beside the bystander's client.
pub fn nice_self() {
    // SAFETY: setpriority has no memory preconditions; on Linux `who` 0
    // with PRIO_PROCESS is the calling thread.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
}

/// One normal client: a fresh TCP connection from the client workload's
/// address to B's 15008, mTLS, HTTP/2, CONNECT to the echo server, 4
/// bytes there and back. Its latency, all of it.
pub async fn connect_once(tls: &Arc<ClientConfig>) -> Result<Duration, String> {
    let start = Instant::now();
    let run = async {
        let addr: SocketAddr = format!("{SERVER_IP}:15008").parse().unwrap();
        let sock = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
        sock.bind(format!("{CLIENT_IP}:0").parse().unwrap())
            .map_err(|e| e.to_string())?;
        let tcp = sock
            .connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true).unwrap();
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let tls = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (send, conn) = h2::client::handshake(tls)
            .await
            .map_err(|e| format!("h2: {e}"))?;
        let driver = tokio::spawn(conn);
        let mut send = send.ready().await.map_err(|e| format!("h2 ready: {e}"))?;
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(format!("{SERVER_IP}:{ECHO_PORT}"))
            .body(())
            .unwrap();
        let (response, mut body) = send
            .send_request(request, false)
            .map_err(|e| format!("CONNECT: {e}"))?;
        let response = response.await.map_err(|e| format!("CONNECT: {e}"))?;
        if response.status() != 200 {
            return Err(format!("CONNECT answered {}", response.status()));
        }
        body.send_data(Bytes::from_static(b"ping"), true)
            .map_err(|e| e.to_string())?;
        let mut recv = response.into_body();
        let mut got = Vec::new();
        while got.len() < 4 {
            let chunk = recv
                .data()
                .await
                .ok_or("tunnel ended before the echo")?
                .map_err(|e| e.to_string())?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        if got != b"ping" {
            return Err(format!("echoed {got:?}"));
        }
        driver.abort();
        Ok(start.elapsed())
    };
    match tokio::time::timeout(Duration::from_secs(5), run).await {
        Ok(r) => r,
        Err(_) => Err("no echo within 5 s".into()),
    }
}

/// Runs `n` probes one after another, 20 ms apart, from node A on
/// [`CLIENT_CPU`], then keeps probing while `more` is set.
pub fn probe(
    nodes: &Nodes,
    tls: &Arc<ClientConfig>,
    n: usize,
    more: Option<Arc<AtomicBool>>,
) -> Vec<Result<Duration, String>> {
    let tls = tls.clone();
    nodes.a.enter(move || {
        pin_to(CLIENT_CPU);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut seen = Vec::new();
            while seen.len() < n || more.as_ref().is_some_and(|m| m.load(Ordering::Relaxed)) {
                seen.push(connect_once(&tls).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        })
    })
}

/// The median of probes that must all have succeeded.
pub fn median_ok(probes: &[Result<Duration, String>], what: &str) -> Duration {
    let mut ok: Vec<Duration> = probes
        .iter()
        .map(|p| {
            p.clone()
                .unwrap_or_else(|e| panic!("{what}: a CONNECT failed: {e}"))
        })
        .collect();
    ok.sort();
    ok[ok.len() / 2]
}

/// The bound a bystander's median must keep under attack: twice its
/// baseline. A baseline of a few ms (TLS handshake included) doubles from
/// scheduling noise alone on a shared two-core machine, so it counts as
/// at least 5 ms.
pub fn twice(baseline: Duration) -> Duration {
    (baseline * 2).max(Duration::from_millis(5) * 2)
}

/// tests/py/hostile_h2.py on node A with a certificate of the client's
/// identity, on [`CLIENT_CPU`] at the lowest priority.
#[derive(Clone)]
pub struct Hostile {
    netns: String,
    certs: PathBuf,
    root: PathBuf,
}

impl Hostile {
    /// Issues its certificate (`name`: a directory of the test's own).
    pub fn new(nodes: &Nodes, name: &str) -> Hostile {
        Hostile {
            netns: nodes.a.name.clone(),
            certs: nodes.issue(&nodes.ca_dir(), CLIENT_ID, name, "1h"),
            root: nodes.ca_dir().join("root-cert.pem"),
        }
    }

    /// Starts it against B's 15008; `args` from `--mode` on.
    pub fn spawn(&self, args: &[String]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(["taskset", "-c", &CLIENT_CPU.to_string(), "nice", "-n", "19"])
            .arg("/usr/bin/python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/hostile_h2.py"))
            .args([
                "--connect",
                &format!("{SERVER_IP}:15008"),
                "--bind",
                CLIENT_IP,
            ])
            .args([
                "--cert",
                self.certs.join("cert-chain.pem").to_str().unwrap(),
            ])
            .args(["--key", self.certs.join("key.pem").to_str().unwrap()])
            .args(["--ca", self.root.to_str().unwrap()])
            .args(["--authority", &format!("{SERVER_IP}:{ECHO_PORT}")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// The hostile client's JSON report (its last line).
pub fn report(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "hostile_h2.py: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Ringway's resident memory (KiB) and open fds.
pub fn usage(pid: i32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
}

/// utime + stime of the whole process.
pub fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Peaks of ringway's RSS (KiB) and fds, sampled every 20 ms until
/// stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, usize)>,
}

impl Sampler {
    pub fn start(pid: i32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                let (rss, fds) = usage(pid);
                peak = (peak.0.max(rss), peak.1.max(fds));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        Sampler { stop, thread }
    }

    /// (peak RSS KiB, peak fds).
    pub fn stop(self) -> (u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// `GET /metrics` on `addr` (a side port's address, from inside its
/// namespace).
pub fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: ringway\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The sum over cores of a per-core series in a scrape, if it is there.
pub fn sum_series(scrape: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}{{core=\"");
    let values: Vec<u64> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}
