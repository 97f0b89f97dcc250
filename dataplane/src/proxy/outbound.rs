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
//! ([`crate::proxy::socks5`]) with the destination the client asked for. A
//! [`Downstream`] is what differs: how the client learns the outcome.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;

use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::model::routing::{plan, Outbound, Plan, PlanError};
use ringway_controlplane::model::Workload;
use ringway_controlplane::Snapshot;

use crate::core::authorization::local_workload;
use crate::core::CoreInputs;
use crate::hbone;
use crate::inpod::PodNetns;
use crate::io::idle::until_idle;
use crate::io::socket;
use crate::proxy::direct::{idle_closed, proxy_direct, quiet};
use crate::proxy::downstream::{announce, refuse, Downstream, Failure, Transparent};
use crate::proxy::fast_path::{on_this_node, serve_local, LocalNext};
use crate::telemetry::accesslog::{ConnLog, Names};
use crate::telemetry::metrics::{ConnLabels, Reporter};

/// Serves one captured outbound connection: reads where it was going (at
/// accept, no await needed) and returns the [`route`] future, or None when
/// the connection was refused and logged already. Not an `async fn`, so the
/// access log lives in `route`'s state only, not twice.
pub fn serve(
    core: Rc<CoreInputs>,
    client: OwnedFd,
    mut log: ConnLog,
) -> Option<impl Future<Output = ()>> {
    let src = log.client_addr(client.as_fd()).ok();
    let dst = match socket::captured_dst(client.as_fd(), src, false) {
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
        hbone_port: core.hbone.pool.cfg.hbone_port,
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

/// The workload an outbound HBONE tunnel speaks for.
struct Source {
    identity: Identity,
    /// Its `baggage` header (ztunnel's format).
    baggage: String,
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
        pod: log.pod.as_ref().map(|p| PodNetns(p.0.clone())),
    };
    core.hbone.open(tunnel).await
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
        let log = &*log;
        let pump = hbone::pump(
            &core.poller,
            fd,
            stream.send,
            stream.recv,
            &log.from_client,
            &log.to_client,
            // What outbound tunnels hold is bounded by the pool's
            // connections' windows; the budget counts inbound 15008.
            None,
        );
        match until_idle(pump, quiet(core, log)).await {
            Some(hbone::PumpOutcome::Closed) => log.finish("closed"),
            Some(other) => log.fail(other.describe()),
            None => idle_closed(core, log),
        }
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
