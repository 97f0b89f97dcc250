//! The names one DNS question may stand for, built as ztunnel builds them.
//!
//! A pod's resolver may send `web`, `web.shop`, `web.shop.svc` or the full
//! `web.shop.svc.cluster.local`. ztunnel tries, in order: the name as
//! asked, then its Kubernetes expansions; each one exactly and then as
//! wildcards of decreasing specificity. The first service found answers.
//!
//! A name with one of the pod's search suffixes already appended (what a
//! stub resolver walking its search list sends first, e.g.
//! `web.shop.svc.cluster.local.shop.svc.cluster.local`) is not stripped:
//! the reference ztunnel (62d826530e5c) forwards such names upstream,
//! where cluster DNS says NXDOMAIN and the stub goes on down its list
//! (seen in the differential test, tests/dns_ztunnel.rs).
//!
//! Names here are text: lowercase, dot-separated, without the trailing dot
//! (the form service hostnames have in the snapshot). The root is "".

use std::borrow::Cow;

/// The cluster's DNS domain and the suffixes derived from it, computed
/// once rather than per question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDomain {
    /// e.g. `cluster.local`.
    domain: String,
    /// `svc.` + domain.
    svc_domain: String,
}

/// Kubernetes' default cluster domain, and ztunnel's (`CLUSTER_DOMAIN`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

impl ClusterDomain {
    /// `domain` as configured; a trailing dot and upper case are ignored.
    pub fn new(domain: &str) -> ClusterDomain {
        let domain = normalize(domain).into_owned();
        ClusterDomain {
            svc_domain: format!("svc.{domain}"),
            domain,
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// `svc.<domain>`: what every Kubernetes Service hostname ends with.
    pub fn svc_domain(&self) -> &str {
        &self.svc_domain
    }

    /// The fully qualified Kubernetes names `name` may be short for, asked
    /// from a pod in `namespace` (ztunnel's rules, by label count):
    /// - 1 label, `web`: `web.<ns>.svc.<domain>`;
    /// - 2, `web.shop`: `web.shop.svc.<domain>`, then (a pod host with its
    ///   subdomain) `web.shop.<ns>.svc.<domain>`;
    /// - 3: `web.shop.svc` → `web.shop.svc.<domain>` when it ends in `svc`;
    ///   then always `<3 labels>.svc.<domain>`;
    /// - 4 ending in `svc`: `<4 labels>.<domain>`;
    /// - anything else is taken as already qualified: nothing.
    pub fn kube_fqdns(&self, name: &str, namespace: &str) -> Vec<String> {
        let in_namespace = |n: &str| {
            (!namespace.is_empty()).then(|| format!("{n}.{namespace}.{}", self.svc_domain))
        };
        let ends_in_svc = name.rsplit('.').next() == Some("svc");
        match label_count(name) {
            1 => in_namespace(name).into_iter().collect(),
            2 => std::iter::once(format!("{name}.{}", self.svc_domain))
                .chain(in_namespace(name))
                .collect(),
            3 => {
                let mut out = Vec::with_capacity(2);
                if ends_in_svc {
                    out.push(format!("{name}.{}", self.domain));
                }
                out.push(format!("{name}.{}", self.svc_domain));
                out
            }
            4 if ends_in_svc => vec![format!("{name}.{}", self.domain)],
            _ => Vec::new(),
        }
    }

    /// Every candidate for `name` asked from a pod in `namespace`, first
    /// to try first, each once: the name, then its Kubernetes expansions.
    pub fn aliases(&self, name: &str, namespace: &str) -> Vec<String> {
        let mut out = vec![name.to_owned()];
        for fqdn in self.kube_fqdns(name, namespace) {
            if !out.contains(&fqdn) {
                out.push(fqdn);
            }
        }
        out
    }
}

impl Default for ClusterDomain {
    fn default() -> Self {
        ClusterDomain::new(DEFAULT_CLUSTER_DOMAIN)
    }
}

/// `name` as the lookups compare it: ASCII lowercase (DNS names are
/// case-insensitive; hickory's server hands ztunnel the lowercased query),
/// no trailing dot.
pub fn normalize(name: &str) -> Cow<'_, str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

/// Labels in `name`; the root ("") has none.
pub fn label_count(name: &str) -> usize {
    if name.is_empty() {
        0
    } else {
        name.split('.').count()
    }
}

/// Whether `name` ends with all of `domain`'s labels and has at least one
/// more. A wildcard domain matches nothing.
pub fn has_domain(name: &str, domain: &str) -> bool {
    trim_domain(name, domain).is_some()
}

/// `name` without `domain`'s labels at its end; None unless
/// [`has_domain`] (so never empty).
pub fn trim_domain<'a>(name: &'a str, domain: &str) -> Option<&'a str> {
    if domain.is_empty() || domain == "*" || domain.starts_with("*.") {
        return None;
    }
    let head = name.strip_suffix(domain)?.strip_suffix('.')?;
    (!head.is_empty()).then_some(head)
}

/// `name`, then `name` with its first label replaced by `*`, then with its
/// first two labels replaced by one `*`, ... down to `*.<last label>`:
/// the hosts a ServiceEntry-style wildcard service may be listed under,
/// most specific first. A one-label name has no wildcards.
pub fn wildcards(name: &str) -> impl Iterator<Item = Cow<'_, str>> {
    let dots = name.match_indices('.').map(|(i, _)| i);
    std::iter::once(Cow::Borrowed(name))
        .chain(dots.map(move |i| Cow::Owned(format!("*{}", &name[i..]))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_fqdns_by_label_count() {
        let d = ClusterDomain::default();
        let cases: &[(&str, &[&str])] = &[
            ("web", &["web.ns1.svc.cluster.local"]),
            (
                "web.ns2",
                &["web.ns2.svc.cluster.local", "web.ns2.ns1.svc.cluster.local"],
            ),
            (
                "web.ns2.svc",
                &["web.ns2.svc.cluster.local", "web.ns2.svc.svc.cluster.local"],
            ),
            ("web.ns2.other", &["web.ns2.other.svc.cluster.local"]),
            ("pod.sub.ns.svc", &["pod.sub.ns.svc.cluster.local"]),
            ("pod.sub.ns.other", &[]),
            ("web.ns2.svc.cluster", &[]),
            ("web.ns2.svc.cluster.local", &[]),
            ("www.example.com", &["www.example.com.svc.cluster.local"]),
            ("", &[]),
        ];
        for (name, want) in cases {
            assert_eq!(d.kube_fqdns(name, "ns1"), *want, "{name}");
        }
    }

    #[test]
    fn aliases_leave_search_suffixes_on() {
        let d = ClusterDomain::default();
        // As the reference ztunnel: no stripping, and a name of more than
        // four labels has no expansion, so this is the only candidate.
        assert_eq!(
            d.aliases("web.ns1.ns1.svc.cluster.local", "ns1"),
            ["web.ns1.ns1.svc.cluster.local"]
        );
        assert_eq!(
            d.aliases("web.ns1.svc.cluster.local.ns1.svc.cluster.local", "ns1"),
            ["web.ns1.svc.cluster.local.ns1.svc.cluster.local"]
        );
    }

    #[test]
    fn aliases_of_a_short_name() {
        let d = ClusterDomain::default();
        assert_eq!(
            d.aliases("web", "shop"),
            ["web", "web.shop.svc.cluster.local"]
        );
    }

    #[test]
    fn trim_and_has_domain() {
        assert_eq!(
            trim_domain("web.ns.svc.cluster.local", "svc.cluster.local"),
            Some("web.ns")
        );
        assert_eq!(trim_domain("svc.cluster.local", "svc.cluster.local"), None);
        assert_eq!(trim_domain("xsvc.cluster.local", "svc.cluster.local"), None);
        assert_eq!(trim_domain("a.example.com", "*.example.com"), None);
        assert!(has_domain("web.ns.svc", "svc"));
        assert!(!has_domain("svc", "svc"));
    }

    #[test]
    fn wildcards_most_specific_first() {
        let got: Vec<_> = wildcards("svc1.ns1.svc.cluster.local").collect();
        assert_eq!(
            got,
            [
                "svc1.ns1.svc.cluster.local",
                "*.ns1.svc.cluster.local",
                "*.svc.cluster.local",
                "*.cluster.local",
                "*.local",
            ]
        );
        assert_eq!(wildcards("svc1").collect::<Vec<_>>(), ["svc1"]);
    }

    #[test]
    fn normalize_lowercases_and_drops_the_root_dot() {
        assert_eq!(normalize("Web.Shop."), "web.shop");
        assert!(matches!(normalize("web.shop"), Cow::Borrowed(_)));
        assert_eq!(normalize("."), "");
    }
}
