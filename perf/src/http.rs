//! A minimal HTTP/1.1 client for the proxies' admin, metrics and
//! readiness endpoints (plain TCP, `Connection: close`): enough for the
//! benchmarks, with no HTTP stack to build.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;

/// A minimal HTTP/1.1 GET (Connection: close): status code and body
/// (content-length, chunked, or to EOF).
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of HTTP head")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let mut body = raw[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body)?;
    }
    Ok((status, body))
}

/// [`http_get`] that must answer 200: its body.
pub fn get_ok(addr: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<Vec<u8>> {
    match http_get(addr, path, timeout)? {
        (200, body) => Ok(body),
        (code, _) => anyhow::bail!("{path} answered {code}"),
    }
}

/// [`get_ok`] of a JSON body.
pub fn get_json(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    serde_json::from_slice(&get_ok(addr, path, timeout)?)
        .with_context(|| format!("{path}: not JSON"))
}

pub fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk")?;
        let size_text = std::str::from_utf8(&data[..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).context("short chunk")?);
        data = data.get(size + 2..).unwrap_or(&[]);
    }
}
