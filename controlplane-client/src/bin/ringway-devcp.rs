//! `ringway-devcp`: a development control plane. Serves a YAML mesh config
//! (ztunnel's LOCAL_XDS schema) over Delta ADS, and the Istio CA service,
//! on one gRPC port, over TLS with a certificate from a local CA.
//!
//! ```text
//! ringway-devcp --config mesh.yaml [--listen 127.0.0.1:15012] [--ca-dir ./devcp-ca]
//!               [--trust-domain cluster.local] [--server-name NAME]... [--server-ip IP]...
//!               [--plaintext] [--no-ca] [--poll-interval-ms 500]
//! ```
//!
//! Edits to the config file are pushed to every connected client as deltas.
//! Clients trust `<ca-dir>/root-cert.pem`. For Istio's ztunnel set
//! `XDS_ADDRESS`/`CA_ADDRESS=https://localhost:15012` and
//! `XDS_ROOT_CA`/`CA_ROOT_CA=<ca-dir>/root-cert.pem` (details in
//! `ringway_controlplane::devcp`). No authentication: test networks only.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ringway_controlplane::devcp::{self, ads, ca::DevCaOptions, Router};
use ringway_controlplane::security::ca::ROOT_CERT_FILE;
use ringway_controlplane::BuiltinCa;

#[derive(Parser, Debug)]
#[command(
    name = "ringway-devcp",
    version,
    about = "Development control plane: Delta ADS + Istio CA from a YAML file"
)]
struct Args {
    /// Mesh config to serve (ztunnel LOCAL_XDS YAML); re-read when it changes.
    #[arg(long, env = "DEVCP_CONFIG")]
    config: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:15012")]
    listen: SocketAddr,
    /// CA directory (Istio cacerts layout); a new root is generated there
    /// when it holds no CA files.
    #[arg(long, default_value = "./devcp-ca")]
    ca_dir: PathBuf,
    /// Trust domain the CA signs for.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// DNS names on the server certificate (repeatable).
    #[arg(long = "server-name", default_values_t = ["istiod.istio-system.svc".to_string(), "localhost".to_string()])]
    server_names: Vec<String>,
    /// Extra IP addresses on the server certificate (the listen IP is always
    /// included; for 0.0.0.0 / :: the loopback addresses are).
    #[arg(long = "server-ip")]
    server_ips: Vec<IpAddr>,
    /// Serve plaintext HTTP/2 (h2c) instead of TLS.
    #[arg(long)]
    plaintext: bool,
    /// Do not serve the CA (IstioCertificateService).
    #[arg(long)]
    no_ca: bool,
    /// How often the config file is checked for changes.
    #[arg(long, default_value_t = 500)]
    poll_interval_ms: u64,
    /// Lifetime of the server certificate (minted at every start).
    #[arg(long, default_value_t = 30)]
    server_cert_days: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringway-devcp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringway-devcp: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    // ring is the only provider compiled in; make it the process default so
    // every rustls config (tonic's included) uses it.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let dev_ads = ads::load_file(&args.config)?;
    let config = dev_ads.config();
    tracing::info!(
        path = %args.config.display(),
        addresses = config.names(ringway_controlplane::sources::xds::ADDRESS_TYPE_URL).len(),
        policies = config.names(ringway_controlplane::sources::xds::AUTHORIZATION_TYPE_URL).len(),
        "serving config"
    );

    let needs_ca = !args.no_ca || !args.plaintext;
    let ca = if needs_ca {
        let ca = BuiltinCa::load_or_create(&args.ca_dir, &args.trust_domain)
            .map_err(|e| e.to_string())?;
        tracing::info!(
            root = %args.ca_dir.join(ROOT_CERT_FILE).display(),
            trust_domain = %args.trust_domain,
            "CA loaded; clients must trust the root"
        );
        Some(Arc::new(ca))
    } else {
        None
    };

    let cert = match (&ca, args.plaintext) {
        (Some(ca), false) => {
            let mut ips = args.server_ips.clone();
            let listen_ip = args.listen.ip();
            if listen_ip.is_unspecified() {
                ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
                ips.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
            } else {
                ips.push(listen_ip);
            }
            ips.sort();
            ips.dedup();
            let cert = devcp::issue_server_cert(
                ca,
                &args.server_names,
                &ips,
                Duration::from_secs(args.server_cert_days * 24 * 60 * 60),
            )?;
            tracing::info!(names = ?args.server_names, ips = ?ips, "server certificate issued");
            Some(cert)
        }
        _ => None,
    };

    let ca_service = match (&ca, args.no_ca) {
        (Some(ca), false) => Some(devcp::ca::service(ca.clone(), DevCaOptions::default())),
        _ => None,
    };
    let router = Router::new(dev_ads.clone(), ca_service);

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", args.listen))?;
    tracing::info!(
        listen = %args.listen,
        tls = cert.is_some(),
        ca = !args.no_ca,
        "ringway-devcp ready"
    );
    let watcher = tokio::spawn(ads::watch_file(
        args.config.clone(),
        Duration::from_millis(args.poll_interval_ms.max(10)),
        dev_ads,
    ));
    let result = devcp::serve(listener, cert.as_ref(), router, std::future::pending()).await;
    watcher.abort();
    result.map_err(|e| format!("server: {e}"))
}
