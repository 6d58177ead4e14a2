//! OVN-Kubernetes annotation codecs: the keys and JSON value formats upstream writes on Nodes and
//! Pods (see `../shared/reference/ovnk-upstream.md` §2), so ovnk and upstream components read each
//! other's annotations.
//!
//! Every parser takes the annotation's raw string and returns a typed value or an
//! [`AnnotationError`] naming the key and what is wrong; nothing here panics on bad input.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The name of the default (cluster) network in per-network annotation maps.
pub const DEFAULT_NETWORK: &str = "default";

/// Node ID, decimal string (`"3"`); written by the cluster manager.
pub const NODE_ID: &str = "k8s.ovn.org/node-id";
/// Node subnets per network (`{"default":["10.244.1.0/24"]}`); written by the cluster manager.
pub const NODE_SUBNETS: &str = "k8s.ovn.org/node-subnets";
/// Transit switch port addresses (`{"ipv4":"100.88.0.3/16"}`); written by the cluster manager.
pub const NODE_TRANSIT_SWITCH_PORT_IFADDR: &str = "k8s.ovn.org/node-transit-switch-port-ifaddr";
/// Gateway-router join addresses per network (`{"default":{"ipv4":"100.64.0.3/16"}}`); written
/// by the cluster manager.
pub const NODE_GATEWAY_ROUTER_LRP_IFADDRS: &str = "k8s.ovn.org/node-gateway-router-lrp-ifaddrs";
/// The node's OVN chassis id (OVS `external_ids:system-id`); written by the node.
pub const NODE_CHASSIS_ID: &str = "k8s.ovn.org/node-chassis-id";
/// Geneve encapsulation IPs, a sorted JSON list (`["172.18.0.3"]`); written by the node.
pub const NODE_ENCAP_IPS: &str = "k8s.ovn.org/node-encap-ips";
/// The node's primary interface addresses (`{"ipv4":"172.18.0.3/16"}`); written by the node.
pub const NODE_PRIMARY_IFADDR: &str = "k8s.ovn.org/node-primary-ifaddr";
/// Every address on the node's host interfaces, a JSON list of CIDRs; written by the node.
pub const HOST_CIDRS: &str = "k8s.ovn.org/host-cidrs";
/// Management port MAC per network (`{"default":"0a:58:0a:f4:01:02"}`); written by the node.
pub const NODE_MGMT_PORT_MAC_ADDRESSES: &str = "k8s.ovn.org/node-mgmt-port-mac-addresses";
/// The OVN zone of the node (`SB_Global options:name`); written by the node (≤ release-1.3).
pub const ZONE_NAME: &str = "k8s.ovn.org/zone-name";
/// OVN transport zones the node belongs to, a JSON list of names (seed 001); set by admins only.
pub const TRANSPORT_ZONES: &str = "k8s.ovn.org/transport-zones";
/// A Pod's network attachment per network; written by the pod's node in IC mode.
pub const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

/// A malformed or unusable annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}: {reason}")]
pub struct AnnotationError {
    /// The annotation key.
    pub key: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl AnnotationError {
    fn new(key: &'static str, reason: impl Into<String>) -> Self {
        Self {
            key,
            reason: reason.into(),
        }
    }
}

fn json<'a, T: Deserialize<'a>>(key: &'static str, value: &'a str) -> Result<T, AnnotationError> {
    serde_json::from_str(value).map_err(|e| AnnotationError::new(key, format!("invalid JSON: {e}")))
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing these plain data types cannot fail (string keys, no floats, no custom impls).
    serde_json::to_string(value).unwrap_or_default()
}

/// Parses `k8s.ovn.org/node-id`: a positive decimal integer.
pub fn parse_node_id(value: &str) -> Result<u32, AnnotationError> {
    match value.trim().parse::<u32>() {
        Ok(0) => Err(AnnotationError::new(NODE_ID, "node IDs start at 1")),
        Ok(id) => Ok(id),
        Err(_) => Err(AnnotationError::new(
            NODE_ID,
            format!("{value:?} is not a decimal integer"),
        )),
    }
}

/// Parses `k8s.ovn.org/node-subnets`: `{"<network>":["cidr",…]}`, also accepting upstream's old
/// single-string form `{"<network>":"cidr"}`.
pub fn parse_node_subnets(value: &str) -> Result<BTreeMap<String, Vec<IpNet>>, AnnotationError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let raw: BTreeMap<String, OneOrMany> = json(NODE_SUBNETS, value)?;
    raw.into_iter()
        .map(|(net, v)| {
            let list = match v {
                OneOrMany::One(s) => vec![s],
                OneOrMany::Many(v) => v,
            };
            let cidrs = list
                .iter()
                .map(|s| {
                    s.trim().parse::<IpNet>().map_err(|_| {
                        AnnotationError::new(
                            NODE_SUBNETS,
                            format!("network {net:?}: {s:?} is not a CIDR"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((net, cidrs))
        })
        .collect()
}

/// Renders `k8s.ovn.org/node-subnets` for one network.
pub fn format_node_subnets(network: &str, subnets: &[IpNet]) -> String {
    let list: Vec<String> = subnets.iter().map(ToString::to_string).collect();
    to_json(&BTreeMap::from([(network, list)]))
}

/// An `{"ipv4":"a.b.c.d/n","ipv6":"…/n"}` value (transit switch port, primary interface).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfAddr {
    /// The IPv4 address with its prefix length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<IpNet>,
    /// The IPv6 address with its prefix length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<IpNet>,
}

impl IfAddr {
    /// The addresses present, IPv4 first.
    pub fn addrs(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.ipv4.iter().chain(self.ipv6.iter()).copied()
    }

    fn validate(self, key: &'static str) -> Result<Self, AnnotationError> {
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(AnnotationError::new(key, "neither ipv4 nor ipv6 is set"));
        }
        if self.ipv4.is_some_and(|n| !matches!(n, IpNet::V4(_)))
            || self.ipv6.is_some_and(|n| !matches!(n, IpNet::V6(_)))
        {
            return Err(AnnotationError::new(key, "address of the wrong family"));
        }
        Ok(self)
    }

    /// Renders the JSON value.
    pub fn to_annotation(&self) -> String {
        to_json(self)
    }
}

/// Parses an [`IfAddr`] annotation (`node-transit-switch-port-ifaddr`, `node-primary-ifaddr`).
pub fn parse_ifaddr(key: &'static str, value: &str) -> Result<IfAddr, AnnotationError> {
    json::<IfAddr>(key, value)?.validate(key)
}

/// Parses `k8s.ovn.org/node-gateway-router-lrp-ifaddrs`: `{"<network>":{"ipv4":…}}`.
pub fn parse_gateway_router_lrp_ifaddrs(
    value: &str,
) -> Result<BTreeMap<String, IfAddr>, AnnotationError> {
    let raw: BTreeMap<String, IfAddr> = json(NODE_GATEWAY_ROUTER_LRP_IFADDRS, value)?;
    raw.into_iter()
        .map(|(k, v)| Ok((k, v.validate(NODE_GATEWAY_ROUTER_LRP_IFADDRS)?)))
        .collect()
}

/// Renders `k8s.ovn.org/node-gateway-router-lrp-ifaddrs` for one network.
pub fn format_gateway_router_lrp_ifaddrs(network: &str, addr: &IfAddr) -> String {
    to_json(&BTreeMap::from([(network, addr)]))
}

/// Parses a JSON list of IP addresses (`node-encap-ips`).
pub fn parse_ip_list(key: &'static str, value: &str) -> Result<Vec<IpAddr>, AnnotationError> {
    let raw: Vec<String> = json(key, value)?;
    raw.iter()
        .map(|s| {
            s.trim()
                .parse::<IpAddr>()
                .map_err(|_| AnnotationError::new(key, format!("{s:?} is not an IP address")))
        })
        .collect()
}

/// Renders a JSON list of IP addresses, sorted as upstream writes `node-encap-ips`.
pub fn format_ip_list(ips: &[IpAddr]) -> String {
    let mut list: Vec<String> = ips.iter().map(ToString::to_string).collect();
    list.sort();
    to_json(&list)
}

/// Parses a JSON list of CIDRs (`host-cidrs`).
pub fn parse_cidr_list(key: &'static str, value: &str) -> Result<Vec<IpNet>, AnnotationError> {
    let raw: Vec<String> = json(key, value)?;
    raw.iter()
        .map(|s| {
            s.trim()
                .parse::<IpNet>()
                .map_err(|_| AnnotationError::new(key, format!("{s:?} is not a CIDR")))
        })
        .collect()
}

/// Renders a JSON list of CIDRs.
pub fn format_cidr_list(cidrs: &[IpNet]) -> String {
    to_json(&cidrs.iter().map(ToString::to_string).collect::<Vec<_>>())
}

/// Parses a `{"<network>":"<string>"}` map (`node-mgmt-port-mac-addresses`).
pub fn parse_string_map(
    key: &'static str,
    value: &str,
) -> Result<BTreeMap<String, String>, AnnotationError> {
    json(key, value)
}

/// Renders a one-entry `{"<network>":"<string>"}` map.
pub fn format_string_map(network: &str, value: &str) -> String {
    to_json(&BTreeMap::from([(network, value)]))
}

/// One route of a pod attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRoute {
    /// Destination CIDR.
    pub dest: String,
    /// Next hop address.
    #[serde(rename = "nextHop")]
    pub next_hop: String,
}

/// A Pod's attachment to one network, as in upstream's `k8s.ovn.org/pod-networks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNetwork {
    /// Addresses with the subnet's prefix length (`10.244.1.5/24`).
    pub ip_addresses: Vec<IpNet>,
    /// The interface MAC (`0a:58:0a:f4:01:05`).
    pub mac_address: String,
    /// Default gateways, one per family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway_ips: Vec<IpAddr>,
    /// Extra routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<PodRoute>,
    /// Legacy single-address field (the first of `ip_addresses`), kept for older readers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<IpNet>,
    /// Legacy single-gateway field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_ip: Option<IpAddr>,
    /// `primary` for the pod's default network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

impl PodNetwork {
    /// A primary attachment with the legacy fields filled in as upstream does.
    pub fn primary(
        ip_addresses: Vec<IpNet>,
        mac_address: String,
        gateway_ips: Vec<IpAddr>,
    ) -> Self {
        Self {
            ip_address: ip_addresses.first().copied(),
            gateway_ip: gateway_ips.first().copied(),
            ip_addresses,
            mac_address,
            gateway_ips,
            routes: Vec::new(),
            role: Some("primary".to_owned()),
        }
    }
}

/// Parses `k8s.ovn.org/pod-networks`.
pub fn parse_pod_networks(value: &str) -> Result<BTreeMap<String, PodNetwork>, AnnotationError> {
    let map: BTreeMap<String, PodNetwork> = json(POD_NETWORKS, value)?;
    for (net, pn) in &map {
        if pn.ip_addresses.is_empty() {
            return Err(AnnotationError::new(
                POD_NETWORKS,
                format!("network {net:?} has no ip_addresses"),
            ));
        }
        parse_mac(&pn.mac_address).map_err(|reason| {
            AnnotationError::new(POD_NETWORKS, format!("network {net:?}: {reason}"))
        })?;
    }
    Ok(map)
}

/// Renders `k8s.ovn.org/pod-networks` for one network.
pub fn format_pod_networks(network: &str, pod: &PodNetwork) -> String {
    to_json(&BTreeMap::from([(network, pod)]))
}

/// Parses `k8s.ovn.org/transport-zones` (seed 001): a JSON list of zone names, each a DNS-1123
/// label (OVN reads its own list comma-separated, so a comma can never be part of a name).
/// Duplicates are removed and the result sorted.
pub fn parse_transport_zones(value: &str) -> Result<Vec<String>, AnnotationError> {
    let mut zones: Vec<String> = json(TRANSPORT_ZONES, value)?;
    for z in &zones {
        if let Err(reason) = validate_zone_name(z) {
            return Err(AnnotationError::new(TRANSPORT_ZONES, reason));
        }
    }
    zones.sort();
    zones.dedup();
    Ok(zones)
}

/// Checks a zone name is a DNS-1123 label: 1–63 characters of `[a-z0-9-]`, starting and ending
/// with an alphanumeric.
pub fn validate_zone_name(name: &str) -> Result<(), String> {
    let ok_len = (1..=63).contains(&name.len());
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = !name.starts_with('-') && !name.ends_with('-');
    if ok_len && ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!(
            "zone name {name:?} is not a DNS-1123 label (1-63 of a-z, 0-9, '-', alphanumeric at both ends)"
        ))
    }
}

/// Checks a MAC address string (`aa:bb:cc:dd:ee:ff`).
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        let p = parts
            .next()
            .ok_or_else(|| format!("{s:?} is not a MAC address"))?;
        if p.len() != 2 {
            return Err(format!("{s:?} is not a MAC address"));
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address"))?;
    }
    if parts.next().is_some() {
        return Err(format!("{s:?} is not a MAC address"));
    }
    Ok(out)
}

/// Upstream's `IPAddrToHWAddr` for IPv4: `0a:58:` followed by the four address bytes
/// (100.88.0.3 → `0a:58:64:58:00:03`). IPv6 addresses use `0a:58:` and the last four bytes
/// of the address (upstream hashes them; ovnk only derives MACs for its own IPv6 addresses).
pub fn ip_to_mac(ip: IpAddr) -> String {
    let b = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_subnets_both_forms() {
        let m = parse_node_subnets(r#"{"default":["10.244.1.0/24","fd00:10:244:2::/64"]}"#)
            .expect("list form");
        assert_eq!(m["default"].len(), 2);
        let m = parse_node_subnets(r#"{"default":"10.244.1.0/24"}"#).expect("string form");
        assert_eq!(
            m["default"],
            vec!["10.244.1.0/24".parse::<IpNet>().expect("cidr")]
        );
        let e = parse_node_subnets(r#"{"default":["10.244.1.0/33"]}"#).expect_err("bad cidr");
        assert!(e.to_string().contains("node-subnets"), "{e}");
        assert_eq!(
            format_node_subnets("default", &m["default"]),
            r#"{"default":["10.244.1.0/24"]}"#
        );
    }

    #[test]
    fn node_id() {
        assert_eq!(parse_node_id("3"), Ok(3));
        assert!(parse_node_id("0").is_err());
        assert!(parse_node_id("-1").is_err());
        assert!(parse_node_id("x").is_err());
    }

    #[test]
    fn ifaddr_roundtrip_and_family_check() {
        let v = parse_ifaddr(
            NODE_TRANSIT_SWITCH_PORT_IFADDR,
            r#"{"ipv4":"100.88.0.3/16"}"#,
        )
        .expect("ok");
        assert_eq!(v.to_annotation(), r#"{"ipv4":"100.88.0.3/16"}"#);
        assert!(parse_ifaddr(NODE_TRANSIT_SWITCH_PORT_IFADDR, r#"{"ipv4":"fd97::3/64"}"#).is_err());
        assert!(parse_ifaddr(NODE_TRANSIT_SWITCH_PORT_IFADDR, "{}").is_err());
        let g = parse_gateway_router_lrp_ifaddrs(r#"{"default":{"ipv4":"100.64.0.3/16"}}"#)
            .expect("ok");
        assert_eq!(
            format_gateway_router_lrp_ifaddrs("default", &g["default"]),
            r#"{"default":{"ipv4":"100.64.0.3/16"}}"#
        );
    }

    #[test]
    fn pod_networks_upstream_shape() {
        let pn = PodNetwork::primary(
            vec!["10.244.1.5/24".parse().expect("cidr")],
            ip_to_mac("10.244.1.5".parse().expect("ip")),
            vec!["10.244.1.1".parse().expect("ip")],
        );
        let s = format_pod_networks(DEFAULT_NETWORK, &pn);
        assert_eq!(
            s,
            r#"{"default":{"ip_addresses":["10.244.1.5/24"],"mac_address":"0a:58:0a:f4:01:05","gateway_ips":["10.244.1.1"],"ip_address":"10.244.1.5/24","gateway_ip":"10.244.1.1","role":"primary"}}"#
        );
        assert_eq!(parse_pod_networks(&s).expect("parse")["default"], pn);
        assert!(
            parse_pod_networks(r#"{"default":{"ip_addresses":[],"mac_address":"x"}}"#).is_err()
        );
        assert!(
            parse_pod_networks(
                r#"{"default":{"ip_addresses":["10.0.0.1/24"],"mac_address":"zz"}}"#
            )
            .is_err()
        );
    }

    #[test]
    fn encap_ips_sorted() {
        let ips = parse_ip_list(NODE_ENCAP_IPS, r#"["172.18.0.3", " 172.18.0.2"]"#).expect("ok");
        assert_eq!(format_ip_list(&ips), r#"["172.18.0.2","172.18.0.3"]"#);
        assert!(parse_ip_list(NODE_ENCAP_IPS, r#"["nope"]"#).is_err());
    }

    #[test]
    fn transport_zones() {
        assert_eq!(
            parse_transport_zones(r#"["tz2","tz1","tz2"]"#),
            Ok(vec!["tz1".to_owned(), "tz2".to_owned()])
        );
        assert!(parse_transport_zones(r#"["a,b"]"#).is_err());
        assert!(parse_transport_zones(r#"["-a"]"#).is_err());
        assert!(parse_transport_zones(r#"[""]"#).is_err());
        assert!(parse_transport_zones(r#""tz1""#).is_err());
        assert_eq!(parse_transport_zones("[]"), Ok(vec![]));
    }

    #[test]
    fn mac_helpers() {
        assert_eq!(
            ip_to_mac("100.88.0.3".parse().expect("ip")),
            "0a:58:64:58:00:03"
        );
        assert!(parse_mac("0a:58:64:58:00:03").is_ok());
        assert!(parse_mac("0a:58:64:58:00").is_err());
        assert!(parse_mac("0a:58:64:58:00:03:01").is_err());
    }
}
