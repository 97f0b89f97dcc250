//! The compiled form of a policy: what the cores evaluate.
//!
//! Compiling happens once per policy version, on the control thread, when
//! a snapshot takes the policy in. Two things come out of it:
//!
//! - a [`Prefilter`] (see that module): a few words that rule most
//!   policies out without looking at their rules;
//! - a flat program: the rules, clauses, matches and checks laid out in one
//!   array of small ops, with the values they compare against in a handful
//!   of pools owned by the policy, in the order that fails fastest: ports
//!   and addresses (integer compares) before namespaces, service accounts
//!   and principals (string compares). A policy is a few contiguous
//!   allocations, not a tree of hundreds: walking 10 000 policies reads
//!   memory in order instead of chasing pointers.
//!
//! Evaluating touches no allocator, no lock and no reference count.

use std::collections::HashMap;
use std::sync::Arc;

use super::facts::{ip_bits, principal, Facts, Ip};
use super::prefilter::Prefilter;
use crate::model::{Cidr, Match, Policy, PolicyAction, PolicyScope, StringMatch, UnreadablePolicy};

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
    filter: Prefilter,
    body: Body,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    /// Any rule matching makes the policy match; none never matches.
    Program(Program),
    /// The config source could not turn the resource into a policy. It
    /// matches every connection and always denies, whatever action it
    /// declared: an unreadable ALLOW must not allow, and an unreadable DENY
    /// must not stop denying.
    Unreadable(Box<str>),
}

/// The rules as a flat sequence: each `Rule` op is followed by its clauses,
/// each `Clause` by its matchers, each `Matcher` by its checks; `end` is the
/// index just past the item, so a failed item is skipped in one step.
///
/// A clause that had no matches always holds, so it is left out (a rule of
/// such clauses alone holds: AND over nothing). A clause whose matches were
/// all empty (an empty `Match` never matches) stays with no matchers, so it
/// never holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Program {
    ops: Box<[Op]>,
    ports: Box<[u16]>,
    prefixes: Box<[Prefix]>,
    patterns: Box<[Pattern]>,
    /// (namespace, service account) pairs, as spans of `strings`.
    accounts: Box<[(Span, Span)]>,
    strings: Box<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Rule {
        end: u32,
    },
    Clause {
        end: u32,
    },
    Matcher {
        end: u32,
    },
    /// Holds when some entry of `field` in `at` matches (none, negated).
    Check {
        field: Field,
        negate: bool,
        at: Span,
    },
}

/// Which field a check compares, and so which pool `at` indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    // In evaluation order: integers first.
    DestinationPorts,
    DestinationIps,
    SourceIps,
    Namespaces,
    ServiceAccounts,
    Principals,
}

/// A range of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
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

/// A string match, its value a span of the policy's `strings`. Checked
/// against a value made of parts: a principal is "td" "/ns/" "ns" "/sa/"
/// "sa", so matching it part by part means never building the string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Exact(Span),
    Prefix(Span),
    Suffix(Span),
    /// Any non-empty value.
    Presence,
}

impl Pattern {
    #[inline]
    fn matches(&self, strings: &str, parts: &[&str]) -> bool {
        let s = |span: &Span| strings[span.range()].as_bytes();
        match self {
            Pattern::Exact(p) => {
                parts.iter().map(|s| s.len()).sum::<usize>() == p.len as usize
                    && parts_start_with(parts, s(p))
            }
            Pattern::Prefix(p) => parts_start_with(parts, s(p)),
            Pattern::Suffix(p) => parts_end_with(parts, s(p)),
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

impl Program {
    /// Any rule holds.
    #[inline]
    fn matches(&self, f: &Facts<'_>) -> bool {
        let mut i = 0;
        while i < self.ops.len() {
            let end = self.end(i);
            if self.rule_holds(i + 1, end, f) {
                return true;
            }
            i = end;
        }
        false
    }

    #[inline]
    fn end(&self, i: usize) -> usize {
        match self.ops[i] {
            Op::Rule { end } | Op::Clause { end } | Op::Matcher { end } => end as usize,
            Op::Check { .. } => i + 1,
        }
    }

    /// Every clause in `i..end` holds.
    #[inline]
    fn rule_holds(&self, mut i: usize, end: usize, f: &Facts<'_>) -> bool {
        while i < end {
            let clause_end = self.end(i);
            if !self.clause_holds(i + 1, clause_end, f) {
                return false;
            }
            i = clause_end;
        }
        true
    }

    /// Some matcher in `i..end` holds.
    #[inline]
    fn clause_holds(&self, mut i: usize, end: usize, f: &Facts<'_>) -> bool {
        while i < end {
            let matcher_end = self.end(i);
            if self.ops[i + 1..matcher_end]
                .iter()
                .all(|op| self.check(op, f))
            {
                return true;
            }
            i = matcher_end;
        }
        false
    }

    #[inline]
    fn check(&self, op: &Op, f: &Facts<'_>) -> bool {
        let Op::Check { field, negate, at } = *op else {
            return true;
        };
        let r = at.range();
        let any = match field {
            Field::DestinationPorts => self.ports[r].contains(&f.port),
            Field::DestinationIps => self.prefixes[r].iter().any(|p| p.contains(f.dst)),
            Field::SourceIps => self.prefixes[r].iter().any(|p| p.contains(f.src)),
            // Without an identity the namespace is "" (so an empty exact,
            // prefix or suffix still matches, as in ztunnel).
            Field::Namespaces => {
                let ns = f.peer.map_or("", |id| id.namespace.as_str());
                self.patterns[r]
                    .iter()
                    .any(|p| p.matches(&self.strings, &[ns]))
            }
            Field::ServiceAccounts => f.peer.is_some_and(|id| {
                self.accounts[r].iter().any(|(ns, sa)| {
                    self.strings[ns.range()] == id.namespace
                        && self.strings[sa.range()] == id.service_account
                })
            }),
            // Without an identity no principal pattern matches, not even a
            // prefix "" (ztunnel requires the spiffe:// it strips).
            Field::Principals => f.peer.is_some_and(|id| {
                let parts = principal(id);
                self.patterns[r]
                    .iter()
                    .any(|p| p.matches(&self.strings, &parts))
            }),
        };
        any != negate
    }
}

/// Builds a [`Program`]; strings are stored once per policy however often
/// they repeat.
#[derive(Default)]
struct Assembler {
    ops: Vec<Op>,
    ports: Vec<u16>,
    prefixes: Vec<Prefix>,
    patterns: Vec<Pattern>,
    accounts: Vec<(Span, Span)>,
    strings: String,
    interned: HashMap<String, Span>,
}

impl Assembler {
    fn string(&mut self, s: &str) -> Span {
        if let Some(span) = self.interned.get(s) {
            return *span;
        }
        let span = Span {
            start: self.strings.len() as u32,
            len: s.len() as u32,
        };
        self.strings.push_str(s);
        self.interned.insert(s.to_owned(), span);
        span
    }

    /// Opens an item; returns its index for [`close`](Self::close).
    fn open(&mut self, op: Op) -> usize {
        self.ops.push(op);
        self.ops.len() - 1
    }

    fn close(&mut self, at: usize) {
        let end = self.ops.len() as u32;
        match &mut self.ops[at] {
            Op::Rule { end: e } | Op::Clause { end: e } | Op::Matcher { end: e } => *e = end,
            Op::Check { .. } => unreachable!("checks are not opened"),
        }
    }

    fn span<T>(pool: &mut Vec<T>, items: impl IntoIterator<Item = T>) -> Span {
        let start = pool.len();
        pool.extend(items);
        Span {
            start: start as u32,
            len: (pool.len() - start) as u32,
        }
    }

    fn patterns(&mut self, v: &[StringMatch]) -> Span {
        let compiled: Vec<Pattern> = v
            .iter()
            .map(|m| match m {
                StringMatch::Exact(s) => Pattern::Exact(self.string(s)),
                StringMatch::Prefix(s) => Pattern::Prefix(self.string(s)),
                StringMatch::Suffix(s) => Pattern::Suffix(self.string(s)),
                StringMatch::Presence => Pattern::Presence,
            })
            .collect();
        Self::span(&mut self.patterns, compiled)
    }

    /// The checks of one non-empty `Match`, cheapest field first (a field's
    /// positive list before its negative one).
    fn matcher(&mut self, m: &Match) {
        let at = self.open(Op::Matcher { end: 0 });
        let mut checks: Vec<(Field, bool, Span)> = Vec::new();
        let mut ports = |this: &mut Self, v: &[u16], negate| {
            if !v.is_empty() {
                let mut v = v.to_vec();
                v.sort_unstable();
                v.dedup();
                checks.push((
                    Field::DestinationPorts,
                    negate,
                    Self::span(&mut this.ports, v),
                ));
            }
        };
        ports(self, &m.destination_ports, false);
        ports(self, &m.not_destination_ports, true);
        for (field, v, negate) in [
            (Field::DestinationIps, &m.destination_ips, false),
            (Field::DestinationIps, &m.not_destination_ips, true),
            (Field::SourceIps, &m.source_ips, false),
            (Field::SourceIps, &m.not_source_ips, true),
        ] {
            if !v.is_empty() {
                let span = Self::span(&mut self.prefixes, v.iter().map(Prefix::new));
                checks.push((field, negate, span));
            }
        }
        for (field, v, negate) in [
            (Field::Namespaces, &m.namespaces, false),
            (Field::Namespaces, &m.not_namespaces, true),
            (Field::Principals, &m.principals, false),
            (Field::Principals, &m.not_principals, true),
        ] {
            if !v.is_empty() {
                let span = self.patterns(v);
                checks.push((field, negate, span));
            }
        }
        for (v, negate) in [
            (&m.service_accounts, false),
            (&m.not_service_accounts, true),
        ] {
            if !v.is_empty() {
                let pairs: Vec<(Span, Span)> = v
                    .iter()
                    .map(|a| (self.string(&a.namespace), self.string(&a.service_account)))
                    .collect();
                let span = Self::span(&mut self.accounts, pairs);
                checks.push((Field::ServiceAccounts, negate, span));
            }
        }
        checks.sort_by_key(|(field, ..)| *field);
        self.ops
            .extend(
                checks
                    .into_iter()
                    .map(|(field, negate, at)| Op::Check { field, negate, at }),
            );
        self.close(at);
    }

    fn finish(self) -> Program {
        Program {
            ops: self.ops.into(),
            ports: self.ports.into(),
            prefixes: self.prefixes.into(),
            patterns: self.patterns.into(),
            accounts: self.accounts.into(),
            strings: self.strings.into(),
        }
    }
}

impl CompiledPolicy {
    /// Compiles a valid policy.
    pub fn compile(policy: &Policy) -> CompiledPolicy {
        let mut a = Assembler::default();
        for rule in &policy.rules {
            let r = a.open(Op::Rule { end: 0 });
            // A clause without matches always holds: nothing to check.
            for clause in rule.clauses.iter().filter(|c| !c.matches.is_empty()) {
                let c = a.open(Op::Clause { end: 0 });
                // An empty match never matches: it adds no matcher.
                for m in clause.matches.iter().filter(|m| **m != Match::default()) {
                    a.matcher(m);
                }
                a.close(c);
            }
            a.close(r);
        }
        CompiledPolicy {
            key: Arc::from(policy.key()),
            namespace_len: policy.namespace.len(),
            scope: policy.scope,
            action: policy.action,
            dry_run: policy.dry_run,
            filter: Prefilter::of(policy),
            body: Body::Program(a.finish()),
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
            filter: Prefilter::ANY,
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
            Body::Program(_) => None,
        }
    }

    /// What rules most connections out without looking at the rules.
    pub(super) fn filter(&self) -> &Prefilter {
        &self.filter
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

    /// Whether the policy matches; the caller has already asked the
    /// [`Prefilter`] (which only ever rules out what cannot match).
    #[inline]
    pub(super) fn matches(&self, f: &Facts<'_>) -> bool {
        match &self.body {
            Body::Unreadable(_) => true,
            Body::Program(p) => p.matches(f),
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
            let strings = p;
            let span = Span {
                start: 0,
                len: p.len() as u32,
            };
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
                Pattern::Exact(span).matches(strings, &parts),
                joined == p,
                "exact {p:?}"
            );
        }
        assert!(Pattern::Presence.matches("", &parts));
        assert!(!Pattern::Presence.matches("", &[""]));
        assert!(Pattern::Exact(Span::default()).matches("", &[""]));
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

    #[test]
    fn strings_are_stored_once_per_policy() {
        let m = Match {
            principals: vec![StringMatch::Exact("cluster.local/ns/a/sa/x".into())],
            namespaces: vec![StringMatch::Exact("a".into())],
            ..Match::default()
        };
        let rule = crate::model::Rule {
            clauses: vec![crate::model::Clause { matches: vec![m] }],
        };
        let p = Policy {
            name: "p".into(),
            namespace: "ns".into(),
            scope: PolicyScope::Namespace,
            action: PolicyAction::Allow,
            dry_run: false,
            rules: vec![rule; 10],
        };
        let c = CompiledPolicy::compile(&p);
        let Body::Program(prog) = &c.body else {
            panic!()
        };
        // Namespaces are compiled before principals (cheaper checks first).
        assert_eq!(&*prog.strings, "acluster.local/ns/a/sa/x");
        // Per rule: Rule, Clause, Matcher and two checks.
        assert_eq!(prog.ops.len(), 10 * 5);
    }
}
