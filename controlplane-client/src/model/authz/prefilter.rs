//! A policy's prefilter: a few words of necessary conditions, computed when
//! the policy is compiled, that rule out most connections it cannot match
//! without reading its rules.
//!
//! For each of three dimensions (destination port, principal, namespace)
//! compiling works out the set of values the policy can possibly match:
//! a `Match` with a positive list of exact values allows those (any other
//! entry kind, or no list, allows anything), a clause allows the union of
//! its matches, a rule the intersection of its clauses, the policy the
//! union of its rules. Ports are kept as a short list; principals and
//! namespaces as a 64-bit Bloom mask (one bit per value), which may let a
//! connection through that the rules then refuse, but never the reverse.
//!
//! With 1000 policies that each name other principals, or other ports,
//! a decision reads 1000 small contiguous entries instead of walking 1000
//! rule sets.

use std::collections::BTreeSet;

use super::facts::{bloom_bit, Facts};
use crate::model::{Match, Policy, StringMatch};

/// Ports kept inline; a policy that may match more counts as any port.
const MAX_PORTS: usize = 6;
/// `ports_len` meaning "any port".
const ANY_PORT: u8 = u8::MAX;
/// A Bloom mask that lets every value through.
const ANY_VALUE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefilter {
    /// No connection can match (no rules, or none that can hold).
    never: bool,
    ports_len: u8,
    ports: [u16; MAX_PORTS],
    principals: u64,
    namespaces: u64,
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
        never: false,
        ports_len: ANY_PORT,
        ports: [0; MAX_PORTS],
        principals: ANY_VALUE,
        namespaces: ANY_VALUE,
    };

    /// The prefilter of a policy, following its rules' structure.
    pub fn of(policy: &Policy) -> Prefilter {
        let dims = policy.rules.iter().fold(none(), |acc, rule| {
            let rule_dims = rule
                .clauses
                .iter()
                .filter(|c| !c.matches.is_empty()) // no matches: always holds
                .fold(any(), |acc, clause| {
                    let clause_dims = clause
                        .matches
                        .iter()
                        .filter(|m| **m != Match::default()) // never matches
                        .fold(none(), |acc, m| or(acc, of_match(m)));
                    and(acc, clause_dims)
                });
            or(acc, rule_dims)
        });
        let (ports, principals, namespaces) = dims;
        let never = ports.is_none() || principals.is_none() || namespaces.is_none();
        let mut f = Prefilter {
            never,
            ..Prefilter::ANY
        };
        if let Values::Only(set) = ports {
            if set.len() <= MAX_PORTS {
                f.ports_len = set.len() as u8;
                for (slot, port) in f.ports.iter_mut().zip(set) {
                    *slot = port;
                }
            }
        }
        let mask = |values: Values<String>| match values {
            Values::Any => ANY_VALUE,
            Values::Only(set) => set.iter().fold(0, |m, v| m | bloom_bit(&[v])),
        };
        f.principals = mask(principals);
        f.namespaces = mask(namespaces);
        f
    }

    /// False when the policy cannot match the connection; true when it
    /// may (its rules decide).
    #[inline]
    pub(super) fn admits(&self, f: &Facts<'_>) -> bool {
        !self.never
            && (self.ports_len == ANY_PORT
                || self.ports[..usize::from(self.ports_len)].contains(&f.port))
            && (self.principals == ANY_VALUE || self.principals & f.principal_bit != 0)
            && (self.namespaces == ANY_VALUE || self.namespaces & f.namespace_bit != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Clause, PolicyAction, PolicyScope, Rule};

    fn policy(rules: Vec<Vec<Vec<Match>>>) -> Policy {
        Policy {
            name: "p".into(),
            namespace: "ns".into(),
            scope: PolicyScope::Namespace,
            action: PolicyAction::Deny,
            dry_run: false,
            rules: rules
                .into_iter()
                .map(|clauses| Rule {
                    clauses: clauses
                        .into_iter()
                        .map(|matches| Clause { matches })
                        .collect(),
                })
                .collect(),
        }
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

    #[test]
    fn follows_the_rule_structure() {
        // Rules OR: either port.
        let f = Prefilter::of(&policy(vec![
            vec![vec![ports(&[80])]],
            vec![vec![ports(&[90])]],
        ]));
        assert_eq!(&f.ports[..f.ports_len as usize], &[80, 90]);
        // Clauses AND: the intersection.
        let f = Prefilter::of(&policy(vec![vec![
            vec![ports(&[80, 90])],
            vec![ports(&[90, 100])],
        ]]));
        assert_eq!(&f.ports[..f.ports_len as usize], &[90]);
        // Disjoint clauses: nothing can match.
        assert!(Prefilter::of(&policy(vec![vec![vec![ports(&[80])], vec![ports(&[90])]]])).never);
        // No rules, or only empty matches: never.
        assert!(Prefilter::of(&policy(vec![])).never);
        assert!(Prefilter::of(&policy(vec![vec![vec![Match::default()]]])).never);
        // A clause without matches holds: no restriction from it.
        let f = Prefilter::of(&policy(vec![vec![vec![], vec![ports(&[80])]]]));
        assert_eq!(f.ports_len, 1);
        // A rule without clauses matches everything.
        assert_eq!(Prefilter::of(&policy(vec![vec![]])), Prefilter::ANY);
        // Too many ports to keep: any.
        let f = Prefilter::of(&policy(vec![vec![vec![ports(&[1, 2, 3, 4, 5, 6, 7])]]]));
        assert_eq!(f.ports_len, ANY_PORT);
    }

    #[test]
    fn only_exact_principals_narrow() {
        let exact = Prefilter::of(&policy(vec![vec![vec![principal(StringMatch::Exact(
            "cluster.local/ns/a/sa/b".into(),
        ))]]]));
        assert_ne!(exact.principals, ANY_VALUE);
        assert_eq!(
            exact.principals,
            bloom_bit(&["cluster.local", "/ns/", "a", "/sa/", "b"])
        );
        let prefix = Prefilter::of(&policy(vec![vec![vec![principal(StringMatch::Prefix(
            "cluster.local/".into(),
        ))]]]));
        assert_eq!(prefix.principals, ANY_VALUE);
        // A negative list says nothing about which values match.
        let negated = Prefilter::of(&policy(vec![vec![vec![Match {
            not_principals: vec![StringMatch::Presence],
            ..Match::default()
        }]]]));
        assert_eq!(negated, Prefilter::ANY);
    }
}
