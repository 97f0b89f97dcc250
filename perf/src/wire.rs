//! The tiny protocol between the load generator and `ringway-perf serve`:
//! a 16-byte request header, then the scenario's bytes.

use std::io::{self, Read, Write};

const MAGIC: &[u8; 4] = b"RWP1";

/// What the client asks the server to do on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Discard everything the client sends; send `download` bytes back,
    /// then FIN.
    Bulk { download: u64 },
    /// Echo every byte back until EOF (request/response).
    Echo,
}

impl Op {
    pub fn encode(self) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(MAGIC);
        let (code, arg) = match self {
            Op::Bulk { download } => (1u32, download),
            Op::Echo => (2u32, 0),
        };
        h[4..8].copy_from_slice(&code.to_be_bytes());
        h[8..16].copy_from_slice(&arg.to_be_bytes());
        h
    }

    pub fn decode(h: &[u8; 16]) -> io::Result<Op> {
        if &h[..4] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a ringway-perf client",
            ));
        }
        let code = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let arg = u64::from_be_bytes(h[8..16].try_into().unwrap());
        match code {
            1 => Ok(Op::Bulk { download: arg }),
            2 => Ok(Op::Echo),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown op {code}"),
            )),
        }
    }

    pub fn write_to(self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Op> {
        let mut h = [0u8; 16];
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
    }
}
