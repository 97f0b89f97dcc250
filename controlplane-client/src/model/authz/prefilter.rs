//! A policy's prefilter: a few words of necessary conditions, computed when
//! the policy is compiled, that rule out most connections it cannot match
//! without reading its rules.
//!
//! For each rule, and each of three dimensions (destination port,
//! principal, namespace), compiling works out the set of values a matching
//! connection can have: a `Match` with a positive list of exact values
//! allows those (any other entry kind, or no list, allows anything), a
//! clause allows the union of its matches, a rule the intersection of its
//! clauses. The policy can match only if one of its rules can: the
//! prefilter keeps one alternative per rule (the last absorbing any rules
//! beyond [`MAX_ALTS`]), because a union across rules loses what each rule
//! narrows (one rule on principals, another on namespaces). Ports are kept
//! as a short list; principals and namespaces as a 64-bit Bloom mask (one
//! bit per value), which may let a connection through that the rules then
//! refuse, but never the reverse.
//!
//! With 1000 policies that each name other principals, namespaces or
//! ports, a decision reads 1000 small contiguous entries instead of
//! walking 1000 rule sets.

use std::collections::BTreeSet;

use super::facts::{bloom_bit, Facts};
use crate::model::{Match, Policy, StringMatch};

/// Ports kept inline; a rule that may match more counts as any port.
const MAX_PORTS: usize = 4;
/// Rules kept apart; further ones are merged into the last alternative.
const MAX_ALTS: usize = 3;
/// `ports_len` meaning "any port".
const ANY_PORT: u8 = u8::MAX;
/// A Bloom mask that lets every value through.
const ANY_VALUE: u64 = u64::MAX;

/// The policy may match only a connection that one of `alts[..len]`
/// admits; none (`len` 0) when no rule can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefilter {
    len: u8,
    alts: [Alt; MAX_ALTS],
}

/// What one rule (or several merged) can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Alt {
    ports_len: u8,
    ports: [u16; MAX_PORTS],
    principals: u64,
    namespaces: u64,
}

impl Alt {
    const ANY: Alt = Alt {
        ports_len: ANY_PORT,
        ports: [0; MAX_PORTS],
        principals: ANY_VALUE,
        namespaces: ANY_VALUE,
    };

    fn new((ports, principals, namespaces): Dims) -> Alt {
        let mut alt = Alt::ANY;
        if let Values::Only(set) = ports {
            if set.len() <= MAX_PORTS {
                alt.ports_len = set.len() as u8;
                for (slot, port) in alt.ports.iter_mut().zip(set) {
                    *slot = port;
                }
            }
        }
        let mask = |values: Values<String>| match values {
            Values::Any => ANY_VALUE,
            Values::Only(set) => set.iter().fold(0, |m, v| m | bloom_bit(&[v])),
        };
        alt.principals = mask(principals);
        alt.namespaces = mask(namespaces);
        alt
    }

    #[inline]
    fn admits(&self, f: &Facts<'_>) -> bool {
        (self.ports_len == ANY_PORT || self.ports[..usize::from(self.ports_len)].contains(&f.port))
            && (self.principals == ANY_VALUE || self.principals & f.principal_bit != 0)
            && (self.namespaces == ANY_VALUE || self.namespaces & f.namespace_bit != 0)
    }
}

/// The values one dimension can take in a matching connection.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Values<T> {
    Any,
    Only(BTreeSet<T>),
}

impl<T: Ord + Clone> Values<T> {
    fn none() -> Self {
        Values::Only(BTreeSet::new())
    }

    fn or(self, other: Self) -> Self {
        match (self, other) {
            (Values::Any, _) | (_, Values::Any) => Values::Any,
            (Values::Only(mut a), Values::Only(b)) => {
                a.extend(b);
                Values::Only(a)
            }
        }
    }

    fn and(self, other: Self) -> Self {
        match (self, other) {
            (Values::Any, x) | (x, Values::Any) => x,
            (Values::Only(a), Values::Only(b)) => {
                Values::Only(a.intersection(&b).cloned().collect())
            }
        }
    }

    fn is_none(&self) -> bool {
        matches!(self, Values::Only(s) if s.is_empty())
    }
}

/// The three dimensions of one `Match` (a non-empty one).
fn of_match(m: &Match) -> (Values<u16>, Values<String>, Values<String>) {
    fn exact(list: &[StringMatch]) -> Values<String> {
        let mut set = BTreeSet::new();
        for s in list {
            match s {
                StringMatch::Exact(v) => {
                    set.insert(v.clone());
                }
                _ => return Values::Any,
            }
        }
        if list.is_empty() {
            Values::Any
        } else {
            Values::Only(set)
        }
    }
    let ports = if m.destination_ports.is_empty() {
        Values::Any
    } else {
        Values::Only(m.destination_ports.iter().copied().collect())
    };
    (ports, exact(&m.principals), exact(&m.namespaces))
}

type Dims = (Values<u16>, Values<String>, Values<String>);

fn or(a: Dims, b: Dims) -> Dims {
    (a.0.or(b.0), a.1.or(b.1), a.2.or(b.2))
}

fn and(a: Dims, b: Dims) -> Dims {
    (a.0.and(b.0), a.1.and(b.1), a.2.and(b.2))
}

fn any() -> Dims {
    (Values::Any, Values::Any, Values::Any)
}

fn none() -> Dims {
    (Values::none(), Values::none(), Values::none())
}

impl Prefilter {
    /// Lets everything through (for policies with no rules to read).
    pub const ANY: Prefilter = Prefilter {
        len: 1,
        alts: [Alt::ANY; MAX_ALTS],
    };

    /// The prefilter of a policy, following its rules' structure.
    pub fn of(policy: &Policy) -> Prefilter {
        let rules = policy.rules.iter().map(|rule| {
            rule.clauses
                .iter()
                .filter(|c| !c.matches.is_empty()) // no matches: always holds
                .fold(any(), |acc, clause| {
                    let clause_dims = clause
                        .matches
                        .iter()
                        .filter(|m| **m != Match::default()) // never matches
                        .fold(none(), |acc, m| or(acc, of_match(m)));
                    and(acc, clause_dims)
                })
        });
        // Rules that cannot hold drop out; the rest, up to MAX_ALTS.
        let mut alts: Vec<Dims> = Vec::new();
        for dims in rules.filter(|d| !(d.0.is_none() || d.1.is_none() || d.2.is_none())) {
            if alts.len() < MAX_ALTS {
                alts.push(dims);
            } else {
                let last = alts.pop().expect("MAX_ALTS > 0");
                alts.push(or(last, dims));
            }
        }
        let mut f = Prefilter {
            len: alts.len() as u8,
            alts: [Alt::ANY; MAX_ALTS],
        };
        for (slot, dims) in f.alts.iter_mut().zip(alts) {
            *slot = Alt::new(dims);
        }
        f
    }

    /// False when the policy cannot match the connection; true when it
    /// may (its rules decide).
    #[inline]
    pub(super) fn admits(&self, f: &Facts<'_>) -> bool {
        self.alts[..usize::from(self.len)]
            .iter()
            .any(|alt| alt.admits(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PolicyAction;

    fn policy(rules: Vec<Vec<Vec<Match>>>) -> Policy {
        super::super::tests::policy("p", PolicyAction::Deny, rules)
    }

    fn ports(v: &[u16]) -> Match {
        Match {
            destination_ports: v.to_vec(),
            ..Match::default()
        }
    }

    fn principal(p: StringMatch) -> Match {
        Match {
            principals: vec![p],
            ..Match::default()
        }
    }

    fn alt_ports(a: &Alt) -> &[u16] {
        &a.ports[..usize::from(a.ports_len)]
    }

    #[test]
    fn follows_the_rule_structure() {
        // Rules OR: one alternative each.
        let f = Prefilter::of(&policy(vec![
            vec![vec![ports(&[80])]],
            vec![vec![ports(&[90])]],
        ]));
        assert_eq!(f.len, 2);
        assert_eq!(
            (alt_ports(&f.alts[0]), alt_ports(&f.alts[1])),
            (&[80][..], &[90][..])
        );
        // Clauses AND: the intersection.
        let f = Prefilter::of(&policy(vec![vec![
            vec![ports(&[80, 90])],
            vec![ports(&[90, 100])],
        ]]));
        assert_eq!((f.len, alt_ports(&f.alts[0])), (1, &[90][..]));
        // Disjoint clauses: that rule cannot hold and drops out.
        let disjoint = vec![vec![ports(&[80])], vec![ports(&[90])]];
        assert_eq!(Prefilter::of(&policy(vec![disjoint.clone()])).len, 0);
        assert_eq!(
            Prefilter::of(&policy(vec![disjoint, vec![vec![ports(&[70])]]])).len,
            1
        );
        // No rules, or only empty matches: nothing can match.
        assert_eq!(Prefilter::of(&policy(vec![])).len, 0);
        assert_eq!(
            Prefilter::of(&policy(vec![vec![vec![Match::default()]]])).len,
            0
        );
        // A clause without matches holds: no restriction from it.
        let f = Prefilter::of(&policy(vec![vec![vec![], vec![ports(&[80])]]]));
        assert_eq!(alt_ports(&f.alts[0]), &[80]);
        // A rule without clauses matches everything.
        assert_eq!(Prefilter::of(&policy(vec![vec![]])), Prefilter::ANY);
        // Too many ports to keep: any.
        let f = Prefilter::of(&policy(vec![vec![vec![ports(&[1, 2, 3, 4, 5])]]]));
        assert_eq!(f.alts[0].ports_len, ANY_PORT);
        // Rules beyond MAX_ALTS merge into the last alternative.
        let many: Vec<_> = (1..=5).map(|p| vec![vec![ports(&[p])]]).collect();
        let f = Prefilter::of(&policy(many));
        assert_eq!(usize::from(f.len), MAX_ALTS);
        assert_eq!(alt_ports(&f.alts[2]), &[3, 4, 5]);
    }

    #[test]
    fn only_exact_principals_narrow() {
        let exact = Prefilter::of(&policy(vec![vec![vec![principal(StringMatch::Exact(
            "cluster.local/ns/a/sa/b".into(),
        ))]]]));
        assert_eq!(
            exact.alts[0].principals,
            bloom_bit(&["cluster.local", "/ns/", "a", "/sa/", "b"])
        );
        let prefix = Prefilter::of(&policy(vec![vec![vec![principal(StringMatch::Prefix(
            "cluster.local/".into(),
        ))]]]));
        assert_eq!(prefix.alts[0].principals, ANY_VALUE);
        // A negative list says nothing about which values match.
        let negated = Prefilter::of(&policy(vec![vec![vec![Match {
            not_principals: vec![StringMatch::Presence],
            ..Match::default()
        }]]]));
        assert_eq!(negated, Prefilter::ANY);
    }

    /// One rule narrows by principal, the other by namespace: together they
    /// still rule out a peer that fits neither (a single union could not).
    #[test]
    fn rules_on_different_fields_stay_apart() {
        let f = Prefilter::of(&policy(vec![
            vec![vec![principal(StringMatch::Exact(
                "cluster.local/ns/x/sa/y".into(),
            ))]],
            vec![vec![Match {
                namespaces: vec![StringMatch::Exact("x".into())],
                ..Match::default()
            }]],
        ]));
        let peer: crate::model::identity::Identity =
            "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let facts = Facts::new(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            80,
            Some(&peer),
        );
        assert!(!f.admits(&facts));
    }
}
