//! Inbound HBONE (15008): terminate mTLS with the certificate of the local
//! workload that was dialled (chosen by destination IP: there is no SNI),
//! then serve HTTP/2 CONNECT streams to that workload.
//!
//! Phases, each with one failure response: pick the local workload and its
//! certificate (none → close), TLS + HTTP/2 handshakes (bounded by
//! `--handshake-timeout`), then per stream: validate the request (400),
//! find the local workload (503), authorize the peer identity (401, and
//! nothing reaches the application), connect (503), answer 200 and pump
//! bytes until either side ends or a later config denies the stream (late
//! rejection: the stream is reset).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::Reason;
use http::{Method, Request, Response, StatusCode};
use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::model::routing::{inbound_service_port, inbound_upstream};

use ringway_controlplane::security::crl::{CrlStore, Side};

use crate::core::authorization::{self, Inbound, Refused, Ticket};
use crate::hbone::revocation::REVOKED;

use crate::core::limits::{ConnDials, DialPermit, OverCap};
use crate::core::memory::StreamHeld;
use crate::core::{spawn_cancellable, CoreInputs};
use crate::hbone::gate::{Gated, ReadGate, Released};
use crate::hbone::liveness::{self, Liveness, OpenStream};
use crate::hbone::{self, pump, with_timeout, PumpOutcome};
use crate::inpod::is_pods_own;
use crate::io::idle::until_idle;
use crate::io::listener::TrafficPath;
use crate::io::socket;
use crate::io::stream::FdStream;
use crate::proxy::direct::{idle_closed, quiet};
use crate::proxy::downstream::timed_write_all;
use crate::telemetry::accesslog::{ConnLog, Names};
use crate::telemetry::metrics::{ConnLabels, Reporter};

/// Serves one TCP connection accepted on 15008.
pub async fn serve(core: Rc<CoreInputs>, conn: OwnedFd, mut log: ConnLog) {
    let fd = conn.as_raw_fd();
    let conn_src = match log.client_addr(conn.as_fd()) {
        Ok(a) => a,
        Err(e) => return log.fail(format!("cannot read the peer address: {e}")),
    };
    log.route = "hbone_connection";
    let dst = match socket::captured_dst(conn.as_fd(), Some(conn_src), true) {
        Ok(d) => d,
        Err(e) => return log.fail(format!("cannot read the destination: {e}")),
    };
    log.dst = Some(dst);

    // The certificate is the dialled workload's own: choose it by IP. In a
    // pod (in-pod mode) that must be the pod's own workload: a stale
    // address mapping must not make it present another's identity.
    let id = {
        let snap = core.snapshot();
        let Some(workload) = authorization::local_workload(&snap, &core.cfg, dst.ip()) else {
            socket::set_reset_on_close(fd);
            return log.fail(format!(
                "no local workload at {}: no certificate to present",
                dst.ip()
            ));
        };
        if let Err(why) = is_pods_own(log.pod.as_deref(), &snap, workload) {
            socket::set_reset_on_close(fd);
            return log.fail(why);
        }
        workload.identity()
    };
    log.dst_identity = Some(id.to_string());
    // The certificate wait counts against the handshake deadline: a peer
    // must not hold the socket for both in turn.
    let deadline = Instant::now() + core.cfg.handshake_timeout;
    let Some(Some(tls)) = with_timeout(core.cfg.handshake_timeout, core.certs.get(&id)).await
    else {
        socket::set_reset_on_close(fd);
        return log.fail(format!("no certificate for {id}; refusing (fail closed)"));
    };

    let stream = FdStream::new(conn, core.poller.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
    let left = deadline.saturating_duration_since(Instant::now());
    let tls_stream = match with_timeout(left, acceptor.accept(stream)).await {
        None => return log.fail("TLS handshake timed out"),
        Some(Err(e)) => return log.fail(format!("TLS handshake failed: {e}")),
        Some(Ok(s)) => s,
    };
    let peer = match hbone::peer_identity(tls_stream.get_ref().1, "client") {
        Ok(p) => Rc::new(p),
        Err(e) => return log.fail(format!("client identity: {e}")),
    };
    log.src_identity = Some(peer.to_string());
    // With a CRL in force: what a reloaded one needs to revoke this peer.
    let crl = core.revocations.watch(
        CrlStore::global(),
        Side::Inbound,
        tls_stream.get_ref().1.peer_certificates(),
        None,
    );

    // Its account under the core's memory budget: past it, a connection
    // holding much stops reading (core::memory).
    let memory = core.memory.connection(peer.clone());
    let gate = memory.clone().map(|m| m as Rc<dyn ReadGate>);
    let tls_stream = Gated::new(tls_stream, fd, gate.clone());

    let s = core.cfg.h2;
    let handshake = h2::server::Builder::new()
        .initial_window_size(s.stream_window)
        .initial_connection_window_size(s.connection_window)
        .max_frame_size(s.max_frame_size)
        .max_concurrent_streams(200)
        .max_header_list_size(64 << 10)
        .handshake::<_, Bytes>(tls_stream);
    // The preface under the same deadline as TLS: a peer that trickles
    // one and then the other must not hold the socket for both in turn.
    let left = deadline.saturating_duration_since(Instant::now());
    let mut h2 = match with_timeout(left, handshake).await {
        None => return log.fail("HTTP/2 handshake timed out"),
        Some(Err(e)) => return log.fail(format!("HTTP/2 handshake failed: {e}")),
        Some(Ok(c)) => c,
    };

    // One wait on the shutdown watch for the connection's life: the watch
    // is shared by every core, and a fresh wait per stream would take its
    // lock and register with its notifier each time.
    let mut shutdown = core.shutdown.clone();
    let shutdown_signal = async {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let mut shutdown_signal = std::pin::pin!(shutdown_signal);
    let mut streams = 0u64;
    let mut draining = false;
    let revoked = async {
        match &crl {
            Some(w) => w.revoked.wait().await,
            None => std::future::pending().await,
        }
    };
    let mut revoked = std::pin::pin!(revoked);
    // This connection's dials in flight and early resets.
    let dials = ConnDials::new(&core.cfg.dials);
    let calm = dials.calm.wait();
    let mut calm = std::pin::pin!(calm);
    // Time bounds (hbone::liveness): the SETTINGS ACK, keepalive, idle.
    let mut watch = h2
        .ping_pong()
        .map(|p| liveness::first_ping(p, core.cfg.handshake_timeout, gate.clone()));
    let open = Rc::new(std::cell::Cell::new(0usize));
    let mut ending = "closed";
    // Whether the connection window is shut for the memory budget.
    let mut window_shut = false;
    loop {
        let accepted =
            futures_lite::future::or(async { Event::Stream(h2.accept().await) }, async {
                if draining {
                    // Done once: never poll the finished signal again.
                    std::future::pending::<()>().await;
                }
                shutdown_signal.as_mut().await;
                Event::Shutdown
            });
        let alarms = futures_lite::future::or(
            async {
                revoked.as_mut().await;
                Event::Revoked
            },
            async {
                calm.as_mut().await;
                Event::Calm
            },
        );
        let alarms = futures_lite::future::or(alarms, async {
            match &memory {
                Some(m) => Event::Budget(m.paused_changed(window_shut).await),
                None => std::future::pending().await,
            }
        });
        let watched = async {
            match watch.as_mut() {
                Some(w) => Event::Liveness(w.as_mut().await),
                None => std::future::pending().await,
            }
        };
        let event =
            futures_lite::future::or(futures_lite::future::or(accepted, alarms), watched).await;
        match event {
            Event::Revoked => return close_revoked(&core, &peer, h2, log, streams).await,
            Event::Calm => return calm_down(&core, &peer, h2, log, streams).await,
            // Paused by the budget: no more window for the peer while its
            // reads are held back (so that resuming does not bring a burst),
            // the configured window again once it reads.
            Event::Budget(paused) => {
                window_shut = paused;
                h2.set_target_window_size(if paused { 0 } else { s.connection_window });
            }
            Event::Liveness((seen, pings)) => {
                let t = core.cfg.hbone_server;
                let stats = &core.metrics.stats;
                watch = None;
                match seen {
                    // Our SETTINGS still unacknowledged (see liveness).
                    Liveness::Answered if h2.set_initial_window_size(s.stream_window).is_err() => {
                        stats.hbone_settings_ack_timeouts.add(1);
                        return log.fail("answered a PING but did not ACK our SETTINGS: cut off");
                    }
                    Liveness::Answered => {
                        watch = Some(liveness::keepalive(pings, t, open.clone(), gate.clone()))
                    }
                    Liveness::NoSettingsAck => {
                        stats.hbone_settings_ack_timeouts.add(1);
                        return log.fail(format!(
                            "no SETTINGS ACK (PING answer) within {:?} (--handshake-timeout): cut off",
                            core.cfg.handshake_timeout
                        ));
                    }
                    Liveness::NoPong => {
                        stats.hbone_keepalive_timeouts.add(1);
                        return log.fail(format!(
                            "keepalive PING not answered within {:?} (--hbone-keepalive-timeout) after {streams} streams",
                            t.keepalive_timeout
                        ));
                    }
                    // Idle again while closing: the GOAWAY went unheeded.
                    Liveness::Idle if draining => break,
                    Liveness::Idle => {
                        stats.hbone_idle_closes.add(1);
                        ending = "closed idle (--hbone-idle-timeout)";
                        draining = true;
                        h2.graceful_shutdown();
                        watch = Some(liveness::keepalive(pings, t, open.clone(), gate.clone()));
                    }
                    Liveness::Gone => {}
                }
            }
            // Drain: GOAWAY, then keep serving the streams already open.
            Event::Shutdown => {
                draining = true;
                h2.graceful_shutdown();
            }
            Event::Stream(None) => break,
            Event::Stream(Some(Ok((mut request, mut respond)))) => {
                streams += 1;
                // Over a cap: refused before anything is looked at, and
                // without an access-log line each (a peer that floods
                // would flood the log); the counter keeps the full count.
                let permit = match DialPermit::take(
                    &core.cfg.dials,
                    &core.dials,
                    &dials,
                    &core.metrics.stats,
                ) {
                    Ok(p) => p,
                    Err(over) => {
                        respond.send_reset(Reason::REFUSED_STREAM);
                        refuse_over_cap(&core, &peer, over);
                        continue;
                    }
                };
                let stream_log = ConnLog::new(core.open.clone(), core.index, TrafficPath::Inbound)
                    .in_pod(log.pod.as_deref());
                // Counted from now: DATA the peer sends while the dial is in
                // flight is held too.
                let flow = request.body_mut().flow_control().clone();
                let held = memory.as_ref().map(|m| m.track(flow));
                let tunnel = admit(
                    &core, conn_src, dst, &peer, request, respond, stream_log, permit, held,
                );
                if let Some(tunnel) = tunnel {
                    let held = OpenStream::new(&open);
                    spawn_cancellable(&core, log.pod.as_deref().map(|p| &**p), async move {
                        let _held = held;
                        tunnel.await
                    });
                }
            }
            Event::Stream(Some(Err(e))) => {
                // h2's own guards (streams reset before they were accepted,
                // header floods) calm a peer too: counted with ringway's.
                if e.is_go_away() && e.is_library() && e.reason() == Some(Reason::ENHANCE_YOUR_CALM)
                {
                    core.metrics.stats.calm_goaways.add(1);
                }
                return log.fail(format!(
                    "HTTP/2 connection error after {streams} streams: {e}"
                ));
            }
        }
    }
    log.finish(format!("{ending} after {streams} streams"));
}

/// What the connection's loop waits for.
enum Event<T> {
    Stream(Option<Result<T, h2::Error>>),
    Shutdown,
    Revoked,
    Calm,
    /// The memory budget paused (true) or resumed the connection's reads.
    Budget(bool),
    /// The liveness watch ended (hbone::liveness), with the PING handle.
    Liveness((Liveness, h2::PingPong)),
}

/// Refuses a stream over a dial cap: REFUSED_STREAM rather than a 503,
/// because it tells the client (RFC 9113 §8.7) that nothing was done, so
/// a retry (on another connection, or later) is safe, and it costs no
/// HEADERS frame. Counted always, logged at most once a second per core.
fn refuse_over_cap(core: &CoreInputs, peer: &Identity, over: OverCap) {
    let stats = &core.metrics.stats;
    crate::core::limits::count_and_log(&stats.dials_refused, &core.dial_refusals_log, |n| {
        let (limit, flag) = match over {
            OverCap::Connection => (core.cfg.dials.per_connection, "--max-dials-per-connection"),
            OverCap::Core => (core.cfg.dials.per_core, "--max-dials-per-core"),
        };
        tracing::warn!(
            core = core.index,
            peer = %peer,
            suppressed = n,
            "inbound HBONE stream refused (REFUSED_STREAM): {limit} dials in flight \
             ({flag}); suppressed {n} such lines"
        );
    });
}

/// The peer reset too many streams before their answer: GOAWAY with
/// ENHANCE_YOUR_CALM, a second at most to send it, then the connection is
/// closed (its open tunnels with it).
async fn calm_down<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    core: &CoreInputs,
    peer: &Rc<Identity>,
    mut h2: h2::server::Connection<T, Bytes>,
    log: ConnLog,
    streams: u64,
) {
    let limit = core.cfg.dials.early_resets;
    crate::core::limits::count_and_log(&core.metrics.stats.calm_goaways, &core.calm_log, |n| {
        tracing::warn!(
            core = core.index,
            peer = %**peer,
            suppressed = n,
            "inbound HBONE connection sent GOAWAY (ENHANCE_YOUR_CALM): over {limit} streams \
             reset before their answer within 10 s (--max-early-resets); suppressed {n} such lines"
        );
    });
    h2.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
    let flush = async { while let Some(Ok(_)) = h2.accept().await {} };
    let _ = with_timeout(std::time::Duration::from_secs(1), flush).await;
    drop(h2);
    log.fail(format!(
        "GOAWAY (ENHANCE_YOUR_CALM): over {limit} streams reset before their answer, \
         after {streams} streams"
    ));
}

/// A reloaded CRL revoked the peer: its streams are reset (each logging
/// why), then the connection is closed.
async fn close_revoked<T>(
    core: &CoreInputs,
    peer: &Rc<Identity>,
    h2: h2::server::Connection<T, Bytes>,
    log: ConnLog,
    streams: u64,
) {
    let open = core.admitted.revoke_streams_of(peer, REVOKED);
    // Let the streams' tasks log and reset first: dropping the connection
    // under them would end them with a vaguer error. Bounded: a task that
    // does not run in time still ends when the connection drops.
    for _ in 0..64 {
        if !core.admitted.has_streams_of(peer) {
            break;
        }
        crate::io::executor::timer::sleep(std::time::Duration::from_millis(1)).await;
    }
    drop(h2);
    log.fail(format!(
        "{REVOKED}: closed with {open} open of {streams} streams"
    ));
}

fn reply(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let resp = Response::builder()
        .status(status)
        .body(())
        .expect("static response");
    let _ = respond.send_response(resp, true);
}

/// One CONNECT stream: validates and authorizes it where it arrives (no
/// await needed) and returns the task that connects to the local workload,
/// answers 200 and pumps; None when it was answered 400/401/503 and logged.
/// Split this way so an open tunnel's task does not keep the request
/// (headers, URI) alive. `permit` counts the dial from here on; `held`
/// counts what the stream holds against the core's memory budget.
#[allow(clippy::too_many_arguments)] // the stream's parts, its dial's permit and account
fn admit(
    core: &Rc<CoreInputs>,
    conn_src: SocketAddr,
    conn_dst: SocketAddr,
    peer: &Rc<Identity>,
    request: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
    mut log: ConnLog,
    permit: DialPermit,
    held: Option<StreamHeld>,
) -> Option<impl std::future::Future<Output = ()>> {
    log.route = "hbone";
    log.src_identity = Some(peer.to_string());
    // The original client as `forwarded` names it, else the tunnel's peer.
    let headers = request.headers();
    let forwarded = headers.get("forwarded").and_then(|v| v.to_str().ok());
    log.src = forwarded
        .and_then(|f| hbone::forwarded_param(f, "for"))
        .and_then(|a| a.parse().ok())
        .or(Some(conn_src));
    log.dst = Some(conn_dst);
    if let Some(t) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        if hbone::valid_traceparent(t) {
            log.trace = Some(t.to_string());
        }
    }
    if request.method() != Method::CONNECT {
        reply(&mut respond, StatusCode::BAD_REQUEST);
        return refused(
            log,
            format!("400: method {} is not CONNECT", request.method()),
        );
    }
    let snapshot = core.snapshot();
    let target = match authority_target(&snapshot, &core.cfg, conn_dst, request.uri().authority()) {
        Ok(t) => t,
        Err((status, why)) => {
            reply(&mut respond, status);
            return refused(log, format!("{}: {why}", status.as_u16()));
        }
    };
    log.hbone_addr = Some(target);
    // For the log: the dialled service (`forwarded`'s `host=`, else a
    // hostname authority), the workload behind the tunnel's peer address
    // when it holds the peer's identity (as ztunnel derives the source),
    // and the destination workload.
    let service = forwarded
        .and_then(|f| hbone::forwarded_param(f, "host"))
        .or_else(|| request.uri().authority().map(|a| a.host()))
        .filter(|h| h.parse::<IpAddr>().is_err() && !h.starts_with('['));
    let destination = authorization::local_workload(&snapshot, &core.cfg, conn_dst.ip());
    if let Some(d) = destination {
        if let Err(why) = is_pods_own(log.pod.as_deref(), &snapshot, d) {
            reply(&mut respond, StatusCode::SERVICE_UNAVAILABLE);
            return refused(log, format!("503: {why}"));
        }
    }
    // A stream that crossed a network gateway (`x-forwarded-network` names
    // another network) has the gateway as its TCP peer: the source is what
    // its `baggage` says, as ztunnel reads it.
    let from_gateway = headers
        .get("x-forwarded-network")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|n| n != core.cfg.network);
    // The source workload: the one at the tunnel's peer address holding
    // the peer's identity (as ztunnel derives it), unless from a gateway.
    let source = snapshot
        .workload_by_addr(&core.cfg.network, conn_src.ip())
        .filter(|w| !from_gateway && w.has_identity(peer));
    log.names = if from_gateway {
        let baggage = headers.get("baggage").and_then(|v| v.to_str().ok());
        let source = baggage.map(hbone::parse_baggage).and_then(|pairs| {
            let get = |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            let workload = ["deployment", "cronjob", "job", "pod"]
                .iter()
                .find_map(|kind| get(&format!("k8s.{kind}.name")))?;
            Some((workload, get("k8s.namespace.name")?))
        });
        let source = source.as_ref().map(|(w, ns)| (w.as_str(), ns.as_str()));
        Names::with_source(source, destination.map(|w| &**w), service)
    } else {
        Names::new(source.map(|w| &**w), destination.map(|w| &**w), service)
    };
    log.dst_identity = destination.map(|w| w.spiffe_id());
    let service = service.and_then(|h| {
        let local = destination?;
        let backed = snapshot.services_by_hostname(h).iter();
        backed
            .map(|s| &**s)
            .find(|s| local.services.contains_key(&s.key()))
    });
    log.count(core.metrics.counters(&ConnLabels {
        reporter: Reporter::Destination,
        src: source.map(|w| &**w),
        src_principal: Some(&**peer),
        dst: destination.map(|w| &**w),
        dst_principal: destination.map(|w| w.spiffe()).as_ref().map(|p| p as _),
        service,
        mtls: true,
    }));
    // A tunnel into ringway's own listeners (say pod:15008) would only
    // come back here: refused, as ztunnel refuses it.
    if core.self_addrs.ports.contains(&target.port()) {
        reply(&mut respond, StatusCode::BAD_REQUEST);
        return refused(
            log,
            format!("400: {target} is one of ringway's own listener ports (self call)"),
        );
    }
    let Some(local) = destination else {
        reply(&mut respond, StatusCode::SERVICE_UNAVAILABLE);
        return refused(log, format!("503: no local workload at {}", conn_dst.ip()));
    };
    // The target is the dialled workload, or (application tunnel,
    // sandwiched waypoint) a destination it stands in for.
    let upstream =
        match inbound_upstream(&snapshot, &core.cfg.network, local, conn_dst.ip(), target) {
            Ok(u) => u,
            Err(mismatch) => {
                reply(&mut respond, StatusCode::BAD_REQUEST);
                return refused(log, format!("400: {mismatch}"));
            }
        };
    // The policies see the tunnel's own peer address (not `forwarded`,
    // which the client writes), the dialled workload and the port asked
    // for.
    let inbound = Inbound {
        src: conn_src.ip(),
        dst: SocketAddr::new(conn_dst.ip(), target.port()),
        peer: Some(peer.clone()),
    };
    let ticket = match authorization::admit(&core.admitted, &snapshot, &core.cfg, inbound) {
        Ok(t) => t,
        Err(refusal @ Refused::NotLocal(_)) => {
            reply(&mut respond, StatusCode::SERVICE_UNAVAILABLE);
            return refused(log, format!("503: {refusal}"));
        }
        Err(refusal @ (Refused::Denied(_) | Refused::BypassedWaypoint(_))) => {
            reply(&mut respond, StatusCode::UNAUTHORIZED);
            return refused(log, format!("401: {refusal}"));
        }
    };
    // The original target and the peer, for an application that reads
    // them from a PROXY header.
    let header = upstream
        .proxy_protocol
        .then(|| hbone::proxy_header::encode(conn_src, target, &peer.to_string()));
    drop(snapshot);
    // From the client's address when asked (--orig-src): the tunnel's TCP
    // peer, which TLS authenticated, not `forwarded`, which it only claims.
    let from = core.cfg.orig_src.then_some(conn_src.ip());
    Some(tunnel(
        core.clone(),
        Box::new(Upstream {
            addr: upstream.addr,
            from,
            header,
            permit,
            held,
        }),
        respond,
        request.into_body(),
        log,
        ticket,
    ))
}

/// Where a CONNECT goes, from its `:authority`: `ip:port` as is;
/// `hostname:port` to the port the named service maps on the workload the
/// tunnel was dialled to (facts 3.4). Err: the status to answer and why.
pub(crate) fn authority_target(
    snap: &ringway_controlplane::Snapshot,
    cfg: &crate::core::config::ProxyConfig,
    conn_dst: SocketAddr,
    authority: Option<&http::uri::Authority>,
) -> Result<SocketAddr, (StatusCode, String)> {
    let malformed = || {
        (
            StatusCode::BAD_REQUEST,
            format!("malformed :authority {authority:?}"),
        )
    };
    let authority = authority.ok_or_else(malformed)?;
    if let Ok(t) = authority.as_str().parse::<SocketAddr>() {
        return Ok(t);
    }
    let (Some(port), host) = (authority.port_u16(), authority.host()) else {
        return Err(malformed());
    };
    if host.is_empty() || host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(malformed());
    }
    let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why);
    let local = authorization::local_workload(snap, cfg, conn_dst.ip())
        .ok_or_else(|| unavailable(format!("no local workload at {}", conn_dst.ip())))?;
    let target_port = inbound_service_port(snap, local, host, port).ok_or_else(|| {
        unavailable(format!(
            "no service {host} with port {port} on workload {}/{}",
            local.namespace, local.name
        ))
    })?;
    Ok(SocketAddr::new(conn_dst.ip(), target_port))
}

/// Logs a refused stream; None for [`admit`].
fn refused<T>(log: ConnLog, why: String) -> Option<T> {
    log.fail(why);
    None
}

/// An admitted CONNECT stream: connect to the local workload, 200, pump;
/// until the end, or until a later config denies it (then the stream and
/// the upstream socket are dropped: h2 resets the stream).
///
/// Not an `async fn`: an async fn keeps its arguments twice (as passed, and
/// moved into its body), and this future lives as long as the tunnel.
#[allow(clippy::manual_async_fn)] // deliberate: see above
fn tunnel(
    core: Rc<CoreInputs>,
    upstream: Box<Upstream>,
    respond: SendResponse<Bytes>,
    recv: h2::RecvStream,
    log: ConnLog,
    ticket: Ticket,
) -> impl std::future::Future<Output = ()> {
    async move {
        let log = &log;
        let carried = carry(&core, upstream, respond, recv, log);
        let revoked = async {
            let why = ticket.revoked().await;
            log.fail(format!("closed: {why}"));
        };
        futures_lite::future::or(carried, revoked).await;
    }
}

/// The 200: with the destination's baggage, as ztunnel's. Built in a
/// function of its own, and looked up now rather than kept from admission:
/// a tunnel's task lives as long as the tunnel, and every byte it holds
/// (even a local's room) is idle memory.
fn ok_response(core: &CoreInputs, target: SocketAddr) -> Response<()> {
    let mut resp = Response::builder().status(StatusCode::OK);
    let snapshot = core.snapshot();
    let baggage = core
        .cfg
        .response_baggage
        .then(|| authorization::local_workload(&snapshot, &core.cfg, target.ip()))
        .flatten()
        .map(|w| hbone::baggage(w))
        .and_then(|b| http::HeaderValue::try_from(b).ok());
    if let Some(b) = baggage {
        resp = resp.header("baggage", b);
    }
    resp.body(()).expect("static response")
}

/// Where a tunnel goes. Boxed: an open tunnel's task keeps its arguments,
/// and needs none of this once connected.
struct Upstream {
    addr: SocketAddr,
    /// The source address to connect from (--orig-src).
    from: Option<IpAddr>,
    /// A PROXY header to write first.
    header: Option<Vec<u8>>,
    /// Counts the dial in flight until it ends.
    permit: DialPermit,
    /// What the stream holds, for the memory budget; kept for the
    /// tunnel's life.
    held: Option<StreamHeld>,
}

/// Why a dial gave no upstream.
enum DialFailed {
    /// Could not connect: the stream is answered 503.
    Failed(String),
    /// The peer reset the stream first: the dial was abandoned (its socket
    /// closed), nothing to answer.
    Abandoned(String),
}

async fn carry(
    core: &CoreInputs,
    mut upstream: Box<Upstream>,
    mut respond: SendResponse<Bytes>,
    recv: h2::RecvStream,
    log: &ConnLog,
) {
    // Both phases are boxed: an async fn keeps room for every future it
    // awaits side by side (1.8 KB here), and an open tunnel's task lives as
    // long as the tunnel. Boxed, the connect state is freed once connected
    // and the task holds only what the pump needs.
    let target = upstream.addr;
    let held = upstream.held.take();
    let connecting = Box::pin(dial(core, upstream, &mut respond, log.netns()));
    let upstream = match connecting.await {
        Ok(s) => s,
        Err(DialFailed::Failed(why)) => {
            reply(&mut respond, StatusCode::SERVICE_UNAVAILABLE);
            return log.fail(format!("503: {why}"));
        }
        Err(DialFailed::Abandoned(why)) => return log.fail(why),
    };
    let send = match respond.send_response(ok_response(core, target), false) {
        Ok(s) => s,
        Err(e) => return log.fail(format!("could not answer 200: {e}")),
    };
    let pump = pump(
        &core.poller,
        upstream.as_raw_fd(),
        send,
        recv,
        &log.to_client,
        &log.from_client,
        held.as_ref().map(|h| h as &dyn Released),
    );
    match until_idle(pump, quiet(core, log)).await {
        Some(PumpOutcome::Closed) => log.finish("closed"),
        Some(other) => log.fail(other.describe()),
        None => idle_closed(core, log),
    }
}

/// Connects to the local workload, unless the peer resets the stream
/// first: then the dial is dropped (its socket closed) and the reset
/// counted against the connection. Without the race, a peer's HEADERS
/// then RST would leave a dial behind each (see `core::limits`).
async fn dial(
    core: &CoreInputs,
    upstream: Box<Upstream>,
    respond: &mut SendResponse<Bytes>,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<OwnedFd, DialFailed> {
    let Upstream {
        addr,
        from,
        header,
        permit,
        held: _,
    } = *upstream;
    let connecting = async {
        connect_upstream(core, addr, from, header, netns)
            .await
            .map_err(DialFailed::Failed)
    };
    let reset = async {
        let reset = futures_lite::future::poll_fn(|cx| respond.poll_reset(cx)).await;
        let why = match reset {
            Ok(reason) => {
                core.metrics.stats.dials_abandoned.add(1);
                permit.conn().early_reset();
                format!("reset by the peer ({reason}) before the dial completed: abandoned")
            }
            Err(e) => format!("HTTP/2 stream failed before the dial completed: {e}"),
        };
        Err(DialFailed::Abandoned(why))
    };
    let dialled = futures_lite::future::or(connecting, reset).await;
    drop(permit);
    dialled
}

/// Connects to the local workload and writes the PROXY header, if any.
/// In-pod mode, `netns` is the pod's: the application is reached from
/// inside it.
async fn connect_upstream(
    core: &CoreInputs,
    target: SocketAddr,
    from: Option<IpAddr>,
    header: Option<Vec<u8>>,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<OwnedFd, String> {
    let upstream = socket::connect_from(&core.poller, target, core.cfg.connect, from, netns)
        .await
        .map_err(|e| format!("connect to {target} failed: {e}"))?;
    if let Some(header) = header {
        let fd = upstream.as_raw_fd();
        match timed_write_all(core, fd, &header).await {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(format!("PROXY header to {target}: {e}")),
            None => return Err(format!("PROXY header to {target}: write timed out")),
        }
    }
    Ok(upstream)
}

#[cfg(test)]
mod footprint {
    use super::*;

    fn future_size<A, B, C, D, E, G, F: std::future::Future>(
        _: fn(A, B, C, D, E, G) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    /// An open tunnel's task holds this future for the tunnel's life: its
    /// size is memory per idle inbound connection. 960 bytes as an `async
    /// fn` (the access log kept twice), 640 at the time of writing.
    #[test]
    fn an_open_tunnel_holds_a_small_future() {
        let size = future_size(tunnel);
        assert!(
            size <= std::mem::size_of::<ConnLog>() + 400,
            "tunnel's future is {size} bytes: an inline phase or a doubled argument?"
        );
    }
}
