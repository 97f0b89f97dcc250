//! The side ports' HTTP server (readiness 15021, metrics 15020, admin
//! 15000), on the control thread: deliberately small, HTTP/1.1, one
//! request per connection. What answers is the caller's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::AbortHandle;

/// An answer: status line, content type, body.
pub type Answer = (&'static str, &'static str, String);

pub const TEXT: &str = "text/plain; charset=utf-8";
pub const JSON: &str = "application/json";
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Requests larger than this get 431 and a close.
const MAX_REQUEST: usize = 8 << 10;

/// Connections a port serves at once. At the cap a new connection
/// displaces the oldest: a kubelet probe or a scrape is answered in
/// milliseconds, so the oldest is the slowest (a slowloris client), and
/// descriptors stay bounded while probes keep being answered.
const MAX_CONNECTIONS: usize = 64;

/// The request head must arrive within this (whatever its pace).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer must be written within this: a client that does not read
/// does not hold its connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The side ports, for their counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SidePort {
    Readiness,
    Metrics,
    Admin,
}

impl SidePort {
    pub const ALL: [SidePort; 3] = [SidePort::Readiness, SidePort::Metrics, SidePort::Admin];

    pub fn name(self) -> &'static str {
        match self {
            SidePort::Readiness => "readiness",
            SidePort::Metrics => "metrics",
            SidePort::Admin => "admin",
        }
    }

    /// What its bounds did so far.
    pub fn stats(self) -> &'static SidePortStats {
        &SIDE_PORT_STATS[self as usize]
    }
}

/// What a side port's bounds did: the scrape's
/// `ringway_side_port_*_total{port}`.
#[derive(Debug, Default)]
pub struct SidePortStats {
    /// Connections closed to make room at the cap (the oldest first).
    pub displaced: AtomicU64,
    /// Connections closed because the request head did not arrive in time.
    pub read_timeouts: AtomicU64,
    /// Connections closed because the client did not take the answer in
    /// time.
    pub write_timeouts: AtomicU64,
}

static SIDE_PORT_STATS: [SidePortStats; 3] = [const {
    SidePortStats {
        displaced: AtomicU64::new(0),
        read_timeouts: AtomicU64::new(0),
        write_timeouts: AtomicU64::new(0),
    }
}; 3];

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A deliberately small HTTP/1.1 server for the side endpoints (readiness
/// for kubelet, metrics for Prometheus, admin): one request per
/// connection, answered by `answer(method, path, query)` with (status,
/// content type, body). What it is not made for gets a 4xx and a close,
/// never a crash: a request that is not HTTP 400, one over 8 KiB 431, one
/// slower than 5 s is closed, as is an answer not taken within 10 s; at
/// most 64 connections at once (the oldest gives way). Each bound that
/// bites is counted in `port`'s [`SidePortStats`].
pub async fn serve_http<F>(listener: tokio::net::TcpListener, port: SidePort, answer: F)
where
    F: Fn(&str, &str, &str) -> Answer + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    // The connections being served, oldest first (only this loop uses it).
    let mut live: VecDeque<AbortHandle> = VecDeque::with_capacity(MAX_CONNECTIONS);
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        live.retain(|h| !h.is_finished());
        if live.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = live.pop_front() {
                oldest.abort();
                bump(&port.stats().displaced);
            }
        }
        let answer = answer.clone();
        let task = tokio::spawn(async move {
            let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut s)).await;
            let (status, kind, body) = match head {
                Err(_) => {
                    // Too slow: closed.
                    bump(&port.stats().read_timeouts);
                    return;
                }
                Ok(Err(status)) => (status, TEXT, format!("{status}\n")),
                Ok(Ok((method, path, query))) => {
                    let (status, kind, body) = answer(&method, &path, &query);
                    (
                        status,
                        kind,
                        if method == "HEAD" {
                            String::new()
                        } else {
                            body
                        },
                    )
                }
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let write = async {
                s.write_all(resp.as_bytes()).await?;
                s.write_all(body.as_bytes()).await
            };
            if tokio::time::timeout(WRITE_TIMEOUT, write).await.is_err() {
                bump(&port.stats().write_timeouts);
            }
        });
        live.push_back(task.abort_handle());
    }
}

/// Reads a request head; its method, path and query, or the status to
/// refuse it with.
async fn read_head(
    s: &mut tokio::net::TcpStream,
) -> Result<(String, String, String), &'static str> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > MAX_REQUEST {
            return Err("431 Request Header Fields Too Large");
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = std::str::from_utf8(&buf).map_err(|_| "400 Bad Request")?;
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/1.") => {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            Ok((method.to_owned(), path.to_owned(), query.to_owned()))
        }
        _ => Err("400 Bad Request"),
    }
}
