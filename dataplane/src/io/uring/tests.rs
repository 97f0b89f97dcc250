//! Completion sockets on a real ring, over real TCP sockets on loopback.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::*;
use crate::io::executor::{poller, spawn_local, timer, Builder};

fn on_executor<F: std::future::Future<Output = ()> + 'static>(
    ring: RingConfig,
    f: impl FnOnce() -> F + Send + 'static,
) {
    Builder::new("ring-sock-test")
        .ring(ring)
        .spawn(f)
        .expect("executor")
        .join()
        .expect("executor ran");
}

fn small_ring() -> RingConfig {
    RingConfig {
        entries: 64,
        recv_buffers: 8,
        recv_buffer_size: 4096,
        io: IoMode::Completion,
        caps: SocketCaps {
            recv: 16 << 10,
            send: 16 << 10,
        },
    }
}

/// A connected TCP pair on loopback: (ours, nonblocking; theirs, blocking
/// with a read timeout).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let theirs = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (ours, _) = l.accept().unwrap();
    ours.set_nonblocking(true).unwrap();
    ours.set_nodelay(true).unwrap();
    theirs.set_nodelay(true).unwrap();
    theirs
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (ours, theirs)
}

/// Lets the executor run (and reap) until `done` holds, for at most ten
/// seconds; panics naming `what` if it never does.
pub(super) async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        timer::sleep(Duration::from_millis(1)).await;
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Echo through a ring socket: each message is received from the ring and
/// sent back from the very buffer it arrived in; a peer thread checks what
/// comes back. And the sends stay quiet where the kernel allows it.
#[test]
fn echo_moves_every_byte_in_order() {
    on_executor(small_ring(), || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        let peer = std::thread::spawn(move || {
            let mut got = [0u8; 64];
            for round in 0..500u32 {
                let msg = pattern(1 + (round as usize % 60), round as u8);
                theirs.write_all(&msg).unwrap();
                theirs.read_exact(&mut got[..msg.len()]).unwrap();
                assert_eq!(&got[..msg.len()], &msg[..], "round {round}");
            }
            theirs.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            theirs.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty());
        });
        while let Some(piece) = sock.recv().await.expect("receive") {
            sock.room().await.unwrap();
            sock.send(piece);
        }
        sock.flushed().await.unwrap();
        socket::shutdown_write(ours.as_raw_fd()).unwrap();
        drop(sock);
        let done = std::cell::Cell::new(false);
        let peer = std::rc::Rc::new(std::cell::RefCell::new(Some(peer)));
        until("the peer has checked every echo", || {
            let finished = peer.borrow().as_ref().is_some_and(|h| h.is_finished());
            done.set(finished);
            finished
        })
        .await;
        peer.borrow_mut().take().unwrap().join().expect("peer");
        let stats = p.stats();
        assert!(stats.recvs >= 500, "{stats:?}");
        if p.setup().quiet_sends {
            assert!(
                stats.quiet_sends >= 490,
                "echo sends should be quiet: {stats:?}"
            );
        }
    });
}

use crate::io::socket;

/// A send larger than the peer takes at once goes out in order, the rest
/// after POLLOUT, and writes wait at the send cap meanwhile.
#[test]
fn a_send_the_socket_cannot_take_at_once_finishes_later() {
    on_executor(small_ring(), || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        let total = 16 << 20;
        let data = pattern(total, 3);
        let expected = data.clone();
        let reader = std::thread::spawn(move || {
            // Let the socket buffers fill first.
            std::thread::sleep(Duration::from_millis(100));
            let mut got = vec![0u8; total];
            theirs.read_exact(&mut got).unwrap();
            assert!(got == expected, "bytes differ");
        });
        let mut at = 0;
        while at < total {
            let n =
                std::future::poll_fn(|cx| sock.poll_write(cx, &data[at..(at + 8192).min(total)]))
                    .await
                    .expect("write");
            at += n;
            assert!(sock.queued() <= (16 << 10) + 8192, "queue over its cap");
        }
        sock.flushed().await.unwrap();
        let stats = p.stats();
        assert!(
            stats.short_sends > 0,
            "the peer never pushed back: {stats:?}"
        );
        let h = std::rc::Rc::new(std::cell::RefCell::new(Some(reader)));
        until("the reader got everything", || {
            h.borrow().as_ref().is_some_and(|h| h.is_finished())
        })
        .await;
        h.borrow_mut().take().unwrap().join().expect("reader");
    });
}

/// A reader that does not read: the socket stops receiving at its cap
/// (the kernel's window closes), holds no ring buffer while the core
/// sleeps, and later hands over every byte in order.
#[test]
fn a_stalled_reader_caps_what_the_socket_holds() {
    let mut ring = small_ring();
    // Enough buffers that the cap, not an empty ring, stops the receive.
    ring.recv_buffers = 64;
    on_executor(ring, || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        let total = 8 << 20;
        let data = pattern(total, 9);
        let expected = data.clone();
        let writer = std::thread::spawn(move || {
            theirs.write_all(&data).unwrap();
            theirs
        });
        // Start the receive, then stop reading.
        let first = sock.recv().await.unwrap().expect("bytes");
        let mut got = first.to_vec();
        drop(first);
        timer::sleep(Duration::from_millis(300)).await;
        let held = sock.with(|st, _| st.inbox_bytes);
        // With a receive budget: the cap plus at most one buffer. Without,
        // what one deferred run of the receive may add before its
        // cancellation lands: up to the whole ring.
        let bound = if p.setup().recv_budget {
            (16 << 10) + 4096
        } else {
            (16 << 10) + 64 * 4096
        };
        assert!(
            held <= bound,
            "the socket holds {held} bytes past its 16 KiB cap (bound {bound})"
        );
        assert_eq!(
            p.free_recv_buffers(),
            64,
            "ring buffers wait on a stalled reader"
        );
        assert!(
            !writer.is_finished(),
            "8 MiB fit the kernel: no backpressure shown"
        );
        while got.len() < total {
            let piece = sock.recv().await.unwrap().expect("more bytes");
            got.extend_from_slice(&piece);
        }
        assert!(got == expected, "bytes differ");
        let h = std::rc::Rc::new(std::cell::RefCell::new(Some(writer)));
        until("the writer finished", || {
            h.borrow().as_ref().is_some_and(|h| h.is_finished())
        })
        .await;
        drop(h.borrow_mut().take().unwrap().join().expect("writer"));
    });
}

/// More sockets receive at once than the ring has buffers: receives end on
/// the empty ring, come back once buffers return, and nothing is lost.
#[test]
fn an_empty_buffer_ring_loses_no_bytes() {
    let mut ring = small_ring();
    ring.recv_buffers = 2;
    on_executor(ring, || async {
        let p = poller();
        let pairs: Vec<_> = (0..6).map(|_| tcp_pair()).collect();
        let mut tasks = Vec::new();
        let mut writers = Vec::new();
        for (i, (ours, mut theirs)) in pairs.into_iter().enumerate() {
            let data = pattern(256 << 10, i as u8);
            let expected = data.clone();
            writers.push(std::thread::spawn(move || {
                theirs.write_all(&data).unwrap();
                theirs.shutdown(std::net::Shutdown::Write).unwrap();
                theirs
            }));
            let p = p.clone();
            tasks.push(spawn_local(async move {
                let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
                let mut got = Vec::new();
                while let Some(piece) = sock.recv().await.expect("receive") {
                    got.extend_from_slice(&piece);
                    drop(piece);
                    timer::sleep(Duration::from_micros(200)).await;
                }
                assert!(got == expected, "socket {i}: bytes differ");
                drop(sock);
                drop(ours);
            }));
        }
        for t in tasks {
            t.await;
        }
        for w in writers {
            drop(w.join().unwrap());
        }
        assert!(
            p.stats().starved > 0,
            "the ring never ran dry: {:?}",
            p.stats()
        );
        until("every buffer is back", || p.free_recv_buffers() == 2).await;
    });
}

/// Dropping a socket with its receive armed and bytes queued: the receive
/// is cancelled, the descriptor really closes (the peer sees EOF), and the
/// slot is freed once the kernel is done with it.
#[test]
fn dropping_a_ring_socket_releases_it() {
    on_executor(small_ring(), || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        theirs.write_all(b"ping").unwrap();
        let got = sock.recv().await.unwrap().expect("bytes");
        assert_eq!(&got[..], b"ping");
        drop(got);
        let before = p.slots.borrow().len();
        drop(sock);
        drop(ours);
        // The cancellation (and with it the kernel's last reference to the
        // socket) completes at the executor's next enter: wait on the
        // executor, not on a blocking read that would stop it.
        theirs.set_nonblocking(true).unwrap();
        until("the peer sees EOF", || {
            matches!((&theirs).read(&mut [0u8; 8]), Ok(0))
        })
        .await;
        until("the slot is freed", || p.slots.borrow().len() < before).await;
        assert_eq!(p.free_recv_buffers(), 8);
    });
}

/// A lingering socket hands its queued bytes to the kernel before its
/// descriptor closes: the last words of a connection are not lost.
#[test]
fn a_lingering_socket_sends_what_it_queued() {
    on_executor(small_ring(), || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let mut sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        sock.linger();
        std::future::poll_fn(|cx| sock.poll_write(cx, b"goodbye"))
            .await
            .unwrap();
        drop(sock);
        drop(ours);
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"goodbye");
    });
}

/// End of stream and a reset reach the reader.
#[test]
fn eof_and_reset_reach_the_reader() {
    on_executor(small_ring(), || async {
        let p = poller();
        let (ours, theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(sock.recv().await.unwrap().is_none(), "EOF expected");
        drop(sock);

        let (ours, theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        socket2::SockRef::from(&theirs)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(theirs);
        let r = sock.recv().await;
        assert!(
            r.is_err(),
            "a reset must be an error: {:?}",
            r.map(|o| o.map(|p| p.len()))
        );
    });
}

/// The kernels ringway runs on (6.1+; this rig's 6.18) give it every ring
/// feature the per-message path counts on; a fallback here would cost an
/// enter per message without anyone noticing, so this says so loudly.
#[test]
fn this_kernel_gives_the_ring_what_the_fast_path_needs() {
    on_executor(RingConfig::default(), || async {
        let setup = poller().setup();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let version: Vec<u32> = release
            .trim()
            .split(|c: char| !c.is_ascii_digit())
            .take(2)
            .filter_map(|p| p.parse().ok())
            .collect();
        let at_least = |maj: u32, min: u32| version.as_slice() >= [maj, min].as_slice();
        if at_least(6, 1) {
            assert_eq!(setup.task_run, TaskRun::Deferred, "kernel {release}");
            assert!(setup.quiet_sends, "kernel {release}: quiet sends refused");
        }
        if at_least(6, 15) {
            assert!(
                setup.recv_budget,
                "kernel {release}: receive budget refused"
            );
        }
    });
}

/// Small messages cycle through a working set, not through the whole pool:
/// the ring holds 16 buffers at a time, topped up with the buffers used
/// last, so a quiet core keeps 16 buffers' first pages resident, not 256.
#[test]
fn small_messages_stay_in_the_ring_working_set() {
    let mut ring = small_ring();
    ring.recv_buffers = 256;
    on_executor(ring, || async {
        let p = poller();
        let (ours, mut theirs) = tcp_pair();
        let sock = RingSocket::new(&p, ours.as_raw_fd(), p.caps());
        let peer = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            for i in 0..300u32 {
                theirs.write_all(&[i as u8]).unwrap();
                theirs.read_exact(&mut b).unwrap();
            }
        });
        for _ in 0..300 {
            let piece = sock.recv().await.unwrap().expect("a message");
            sock.send(piece);
        }
        sock.flushed().await.unwrap();
        let h = std::rc::Rc::new(std::cell::RefCell::new(Some(peer)));
        until("the peer is done", || {
            h.borrow().as_ref().is_some_and(|h| h.is_finished())
        })
        .await;
        h.borrow_mut().take().unwrap().join().unwrap();
        assert_eq!(p.recv_buffer_target(), 16, "the working set grew");
        assert_eq!(p.free_recv_buffers(), 256);
    });
}

/// Every socket of every connection holds one of these for its life:
/// its size is idle memory per connection (312 bytes before the queues
/// kept their second and later pieces out of line).
#[test]
fn a_socket_state_fits_its_allocation_class() {
    let size = std::mem::size_of::<sock::SockState>();
    assert!(size <= 256, "SockState is {size} bytes");
}
