//! SOCKS5 front door (RFC 1928), off unless enabled: a local client asks
//! for a destination explicitly instead of being captured, and the
//! connection then takes exactly the outbound path of 15001
//! ([`outbound::route`]).
//!
//! Supported: the "no authentication" method only, the CONNECT command
//! only, IPv4, IPv6 and domain-name destinations. Domain names are
//! resolved from the current snapshot's service hostnames (to the service
//! VIP on this node's network), never by DNS.
//!
//! The first half of this module is the wire codec: pure functions over a
//! byte buffer that say how many more bytes they need, so the server reads
//! exactly the handshake and never a byte of the payload that may follow
//! it. The second half is the per-connection front door.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;

use ringway_controlplane::Snapshot;

use crate::core::CoreInputs;
use crate::io::socket;
use crate::io::uring::Registration;
use crate::proxy::downstream::{reply_and_close, Downstream, Failure, Refusal};
use crate::proxy::outbound;
use crate::telemetry::accesslog::ConnLog;

// ---------------------------------------------------------------------------
// Codec
// ---------------------------------------------------------------------------

/// Protocol version byte of every SOCKS5 message.
pub const VERSION: u8 = 0x05;
/// Method "no authentication required".
pub const METHOD_NO_AUTH: u8 = 0x00;
/// Method reply "no acceptable methods".
pub const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;

const CMD_CONNECT: u8 = 0x01;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// The longest handshake message: a request with a 255-byte domain name
/// (VER CMD RSV ATYP LEN name PORT). A greeting is at most 2 + 255.
pub const MAX_MESSAGE: usize = 4 + 1 + 255 + 2;

/// The REP field of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReplyCode {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    NetworkUnreachable = 0x03,
    HostUnreachable = 0x04,
    ConnectionRefused = 0x05,
    TtlExpired = 0x06,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

/// The outcome of parsing a message from the bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<T> {
    /// The message is complete and used the first `usize` bytes.
    Complete(T, usize),
    /// At least this many more bytes are needed before anything can be
    /// decided (never more than the message still lacks, so reading
    /// exactly this many never consumes bytes that follow the message).
    NeedMore(usize),
    /// The bytes are not an acceptable message.
    Error(Malformed),
}

/// Why a message was rejected, and the reply the protocol has for it
/// (`None`: there is none, just close).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed {
    pub reply: Option<ReplyCode>,
    pub why: &'static str,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.why)
    }
}

/// The client's greeting (VER NMETHODS METHODS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greeting {
    /// Whether the client offered "no authentication".
    pub no_auth: bool,
}

/// Where a CONNECT request asks to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// A domain name, as sent (validated as printable ASCII, not empty).
    Domain(String, u16),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::Domain(name, port) => write!(f, "{name}:{port}"),
        }
    }
}

fn malformed(reply: Option<ReplyCode>, why: &'static str) -> Malformed {
    Malformed { reply, why }
}

/// How many more bytes are needed for `buf` to hold `want` bytes.
fn need<T>(buf: &[u8], want: usize) -> Option<Parse<T>> {
    (buf.len() < want).then(|| Parse::NeedMore(want - buf.len()))
}

/// Cannot happen (lengths are checked first); an error rather than a panic.
const INCONSISTENT: Malformed = Malformed {
    reply: Some(ReplyCode::GeneralFailure),
    why: "inconsistent request length",
};

/// The `N` bytes at `at`, or how many more are needed for them.
fn fixed<const N: usize, T>(buf: &[u8], at: usize) -> Result<[u8; N], Parse<T>> {
    if let Some(more) = need(buf, at + N) {
        return Err(more);
    }
    buf.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or(Parse::Error(INCONSISTENT))
}

/// Parses the greeting. A wrong version has no reply in the protocol
/// (the client does not speak SOCKS5): close.
pub fn parse_greeting(buf: &[u8]) -> Parse<Greeting> {
    let Some(&ver) = buf.first() else {
        return Parse::NeedMore(2);
    };
    if ver != VERSION {
        return Parse::Error(malformed(None, "not a SOCKS5 greeting (version byte)"));
    }
    let Some(&nmethods) = buf.get(1) else {
        return Parse::NeedMore(1);
    };
    let total = 2 + usize::from(nmethods);
    if let Some(more) = need(buf, total) {
        return more;
    }
    let methods = buf.get(2..total).unwrap_or_default();
    Parse::Complete(
        Greeting {
            no_auth: methods.contains(&METHOD_NO_AUTH),
        },
        total,
    )
}

/// The server's method selection: "no authentication" if offered, else
/// "no acceptable methods" (after which the server closes).
pub fn method_selection(greeting: Greeting) -> [u8; 2] {
    if greeting.no_auth {
        [VERSION, METHOD_NO_AUTH]
    } else {
        [VERSION, METHOD_NONE_ACCEPTABLE]
    }
}

/// Parses a request (VER CMD RSV ATYP DST.ADDR DST.PORT). Only CONNECT is
/// accepted; every rejection carries the reply code to answer with.
pub fn parse_request(buf: &[u8]) -> Parse<Target> {
    // Decide as early as each byte allows, so garbage is answered without
    // waiting for bytes that may never come.
    let Some(&ver) = buf.first() else {
        return Parse::NeedMore(4);
    };
    if ver != VERSION {
        return Parse::Error(malformed(
            Some(ReplyCode::GeneralFailure),
            "not a SOCKS5 request (version byte)",
        ));
    }
    let Some(&cmd) = buf.get(1) else {
        return Parse::NeedMore(3);
    };
    if cmd != CMD_CONNECT {
        return Parse::Error(malformed(
            Some(ReplyCode::CommandNotSupported),
            "only CONNECT is supported (BIND and UDP ASSOCIATE are not)",
        ));
    }
    let Some(&rsv) = buf.get(2) else {
        return Parse::NeedMore(2);
    };
    if rsv != 0 {
        return Parse::Error(malformed(
            Some(ReplyCode::GeneralFailure),
            "reserved byte of the request is not zero",
        ));
    }
    let Some(&atyp) = buf.get(3) else {
        return Parse::NeedMore(1);
    };
    match atyp {
        ATYP_IPV4 => match fixed::<6, Target>(buf, 4) {
            Ok(b) => {
                let [a, b2, c, d, p0, p1] = b;
                let addr = SocketAddr::new(
                    Ipv4Addr::new(a, b2, c, d).into(),
                    u16::from_be_bytes([p0, p1]),
                );
                Parse::Complete(Target::Addr(addr), 4 + 6)
            }
            Err(more) => more,
        },
        ATYP_IPV6 => match fixed::<18, Target>(buf, 4) {
            Ok(b) => {
                let [ip @ .., p0, p1] = b;
                let addr = SocketAddr::new(Ipv6Addr::from(ip).into(), u16::from_be_bytes([p0, p1]));
                Parse::Complete(Target::Addr(addr), 4 + 18)
            }
            Err(more) => more,
        },
        ATYP_DOMAIN => {
            let Some(&len) = buf.get(4) else {
                return Parse::NeedMore(1);
            };
            if len == 0 {
                return Parse::Error(malformed(
                    Some(ReplyCode::GeneralFailure),
                    "empty domain name",
                ));
            }
            let len = usize::from(len);
            let total = 5 + len + 2;
            if let Some(more) = need(buf, total) {
                return more;
            }
            let Some((name, port)) = buf
                .get(5..total)
                .and_then(|rest| rest.split_at_checked(len))
            else {
                return Parse::Error(INCONSISTENT);
            };
            if !name.iter().all(u8::is_ascii_graphic) {
                return Parse::Error(malformed(
                    Some(ReplyCode::GeneralFailure),
                    "domain name is not printable ASCII",
                ));
            }
            let port: [u8; 2] = port.try_into().unwrap_or_default();
            // All printable ASCII, so valid UTF-8.
            let name = String::from_utf8_lossy(name).into_owned();
            Parse::Complete(Target::Domain(name, u16::from_be_bytes(port)), total)
        }
        _ => Parse::Error(malformed(
            Some(ReplyCode::AddressTypeNotSupported),
            "unknown address type",
        )),
    }
}

/// Encodes a reply (VER REP RSV ATYP BND.ADDR BND.PORT).
pub fn encode_reply(code: ReplyCode, bound: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 16 + 2);
    out.extend_from_slice(&[VERSION, code as u8, 0]);
    match bound.ip() {
        IpAddr::V4(ip) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&bound.port().to_be_bytes());
    out
}

/// 0.0.0.0:0, the bound address of failure replies and HBONE tunnels.
pub const UNSPECIFIED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// The reply code for an outbound failure.
pub fn reply_code(failure: Failure) -> ReplyCode {
    match failure {
        Failure::Loop | Failure::NotAllowed => ReplyCode::NotAllowed,
        Failure::ConnectionRefused => ReplyCode::ConnectionRefused,
        Failure::HostUnreachable => ReplyCode::HostUnreachable,
        Failure::NetworkUnreachable => ReplyCode::NetworkUnreachable,
        Failure::General => ReplyCode::GeneralFailure,
    }
}

// ---------------------------------------------------------------------------
// Front door
// ---------------------------------------------------------------------------

/// Resolves a domain name from the snapshot: a service hostname (the
/// canonical service first, when several namespaces share the name) to
/// that service's VIP on `network`, IPv4 preferred. An IP literal sent as
/// a name is taken as that IP.
pub fn resolve(snap: &Snapshot, network: &str, name: &str) -> Option<IpAddr> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let name = name.to_ascii_lowercase();
    let services = snap.services_by_hostname(&name);
    let ordered = services
        .iter()
        .filter(|s| s.canonical)
        .chain(services.iter().filter(|s| !s.canonical));
    for svc in ordered {
        let ours = || svc.vips.iter().filter(|v| v.network == network);
        if let Some(v) = ours().find(|v| v.ip.is_ipv4()).or_else(|| ours().next()) {
            return Some(v.ip);
        }
    }
    None
}

/// The SOCKS5 client learns the upstream outcome from a reply.
struct Socks5Client;

impl Downstream for Socks5Client {
    fn established(&mut self, upstream: Option<BorrowedFd<'_>>) -> Option<Vec<u8>> {
        let bound = upstream.and_then(|fd| socket::local_addr(fd).ok());
        Some(encode_reply(
            ReplyCode::Succeeded,
            bound.unwrap_or(UNSPECIFIED),
        ))
    }

    fn failed(&mut self, failure: Failure) -> Refusal {
        Refusal::Reply(encode_reply(reply_code(failure), UNSPECIFIED))
    }
}

/// Why the handshake ended without a destination.
struct Abort {
    reply: Option<ReplyCode>,
    why: String,
}

impl From<Malformed> for Abort {
    fn from(m: Malformed) -> Self {
        Abort {
            reply: m.reply,
            why: m.why.to_string(),
        }
    }
}

/// Serves one SOCKS5 connection: handshake (bounded by
/// --handshake-timeout), resolve, then the shared outbound route.
pub async fn serve(core: Rc<CoreInputs>, client: OwnedFd, mut log: ConnLog) {
    let fd = client.as_raw_fd();
    let _ = log.client_addr(client.as_fd());
    let limit = core.cfg.handshake_timeout;
    let target = match crate::hbone::with_timeout(limit, handshake(&core, fd)).await {
        None => {
            return log.fail(format!(
                "SOCKS5: handshake not completed within {limit:?} (--handshake-timeout)"
            ))
        }
        Some(Err(abort)) => {
            if let Some(code) = abort.reply {
                reply_and_close(&core, fd, &encode_reply(code, UNSPECIFIED)).await;
            }
            return log.fail(format!("SOCKS5: {}", abort.why));
        }
        Some(Ok(t)) => t,
    };
    let dst = match &target {
        Target::Addr(a) => SocketAddr::new(a.ip().to_canonical(), a.port()),
        Target::Domain(name, port) => {
            let ip = resolve(&core.snapshot(), &core.cfg.network, name);
            match ip {
                Some(ip) => SocketAddr::new(ip, *port),
                None => {
                    let reply = encode_reply(ReplyCode::HostUnreachable, UNSPECIFIED);
                    reply_and_close(&core, fd, &reply).await;
                    return log.fail(format!(
                        "SOCKS5: {name} is not a known service hostname (host unreachable)"
                    ));
                }
            }
        }
    };
    outbound::route(core, client, dst, log, Socks5Client).await;
}

/// Greeting, method selection, request.
async fn handshake(core: &CoreInputs, fd: RawFd) -> Result<Target, Abort> {
    let mut buf = [0u8; MAX_MESSAGE];
    let greeting = read_message(core, fd, &mut buf, parse_greeting).await?;
    let selection = method_selection(greeting);
    write(core, fd, &selection).await?;
    if !greeting.no_auth {
        return Err(Abort {
            reply: None,
            why:
                "the client offered no acceptable method (only \"no authentication\" is supported)"
                    .into(),
        });
    }
    read_message(core, fd, &mut buf, parse_request).await
}

/// Reads exactly as many bytes as `parse` asks for until it decides.
async fn read_message<T>(
    core: &CoreInputs,
    fd: RawFd,
    buf: &mut [u8; MAX_MESSAGE],
    parse: fn(&[u8]) -> Parse<T>,
) -> Result<T, Abort> {
    let mut len = 0;
    loop {
        match parse(buf.get(..len).unwrap_or_default()) {
            Parse::Complete(v, _) => return Ok(v),
            Parse::Error(m) => return Err(m.into()),
            Parse::NeedMore(n) => {
                let Some(room) = buf.get_mut(len..len.saturating_add(n)) else {
                    return Err(Abort {
                        reply: Some(ReplyCode::GeneralFailure),
                        why: "handshake message too long".into(),
                    });
                };
                let got = crate::io::stream::read_some(&Registration::new(&core.poller, fd), room)
                    .await
                    .map_err(|e| Abort {
                        reply: None,
                        why: format!("handshake read failed: {e}"),
                    })?;
                if got == 0 {
                    return Err(Abort {
                        reply: None,
                        why: "the client closed during the handshake (truncated message)".into(),
                    });
                }
                len += got;
            }
        }
    }
}

async fn write(core: &CoreInputs, fd: RawFd, bytes: &[u8]) -> Result<(), Abort> {
    crate::io::stream::write_all(&Registration::new(&core.poller, fd), bytes)
        .await
        .map_err(|e| Abort {
            reply: None,
            why: format!("handshake write failed: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `msg` one byte at a time: every prefix must ask for more
    /// (never beyond the message), the whole must parse.
    fn bytewise<T: fmt::Debug>(msg: &[u8], parse: fn(&[u8]) -> Parse<T>) -> Parse<T> {
        for cut in 0..msg.len() {
            match parse(&msg[..cut]) {
                Parse::NeedMore(n) => {
                    assert!(n >= 1 && cut + n <= msg.len(), "cut {cut}: asks for {n}")
                }
                other => panic!("prefix of {cut} bytes: {other:?}"),
            }
        }
        parse(msg)
    }

    /// Simulates the server's read loop: read exactly what is asked for.
    fn read_loop<T: fmt::Debug>(stream: &[u8], parse: fn(&[u8]) -> Parse<T>) -> (Parse<T>, usize) {
        let mut len = 0;
        loop {
            match parse(&stream[..len]) {
                Parse::NeedMore(n) => {
                    assert!(len + n <= stream.len(), "would block for {n} more");
                    len += n;
                }
                other => return (other, len),
            }
        }
    }

    #[test]
    fn greeting_no_auth_offered() {
        let msg = [5, 3, 2, 1, 0];
        assert_eq!(
            bytewise(&msg, parse_greeting),
            Parse::Complete(Greeting { no_auth: true }, 5)
        );
        assert_eq!(method_selection(Greeting { no_auth: true }), [5, 0]);
    }

    #[test]
    fn greeting_without_no_auth_gets_ff() {
        let msg = [5, 2, 1, 2];
        let Parse::Complete(g, 4) = bytewise(&msg, parse_greeting) else {
            panic!()
        };
        assert!(!g.no_auth);
        assert_eq!(method_selection(g), [5, 0xFF]);
        // Zero methods offered: nothing acceptable either.
        let Parse::Complete(g, 2) = bytewise(&[5, 0], parse_greeting) else {
            panic!()
        };
        assert_eq!(method_selection(g), [5, 0xFF]);
    }

    #[test]
    fn greeting_all_255_methods() {
        let mut msg = vec![5, 255];
        msg.extend((0..255).map(|i| (i + 1) as u8));
        msg[256] = 0; // the last one offered is no-auth
        assert_eq!(
            bytewise(&msg, parse_greeting),
            Parse::Complete(Greeting { no_auth: true }, 257)
        );
    }

    #[test]
    fn greeting_wrong_version_closes() {
        for v in [0u8, 4, 6, b'G', 0xFF] {
            match parse_greeting(&[v]) {
                Parse::Error(m) => assert_eq!(m.reply, None),
                other => panic!("{other:?}"),
            }
        }
        // SOCKS4 CONNECT.
        assert!(matches!(
            parse_greeting(&[4, 1, 0, 80, 127, 0, 0, 1, 0]),
            Parse::Error(_)
        ));
    }

    #[test]
    fn greeting_does_not_consume_what_follows() {
        // A pipelining client: greeting and request in one segment.
        let mut stream = vec![5, 1, 0];
        stream.extend([5, 1, 0, 1, 10, 0, 0, 1, 0, 80]);
        let (r, used) = read_loop(&stream, parse_greeting);
        assert_eq!(r, Parse::Complete(Greeting { no_auth: true }, 3));
        assert_eq!(used, 3);
        let (r, used) = read_loop(&stream[3..], parse_request);
        assert_eq!(
            r,
            Parse::Complete(Target::Addr("10.0.0.1:80".parse().unwrap()), 10)
        );
        assert_eq!(used, 10);
    }

    #[test]
    fn request_ipv4() {
        let msg = [5, 1, 0, 1, 192, 168, 1, 2, 0x1F, 0x90];
        assert_eq!(
            bytewise(&msg, parse_request),
            Parse::Complete(Target::Addr("192.168.1.2:8080".parse().unwrap()), 10)
        );
    }

    #[test]
    fn request_ipv6() {
        let mut msg = vec![5, 1, 0, 4];
        msg.extend("fd00::1:2".parse::<Ipv6Addr>().unwrap().octets());
        msg.extend(443u16.to_be_bytes());
        assert_eq!(
            bytewise(&msg, parse_request),
            Parse::Complete(Target::Addr("[fd00::1:2]:443".parse().unwrap()), 22)
        );
    }

    #[test]
    fn request_domain() {
        let name = b"echo.default.svc.cluster.local";
        let mut msg = vec![5, 1, 0, 3, name.len() as u8];
        msg.extend(name);
        msg.extend(80u16.to_be_bytes());
        assert_eq!(
            bytewise(&msg, parse_request),
            Parse::Complete(
                Target::Domain("echo.default.svc.cluster.local".into(), 80),
                msg.len()
            )
        );
    }

    #[test]
    fn request_domain_of_max_length() {
        let mut msg = vec![5, 1, 0, 3, 255];
        msg.extend(std::iter::repeat_n(b'a', 255));
        msg.extend(1u16.to_be_bytes());
        assert_eq!(msg.len(), MAX_MESSAGE);
        let Parse::Complete(Target::Domain(name, 1), used) = bytewise(&msg, parse_request) else {
            panic!()
        };
        assert_eq!((name.len(), used), (255, MAX_MESSAGE));
    }

    #[test]
    fn request_domain_empty_or_binary() {
        let r = parse_request(&[5, 1, 0, 3, 0, 0, 80]);
        assert!(
            matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::GeneralFailure)),
            "{r:?}"
        );
        // Already decided on the length byte, before the rest arrives.
        assert!(matches!(parse_request(&[5, 1, 0, 3, 0]), Parse::Error(_)));
        let r = parse_request(&[5, 1, 0, 3, 3, b'a', 0, b'b', 0, 80]);
        assert!(
            matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::GeneralFailure)),
            "{r:?}"
        );
        let r = parse_request(&[5, 1, 0, 3, 2, b'a', b' ', 0, 80]);
        assert!(matches!(r, Parse::Error(_)), "{r:?}");
    }

    #[test]
    fn request_trailing_bytes_are_not_consumed() {
        let mut msg = vec![5, 1, 0, 1, 127, 0, 0, 1, 0, 80];
        msg.extend(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            parse_request(&msg),
            Parse::Complete(Target::Addr("127.0.0.1:80".parse().unwrap()), 10)
        );
    }

    #[test]
    fn request_unsupported_commands() {
        for cmd in [2u8, 3, 0, 4, 0xFF] {
            let r = parse_request(&[5, cmd]);
            assert!(
                matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::CommandNotSupported)),
                "cmd {cmd}: {r:?}"
            );
        }
    }

    #[test]
    fn request_unknown_address_type() {
        for atyp in [0u8, 2, 5, 0xFF] {
            let r = parse_request(&[5, 1, 0, atyp, 1, 2, 3, 4, 0, 80]);
            assert!(
                matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::AddressTypeNotSupported)),
                "atyp {atyp}: {r:?}"
            );
        }
    }

    #[test]
    fn request_garbage_and_bad_version() {
        for garbage in [&b"GET / HTTP/1.1\r\n"[..], &[4, 1, 0, 80], &[0, 0, 0, 0]] {
            let r = parse_request(garbage);
            assert!(
                matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::GeneralFailure)),
                "{garbage:?}: {r:?}"
            );
        }
        let r = parse_request(&[5, 1, 7, 1]);
        assert!(
            matches!(r, Parse::Error(m) if m.reply == Some(ReplyCode::GeneralFailure)),
            "nonzero RSV: {r:?}"
        );
    }

    #[test]
    fn truncated_inputs_ask_for_more() {
        assert_eq!(parse_greeting(&[]), Parse::NeedMore(2));
        assert_eq!(parse_greeting(&[5]), Parse::NeedMore(1));
        assert_eq!(parse_greeting(&[5, 3, 0]), Parse::NeedMore(2));
        assert_eq!(parse_request(&[]), Parse::NeedMore(4));
        assert_eq!(parse_request(&[5, 1, 0, 1, 10]), Parse::NeedMore(5));
        assert_eq!(parse_request(&[5, 1, 0, 4]), Parse::NeedMore(18));
        assert_eq!(parse_request(&[5, 1, 0, 3]), Parse::NeedMore(1));
        assert_eq!(parse_request(&[5, 1, 0, 3, 10, b'a']), Parse::NeedMore(11));
    }

    #[test]
    fn every_prefix_of_random_input_is_safe() {
        // No panic, no out-of-bounds request for more, whatever the bytes.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let len = rng.usize(0..300);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if rng.bool() && !buf.is_empty() {
                buf[0] = 5;
            }
            if let Parse::NeedMore(n) = parse_greeting(&buf) {
                assert!(n >= 1 && buf.len() + n <= MAX_MESSAGE);
            }
            if let Parse::NeedMore(n) = parse_request(&buf) {
                assert!(n >= 1 && buf.len() + n <= MAX_MESSAGE);
            }
        }
    }

    #[test]
    fn reply_encoding_v4_and_v6() {
        assert_eq!(
            encode_reply(ReplyCode::Succeeded, "10.1.2.3:40000".parse().unwrap()),
            vec![5, 0, 0, 1, 10, 1, 2, 3, 0x9C, 0x40]
        );
        assert_eq!(
            encode_reply(ReplyCode::ConnectionRefused, UNSPECIFIED),
            vec![5, 5, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        let v6 = encode_reply(ReplyCode::Succeeded, "[::1]:443".parse().unwrap());
        let mut want = vec![5, 0, 0, 4];
        want.extend(Ipv6Addr::LOCALHOST.octets());
        want.extend([1, 0xBB]);
        assert_eq!(v6, want);
        assert_eq!(v6.len(), 22);
    }

    #[test]
    fn failure_codes() {
        assert_eq!(reply_code(Failure::Loop), ReplyCode::NotAllowed);
        assert_eq!(reply_code(Failure::NotAllowed), ReplyCode::NotAllowed);
        assert_eq!(
            reply_code(Failure::ConnectionRefused),
            ReplyCode::ConnectionRefused
        );
        assert_eq!(
            reply_code(Failure::HostUnreachable),
            ReplyCode::HostUnreachable
        );
        assert_eq!(reply_code(Failure::General), ReplyCode::GeneralFailure);
    }

    fn snapshot(yaml: &str) -> Snapshot {
        ringway_controlplane::sources::local::load_snapshot(yaml, "test").unwrap()
    }

    #[test]
    fn resolves_service_hostnames_to_vips() {
        let snap = snapshot(
            r#"
services:
- name: a
  namespace: one
  hostname: shared.example.com
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
- name: a
  namespace: two
  hostname: shared.example.com
  vips: ["/10.96.0.2", "/fd00::2"]
  ports: {80: 8080}
  canonical: true
- name: b
  namespace: one
  hostname: dual.example.com
  vips: ["/fd00::3", "/10.96.0.3", "other/10.200.0.3"]
  ports: {80: 8080}
"#,
        );
        assert_eq!(
            resolve(&snap, "", "dual.example.com"),
            Some("10.96.0.3".parse().unwrap())
        );
        assert_eq!(
            resolve(&snap, "other", "DUAL.example.com."),
            Some("10.200.0.3".parse().unwrap())
        );
        assert_eq!(
            resolve(&snap, "", "shared.example.com"),
            Some("10.96.0.2".parse().unwrap()),
            "the canonical service wins"
        );
        assert_eq!(resolve(&snap, "", "nope.example.com"), None);
        assert_eq!(resolve(&snap, "nowhere", "dual.example.com"), None);
        assert_eq!(
            resolve(&snap, "", "10.9.8.7"),
            Some("10.9.8.7".parse().unwrap())
        );
        assert_eq!(
            resolve(&snap, "", "::ffff:127.0.0.1"),
            Some("127.0.0.1".parse().unwrap())
        );
    }
}
