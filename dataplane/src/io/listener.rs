//! Listeners: bound once per core on the main thread (so a bind error stops
//! startup with a clear message before any executor runs), then handed to
//! each core, which runs its own accept loop (`proxy::accept`). Every core
//! has its own SO_REUSEPORT socket per address; the kernel spreads
//! connections.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use anyhow::Context;

use crate::io::socket;

/// The traffic path a listener feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrafficPath {
    /// 15001: captured pod egress.
    Outbound,
    /// 15006: captured plaintext ingress.
    InboundPassthrough,
    /// 15008: HBONE (mTLS HTTP/2 CONNECT) ingress.
    Inbound,
    /// 15080: SOCKS5 front door to the outbound path (off by default).
    Socks5,
}

impl TrafficPath {
    pub const ALL: [TrafficPath; 4] = [
        TrafficPath::Outbound,
        TrafficPath::InboundPassthrough,
        TrafficPath::Inbound,
        TrafficPath::Socks5,
    ];

    /// Its place in [`ALL`](Self::ALL), for per-path arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            TrafficPath::Outbound => "outbound",
            TrafficPath::InboundPassthrough => "inbound_passthrough",
            TrafficPath::Inbound => "inbound",
            TrafficPath::Socks5 => "socks5",
        }
    }
}

/// One core's socket for one listening address.
pub struct BoundListener {
    pub path: TrafficPath,
    pub addr: SocketAddr,
    pub fd: Listening,
}

/// A listening socket that stops listening the moment it is dropped: shut
/// down (`SHUT_RDWR`: its backlog reset, new SYNs refused), then closed.
/// Closing alone is not enough: while an io_uring poll on it is in flight
/// the ring holds the file, and the socket keeps listening until the
/// cancel completes. Connections that land in its backlog meanwhile are
/// lost, where they should go to another socket of the port
/// (`SO_REUSEPORT`: a pod's listener on another core, the next ringway)
/// or be refused (a removed pod).
pub struct Listening(OwnedFd);

impl From<OwnedFd> for Listening {
    fn from(fd: OwnedFd) -> Self {
        Listening(fd)
    }
}

impl AsFd for Listening {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Listening {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        socket::stop_listening(self.0.as_raw_fd());
    }
}

const BACKLOG: i32 = 4096;

/// Binds `cores` REUSEPORT sockets for every address. With port 0 the first
/// bind picks the port and the other cores join it. Each listener gets the
/// per-socket TCP options ([`socket::tune_stream`]): Linux copies them into
/// every accepted socket, which saves five `setsockopt` calls per
/// connection. IPv6 addresses are IPv6-only unless `dual_stack` (see
/// [`socket::bind_listener`]).
pub fn bind_all(
    specs: &[(TrafficPath, Vec<SocketAddr>)],
    cores: usize,
    keepalive: Option<socket::KeepaliveOpts>,
    dual_stack: bool,
) -> anyhow::Result<Vec<Vec<BoundListener>>> {
    let mut per_core: Vec<Vec<BoundListener>> = (0..cores).map(|_| Vec::new()).collect();
    for (path, addrs) in specs {
        for &requested in addrs {
            let mut addr = requested;
            for (core, slot) in per_core.iter_mut().enumerate() {
                // Only capture listeners may receive TPROXY-delivered traffic.
                let transparent =
                    matches!(path, TrafficPath::InboundPassthrough | TrafficPath::Inbound);
                let fd = socket::bind_listener(addr, transparent, BACKLOG, dual_stack).with_context(|| {
                    format!(
                        "cannot bind the {} listener on {addr} (core {core}); is another process using the port?",
                        path.name()
                    )
                })?;
                socket::tune_stream(&fd, keepalive).with_context(|| {
                    format!(
                        "cannot set TCP options on the {} listener {addr}",
                        path.name()
                    )
                })?;
                if addr.port() == 0 {
                    addr = socket::local_addr(fd.as_fd())?;
                }
                slot.push(BoundListener {
                    path: *path,
                    addr,
                    fd: fd.into(),
                });
            }
        }
    }
    Ok(per_core)
}

/// One core's DNS sockets on one address: UDP and TCP on the same port.
pub struct DnsListener {
    pub addr: SocketAddr,
    pub udp: OwnedFd,
    pub tcp: Listening,
}

/// Binds the DNS proxy's UDP socket and TCP listener on every address,
/// once per core (SO_REUSEPORT). With port 0 the first core's UDP bind
/// picks the port and the TCP listeners and the other cores take it.
pub fn bind_dns(addrs: &[SocketAddr], cores: usize) -> anyhow::Result<Vec<Vec<DnsListener>>> {
    let mut per_core: Vec<Vec<DnsListener>> = (0..cores).map(|_| Vec::new()).collect();
    for &requested in addrs {
        let mut addr = requested;
        for (core, slot) in per_core.iter_mut().enumerate() {
            let udp = socket::bind_udp(addr).with_context(|| {
                format!("cannot bind the DNS proxy's UDP socket on {addr} (core {core}); is another process using the port?")
            })?;
            if addr.port() == 0 {
                addr = socket::local_addr(udp.as_fd())?;
            }
            let tcp = socket::bind_listener(addr, false, BACKLOG, false).with_context(|| {
                format!("cannot bind the DNS proxy's TCP listener on {addr} (core {core}); is another process using the port?")
            })?;
            slot.push(DnsListener {
                addr,
                udp,
                tcp: tcp.into(),
            });
        }
    }
    Ok(per_core)
}

/// Addresses that lead back into ringway itself: a destination with one of
/// our listener ports on a local address would make a forwarding loop.
#[derive(Clone, Debug, Default)]
pub struct SelfAddrs {
    pub ports: Vec<u16>,
    pub local_ips: Vec<IpAddr>,
}

impl SelfAddrs {
    pub fn is_self(&self, dst: SocketAddr) -> bool {
        self.ports.contains(&dst.port())
            && (dst.ip().is_loopback()
                || dst.ip().is_unspecified()
                || self.local_ips.contains(&dst.ip()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_addrs() {
        let s = SelfAddrs {
            ports: vec![15001, 15006],
            local_ips: vec!["10.1.2.3".parse().unwrap()],
        };
        assert!(s.is_self("127.0.0.1:15001".parse().unwrap()));
        assert!(s.is_self("10.1.2.3:15006".parse().unwrap()));
        assert!(s.is_self("[::1]:15001".parse().unwrap()));
        assert!(!s.is_self("10.1.2.4:15001".parse().unwrap()));
        assert!(!s.is_self("127.0.0.1:8080".parse().unwrap()));
    }

    #[test]
    fn port_zero_is_shared_by_all_cores() {
        let specs = vec![(TrafficPath::Outbound, vec!["127.0.0.1:0".parse().unwrap()])];
        let bound = bind_all(&specs, 2, None, false).unwrap();
        assert_eq!(bound.len(), 2);
        assert_ne!(bound[0][0].addr.port(), 0);
        assert_eq!(bound[0][0].addr, bound[1][0].addr);
    }

    /// Accepted sockets carry NODELAY and the keepalive settings without a
    /// `setsockopt` of their own: they inherit the listener's.
    #[test]
    fn accepted_sockets_inherit_the_tcp_options() {
        let specs = vec![(TrafficPath::Inbound, vec!["127.0.0.1:0".parse().unwrap()])];
        let idle = std::time::Duration::from_secs(123);
        let keepalive = socket::KeepaliveOpts {
            time: idle,
            interval: std::time::Duration::from_secs(45),
            retries: 4,
            user_timeout: true,
        };
        let bound = bind_all(&specs, 1, Some(keepalive), false).unwrap();
        let l = &bound[0][0];
        let _client = std::net::TcpStream::connect(l.addr).unwrap();
        let conn = loop {
            match socket::accept(l.fd.as_fd()) {
                Ok((c, _)) => break c,
                Err(e) if socket::would_block(&e) => std::thread::yield_now(),
                Err(e) => panic!("accept: {e}"),
            }
        };
        let s = socket2::SockRef::from(&conn);
        assert!(s.tcp_nodelay().unwrap(), "NODELAY not inherited");
        assert!(s.keepalive().unwrap(), "SO_KEEPALIVE not inherited");
        assert_eq!(s.tcp_keepalive_time().unwrap(), idle);
        assert_eq!(s.tcp_keepalive_interval().unwrap(), keepalive.interval);
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        // ztunnel's USER_TIMEOUT_ENABLED: idle time plus every probe.
        assert_eq!(
            s.tcp_user_timeout().unwrap(),
            Some(std::time::Duration::from_secs(123 + 4 * 45))
        );
    }

    #[test]
    fn dns_sockets_share_one_port_across_cores() {
        let bound = bind_dns(&["127.0.0.1:0".parse().unwrap()], 2).unwrap();
        let addr = bound[0][0].addr;
        assert_ne!(addr.port(), 0);
        assert_eq!(bound[1][0].addr, addr);
        assert_eq!(socket::local_addr(bound[1][0].udp.as_fd()).unwrap(), addr);
        assert_eq!(socket::local_addr(bound[0][0].tcp.as_fd()).unwrap(), addr);
    }

    #[test]
    fn bind_conflict_is_a_clear_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let specs = vec![(TrafficPath::InboundPassthrough, vec![addr])];
        let err = format!("{:#}", bind_all(&specs, 1, None, false).err().unwrap());
        assert!(err.contains("inbound_passthrough listener"), "{err}");
        assert!(err.contains(&addr.to_string()), "{err}");
    }
}
