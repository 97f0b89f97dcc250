//! The PROXY protocol v2 header ringway writes in front of a stream to a
//! workload whose application tunnel asks for it (a sandwiched waypoint,
//! say): the client's address, the stream's original target, and the
//! peer's SPIFFE identity in TLV 0xD0, as ztunnel writes it.
//!
//! Written by hand: it is a fixed 16-byte preamble, two addresses and one
//! TLV, and only ever encoded here.

use std::net::{IpAddr, SocketAddr};

const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2, command PROXY.
const V2_PROXY: u8 = 0x21;
/// TCP over IPv4 / IPv6.
const TCP4: u8 = 0x11;
const TCP6: u8 = 0x21;
/// Istio's TLV type for the peer's SPIFFE identity.
pub const TLV_PEER_IDENTITY: u8 = 0xD0;

/// The header for a stream from `src` to `dst` authenticated as `identity`.
/// Mixed address families are written as IPv6 (IPv4-mapped).
pub fn encode(src: SocketAddr, dst: SocketAddr, identity: &str) -> Vec<u8> {
    let id = identity.as_bytes();
    let id_len = id.len().min(u16::MAX as usize - 64);
    let v4 = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some((s, d)),
        _ => None,
    };
    let addr_len = if v4.is_some() { 12 } else { 36 };
    let mut h = Vec::with_capacity(16 + addr_len + 3 + id_len);
    h.extend_from_slice(&SIGNATURE);
    h.push(V2_PROXY);
    h.push(if v4.is_some() { TCP4 } else { TCP6 });
    h.extend_from_slice(&((addr_len + 3 + id_len) as u16).to_be_bytes());
    match v4 {
        Some((s, d)) => {
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
        }
        None => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            h.extend_from_slice(&v6(src.ip()).octets());
            h.extend_from_slice(&v6(dst.ip()).octets());
        }
    }
    h.extend_from_slice(&src.port().to_be_bytes());
    h.extend_from_slice(&dst.port().to_be_bytes());
    h.push(TLV_PEER_IDENTITY);
    h.extend_from_slice(&(id_len as u16).to_be_bytes());
    h.extend_from_slice(&id[..id_len]);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_layout() {
        let h = encode(
            "10.0.0.1:40000".parse().unwrap(),
            "10.96.0.10:80".parse().unwrap(),
            "spiffe://td/ns/a/sa/b",
        );
        assert_eq!(&h[..12], b"\r\n\r\n\0\r\nQUIT\n");
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        let len = u16::from_be_bytes([h[14], h[15]]) as usize;
        assert_eq!(len, h.len() - 16);
        assert_eq!(&h[16..20], &[10, 0, 0, 1]);
        assert_eq!(&h[20..24], &[10, 96, 0, 10]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 40000);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 80);
        assert_eq!(h[28], 0xD0);
        assert_eq!(u16::from_be_bytes([h[29], h[30]]) as usize, 21);
        assert_eq!(&h[31..], b"spiffe://td/ns/a/sa/b");
    }

    #[test]
    fn mixed_families_are_written_as_ipv6() {
        let h = encode(
            "10.0.0.1:1".parse().unwrap(),
            "[fd00::1]:2".parse().unwrap(),
            "x",
        );
        assert_eq!(h[13], 0x21);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]) as usize, 36 + 3 + 1);
        let src: [u8; 16] = h[16..32].try_into().unwrap();
        assert_eq!(
            std::net::Ipv6Addr::from(src),
            "::ffff:10.0.0.1".parse::<std::net::Ipv6Addr>().unwrap()
        );
    }
}
