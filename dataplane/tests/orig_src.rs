//! Original source IP (--orig-src): ringway B connects to the application
//! from the client's address, so what the application's accept (its
//! getpeername) reports is the client, not the node. Node B gets the
//! return-path routing from scripts/orig-src-rules.sh; without --orig-src
//! the application sees node B's own address.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::thread;

use common::nodes::{connect_from_client, Nodes, CLIENT_IP, SERVER_IP};

/// An application on node B at `port` that answers each connection with
/// the peer address its accept returned, then closes.
fn peer_reporter(nodes: &Nodes, port: u16) {
    nodes.b.enter(move || {
        let l = TcpListener::bind(format!("{SERVER_IP}:{port}")).unwrap();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let peer = s.peer_addr().unwrap();
                let _ = s.write_all(peer.ip().to_string().as_bytes());
            }
        });
    });
}

fn rules(action: &str, netns: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/orig-src-rules.sh");
    let out = Command::new("bash")
        .arg(script)
        .args([action, "--netns", netns])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "orig-src-rules.sh {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the application reported for one connection from the client,
/// through HBONE (captured on node A) or as plaintext straight to node B's
/// 15006 (a socket marked like ringway's own skips node A's capture).
fn peer_seen(nodes: &Nodes, dst: &str, plaintext: bool) -> String {
    let dst = dst.to_owned();
    nodes.a.enter(move || {
        let mut s: TcpStream = if plaintext {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_mark(0x539).unwrap();
            sock.connect(&dst.parse::<SocketAddr>().unwrap().into())
                .unwrap();
            sock.into()
        } else {
            connect_from_client(&dst).unwrap()
        };
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        got
    })
}

#[test]
fn the_application_sees_the_client_address_only_with_orig_src() {
    for (tag, orig_src) in [("osy", true), ("osn", false)] {
        let extra: &[&str] = if orig_src { &["--orig-src"] } else { &[] };
        let nodes = Nodes::new(tag, true, extra);
        if orig_src {
            rules("add", &nodes.b.name);
            // Idempotent: a second add replaces the first.
            rules("add", &nodes.b.name);
        }
        // Plaintext to 8090 on node B is captured to ringway B's 15006.
        nodes.b.nft(
            "table inet plain_in {
               chain pre { type nat hook prerouting priority -100; policy accept;
                 tcp dport 8090 redirect to :15006
               }
             }",
        );
        peer_reporter(&nodes, 8080);
        peer_reporter(&nodes, 8090);
        let want = if orig_src { CLIENT_IP } else { SERVER_IP };
        assert_eq!(
            peer_seen(&nodes, &format!("{SERVER_IP}:8080"), false),
            want,
            "HBONE, orig_src={orig_src}"
        );
        assert_eq!(
            peer_seen(&nodes, &format!("{SERVER_IP}:8090"), true),
            want,
            "plaintext, orig_src={orig_src}"
        );
        let logs = nodes.b().wait_access_logs(2);
        assert!(logs.iter().all(|l| l["error"].is_null()), "{logs:#?}");
        if orig_src {
            rules("del", &nodes.b.name);
            rules("del", &nodes.b.name);
        }
    }
}
