//! The outbound routing decision: where a captured connection goes, from
//! the snapshot alone (no I/O), in ztunnel's order:
//!
//! 1. A Service VIP whose service has a waypoint, and the source is not that
//!    waypoint: HBONE to the waypoint, asking it for the VIP (the VIP stays
//!    the `:authority`, so the waypoint applies the service's L7 policy).
//! 2. A Service VIP otherwise: load-balance over its endpoints (health,
//!    locality preferences in STRICT or FAILOVER mode, capacity), with the
//!    target port from the endpoint's own port map, else the service's, else
//!    the port dialled. No endpoint: plain TCP to the VIP if the service is
//!    PASSTHROUGH, else an error.
//! 3. A workload address whose workload has a waypoint, and the source is
//!    not that waypoint: HBONE to the waypoint, asking it for the address.
//! 4. A workload address otherwise: HBONE to its port 15008 if it speaks
//!    HBONE, else plain TCP.
//! 5. Anything else: plain TCP to the original destination.
//!
//! Endpoints on another network would need double HBONE through their
//! network gateway, which ringway does not do: they are skipped while an
//! endpoint on this network can serve, and refused with a reason when none
//! can (ztunnel would tunnel through the gateway).

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::model::identity::Identity;
use crate::model::snapshot::Snapshot;
use crate::model::{
    ApplicationTunnelProtocol, GatewayAddress, GatewayDestination, LbHealthPolicy, LbMode, LbScope,
    Service, TunnelProtocol, Workload, WorkloadStatus,
};

/// What a connection is, as far as routing goes.
#[derive(Clone, Copy, Debug)]
pub struct Outbound<'a> {
    /// The workload the connection speaks for; None when the source is not
    /// a known workload (only plain TCP can leave then).
    pub source: Option<&'a Workload>,
    /// The proxy's own network ("" = the default network).
    pub network: &'a str,
    /// The original destination.
    pub dst: SocketAddr,
    /// The port workloads take HBONE on (15008; waypoints and gateways say
    /// their own).
    pub hbone_port: u16,
}

/// Where a connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Plain TCP to `upstream`.
    Direct {
        upstream: SocketAddr,
        route: &'static str,
    },
    /// An HTTP/2 CONNECT to `authority`, over mTLS to `peer` (an HBONE
    /// port), whose certificate must be `identity`.
    Hbone {
        peer: SocketAddr,
        authority: SocketAddr,
        identity: Identity,
        route: &'static str,
    },
}

impl Plan {
    /// The route name the access log shows.
    pub fn route(&self) -> &'static str {
        match self {
            Plan::Direct { route, .. } | Plan::Hbone { route, .. } => route,
        }
    }
}

/// Route names, as the access log shows them.
pub mod route {
    pub const PASSTHROUGH: &str = "passthrough";
    pub const WORKLOAD: &str = "workload";
    pub const SERVICE: &str = "service";
    pub const SERVICE_PASSTHROUGH: &str = "service_passthrough";
    pub const HBONE: &str = "hbone";
    pub const SERVICE_WAYPOINT: &str = "service_waypoint";
    pub const WORKLOAD_WAYPOINT: &str = "workload_waypoint";
}

/// Why no plan could be made. Every case is a refusal: nothing falls back
/// to plaintext.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The service has no endpoint that may take this port now (none
    /// healthy, none with the port, none matching a STRICT locality
    /// preference).
    NoHealthyUpstream { service: String, port: u16 },
    /// A waypoint is configured but cannot be reached: its service or
    /// workload is unknown, has no usable endpoint, or is on another
    /// network.
    WaypointUnavailable {
        of: String,
        waypoint: String,
        why: &'static str,
    },
    /// Every usable endpoint is on another network (double HBONE through a
    /// network gateway is not supported).
    RemoteNetwork { service: String, network: String },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoHealthyUpstream { service, port } => {
                write!(f, "no healthy upstream for service {service} port {port}")
            }
            PlanError::WaypointUnavailable { of, waypoint, why } => {
                write!(f, "waypoint {waypoint} of {of} is unavailable: {why}")
            }
            PlanError::RemoteNetwork { service, network } => write!(
                f,
                "every endpoint of {service} that could serve is on network {network:?}, \
                 reached only through its network gateway (double HBONE), which ringway \
                 does not support"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// Picks a number in `0..n` (n ≥ 1): the load balancer's only randomness,
/// passed in so that tests can choose.
pub type Pick<'p> = &'p mut dyn FnMut(u64) -> u64;

/// The decision for `out` over `snap`. See the module documentation.
pub fn plan(snap: &Snapshot, out: Outbound<'_>, pick: Pick<'_>) -> Result<Plan, PlanError> {
    let dst = out.dst;
    if let Some(svc) = snap.service_by_addr(out.network, dst.ip()) {
        if let Some(wp) = service_waypoint(svc, pick) {
            let key = svc.key();
            match resolve_waypoint(snap, out, wp, pick) {
                Ok(w) if !w.is_source => return Ok(w.plan(dst, route::SERVICE_WAYPOINT)),
                Ok(_) => {}
                Err(why) => return Err(waypoint_error(key, wp, why)),
            }
        }
        return service_plan(snap, out, svc, pick);
    }
    if let Some(w) = snap.workload_by_addr(out.network, dst.ip()) {
        if let Some(wp) = &w.waypoint {
            match resolve_waypoint(snap, out, wp, pick) {
                Ok(r) if !r.is_source => return Ok(r.plan(dst, route::WORKLOAD_WAYPOINT)),
                Ok(_) => {}
                Err(why) => {
                    let of = format!("workload {}/{}", w.namespace, w.name);
                    return Err(waypoint_error(of, wp, why));
                }
            }
        }
        return Ok(to_endpoint(w, dst, out, route::WORKLOAD));
    }
    Ok(Plan::Direct {
        upstream: dst,
        route: route::PASSTHROUGH,
    })
}

/// Step 2: a service VIP without a waypoint in the way.
fn service_plan(
    snap: &Snapshot,
    out: Outbound<'_>,
    svc: &Service,
    pick: Pick<'_>,
) -> Result<Plan, PlanError> {
    let dst = out.dst;
    let lb = svc.load_balancer.as_ref();
    // PASSTHROUGH: the original destination, endpoints or not (a CIDR
    // ServiceEntry says "these addresses", not "balance over them").
    if lb.is_some_and(|lb| lb.mode == LbMode::Passthrough) {
        return Ok(Plan::Direct {
            upstream: dst,
            route: route::SERVICE_PASSTHROUGH,
        });
    }
    let key = svc.key();
    let candidates = endpoints_for_port(snap, svc, &key, dst.port());
    let (local, remote): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|(w, _)| w.network == out.network);
    let chosen = match choose(&local, out.source, lb, pick) {
        Some(c) => c,
        None => {
            if let Some((w, _)) = choose(&remote, out.source, lb, pick) {
                return Err(PlanError::RemoteNetwork {
                    service: key,
                    network: w.network.to_string(),
                });
            }
            return Err(PlanError::NoHealthyUpstream {
                service: key,
                port: dst.port(),
            });
        }
    };
    let (w, port) = chosen;
    let target = SocketAddr::new(address_like(w, dst.ip()), port);
    Ok(to_endpoint(w, target, out, route::SERVICE))
}

/// Straight to endpoint `w` at `target`: HBONE to its HBONE port when it
/// speaks HBONE, else plain TCP (logged as `plain_route`).
fn to_endpoint(
    w: &Workload,
    target: SocketAddr,
    out: Outbound<'_>,
    plain_route: &'static str,
) -> Plan {
    match w.protocol {
        TunnelProtocol::Hbone => Plan::Hbone {
            peer: SocketAddr::new(target.ip(), out.hbone_port),
            authority: target,
            identity: w.identity(),
            route: route::HBONE,
        },
        TunnelProtocol::None => Plan::Direct {
            upstream: target,
            route: plain_route,
        },
    }
}

/// The service's endpoints that may take `port` under its health policy,
/// each with its target port: the endpoint's own mapping first (named
/// target ports resolve per pod), then the service's, then `port` itself
/// where a mapping says 0. An endpoint neither maps is skipped.
fn endpoints_for_port<'s>(
    snap: &'s Snapshot,
    svc: &Service,
    key: &str,
    port: u16,
) -> Vec<(&'s Workload, u16)> {
    let allow_unhealthy = svc
        .load_balancer
        .as_ref()
        .is_some_and(|lb| lb.health_policy == LbHealthPolicy::AllowAll);
    snap.endpoints(key)
        .iter()
        .filter(|w| allow_unhealthy || w.status == WorkloadStatus::Healthy)
        .filter(|w| !w.addresses.is_empty())
        .filter_map(|w| Some((&**w, target_port(w, svc, key, port)?)))
        .collect()
}

/// The port service port `port` of `svc` (key `key`) reaches on endpoint
/// `w`: the endpoint's own mapping first (Kubernetes named target ports
/// resolve per pod), then the service's, then `port` itself where a
/// mapping says 0. None: neither maps it.
fn target_port(w: &Workload, svc: &Service, key: &str, port: u16) -> Option<u16> {
    let own = w
        .services
        .get(key)
        .and_then(|ports| ports.iter().find(|p| p.service_port == port))
        .map(|p| p.target_port)
        .filter(|&t| t != 0);
    let target = own.or_else(|| {
        svc.ports
            .iter()
            .find(|p| p.service_port == port)
            .map(|p| p.target_port)
    })?;
    Some(if target == 0 { port } else { target })
}

/// Load balancing proper: locality preferences by mode, then a choice
/// weighted by capacity.
fn choose<'s>(
    candidates: &[(&'s Workload, u16)],
    source: Option<&Workload>,
    lb: Option<&crate::model::LoadBalancer>,
    pick: Pick<'_>,
) -> Option<(&'s Workload, u16)> {
    if candidates.is_empty() {
        return None;
    }
    let (mode, scopes) = match lb {
        Some(lb) => (lb.mode, &lb.routing_preferences[..]),
        None => (LbMode::Standard, &[][..]),
    };
    let ranked: Vec<(&'s Workload, u16)> = match mode {
        LbMode::Strict | LbMode::Failover if !scopes.is_empty() => {
            let rank = |w: &Workload| match source {
                Some(src) => scopes
                    .iter()
                    .take_while(|s| same_scope(**s, src, w))
                    .count(),
                None => 0,
            };
            let best = if mode == LbMode::Strict {
                scopes.len()
            } else {
                candidates.iter().map(|(w, _)| rank(w)).max().unwrap_or(0)
            };
            candidates
                .iter()
                .copied()
                .filter(|(w, _)| rank(w) == best)
                .collect()
        }
        _ => candidates.to_vec(),
    };
    weighted(&ranked, pick)
}

/// Whether `w` is in the same `scope` as the source `src`. Scopes are
/// ranked as listed (most important first), so each is compared alone.
fn same_scope(scope: LbScope, src: &Workload, w: &Workload) -> bool {
    let field =
        |f: fn(&crate::model::Locality) -> &str| match (src.locality.as_ref(), w.locality.as_ref())
        {
            (Some(a), Some(b)) => f(a) == f(b),
            (None, None) => true,
            _ => false,
        };
    match scope {
        LbScope::Region => field(|l| &l.region),
        LbScope::Zone => field(|l| &l.zone),
        LbScope::Subzone => field(|l| &l.subzone),
        LbScope::Node => src.node == w.node,
        LbScope::Cluster => src.cluster_id == w.cluster_id,
        LbScope::Network => src.network == w.network,
    }
}

/// A choice weighted by capacity (1 unless the config says otherwise); an
/// endpoint with capacity 0 is never chosen, as in ztunnel (a drained
/// endpoint), and when every one has 0 there is none.
fn weighted<'s>(c: &[(&'s Workload, u16)], pick: Pick<'_>) -> Option<(&'s Workload, u16)> {
    weighted_by(c, |(w, _)| w.capacity, pick).copied()
}

/// The item `pick` lands on when each takes room `weight` (0: none).
fn weighted_by<'i, T>(items: &'i [T], weight: impl Fn(&T) -> u32, pick: Pick<'_>) -> Option<&'i T> {
    let total: u64 = items.iter().map(|i| u64::from(weight(i))).sum();
    if total == 0 {
        return None;
    }
    let mut n = pick(total).min(total - 1);
    for item in items {
        let w = u64::from(weight(item));
        if n < w {
            return Some(item);
        }
        n -= w;
    }
    None
}

/// The waypoint a service's traffic goes through: `waypoint`, else one of
/// `weighted_waypoints` by weight (a list istiod may send on its own; going
/// straight to the endpoints would skip the waypoint's policy).
fn service_waypoint<'s>(svc: &'s Service, pick: Pick<'_>) -> Option<&'s GatewayAddress> {
    if let Some(wp) = &svc.waypoint {
        return Some(wp);
    }
    if svc.weighted_waypoints.is_empty() {
        return None;
    }
    // All weights 0: still a waypoint, never none.
    let all_zero = svc.weighted_waypoints.iter().all(|w| w.weight == 0);
    let chosen = weighted_by(
        &svc.weighted_waypoints,
        |w| if all_zero { 1 } else { w.weight },
        pick,
    );
    chosen.map(|w| &w.waypoint)
}

/// One of `w`'s addresses, of the same family as `like` when it has one.
fn address_like(w: &Workload, like: IpAddr) -> IpAddr {
    w.addresses
        .iter()
        .copied()
        .find(|a| a.is_ipv4() == like.is_ipv4())
        .unwrap_or(w.addresses[0])
}

/// A waypoint, resolved to the instance this connection goes through.
struct Waypoint {
    peer: SocketAddr,
    identity: Identity,
    /// The connection comes from the waypoint itself (it is forwarding what
    /// it already processed): it goes to the destination, not back to it.
    is_source: bool,
}

impl Waypoint {
    fn plan(self, authority: SocketAddr, route: &'static str) -> Plan {
        Plan::Hbone {
            peer: self.peer,
            authority,
            identity: self.identity,
            route,
        }
    }
}

/// A waypoint's address: a service (by hostname, or by VIP) load-balanced
/// to one of its instances, or a workload by its address. The instance
/// must speak HBONE on this network, and its identity is what its
/// certificate must carry.
fn resolve_waypoint(
    snap: &Snapshot,
    out: Outbound<'_>,
    gw: &GatewayAddress,
    pick: Pick<'_>,
) -> Result<Waypoint, &'static str> {
    let port = gw.hbone_mtls_port;
    let is_source = |w: &Workload| out.source.is_some_and(|s| s.uid == w.uid);
    let service = match &gw.destination {
        GatewayDestination::Hostname(h) => Some(
            snap.service_by_host(&h.namespace, &h.hostname)
                .ok_or("no such service")?,
        ),
        GatewayDestination::Address(a) => {
            if a.network != out.network {
                return Err("it is on another network");
            }
            snap.service_by_vip(&a.network, a.ip)
        }
    };
    let instance: &Workload = match (service, &gw.destination) {
        (Some(svc), _) => {
            let key = svc.key();
            // The source may be any instance of the waypoint service (its
            // address is not needed then: the connection does not go to it).
            if let Some(src) = snap.endpoints(&key).iter().find(|w| is_source(w)) {
                return Ok(Waypoint {
                    peer: out.dst,
                    identity: src.identity(),
                    is_source: true,
                });
            }
            let healthy: Vec<(&Workload, u16)> = snap
                .endpoints(&key)
                .iter()
                .filter(|w| w.status == WorkloadStatus::Healthy && !w.addresses.is_empty())
                .filter(|w| w.network == out.network)
                .map(|w| (&**w, port))
                .collect();
            choose(&healthy, out.source, svc.load_balancer.as_ref(), pick)
                .ok_or("its service has no healthy instance on this network")?
                .0
        }
        (None, GatewayDestination::Address(a)) => snap
            .workload_by_addr(&a.network, a.ip)
            .map(|w| &**w)
            .ok_or("no workload or service has its address")?,
        (None, GatewayDestination::Hostname(_)) => unreachable!("resolved above"),
    };
    if instance.protocol != TunnelProtocol::Hbone && !is_source(instance) {
        return Err("it does not speak HBONE");
    }
    let ip = match &gw.destination {
        GatewayDestination::Address(a) if service.is_none() => a.ip,
        _ if instance.addresses.is_empty() => return Err("its instance has no address"),
        _ => address_like(instance, out.dst.ip()),
    };
    Ok(Waypoint {
        peer: SocketAddr::new(ip, port),
        identity: instance.identity(),
        is_source: is_source(instance),
    })
}

fn waypoint_error(of: String, gw: &GatewayAddress, why: &'static str) -> PlanError {
    PlanError::WaypointUnavailable {
        of,
        waypoint: gw.destination.to_string(),
        why,
    }
}

/// Whether `peer` is the identity of an instance of waypoint `gw` (any
/// instance of its service, or the workload at its address), on
/// `network`: the inbound side's test that traffic to a workload with a
/// waypoint came through that waypoint.
pub fn is_waypoint_identity(
    snap: &Snapshot,
    network: &str,
    gw: &GatewayAddress,
    peer: &Identity,
) -> bool {
    gateway_has(snap, network, gw, |w| w.has_identity(peer))
}

/// Whether an instance of gateway `gw` (any endpoint of its service, or
/// the workload at its address) on `network` satisfies `is`.
fn gateway_has(
    snap: &Snapshot,
    network: &str,
    gw: &GatewayAddress,
    is: impl Fn(&Workload) -> bool,
) -> bool {
    let service = match &gw.destination {
        GatewayDestination::Hostname(h) => snap.service_by_host(&h.namespace, &h.hostname),
        GatewayDestination::Address(a) if a.network == network => {
            match snap.service_by_vip(&a.network, a.ip) {
                Some(s) => Some(s),
                None => {
                    return snap
                        .workload_by_addr(&a.network, a.ip)
                        .is_some_and(|w| is(w))
                }
            }
        }
        GatewayDestination::Address(_) => None,
    };
    service.is_some_and(|s| snap.endpoints(&s.key()).iter().any(|w| is(w)))
}

/// Where an inbound HBONE stream goes on this node (facts 3.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboundUpstream {
    /// Always an address of the local workload the tunnel was dialled to.
    pub addr: SocketAddr,
    /// Write a PROXY protocol v2 header first (the workload's application
    /// tunnel asks for it): it carries the original target and the peer's
    /// identity, which `addr` no longer shows.
    pub proxy_protocol: bool,
}

/// Why an inbound HBONE stream has nowhere to go: answered 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpMismatch {
    pub target: SocketAddr,
    pub dialled: IpAddr,
}

impl std::fmt::Display for IpMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "authority IP {} is not the connection's destination {}, which is neither an \
             application-tunnel workload nor a waypoint of {}",
            self.target.ip(),
            self.dialled,
            self.target.ip()
        )
    }
}

/// Inbound HBONE: where a CONNECT for `target` (an IP authority) goes when
/// it arrived at `local`, the workload dialled at `dialled`, as ztunnel
/// decides it:
/// - the target is normally `local` itself (same IP);
/// - a different target IP is allowed when `local` has an application
///   tunnel, or when `local` is the waypoint of the service or workload at
///   the target (a sandwiched waypoint);
/// - the stream then goes to `local`'s own address, at the application
///   tunnel's port if it names one (else the target port), behind a PROXY
///   header if the tunnel's protocol is PROXY.
pub fn inbound_upstream(
    snap: &Snapshot,
    network: &str,
    local: &Workload,
    dialled: IpAddr,
    target: SocketAddr,
) -> Result<InboundUpstream, IpMismatch> {
    let tunnel = local.application_tunnel.as_ref();
    if target.ip() != dialled
        && tunnel.is_none()
        && !is_waypoint_of(snap, network, local, target.ip())
    {
        return Err(IpMismatch { target, dialled });
    }
    let port = tunnel.and_then(|t| t.port).unwrap_or(target.port());
    Ok(InboundUpstream {
        addr: SocketAddr::new(dialled, port),
        proxy_protocol: tunnel.is_some_and(|t| t.protocol == ApplicationTunnelProtocol::Proxy),
    })
}

/// Whether `local` is (an instance of) the waypoint of the service at
/// `ip`, or else of the workload at `ip`.
fn is_waypoint_of(snap: &Snapshot, network: &str, local: &Workload, ip: IpAddr) -> bool {
    let waypoint = match snap.service_by_addr(network, ip) {
        Some(s) => s.waypoint.as_ref(),
        None => snap
            .workload_by_addr(network, ip)
            .and_then(|w| w.waypoint.as_deref()),
    };
    waypoint.is_some_and(|gw| gateway_has(snap, network, gw, |w| w.uid == local.uid))
}

/// Inbound HBONE with a hostname `:authority` (`host:port`): the port on
/// `local` (the workload the tunnel was dialled to) that the service named
/// `hostname` maps `port` to. The service is one `local` backs, preferring
/// one in `local`'s own namespace (ServiceEntry hosts repeat across
/// namespaces); its port comes from `local`'s own mapping, else the
/// service's. None: no such service on this workload, or no such port.
pub fn inbound_service_port(
    snap: &Snapshot,
    local: &Workload,
    hostname: &str,
    port: u16,
) -> Option<u16> {
    let backed: Vec<&Service> = snap
        .services_by_hostname(hostname)
        .iter()
        .map(|s| &**s)
        .filter(|s| local.services.contains_key(&s.key()))
        .collect();
    let svc = backed
        .iter()
        .find(|s| s.namespace == local.namespace)
        .or(backed.first())?;
    target_port(local, svc, &svc.key(), port)
}
