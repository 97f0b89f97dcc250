//! Istio L4 authorization as ztunnel enforces it: which policies apply to a
//! destination workload, and whether they let a connection in.
//!
//! No I/O here. Policies are compiled once per version on the control
//! thread ([`CompiledPolicy`]); the snapshot indexes them; a core asks
//! [`authorize`] per connection, which allocates nothing and takes no lock.
//! [`reference`] is the same decision written as plainly as possible, for
//! tests and benchmarks to hold the compiled one against.
//!
//! Semantics (Istio's, as ztunnel implements them):
//! - **Selection**: the destination workload's namespace's NAMESPACE-scope
//!   policies, then the GLOBAL ones (istiod puts them in its root
//!   namespace), then the names in the workload's `authorization_policies`
//!   (unknown names are skipped).
//! - **Order**: dry-run DENY matches are reported; any DENY match denies;
//!   dry-run ALLOW matches are reported; with no ALLOW policy the
//!   connection is allowed; an ALLOW match allows; otherwise it is denied.
//! - **Matching**: rules OR, clauses AND, matches OR, fields AND; a
//!   positive list needs one hit, a `not_` list none. A policy without
//!   rules never matches; a `Match` with every field empty never matches; a
//!   clause with no matches always holds.
//! - **Fields**: source and destination IPs against CIDRs, the destination
//!   port (the application's, not 15008), and the peer's identity:
//!   principal "td/ns/NS/sa/SA" (`spiffe://` stripped), its namespace and
//!   (namespace, service account). A plaintext connection has no identity:
//!   no principal or service-account entry matches it (so
//!   `not_principals: [presence]`, istiod's STRICT mTLS policy, denies it),
//!   and its namespace is "".
//! - **Unreadable policies** (a resource the config source could not
//!   convert) deny every connection they apply to until a good version
//!   arrives: they never widen access.

mod compile;
mod facts;
mod prefilter;
pub mod reference;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::model::identity::Identity;
use crate::model::{PolicyAction, Str};

pub use compile::CompiledPolicy;
use facts::Facts;
use prefilter::Prefilter;

/// What the policies see of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    /// The peer's address (for HBONE, the tunnel's TCP peer).
    pub src: IpAddr,
    /// The destination workload's address and the application port.
    pub dst: SocketAddr,
    /// The mTLS peer's identity; None for plaintext.
    pub peer: Option<&'a Identity>,
}

impl Conn<'_> {
    /// IPv4-mapped IPv6 addresses (from dual-stack sockets) as IPv4, so
    /// IPv4 rules apply to them.
    fn canonical_ip(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        }
    }

    fn facts(&self) -> Facts<'_> {
        Facts::new(
            Self::canonical_ip(self.src),
            Self::canonical_ip(self.dst.ip()),
            self.dst.port(),
            self.peer,
        )
    }
}

/// One policy in an indexed list (a namespace's, or the global ones): what
/// a decision needs to skip it (action, dry run, prefilter) is kept inline,
/// so scanning a list reads one contiguous array and touches only the
/// policies that may match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    action: PolicyAction,
    dry_run: bool,
    filter: Prefilter,
    policy: Arc<CompiledPolicy>,
}

impl Listed {
    pub fn new(policy: Arc<CompiledPolicy>) -> Listed {
        Listed {
            action: policy.action(),
            dry_run: policy.dry_run(),
            filter: *policy.filter(),
            policy,
        }
    }

    pub fn policy(&self) -> &Arc<CompiledPolicy> {
        &self.policy
    }
}

/// A selected policy as a decision sees it.
#[derive(Clone, Copy)]
struct Entry<'s> {
    action: PolicyAction,
    dry_run: bool,
    filter: &'s Prefilter,
    policy: &'s CompiledPolicy,
}

impl<'s> Entry<'s> {
    fn listed(l: &'s Listed) -> Self {
        Entry {
            action: l.action,
            dry_run: l.dry_run,
            filter: &l.filter,
            policy: &l.policy,
        }
    }

    fn named(p: &'s CompiledPolicy) -> Self {
        Entry {
            action: p.action(),
            dry_run: p.dry_run(),
            filter: p.filter(),
            policy: p,
        }
    }

    #[inline]
    fn matches(&self, facts: &Facts<'_>) -> bool {
        self.filter.admits(facts) && self.policy.matches(facts)
    }
}

/// The policies that apply to one destination workload, as the snapshot
/// hands them over: two indexed lists, each split by action, and the
/// workload's own names.
pub struct Selected<'s> {
    /// The workload's namespace's NAMESPACE-scope policies.
    pub namespace: ByAction<'s>,
    /// The GLOBAL-scope policies.
    pub global: ByAction<'s>,
    /// The workload's `authorization_policies` ("ns/name").
    pub named: &'s [Str],
    /// Where the named policies are looked up.
    pub table: &'s dyn PolicyTable,
}

/// One indexed list split by action (each part in the list's order): the
/// DENY pass and the ALLOW pass each read only their own part.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByAction<'s> {
    pub deny: &'s [Listed],
    pub allow: &'s [Listed],
}

/// Policies by key ("ns/name"): the snapshot's policy table.
pub trait PolicyTable {
    /// None skips the name: it is unknown (not sent yet, or removed).
    fn get(&self, key: &str) -> Option<&Arc<CompiledPolicy>>;
}

/// A plain list is a (linearly searched) table: for tests and tools.
impl PolicyTable for Vec<Arc<CompiledPolicy>> {
    fn get(&self, key: &str) -> Option<&Arc<CompiledPolicy>> {
        self.iter().find(|p| p.key() == key)
    }
}

impl<'s> Selected<'s> {
    /// The selected policies with `action`, in selection order.
    fn iter(&self, action: PolicyAction) -> impl Iterator<Item = Entry<'s>> + '_ {
        let table = self.table;
        let part = |lists: ByAction<'s>| match action {
            PolicyAction::Deny => lists.deny,
            PolicyAction::Allow => lists.allow,
        };
        part(self.namespace)
            .iter()
            .chain(part(self.global))
            .map(Entry::listed)
            .chain(
                self.named
                    .iter()
                    .filter_map(move |k| table.get(k).map(|p| Entry::named(p)))
                    .filter(move |e| e.action == action),
            )
    }
}

/// The outcome of [`authorize`]. Borrowed from the snapshot the policies
/// came from, so it can name them without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'s> {
    /// No ALLOW policy applies (and no DENY matched).
    AllowedNoPolicies,
    /// This ALLOW policy matched.
    AllowedBy(&'s CompiledPolicy),
    /// This DENY policy matched.
    DeniedBy(&'s CompiledPolicy),
    /// This policy could not be read by the config source; it denies
    /// until a good version arrives.
    DeniedUnreadable(&'s CompiledPolicy),
    /// ALLOW policies apply and none matched.
    NotAllowed,
}

impl Verdict<'_> {
    pub fn allowed(&self) -> bool {
        matches!(self, Verdict::AllowedNoPolicies | Verdict::AllowedBy(_))
    }

    /// The deciding policy's key, if one decided.
    pub fn policy(&self) -> Option<&str> {
        match self {
            Verdict::AllowedBy(p) | Verdict::DeniedBy(p) | Verdict::DeniedUnreadable(p) => {
                Some(p.key())
            }
            Verdict::AllowedNoPolicies | Verdict::NotAllowed => None,
        }
    }
}

/// For the access log: `explicitly denied by ns/name`, `allow policies
/// exist, but none allowed`, ...
impl fmt::Display for Verdict<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::AllowedNoPolicies => f.write_str("no allow policies, allowed"),
            Verdict::AllowedBy(p) => write!(f, "allowed by {}", p.key()),
            Verdict::DeniedBy(p) => write!(f, "explicitly denied by {}", p.key()),
            Verdict::DeniedUnreadable(p) => write!(
                f,
                "denied: policy {} could not be read ({}); denying until a good version arrives",
                p.key(),
                p.unreadable_reason().unwrap_or("unknown error")
            ),
            Verdict::NotAllowed => f.write_str("allow policies exist, but none allowed"),
        }
    }
}

/// What dry-run policies would have done, reported while deciding (they
/// never change the verdict).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun<'s> {
    /// This dry-run DENY policy matched (would have denied).
    DenyMatch(&'s CompiledPolicy),
    /// This dry-run ALLOW policy matched.
    AllowMatch(&'s CompiledPolicy),
    /// Only dry-run ALLOW policies apply, and none matched (they would
    /// have denied).
    NoAllowMatch,
}

impl<'s> DryRun<'s> {
    /// What happened, in ztunnel's words.
    pub fn message(&self) -> &'static str {
        match self {
            DryRun::DenyMatch(_) => "dry-run: deny policy match",
            DryRun::AllowMatch(_) => "dry-run: allow policy match",
            DryRun::NoAllowMatch => "dry-run: no allow policies match",
        }
    }

    /// The policy concerned, if one is.
    pub fn policy(&self) -> Option<&'s CompiledPolicy> {
        match self {
            DryRun::DenyMatch(p) | DryRun::AllowMatch(p) => Some(p),
            DryRun::NoAllowMatch => None,
        }
    }
}

/// The message, then the policy's key.
impl fmt::Display for DryRun<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())?;
        match self.policy() {
            Some(p) => write!(f, " {}", p.key()),
            None => Ok(()),
        }
    }
}

/// Decides `conn` against the `policies` of its destination workload,
/// reporting dry-run outcomes to `dry_run` as they are found.
pub fn authorize<'s>(
    policies: &Selected<'s>,
    conn: &Conn<'_>,
    dry_run: &mut dyn FnMut(DryRun<'s>),
) -> Verdict<'s> {
    let facts = conn.facts();
    // DENY first. After a denial only dry-run policies are still looked at
    // (they are all reported).
    let mut denied = None;
    for e in policies.iter(PolicyAction::Deny) {
        if denied.is_some() && !e.dry_run {
            continue;
        }
        if !e.matches(&facts) {
            continue;
        }
        let p = e.policy;
        if e.dry_run {
            dry_run(DryRun::DenyMatch(p));
        } else if p.unreadable_reason().is_some() {
            denied = Some(Verdict::DeniedUnreadable(p));
        } else {
            denied = Some(Verdict::DeniedBy(p));
        }
    }
    if let Some(verdict) = denied {
        return verdict;
    }
    let (mut allow_policies, mut allowed) = (false, None);
    let (mut dry_allow_policies, mut dry_allow_matched) = (false, false);
    for e in policies.iter(PolicyAction::Allow) {
        if e.dry_run {
            dry_allow_policies = true;
            if e.matches(&facts) {
                dry_allow_matched = true;
                dry_run(DryRun::AllowMatch(e.policy));
            }
        } else {
            // Counts as an ALLOW policy even when it cannot match.
            allow_policies = true;
            if allowed.is_none() && e.matches(&facts) {
                allowed = Some(e.policy);
            }
        }
    }
    if dry_allow_policies && !dry_allow_matched && !allow_policies {
        dry_run(DryRun::NoAllowMatch);
    }
    match allowed {
        Some(p) => Verdict::AllowedBy(p),
        None if !allow_policies => Verdict::AllowedNoPolicies,
        None => Verdict::NotAllowed,
    }
}
