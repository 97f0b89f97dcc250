//! SOCKS5 (RFC 1928): the CONNECT client the load generator uses to reach
//! a proxy's SOCKS5 front door, and a minimal relay server (no-auth,
//! CONNECT, IPv4/IPv6) that stands in for a proxy in tests and serves as a
//! plain userspace-relay baseline.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;
const ATYP_V4: u8 = 1;
const ATYP_DOMAIN: u8 = 3;
const ATYP_V6: u8 = 4;

/// Reply codes (RFC 1928 §6).
pub const REP_SUCCEEDED: u8 = 0;
pub const REP_GENERAL_FAILURE: u8 = 1;
pub const REP_HOST_UNREACHABLE: u8 = 4;
pub const REP_CONNECTION_REFUSED: u8 = 5;
pub const REP_COMMAND_NOT_SUPPORTED: u8 = 7;
pub const REP_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;

fn malformed(what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed SOCKS5 reply: {}", what.into()),
    )
}

/// The client's greeting: version 5, one method, "no authentication".
pub fn greeting() -> [u8; 3] {
    [VERSION, 1, NO_AUTH]
}

/// Checks the server's method choice.
pub fn check_method_choice(reply: [u8; 2]) -> io::Result<()> {
    match reply {
        [VERSION, NO_AUTH] => Ok(()),
        [VERSION, NO_ACCEPTABLE] => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "SOCKS5 server accepts none of our methods (we only do no-auth)",
        )),
        [VERSION, m] => Err(malformed(format!(
            "server chose method {m:#04x}, which we did not offer"
        ))),
        [v, _] => Err(malformed(format!("version {v}, expected 5"))),
    }
}

/// CONNECT request for `target` (IPv4 or IPv6 literal).
pub fn connect_request(target: SocketAddr) -> Vec<u8> {
    let mut req = vec![VERSION, CMD_CONNECT, 0];
    match target.ip() {
        IpAddr::V4(ip) => {
            req.push(ATYP_V4);
            req.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            req.push(ATYP_V6);
            req.extend_from_slice(&ip.octets());
        }
    }
    req.extend_from_slice(&target.port().to_be_bytes());
    req
}

/// BND.ADDR / BND.PORT of a successful reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    Ip(SocketAddr),
    Domain(String, u16),
}

/// What a reply code means.
pub fn reply_text(code: u8) -> &'static str {
    match code {
        0 => "succeeded",
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unassigned reply code",
    }
}

fn read_exact_or(r: &mut impl Read, buf: &mut [u8], what: &str) -> io::Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("SOCKS5 server closed the connection during the {what}"),
            )
        } else {
            e
        }
    })
}

/// Reads the server's CONNECT reply; errors for failure codes and malformed
/// replies. Reads exactly the reply, nothing of the tunnelled bytes.
pub fn read_reply(r: &mut impl Read) -> io::Result<Bound> {
    let mut head = [0u8; 4];
    read_exact_or(r, &mut head, "CONNECT reply")?;
    let [ver, rep, _rsv, atyp] = head;
    if ver != VERSION {
        return Err(malformed(format!("version {ver}, expected 5")));
    }
    // Parse the address even on failure so a malformed failure reply is
    // reported as malformed.
    let bound = match atyp {
        ATYP_V4 => {
            let mut b = [0u8; 6];
            read_exact_or(r, &mut b, "CONNECT reply")?;
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            Bound::Ip(SocketAddr::new(ip.into(), u16::from_be_bytes([b[4], b[5]])))
        }
        ATYP_V6 => {
            let mut b = [0u8; 18];
            read_exact_or(r, &mut b, "CONNECT reply")?;
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap());
            Bound::Ip(SocketAddr::new(
                ip.into(),
                u16::from_be_bytes([b[16], b[17]]),
            ))
        }
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            read_exact_or(r, &mut len, "CONNECT reply")?;
            let mut name = vec![0u8; len[0] as usize + 2];
            read_exact_or(r, &mut name, "CONNECT reply")?;
            let port = u16::from_be_bytes([name[name.len() - 2], name[name.len() - 1]]);
            name.truncate(name.len() - 2);
            let name =
                String::from_utf8(name).map_err(|_| malformed("bound domain is not UTF-8"))?;
            Bound::Domain(name, port)
        }
        other => return Err(malformed(format!("unknown address type {other}"))),
    };
    if rep != REP_SUCCEEDED {
        let kind = match rep {
            REP_CONNECTION_REFUSED => io::ErrorKind::ConnectionRefused,
            REP_HOST_UNREACHABLE | 3 => io::ErrorKind::HostUnreachable,
            2 => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::Other,
        };
        return Err(io::Error::new(
            kind,
            format!("SOCKS5 CONNECT failed: {} (code {rep})", reply_text(rep)),
        ));
    }
    Ok(bound)
}

/// Runs the no-auth CONNECT handshake on `s` (already connected to the
/// SOCKS5 server). Afterwards `s` carries the tunnelled bytes.
pub fn handshake<S: Read + Write>(s: &mut S, target: SocketAddr) -> io::Result<Bound> {
    s.write_all(&greeting())?;
    let mut choice = [0u8; 2];
    read_exact_or(s, &mut choice, "method negotiation")?;
    check_method_choice(choice)?;
    s.write_all(&connect_request(target))?;
    read_reply(s)
}

/// Starts a SOCKS5 relay on `listen` (background threads, forever).
/// Returns the bound address.
pub fn spawn_relay(listen: SocketAddr) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(listen)?;
    let bound = l.local_addr()?;
    thread::Builder::new()
        .name("socks5-relay".into())
        .spawn(move || {
            for conn in l.incoming() {
                match conn {
                    Ok(s) => {
                        thread::spawn(move || {
                            if let Err(e) = relay_one(s) {
                                if e.kind() != io::ErrorKind::UnexpectedEof {
                                    eprintln!("socks5 relay: {e}");
                                }
                            }
                        });
                    }
                    Err(e) => {
                        eprintln!("socks5 relay: accept: {e}");
                        thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })?;
    Ok(bound)
}

fn reply(s: &mut TcpStream, code: u8, bound: SocketAddr) -> io::Result<()> {
    let mut r = connect_request(bound);
    r[1] = code;
    s.write_all(&r)
}

fn relay_one(mut s: TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut head = [0u8; 2];
    s.read_exact(&mut head)?;
    if head[0] != VERSION {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not SOCKS5"));
    }
    let mut methods = vec![0u8; head[1] as usize];
    s.read_exact(&mut methods)?;
    if !methods.contains(&NO_AUTH) {
        s.write_all(&[VERSION, NO_ACCEPTABLE])?;
        return Ok(());
    }
    s.write_all(&[VERSION, NO_AUTH])?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req)?;
    let target = match req[3] {
        ATYP_V4 => {
            let mut b = [0u8; 6];
            s.read_exact(&mut b)?;
            SocketAddr::from((
                Ipv4Addr::new(b[0], b[1], b[2], b[3]),
                u16::from_be_bytes([b[4], b[5]]),
            ))
        }
        ATYP_V6 => {
            let mut b = [0u8; 18];
            s.read_exact(&mut b)?;
            SocketAddr::from((
                Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap()),
                u16::from_be_bytes([b[16], b[17]]),
            ))
        }
        _ => return reply(&mut s, REP_ADDRESS_TYPE_NOT_SUPPORTED, unspecified),
    };
    if req[1] != CMD_CONNECT {
        return reply(&mut s, REP_COMMAND_NOT_SUPPORTED, unspecified);
    }
    let up = match TcpStream::connect_timeout(&target, Duration::from_secs(10)) {
        Ok(up) => up,
        Err(e) => {
            let code = match e.kind() {
                io::ErrorKind::ConnectionRefused => REP_CONNECTION_REFUSED,
                io::ErrorKind::HostUnreachable | io::ErrorKind::TimedOut => REP_HOST_UNREACHABLE,
                _ => REP_GENERAL_FAILURE,
            };
            return reply(&mut s, code, unspecified);
        }
    };
    up.set_nodelay(true)?;
    reply(&mut s, REP_SUCCEEDED, up.local_addr()?)?;
    let (mut down_r, mut up_w) = (s.try_clone()?, up.try_clone()?);
    let upstream = thread::spawn(move || {
        let r = io::copy(&mut down_r, &mut up_w);
        let _ = up_w.shutdown(Shutdown::Write);
        r
    });
    let (mut up_r, mut down_w) = (up, s);
    let r = io::copy(&mut up_r, &mut down_w);
    let _ = down_w.shutdown(Shutdown::Write);
    upstream
        .join()
        .map_err(|_| io::Error::other("relay thread panicked"))??;
    r.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn encodes_greeting_and_requests() {
        assert_eq!(greeting(), [5, 1, 0]);
        assert_eq!(
            connect_request("10.1.2.3:8080".parse().unwrap()),
            [5, 1, 0, 1, 10, 1, 2, 3, 0x1f, 0x90]
        );
        let v6 = connect_request("[2001:db8::1]:443".parse().unwrap());
        assert_eq!(&v6[..4], &[5, 1, 0, 4]);
        assert_eq!(v6.len(), 4 + 16 + 2);
        assert_eq!(v6[4..6], [0x20, 0x01]);
        assert_eq!(v6[19], 1);
        assert_eq!(&v6[20..], &[1, 0xbb]);
    }

    #[test]
    fn method_choice() {
        check_method_choice([5, 0]).unwrap();
        let e = check_method_choice([5, 0xff]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(check_method_choice([5, 2])
            .unwrap_err()
            .to_string()
            .contains("did not offer"));
        assert!(check_method_choice([4, 0])
            .unwrap_err()
            .to_string()
            .contains("version 4"));
    }

    #[test]
    fn decodes_replies() {
        let ok4 = [5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90, 0xAA];
        let mut c = Cursor::new(&ok4[..]);
        assert_eq!(
            read_reply(&mut c).unwrap(),
            Bound::Ip("127.0.0.1:8080".parse().unwrap())
        );
        // Stops right after the reply: tunnelled bytes stay unread.
        assert_eq!(c.position(), 10);

        let mut ok6 = vec![5, 0, 0, 4];
        ok6.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        ok6.extend_from_slice(&[0, 80]);
        assert_eq!(
            read_reply(&mut Cursor::new(ok6)).unwrap(),
            Bound::Ip("[::1]:80".parse().unwrap())
        );

        let dom = [5, 0, 0, 3, 4, b'h', b'o', b's', b't', 0, 1];
        assert_eq!(
            read_reply(&mut Cursor::new(&dom[..])).unwrap(),
            Bound::Domain("host".into(), 1)
        );
    }

    #[test]
    fn rejects_failures_and_malformed_replies() {
        let refused = [5, 5, 0, 1, 0, 0, 0, 0, 0, 0];
        let e = read_reply(&mut Cursor::new(&refused[..])).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(e.to_string().contains("connection refused"), "{e}");

        let general = [5, 1, 0, 1, 0, 0, 0, 0, 0, 0];
        assert!(read_reply(&mut Cursor::new(&general[..]))
            .unwrap_err()
            .to_string()
            .contains("general SOCKS server failure"));

        for (bytes, want) in [
            (&[4u8, 0, 0, 1, 0, 0, 0, 0, 0, 0][..], "version 4"),
            (&[5, 0, 0, 9, 0, 0][..], "unknown address type 9"),
            (&[5, 0, 0, 1, 127, 0][..], "closed the connection"),
            (&[5, 0][..], "closed the connection"),
            (&[][..], "closed the connection"),
            (&[5, 0, 0, 4, 0, 0, 0][..], "closed the connection"),
            (&[5, 0, 0, 3, 2, 0xff, 0xfe, 0, 1][..], "not UTF-8"),
            (&[5, 0, 0, 3, 9, b'a'][..], "closed the connection"),
        ] {
            let e = read_reply(&mut Cursor::new(bytes)).unwrap_err();
            assert!(e.to_string().contains(want), "{bytes:?}: {e}");
        }
        // A malformed failure reply is reported as malformed, not as the
        // failure.
        let e = read_reply(&mut Cursor::new(&[5u8, 5, 0, 7][..])).unwrap_err();
        assert!(e.to_string().contains("unknown address type 7"), "{e}");
    }

    /// A scripted server: answers the greeting with `choice`, then sends
    /// `reply` after reading the request.
    fn scripted(choice: [u8; 2], reply: Vec<u8>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut g = [0u8; 3];
            s.read_exact(&mut g).unwrap();
            s.write_all(&choice).unwrap();
            if choice[1] != 0 {
                return;
            }
            let mut req = [0u8; 10];
            s.read_exact(&mut req).unwrap();
            s.write_all(&reply).unwrap();
        });
        addr
    }

    #[test]
    fn handshake_against_scripted_servers() {
        let target: SocketAddr = "10.0.0.1:9".parse().unwrap();
        let ok = scripted([5, 0], vec![5, 0, 0, 1, 1, 2, 3, 4, 0, 5]);
        let mut s = TcpStream::connect(ok).unwrap();
        assert_eq!(
            handshake(&mut s, target).unwrap(),
            Bound::Ip("1.2.3.4:5".parse().unwrap())
        );

        let noauth = scripted([5, 0xff], vec![]);
        let mut s = TcpStream::connect(noauth).unwrap();
        assert_eq!(
            handshake(&mut s, target).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );

        let truncated = scripted([5, 0], vec![5, 0, 0]);
        let mut s = TcpStream::connect(truncated).unwrap();
        assert!(handshake(&mut s, target)
            .unwrap_err()
            .to_string()
            .contains("closed the connection"));
    }

    #[test]
    fn relay_tunnels_and_reports_refusal() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let relay = spawn_relay("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut s = TcpStream::connect(relay).unwrap();
        handshake(&mut s, echo_addr).unwrap();
        s.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");

        // A port nobody listens on.
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut s = TcpStream::connect(relay).unwrap();
        let e = handshake(&mut s, closed).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }
}
