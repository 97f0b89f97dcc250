//! Outbound HBONE: open a CONNECT stream to `target` on a pooled mTLS
//! HTTP/2 connection to the destination's HBONE port, presenting the
//! source workload's certificate and checking the server's SPIFFE identity
//! before any byte of the request is sent.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use ringway_controlplane::model::identity::Identity;
use rustls_pki_types::ServerName;

use ringway_controlplane::security::crl::{CrlStore, Side};

use super::pool::{Lease, Pool, PoolConfig, PoolKey, PooledConn};
use super::tls::Certificates;
pub use super::HboneError;
use super::{with_timeout, H2Settings};
use crate::hbone::revocation::{Revocations, Watching, REVOKED};
use crate::io::socket::{self, ConnectOpts};
use crate::io::stream::FdStream;
use crate::io::uring::Poller;

/// How a core's tunnels are dialled.
#[derive(Clone, Copy, Debug)]
pub struct ClientSettings {
    /// The TCP connect to the peer's HBONE port; its timeout also bounds
    /// the wait for the CONNECT's answer.
    pub connect: ConnectOpts,
    /// TLS and HTTP/2 handshakes must complete within this.
    pub handshake_timeout: Duration,
    pub h2: H2Settings,
}

/// One core's outbound HBONE: its connection pool and what dialling a new
/// pooled connection needs. Core-local (!Send).
pub struct Client {
    pub pool: Pool,
    pub settings: ClientSettings,
    poller: Rc<Poller>,
    certs: Rc<Certificates>,
    /// The core's index, for the log.
    core: usize,
    /// The core's connections to re-check when a CRL is reloaded (inbound
    /// ones too: the core shares it).
    pub revocations: Rc<Revocations>,
}

/// Everything needed to open one tunnel.
pub struct Tunnel<'a> {
    pub src_identity: &'a Identity,
    pub dst_identity: &'a Identity,
    /// Where the mTLS connection goes: the destination's (or its
    /// waypoint's) HBONE port.
    pub peer: SocketAddr,
    /// What the CONNECT asks for (`:authority`): the endpoint and its
    /// target port, or a service VIP and port when going through a
    /// waypoint.
    pub authority: SocketAddr,
    pub forwarded: String,
    pub baggage: String,
    pub traceparent: String,
    /// In-pod mode: the pod the tunnel leaves from.
    pub pod: Option<crate::inpod::PodNetns>,
}

/// An open CONNECT stream and the pool slot it occupies.
pub struct OpenStream {
    pub send: h2::SendStream<Bytes>,
    pub recv: h2::RecvStream,
    pub conn_id: u64,
    _lease: Lease,
}

impl Client {
    pub fn new(
        pool: Pool,
        settings: ClientSettings,
        poller: Rc<Poller>,
        certs: Rc<Certificates>,
        core: usize,
    ) -> Self {
        Client {
            pool,
            settings,
            poller,
            certs,
            core,
            revocations: Rc::default(),
        }
    }

    /// Opens a CONNECT stream for `t`, reusing or creating a pooled
    /// connection.
    ///
    /// A pooled connection can die between two uses (peer restarted, idle
    /// timeout on the other side) before its driver notices. If the stream
    /// fails on such a connection before the peer accepted it, nothing
    /// reached the destination: mark the connection broken and retry once
    /// on another.
    pub async fn open(&self, t: Tunnel<'_>) -> Result<OpenStream, HboneError> {
        let key = PoolKey {
            src: t.src_identity.clone(),
            dst: t.dst_identity.clone(),
            peer: t.peer,
            pod: t.pod.clone(),
        };
        let mut retried = false;
        loop {
            let lease = self.pool.lease(&key, |id| self.connect(&key, id)).await?;
            let reused = lease.conn.streams_opened() > 0;
            match self.open_on(&t, lease).await {
                Err(Attempt::ConnectionDead(e)) if reused && !retried => {
                    tracing::debug!(error = %e, "pooled HBONE connection was dead; retrying on a new one");
                    retried = true;
                }
                Err(Attempt::ConnectionDead(e)) | Err(Attempt::Failed(e)) => return Err(e),
                Ok(s) => return Ok(s),
            }
        }
    }

    async fn open_on(&self, t: &Tunnel<'_>, lease: Lease) -> Result<OpenStream, Attempt> {
        let peer = t.peer;
        lease.conn.note_stream_opened();
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri(t.authority.to_string())
            .header("forwarded", t.forwarded.as_str())
            .header("traceparent", t.traceparent.as_str());
        let req = if t.baggage.is_empty() {
            req
        } else {
            req.header("baggage", t.baggage.as_str())
        };
        let req = req
            .body(())
            .map_err(|e| Attempt::Failed(HboneError::H2(peer, e.to_string())))?;
        // Connection-level failures (I/O, GOAWAY, refused stream) mean the
        // peer never acted on the request.
        let classify = |e: h2::Error| {
            let dead =
                e.is_io() || e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM);
            if dead {
                lease.conn.broken.set(true);
                Attempt::ConnectionDead(HboneError::H2(peer, e.to_string()))
            } else {
                Attempt::Failed(HboneError::H2(peer, e.to_string()))
            }
        };
        let mut sender = lease.conn.sender().ready().await.map_err(classify)?;
        let (response, send) = sender.send_request(req, false).map_err(classify)?;
        let response = match with_timeout(self.settings.connect.timeout, response).await {
            None => return Err(Attempt::Failed(HboneError::ConnectTimeout(peer))),
            Some(r) => r.map_err(classify)?,
        };
        if response.status() != StatusCode::OK {
            return Err(Attempt::Failed(HboneError::Status(
                t.authority,
                response.status(),
            )));
        }
        Ok(OpenStream {
            send,
            recv: response.into_body(),
            conn_id: lease.conn.id,
            _lease: lease,
        })
    }

    /// TCP connect → mTLS (source identity's client config, no SNI) →
    /// verify the server identity → HTTP/2 handshake → driver task with
    /// keepalive.
    async fn connect(&self, key: &PoolKey, id: u64) -> Result<PooledConn, HboneError> {
        let addr = key.peer;
        let s = self.settings;
        let tls = self
            .certs
            .get(&key.src)
            .await
            .ok_or_else(|| HboneError::NoCertificate(key.src.clone()))?;
        let netns = key.pod.as_ref().map(|p| p.0.netns());
        let connecting = socket::connect_from(&self.poller, addr, s.connect, None, netns);
        let tcp = match connecting.await {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(HboneError::ConnectTimeout(addr))
            }
            Err(e) => return Err(HboneError::Connect(addr, e.to_string())),
        };
        let stream = FdStream::new(tcp, self.poller.clone());
        let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
        let server_name = ServerName::IpAddress(key.peer.ip().into());
        let tls_stream =
            match with_timeout(s.handshake_timeout, connector.connect(server_name, stream)).await {
                None => return Err(HboneError::Tls(addr, "handshake timed out".into())),
                Some(Err(e)) => return Err(HboneError::Tls(addr, e.to_string())),
                Some(Ok(s)) => s,
            };
        // The client config is shared by every destination, so the expected
        // identity is checked here, before the request goes out.
        match super::peer_identity(tls_stream.get_ref().1, "server") {
            Ok(got) if got == key.dst => {}
            Ok(got) => {
                return Err(HboneError::IdentityMismatch {
                    addr,
                    expected: key.dst.clone(),
                    got: got.to_string(),
                })
            }
            Err(e) => {
                return Err(HboneError::IdentityMismatch {
                    addr,
                    expected: key.dst.clone(),
                    got: e,
                })
            }
        }
        // With a CRL in force: what a reloaded one needs to revoke this
        // peer (a connection that fails below unregisters as it drops).
        let broken = Rc::new(Cell::new(false));
        let crl = self.revocations.watch(
            CrlStore::global(),
            Side::Outbound,
            tls_stream.get_ref().1.peer_certificates(),
            Some(broken.clone()),
        );
        let handshake = h2::client::Builder::new()
            .initial_window_size(s.h2.stream_window)
            .initial_connection_window_size(s.h2.connection_window)
            .max_frame_size(s.h2.max_frame_size)
            .max_header_list_size(16 << 10)
            .enable_push(false)
            .handshake::<_, Bytes>(tls_stream);
        let (sender, connection) = match with_timeout(s.handshake_timeout, handshake).await {
            None => return Err(HboneError::H2(addr, "handshake timed out".into())),
            Some(Err(e)) => return Err(HboneError::H2(addr, e.to_string())),
            Some(Ok(pair)) => pair,
        };
        crate::io::executor::spawn_detached(drive(
            connection,
            self.pool.cfg,
            broken.clone(),
            crl,
            self.core,
            id,
            addr,
        ));
        tracing::debug!(core = self.core, conn = id, %addr, src = %key.src, dst = %key.dst, "HBONE connection established");
        Ok(PooledConn::new(id, sender, broken))
    }
}

enum Attempt {
    /// The connection failed before the peer took the stream.
    ConnectionDead(HboneError),
    Failed(HboneError),
}

/// A pooled connection's driver: runs its HTTP/2 connection and the
/// keepalive PINGs until either ends, or a reloaded CRL revokes the peer
/// (`crl`), then marks it `broken`.
async fn drive<T>(
    mut connection: h2::client::Connection<T, Bytes>,
    cfg: PoolConfig,
    broken: Rc<Cell<bool>>,
    crl: Option<Watching>,
    core: usize,
    id: u64,
    addr: SocketAddr,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let ping_pong = connection.ping_pong();
    let keepalive = async {
        let Some(mut pp) = ping_pong else {
            return std::future::pending::<String>().await;
        };
        loop {
            crate::io::executor::timer::sleep(cfg.ping_interval).await;
            match with_timeout(cfg.ping_timeout, pp.ping(h2::Ping::opaque())).await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return format!("keepalive PING failed: {e}"),
                None => return format!("keepalive PING unanswered for {:?}", cfg.ping_timeout),
            }
        }
    };
    let revoked = async {
        match &crl {
            Some(w) => w.revoked.wait().await,
            None => std::future::pending().await,
        }
    };
    let ended = futures_lite::future::or(
        async {
            match (&mut connection).await {
                Ok(()) => "closed".to_string(),
                Err(e) => e.to_string(),
            }
        },
        keepalive,
    );
    let why = futures_lite::future::or(ended, async {
        revoked.await;
        REVOKED.to_string()
    })
    .await;
    broken.set(true);
    if crl.as_ref().is_some_and(|w| w.revoked.is_set()) {
        // Dropping the connection closes it, and its streams with it.
        tracing::info!(core, conn = id, %addr, why, "HBONE connection closed");
    } else {
        tracing::debug!(core, conn = id, %addr, why, "HBONE connection ended");
    }
}

/// How long a pooled connection may sit unused; exposed for the reaper.
pub fn reap_interval(idle: Duration) -> Duration {
    (idle / 10).clamp(Duration::from_secs(1), Duration::from_secs(30))
}
