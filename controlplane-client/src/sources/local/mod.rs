//! The local config source: ztunnel's LOCAL_XDS YAML, used as the embedded
//! default and for running without istiod.
//!
//! The YAML is read into private `Raw*` types that mirror the schema (camelCase,
//! unknown fields rejected) and whose leaf types parse and range-check values
//! inside serde, so a bad value is reported with its field path and line.
//! Cross-item rules (uniqueness, address clashes) are [`Snapshot::new`]'s.
//!
//! Uses only the [`model`](crate::model) and [`publish`](crate::publish).

pub mod dump;

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, EnumAccess, MapAccess, VariantAccess, Visitor};
use serde::Deserialize;

use crate::model::snapshot::{Snapshot, SnapshotError};
use crate::model::strings::name_within;
use crate::model::{
    intern, is_namespaced, or_str, ApplicationTunnel, ApplicationTunnelProtocol, Cidr, Clause,
    GatewayAddress, GatewayDestination, LbHealthPolicy, LbMode, LbScope, LoadBalancer, Locality,
    Match, NamespacedHostname, NetworkAddress, NetworkMode, Policy, PolicyAction, PolicyScope,
    PortMapping, Rule, Service, ServiceAccountMatch, Str, StringMatch, TunnelProtocol, Visibility,
    WeightedWaypoint, Workload, WorkloadStatus, WorkloadType, DEFAULT_HBONE_MTLS_PORT,
    DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN,
};
use crate::model::{IpFamilies, NetworkCidr};
use crate::publish::SnapshotPublisher;

/// `examples/local.yaml`, a documented loopback config for a developer
/// machine; built in so the binary can run with no config file at all.
pub const EXAMPLE_CONFIG: &str = include_str!("../../../../examples/local.yaml");

/// A config that can't be used. `Display` gives the whole story on one line,
/// starting with the origin (usually the file path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not valid YAML, or not the schema. `message` names the field path and
    /// ends with the position, e.g. `workloads[1].workloadIps[0]: invalid IP
    /// address "10.0.0.300" at line 14 column 7`.
    #[error("{origin}: {message}")]
    Parse {
        origin: String,
        message: String,
        line: Option<usize>,
        column: Option<usize>,
    },
    /// Well-formed but wrong, e.g. a duplicate uid. `item` names it, e.g.
    /// `workloads[2] (uid "x")`.
    #[error("{origin}: {item}: {message}")]
    Invalid {
        origin: String,
        item: String,
        message: String,
    },
}

impl ConfigError {
    fn invalid(origin: &str, item: String, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: origin.to_owned(),
            item,
            message: message.into(),
        }
    }
}

/// The items of a config, in file order (indices match the YAML lists).
pub type Parsed = (Vec<Workload>, Vec<Service>, Vec<Policy>);

/// Parses and checks each item. Uniqueness across items is checked by
/// [`load_snapshot`].
///
/// A YAML parser holds a document's every event before it hands out the
/// first value: ~20× the text (964 MiB for the 47 MiB of 100k workloads,
/// `scale-bench`). So a file laid out as block lists (one item per `- `
/// at the list's indentation, as ztunnel's and our examples are) is
/// parsed a batch of items at a time ([`parse_in_batches`]); anything else,
/// and any error, goes through the whole-document parse, which gives the
/// same items and reports errors with their line.
pub fn parse(text: &str, origin: &str) -> Result<Parsed, ConfigError> {
    match parse_in_batches(text, origin) {
        Some(parsed) => Ok(parsed),
        None => parse_whole(text, origin),
    }
}

/// The top-level lists, in [`RawConfig`]'s order.
const LISTS: [&str; 3] = ["workloads", "services", "policies"];

/// A batch is cut at the first item boundary past this much text: its
/// parser events take ~20× that, briefly.
const BATCH_BYTES: usize = 64 << 10;

/// Items of one list, cut into batches of whole items: (text, item count).
type Batches<'a> = Vec<(&'a str, usize)>;

/// Cuts `text` into batches of list items by reading only line starts, or
/// `None` if it is laid out any other way: the top level must be
/// comments, blank lines and the keys of [`LISTS`] (each at most once),
/// each key on its own line (`key:`, or `key: []`) followed by its block
/// list, whose items start with `- ` at one indentation, with every other
/// line of an item indented deeper. No tabs, directives or document
/// markers. Whatever this misjudges fails to parse as its batch (an alias
/// to an anchor in another batch, a quoted string cut in two) and the
/// caller falls back to the whole document.
fn split_lists(text: &str) -> Option<[Batches<'_>; 3]> {
    let mut lists: [Batches<'_>; 3] = Default::default();
    let mut seen = [false; 3];
    // The list being read: its index, its items' indentation once known,
    // where its current batch starts and how many items it has.
    let mut list: Option<usize> = None;
    let mut indent: Option<usize> = None;
    let (mut batch_start, mut batch_items) = (0, 0);
    fn close<'a>(
        lists: &mut [Batches<'a>; 3],
        text: &'a str,
        list: Option<usize>,
        (from, to): (usize, usize),
        items: usize,
    ) {
        if let (Some(k), true) = (list, items > 0) {
            lists[k].push((&text[from..to], items));
        }
    }
    let is_item = |t: &str| t == "-" || t.starts_with("- ");
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        let content = line.trim_end_matches(['\n', '\r']);
        let trimmed = content.trim_start_matches(' ');
        let col = content.len() - trimmed.len();
        if trimmed.starts_with('\t') {
            return None;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if col == 0 && !is_item(trimmed) {
            // A top-level key: ends the list being read.
            if list.is_some() && indent.is_none() {
                return None; // `key:` with no items (null)
            }
            close(&mut lists, text, list, (batch_start, start), batch_items);
            (list, indent, batch_items) = (None, None, 0);
            let (key, rest) = trimmed.split_once(':')?;
            let k = LISTS.iter().position(|l| *l == key)?;
            if std::mem::replace(&mut seen[k], true) {
                return None;
            }
            if !(rest.is_empty() || rest.starts_with(' ')) {
                return None;
            }
            let value = rest.split_once(" #").map_or(rest, |(v, _)| v).trim();
            match value {
                "" => list = Some(k),
                "[]" => {}
                _ => return None,
            }
            continue;
        }
        list?;
        match indent {
            None if is_item(trimmed) => {
                indent = Some(col);
                batch_start = start;
                batch_items = 1;
            }
            None => return None,
            Some(ind) if col < ind => return None,
            Some(ind) if col == ind => {
                if !is_item(trimmed) {
                    return None;
                }
                if start - batch_start >= BATCH_BYTES {
                    close(&mut lists, text, list, (batch_start, start), batch_items);
                    (batch_start, batch_items) = (start, 0);
                }
                batch_items += 1;
            }
            Some(_) => {} // inside the current item
        }
    }
    if list.is_some() && indent.is_none() {
        return None;
    }
    close(&mut lists, text, list, (batch_start, pos), batch_items);
    seen.contains(&true).then_some(lists)
}

/// Parses each batch of one list and converts its items to the model as
/// it goes, so that only one batch's parser events and raw items are ever
/// held. `None` on any error (the whole-document parse reports it).
fn parse_list<R, T>(
    batches: &[(&str, usize)],
    convert: impl Fn(R, usize) -> Result<T, ConfigError>,
) -> Option<Vec<T>>
where
    R: serde::de::DeserializeOwned,
{
    let mut items = Vec::with_capacity(batches.iter().map(|(_, n)| n).sum());
    for (text, n) in batches {
        let raw: Vec<R> = serde_norway::from_str(text).ok()?;
        if raw.len() != *n {
            return None;
        }
        for r in raw {
            let index = items.len();
            items.push(convert(r, index).ok()?);
        }
    }
    Some(items)
}

/// [`parse`]'s fast path: the items of a file laid out as block lists,
/// parsed a batch at a time; `None` when the layout is another one, or on
/// any error (so errors, and their order, are the whole-document parse's).
pub(crate) fn parse_in_batches(text: &str, origin: &str) -> Option<Parsed> {
    if !cut_reads_as_yaml(text) {
        return None;
    }
    let [workloads, services, policies] = split_lists(text)?;
    Some((
        parse_list(&workloads, |w: RawWorkload, i| w.into_model(i, origin))?,
        parse_list(&services, |s: RawService, i| s.into_model(i, origin))?,
        parse_list(&policies, |p: RawPolicy, i| p.into_model(i, origin))?,
    ))
}

/// Whether cutting `text` at `\n` sees the lines the YAML reader sees:
/// no line break the reader knows but the cut does not (a CR not before
/// LF, NEL, LS, PS), and no character the reader refuses, which fails the
/// whole document even in a comment no batch would hold. Both were found
/// by fuzzing, in comments the fast path skipped and the whole-document
/// parse refused.
fn cut_reads_as_yaml(text: &str) -> bool {
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let breaks = match c {
            '\r' => chars.peek() != Some(&'\n'),
            '\u{85}' | '\u{2028}' | '\u{2029}' => true,
            c => !yaml_readable(c),
        };
        if breaks {
            return false;
        }
    }
    true
}

/// The characters the YAML reader takes (YAML 1.1's printable set, as
/// libyaml checks it); any other fails the whole document.
fn yaml_readable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{A0}'..='\u{D7FF}')
        || matches!(c, '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// [`parse`] of the document as one value.
pub(crate) fn parse_whole(text: &str, origin: &str) -> Result<Parsed, ConfigError> {
    let raw: RawConfig = serde_norway::from_str(text).map_err(|e| {
        let location = e.location();
        let mut message = e.to_string();
        if let Some(l) = &location {
            // serde_norway leaves out "line 1 column 1"; keep every message uniform.
            let at = format!(" at line {} column {}", l.line(), l.column());
            if !message.ends_with(&at) {
                message.push_str(&at);
            }
        }
        ConfigError::Parse {
            origin: origin.to_owned(),
            message,
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
        }
    })?;
    let workloads = raw
        .workloads
        .into_iter()
        .enumerate()
        .map(|(i, w)| w.into_model(i, origin))
        .collect::<Result<_, _>>()?;
    let services = raw
        .services
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.into_model(i, origin))
        .collect::<Result<_, _>>()?;
    let policies = raw
        .policies
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.into_model(i, origin))
        .collect::<Result<_, _>>()?;
    Ok((workloads, services, policies))
}

/// [`parse`] plus the cross-item checks of [`Snapshot::new`], reported
/// against the YAML items.
pub fn load_snapshot(text: &str, origin: &str) -> Result<Snapshot, ConfigError> {
    snapshot_of(parse(text, origin)?, origin)
}

/// [`load_snapshot`] once the text is parsed.
pub(crate) fn snapshot_of(parsed: Parsed, origin: &str) -> Result<Snapshot, ConfigError> {
    let (workloads, services, policies) = parsed;
    let snapshot =
        Snapshot::new(workloads, services, policies).map_err(|e| snapshot_error(e, origin))?;
    super::warn_missing_policies(&snapshot, snapshot.workloads().map(|w| &**w), origin);
    Ok(snapshot)
}

fn snapshot_error(err: SnapshotError, origin: &str) -> ConfigError {
    let (item, message) = match err {
        SnapshotError::DuplicateWorkloadUid { uid, first, second } => (
            format!("workloads[{second}] (uid {uid:?})"),
            format!("duplicate uid, already used by workloads[{first}]"),
        ),
        SnapshotError::DuplicateServiceKey { key, first, second } => (
            format!("services[{second}] ({key:?})"),
            format!("duplicate namespace/hostname, already used by services[{first}]"),
        ),
        SnapshotError::DuplicatePolicyKey { key, first, second } => (
            format!("policies[{second}] ({key:?})"),
            format!("duplicate namespace/name, already used by policies[{first}]"),
        ),
        SnapshotError::DuplicateServiceVip {
            network,
            ip,
            first,
            first_key,
            second,
            second_key,
        } => (
            format!("services[{second}] ({second_key:?})"),
            format!(
                "VIP {ip} on network {network:?} is already used by {} ({first_key:?})",
                list_item("services", first)
            ),
        ),
    };
    ConfigError::invalid(origin, item, message)
}

/// "workloads[3]". `None` (an item already in the snapshot a delta applies
/// to) never comes from [`load_snapshot`], which builds from scratch.
fn list_item(list: &str, pos: Option<usize>) -> String {
    match pos {
        Some(i) => format!("{list}[{i}]"),
        None => format!("an existing item of {list}"),
    }
}

// ---------------------------------------------------------------------------
// File watching (control thread)
// ---------------------------------------------------------------------------

/// What one [`FileWatcher::poll`] did.
#[derive(Debug)]
pub enum PollOutcome {
    /// Same bytes as last time (or unreadable again with the same error).
    Unchanged,
    /// New content, and it was published under this version.
    Published(u64),
    /// New bytes, but the same config as the current snapshot (e.g. only
    /// comments changed); nothing published.
    Equivalent,
    /// New content that doesn't parse or validate; the last good snapshot
    /// stays.
    Rejected(ConfigError),
    /// The file can't be read; the last good snapshot stays.
    Unreadable(String),
}

/// A file's content, identified without keeping it: its length and
/// SHA-256. At 100k workloads the file is ~47 MB; the watcher used to keep
/// a copy of it to compare with, and to read it whole at every poll.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ContentDigest {
    len: u64,
    sha256: [u8; 32],
}

impl ContentDigest {
    pub fn of(bytes: &[u8]) -> ContentDigest {
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let mut sha256 = [0; 32];
        sha256.copy_from_slice(digest.as_ref());
        ContentDigest {
            len: bytes.len() as u64,
            sha256,
        }
    }

    /// Streams the file through the hash, 64 KiB at a time.
    pub fn of_file(path: &Path) -> std::io::Result<ContentDigest> {
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 64 << 10];
        let mut len = 0u64;
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    ctx.update(&buf[..n]);
                    len += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut sha256 = [0; 32];
        sha256.copy_from_slice(ctx.finish().as_ref());
        Ok(ContentDigest { len, sha256 })
    }
}

impl fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, sha256 ", self.len)?;
        self.sha256[..8]
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// What `stat` says of a file (following symlinks): any write changes the
/// ctime, whatever it does to the mtime, and a symlink swap the inode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileMeta {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileMeta {
    /// Whether this file was changed too recently for its metadata to
    /// vouch for its content: another write within the same timestamp tick
    /// would leave the ctime as it is ("racy" entries, as git calls them).
    fn racy(&self) -> bool {
        let ctime = std::time::UNIX_EPOCH
            + Duration::new(
                self.ctime.0.max(0) as u64,
                self.ctime.1.clamp(0, 999_999_999) as u32,
            );
        std::time::SystemTime::now()
            .duration_since(ctime)
            .map_or(true, |age| age < Duration::from_secs(1))
    }

    fn of(path: &Path) -> Option<FileMeta> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileMeta {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// Polls with unchanged metadata that may skip hashing the content, in a
/// row: a backstop, should a rewrite leave even the ctime alone (a clock
/// set back, say); it is still seen within this many polls.
const POLLS_TRUSTING_METADATA: u32 = 30;

/// Polls one file by content, so it follows ConfigMap symlink swaps, editors
/// that replace the file, and edits that keep the mtime. Content is
/// compared by [`ContentDigest`]: the file is hashed as it is read, and
/// read whole only when it changed. The hash is skipped while the file's
/// metadata (inode, size, mtime, ctime) stays what it was when last hashed,
/// unless the file had changed less than a second before that hash (a
/// second write in the same timestamp tick would not show), and for at
/// most [`POLLS_TRUSTING_METADATA`] polls in a row: at 100k workloads,
/// hashing the file every second took 7 % of a CPU.
pub struct FileWatcher {
    path: PathBuf,
    origin: String,
    publisher: SnapshotPublisher,
    /// Digest of the last bytes parsed, good or bad: a bad file is
    /// reported once, not at every poll.
    last_content: Option<ContentDigest>,
    /// The file's metadata when it was last hashed, and the polls since
    /// that relied on it.
    last_meta: Option<FileMeta>,
    polls_on_meta: u32,
    /// Last read error reported, for the same reason.
    last_read_error: Option<String>,
}

impl FileWatcher {
    pub fn new(path: PathBuf, publisher: SnapshotPublisher) -> FileWatcher {
        FileWatcher {
            origin: path.display().to_string(),
            path,
            publisher,
            last_content: None,
            last_meta: None,
            polls_on_meta: 0,
            last_read_error: None,
        }
    }

    /// A watcher for a file whose content (`loaded`) was already parsed and
    /// published: its first poll does not load it again.
    pub fn loaded(
        path: PathBuf,
        publisher: SnapshotPublisher,
        loaded: ContentDigest,
    ) -> FileWatcher {
        let mut watcher = FileWatcher::new(path, publisher);
        watcher.last_content = Some(loaded);
        watcher
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file's metadata is what it was when last hashed (and
    /// has not been trusted for too long).
    fn metadata_unchanged(&self) -> bool {
        self.last_meta.is_some()
            && self.last_read_error.is_none()
            && self.polls_on_meta < POLLS_TRUSTING_METADATA
            && FileMeta::of(&self.path) == self.last_meta
    }

    /// Whether a later poll would see new bytes. False before the first
    /// poll, which should not wait.
    fn content_differs(&self) -> bool {
        if self.last_content.is_none() && self.last_read_error.is_none() {
            return false;
        }
        if self.metadata_unchanged() {
            return false;
        }
        match ContentDigest::of_file(&self.path) {
            Ok(digest) => self.last_content != Some(digest),
            Err(_) => false,
        }
    }

    /// Logs a read error once; `Unchanged` if it was already reported.
    fn unreadable(&mut self, e: std::io::Error) -> PollOutcome {
        let message = format!("{}: cannot read config: {e}", self.origin);
        if self.last_read_error.as_deref() == Some(message.as_str()) {
            return PollOutcome::Unchanged;
        }
        tracing::error!("{message}; keeping the last good config");
        self.last_read_error = Some(message.clone());
        PollOutcome::Unreadable(message)
    }

    /// Reads the file and, if its content changed, parses and publishes it.
    /// Logs what it did; never panics on bad input.
    pub fn poll(&mut self) -> PollOutcome {
        if self.metadata_unchanged() {
            self.polls_on_meta += 1;
            return PollOutcome::Unchanged;
        }
        // Taken before the content: a change after this is a change of
        // metadata at the next poll (unless racy: then hash again).
        self.last_meta = FileMeta::of(&self.path).filter(|m| !m.racy());
        self.polls_on_meta = 0;
        // Hashed as it streams by: an unchanged file costs no copy of it.
        let digest = match ContentDigest::of_file(&self.path) {
            Ok(digest) => digest,
            Err(e) => return self.unreadable(e),
        };
        if self.last_read_error.take().is_some() {
            tracing::info!(path = %self.origin, "config file readable again");
        }
        if self.last_content == Some(digest) {
            return PollOutcome::Unchanged;
        }
        let read_at = std::time::Instant::now();
        let content = match std::fs::read(&self.path) {
            Ok(content) => content,
            Err(e) => return self.unreadable(e),
        };
        // What is remembered is what is parsed, should the file have
        // changed again in between.
        let digest = ContentDigest::of(&content);
        if self.last_content == Some(digest) {
            return PollOutcome::Unchanged;
        }
        let parsed = match std::str::from_utf8(&content) {
            Ok(text) => load_snapshot(text, &self.origin),
            Err(e) => Err(ConfigError::Parse {
                origin: self.origin.clone(),
                message: format!("not UTF-8: {e}"),
                line: None,
                column: None,
            }),
        };
        drop(content);
        self.last_content = Some(digest);
        match parsed {
            Ok(snapshot) => {
                if self.publisher.current().same_content(&snapshot) {
                    tracing::debug!(path = %self.origin, "config file changed, content equivalent");
                    return PollOutcome::Equivalent;
                }
                let (workloads, services, policies) = (
                    snapshot.workloads().len(),
                    snapshot.services().len(),
                    snapshot.policy_count(),
                );
                let version = self.publisher.publish(snapshot.received(read_at));
                tracing::info!(
                    path = %self.origin,
                    version,
                    workloads,
                    services,
                    policies,
                    "published local config"
                );
                PollOutcome::Published(version)
            }
            Err(e) => {
                tracing::error!("rejected config, keeping the last good one: {e}");
                PollOutcome::Rejected(e)
            }
        }
    }
}

/// Publishes `path` now and whenever its content changes, checking every
/// `interval`. Runs forever on the caller's tokio runtime (needs `time`);
/// abort the task to stop it. Reads are plain blocking reads of a local
/// file, fine on the control thread. `loaded`: the digest of content
/// already published from this file (at startup), which is then not
/// loaded a second time.
///
/// A change is re-read after a short pause before it is used, so a file
/// caught half-written (truncate-then-write editors) is not published.
pub async fn watch_file(
    path: PathBuf,
    interval: Duration,
    publisher: SnapshotPublisher,
    loaded: Option<ContentDigest>,
) {
    let settle = (interval / 4).min(Duration::from_millis(100));
    let mut watcher = match loaded {
        Some(digest) => FileWatcher::loaded(path, publisher, digest),
        None => FileWatcher::new(path, publisher),
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if watcher.content_differs() {
            tokio::time::sleep(settle).await;
        }
        watcher.poll();
    }
}

// ---------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    workloads: Vec<RawWorkload>,
    #[serde(default)]
    services: Vec<RawService>,
    #[serde(default)]
    policies: Vec<RawPolicy>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWorkload {
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    name: String,
    namespace: String,
    #[serde(default)]
    service_account: String,
    #[serde(default)]
    trust_domain: String,
    #[serde(default)]
    workload_ips: Vec<Ip>,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    network: String,
    #[serde(default)]
    protocol: Named<TunnelProtocol>,
    #[serde(default)]
    node: String,
    #[serde(default)]
    canonical_name: String,
    #[serde(default)]
    canonical_revision: String,
    #[serde(default)]
    workload_name: String,
    #[serde(default)]
    workload_type: Named<WorkloadType>,
    #[serde(default)]
    status: Named<WorkloadStatus>,
    #[serde(default)]
    cluster_id: String,
    #[serde(default)]
    authorization_policies: Vec<String>,
    #[serde(default)]
    services: ServicesMap,
    #[serde(default)]
    locality: Option<RawLocality>,
    #[serde(default)]
    network_mode: Named<NetworkMode>,
    #[serde(default = "one")]
    capacity: u32,
    #[serde(default)]
    waypoint: Option<RawGateway>,
    #[serde(default)]
    network_gateway: Option<RawGateway>,
    #[serde(default)]
    native_tunnel: bool,
    #[serde(default)]
    application_tunnel: Option<RawApplicationTunnel>,
}

fn one() -> u32 {
    1
}

impl RawWorkload {
    fn into_model(self, index: usize, origin: &str) -> Result<Workload, ConfigError> {
        // ztunnel lets the uid be omitted; derive a stable one from the name
        // so such configs keep working and still collide when duplicated.
        let uid = match self.uid {
            Some(uid) => uid,
            None if !self.name.is_empty() => {
                format!("{}/{}", self.namespace, self.name)
            }
            None => String::new(),
        };
        let item = format!("workloads[{index}] (uid {uid:?})");
        if uid.is_empty() {
            return Err(ConfigError::invalid(
                origin,
                item,
                "needs a uid (or a name to derive one from)",
            ));
        }
        if self.namespace.is_empty() {
            return Err(ConfigError::invalid(origin, item, "namespace is empty"));
        }
        for (i, key) in self.authorization_policies.iter().enumerate() {
            if !is_namespaced(key) {
                return Err(ConfigError::invalid(
                    origin,
                    item,
                    format!("authorizationPolicies[{i}]: {key:?} is not \"namespace/name\""),
                ));
            }
        }
        // Fields that repeat across workloads are interned (see
        // model::strings); uid and name are this workload's own.
        let uid = Str::from(uid);
        Ok(Workload {
            name: name_within(&uid, &self.name),
            uid,
            namespace: intern(&self.namespace),
            service_account: intern(or_str(&self.service_account, DEFAULT_SERVICE_ACCOUNT)),
            trust_domain: intern(or_str(&self.trust_domain, DEFAULT_TRUST_DOMAIN)),
            addresses: self.workload_ips.into_iter().map(|ip| ip.0).collect(),
            hostname: Str::from(self.hostname),
            network: intern(&self.network),
            protocol: self.protocol.0,
            node: intern(&self.node),
            canonical_name: intern(&self.canonical_name),
            canonical_revision: intern(&self.canonical_revision),
            workload_name: intern(&self.workload_name),
            workload_type: self.workload_type.0,
            status: self.status.0,
            cluster_id: intern(&self.cluster_id),
            authorization_policies: self
                .authorization_policies
                .iter()
                .map(|k| intern(k))
                .collect(),
            services: self
                .services
                .0
                .into_iter()
                .map(|(k, v)| (intern(&k), v))
                .collect(),
            locality: self.locality.map(|l| Locality {
                region: intern(&l.region),
                zone: intern(&l.zone),
                subzone: intern(&l.subzone),
            }),
            network_mode: self.network_mode.0,
            capacity: self.capacity,
            waypoint: self.waypoint.map(|g| Box::new(g.into_model())),
            network_gateway: self.network_gateway.map(|g| Box::new(g.into_model())),
            native_tunnel: self.native_tunnel,
            application_tunnel: self.application_tunnel.map(|t| ApplicationTunnel {
                protocol: t.protocol.0,
                port: t.port.map(|p| p.0),
            }),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLocality {
    #[serde(default)]
    region: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    subzone: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawApplicationTunnel {
    #[serde(default)]
    protocol: Named<ApplicationTunnelProtocol>,
    #[serde(default)]
    port: Option<Port>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawGateway {
    destination: GatewayDest,
    #[serde(default)]
    hbone_mtls_port: Option<Port>,
}

impl RawGateway {
    fn into_model(self) -> GatewayAddress {
        GatewayAddress {
            destination: self.destination.0,
            hbone_mtls_port: self
                .hbone_mtls_port
                .map_or(DEFAULT_HBONE_MTLS_PORT, |p| p.0),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawService {
    name: String,
    namespace: String,
    hostname: String,
    #[serde(default)]
    vips: Vec<Vip>,
    #[serde(default)]
    ports: PortMap<true>,
    #[serde(default)]
    subject_alt_names: Vec<String>,
    #[serde(default)]
    waypoint: Option<RawGateway>,
    #[serde(default)]
    load_balancer: Option<RawLoadBalancer>,
    #[serde(default)]
    canonical: bool,
    #[serde(default)]
    cidr_vips: Vec<RawCidrVip>,
    #[serde(default)]
    weighted_waypoints: Vec<RawWeightedWaypoint>,
    #[serde(default)]
    ip_families: Option<Named<IpFamilies>>,
    #[serde(default)]
    visibility: Named<Visibility>,
    /// What ztunnel's own dump writes (uid → port map, status, uid). Read
    /// for its shape and dropped: like ztunnel, ringway derives a
    /// service's endpoints from the workloads' `services` maps.
    #[serde(default)]
    #[allow(dead_code)]
    endpoints: BTreeMap<String, RawEndpoint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCidrVip {
    #[serde(default)]
    network: String,
    cidr: CidrDe,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWeightedWaypoint {
    destination: RawGateway,
    #[serde(default)]
    weight: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct RawEndpoint {
    workload_uid: String,
    #[serde(default)]
    port: PortMap<true>,
    #[serde(default)]
    status: Named<WorkloadStatus>,
}

impl RawService {
    fn into_model(self, index: usize, origin: &str) -> Result<Service, ConfigError> {
        let item = format!(
            "services[{index}] ({:?})",
            format!("{}/{}", self.namespace, self.hostname)
        );
        for (field, value) in [
            ("name", &self.name),
            ("namespace", &self.namespace),
            ("hostname", &self.hostname),
        ] {
            if value.is_empty() {
                return Err(ConfigError::invalid(
                    origin,
                    item,
                    format!("{field} is empty"),
                ));
            }
        }
        if self.namespace.contains('/') || self.hostname.contains('/') {
            return Err(ConfigError::invalid(
                origin,
                item,
                "namespace and hostname must not contain '/'",
            ));
        }
        Ok(Service {
            name: intern(&self.name),
            namespace: intern(&self.namespace),
            hostname: intern(&self.hostname),
            vips: self.vips.into_iter().map(|v| v.0).collect(),
            ports: self.ports.0,
            subject_alt_names: self.subject_alt_names.iter().map(|s| intern(s)).collect(),
            waypoint: self.waypoint.map(RawGateway::into_model),
            load_balancer: self.load_balancer.map(|lb| LoadBalancer {
                routing_preferences: lb.routing_preferences.into_iter().map(|s| s.0).collect(),
                mode: lb.mode.0,
                health_policy: lb.health_policy.0,
            }),
            canonical: self.canonical,
            cidr_vips: self
                .cidr_vips
                .into_iter()
                .map(|c| NetworkCidr {
                    network: intern(&c.network),
                    cidr: c.cidr.0,
                })
                .collect(),
            weighted_waypoints: self
                .weighted_waypoints
                .into_iter()
                .map(|w| WeightedWaypoint {
                    waypoint: w.destination.into_model(),
                    weight: w.weight,
                })
                .collect(),
            ip_families: self.ip_families.map(|f| f.0),
            visibility: self.visibility.0,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLoadBalancer {
    #[serde(default)]
    routing_preferences: Vec<Named<LbScope>>,
    #[serde(default)]
    mode: Named<LbMode>,
    #[serde(default)]
    health_policy: Named<LbHealthPolicy>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPolicy {
    name: String,
    namespace: String,
    scope: Named<PolicyScope>,
    action: Named<PolicyAction>,
    #[serde(default)]
    dry_run: bool,
    /// rules → clauses → matches, as in ztunnel's YAML.
    #[serde(default)]
    rules: Vec<Vec<Vec<RawMatch>>>,
}

impl RawPolicy {
    fn into_model(self, index: usize, origin: &str) -> Result<Policy, ConfigError> {
        let item = format!(
            "policies[{index}] ({:?})",
            format!("{}/{}", self.namespace, self.name)
        );
        for (field, value) in [("name", &self.name), ("namespace", &self.namespace)] {
            if value.is_empty() {
                return Err(ConfigError::invalid(
                    origin,
                    item,
                    format!("{field} is empty"),
                ));
            }
        }
        if self.namespace.contains('/') || self.name.contains('/') {
            return Err(ConfigError::invalid(
                origin,
                item,
                "namespace and name must not contain '/'",
            ));
        }
        Ok(Policy {
            name: self.name,
            namespace: self.namespace,
            scope: self.scope.0,
            action: self.action.0,
            dry_run: self.dry_run,
            rules: self
                .rules
                .into_iter()
                .map(|clauses| Rule {
                    clauses: clauses
                        .into_iter()
                        .map(|matches| Clause {
                            matches: matches.into_iter().map(RawMatch::into_model).collect(),
                        })
                        .collect(),
                })
                .collect(),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawMatch {
    #[serde(default)]
    namespaces: Vec<StringMatchDe>,
    #[serde(default)]
    not_namespaces: Vec<StringMatchDe>,
    #[serde(default)]
    principals: Vec<StringMatchDe>,
    #[serde(default)]
    not_principals: Vec<StringMatchDe>,
    #[serde(default)]
    service_accounts: Vec<RawServiceAccountMatch>,
    #[serde(default)]
    not_service_accounts: Vec<RawServiceAccountMatch>,
    #[serde(default)]
    source_ips: Vec<CidrDe>,
    #[serde(default)]
    not_source_ips: Vec<CidrDe>,
    #[serde(default)]
    destination_ips: Vec<CidrDe>,
    #[serde(default)]
    not_destination_ips: Vec<CidrDe>,
    #[serde(default)]
    destination_ports: Vec<Port>,
    #[serde(default)]
    not_destination_ports: Vec<Port>,
}

impl RawMatch {
    fn into_model(self) -> Match {
        fn strings(v: Vec<StringMatchDe>) -> Vec<StringMatch> {
            v.into_iter().map(|m| m.0).collect()
        }
        fn accounts(v: Vec<RawServiceAccountMatch>) -> Vec<ServiceAccountMatch> {
            v.into_iter()
                .map(|m| ServiceAccountMatch {
                    namespace: m.namespace,
                    service_account: m.service_account,
                })
                .collect()
        }
        fn cidrs(v: Vec<CidrDe>) -> Vec<Cidr> {
            v.into_iter().map(|c| c.0).collect()
        }
        fn ports(v: Vec<Port>) -> Vec<u16> {
            v.into_iter().map(|p| p.0).collect()
        }
        Match {
            namespaces: strings(self.namespaces),
            not_namespaces: strings(self.not_namespaces),
            principals: strings(self.principals),
            not_principals: strings(self.not_principals),
            service_accounts: accounts(self.service_accounts),
            not_service_accounts: accounts(self.not_service_accounts),
            source_ips: cidrs(self.source_ips),
            not_source_ips: cidrs(self.not_source_ips),
            destination_ips: cidrs(self.destination_ips),
            not_destination_ips: cidrs(self.not_destination_ips),
            destination_ports: ports(self.destination_ports),
            not_destination_ports: ports(self.not_destination_ports),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawServiceAccountMatch {
    namespace: String,
    service_account: String,
}

// Enums: the spellings ztunnel's YAML uses, plus the istio proto names
// (HBONE aside, ztunnel's are the proto names in PascalCase). Errors list
// only the ztunnel spellings.

/// A model enum read from a YAML string.
trait YamlEnum: Sized {
    /// The spellings listed when a value is not recognised.
    const EXPECTED: &'static [&'static str];
    fn from_name(name: &str) -> Option<Self>;
}

/// Deserializes a [`YamlEnum`]; `Default` gives the model's default.
#[derive(Default)]
struct Named<T>(T);

impl<'de, T: YamlEnum> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor<T>(PhantomData<T>);
        impl<T: YamlEnum> Visitor<'_> for NameVisitor<T> {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "one of {}", T::EXPECTED.join(", "))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Named<T>, E> {
                T::from_name(v)
                    .map(Named)
                    .ok_or_else(|| E::unknown_variant(v, T::EXPECTED))
            }
        }
        d.deserialize_str(NameVisitor(PhantomData))
    }
}

impl YamlEnum for TunnelProtocol {
    const EXPECTED: &'static [&'static str] = &["TCP", "HBONE"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "TCP" | "NONE" => Some(TunnelProtocol::None),
            "HBONE" => Some(TunnelProtocol::Hbone),
            _ => None,
        }
    }
}

impl YamlEnum for WorkloadType {
    const EXPECTED: &'static [&'static str] = &["Deployment", "CronJob", "Pod", "Job"];
    fn from_name(name: &str) -> Option<Self> {
        // ztunnel keeps this as free text, lowercased from the proto name.
        match name.to_ascii_lowercase().as_str() {
            "deployment" => Some(WorkloadType::Deployment),
            "cronjob" => Some(WorkloadType::CronJob),
            "pod" => Some(WorkloadType::Pod),
            "job" => Some(WorkloadType::Job),
            _ => None,
        }
    }
}

impl YamlEnum for WorkloadStatus {
    const EXPECTED: &'static [&'static str] = &["Healthy", "Unhealthy"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Healthy" | "HEALTHY" => Some(WorkloadStatus::Healthy),
            "Unhealthy" | "UNHEALTHY" => Some(WorkloadStatus::Unhealthy),
            _ => None,
        }
    }
}

impl YamlEnum for NetworkMode {
    const EXPECTED: &'static [&'static str] = &["Standard", "HostNetwork"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Standard" | "STANDARD" => Some(NetworkMode::Standard),
            "HostNetwork" | "HOST_NETWORK" => Some(NetworkMode::HostNetwork),
            _ => None,
        }
    }
}

impl YamlEnum for ApplicationTunnelProtocol {
    const EXPECTED: &'static [&'static str] = &["NONE", "PROXY"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "NONE" | "None" => Some(ApplicationTunnelProtocol::None),
            "PROXY" | "Proxy" => Some(ApplicationTunnelProtocol::Proxy),
            _ => None,
        }
    }
}

impl YamlEnum for LbScope {
    const EXPECTED: &'static [&'static str] =
        &["Region", "Zone", "Subzone", "Node", "Cluster", "Network"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Region" | "REGION" => Some(LbScope::Region),
            "Zone" | "ZONE" => Some(LbScope::Zone),
            "Subzone" | "SUBZONE" => Some(LbScope::Subzone),
            "Node" | "NODE" => Some(LbScope::Node),
            "Cluster" | "CLUSTER" => Some(LbScope::Cluster),
            "Network" | "NETWORK" => Some(LbScope::Network),
            _ => None,
        }
    }
}

impl YamlEnum for IpFamilies {
    const EXPECTED: &'static [&'static str] = &["IPv4", "IPv6", "Dual"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "IPv4" | "IPV4_ONLY" => Some(IpFamilies::Ipv4),
            "IPv6" | "IPV6_ONLY" => Some(IpFamilies::Ipv6),
            "Dual" | "DUAL" => Some(IpFamilies::Dual),
            _ => None,
        }
    }
}

impl YamlEnum for Visibility {
    const EXPECTED: &'static [&'static str] = &["Public", "Namespace"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Public" | "PUBLIC" => Some(Visibility::Public),
            "Namespace" | "NAMESPACE" => Some(Visibility::Namespace),
            _ => None,
        }
    }
}

impl YamlEnum for LbMode {
    const EXPECTED: &'static [&'static str] = &["Standard", "Strict", "Failover", "Passthrough"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Standard" | "UNSPECIFIED_MODE" => Some(LbMode::Standard),
            "Strict" | "STRICT" => Some(LbMode::Strict),
            "Failover" | "FAILOVER" => Some(LbMode::Failover),
            "Passthrough" | "PASSTHROUGH" => Some(LbMode::Passthrough),
            _ => None,
        }
    }
}

impl YamlEnum for LbHealthPolicy {
    const EXPECTED: &'static [&'static str] = &["OnlyHealthy", "AllowAll"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "OnlyHealthy" | "ONLY_HEALTHY" => Some(LbHealthPolicy::OnlyHealthy),
            "AllowAll" | "ALLOW_ALL" => Some(LbHealthPolicy::AllowAll),
            _ => None,
        }
    }
}

impl YamlEnum for PolicyScope {
    const EXPECTED: &'static [&'static str] = &["Global", "Namespace", "WorkloadSelector"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Global" | "GLOBAL" => Some(PolicyScope::Global),
            "Namespace" | "NAMESPACE" => Some(PolicyScope::Namespace),
            "WorkloadSelector" | "WORKLOAD_SELECTOR" => Some(PolicyScope::WorkloadSelector),
            _ => None,
        }
    }
}

impl YamlEnum for PolicyAction {
    const EXPECTED: &'static [&'static str] = &["Allow", "Deny"];
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "Allow" | "ALLOW" => Some(PolicyAction::Allow),
            "Deny" | "DENY" => Some(PolicyAction::Deny),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Leaf types. Each checks its value inside serde so errors carry the position.
// ---------------------------------------------------------------------------

/// A string scalar turned into `T` by `parse`, which returns the message.
fn deserialize_parsed<'de, D, T>(
    deserializer: D,
    expecting: &'static str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct ParsedVisitor<T> {
        expecting: &'static str,
        parse: fn(&str) -> Result<T, String>,
    }
    impl<T> Visitor<'_> for ParsedVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            (self.parse)(v).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(ParsedVisitor { expecting, parse })
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("invalid IP address {s:?}"))
}

struct Ip(IpAddr);

impl<'de> Deserialize<'de> for Ip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_parsed(d, "an IP address", parse_ip).map(Ip)
    }
}

/// "network/IP" or a bare IP (default network).
struct Vip(NetworkAddress);

impl<'de> Deserialize<'de> for Vip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_parsed(d, "\"network/IP\" or an IP address", |s| {
            let (network, ip) = s.split_once('/').unwrap_or(("", s));
            match ip.parse() {
                Ok(ip) => Ok(NetworkAddress {
                    network: intern(network),
                    ip,
                }),
                Err(_) => Err(format!(
                    "invalid VIP {s:?}: expected \"network/IP\" or an IP address"
                )),
            }
        })
        .map(Vip)
    }
}

/// "ns/hostname" (a service), "network/IP" or a bare IP.
struct GatewayDest(GatewayDestination);

impl<'de> Deserialize<'de> for GatewayDest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_parsed(d, "\"namespace/hostname\", \"network/IP\" or an IP", |s| {
            if let Ok(ip) = s.parse() {
                return Ok(GatewayDestination::Address(NetworkAddress {
                    network: Str::new(),
                    ip,
                }));
            }
            match s.split_once('/') {
                Some((network, ip)) if ip.parse::<IpAddr>().is_ok() => {
                    Ok(GatewayDestination::Address(NetworkAddress {
                        network: intern(network),
                        ip: ip.parse().expect("checked above"),
                    }))
                }
                Some((namespace, hostname)) if is_namespaced(s) => {
                    Ok(GatewayDestination::Hostname(NamespacedHostname {
                        namespace: intern(namespace),
                        hostname: intern(hostname),
                    }))
                }
                _ => Err(format!(
                    "invalid gateway destination {s:?}: expected \"namespace/hostname\", \
                     \"network/IP\" or an IP address"
                )),
            }
        })
        .map(GatewayDest)
    }
}

/// "IP/len" or a bare IP (a host prefix).
struct CidrDe(Cidr);

impl<'de> Deserialize<'de> for CidrDe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_parsed(d, "a CIDR such as \"10.0.0.0/8\"", |s| {
            let Some((addr, len)) = s.split_once('/') else {
                return parse_ip(s)
                    .map(Cidr::host)
                    .map_err(|_| format!("invalid CIDR {s:?}"));
            };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("invalid CIDR {s:?}: bad address"))?;
            let len: u8 = len
                .parse()
                .map_err(|_| format!("invalid CIDR {s:?}: bad prefix length"))?;
            Cidr::new(addr, len).ok_or_else(|| {
                let max = if addr.is_ipv4() { 32 } else { 128 };
                format!("invalid CIDR {s:?}: prefix length {len} exceeds {max}")
            })
        })
        .map(CidrDe)
    }
}

/// A port number, 1..=65535.
struct Port(u16);

fn deserialize_port<'de, D: Deserializer<'de>>(d: D, allow_zero: bool) -> Result<u16, D::Error> {
    struct PortVisitor(bool);
    impl Visitor<'_> for PortVisitor {
        type Value = u16;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a port number")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u16, E> {
            let low = if self.0 { 0 } else { 1 };
            match u16::try_from(v) {
                Ok(p) if u64::from(p) >= low => Ok(p),
                _ => Err(E::custom(format!(
                    "invalid port {v}: must be {low}..=65535"
                ))),
            }
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u16, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::custom(format!("invalid port {v}: must not be negative"))),
            }
        }
        /// A quoted port: JSON map keys are strings (ztunnel's own dumps
        /// write `{"80": 8080}`).
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u16, E> {
            match v.parse::<u64>() {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::custom(format!("invalid port {v:?}: not a number"))),
            }
        }
    }
    // `any`, not `u64`: so a negative number reaches `visit_i64` for a clear message.
    d.deserialize_any(PortVisitor(allow_zero))
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_port(d, false).map(Port)
    }
}

/// `{servicePort: targetPort}`, sorted by service port; a repeated service
/// port is an error rather than last-one-wins. `ZERO_TARGET` allows target
/// port 0, which on a service means "per endpoint".
#[derive(Default)]
struct PortMap<const ZERO_TARGET: bool>(Vec<PortMapping>);

impl<'de, const ZERO_TARGET: bool> Deserialize<'de> for PortMap<ZERO_TARGET> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// The value side of the map.
        struct Target<const ZERO: bool>(u16);
        impl<'de, const ZERO: bool> Deserialize<'de> for Target<ZERO> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                deserialize_port(d, ZERO).map(Target)
            }
        }

        struct PortMapVisitor<const ZERO: bool>;
        impl<'de, const ZERO: bool> Visitor<'de> for PortMapVisitor<ZERO> {
            type Value = PortMap<ZERO>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of servicePort: targetPort")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PortMap<ZERO>, A::Error> {
                let mut mappings: Vec<PortMapping> = Vec::new();
                while let Some(Port(service_port)) = map.next_key()? {
                    let Target::<ZERO>(target_port) = map.next_value()?;
                    if mappings.iter().any(|m| m.service_port == service_port) {
                        return Err(de::Error::custom(format!(
                            "duplicate service port {service_port}"
                        )));
                    }
                    mappings.push(PortMapping {
                        service_port,
                        target_port,
                    });
                }
                mappings.sort();
                Ok(PortMap(mappings))
            }
        }
        d.deserialize_map(PortMapVisitor::<ZERO_TARGET>)
    }
}

/// A workload's `services`: `"ns/hostname": {servicePort: targetPort}`.
#[derive(Default)]
struct ServicesMap(BTreeMap<String, Vec<PortMapping>>);

impl<'de> Deserialize<'de> for ServicesMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ServicesVisitor;
        impl<'de> Visitor<'de> for ServicesVisitor {
            type Value = ServicesMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of \"namespace/hostname\": {servicePort: targetPort}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServicesMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !is_namespaced(&key) {
                        return Err(de::Error::custom(format!(
                            "invalid service key {key:?}: expected \"namespace/hostname\""
                        )));
                    }
                    let ports: PortMap<false> = map.next_value()?;
                    if out.insert(key.clone(), ports.0).is_some() {
                        return Err(de::Error::custom(format!("duplicate service key {key:?}")));
                    }
                }
                Ok(ServicesMap(out))
            }
        }
        d.deserialize_map(ServicesVisitor)
    }
}

/// ztunnel's YAML writes these as tagged values (`!Exact foo`,
/// `!Presence []`); the map form (`{exact: foo}`, `{presence: {}}`) is
/// accepted too, in either capitalisation.
struct StringMatchDe(StringMatch);

const STRING_MATCH_KINDS: &[&str] = &["exact", "prefix", "suffix", "presence"];

enum StringMatchKind {
    Exact,
    Prefix,
    Suffix,
    Presence,
}

impl StringMatchKind {
    fn from_name<E: de::Error>(name: &str) -> Result<Self, E> {
        match name {
            "exact" | "Exact" => Ok(StringMatchKind::Exact),
            "prefix" | "Prefix" => Ok(StringMatchKind::Prefix),
            "suffix" | "Suffix" => Ok(StringMatchKind::Suffix),
            "presence" | "Presence" => Ok(StringMatchKind::Presence),
            _ => Err(E::unknown_variant(name, STRING_MATCH_KINDS)),
        }
    }

    fn build(self, value: String) -> StringMatch {
        match self {
            StringMatchKind::Exact => StringMatch::Exact(value),
            StringMatchKind::Prefix => StringMatch::Prefix(value),
            StringMatchKind::Suffix => StringMatch::Suffix(value),
            StringMatchKind::Presence => StringMatch::Presence,
        }
    }
}

/// The (ignored) value of `presence`: null, `{}` or `[]`.
struct Empty;

impl<'de> Deserialize<'de> for Empty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EmptyVisitor;
        impl<'de> Visitor<'de> for EmptyVisitor {
            type Value = Empty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("nothing (null, {} or [])")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Empty, E> {
                Ok(Empty)
            }
            fn visit_none<E: de::Error>(self) -> Result<Empty, E> {
                Ok(Empty)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Empty, A::Error> {
                match map.next_key::<de::IgnoredAny>()? {
                    None => Ok(Empty),
                    Some(_) => Err(de::Error::custom("presence takes no value")),
                }
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Empty, A::Error> {
                match seq.next_element::<de::IgnoredAny>()? {
                    None => Ok(Empty),
                    Some(_) => Err(de::Error::custom("presence takes no value")),
                }
            }
        }
        d.deserialize_any(EmptyVisitor)
    }
}

impl<'de> Deserialize<'de> for StringMatchDe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StringMatchVisitor;
        impl<'de> Visitor<'de> for StringMatchVisitor {
            type Value = StringMatchDe;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a string match ({exact: ..}, {prefix: ..}, {suffix: ..} or {presence: {}})",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringMatchDe, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(
                        "empty string match: expected one of exact, prefix, suffix, presence",
                    ));
                };
                let kind = StringMatchKind::from_name(&name)?;
                let value = match kind {
                    StringMatchKind::Presence => {
                        map.next_value::<Empty>()?;
                        String::new()
                    }
                    _ => map.next_value::<String>()?,
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "string match has both `{name}` and `{extra}`; use one"
                    )));
                }
                Ok(StringMatchDe(kind.build(value)))
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<StringMatchDe, A::Error> {
                let (name, variant) = data.variant::<String>()?;
                let kind = StringMatchKind::from_name(&name)?;
                let value = match kind {
                    StringMatchKind::Presence => {
                        variant.newtype_variant::<Empty>()?;
                        String::new()
                    }
                    _ => variant.newtype_variant::<String>()?,
                };
                Ok(StringMatchDe(kind.build(value)))
            }
        }
        d.deserialize_any(StringMatchVisitor)
    }
}

#[cfg(test)]
mod tests;
