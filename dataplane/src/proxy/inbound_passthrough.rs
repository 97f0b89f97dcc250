//! Inbound passthrough (15006): plaintext traffic to a local workload,
//! captured by nat REDIRECT (original destination from SO_ORIGINAL_DST) or
//! by TPROXY (the accepted socket's local address *is* the original
//! destination). The destination must be a local workload and its
//! policies must admit a connection without a peer identity (so a STRICT
//! mTLS policy refuses it); then it is forwarded to that destination with
//! the same copy engine, until it ends or a later config denies it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;

use crate::core::authorization::{self, Inbound};
use crate::core::CoreInputs;
use crate::inpod::is_pods_own;
use crate::io::socket;
use crate::proxy::direct::direct_until_revoked;
use crate::proxy::downstream::Transparent;
use crate::telemetry::accesslog::{ConnLog, Names};
use crate::telemetry::metrics::{ConnLabels, Reporter};

pub async fn serve(core: Rc<CoreInputs>, client: OwnedFd, mut log: ConnLog) {
    let fd = client.as_raw_fd();
    let src = match log.client_addr(client.as_fd()) {
        Ok(a) => a,
        Err(e) => return log.fail(format!("cannot read the peer address: {e}")),
    };
    let dst = match socket::captured_dst(client.as_fd(), Some(src), true) {
        Ok(d) => d,
        Err(e) => return log.fail(format!("cannot read the original destination: {e}")),
    };
    log.dst = Some(dst);
    // Covers both a direct (un-captured) connection to 15006 and a captured
    // one aimed at any of our ports: forwarding either would loop.
    if core.self_addrs.is_self(dst) || core.self_addrs.ports.contains(&dst.port()) {
        return log.fail(format!(
            "refused: {dst} is one of ringway's own listener ports (not captured traffic, or a loop)"
        ));
    }
    log.route = "passthrough";
    let inbound = Inbound {
        src: src.ip(),
        dst,
        peer: None,
    };
    let snapshot = core.snapshot();
    let network = &core.cfg.network;
    let source = snapshot.workload_by_addr(network, src.ip()).map(|w| &**w);
    let destination = authorization::local_workload(&snapshot, &core.cfg, dst.ip()).map(|w| &**w);
    // In a pod (in-pod mode), only to the pod's own workload: anything else
    // would be forwarded from inside this pod's namespace.
    let own = match (log.pod.as_deref(), destination) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(format!("no local workload at {}", dst.ip())),
        (Some(pod), Some(d)) => is_pods_own(Some(pod), &snapshot, d),
    };
    if let Err(why) = own {
        drop(snapshot);
        socket::set_reset_on_close(fd);
        return log.fail(format!("refused: {why}"));
    }
    log.names = Names::new(source, destination, None);
    log.count(core.metrics.counters(&ConnLabels {
        reporter: Reporter::Destination,
        src: source,
        src_principal: None,
        dst: destination,
        dst_principal: None,
        service: None,
        mtls: false,
    }));
    let admitted = authorization::admit(&core.admitted, &snapshot, &core.cfg, inbound);
    drop(snapshot);
    let ticket = match admitted {
        Ok(t) => t,
        Err(refusal) => {
            // It believes it is connected: a reset tells it otherwise.
            socket::set_reset_on_close(fd);
            return log.fail(format!("refused: {refusal}"));
        }
    };
    let log = &log;
    let mut transparent = Transparent;
    // From the client's own address when asked (--orig-src): the TCP peer.
    let from = core.cfg.orig_src.then_some(src.ip());
    direct_until_revoked(&core, client, dst, log, &mut transparent, from, &ticket).await;
}
