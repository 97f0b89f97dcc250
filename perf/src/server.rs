//! `ringway-perf serve`: the sink / source / echo server every scenario
//! talks to. One thread per connection and direction: with large buffers
//! a blocking thread is the cheapest way to keep a loopback stream busy.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;

use crate::wire::Op;

pub const CHUNK: usize = 1 << 20;

/// Binds every address and serves forever on background threads.
pub fn spawn(addrs: &[SocketAddr]) -> anyhow::Result<Vec<SocketAddr>> {
    let mut bound = Vec::new();
    for &a in addrs {
        let l = TcpListener::bind(a).map_err(|e| anyhow::anyhow!("bind {a}: {e}"))?;
        bound.push(l.local_addr()?);
        thread::spawn(move || {
            for conn in l.incoming() {
                match conn {
                    Ok(s) => {
                        thread::spawn(move || {
                            if let Err(e) = handle(s) {
                                if e.kind() != io::ErrorKind::UnexpectedEof {
                                    eprintln!("ringway-perf serve: {e}");
                                }
                            }
                        });
                    }
                    Err(e) => eprintln!("ringway-perf serve: accept: {e}"),
                }
            }
        });
    }
    Ok(bound)
}

fn handle(mut s: TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    match Op::read_from(&mut s)? {
        Op::Bulk { download } => {
            let mut w = s.try_clone()?;
            let writer = thread::spawn(move || -> io::Result<TcpStream> {
                send_bytes(&mut w, download)?;
                Ok(w)
            });
            let received = discard(&mut s)?;
            let mut w = writer
                .join()
                .map_err(|_| io::Error::other("writer panicked"))??;
            // The trailer proves to the client how much of its upload arrived.
            w.write_all(&received.to_be_bytes())?;
            w.shutdown(Shutdown::Write)?;
        }
        Op::Echo => {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                s.write_all(&buf[..n])?;
            }
        }
    }
    Ok(())
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
        let got = r.read(&mut buf[..k])?;
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
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}
