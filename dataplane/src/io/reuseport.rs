//! Keeping a port's queued connections when one of its listeners closes.
//!
//! An upgrade hands a pod's ports from one proxy to the next: both bind
//! them with `SO_REUSEPORT`, so for a while the kernel spreads new
//! connections over the listeners of both. When the old proxy closes its
//! listeners, the connections already in their accept queues (handshake
//! done, not yet accepted) and the half-open ones are reset by default:
//! with a client connecting in a tight loop, about one connection per
//! hand-over. Linux (5.14+) can instead move them to another listener of
//! the same port (the "migration" of a closing listener's requests). It
//! does so for a group when either
//! - a `SK_REUSEPORT` program of attach type `SELECT_OR_MIGRATE` is
//!   attached to the group: ours passes every decision back to the
//!   kernel's hash, so it changes nothing but the migration; or
//! - `net.ipv4.tcp_migrate_req` is 1 in the namespace (for every group
//!   there, the application's own included).
//!
//! [`keep_queued_connections`] tries the program first (it touches only
//! ringway's ports), then the sysctl; the program is loaded once per
//! process. The group keeps the program when the socket it was attached
//! through closes, so a proxy of another kind sharing the port (ztunnel)
//! has its closing listeners migrated too.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use crate::io::sockmap::{load_program, setsockopt_int, Insn, ProgramKind, Reg};

const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_SK_REUSEPORT_SELECT_OR_MIGRATE: u32 = 40;
/// A `SK_REUSEPORT` program's verdict that lets the kernel go on (to its
/// own hash, as no socket was selected).
const SK_PASS: i32 = 1;

/// How a port's listeners were made to hand their queues on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    /// Our `SK_REUSEPORT` program is attached to the port's group.
    Program,
    /// `net.ipv4.tcp_migrate_req` is 1 in the namespace.
    Sysctl,
}

impl Migration {
    pub fn name(self) -> &'static str {
        match self {
            Migration::Program => "reuseport program",
            Migration::Sysctl => "net.ipv4.tcp_migrate_req",
        }
    }
}

/// Makes the port of `listener` (a bound, listening `SO_REUSEPORT`
/// socket) hand its queued connections to the port's other listeners
/// when one of them closes. Call it with the thread in the listener's
/// network namespace: the sysctl fallback acts on the caller's. The error
/// says why neither way is open (no `bpf(2)`, a read-only `/proc/sys`).
pub fn keep_queued_connections(listener: BorrowedFd<'_>) -> Result<Migration, String> {
    let program = match program() {
        Ok(prog) => match attach(listener, prog) {
            Ok(()) => return Ok(Migration::Program),
            Err(e) => format!("cannot attach the reuseport program: {e}"),
        },
        Err(why) => why.clone(),
    };
    match enable_sysctl() {
        Ok(()) => Ok(Migration::Sysctl),
        Err(e) => Err(format!(
            "{program}; cannot set net.ipv4.tcp_migrate_req in the namespace either: {e}"
        )),
    }
}

/// The program, loaded on first use; the reason it cannot be, kept.
fn program() -> &'static Result<OwnedFd, String> {
    static PROGRAM: OnceLock<Result<OwnedFd, String>> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let kind = ProgramKind {
            prog_type: BPF_PROG_TYPE_SK_REUSEPORT,
            expected_attach_type: BPF_SK_REUSEPORT_SELECT_OR_MIGRATE,
            name: "ringway_migrate",
        };
        let insns = [Insn::mov64_imm(Reg::R0, SK_PASS), Insn::exit()];
        load_program(&kind, &insns).map_err(|(e, log)| {
            let mut why = format!("cannot load the reuseport program: {e}");
            if !log.is_empty() {
                why.push_str(&format!(" (verifier: {log})"));
            }
            why
        })
    })
}

fn attach(listener: BorrowedFd<'_>, prog: &OwnedFd) -> io::Result<()> {
    setsockopt_int(
        listener,
        libc::SOL_SOCKET,
        libc::SO_ATTACH_REUSEPORT_EBPF,
        prog.as_raw_fd(),
    )
}

/// `/proc/sys/net` is per network namespace, resolved when the file is
/// opened: the calling thread's.
const MIGRATE_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

fn enable_sysctl() -> io::Result<()> {
    if std::fs::read_to_string(MIGRATE_SYSCTL)?.trim() == "1" {
        return Ok(());
    }
    std::fs::write(MIGRATE_SYSCTL, "1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsFd;

    fn listener(addr: SocketAddr) -> TcpListener {
        crate::io::socket::bind_listener(addr, false, 128, false)
            .unwrap()
            .into()
    }

    /// Two listeners of one port; connections queue on both; the first
    /// closes without accepting. With the program attached, every queued
    /// connection is accepted by the second, none reset. Needs root
    /// (bpf(2)); fails loudly otherwise.
    #[test]
    fn a_closing_listener_hands_its_queue_to_the_port() {
        ringway_rig::require_root("loading a reuseport program").unwrap();
        let first = listener("127.0.0.1:0".parse().unwrap());
        let addr = first.local_addr().unwrap();
        let second = listener(addr);
        // The program alone: the sysctl fallback would change the host's.
        let prog = program().as_ref().expect("load the program");
        attach(first.as_fd(), prog).expect("attach the program");
        // Enough connections that both listeners get some (the kernel
        // hashes by source port).
        let mut clients: Vec<TcpStream> =
            (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
        drop(first);
        second.set_nonblocking(true).unwrap();
        let mut accepted = 0;
        while let Ok((mut s, _)) = second.accept() {
            s.write_all(b"k").unwrap();
            accepted += 1;
        }
        assert_eq!(
            accepted,
            clients.len(),
            "connections lost with the listener"
        );
        for c in &mut clients {
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
        }
    }
}
