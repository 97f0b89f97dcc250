//! Where connections enter a core: each listener's accept loop, and the
//! dispatch of an accepted connection to the traffic path its listener
//! feeds.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use crate::core::{cancelled, CoreInputs};
use crate::inpod::PodScope;
use crate::io::listener::{BoundListener, TrafficPath};
use crate::io::socket;
use crate::io::uring::Registration;
use crate::proxy::{inbound, inbound_passthrough, outbound, socks5};
use crate::telemetry::accesslog::ConnLog;

/// Accepts until the task is dropped (which closes the socket: drain).
/// Each connection runs as its own task; its [`ConnLog`] exists from
/// accept on, so drain counts it even before the task first runs.
///
/// `pod`: in-pod mode, the enrolled pod this listener is in; its
/// connections are made and counted there.
pub async fn accept_loop(core: Rc<CoreInputs>, listener: BoundListener, pod: Option<Rc<PodScope>>) {
    let fd = listener.fd.as_raw_fd();
    let reg = Registration::new(&core.poller, fd);
    loop {
        match socket::accept(listener.fd.as_fd()) {
            Ok((conn, peer)) => {
                let mut log =
                    ConnLog::new(core.open.clone(), core.index, listener.path).in_pod(pod.as_ref());
                log.src = peer;
                crate::io::executor::spawn_detached(serve(core.clone(), conn, log));
                crate::io::executor::yield_if_needed().await;
            }
            Err(e) if socket::would_block(&e) => {
                if let Err(e) = reg.ready(libc::POLLIN).await {
                    tracing::error!(addr = %listener.addr, error = %e, "listener readiness failed");
                    crate::io::executor::timer::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) if is_transient(&e) => continue,
            Err(e) => {
                // Out of fds or memory: back off instead of spinning, the
                // queued connections wait in the backlog meanwhile.
                tracing::warn!(addr = %listener.addr, error = %e, "accept failed; retrying in 50ms");
                crate::io::executor::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
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
fn serve(core: Rc<CoreInputs>, conn: OwnedFd, log: ConnLog) -> impl Future<Output = ()> {
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
    }
}
