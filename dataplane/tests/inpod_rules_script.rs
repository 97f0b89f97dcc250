//! scripts/inpod-rules.sh, istio-cni's in-pod redirection rules for a pod
//! network namespace, proven with real sockets: a "pod" namespace joined to
//! a "peer" namespace by a veth pair, the script run in the pod, and the
//! test's own listeners standing in for ringway (15001, 15006, 15008) and
//! for the application. Needs root; without it these tests fail, they
//! never skip.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output};
use std::thread;
use std::time::Duration;

use common::{NetNs, PATIENCE};
use socket2::{Domain, SockRef, Socket, Type};

const POD: &str = "10.77.0.1";
const PEER: &str = "10.77.0.2";
const POD6: &str = "fd77::1";
const PEER6: &str = "fd77::2";
const PROBE: &str = "169.254.7.127";
const PROBE6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";
const MARK: u32 = 0x539;

/// A pod namespace and a peer namespace joined by a veth pair, IPv4 and
/// IPv6 on both ends. Dropping it deletes both namespaces.
struct Pod {
    pod: NetNs,
    peer: NetNs,
    pod_if: String,
    peer_if: String,
}

impl Pod {
    fn new(tag: &str) -> Pod {
        let pod = NetNs::new(&format!("{tag}p"));
        let peer = NetNs::new(&format!("{tag}q"));
        let (pod_if, peer_if) = common::veth(&pod, POD, &peer, PEER);
        // No duplicate address detection: the addresses are usable at once.
        pod.ip(&[
            "addr",
            "add",
            &format!("{POD6}/64"),
            "dev",
            &pod_if,
            "nodad",
        ]);
        peer.ip(&[
            "addr",
            "add",
            &format!("{PEER6}/64"),
            "dev",
            &peer_if,
            "nodad",
        ]);
        Pod {
            pod,
            peer,
            pod_if,
            peer_if,
        }
    }

    /// Runs the script on the pod namespace with `args`; it must succeed.
    fn rules(&self, args: &[&str]) {
        let mut all = vec![self.pod.name.as_str()];
        all.extend_from_slice(args);
        let out = script(&all);
        assert!(
            out.status.success(),
            "inpod-rules.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn nft_table(&self) -> String {
        ns_stdout(
            &self.pod,
            &["nft", "list", "table", "inet", "ringway-inpod"],
        )
    }
}

fn script(args: &[&str]) -> Output {
    Command::new(ringway_rig::script("inpod-rules.sh"))
        .args(args)
        .output()
        .expect("run scripts/inpod-rules.sh")
}

/// What `args` prints inside `ns` ("" when it fails).
fn ns_stdout(ns: &NetNs, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// A listener on `at` inside `ns`. IPv6 listeners are IPv6-only, so the
/// wildcard of each family can listen on the same port.
fn listen(ns: &NetNs, at: SocketAddr) -> TcpListener {
    ns.enter(move || {
        let s = Socket::new(Domain::for_address(at), Type::STREAM, None).unwrap();
        if at.is_ipv6() {
            s.set_only_v6(true).unwrap();
        }
        s.set_reuse_address(true).unwrap();
        s.bind(&at.into())
            .unwrap_or_else(|e| panic!("bind {at}: {e}"));
        s.listen(64).unwrap();
        s.into()
    })
}

/// A connection from inside `ns` to `dst`, from `src` when given, with
/// `mark` as its SO_MARK when given; IP_TRANSPARENT when `transparent`
/// (a source the namespace does not own).
fn connect(
    ns: &NetNs,
    dst: SocketAddr,
    src: Option<SocketAddr>,
    mark: Option<u32>,
    transparent: bool,
    wait: Duration,
) -> std::io::Result<TcpStream> {
    ns.enter(move || {
        let s = Socket::new(Domain::for_address(dst), Type::STREAM, None)?;
        if let Some(m) = mark {
            s.set_mark(m)?;
        }
        if transparent {
            s.set_ip_transparent_v4(true)?;
        }
        if let Some(src) = src {
            s.bind(&src.into())?;
        }
        s.connect_timeout(&dst.into(), wait)?;
        let s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    })
}

fn connect_ok(
    ns: &NetNs,
    dst: SocketAddr,
    src: Option<SocketAddr>,
    mark: Option<u32>,
) -> TcpStream {
    connect(ns, dst, src, mark, false, PATIENCE)
        .unwrap_or_else(|e| panic!("connect {dst} from {src:?} in {}: {e}", ns.name))
}

/// The connection `l` must accept now (after a connect has succeeded).
fn accepted(l: &TcpListener, what: &str) -> (TcpStream, SocketAddr) {
    l.set_nonblocking(true).unwrap();
    let (s, peer) = common::wait_for(&format!("{what}: a connection"), PATIENCE, || {
        match l.accept() {
            Err(e) if e.kind() != ErrorKind::WouldBlock => panic!("{what}: accept: {e}"),
            r => r,
        }
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (s, peer)
}

/// Nothing reached `l`: what landed elsewhere did not also land here. No
/// wait is needed to know: a connection completes at exactly one listener,
/// and the test's connection has already been accepted elsewhere and
/// carried bytes there, so anything here would be in `l`'s queue by now.
fn nothing_on(l: &TcpListener, what: &str) {
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Ok((_, peer)) => panic!("{what}: an unexpected connection from {peer}"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => panic!("{what}: accept: {e}"),
    }
}

/// conntrack's original destination of an accepted connection
/// (SO_ORIGINAL_DST at SOL_IP, or IP6T_SO_ORIGINAL_DST at SOL_IPV6).
fn original_dst(s: &TcpStream) -> SocketAddr {
    let sock = SockRef::from(s);
    let got = if s.local_addr().unwrap().is_ipv4() {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    got.expect("SO_ORIGINAL_DST").as_socket().unwrap()
}

/// Bytes written on `from` arrive on `to`: the two ends are one connection.
fn joined(from: &mut TcpStream, to: &mut TcpStream) {
    from.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    to.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}

/// (a) Egress from the pod lands on 15001 with its original destination;
/// (b) a socket marked like ringway's own is not captured and reaches the
/// real peer; loopback and the pod calling its own address are left alone.
#[test]
fn egress_goes_to_15001_except_ringways_own_and_local_traffic() {
    let p = Pod::new("ire");
    p.rules(&[]);
    for (pod_ip, peer_ip, any) in [(POD, PEER, "0.0.0.0"), (POD6, PEER6, "::")] {
        let outbound = listen(&p.pod, addr(any, 15001));
        let peer_app = listen(&p.peer, addr(peer_ip, 9090));

        // (a) The pod's connection to the peer reaches "ringway".
        let mut c = connect_ok(&p.pod, addr(peer_ip, 9090), None, None);
        let (mut s, from) = accepted(&outbound, "egress on 15001");
        assert_eq!(original_dst(&s), addr(peer_ip, 9090));
        assert_eq!(from.ip(), pod_ip.parse::<IpAddr>().unwrap());
        joined(&mut c, &mut s);
        nothing_on(&peer_app, "the peer, behind the captured egress");

        // (b) ringway's own marked socket goes to the real peer.
        let mut c = connect_ok(&p.pod, addr(peer_ip, 9090), None, Some(MARK));
        let (mut s, from) = accepted(&peer_app, "marked egress at the peer");
        assert_eq!(from.ip(), pod_ip.parse::<IpAddr>().unwrap());
        joined(&mut c, &mut s);
        nothing_on(&outbound, "15001, after a marked connect");

        // Another mark (the low 12 bits differ) is captured.
        let _c = connect_ok(&p.pod, addr(peer_ip, 9090), None, Some(0x538));
        let (s, _) = accepted(&outbound, "egress with a foreign mark");
        assert_eq!(original_dst(&s), addr(peer_ip, 9090));

        // Loopback and the pod's own address: straight to the application.
        let lo = if pod_ip == POD { "127.0.0.1" } else { "::1" };
        for dst in [addr(lo, 7070), addr(pod_ip, 7071)] {
            let app = listen(&p.pod, dst);
            let mut c = connect_ok(&p.pod, dst, None, None);
            let (mut s, _) = accepted(&app, "pod-local connection at the app");
            joined(&mut c, &mut s);
        }
        nothing_on(&outbound, "15001, after pod-local connections");
    }
}

/// (c) Ingress to an application port lands on 15006 with its original
/// destination; ingress to 15008 (HBONE) reaches 15008 untouched.
#[test]
fn ingress_goes_to_15006_and_hbone_straight_to_15008() {
    let p = Pod::new("iri");
    p.rules(&[]);
    for (pod_ip, peer_ip, any) in [(POD, PEER, "0.0.0.0"), (POD6, PEER6, "::")] {
        let inbound = listen(&p.pod, addr(any, 15006));
        let hbone = listen(&p.pod, addr(any, 15008));
        let app = listen(&p.pod, addr(any, 8080));

        let mut c = connect_ok(&p.peer, addr(pod_ip, 8080), None, None);
        let (mut s, from) = accepted(&inbound, "ingress to 8080 on 15006");
        assert_eq!(original_dst(&s), addr(pod_ip, 8080));
        assert_eq!(from.ip(), peer_ip.parse::<IpAddr>().unwrap());
        joined(&mut c, &mut s);
        nothing_on(&app, "the application, behind 15006");

        let mut c = connect_ok(&p.peer, addr(pod_ip, 15008), None, None);
        let (mut s, from) = accepted(&hbone, "ingress to 15008");
        assert_eq!(s.local_addr().unwrap(), addr(pod_ip, 15008));
        assert_eq!(from.ip(), peer_ip.parse::<IpAddr>().unwrap());
        joined(&mut c, &mut s);
        nothing_on(&inbound, "15006, after a connection to 15008");
    }
}

/// (d) Kubelet probes (SNATed by istio-cni to 169.254.7.127, or the IPv6
/// probe address) reach the application, not 15006; `--probe-addr`
/// moves the exception, and a re-run replaces the rules.
#[test]
fn kubelet_probes_bypass_the_proxy() {
    let p = Pod::new("irp");
    p.rules(&[]);
    p.peer
        .ip(&["addr", "add", &format!("{PROBE}/32"), "dev", &p.peer_if]);
    p.peer.ip(&[
        "addr",
        "add",
        &format!("{PROBE6}/128"),
        "dev",
        &p.peer_if,
        "nodad",
    ]);
    p.pod
        .ip(&["route", "add", &format!("{PROBE}/32"), "dev", &p.pod_if]);
    p.pod.ip(&[
        "-6",
        "route",
        "add",
        &format!("{PROBE6}/128"),
        "dev",
        &p.pod_if,
    ]);
    for (pod_ip, probe, any) in [(POD, PROBE, "0.0.0.0"), (POD6, PROBE6, "::")] {
        let inbound = listen(&p.pod, addr(any, 15006));
        let app = listen(&p.pod, addr(any, 8080));
        let mut c = connect_ok(&p.peer, addr(pod_ip, 8080), Some(addr(probe, 0)), None);
        let (mut s, from) = accepted(&app, "a probe at the application");
        assert_eq!(from.ip(), probe.parse::<IpAddr>().unwrap());
        joined(&mut c, &mut s);
        nothing_on(&inbound, "15006, after a probe");
    }

    // Another probe address: 169.254.7.127 is now ordinary traffic.
    p.rules(&["--probe-addr", "169.254.7.1"]);
    let inbound = listen(&p.pod, addr("0.0.0.0", 15006));
    let app = listen(&p.pod, addr("0.0.0.0", 8080));
    let _c = connect_ok(&p.peer, addr(POD, 8080), Some(addr(PROBE, 0)), None);
    let (s, _) = accepted(&inbound, "169.254.7.127 once no longer the probe address");
    assert_eq!(original_dst(&s), addr(POD, 8080));
    nothing_on(&app, "the application, after the probe address moved");
}

/// Lines of `ip <family> rule` in the pod naming the return-path rule.
fn return_rules(p: &Pod, family: &str) -> usize {
    ns_stdout(&p.pod, &["ip", family, "rule", "show"])
        .lines()
        .filter(|l| l.contains("fwmark 0x111/0xfff lookup 100"))
        .count()
}

fn table_100(p: &Pod, family: &str) -> String {
    ns_stdout(&p.pod, &["ip", family, "route", "show", "table", "100"])
}

/// (e) However often it runs, one copy of the rules, one policy rule and
/// one route per family; `--remove` takes all of it away and is quiet the
/// second time; other tables in the namespace are left alone. DNS capture
/// is on unless `--no-dns`; the file in deploy/ is what the script installs.
#[test]
fn rules_install_once_however_often_run_and_remove_cleanly() {
    let p = Pod::new("irx");
    p.pod
        .nft("table inet someone-else {\n chain c { type filter hook output priority 0; }\n}\n");
    for _ in 0..3 {
        p.rules(&[]);
    }
    let rules = p.nft_table();
    assert_eq!(rules.matches("redirect to :15001").count(), 2, "{rules}");
    assert_eq!(rules.matches("redirect to :15006").count(), 2, "{rules}");
    assert_eq!(rules.matches("tcp dport != 15008").count(), 2, "{rules}");
    assert_eq!(rules.matches("ct mark set").count(), 1, "{rules}");
    assert_eq!(rules.matches("meta mark set ct mark").count(), 1, "{rules}");
    // Ingress and egress TCP (2 each), DNS (UDP, TCP per family) and the
    // upstream replies' conntrack zone.
    assert_eq!(
        rules
            .matches("meta mark & 0x00000fff != 0x00000539")
            .count(),
        8,
        "{rules}"
    );
    assert_eq!(rules.matches(PROBE).count(), 2, "{rules}");
    assert_eq!(
        rules.matches("redirect to :15053").count(),
        3,
        "DNS captured by default, as istio-cni does: {rules}"
    );
    assert_eq!(rules.matches("ct zone set 1").count(), 2, "{rules}");
    for family in ["-4", "-6"] {
        assert_eq!(return_rules(&p, family), 1, "ip {family} rule");
        let routes = table_100(&p, family);
        assert_eq!(
            routes.lines().count(),
            1,
            "ip {family} route table 100: {routes}"
        );
        assert!(routes.starts_with("local default dev lo"), "{routes}");
    }

    // DNS left alone on request, and captured again by default.
    p.rules(&["--no-dns"]);
    let rules = p.nft_table();
    assert!(!rules.contains("15053"), "{rules}");
    assert!(!rules.contains("ct zone"), "{rules}");
    p.rules(&[]);
    assert_eq!(p.nft_table().matches("redirect to :15053").count(), 3);
    assert_eq!(return_rules(&p, "-4"), 1);

    // Other ports and mark.
    p.rules(&[
        "--mark",
        "0x2a",
        "--outbound-port",
        "25001",
        "--inbound-port",
        "25006",
    ]);
    let rules = p.nft_table();
    assert_eq!(rules.matches("redirect to :25001").count(), 2, "{rules}");
    assert_eq!(rules.matches("redirect to :25006").count(), 2, "{rules}");
    assert!(
        rules.contains("meta mark & 0x00000fff != 0x0000002a"),
        "{rules}"
    );
    assert!(!rules.contains("0x00000539"), "{rules}");

    for _ in 0..2 {
        p.rules(&["--remove"]);
    }
    assert_eq!(p.nft_table(), "");
    for family in ["-4", "-6"] {
        assert_eq!(
            return_rules(&p, family),
            0,
            "ip {family} rule after --remove"
        );
        assert_eq!(table_100(&p, family), "", "ip {family} route table 100");
    }
    let left = ns_stdout(&p.pod, &["nft", "list", "tables"]);
    assert!(left.contains("someone-else"), "{left}");

    // deploy/ holds the default rules, exactly as the script renders them.
    let printed = script(&["--print"]);
    assert!(printed.status.success());
    let deploy = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nftables-inpod.nft"),
    )
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        deploy,
        "regenerate: scripts/inpod-rules.sh --print > deploy/nftables-inpod.nft"
    );
}

/// (f) Without root, a missing namespace or a bad value: a clear message.
#[test]
fn without_root_or_namespace_the_script_says_so() {
    common::require_root();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(ringway_rig::script("inpod-rules.sh"))
            .args(args)
            .output()
            .expect("setpriv (util-linux)")
    };
    for args in [&["some-ns"][..], &["some-ns", "--remove"][..]] {
        let out = as_nobody(args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs root"), "{args:?}: {err}");
    }
    // Printing the rules needs no privilege.
    let out = as_nobody(&["--print"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("table inet ringway-inpod"));

    let missing = format!("rwt-irnone-{}", std::process::id());
    for args in [vec![missing.as_str()], vec![missing.as_str(), "--remove"]] {
        let out = script(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("no network namespace named {missing}")),
            "{args:?}: {err}"
        );
    }
    for (args, says) in [
        (
            &["x", "--mark", "0x1539"][..],
            "does not fit the mask 0xfff",
        ),
        (&["x", "--mark", "0"][..], "mark 0"),
        (&["x", "--outbound-port", "70000"][..], "not a port: 70000"),
        (
            &["x", "--probe-addr", "nope"][..],
            "not an IPv4 address: nope",
        ),
        (&["x", "--frobnicate"][..], "unknown option --frobnicate"),
    ] {
        let out = script(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The return path: a connection captured on 15006 is carried on by a
/// transparent socket (the client's address, ringway's mark) to the
/// application in the pod; the application answers the client's address,
/// and the 0x111 connmark with its policy rule brings those replies back
/// to the transparent socket instead of out of the pod. Without the
/// policy rule the same connect never completes.
#[test]
fn replies_to_a_transparent_connection_return_through_the_connmark() {
    let p = Pod::new("irc");
    p.rules(&[]);
    let inbound = listen(&p.pod, addr("0.0.0.0", 15006));
    let app = listen(&p.pod, addr("0.0.0.0", 8080));
    // The application answers each connection with its peer's address.
    thread::spawn(move || {
        for s in app.incoming() {
            let Ok(mut s) = s else { return };
            let peer = s.peer_addr().unwrap();
            let _ = s.write_all(peer.ip().to_string().as_bytes());
        }
    });

    let mut client = connect_ok(&p.peer, addr(POD, 8080), None, None);
    let (mut down, from) = accepted(&inbound, "ingress on 15006");
    let dst = original_dst(&down);
    assert_eq!(dst, addr(POD, 8080));
    // The client's address with ports of our own, never the client's (that
    // 4-tuple belongs to the captured connection's conntrack entry), a new
    // one each time (no TIME_WAIT in the way).
    let mut ports = (40000..).filter(|&p| p != from.port());
    let mut upstream = |wait| {
        let port = ports.next().unwrap();
        connect(&p.pod, dst, Some(addr(PEER, port)), Some(MARK), true, wait)
    };

    let mut up = upstream(PATIENCE).expect("transparent connect to the app");
    let mut seen = String::new();
    up.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, PEER, "the application saw the client's address");
    // Carried back to the client, as ringway would.
    down.write_all(seen.as_bytes()).unwrap();
    drop(down);
    let mut got = String::new();
    client.read_to_string(&mut got).unwrap();
    assert_eq!(got, PEER);
    drop(up);

    // The policy rule is what brings the replies home.
    p.pod.ip(&[
        "-4",
        "rule",
        "del",
        "fwmark",
        "0x111/0xfff",
        "lookup",
        "100",
    ]);
    // Nothing can show that a reply will never come home; a connect that
    // works completes in a millisecond here, so one that has not in this
    // window is one that will not.
    const NO_REPLY_WINDOW: Duration = Duration::from_millis(1500);
    match upstream(NO_REPLY_WINDOW) {
        Ok(_) => panic!("without the fwmark rule the replies should leave the pod"),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
            "{e}"
        ),
    }
    // A re-run puts it back.
    p.rules(&[]);
    let mut up = upstream(PATIENCE).expect("transparent connect after re-run");
    let mut seen = String::new();
    up.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, PEER);
}
