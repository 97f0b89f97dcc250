//! The compiled form of a policy: what the cores evaluate.
//!
//! Compiling happens once per policy version, on the control thread, when
//! a snapshot takes the policy in. It keeps only what can ever match, in
//! the order that fails fastest: ports and addresses (integer compares)
//! before namespaces and principals (string compares). Evaluating touches
//! no allocator, no lock and no reference count.

use std::net::IpAddr;
use std::sync::Arc;

use crate::model::identity::Identity;
use crate::model::{
    Cidr, Match, Policy, PolicyAction, PolicyScope, ServiceAccountMatch, StringMatch,
    UnreadablePolicy,
};

/// One policy, ready to evaluate. Built by [`CompiledPolicy::compile`] from a
/// valid [`Policy`], or by [`CompiledPolicy::unreadable`] for one the config
/// source could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    key: Arc<str>,
    namespace_len: usize,
    scope: PolicyScope,
    action: PolicyAction,
    dry_run: bool,
    body: Body,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    /// Any rule matching makes the policy match; none never matches.
    Rules(Box<[Rule]>),
    /// The config source could not turn the resource into a policy. It
    /// matches every connection and always denies, whatever action it
    /// declared: an unreadable ALLOW must not allow, and an unreadable DENY
    /// must not stop denying.
    Unreadable(Box<str>),
}

/// All clauses must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    clauses: Box<[Clause]>,
}

/// Any matcher holding is enough. A clause that had no matches at all
/// holds; one whose matches were all empty (which never match) is kept
/// with no matchers, so it never holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Clause {
    Always,
    Any(Box<[Matcher]>),
}

/// One `Match`: every check must hold; cheapest first.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Matcher {
    checks: Box<[Check]>,
}

/// One field of a `Match` (or its `not_` form): holds when some entry
/// matches (or, negated, when none does).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    negate: bool,
    field: Field,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    DestinationPorts(Box<[u16]>),
    DestinationIps(Box<[Prefix]>),
    SourceIps(Box<[Prefix]>),
    Namespaces(Box<[Pattern]>),
    ServiceAccounts(Box<[(Box<str>, Box<str>)]>),
    Principals(Box<[Pattern]>),
}

/// An IP prefix as two 128-bit words; IPv4 keeps its own family so a v4
/// prefix never matches a v6 address (and the reverse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    v4: bool,
    network: u128,
    mask: u128,
}

impl Prefix {
    fn new(cidr: &Cidr) -> Prefix {
        let (v4, bits, width) = ip_bits(cidr.addr);
        let len = u32::from(cidr.prefix_len).min(width);
        let mask = if len == 0 {
            0
        } else {
            (u128::MAX << (128 - len)) >> (128 - width)
        };
        Prefix {
            v4,
            network: bits & mask,
            mask,
        }
    }

    #[inline]
    fn contains(&self, ip: Ip) -> bool {
        self.v4 == ip.v4 && ip.bits & self.mask == self.network
    }
}

/// An address reduced to what [`Prefix::contains`] compares.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ip {
    v4: bool,
    bits: u128,
}

impl Ip {
    pub(super) fn new(ip: IpAddr) -> Ip {
        let (v4, bits, _) = ip_bits(ip);
        Ip { v4, bits }
    }
}

/// (is IPv4, the address right-aligned in 128 bits, its width).
fn ip_bits(ip: IpAddr) -> (bool, u128, u32) {
    match ip {
        IpAddr::V4(v4) => (true, u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (false, u128::from(v6), 128),
    }
}

/// A string match, checked against a value made of parts (a principal is
/// "td" "/ns/" "ns" "/sa/" "sa": matching it part by part means never
/// building the string).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(Box<str>),
    Prefix(Box<str>),
    Suffix(Box<str>),
    /// Any non-empty value.
    Presence,
}

impl Pattern {
    fn new(m: &StringMatch) -> Pattern {
        match m {
            StringMatch::Exact(s) => Pattern::Exact(s.as_str().into()),
            StringMatch::Prefix(s) => Pattern::Prefix(s.as_str().into()),
            StringMatch::Suffix(s) => Pattern::Suffix(s.as_str().into()),
            StringMatch::Presence => Pattern::Presence,
        }
    }

    #[inline]
    fn matches(&self, parts: &[&str]) -> bool {
        match self {
            Pattern::Exact(p) => {
                parts.iter().map(|s| s.len()).sum::<usize>() == p.len()
                    && parts_start_with(parts, p.as_bytes())
            }
            Pattern::Prefix(p) => parts_start_with(parts, p.as_bytes()),
            Pattern::Suffix(p) => parts_end_with(parts, p.as_bytes()),
            Pattern::Presence => parts.iter().any(|s| !s.is_empty()),
        }
    }
}

/// Whether the concatenation of `parts` starts with `pat`.
fn parts_start_with(parts: &[&str], mut pat: &[u8]) -> bool {
    for part in parts {
        let part = part.as_bytes();
        if pat.len() <= part.len() {
            return part.starts_with(pat);
        }
        if !pat.starts_with(part) {
            return false;
        }
        pat = &pat[part.len()..];
    }
    pat.is_empty()
}

/// Whether the concatenation of `parts` ends with `pat`.
fn parts_end_with(parts: &[&str], mut pat: &[u8]) -> bool {
    for part in parts.iter().rev() {
        let part = part.as_bytes();
        if pat.len() <= part.len() {
            return part.ends_with(pat);
        }
        if !pat.ends_with(part) {
            return false;
        }
        pat = &pat[..pat.len() - part.len()];
    }
    pat.is_empty()
}

/// What policies look at in a connection, prepared once per decision.
pub(super) struct Facts<'a> {
    pub(super) src: Ip,
    pub(super) dst: Ip,
    pub(super) port: u16,
    /// The peer's identity; None for plaintext.
    pub(super) peer: Option<&'a Identity>,
}

impl Facts<'_> {
    /// The principal as parts: "td/ns/NS/sa/SA" (`spiffe://` stripped).
    #[inline]
    fn principal(id: &Identity) -> [&str; 5] {
        [
            &id.trust_domain,
            "/ns/",
            &id.namespace,
            "/sa/",
            &id.service_account,
        ]
    }
}

impl Check {
    #[inline]
    fn holds(&self, f: &Facts<'_>) -> bool {
        let any = match &self.field {
            Field::DestinationPorts(ports) => ports.contains(&f.port),
            Field::DestinationIps(nets) => nets.iter().any(|n| n.contains(f.dst)),
            Field::SourceIps(nets) => nets.iter().any(|n| n.contains(f.src)),
            // Without an identity the namespace is "" (so an empty exact,
            // prefix or suffix still matches, as in ztunnel).
            Field::Namespaces(pats) => {
                let ns = f.peer.map_or("", |id| id.namespace.as_str());
                pats.iter().any(|p| p.matches(&[ns]))
            }
            Field::ServiceAccounts(accounts) => f.peer.is_some_and(|id| {
                accounts
                    .iter()
                    .any(|(ns, sa)| **ns == id.namespace && **sa == id.service_account)
            }),
            // Without an identity no principal pattern matches, not even a
            // prefix "" (ztunnel requires the spiffe:// it strips).
            Field::Principals(pats) => f.peer.is_some_and(|id| {
                let parts = Facts::principal(id);
                pats.iter().any(|p| p.matches(&parts))
            }),
        };
        any != self.negate
    }
}

impl Matcher {
    /// None for a `Match` with every field empty: it never matches.
    fn new(m: &Match) -> Option<Matcher> {
        let mut checks = Vec::new();
        let mut add = |negate: bool, field: Option<Field>| {
            if let Some(field) = field {
                checks.push(Check { negate, field });
            }
        };
        fn ports(v: &[u16]) -> Option<Field> {
            (!v.is_empty()).then(|| {
                let mut v = v.to_vec();
                v.sort_unstable();
                v.dedup();
                Field::DestinationPorts(v.into())
            })
        }
        fn prefixes(v: &[Cidr], field: fn(Box<[Prefix]>) -> Field) -> Option<Field> {
            (!v.is_empty()).then(|| field(v.iter().map(Prefix::new).collect()))
        }
        fn patterns(v: &[StringMatch], field: fn(Box<[Pattern]>) -> Field) -> Option<Field> {
            (!v.is_empty()).then(|| field(v.iter().map(Pattern::new).collect()))
        }
        fn accounts(v: &[ServiceAccountMatch]) -> Option<Field> {
            (!v.is_empty()).then(|| {
                Field::ServiceAccounts(
                    v.iter()
                        .map(|a| {
                            (
                                a.namespace.as_str().into(),
                                a.service_account.as_str().into(),
                            )
                        })
                        .collect(),
                )
            })
        }
        add(false, ports(&m.destination_ports));
        add(true, ports(&m.not_destination_ports));
        add(false, prefixes(&m.destination_ips, Field::DestinationIps));
        add(
            true,
            prefixes(&m.not_destination_ips, Field::DestinationIps),
        );
        add(false, prefixes(&m.source_ips, Field::SourceIps));
        add(true, prefixes(&m.not_source_ips, Field::SourceIps));
        add(false, patterns(&m.namespaces, Field::Namespaces));
        add(true, patterns(&m.not_namespaces, Field::Namespaces));
        add(false, accounts(&m.service_accounts));
        add(true, accounts(&m.not_service_accounts));
        add(false, patterns(&m.principals, Field::Principals));
        add(true, patterns(&m.not_principals, Field::Principals));
        if checks.is_empty() {
            return None;
        }
        // Cheapest field first; stable, so a field's positive list stays
        // before its negative one.
        checks.sort_by_key(|c| c.field.rank());
        Some(Matcher {
            checks: checks.into(),
        })
    }

    #[inline]
    fn holds(&self, f: &Facts<'_>) -> bool {
        self.checks.iter().all(|c| c.holds(f))
    }
}

impl Field {
    /// Evaluation order: integer compares before string compares.
    fn rank(&self) -> u8 {
        match self {
            Field::DestinationPorts(_) => 0,
            Field::DestinationIps(_) => 1,
            Field::SourceIps(_) => 2,
            Field::Namespaces(_) => 3,
            Field::ServiceAccounts(_) => 4,
            Field::Principals(_) => 5,
        }
    }
}

impl CompiledPolicy {
    /// Compiles a valid policy.
    pub fn compile(policy: &Policy) -> CompiledPolicy {
        let rules = policy
            .rules
            .iter()
            .map(|rule| Rule {
                clauses: rule
                    .clauses
                    .iter()
                    .map(|clause| {
                        if clause.matches.is_empty() {
                            Clause::Always
                        } else {
                            Clause::Any(clause.matches.iter().filter_map(Matcher::new).collect())
                        }
                    })
                    .collect(),
            })
            .collect();
        CompiledPolicy {
            key: Arc::from(policy.key()),
            namespace_len: policy.namespace.len(),
            scope: policy.scope,
            action: policy.action,
            dry_run: policy.dry_run,
            body: Body::Rules(rules),
        }
    }

    /// A policy the config source could not read. It denies every
    /// connection it is evaluated for (unless it was a dry run), and is
    /// indexed under its namespace when its scope is unknown.
    pub fn unreadable(p: &UnreadablePolicy) -> CompiledPolicy {
        CompiledPolicy {
            key: Arc::from(p.key()),
            namespace_len: p.namespace.len(),
            scope: p.scope.unwrap_or(PolicyScope::Namespace),
            action: PolicyAction::Deny,
            dry_run: p.dry_run,
            body: Body::Unreadable(p.error.as_str().into()),
        }
    }

    /// "ns/name".
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn namespace(&self) -> &str {
        &self.key[..self.namespace_len]
    }

    pub fn scope(&self) -> PolicyScope {
        self.scope
    }

    /// Deny for an unreadable policy, whatever it declared.
    pub fn action(&self) -> PolicyAction {
        self.action
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Why the config source could not read it, if it could not.
    pub fn unreadable_reason(&self) -> Option<&str> {
        match &self.body {
            Body::Unreadable(why) => Some(why),
            Body::Rules(_) => None,
        }
    }

    /// Where the snapshot indexes it: "" for global policies, the
    /// namespace for namespace-wide ones, None for those that apply only
    /// where a workload names them.
    pub fn index_namespace(&self) -> Option<&str> {
        match self.scope {
            PolicyScope::Global => Some(""),
            PolicyScope::Namespace => Some(self.namespace()),
            PolicyScope::WorkloadSelector => None,
        }
    }

    #[inline]
    pub(super) fn matches(&self, f: &Facts<'_>) -> bool {
        match &self.body {
            Body::Unreadable(_) => true,
            Body::Rules(rules) => rules.iter().any(|rule| {
                rule.clauses.iter().all(|clause| match clause {
                    Clause::Always => true,
                    Clause::Any(matchers) => matchers.iter().any(|m| m.holds(f)),
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_compare_like_the_joined_string() {
        let parts = ["cluster.local", "/ns/", "a", "/sa/", "bob"];
        let joined: String = parts.concat();
        let probes = [
            "",
            "c",
            "cluster.local",
            "cluster.local/",
            "cluster.local/ns/a/sa/bob",
            "cluster.local/ns/a/sa/bobx",
            "xcluster.local/ns/a/sa/bob",
            "/ns/a/sa/bob",
            "a/sa/bob",
            "bob",
            "b",
            "ns/a",
            "cluster.local/ns/b",
        ];
        for p in probes {
            assert_eq!(
                parts_start_with(&parts, p.as_bytes()),
                joined.starts_with(p),
                "prefix {p:?}"
            );
            assert_eq!(
                parts_end_with(&parts, p.as_bytes()),
                joined.ends_with(p),
                "suffix {p:?}"
            );
            assert_eq!(
                Pattern::Exact(p.into()).matches(&parts),
                joined == p,
                "exact {p:?}"
            );
        }
        assert!(Pattern::Presence.matches(&parts));
        assert!(!Pattern::Presence.matches(&[""]));
        assert!(Pattern::Exact("".into()).matches(&[""]));
    }

    #[test]
    fn prefixes_respect_family_and_length() {
        let p = |s: &str, len| Prefix::new(&Cidr::new(s.parse().unwrap(), len).unwrap());
        let ip = |s: &str| Ip::new(s.parse().unwrap());
        assert!(p("10.1.0.0", 16).contains(ip("10.1.200.3")));
        assert!(!p("10.1.0.0", 16).contains(ip("10.2.0.1")));
        // Host bits in the network address are ignored.
        assert!(p("10.1.2.3", 16).contains(ip("10.1.9.9")));
        assert!(p("0.0.0.0", 0).contains(ip("203.0.113.9")));
        assert!(!p("0.0.0.0", 0).contains(ip("::1")));
        assert!(!p("::", 0).contains(ip("10.0.0.1")));
        assert!(p("::", 0).contains(ip("2001:db8::1")));
        assert!(p("2001:db8::", 32).contains(ip("2001:db8:ffff::1")));
        assert!(!p("2001:db8::", 33).contains(ip("2001:db8:8000::1")));
        assert!(p("10.0.0.7", 32).contains(ip("10.0.0.7")));
        assert!(!p("10.0.0.7", 32).contains(ip("10.0.0.6")));
        assert!(!p("10.0.0.1", 32).contains(ip("::ffff:10.0.0.1")));
    }
}
