//! `ringway-perf serve`: the sink / source / responder every scenario
//! talks to.
//!
//! Small-message work (request/response, echo, idle connections) runs on
//! a few epoll reactor threads, so thousands of connections and tens of
//! thousands of connects per second cost the server little CPU on a
//! machine it shares with the proxy under test. Bulk transfers get blocking
//! threads with 1 MiB buffers: that is the cheapest way to keep one stream
//! busy.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::Context;

use crate::epoll::{self, Epoll};
use crate::wire::{Op, HEADER_LEN};

/// Buffer size for bulk reads and writes.
pub const CHUNK: usize = 1 << 20;

/// Response bytes of request/response connections come from here.
static FILL: [u8; 64 << 10] = [0x5a; 64 << 10];

/// Work one connection may do per wakeup before others get a turn.
const BUDGET: usize = 32;

/// Binds every address and serves forever on background threads (one
/// reactor per CPU, at most 4). Threads inherit the caller's network
/// namespace.
pub fn spawn(addrs: &[SocketAddr]) -> anyhow::Result<Vec<SocketAddr>> {
    let reactors = thread::available_parallelism().map_or(2, |n| n.get().min(4));
    spawn_with(addrs, reactors)
}

/// Like [`spawn`] with an explicit number of reactor threads.
pub fn spawn_with(addrs: &[SocketAddr], reactors: usize) -> anyhow::Result<Vec<SocketAddr>> {
    let mut listeners = Vec::new();
    for &a in addrs {
        listeners.push(listen(a).with_context(|| format!("bind {a}"))?);
    }
    let bound = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<io::Result<Vec<_>>>()?;
    let listeners = Arc::new(listeners);
    for i in 0..reactors.max(1) {
        let reactor = Reactor::new(listeners.clone())?;
        thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(move || reactor.run())?;
    }
    Ok(bound)
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// epoll tokens with this bit set name a listener (by index).
const LISTENER: u64 = 1 << 63;

struct Reactor {
    ep: Epoll,
    listeners: Arc<Vec<TcpListener>>,
    /// Connections by token (a tiny slab).
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    scratch: Box<[u8]>,
}

impl Reactor {
    fn new(listeners: Arc<Vec<TcpListener>>) -> io::Result<Reactor> {
        let ep = Epoll::new()?;
        for (i, l) in listeners.iter().enumerate() {
            // Every reactor watches every listener; EXCLUSIVE wakes one.
            ep.add(
                l.as_raw_fd(),
                epoll::IN | libc::EPOLLEXCLUSIVE as u32,
                LISTENER | i as u64,
            )?;
        }
        Ok(Reactor {
            ep,
            listeners,
            conns: Vec::new(),
            free: Vec::new(),
            scratch: vec![0u8; 64 << 10].into_boxed_slice(),
        })
    }

    fn run(mut self) {
        let mut events = epoll::events(256);
        loop {
            let n = match self.ep.wait(&mut events, -1) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ringway-perf serve: epoll_wait: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                let token = ev.u64;
                if token & LISTENER != 0 {
                    self.accept((token & !LISTENER) as usize);
                } else {
                    self.drive(token as usize);
                }
            }
        }
    }

    fn accept(&mut self, i: usize) {
        let listeners = self.listeners.clone();
        loop {
            match listeners[i].accept() {
                Ok((s, _)) => {
                    if let Err(e) = self.register(s) {
                        eprintln!("ringway-perf serve: register: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("ringway-perf serve: accept: {e}");
                    thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    fn register(&mut self, s: TcpStream) -> io::Result<()> {
        s.set_nonblocking(true)?;
        s.set_nodelay(true)?;
        let key = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self.ep.add(s.as_raw_fd(), epoll::IN, key as u64) {
            self.free.push(key);
            return Err(e);
        }
        self.conns[key] = Some(Conn {
            stream: s,
            state: State::Header {
                buf: [0; HEADER_LEN],
                got: 0,
            },
            interest: Interest::Read,
        });
        Ok(())
    }

    fn retire(&mut self, key: usize) -> Option<Conn> {
        let conn = self.conns.get_mut(key)?.take()?;
        self.free.push(key);
        Some(conn)
    }

    fn drive(&mut self, key: usize) {
        // A stale event for a slot that was retired earlier in this batch
        // finds nothing (or a new connection, for which a spurious wakeup
        // is harmless).
        let Some(conn) = self.conns.get_mut(key).and_then(Option::as_mut) else {
            return;
        };
        match conn.advance(&mut self.scratch) {
            Ok(Step::Wait(interest)) => {
                if interest != conn.interest {
                    let events = match interest {
                        Interest::Read => epoll::IN,
                        Interest::Write => epoll::OUT,
                    };
                    conn.interest = interest;
                    let fd = conn.stream.as_raw_fd();
                    if self.ep.modify(fd, events, key as u64).is_err() {
                        self.retire(key);
                    }
                }
            }
            Ok(Step::Close) => {
                self.retire(key);
            }
            Ok(Step::Bulk(download)) => {
                let conn = self.retire(key).expect("live connection");
                let _ = self.ep.delete(conn.stream.as_raw_fd());
                let spawned = thread::Builder::new()
                    .name("serve-bulk".into())
                    .spawn(move || {
                        if let Err(e) = bulk(conn.stream, download) {
                            if !is_disconnect(&e) {
                                eprintln!("ringway-perf serve: bulk: {e}");
                            }
                        }
                    });
                if let Err(e) = spawned {
                    eprintln!("ringway-perf serve: cannot start a bulk thread: {e}");
                }
            }
            Err(e) => {
                if !is_disconnect(&e) {
                    eprintln!("ringway-perf serve: {e}");
                }
                self.retire(key);
            }
        }
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Interest {
    Read,
    Write,
}

enum Step {
    /// Nothing more to do until the socket is ready for this.
    Wait(Interest),
    Close,
    /// Hand the connection to a blocking bulk thread.
    Bulk(u64),
}

struct Conn {
    stream: TcpStream,
    state: State,
    interest: Interest,
}

enum State {
    Header {
        buf: [u8; HEADER_LEN],
        got: usize,
    },
    Rr {
        request: u64,
        response: u64,
        /// Bytes of the current request received so far.
        got: u64,
        /// Response bytes not yet written.
        owed: u64,
    },
    Echo {
        pending: Vec<u8>,
        sent: usize,
    },
}

/// The bytes a nonblocking read or write of [`Conn::advance`] moved; on
/// would-block it returns the wait for `interest`, on an interrupted call
/// it goes round the loop again. A read of 0 bytes (EOF) closes.
macro_rules! moved {
    (read $e:expr) => {
        match moved!($e, Interest::Read) {
            0 => return Ok(Step::Close),
            n => n,
        }
    };
    ($e:expr, $interest:expr) => {
        match $e {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Wait($interest)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
}

impl Conn {
    /// Does what the socket allows right now (nonblocking).
    fn advance(&mut self, scratch: &mut [u8]) -> io::Result<Step> {
        let Conn { stream, state, .. } = self;
        for _ in 0..BUDGET {
            match state {
                State::Header { buf, got } => {
                    // Read no further than the header: what follows belongs
                    // to the op.
                    *got += moved!(read stream.read(&mut buf[*got..]));
                    if *got == HEADER_LEN {
                        *state = match Op::decode(buf)? {
                            Op::Bulk { download } => return Ok(Step::Bulk(download)),
                            Op::Echo => State::Echo {
                                pending: Vec::new(),
                                sent: 0,
                            },
                            Op::Rr { request, response } => State::Rr {
                                request: request as u64,
                                response: response as u64,
                                got: 0,
                                owed: 0,
                            },
                        };
                    }
                }
                State::Rr {
                    request,
                    response,
                    got,
                    owed,
                } => {
                    if *owed > 0 {
                        let k = (*owed).min(FILL.len() as u64) as usize;
                        *owed -= moved!(stream.write(&FILL[..k]), Interest::Write) as u64;
                        continue;
                    }
                    let total = *got + moved!(read stream.read(scratch)) as u64;
                    *owed += total / *request * *response;
                    *got = total % *request;
                }
                State::Echo { pending, sent } => {
                    if *sent < pending.len() {
                        *sent += moved!(stream.write(&pending[*sent..]), Interest::Write);
                        continue;
                    }
                    pending.clear();
                    *sent = 0;
                    let n = moved!(read stream.read(scratch));
                    pending.extend_from_slice(&scratch[..n]);
                }
            }
        }
        // Out of budget: level-triggered epoll reports the socket again.
        let pending_write = match state {
            State::Header { .. } => false,
            State::Rr { owed, .. } => *owed > 0,
            State::Echo { pending, sent } => *sent < pending.len(),
        };
        Ok(Step::Wait(if pending_write {
            Interest::Write
        } else {
            Interest::Read
        }))
    }
}

/// The bulk op on a blocking thread: discard the upload, send `download`
/// bytes, then the upload count as a trailer. Nagle on, as for any bulk
/// sender. Clients that only download send FIN right after the header, so
/// the reading thread is done before the download starts.
fn bulk(s: TcpStream, download: u64) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(false)?;
    let writer = if download > 0 {
        let mut w = s.try_clone()?;
        Some(thread::spawn(move || send_bytes(&mut w, download)))
    } else {
        None
    };
    let received = discard(&mut &s)?;
    if let Some(writer) = writer {
        writer
            .join()
            .map_err(|_| io::Error::other("writer panicked"))??;
    }
    // The trailer proves to the client how much of its upload arrived.
    (&s).write_all(&received.to_be_bytes())?;
    s.shutdown(Shutdown::Write)
}

/// Sends `n` bytes from a constant buffer (no generation cost).
pub fn send_bytes(w: &mut impl Write, mut n: u64) -> io::Result<()> {
    let buf = vec![0x5au8; CHUNK];
    while n > 0 {
        let k = n.min(CHUNK as u64) as usize;
        w.write_all(&buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Reads exactly `n` bytes and drops them.
pub fn discard_exact(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    while n > 0 {
        let k = n.min(CHUNK as u64) as usize;
        let got = match r.read(&mut buf[..k]) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{n} bytes missing"),
            ));
        }
        n -= got as u64;
    }
    Ok(())
}

/// Reads to EOF, returns the byte count.
pub fn discard(r: &mut impl Read) -> io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> SocketAddr {
        spawn_with(&["127.0.0.1:0".parse().unwrap()], 2).unwrap()[0]
    }

    #[test]
    fn rr_answers_every_request_even_pipelined() {
        let addr = local();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Header and three 3-byte requests in one write: 3 × 5 bytes back.
        let mut msg = Op::Rr {
            request: 3,
            response: 5,
        }
        .encode()
        .to_vec();
        msg.extend_from_slice(&[1; 9]);
        s.write_all(&msg).unwrap();
        let mut got = [0u8; 15];
        s.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x5a));
        // A request split across writes.
        s.write_all(&[1]).unwrap();
        thread::sleep(Duration::from_millis(20));
        s.write_all(&[1, 1]).unwrap();
        s.read_exact(&mut got[..5]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(discard(&mut s).unwrap(), 0);
    }

    #[test]
    fn rr_large_response_is_flow_controlled() {
        let addr = local();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Op::Rr {
            request: 1,
            response: 8 << 20,
        }
        .write_to(&mut s)
        .unwrap();
        s.write_all(&[7]).unwrap();
        discard_exact(&mut s, 8 << 20).unwrap();
    }

    #[test]
    fn echo_and_bad_header() {
        let addr = local();
        let mut s = TcpStream::connect(addr).unwrap();
        Op::Echo.write_to(&mut s).unwrap();
        s.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");

        let mut bad = TcpStream::connect(addr).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        bad.write_all(&[0u8; HEADER_LEN]).unwrap();
        // The server hangs up on a client that does not speak the protocol.
        let mut buf = [0u8; 1];
        assert!(matches!(bad.read(&mut buf), Ok(0) | Err(_)));
    }
}
