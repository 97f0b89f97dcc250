//! Workload identities: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! This is the only identity shape Istio's ambient mesh uses: it is what a
//! workload certificate carries as its single URI SAN, what peers check after
//! a handshake, and what authorization policies match on. Parsing is strict
//! (see [`Identity::from_str`]) because the parsed value decides who a peer
//! is; anything that is not exactly that shape is refused with a reason.

use std::fmt;
use std::str::FromStr;

use crate::model::strings::Str;

const SCHEME: &str = "spiffe://";

/// A workload identity. Ordering is by trust domain, then namespace, then
/// service account.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub trust_domain: Str,
    pub namespace: Str,
    pub service_account: Str,
}

impl Identity {
    /// Builds an identity from its parts without checking them; use
    /// [`validate`](Self::validate) (or parse a URI) when the parts come from
    /// outside. The CA refuses to sign an identity that doesn't validate.
    pub fn new(
        trust_domain: impl Into<Str>,
        namespace: impl Into<Str>,
        service_account: impl Into<Str>,
    ) -> Identity {
        Identity {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }

    /// Checks that the parts form a URI that [`FromStr`] accepts and that
    /// parses back to the same parts (no `/` hiding inside a part).
    pub fn validate(&self) -> Result<(), IdentityError> {
        let uri = self.to_string();
        let parsed: Identity = uri.parse()?;
        if parsed == *self {
            Ok(())
        } else {
            Err(IdentityError::new(&uri, IdentityErrorKind::WrongPath))
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// Why a string is not an acceptable SPIFFE ID. `Display` names the input and
/// the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SPIFFE ID {input:?}: {kind}")]
pub struct IdentityError {
    /// The offending input (cut short if very long).
    pub input: String,
    pub kind: IdentityErrorKind,
}

impl IdentityError {
    fn new(input: &str, kind: IdentityErrorKind) -> IdentityError {
        const MAX: usize = 200;
        let input = match input.char_indices().nth(MAX) {
            Some((cut, _)) => format!("{}...", &input[..cut]),
            None => input.to_owned(),
        };
        IdentityError { input, kind }
    }
}

/// The specific problem found in a SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityErrorKind {
    #[error("empty string")]
    Empty,
    #[error("contains whitespace or a control character")]
    Whitespace,
    #[error("the scheme must be lowercase \"spiffe://\"")]
    SchemeCase,
    #[error("must start with \"spiffe://\"")]
    Scheme,
    #[error("percent-encoding is not allowed")]
    PercentEncoded,
    #[error("a query ('?') or fragment ('#') is not allowed")]
    QueryOrFragment,
    #[error("the trust domain is empty")]
    EmptyTrustDomain,
    #[error(
        "the trust domain contains {0:?}; only lowercase letters, digits, '.', '-' and '_' are allowed"
    )]
    TrustDomainChar(char),
    #[error("the path must be /ns/<namespace>/sa/<service-account>")]
    WrongPath,
    #[error("expected \"ns\" as the first path segment, found {0:?}")]
    ExpectedNs(String),
    #[error("expected \"sa\" as the third path segment, found {0:?}")]
    ExpectedSa(String),
    #[error("the namespace is empty")]
    EmptyNamespace,
    #[error("the service account is empty")]
    EmptyServiceAccount,
    #[error("unexpected path segments after the service account")]
    ExtraSegments,
    #[error("the {part} contains {ch:?}; only letters, digits, '.', '-' and '_' are allowed")]
    SegmentChar { part: &'static str, ch: char },
    #[error("the {part} may not be \".\" or \"..\"")]
    DotSegment { part: &'static str },
}

impl FromStr for Identity {
    type Err = IdentityError;

    /// Accepts exactly `spiffe://<td>/ns/<ns>/sa/<sa>`:
    /// - the scheme is lowercase `spiffe`, with no userinfo, port, query,
    ///   fragment, percent-encoding or whitespace anywhere;
    /// - the trust domain is non-empty lowercase `[a-z0-9._-]` (SPIFFE spec);
    /// - namespace and service account are non-empty `[A-Za-z0-9._-]`, not
    ///   `.`/`..`; there are exactly these four path segments.
    fn from_str(s: &str) -> Result<Identity, IdentityError> {
        let fail = |kind| Err(IdentityError::new(s, kind));
        if s.is_empty() {
            return fail(IdentityErrorKind::Empty);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return fail(IdentityErrorKind::Whitespace);
        }
        let Some(rest) = s.strip_prefix(SCHEME) else {
            let prefix = s.get(..SCHEME.len()).unwrap_or(s);
            return if prefix.eq_ignore_ascii_case(SCHEME) {
                fail(IdentityErrorKind::SchemeCase)
            } else {
                fail(IdentityErrorKind::Scheme)
            };
        };
        if rest.contains('%') {
            return fail(IdentityErrorKind::PercentEncoded);
        }
        if rest.contains(['?', '#']) {
            return fail(IdentityErrorKind::QueryOrFragment);
        }

        let mut segments = rest.split('/');
        let trust_domain = segments.next().unwrap_or_default();
        if trust_domain.is_empty() {
            return fail(IdentityErrorKind::EmptyTrustDomain);
        }
        if let Some(ch) = trust_domain
            .chars()
            .find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c)))
        {
            return fail(IdentityErrorKind::TrustDomainChar(ch));
        }

        match segments.next() {
            Some("ns") => {}
            Some(other) => return fail(IdentityErrorKind::ExpectedNs(other.to_owned())),
            None => return fail(IdentityErrorKind::WrongPath),
        }
        let namespace = match segments.next() {
            Some("") => return fail(IdentityErrorKind::EmptyNamespace),
            Some(ns) => ns,
            None => return fail(IdentityErrorKind::WrongPath),
        };
        match segments.next() {
            Some("sa") => {}
            Some(other) => return fail(IdentityErrorKind::ExpectedSa(other.to_owned())),
            None => return fail(IdentityErrorKind::WrongPath),
        }
        let service_account = match segments.next() {
            Some("") => return fail(IdentityErrorKind::EmptyServiceAccount),
            Some(sa) => sa,
            None => return fail(IdentityErrorKind::WrongPath),
        };
        if segments.next().is_some() {
            return fail(IdentityErrorKind::ExtraSegments);
        }
        for (part, value) in [
            ("namespace", namespace),
            ("service account", service_account),
        ] {
            if let Some(ch) = value
                .chars()
                .find(|&c| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
            {
                return fail(IdentityErrorKind::SegmentChar { part, ch });
            }
            if value == "." || value == ".." {
                return fail(IdentityErrorKind::DotSegment { part });
            }
        }

        Ok(Identity::new(trust_domain, namespace, service_account))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_round_trip() {
        for uri in [
            "spiffe://cluster.local/ns/default/sa/default",
            "spiffe://example.org/ns/shop/sa/cart-v2",
            "spiffe://td_1-x.y/ns/Team.A/sa/svc_acc-1",
        ] {
            let id: Identity = uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"));
            assert_eq!(id.to_string(), uri);
            id.validate().unwrap();
        }
        let id: Identity = "spiffe://cluster.local/ns/shop/sa/cart".parse().unwrap();
        assert_eq!(id, Identity::new("cluster.local", "shop", "cart"));
        assert_eq!(id.trust_domain, "cluster.local");
        assert_eq!(id.namespace, "shop");
        assert_eq!(id.service_account, "cart");
    }

    #[test]
    fn rejects_malformed_ids_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "empty string"),
            (" spiffe://td/ns/a/sa/b", "whitespace"),
            ("spiffe://td/ns/a/sa/b\n", "whitespace"),
            ("spiffe://td/ns/a b/sa/c", "whitespace"),
            ("SPIFFE://td/ns/a/sa/b", "scheme must be lowercase"),
            ("Spiffe://td/ns/a/sa/b", "scheme must be lowercase"),
            ("https://td/ns/a/sa/b", "must start with \"spiffe://\""),
            ("spiffe:/td/ns/a/sa/b", "must start with \"spiffe://\""),
            ("td/ns/a/sa/b", "must start with \"spiffe://\""),
            ("spiffe://td/ns/a%2Fb/sa/c", "percent-encoding"),
            ("spiffe://td/ns/a/sa/b?x=1", "query ('?') or fragment ('#')"),
            (
                "spiffe://td/ns/a/sa/b#frag",
                "query ('?') or fragment ('#')",
            ),
            ("spiffe:///ns/a/sa/b", "trust domain is empty"),
            ("spiffe://", "trust domain is empty"),
            (
                "spiffe://Cluster.local/ns/a/sa/b",
                "trust domain contains 'C'",
            ),
            ("spiffe://td:8080/ns/a/sa/b", "trust domain contains ':'"),
            ("spiffe://user@td/ns/a/sa/b", "trust domain contains '@'"),
            (
                "spiffe://td",
                "path must be /ns/<namespace>/sa/<service-account>",
            ),
            ("spiffe://td/ns/a", "path must be"),
            ("spiffe://td/ns/a/sa", "path must be"),
            (
                "spiffe://td/namespace/a/sa/b",
                "expected \"ns\" as the first path segment, found \"namespace\"",
            ),
            (
                "spiffe://td/ns/a/serviceaccount/b",
                "expected \"sa\" as the third path segment, found \"serviceaccount\"",
            ),
            ("spiffe://td/sa/b/ns/a", "expected \"ns\""),
            ("spiffe://td/ns//sa/b", "namespace is empty"),
            ("spiffe://td/ns/a/sa/", "service account is empty"),
            ("spiffe://td/ns/a/sa/b/", "unexpected path segments"),
            ("spiffe://td/ns/a/sa/b/c", "unexpected path segments"),
            ("spiffe://td/ns/a/sa/b/sa/c", "unexpected path segments"),
            ("spiffe://td/ns/a*/sa/b", "namespace contains '*'"),
            ("spiffe://td/ns/a/sa/b:c", "service account contains ':'"),
            ("spiffe://td/ns/ä/sa/b", "namespace contains 'ä'"),
            (
                "spiffe://td/ns/../sa/b",
                "namespace may not be \".\" or \"..\"",
            ),
            ("spiffe://td/ns/a/sa/.", "service account may not be"),
        ];
        for (input, want) in cases {
            let err = input
                .parse::<Identity>()
                .expect_err(&format!("{input:?} must be rejected"));
            let text = err.to_string();
            assert!(
                text.contains(want),
                "{input:?}: error {text:?} should mention {want:?}"
            );
            assert!(text.starts_with("invalid SPIFFE ID"), "{text}");
        }
    }

    #[test]
    fn validate_catches_parts_that_do_not_round_trip() {
        assert!(Identity::new("td", "a/sa/b", "c").validate().is_err());
        assert!(Identity::new("td", "", "c").validate().is_err());
        assert!(Identity::new("TD", "a", "c").validate().is_err());
        assert!(Identity::new("td", "a", "c").validate().is_ok());
    }

    #[test]
    fn orders_by_trust_domain_then_namespace_then_account() {
        let mut ids = [
            Identity::new("b", "a", "a"),
            Identity::new("a", "b", "a"),
            Identity::new("a", "a", "b"),
            Identity::new("a", "a", "a"),
        ];
        ids.sort();
        let shown: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "spiffe://a/ns/a/sa/a",
                "spiffe://a/ns/a/sa/b",
                "spiffe://a/ns/b/sa/a",
                "spiffe://b/ns/a/sa/a",
            ]
        );
    }

    const _: fn() = || {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Identity>();
        send_sync::<IdentityError>();
    };
}
