//! `tls-provider-bench`: rustls' `ring` provider against `aws-lc-rs` on this
//! CPU (issue 22 item 4), in memory: no sockets, no kernel, one thread.
//!
//! Both providers get the configs ringway builds for HBONE (see
//! `ringway_controlplane::security::tls::build_tls_configs`): TLS 1.3 only,
//! ALPN `h2`, no resumption, tickets or SNI, mutual TLS with ECDSA P-256
//! certificates from ringway's built-in CA, the client certificate verified
//! by webpki plus the trust-domain check, the server's chain and SPIFFE ID
//! checked by the client. Only the provider differs (and, per row, the one
//! cipher suite offered). It measures, per provider:
//!
//! - bulk: plaintext from client to server through `writer().write_all` →
//!   `write_tls` → `read_tls` → `process_new_packets` → `reader().read`, in
//!   16 KiB writes (full records) and 1 KiB writes, for TLS13_AES_128_GCM_SHA256
//!   and TLS13_AES_256_GCM_SHA384: one direction, so encryption plus
//!   decryption, in ns per KiB and GiB/s;
//! - small messages: 1-byte and 64-byte writes, one record each, the same
//!   way: ns per message;
//! - handshakes: a full mTLS handshake in memory (ringway's suite order,
//!   AES-256 first; X25519 with both providers' default groups), per second;
//!   plus ringway's own configs (ring) as a check that the mirror costs the
//!   same, and aws-lc with X25519MLKEM768 for what post-quantum would cost;
//! - raw AEAD: `ring::aead` against `aws_lc_rs::aead` (AES-128-GCM and
//!   AES-256-GCM, `LessSafeKey`), seal, and seal then open, of 16 KiB and of
//!   1350 bytes, to tell the AEAD's cost from rustls' own.
//!
//! Every measurement is a batch of at least `--batch-ms` of the thread's CPU
//! time (`CLOCK_THREAD_CPUTIME_ID`: time spent preempted on a shared machine
//! is not the provider's; wall-clock is kept beside it). Rounds interleave
//! the providers (ring first in even rounds, aws-lc first in odd ones)
//! because the machine is noisy, and the table shows medians over rounds and
//! aws-lc ÷ ring (of time: below 1 means aws-lc is faster). The last line is
//! the same as one JSON object.
//!
//! Run (aws-lc-sys is only built with the feature, never in the default
//! workspace build):
//!
//! ```sh
//! cargo build --release -p ringway-perf --features aws-lc --bin tls-provider-bench
//! target/release/tls-provider-bench            # ~1.5 min; --quick ~15 s
//! ```
//!
//! For instruction counts (noise-free), `--count CASE --provider P --iters N`
//! runs one case N times untimed; run it under `valgrind --tool=callgrind`
//! with two values of N and divide the difference.

use std::io::{ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Parser;
use ringway_benchkit::median;
use ringway_controlplane::security::ca::DEFAULT_CERT_VALIDITY;
use ringway_controlplane::{
    build_tls_configs, build_tls_configs_with, BuiltinCa, Identity, WorkloadCert,
};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::ServerName;
use rustls::{
    ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection,
    SupportedCipherSuite,
};
use serde_json::json;

const TRUST_DOMAIN: &str = "cluster.local";
const KIB: usize = 1024;

#[derive(Parser, Debug)]
#[command(
    about = "rustls' ring provider against aws-lc-rs: bulk, small records, handshakes, raw AEAD"
)]
struct Args {
    /// Rounds; each measures every case once per provider.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Minimum wall time of one timed batch, in milliseconds.
    #[arg(long, default_value_t = 200)]
    batch_ms: u64,
    /// 3 rounds of 60 ms batches.
    #[arg(long)]
    quick: bool,
    /// Only the cases whose id contains this.
    #[arg(long)]
    only: Option<String>,
    /// Run this case (an id from the table) `--iters` times untimed and
    /// exit: for `valgrind --tool=callgrind` or `perf stat`.
    #[arg(long)]
    count: Option<String>,
    /// The provider for `--count`: `ring` or `aws-lc`.
    #[arg(long, default_value = "ring")]
    provider: String,
    /// Iterations for `--count`.
    #[arg(long, default_value_t = 100)]
    iters: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    Ring,
    AwsLc,
}

impl Provider {
    const BOTH: [Provider; 2] = [Provider::Ring, Provider::AwsLc];

    fn name(self) -> &'static str {
        match self {
            Provider::Ring => "ring",
            Provider::AwsLc => "aws-lc",
        }
    }

    /// The provider's own defaults (key exchange groups, signature
    /// algorithms, key loading, randomness).
    fn base(self) -> CryptoProvider {
        match self {
            Provider::Ring => rustls::crypto::ring::default_provider(),
            Provider::AwsLc => rustls::crypto::aws_lc_rs::default_provider(),
        }
    }

    fn suite(self, suite: Suite) -> SupportedCipherSuite {
        use rustls::crypto::{aws_lc_rs, ring};
        match (self, suite) {
            (Provider::Ring, Suite::Aes128) => ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
            (Provider::Ring, Suite::Aes256) => ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
            (Provider::AwsLc, Suite::Aes128) => aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
            (Provider::AwsLc, Suite::Aes256) => aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suite {
    Aes128,
    Aes256,
}

impl Suite {
    fn id(self) -> &'static str {
        match self {
            Suite::Aes128 => "aes128",
            Suite::Aes256 => "aes256",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Suite::Aes128 => "AES-128-GCM",
            Suite::Aes256 => "AES-256-GCM",
        }
    }
}

/// Which suites a config offers.
#[derive(Clone, Copy, Debug)]
enum Offer {
    One(Suite),
    /// ringway's list: AES-256 first, then AES-128.
    Ringway,
}

/// Key exchange groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kx {
    /// The provider's defaults (X25519 first for both).
    Default,
    /// X25519MLKEM768 alone (aws-lc only).
    HybridPq,
}

/// What one row measures.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// Client → server, `size`-byte writes.
    Bulk { suite: Suite, size: usize },
    /// Client → server, one `size`-byte record at a time.
    Small { suite: Suite, size: usize },
    /// A full mTLS handshake with the mirrored configs.
    Handshake { kx: Kx },
    /// A full mTLS handshake with ringway's own configs (ring only).
    RingwayHandshake,
    /// `LessSafeKey::seal_in_place_separate_tag` of `size` bytes.
    Seal { suite: Suite, size: usize },
    /// Seal, then `open_in_place` of the result.
    SealOpen { suite: Suite, size: usize },
}

impl Case {
    fn all() -> Vec<Case> {
        let mut v = Vec::new();
        for suite in [Suite::Aes128, Suite::Aes256] {
            for size in [16 * KIB, KIB] {
                v.push(Case::Bulk { suite, size });
            }
        }
        for suite in [Suite::Aes128, Suite::Aes256] {
            for size in [1, 64] {
                v.push(Case::Small { suite, size });
            }
        }
        v.push(Case::Handshake { kx: Kx::Default });
        v.push(Case::RingwayHandshake);
        v.push(Case::Handshake { kx: Kx::HybridPq });
        for suite in [Suite::Aes128, Suite::Aes256] {
            for size in [16 * KIB, 1350] {
                v.push(Case::Seal { suite, size });
                v.push(Case::SealOpen { suite, size });
            }
        }
        v
    }

    fn id(self) -> String {
        match self {
            Case::Bulk { suite, size } => format!("bulk-{}-{}", size_id(size), suite.id()),
            Case::Small { suite, size } => format!("small-{}-{}", size_id(size), suite.id()),
            Case::Handshake { kx: Kx::Default } => "handshake".into(),
            Case::Handshake { kx: Kx::HybridPq } => "handshake-x25519mlkem768".into(),
            Case::RingwayHandshake => "handshake-ringway-configs".into(),
            Case::Seal { suite, size } => format!("aead-seal-{}-{}", size_id(size), suite.id()),
            Case::SealOpen { suite, size } => {
                format!("aead-sealopen-{}-{}", size_id(size), suite.id())
            }
        }
    }

    fn label(self) -> String {
        match self {
            Case::Bulk { suite, size } => {
                format!("bulk, {} writes, {}", size_label(size), suite.label())
            }
            Case::Small { suite, size } => {
                format!("small messages, {}, {}", size_label(size), suite.label())
            }
            Case::Handshake { kx: Kx::Default } => "mTLS handshake, P-256 certs, X25519".into(),
            Case::Handshake { kx: Kx::HybridPq } => {
                "mTLS handshake, P-256 certs, X25519MLKEM768".into()
            }
            Case::RingwayHandshake => "mTLS handshake, ringway's own configs".into(),
            Case::Seal { suite, size } => {
                format!("raw AEAD seal, {}, {}", size_label(size), suite.label())
            }
            Case::SealOpen { suite, size } => {
                format!(
                    "raw AEAD seal + open, {}, {}",
                    size_label(size),
                    suite.label()
                )
            }
        }
    }

    /// Whether `provider` can run it.
    fn runs_with(self, provider: Provider) -> bool {
        match self {
            Case::Handshake { kx: Kx::HybridPq } => provider == Provider::AwsLc,
            Case::RingwayHandshake => provider == Provider::Ring,
            _ => true,
        }
    }

    /// Plaintext bytes per operation, for throughput rows.
    fn bytes(self) -> Option<usize> {
        match self {
            Case::Bulk { size, .. } | Case::Seal { size, .. } => Some(size),
            _ => None,
        }
    }
}

fn size_id(size: usize) -> String {
    if size >= KIB && size.is_multiple_of(KIB) {
        format!("{}k", size / KIB)
    } else {
        format!("{size}b")
    }
}

fn size_label(size: usize) -> String {
    if size >= KIB && size.is_multiple_of(KIB) {
        format!("{} KiB", size / KIB)
    } else {
        format!("{size} B")
    }
}

/// The certificates both sides present, from ringway's built-in CA (ECDSA
/// P-256 leaf and root, SPIFFE URI SANs), and ringway's own configs.
struct Pki {
    client: WorkloadCert,
    server: WorkloadCert,
    ringway_client: Arc<ClientConfig>,
    ringway_server: Arc<ServerConfig>,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        let dir = tempfile::tempdir()?;
        let ca = BuiltinCa::load_or_create(dir.path(), TRUST_DOMAIN)?;
        let issue = |ns: &str, sa: &str| -> anyhow::Result<WorkloadCert> {
            Ok(ca
                .issue(
                    &Identity::new(ca.trust_domain(), ns, sa),
                    DEFAULT_CERT_VALIDITY,
                )?
                .to_workload_cert()?)
        };
        let client = issue("web", "client")?;
        let server = issue("shop", "server")?;
        let ringway_client = build_tls_configs(&client)?.client;
        let ringway_server = build_tls_configs(&server)?.server;
        Ok(Pki {
            client,
            server,
            ringway_client,
            ringway_server,
        })
    }

    /// ringway's configs (`build_tls_configs_with`: the same verifiers,
    /// versions, ALPN and session settings) on `provider`, offering `offer`
    /// and key exchange `kx`.
    fn configs(
        &self,
        provider: Provider,
        offer: Offer,
        kx: Kx,
    ) -> anyhow::Result<(Arc<ClientConfig>, Arc<ServerConfig>)> {
        let base = provider.base();
        let cipher_suites = match offer {
            Offer::One(s) => vec![provider.suite(s)],
            Offer::Ringway => vec![provider.suite(Suite::Aes256), provider.suite(Suite::Aes128)],
        };
        let kx_groups: Vec<&'static dyn SupportedKxGroup> = match (kx, provider) {
            (Kx::Default, _) => base.kx_groups.clone(),
            (Kx::HybridPq, Provider::AwsLc) => {
                vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768]
            }
            (Kx::HybridPq, Provider::Ring) => bail!("ring has no X25519MLKEM768"),
        };
        let provider = Arc::new(CryptoProvider {
            cipher_suites,
            kx_groups,
            ..base
        });
        let client = build_tls_configs_with(&self.client, provider.clone())?.client;
        let server = build_tls_configs_with(&self.server, provider)?.server;
        Ok((client, server))
    }
}

fn pump(from: &mut Connection, to: &mut Connection, wire: &mut Vec<u8>) -> anyhow::Result<()> {
    wire.clear();
    while from.wants_write() {
        from.write_tls(wire)?;
    }
    let mut rest = &wire[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest)?;
        to.process_new_packets()?;
    }
    Ok(())
}

/// A connected pair, handshake done.
fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
    wire: &mut Vec<u8>,
) -> anyhow::Result<(Connection, Connection)> {
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let mut c: Connection = ClientConnection::new(client.clone(), name)?.into();
    let mut s: Connection = ServerConnection::new(server.clone())?.into();
    // ClientHello; the server's flight; the client's certificate and
    // Finished. A fourth pass would only mean something went wrong.
    for _ in 0..4 {
        if !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
        pump(&mut c, &mut s, wire)?;
        pump(&mut s, &mut c, wire)?;
    }
    ensure!(
        !c.is_handshaking() && !s.is_handshaking(),
        "the handshake did not finish"
    );
    Ok((c, s))
}

/// `msg` through `tx` and `rx`, read out into `out`; all of it must arrive.
fn transfer(
    tx: &mut Connection,
    rx: &mut Connection,
    msg: &[u8],
    wire: &mut Vec<u8>,
    out: &mut [u8],
) -> anyhow::Result<()> {
    tx.writer().write_all(msg)?;
    wire.clear();
    while tx.wants_write() {
        tx.write_tls(wire)?;
    }
    let mut rest = &wire[..];
    let mut got = 0;
    while !rest.is_empty() {
        rx.read_tls(&mut rest)?;
        rx.process_new_packets()?;
        loop {
            match rx.reader().read(out) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    ensure!(got == msg.len(), "sent {} bytes, {got} arrived", msg.len());
    Ok(())
}

/// The raw AEAD of one provider: same API in both crates. ring's key is
/// held inline as ring holds it (aws-lc-rs boxes its own): a `Box` here would
/// add an indirection to ring's side only, and there is one per runner.
#[allow(clippy::large_enum_variant)]
enum Aead {
    Ring(ring::aead::LessSafeKey),
    AwsLc(aws_lc_rs::aead::LessSafeKey),
}

impl Aead {
    fn new(provider: Provider, suite: Suite) -> anyhow::Result<Aead> {
        let key = [0x42u8; 32];
        Ok(match (provider, suite) {
            (Provider::Ring, s) => {
                let (alg, len) = match s {
                    Suite::Aes128 => (&ring::aead::AES_128_GCM, 16),
                    Suite::Aes256 => (&ring::aead::AES_256_GCM, 32),
                };
                let k = ring::aead::UnboundKey::new(alg, &key[..len])
                    .map_err(|_| anyhow::anyhow!("ring key"))?;
                Aead::Ring(ring::aead::LessSafeKey::new(k))
            }
            (Provider::AwsLc, s) => {
                let (alg, len) = match s {
                    Suite::Aes128 => (&aws_lc_rs::aead::AES_128_GCM, 16),
                    Suite::Aes256 => (&aws_lc_rs::aead::AES_256_GCM, 32),
                };
                let k = aws_lc_rs::aead::UnboundKey::new(alg, &key[..len])
                    .map_err(|_| anyhow::anyhow!("aws-lc key"))?;
                Aead::AwsLc(aws_lc_rs::aead::LessSafeKey::new(k))
            }
        })
    }

    /// Encrypts `buf` in place; the tag goes to `tag`. A fixed nonce is
    /// fine for timing (and nothing else).
    fn seal(&self, buf: &mut [u8], tag: &mut [u8; 16]) {
        let nonce = [7u8; 12];
        match self {
            Aead::Ring(k) => {
                let t = k
                    .seal_in_place_separate_tag(
                        ring::aead::Nonce::assume_unique_for_key(nonce),
                        ring::aead::Aad::empty(),
                        buf,
                    )
                    .expect("seal");
                tag.copy_from_slice(t.as_ref());
            }
            Aead::AwsLc(k) => {
                let t = k
                    .seal_in_place_separate_tag(
                        aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                        aws_lc_rs::aead::Aad::empty(),
                        buf,
                    )
                    .expect("seal");
                tag.copy_from_slice(t.as_ref());
            }
        }
    }

    /// Decrypts what [`seal`](Self::seal) made (`buf` then the tag) in
    /// place; the tag must verify.
    fn open(&self, buf_and_tag: &mut [u8]) {
        let nonce = [7u8; 12];
        match self {
            Aead::Ring(k) => {
                k.open_in_place(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::empty(),
                    buf_and_tag,
                )
                .expect("open");
            }
            Aead::AwsLc(k) => {
                k.open_in_place(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                    aws_lc_rs::aead::Aad::empty(),
                    buf_and_tag,
                )
                .expect("open");
            }
        }
    }
}

/// One case with one provider, ready to run one operation at a time.
struct Runner {
    op: Box<dyn FnMut() -> anyhow::Result<()>>,
}

impl Runner {
    fn new(pki: &Pki, case: Case, provider: Provider) -> anyhow::Result<Runner> {
        let op: Box<dyn FnMut() -> anyhow::Result<()>> = match case {
            Case::Bulk { suite, size } | Case::Small { suite, size } => {
                let (cc, sc) = pki.configs(provider, Offer::One(suite), Kx::Default)?;
                let mut wire = Vec::with_capacity(2 * size + 1024);
                let (mut c, mut s) = handshake(&cc, &sc, &mut wire)?;
                let negotiated = c.negotiated_cipher_suite().context("no suite negotiated")?;
                ensure!(
                    negotiated.suite() == provider.suite(suite).suite(),
                    "negotiated {:?}",
                    negotiated.suite()
                );
                let msg = vec![0x5au8; size];
                let mut out = vec![0u8; 32 * KIB];
                Box::new(move || transfer(&mut c, &mut s, &msg, &mut wire, &mut out))
            }
            Case::Handshake { kx } => {
                let (cc, sc) = pki.configs(provider, Offer::Ringway, kx)?;
                let mut wire = Vec::with_capacity(8 * KIB);
                // Once, checked: the suite and group ringway would get.
                let (c, s) = handshake(&cc, &sc, &mut wire)?;
                ensure!(c.negotiated_cipher_suite() == Some(provider.suite(Suite::Aes256)));
                let group = c.negotiated_key_exchange_group().context("no group")?;
                let expect = match kx {
                    Kx::Default => rustls::NamedGroup::X25519,
                    Kx::HybridPq => rustls::NamedGroup::X25519MLKEM768,
                };
                ensure!(group.name() == expect, "negotiated {:?}", group.name());
                ensure!(s.peer_certificates().is_some(), "no client certificate");
                Box::new(move || handshake(&cc, &sc, &mut wire).map(drop))
            }
            Case::RingwayHandshake => {
                let (cc, sc) = (pki.ringway_client.clone(), pki.ringway_server.clone());
                let mut wire = Vec::with_capacity(8 * KIB);
                Box::new(move || handshake(&cc, &sc, &mut wire).map(drop))
            }
            Case::Seal { suite, size } => {
                let aead = Aead::new(provider, suite)?;
                let mut buf = vec![0x5au8; size];
                let mut tag = [0u8; 16];
                Box::new(move || {
                    aead.seal(&mut buf, &mut tag);
                    Ok(())
                })
            }
            Case::SealOpen { suite, size } => {
                let aead = Aead::new(provider, suite)?;
                let mut buf = vec![0x5au8; size + 16];
                let mut tag = [0u8; 16];
                Box::new(move || {
                    let (data, t) = buf.split_at_mut(size);
                    aead.seal(data, &mut tag);
                    t.copy_from_slice(&tag);
                    aead.open(&mut buf);
                    Ok(())
                })
            }
        };
        Ok(Runner { op })
    }

    /// Time per operation over one batch of at least `min` of this
    /// thread's CPU time. The batch grows until it lasts that long; the
    /// shorter batches before it warm caches and branch predictors.
    fn time(&mut self, min: Duration) -> anyhow::Result<Timing> {
        let mut calls: u64 = 1;
        loop {
            let wall = Instant::now();
            let cpu = thread_cpu()?;
            for _ in 0..calls {
                (self.op)()?;
            }
            let cpu = thread_cpu()?.saturating_sub(cpu);
            let wall = wall.elapsed();
            if cpu >= min {
                return Ok(Timing {
                    cpu_ns: cpu.as_nanos() as f64 / calls as f64,
                    wall_ns: wall.as_nanos() as f64 / calls as f64,
                });
            }
            // Aim 20 % past `min`, at least doubling.
            let scale = min.as_secs_f64() / cpu.as_secs_f64().max(1e-9) * 1.2;
            calls = (calls as f64 * scale.max(2.0)).ceil() as u64;
        }
    }
}

/// One batch's time per operation.
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// This thread's CPU time: what the table shows. The machine is
    /// shared, and time spent preempted is not the provider's.
    cpu_ns: f64,
    /// Wall-clock time, preemption included.
    wall_ns: f64,
}

/// CPU time of the calling thread so far.
fn thread_cpu() -> anyhow::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the struct we pass,
    // which lives for the whole call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ensure!(
        rc == 0,
        "clock_gettime(CLOCK_THREAD_CPUTIME_ID): {}",
        std::io::Error::last_os_error()
    );
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

fn provider_named(name: &str) -> anyhow::Result<Provider> {
    match name {
        "ring" => Ok(Provider::Ring),
        "aws-lc" | "aws-lc-rs" => Ok(Provider::AwsLc),
        other => bail!("unknown provider {other:?} (ring, aws-lc)"),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pki = Pki::new()?;

    if let Some(id) = &args.count {
        let provider = provider_named(&args.provider)?;
        let case = Case::all()
            .into_iter()
            .find(|c| c.id() == *id)
            .with_context(|| format!("no case {id:?}"))?;
        ensure!(
            case.runs_with(provider),
            "{id} does not run with {}",
            provider.name()
        );
        let mut runner = Runner::new(&pki, case, provider)?;
        for _ in 0..args.iters {
            (runner.op)()?;
        }
        println!("{id} with {}: {} iterations", provider.name(), args.iters);
        return Ok(());
    }

    let (rounds, batch) = if args.quick {
        (3, Duration::from_millis(60))
    } else {
        (args.rounds.max(1), Duration::from_millis(args.batch_ms))
    };
    let cases: Vec<Case> = Case::all()
        .into_iter()
        .filter(|c| {
            args.only
                .as_ref()
                .is_none_or(|o| c.id().contains(o.as_str()))
        })
        .collect();
    ensure!(!cases.is_empty(), "no case matches");

    // samples[case][provider]: time per operation, one per round.
    let mut samples = vec![[Vec::new(), Vec::new()]; cases.len()];
    let started = Instant::now();
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            Provider::BOTH
        } else {
            [Provider::AwsLc, Provider::Ring]
        };
        for (i, &case) in cases.iter().enumerate() {
            for provider in order {
                if !case.runs_with(provider) {
                    continue;
                }
                let t = Runner::new(&pki, case, provider)?
                    .time(batch)
                    .with_context(|| format!("{} with {}", case.id(), provider.name()))?;
                samples[i][provider as usize].push(t);
            }
        }
        eprintln!(
            "round {}/{rounds} done ({:.0} s)",
            round + 1,
            started.elapsed().as_secs_f64()
        );
    }

    println!("# rustls' ring provider against aws-lc-rs");
    println!();
    println!("CPU: {} ({})", cpu_model(), cpu_flags().join(" "));
    println!();
    println!(
        "Medians of {rounds} rounds of this thread's CPU time per operation (batches of at \
         least {} ms of it, providers interleaved). aws-lc ÷ ring is of time per operation: \
         below 1 means aws-lc is faster; the last column is the same ratio of wall-clock time.",
        batch.as_millis()
    );
    println!();
    println!("| case | id | ring | aws-lc | aws-lc ÷ ring | wall-clock ÷ |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (i, &case) in cases.iter().enumerate() {
        let of = |p: Provider, f: fn(&Timing) -> f64| -> Vec<f64> {
            samples[i][p as usize].iter().map(f).collect()
        };
        let cpu = |t: &Timing| t.cpu_ns;
        let wall = |t: &Timing| t.wall_ns;
        let (ring, aws) = (
            median(&of(Provider::Ring, cpu)),
            median(&of(Provider::AwsLc, cpu)),
        );
        let (ring_wall, aws_wall) = (
            median(&of(Provider::Ring, wall)),
            median(&of(Provider::AwsLc, wall)),
        );
        let cell = |ns: Option<f64>| match ns {
            None => "—".to_string(),
            Some(ns) => describe(case, ns),
        };
        let ratio = |r: Option<f64>, a: Option<f64>| match r.zip(a) {
            Some((r, a)) => format!("{:.2}", a / r),
            None => "—".into(),
        };
        println!(
            "| {} | `{}` | {} | {} | {} | {} |",
            case.label(),
            case.id(),
            cell(ring),
            cell(aws),
            ratio(ring, aws),
            ratio(ring_wall, aws_wall),
        );
        rows.push(json!({
            "id": case.id(),
            "case": case.label(),
            "ring_cpu_ns": ring,
            "aws_lc_cpu_ns": aws,
            "aws_lc_over_ring": ring.zip(aws).map(|(r, a)| a / r),
            "ring_wall_ns": ring_wall,
            "aws_lc_wall_ns": aws_wall,
            "aws_lc_over_ring_wall": ring_wall.zip(aws_wall).map(|(r, a)| a / r),
            "ring_cpu_samples_ns": of(Provider::Ring, cpu),
            "aws_lc_cpu_samples_ns": of(Provider::AwsLc, cpu),
        }));
    }
    println!();
    println!(
        "{}",
        json!({
            "bench": "tls-provider-bench",
            "rounds": rounds,
            "batch_ms": batch.as_millis() as u64,
            "cpu": cpu_model(),
            "cpu_flags": cpu_flags(),
            "cases": rows,
        })
    );
    Ok(())
}

/// One table cell: time per operation, and for byte rows ns/KiB and GiB/s;
/// handshakes also per second.
fn describe(case: Case, ns: f64) -> String {
    match case {
        Case::Handshake { .. } | Case::RingwayHandshake => {
            format!("{:.1} µs ({:.0}/s)", ns / 1e3, 1e9 / ns)
        }
        Case::SealOpen { size, .. } => format!(
            "{:.0} ns ({:.1} ns/KiB)",
            ns,
            ns / (size as f64 / KIB as f64)
        ),
        _ => match case.bytes() {
            Some(bytes) => {
                let kib = bytes as f64 / KIB as f64;
                let gib_s = bytes as f64 / ns * 1e9 / (1u64 << 30) as f64;
                format!("{:.0} ns/KiB, {gib_s:.2} GiB/s", ns / kib)
            }
            None => format!("{ns:.0} ns/msg"),
        },
    }
}

/// The first `model name` of /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU flags the AES-GCM, SHA and big-number code paths choose by:
/// AES-NI, carry-less multiply, their 256/512-bit forms, AVX2 and AVX-512,
/// SHA extensions, BMI2 and ADX.
fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let Some(flags) = info.lines().find_map(|l| l.strip_prefix("flags")) else {
        return Vec::new();
    };
    let mut wanted: Vec<String> = flags
        .trim_start_matches([' ', '\t', ':'])
        .split_whitespace()
        .filter(|f| {
            matches!(
                *f,
                "aes"
                    | "pclmulqdq"
                    | "vaes"
                    | "vpclmulqdq"
                    | "avx"
                    | "avx2"
                    | "sha_ni"
                    | "bmi2"
                    | "adx"
            ) || f.starts_with("avx512")
        })
        .map(str::to_string)
        .collect();
    wanted.sort();
    wanted
}
