//! Wire (protobuf) ⇄ model conversion for the two xDS resource types.
//!
//! Decoding is strict about anything that changes where traffic goes or who
//! may send it, and lenient about telemetry-only details:
//!
//! | Input | Result |
//! |---|---|
//! | IP `bytes` that are not 4 or 16 bytes long | error |
//! | empty `uid` / `name` / `namespace` (workload), `name` / `namespace` / `hostname` (service), `name` / `namespace` (policy) | error |
//! | `tunnel_protocol` `LEGACY_ISTIO_MTLS` | error, as in ztunnel (no longer supported) |
//! | unknown value of `tunnel_protocol`, `status`, `network_mode`, application tunnel protocol, load-balancing `mode` / `health_policy` / scope, policy `scope` / `action` | error |
//! | unknown `workload_type` | [`WorkloadType::Deployment`] (only used for telemetry) |
//! | `routing_preference` entry `UNSPECIFIED_SCOPE` | skipped |
//! | `trust_domain` "" / `service_account` "" | `cluster.local` / `default` |
//! | `capacity` absent | 1 |
//! | gateway `hbone_mtls_port` 0 | 15008 |
//! | application tunnel `port` 0 | `None` (the original port) |
//! | ports above 65535, service port 0 | error |
//! | service VIP with a prefix `length` shorter than a host | a CIDR VIP; a `length` longer than the address family allows is an error |
//! | unknown `ip_families` / `visibility` value | error |
//! | `StringMatch` without a value | error |
//! | `ip_families`, `visibility`, `weighted_waypoints` | kept in the model, not used for routing (docs/routing.md) |
//! | `app_protocol`, `ingress_use_waypoint`, `extensions` | ignored |
//!
//! Every error names the offending field, e.g. `addresses[1]: IP address must
//! be 4 or 16 bytes, got 5`; the client prefixes it with the resource name
//! when it builds a NACK. An Authorization that fails is also kept, as an
//! [`UnreadablePolicy`] ([`unreadable_authorization`]), so that it denies
//! where it applies instead of silently widening access. ztunnel differs
//! here: it drops the entries it cannot read (a bad CIDR, a string match
//! without a value) and keeps the rest of the policy, which can turn a
//! narrow ALLOW into a wide one.
//!
//! The opposite direction (model → wire) serves the dev control plane, which
//! publishes a local YAML config over xDS.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::Bytes;
use prost::Message;
use ringway_proto::discovery::Resource;
use ringway_proto::security as spb;
use ringway_proto::workload as wpb;
use ringway_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use crate::model::strings::name_within;
use crate::model::{
    intern, is_namespaced, or_str, ApplicationTunnel, ApplicationTunnelProtocol, Cidr, Clause,
    GatewayAddress, GatewayDestination, LbHealthPolicy, LbMode, LbScope, LoadBalancer, Locality,
    Match, NamespacedHostname, NetworkAddress, NetworkMode, Policy, PolicyAction, PolicyScope,
    PortMapping, Rule, Service, ServiceAccountMatch, Str, StringMatch, TunnelProtocol,
    UnreadablePolicy, Workload, WorkloadStatus, WorkloadType, DEFAULT_HBONE_MTLS_PORT,
    DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN,
};
use crate::model::{IpFamilies, NetworkCidr, Visibility, WeightedWaypoint};

/// Why one resource can't be used. The message starts with the field path
/// when the problem is inside the resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(String);

impl ConvertError {
    pub fn new(message: impl Into<String>) -> ConvertError {
        ConvertError(message.into())
    }

    /// Prefixes the field path: `ctx("waypoint")` turns "no destination"
    /// into "waypoint: no destination".
    fn within(self, field: impl fmt::Display) -> ConvertError {
        ConvertError(format!("{field}: {}", self.0))
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

type Result<T, E = ConvertError> = std::result::Result<T, E>;

fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(ConvertError::new(message))
}

/// One decoded `istio.workload.Address`.
// Short-lived (decoded, then moved into a delta); boxing would only add an
// allocation per resource.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressResource {
    Workload(Workload),
    Service(Service),
}

impl AddressResource {
    /// The xDS resource name: the workload uid or the service's
    /// "namespace/hostname".
    pub fn name(&self) -> String {
        match self {
            AddressResource::Workload(w) => w.uid.to_string(),
            AddressResource::Service(s) => s.key(),
        }
    }

    /// The "network/IP" keys this resource answers to (workload addresses or
    /// service VIPs), as carried in `Resource.aliases`.
    pub fn aliases(&self) -> Vec<String> {
        match self {
            AddressResource::Workload(w) => workload_aliases(w),
            AddressResource::Service(s) => service_aliases(s),
        }
    }
}

/// "network/IP" for each address of a workload (none for host-network ones,
/// which are not looked up by address).
pub fn workload_aliases(w: &Workload) -> Vec<String> {
    if w.network_mode == NetworkMode::HostNetwork {
        return Vec::new();
    }
    w.addresses
        .iter()
        .map(|ip| address_key(&w.network, *ip))
        .collect()
}

/// "network/IP" for each VIP of a service.
pub fn service_aliases(s: &Service) -> Vec<String> {
    s.vips
        .iter()
        .map(|v| address_key(&v.network, v.ip))
        .collect()
}

/// The "network/IP" key used for on-demand subscriptions and aliases.
pub fn address_key(network: &str, ip: IpAddr) -> String {
    format!("{network}/{ip}")
}

// ---------------------------------------------------------------------------
// Resource envelopes
// ---------------------------------------------------------------------------

/// Decodes the `Any` inside an Address resource and converts it.
pub fn decode_address_resource(res: &Resource) -> Result<AddressResource> {
    let bytes = any_payload(res, ADDRESS_TYPE_URL)?;
    let msg = wpb::Address::decode(bytes)
        .map_err(|e| ConvertError::new(format!("undecodable istio.workload.Address: {e}")))?;
    address_from_proto(msg)
}

/// Decodes the `Any` inside an Authorization resource and converts it.
pub fn decode_authorization_resource(res: &Resource) -> Result<Policy> {
    let bytes = any_payload(res, AUTHORIZATION_TYPE_URL)?;
    let msg = spb::Authorization::decode(bytes)
        .map_err(|e| ConvertError::new(format!("undecodable istio.security.Authorization: {e}")))?;
    policy_from_proto(msg)
}

/// What can still be read of an Authorization resource that
/// [`decode_authorization_resource`] refused, so the snapshot can keep it
/// denying where it applies (it must never widen access): the key from the
/// resource name, and the scope and dry-run flag if the payload decodes.
/// None when the resource name is not "ns/name" (nothing could name it).
pub fn unreadable_authorization(res: &Resource, error: &ConvertError) -> Option<UnreadablePolicy> {
    if !is_namespaced(&res.name) {
        return None;
    }
    let (namespace, name) = res.name.split_once('/').expect("namespaced");
    let header = any_payload(res, AUTHORIZATION_TYPE_URL)
        .ok()
        .and_then(|bytes| spb::Authorization::decode(bytes).ok());
    let scope = header
        .as_ref()
        .and_then(|a| spb::Scope::try_from(a.scope).ok())
        .map(|s| match s {
            spb::Scope::Global => PolicyScope::Global,
            spb::Scope::Namespace => PolicyScope::Namespace,
            spb::Scope::WorkloadSelector => PolicyScope::WorkloadSelector,
        });
    Some(UnreadablePolicy {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        scope,
        dry_run: header.is_some_and(|a| a.dry_run),
        error: error.to_string(),
    })
}

fn any_payload<'a>(res: &'a Resource, type_url: &str) -> Result<&'a [u8]> {
    let Some(any) = &res.resource else {
        return fail("resource has no payload");
    };
    // An empty type URL inside the Any is tolerated (the response's type URL
    // already says what it is); a different one is not.
    if !any.type_url.is_empty() && any.type_url != type_url {
        return fail(format!(
            "payload type {:?} does not match the subscribed type {type_url:?}",
            any.type_url
        ));
    }
    Ok(&any.value)
}

/// Wraps a model resource for sending, with `version` and (for addresses)
/// the "network/IP" aliases.
pub fn address_resource(item: &AddressResource, version: String) -> Resource {
    let msg = match item {
        AddressResource::Workload(w) => wpb::Address {
            r#type: Some(wpb::address::Type::Workload(workload_to_proto(w))),
        },
        AddressResource::Service(s) => wpb::Address {
            r#type: Some(wpb::address::Type::Service(service_to_proto(s))),
        },
    };
    Resource {
        version,
        name: item.name(),
        aliases: item.aliases(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.to_owned(),
            value: msg.encode_to_vec(),
        }),
        ..Resource::default()
    }
}

/// Wraps a policy for sending.
pub fn authorization_resource(p: &Policy, version: String) -> Resource {
    Resource {
        version,
        name: p.key(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE_URL.to_owned(),
            value: policy_to_proto(p).encode_to_vec(),
        }),
        ..Resource::default()
    }
}

// ---------------------------------------------------------------------------
// Wire → model
// ---------------------------------------------------------------------------

pub fn address_from_proto(msg: wpb::Address) -> Result<AddressResource> {
    match msg.r#type {
        Some(wpb::address::Type::Workload(w)) => {
            workload_from_proto(w).map(AddressResource::Workload)
        }
        Some(wpb::address::Type::Service(s)) => service_from_proto(s).map(AddressResource::Service),
        None => fail("Address holds neither a workload nor a service"),
    }
}

pub fn workload_from_proto(w: wpb::Workload) -> Result<Workload> {
    non_empty("uid", &w.uid)?;
    non_empty("name", &w.name)?;
    non_empty("namespace", &w.namespace)?;
    let addresses = w
        .addresses
        .iter()
        .enumerate()
        .map(|(i, b)| ip_from_bytes(b).map_err(|e| e.within(format_args!("addresses[{i}]"))))
        .collect::<Result<Vec<_>>>()?;
    let protocol = match wpb::TunnelProtocol::try_from(w.tunnel_protocol) {
        Ok(wpb::TunnelProtocol::None) => TunnelProtocol::None,
        Ok(wpb::TunnelProtocol::Hbone) => TunnelProtocol::Hbone,
        Ok(wpb::TunnelProtocol::LegacyIstioMtls) => {
            return fail("tunnel_protocol: LEGACY_ISTIO_MTLS is not supported")
        }
        Err(_) => return fail(unknown_enum("tunnel_protocol", w.tunnel_protocol)),
    };
    let workload_type = match wpb::WorkloadType::try_from(w.workload_type) {
        Ok(wpb::WorkloadType::Deployment) | Err(_) => WorkloadType::Deployment,
        Ok(wpb::WorkloadType::Cronjob) => WorkloadType::CronJob,
        Ok(wpb::WorkloadType::Pod) => WorkloadType::Pod,
        Ok(wpb::WorkloadType::Job) => WorkloadType::Job,
    };
    let status = match wpb::WorkloadStatus::try_from(w.status) {
        Ok(wpb::WorkloadStatus::Healthy) => WorkloadStatus::Healthy,
        Ok(wpb::WorkloadStatus::Unhealthy) => WorkloadStatus::Unhealthy,
        Err(_) => return fail(unknown_enum("status", w.status)),
    };
    let network_mode = match wpb::NetworkMode::try_from(w.network_mode) {
        Ok(wpb::NetworkMode::Standard) => NetworkMode::Standard,
        Ok(wpb::NetworkMode::HostNetwork) => NetworkMode::HostNetwork,
        Err(_) => return fail(unknown_enum("network_mode", w.network_mode)),
    };
    let mut services = BTreeMap::new();
    for (key, list) in w.services {
        if !is_namespaced(&key) {
            return fail(format!(
                "services: key {key:?} is not \"namespace/hostname\""
            ));
        }
        let ports = ports_from_proto(&list.ports)
            .map_err(|e| e.within(format_args!("services[{key:?}]")))?;
        services.insert(intern(&key), ports);
    }
    let waypoint = w
        .waypoint
        .map(|g| gateway_from_proto(g).map_err(|e| e.within("waypoint")))
        .transpose()?;
    let network_gateway = w
        .network_gateway
        .map(|g| gateway_from_proto(g).map_err(|e| e.within("network_gateway")))
        .transpose()?;
    let application_tunnel = w
        .application_tunnel
        .map(|t| {
            let protocol = match wpb::application_tunnel::Protocol::try_from(t.protocol) {
                Ok(wpb::application_tunnel::Protocol::None) => ApplicationTunnelProtocol::None,
                Ok(wpb::application_tunnel::Protocol::Proxy) => ApplicationTunnelProtocol::Proxy,
                Err(_) => return fail(unknown_enum("application_tunnel.protocol", t.protocol)),
            };
            let port = match t.port {
                0 => None,
                p => Some(port16(p).map_err(|e| e.within("application_tunnel.port"))?),
            };
            Ok(ApplicationTunnel { protocol, port })
        })
        .transpose()?;
    // Fields that repeat across workloads are interned (see
    // model::strings); uid and name are this workload's own.
    let uid = Str::from(w.uid);
    Ok(Workload {
        name: name_within(&uid, &w.name),
        uid,
        namespace: intern(&w.namespace),
        service_account: intern(or_str(&w.service_account, DEFAULT_SERVICE_ACCOUNT)),
        trust_domain: intern(or_str(&w.trust_domain, DEFAULT_TRUST_DOMAIN)),
        addresses: addresses.into(),
        hostname: Str::from(w.hostname),
        network: intern(&w.network),
        protocol,
        node: intern(&w.node),
        canonical_name: intern(&w.canonical_name),
        canonical_revision: intern(&w.canonical_revision),
        workload_name: intern(&w.workload_name),
        workload_type,
        status,
        cluster_id: intern(&w.cluster_id),
        authorization_policies: w.authorization_policies.iter().map(|k| intern(k)).collect(),
        services: services.into(),
        locality: w.locality.map(|l| Locality {
            region: intern(&l.region),
            zone: intern(&l.zone),
            subzone: intern(&l.subzone),
        }),
        network_mode,
        capacity: w.capacity.unwrap_or(1),
        waypoint: waypoint.map(Box::new),
        network_gateway: network_gateway.map(Box::new),
        native_tunnel: w.native_tunnel,
        application_tunnel,
    })
}

pub fn service_from_proto(s: wpb::Service) -> Result<Service> {
    non_empty("name", &s.name)?;
    non_empty("namespace", &s.namespace)?;
    non_empty("hostname", &s.hostname)?;
    if s.namespace.contains('/') || s.hostname.contains('/') {
        return fail("namespace and hostname must not contain '/'");
    }
    let mut vips = Vec::with_capacity(s.addresses.len());
    let mut cidr_vips = Vec::new();
    for (i, a) in s.addresses.iter().enumerate() {
        let ip = ip_from_bytes(&a.address).map_err(|e| e.within(format_args!("addresses[{i}]")))?;
        if let Some(len) = a.length {
            let max = max_prefix(ip);
            if len > u32::from(max) {
                return fail(format!("addresses[{i}]: prefix length {len} exceeds {max}"));
            }
            if len < u32::from(max) {
                let cidr = Cidr::new(ip, len as u8).expect("length checked");
                cidr_vips.push(NetworkCidr {
                    network: intern(&a.network),
                    cidr,
                });
                continue;
            }
        }
        vips.push(NetworkAddress {
            network: intern(&a.network),
            ip,
        });
    }
    let ip_families = match wpb::IpFamilies::try_from(s.ip_families) {
        Ok(wpb::IpFamilies::Automatic) => None,
        Ok(wpb::IpFamilies::Ipv4Only) => Some(IpFamilies::Ipv4),
        Ok(wpb::IpFamilies::Ipv6Only) => Some(IpFamilies::Ipv6),
        Ok(wpb::IpFamilies::Dual) => Some(IpFamilies::Dual),
        Err(_) => return fail(unknown_enum("ip_families", s.ip_families)),
    };
    let visibility = match wpb::service::Visibility::try_from(s.visibility) {
        Ok(wpb::service::Visibility::Public) => Visibility::Public,
        Ok(wpb::service::Visibility::Namespace) => Visibility::Namespace,
        Err(_) => return fail(unknown_enum("visibility", s.visibility)),
    };
    let mut weighted_waypoints = Vec::with_capacity(s.weighted_waypoints.len());
    for (i, w) in s.weighted_waypoints.into_iter().enumerate() {
        let Some(g) = w.destination else {
            return fail(format!("weighted_waypoints[{i}]: no destination"));
        };
        let waypoint = gateway_from_proto(g)
            .map_err(|e| e.within(format_args!("weighted_waypoints[{i}].destination")))?;
        weighted_waypoints.push(WeightedWaypoint {
            waypoint,
            weight: w.weight,
        });
    }
    let ports = ports_from_proto(&s.ports).map_err(|e| e.within("ports"))?;
    let waypoint = s
        .waypoint
        .map(|g| gateway_from_proto(g).map_err(|e| e.within("waypoint")))
        .transpose()?;
    let load_balancer = s
        .load_balancing
        .map(|lb| load_balancing_from_proto(lb).map_err(|e| e.within("load_balancing")))
        .transpose()?;
    Ok(Service {
        name: intern(&s.name),
        namespace: intern(&s.namespace),
        hostname: intern(&s.hostname),
        vips,
        ports,
        subject_alt_names: s.subject_alt_names.iter().map(|n| intern(n)).collect(),
        waypoint,
        load_balancer,
        canonical: s.canonical,
        cidr_vips,
        weighted_waypoints,
        ip_families,
        visibility,
    })
}

fn load_balancing_from_proto(lb: wpb::LoadBalancing) -> Result<LoadBalancer> {
    use wpb::load_balancing::{HealthPolicy, Mode, Scope};
    let mut routing_preferences = Vec::with_capacity(lb.routing_preference.len());
    for (i, &v) in lb.routing_preference.iter().enumerate() {
        let scope = match Scope::try_from(v) {
            Ok(Scope::UnspecifiedScope) => continue,
            Ok(Scope::Region) => LbScope::Region,
            Ok(Scope::Zone) => LbScope::Zone,
            Ok(Scope::Subzone) => LbScope::Subzone,
            Ok(Scope::Node) => LbScope::Node,
            Ok(Scope::Cluster) => LbScope::Cluster,
            Ok(Scope::Network) => LbScope::Network,
            Err(_) => return fail(unknown_enum(format_args!("routing_preference[{i}]"), v)),
        };
        routing_preferences.push(scope);
    }
    let mode = match Mode::try_from(lb.mode) {
        Ok(Mode::UnspecifiedMode) => LbMode::Standard,
        Ok(Mode::Strict) => LbMode::Strict,
        Ok(Mode::Failover) => LbMode::Failover,
        Ok(Mode::Passthrough) => LbMode::Passthrough,
        Err(_) => return fail(unknown_enum("mode", lb.mode)),
    };
    let health_policy = match HealthPolicy::try_from(lb.health_policy) {
        Ok(HealthPolicy::OnlyHealthy) => LbHealthPolicy::OnlyHealthy,
        Ok(HealthPolicy::AllowAll) => LbHealthPolicy::AllowAll,
        Err(_) => return fail(unknown_enum("health_policy", lb.health_policy)),
    };
    Ok(LoadBalancer {
        routing_preferences,
        mode,
        health_policy,
    })
}

fn gateway_from_proto(g: wpb::GatewayAddress) -> Result<GatewayAddress> {
    let destination = match g.destination {
        Some(wpb::gateway_address::Destination::Hostname(h)) => {
            non_empty("hostname.namespace", &h.namespace)?;
            non_empty("hostname.hostname", &h.hostname)?;
            GatewayDestination::Hostname(NamespacedHostname {
                namespace: intern(&h.namespace),
                hostname: intern(&h.hostname),
            })
        }
        Some(wpb::gateway_address::Destination::Address(a)) => {
            let ip = ip_from_bytes(&a.address).map_err(|e| e.within("address"))?;
            GatewayDestination::Address(NetworkAddress {
                network: intern(&a.network),
                ip,
            })
        }
        None => return fail("no destination (neither hostname nor address)"),
    };
    let hbone_mtls_port = match g.hbone_mtls_port {
        0 => DEFAULT_HBONE_MTLS_PORT,
        p => port16(p).map_err(|e| e.within("hbone_mtls_port"))?,
    };
    Ok(GatewayAddress {
        destination,
        hbone_mtls_port,
    })
}

fn ports_from_proto(ports: &[wpb::Port]) -> Result<Vec<PortMapping>> {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let at = |e: ConvertError| e.within(format_args!("[{i}]"));
            if p.service_port == 0 {
                return Err(at(ConvertError::new("service_port is 0")));
            }
            Ok(PortMapping {
                service_port: port16(p.service_port).map_err(|e| at(e.within("service_port")))?,
                target_port: port16(p.target_port).map_err(|e| at(e.within("target_port")))?,
            })
        })
        .collect()
}

pub fn policy_from_proto(a: spb::Authorization) -> Result<Policy> {
    non_empty("name", &a.name)?;
    non_empty("namespace", &a.namespace)?;
    if a.namespace.contains('/') || a.name.contains('/') {
        return fail("namespace and name must not contain '/'");
    }
    let scope = match spb::Scope::try_from(a.scope) {
        Ok(spb::Scope::Global) => PolicyScope::Global,
        Ok(spb::Scope::Namespace) => PolicyScope::Namespace,
        Ok(spb::Scope::WorkloadSelector) => PolicyScope::WorkloadSelector,
        Err(_) => return fail(unknown_enum("scope", a.scope)),
    };
    let action = match spb::Action::try_from(a.action) {
        Ok(spb::Action::Allow) => PolicyAction::Allow,
        Ok(spb::Action::Deny) => PolicyAction::Deny,
        Err(_) => return fail(unknown_enum("action", a.action)),
    };
    let mut rules = Vec::with_capacity(a.rules.len());
    for (r, rule) in a.rules.into_iter().enumerate() {
        let mut clauses = Vec::with_capacity(rule.clauses.len());
        for (c, clause) in rule.clauses.into_iter().enumerate() {
            let matches = clause
                .matches
                .into_iter()
                .enumerate()
                .map(|(m, mt)| {
                    match_from_proto(mt)
                        .map_err(|e| e.within(format_args!("rules[{r}].clauses[{c}].matches[{m}]")))
                })
                .collect::<Result<Vec<_>>>()?;
            clauses.push(Clause { matches });
        }
        rules.push(Rule { clauses });
    }
    Ok(Policy {
        name: a.name,
        namespace: a.namespace,
        scope,
        action,
        dry_run: a.dry_run,
        rules,
    })
}

fn match_from_proto(m: spb::Match) -> Result<Match> {
    fn strings(field: &str, v: Vec<spb::StringMatch>) -> Result<Vec<StringMatch>> {
        v.into_iter()
            .enumerate()
            .map(|(i, s)| {
                use spb::string_match::MatchType;
                match s.match_type {
                    Some(MatchType::Exact(v)) => Ok(StringMatch::Exact(v)),
                    Some(MatchType::Prefix(v)) => Ok(StringMatch::Prefix(v)),
                    Some(MatchType::Suffix(v)) => Ok(StringMatch::Suffix(v)),
                    Some(MatchType::Presence(())) => Ok(StringMatch::Presence),
                    None => fail(format!("{field}[{i}]: string match has no value")),
                }
            })
            .collect()
    }
    fn cidrs(field: &str, v: Vec<spb::Address>) -> Result<Vec<Cidr>> {
        v.into_iter()
            .enumerate()
            .map(|(i, a)| {
                let ip = ip_from_bytes(&a.address)
                    .map_err(|e| e.within(format_args!("{field}[{i}]")))?;
                let max = max_prefix(ip);
                u8::try_from(a.length)
                    .ok()
                    .and_then(|len| Cidr::new(ip, len))
                    .ok_or_else(|| {
                        ConvertError::new(format!(
                            "{field}[{i}]: prefix length {} exceeds {max}",
                            a.length
                        ))
                    })
            })
            .collect()
    }
    fn ports(field: &str, v: Vec<u32>) -> Result<Vec<u16>> {
        v.into_iter()
            .enumerate()
            .map(|(i, p)| port16(p).map_err(|e| e.within(format_args!("{field}[{i}]"))))
            .collect()
    }
    fn accounts(v: Vec<spb::ServiceAccountMatch>) -> Vec<ServiceAccountMatch> {
        v.into_iter()
            .map(|a| ServiceAccountMatch {
                namespace: a.namespace,
                service_account: a.service_account,
            })
            .collect()
    }
    Ok(Match {
        namespaces: strings("namespaces", m.namespaces)?,
        not_namespaces: strings("not_namespaces", m.not_namespaces)?,
        principals: strings("principals", m.principals)?,
        not_principals: strings("not_principals", m.not_principals)?,
        service_accounts: accounts(m.service_accounts),
        not_service_accounts: accounts(m.not_service_accounts),
        source_ips: cidrs("source_ips", m.source_ips)?,
        not_source_ips: cidrs("not_source_ips", m.not_source_ips)?,
        destination_ips: cidrs("destination_ips", m.destination_ips)?,
        not_destination_ips: cidrs("not_destination_ips", m.not_destination_ips)?,
        destination_ports: ports("destination_ports", m.destination_ports)?,
        not_destination_ports: ports("not_destination_ports", m.not_destination_ports)?,
    })
}

/// A 4- or 16-byte IP address.
pub fn ip_from_bytes(b: &[u8]) -> Result<IpAddr> {
    match b.len() {
        4 => Ok(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(b).expect("length checked"),
        ))),
        16 => Ok(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(b).expect("length checked"),
        ))),
        n => fail(format!("IP address must be 4 or 16 bytes, got {n}")),
    }
}

fn ip_to_bytes(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

fn max_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

fn port16(p: u32) -> Result<u16> {
    u16::try_from(p).map_err(|_| ConvertError::new(format!("port {p} is out of range")))
}

fn non_empty(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        fail(format!("{field} is empty"))
    } else {
        Ok(())
    }
}

fn unknown_enum(field: impl fmt::Display, value: i32) -> String {
    format!("{field}: unknown enum value {value}")
}

// ---------------------------------------------------------------------------
// Model → wire
// ---------------------------------------------------------------------------

pub fn workload_to_proto(w: &Workload) -> wpb::Workload {
    wpb::Workload {
        uid: w.uid.to_string(),
        name: w.name.to_string(),
        namespace: w.namespace.to_string(),
        addresses: w.addresses.iter().map(|ip| ip_to_bytes(*ip)).collect(),
        hostname: w.hostname.to_string(),
        network: w.network.to_string(),
        tunnel_protocol: match w.protocol {
            TunnelProtocol::None => wpb::TunnelProtocol::None,
            TunnelProtocol::Hbone => wpb::TunnelProtocol::Hbone,
        } as i32,
        trust_domain: w.trust_domain.to_string(),
        service_account: w.service_account.to_string(),
        waypoint: w.waypoint.as_deref().map(gateway_to_proto),
        network_gateway: w.network_gateway.as_deref().map(gateway_to_proto),
        node: w.node.to_string(),
        canonical_name: w.canonical_name.to_string(),
        canonical_revision: w.canonical_revision.to_string(),
        workload_type: match w.workload_type {
            WorkloadType::Deployment => wpb::WorkloadType::Deployment,
            WorkloadType::CronJob => wpb::WorkloadType::Cronjob,
            WorkloadType::Pod => wpb::WorkloadType::Pod,
            WorkloadType::Job => wpb::WorkloadType::Job,
        } as i32,
        workload_name: w.workload_name.to_string(),
        native_tunnel: w.native_tunnel,
        application_tunnel: w
            .application_tunnel
            .as_ref()
            .map(|t| wpb::ApplicationTunnel {
                protocol: match t.protocol {
                    ApplicationTunnelProtocol::None => wpb::application_tunnel::Protocol::None,
                    ApplicationTunnelProtocol::Proxy => wpb::application_tunnel::Protocol::Proxy,
                } as i32,
                port: t.port.map_or(0, u32::from),
            }),
        services: w
            .services
            .iter()
            .map(|(k, ports)| {
                (
                    k.to_string(),
                    wpb::PortList {
                        ports: ports_to_proto(ports),
                    },
                )
            })
            .collect::<HashMap<_, _>>(),
        authorization_policies: w
            .authorization_policies
            .iter()
            .map(ToString::to_string)
            .collect(),
        status: match w.status {
            WorkloadStatus::Healthy => wpb::WorkloadStatus::Healthy,
            WorkloadStatus::Unhealthy => wpb::WorkloadStatus::Unhealthy,
        } as i32,
        cluster_id: w.cluster_id.to_string(),
        locality: w.locality.as_ref().map(|l| wpb::Locality {
            region: l.region.to_string(),
            zone: l.zone.to_string(),
            subzone: l.subzone.to_string(),
        }),
        network_mode: match w.network_mode {
            NetworkMode::Standard => wpb::NetworkMode::Standard,
            NetworkMode::HostNetwork => wpb::NetworkMode::HostNetwork,
        } as i32,
        extensions: Vec::new(),
        capacity: Some(w.capacity),
    }
}

pub fn service_to_proto(s: &Service) -> wpb::Service {
    wpb::Service {
        name: s.name.to_string(),
        namespace: s.namespace.to_string(),
        hostname: s.hostname.to_string(),
        addresses: s
            .vips
            .iter()
            .map(|v| wpb::NetworkAddress {
                network: v.network.to_string(),
                address: ip_to_bytes(v.ip),
                length: None,
            })
            .chain(s.cidr_vips.iter().map(|c| wpb::NetworkAddress {
                network: c.network.to_string(),
                address: ip_to_bytes(c.cidr.addr),
                length: Some(u32::from(c.cidr.prefix_len)),
            }))
            .collect(),
        ip_families: match s.ip_families {
            None => wpb::IpFamilies::Automatic,
            Some(IpFamilies::Ipv4) => wpb::IpFamilies::Ipv4Only,
            Some(IpFamilies::Ipv6) => wpb::IpFamilies::Ipv6Only,
            Some(IpFamilies::Dual) => wpb::IpFamilies::Dual,
        } as i32,
        visibility: match s.visibility {
            Visibility::Public => wpb::service::Visibility::Public,
            Visibility::Namespace => wpb::service::Visibility::Namespace,
        } as i32,
        weighted_waypoints: s
            .weighted_waypoints
            .iter()
            .map(|w| wpb::WeightedWaypoint {
                destination: Some(gateway_to_proto(&w.waypoint)),
                weight: w.weight,
            })
            .collect(),
        ports: ports_to_proto(&s.ports),
        subject_alt_names: s
            .subject_alt_names
            .iter()
            .map(ToString::to_string)
            .collect(),
        waypoint: s.waypoint.as_ref().map(gateway_to_proto),
        load_balancing: s.load_balancer.as_ref().map(|lb| {
            use wpb::load_balancing::{HealthPolicy, Mode, Scope};
            wpb::LoadBalancing {
                routing_preference: lb
                    .routing_preferences
                    .iter()
                    .map(|s| {
                        (match s {
                            LbScope::Region => Scope::Region,
                            LbScope::Zone => Scope::Zone,
                            LbScope::Subzone => Scope::Subzone,
                            LbScope::Node => Scope::Node,
                            LbScope::Cluster => Scope::Cluster,
                            LbScope::Network => Scope::Network,
                        }) as i32
                    })
                    .collect(),
                mode: match lb.mode {
                    LbMode::Standard => Mode::UnspecifiedMode,
                    LbMode::Strict => Mode::Strict,
                    LbMode::Failover => Mode::Failover,
                    LbMode::Passthrough => Mode::Passthrough,
                } as i32,
                health_policy: match lb.health_policy {
                    LbHealthPolicy::OnlyHealthy => HealthPolicy::OnlyHealthy,
                    LbHealthPolicy::AllowAll => HealthPolicy::AllowAll,
                } as i32,
            }
        }),
        canonical: s.canonical,
        ..wpb::Service::default()
    }
}

fn ports_to_proto(ports: &[PortMapping]) -> Vec<wpb::Port> {
    ports
        .iter()
        .map(|p| wpb::Port {
            service_port: u32::from(p.service_port),
            target_port: u32::from(p.target_port),
            app_protocol: 0,
        })
        .collect()
}

fn gateway_to_proto(g: &GatewayAddress) -> wpb::GatewayAddress {
    wpb::GatewayAddress {
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
        destination: Some(match &g.destination {
            GatewayDestination::Hostname(h) => {
                wpb::gateway_address::Destination::Hostname(wpb::NamespacedHostname {
                    namespace: h.namespace.to_string(),
                    hostname: h.hostname.to_string(),
                })
            }
            GatewayDestination::Address(a) => {
                wpb::gateway_address::Destination::Address(wpb::NetworkAddress {
                    network: a.network.to_string(),
                    address: ip_to_bytes(a.ip),
                    length: None,
                })
            }
        }),
    }
}

pub fn policy_to_proto(p: &Policy) -> spb::Authorization {
    fn strings(v: &[StringMatch]) -> Vec<spb::StringMatch> {
        use spb::string_match::MatchType;
        v.iter()
            .map(|s| spb::StringMatch {
                match_type: Some(match s {
                    StringMatch::Exact(v) => MatchType::Exact(v.clone()),
                    StringMatch::Prefix(v) => MatchType::Prefix(v.clone()),
                    StringMatch::Suffix(v) => MatchType::Suffix(v.clone()),
                    StringMatch::Presence => MatchType::Presence(()),
                }),
            })
            .collect()
    }
    fn cidrs(v: &[Cidr]) -> Vec<spb::Address> {
        v.iter()
            .map(|c| spb::Address {
                address: ip_to_bytes(c.addr),
                length: u32::from(c.prefix_len),
            })
            .collect()
    }
    fn ports(v: &[u16]) -> Vec<u32> {
        v.iter().map(|&p| u32::from(p)).collect()
    }
    fn accounts(v: &[ServiceAccountMatch]) -> Vec<spb::ServiceAccountMatch> {
        v.iter()
            .map(|a| spb::ServiceAccountMatch {
                namespace: a.namespace.clone(),
                service_account: a.service_account.clone(),
            })
            .collect()
    }
    spb::Authorization {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            PolicyScope::Global => spb::Scope::Global,
            PolicyScope::Namespace => spb::Scope::Namespace,
            PolicyScope::WorkloadSelector => spb::Scope::WorkloadSelector,
        } as i32,
        action: match p.action {
            PolicyAction::Allow => spb::Action::Allow,
            PolicyAction::Deny => spb::Action::Deny,
        } as i32,
        rules: p
            .rules
            .iter()
            .map(|r| spb::Rule {
                clauses: r
                    .clauses
                    .iter()
                    .map(|c| spb::Clause {
                        matches: c
                            .matches
                            .iter()
                            .map(|m| spb::Match {
                                namespaces: strings(&m.namespaces),
                                not_namespaces: strings(&m.not_namespaces),
                                principals: strings(&m.principals),
                                not_principals: strings(&m.not_principals),
                                source_ips: cidrs(&m.source_ips),
                                not_source_ips: cidrs(&m.not_source_ips),
                                destination_ips: cidrs(&m.destination_ips),
                                not_destination_ips: cidrs(&m.not_destination_ips),
                                destination_ports: ports(&m.destination_ports),
                                not_destination_ports: ports(&m.not_destination_ports),
                                service_accounts: accounts(&m.service_accounts),
                                not_service_accounts: accounts(&m.not_service_accounts),
                                extensions: Vec::new(),
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
        dry_run: p.dry_run,
        extensions: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
