//! Outbound (15001): pod egress captured by nat REDIRECT. Read the original
//! destination, refuse loops, decide the route from the core's snapshot
//! ([`plan`]), then connect and move bytes.
//!
//! Sources: the client must be a workload of this node in the config
//! (found by its address); an unknown source is refused, as ztunnel
//! refuses one, unless `--allow-unknown-source` (labs) lets it out as plain
//! TCP.
//!
//! Routes are decided by [`plan`] (the model's routing decision, with its
//! table tests beside it): destinations outside the mesh and TCP-protocol
//! workloads are connected directly; HBONE workloads, service endpoints and
//! waypoints are reached through an mTLS HTTP/2 CONNECT tunnel under the
//! source workload's identity. What cannot be reached is refused: ringway
//! never falls back to plaintext for a mesh destination.
//!
//! [`route`] is the path itself, entered with a destination: by [`serve`]
//! for captured traffic, and by the SOCKS5 front door
//! ([`crate::socks5`]) with the destination the client asked for. A
//! [`Downstream`] is what differs: how the client learns the outcome.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::model::routing::{plan, Outbound, Plan, PlanError};
use ringway_controlplane::model::Workload;
use ringway_controlplane::Snapshot;

use crate::accesslog::{ConnLog, Names};
use crate::authorization::local_workload;
use crate::authorization::{self, Inbound};
use crate::hbone;
use crate::listeners::TrafficPath;
use crate::metrics::{ConnLabels, Reporter};
use crate::runtime::CoreInputs;
use crate::socket;
use crate::uring::Registration;

/// How the client of an outbound connection learns what became of its
/// upstream: this is all that differs between the entry points feeding
/// [`route`] (captured 15001 traffic, the SOCKS5 front door).
pub trait Downstream {
    /// The upstream is established (connected, or the HBONE CONNECT was
    /// answered 200). Returns bytes to send the client before any proxied
    /// byte. `upstream` is the direct upstream socket (`None` when
    /// tunnelled over HBONE).
    fn established(&mut self, upstream: Option<BorrowedFd<'_>>) -> Option<Vec<u8>>;
    /// The connection will not be made, for `failure`.
    fn failed(&mut self, failure: Failure) -> Refusal;
}

/// Why an outbound connection was not made, coarsely (what a client can
/// be told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The destination is one of ringway's own listeners.
    Loop,
    /// Refused by ringway: fail closed, unsupported mesh destination.
    NotAllowed,
    /// The upstream refused the connection.
    ConnectionRefused,
    /// No route, timed out, no healthy endpoint, peer unreachable.
    HostUnreachable,
    NetworkUnreachable,
    General,
}

impl Failure {
    /// Classifies a failed upstream connect.
    pub fn of_io(e: &std::io::Error) -> Failure {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => Failure::ConnectionRefused,
            Some(libc::EHOSTUNREACH) | Some(libc::ETIMEDOUT) | Some(libc::EHOSTDOWN) => {
                Failure::HostUnreachable
            }
            Some(libc::ENETUNREACH) | Some(libc::ENETDOWN) => Failure::NetworkUnreachable,
            _ if e.kind() == std::io::ErrorKind::TimedOut => Failure::HostUnreachable,
            _ => Failure::General,
        }
    }

    /// Classifies a failed HBONE tunnel.
    pub fn of_hbone(e: &hbone::client::HboneError) -> Failure {
        use hbone::client::HboneError as E;
        match e {
            E::NoCertificate(_) | E::IdentityMismatch { .. } => Failure::NotAllowed,
            E::Connect(..) | E::ConnectTimeout(_) => Failure::HostUnreachable,
            E::Status(_, s) if *s == http::StatusCode::SERVICE_UNAVAILABLE => {
                Failure::HostUnreachable
            }
            E::Status(_, s)
                if *s == http::StatusCode::FORBIDDEN || *s == http::StatusCode::UNAUTHORIZED =>
            {
                Failure::NotAllowed
            }
            _ => Failure::General,
        }
    }
}

/// What the client gets when its connection will not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// RST: it believed it was connected; a reset tells the truth.
    Reset,
    /// A plain close.
    Close,
    /// These bytes, then a close.
    Reply(Vec<u8>),
}

/// Captured traffic: the client believes it is already connected, so
/// nothing is said on success and a failure resets it (a loop is just
/// closed).
pub struct Transparent;

impl Downstream for Transparent {
    fn established(&mut self, _upstream: Option<BorrowedFd<'_>>) -> Option<Vec<u8>> {
        None
    }

    fn failed(&mut self, failure: Failure) -> Refusal {
        match failure {
            Failure::Loop => Refusal::Close,
            _ => Refusal::Reset,
        }
    }
}

/// Serves one captured outbound connection: reads where it was going (at
/// accept, no await needed) and returns the [`route`] future, or None when
/// the connection was refused and logged already. Not an `async fn`, so the
/// access log lives in `route`'s state only, not twice.
pub fn serve(
    core: Rc<CoreInputs>,
    client: OwnedFd,
    mut log: ConnLog,
) -> Option<impl Future<Output = ()>> {
    let fd = client.as_raw_fd();
    let src = log.client_addr(fd).ok();
    let dst = match socket::captured_dst(fd, src, false) {
        Ok(d) => d,
        Err(e) => {
            log.fail(format!(
                "no original destination (was the connection redirected by iptables/nftables?): {e}"
            ));
            return None;
        }
    };
    Some(route(core, client, dst, log, Transparent))
}

/// The outbound path proper, shared by every entry point: refuse loops,
/// [`plan`] from the core's snapshot, then connect directly or tunnel over
/// HBONE (speaking for the workload at `log.src`) and move bytes.
/// `downstream` decides what the client hears at the moment the upstream
/// is established or the attempt fails.
///
/// `log` comes after `client` so that, on a refusal here, the access-log
/// line is written before the client socket is closed.
///
/// Not an `async fn`: an async fn keeps its arguments twice (as passed, and
/// moved into its body), and this future lives as long as the connection.
#[allow(clippy::manual_async_fn)] // deliberate: see above
pub fn route(
    core: Rc<CoreInputs>,
    client: OwnedFd,
    dst: SocketAddr,
    mut log: ConnLog,
    mut downstream: impl Downstream,
) -> impl Future<Output = ()> {
    async move {
        let core = &core;
        let downstream: &mut dyn Downstream = &mut downstream;
        let log = &mut log;
        log.dst = Some(dst);
        let pod = log.pod.as_deref().map(|p| &**p);
        if core.self_addrs.is_self(dst)
            || pod.is_some_and(|p| p.is_self(dst, &core.self_addrs.ports))
        {
            return refuse(
                core,
                &client,
                downstream,
                Failure::Loop,
                log,
                format!("refused: {dst} is one of ringway's own listeners (forwarding loop)"),
            )
            .await;
        }
        let mut snapshot = core.snapshot();
        let network = &core.cfg.network;
        // On-demand xDS: the source or the destination may simply not be
        // fetched yet.
        let src_ip = log.src.map(|s| s.ip());
        let by_address = core.cfg.proxy_workload.is_none() && pod.is_none();
        if let (Some(ip), Some(_), true) = (src_ip, &core.control.on_demand, by_address) {
            if local_workload(&snapshot, &core.cfg, ip).is_none() {
                let lookup = Box::pin(core.resolve_on_demand(ip));
                if let Some(fresh) = lookup.await {
                    snapshot = Rc::new(fresh);
                }
            }
        }
        if core.control.on_demand.is_some()
            && !ringway_controlplane::sources::xds::resolves(&snapshot, network, dst.ip())
        {
            let lookup = Box::pin(core.resolve_on_demand(dst.ip()));
            if let Some(fresh) = lookup.await {
                snapshot = Rc::new(fresh);
            }
        }
        // The source must be a workload of this node that ringway knows (as in
        // ztunnel, which speaks for a known workload only): nothing leaves
        // unauthenticated by accident, e.g. before the first config arrives.
        let source = core.source_workload(&snapshot, src_ip, pod);
        if let (None, Some(pod)) = (source, pod) {
            let why = format!(
                "refused: pod {} is enrolled as workload {}, which is not in the mesh config \
                 (fail closed)",
                pod.entry.uid, pod.entry.workload
            );
            return refuse(core, &client, downstream, Failure::NotAllowed, log, why).await;
        }
        if let (None, Some(pw)) = (source, &core.cfg.proxy_workload) {
            let why = format!(
                "refused: dedicated mode speaks for workload {pw}, which is not in the mesh \
                 config (fail closed)"
            );
            return refuse(core, &client, downstream, Failure::NotAllowed, log, why).await;
        }
        if source.is_none() && !core.cfg.allow_unknown_source {
            let why = format!(
            "refused: unknown source {}: no workload of this node has this address in the mesh \
             config (fail closed; --allow-unknown-source lets plain TCP out in a lab)",
            src_ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string())
        );
            return refuse(core, &client, downstream, Failure::NotAllowed, log, why).await;
        }
        // Decided in a plain function: the plan (and its error) must not
        // stay in this future, which lives as long as the connection.
        let step = next_step(core, &snapshot, source.map(|w| &**w), dst, log);
        drop(snapshot);
        match step {
            Step::Direct(upstream) => {
                log.dst = Some(upstream);
                // Boxed like the HBONE phases: the connect and splice state
                // is this path's alone.
                let direct = Box::pin(proxy_direct(core, client, upstream, log, downstream, None));
                direct.await;
            }
            Step::Hbone(next) => {
                // Boxed, in two steps, each in its own statement (a temporary
                // inside an awaited expression keeps its room in this
                // future): a plain connection must not carry the HBONE
                // path's state, and an open tunnel must not keep what only
                // opening it needed (the pool's TLS/HTTP/2 connect,
                // identities, headers).
                let open = Box::pin(open_hbone(core, next, log));
                let opened = open.await;
                let tunnel = Box::pin(proxy_hbone(core, client, opened, log, downstream));
                tunnel.await;
            }
            Step::Local(next) => {
                let local = Box::pin(serve_local(core, client, next, log, downstream));
                local.await;
            }
            Step::Refuse(failure, why) => {
                refuse(core, &client, downstream, failure, log, why).await;
            }
        }
    }
}

/// What [`route`] does next, small enough to keep: the HBONE case is boxed.
enum Step {
    Direct(SocketAddr),
    Hbone(Box<HboneNext>),
    /// HBONE to a workload of this node: the same-node fast path.
    Local(Box<LocalNext>),
    Refuse(Failure, String),
}

/// [`plan`] for this connection, with the route and identities noted in
/// `log`.
fn next_step(
    core: &CoreInputs,
    snapshot: &Arc<Snapshot>,
    source: Option<&Workload>,
    dst: SocketAddr,
    log: &mut ConnLog,
) -> Step {
    let out = Outbound {
        source,
        network: &core.cfg.network,
        dst,
        hbone_port: core.pool.cfg.hbone_port,
    };
    let network = &core.cfg.network;
    let service = snapshot.service_by_addr(network, dst.ip());
    // The log's names: the workload reached (for a tunnel, the one at its
    // target, else the one serving its HBONE port, e.g. a waypoint).
    // The log's names and the metrics' labels: the workload reached (for a
    // tunnel, the one at its target, else the one serving its HBONE port,
    // e.g. a waypoint), and for a tunnel the identities of both ends.
    let name = |log: &mut ConnLog, reached: &[SocketAddr], tunnel: Option<&Identity>| {
        let destination = reached
            .iter()
            .find_map(|a| snapshot.workload_by_addr(network, a.ip()))
            .map(|w| &**w);
        log.names = Names::new(source, destination, service.map(|s| s.hostname.as_str()));
        let src_principal = source.filter(|_| tunnel.is_some()).map(Workload::spiffe);
        let counters = core.metrics.counters(&ConnLabels {
            reporter: Reporter::Source,
            src: source,
            src_principal: src_principal.as_ref().map(|p| p as &dyn std::fmt::Display),
            dst: destination,
            dst_principal: tunnel.map(|i| i as &dyn std::fmt::Display),
            service: service.map(|s| &**s),
            mtls: tunnel.is_some(),
        });
        log.count(counters);
    };
    match plan(snapshot, out, &mut |n| fastrand::u64(0..n)) {
        Ok(Plan::Direct { upstream, route }) => {
            log.route = route;
            name(log, &[upstream], None);
            Step::Direct(upstream)
        }
        Ok(Plan::Hbone {
            peer,
            authority,
            identity,
            route,
        }) => {
            log.route = route;
            log.dst_identity = Some(identity.to_string());
            name(log, &[authority, peer], Some(&identity));
            // The tunnel speaks for the client's workload: no workload, no
            // identity, no tunnel. Take what the tunnel needs while the
            // snapshot is borrowed: cloning the workload's Arc would touch
            // a refcount every core shares.
            let Some(w) = source else {
                let why = format!(
                    "refused: no workload at source {} to speak for over HBONE (fail closed)",
                    log.src
                        .map(|s| s.ip().to_string())
                        .unwrap_or_else(|| "-".into())
                );
                return Step::Refuse(Failure::NotAllowed, why);
            };
            // The same-node fast path: the destination is a workload this
            // ringway serves, reached directly (not through a waypoint).
            // Not from a pod (in-pod mode): the application must be
            // reached from inside its own namespace, which the HBONE hop to
            // its 15008 there does.
            if core.cfg.fast_path
                && log.pod.is_none()
                && peer == SocketAddr::new(authority.ip(), out.hbone_port)
                && on_this_node(core, snapshot, authority)
            {
                log.route = "same_node";
                return Step::Local(Box::new(LocalNext {
                    authority,
                    src_identity: w.identity(),
                    snapshot: Rc::new(Arc::clone(snapshot)),
                }));
            }
            Step::Hbone(Box::new(HboneNext {
                peer,
                authority,
                identity,
                source: Source {
                    identity: w.identity(),
                    baggage: hbone::baggage(w),
                },
                host: service.map(|s| s.hostname.to_string()),
            }))
        }
        Err(e) => {
            let failure = match e {
                PlanError::NoHealthyUpstream { .. } | PlanError::WaypointUnavailable { .. } => {
                    Failure::HostUnreachable
                }
                PlanError::RemoteNetwork { .. } => Failure::NetworkUnreachable,
            };
            Step::Refuse(failure, format!("refused: {e}"))
        }
    }
}

/// Ends a connection that will not be made: tells the client what
/// `downstream` says for `failure`, and logs `why`.
///
/// Returns the refusal boxed: `route` awaits it at six places, and an
/// unboxed refusal (with its timed reply write) would make every
/// connection's future, refused or not, reserve room for it for life.
fn refuse<'a>(
    core: &'a CoreInputs,
    client: &'a OwnedFd,
    downstream: &'a mut dyn Downstream,
    failure: Failure,
    log: &'a ConnLog,
    why: String,
) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
    Box::pin(async move {
        let fd = client.as_raw_fd();
        match downstream.failed(failure) {
            Refusal::Reset => socket::set_reset_on_close(fd),
            Refusal::Close => {}
            Refusal::Reply(bytes) => reply_and_close(core, fd, &bytes).await,
        }
        log.fail(why);
    })
}

/// Sends what `downstream` has to say once the upstream is established;
/// false (and logged) if the client could not be told.
async fn announce(
    core: &CoreInputs,
    client: &OwnedFd,
    downstream: &mut dyn Downstream,
    upstream: Option<BorrowedFd<'_>>,
    log: &ConnLog,
) -> bool {
    let Some(bytes) = downstream.established(upstream) else {
        return true;
    };
    let write = Box::pin(timed_write_all(core, client.as_raw_fd(), &bytes));
    match write.await {
        Some(Ok(())) => true,
        Some(Err(e)) => {
            log.fail(format!("could not tell the client it is connected: {e}"));
            false
        }
        None => {
            log.fail("could not tell the client it is connected: write timed out");
            false
        }
    }
}

/// The workload an outbound HBONE tunnel speaks for.
struct Source {
    identity: Identity,
    /// Its `baggage` header (ztunnel's format).
    baggage: String,
}

/// Whether `dst` is a workload this ringway itself serves, so that the
/// fast path may skip the HBONE hop. Only with `--node-name`: without it
/// every workload in the config counts as local for inbound, and taking the
/// fast path to one on another node would send its traffic there as
/// plaintext. In dedicated mode only the proxy workload itself is served
/// here.
fn on_this_node(core: &CoreInputs, snapshot: &Snapshot, dst: SocketAddr) -> bool {
    if core.cfg.node_name.is_none() {
        return false;
    }
    match local_workload(snapshot, &core.cfg, dst.ip()) {
        None => false,
        Some(w) => core.cfg.proxy_workload.as_ref().is_none_or(|pw| pw.is(w)),
    }
}

/// A same-node HBONE destination: the workload's address and port, the
/// identity the tunnel would have presented, and the snapshot the plan was
/// made with (in on-demand mode fresher than the core's).
struct LocalNext {
    authority: SocketAddr,
    src_identity: Identity,
    #[allow(clippy::redundant_allocation)] // the core's snapshot type
    snapshot: Rc<Arc<Snapshot>>,
}

/// The same-node fast path: what the HBONE hop to this ringway's own 15008
/// would have done, in-process. The destination's policies decide with the
/// source workload's identity as the peer (as they would after mTLS); the
/// connection is registered for late rejection; the application is reached
/// directly. Two access-log lines, as two hops would write: this outbound
/// one (route `same_node`) and an inbound one.
async fn serve_local(
    core: &Rc<CoreInputs>,
    client: OwnedFd,
    next: Box<LocalNext>,
    log: &mut ConnLog,
    downstream: &mut dyn Downstream,
) {
    let LocalNext {
        authority,
        src_identity,
        snapshot,
    } = *next;
    log.src_identity = Some(src_identity.to_string());
    log.dst = Some(authority);
    let mut inbound = ConnLog::new(core.open.clone(), core.index, TrafficPath::Inbound);
    inbound.src = log.src;
    inbound.dst = Some(authority);
    inbound.names = log.names.clone();
    inbound.route = "same_node";
    inbound.src_identity = log.src_identity.clone();
    inbound.dst_identity = log.dst_identity.clone();
    // What the HBONE hop would have refused before its policies: a call to
    // one of ringway's own ports, and (at its TLS handshake) a source in
    // another trust domain than the destination's.
    let refusal = if core.self_addrs.ports.contains(&authority.port()) {
        Some(format!(
            "{authority} is one of ringway's own listener ports (self call)"
        ))
    } else {
        local_workload(&snapshot, &core.cfg, authority.ip())
            .filter(|w| w.trust_domain != src_identity.trust_domain)
            .map(|w| {
                format!(
                    "source trust domain {:?} is not the destination's {:?}",
                    src_identity.trust_domain, w.trust_domain
                )
            })
    };
    if let Some(why) = refusal {
        inbound.fail(format!("400: {why}"));
        let why = format!("refused: {why}");
        return refuse(core, &client, downstream, Failure::NotAllowed, log, why).await;
    }
    // Counted as the destination's proxy would count the HBONE hop.
    let network = &core.cfg.network;
    let source = log
        .src
        .and_then(|a| snapshot.workload_by_addr(network, a.ip()));
    let destination = local_workload(&snapshot, &core.cfg, authority.ip());
    inbound.count(core.metrics.counters(&ConnLabels {
        reporter: Reporter::Destination,
        src: source.map(|w| &**w),
        src_principal: Some(&src_identity),
        dst: destination.map(|w| &**w),
        dst_principal: destination.map(|w| w.spiffe()).as_ref().map(|p| p as _),
        service: None,
        mtls: true,
    }));
    let conn = Inbound {
        src: log.src.map_or(authority.ip(), |s| s.ip()),
        dst: authority,
        peer: Some(Rc::new(src_identity)),
    };
    let admitted = authorization::admit(&core.admitted, &snapshot, &core.cfg, conn);
    drop(snapshot);
    let ticket = match admitted {
        Ok(t) => t,
        Err(refusal) => {
            inbound.fail(format!("401: {refusal}"));
            let why = format!("refused by the destination: {refusal}");
            return refuse(core, &client, downstream, Failure::NotAllowed, log, why).await;
        }
    };
    let log = &*log;
    direct_until_revoked(core, client, authority, log, downstream, None, &ticket).await;
    // What the client sent, the application received, and back.
    inbound.from_client.add(log.from_client.get());
    inbound.to_client.add(log.to_client.get());
    match log.outcome() {
        Some((true, outcome)) => inbound.finish(outcome),
        Some((false, why)) => inbound.fail(why),
        None => {}
    }
}

/// Where an HBONE stream goes: mTLS to `peer` (an HBONE port) whose
/// certificate must be `identity`, then CONNECT `authority`, speaking for
/// `source`; `host` is the service hostname when a service was dialled.
struct HboneNext {
    peer: SocketAddr,
    authority: SocketAddr,
    identity: Identity,
    source: Source,
    host: Option<String>,
}

/// Opens the HBONE stream `next` describes, and notes the tunnel's
/// identities, trace and upstream in `log`.
async fn open_hbone(
    core: &Rc<CoreInputs>,
    next: Box<HboneNext>,
    log: &mut ConnLog,
) -> Result<hbone::client::OpenStream, hbone::client::HboneError> {
    let HboneNext {
        peer,
        authority,
        identity,
        source,
        host,
    } = *next;
    log.src_identity = Some(source.identity.to_string());
    log.dst = Some(peer);
    log.hbone_addr = Some(authority);
    let traceparent = hbone::new_traceparent();
    log.trace = Some(traceparent.clone());
    let tunnel = hbone::client::Tunnel {
        src_identity: &source.identity,
        dst_identity: &identity,
        peer,
        authority,
        forwarded: hbone::forwarded(log.src.unwrap_or(authority), host.as_deref()),
        baggage: source.baggage,
        traceparent,
        pod: log
            .pod
            .as_ref()
            .map(|p| crate::inpod::PodNetns(p.0.clone())),
    };
    hbone::client::open(core, tunnel).await
}

/// Tunnels the client connection over the stream [`open_hbone`] opened
/// (or refuses it with what went wrong). Not an `async fn`, for the reason
/// given at [`route`].
#[allow(clippy::manual_async_fn)] // deliberate: see above
fn proxy_hbone<'a>(
    core: &'a Rc<CoreInputs>,
    client: OwnedFd,
    opened: Result<hbone::client::OpenStream, hbone::client::HboneError>,
    log: &'a mut ConnLog,
    downstream: &'a mut dyn Downstream,
) -> impl Future<Output = ()> + 'a {
    async move {
        let fd = client.as_raw_fd();
        let stream = match opened {
            Ok(s) => s,
            Err(e) => {
                let failure = Failure::of_hbone(&e);
                let why = format!("HBONE: {e}");
                return refuse(core, &client, downstream, failure, log, why).await;
            }
        };
        log.hbone_conn = Some(stream.conn_id);
        if !announce(core, &client, downstream, None, log).await {
            return;
        }
        let outcome = hbone::pump(
            &core.poller,
            fd,
            stream.send,
            stream.recv,
            &log.from_client,
            &log.to_client,
        )
        .await;
        match outcome {
            hbone::PumpOutcome::Closed => log.finish("closed"),
            other => log.fail(other.describe()),
        }
    }
}

/// Connects to `upstream` and proxies until both sides are done. Shared
/// with the inbound passthrough path (which passes [`Transparent`]).
pub async fn proxy_direct(
    core: &CoreInputs,
    client: OwnedFd,
    upstream: SocketAddr,
    log: &ConnLog,
    downstream: &mut dyn Downstream,
    source: Option<std::net::IpAddr>,
) {
    let connecting = socket::connect_from(
        &core.poller,
        upstream,
        core.cfg.connect,
        source,
        log.netns(),
    );
    let server = match connecting.await {
        Ok(s) => s,
        Err(e) => {
            let why = format!("upstream connect to {upstream} failed: {e}");
            return refuse(core, &client, downstream, Failure::of_io(&e), log, why).await;
        }
    };
    if !announce(core, &client, downstream, Some(server.as_fd()), log).await {
        return;
    }
    let outcome = core
        .copier
        .bidirectional(&client, &server, &log.from_client, &log.to_client)
        .await;
    match outcome {
        crate::copy::CopyOutcome::Closed => log.finish("closed"),
        other => log.fail(other.describe()),
    }
}

/// [`proxy_direct`] for an admitted inbound connection: until it ends, or
/// until a later config denies it (`ticket`). Then the sockets close when
/// the copy is dropped, right after, with a reset for the client rather
/// than a clean end of stream.
pub async fn direct_until_revoked(
    core: &CoreInputs,
    client: OwnedFd,
    upstream: SocketAddr,
    log: &ConnLog,
    downstream: &mut dyn Downstream,
    source: Option<std::net::IpAddr>,
    ticket: &authorization::Ticket,
) {
    let fd = client.as_raw_fd();
    let carried = proxy_direct(core, client, upstream, log, downstream, source);
    let revoked = async {
        let why = ticket.revoked().await;
        socket::set_reset_on_close(fd);
        log.fail(format!("closed: {why}"));
    };
    futures_lite::future::or(carried, revoked).await;
}

/// Sends a final reply (a refusal), bounded by the handshake timeout,
/// then FIN. What the client already sent is read and dropped, so that
/// closing with unread data does not turn into an RST that could overtake
/// the reply.
pub(crate) async fn reply_and_close(core: &CoreInputs, fd: RawFd, bytes: &[u8]) {
    if matches!(timed_write_all(core, fd, bytes).await, Some(Ok(()))) {
        let _ = socket::shutdown_write(fd);
        discard_pending(fd);
    }
}

/// Writes a handshake-time message (a SOCKS5 reply), bounded by the
/// handshake timeout; None = timed out.
pub(crate) async fn timed_write_all(
    core: &CoreInputs,
    fd: RawFd,
    bytes: &[u8],
) -> Option<std::io::Result<()>> {
    let reg = Registration::new(&core.poller, fd);
    hbone::with_timeout(
        core.cfg.handshake_timeout,
        crate::stream::write_all(&reg, bytes),
    )
    .await
}

/// Reads and drops whatever is already queued (nonblocking, bounded).
fn discard_pending(fd: RawFd) {
    let mut scratch = [0u8; 4096];
    for _ in 0..16 {
        match socket::read(fd, &mut scratch) {
            Ok(n) if n > 0 => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn transparent_clients_are_reset_except_on_loops() {
        let mut t = Transparent;
        assert_eq!(t.established(None), None);
        assert_eq!(t.failed(Failure::Loop), Refusal::Close);
        for f in [
            Failure::NotAllowed,
            Failure::ConnectionRefused,
            Failure::HostUnreachable,
            Failure::NetworkUnreachable,
            Failure::General,
        ] {
            assert_eq!(t.failed(f), Refusal::Reset, "{f:?}");
        }
    }

    #[test]
    fn connect_errors_are_classified() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(
            Failure::of_io(&os(libc::ECONNREFUSED)),
            Failure::ConnectionRefused
        );
        assert_eq!(
            Failure::of_io(&os(libc::EHOSTUNREACH)),
            Failure::HostUnreachable
        );
        assert_eq!(
            Failure::of_io(&io::Error::from(io::ErrorKind::TimedOut)),
            Failure::HostUnreachable
        );
        assert_eq!(
            Failure::of_io(&os(libc::ENETUNREACH)),
            Failure::NetworkUnreachable
        );
        assert_eq!(Failure::of_io(&os(libc::EMFILE)), Failure::General);
        let addr: SocketAddr = "10.0.0.1:15008".parse().unwrap();
        use hbone::client::HboneError as E;
        assert_eq!(
            Failure::of_hbone(&E::ConnectTimeout(addr)),
            Failure::HostUnreachable
        );
        assert_eq!(
            Failure::of_hbone(&E::Status(addr, http::StatusCode::SERVICE_UNAVAILABLE)),
            Failure::HostUnreachable
        );
        assert_eq!(
            Failure::of_hbone(&E::Status(addr, http::StatusCode::FORBIDDEN)),
            Failure::NotAllowed
        );
        assert_eq!(
            Failure::of_hbone(&E::Tls(addr, "x".into())),
            Failure::General
        );
    }
}

#[cfg(test)]
mod footprint {
    use super::*;

    fn future_size<A, B, C, D, E, F: Future>(_: fn(A, B, C, D, E) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// An idle outbound connection holds this future (boxed) for its whole
    /// life, so its size is memory per idle connection. It was 1752 bytes
    /// while `route` was an `async fn` (arguments kept twice) with the
    /// direct path and refusals inline, 824 while the routing plan stayed
    /// in it, 488 at the time of writing.
    #[test]
    fn an_idle_connection_holds_a_small_route_future() {
        let size = future_size::<_, _, _, _, Transparent, _>(route);
        assert!(
            size <= std::mem::size_of::<ConnLog>() + 256,
            "route's future is {size} bytes: an inline phase or a doubled argument?"
        );
    }
}
