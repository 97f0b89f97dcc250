//! Socket plumbing for the traffic paths: original destination, outbound
//! connect with SO_MARK, accept, and the nonblocking syscalls the copy
//! engine uses. All sockets here are O_NONBLOCK; waiting is done by the
//! per-core [`Poller`](crate::io::uring::Poller), never by the kernel.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, TcpKeepalive, Type};

use crate::io::uring::Poller;

/// `SO_ORIGINAL_DST` / `IP6T_SO_ORIGINAL_DST` (same number, different level).
const SO_ORIGINAL_DST: libc::c_int = 80;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Converts a kernel sockaddr into a std SocketAddr.
///
/// # Safety
/// `sa` must point at a valid sockaddr_in or sockaddr_in6 (by its family).
unsafe fn to_socket_addr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    match (*sa).sa_family as libc::c_int {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // A v4-mapped peer on a dual-stack socket is reported as plain v4.
            let ip = match ip.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(ip),
            };
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn sockname(
    fd: RawFd,
    f: unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int,
) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    cvt(unsafe { f(fd, storage.as_mut_ptr() as *mut _, &mut len) })?;
    unsafe { to_socket_addr(storage.as_ptr() as *const libc::sockaddr) }
        .ok_or_else(|| io::Error::other("unsupported address family"))
}

pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockname(fd, libc::getsockname)
}

pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockname(fd, libc::getpeername)
}

/// The destination the client dialled before nat REDIRECT rewrote it
/// (conntrack's SO_ORIGINAL_DST). Fails with ENOENT when the connection was
/// not redirected.
pub fn original_dst(fd: RawFd, local: SocketAddr) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let (level, mut len) = match local {
        SocketAddr::V4(_) => (libc::SOL_IP, size_of::<libc::sockaddr_in>()),
        SocketAddr::V6(_) => (libc::SOL_IPV6, size_of::<libc::sockaddr_in6>()),
    };
    let mut len_t = len as libc::socklen_t;
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            SO_ORIGINAL_DST,
            storage.as_mut_ptr() as *mut _,
            &mut len_t,
        )
    })?;
    len = len_t as usize;
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    unsafe { to_socket_addr(storage.as_ptr() as *const libc::sockaddr) }
        .ok_or_else(|| io::Error::other("SO_ORIGINAL_DST returned an unknown family"))
}

/// The original destination of a captured connection, whose peer is
/// `peer` (its family picks the socket option: no `getsockname` needed).
/// With `tproxy`, a connection that was not NATed is taken to be
/// TPROXY-delivered, whose local address *is* the original destination.
pub fn captured_dst(fd: RawFd, peer: Option<SocketAddr>, tproxy: bool) -> io::Result<SocketAddr> {
    let family = match peer {
        Some(p) => p,
        None => local_addr(fd)?,
    };
    match original_dst(fd, family) {
        Err(e) if tproxy && e.raw_os_error() == Some(libc::ENOENT) => local_addr(fd),
        other => other,
    }
}

/// Accepts one connection if one is queued (nonblocking, CLOEXEC), with
/// its peer's address (from accept4 itself: no `getpeername` per
/// connection).
pub fn accept(listener: RawFd) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: accept4 writes at most `len` bytes of address into storage.
    let fd = cvt(unsafe {
        libc::accept4(
            listener,
            storage.as_mut_ptr() as *mut _,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: accept4 returned a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: storage is zero-initialised and accept4 filled in an address.
    let peer = unsafe { to_socket_addr(storage.as_ptr() as *const libc::sockaddr) };
    Ok((fd, peer))
}

/// Per-socket TCP options every proxied socket gets: NODELAY (TLS and
/// request/response traffic crawl without it, stack-notes §3) and keepalive
/// so dead peers of idle connections are eventually noticed. Set on the
/// listeners (accepted sockets inherit them) and on each outbound socket.
pub fn tune_stream(fd: &impl std::os::fd::AsFd, keepalive: Option<Duration>) -> io::Result<()> {
    let sock = socket2::SockRef::from(fd);
    sock.set_tcp_nodelay(true)?;
    if let Some(idle) = keepalive {
        let ka = TcpKeepalive::new()
            .with_time(idle)
            .with_interval(idle)
            .with_retries(9);
        sock.set_tcp_keepalive(&ka)?;
    }
    Ok(())
}

/// How outbound sockets are made.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    /// SO_MARK so redirection rules can skip ringway's own traffic (0 = none).
    pub mark: u32,
    pub timeout: Duration,
    pub keepalive: Option<Duration>,
}

/// Connects to `dst` without blocking the core: nonblocking connect, then
/// wait for POLLOUT on the readiness ring, then read SO_ERROR.
pub async fn connect(
    poller: &Rc<Poller>,
    dst: SocketAddr,
    opts: ConnectOpts,
) -> io::Result<OwnedFd> {
    connect_from(poller, dst, opts, None, None).await
}

/// [`connect`], from `source` when given: the original client's address,
/// which this host does not own (IP_TRANSPARENT, which needs
/// CAP_NET_ADMIN, and return-path routing that brings the replies back to
/// this socket; see `scripts/orig-src-rules.sh`). An error names what
/// failed. With `netns` (in-pod mode) the socket is made in that network
/// namespace, the pod's, so it leaves from the pod as ztunnel's do.
pub async fn connect_from(
    poller: &Rc<Poller>,
    dst: SocketAddr,
    opts: ConnectOpts,
    source: Option<IpAddr>,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<OwnedFd> {
    let new_socket = || {
        Socket::new(
            Domain::for_address(dst),
            Type::STREAM.nonblocking().cloexec(),
            None,
        )
    };
    let sock = match netns {
        None => new_socket()?,
        Some(ns) => crate::io::netns::within(ns, new_socket)??,
    };
    if opts.mark != 0 {
        sock.set_mark(opts.mark)?;
    }
    tune_stream(&sock, opts.keepalive)?;
    // A source of the other family than the destination cannot be used
    // (an IPv6 client of an IPv4 application): the node's own address then.
    let source = source.filter(|ip| ip.is_ipv4() == dst.is_ipv4());
    if let Some(ip) = source {
        let transparent = match ip {
            IpAddr::V4(_) => sock.set_ip_transparent_v4(true),
            IpAddr::V6(_) => sock.set_ip_transparent_v6(true),
        };
        transparent.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("IP_TRANSPARENT for the original source {ip}: {e} (needs CAP_NET_ADMIN)"),
            )
        })?;
        // Let connect pick the port for the whole 4-tuple: every tunnel
        // from one node shares a source address, and a port reserved at
        // bind time would cap them at the ephemeral range.
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on a socket we own, with a valid int option.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                &one as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        sock.bind(&SockAddr::from(SocketAddr::new(ip, 0)))
            .map_err(|e| {
                io::Error::new(e.kind(), format!("bind to the original source {ip}: {e}"))
            })?;
    }
    match sock.connect(&SockAddr::from(dst)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
            let wait = poller.ready(sock.as_raw_fd(), libc::POLLOUT);
            match crate::io::executor::timer::timeout(opts.timeout, wait).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => return Err(io::Error::from(io::ErrorKind::TimedOut)),
            }
            if let Some(e) = sock.take_error()? {
                return Err(e);
            }
        }
        Err(e) => return Err(e),
    }
    Ok(unsafe { OwnedFd::from_raw_fd(sock.into_raw_fd()) })
}

pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    cvt_size(unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut _, buf.len(), 0) })
}

pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    cvt_size(unsafe { libc::send(fd, buf.as_ptr() as *const _, buf.len(), libc::MSG_NOSIGNAL) })
}

pub fn writev(fd: RawFd, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    // sendmsg rather than writev: MSG_NOSIGNAL, so a closed peer is an
    // EPIPE error instead of a process-killing SIGPIPE.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(1024) as _;
    cvt_size(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })
}

/// Nonblocking splice(2); either side must be a pipe.
pub fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    cvt_size(unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    })
}

/// Sends FIN: this direction is done, the other may continue (half-close).
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) }).map(|_| ())
}

/// Makes the next close() send RST instead of FIN, to propagate a reset.
pub fn set_reset_on_close(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const _ as *const _,
            size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

pub fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// A nonblocking pipe for splice, sized to `size` when the kernel allows.
pub struct Pipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
    pub capacity: usize,
}

impl Pipe {
    pub fn new(size: usize) -> io::Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // F_SETPIPE_SZ can fail above /proc/sys/fs/pipe-max-size for
        // unprivileged users; a smaller pipe still works, just slower.
        let got =
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int) };
        let capacity = if got > 0 {
            got as usize
        } else {
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) }.max(4096) as usize
        };
        Ok(Self {
            read,
            write,
            capacity,
        })
    }
}

/// Builds a listening socket for one core. Every core binds its own socket
/// on the same address with SO_REUSEPORT and the kernel spreads incoming
/// connections across them.
pub fn bind_listener(addr: SocketAddr, transparent: bool, backlog: i32) -> io::Result<OwnedFd> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        None,
    )?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    if transparent {
        // TPROXY delivery needs IP_TRANSPARENT (CAP_NET_ADMIN). Without it
        // the listener still serves REDIRECTed traffic, so only warn.
        let res = if addr.is_ipv6() {
            sock.set_ip_transparent_v6(true)
        } else {
            sock.set_ip_transparent_v4(true)
        };
        if let Err(e) = res {
            tracing::debug!(%addr, error = %e, "IP_TRANSPARENT unavailable; TPROXY capture will not reach this listener");
        }
    }
    sock.bind(&SockAddr::from(addr))?;
    sock.listen(backlog)?;
    Ok(unsafe { OwnedFd::from_raw_fd(sock.into_raw_fd()) })
}

/// Every address configured on this host's interfaces (in this netns), used
/// to recognise connections that would loop back into ringway itself.
pub fn local_interface_addrs() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            if let Some(sa) = unsafe { to_socket_addr(ifa.ifa_addr) } {
                out.push(sa.ip());
            }
        }
        cur = ifa.ifa_next;
    }
    unsafe { libc::freeifaddrs(ifap) };
    out
}
