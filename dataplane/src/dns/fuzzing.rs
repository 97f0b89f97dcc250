//! The fuzz harness for the DNS proxy (issue 23, "a fuzz target for the
//! query path"): what `fuzz/fuzz_targets/*` call with libFuzzer's bytes,
//! and what `tests/dns_fuzz_corpus.rs` replays the committed corpus
//! through on stable, so CI exercises the same path without nightly.
//!
//! Not an API: `#[doc(hidden)]`, kept in the crate only so the fuzz
//! targets are one line each and both callers run the same code. Each
//! function panics when an invariant of the DNS code breaks; that panic
//! is the fuzzer's crash.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use ringway_controlplane::sources::local::load_snapshot;
use ringway_controlplane::Snapshot;

use super::answer::{decide, Decision, DnsSettings};
use super::forward::{tcp_reply, Pending, PendingTable, Question, Reply};
use super::message::{self, error_response, Frame, Rejection, Transport};

/// Endpoints of the headless service, and VIPs of the many-VIP one: more
/// A and AAAA records than 512 bytes (and than 1232 for AAAA) hold, so
/// small clients get truncated answers and large ones whole answers.
const MANY: u8 = 48;

/// The mesh every query is answered from, in the local-config YAML an
/// operator writes: services with v4 and v6 VIPs, two namespaces sharing
/// the short name `web`, a headless service with endpoints (one
/// unhealthy), a namespace-only service, an IPv6-only one, a wildcard
/// host, a VIP-less ServiceEntry-style host (forwarded), and the
/// clients.
pub fn mesh_yaml() -> String {
    let mut y = String::from(
        "workloads:
  - {uid: client-ns1, name: client-ns1, namespace: ns1, workloadIps: [10.0.0.1, \"fd00::1\"]}
  - {uid: client-ns2, name: client-ns2, namespace: ns2, workloadIps: [10.0.0.2]}
  - uid: db-sick
    name: db-sick
    namespace: ns1
    workloadIps: [10.1.1.1]
    status: Unhealthy
    services: {\"ns1/db.ns1.svc.cluster.local\": {5432: 5432}}
",
    );
    for i in 0..MANY {
        y += &format!(
            "  - uid: db-{i}
    name: db-{i}
    namespace: ns1
    workloadIps: [10.1.0.{i}, \"fd00:1::{i:x}\"]
    services: {{\"ns1/db.ns1.svc.cluster.local\": {{5432: 5432}}}}
"
        );
    }
    let many: Vec<String> = (0..MANY).map(|i| format!("10.2.0.{i}")).collect();
    y += &format!(
        "services:
  - {{name: web, namespace: ns1, hostname: web.ns1.svc.cluster.local, vips: [10.96.0.1, \"fd00:96::1\"]}}
  - {{name: web, namespace: ns2, hostname: web.ns2.svc.cluster.local, vips: [10.96.0.2]}}
  - {{name: db, namespace: ns1, hostname: db.ns1.svc.cluster.local}}
  - {{name: many, namespace: ns2, hostname: many.ns2.svc.cluster.local, vips: [{}]}}
  - {{name: v6, namespace: ns1, hostname: v6.ns1.svc.cluster.local, vips: [\"fd00:96::6\"], ipFamilies: IPv6}}
  - {{name: private, namespace: ns2, hostname: private.ns2.svc.cluster.local, vips: [10.96.0.9], visibility: Namespace}}
  - {{name: wild, namespace: ns1, hostname: \"*.example.com\", vips: [10.97.0.1, \"fd00:97::1\"]}}
  - {{name: external, namespace: ns1, hostname: external.example.org}}
",
        many.join(", ")
    );
    y
}

/// Where the queries come from, as a core in node-level capture finds the
/// asking workload: a client in `ns1`, one in `ns2`, and an address the
/// mesh does not know (SERVFAIL).
const CLIENTS: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
];

fn mesh() -> &'static Snapshot {
    static MESH: OnceLock<Snapshot> = OnceLock::new();
    MESH.get_or_init(|| load_snapshot(&mesh_yaml(), "fuzz-mesh.yaml").expect("the fuzz mesh"))
}

/// `data` through the query path as a core takes it: as one UDP datagram,
/// as one TCP message, and as a TCP stream cut into its framed messages.
pub fn query(data: &[u8]) {
    one_message(data, Transport::Udp);
    one_message(data, Transport::Tcp);
    let mut stream = data;
    while let Frame::Message { message, rest } = message::tcp_frame(stream) {
        one_message(message, Transport::Tcp);
        stream = rest;
    }
}

/// One query message, asked by each client: what the core sends back.
fn one_message(bytes: &[u8], transport: Transport) {
    let request = match message::parse(bytes) {
        Ok(request) => request,
        Err(rejection) => return rejected(bytes, &rejection),
    };
    let snapshot = mesh();
    let settings = DnsSettings::default();
    let mut rng = fastrand::Rng::with_seed(u64::from(request.id()));
    for client in CLIENTS {
        let source = snapshot.workload_by_addr("", client);
        let mut decision = decide(
            snapshot,
            &settings,
            source.map(|w| &**w),
            &request.lookup_name(),
            request.family(),
        );
        if let Decision::Answer(answer) = &mut decision {
            answer.shuffle(&mut rng);
        }
        match message::respond(&request, &decision, transport) {
            Some(reply) => {
                let limit = match transport {
                    Transport::Udp => usize::from(request.udp_payload()),
                    Transport::Tcp => message::MAX_MESSAGE,
                };
                assert!(reply.len() <= limit, "{} bytes over {limit}", reply.len());
                let m = response_to(bytes, &reply);
                if let Decision::Answer(answer) = &decision {
                    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
                    let most = answer.addresses.len();
                    assert!(m.answers.len() <= most);
                    if !m.metadata.truncation {
                        assert_eq!(m.answers.len(), most, "untruncated answers all there");
                    }
                }
                assert!(message::tcp_framed(&reply).is_some());
            }
            None => {
                assert_eq!(decision, Decision::Forward);
                // What the client gets when the upstreams fail.
                let servfail = error_response(&request, ResponseCode::ServFail);
                let m = response_to(bytes, &servfail);
                assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
            }
        }
    }
}

fn rejected(bytes: &[u8], rejection: &Rejection) {
    match (rejection, rejection.response()) {
        (Rejection::Drop, None) => {}
        (Rejection::Respond { code, .. }, Some(reply)) => {
            let m = response_to(bytes, &reply);
            assert!(m.metadata.response_code == *code || m.queries.is_empty());
        }
        (r, reply) => panic!("{r:?} answered with {reply:?}"),
    }
}

/// `reply` decodes as a response under the query's ID.
fn response_to(query: &[u8], reply: &[u8]) -> Message {
    let m = Message::from_vec(reply).expect("a response that decodes");
    assert_eq!(reply[..2], query[..2], "answered under the query's ID");
    assert_eq!(m.metadata.message_type, MessageType::Response);
    m
}

/// The upstream resolvers the pending queries went to.
const UPSTREAMS: [&str; 2] = ["10.96.0.10:53", "[fd00::10]:53"];

/// The questions in flight when an upstream's datagram arrives.
const ASKED: [(&str, RecordType); 3] = [
    ("Example.COM.", RecordType::A),
    ("web.ns1.svc.cluster.local.", RecordType::AAAA),
    ("_sip._udp.example.org.", RecordType::SRV),
];

/// `data` as a datagram from an upstream, against a core's table of three
/// forwarded queries. The first byte steers: its low two bits put one
/// pending query's ID on the datagram (3: leave the datagram's own), the
/// next two pick the sender (the right upstream, it v4-mapped, another
/// port, another host). The rest is the datagram, also read as the reply
/// over TCP after truncation.
pub fn upstream_reply(data: &[u8]) {
    let Some((&steer, datagram)) = data.split_first() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(23);
    let mut table = PendingTable::new(8);
    let mut sent = Vec::new();
    for (i, (name, kind)) in ASKED.into_iter().enumerate() {
        let request = message::parse(&query_bytes(0x100 + i as u16, name, kind, None))
            .expect("a well-formed query");
        let upstream: SocketAddr = UPSTREAMS[i % 2].parse().expect("an address");
        let question = Question::of(&request);
        let pending = Pending {
            upstream,
            client_id: request.id(),
            question: question.clone(),
            reply_to: i,
        };
        let id = table.insert(&mut rng, pending).expect("room");
        sent.push((id, upstream, question, request.id()));
    }
    let mut datagram = datagram.to_vec();
    if let (Some((id, ..)), Some(head)) = (
        sent.get(usize::from(steer & 3)),
        datagram.first_chunk_mut::<2>(),
    ) {
        *head = id.to_be_bytes();
    }
    let target = sent[usize::from(steer & 3) % sent.len()].1;
    let from = match (steer >> 2) & 3 {
        0 => target,
        1 => match target.ip() {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), target.port()),
            IpAddr::V6(_) => target,
        },
        2 => SocketAddr::new(target.ip(), 5353),
        _ => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 53),
    };
    let before = table.len();
    match table.reply(from, &datagram) {
        Reply::Answer {
            pending,
            bytes,
            truncated,
        } => {
            assert_eq!(
                table.len(),
                before - 1,
                "the answered query leaves the table"
            );
            let (_, upstream, _, client_id) = &sent[pending.reply_to];
            assert_eq!(upstream.ip().to_canonical(), from.ip().to_canonical());
            assert_eq!((bytes.len(), &bytes[2..]), (datagram.len(), &datagram[2..]));
            assert_eq!(bytes[..2], client_id.to_be_bytes(), "the client's ID back");
            if !truncated {
                Message::from_vec(&bytes).expect("a taken reply decodes");
            }
        }
        Reply::Garbage { pending } => {
            assert_eq!(table.len(), before - 1, "a garbage reply ends its query");
            assert_eq!(datagram[..2], sent[pending.reply_to].0.to_be_bytes());
        }
        Reply::Stray => assert_eq!(table.len(), before, "a stray reply changes nothing"),
    }
    for (id, _, question, client_id) in &sent {
        if let Some(bytes) = tcp_reply(&datagram, *id, question, *client_id) {
            assert_eq!(bytes[..2], client_id.to_be_bytes());
            assert_eq!(bytes[2..], datagram[2..]);
        }
    }
}

/// A query as a stub resolver sends it: one question, RD, and an OPT
/// record with `edns` as its UDP size when given.
pub fn query_bytes(id: u16, name: &str, kind: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    let name = Name::from_ascii(name).expect("a name");
    m.add_query(Query::query(name, kind));
    if let Some(size) = edns {
        let mut e = hickory_proto::op::Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().expect("encodes")
}

/// Seed inputs for `dns_query`: a query for each kind of name, small and
/// large client sizes, over UDP and TCP framing. Named for the files
/// `RINGWAY_FUZZ_SEEDS` writes (see `fuzz/README.md`).
pub fn query_seeds() -> Vec<(String, Vec<u8>)> {
    let names = [
        ("web", RecordType::A),
        ("web", RecordType::AAAA),
        ("web.ns2", RecordType::A),
        ("Web.NS1.svc.cluster.local.", RecordType::AAAA),
        (
            "web.ns1.svc.cluster.local.ns1.svc.cluster.local.",
            RecordType::A,
        ),
        ("db.ns1.svc.cluster.local.", RecordType::A),
        ("db", RecordType::AAAA),
        ("many.ns2", RecordType::A),
        ("v6.ns1", RecordType::A),
        ("private.ns2", RecordType::A),
        ("api.example.com.", RecordType::AAAA),
        ("external.example.org.", RecordType::A),
        ("example.net.", RecordType::MX),
    ];
    let mut out = Vec::new();
    for (i, (name, kind)) in names.into_iter().enumerate() {
        for edns in [None, Some(512), Some(1232), Some(4096)] {
            let q = query_bytes(i as u16, name, kind, edns);
            let size = edns.map_or("plain".to_owned(), |s| s.to_string());
            let stem = format!("seed-{}-{kind}-{size}", name.trim_end_matches('.'));
            if let Some(framed) = message::tcp_framed(&q) {
                out.push((format!("{stem}-tcp"), framed));
            }
            out.push((stem, q));
        }
    }
    out
}

/// Seed inputs for `dns_upstream_reply`: the upstream's real answer to
/// each pending question (steered to its ID), truncated and not, and
/// from the wrong sender.
pub fn upstream_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, (name, kind)) in ASKED.into_iter().enumerate() {
        for (tc, steer) in [(false, 0u8), (true, 0), (false, 4), (false, 12)] {
            let mut m = Message::new(0, MessageType::Response, OpCode::Query);
            m.metadata.truncation = tc;
            m.metadata.recursion_available = true;
            let name = Name::from_ascii(name.to_lowercase()).expect("a name");
            m.add_query(Query::query(name.clone(), kind));
            let a = hickory_proto::rr::rdata::A::new(192, 0, 2, i as u8);
            m.add_answer(hickory_proto::rr::Record::from_rdata(
                name,
                60,
                hickory_proto::rr::RData::A(a),
            ));
            let mut bytes = vec![steer | i as u8];
            bytes.extend(m.to_vec().expect("encodes"));
            if tc {
                bytes.truncate(bytes.len() - 3);
            }
            out.push((
                format!("seed-{i}-tc{}-from{}", u8::from(tc), steer >> 2),
                bytes,
            ));
        }
    }
    out
}
