//! The tiny protocol between the load generator and `ringway-perf serve`:
//! a 16-byte request header, then the scenario's bytes.
//!
//! Header: magic "RWP1", op code (u32, big endian), argument (u64, big
//! endian).

use std::io::{self, Read, Write};

const MAGIC: &[u8; 4] = b"RWP1";
pub const HEADER_LEN: usize = 16;

/// What the client asks the server to do on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Discard everything the client sends; send `download` bytes back,
    /// then an 8-byte trailer (upload byte count, big endian), then FIN.
    Bulk { download: u64 },
    /// Echo every byte back until EOF.
    Echo,
    /// Request/response: for every `request` bytes received, send
    /// `response` bytes back, until EOF. Requests may be pipelined.
    Rr { request: u32, response: u32 },
}

impl Op {
    pub fn encode(self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(MAGIC);
        let (code, arg) = match self {
            Op::Bulk { download } => (1u32, download),
            Op::Echo => (2u32, 0),
            Op::Rr { request, response } => (3u32, (request as u64) << 32 | response as u64),
        };
        h[4..8].copy_from_slice(&code.to_be_bytes());
        h[8..16].copy_from_slice(&arg.to_be_bytes());
        h
    }

    pub fn decode(h: &[u8; HEADER_LEN]) -> io::Result<Op> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        if &h[..4] != MAGIC {
            return Err(invalid("not a ringway-perf client".into()));
        }
        let code = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let arg = u64::from_be_bytes(h[8..16].try_into().unwrap());
        match code {
            1 => Ok(Op::Bulk { download: arg }),
            2 => Ok(Op::Echo),
            3 => {
                let (request, response) = ((arg >> 32) as u32, arg as u32);
                if request == 0 {
                    return Err(invalid("request/response with an empty request".into()));
                }
                Ok(Op::Rr { request, response })
            }
            _ => Err(invalid(format!("unknown op {code}"))),
        }
    }

    pub fn write_to(self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Op> {
        let mut h = [0u8; HEADER_LEN];
        r.read_exact(&mut h)?;
        Op::decode(&h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects() {
        for op in [
            Op::Bulk { download: 0 },
            Op::Bulk { download: 1 << 40 },
            Op::Echo,
            Op::Rr {
                request: 1,
                response: 0,
            },
            Op::Rr {
                request: u32::MAX,
                response: 7,
            },
        ] {
            assert_eq!(Op::decode(&op.encode()).unwrap(), op);
        }
        let mut bad = Op::Echo.encode();
        bad[0] = b'X';
        assert!(Op::decode(&bad).is_err());
        let mut bad = Op::Echo.encode();
        bad[7] = 9;
        assert!(Op::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("unknown op 9"));
        let empty = Op::Rr {
            request: 0,
            response: 1,
        }
        .encode();
        assert!(Op::decode(&empty).is_err());
    }
}
