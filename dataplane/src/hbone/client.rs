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

use super::pool::{Lease, PoolKey, PooledConn};
use super::with_timeout;
use crate::runtime::CoreInputs;
use crate::socket;
use crate::stream::FdStream;

/// Why an HBONE stream could not be opened. Clone: a failed single-flight
/// connect is reported to every request that waited on it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HboneError {
    #[error("no certificate for source identity {0} (fail closed)")]
    NoCertificate(Identity),
    #[error("connect to {0} failed: {1}")]
    Connect(SocketAddr, String),
    #[error(
        "connect to {0} timed out; is something (e.g. a NetworkPolicy) blocking HBONE port 15008?"
    )]
    ConnectTimeout(SocketAddr),
    #[error("TLS handshake with {0} failed: {1}")]
    Tls(SocketAddr, String),
    #[error("server at {addr} is {got}, expected {expected}")]
    IdentityMismatch {
        addr: SocketAddr,
        expected: Identity,
        got: String,
    },
    #[error("HTTP/2 with {0} failed: {1}")]
    H2(SocketAddr, String),
    #[error("CONNECT {0} answered {1}")]
    Status(SocketAddr, StatusCode),
    #[error("the request that was opening this connection went away")]
    Cancelled,
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

/// Opens a CONNECT stream for `t`, reusing or creating a pooled connection.
///
/// A pooled connection can die between two uses (peer restarted, idle
/// timeout on the other side) before its driver notices. If the stream
/// fails on such a connection before the peer accepted it, nothing reached
/// the destination: mark the connection broken and retry once on another.
pub async fn open(core: &Rc<CoreInputs>, t: Tunnel<'_>) -> Result<OpenStream, HboneError> {
    let key = PoolKey {
        src: t.src_identity.clone(),
        dst: t.dst_identity.clone(),
        peer: t.peer,
        pod: t.pod.clone(),
    };
    let mut retried = false;
    loop {
        let lease = core.pool.lease(&key, |id| connect(core, &key, id)).await?;
        let reused = lease.conn.streams_opened() > 0;
        match open_on(core, &t, lease).await {
            Err(Attempt::ConnectionDead(e)) if reused && !retried => {
                tracing::debug!(error = %e, "pooled HBONE connection was dead; retrying on a new one");
                retried = true;
            }
            Err(Attempt::ConnectionDead(e)) | Err(Attempt::Failed(e)) => return Err(e),
            Ok(s) => return Ok(s),
        }
    }
}

enum Attempt {
    /// The connection failed before the peer took the stream.
    ConnectionDead(HboneError),
    Failed(HboneError),
}

async fn open_on(
    core: &Rc<CoreInputs>,
    t: &Tunnel<'_>,
    lease: Lease,
) -> Result<OpenStream, Attempt> {
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
    // Connection-level failures (I/O, GOAWAY, refused stream) mean the peer
    // never acted on the request.
    let classify = |e: h2::Error| {
        let dead = e.is_io() || e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM);
        if dead {
            lease.conn.broken.set(true);
            Attempt::ConnectionDead(HboneError::H2(peer, e.to_string()))
        } else {
            Attempt::Failed(HboneError::H2(peer, e.to_string()))
        }
    };
    let mut sender = lease.conn.sender().ready().await.map_err(classify)?;
    let (response, send) = sender.send_request(req, false).map_err(classify)?;
    let response = match with_timeout(core.cfg.connect.timeout, response).await {
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

/// TCP connect → mTLS (source identity's client config, no SNI) → verify
/// the server identity → HTTP/2 handshake → driver task with keepalive.
async fn connect(core: &Rc<CoreInputs>, key: &PoolKey, id: u64) -> Result<PooledConn, HboneError> {
    let addr = key.peer;
    let tls = core
        .cert_for(&key.src)
        .await
        .ok_or_else(|| HboneError::NoCertificate(key.src.clone()))?;
    let netns = key.pod.as_ref().map(|p| p.0.netns());
    let connecting = socket::connect_from(&core.poller, addr, core.cfg.connect, None, netns);
    let tcp = match connecting.await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            return Err(HboneError::ConnectTimeout(addr))
        }
        Err(e) => return Err(HboneError::Connect(addr, e.to_string())),
    };
    let stream = FdStream::new(tcp, core.poller.clone());
    let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
    let server_name = ServerName::IpAddress(key.peer.ip().into());
    let tls_stream = match with_timeout(
        core.cfg.handshake_timeout,
        connector.connect(server_name, stream),
    )
    .await
    {
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
    let s = core.cfg.h2;
    let handshake = h2::client::Builder::new()
        .initial_window_size(s.stream_window)
        .initial_connection_window_size(s.connection_window)
        .max_frame_size(s.max_frame_size)
        .max_header_list_size(16 << 10)
        .enable_push(false)
        .handshake::<_, Bytes>(tls_stream);
    let (sender, mut connection) = match with_timeout(core.cfg.handshake_timeout, handshake).await {
        None => return Err(HboneError::H2(addr, "handshake timed out".into())),
        Some(Err(e)) => return Err(HboneError::H2(addr, e.to_string())),
        Some(Ok(pair)) => pair,
    };
    let broken = Rc::new(Cell::new(false));
    let ping_pong = connection.ping_pong();
    let cfg = core.pool.cfg;
    let driver_broken = broken.clone();
    let core_index = core.index;
    crate::executor::spawn_detached(async move {
        let keepalive = async {
            let Some(mut pp) = ping_pong else {
                return std::future::pending::<String>().await;
            };
            loop {
                crate::executor::timer::sleep(cfg.ping_interval).await;
                match with_timeout(cfg.ping_timeout, pp.ping(h2::Ping::opaque())).await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return format!("keepalive PING failed: {e}"),
                    None => return format!("keepalive PING unanswered for {:?}", cfg.ping_timeout),
                }
            }
        };
        let why = futures_lite::future::or(
            async {
                match (&mut connection).await {
                    Ok(()) => "closed".to_string(),
                    Err(e) => e.to_string(),
                }
            },
            keepalive,
        )
        .await;
        driver_broken.set(true);
        tracing::debug!(core = core_index, conn = id, %addr, why, "HBONE connection ended");
    });
    tracing::debug!(core = core.index, conn = id, %addr, src = %key.src, dst = %key.dst, "HBONE connection established");
    Ok(PooledConn::new(id, sender, broken))
}

/// How long a pooled connection may sit unused; exposed for the reaper.
pub fn reap_interval(idle: Duration) -> Duration {
    (idle / 10).clamp(Duration::from_secs(1), Duration::from_secs(30))
}
