//! DNS messages in and out: a query as it arrives (a UDP datagram, or one
//! message of a TCP stream) parsed into what [`decide`](super::answer::decide)
//! needs, and the response bytes for each decision, with hickory-proto's
//! codec.
//!
//! What the responses look like follows ztunnel (hickory's server under
//! ztunnel's handler; each point checked against the reference binary):
//! - a mesh answer or an empty one: NOERROR, AA and RA set, ID, opcode, RD
//!   and CD copied, the question echoed as it was sent (its case kept),
//!   records owned by the lowercased name, TTL 30; an OPT record when the
//!   query had one, with the query's payload size (at least 512), EDNS
//!   version and DO bit;
//! - an error: the rcode, no AA, RA or OPT. SERVFAIL for an unknown pod,
//!   and for a well-formed query with no question or several (echoed);
//!   NOTIMP, with the question, for an opcode other than QUERY; FORMERR,
//!   without a question, for bytes that do not decode;
//! - fewer than 12 bytes (no ID to answer to), or a response: nothing.
//!
//! Over UDP a response larger than the client can take (512 bytes, or
//! the EDNS size it sent) keeps the answers that fit and sets TC, so the
//! client retries over TCP; over TCP the limit is the 65535 bytes the
//! length prefix allows. Two deliberate differences from ztunnel here:
//! without EDNS ztunnel does not truncate at all (it sent a 1624-byte
//! datagram for 100 addresses), where RFC 1035 clients may take no more
//! than 512; and when it truncates it drops the OPT record (leaving six
//! bytes of it behind the last answer), where RFC 6891 wants it kept.

use hickory_proto::op::{
    Edns, Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode,
};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};

use super::answer::{Answer, Decision, Family};

/// The UDP size every client takes (RFC 1035), and the least an EDNS
/// client is taken to take.
pub const MIN_UDP_PAYLOAD: u16 = 512;

/// The largest message: what a TCP length prefix can say. A query longer
/// than this is refused as malformed.
pub const MAX_MESSAGE: usize = u16::MAX as usize;

/// A DNS header: ID, flags, four counts.
const HEADER_LEN: usize = 12;

/// An OPT record without options: root name, type, class, TTL, length.
const OPT_LEN: u16 = 11;

/// Where a query came in, which bounds the response's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// A query that parsed: one question and what the response must echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    metadata: Metadata,
    query: Query,
    edns: Option<Edns>,
}

impl Request {
    pub fn id(&self) -> u16 {
        self.metadata.id
    }

    pub fn recursion_desired(&self) -> bool {
        self.metadata.recursion_desired
    }

    /// The question's name, as sent (case kept).
    pub fn name(&self) -> &Name {
        self.query.name()
    }

    pub fn query_type(&self) -> RecordType {
        self.query.query_type()
    }

    /// Read and kept, but not checked: ztunnel answers A/AAAA questions of
    /// any class from the mesh (with IN records).
    pub fn query_class(&self) -> DNSClass {
        self.query.query_class()
    }

    /// The name as [`decide`](super::answer::decide) takes it: as hickory
    /// shows it (what ztunnel looks up), trailing dot included.
    pub fn lookup_name(&self) -> String {
        self.query.name().to_string()
    }

    /// A for IPv4, AAAA for IPv6, None for any other type (forwarded).
    pub fn family(&self) -> Option<Family> {
        match self.query.query_type() {
            RecordType::A => Some(Family::V4),
            RecordType::AAAA => Some(Family::V6),
            _ => None,
        }
    }

    /// The EDNS UDP payload size the client sent, if it sent an OPT record.
    pub fn edns_payload(&self) -> Option<u16> {
        self.edns.as_ref().map(Edns::max_payload)
    }

    /// The largest UDP response the client takes: its EDNS size, never
    /// below 512.
    pub fn udp_payload(&self) -> u16 {
        self.edns_payload()
            .map_or(MIN_UDP_PAYLOAD, |p| p.max(MIN_UDP_PAYLOAD))
    }

    fn limit(&self, transport: Transport) -> u16 {
        match transport {
            Transport::Udp => self.udp_payload(),
            Transport::Tcp => u16::MAX,
        }
    }
}

/// A query that is not answered normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Nothing to send: no header (so no ID to answer to), or a message
    /// that is itself a response.
    Drop,
    /// Answer with `code` (FORMERR, NOTIMP, SERVFAIL) under the query's
    /// header.
    Respond {
        metadata: Metadata,
        /// The questions echoed: those read, when all were.
        queries: Vec<Query>,
        code: ResponseCode,
    },
}

impl Rejection {
    fn formerr(metadata: Metadata) -> Rejection {
        Rejection::Respond {
            metadata,
            queries: Vec::new(),
            code: ResponseCode::FormErr,
        }
    }

    pub fn response_code(&self) -> Option<ResponseCode> {
        match self {
            Rejection::Drop => None,
            Rejection::Respond { code, .. } => Some(*code),
        }
    }

    /// The bytes to send back, or None to send nothing.
    pub fn response(&self) -> Option<Vec<u8>> {
        match self {
            Rejection::Drop => None,
            Rejection::Respond {
                metadata,
                queries,
                code,
            } => Some(error_message(metadata, queries, *code)),
        }
    }
}

/// Parses one query message (a UDP datagram, or a TCP message without its
/// length prefix). Never panics; whatever the bytes, the result is a
/// request or what to answer instead. What ztunnel does with each kind of
/// bad input (checked against its binary): no header, or a response,
/// gets nothing; bytes that do not decode get FORMERR without the
/// question; an opcode other than QUERY gets NOTIMP; a well-formed query
/// with no question or several gets SERVFAIL with them echoed.
pub fn parse(bytes: &[u8]) -> Result<Request, Rejection> {
    if bytes.len() < HEADER_LEN {
        return Err(Rejection::Drop);
    }
    let mut decoder = BinDecoder::new(bytes);
    let Ok(header) = Header::read(&mut decoder) else {
        return Err(Rejection::Drop);
    };
    let metadata = header.metadata;
    if metadata.message_type != MessageType::Query {
        return Err(Rejection::Drop);
    }
    if bytes.len() > MAX_MESSAGE {
        return Err(Rejection::formerr(metadata));
    }
    let counts = header.counts;
    let mut queries = Vec::with_capacity(usize::from(counts.queries).min(8));
    for _ in 0..counts.queries {
        queries.push(Query::read(&mut decoder).map_err(|_| Rejection::formerr(metadata))?);
    }
    // The other sections are read (a malformed one is FORMERR) only for
    // the OPT record.
    let op = metadata.op_code;
    let edns = Message::read_records(&mut decoder, counts.answers.into(), false, op)
        .and_then(|_| Message::read_records(&mut decoder, counts.authorities.into(), false, op))
        .and_then(|_| Message::read_records(&mut decoder, counts.additionals.into(), true, op))
        .map_err(|_| Rejection::formerr(metadata))?
        .1;
    let code = if op != OpCode::Query {
        ResponseCode::NotImp
    } else if queries.len() != 1 {
        ResponseCode::ServFail
    } else {
        ResponseCode::NoError
    };
    match queries.pop() {
        Some(query) if code == ResponseCode::NoError => Ok(Request {
            metadata,
            query,
            edns,
        }),
        last => {
            queries.extend(last);
            Err(Rejection::Respond {
                metadata,
                queries,
                code,
            })
        }
    }
}

/// The response bytes for `decision`, or None for [`Decision::Forward`]
/// (not answered here: the upstream resolvers' answer goes back instead).
pub fn respond(request: &Request, decision: &Decision, transport: Transport) -> Option<Vec<u8>> {
    match decision {
        Decision::Answer(answer) => Some(mesh_response(request, Some(answer), transport)),
        Decision::NoData => Some(mesh_response(request, None, transport)),
        Decision::UnknownClient => Some(error_response(request, ResponseCode::ServFail)),
        Decision::Forward => None,
    }
}

/// An error response to a parsed request (SERVFAIL when forwarding fails,
/// for one).
pub fn error_response(request: &Request, code: ResponseCode) -> Vec<u8> {
    error_message(
        &request.metadata,
        std::slice::from_ref(&request.query),
        code,
    )
}

/// The authoritative response for a mesh name: `answer`'s records, or none.
fn mesh_response(request: &Request, answer: Option<&Answer>, transport: Transport) -> Vec<u8> {
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.authoritative = true;
    metadata.recursion_available = true;
    let mut message = Message::new(metadata.id, MessageType::Response, metadata.op_code);
    message.metadata = metadata;
    message.add_query(request.query.clone());
    if let Some(answer) = answer {
        message.insert_answers(records(request.query.name(), answer));
    }
    if let Some(edns) = &request.edns {
        message.set_edns(response_edns(edns));
    }
    encode_within(message, request.limit(transport))
        .unwrap_or_else(|| servfail_header(&request.metadata))
}

/// The answer's records: the addresses, under the question's name.
fn records(question: &Name, answer: &Answer) -> Vec<Record> {
    let mut owner = question.to_lowercase();
    owner.set_fqdn(true);
    let mut out = Vec::with_capacity(answer.addresses.len());
    for ip in &answer.addresses {
        let rdata = match ip {
            std::net::IpAddr::V4(v4) => RData::A(A(*v4)),
            std::net::IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
        };
        out.push(Record::from_rdata(owner.clone(), answer.ttl, rdata));
    }
    out
}

/// The OPT record ztunnel returns: the client's payload size (at least
/// 512), its EDNS version and DO bit, no options.
fn response_edns(request: &Edns) -> Edns {
    let mut edns = Edns::new();
    edns.set_max_payload(request.max_payload().max(MIN_UDP_PAYLOAD));
    edns.set_version(request.version());
    edns.set_dnssec_ok(request.flags().dnssec_ok);
    edns
}

/// `message` encoded in at most `limit` bytes: the answers that fit, TC
/// when some did not, and the OPT record always kept (space is reserved
/// for it once the answers overflow). None if it cannot be encoded.
fn encode_within(mut message: Message, limit: u16) -> Option<Vec<u8>> {
    let (bytes, header) = encode(&message, limit)?;
    let opt_missing = message.edns.is_some()
        && usize::from(header.counts.additionals) < message.additionals.len() + 1;
    if !header.metadata.truncation && !opt_missing {
        return Some(bytes);
    }
    // Too big: find how many answers fit beside the OPT record, keep those.
    let edns = message.edns.take();
    let room = if edns.is_some() {
        limit.saturating_sub(OPT_LEN)
    } else {
        limit
    };
    let (_, fitted) = encode(&message, room)?;
    message.answers.truncate(fitted.counts.answers.into());
    message.additionals.clear();
    message.metadata.truncation = true;
    message.edns = edns;
    encode(&message, limit).map(|(bytes, _)| bytes)
}

fn encode(message: &Message, limit: u16) -> Option<(Vec<u8>, Header)> {
    let mut bytes = Vec::with_capacity(usize::from(limit).min(1232));
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(limit);
    message.emit(&mut encoder).ok()?;
    let mut decoder = BinDecoder::new(&bytes);
    let header = Header::read(&mut decoder).ok()?;
    Some((bytes, header))
}

fn error_message(request: &Metadata, queries: &[Query], code: ResponseCode) -> Vec<u8> {
    let mut metadata = Metadata::response_from_request(request);
    metadata.response_code = code;
    let mut message = Message::new(metadata.id, MessageType::Response, metadata.op_code);
    message.metadata = metadata;
    message.add_queries(queries.iter().cloned());
    // More questions than fit fail the encoding: the bare header then.
    encode(&message, MIN_UDP_PAYLOAD)
        .map(|(bytes, _)| bytes)
        .unwrap_or_else(|| servfail_header(request))
}

/// A bare SERVFAIL header: the fallback should encoding ever fail, so the
/// client still hears back under its ID.
fn servfail_header(request: &Metadata) -> Vec<u8> {
    let mut metadata = Metadata::response_from_request(request);
    metadata.response_code = ResponseCode::ServFail;
    let header = Header {
        metadata,
        counts: Default::default(),
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN);
    let mut encoder = BinEncoder::new(&mut bytes);
    match header.emit(&mut encoder) {
        Ok(()) => bytes,
        Err(_) => {
            // Cannot fail (no size limit); written out by hand regardless.
            let [hi, lo] = request.id.to_be_bytes();
            let rd = u8::from(request.recursion_desired);
            vec![hi, lo, 0x80 | rd, 0x02, 0, 0, 0, 0, 0, 0, 0, 0]
        }
    }
}

/// One message cut from the front of a TCP stream (2-byte length, then
/// the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Not all of it has arrived yet.
    Incomplete,
    /// A whole message, and what follows it.
    Message { message: &'a [u8], rest: &'a [u8] },
}

/// The first message in `stream`, if it has all arrived.
pub fn tcp_frame(stream: &[u8]) -> Frame<'_> {
    let Some((len, body)) = stream.split_first_chunk::<2>() else {
        return Frame::Incomplete;
    };
    let len = usize::from(u16::from_be_bytes(*len));
    match body.split_at_checked(len) {
        Some((message, rest)) => Frame::Message { message, rest },
        None => Frame::Incomplete,
    }
}

/// `message` with its TCP length prefix. None if it is too long to frame
/// (no response built here is).
pub fn tcp_framed(message: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(message.len()).ok()?;
    let mut out = Vec::with_capacity(message.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::dns::answer::MESH_TTL;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    /// A query as a stub resolver sends it: RD set, optionally with EDNS.
    fn query_bytes(id: u16, qname: &str, qtype: RecordType, edns: Option<(u16, bool)>) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(name(qname), qtype));
        if let Some((size, dnssec_ok)) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            e.set_dnssec_ok(dnssec_ok);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    fn request(qname: &str, qtype: RecordType, edns: Option<(u16, bool)>) -> Request {
        parse(&query_bytes(0xbeef, qname, qtype, edns)).unwrap()
    }

    fn addrs(n: usize) -> Vec<IpAddr> {
        (0..n)
            .map(|i| IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]))
            .collect()
    }

    fn answer(addresses: Vec<IpAddr>) -> Decision {
        Decision::Answer(Answer {
            addresses,
            ttl: MESH_TTL,
        })
    }

    fn reply(req: &Request, decision: &Decision, transport: Transport) -> (usize, Message) {
        let bytes = respond(req, decision, transport).expect("answered here");
        let len = bytes.len();
        (len, Message::from_vec(&bytes).unwrap())
    }

    #[test]
    fn parses_a_query_with_its_edns_size() {
        let r = parse(&query_bytes(
            7,
            "Web.Shop.",
            RecordType::AAAA,
            Some((4096, true)),
        ))
        .unwrap();
        assert_eq!(r.id(), 7);
        assert!(r.recursion_desired());
        assert_eq!(r.name(), &name("Web.Shop."));
        assert_eq!(r.lookup_name(), "Web.Shop.");
        assert_eq!(r.family(), Some(Family::V6));
        assert_eq!(r.query_class(), DNSClass::IN);
        assert_eq!(r.edns_payload(), Some(4096));
        assert_eq!(r.udp_payload(), 4096);

        let small = request("web.", RecordType::A, Some((100, false)));
        assert_eq!(
            small.udp_payload(),
            512,
            "an EDNS size below 512 counts as 512"
        );
        let plain = request("web.", RecordType::MX, None);
        assert_eq!((plain.udp_payload(), plain.family()), (512, None));
    }

    /// One row per malformed input: what parse makes of it.
    #[test]
    fn malformed_queries_are_rejected_as_ztunnel_rejects_them() {
        let valid = query_bytes(0x1234, "web.shop.", RecordType::A, None);
        let header = |qd: u16, flags: [u8; 2]| {
            let mut h = vec![0x12, 0x34, flags[0], flags[1]];
            h.extend_from_slice(&qd.to_be_bytes());
            h.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            h
        };
        let with = |mut h: Vec<u8>, tail: &[u8]| {
            h.extend_from_slice(tail);
            h
        };
        let q = [0, 1, 0, 1]; // type A, class IN
        let mut two_opts = Message::new(0x1234, MessageType::Query, OpCode::Query);
        two_opts.add_query(Query::query(name("web."), RecordType::A));
        two_opts.set_edns(Edns::new());
        let mut two_opts = two_opts.to_vec().unwrap();
        let opt = two_opts[two_opts.len() - 11..].to_vec();
        two_opts.extend_from_slice(&opt);
        two_opts[11] = 2; // ARCOUNT
        let long_name: Vec<u8> = (0..5)
            .flat_map(|_| std::iter::once(63).chain([b'a'; 63]))
            .chain([0])
            .collect();
        let mut oversized = valid.clone();
        oversized.resize(MAX_MESSAGE + 1, 0);
        let mut response = valid.clone();
        response[2] |= 0x80;

        let rows: Vec<(&str, Vec<u8>, Option<ResponseCode>)> = vec![
            ("zero-length", vec![], None),
            ("shorter than a header", valid[..11].to_vec(), None),
            (
                "header only, QDCOUNT=0",
                header(0, [1, 0]),
                Some(ResponseCode::ServFail),
            ),
            (
                "QDCOUNT=1 but no question",
                header(1, [1, 0]),
                Some(ResponseCode::FormErr),
            ),
            (
                "question cut short",
                valid[..valid.len() - 2].to_vec(),
                Some(ResponseCode::FormErr),
            ),
            (
                "label longer than the message",
                with(header(1, [1, 0]), &[40, b'a', b'b']),
                Some(ResponseCode::FormErr),
            ),
            (
                "label length 64 (reserved label type)",
                with(header(1, [1, 0]), &[0x40, b'a', 0, 0, 1, 0, 1]),
                Some(ResponseCode::FormErr),
            ),
            (
                "compression pointer to itself",
                with(header(1, [1, 0]), &[0xc0, 12, 0, 1, 0, 1]),
                Some(ResponseCode::FormErr),
            ),
            (
                "compression pointer forward",
                with(header(1, [1, 0]), &[0xc0, 14, 0, 1, 0, 1]),
                Some(ResponseCode::FormErr),
            ),
            (
                "compression pointer loop via an earlier label",
                with(header(1, [1, 0]), &[1, b'a', 0xc0, 12, 0, 1, 0, 1]),
                Some(ResponseCode::FormErr),
            ),
            (
                "name over 255 bytes",
                with(with(header(1, [1, 0]), &long_name), &q),
                Some(ResponseCode::FormErr),
            ),
            (
                "QDCOUNT=2",
                with(with(header(2, [1, 0]), &valid[12..]), &valid[12..]),
                Some(ResponseCode::ServFail),
            ),
            (
                "ANCOUNT claims a record that is not there",
                {
                    let mut v = valid.clone();
                    v[7] = 1;
                    v
                },
                Some(ResponseCode::FormErr),
            ),
            ("two OPT records", two_opts, Some(ResponseCode::FormErr)),
            ("oversized", oversized, Some(ResponseCode::FormErr)),
            ("a response, not a query", response, None),
            (
                "opcode STATUS",
                {
                    let mut v = valid.clone();
                    v[2] |= 2 << 3;
                    v
                },
                Some(ResponseCode::NotImp),
            ),
            (
                "opcode NOTIFY",
                {
                    let mut v = valid.clone();
                    v[2] |= 4 << 3;
                    v
                },
                Some(ResponseCode::NotImp),
            ),
        ];
        for (why, bytes, want) in rows {
            let got = parse(&bytes).expect_err(why);
            assert_eq!(got.response_code(), want, "{why}");
            match got.response() {
                None => assert!(want.is_none(), "{why}"),
                Some(out) => {
                    let m = Message::from_vec(&out).unwrap();
                    assert_eq!(m.metadata.id, 0x1234, "{why}: the query's ID");
                    assert_eq!(m.metadata.message_type, MessageType::Response, "{why}");
                    assert_eq!(Some(m.metadata.response_code), want, "{why}");
                    assert!(
                        !m.metadata.authoritative && !m.metadata.recursion_available,
                        "{why}"
                    );
                    if want == Some(ResponseCode::FormErr) {
                        assert!(m.queries.is_empty(), "{why}: no question with FORMERR");
                    }
                }
            }
        }
    }

    #[test]
    fn several_questions_are_servfail_with_all_of_them_echoed() {
        let mut m = Message::new(8, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(name("a.example."), RecordType::A));
        m.add_query(Query::query(name("b.example."), RecordType::AAAA));
        let rejected = parse(&m.to_vec().unwrap()).unwrap_err();
        let out = Message::from_vec(&rejected.response().unwrap()).unwrap();
        assert_eq!(out.metadata.response_code, ResponseCode::ServFail);
        assert_eq!(out.queries, m.queries);
    }

    #[test]
    fn notimp_echoes_the_question() {
        let mut bytes = query_bytes(9, "web.shop.", RecordType::A, None);
        bytes[2] |= 4 << 3;
        let out = parse(&bytes).unwrap_err().response().unwrap();
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.op_code, OpCode::Notify);
        assert_eq!(m.queries, [Query::query(name("web.shop."), RecordType::A)]);
    }

    #[test]
    fn trailing_bytes_after_the_message_are_ignored() {
        let mut bytes = query_bytes(3, "web.", RecordType::A, None);
        bytes.extend_from_slice(&[0xde, 0xad]);
        assert_eq!(parse(&bytes).unwrap().id(), 3);
    }

    /// Random and mutated packets: parse never panics, and whatever it
    /// answers carries the packet's ID.
    #[test]
    fn garbage_never_panics() {
        let mut rng = fastrand::Rng::with_seed(23);
        let valid = query_bytes(
            0x4242,
            "web.shop.svc.cluster.local.",
            RecordType::A,
            Some((1232, false)),
        );
        for round in 0..50_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect()
            } else {
                let mut v = valid.clone();
                for _ in 0..rng.usize(1..4) {
                    let i = rng.usize(..v.len());
                    v[i] = rng.u8(..);
                }
                v.truncate(rng.usize(0..=v.len()));
                v
            };
            let response = match parse(&bytes) {
                Ok(req) => respond(&req, &answer(addrs(3)), Transport::Udp),
                Err(rejected) => rejected.response(),
            };
            if let Some(out) = response {
                assert_eq!(out[..2], bytes[..2], "answered under the query's ID");
            }
        }
    }

    #[test]
    fn an_answer_is_authoritative_with_30s_records_under_the_lowercased_name() {
        let req = request("Web.Shop.", RecordType::A, None);
        let (_, m) = reply(&req, &answer(addrs(2)), Transport::Udp);
        let md = m.metadata;
        assert_eq!(
            (md.id, md.message_type, md.response_code),
            (0xbeef, MessageType::Response, ResponseCode::NoError)
        );
        assert!(
            md.authoritative && md.recursion_available && md.recursion_desired && !md.truncation
        );
        assert_eq!(
            m.queries,
            [Query::query(name("Web.Shop."), RecordType::A)],
            "question as sent"
        );
        let want: Vec<Record> = addrs(2)
            .into_iter()
            .map(|ip| match ip {
                IpAddr::V4(v4) => Record::from_rdata(name("web.shop."), 30, RData::A(A(v4))),
                IpAddr::V6(_) => unreachable!(),
            })
            .collect();
        assert_eq!(m.answers, want);
        assert!(m.edns.is_none(), "no OPT record when the query had none");
    }

    #[test]
    fn aaaa_records() {
        let req = request("web.", RecordType::AAAA, None);
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        let (_, m) = reply(&req, &answer(vec![ip]), Transport::Udp);
        assert_eq!(
            m.answers,
            [Record::from_rdata(
                name("web."),
                30,
                RData::AAAA(AAAA("2001:db8::1".parse().unwrap()))
            )]
        );
    }

    #[test]
    fn nodata_is_an_authoritative_noerror_without_records() {
        let req = request("web.", RecordType::AAAA, Some((1232, true)));
        let (_, m) = reply(&req, &Decision::NoData, Transport::Udp);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative && m.answers.is_empty());
        let edns = m.edns.expect("OPT echoed");
        assert_eq!((edns.max_payload(), edns.flags().dnssec_ok), (1232, true));
    }

    #[test]
    fn edns_size_below_512_is_answered_as_512() {
        let req = request("web.", RecordType::A, Some((200, false)));
        let (_, m) = reply(&req, &answer(addrs(1)), Transport::Udp);
        assert_eq!(m.edns.unwrap().max_payload(), 512);
    }

    #[test]
    fn unknown_client_is_servfail_with_the_question_and_forward_is_not_answered() {
        let req = request("web.", RecordType::A, Some((1232, false)));
        let (_, m) = reply(&req, &Decision::UnknownClient, Transport::Udp);
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        assert!(!m.metadata.authoritative);
        assert_eq!(m.queries.len(), 1);
        assert!(m.edns.is_none());
        assert_eq!(respond(&req, &Decision::Forward, Transport::Udp), None);
    }

    #[test]
    fn udp_truncates_to_512_without_edns() {
        let req = request("web.", RecordType::A, None);
        let (len, m) = reply(&req, &answer(addrs(100)), Transport::Udp);
        assert!(m.metadata.truncation);
        assert!(len <= 512);
        // 12 header + 9 question, then 16 per compressed A record.
        assert_eq!(m.answers.len(), (512 - 12 - 9) / 16);
    }

    #[test]
    fn udp_truncates_to_the_edns_size_and_keeps_the_opt_record() {
        for size in [512u16, 600, 1232] {
            let req = request("web.", RecordType::A, Some((size, false)));
            let (len, m) = reply(&req, &answer(addrs(200)), Transport::Udp);
            assert!(m.metadata.truncation, "{size}");
            assert!(len <= usize::from(size), "{size}: {len}");
            assert_eq!(
                m.answers.len(),
                (usize::from(size) - 12 - 9 - 11) / 16,
                "{size}"
            );
            assert_eq!(m.edns.map(|e| e.max_payload()), Some(size), "{size}");
        }
    }

    #[test]
    fn what_fits_is_not_truncated() {
        let req = request("web.", RecordType::A, Some((1232, false)));
        let (_, m) = reply(&req, &answer(addrs(30)), Transport::Udp);
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 30);
    }

    #[test]
    fn tcp_is_not_truncated() {
        let req = request("web.", RecordType::A, None);
        let (len, m) = reply(&req, &answer(addrs(1000)), Transport::Tcp);
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 1000);
        assert!(len > 512);
    }

    #[test]
    fn tcp_frames() {
        let q = query_bytes(5, "web.", RecordType::A, None);
        let framed = tcp_framed(&q).unwrap();
        let mut stream = framed.clone();
        stream.extend_from_slice(&framed[..3]);
        let Frame::Message { message, rest } = tcp_frame(&stream) else {
            panic!("a whole message is there");
        };
        assert_eq!(parse(message).unwrap().id(), 5);
        assert_eq!(tcp_frame(rest), Frame::Incomplete);
        assert_eq!(tcp_frame(&[0]), Frame::Incomplete);
        assert_eq!(tcp_frame(&[]), Frame::Incomplete);
        assert_eq!(
            tcp_frame(&[0, 0]),
            Frame::Message {
                message: &[],
                rest: &[]
            }
        );
        assert_eq!(parse(&[]), Err(Rejection::Drop), "an empty TCP message");
        assert_eq!(tcp_framed(&vec![0; MAX_MESSAGE + 1]), None);
    }
}
