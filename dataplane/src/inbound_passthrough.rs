//! Inbound passthrough (15006): plaintext traffic to a local workload,
//! captured by nat REDIRECT (original destination from SO_ORIGINAL_DST) or
//! by TPROXY (the accepted socket's local address *is* the original
//! destination). Forwarded to that destination with the same copy engine.
//! Authorization of this path comes with the policy engine.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use crate::accesslog::ConnLog;
use crate::runtime::CoreInputs;
use crate::socket;

pub async fn serve(core: Rc<CoreInputs>, client: OwnedFd, mut log: ConnLog) {
    let fd = client.as_raw_fd();
    log.src = socket::peer_addr(fd).ok();
    let dst = match socket::captured_dst(fd, true) {
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
    log.upstream = Some(dst);
    crate::outbound::proxy_direct(&core, client, dst, &log, &mut crate::outbound::Transparent)
        .await;
}
