//! Differential DNS (issue 23): ringway and the real Istio ztunnel serve
//! DNS for the same LOCAL_XDS mesh and get the same questions from the
//! same client pod address; every answer must agree (rcode, the AA, RA, TC
//! and RD flags, every record's name, class, type, TTL and data), except
//! for the differences listed in [`DELIBERATE`], each with its reason.
//!
//! How each runs (common/ztunnel.rs for the binary, RINGWAY_ZTUNNEL):
//! - ringway, node-level, in its own namespace, `--dns-addr` on 127.0.0.1;
//!   the client pods are addresses on that namespace's loopback, and
//!   ringway finds the asking pod by the query's source address.
//! - ztunnel in dedicated mode (its only mode without a CNI agent), one
//!   instance per client pod, each in its own namespace with the pod's
//!   address on loopback and `PROXY_WORKLOAD_INFO` naming that pod: in
//!   dedicated mode ztunnel answers for that workload whatever the source
//!   address (checked by hand: it does not look the source up), so one
//!   instance per asking pod gives it the same view ringway derives from
//!   the source address. Its DNS address is fixed, localhost:15053.
//! - Forwarded names: each namespace has this test's resolver on
//!   127.0.0.1:53 (UDP and TCP). ringway is given it with
//!   `--dns-upstream`; ztunnel reads `/etc/resolv.conf`, so the test writes
//!   `/etc/netns/<ns>/resolv.conf`, which `ip netns exec` bind-mounts over
//!   `/etc/resolv.conf` in the private mount namespace it gives ztunnel
//!   (removed again when the test ends, pass or fail).
//!
//! Prints every question with both answers to stderr (`-- --nocapture`);
//! fails with the table of every undeclared difference.

mod common;

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ztunnel::{self, Ztunnel};
use common::{write_config, NetNs};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// The client pods: the same short service name `web` exists in both
/// namespaces.
const SHOP: (&str, &str) = ("10.74.0.1", "shop/client/default");
const OTHER: (&str, &str) = ("10.74.0.2", "other/client/default");

/// Endpoints of the headless service `big`: more A records than fit in
/// 512 bytes, or in 1232.
const BIG: usize = 100;

/// The mesh: [`MESH`] and `big`'s endpoints.
fn mesh() -> String {
    let mut out = MESH.replace(
        "services:\n- name: web\n",
        "services:\n- name: big\n  namespace: shop\n  hostname: big.shop.svc.cluster.local\n  vips: []\n  ports: {80: 80}\n- name: web\n",
    );
    let mut big = String::new();
    for i in 0..BIG {
        big += &format!(
            "- uid: k8s//v1/Pod/shop/big-{i}\n  name: big-{i}\n  namespace: shop\n  serviceAccount: default\n  workloadIps: [\"10.74.2.{i}\"]\n  protocol: HBONE\n  services:\n    \"shop/big.shop.svc.cluster.local\": {{80: 80}}\n"
        );
    }
    out = out.replacen(
        "services:\n- name: big",
        &format!("{big}services:\n- name: big"),
        1,
    );
    out
}

/// ztunnel's LOCAL_XDS parser wants `services` on every workload.
const MESH: &str = r#"
workloads:
- uid: k8s//v1/Pod/shop/client
  name: client
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.74.0.1"]
  protocol: HBONE
  services: {}
- uid: k8s//v1/Pod/other/client
  name: client
  namespace: other
  serviceAccount: default
  workloadIps: ["10.74.0.2"]
  protocol: HBONE
  services: {}
- uid: k8s//v1/Pod/shop/db-0
  name: db-0
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.74.1.1"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
- uid: k8s//v1/Pod/shop/db-1
  name: db-1
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.74.1.2"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
- uid: k8s//v1/Pod/shop/vm
  name: vm
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.74.1.9"]
  hostname: vm.example.internal
  protocol: HBONE
  services: {}
services:
- name: web
  namespace: shop
  hostname: web.shop.svc.cluster.local
  vips: ["/10.96.4.1", "/fd96::4:1"]
  ports: {80: 8080}
- name: web
  namespace: other
  hostname: web.other.svc.cluster.local
  vips: ["/10.96.4.2"]
  ports: {80: 8080}
- name: api
  namespace: shop
  hostname: api.shop.svc.cluster.local
  vips: ["/10.96.4.3"]
  ports: {80: 8080}
- name: db
  namespace: shop
  hostname: db.shop.svc.cluster.local
  vips: []
  ports: {5432: 5432}
- name: wild
  namespace: shop
  hostname: "*.wild.example"
  vips: ["/10.96.4.9"]
  ports: {443: 443}
policies: []
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    /// UDP with an EDNS OPT record (1232 bytes), as dig asks.
    Udp,
    /// UDP without EDNS, as glibc's stub resolver asks.
    UdpPlain,
    Tcp,
}

#[derive(Clone, Copy)]
struct Question {
    from: (&'static str, &'static str),
    name: &'static str,
    kind: RecordType,
    via: Transport,
}

impl fmt::Display for Question {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {:?} from {}",
            self.name, self.kind, self.via, self.from.1
        )
    }
}

fn questions() -> Vec<Question> {
    use RecordType::*;
    use Transport::*;
    let q = |from, name, kind, via| Question {
        from,
        name,
        kind,
        via,
    };
    vec![
        // Service FQDNs, both families, and a v4-only one asked for v6.
        q(SHOP, "web.shop.svc.cluster.local.", A, Udp),
        q(SHOP, "web.shop.svc.cluster.local.", AAAA, Udp),
        q(SHOP, "api.shop.svc.cluster.local.", AAAA, Udp),
        // Kubernetes short names and partial names.
        q(SHOP, "web.", A, Udp),
        q(SHOP, "web.", AAAA, Udp),
        q(SHOP, "web.shop.", A, Udp),
        q(SHOP, "web.shop.svc.", A, Udp),
        q(SHOP, "web.other.", A, Udp),
        q(SHOP, "web.other.", AAAA, Udp),
        // The same short name from the other namespace's pod.
        q(OTHER, "web.", A, Udp),
        q(OTHER, "web.shop.", A, Udp),
        q(OTHER, "api.", A, Udp),
        // Search suffixes left on by a stub resolver.
        q(
            SHOP,
            "web.shop.svc.cluster.local.shop.svc.cluster.local.",
            A,
            Udp,
        ),
        q(SHOP, "web.shop.shop.svc.cluster.local.", A, Udp),
        q(SHOP, "web.svc.cluster.local.", A, Udp),
        q(SHOP, "web.cluster.local.", A, Udp),
        // Wildcard hosts.
        q(SHOP, "api.wild.example.", A, Udp),
        q(SHOP, "a.b.wild.example.", A, Udp),
        q(SHOP, "api.wild.example.", AAAA, Udp),
        q(SHOP, "wild.example.", A, Udp),
        q(SHOP, "api.wild.example.shop.svc.cluster.local.", A, Udp),
        // Headless: the endpoints.
        q(SHOP, "db.", A, Udp),
        q(SHOP, "db.shop.svc.cluster.local.", A, Udp),
        q(SHOP, "db.shop.svc.cluster.local.", AAAA, Udp),
        q(OTHER, "db.shop.", A, Udp),
        // A workload hostname.
        q(SHOP, "vm.example.internal.", A, Udp),
        // Uppercase.
        q(SHOP, "WEB.SHOP.SVC.CLUSTER.LOCAL.", A, Udp),
        q(SHOP, "Web.Shop.", A, Udp),
        q(SHOP, "API.WILD.EXAMPLE.", A, Udp),
        // Other types of mesh names: forwarded.
        q(SHOP, "web.shop.svc.cluster.local.", MX, Udp),
        q(SHOP, "web.shop.svc.cluster.local.", TXT, Udp),
        // Forwarded names: an answer, a CNAME chain, NXDOMAIN.
        q(SHOP, "ext.example.org.", A, Udp),
        q(SHOP, "ext.example.org.", AAAA, Udp),
        q(SHOP, "alias.example.org.", A, Udp),
        q(SHOP, "nothere.example.org.", A, Udp),
        q(SHOP, "nothere.shop.svc.cluster.local.", A, Udp),
        q(SHOP, "nothere.", A, Udp),
        q(SHOP, "EXT.Example.ORG.", A, Udp),
        q(SHOP, "Alias.Example.Org.", A, Udp),
        // Over TCP, and over UDP without EDNS.
        q(SHOP, "web.shop.svc.cluster.local.", A, Tcp),
        q(SHOP, "db.", A, Tcp),
        q(SHOP, "ext.example.org.", A, Tcp),
        q(SHOP, "web.", A, UdpPlain),
        q(SHOP, "ext.example.org.", A, UdpPlain),
        // Answers larger than the client takes over UDP.
        q(SHOP, "big.", A, UdpPlain),
        q(SHOP, "big.", A, Udp),
        q(SHOP, "big.", A, Tcp),
    ]
}

/// What the comparison looks at, one line each, records sorted (neither
/// proxy promises an order among equal records).
#[derive(Clone, Debug, PartialEq)]
struct Answer {
    /// The question section as echoed, case and all.
    question: Vec<String>,
    rcode: ResponseCode,
    flags: String,
    answers: Vec<String>,
    authorities: Vec<String>,
    additionals: Vec<String>,
    /// The OPT record: its payload size, or none.
    edns: Option<u16>,
}

impl Answer {
    fn of(m: &Message) -> Answer {
        let sorted = |rs: &[Record]| {
            let mut v: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
            v.sort();
            v
        };
        let md = &m.metadata;
        let flags = [
            ("aa", md.authoritative),
            ("tc", md.truncation),
            ("rd", md.recursion_desired),
            ("ra", md.recursion_available),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect::<Vec<_>>()
        .join(" ");
        Answer {
            question: m.queries.iter().map(|q| q.to_string()).collect(),
            rcode: md.response_code,
            flags,
            answers: sorted(&m.answers),
            authorities: sorted(&m.authorities),
            additionals: sorted(&m.additionals),
            edns: m.edns.as_ref().map(|e| e.max_payload()),
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}] q {}",
            self.rcode,
            self.flags,
            self.question.join(", ")
        )?;
        if let Some(size) = self.edns {
            write!(f, " edns {size}")?;
        }
        for (section, rs) in [
            ("an", &self.answers),
            ("ns", &self.authorities),
            ("ar", &self.additionals),
        ] {
            for r in rs {
                write!(f, "\n      {section} {r}")?;
            }
        }
        Ok(())
    }
}

/// A difference the test accepts, with why.
struct Deliberate {
    why: &'static str,
    applies: fn(&Question, &Answer, &Answer) -> bool,
}

/// Differences between ringway (first) and ztunnel (second) answers that
/// are deliberate. Everything else fails the test.
const DELIBERATE: &[Deliberate] = &[
    Deliberate {
        why: "forwarded negative answer: ringway relays the upstream's reply as it came \
              (RA, its OPT record, the SOA that lets the client cache the NXDOMAIN or \
              NODATA); ztunnel rebuilds it from its resolver's error without them \
              (docs/operating.md, DNS proxy)",
        applies: |_, r, z| {
            !r.flags.contains("aa")
                && r.rcode == z.rcode
                && matches!(r.rcode, ResponseCode::NXDomain | ResponseCode::NoError)
                && r.answers.is_empty()
                && z.answers.is_empty()
                && r.flags == "rd ra"
                && z.flags == "rd"
                && z.edns.is_none()
                && z.authorities.is_empty()
                && r.authorities.iter().all(|a| a.contains(" IN SOA "))
        },
    },
    Deliberate {
        why: "UDP without EDNS: ringway truncates at 512 bytes (RFC 1035) and sets TC, \
              ztunnel sends the whole answer in one larger datagram \
              (dataplane/src/dns/message.rs)",
        applies: |q, r, z| {
            q.via == Transport::UdpPlain
                && r.rcode == z.rcode
                && r.flags == "aa tc rd ra"
                && z.flags == "aa rd ra"
                && r.answers.len() < z.answers.len()
                && r.answers.iter().all(|a| z.answers.contains(a))
        },
    },
    Deliberate {
        why: "UDP truncated to the EDNS size: ringway keeps the OPT record (RFC 6891), \
              ztunnel drops it; which records fit is each one's own \
              (dataplane/src/dns/message.rs)",
        applies: |q, r, z| {
            q.via == Transport::Udp
                && r.rcode == z.rcode
                && r.flags == z.flags
                && r.flags.contains("tc")
                && r.edns.is_some()
                && z.edns.is_none()
                && r.answers
                    .iter()
                    .chain(&z.answers)
                    .all(|a| a.starts_with("big. 30 IN A 10.74.2."))
        },
    },
];

/// The test's upstream resolver, the same table in both namespaces:
/// TTL 60, NXDOMAIN for anything it does not know, and NOERROR with no
/// records for other types of names it knows (as a cluster DNS does).
fn upstream_reply(query: &Message) -> Vec<u8> {
    let mut m = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.add_queries(query.queries.iter().cloned());
    let Some(q) = query.queries.first() else {
        m.metadata.response_code = ResponseCode::FormErr;
        return m.to_vec().unwrap();
    };
    let name = q.name().to_lowercase().to_ascii();
    let ext: Name = "ext.example.org.".parse().unwrap();
    let a = |n: &Name| Record::from_rdata(n.clone(), 60, RData::A(A::new(192, 0, 2, 7)));
    let answers = match (name.as_str(), q.query_type()) {
        ("ext.example.org.", RecordType::A) => vec![a(q.name())],
        ("ext.example.org.", RecordType::AAAA) => vec![Record::from_rdata(
            q.name().clone(),
            60,
            RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
        )],
        ("alias.example.org.", RecordType::A) => vec![
            Record::from_rdata(q.name().clone(), 60, RData::CNAME(CNAME(ext.clone()))),
            a(&ext),
        ],
        ("ext.example.org." | "alias.example.org.", _) => vec![],
        (n, _) if n.ends_with(".svc.cluster.local.") && n.starts_with("web.") => vec![],
        _ => {
            m.metadata.response_code = ResponseCode::NXDomain;
            vec![]
        }
    };
    if answers.is_empty() {
        // As a real zone's server: the SOA with the negative TTL.
        let soa = SOA::new(
            "ns.example.".parse().unwrap(),
            "admin.example.".parse().unwrap(),
            1,
            3600,
            600,
            86400,
            15,
        );
        m.add_authority(Record::from_rdata(Name::root(), 15, RData::SOA(soa)));
    }
    m.insert_answers(answers);
    if query.edns.is_some() {
        // A query with OPT gets OPT back (RFC 6891).
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        m.set_edns(edns);
    }
    m.to_vec().unwrap()
}

/// Runs the upstream on 127.0.0.1:53 in `ns` (UDP and TCP), on threads
/// that end with the namespace's sockets when the process ends.
fn start_upstream(ns: &NetNs) {
    let (udp, tcp) = ns.enter(|| {
        (
            UdpSocket::bind("127.0.0.1:53").expect("upstream UDP 127.0.0.1:53"),
            TcpListener::bind("127.0.0.1:53").expect("upstream TCP 127.0.0.1:53"),
        )
    });
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            if let Ok(q) = Message::from_vec(&buf[..n]) {
                let _ = udp.send_to(&upstream_reply(&q), from);
            }
        }
    });
    common::serve_dns_tcp(tcp, |msg| {
        Message::from_vec(msg).ok().map(|q| upstream_reply(&q))
    });
}

/// Asks `q` of the DNS server at `server` in namespace `ns`, from the
/// question's client address: the reply, or why there is none.
fn ask(ns: &str, server: SocketAddr, q: Question, id: u16) -> Result<Message, String> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(q.name.parse().unwrap(), q.kind));
    if q.via != Transport::UdpPlain {
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        m.set_edns(edns);
    }
    let bytes = m.to_vec().unwrap();
    let src: std::net::IpAddr = q.from.0.parse().unwrap();
    common::in_netns(ns, move || {
        let timeout = Some(Duration::from_secs(6));
        let reply = if q.via == Transport::Tcp {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.bind(&SocketAddr::new(src, 0).into()).unwrap();
            sock.connect(&server.into()).map_err(|e| format!("{e}"))?;
            let mut s = std::net::TcpStream::from(sock);
            s.set_read_timeout(timeout).unwrap();
            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            s.write_all(&framed).map_err(|e| format!("{e}"))?;
            let mut len = [0u8; 2];
            s.read_exact(&mut len)
                .map_err(|e| format!("no reply: {e}"))?;
            let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut body).map_err(|e| format!("cut: {e}"))?;
            body
        } else {
            let s = UdpSocket::bind((src, 0)).unwrap();
            s.set_read_timeout(timeout).unwrap();
            s.send_to(&bytes, server).map_err(|e| format!("{e}"))?;
            let mut buf = [0u8; 65535];
            let n = s.recv(&mut buf).map_err(|e| format!("no reply: {e}"))?;
            buf[..n].to_vec()
        };
        Message::from_vec(&reply).map_err(|e| format!("undecodable reply: {e}"))
    })
}

/// Removes `/etc/netns/<ns>` (ztunnel's private resolv.conf) on drop.
struct EtcNetns(PathBuf);

impl EtcNetns {
    fn new(ns: &str, resolv: &str) -> EtcNetns {
        let dir = Path::new("/etc/netns").join(ns);
        std::fs::create_dir_all(&dir).unwrap();
        let guard = EtcNetns(dir);
        std::fs::write(guard.0.join("resolv.conf"), resolv).unwrap();
        guard
    }
}

impl Drop for EtcNetns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn dns_answers_match_ztunnel() {
    let Some(bin) = ztunnel::locate("differential DNS test (dns_ztunnel)") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "mesh.yaml", &mesh());

    // ringway: both client pods in one namespace, found by source address.
    let rw_ns = NetNs::new("dnsz-rw");
    for (ip, _) in [SHOP, OTHER] {
        rw_ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    }
    start_upstream(&rw_ns);
    let rw = rw_ns.ringway(&[
        "--config",
        cfg.to_str().unwrap(),
        "--cores",
        "1",
        "--dns-addr",
        "127.0.0.1:0",
        "--dns-upstream",
        "127.0.0.1:53",
        "--dns-forward-timeout",
        "5s",
    ]);
    let rw_dns: SocketAddr = rw.listeners["listeners"]["dns"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no dns listener: {}", rw.listeners))
        .parse()
        .unwrap();

    // ztunnel: one dedicated instance per client pod.
    let mut zts = Vec::new();
    for (tag, (ip, workload)) in [("dnsz-zs", SHOP), ("dnsz-zo", OTHER)] {
        let ns = NetNs::new(tag);
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
        let etc = EtcNetns::new(&ns.name, "nameserver 127.0.0.1\n");
        start_upstream(&ns);
        let log = dir.path().join(format!("{tag}.log"));
        let z = Ztunnel::start(&bin, &ns.name, &cfg, workload, &log);
        // Fields drop in order: ztunnel before its namespace and files.
        zts.push((workload, z, etc, ns));
    }
    let zt_dns: SocketAddr = "127.0.0.1:15053".parse().unwrap();

    let mut table = String::new();
    let mut failures = String::new();
    let mut accepted = Vec::new();
    let qs = questions();
    for (i, q) in qs.iter().enumerate() {
        let id = 0x2300 + i as u16;
        let (_, _, _, zns) = zts.iter().find(|(w, ..)| *w == q.from.1).unwrap();
        let ours = ask(&rw_ns.name, rw_dns, *q, id);
        let theirs = ask(&zns.name, zt_dns, *q, id);
        let (line, bad) = match (&ours, &theirs) {
            (Ok(r), Ok(z)) => {
                let (r, z) = (Answer::of(r), Answer::of(z));
                if r == z {
                    (format!("  same  {q}\n      {r}\n"), false)
                } else if let Some(d) = DELIBERATE.iter().find(|d| (d.applies)(q, &r, &z)) {
                    accepted.push(q.to_string());
                    (
                        format!(
                            "  known {q} ({})\n    ringway {r}\n    ztunnel {z}\n",
                            d.why
                        ),
                        false,
                    )
                } else {
                    (
                        format!("  DIFF  {q}\n    ringway {r}\n    ztunnel {z}\n"),
                        true,
                    )
                }
            }
            (r, z) => (
                format!(
                    "  DIFF  {q}\n    ringway {:?}\n    ztunnel {:?}\n",
                    r.as_ref().map(Answer::of),
                    z.as_ref().map(Answer::of)
                ),
                true,
            ),
        };
        table += &line;
        if bad {
            failures += &line;
        }
    }
    eprintln!("differential DNS, {} questions:\n{table}", qs.len());
    eprintln!(
        "{} answers the same, {} deliberate differences (listed above with their reasons)",
        qs.len() - accepted.len() - failures.matches("  DIFF  ").count(),
        accepted.len()
    );
    assert!(
        failures.is_empty(),
        "ringway and ztunnel answer differently:\n{failures}"
    );
    drop(rw);
}
