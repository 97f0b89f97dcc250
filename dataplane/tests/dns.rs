//! The DNS proxy through a real ringway (issue 23), node-level: ringway
//! serves DNS on an address inside a test namespace, pods are addresses on
//! that namespace's loopback, and `dig` (dnsutils, installed by
//! scripts/test.sh) asks from them. Names the mesh does not answer go to
//! an upstream resolver this test runs itself (UDP and TCP), whose names
//! each behave in one way: a plain answer, a truncated one, silence,
//! garbage, a spoofed reply from another port.

mod common;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{write_config, NetNs};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

/// The client pod (namespace `shop`), another pod (namespace `other`),
/// and an address no workload has.
const CLIENT: &str = "10.71.0.1";
const OTHER: &str = "10.71.0.2";
const STRANGER: &str = "10.71.0.9";

const MESH: &str = r#"
workloads:
- uid: k8s//v1/Pod/shop/client
  name: client
  namespace: shop
  serviceAccount: default
  canonicalName: client-app
  canonicalRevision: v1
  workloadIps: ["10.71.0.1"]
  protocol: HBONE
- uid: k8s//v1/Pod/other/other
  name: other
  namespace: other
  serviceAccount: default
  canonicalName: other-app
  workloadIps: ["10.71.0.2"]
  protocol: HBONE
- uid: k8s//v1/Pod/shop/db-0
  name: db-0
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.71.1.1"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
- uid: k8s//v1/Pod/shop/db-1
  name: db-1
  namespace: shop
  serviceAccount: default
  workloadIps: ["10.71.1.2"]
  protocol: HBONE
  services:
    "shop/db.shop.svc.cluster.local": {5432: 5432}
services:
- name: web
  namespace: shop
  hostname: web.shop.svc.cluster.local
  vips: ["/10.96.1.1", "/fd96::1"]
  ports: {80: 8080}
- name: api
  namespace: shop
  hostname: api.shop.svc.cluster.local
  vips: ["/10.96.1.2"]
  ports: {80: 8080}
- name: db
  namespace: shop
  hostname: db.shop.svc.cluster.local
  vips: []
  ports: {5432: 5432}
- name: wild
  namespace: shop
  hostname: "*.wild.example"
  vips: ["/10.96.1.9"]
  ports: {443: 443}
policies: []
"#;

/// What a `dig` printed: the rcode, the flags line and the answers.
#[derive(Debug)]
struct Dig {
    status: String,
    flags: String,
    /// (type, data) of each answer record.
    answers: Vec<(String, String)>,
    raw: String,
}

impl Dig {
    fn data(&self, kind: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .answers
            .iter()
            .filter(|(t, _)| t == kind)
            .map(|(_, d)| d.clone())
            .collect();
        v.sort();
        v
    }
}

fn require_dig() {
    let found = Command::new("dig").arg("-v").output().is_ok();
    assert!(
        found,
        "`dig` is missing: install dnsutils (scripts/test.sh installs it); this test does not skip"
    );
}

/// `dig` from `src` inside `ns` to ringway's DNS address.
fn dig(ns: &NetNs, server: SocketAddr, src: &str, name: &str, kind: &str, extra: &[&str]) -> Dig {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "dig"])
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "-b", src])
        .args(["+tries=1", "+timeout=4", "+noall", "+comments", "+answer"])
        .args(extra)
        .args([name, kind])
        .output()
        .expect("run dig");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = common::dig_status(&raw);
    let flags = raw
        .lines()
        .find(|l| l.starts_with(";; flags:"))
        .unwrap_or("")
        .to_string();
    let answers = raw
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5).then(|| (f[3].to_string(), f[4..].join(" ")))
        })
        .collect();
    Dig {
        status,
        flags,
        answers,
        raw,
    }
}

/// The test's upstream resolver: what each name does, and how many
/// queries came over TCP.
struct Upstream {
    addr: SocketAddr,
    tcp_queries: Arc<AtomicUsize>,
}

fn reply_to(query: &Message, answers: Vec<Record>, truncated: bool) -> Vec<u8> {
    let mut m = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.truncation = truncated;
    m.add_queries(query.queries.iter().cloned());
    if answers.is_empty() && !truncated {
        m.metadata.response_code = ResponseCode::NXDomain;
    }
    m.insert_answers(answers);
    m.to_vec().unwrap()
}

fn records(query: &Message, tcp: bool) -> Option<(Vec<Record>, bool)> {
    let q = query.queries.first()?;
    let name = q.name().to_lowercase().to_ascii();
    let a = |ip: [u8; 4]| {
        Record::from_rdata(
            q.name().clone(),
            60,
            RData::A(A::from(std::net::Ipv4Addr::from(ip))),
        )
    };
    Some(match (name.as_str(), q.query_type()) {
        ("ext.example.org.", RecordType::A) => (vec![a([192, 0, 2, 7])], false),
        ("ext.example.org.", RecordType::AAAA) => (
            vec![Record::from_rdata(
                q.name().clone(),
                60,
                RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
            )],
            false,
        ),
        ("spoof.example.org.", _) => (vec![a([192, 0, 2, 8])], false),
        ("big.example.org.", _) if !tcp => (Vec::new(), true),
        ("big.example.org.", _) => ((1..=40).map(|i| a([192, 0, 2, i])).collect(), false),
        _ => (Vec::new(), false),
    })
}

fn start_upstream(ns: &NetNs) -> Upstream {
    let (udp, tcp, spoofer) = ns.enter(|| {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        let tcp = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let spoofer = UdpSocket::bind("127.0.0.1:0").unwrap();
        (udp, tcp, spoofer)
    });
    let addr = udp.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            let Ok((n, from)) = udp.recv_from(&mut buf) else {
                return;
            };
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let name = query
                .queries
                .first()
                .map(|q| q.name().to_lowercase().to_ascii())
                .unwrap_or_default();
            match name.as_str() {
                "slow.example.org." => continue,
                "junk.example.org." => {
                    let mut junk = buf[..2].to_vec();
                    junk.extend_from_slice(&[0xff; 30]);
                    let _ = udp.send_to(&junk, from);
                    continue;
                }
                "spoof.example.org." => {
                    // A forged answer under the right ID from another port
                    // first: ringway must wait for the real one.
                    let mut forged =
                        Message::from_vec(&reply_to(&query, Vec::new(), false)).unwrap();
                    forged.metadata.response_code = ResponseCode::NoError;
                    forged.insert_answers(vec![Record::from_rdata(
                        query.queries[0].name().clone(),
                        60,
                        RData::A(A::new(6, 6, 6, 6)),
                    )]);
                    let _ = spoofer.send_to(&forged.to_vec().unwrap(), from);
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {}
            }
            if let Some((answers, truncated)) = records(&query, false) {
                let _ = udp.send_to(&reply_to(&query, answers, truncated), from);
            }
        }
    });
    let tcp_queries = Arc::new(AtomicUsize::new(0));
    let counted = tcp_queries.clone();
    common::serve_dns_tcp(tcp, move |msg| {
        counted.fetch_add(1, Ordering::SeqCst);
        let query = Message::from_vec(msg).ok()?;
        let (answers, truncated) = records(&query, true)?;
        Some(reply_to(&query, answers, truncated))
    });
    Upstream { addr, tcp_queries }
}

/// Raw bytes over UDP from `src`: the reply, or None within 1 s.
fn raw_udp(ns: &NetNs, src: &'static str, server: SocketAddr, bytes: Vec<u8>) -> Option<Vec<u8>> {
    ns.enter(move || {
        let s = UdpSocket::bind((src, 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        s.send_to(&bytes, server).unwrap();
        let mut buf = [0u8; 4096];
        s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
    })
}

/// The value of the one sample of `name` whose labels include `want`.
fn sample(scrape: &str, name: &str, want: &[(&str, &str)]) -> u64 {
    let found: Vec<u64> = scrape
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            want.iter()
                .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?} in\n{scrape}");
    found[0]
}

/// ringway in `ns` on the test mesh, serving DNS on a free port of
/// 127.0.0.1 with these upstreams and forward timeout: it, the DNS
/// address, and the directory its config lives in.
fn serve_dns(
    ns: &NetNs,
    cores: &str,
    upstreams: &str,
    timeout: &str,
) -> (common::Ringway, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "mesh.yaml", MESH);
    let rw = ns.ringway(&[
        "--config",
        cfg.to_str().unwrap(),
        "--cores",
        cores,
        "--dns-addr",
        "127.0.0.1:0",
        "--dns-upstream",
        upstreams,
        "--dns-forward-timeout",
        timeout,
    ]);
    let server = rw.listeners["listeners"]["dns"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no dns listener: {}", rw.listeners))
        .parse()
        .unwrap();
    (rw, server, dir)
}

#[test]
fn dns_proxy_answers_mesh_names_and_forwards_the_rest() {
    require_dig();
    let ns = NetNs::new("dns");
    for ip in [CLIENT, OTHER, STRANGER] {
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    }
    let upstream = start_upstream(&ns);
    let up = upstream.addr.to_string();
    let (rw, server, _dir) = serve_dns(&ns, "2", &up, "1s");
    let (status, _) = rw.http_get("readiness", "/healthz/ready");
    assert!(status.contains(" 200 "), "ready once DNS serves: {status}");
    let ask = |src: &str, name: &str, kind: &str| dig(&ns, server, src, name, kind, &[]);

    // A Service hostname: its VIPs, authoritative, TTL 30.
    let d = ask(CLIENT, "web.shop.svc.cluster.local", "A");
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert_eq!(d.data("A"), ["10.96.1.1"], "{}", d.raw);
    assert!(d.flags.contains(" aa"), "authoritative: {}", d.raw);
    let ttl = |l: &str| l.split_whitespace().nth(1).map(str::to_owned);
    let ttls: Vec<_> = d
        .raw
        .lines()
        .filter(|l| l.starts_with("web."))
        .filter_map(ttl)
        .collect();
    assert_eq!(ttls, ["30"], "TTL 30: {}", d.raw);
    let d = ask(CLIENT, "web.shop.svc.cluster.local", "AAAA");
    assert_eq!(d.data("AAAA"), ["fd96::1"], "{}", d.raw);
    // A v4-only service asked for IPv6: the name exists, no records.
    let d = ask(CLIENT, "api.shop.svc.cluster.local", "AAAA");
    assert_eq!(
        (d.status.as_str(), d.answers.len()),
        ("NOERROR", 0),
        "{}",
        d.raw
    );

    // Short names from a pod of `shop`, and a search suffix left on.
    assert_eq!(ask(CLIENT, "web", "A").data("A"), ["10.96.1.1"]);
    assert_eq!(ask(CLIENT, "api.shop", "A").data("A"), ["10.96.1.2"]);
    // With one of its search suffixes left on, the name is forwarded, as
    // ztunnel does (the test upstream says NXDOMAIN): the stub resolver
    // goes on down its search list.
    let d = ask(
        CLIENT,
        "web.shop.svc.cluster.local.shop.svc.cluster.local",
        "A",
    );
    assert_eq!(d.status, "NXDOMAIN", "{}", d.raw);
    // From another namespace the short name is not ours: forwarded
    // (the test upstream says NXDOMAIN).
    assert_eq!(ask(OTHER, "web", "A").status, "NXDOMAIN");
    assert_eq!(ask(OTHER, "web.shop", "A").data("A"), ["10.96.1.1"]);

    // A wildcard host, and a headless service's endpoints.
    assert_eq!(
        ask(CLIENT, "api.wild.example", "A").data("A"),
        ["10.96.1.9"]
    );
    assert_eq!(
        ask(CLIENT, "db.shop.svc.cluster.local", "A").data("A"),
        ["10.71.1.1", "10.71.1.2"]
    );

    // A source no workload has: SERVFAIL, as ztunnel answers it.
    assert_eq!(
        ask(STRANGER, "web.shop.svc.cluster.local", "A").status,
        "SERVFAIL"
    );

    // Over TCP (dig keeps one connection for both names with +keepopen).
    let d = dig(
        &ns,
        server,
        CLIENT,
        "web.shop.svc.cluster.local",
        "A",
        &["+tcp", "+keepopen", "api.shop.svc.cluster.local", "A"],
    );
    assert_eq!(d.data("A"), ["10.96.1.1", "10.96.1.2"], "{}", d.raw);

    // Forwarded: the upstream's answer under the client's ID, over UDP
    // and TCP.
    let d = ask(CLIENT, "ext.example.org", "A");
    assert_eq!(
        (d.status.as_str(), d.data("A")),
        ("NOERROR", vec!["192.0.2.7".to_string()]),
        "{}",
        d.raw
    );
    assert!(
        !d.flags.contains(" aa"),
        "not ours to be authoritative for: {}",
        d.raw
    );
    let d = dig(&ns, server, CLIENT, "ext.example.org", "AAAA", &["+tcp"]);
    assert_eq!(d.data("AAAA"), ["2001:db8::7"], "{}", d.raw);
    // Other types of mesh names go upstream too.
    assert_eq!(
        ask(CLIENT, "web.shop.svc.cluster.local", "TXT").status,
        "NXDOMAIN"
    );

    // Truncated upstream reply: ringway asks again over TCP and the
    // client gets all 40 records.
    let before = upstream.tcp_queries.load(Ordering::SeqCst);
    let d = ask(CLIENT, "big.example.org", "A");
    assert_eq!(d.data("A").len(), 40, "{}", d.raw);
    assert!(!d.flags.contains(" tc"), "{}", d.raw);
    assert!(
        upstream.tcp_queries.load(Ordering::SeqCst) > before,
        "no TCP retry upstream"
    );
    // A client without EDNS takes 512 bytes: it gets the upstream's
    // truncated reply, and would ask again over TCP itself.
    let d = dig(
        &ns,
        server,
        CLIENT,
        "big.example.org",
        "A",
        &["+noedns", "+ignore"],
    );
    assert!(d.flags.contains(" tc"), "{}", d.raw);

    // A forged reply from another port is dropped; the real one is taken.
    let d = ask(CLIENT, "spoof.example.org", "A");
    assert_eq!(d.data("A"), ["192.0.2.8"], "{}", d.raw);

    // An upstream that never answers: SERVFAIL within the 1 s timeout.
    let started = Instant::now();
    let d = ask(CLIENT, "slow.example.org", "A");
    let took = started.elapsed();
    assert_eq!(d.status, "SERVFAIL", "{}", d.raw);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // An upstream that answers garbage: SERVFAIL at once.
    let started = Instant::now();
    assert_eq!(ask(CLIENT, "junk.example.org", "A").status, "SERVFAIL");
    assert!(started.elapsed() < Duration::from_millis(900));

    // Malformed input: too short for an ID gets nothing; a header with a
    // broken question gets FORMERR; a response is ignored; over TCP a
    // broken message gets a framed FORMERR. ringway keeps answering.
    assert_eq!(raw_udp(&ns, CLIENT, server, vec![1, 2, 3, 4, 5]), None);
    let mut broken = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    broken.extend_from_slice(&[60, b'x', b'y']);
    let reply = raw_udp(&ns, CLIENT, server, broken.clone()).expect("FORMERR");
    let m = Message::from_vec(&reply).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0x1234, ResponseCode::FormErr)
    );
    let mut response = broken.clone();
    response[2] |= 0x80;
    assert_eq!(raw_udp(&ns, CLIENT, server, response), None);
    // Over TCP, on one connection: the broken message, then a good one
    // split across two writes; a framed FORMERR, then the answer.
    let frame = |m: &[u8]| {
        let mut f = (m.len() as u16).to_be_bytes().to_vec();
        f.extend_from_slice(m);
        f
    };
    let mut good = Message::new(0x4321, MessageType::Query, OpCode::Query);
    good.add_query(hickory_proto::op::Query::query(
        "api.shop.svc.cluster.local.".parse().unwrap(),
        RecordType::A,
    ));
    let mut stream = frame(&broken);
    stream.extend_from_slice(&frame(&good.to_vec().unwrap()));
    let replies = ns.enter(move || {
        use std::io::{Read, Write};
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::new(CLIENT.parse().unwrap(), 0).into())
            .unwrap();
        sock.connect(&server.into()).unwrap();
        let mut s = std::net::TcpStream::from(sock);
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let cut = stream.len() - 5;
        s.write_all(&stream[..cut]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(&stream[cut..]).unwrap();
        (0..2)
            .map(|_| {
                let mut len = [0u8; 2];
                s.read_exact(&mut len).unwrap();
                let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut body).unwrap();
                Message::from_vec(&body).unwrap()
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(replies[0].metadata.response_code, ResponseCode::FormErr);
    assert_eq!(
        (replies[1].metadata.id, replies[1].answers.len()),
        (0x4321, 1),
        "{:?}",
        replies[1]
    );
    assert_eq!(
        ask(CLIENT, "web", "A").data("A"),
        ["10.96.1.1"],
        "still answering"
    );

    // The metrics counted all this with ztunnel's labels.
    let (status, scrape) = rw.http_get("stats", "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let client = [
        ("request_protocol", "udp"),
        ("source_canonical_service", "client-app"),
        ("source_canonical_revision", "v1"),
    ];
    let a_udp = [&client[..], &[("request_query_type", "a")]].concat();
    // Thirteen A questions over UDP from the client, seven of them
    // forwarded (the search-suffixed name, ext, big twice, spoof, slow,
    // junk), two of those failed (slow, junk).
    assert_eq!(sample(&scrape, "istio_dns_requests_total", &a_udp), 13);
    assert_eq!(
        sample(&scrape, "istio_dns_upstream_requests_total", &a_udp),
        7
    );
    assert_eq!(
        sample(&scrape, "istio_dns_upstream_failures_total", &a_udp),
        2
    );
    let count = sample(
        &scrape,
        "istio_dns_upstream_request_duration_seconds_count",
        &a_udp,
    );
    assert_eq!(
        count,
        sample(&scrape, "istio_dns_upstream_requests_total", &a_udp)
    );
    let tcp = [("request_protocol", "tcp"), ("request_query_type", "a")];
    assert_eq!(sample(&scrape, "istio_dns_requests_total", &tcp), 3);
    let unknown = [
        ("source_canonical_service", "unknown"),
        ("request_query_type", "a"),
    ];
    assert_eq!(sample(&scrape, "istio_dns_requests_total", &unknown), 1);
    let stray: u64 = rw
        .per_core("ringway_core_dns_stray_replies_total")
        .iter()
        .sum();
    assert!(stray >= 1, "the forged reply is counted");

    // The settings show in /config_dump.
    // A flood of queries the upstream never answers: beyond the core's
    // 4096 in flight they get SERVFAIL at once, the rest at the timeout,
    // and ringway goes on answering.
    let early = ns.enter(move || {
        let s = UdpSocket::bind((OTHER, 0)).unwrap();
        let query = |id: u16| {
            let mut m = Message::new(id, MessageType::Query, OpCode::Query);
            m.add_query(hickory_proto::op::Query::query(
                "slow.example.org.".parse().unwrap(),
                RecordType::A,
            ));
            m.to_vec().unwrap()
        };
        let reader = s.try_clone().unwrap();
        reader
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let until = Instant::now() + Duration::from_millis(700);
        let counting = std::thread::spawn(move || {
            let mut servfails = 0;
            let mut buf = [0u8; 512];
            while Instant::now() < until {
                if let Ok(n) = reader.recv(&mut buf) {
                    if Message::from_vec(&buf[..n]).unwrap().metadata.response_code
                        == ResponseCode::ServFail
                    {
                        servfails += 1;
                    }
                }
            }
            servfails
        });
        for id in 0..12000u16 {
            let _ = s.send_to(&query(id), server);
            if id % 32 == 0 {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        counting.join().unwrap()
    });
    let full: u64 = rw
        .per_core("ringway_core_dns_pending_full_total")
        .iter()
        .sum();
    eprintln!("flood of 12000: {full} refused at the cap, {early} SERVFAILs within 700 ms");
    assert!(
        full > 0 && early > 0,
        "flood: {full} refused, {early} early SERVFAILs"
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        ask(CLIENT, "web", "A").data("A"),
        ["10.96.1.1"],
        "after the flood"
    );

    // Each query at debug level, for operators who turn it on.
    let (status, _) = rw.http_get(
        "admin",
        "/logging?level=ringway_dataplane%3A%3Aproxy%3A%3Adns%3Ddebug%2Cinfo",
    );
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(ask(CLIENT, "x.wild.example", "A").data("A"), ["10.96.1.9"]);
    let line = rw.wait_log("the query's debug line", |l| l["name"] == "x.wild.example.");
    assert_eq!(line["qtype"], "A", "{line}");
    assert_eq!(line["outcome"], "answered: 1 addresses", "{line}");
    assert!(line["src"].as_str().unwrap().starts_with(CLIENT), "{line}");

    let (_, dump) = rw.http_get("admin", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["config"]["dnsProxy"], true, "{dump}");
    assert_eq!(dump["config"]["dnsProxyAddr"][0], server.to_string());
    assert_eq!(dump["config"]["dnsUpstreams"][0], up);
}

/// Several upstreams are asked in order: a silent one is given its share
/// of the timeout, one that answers garbage passes on at once, and the
/// client gets the first real answer.
#[test]
fn dns_forwarding_fails_over_to_the_next_upstream() {
    require_dig();
    let ns = NetNs::new("dns-over");
    ns.ip(&["addr", "add", &format!("{CLIENT}/32"), "dev", "lo"]);
    let real = start_upstream(&ns);
    let (silent, garbled) = ns.enter(|| {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let garbled = UdpSocket::bind("127.0.0.1:0").unwrap();
        (silent, garbled)
    });
    let garbled_addr = garbled.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = garbled.recv_from(&mut buf) {
            let mut junk = buf[..2.min(n)].to_vec();
            junk.extend_from_slice(&[0xff; 30]);
            let _ = garbled.send_to(&junk, from);
        }
    });
    let upstreams = format!(
        "{},{garbled_addr},{}",
        silent.local_addr().unwrap(),
        real.addr
    );
    let (_rw, server, _dir) = serve_dns(&ns, "1", &upstreams, "1500ms");
    let started = Instant::now();
    let d = dig(&ns, server, CLIENT, "ext.example.org", "A", &[]);
    let took = started.elapsed();
    assert_eq!(d.data("A"), ["192.0.2.7"], "{}", d.raw);
    // The silent one's share is a third of 1.5 s; the garbled one's turn
    // ends at once.
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1400),
        "{took:?}"
    );
    drop(silent);
}

/// ztunnel refuses DNS with on-demand xDS; so does ringway, at startup,
/// saying why.
#[test]
fn dns_with_on_demand_xds_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::ringway_bin())
        .args(["--dns-addr", "127.0.0.1:0", "--xds-on-demand"])
        .args(["--xds-address", "https://127.0.0.1:1"])
        .arg("--ca-dir")
        .arg(dir.path().join("ca"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("on-demand xDS"), "{err}");
}
