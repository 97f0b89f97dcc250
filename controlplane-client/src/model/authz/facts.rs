//! What a decision reads of a connection, prepared once per decision: the
//! addresses as bits, the port, the peer identity, and the Bloom bits of
//! its principal and namespace (see the prefilter).

use std::net::IpAddr;

use crate::model::identity::Identity;

/// An address as [`Prefix`](super::compile) compares it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ip {
    pub(super) v4: bool,
    pub(super) bits: u128,
}

impl Ip {
    pub(super) fn new(ip: IpAddr) -> Ip {
        let (v4, bits, _) = ip_bits(ip);
        Ip { v4, bits }
    }
}

/// (is IPv4, the address right-aligned in 128 bits, its width).
pub(super) fn ip_bits(ip: IpAddr) -> (bool, u128, u32) {
    match ip {
        IpAddr::V4(v4) => (true, u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (false, u128::from(v6), 128),
    }
}

/// What policies look at in a connection, prepared once per decision.
pub(super) struct Facts<'a> {
    pub(super) src: Ip,
    pub(super) dst: Ip,
    pub(super) port: u16,
    /// The peer's identity; None for plaintext.
    pub(super) peer: Option<&'a Identity>,
    /// The Bloom bits of the principal (0 without an identity) and of
    /// the namespace.
    pub(super) principal_bit: u64,
    pub(super) namespace_bit: u64,
}

impl<'a> Facts<'a> {
    pub(super) fn new(src: IpAddr, dst: IpAddr, port: u16, peer: Option<&'a Identity>) -> Self {
        Facts {
            src: Ip::new(src),
            dst: Ip::new(dst),
            port,
            peer,
            principal_bit: peer.map_or(0, |id| bloom_bit(&principal(id))),
            namespace_bit: bloom_bit(&[peer.map_or("", |id| id.namespace.as_str())]),
        }
    }
}

/// The principal as parts: "td/ns/NS/sa/SA" (`spiffe://` stripped).
#[inline]
pub(super) fn principal(id: &Identity) -> [&str; 5] {
    [
        &id.trust_domain,
        "/ns/",
        &id.namespace,
        "/sa/",
        &id.service_account,
    ]
}

/// The Bloom bit of the string made of `parts`: one of 64. FNV-1a over the
/// bytes (so the parts hash as their concatenation would), then a 64-bit
/// finalizer: FNV alone leaves the top bits of short strings alike ("a",
/// "x" and "y" shared a bit).
#[inline]
pub(super) fn bloom_bit(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    1 << (h & 63)
}
