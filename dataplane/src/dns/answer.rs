//! What the DNS proxy answers for one question, from the mesh snapshot and
//! the asking workload, as ztunnel answers it. Pure: the caller parses the
//! query, calls [`decide`], and writes the [`Decision`] out (see
//! [`message`](super::message)).
//!
//! ztunnel's rules, which these follow:
//! - Only A and AAAA are answered from the mesh; every other type is
//!   forwarded upstream, mesh name or not.
//! - The name is tried as its [candidates](super::names) (Kubernetes
//!   short forms expanded, wildcards; search suffixes are not stripped);
//!   the first candidate with a service answers. A name no service has is
//!   forwarded: ztunnel never says NXDOMAIN itself.
//! - A service without VIPs answers only if it is a Kubernetes (headless)
//!   Service, `*.svc.<cluster domain>`, with its healthy endpoints'
//!   addresses (one per endpoint, of the family asked); any other
//!   VIP-less service (a DNS-resolved ServiceEntry) is forwarded.
//! - A service with VIPs answers its VIPs on the asking pod's network, of
//!   the family asked.
//! - Found but nothing of that family (or the service's `ip_families`
//!   excludes it, or IPv6 is off): NOERROR with no records, authoritative.
//! - Every record has a TTL of 30 s.
//! - An asking pod ztunnel does not know gets SERVFAIL, whatever it asks.
//!
//! Workload hostnames on their own are not answered: ztunnel's answers
//! come from services only (its older releases also answered a
//! workload's `hostname`; the reference binary forwards it). Every rule
//! above was checked against that binary, except namespace-only
//! visibility (taken from its log line) and the choice among services
//! sharing a hostname (from its source).

use std::net::IpAddr;
use std::sync::Arc;

use ringway_controlplane::model::{
    IpFamilies, LbHealthPolicy, Service, Visibility, Workload, WorkloadStatus,
};
use ringway_controlplane::Snapshot;

use super::names::{normalize, wildcards, ClusterDomain};

/// TTL of every record the proxy answers from the mesh (ztunnel's, fixed).
pub const MESH_TTL: u32 = 30;

/// The DNS proxy's settings that change its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// ztunnel's `CLUSTER_DOMAIN`.
    pub cluster: ClusterDomain,
    /// ztunnel's `IPV6_ENABLED`: when off, AAAA questions for mesh names
    /// get an empty answer.
    pub ipv6_enabled: bool,
    /// ztunnel's `PREFERED_SERVICE_NAMESPACE`: which namespace's service
    /// answers a hostname several namespaces define, after the asking
    /// pod's own namespace and a canonical service.
    pub preferred_namespace: Option<String>,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            cluster: ClusterDomain::default(),
            ipv6_enabled: true,
            preferred_namespace: None,
        }
    }
}

/// Which addresses a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A.
    V4,
    /// AAAA.
    V6,
}

impl Family {
    fn admits(self, ip: &IpAddr) -> bool {
        match self {
            Family::V4 => ip.is_ipv4(),
            Family::V6 => ip.is_ipv6(),
        }
    }
}

/// What to do with one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A mesh name with addresses of the family asked: answer them
    /// (authoritatively).
    Answer(Answer),
    /// A mesh name with no address of the family asked: NOERROR, no
    /// records (authoritatively). Not NXDOMAIN: the name exists.
    NoData,
    /// Not the mesh's to answer: ask the upstream resolvers.
    Forward,
    /// The asking pod is not a workload the snapshot knows: SERVFAIL.
    UnknownClient,
}

/// A mesh answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// In snapshot order; ztunnel shuffles them per answer (DNS load
    /// balancing), which is the writer's to do ([`Answer::shuffle`]).
    pub addresses: Vec<IpAddr>,
    pub ttl: u32,
}

impl Answer {
    /// A fresh order per answer, as ztunnel gives, so that clients which
    /// take the first address spread over the endpoints.
    pub fn shuffle(&mut self, rng: &mut fastrand::Rng) {
        rng.shuffle(&mut self.addresses);
    }
}

/// The decision for the question `name` (as asked: any case, trailing dot
/// or not) of type A (`Some(V4)`), AAAA (`Some(V6)`) or anything else
/// (`None`), from `client` (None: the asking pod is unknown).
pub fn decide(
    snapshot: &Snapshot,
    settings: &DnsSettings,
    client: Option<&Workload>,
    name: &str,
    family: Option<Family>,
) -> Decision {
    let Some(client) = client else {
        return Decision::UnknownClient;
    };
    let Some(family) = family else {
        return Decision::Forward;
    };
    let name = normalize(name);
    let Some(service) = find_service(snapshot, settings, client, &name) else {
        return Decision::Forward;
    };
    if !family_allowed(service, family, settings.ipv6_enabled) {
        return Decision::NoData;
    }
    let addresses = addresses(snapshot, client, service, family);
    if addresses.is_empty() {
        return Decision::NoData;
    }
    Decision::Answer(Answer {
        addresses,
        ttl: MESH_TTL,
    })
}

fn find_service<'s>(
    snapshot: &'s Snapshot,
    settings: &DnsSettings,
    client: &Workload,
    name: &str,
) -> Option<&'s Arc<Service>> {
    for alias in settings.cluster.aliases(name, &client.namespace) {
        for host in wildcards(&alias) {
            let candidates = snapshot
                .services_by_hostname(&host)
                .iter()
                .filter(|s| answerable(s, &settings.cluster) && visible_to(s, client));
            if let Some(service) = best_match(
                candidates,
                &client.namespace,
                settings.preferred_namespace.as_deref(),
            ) {
                return Some(service);
            }
        }
    }
    None
}

/// A service with VIPs, or a Kubernetes headless Service: ztunnel answers
/// for these. Another VIP-less service (a ServiceEntry resolved by DNS) is
/// left to the upstream resolvers.
fn answerable(service: &Service, cluster: &ClusterDomain) -> bool {
    !service.vips.is_empty() || is_kubernetes_headless(service, cluster)
}

fn is_kubernetes_headless(service: &Service, cluster: &ClusterDomain) -> bool {
    service.vips.is_empty()
        && service
            .hostname
            .strip_suffix(cluster.svc_domain())
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// A service exported only to its own namespace is not answered to pods
/// of other namespaces.
fn visible_to(service: &Service, client: &Workload) -> bool {
    service.visibility != Visibility::Namespace || service.namespace == client.namespace
}

/// Among services sharing a hostname (ServiceEntry lets namespaces reuse
/// one), ztunnel's pick: the asking pod's namespace; else the last
/// canonical one; else the preferred namespace's; else the first.
fn best_match<'s>(
    services: impl Iterator<Item = &'s Arc<Service>>,
    client_namespace: &str,
    preferred_namespace: Option<&str>,
) -> Option<&'s Arc<Service>> {
    let mut canonical = None;
    let mut preferred = None;
    let mut first = None;
    for s in services {
        if s.namespace.as_str() == client_namespace {
            return Some(s);
        }
        if s.canonical {
            canonical = Some(s);
        } else if preferred_namespace.is_some_and(|p| !p.is_empty() && s.namespace.as_str() == p) {
            preferred = Some(s);
        } else if first.is_none() {
            first = Some(s);
        }
    }
    canonical.or(preferred).or(first)
}

/// ztunnel's family rules: a service declared single-stack answers nothing
/// for the other family (a headless service's pods may be dual-stack even
/// so); AAAA is never answered with IPv6 off.
fn family_allowed(service: &Service, family: Family, ipv6_enabled: bool) -> bool {
    if family == Family::V6 && !ipv6_enabled {
        return false;
    }
    !matches!(
        (service.ip_families, family),
        (Some(IpFamilies::Ipv4), Family::V6) | (Some(IpFamilies::Ipv6), Family::V4)
    )
}

fn addresses(
    snapshot: &Snapshot,
    client: &Workload,
    service: &Service,
    family: Family,
) -> Vec<IpAddr> {
    if service.vips.is_empty() {
        // Headless: the endpoints, one address each.
        let allow_unhealthy = service
            .load_balancer
            .as_ref()
            .is_some_and(|lb| lb.health_policy == LbHealthPolicy::AllowAll);
        snapshot
            .endpoints(&service.key())
            .iter()
            .filter(|w| allow_unhealthy || w.status == WorkloadStatus::Healthy)
            .filter_map(|w| w.addresses.iter().copied().find(|ip| family.admits(ip)))
            .collect()
    } else {
        service
            .vips
            .iter()
            .filter(|v| v.network == client.network && family.admits(&v.ip))
            .map(|v| v.ip)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_controlplane::model::{LoadBalancer, NetworkAddress};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn service(ns: &str, host: &str, vips: &[&str]) -> Service {
        service_on(ns, host, "", vips)
    }

    fn service_on(ns: &str, host: &str, network: &str, vips: &[&str]) -> Service {
        Service {
            name: host.split('.').next().unwrap().into(),
            namespace: ns.into(),
            hostname: host.into(),
            vips: vips
                .iter()
                .map(|a| NetworkAddress {
                    network: network.into(),
                    ip: ip(a),
                })
                .collect(),
            ..Service::default()
        }
    }

    fn workload(uid: &str, ns: &str, addrs: &[&str], services: &[&str]) -> Workload {
        Workload {
            uid: uid.into(),
            name: uid.into(),
            namespace: ns.into(),
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            services: services.iter().map(|s| (s.to_string(), vec![])).collect(),
            ..Workload::default()
        }
    }

    /// The mesh every row asks of: one of each kind of name.
    fn mesh() -> Snapshot {
        let mut headless_v4 = service("ns1", "headless-v4.ns1.svc.cluster.local", &[]);
        headless_v4.ip_families = Some(IpFamilies::Ipv4);
        let mut canonical = service("ns3", "shared.io", &["10.3.3.3"]);
        canonical.canonical = true;
        let mut private = service("ns2", "private.ns2.svc.cluster.local", &["5.5.5.5"]);
        private.visibility = Visibility::Namespace;
        let mut lenient = service("ns1", "lenient.ns1.svc.cluster.local", &[]);
        lenient.load_balancer = Some(LoadBalancer {
            routing_preferences: vec![],
            mode: Default::default(),
            health_policy: LbHealthPolicy::AllowAll,
        });
        let services = vec![
            service("ns1", "productpage.ns1.svc.cluster.local", &["9.9.9.9"]),
            service("ns2", "example.ns2.svc.cluster.local", &["10.10.10.10"]),
            service(
                "ns1",
                "dual.ns1.svc.cluster.local",
                &["2.2.2.2", "2001:db8::2"],
            ),
            service("ns1", "headless.ns1.svc.cluster.local", &[]),
            headless_v4,
            lenient,
            service("ns1", "*.example.com", &["10.1.2.3"]),
            service("ns1", "external.example.org", &[]),
            service_on("ns1", "nw2.ns1.svc.cluster.local", "nw2", &["7.7.7.7"]),
            service("ns2", "shared.io", &["10.2.2.2"]),
            canonical,
            private,
            service("ns2", "pref.io", &["10.20.0.2"]),
            service("ns4", "pref.io", &["10.20.0.4"]),
        ];
        let mut sick = workload(
            "w3",
            "ns1",
            &["32.32.32.32"],
            &[
                "ns1/headless.ns1.svc.cluster.local",
                "ns1/lenient.ns1.svc.cluster.local",
            ],
        );
        sick.status = WorkloadStatus::Unhealthy;
        let workloads = vec![
            workload("client1", "ns1", &["10.0.0.1"], &[]),
            workload("client2", "ns2", &["10.0.0.2"], &[]),
            workload(
                "w1",
                "ns1",
                &["30.30.30.30", "2001:db8::30"],
                &["ns1/headless.ns1.svc.cluster.local"],
            ),
            workload(
                "w2",
                "ns1",
                &["31.31.31.31"],
                &["ns1/headless.ns1.svc.cluster.local"],
            ),
            sick,
            workload(
                "w4",
                "ns1",
                &["40.40.40.40", "2001:db8::40"],
                &["ns1/headless-v4.ns1.svc.cluster.local"],
            ),
        ];
        Snapshot::new(workloads, services, vec![]).unwrap()
    }

    fn answer(addrs: &[&str]) -> Decision {
        Decision::Answer(Answer {
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            ttl: MESH_TTL,
        })
    }

    /// The decision for `name` asked by the workload `client` (a uid).
    fn ask(
        snap: &Snapshot,
        settings: &DnsSettings,
        client: &str,
        name: &str,
        family: Option<Family>,
    ) -> Decision {
        let client = snap.workload_by_uid(client).map(|w| &**w);
        decide(snap, settings, client, name, family)
    }

    const A: Option<Family> = Some(Family::V4);
    const AAAA: Option<Family> = Some(Family::V6);
    const OTHER: Option<Family> = None;

    #[test]
    fn decisions_follow_ztunnels_rules() {
        use Decision::{Forward, NoData, UnknownClient};
        let snap = mesh();
        let settings = DnsSettings::default();
        // (why, asking client uid, name, type, decision)
        let rows: Vec<(&str, &str, &str, Option<Family>, Decision)> = vec![
            (
                "service, short name in own namespace",
                "client1",
                "productpage",
                A,
                answer(&["9.9.9.9"]),
            ),
            (
                "service, name.namespace",
                "client1",
                "productpage.ns1",
                A,
                answer(&["9.9.9.9"]),
            ),
            (
                "service, name.namespace.svc",
                "client1",
                "productpage.ns1.svc",
                A,
                answer(&["9.9.9.9"]),
            ),
            (
                "service, fully qualified",
                "client1",
                "productpage.ns1.svc.cluster.local.",
                A,
                answer(&["9.9.9.9"]),
            ),
            (
                "names are case-insensitive",
                "client1",
                "ProductPage.NS1.svc.Cluster.Local",
                A,
                answer(&["9.9.9.9"]),
            ),
            (
                "a search suffix on a full name is not stripped: forwarded",
                "client1",
                "productpage.ns1.svc.cluster.local.ns1.svc.cluster.local",
                A,
                Forward,
            ),
            (
                "a search suffix on name.namespace: forwarded",
                "client1",
                "productpage.ns1.ns1.svc.cluster.local",
                A,
                Forward,
            ),
            (
                "svc.cluster.local on a short name: forwarded",
                "client1",
                "productpage.svc.cluster.local",
                A,
                Forward,
            ),
            (
                "cluster.local on a short name: forwarded",
                "client1",
                "productpage.cluster.local",
                A,
                Forward,
            ),
            (
                "short name of another namespace's service is not ours",
                "client1",
                "example",
                A,
                Forward,
            ),
            (
                "another namespace's service by name.namespace",
                "client1",
                "example.ns2",
                A,
                answer(&["10.10.10.10"]),
            ),
            (
                "v4-only VIPs, AAAA: empty, not forwarded",
                "client1",
                "productpage",
                AAAA,
                NoData,
            ),
            (
                "dual-stack VIPs, A",
                "client1",
                "dual.ns1",
                A,
                answer(&["2.2.2.2"]),
            ),
            (
                "dual-stack VIPs, AAAA",
                "client1",
                "dual.ns1",
                AAAA,
                answer(&["2001:db8::2"]),
            ),
            (
                "headless: healthy endpoints, one address each",
                "client1",
                "headless.ns1.svc.cluster.local",
                A,
                answer(&["30.30.30.30", "31.31.31.31"]),
            ),
            (
                "headless, AAAA: endpoints that have one",
                "client1",
                "headless",
                AAAA,
                answer(&["2001:db8::30"]),
            ),
            (
                "headless with AllowAll health policy: unhealthy endpoints too",
                "client1",
                "lenient",
                A,
                answer(&["32.32.32.32"]),
            ),
            (
                "headless declared IPv4-only, dual-stack pods, AAAA: empty",
                "client1",
                "headless-v4",
                AAAA,
                NoData,
            ),
            (
                "headless declared IPv4-only, A",
                "client1",
                "headless-v4",
                A,
                answer(&["40.40.40.40"]),
            ),
            (
                "wildcard host",
                "client1",
                "www.example.com",
                A,
                answer(&["10.1.2.3"]),
            ),
            (
                "wildcard host, deeper name",
                "client1",
                "a.b.example.com",
                A,
                answer(&["10.1.2.3"]),
            ),
            (
                "wildcard host under a search suffix: forwarded",
                "client1",
                "www.example.com.ns1.svc.cluster.local",
                A,
                Forward,
            ),
            (
                "the wildcard's own domain is not under it",
                "client1",
                "example.com",
                A,
                Forward,
            ),
            (
                "VIP-less ServiceEntry (DNS resolution): upstream's",
                "client1",
                "external.example.org",
                A,
                Forward,
            ),
            (
                "VIP only on another network: empty",
                "client1",
                "nw2",
                A,
                NoData,
            ),
            (
                "shared hostname: the canonical one for other namespaces",
                "client1",
                "shared.io",
                A,
                answer(&["10.3.3.3"]),
            ),
            (
                "shared hostname: the asking pod's namespace first",
                "client2",
                "shared.io",
                A,
                answer(&["10.2.2.2"]),
            ),
            (
                "shared hostname, none canonical: the first",
                "client1",
                "pref.io",
                A,
                answer(&["10.20.0.2"]),
            ),
            (
                "namespace-only service, other namespace: upstream's",
                "client1",
                "private.ns2",
                A,
                Forward,
            ),
            (
                "namespace-only service, own namespace",
                "client2",
                "private",
                A,
                answer(&["5.5.5.5"]),
            ),
            ("unknown name", "client1", "nothing.ns1", A, Forward),
            ("the root", "client1", ".", A, Forward),
            (
                "MX of a mesh name: forwarded",
                "client1",
                "productpage",
                OTHER,
                Forward,
            ),
            (
                "unknown asking pod: SERVFAIL",
                "nobody",
                "productpage.ns1",
                A,
                UnknownClient,
            ),
            (
                "unknown asking pod, any type: SERVFAIL",
                "nobody",
                "productpage.ns1",
                OTHER,
                UnknownClient,
            ),
        ];
        for (why, client, name, family, want) in rows {
            let got = ask(&snap, &settings, client, name, family);
            assert_eq!(got, want, "{why}: {name}");
        }
    }

    #[test]
    fn ipv6_off_empties_every_aaaa() {
        let snap = mesh();
        let settings = DnsSettings {
            ipv6_enabled: false,
            ..DnsSettings::default()
        };
        assert_eq!(
            ask(&snap, &settings, "client1", "dual.ns1", AAAA),
            Decision::NoData
        );
        assert_eq!(
            ask(&snap, &settings, "client1", "dual.ns1", A),
            answer(&["2.2.2.2"])
        );
    }

    #[test]
    fn preferred_namespace_wins_over_the_first() {
        let snap = mesh();
        let settings = DnsSettings {
            preferred_namespace: Some("ns4".into()),
            ..DnsSettings::default()
        };
        assert_eq!(
            ask(&snap, &settings, "client1", "pref.io", A),
            answer(&["10.20.0.4"])
        );
        // ... but not over a canonical one.
        assert_eq!(
            ask(&snap, &settings, "client1", "shared.io", A),
            answer(&["10.3.3.3"])
        );
    }

    #[test]
    fn another_cluster_domain() {
        let snap = Snapshot::new(
            vec![workload("c", "ns1", &["10.0.0.1"], &[])],
            vec![service("ns1", "web.ns1.svc.corp.example", &["10.9.0.1"])],
            vec![],
        )
        .unwrap();
        let settings = DnsSettings {
            cluster: ClusterDomain::new("corp.example"),
            ..DnsSettings::default()
        };
        assert_eq!(ask(&snap, &settings, "c", "web", A), answer(&["10.9.0.1"]));
        assert_eq!(
            ask(&snap, &settings, "c", "web.ns1.svc.cluster.local", A),
            Decision::Forward
        );
    }

    #[test]
    fn shuffle_keeps_the_addresses() {
        let Decision::Answer(mut a) = answer(&["1.1.1.1", "2.2.2.2", "3.3.3.3"]) else {
            unreachable!()
        };
        a.shuffle(&mut fastrand::Rng::with_seed(7));
        a.addresses.sort();
        assert_eq!(a.addresses, [ip("1.1.1.1"), ip("2.2.2.2"), ip("3.3.3.3")]);
    }
}
