//! The fuzz harness for the SOCKS5 front door's codec (issue 25, item 6):
//! what `fuzz/fuzz_targets/socks5.rs` calls, and what
//! `tests/fuzz_corpus.rs` replays the committed corpus through on stable.
//! Not an API (`#[doc(hidden)]`); it panics when an invariant breaks.
//!
//! The bytes are what a client sends: a greeting, then a request, read as
//! the server reads them (exactly as many bytes as the parser asks for).
//! Asserted: the parser never asks for a byte past the message it is
//! reading (so the payload that follows is never consumed), and decides the
//! same on the whole buffer as byte by byte; a complete request is exactly
//! the bytes its target encodes to; every refused request has a reply code
//! (a refused greeting has none: close); a domain name resolves only to an
//! IP literal it spells or a VIP of a service with that hostname; replies
//! encode to their fixed sizes.

use std::net::IpAddr;
use std::sync::OnceLock;

use ringway_controlplane::sources::local::load_snapshot;
use ringway_controlplane::Snapshot;

use super::socks5::{
    encode_reply, method_selection, parse_greeting, parse_request, resolve, Parse, ReplyCode,
    Target, METHOD_NONE_ACCEPTABLE, METHOD_NO_AUTH, VERSION,
};

/// Services the domain names of requests are resolved against.
const MESH: &str = "services:
  - {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: [10.96.0.1, \"fd00:96::1\"]}
  - {name: echo, namespace: ns2, hostname: echo.ns1.svc.cluster.local, vips: [10.96.0.9]}
  - {name: v6, namespace: ns1, hostname: v6.ns1.svc.cluster.local, vips: [\"fd00:96::6\"]}
  - {name: remote, namespace: ns1, hostname: remote.example.com, vips: [\"net2/10.96.0.7\"]}
  - {name: novip, namespace: ns1, hostname: novip.example.com}
";

fn mesh() -> &'static Snapshot {
    static MESH_SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    MESH_SNAPSHOT.get_or_init(|| load_snapshot(MESH, "fuzz-socks5.yaml").expect("the fuzz mesh"))
}

/// The server's read loop over `stream`: reads exactly what `parse` asks
/// for. Returns the outcome (None: the client stopped sending first) and
/// the bytes read.
fn read<T: std::fmt::Debug + PartialEq>(
    stream: &[u8],
    parse: fn(&[u8]) -> Parse<T>,
) -> (Option<Parse<T>>, usize) {
    let mut len = 0;
    let mut asked = Vec::new();
    loop {
        match parse(&stream[..len]) {
            Parse::NeedMore(n) => {
                assert!(n >= 1, "asks for nothing at {len}");
                asked.push(len + n);
                if len + n > stream.len() {
                    return (None, len);
                }
                len += n;
            }
            outcome => {
                if let Parse::Complete(_, used) = &outcome {
                    assert_eq!(*used, len, "a complete message is what was read");
                    assert!(
                        asked.iter().all(|&upto| upto <= len),
                        "asked past the message's end ({asked:?}, message {len})"
                    );
                }
                // No look-ahead: the whole buffer decides the same.
                assert_eq!(parse(stream), outcome, "byte by byte and at once differ");
                return (Some(outcome), len);
            }
        }
    }
}

/// The bytes a CONNECT request for `target` is made of.
fn request_bytes(target: &Target) -> Vec<u8> {
    let mut out = vec![VERSION, 1, 0];
    let port = match target {
        Target::Addr(a) => {
            match a.ip() {
                IpAddr::V4(ip) => {
                    out.push(1);
                    out.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    out.push(4);
                    out.extend_from_slice(&ip.octets());
                }
            }
            a.port()
        }
        Target::Domain(name, port) => {
            out.push(3);
            out.push(u8::try_from(name.len()).expect("a name of at most 255 bytes"));
            out.extend_from_slice(name.as_bytes());
            *port
        }
    };
    out.extend_from_slice(&port.to_be_bytes());
    out
}

/// `data` as a SOCKS5 client's first bytes.
pub fn socks5(data: &[u8]) {
    let (greeting, used) = read(data, parse_greeting);
    let greeting = match greeting {
        Some(Parse::Complete(g, n)) => {
            assert_eq!(n, 2 + usize::from(data[1]));
            assert_eq!(g.no_auth, data[2..n].contains(&METHOD_NO_AUTH));
            let selection = method_selection(g);
            assert_eq!(selection[0], VERSION);
            assert_eq!(
                selection[1] == METHOD_NONE_ACCEPTABLE,
                !g.no_auth,
                "no acceptable method answered as such"
            );
            g
        }
        Some(Parse::Error(m)) => {
            assert_eq!(m.reply, None, "a refused greeting is closed, not answered");
            return;
        }
        Some(Parse::NeedMore(_)) => unreachable!("read decides"),
        None => return,
    };
    if !greeting.no_auth {
        return;
    }
    let rest = &data[used..];
    let (request, _) = read(rest, parse_request);
    match request {
        Some(Parse::Complete(target, n)) => {
            assert_eq!(request_bytes(&target), rest[..n], "{target}");
            let ip = match &target {
                Target::Addr(a) => Some(a.ip()),
                Target::Domain(name, _) => {
                    assert!(!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()));
                    let resolved = resolve(mesh(), "", name);
                    if let Some(ip) = resolved {
                        resolved_rightly(name, ip);
                    }
                    resolved
                }
            };
            let port = match &target {
                Target::Addr(a) => a.port(),
                Target::Domain(_, port) => *port,
            };
            if let Some(ip) = ip {
                let reply = encode_reply(ReplyCode::Succeeded, (ip, port).into());
                assert_eq!(reply.len(), if ip.is_ipv4() { 10 } else { 22 });
                assert_eq!(reply[..3], [VERSION, 0, 0]);
            }
        }
        Some(Parse::Error(m)) => {
            assert!(m.reply.is_some(), "a refused request is answered: {m}");
            assert_ne!(m.reply, Some(ReplyCode::Succeeded));
        }
        Some(Parse::NeedMore(_)) => unreachable!("read decides"),
        None => {}
    }
}

/// `name` resolved to `ip`: the IP it spells, or a VIP on the default
/// network of a service with that hostname.
fn resolved_rightly(name: &str, ip: IpAddr) {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if let Ok(literal) = bare.parse::<IpAddr>() {
        assert_eq!(ip, literal.to_canonical(), "an IP literal is itself");
        return;
    }
    let host = bare.to_ascii_lowercase();
    let owner = mesh()
        .services_by_hostname(&host)
        .iter()
        .any(|s| s.vips.iter().any(|v| v.network.is_empty() && v.ip == ip));
    assert!(owner, "{name} resolved to {ip}, no VIP of that hostname");
}

/// Seeds: what SOCKS5 clients send (curl's no-auth greeting, one offering
/// only user/password, requests for an IPv4, an IPv6 and a domain target,
/// a mixed-case service name with its trailing dot, an IP written as a
/// name, BIND), each with some payload after it.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let greeting = [VERSION, 1, METHOD_NO_AUTH];
    let domain = |name: &str, port: u16| request_bytes(&Target::Domain(name.to_owned(), port));
    let requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "ipv4",
            request_bytes(&Target::Addr("10.0.0.2:8080".parse().expect("an address"))),
        ),
        (
            "ipv6",
            request_bytes(&Target::Addr("[fd00::2]:80".parse().expect("an address"))),
        ),
        ("service", domain("echo.ns1.svc.cluster.local", 80)),
        (
            "service-case-dot",
            domain("Echo.NS1.svc.cluster.local.", 80),
        ),
        ("v6-service", domain("v6.ns1.svc.cluster.local", 443)),
        ("ip-as-name", domain("10.96.0.1", 80)),
        ("unknown-name", domain("nowhere.example.org", 80)),
        ("bind", vec![VERSION, 2, 0, 1, 10, 0, 0, 2, 0, 80]),
    ];
    let mut out: Vec<(String, Vec<u8>)> = requests
        .into_iter()
        .map(|(name, request)| {
            let mut bytes = greeting.to_vec();
            bytes.extend(request);
            bytes.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            (format!("seed-{name}"), bytes)
        })
        .collect();
    out.push((
        "seed-userpass-only".into(),
        vec![VERSION, 2, 2, 0x80, VERSION, 1, 0, 1, 10, 0, 0, 2, 0, 80],
    ));
    out.push(("seed-socks4".into(), vec![4, 1, 0, 80, 10, 0, 0, 2, 0]));
    out
}
