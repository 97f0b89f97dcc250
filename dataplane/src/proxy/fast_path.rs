//! The same-node fast path: HBONE to a workload this ringway serves itself
//! is served in-process as inbound, with the same authorization and access
//! logs, no TLS and one TCP hop less. The outbound path decides when it
//! applies ([`on_this_node`]) and hands the connection over
//! ([`serve_local`]).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

use ringway_controlplane::model::identity::Identity;
use ringway_controlplane::Snapshot;

use crate::core::authorization::{self, local_workload, Inbound};
use crate::core::CoreInputs;
use crate::io::listener::TrafficPath;
use crate::proxy::direct::direct_until_revoked;
use crate::proxy::downstream::{refuse, Downstream, Failure};
use crate::telemetry::accesslog::ConnLog;
use crate::telemetry::metrics::{ConnLabels, Reporter};

/// Whether `dst` is a workload this ringway itself serves, so that the
/// fast path may skip the HBONE hop. Only with `--node-name`: without it
/// every workload in the config counts as local for inbound, and taking the
/// fast path to one on another node would send its traffic there as
/// plaintext. In dedicated mode only the proxy workload itself is served
/// here.
pub fn on_this_node(core: &CoreInputs, snapshot: &Snapshot, dst: SocketAddr) -> bool {
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
pub struct LocalNext {
    pub authority: SocketAddr,
    pub src_identity: Identity,
    #[allow(clippy::redundant_allocation)] // the core's snapshot type
    pub snapshot: Rc<Arc<Snapshot>>,
}

/// The same-node fast path: what the HBONE hop to this ringway's own 15008
/// would have done, in-process. The destination's policies decide with the
/// source workload's identity as the peer (as they would after mTLS); the
/// connection is registered for late rejection; the application is reached
/// directly. Two access-log lines, as two hops would write: this outbound
/// one (route `same_node`) and an inbound one.
pub async fn serve_local(
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
