//! A plain TCP upstream: connect, tell the client, and move bytes with the
//! core's copy engine (splice by default) until both sides are done. The
//! outbound path uses it for direct routes; the inbound paths for the local
//! application, until a later config denies the connection.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::core::authorization;
use crate::core::CoreInputs;
use crate::io::copy::CopyOutcome;
use crate::io::idle::{until_idle, Quiet};
use crate::io::socket;
use crate::proxy::downstream::{announce, refuse, Downstream, Failure};
use crate::telemetry::accesslog::ConnLog;

/// Connects to `upstream` and proxies until both sides are done. Shared
/// with the inbound passthrough path (which passes
/// [`Transparent`](crate::proxy::downstream::Transparent)).
pub async fn proxy_direct(
    core: &CoreInputs,
    client: OwnedFd,
    upstream: SocketAddr,
    log: &ConnLog,
    downstream: &mut dyn Downstream,
    source: Option<IpAddr>,
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
    let copy = core
        .copier
        .bidirectional(&client, &server, &log.from_client, &log.to_client);
    match until_idle(copy, quiet(core, log)).await {
        Some(CopyOutcome::Closed) => log.finish("closed"),
        Some(other) => log.fail(other.describe()),
        None => idle_closed(core, log),
    }
}

/// The idle bound of `log`'s connection (`--idle-timeout`), read off the
/// bytes it counts; never completes when there is none.
pub fn quiet<'a>(core: &CoreInputs, log: &'a ConnLog) -> Quiet<'a> {
    Quiet::new(core.cfg.idle_timeout, [&log.from_client, &log.to_client])
}

/// A connection was cut by `--idle-timeout` (its sockets, or its stream,
/// close as the copy is dropped): counted, and said in its access-log line
/// (rate-limited with the other failures).
pub fn idle_closed(core: &CoreInputs, log: &ConnLog) {
    core.metrics.stats.idle_closes[log.path().index()].add(1);
    let bound = core.cfg.idle_timeout.unwrap_or_default();
    log.fail(format!(
        "closed: no byte either way for {bound:?} (--idle-timeout)"
    ));
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
    source: Option<IpAddr>,
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
