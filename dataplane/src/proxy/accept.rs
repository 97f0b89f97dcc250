//! Where connections enter a core: each listener's accept loop, and the
//! dispatch of an accepted connection to the traffic path its listener
//! feeds.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use crate::core::admission::Admitted;
use crate::core::{cancelled, CoreInputs};
use crate::inpod::PodScope;
use crate::io::listener::{BoundListener, TrafficPath};
use crate::io::socket;
use crate::io::uring::Registration;
use crate::proxy::{inbound, inbound_passthrough, outbound, socks5};
use crate::telemetry::accesslog::ConnLog;

/// How long an accept loop waits, at most, for a connection to close
/// after the fd table was full (something else may have freed fds).
const FD_EXHAUSTED_RETRY: Duration = Duration::from_millis(250);

/// Accepts until the task is dropped (which closes the socket: drain).
/// Each connection runs as its own task; its [`ConnLog`] exists from
/// accept on, so drain counts it even before the task first runs.
///
/// At a cap, or with the fd table full, the loop stops accepting until a
/// connection of this core closes: new connections wait in the kernel's
/// backlog (and past it the kernel drops SYNs, which clients retry)
/// rather than being accepted and reset. Accept-and-reset would spend an
/// fd and a syscall pair per attempt on exactly the peer that is flooding,
/// and would turn away a client that would have been served a moment
/// later; waiting costs nothing while it lasts.
///
/// `pod`: in-pod mode, the enrolled pod this listener is in; its
/// connections are made and counted there.
pub async fn accept_loop(core: Rc<CoreInputs>, listener: BoundListener, pod: Option<Rc<PodScope>>) {
    let fd = listener.fd.as_raw_fd();
    let reg = Registration::new(&core.poller, fd);
    let path = listener.path;
    let admission = core.admission.clone();
    loop {
        if let Some(cap) = admission.full(path) {
            core.metrics.stats.conn_cap_reached[path.index()].add(1);
            if let Some(suppressed) = admission.log.allow() {
                tracing::warn!(
                    core = core.index,
                    path = path.name(),
                    addr = %listener.addr,
                    cap,
                    open = admission.open(path),
                    suppressed,
                    "connection cap reached; not accepting on this listener until a connection closes"
                );
            }
            admission.closed().await;
            continue;
        }
        match socket::accept(listener.fd.as_fd()) {
            Ok((conn, peer)) => {
                let admitted = match admission.admit(path, peer.map(|p| p.ip())) {
                    Ok(a) => a,
                    Err(cap) => {
                        // One peer at its share: refuse it alone, at
                        // once, so that it cannot fill the backlog that
                        // everyone else waits in.
                        refuse_peer(&core, &listener, conn, peer, cap);
                        crate::io::executor::yield_if_needed().await;
                        continue;
                    }
                };
                let mut log =
                    ConnLog::new(core.open.clone(), core.index, path).in_pod(pod.as_ref());
                log.src = peer;
                crate::io::executor::spawn_detached(serve(core.clone(), conn, log, admitted));
                crate::io::executor::yield_if_needed().await;
            }
            Err(e) if socket::would_block(&e) => {
                if let Err(e) = reg.ready(libc::POLLIN).await {
                    tracing::error!(addr = %listener.addr, error = %e, "listener readiness failed");
                    crate::io::executor::timer::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) if is_transient(&e) => continue,
            Err(e) if is_fd_exhausted(&e) => {
                // The fd table is full: the caps leave headroom for the
                // side ports and control channels, so something else
                // took it. Wait for a close rather than spin.
                core.metrics.stats.accept_fd_exhausted.add(1);
                if let Some(suppressed) = admission.log.allow() {
                    tracing::warn!(
                        core = core.index,
                        path = path.name(),
                        addr = %listener.addr,
                        error = %e,
                        suppressed,
                        "out of file descriptors; not accepting until a connection closes"
                    );
                }
                let retry = crate::io::executor::timer::sleep(FD_EXHAUSTED_RETRY);
                futures_lite::future::or(admission.closed(), retry).await;
            }
            Err(e) => {
                // Out of memory, say: back off instead of spinning, the
                // queued connections wait in the backlog meanwhile.
                tracing::warn!(addr = %listener.addr, error = %e, "accept failed; retrying in 50ms");
                crate::io::executor::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Resets a connection from a peer that holds its share of the
/// listener's connections, counted and logged (rate-limited).
fn refuse_peer(
    core: &CoreInputs,
    listener: &BoundListener,
    conn: OwnedFd,
    peer: Option<SocketAddr>,
    cap: usize,
) {
    socket::set_reset_on_close(conn.as_raw_fd());
    drop(conn);
    core.metrics.stats.peer_cap_refused[listener.path.index()].add(1);
    if let Some(suppressed) = core.admission.log.allow() {
        tracing::warn!(
            core = core.index,
            path = listener.path.name(),
            addr = %listener.addr,
            peer = ?peer,
            cap,
            suppressed,
            "peer connection cap reached; resetting its new connections until one closes"
        );
    }
}

fn is_fd_exhausted(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::ECONNABORTED) | Some(libc::EPROTO) | Some(libc::EPERM)
    )
}

/// Runs one accepted connection on its traffic path, until it ends or the
/// drain deadline cancels it.
///
/// Not an `async fn`: a task is as large as its future, and an async fn
/// keeps room for its arguments (the access log among them) for its whole
/// life even after moving them on. Here the path's future is built and
/// boxed first, so the task holds only the box and the drain watch; each
/// path's box is sized for that path alone.
fn serve(
    core: Rc<CoreInputs>,
    conn: OwnedFd,
    log: ConnLog,
    admitted: Admitted,
) -> impl Future<Output = ()> {
    let deadline = cancelled(&core, log.pod.as_deref().map(|p| &**p));
    let path: Pin<Box<dyn Future<Output = ()>>> = match log.path() {
        TrafficPath::Outbound => match outbound::serve(core, conn, log) {
            Some(route) => Box::pin(route),
            None => Box::pin(std::future::ready(())),
        },
        TrafficPath::InboundPassthrough => Box::pin(inbound_passthrough::serve(core, conn, log)),
        TrafficPath::Inbound => Box::pin(inbound::serve(core, conn, log)),
        TrafficPath::Socks5 => Box::pin(socks5::serve(core, conn, log)),
    };
    async move {
        futures_lite::future::or(path, deadline).await;
        drop(admitted);
    }
}
