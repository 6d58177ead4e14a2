//! The agent's view of the cluster, as plain data (no Kubernetes types), and how it is built
//! from Node and Pod objects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use k8s_api::annotations as ann;
use k8s_openapi::api::core::v1::{Node, Pod};

/// One Node as the plan sees it. Fields are `None` until the annotation is present and valid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// `k8s.ovn.org/node-id`.
    pub id: Option<u32>,
    /// The default network's IPv4 subnet (`k8s.ovn.org/node-subnets`).
    pub subnet: Option<Ipv4Net>,
    /// The transit switch address (`node-transit-switch-port-ifaddr`).
    pub transit: Option<Ipv4Net>,
    /// The gateway-router join address (`node-gateway-router-lrp-ifaddrs`).
    pub join: Option<Ipv4Net>,
    /// `k8s.ovn.org/node-chassis-id`.
    pub chassis_id: Option<String>,
    /// `k8s.ovn.org/node-encap-ips`.
    pub encap_ips: Vec<IpAddr>,
    /// The node's zones, from every zone source.
    pub zones: BTreeSet<String>,
    /// The first InternalIP of `status.addresses`.
    pub internal_ip: Option<IpAddr>,
    /// Invalid annotations (reported as Events on the Node; the field stays `None`).
    pub errors: Vec<String>,
}

impl NodeInfo {
    /// The cluster manager's part is complete (id, subnet, transit and join addresses).
    pub fn has_cluster_manager_data(&self) -> bool {
        self.id.is_some() && self.subnet.is_some() && self.transit.is_some() && self.join.is_some()
    }
}

/// One Pod scheduled to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub host_network: bool,
    /// Succeeded or Failed: its address is released.
    pub terminal: bool,
    /// The address already published for it (annotation, or what this agent wrote).
    pub network: Option<PodAddr>,
    /// An unusable `pod-networks` annotation.
    pub error: Option<String>,
}

impl PodInfo {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
    /// The logical switch port name: `<namespace>_<name>`.
    pub fn lsp_name(&self) -> String {
        format!("{}_{}", self.namespace, self.name)
    }
}

/// A pod's IPv4 address and MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodAddr {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

impl PodAddr {
    /// `aa:bb:cc:dd:ee:ff`.
    pub fn mac_string(&self) -> String {
        let m = self.mac;
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Everything the plan reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every Node, by name.
    pub nodes: BTreeMap<String, NodeInfo>,
    /// This node's Pods.
    pub pods: Vec<PodInfo>,
}

/// A source of a node's zones. Issue 5 adds TrustZone selectors as a second source; a node's
/// zones are the union over all sources.
pub trait ZoneSource: Send + Sync {
    /// The zones `node` belongs to according to this source; an error is reported on the Node
    /// and counts as no zones from this source.
    fn zones(&self, node: &Node) -> Result<BTreeSet<String>, String>;
}

/// Zones from the `k8s.ovn.org/transport-zones` annotation (seed 001).
#[derive(Clone, Copy, Debug, Default)]
pub struct AnnotationZones;

impl ZoneSource for AnnotationZones {
    fn zones(&self, node: &Node) -> Result<BTreeSet<String>, String> {
        match annotation(node.metadata.annotations.as_ref(), ann::TRANSPORT_ZONES) {
            None => Ok(BTreeSet::new()),
            Some(v) => ann::parse_transport_zones(v)
                .map(|z| z.into_iter().collect())
                .map_err(|e| e.to_string()),
        }
    }
}

fn annotation<'a>(a: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    a.and_then(|m| m.get(key)).map(String::as_str)
}

fn v4(n: IpNet) -> Option<Ipv4Net> {
    match n {
        IpNet::V4(n) => Some(n),
        IpNet::V6(_) => None,
    }
}

/// Parses one Node. Bad annotations end up in `errors`, never in a panic.
pub fn node_info(node: &Node, zones: &[&dyn ZoneSource]) -> NodeInfo {
    let a = node.metadata.annotations.as_ref();
    let mut info = NodeInfo {
        name: node.metadata.name.clone().unwrap_or_default(),
        ..NodeInfo::default()
    };
    let mut errors = Vec::new();
    if let Some(v) = annotation(a, ann::NODE_ID) {
        match ann::parse_node_id(v) {
            Ok(id) => info.id = Some(id),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if let Some(v) = annotation(a, ann::NODE_SUBNETS) {
        match ann::parse_node_subnets(v) {
            Ok(m) => {
                info.subnet = m
                    .get(ann::DEFAULT_NETWORK)
                    .and_then(|l| l.iter().copied().find_map(v4))
                    .map(|n| n.trunc());
                if info.subnet.is_none() {
                    errors.push(format!(
                        "annotation {}: no IPv4 subnet for the default network",
                        ann::NODE_SUBNETS
                    ));
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if let Some(v) = annotation(a, ann::NODE_TRANSIT_SWITCH_PORT_IFADDR) {
        match ann::parse_ifaddr(ann::NODE_TRANSIT_SWITCH_PORT_IFADDR, v) {
            Ok(i) => info.transit = i.ipv4.and_then(v4),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if let Some(v) = annotation(a, ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS) {
        match ann::parse_gateway_router_lrp_ifaddrs(v) {
            Ok(m) => {
                info.join = m
                    .get(ann::DEFAULT_NETWORK)
                    .and_then(|i| i.ipv4)
                    .and_then(v4)
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if let Some(v) = annotation(a, ann::NODE_CHASSIS_ID) {
        let v = v.trim();
        if v.is_empty() || v.contains(char::is_whitespace) {
            errors.push(format!(
                "annotation {}: {v:?} is not a chassis id",
                ann::NODE_CHASSIS_ID
            ));
        } else {
            info.chassis_id = Some(v.to_owned());
        }
    }
    if let Some(v) = annotation(a, ann::NODE_ENCAP_IPS) {
        match ann::parse_ip_list(ann::NODE_ENCAP_IPS, v) {
            Ok(l) => info.encap_ips = l,
            Err(e) => errors.push(e.to_string()),
        }
    }
    for src in zones {
        match src.zones(node) {
            Ok(z) => info.zones.extend(z),
            Err(e) => errors.push(e),
        }
    }
    info.internal_ip = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|l| {
            l.iter()
                .filter(|a| a.type_ == "InternalIP")
                .find_map(|a| a.address.parse().ok())
        });
    info.errors = errors;
    info
}

/// Parses one Pod; `written` is what this agent published for it and may not be in the
/// store yet.
pub fn pod_info(pod: &Pod, written: Option<PodAddr>) -> PodInfo {
    let spec = pod.spec.as_ref();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let mut info = PodInfo {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        terminal: matches!(phase, Some("Succeeded" | "Failed")),
        network: None,
        error: None,
    };
    if let Some(v) = annotation(pod.metadata.annotations.as_ref(), ann::POD_NETWORKS) {
        match parse_pod_addr(v) {
            Ok(a) => info.network = a,
            Err(e) => info.error = Some(e),
        }
    }
    if info.network.is_none() {
        info.network = written;
    }
    info
}

/// The default network's IPv4 address and MAC from a `pod-networks` value.
pub fn parse_pod_addr(value: &str) -> Result<Option<PodAddr>, String> {
    let m = ann::parse_pod_networks(value).map_err(|e| e.to_string())?;
    let Some(pn) = m.get(ann::DEFAULT_NETWORK) else {
        return Ok(None);
    };
    let ip = pn
        .ip_addresses
        .iter()
        .find_map(|n| match n {
            IpNet::V4(n) => Some(n.addr()),
            IpNet::V6(_) => None,
        })
        .ok_or_else(|| format!("annotation {}: no IPv4 address", ann::POD_NETWORKS))?;
    let mac = ann::parse_mac(&pn.mac_address)?;
    Ok(Some(PodAddr { ip, mac }))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static [&'static str]);
    impl ZoneSource for Fixed {
        fn zones(&self, _: &Node) -> Result<BTreeSet<String>, String> {
            Ok(self.0.iter().map(|s| (*s).to_owned()).collect())
        }
    }

    fn node(annotations: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "annotations": annotations},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "172.16.0.9"}]},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn zones_are_the_union_of_sources_and_bad_values_are_errors() {
        let n = node(serde_json::json!({"k8s.ovn.org/transport-zones": "[\"b\",\"a\"]"}));
        let i = node_info(&n, &[&AnnotationZones, &Fixed(&["x"])]);
        assert_eq!(
            i.zones,
            ["a", "b", "x"].iter().map(|s| (*s).to_owned()).collect()
        );
        assert_eq!(i.internal_ip, "172.16.0.9".parse().ok());
        let n = node(serde_json::json!({"k8s.ovn.org/transport-zones": "tz1"}));
        let i = node_info(&n, &[&AnnotationZones, &Fixed(&["x"])]);
        assert_eq!(i.zones, ["x"].iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(i.errors.len(), 1, "{:?}", i.errors);
    }

    #[test]
    fn malformed_cluster_manager_annotations_are_errors_not_panics() {
        let n = node(serde_json::json!({
            "k8s.ovn.org/node-id": "zero",
            "k8s.ovn.org/node-subnets": "{\"default\":[\"not-a-cidr\"]}",
            "k8s.ovn.org/node-transit-switch-port-ifaddr": "{}",
            "k8s.ovn.org/node-gateway-router-lrp-ifaddrs": "[",
            "k8s.ovn.org/node-chassis-id": " ",
            "k8s.ovn.org/node-encap-ips": "[\"x\"]",
        }));
        let i = node_info(&n, &[&AnnotationZones]);
        assert!(!i.has_cluster_manager_data());
        assert!(i.chassis_id.is_none() && i.encap_ips.is_empty());
        assert_eq!(i.errors.len(), 6, "{:?}", i.errors);
    }

    #[test]
    fn pod_addresses_come_from_the_default_network() {
        let v = r#"{"default":{"ip_addresses":["10.244.1.5/24"],"mac_address":"0a:58:0a:f4:01:05","gateway_ips":["10.244.1.1"],"role":"primary"}}"#;
        let a = parse_pod_addr(v).ok().flatten();
        assert_eq!(a.map(|a| a.ip.to_string()), Some("10.244.1.5".into()));
        assert_eq!(a.map(|a| a.mac_string()), Some("0a:58:0a:f4:01:05".into()));
        assert!(parse_pod_addr("{").is_err());
        assert_eq!(parse_pod_addr("{}"), Ok(None));
    }
}
