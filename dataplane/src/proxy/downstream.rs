//! What the client of a connection hears about its upstream, shared by the
//! paths: the [`Downstream`] an entry point supplies (captured traffic is
//! [`Transparent`]; SOCKS5 speaks its protocol), why a connection was not
//! made ([`Failure`]), how the client is told ([`Refusal`]), and the bounded
//! writes that carry a reply.

use std::future::Future;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;

use crate::core::CoreInputs;
use crate::hbone;
use crate::io::socket;
use crate::io::uring::Registration;
use crate::telemetry::accesslog::ConnLog;

/// How the client of an outbound connection learns what became of its
/// upstream: this is all that differs between the entry points feeding
/// [`route`](crate::proxy::outbound::route) (captured 15001 traffic, the SOCKS5 front door).
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

/// Ends a connection that will not be made: tells the client what
/// `downstream` says for `failure`, and logs `why`.
///
/// Returns the refusal boxed: `route` awaits it at six places, and an
/// unboxed refusal (with its timed reply write) would make every
/// connection's future, refused or not, reserve room for it for life.
pub fn refuse<'a>(
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
pub async fn announce(
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

/// Sends a final reply (a refusal), bounded by the handshake timeout,
/// then FIN. What the client already sent is read and dropped, so that
/// closing with unread data does not turn into an RST that could overtake
/// the reply.
pub async fn reply_and_close(core: &CoreInputs, fd: RawFd, bytes: &[u8]) {
    if matches!(timed_write_all(core, fd, bytes).await, Some(Ok(()))) {
        let _ = socket::shutdown_write(fd);
        discard_pending(fd);
    }
}

/// Writes a handshake-time message (a SOCKS5 reply), bounded by the
/// handshake timeout; None = timed out.
pub async fn timed_write_all(
    core: &CoreInputs,
    fd: RawFd,
    bytes: &[u8],
) -> Option<std::io::Result<()>> {
    let reg = Registration::new(&core.poller, fd);
    hbone::with_timeout(
        core.cfg.handshake_timeout,
        crate::io::stream::write_all(&reg, bytes),
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
    use std::net::SocketAddr;

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
