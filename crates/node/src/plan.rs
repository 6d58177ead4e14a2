//! The pure plan: `(Snapshot, LocalNode) -> Desired`. No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use k8s_api::annotations as ann;
use ovn_model::OWNER_KEY;

use crate::snapshot::{PodAddr, PodInfo, Snapshot};

/// `ovn_cluster_router`.
pub const CLUSTER_ROUTER: &str = "ovn_cluster_router";
/// `transit_switch`.
pub const TRANSIT_SWITCH: &str = "transit_switch";
/// Upstream's `BaseTransitSwitchTunnelKey` (default network ID 0).
pub const TRANSIT_SWITCH_TNL_KEY: u32 = 16_711_683;
/// The management port's OVS interface name.
pub const MGMT_PORT: &str = "ovn-k8s-mp0";
/// The static routes' network key (upstream, R1.1+).
pub const NETWORK_KEY: &str = "k8s.ovn.org/network";
/// Upstream's per-node ownership key on IC static routes.
pub const IC_NODE_KEY: &str = "ic-node";
/// The nftables table ovnk owns in the node's namespace.
pub const NFT_TABLE: &str = "ovnk-gateway";

type Map = BTreeMap<String, String>;

/// What the agent knows about itself (flags and the local OVS database).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalNode {
    pub name: String,
    /// OVS `external_ids:system-id` (kept, or generated once and written).
    pub system_id: String,
    /// `--encap-ip`, else the Node's InternalIP (resolved by the plan when `None`).
    pub encap_ip: Option<IpAddr>,
    /// The node's underlay address with its prefix (for `node-primary-ifaddr`), when known.
    pub primary_ifaddr: Option<IpNet>,
    pub gateway_interface: Option<String>,
    pub mtu: u32,
    pub cluster_cidr: Ipv4Net,
    pub transit_cidr: Ipv4Net,
    pub join_cidr: Ipv4Net,
    /// Which zone enforcements are on (both, except in tests that prove each alone suffices).
    pub enforcement: Enforcement,
}

/// The two independent enforcements of zones (issue 5). Each alone keeps a tunnel to a
/// non-connected node from being built; production always runs both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enforcement {
    /// Program only connected remote nodes (seed 000). Off: every remote node is programmed.
    pub filter_rows: bool,
    /// Local `external_ids:ovn-transport-zones` and remote `Chassis.transport_zones`
    /// (seed 001). Off: neither is written, so OVN itself filters nothing.
    pub transport_zones: bool,
}

impl Default for Enforcement {
    fn default() -> Self {
        Enforcement {
            filter_rows: true,
            transport_zones: true,
        }
    }
}

/// Owner values in `external_ids:k8s.ovn.org/owner`.
pub fn owner_node(node: &str) -> String {
    format!("node/{node}")
}
/// Owner value of a pod's port.
pub fn owner_pod(ns: &str, name: &str) -> String {
    format!("pod/{ns}/{name}")
}
/// Owner value of the cluster-wide rows (router, transit switch).
pub const OWNER_CLUSTER: &str = "cluster";

fn map<const N: usize>(kv: [(&str, String); N]) -> Map {
    kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
fn set<const N: usize>(v: [String; N]) -> BTreeSet<String> {
    v.into_iter().collect()
}

/// A logical switch port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lsp {
    pub name: String,
    pub kind: String,
    pub addresses: BTreeSet<String>,
    pub port_security: BTreeSet<String>,
    pub options: Map,
    pub external_ids: Map,
}

/// A logical switch and all of its ports (ovnk owns every port on its switches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    pub name: String,
    pub other_config: Map,
    pub external_ids: Map,
    pub ports: Vec<Lsp>,
}

/// A logical router port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lrp {
    pub name: String,
    pub mac: String,
    pub networks: BTreeSet<String>,
    pub options: Map,
    pub external_ids: Map,
}

/// A static route (dst-ip, main table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub ip_prefix: String,
    pub nexthop: String,
    pub external_ids: Map,
}

/// The router and everything on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Router {
    pub name: String,
    pub external_ids: Map,
    pub ports: Vec<Lrp>,
    pub routes: Vec<Route>,
}

/// The local zone's Northbound content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbDesired {
    pub router: Router,
    pub switches: Vec<Switch>,
}

/// A remote node's SB Chassis (with `other_config:is-remote=true`) and its geneve Encaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteChassis {
    pub name: String,
    pub hostname: String,
    pub encap_ips: BTreeSet<IpAddr>,
    pub transport_zones: BTreeSet<String>,
}

/// The local Southbound content ovnk writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SbDesired {
    /// This node's own chassis (written by ovn-controller; never touched, only recognised).
    pub local_chassis: String,
    pub chassis: Vec<RemoteChassis>,
    /// Remote port name → chassis name, for `Port_Binding.chassis`.
    pub bindings: BTreeMap<String, String>,
}

/// The management port on br-int.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MgmtPort {
    pub iface_id: String,
    pub mac: String,
    pub mtu: u32,
}

/// The local Open_vSwitch content ovnk writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OvsDesired {
    /// `Open_vSwitch` `external_ids` keys: `Some` to set, `None` to remove.
    pub external_ids: BTreeMap<String, Option<String>>,
    pub mgmt_port: Option<MgmtPort>,
}

/// The kernel side in the node's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDesired {
    pub mgmt_ip: Ipv4Net,
    pub mgmt_mac: String,
    pub router_ip: Ipv4Addr,
    pub cluster_cidr: Ipv4Net,
    pub mtu: u32,
    /// The nftables ruleset of [`NFT_TABLE`] (empty when there is no gateway interface).
    pub nft: String,
}

/// A Pod whose `k8s.ovn.org/pod-networks` must carry `addr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAnnotation {
    pub namespace: String,
    pub name: String,
    pub addr: PodAddr,
    pub value: String,
}

/// The kind of object a problem is reported on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectRef {
    Node(String),
    /// A TrustZone (cluster-scoped).
    TrustZone(String),
    Pod {
        namespace: String,
        name: String,
    },
}

/// Bad input found while planning: an Event on the object and a log line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub object: ObjectRef,
    pub reason: &'static str,
    pub message: String,
}

/// Everything one reconcile should make true.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// `None` until the local node carries the cluster manager's annotations (NB and SB are
    /// then left alone).
    pub nb: Option<NbDesired>,
    pub sb: Option<SbDesired>,
    pub ovs: OvsDesired,
    /// Annotations this agent owns on its Node.
    pub node_annotations: Map,
    pub pod_annotations: Vec<PodAnnotation>,
    pub kernel: Option<KernelDesired>,
    pub problems: Vec<Problem>,
    /// Remote nodes this node is connected to and programs.
    pub remotes: BTreeSet<String>,
}

/// OVN's rule: two chassis tunnel iff their zone sets intersect, or both are empty (the one
/// definition lives in the `zones` crate).
pub use zones::connected;

/// `subnet base + n`.
pub fn nth(subnet: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(n))
}

fn mac_of(ip: Ipv4Addr) -> String {
    ann::ip_to_mac(IpAddr::V4(ip))
}

fn mac_bytes(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x0a, 0x58, o[0], o[1], o[2], o[3]]
}

/// Pod address management: keeps every valid published address (so nothing is renumbered),
/// then hands out the lowest free addresses from `.3` to pods without one. Never gives one
/// address to two pods; a second pod claiming a taken address is a problem and gets no port.
pub fn assign(subnet: Ipv4Net, pods: &[PodInfo]) -> (BTreeMap<String, PodAddr>, Vec<Problem>) {
    let mut taken: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    let first = u32::from(subnet.network()).saturating_add(3);
    let last = u32::from(subnet.broadcast()).saturating_sub(1);
    let usable = |ip: Ipv4Addr| (first..=last).contains(&u32::from(ip));
    let mut active: Vec<&PodInfo> = pods
        .iter()
        .filter(|p| !p.host_network && !p.terminal)
        .collect();
    active.sort_by_key(|p| p.key());
    let mut waiting = Vec::new();
    for p in active {
        match p.network {
            Some(a) if usable(a.ip) && subnet.contains(&a.ip) => {
                if let Some(owner) = taken.get(&a.ip) {
                    problems.push(Problem {
                        object: ObjectRef::Pod {
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                        },
                        reason: "AddressConflict",
                        message: format!("address {} is already used by pod {owner}", a.ip),
                    });
                } else {
                    taken.insert(a.ip, p.key());
                    out.insert(p.key(), a);
                }
            }
            _ => waiting.push(p),
        }
    }
    let mut next = first;
    for p in waiting {
        while next <= last && taken.contains_key(&Ipv4Addr::from(next)) {
            next += 1;
        }
        if next > last {
            problems.push(Problem {
                object: ObjectRef::Pod {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                },
                reason: "SubnetExhausted",
                message: format!("no free address left in node subnet {subnet}"),
            });
            continue;
        }
        let ip = Ipv4Addr::from(next);
        taken.insert(ip, p.key());
        out.insert(
            p.key(),
            PodAddr {
                ip,
                mac: mac_bytes(ip),
            },
        );
    }
    (out, problems)
}

fn node_problem(node: &str, reason: &'static str, message: String) -> Problem {
    Problem {
        object: ObjectRef::Node(node.to_owned()),
        reason,
        message,
    }
}

/// Plans one reconcile of `local` against the cluster `snap`.
pub fn plan(snap: &Snapshot, local: &LocalNode) -> Desired {
    let me = snap.nodes.get(&local.name);
    let mut problems = Vec::new();
    for n in snap.nodes.values() {
        for e in &n.errors {
            problems.push(node_problem(&n.name, "InvalidAnnotation", e.clone()));
        }
    }
    let my_zones = me.map(|n| n.zones.clone()).unwrap_or_default();
    let enforce = local.enforcement;
    let encap_ip = local.encap_ip.or_else(|| me.and_then(|n| n.internal_ip));

    // ---- local OVS
    let mut ext: BTreeMap<String, Option<String>> = BTreeMap::new();
    ext.insert("system-id".into(), Some(local.system_id.clone()));
    ext.insert("hostname".into(), Some(local.name.clone()));
    ext.insert("ovn-encap-type".into(), Some("geneve".into()));
    ext.insert("ovn-is-interconn".into(), Some("true".into()));
    ext.insert("ovn-encap-ip".into(), encap_ip.map(|i| i.to_string()));
    ext.insert(
        "ovn-transport-zones".into(),
        (enforce.transport_zones && !my_zones.is_empty())
            .then(|| my_zones.iter().cloned().collect::<Vec<_>>().join(",")),
    );
    if encap_ip.is_none() {
        problems.push(node_problem(
            &local.name,
            "NoEncapIP",
            "no --encap-ip and no InternalIP in status.addresses".into(),
        ));
    }

    // ---- annotations this agent owns
    let mut node_annotations = Map::new();
    node_annotations.insert(ann::NODE_CHASSIS_ID.into(), local.system_id.clone());
    if let Some(ip) = encap_ip {
        node_annotations.insert(ann::NODE_ENCAP_IPS.into(), ann::format_ip_list(&[ip]));
    }
    if let Some(p) = local.primary_ifaddr {
        let ifaddr = match p {
            IpNet::V4(_) => ann::IfAddr {
                ipv4: Some(p),
                ipv6: None,
            },
            IpNet::V6(_) => ann::IfAddr {
                ipv4: None,
                ipv6: Some(p),
            },
        };
        node_annotations.insert(ann::NODE_PRIMARY_IFADDR.into(), ifaddr.to_annotation());
        node_annotations.insert(ann::HOST_CIDRS.into(), ann::format_cidr_list(&[p]));
    }

    let mut desired = Desired {
        nb: None,
        sb: None,
        ovs: OvsDesired {
            external_ids: ext,
            mgmt_port: None,
        },
        node_annotations,
        pod_annotations: Vec::new(),
        kernel: None,
        problems,
        remotes: BTreeSet::new(),
    };
    let Some(me) = me.filter(|n| n.has_cluster_manager_data()) else {
        return desired;
    };
    let (Some(id), Some(subnet), Some(transit)) = (me.id, me.subnet, me.transit) else {
        return desired;
    };
    let node = &local.name;
    let owner = owner_node(node);
    let gw = nth(subnet, 1);
    let mgmt = nth(subnet, 2);
    let mgmt_mac = mac_of(mgmt);
    let prefix = subnet.prefix_len();
    desired.node_annotations.insert(
        ann::NODE_MGMT_PORT_MAC_ADDRESSES.into(),
        ann::format_string_map(ann::DEFAULT_NETWORK, &mgmt_mac),
    );
    desired.ovs.mgmt_port = Some(MgmtPort {
        iface_id: format!("k8s-{node}"),
        mac: mgmt_mac.clone(),
        mtu: local.mtu,
    });

    // ---- pods
    let (addrs, pod_problems) = assign(subnet, &snap.pods);
    desired.problems.extend(pod_problems);
    for p in &snap.pods {
        if let Some(e) = &p.error {
            desired.problems.push(Problem {
                object: ObjectRef::Pod {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                },
                reason: "InvalidAnnotation",
                message: e.clone(),
            });
        }
    }
    let mut node_ports = vec![
        Lsp {
            name: format!("stor-{node}"),
            kind: "router".into(),
            addresses: set(["router".into()]),
            port_security: BTreeSet::new(),
            options: map([("router-port", format!("rtos-{node}"))]),
            external_ids: map([(OWNER_KEY, owner.clone())]),
        },
        Lsp {
            name: format!("k8s-{node}"),
            kind: String::new(),
            addresses: set([format!("{mgmt_mac} {mgmt}")]),
            port_security: BTreeSet::new(),
            options: Map::new(),
            external_ids: map([(OWNER_KEY, owner.clone())]),
        },
    ];
    for p in &snap.pods {
        let Some(a) = addrs.get(&p.key()) else {
            continue;
        };
        let addr = format!("{} {}", a.mac_string(), a.ip);
        node_ports.push(Lsp {
            name: p.lsp_name(),
            kind: String::new(),
            addresses: set([addr.clone()]),
            port_security: set([addr]),
            options: Map::new(),
            external_ids: map([
                ("namespace", p.namespace.clone()),
                ("pod", "true".into()),
                (OWNER_KEY, owner_pod(&p.namespace, &p.name)),
            ]),
        });
        let pn = ann::PodNetwork::primary(
            vec![IpNet::V4(Ipv4Net::new(a.ip, prefix).unwrap_or(subnet))],
            a.mac_string(),
            vec![IpAddr::V4(gw)],
        );
        desired.pod_annotations.push(PodAnnotation {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            addr: *a,
            value: ann::format_pod_networks(ann::DEFAULT_NETWORK, &pn),
        });
    }
    let node_switch = Switch {
        name: node.clone(),
        other_config: map([("subnet", subnet.to_string())]),
        external_ids: map([(OWNER_KEY, owner.clone())]),
        ports: node_ports,
    };

    // ---- transit switch: the local router-type port, then the connected remote nodes
    let mut ts_ports = vec![Lsp {
        name: format!("tstor-{node}"),
        kind: "router".into(),
        addresses: set(["router".into()]),
        port_security: BTreeSet::new(),
        options: map([
            ("router-port", format!("rtots-{node}")),
            ("requested-tnl-key", id.to_string()),
        ]),
        external_ids: map([("node", node.clone()), (OWNER_KEY, owner.clone())]),
    }];
    let mut routers_ports = vec![
        Lrp {
            name: format!("rtos-{node}"),
            mac: mac_of(gw),
            networks: set([format!("{gw}/{prefix}")]),
            options: Map::new(),
            external_ids: map([(OWNER_KEY, owner.clone())]),
        },
        Lrp {
            name: format!("rtots-{node}"),
            mac: mac_of(transit.addr()),
            networks: set([transit.to_string()]),
            options: map([("mcast_flood", "true".into())]),
            external_ids: map([(OWNER_KEY, owner.clone())]),
        },
    ];
    routers_ports.sort_by(|a, b| a.name.cmp(&b.name));
    // Local gateway mode: everything outside the cluster goes to the management port (the
    // node's kernel routes and SNATs it); cluster and join destinations OVN has no more
    // specific route for are dropped in OVN.
    let local_route = |prefix: String, nexthop: String| Route {
        ip_prefix: prefix,
        nexthop,
        external_ids: map([
            (NETWORK_KEY, ann::DEFAULT_NETWORK.into()),
            (OWNER_KEY, owner.clone()),
        ]),
    };
    let mut routes = vec![
        local_route("0.0.0.0/0".into(), mgmt.to_string()),
        local_route(local.cluster_cidr.trunc().to_string(), "discard".into()),
        local_route(local.join_cidr.trunc().to_string(), "discard".into()),
    ];
    let mut sb = SbDesired {
        local_chassis: local.system_id.clone(),
        chassis: Vec::new(),
        bindings: BTreeMap::new(),
    };
    let mut seen_ids: BTreeMap<u32, String> = BTreeMap::from([(id, node.clone())]);
    let mut seen_chassis: BTreeMap<String, String> =
        BTreeMap::from([(local.system_id.clone(), node.clone())]);
    let mut seen_encaps: BTreeMap<IpAddr, String> =
        encap_ip.map(|ip| (ip, node.clone())).into_iter().collect();
    for n in snap.nodes.values() {
        if n.name == *node || (enforce.filter_rows && !connected(&my_zones, &n.zones)) {
            continue;
        }
        let (Some(rid), Some(rsub), Some(rts), Some(rjoin), Some(ch)) =
            (n.id, n.subnet, n.transit, n.join, n.chassis_id.as_ref())
        else {
            continue;
        };
        if n.encap_ips.is_empty() {
            continue;
        }
        // Unique in the databases (Chassis name, Encap type+ip, tunnel keys): a duplicate
        // would fail the whole transaction, so the later node (by name) is left out.
        let dup = if let Some(other) = seen_ids.get(&rid) {
            Some((
                "DuplicateNodeID",
                format!("node id {rid} is also used by node {other}"),
            ))
        } else if let Some(other) = seen_chassis.get(ch.as_str()) {
            Some((
                "DuplicateChassisID",
                format!("chassis id {ch} is also used by node {other}"),
            ))
        } else if let Some((ip, other)) = n
            .encap_ips
            .iter()
            .find_map(|ip| seen_encaps.get(ip).map(|o| (ip, o)))
        {
            Some((
                "DuplicateEncapIP",
                format!("encap IP {ip} is also used by node {other}"),
            ))
        } else {
            None
        };
        if let Some((reason, message)) = dup {
            desired
                .problems
                .push(node_problem(&n.name, reason, message));
            continue;
        }
        seen_ids.insert(rid, n.name.clone());
        seen_chassis.insert(ch.clone(), n.name.clone());
        for ip in &n.encap_ips {
            seen_encaps.insert(*ip, n.name.clone());
        }
        let rowner = owner_node(&n.name);
        ts_ports.push(Lsp {
            name: format!("tstor-{}", n.name),
            kind: "remote".into(),
            addresses: set([format!("{} {}", mac_of(rts.addr()), rts)]),
            port_security: BTreeSet::new(),
            options: map([
                ("requested-tnl-key", rid.to_string()),
                ("requested-chassis", n.name.clone()),
            ]),
            external_ids: map([("node", n.name.clone()), (OWNER_KEY, rowner.clone())]),
        });
        let rr = |prefix: String| Route {
            ip_prefix: prefix,
            nexthop: rts.addr().to_string(),
            external_ids: map([
                (IC_NODE_KEY, n.name.clone()),
                (NETWORK_KEY, ann::DEFAULT_NETWORK.into()),
                (OWNER_KEY, rowner.clone()),
            ]),
        };
        routes.push(rr(rsub.trunc().to_string()));
        routes.push(rr(format!("{}/32", rjoin.addr())));
        sb.chassis.push(RemoteChassis {
            name: ch.clone(),
            hostname: n.name.clone(),
            encap_ips: n.encap_ips.iter().copied().collect(),
            transport_zones: if enforce.transport_zones {
                n.zones.clone()
            } else {
                BTreeSet::new()
            },
        });
        sb.bindings.insert(format!("tstor-{}", n.name), ch.clone());
        desired.remotes.insert(n.name.clone());
    }
    let transit_switch = Switch {
        name: TRANSIT_SWITCH.into(),
        other_config: map([
            ("interconn-ts", TRANSIT_SWITCH.into()),
            ("requested-tnl-key", TRANSIT_SWITCH_TNL_KEY.to_string()),
            ("mcast_snoop", "true".into()),
            ("mcast_querier", "false".into()),
            ("mcast_flood_unregistered", "true".into()),
        ]),
        external_ids: map([(OWNER_KEY, OWNER_CLUSTER.into())]),
        ports: ts_ports,
    };
    desired.nb = Some(NbDesired {
        router: Router {
            name: CLUSTER_ROUTER.into(),
            external_ids: map([(OWNER_KEY, OWNER_CLUSTER.into())]),
            ports: routers_ports,
            routes,
        },
        switches: vec![node_switch, transit_switch],
    });
    desired.sb = Some(sb);
    let nft = match (&local.gateway_interface, encap_ip) {
        (Some(gwif), Some(IpAddr::V4(nip))) => nft_ruleset(gwif, local, nip),
        _ => String::new(),
    };
    desired.kernel = Some(KernelDesired {
        mgmt_ip: Ipv4Net::new(mgmt, prefix).unwrap_or(subnet),
        mgmt_mac,
        router_ip: gw,
        cluster_cidr: local.cluster_cidr.trunc(),
        mtu: local.mtu,
        nft,
    });
    desired.problems.sort();
    desired.problems.dedup();
    desired
}

/// The SNAT ruleset of the local gateway: pod traffic leaving by the gateway interface to a
/// destination outside the cluster, transit and join networks is SNATed to the node IP.
pub fn nft_ruleset(gateway_interface: &str, local: &LocalNode, node_ip: Ipv4Addr) -> String {
    let gwif = gateway_interface.replace('"', "");
    format!(
        "table inet {NFT_TABLE} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\toifname \"{gwif}\" ip saddr {cluster} ip daddr != {{ {cluster}, {transit}, {join} }} snat ip to {node_ip}\n\
         \t}}\n\
         }}\n",
        cluster = local.cluster_cidr.trunc(),
        transit = local.transit_cidr.trunc(),
        join = local.join_cidr.trunc(),
    )
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
