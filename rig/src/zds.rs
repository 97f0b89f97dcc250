//! An in-test node agent: the istio-cni side of ZDS (for the in-pod
//! tests and the in-pod benchmark). It listens on a real
//! unix SOCK_SEQPACKET socket, reads the proxy's hello, and sends requests
//! one at a time, each `add` with a real pod network namespace attached
//! (SCM_RIGHTS), waiting for the proxy's ack as istio-cni does.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use ringway_controlplane::sources::zds::{recv, send_with_fd, unix_addr};
use ringway_proto::zds::{
    workload_request::Payload, workload_response, AddWorkload, DelWorkload, KeepWorkload,
    SnapshotSent, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello,
};

/// The agent's listening socket.
pub struct Agent {
    pub path: PathBuf,
    listener: OwnedFd,
}

impl Agent {
    /// Listens on `path` (replacing a stale socket file, as an agent that
    /// restarts does).
    pub fn listen(path: &Path) -> Agent {
        let _ = std::fs::remove_file(path);
        // SAFETY: socket(2); checked below.
        let fd =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: fresh descriptor, owned here.
        let listener = unsafe { OwnedFd::from_raw_fd(fd) };
        let (addr, len) = unix_addr(path).unwrap();
        // SAFETY: valid sockaddr_un of length len.
        let r = unsafe {
            libc::bind(
                listener.as_raw_fd(),
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        };
        assert_eq!(
            r,
            0,
            "bind {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        // SAFETY: listen on our socket.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 8) }, 0);
        Agent {
            path: path.to_owned(),
            listener,
        }
    }

    /// Waits (up to `within`) for the proxy to connect and say hello.
    pub fn accept(&self, within: Duration) -> AgentConn {
        let deadline = Instant::now() + within;
        loop {
            let mut pfd = libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 100) };
            if r > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy did not connect to {} within {within:?}",
                self.path.display()
            );
        }
        // SAFETY: accept on our listening socket; result checked.
        let fd = unsafe {
            libc::accept4(
                self.listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        assert!(fd >= 0, "accept: {}", std::io::Error::last_os_error());
        // SAFETY: fresh descriptor from accept4, owned by no one else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let conn = AgentConn { sock };
        let hello = conn.read(Duration::from_secs(10));
        let hello = ZdsHello::decode(&hello[..]).expect("the first packet is a ZdsHello");
        assert_eq!(hello.version, 1, "ZDS version");
        conn
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One proxy's connection, from the agent's side.
pub struct AgentConn {
    sock: OwnedFd,
}

impl AgentConn {
    fn read(&self, within: Duration) -> Vec<u8> {
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as i32) };
        assert!(r > 0, "no packet from the proxy within {within:?}");
        let p = recv(self.sock.as_raw_fd())
            .expect("recv")
            .expect("the proxy closed the ZDS connection");
        assert!(p.fds.is_empty(), "the proxy sent descriptors");
        p.bytes
    }

    /// Sends one request and returns the ack's error ("" = ACK).
    pub fn request(&self, payload: Payload, netns: Option<&std::fs::File>) -> String {
        self.try_request(payload, netns)
            .unwrap_or_else(|e| panic!("ZDS request: {e}"))
    }

    /// [`request`](Self::request), with a closed connection as an error
    /// rather than a panic (a proxy may hang up on a request it rejects).
    pub fn try_request(
        &self,
        payload: Payload,
        netns: Option<&std::fs::File>,
    ) -> Result<String, String> {
        let bytes = WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec();
        send_with_fd(self.sock.as_raw_fd(), &bytes, netns.map(|f| f.as_raw_fd()))
            .map_err(|e| format!("the proxy hung up: {e}"))?;
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 20_000) } <= 0 {
            return Err("no answer within 20 s".into());
        }
        let packet = recv(self.sock.as_raw_fd())
            .map_err(|e| format!("the proxy hung up: {e}"))?
            .ok_or_else(|| "the proxy hung up".to_string())?;
        let resp = WorkloadResponse::decode(&packet.bytes[..])
            .map_err(|e| format!("undecodable response: {e}"))?;
        match resp.payload {
            Some(workload_response::Payload::Ack(a)) => Ok(a.error),
            None => Err("response without an ack".into()),
        }
    }

    /// `add` with the named pod namespace (`ip netns` name).
    pub fn add(&self, uid: &str, netns: &str, ns: &str, name: &str, sa: &str) -> String {
        let file = std::fs::File::open(format!("/var/run/netns/{netns}"))
            .unwrap_or_else(|e| panic!("open netns {netns}: {e}"));
        self.add_fd(uid, &file, ns, name, sa)
    }

    /// `add` with any descriptor (to test what a bad one gets).
    pub fn add_fd(&self, uid: &str, fd: &std::fs::File, ns: &str, name: &str, sa: &str) -> String {
        self.request(
            Payload::Add(AddWorkload {
                uid: uid.into(),
                workload_info: Some(WorkloadInfo {
                    name: name.into(),
                    namespace: ns.into(),
                    service_account: sa.into(),
                }),
            }),
            Some(fd),
        )
    }

    pub fn keep(&self, uid: &str) -> String {
        self.request(Payload::Keep(KeepWorkload { uid: uid.into() }), None)
    }

    pub fn del(&self, uid: &str) -> String {
        self.request(Payload::Del(DelWorkload { uid: uid.into() }), None)
    }

    pub fn snapshot_sent(&self) -> String {
        self.request(Payload::SnapshotSent(SnapshotSent {}), None)
    }
}
