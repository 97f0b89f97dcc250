//! Outbound (15001): pod egress captured by nat REDIRECT. Read the original
//! destination, refuse loops, decide the route from the core's snapshot
//! ([`plan`]), then connect and move bytes.
//!
//! Routes: destinations outside the mesh and TCP-protocol workloads are
//! connected directly (passthrough); HBONE workloads are reached through an
//! mTLS HTTP/2 CONNECT tunnel under the source workload's identity; a
//! service VIP is load-balanced to one of its endpoints first. Waypoints
//! are not supported yet and are refused: ringway never falls back to
//! plaintext for a mesh destination.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use ringway_controlplane::identity::Identity;
use ringway_controlplane::model::{
    LbHealthPolicy, LbMode, TunnelProtocol, Workload, WorkloadStatus,
};
use ringway_controlplane::Snapshot;

use crate::accesslog::ConnLog;
use crate::hbone;
use crate::runtime::CoreInputs;
use crate::socket;

/// Where an outbound connection goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Plain TCP to `upstream`. `route` names why (for the access log).
    Direct {
        upstream: SocketAddr,
        route: &'static str,
    },
    /// An HBONE tunnel to the workload `identity` at `target` (its address
    /// and the real target port).
    Hbone {
        target: SocketAddr,
        identity: Identity,
    },
    /// A mesh destination this build cannot reach safely; refuse it.
    Unsupported(&'static str),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("service {0} has no healthy endpoint for port {1}")]
    NoHealthyUpstream(String, u16),
}

/// The routing decision, from the snapshot alone (no I/O), in this order:
/// service VIP → load-balanced endpoint; known workload → by its tunnel
/// protocol; anything else → passthrough to the original destination.
pub fn plan(snap: &Snapshot, network: &str, dst: SocketAddr) -> Result<Plan, PlanError> {
    if let Some(svc) = snap.service_by_vip(network, dst.ip()) {
        if svc.waypoint.is_some() {
            return Ok(Plan::Unsupported(
                "the service uses a waypoint, which this build cannot reach yet",
            ));
        }
        let key = svc.key();
        let allow_unhealthy = svc
            .load_balancer
            .as_ref()
            .is_some_and(|lb| lb.health_policy == LbHealthPolicy::AllowAll);
        let svc_target = svc
            .ports
            .iter()
            .find(|p| p.service_port == dst.port())
            .map(|p| p.target_port);
        let candidates: Vec<(&Workload, u16)> = snap
            .endpoints(&key)
            .iter()
            .filter(|w| allow_unhealthy || w.status == WorkloadStatus::Healthy)
            .filter(|w| !w.addresses.is_empty())
            .filter_map(|w| {
                let per_workload = w
                    .services
                    .get(&key)
                    .and_then(|ports| ports.iter().find(|p| p.service_port == dst.port()))
                    .map(|p| p.target_port);
                let target = per_workload.or(svc_target)?;
                Some((&**w, if target == 0 { dst.port() } else { target }))
            })
            .collect();
        if candidates.is_empty() {
            if svc
                .load_balancer
                .as_ref()
                .is_some_and(|lb| lb.mode == LbMode::Passthrough)
            {
                return Ok(Plan::Direct {
                    upstream: dst,
                    route: "service_passthrough",
                });
            }
            return Err(PlanError::NoHealthyUpstream(key, dst.port()));
        }
        let (w, port) = pick_weighted(&candidates);
        let ip = w
            .addresses
            .iter()
            .find(|a| a.is_ipv4() == dst.is_ipv4())
            .unwrap_or(&w.addresses[0]);
        let target = SocketAddr::new(*ip, port);
        return Ok(match w.protocol {
            TunnelProtocol::Hbone => Plan::Hbone {
                target,
                identity: w.identity(),
            },
            TunnelProtocol::None => Plan::Direct {
                upstream: target,
                route: "service",
            },
        });
    }
    if let Some(w) = snap.workload_by_addr(network, dst.ip()) {
        if w.waypoint.is_some() {
            return Ok(Plan::Unsupported(
                "the workload uses a waypoint, which this build cannot reach yet",
            ));
        }
        return Ok(match w.protocol {
            TunnelProtocol::Hbone => Plan::Hbone {
                target: dst,
                identity: w.identity(),
            },
            TunnelProtocol::None => Plan::Direct {
                upstream: dst,
                route: "workload",
            },
        });
    }
    Ok(Plan::Direct {
        upstream: dst,
        route: "passthrough",
    })
}

/// Weighted random choice by workload capacity (default 1).
fn pick_weighted<'a>(candidates: &[(&'a Workload, u16)]) -> (&'a Workload, u16) {
    let total: u64 = candidates
        .iter()
        .map(|(w, _)| u64::from(w.capacity.max(1)))
        .sum();
    let mut n = fastrand::u64(0..total);
    for &(w, port) in candidates {
        let c = u64::from(w.capacity.max(1));
        if n < c {
            return (w, port);
        }
        n -= c;
    }
    candidates[candidates.len() - 1]
}

/// Serves one captured outbound connection.
pub async fn serve(core: Rc<CoreInputs>, client: OwnedFd, mut log: ConnLog) {
    let fd = client.as_raw_fd();
    log.src = socket::peer_addr(fd).ok();
    let dst = match socket::captured_dst(fd, false) {
        Ok(d) => d,
        Err(e) => {
            return log.fail(format!(
                "no original destination (was the connection redirected by iptables/nftables?): {e}"
            ))
        }
    };
    log.dst = Some(dst);
    if core.self_addrs.is_self(dst) {
        return log.fail(format!(
            "refused: {dst} is one of ringway's own listeners (forwarding loop)"
        ));
    }
    let snapshot = core.snapshot();
    let upstream = match plan(&snapshot, &core.cfg.network, dst) {
        Ok(Plan::Direct { upstream, route }) => {
            log.route = route;
            upstream
        }
        Ok(Plan::Hbone { target, identity }) => {
            log.route = "hbone";
            log.dst_identity = Some(identity.to_string());
            // The tunnel speaks for the client's workload: no workload, no
            // identity, no tunnel.
            let source = log.src.and_then(|src| {
                snapshot
                    .workload_by_addr(&core.cfg.network, src.ip())
                    .cloned()
            });
            drop(snapshot);
            let Some(source) = source else {
                socket::set_reset_on_close(fd);
                return log.fail(format!(
                    "refused: no workload at source {} to speak for over HBONE (fail closed)",
                    log.src
                        .map(|s| s.ip().to_string())
                        .unwrap_or_else(|| "-".into())
                ));
            };
            return proxy_hbone(&core, client, target, identity, &source, &mut log).await;
        }
        Ok(Plan::Unsupported(why)) => {
            socket::set_reset_on_close(fd);
            return log.fail(format!("refused: {why}; never falling back to plaintext"));
        }
        Err(e) => {
            socket::set_reset_on_close(fd);
            return log.fail(format!("refused: {e}"));
        }
    };
    drop(snapshot);
    log.upstream = Some(upstream);
    proxy_direct(&core, client, upstream, &log).await;
}

/// Tunnels the client connection to `target` over HBONE.
async fn proxy_hbone(
    core: &Rc<CoreInputs>,
    client: OwnedFd,
    target: SocketAddr,
    dst_identity: Identity,
    source: &Workload,
    log: &mut ConnLog,
) {
    let fd = client.as_raw_fd();
    let src_identity = source.identity();
    log.src_identity = Some(src_identity.to_string());
    log.upstream = Some(SocketAddr::new(target.ip(), core.pool.cfg.hbone_port));
    let traceparent = hbone::new_traceparent();
    log.trace = Some(traceparent.clone());
    let tunnel = hbone::client::Tunnel {
        src_identity: &src_identity,
        dst_identity: &dst_identity,
        target,
        forwarded: hbone::forwarded_for(log.src.unwrap_or(target)),
        baggage: hbone::baggage(source),
        traceparent,
    };
    let stream = match hbone::client::open(core, tunnel).await {
        Ok(s) => s,
        Err(e) => {
            socket::set_reset_on_close(fd);
            return log.fail(format!("HBONE: {e}"));
        }
    };
    log.hbone_conn = Some(stream.conn_id);
    if let Err(e) = socket::tune_stream(&client, core.cfg.connect.keepalive) {
        tracing::debug!(error = %e, "could not tune the downstream socket");
    }
    let outcome = hbone::pump(
        &core.poller,
        fd,
        stream.send,
        stream.recv,
        &log.sent,
        &log.received,
    )
    .await;
    match outcome {
        hbone::PumpOutcome::Closed => log.finish("closed"),
        other => log.fail(other.describe()),
    }
}

/// Connects to `upstream` and proxies until both sides are done. Shared
/// with the inbound passthrough path.
pub async fn proxy_direct(core: &CoreInputs, client: OwnedFd, upstream: SocketAddr, log: &ConnLog) {
    let server = match socket::connect(&core.poller, upstream, core.cfg.connect).await {
        Ok(s) => s,
        Err(e) => {
            // The client believes it is connected: tell it the truth with RST.
            socket::set_reset_on_close(client.as_raw_fd());
            return log.fail(format!("upstream connect to {upstream} failed: {e}"));
        }
    };
    if let Err(e) = socket::tune_stream(&client, core.cfg.connect.keepalive) {
        tracing::debug!(error = %e, "could not tune the downstream socket");
    }
    let outcome = core
        .copier
        .bidirectional(&client, &server, &log.sent, &log.received)
        .await;
    match outcome {
        crate::copy::CopyOutcome::Closed => log.finish("closed"),
        other => log.fail(other.describe()),
    }
}
