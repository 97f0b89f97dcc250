//! The authorization decision written as plainly as possible, straight
//! from the model and Istio's documentation: no compilation, no ordering
//! tricks, strings built as they are compared. It is what the compiled
//! evaluator ([`super::authorize`]) is held against, in the property test
//! and in the benchmark; nothing on the data path uses it.

use std::net::IpAddr;

use super::Conn;
use crate::model::{Match, Policy, PolicyAction, ServiceAccountMatch, StringMatch};

/// A reference decision, owned so tests can compare it freely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefVerdict {
    AllowedNoPolicies,
    AllowedBy(String),
    DeniedBy(String),
    NotAllowed,
}

impl RefVerdict {
    pub fn allowed(&self) -> bool {
        matches!(
            self,
            RefVerdict::AllowedNoPolicies | RefVerdict::AllowedBy(_)
        )
    }
}

/// A reference dry-run report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefDryRun {
    DenyMatch(String),
    AllowMatch(String),
    NoAllowMatch,
}

/// Decides `conn` against `policies`, already selected for its destination
/// workload and in selection order.
pub fn authorize(policies: &[&Policy], conn: &Conn<'_>) -> (RefVerdict, Vec<RefDryRun>) {
    let mut reports = Vec::new();
    let deny: Vec<&Policy> = policies
        .iter()
        .copied()
        .filter(|p| p.action == PolicyAction::Deny)
        .collect();
    let allow: Vec<&Policy> = policies
        .iter()
        .copied()
        .filter(|p| p.action == PolicyAction::Allow)
        .collect();

    // 1. Dry-run DENY matches are reported.
    for p in deny.iter().filter(|p| p.dry_run) {
        if policy_matches(p, conn) {
            reports.push(RefDryRun::DenyMatch(p.key()));
        }
    }
    // 2. Any DENY match denies.
    for p in deny.iter().filter(|p| !p.dry_run) {
        if policy_matches(p, conn) {
            return (RefVerdict::DeniedBy(p.key()), reports);
        }
    }
    // 3. Dry-run ALLOW matches are reported.
    let dry_allow: Vec<&&Policy> = allow.iter().filter(|p| p.dry_run).collect();
    let enforced_allow: Vec<&&Policy> = allow.iter().filter(|p| !p.dry_run).collect();
    let mut dry_matched = false;
    for p in &dry_allow {
        if policy_matches(p, conn) {
            dry_matched = true;
            reports.push(RefDryRun::AllowMatch(p.key()));
        }
    }
    if !dry_allow.is_empty() && !dry_matched && enforced_allow.is_empty() {
        reports.push(RefDryRun::NoAllowMatch);
    }
    // 4. No ALLOW policy: allow.
    if enforced_allow.is_empty() {
        return (RefVerdict::AllowedNoPolicies, reports);
    }
    // 5. Any ALLOW match allows.
    for p in enforced_allow {
        if policy_matches(p, conn) {
            return (RefVerdict::AllowedBy(p.key()), reports);
        }
    }
    // 6. Otherwise deny.
    (RefVerdict::NotAllowed, reports)
}

/// Whether `policy` matches `conn`: rules OR, clauses AND, matches OR.
pub fn policy_matches(policy: &Policy, conn: &Conn<'_>) -> bool {
    if policy.rules.is_empty() {
        return false;
    }
    policy.rules.iter().any(|rule| {
        rule.clauses.iter().all(|clause| {
            clause.matches.is_empty() || clause.matches.iter().any(|m| match_holds(m, conn))
        })
    })
}

fn is_empty(m: &Match) -> bool {
    *m == Match::default()
}

/// Every field holds: a positive list needs one hit (or is empty), a
/// negative list needs none.
fn match_holds(m: &Match, conn: &Conn<'_>) -> bool {
    if is_empty(m) {
        return false;
    }
    let src = canonical(conn.src);
    let dst = canonical(conn.dst.ip());
    let port = conn.dst.port();
    let principal = conn.peer.map(|id| id.to_string()).unwrap_or_default();
    let namespace = conn.peer.map(|id| id.namespace.clone()).unwrap_or_default();

    field(&m.destination_ips, &m.not_destination_ips, |c| {
        c.contains(dst)
    }) && field(&m.source_ips, &m.not_source_ips, |c| c.contains(src))
        && field(&m.destination_ports, &m.not_destination_ports, |p| {
            *p == port
        })
        && field(&m.service_accounts, &m.not_service_accounts, |a| {
            account_matches(a, conn)
        })
        && field(&m.principals, &m.not_principals, |s| {
            principal_matches(s, &principal)
        })
        && field(&m.namespaces, &m.not_namespaces, |s| {
            string_matches(s, &namespace)
        })
}

fn field<T>(positive: &[T], negative: &[T], hit: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&hit)) && !negative.iter().any(&hit)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn account_matches(a: &ServiceAccountMatch, conn: &Conn<'_>) -> bool {
    conn.peer
        .is_some_and(|id| id.namespace == a.namespace && id.service_account == a.service_account)
}

/// Principals are compared without `spiffe://`; no identity matches nothing.
fn principal_matches(s: &StringMatch, spiffe_id: &str) -> bool {
    match spiffe_id.strip_prefix("spiffe://") {
        Some(principal) => string_matches(s, principal),
        None => false,
    }
}

fn string_matches(s: &StringMatch, value: &str) -> bool {
    match s {
        StringMatch::Exact(e) => value == e,
        StringMatch::Prefix(p) => value.starts_with(p.as_str()),
        StringMatch::Suffix(p) => value.ends_with(p.as_str()),
        StringMatch::Presence => !value.is_empty(),
    }
}
