//! HBONE, the protocol: TCP carried in HTTP/2 CONNECT streams over mTLS.
//! The traffic paths that speak it (the 15008 listener, outbound tunnels)
//! are in `proxy/`; this layer knows nothing of them.
//!
//! - [`client`]: a core's outbound side: opens CONNECT streams on pooled
//!   connections.
//! - [`pool`]: per-core connection pool keyed by {source identity,
//!   destination identity, destination IP}.
//! - [`tls`]: a core's certificates, for both directions.
//! - [`proxy_header`]: the PROXY v2 header of application tunnels.
//! - [`revocation`]: a core's open HBONE connections by peer chain, closed
//!   when a reloaded CRL revokes their peer.
//! - [`gate`]: holds back an h2 connection's reads (the core's memory
//!   budget decides when).
//!
//! This module holds what both directions share: HTTP/2 settings, the
//! stream ⇄ socket pump with correct flow control and FIN/RST mapping, and
//! the HBONE request headers.

pub mod client;
pub mod gate;
pub mod liveness;
pub mod pool;
pub mod proxy_header;
pub mod revocation;
pub mod tls;

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::{Reason, RecvStream, SendStream};
use http::StatusCode;
use ringway_controlplane::model::identity::Identity;

use crate::io::count::ByteCount;
use crate::io::socket;
use crate::io::stream::ReadSizer;
use crate::io::uring::{Poller, Registration, RingSocket};

use self::gate::Released;

/// HTTP/2 tuning (ztunnel's defaults; 64 KiB windows cripple throughput).
#[derive(Clone, Copy, Debug)]
pub struct H2Settings {
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame_size: u32,
}

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            stream_window: 4 << 20,
            connection_window: 16 << 20,
            max_frame_size: 1 << 20,
        }
    }
}

/// Bytes read from the plain socket per DATA chunk while data streams.
const READ_CHUNK: usize = 256 << 10;

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

/// How a tunnelled connection ended.
#[derive(Debug)]
pub enum PumpOutcome {
    /// Both directions finished (FIN ⇄ END_STREAM).
    Closed,
    /// The plain TCP side reset or failed; the stream was reset.
    TcpReset(String),
    /// The tunnel side reset the stream or the HTTP/2 connection broke;
    /// the plain socket was reset.
    TunnelReset(String),
}

impl PumpOutcome {
    pub fn describe(&self) -> String {
        match self {
            PumpOutcome::Closed => "closed".into(),
            PumpOutcome::TcpReset(e) => format!("reset by plain-TCP side: {e}"),
            PumpOutcome::TunnelReset(e) => format!("reset by tunnel side: {e}"),
        }
    }
}

/// Moves bytes between the plain socket `fd` and an HBONE stream until
/// both directions end. TCP FIN ⇄ END_STREAM, TCP RST ⇄ RST_STREAM
/// (CONNECT_ERROR, as RFC 9113 §8.5 asks for a reset TCP connection).
/// `to_tunnel` / `from_tunnel` count payload bytes as they move (handed to
/// h2, or queued on the socket); `released`, when given, hears of every
/// window given back.
///
/// Not an `async fn`: a tunnel's task keeps this future for the tunnel's
/// life, and one state machine holding both I/O modes' futures is as large
/// as their sum in places; each mode's own is boxed at its own size.
pub fn pump<'a>(
    poller: &'a Rc<Poller>,
    fd: RawFd,
    send: SendStream<Bytes>,
    recv: RecvStream,
    to_tunnel: &'a ByteCount,
    from_tunnel: &'a ByteCount,
    released: Option<&'a dyn Released>,
) -> std::pin::Pin<Box<dyn Future<Output = PumpOutcome> + 'a>> {
    let from_tunnel: Reports<'a> = (from_tunnel, released);
    if poller.completion() {
        Box::pin(pump_ring(poller, fd, send, recv, to_tunnel, from_tunnel))
    } else {
        Box::pin(pump_ready(poller, fd, send, recv, to_tunnel, from_tunnel))
    }
}

/// Where the tunnel → socket direction reports: its byte count, and who
/// hears of released window.
type Reports<'a> = (&'a ByteCount, Option<&'a dyn Released>);

/// The tunnel → socket direction's reports, and the stream's send half,
/// watched for a reset while the workload's socket has no room.
type FromTunnel<'a> = (
    &'a ByteCount,
    Option<&'a dyn Released>,
    &'a RefCell<SendStream<Bytes>>,
);

/// Resolves when the stream is reset or its connection is gone: a tunnel
/// waiting on a workload that does not read would otherwise never learn
/// it, and keep what h2 holds for it (and its socket) for good.
async fn stream_gone(send: &RefCell<SendStream<Bytes>>) -> PumpOutcome {
    let why = futures_lite::future::poll_fn(|cx| send.borrow_mut().poll_reset(cx)).await;
    match why {
        Ok(reason) => PumpOutcome::TunnelReset(format!("stream reset by peer: {reason}")),
        Err(e) => PumpOutcome::TunnelReset(e.to_string()),
    }
}

/// Waits for `room` unless the stream goes first.
async fn room_or_gone(
    room: impl Future<Output = std::io::Result<()>>,
    send: &RefCell<SendStream<Bytes>>,
) -> Result<(), PumpOutcome> {
    let room = async { room.await.map_err(|e| PumpOutcome::TcpReset(e.to_string())) };
    futures_lite::future::or(room, async { Err(stream_gone(send).await) }).await
}

async fn pump_ring(
    poller: &Rc<Poller>,
    fd: RawFd,
    send: SendStream<Bytes>,
    mut recv: RecvStream,
    to_tunnel: &ByteCount,
    (from_tunnel, released): Reports<'_>,
) -> PumpOutcome {
    let send = RefCell::new(send);
    let sock = RingSocket::new(poller, fd, poller.caps());
    // Both directions until both are done or one fails. `try_zip` holds
    // each direction's future in place: an `async fn` taking them would
    // keep each twice (as passed, and pinned in its body) for the tunnel's
    // life (992 bytes then, this future).
    let failure = futures_lite::future::try_zip(
        ring_socket_to_stream(&sock, &send, to_tunnel),
        ring_stream_to_socket(&sock, &mut recv, (from_tunnel, released, &send)),
    )
    .await
    .err();
    drop(sock);
    finish(failure, &send, fd)
}

async fn pump_ready(
    poller: &Rc<Poller>,
    fd: RawFd,
    send: SendStream<Bytes>,
    mut recv: RecvStream,
    to_tunnel: &ByteCount,
    (from_tunnel, released): Reports<'_>,
) -> PumpOutcome {
    let send = RefCell::new(send);
    let reg = Registration::new(poller, fd);
    // As in pump_ring.
    let failure = futures_lite::future::try_zip(
        socket_to_stream(&reg, &send, to_tunnel),
        stream_to_socket(&reg, &mut recv, (from_tunnel, released, &send)),
    )
    .await
    .err();
    drop(reg);
    finish(failure, &send, fd)
}

/// How the pump ended, with the reset passed on to the other side.
fn finish(
    failure: Option<PumpOutcome>,
    send: &RefCell<SendStream<Bytes>>,
    fd: RawFd,
) -> PumpOutcome {
    match failure {
        None => PumpOutcome::Closed,
        Some(outcome) => {
            match &outcome {
                PumpOutcome::TcpReset(_) => send.borrow_mut().send_reset(Reason::CONNECT_ERROR),
                PumpOutcome::TunnelReset(_) => socket::set_reset_on_close(fd),
                PumpOutcome::Closed => {}
            }
            outcome
        }
    }
}

/// Sends `data` as DATA frames, as the peer's flow-control window allows
/// (reserve, wait for capacity, send at most that much).
async fn send_windowed(
    send: &RefCell<SendStream<Bytes>>,
    mut data: Bytes,
    moved: &ByteCount,
) -> Result<(), PumpOutcome> {
    while !data.is_empty() {
        send.borrow_mut().reserve_capacity(data.len());
        let cap = futures_lite::future::poll_fn(|cx| send.borrow_mut().poll_capacity(cx)).await;
        let cap = match cap {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(PumpOutcome::TunnelReset(e.to_string())),
            None => return Err(PumpOutcome::TunnelReset("stream closed by peer".into())),
        };
        if cap == 0 {
            continue;
        }
        let chunk = data.split_to(cap.min(data.len()));
        let len = chunk.len() as u64;
        send.borrow_mut()
            .send_data(chunk, false)
            .map_err(|e| PumpOutcome::TunnelReset(e.to_string()))?;
        moved.add(len);
    }
    Ok(())
}

/// Plain socket → DATA frames, completion mode: every piece the ring has
/// received (up to [`READ_CHUNK`]) becomes one payload. While h2 has no
/// window, the socket keeps receiving up to its cap, then stops, and the
/// TCP window closes.
async fn ring_socket_to_stream(
    sock: &RingSocket,
    send: &RefCell<SendStream<Bytes>>,
    moved: &ByteCount,
) -> Result<(), PumpOutcome> {
    loop {
        let first = match sock.recv().await {
            Ok(Some(p)) => p,
            Ok(None) => {
                send.borrow_mut()
                    .send_data(Bytes::new(), true)
                    .map_err(|e| PumpOutcome::TunnelReset(e.to_string()))?;
                return Ok(());
            }
            Err(e) => return Err(PumpOutcome::TcpReset(e.to_string())),
        };
        // A fresh buffer per payload, dropped with it: h2 keeps what it
        // sends until written, so a buffer kept across the wait would keep
        // the last payload's memory alive on every idle tunnel.
        let mut buf = BytesMut::from(&first[..]);
        drop(first);
        while buf.len() < READ_CHUNK {
            match sock.try_recv() {
                Some(p) => buf.extend_from_slice(&p),
                None => break,
            }
        }
        send_windowed(send, buf.freeze(), moved).await?;
        crate::io::executor::yield_if_needed().await;
    }
}

/// DATA frames → plain socket, completion mode: each payload is queued as
/// it is (no copy) and window is released once the socket's queue has
/// room, so a slow reader back-pressures the sender at the socket's cap.
async fn ring_stream_to_socket(
    sock: &RingSocket,
    recv: &mut RecvStream,
    (moved, released, send): FromTunnel<'_>,
) -> Result<(), PumpOutcome> {
    loop {
        match recv.data().await {
            None => {
                sock.flushed()
                    .await
                    .map_err(|e| PumpOutcome::TcpReset(e.to_string()))?;
                let _ = socket::shutdown_write(sock.fd());
                return Ok(());
            }
            Some(Ok(data)) => {
                room_or_gone(sock.room(), send).await?;
                let n = data.len();
                sock.send(data);
                moved.add(n as u64);
                let _ = recv.flow_control().release_capacity(n);
                if let Some(r) = released {
                    r.released(sock.queued());
                }
            }
            Some(Err(e)) => return Err(PumpOutcome::TunnelReset(e.to_string())),
        }
    }
}

/// Plain socket → DATA frames, readiness mode.
async fn socket_to_stream(
    reg: &Registration,
    send: &RefCell<SendStream<Bytes>>,
    moved: &ByteCount,
) -> Result<(), PumpOutcome> {
    let mut buf = BytesMut::new();
    let mut sizer = ReadSizer::new(READ_CHUNK);
    loop {
        if let Err(e) = reg.readable().await {
            return Err(PumpOutcome::TcpReset(e.to_string()));
        }
        let n = match sizer.read(reg.fd(), &mut buf) {
            Ok(n) => {
                if sizer.was_short() {
                    reg.drained();
                }
                n
            }
            Err(e) if socket::would_block(&e) => {
                // Idle: hold no buffer while waiting.
                buf = BytesMut::new();
                reg.drained();
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(PumpOutcome::TcpReset(e.to_string())),
        };
        if n == 0 {
            send.borrow_mut()
                .send_data(Bytes::new(), true)
                .map_err(|e| PumpOutcome::TunnelReset(e.to_string()))?;
            return Ok(());
        }
        send_windowed(send, buf.split().freeze(), moved).await?;
        if sizer.was_short() {
            // Drained: the next read waits; hold no buffer meanwhile.
            buf = BytesMut::new();
        }
        crate::io::executor::yield_if_needed().await;
    }
}

/// DATA frames → plain socket, readiness mode; window released only after
/// the bytes are written, so a slow reader back-pressures the sender.
async fn stream_to_socket(
    reg: &Registration,
    recv: &mut RecvStream,
    (moved, released, send): FromTunnel<'_>,
) -> Result<(), PumpOutcome> {
    loop {
        match recv.data().await {
            None => {
                let _ = socket::shutdown_write(reg.fd());
                return Ok(());
            }
            Some(Ok(data)) => {
                room_or_gone(crate::io::stream::write_all(reg, &data), send).await?;
                moved.add(data.len() as u64);
                let _ = recv.flow_control().release_capacity(data.len());
                if let Some(r) = released {
                    // Written: nothing of it is held any more.
                    r.released(0);
                }
            }
            Some(Err(e)) => return Err(PumpOutcome::TunnelReset(e.to_string())),
        }
    }
}

/// The SPIFFE identity in the peer's verified certificate; `side` names
/// the peer in the error ("client", "server").
pub fn peer_identity<D>(
    conn: &tokio_rustls::rustls::ConnectionCommon<D>,
    side: &str,
) -> Result<ringway_controlplane::model::identity::Identity, String> {
    let certs = conn
        .peer_certificates()
        .ok_or_else(|| format!("no {side} certificate"))?;
    ringway_controlplane::security::tls::peer_identity(certs).map_err(|e| e.to_string())
}

/// `forwarded: for="<ip:port>"` (RFC 7239 quoting; IPv6 in brackets),
/// with `;host=<hostname>` when the client dialled a service, as ztunnel
/// sends it.
pub fn forwarded(client: SocketAddr, host: Option<&str>) -> String {
    match host {
        Some(h) => format!("for=\"{client}\";host={h}"),
        None => format!("for=\"{client}\""),
    }
}

/// Extracts the `for=` address from a `forwarded` header, if present.
pub fn parse_forwarded_for(value: &str) -> Option<String> {
    forwarded_param(value, "for").map(str::to_owned)
}

/// The value of parameter `name` (`for`, `host`) in a `forwarded` header,
/// unquoted.
pub fn forwarded_param<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    value.split([';', ',']).find_map(|part| {
        let (k, v) = part.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"'))
    })
}

/// A W3C traceparent for a new connection: version 00, random trace and
/// span ids, not sampled.
pub fn new_traceparent() -> String {
    format!(
        "00-{:016x}{:016x}-{:016x}-00",
        fastrand::u64(..),
        fastrand::u64(1..),
        fastrand::u64(1..)
    )
}

/// True when `v` is a well-formed traceparent.
pub fn valid_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    parts.len() == 4
        && parts[0].len() == 2
        && parts[1].len() == 32
        && parts[2].len() == 16
        && parts[3].len() == 2
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// ztunnel's baggage for a source workload: `k8s.cluster.name`,
/// `k8s.namespace.name`, `k8s.<type>.name`, `service.name`,
/// `service.version`, locality; empty values omitted.
pub fn baggage(w: &ringway_controlplane::model::Workload) -> String {
    use ringway_controlplane::model::WorkloadType;
    let kind = match w.workload_type {
        WorkloadType::Deployment => "deployment",
        WorkloadType::CronJob => "cronjob",
        WorkloadType::Pod => "pod",
        WorkloadType::Job => "job",
    };
    let kind_key = format!("k8s.{kind}.name");
    let workload_name = if w.workload_name.is_empty() {
        &*w.name
    } else {
        &*w.workload_name
    };
    let (region, zone) = w
        .locality
        .as_ref()
        .map(|l| (l.region.as_str(), l.zone.as_str()))
        .unwrap_or(("", ""));
    let pairs: [(&str, &str); 7] = [
        ("k8s.cluster.name", &w.cluster_id),
        ("k8s.namespace.name", &w.namespace),
        (&kind_key, workload_name),
        ("service.name", &w.canonical_name),
        ("service.version", &w.canonical_revision),
        ("cloud.region", region),
        ("cloud.availability_zone", zone),
    ];
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a baggage header into (key, value) pairs, ignoring properties.
pub fn parse_baggage(v: &str) -> Vec<(String, String)> {
    v.split(',')
        .filter_map(|member| {
            let kv = member.split(';').next()?;
            let (k, v) = kv.split_once('=')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Awaits `fut` for at most `dur` (the core's timer).
pub async fn with_timeout<T>(dur: Duration, fut: impl Future<Output = T>) -> Option<T> {
    crate::io::executor::timer::timeout(dur, fut).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_roundtrip() {
        let v4: SocketAddr = "10.0.0.1:41234".parse().unwrap();
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(forwarded(v4, None), "for=\"10.0.0.1:41234\"");
        let with_host = forwarded(v4, Some("server.b.svc.cluster.local"));
        assert_eq!(
            with_host,
            "for=\"10.0.0.1:41234\";host=server.b.svc.cluster.local"
        );
        assert_eq!(parse_forwarded_for(&with_host).unwrap(), "10.0.0.1:41234");
        assert_eq!(
            parse_forwarded_for(&forwarded(v6, None)).unwrap(),
            "[fd00::1]:80"
        );
        assert_eq!(
            parse_forwarded_for("for=\"10.0.1.5:41234\";host=server.b.svc.cluster.local").unwrap(),
            "10.0.1.5:41234"
        );
        assert_eq!(parse_forwarded_for("host=x"), None);
        let both = "for=\"10.0.1.5:41234\";host=server.b.svc.cluster.local";
        assert_eq!(
            forwarded_param(both, "host"),
            Some("server.b.svc.cluster.local")
        );
        assert_eq!(forwarded_param("for=1.2.3.4:5", "host"), None);
    }

    #[test]
    fn traceparents_are_valid_and_fresh() {
        let a = new_traceparent();
        let b = new_traceparent();
        assert!(valid_traceparent(&a), "{a}");
        assert_ne!(a, b);
        assert!(!valid_traceparent("00-xyz-1-00"));
    }

    #[test]
    fn baggage_format() {
        let w = ringway_controlplane::model::Workload {
            name: "client-abc".into(),
            namespace: "a".into(),
            cluster_id: "Kubernetes".into(),
            workload_name: "client".into(),
            canonical_name: "client".into(),
            canonical_revision: "v1".into(),
            ..Default::default()
        };
        let b = baggage(&w);
        assert_eq!(
            b,
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=a,k8s.deployment.name=client,service.name=client,service.version=v1"
        );
        let parsed = parse_baggage(&b);
        assert_eq!(parsed[1], ("k8s.namespace.name".into(), "a".into()));
    }
}

#[cfg(test)]
mod footprint {
    use super::*;

    fn future_size<A, B, C, D, E, G, F: Future>(_: fn(A, B, C, D, E, G) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    fn direction_size<A, B, C, F: Future>(_: fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Both ends of an open tunnel hold the pump's future (boxed) for the
    /// tunnel's whole life, so its size is memory per idle tunnel, twice.
    /// It was 992 bytes (completion mode) while an `async fn both` kept
    /// each direction's future twice; 608 at the time of writing (392 of
    /// them the two directions', the rest the pump's own state).
    #[test]
    fn an_idle_tunnel_holds_each_direction_once() {
        let ring = future_size(pump_ring);
        let directions =
            direction_size(ring_socket_to_stream) + direction_size(ring_stream_to_socket);
        assert!(
            ring <= directions + 256,
            "pump_ring's future is {ring} bytes for {directions} of directions: a doubled future?"
        );
        let ready = future_size(pump_ready);
        let directions = direction_size(socket_to_stream) + direction_size(stream_to_socket);
        assert!(
            ready <= directions + 256,
            "pump_ready's future is {ready} bytes for {directions} of directions: a doubled future?"
        );
    }
}
