//! The mesh as plain values, with no I/O: workloads, services and
//! authorization policies (this module), workload identities ([`identity`]),
//! the immutable, indexed [`snapshot`] of them that cores read, and the
//! authorization decision over them ([`authz`]).
//!
//! These are plain owned values with no serde or protobuf attached, so every
//! source (local YAML, xDS) converts into the same types. They are built on
//! the control thread and shared read-only with every core through `Arc`,
//! hence `Send + Sync` and no interior mutability. Decisions that need no I/O
//! belong next to the model they read, in here.
//!
//! Nothing in `model/` imports anything outside `model/`.

pub mod authz;
pub mod identity;
pub mod routing;
pub mod snapshot;
pub mod strings;
pub mod time;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::model::identity::Identity;
pub use crate::model::strings::{intern, Str, SubStr};

/// Service account assumed when a workload doesn't name one.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Trust domain assumed when a workload doesn't name one.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// HBONE port of a gateway (waypoint, network gateway) unless it says otherwise.
pub const DEFAULT_HBONE_MTLS_PORT: u16 = 15008;

/// A workload (pod, VM, ...) as pushed by the control plane. `uid` is the
/// primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub uid: Str,
    /// A slice of `uid` where the uid ends with it (see
    /// [`strings::name_within`]).
    pub name: SubStr,
    pub namespace: Str,
    pub service_account: Str,
    pub trust_domain: Str,
    pub addresses: Box<[IpAddr]>,
    pub hostname: Str,
    pub network: Str,
    pub protocol: TunnelProtocol,
    pub node: Str,
    pub canonical_name: Str,
    pub canonical_revision: Str,
    pub workload_name: Str,
    pub workload_type: WorkloadType,
    pub status: WorkloadStatus,
    pub cluster_id: Str,
    /// Policy keys ("ns/name") selected for this workload (scope
    /// `WorkloadSelector`); unknown keys are to be skipped, not fatal.
    pub authorization_policies: Box<[Str]>,
    /// Services this workload backs, keyed "ns/hostname", with the port
    /// mapping as seen from this workload (target ports are per pod).
    pub services: ServicePorts,
    pub locality: Option<Locality>,
    pub network_mode: NetworkMode,
    /// Relative load-balancing weight.
    pub capacity: u32,
    /// Boxed, as `network_gateway`: most workloads have neither, and inline
    /// the two cost 80 bytes on every workload.
    pub waypoint: Option<Box<GatewayAddress>>,
    pub network_gateway: Option<Box<GatewayAddress>>,
    pub native_tunnel: bool,
    pub application_tunnel: Option<ApplicationTunnel>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            uid: Str::new(),
            name: SubStr::default(),
            namespace: Str::new(),
            service_account: Str::from(DEFAULT_SERVICE_ACCOUNT),
            trust_domain: Str::from(DEFAULT_TRUST_DOMAIN),
            addresses: Box::default(),
            hostname: Str::new(),
            network: Str::new(),
            protocol: TunnelProtocol::default(),
            node: Str::new(),
            canonical_name: Str::new(),
            canonical_revision: Str::new(),
            workload_name: Str::new(),
            workload_type: WorkloadType::default(),
            status: WorkloadStatus::default(),
            cluster_id: Str::new(),
            authorization_policies: Box::default(),
            services: ServicePorts::default(),
            locality: None,
            network_mode: NetworkMode::default(),
            capacity: 1,
            waypoint: None,
            network_gateway: None,
            native_tunnel: false,
            application_tunnel: None,
        }
    }
}

/// A workload's SPIFFE ID as a `Display` value (see [`Workload::spiffe`]).
pub struct SpiffeId<'a>(&'a Workload);

impl fmt::Display for SpiffeId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.0;
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            w.trust_domain, w.namespace, w.service_account
        )
    }
}

impl Workload {
    /// The workload's identity, `spiffe://<td>/ns/<ns>/sa/<sa>`: what its
    /// certificate carries and what peers verify.
    pub fn spiffe_id(&self) -> String {
        self.spiffe().to_string()
    }

    /// [`spiffe_id`](Self::spiffe_id) without building a string: for
    /// writing it where it goes (a metric label, a log field).
    pub fn spiffe(&self) -> SpiffeId<'_> {
        SpiffeId(self)
    }

    /// Whether `id` is this workload's identity (what a peer certificate
    /// must show to be this workload).
    pub fn has_identity(&self, id: &Identity) -> bool {
        self.trust_domain == id.trust_domain
            && self.namespace == id.namespace
            && self.service_account == id.service_account
    }

    /// The same identity as a value (not validated: a workload with, say, an
    /// empty namespace yields an identity the CA will refuse to sign).
    pub fn identity(&self) -> Identity {
        Identity::new(
            self.trust_domain.clone(),
            self.namespace.clone(),
            self.service_account.clone(),
        )
    }
}

/// A workload named by its namespace, name and service account, as the
/// proxy is told whom it speaks for: ztunnel's `PROXY_WORKLOAD_INFO` in
/// dedicated mode, or the node agent's description of an enrolled pod.
/// Written and parsed as `namespace/name/service-account`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadName {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

impl WorkloadName {
    /// Whether `w` is the workload so named.
    pub fn is(&self, w: &Workload) -> bool {
        w.namespace == self.namespace
            && w.name == self.name
            && w.service_account == self.service_account
    }
}

impl fmt::Display for WorkloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.namespace, self.name, self.service_account
        )
    }
}

impl std::str::FromStr for WorkloadName {
    type Err = String;

    /// "namespace/name/service-account", three non-empty parts.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split('/').collect::<Vec<_>>()[..] {
            [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => {
                Ok(WorkloadName {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    service_account: sa.to_owned(),
                })
            }
            _ => Err(format!(
                "{s:?}: expected namespace/name/service-account (three non-empty parts)"
            )),
        }
    }
}

/// How traffic to a workload is carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TunnelProtocol {
    /// Plain TCP: the workload is not in the mesh (YAML `TCP`).
    #[default]
    None,
    /// HTTP/2 CONNECT over mTLS to port 15008 (YAML `HBONE`).
    Hbone,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WorkloadType {
    #[default]
    Deployment,
    CronJob,
    Pod,
    Job,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WorkloadStatus {
    #[default]
    Healthy,
    Unhealthy,
}

/// A host-network workload shares the node's IP, so it is not looked up by
/// address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NetworkMode {
    #[default]
    Standard,
    HostNetwork,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Locality {
    pub region: Str,
    pub zone: Str,
    pub subzone: Str,
}

/// Service port → target (container) port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortMapping {
    pub service_port: u16,
    /// On a [`Service`], 0 means "take it from the endpoint's own mapping"
    /// (Kubernetes named target ports resolve per pod).
    pub target_port: u16,
}

/// An IP on a named network ("" is the default network).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkAddress {
    pub network: Str,
    pub ip: IpAddr,
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.ip)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamespacedHostname {
    pub namespace: Str,
    pub hostname: Str,
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// Where a waypoint or network gateway is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayAddress {
    pub destination: GatewayDestination,
    pub hbone_mtls_port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayDestination {
    /// A service, resolved through the snapshot at connection time.
    Hostname(NamespacedHostname),
    Address(NetworkAddress),
}

/// "ns/hostname" or "network/IP", as the config writes them.
impl fmt::Display for GatewayDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayDestination::Hostname(h) => h.fmt(f),
            GatewayDestination::Address(a) => a.fmt(f),
        }
    }
}

/// How a workload's own proxy (e.g. a sandwiched waypoint) wants to receive
/// traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApplicationTunnel {
    pub protocol: ApplicationTunnelProtocol,
    /// None: the original destination port.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ApplicationTunnelProtocol {
    #[default]
    None,
    /// PROXY protocol v2 header in front of the stream.
    Proxy,
}

/// A service: a hostname plus VIPs that load-balance over its endpoints
/// (the workloads whose `services` map names it). Key: "ns/hostname".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Service {
    pub name: Str,
    pub namespace: Str,
    pub hostname: Str,
    pub vips: Vec<NetworkAddress>,
    pub ports: Vec<PortMapping>,
    pub subject_alt_names: Vec<Str>,
    pub waypoint: Option<GatewayAddress>,
    pub load_balancer: Option<LoadBalancer>,
    /// Preferred when the same hostname exists in several namespaces.
    pub canonical: bool,
    /// Address ranges that are this service: any address inside one is
    /// routed like a VIP (after exact VIPs, longest prefix first).
    pub cidr_vips: Vec<NetworkCidr>,
    /// Kept as received and shown, not used for routing: istiod sends
    /// `waypoint` as well where traffic should go through one.
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// None: decided by the addresses (AUTOMATIC). Kept as received; only
    /// DNS answers would use it.
    pub ip_families: Option<IpFamilies>,
    /// Kept as received, not enforced (see docs/routing.md).
    pub visibility: Visibility,
}

/// A CIDR VIP: a prefix on a named network.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkCidr {
    pub network: Str,
    pub cidr: Cidr,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightedWaypoint {
    pub waypoint: GatewayAddress,
    pub weight: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamilies {
    Ipv4,
    Ipv6,
    Dual,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Visibility {
    #[default]
    Public,
    /// Meant for clients in the service's own namespace.
    Namespace,
}

impl Service {
    /// The primary key, "ns/hostname" (the xDS resource name).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

/// Whether `s` has the shape of a service key, "ns/hostname": both parts
/// non-empty and a single slash. Every config source checks with this.
pub fn is_namespaced(s: &str) -> bool {
    matches!(s.split_once('/'), Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('/'))
}

/// `value`, or `default` when the source left it empty (proto3 and YAML
/// alike use "" for "not set").
pub fn or_str<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() {
        default
    } else {
        value
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancer {
    /// Locality scopes to match, most important first.
    pub routing_preferences: Vec<LbScope>,
    pub mode: LbMode,
    pub health_policy: LbHealthPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbScope {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LbMode {
    /// Ignore routing preferences.
    #[default]
    Standard,
    /// Only endpoints matching every preference; otherwise fail.
    Strict,
    /// Prefer endpoints matching the most preferences.
    Failover,
    /// No endpoint selection: connect to the original destination.
    Passthrough,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LbHealthPolicy {
    #[default]
    OnlyHealthy,
    AllowAll,
}

/// An authorization policy as ztunnel receives it (already flattened by
/// istiod). Key: "ns/name". Evaluated by [`authz`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: PolicyScope,
    pub action: PolicyAction,
    pub dry_run: bool,
    /// Any rule matching makes the policy match; no rules never matches.
    pub rules: Vec<Rule>,
}

impl Policy {
    /// The primary key, "ns/name" (the xDS resource name).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// An authorization resource a config source could not turn into a
/// [`Policy`] (say a CIDR longer than its address family): its key, what
/// could still be read of it, and why not the rest. A snapshot keeps it so
/// that it denies wherever it applies until a readable version arrives: an
/// unreadable policy must never widen access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadablePolicy {
    pub namespace: String,
    pub name: String,
    /// None when not even the scope could be read: the policy is then
    /// applied to its whole namespace (sources that know better, such as
    /// the previous version's scope, fill it in).
    pub scope: Option<PolicyScope>,
    /// A dry-run policy only ever reported; unreadable, it still only
    /// reports.
    pub dry_run: bool,
    pub error: String,
}

impl UnreadablePolicy {
    /// "ns/name", like [`Policy::key`].
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyScope {
    /// Applies to every workload in the mesh.
    Global,
    /// Applies to every workload in the policy's namespace.
    Namespace,
    /// Applies to workloads that list it in `authorization_policies`.
    WorkloadSelector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyAction {
    Allow,
    Deny,
}

/// Matches when every clause matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub clauses: Vec<Clause>,
}

/// Matches when any of its matches does (a clause with none matches).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clause {
    pub matches: Vec<Match>,
}

/// All non-empty field pairs must hold: a positive list needs one hit, a
/// negative (`not_*`) list needs none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub service_accounts: Vec<ServiceAccountMatch>,
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    pub source_ips: Vec<Cidr>,
    pub not_source_ips: Vec<Cidr>,
    pub destination_ips: Vec<Cidr>,
    pub not_destination_ips: Vec<Cidr>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    /// Any non-empty value.
    Presence,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

/// An IP prefix. `prefix_len` never exceeds 32 (IPv4) or 128 (IPv6) when
/// built through [`Cidr::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    /// None if `prefix_len` is too long for the address family.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Option<Cidr> {
        (prefix_len <= max_prefix_len(addr)).then_some(Cidr { addr, prefix_len })
    }

    /// The single-address prefix (/32 or /128).
    pub fn host(addr: IpAddr) -> Cidr {
        Cidr {
            addr,
            prefix_len: max_prefix_len(addr),
        }
    }

    /// Whether `ip` falls inside the prefix; never across address families.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let len = u32::from(self.prefix_len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                (u32::from(net) & mask) == (u32::from(ip) & mask)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let len = u32::from(self.prefix_len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                (u128::from(net) & mask) == (u128::from(ip) & mask)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

fn max_prefix_len(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

// Everything here is shared across cores behind `Arc`.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Workload>();
    send_sync::<Service>();
    send_sync::<Policy>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_take_three_non_empty_parts() {
        assert_eq!(
            "shop/cart-7f9c/cart".parse::<WorkloadName>().unwrap(),
            WorkloadName {
                namespace: "shop".into(),
                name: "cart-7f9c".into(),
                service_account: "cart".into()
            }
        );
        assert_eq!(
            "shop/cart-7f9c/cart"
                .parse::<WorkloadName>()
                .unwrap()
                .to_string(),
            "shop/cart-7f9c/cart"
        );
        for bad in ["shop/cart", "shop//cart", "a/b/c/d", "", "/b/c"] {
            let e = bad.parse::<WorkloadName>().unwrap_err();
            assert!(e.contains("namespace/name/service-account"), "{bad}: {e}");
        }
    }

    #[test]
    fn workload_defaults_and_identity() {
        let w = Workload {
            namespace: "shop".into(),
            ..Workload::default()
        };
        assert_eq!(w.capacity, 1);
        assert_eq!(w.protocol, TunnelProtocol::None);
        assert_eq!(w.spiffe_id(), "spiffe://cluster.local/ns/shop/sa/default");
        let w = Workload {
            trust_domain: "example.org".into(),
            service_account: "cart".into(),
            ..w
        };
        assert_eq!(w.spiffe_id(), "spiffe://example.org/ns/shop/sa/cart");
        assert_eq!(w.identity(), Identity::new("example.org", "shop", "cart"));
        assert_eq!(w.identity().to_string(), w.spiffe_id());
    }

    /// Every byte here is paid once per workload in the mesh (100k on a
    /// big cluster), and with its `Arc` header a workload sits in
    /// jemalloc's 224-byte size class. Grow it only knowingly.
    #[test]
    fn a_workload_stays_compact() {
        assert!(
            std::mem::size_of::<Workload>() <= 208,
            "Workload is {} bytes",
            std::mem::size_of::<Workload>()
        );
    }

    #[test]
    fn keys() {
        let s = Service {
            namespace: "default".into(),
            hostname: "web.default.svc.cluster.local".into(),
            ..Service::default()
        };
        assert_eq!(s.key(), "default/web.default.svc.cluster.local");
        let p = Policy {
            name: "deny-all".into(),
            namespace: "shop".into(),
            scope: PolicyScope::Namespace,
            action: PolicyAction::Deny,
            dry_run: false,
            rules: vec![],
        };
        assert_eq!(p.key(), "shop/deny-all");
    }

    #[test]
    fn cidr_contains() {
        let net = Cidr::new("10.1.0.0".parse().unwrap(), 16).unwrap();
        assert!(net.contains("10.1.255.3".parse().unwrap()));
        assert!(!net.contains("10.2.0.1".parse().unwrap()));
        assert!(!net.contains("::ffff:10.1.0.1".parse().unwrap()));
        let all = Cidr::new("0.0.0.0".parse().unwrap(), 0).unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let host = Cidr::host("2001:db8::1".parse().unwrap());
        assert_eq!(host.prefix_len, 128);
        assert!(host.contains("2001:db8::1".parse().unwrap()));
        assert!(!host.contains("2001:db8::2".parse().unwrap()));
        let v6 = Cidr::new("2001:db8::".parse().unwrap(), 32).unwrap();
        assert!(v6.contains("2001:db8:ffff::9".parse().unwrap()));
        assert!(Cidr::new("10.0.0.0".parse().unwrap(), 33).is_none());
        assert!(Cidr::new("::".parse().unwrap(), 129).is_none());
        assert_eq!(net.to_string(), "10.1.0.0/16");
    }
}

/// The services a workload backs: "ns/hostname" → port mappings, sorted by
/// key. Not a `BTreeMap`: most workloads back one or two services, and a
/// B-tree leaf costs ~530 bytes even for one entry — at 100k workloads that
/// alone broke the 1 KiB-per-workload budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicePorts(Box<[(Str, Vec<PortMapping>)]>);

impl ServicePorts {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&Vec<PortMapping>> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Inserts or replaces; returns the previous ports for `key`.
    pub fn insert(
        &mut self,
        key: impl Into<Str>,
        ports: Vec<PortMapping>,
    ) -> Option<Vec<PortMapping>> {
        let key = key.into();
        let mut ports = ports;
        ports.shrink_to_fit();
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, ports)),
            Err(i) => {
                // Exact-size storage: rebuilt on insert, which only config
                // sources do, a few entries at a time.
                let mut v = std::mem::take(&mut self.0).into_vec();
                v.insert(i, (key, ports));
                self.0 = v.into_boxed_slice();
                None
            }
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &Str> + '_ {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Str, &Vec<PortMapping>)> + '_ {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<Str>> FromIterator<(K, Vec<PortMapping>)> for ServicePorts {
    fn from_iter<I: IntoIterator<Item = (K, Vec<PortMapping>)>>(iter: I) -> Self {
        let mut out = ServicePorts::default();
        for (k, v) in iter {
            out.insert(k, v);
        }
        out
    }
}

impl<K: Into<Str>> From<BTreeMap<K, Vec<PortMapping>>> for ServicePorts {
    fn from(map: BTreeMap<K, Vec<PortMapping>>) -> Self {
        // Already sorted and unique (a key's order is its text's).
        ServicePorts(
            map.into_iter()
                .map(|(k, mut p)| {
                    p.shrink_to_fit();
                    (k.into(), p)
                })
                .collect(),
        )
    }
}

impl<K: Into<Str>, const N: usize> From<[(K, Vec<PortMapping>); N]> for ServicePorts {
    fn from(items: [(K, Vec<PortMapping>); N]) -> Self {
        items.into_iter().collect()
    }
}

impl IntoIterator for ServicePorts {
    type Item = (Str, Vec<PortMapping>);
    type IntoIter = std::vec::IntoIter<(Str, Vec<PortMapping>)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_vec().into_iter()
    }
}

impl std::ops::Index<&str> for ServicePorts {
    type Output = Vec<PortMapping>;
    fn index(&self, key: &str) -> &Vec<PortMapping> {
        self.get(key)
            .unwrap_or_else(|| panic!("no service {key:?}"))
    }
}
