//! The ZDS client: how the node agent (istio-cni) enrolls pods in ambient
//! in-pod mode. The agent listens on a unix SOCK_SEQPACKET socket
//! (`/var/run/ztunnel/ztunnel.sock` by default, shared by hostPath); the
//! proxy connects, says hello, and then answers every request with one ack:
//! `add` (a pod to proxy, its network namespace passed as the packet's one
//! file descriptor), `keep` (replayed for a pod the proxy should already
//! have), `del`, and `snapshot_sent` (the replay after a connect is
//! complete: pods not replayed are gone). The agent sends the next request
//! only after the ack, so the acks pace the protocol.
//!
//! The protocol lives here; what a pod *is* (listeners in its namespace,
//! on every core) is the [`PodHandler`]'s business. The client runs on a
//! thread of its own with blocking calls: it is never a data-plane core.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prost::Message;
use ringway_proto::zds::{
    self, workload_request::Payload, workload_response, Ack, WorkloadRequest, WorkloadResponse,
    ZdsHello,
};

/// The socket istio-cni listens on (ztunnel's `INPOD_UDS` default).
pub const DEFAULT_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";

/// The largest request the agent sends (ztunnel reads into the same size);
/// anything longer arrives truncated and is refused.
const MAX_PACKET: usize = 1024;
/// How many descriptors one packet may carry before the kernel truncates
/// the control data. One is allowed (with `add`); room for more lets us see,
/// close and refuse extra ones instead of leaking them.
const MAX_FDS: usize = 4;

/// Where and how to reach the node agent.
#[derive(Clone, Debug)]
pub struct ZdsConfig {
    pub socket: PathBuf,
    /// First reconnect delay; doubles up to `max_backoff` (ztunnel starts at
    /// 10 ms too, so a restarted agent is picked up at once).
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// How often [`PodHandler::tick`] runs while the socket is quiet.
    pub tick: Duration,
}

impl ZdsConfig {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ZdsConfig {
            socket: socket.into(),
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(5),
            tick: Duration::from_millis(250),
        }
    }
}

/// The pod as the agent names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// Whoever runs the enrolled pods. Each call's `Err` is sent back as a NACK
/// with that text; the handler keeps whatever state it decides (a pod that
/// failed to start is usually kept and retried from [`tick`](Self::tick)).
pub trait PodHandler {
    /// Proxy this pod from now on, in the network namespace `netns`.
    fn add(&mut self, uid: &str, info: PodInfo, netns: OwnedFd) -> Result<(), String>;
    /// The agent replays a pod after a reconnect without its namespace: it
    /// must already be known.
    fn keep(&mut self, uid: &str) -> Result<(), String>;
    /// The pod is gone: drain it and close its listeners.
    fn del(&mut self, uid: &str) -> Result<(), String>;
    /// The replay after a connect is complete: every pod not in `replayed`
    /// is gone.
    fn reconcile(&mut self, replayed: &HashSet<String>);
    /// Runs between requests and while the socket is quiet: retries.
    fn tick(&mut self) {}
    /// The connection to the agent went up (true) or down (false).
    fn connected(&mut self, _up: bool) {}
}

/// Why a connection to the agent ended.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("cannot connect to the node agent at {path}: {source}")]
    Connect { path: String, source: io::Error },
    #[error("node agent connection: {0}")]
    Io(#[from] io::Error),
    #[error("the node agent closed the connection")]
    Closed,
}

/// Runs the client until `stop`: connect, hello, serve requests; on any
/// error wait (10 ms, doubling) and connect again. Pods survive reconnects:
/// the handler keeps them, and the next `snapshot_sent` reconciles.
pub fn run(cfg: &ZdsConfig, handler: &mut dyn PodHandler, stop: &AtomicBool) {
    let mut backoff = cfg.min_backoff;
    let mut logged_down = false;
    while !stop.load(Ordering::Acquire) {
        match connect(&cfg.socket) {
            Ok(sock) => {
                tracing::info!(socket = %cfg.socket.display(), "connected to the node agent (ZDS)");
                logged_down = false;
                backoff = cfg.min_backoff;
                handler.connected(true);
                let end = serve(&sock, cfg, handler, stop);
                handler.connected(false);
                match end {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, "ZDS connection lost; reconnecting"),
                }
            }
            Err(e) => {
                // Logged once per outage, not at every retry.
                if !logged_down {
                    tracing::warn!(error = %e, "node agent not reachable yet; retrying");
                    logged_down = true;
                }
            }
        }
        handler.tick();
        sleep_unless_stopped(backoff, stop);
        backoff = (backoff * 2).min(cfg.max_backoff);
    }
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(50);
    let mut left = total;
    while !left.is_zero() && !stop.load(Ordering::Acquire) {
        let d = left.min(step);
        std::thread::sleep(d);
        left -= d;
    }
}

/// A connected SEQPACKET socket to `path`, with the hello sent.
pub fn connect(path: &Path) -> Result<OwnedFd, ZdsError> {
    let connect_err = |source| ZdsError::Connect {
        path: path.display().to_string(),
        source,
    };
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(connect_err(io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by socket(2) and is owned by no one else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, len) = unix_addr(path).map_err(connect_err)?;
    // SAFETY: addr is a valid sockaddr_un of length len.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    if r != 0 {
        return Err(connect_err(io::Error::last_os_error()));
    }
    let hello = ZdsHello {
        version: zds::Version::V1 as i32,
    };
    send(sock.as_raw_fd(), &hello.encode_to_vec())?;
    Ok(sock)
}

/// A `sockaddr_un` for `path` (which must fit its 108 bytes).
pub fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is empty or longer than {} bytes",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// Serves requests on one connection until it ends (Err) or `stop` (Ok).
fn serve(
    sock: &OwnedFd,
    cfg: &ZdsConfig,
    handler: &mut dyn PodHandler,
    stop: &AtomicBool,
) -> Result<(), ZdsError> {
    let fd = sock.as_raw_fd();
    // Uids the agent replayed since this connection began; None once the
    // replay is over (`snapshot_sent`).
    let mut replay: Option<HashSet<String>> = Some(HashSet::new());
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        if !wait_readable(fd, cfg.tick)? {
            handler.tick();
            continue;
        }
        let packet = match recv(fd)? {
            Some(p) => p,
            None => return Err(ZdsError::Closed),
        };
        let error = match handle(packet, handler, &mut replay) {
            Ok(()) => String::new(),
            Err(e) => {
                tracing::warn!(error = %e, "ZDS request refused (NACK)");
                e
            }
        };
        let ack = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack { error })),
        };
        send(fd, &ack.encode_to_vec())?;
        handler.tick();
    }
}

/// One received packet: its bytes and the descriptors that came with it.
pub struct Packet {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// The kernel cut the message or its descriptors (MSG_TRUNC/MSG_CTRUNC).
    pub truncated: bool,
}

/// Applies one request to `handler`; the error is the NACK's text.
pub(crate) fn handle(
    packet: Packet,
    handler: &mut dyn PodHandler,
    replay: &mut Option<HashSet<String>>,
) -> Result<(), String> {
    if packet.truncated {
        return Err(format!(
            "request truncated (longer than {MAX_PACKET} bytes or more than {MAX_FDS} descriptors)"
        ));
    }
    let req = WorkloadRequest::decode(&packet.bytes[..])
        .map_err(|e| format!("undecodable WorkloadRequest: {e}"))?;
    let mut fds = packet.fds;
    let payload = req
        .payload
        .ok_or_else(|| "WorkloadRequest without a payload".to_string())?;
    // Only `add` carries a descriptor, exactly one; anything else is a
    // confused agent, and the extra descriptors are closed (dropped) here.
    let expect_fd = matches!(payload, Payload::Add(_));
    if expect_fd && fds.len() != 1 {
        return Err(format!(
            "add must carry exactly one network namespace descriptor, got {}",
            fds.len()
        ));
    }
    if !expect_fd && !fds.is_empty() {
        return Err(format!(
            "unexpected {} descriptor(s) with a request that takes none",
            fds.len()
        ));
    }
    match payload {
        Payload::Add(add) => {
            if add.uid.is_empty() {
                return Err("add without a uid".into());
            }
            let info = add.workload_info.map(|i| PodInfo {
                name: i.name,
                namespace: i.namespace,
                service_account: i.service_account,
            });
            let info = info.ok_or_else(|| format!("add {} without workload_info", add.uid))?;
            if let Some(seen) = replay {
                seen.insert(add.uid.clone());
            }
            let netns = fds.pop().expect("checked: one descriptor");
            handler.add(&add.uid, info, netns)
        }
        // `keep` only means something in the replay: "this pod survives the
        // reconcile". After it, refused, as ztunnel refuses it (ztunnel then
        // stops reading from the agent altogether; ringway goes on).
        Payload::Keep(keep) => match replay {
            Some(seen) => {
                seen.insert(keep.uid.clone());
                handler.keep(&keep.uid)
            }
            None => Err(format!(
                "keep for {} after snapshot_sent: keep belongs to the replay after a connect",
                keep.uid
            )),
        },
        Payload::Del(del) => handler.del(&del.uid),
        // As ztunnel: a second snapshot_sent is a confused agent, refused
        // (ztunnel answers "pod snapshot received already").
        Payload::SnapshotSent(_) => match replay.take() {
            Some(seen) => {
                handler.reconcile(&seen);
                Ok(())
            }
            None => Err("a second snapshot_sent on one connection".into()),
        },
    }
}

/// Waits up to `timeout` for the socket to become readable (or hung up).
fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    match r {
        0 => Ok(false),
        r if r > 0 => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Receives one packet with its descriptors (close-on-exec). None when the
/// peer closed the connection.
pub fn recv(fd: RawFd) -> io::Result<Option<Packet>> {
    let mut buf = vec![0u8; MAX_PACKET];
    // u64 alignment satisfies cmsghdr's.
    let space = cmsg_space(MAX_FDS);
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid, then filled in.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: msg points at live buffers sized as declared.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled,
    // bounded by msg_controllen; each SCM_RIGHTS payload is an array of ints
    // that are now descriptors of this process, owned by us alone.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(n);
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(Packet {
        bytes: buf,
        fds,
        truncated,
    }))
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<libc::c_int>()) as u32) as usize }
}

/// Sends one packet, with `fd` attached when given (SCM_RIGHTS). Public
/// for in-test agents, which speak the other side of the protocol.
pub fn send_with_fd(sock: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid, then filled in.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let space = cmsg_space(1);
    let mut control = vec![0u64; space.div_ceil(8)];
    if let Some(fd) = fd {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one cmsghdr with one int.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, fd);
        }
    }
    loop {
        // SAFETY: msg points at live buffers sized as declared.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn send(sock: RawFd, bytes: &[u8]) -> io::Result<()> {
    send_with_fd(sock, bytes, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_proto::zds::{AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo};

    /// Records what the client asked, answering as told.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<String>,
        fail_add: bool,
        known: HashSet<String>,
    }

    impl PodHandler for Recorder {
        fn add(&mut self, uid: &str, info: PodInfo, _netns: OwnedFd) -> Result<(), String> {
            self.calls
                .push(format!("add {uid} {}/{}", info.namespace, info.name));
            if self.fail_add {
                return Err("cannot start".into());
            }
            self.known.insert(uid.into());
            Ok(())
        }
        fn keep(&mut self, uid: &str) -> Result<(), String> {
            self.calls.push(format!("keep {uid}"));
            if self.known.contains(uid) {
                Ok(())
            } else {
                Err(format!("unknown pod {uid}"))
            }
        }
        fn del(&mut self, uid: &str) -> Result<(), String> {
            self.calls.push(format!("del {uid}"));
            self.known.remove(uid);
            Ok(())
        }
        fn reconcile(&mut self, replayed: &HashSet<String>) {
            let mut r: Vec<_> = replayed.iter().cloned().collect();
            r.sort();
            self.calls.push(format!("reconcile {}", r.join(",")));
        }
    }

    fn request(p: Payload) -> Vec<u8> {
        WorkloadRequest { payload: Some(p) }.encode_to_vec()
    }

    fn add(uid: &str) -> Payload {
        Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(WorkloadInfo {
                name: "pod".into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
            }),
        })
    }

    fn devnull() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    fn packet(bytes: Vec<u8>, fds: usize) -> Packet {
        Packet {
            bytes,
            fds: (0..fds).map(|_| devnull()).collect(),
            truncated: false,
        }
    }

    /// Each request, well- or ill-formed, maps to the handler call it
    /// means or to a NACK that says what was wrong.
    #[test]
    fn requests_and_their_answers() {
        let cases: Vec<(Packet, Result<(), &str>, &str)> = vec![
            (packet(request(add("u1")), 1), Ok(()), "add u1 ns/pod"),
            (
                packet(request(Payload::Del(DelWorkload { uid: "u0".into() })), 0),
                Ok(()),
                "del u0",
            ),
            (
                packet(request(add("u2")), 0),
                Err("exactly one network namespace"),
                "",
            ),
            (
                packet(request(add("u2")), 2),
                Err("exactly one network namespace"),
                "",
            ),
            (
                packet(request(Payload::Del(DelWorkload { uid: "u1".into() })), 1),
                Err("unexpected 1 descriptor"),
                "",
            ),
            (
                packet(request(Payload::Keep(KeepWorkload { uid: "u9".into() })), 0),
                Err("unknown pod u9"),
                "keep u9",
            ),
            (packet(vec![0xff, 0xff, 0xff], 0), Err("undecodable"), ""),
            (
                packet(WorkloadRequest { payload: None }.encode_to_vec(), 0),
                Err("without a payload"),
                "",
            ),
            (
                Packet {
                    bytes: vec![],
                    fds: vec![],
                    truncated: true,
                },
                Err("truncated"),
                "",
            ),
            (
                packet(
                    request(Payload::Add(AddWorkload {
                        uid: "u3".into(),
                        workload_info: None,
                    })),
                    1,
                ),
                Err("without workload_info"),
                "",
            ),
            (
                packet(request(Payload::SnapshotSent(SnapshotSent {})), 0),
                Ok(()),
                "reconcile u1,u9",
            ),
            (
                packet(request(Payload::Del(DelWorkload { uid: "u1".into() })), 0),
                Ok(()),
                "del u1",
            ),
            (
                packet(request(Payload::Keep(KeepWorkload { uid: "u1".into() })), 0),
                Err("after snapshot_sent"),
                "",
            ),
            (
                packet(request(Payload::SnapshotSent(SnapshotSent {})), 0),
                Err("second snapshot_sent"),
                "",
            ),
        ];
        let mut h = Recorder::default();
        let mut replay = Some(HashSet::new());
        for (i, (p, expected, call)) in cases.into_iter().enumerate() {
            let before = h.calls.len();
            let got = handle(p, &mut h, &mut replay);
            match (expected, &got) {
                (Ok(()), Ok(())) => {}
                (Err(want), Err(e)) => assert!(e.contains(want), "case {i}: {e}"),
                _ => panic!("case {i}: expected {expected:?}, got {got:?}"),
            }
            if call.is_empty() {
                assert_eq!(h.calls.len(), before, "case {i} reached the handler");
            } else {
                assert_eq!(h.calls.last().map(String::as_str), Some(call), "case {i}");
            }
        }
        assert!(replay.is_none(), "the replay ends at snapshot_sent");
    }

    /// Descriptors of this process that refer to `path`.
    fn open_fds_to(path: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == path)
            .count()
    }

    /// Over a real socket pair, ill-formed packets get a NACK each, the
    /// connection goes on, and every descriptor that came with them is
    /// closed, not leaked: a packet longer than 1024 bytes, an add with two
    /// descriptors, a del with one.
    #[test]
    fn bad_packets_are_refused_and_their_descriptors_closed() {
        let mut pair = [0; 2];
        // SAFETY: socketpair fills two descriptors we then own.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: both descriptors are fresh from socketpair.
        let (agent, proxy) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let marker = std::env::temp_dir().join(format!("zds-fd-marker-{}", std::process::id()));
        let file = std::fs::File::create(&marker).unwrap();
        let marker = marker.canonicalize().unwrap();
        let send_two = |bytes: &[u8]| {
            // Two descriptors in one SCM_RIGHTS message.
            let mut iov = libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            };
            // SAFETY: msghdr is plain old data, then filled in.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            let space = cmsg_space(2);
            let mut control = vec![0u64; space.div_ceil(8)];
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space as _;
            // SAFETY: room for one cmsghdr with two ints.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(2 * 4) as _;
                let data = libc::CMSG_DATA(cmsg) as *mut libc::c_int;
                std::ptr::write_unaligned(data, file.as_raw_fd());
                std::ptr::write_unaligned(data.add(1), file.as_raw_fd());
                assert!(libc::sendmsg(agent.as_raw_fd(), &msg, 0) >= 0);
            }
        };
        send_with_fd(agent.as_raw_fd(), &vec![0u8; 1500], Some(file.as_raw_fd())).unwrap();
        send_two(&request(add("two-fds")));
        send_with_fd(
            agent.as_raw_fd(),
            &request(Payload::Del(DelWorkload { uid: "x".into() })),
            Some(file.as_raw_fd()),
        )
        .unwrap();
        send_with_fd(
            agent.as_raw_fd(),
            &request(Payload::SnapshotSent(SnapshotSent {})),
            None,
        )
        .unwrap();
        let stop = AtomicBool::new(false);
        let cfg = ZdsConfig::new("/unused");
        let mut h = Recorder::default();
        let mut acks = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                while acks.len() < 4 {
                    let p = recv(agent.as_raw_fd()).unwrap().unwrap();
                    let resp = WorkloadResponse::decode(&p.bytes[..]).unwrap();
                    let Some(workload_response::Payload::Ack(a)) = resp.payload else {
                        panic!("not an ack")
                    };
                    acks.push(a.error);
                }
                stop.store(true, Ordering::Release);
            });
            serve(&proxy, &cfg, &mut h, &stop).unwrap();
        });
        assert!(acks[0].contains("truncated"), "{acks:?}");
        assert!(acks[1].contains("exactly one"), "{acks:?}");
        assert!(acks[2].contains("unexpected 1 descriptor"), "{acks:?}");
        assert_eq!(acks[3], "", "the connection goes on: {acks:?}");
        assert_eq!(
            h.calls,
            vec!["reconcile "],
            "only the good request reached the handler"
        );
        assert_eq!(open_fds_to(&marker), 1, "a received descriptor leaked");
        let _ = std::fs::remove_file(&marker);
    }

    /// Over a real SEQPACKET pair: the descriptor crosses, the hello and the
    /// acks are real packets, a NACK carries the handler's reason.
    #[test]
    fn a_real_socket_pair_carries_fds_and_acks() {
        let mut pair = [0; 2];
        // SAFETY: socketpair fills two descriptors we then own.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: both descriptors are fresh from socketpair.
        let (agent, proxy) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let ns = std::fs::File::open("/proc/self/ns/net").unwrap();
        send_with_fd(
            agent.as_raw_fd(),
            &request(add("pod-1")),
            Some(ns.as_raw_fd()),
        )
        .unwrap();
        send_with_fd(
            agent.as_raw_fd(),
            &request(Payload::Keep(KeepWorkload {
                uid: "ghost".into(),
            })),
            None,
        )
        .unwrap();
        send_with_fd(
            agent.as_raw_fd(),
            &request(Payload::SnapshotSent(SnapshotSent {})),
            None,
        )
        .unwrap();
        let stop = AtomicBool::new(false);
        let cfg = ZdsConfig::new("/unused");
        let mut h = Recorder::default();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut acks = Vec::new();
                while acks.len() < 3 {
                    let p = recv(agent.as_raw_fd()).unwrap().unwrap();
                    let resp = WorkloadResponse::decode(&p.bytes[..]).unwrap();
                    let Some(workload_response::Payload::Ack(a)) = resp.payload else {
                        panic!("not an ack")
                    };
                    acks.push(a.error);
                }
                assert_eq!(acks[0], "");
                assert!(acks[1].contains("unknown pod ghost"), "{:?}", acks[1]);
                assert_eq!(acks[2], "");
                stop.store(true, Ordering::Release);
            });
            serve(&proxy, &cfg, &mut h, &stop).unwrap();
        });
        assert_eq!(
            h.calls,
            vec!["add pod-1 ns/pod", "keep ghost", "reconcile ghost,pod-1"]
        );
    }
}
