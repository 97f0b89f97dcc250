//! How the load generator reaches the server: directly (no proxy, or a
//! proxy that captures the connection transparently) or through a proxy's
//! SOCKS5 front door; optionally from a fixed source address (the client
//! workload's IP, so a proxy knows whose identity to use).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};

use crate::socks5;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// A plain TCP connect to the target (possibly captured on the way).
    Direct,
    /// CONNECT through the SOCKS5 server at this address.
    Socks5(SocketAddr),
}

#[derive(Clone, Debug, Serialize)]
pub struct Dialer {
    /// The `ringway-perf serve` address the scenario talks to.
    pub target: SocketAddr,
    pub route: Route,
    /// Source address for every connection (port chosen by the kernel).
    pub bind: Option<IpAddr>,
    /// Connect timeout, and read/write timeout on the connected stream.
    #[serde(skip)]
    pub timeout: Duration,
}

impl Dialer {
    pub fn direct(target: SocketAddr) -> Dialer {
        Dialer {
            target,
            route: Route::Direct,
            bind: None,
            timeout: Duration::from_secs(60),
        }
    }

    pub fn via_socks5(target: SocketAddr, socks: SocketAddr) -> Dialer {
        Dialer {
            route: Route::Socks5(socks),
            ..Dialer::direct(target)
        }
    }

    pub fn bind(mut self, ip: Option<IpAddr>) -> Dialer {
        self.bind = ip;
        self
    }

    /// A connected stream that carries the scenario's bytes to the target.
    pub fn connect(&self) -> io::Result<TcpStream> {
        let first_hop = match self.route {
            Route::Direct => self.target,
            Route::Socks5(proxy) => proxy,
        };
        let sock = Socket::new(
            Domain::for_address(first_hop),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        if let Some(ip) = self.bind.filter(|ip| ip.is_ipv4() == first_hop.is_ipv4()) {
            // Pick the port at connect time from the whole 4-tuple space, so
            // connect-rate scenarios are not limited by bind()'s port pool.
            if ip.is_ipv4() {
                set_bind_no_port(&sock)?;
            }
            sock.bind(&SocketAddr::new(ip, 0).into())?;
        }
        sock.connect_timeout(&first_hop.into(), self.timeout)
            .map_err(|e| io::Error::new(e.kind(), format!("connect {first_hop}: {e}")))?;
        sock.set_tcp_nodelay(true)?;
        let mut s: TcpStream = sock.into();
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        if let Route::Socks5(proxy) = self.route {
            socks5::handshake(&mut s, self.target).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("SOCKS5 via {proxy} to {}: {e}", self.target),
                )
            })?;
        }
        Ok(s)
    }

    /// For progress lines: "10.0.0.2:5201 via socks5 127.0.0.1:15080".
    pub fn describe(&self) -> String {
        let mut s = self.target.to_string();
        if let Route::Socks5(p) = self.route {
            s += &format!(" via socks5 {p}");
        }
        if let Some(b) = self.bind {
            s += &format!(" from {b}");
        }
        s
    }
}

fn set_bind_no_port(sock: &Socket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a valid int option.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
