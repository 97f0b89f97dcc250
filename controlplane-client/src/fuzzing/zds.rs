//! ZDS: packets from the node agent (istio-cni) through the client's
//! request handling, as one connection receives them (and across
//! reconnects): bytes, descriptors and the kernel's truncation flag in,
//! handler calls and NACKs out. Held against a model of the protocol
//! written apart from it: which packet reaches which [`PodHandler`] call
//! (and which is refused before any), that `keep` is only honoured in the
//! replay after a connect, that `snapshot_sent` reconciles exactly the pods
//! replayed, once, and that a handler's refusal becomes the NACK.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::OnceLock;

use prost::Message;
use ringway_proto::zds::workload_request::Payload;
use ringway_proto::zds::{
    AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo, WorkloadRequest,
};

use super::Draw;
use crate::sources::zds::{handle, Packet, PodHandler, PodInfo};

/// Records the calls; refuses pods whose uid starts with `x`, and `keep`
/// of pods it never added.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
    known: HashSet<String>,
}

impl PodHandler for Recorder {
    fn add(&mut self, uid: &str, info: PodInfo, _netns: OwnedFd) -> Result<(), String> {
        self.calls
            .push(format!("add {uid} {}/{}", info.namespace, info.name));
        if uid.starts_with('x') {
            return Err("cannot start".into());
        }
        self.known.insert(uid.to_owned());
        Ok(())
    }

    fn keep(&mut self, uid: &str) -> Result<(), String> {
        self.calls.push(format!("keep {uid}"));
        match self.known.contains(uid) {
            true => Ok(()),
            false => Err(format!("unknown pod {uid}")),
        }
    }

    fn del(&mut self, uid: &str) -> Result<(), String> {
        self.calls.push(format!("del {uid}"));
        self.known.remove(uid);
        Ok(())
    }

    fn reconcile(&mut self, replayed: &HashSet<String>) {
        let mut r: Vec<&str> = replayed.iter().map(String::as_str).collect();
        r.sort_unstable();
        self.calls.push(format!("reconcile {}", r.join(",")));
    }
}

/// A descriptor to pass along, as `add`'s network namespace would be.
fn descriptor() -> OwnedFd {
    static NULL: OnceLock<File> = OnceLock::new();
    let null = NULL.get_or_init(|| File::open("/dev/null").expect("/dev/null"));
    OwnedFd::from(null.try_clone().expect("dup /dev/null"))
}

/// What the protocol says a packet does: the handler call it makes
/// (None: refused before any), given the replay state.
fn expected_call(
    bytes: &[u8],
    fds: usize,
    truncated: bool,
    replay: &mut Option<HashSet<String>>,
) -> Option<String> {
    if truncated {
        return None;
    }
    let payload = WorkloadRequest::decode(bytes).ok()?.payload?;
    match payload {
        Payload::Add(add) => {
            let info = add.workload_info?;
            if fds != 1 || add.uid.is_empty() {
                return None;
            }
            if let Some(seen) = replay {
                seen.insert(add.uid.clone());
            }
            Some(format!("add {} {}/{}", add.uid, info.namespace, info.name))
        }
        _ if fds != 0 => None,
        Payload::Keep(keep) => {
            let seen = replay.as_mut()?;
            seen.insert(keep.uid.clone());
            Some(format!("keep {}", keep.uid))
        }
        Payload::Del(del) => Some(format!("del {}", del.uid)),
        Payload::SnapshotSent(_) => {
            let seen = replay.take()?;
            let mut r: Vec<String> = seen.into_iter().collect();
            r.sort_unstable();
            Some(format!("reconcile {}", r.join(",")))
        }
    }
}

/// `data` as packets on the agent's connection. Each packet: a byte of
/// flags (low two bits: descriptors, 0-3; `0x0c` both set: truncated by
/// the kernel; `0x80`: the connection was re-established before it), two
/// bytes of length (at most the client's 1024), then the packet's bytes.
pub fn requests(data: &[u8]) {
    let mut d = Draw::new(data);
    let mut handler = Recorder::default();
    let mut replay: Option<HashSet<String>> = Some(HashSet::new());
    let mut model: Option<HashSet<String>> = Some(HashSet::new());
    while !d.is_empty() {
        let flags = d.byte();
        if flags & 0x80 != 0 {
            replay = Some(HashSet::new());
            model = Some(HashSet::new());
        }
        let fds = usize::from(flags & 3);
        let truncated = flags & 0x0c == 0x0c;
        let len = usize::from(d.u16() % 1025);
        let bytes = d.take(len).to_vec();
        let want = expected_call(&bytes, fds, truncated, &mut model);
        let before = handler.calls.len();
        let packet = Packet {
            bytes,
            fds: (0..fds).map(|_| descriptor()).collect(),
            truncated,
        };
        let got = handle(packet, &mut handler, &mut replay);
        let call = handler.calls.get(before).cloned();
        assert!(
            handler.calls.len() <= before + 1,
            "one packet, one call at most"
        );
        assert_eq!(call, want, "the call a packet makes");
        match (&call, &got) {
            (None, Err(why)) => assert!(!why.is_empty(), "a NACK says why"),
            (None, Ok(())) => panic!("acknowledged without reaching the handler"),
            (Some(c), Ok(())) => assert!(!refused_by_handler(c, &handler)),
            (Some(c), Err(_)) => assert!(refused_by_handler(c, &handler), "{c}: NACK"),
        }
        assert_eq!(replay.is_some(), model.is_some(), "in the replay or not");
    }
}

/// Whether the recorder refused `call` (so the packet must be NACKed).
fn refused_by_handler(call: &str, handler: &Recorder) -> bool {
    if let Some(rest) = call.strip_prefix("add ") {
        return rest.starts_with('x');
    }
    if let Some(uid) = call.strip_prefix("keep ") {
        return !handler.known.contains(uid);
    }
    false
}

fn packet(flags: u8, payload: Payload) -> Vec<u8> {
    let bytes = WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec();
    let mut out = vec![flags];
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend(bytes);
    out
}

fn add(uid: &str) -> Payload {
    Payload::Add(AddWorkload {
        uid: uid.into(),
        workload_info: Some(WorkloadInfo {
            name: "pod".into(),
            namespace: "ns1".into(),
            service_account: "sa".into(),
        }),
    })
}

/// Seeds: what istio-cni sends: pods added with their namespace, the
/// replay after a reconnect (`keep`, `snapshot_sent`), deletions, and the
/// confused-agent cases the tests cover (no descriptor, a second
/// `snapshot_sent`, `keep` after the replay).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let keep = |uid: &str| Payload::Keep(KeepWorkload { uid: uid.into() });
    let del = |uid: &str| Payload::Del(DelWorkload { uid: uid.into() });
    let sent = || Payload::SnapshotSent(SnapshotSent {});
    let sessions: Vec<(&str, Vec<Vec<u8>>)> = vec![
        (
            "startup",
            vec![
                packet(1, add("u1")),
                packet(1, add("u2")),
                packet(0, sent()),
            ],
        ),
        (
            "reconnect-replay",
            vec![
                packet(1, add("u1")),
                packet(0, sent()),
                packet(0x80, keep("u1")),
                packet(1, add("u3")),
                packet(0, sent()),
                packet(0, del("u1")),
            ],
        ),
        (
            "confused-agent",
            vec![
                packet(0, add("u1")),
                packet(2, add("u2")),
                packet(1, del("u2")),
                packet(1, add("xfail")),
                packet(0, sent()),
                packet(0, sent()),
                packet(0, keep("u1")),
                packet(0x0c, del("u1")),
            ],
        ),
    ];
    sessions
        .into_iter()
        .map(|(name, packets)| (format!("seed-{name}"), packets.concat()))
        .collect()
}
