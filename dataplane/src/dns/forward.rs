//! Forwarding to the upstream resolvers, without sockets: which upstreams
//! (`/etc/resolv.conf`), the table of queries a core has sent and not yet
//! heard back about, and which replies it takes.
//!
//! A forwarded query leaves under a fresh random ID (so an off-path party
//! cannot guess it from the client's), and a reply is taken only when it
//! comes from the upstream the query went to, under that ID, for that
//! question; its ID is then set back to the client's. Anything else is
//! dropped, and the caller counts it. A reply from the right upstream under
//! the right ID that does not decode is the upstream's garbage: the client
//! gets SERVFAIL at once rather than waiting for the timeout.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::{DNSClass, Name, RecordType};

use super::message::Request;

/// How long a forwarded query waits for its upstream before the client
/// gets SERVFAIL: hickory-resolver's default query timeout, which
/// ztunnel's forwarder keeps (it sets only the cache size and address
/// strategy on the options it reads from resolv.conf).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Queries in flight per core beyond which new ones get SERVFAIL at once
/// (a flood must not grow a core's memory without bound).
pub const DEFAULT_MAX_PENDING: usize = 4096;

/// Where resolv.conf is read from.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The `nameserver` lines of a resolv.conf, port 53. None listed: the
/// resolver library's default, the local host.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            // A link-local IPv6 server may carry a zone ("fe80::1%eth0"),
            // which a socket address here cannot: skipped.
            words.next()?.parse::<IpAddr>().ok()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .collect();
    if out.is_empty() {
        out.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53));
    }
    out
}

/// The question a reply must carry to be taken: the query's, compared
/// without case (RFC 4343; resolvers may also randomise it, 0x20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    name: Name,
    kind: RecordType,
    class: DNSClass,
}

impl Question {
    pub fn of(request: &Request) -> Question {
        Question {
            name: request.name().clone(),
            kind: request.query_type(),
            class: request.query_class(),
        }
    }

    fn matches(&self, name: &Name, kind: RecordType, class: DNSClass) -> bool {
        // hickory compares names without case.
        self.kind == kind && self.class == class && self.name == *name
    }
}

/// One forwarded query waiting for its reply. `R` is where the answer
/// goes (the waiting task's slot).
#[derive(Debug)]
pub struct Pending<R> {
    pub upstream: SocketAddr,
    pub client_id: u16,
    pub question: Question,
    pub reply_to: R,
}

/// Why a query could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The core already waits for its cap of queries.
    Cap,
}

/// What a datagram from an upstream turned out to be.
#[derive(Debug)]
pub enum Reply<R> {
    /// The reply to a pending query, its ID set back to the client's;
    /// `truncated` when the upstream set TC (retry over TCP).
    Answer {
        pending: Pending<R>,
        bytes: Vec<u8>,
        truncated: bool,
    },
    /// From the right upstream under the right ID, but it does not decode
    /// as a response: the client gets SERVFAIL.
    Garbage { pending: Pending<R> },
    /// Not for any pending query (unknown ID, another sender, another
    /// question): dropped.
    Stray,
}

/// A core's queries in flight, by the ID they were sent under.
#[derive(Debug)]
pub struct PendingTable<R> {
    entries: HashMap<u16, Pending<R>>,
    cap: usize,
}

impl<R> PendingTable<R> {
    pub fn new(cap: usize) -> Self {
        PendingTable {
            entries: HashMap::new(),
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records `pending` under a fresh random ID not in use, and returns
    /// the ID to send the query under.
    pub fn insert(&mut self, rng: &mut fastrand::Rng, pending: Pending<R>) -> Result<u16, Full> {
        if self.entries.len() >= self.cap.min(usize::from(u16::MAX)) {
            return Err(Full::Cap);
        }
        loop {
            let id = rng.u16(..);
            if let std::collections::hash_map::Entry::Vacant(slot) = self.entries.entry(id) {
                slot.insert(pending);
                return Ok(id);
            }
        }
    }

    /// Forgets the query sent under `id` (timed out, or its client left).
    pub fn remove(&mut self, id: u16) -> Option<Pending<R>> {
        self.entries.remove(&id)
    }

    /// Forgets the query sent under `id` if `still_ours` says the entry is
    /// the one the caller means.
    pub fn remove_if(&mut self, id: u16, still_ours: impl FnOnce(&Pending<R>) -> bool) {
        if self.entries.get(&id).is_some_and(still_ours) {
            self.entries.remove(&id);
        }
    }

    /// Judges a datagram `from` an upstream.
    pub fn reply(&mut self, from: SocketAddr, datagram: &[u8]) -> Reply<R> {
        let Some(id) = datagram.first_chunk::<2>().map(|b| u16::from_be_bytes(*b)) else {
            return Reply::Stray;
        };
        match self.entries.get(&id) {
            Some(p) if same_upstream(p.upstream, from) => {}
            _ => return Reply::Stray,
        }
        match check(datagram) {
            Checked::Response {
                name,
                kind,
                class,
                truncated,
            } => {
                let matches = self
                    .entries
                    .get(&id)
                    .is_some_and(|p| p.question.matches(&name, kind, class));
                if !matches {
                    return Reply::Stray;
                }
                let pending = self.entries.remove(&id).expect("looked up above");
                let bytes = with_id(datagram, pending.client_id);
                Reply::Answer {
                    pending,
                    bytes,
                    truncated,
                }
            }
            Checked::Garbage => Reply::Garbage {
                pending: self.entries.remove(&id).expect("looked up above"),
            },
        }
    }
}

/// An IPv4 upstream may answer on a v4-mapped address of a dual-stack
/// socket; the same host either way.
fn same_upstream(sent_to: SocketAddr, from: SocketAddr) -> bool {
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    canon(sent_to) == canon(from)
}

enum Checked {
    Response {
        name: Name,
        kind: RecordType,
        class: DNSClass,
        truncated: bool,
    },
    Garbage,
}

/// Whether `bytes` is a response with one question; a reply truncated by
/// its sender (TC) may end in the middle of a record, so only its header
/// and question must decode.
fn check(bytes: &[u8]) -> Checked {
    use hickory_proto::op::{Header, Query};
    use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
    let mut decoder = BinDecoder::new(bytes);
    let Ok(header) = Header::read(&mut decoder) else {
        return Checked::Garbage;
    };
    if header.metadata.message_type != MessageType::Response || header.counts.queries != 1 {
        return Checked::Garbage;
    }
    let Ok(query) = Query::read(&mut decoder) else {
        return Checked::Garbage;
    };
    let truncated = header.metadata.truncation;
    if !truncated && Message::from_vec(bytes).is_err() {
        return Checked::Garbage;
    }
    Checked::Response {
        name: query.name().clone(),
        kind: query.query_type(),
        class: query.query_class(),
        truncated,
    }
}

/// `message` with its ID replaced.
pub fn with_id(message: &[u8], id: u16) -> Vec<u8> {
    let mut out = message.to_vec();
    if let Some(head) = out.first_chunk_mut::<2>() {
        *head = id.to_be_bytes();
    }
    out
}

/// Reads a reply that came over TCP (after TC): taken only under `id` and
/// for `question`, its ID set back to `client_id`. None: garbage.
pub fn tcp_reply(bytes: &[u8], id: u16, question: &Question, client_id: u16) -> Option<Vec<u8>> {
    if bytes.first_chunk::<2>().map(|b| u16::from_be_bytes(*b)) != Some(id) {
        return None;
    }
    match check(bytes) {
        Checked::Response {
            name, kind, class, ..
        } if question.matches(&name, kind, class) => Some(with_id(bytes, client_id)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::message::parse;
    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{RData, Record};

    fn query(id: u16, name: &str, kind: RecordType) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        m.to_vec().unwrap()
    }

    fn response(id: u16, name: &str, kind: RecordType, truncated: bool) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Response, OpCode::Query);
        m.metadata.response_code = ResponseCode::NoError;
        m.metadata.truncation = truncated;
        let n = Name::from_ascii(name).unwrap();
        m.add_query(Query::query(n.clone(), kind));
        m.add_answer(Record::from_rdata(n, 60, RData::A(A::new(1, 2, 3, 4))));
        m.to_vec().unwrap()
    }

    fn table(upstream: SocketAddr) -> (PendingTable<&'static str>, u16) {
        let mut t = PendingTable::new(4);
        let req = parse(&query(7, "Example.COM.", RecordType::A)).unwrap();
        let id = t
            .insert(
                &mut fastrand::Rng::with_seed(1),
                Pending {
                    upstream,
                    client_id: 7,
                    question: Question::of(&req),
                    reply_to: "client",
                },
            )
            .unwrap();
        (t, id)
    }

    const UP: &str = "10.0.0.53:53";

    #[test]
    fn a_reply_goes_back_under_the_clients_id() {
        let (mut t, id) = table(UP.parse().unwrap());
        let r = t.reply(
            UP.parse().unwrap(),
            &response(id, "example.com.", RecordType::A, false),
        );
        let Reply::Answer {
            pending,
            bytes,
            truncated,
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(pending.reply_to, "client");
        assert!(!truncated);
        assert_eq!(Message::from_vec(&bytes).unwrap().metadata.id, 7);
        assert!(t.is_empty());
    }

    #[test]
    fn replies_from_elsewhere_or_for_another_question_are_dropped() {
        let (mut t, id) = table(UP.parse().unwrap());
        let good = response(id, "example.com.", RecordType::A, false);
        assert!(matches!(
            t.reply("10.0.0.54:53".parse().unwrap(), &good),
            Reply::Stray
        ));
        assert!(matches!(
            t.reply("10.0.0.53:5353".parse().unwrap(), &good),
            Reply::Stray
        ));
        let other = response(id, "example.org.", RecordType::A, false);
        assert!(matches!(t.reply(UP.parse().unwrap(), &other), Reply::Stray));
        let aaaa = response(id, "example.com.", RecordType::AAAA, false);
        assert!(matches!(t.reply(UP.parse().unwrap(), &aaaa), Reply::Stray));
        let wrong_id = response(id.wrapping_add(1), "example.com.", RecordType::A, false);
        assert!(matches!(
            t.reply(UP.parse().unwrap(), &wrong_id),
            Reply::Stray
        ));
        assert_eq!(t.len(), 1, "still waiting for the real reply");
        assert!(matches!(
            t.reply(UP.parse().unwrap(), &good),
            Reply::Answer { .. }
        ));
    }

    #[test]
    fn garbage_from_the_upstream_ends_the_query() {
        let (mut t, id) = table(UP.parse().unwrap());
        let mut junk = id.to_be_bytes().to_vec();
        junk.extend_from_slice(&[0xff; 40]);
        assert!(matches!(
            t.reply(UP.parse().unwrap(), &junk),
            Reply::Garbage { .. }
        ));
        assert!(t.is_empty());
        // A query echoed back (not a response) is garbage too.
        let (mut t, id) = table(UP.parse().unwrap());
        assert!(matches!(
            t.reply(
                UP.parse().unwrap(),
                &query(id, "example.com.", RecordType::A)
            ),
            Reply::Garbage { .. }
        ));
        // Too short for an ID: nobody's.
        assert!(matches!(t.reply(UP.parse().unwrap(), &[1]), Reply::Stray));
    }

    #[test]
    fn truncated_replies_are_flagged_for_tcp() {
        let (mut t, id) = table(UP.parse().unwrap());
        let mut tc = response(id, "example.com.", RecordType::A, true);
        tc.truncate(tc.len() - 3); // cut inside the record, as a sender may
        let r = t.reply(UP.parse().unwrap(), &tc);
        assert!(
            matches!(
                r,
                Reply::Answer {
                    truncated: true,
                    ..
                }
            ),
            "{r:?}"
        );
    }

    #[test]
    fn the_cap_refuses_more() {
        let mut t = PendingTable::new(2);
        let mut rng = fastrand::Rng::with_seed(3);
        let req = parse(&query(1, "a.", RecordType::A)).unwrap();
        let p = || Pending {
            upstream: UP.parse().unwrap(),
            client_id: 1,
            question: Question::of(&req),
            reply_to: (),
        };
        let a = t.insert(&mut rng, p()).unwrap();
        let b = t.insert(&mut rng, p()).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.insert(&mut rng, p()), Err(Full::Cap));
        t.remove(a);
        assert!(t.insert(&mut rng, p()).is_ok());
    }

    #[test]
    fn tcp_replies_are_checked_too() {
        let req = parse(&query(9, "example.com.", RecordType::A)).unwrap();
        let q = Question::of(&req);
        let good = response(500, "EXAMPLE.com.", RecordType::A, false);
        let back = tcp_reply(&good, 500, &q, 9).unwrap();
        assert_eq!(Message::from_vec(&back).unwrap().metadata.id, 9);
        assert!(tcp_reply(&good, 501, &q, 9).is_none());
        assert!(tcp_reply(&[0x01, 0xf4, 0xff], 500, &q, 9).is_none());
    }

    #[test]
    fn nameservers_from_resolv_conf() {
        let conf =
            "# generated\nsearch a.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\n\
                    nameserver fd00::10\nnameserver fe80::1%eth0\noptions ndots:5\n";
        assert_eq!(
            nameservers(conf),
            vec![
                "10.96.0.10:53".parse().unwrap(),
                "[fd00::10]:53".parse().unwrap()
            ]
        );
        assert_eq!(nameservers(""), vec!["127.0.0.1:53".parse().unwrap()]);
    }
}
