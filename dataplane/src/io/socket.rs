//! Socket plumbing for the traffic paths: original destination, outbound
//! connect with SO_MARK, accept, and the nonblocking syscalls the copy
//! engine uses. All sockets here are O_NONBLOCK; waiting is done by the
//! per-core [`Poller`](crate::io::uring::Poller), never by the kernel.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use socket2::{Domain, SockAddr, SockRef, Socket, TcpKeepalive, Type};

use crate::io::uring::Poller;

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

/// A kernel socket address as std's; a v4-mapped IPv6 address (a v4 peer
/// of a dual-stack socket) as the plain v4 one.
fn to_socket_addr(addr: &SockAddr) -> Option<SocketAddr> {
    addr.as_socket().map(|a| match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    })
}

fn known_family(addr: SockAddr) -> io::Result<SocketAddr> {
    to_socket_addr(&addr).ok_or_else(|| io::Error::other("unsupported address family"))
}

pub fn local_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    known_family(SockRef::from(&fd).local_addr()?)
}

pub fn peer_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    known_family(SockRef::from(&fd).peer_addr()?)
}

/// The destination the client dialled before nat REDIRECT rewrote it
/// (conntrack's SO_ORIGINAL_DST, or IP6T_SO_ORIGINAL_DST for `local` of
/// IPv6). Fails with ENOENT when the connection was not redirected.
pub fn original_dst(fd: BorrowedFd<'_>, local: SocketAddr) -> io::Result<SocketAddr> {
    let sock = SockRef::from(&fd);
    let dst = match local {
        SocketAddr::V4(_) => sock.original_dst_v4()?,
        SocketAddr::V6(_) => sock.original_dst_v6()?,
    };
    to_socket_addr(&dst)
        .ok_or_else(|| io::Error::other("SO_ORIGINAL_DST returned an unknown family"))
}

/// The original destination of a captured connection, whose peer is
/// `peer` (its family picks the socket option: no `getsockname` needed).
/// With `tproxy`, a connection that was not NATed is taken to be
/// TPROXY-delivered, whose local address *is* the original destination.
pub fn captured_dst(
    fd: BorrowedFd<'_>,
    peer: Option<SocketAddr>,
    tproxy: bool,
) -> io::Result<SocketAddr> {
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
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    let (conn, peer) =
        SockRef::from(&listener).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    Ok((conn.into(), to_socket_addr(&peer)))
}

/// TCP keepalive on proxied sockets, in ztunnel's terms (`KEEPALIVE_TIME`,
/// `KEEPALIVE_INTERVAL`, `KEEPALIVE_RETRIES`, `USER_TIMEOUT_ENABLED`): an
/// idle connection through ringway must not look dead to middleboxes, and a
/// dead peer must eventually be noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepaliveOpts {
    /// Idle time before the first probe.
    pub time: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub retries: u32,
    /// Also set TCP_USER_TIMEOUT to what keepalive would take to give up,
    /// so unacknowledged sends give up as soon as an idle peer would.
    pub user_timeout: bool,
}

impl KeepaliveOpts {
    /// TCP_USER_TIMEOUT as ztunnel derives it: idle time plus every probe.
    pub fn user_timeout_value(&self) -> Duration {
        self.time
            .saturating_add(self.interval.saturating_mul(self.retries))
    }
}

/// Per-socket TCP options every proxied socket gets: NODELAY (TLS and
/// request/response traffic crawl without it, stack-notes §3) and keepalive
/// so dead peers of idle connections are eventually noticed. Set on the
/// listeners (accepted sockets inherit them) and on each outbound socket.
pub fn tune_stream(
    fd: &impl std::os::fd::AsFd,
    keepalive: Option<KeepaliveOpts>,
) -> io::Result<()> {
    let sock = socket2::SockRef::from(fd);
    sock.set_tcp_nodelay(true)?;
    if let Some(k) = keepalive {
        let ka = TcpKeepalive::new()
            .with_time(k.time)
            .with_interval(k.interval)
            .with_retries(k.retries);
        sock.set_tcp_keepalive(&ka)?;
        if k.user_timeout {
            sock.set_tcp_user_timeout(Some(k.user_timeout_value()))?;
        }
    }
    Ok(())
}

/// How outbound sockets are made.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    /// SO_MARK so redirection rules can skip ringway's own traffic (0 = none).
    pub mark: u32,
    pub timeout: Duration,
    pub keepalive: Option<KeepaliveOpts>,
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
    Ok(sock.into())
}

/// One nonblocking `recv(2)` into `buf`.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which is
    // valid, writable memory of that length.
    cvt_size(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) })
}

/// One nonblocking `recv(2)` into the spare capacity of `buf`, which grows
/// by what arrived. The spare bytes are never seen as `&mut [u8]`: the
/// kernel writes them, and only the `n` it reports become part of `buf`.
pub fn read_into(fd: RawFd, buf: &mut bytes::BytesMut, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = &mut buf.spare_capacity_mut()[..max];
    // SAFETY: recv writes at most `spare.len()` bytes through the pointer,
    // into memory `buf` owns and reserved above.
    let n = cvt_size(unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), spare.len(), 0) })?;
    // SAFETY: recv initialised the first `n` spare bytes (n <= max).
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// One nonblocking `send(2)` of `buf`; a closed peer is EPIPE, never
/// SIGPIPE.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: send reads at most `buf.len()` bytes from `buf`.
    cvt_size(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) })
}

pub fn writev(fd: RawFd, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    // sendmsg rather than writev: MSG_NOSIGNAL, so a closed peer is an
    // EPIPE error instead of a process-killing SIGPIPE.
    // SAFETY: msghdr is plain data; all zeroes is "no name, no control".
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec (std guarantees it on Unix);
    // sendmsg only reads through the pointer.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(1024) as _;
    // SAFETY: `msg` points at `msg_iovlen` valid iovecs borrowed from
    // `bufs` for the duration of the call.
    cvt_size(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })
}

/// Nonblocking splice(2); either side must be a pipe.
pub fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice takes no memory of ours (null offsets: both ends use
    // their own file position).
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
    // SAFETY: shutdown takes no memory; a stale fd is an error (EBADF).
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) }).map(|_| ())
}

/// Stops a listening socket now: connections in its backlog are reset and
/// new ones refused (see [`Listening`](crate::io::listener::Listening)).
/// The caller owns `fd` (a stale one is only an error, ignored).
pub fn stop_listening(fd: RawFd) {
    // SAFETY: shutdown takes no memory; a stale fd is an error (EBADF).
    let _ = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// The socket's pending error (`SO_ERROR`), if it has one: why a poll
/// reported POLLERR.
pub fn take_error(fd: RawFd) -> Option<io::Error> {
    // SAFETY: the caller's descriptor, borrowed for this call only.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&fd).take_error().ok().flatten()
}

/// Whether the peer has finished (FIN) or reset the connection, even
/// with bytes of it still unread: what a reader that stopped reading can
/// still learn.
pub fn peer_gone(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Makes the next close() send RST instead of FIN, to propagate a reset.
pub fn set_reset_on_close(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads a `linger` of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
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
        // SAFETY: pipe2 writes two fds into the array we pass.
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
        // SAFETY: pipe2 succeeded: both fds are fresh and owned by no one
        // else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // F_SETPIPE_SZ can fail above /proc/sys/fs/pipe-max-size for
        // unprivileged users; a smaller pipe still works, just slower.
        // SAFETY: fcntl with an int argument on a pipe we own.
        let got =
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int) };
        let capacity = if got > 0 {
            got as usize
        } else {
            // SAFETY: fcntl without an argument on a pipe we own.
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
/// connections across them. An IPv6 address is IPv6-only unless
/// `dual_stack` (then `[::]` takes IPv4 too, as v4-mapped peers).
pub fn bind_listener(
    addr: SocketAddr,
    transparent: bool,
    backlog: i32,
    dual_stack: bool,
) -> io::Result<OwnedFd> {
    let sock = shared_port(addr, Type::STREAM)?;
    if addr.is_ipv6() && dual_stack {
        sock.set_only_v6(false)?;
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
    Ok(sock.into())
}

/// Binds one core's UDP socket on `addr` (nonblocking, SO_REUSEPORT so
/// every core binds the same address and the kernel spreads datagrams by
/// their source).
pub fn bind_udp(addr: SocketAddr) -> io::Result<OwnedFd> {
    let sock = shared_port(addr, Type::DGRAM)?;
    sock.bind(&SockAddr::from(addr))?;
    Ok(sock.into())
}

/// A nonblocking socket of `kind` for `addr`, not yet bound, that every
/// core may bind on the same address (SO_REUSEPORT); IPv6 only for an
/// IPv6 address, so `[::]` and `0.0.0.0` are separate listeners.
fn shared_port(addr: SocketAddr, kind: Type) -> io::Result<Socket> {
    let sock = Socket::new(
        Domain::for_address(addr),
        kind.nonblocking().cloexec(),
        None,
    )?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    Ok(sock)
}

/// An unbound nonblocking UDP socket of `addr`'s family, with SO_MARK
/// `mark` (0: none) so capture rules let ringway's own queries pass.
pub fn udp_socket(addr: SocketAddr, mark: u32) -> io::Result<OwnedFd> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::DGRAM.nonblocking().cloexec(),
        None,
    )?;
    if mark != 0 {
        sock.set_mark(mark)?;
    }
    Ok(sock.into())
}

/// Every address configured on this host's interfaces (in this netns), used
/// to recognise connections that would loop back into ringway itself.
pub fn local_interface_addrs() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes the head of a list it allocated into ifap.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which
        // stays valid until freeifaddrs below.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-null ifa_addr points at a sockaddr of the family
        // it names, as getifaddrs(3) promises.
        if let Some(ip) = unsafe { interface_ip(ifa.ifa_addr) } {
            out.push(ip);
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

/// The IP of an interface address (None for other families, or none).
///
/// # Safety
/// `sa` is null or points at a valid sockaddr whose `sa_family` says what
/// it is (a sockaddr_in for AF_INET, a sockaddr_in6 for AF_INET6).
unsafe fn interface_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller promises a valid sockaddr of that family; read
    // unaligned, as the list owes no alignment beyond sockaddr's.
    unsafe {
        match (*sa).sa_family as libc::c_int {
            libc::AF_INET => {
                let sin = std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>());
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let sin6 = std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>());
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4))
            }
            _ => None,
        }
    }
}
