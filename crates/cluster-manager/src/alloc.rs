//! The allocator core: node IDs, node subnets, transit switch and join addresses. No I/O.
//!
//! The allocator is fed the live Nodes (name, creation time and the four raw annotations the
//! cluster manager owns) with [`Allocator::sync`]. Nodes it has not seen yet first *claim*
//! what their annotations already say (oldest Node first, by creationTimestamp then name), and
//! only then are fresh values handed out, lowest free first. A fresh allocator fed the
//! annotations a previous one published therefore rebuilds exactly the same assignment, and a
//! claim that is malformed, out of range or already held by an older Node is refused and
//! reported as a [`Finding`]. Nodes missing from a sync are released.
//!
//! Addresses follow upstream: the transit switch port IP and the gateway-router join IP are the
//! base of their range plus the node ID, with the range's prefix length.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use k8s_api::annotations::{self as ann, IfAddr};

/// The first node ID handed out. Upstream reserves 0 and 1 (join base + 1, `100.64.0.1`, is the
/// cluster router's own join address), so nodes are numbered 2, 3, …
pub const FIRST_NODE_ID: u32 = 2;

/// The highest node ID OVN can use: it is also the transit switch port's `requested-tnl-key`,
/// and Geneve carries logical port keys in 15 bits.
pub const MAX_PORT_TUNNEL_KEY: u32 = 32767;

/// Largest number of host subnets the cluster CIDR may be split into (keeps scans bounded).
pub const MAX_SUBNET_BITS: u8 = 24;

/// The ranges the allocator hands out from. Built with [`AllocConfig::new`], which validates
/// them, so every method here is total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocConfig {
    cluster_cidr: Ipv4Net,
    host_subnet_length: u8,
    transit: Ipv4Net,
    join: Ipv4Net,
}

/// An unusable allocator configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A range is not IPv4 (ovnk allocates IPv4 only).
    #[error("{what} {net} is not an IPv4 CIDR (only IPv4 is supported)")]
    NotIpv4 {
        /// Which flag.
        what: &'static str,
        /// The value given.
        net: IpNet,
    },
    /// A range has host bits set.
    #[error("{what} {net} is not a network address (did you mean {trunc}?)")]
    HostBits {
        /// Which flag.
        what: &'static str,
        /// The value given.
        net: Ipv4Net,
        /// The network it lies in.
        trunc: Ipv4Net,
    },
    /// The host subnet length does not fit the cluster CIDR.
    #[error(
        "host subnet length /{len} does not fit cluster CIDR {cidr}: it must be between /{min} and /30 and split it into at most 2^{MAX_SUBNET_BITS} subnets"
    )]
    HostSubnetLength {
        /// The length given.
        len: u8,
        /// The cluster CIDR.
        cidr: Ipv4Net,
        /// The cluster CIDR's own prefix length.
        min: u8,
    },
    /// The transit or join range cannot address even one node.
    #[error("{what} {net} has no room for node IDs from {FIRST_NODE_ID}")]
    TooSmall {
        /// Which flag.
        what: &'static str,
        /// The value given.
        net: Ipv4Net,
    },
}

fn v4(what: &'static str, net: IpNet) -> Result<Ipv4Net, ConfigError> {
    match net {
        IpNet::V4(n) if n == n.trunc() => Ok(n),
        IpNet::V4(n) => Err(ConfigError::HostBits {
            what,
            net: n,
            trunc: n.trunc(),
        }),
        IpNet::V6(_) => Err(ConfigError::NotIpv4 { what, net }),
    }
}

/// Usable host addresses of a range (without network and broadcast addresses).
fn hosts(net: Ipv4Net) -> u32 {
    match 32 - u32::from(net.prefix_len()) {
        0 | 1 => 0,
        bits => (1u64 << bits).saturating_sub(2).min(u64::from(u32::MAX)) as u32,
    }
}

fn offset(net: Ipv4Net, n: u32) -> Ipv4Net {
    let ip = Ipv4Addr::from(u32::from(net.network()).wrapping_add(n));
    // The prefix length comes from a valid Ipv4Net, so this cannot fail; fall back to the base.
    Ipv4Net::new(ip, net.prefix_len()).unwrap_or(net)
}

impl AllocConfig {
    /// Validates the ranges: all IPv4 network addresses, the host subnet length between the
    /// cluster CIDR's length and /30, and transit/join ranges with room for at least one node.
    pub fn new(
        cluster_cidr: IpNet,
        host_subnet_length: u8,
        transit: IpNet,
        join: IpNet,
    ) -> Result<Self, ConfigError> {
        let cluster_cidr = v4("cluster CIDR", cluster_cidr)?;
        let transit = v4("transit CIDR", transit)?;
        let join = v4("join CIDR", join)?;
        let min = cluster_cidr.prefix_len();
        if host_subnet_length < min
            || host_subnet_length > 30
            || host_subnet_length - min > MAX_SUBNET_BITS
        {
            return Err(ConfigError::HostSubnetLength {
                len: host_subnet_length,
                cidr: cluster_cidr,
                min,
            });
        }
        for (what, net) in [("transit CIDR", transit), ("join CIDR", join)] {
            if hosts(net) < FIRST_NODE_ID {
                return Err(ConfigError::TooSmall { what, net });
            }
        }
        Ok(Self {
            cluster_cidr,
            host_subnet_length,
            transit,
            join,
        })
    }

    /// The cluster CIDR node subnets are carved from.
    pub fn cluster_cidr(&self) -> Ipv4Net {
        self.cluster_cidr
    }

    /// The highest node ID: the smaller of what the transit and join ranges can address (base +
    /// ID must be a host address) and [`MAX_PORT_TUNNEL_KEY`].
    pub fn max_node_id(&self) -> u32 {
        hosts(self.transit)
            .min(hosts(self.join))
            .min(MAX_PORT_TUNNEL_KEY)
    }

    /// How many node subnets the cluster CIDR holds.
    pub fn subnet_count(&self) -> u32 {
        1u32 << (self.host_subnet_length - self.cluster_cidr.prefix_len())
    }

    /// The `index`-th node subnet (index below [`Self::subnet_count`]).
    pub fn subnet(&self, index: u32) -> Ipv4Net {
        let size = 1u64 << (32 - u32::from(self.host_subnet_length));
        let base = u64::from(u32::from(self.cluster_cidr.network()));
        let ip = Ipv4Addr::from((base + u64::from(index) * size) as u32);
        Ipv4Net::new(ip, self.host_subnet_length).unwrap_or(self.cluster_cidr)
    }

    /// The index of `net` if it is one of the node subnets.
    pub fn subnet_index(&self, net: Ipv4Net) -> Option<u32> {
        if net.prefix_len() != self.host_subnet_length
            || net != net.trunc()
            || !self.cluster_cidr.contains(&net)
        {
            return None;
        }
        let delta = u32::from(net.network()) - u32::from(self.cluster_cidr.network());
        Some(delta >> (32 - u32::from(self.host_subnet_length)))
    }

    /// The transit switch port address of node `id` (`100.88.0.<id>/16`).
    pub fn transit_addr(&self, id: u32) -> Ipv4Net {
        offset(self.transit, id)
    }

    /// The gateway-router join address of node `id` (`100.64.0.<id>/16`).
    pub fn join_addr(&self, id: u32) -> Ipv4Net {
        offset(self.join, id)
    }

    /// The full assignment of a node with `id` and subnet `index`.
    pub fn assignment(&self, id: u32, index: u32) -> Assignment {
        Assignment {
            id,
            subnet: self.subnet(index),
            transit: self.transit_addr(id),
            join: self.join_addr(id),
        }
    }
}

/// What one Node is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Assignment {
    /// Node ID (`k8s.ovn.org/node-id`).
    pub id: u32,
    /// Node subnet (`k8s.ovn.org/node-subnets`, default network).
    pub subnet: Ipv4Net,
    /// Transit switch port address (`k8s.ovn.org/node-transit-switch-port-ifaddr`).
    pub transit: Ipv4Net,
    /// Gateway-router join address (`k8s.ovn.org/node-gateway-router-lrp-ifaddrs`).
    pub join: Ipv4Net,
}

/// The raw values of the annotations the cluster manager owns, as found on a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// `k8s.ovn.org/node-id`.
    pub node_id: Option<String>,
    /// `k8s.ovn.org/node-subnets`.
    pub subnets: Option<String>,
    /// `k8s.ovn.org/node-transit-switch-port-ifaddr`.
    pub transit: Option<String>,
    /// `k8s.ovn.org/node-gateway-router-lrp-ifaddrs`.
    pub join: Option<String>,
}

impl Observed {
    /// Picks the four keys out of a Node's annotations.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        Self {
            node_id: a.get(ann::NODE_ID).cloned(),
            subnets: a.get(ann::NODE_SUBNETS).cloned(),
            transit: a.get(ann::NODE_TRANSIT_SWITCH_PORT_IFADDR).cloned(),
            join: a.get(ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS).cloned(),
        }
    }
}

/// A Node as the allocator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name.
    pub name: String,
    /// creationTimestamp in seconds since the epoch; `None` sorts last.
    pub created: Option<i64>,
    /// Its cluster-manager annotations.
    pub observed: Observed,
}

/// Something wrong with a Node's annotations, to be reported on that Node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Finding {
    /// The value does not parse or is not usable at all.
    #[error("annotation {key} is malformed ({error}); reallocating")]
    Malformed {
        /// Annotation key.
        key: &'static str,
        /// What is wrong.
        error: String,
    },
    /// The value names something outside the configured ranges.
    #[error("annotation {key} value {value} is out of range ({reason}); reallocating")]
    OutOfRange {
        /// Annotation key.
        key: &'static str,
        /// The value found.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// Another (older) Node already holds the value.
    #[error(
        "annotation {key} value {value} conflicts with node {holder}, which holds it; reallocating"
    )]
    Conflict {
        /// Annotation key.
        key: &'static str,
        /// The value found.
        value: String,
        /// The Node holding it.
        holder: String,
    },
    /// The value differs from what the Node was given and is rewritten.
    #[error("annotation {key} was {found:?}, which is not this node's allocation; rewriting")]
    Mismatch {
        /// Annotation key.
        key: &'static str,
        /// The value found.
        found: String,
    },
}

/// A Node that could not be given everything it needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Exhausted {
    /// Every node ID is in use.
    #[error("no free node ID (IDs {FIRST_NODE_ID}..={max} are all in use)")]
    NodeIds {
        /// The highest ID.
        max: u32,
    },
    /// Every node subnet is in use.
    #[error("no free node subnet in {cidr} (all {count} are in use)")]
    Subnets {
        /// The cluster CIDR.
        cidr: Ipv4Net,
        /// How many subnets it holds.
        count: u32,
    },
}

/// What a [`Allocator::sync`] call found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Per Node, what was wrong with its annotations.
    pub findings: Vec<(String, Finding)>,
    /// Nodes left without an allocation, and why.
    pub exhausted: Vec<(String, Exhausted)>,
    /// Nodes released because they are gone.
    pub released: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    id: u32,
    subnet: u32,
}

/// The allocator state: who holds which ID and subnet.
#[derive(Debug, Clone)]
pub struct Allocator {
    cfg: AllocConfig,
    nodes: BTreeMap<String, Slot>,
    ids: BTreeMap<u32, String>,
    subnets: BTreeMap<u32, String>,
}

fn lowest_free(used: &BTreeMap<u32, String>, from: u32, to: u32) -> Option<u32> {
    let mut want = from;
    for &k in used.range(from..=to).map(|(k, _)| k) {
        if k != want {
            break;
        }
        want = want.checked_add(1)?;
    }
    (want <= to).then_some(want)
}

impl Allocator {
    /// An empty allocator.
    pub fn new(cfg: AllocConfig) -> Self {
        Self {
            cfg,
            nodes: BTreeMap::new(),
            ids: BTreeMap::new(),
            subnets: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AllocConfig {
        &self.cfg
    }

    /// The assignment of `node`, if it has one.
    pub fn get(&self, node: &str) -> Option<Assignment> {
        self.nodes
            .get(node)
            .map(|s| self.cfg.assignment(s.id, s.subnet))
    }

    /// Every assignment, by node name.
    pub fn assignments(&self) -> BTreeMap<String, Assignment> {
        self.nodes
            .iter()
            .map(|(n, s)| (n.clone(), self.cfg.assignment(s.id, s.subnet)))
            .collect()
    }

    fn release(&mut self, node: &str) {
        if let Some(s) = self.nodes.remove(node) {
            self.ids.remove(&s.id);
            self.subnets.remove(&s.subnet);
        }
    }

    fn claim_id(&self, raw: &str) -> Result<u32, Finding> {
        let id = ann::parse_node_id(raw).map_err(|e| Finding::Malformed {
            key: ann::NODE_ID,
            error: e.reason,
        })?;
        let max = self.cfg.max_node_id();
        if id < FIRST_NODE_ID || id > max {
            return Err(Finding::OutOfRange {
                key: ann::NODE_ID,
                value: raw.to_owned(),
                reason: format!(
                    "node IDs are {FIRST_NODE_ID}..={max}, what the transit and join ranges can address"
                ),
            });
        }
        match self.ids.get(&id) {
            Some(holder) => Err(Finding::Conflict {
                key: ann::NODE_ID,
                value: id.to_string(),
                holder: holder.clone(),
            }),
            None => Ok(id),
        }
    }

    fn claim_subnet(&self, raw: &str) -> Result<u32, Finding> {
        let map = ann::parse_node_subnets(raw).map_err(|e| Finding::Malformed {
            key: ann::NODE_SUBNETS,
            error: e.reason,
        })?;
        let Some(list) = map.get(ann::DEFAULT_NETWORK) else {
            return Err(Finding::Malformed {
                key: ann::NODE_SUBNETS,
                error: format!("no {:?} network", ann::DEFAULT_NETWORK),
            });
        };
        let v4: Vec<Ipv4Net> = list
            .iter()
            .filter_map(|n| match n {
                IpNet::V4(n) => Some(*n),
                IpNet::V6(_) => None,
            })
            .collect();
        let [net] = v4.as_slice() else {
            return Err(Finding::Malformed {
                key: ann::NODE_SUBNETS,
                error: format!("expected one IPv4 subnet, found {}", v4.len()),
            });
        };
        let Some(index) = self.cfg.subnet_index(*net) else {
            return Err(Finding::OutOfRange {
                key: ann::NODE_SUBNETS,
                value: net.to_string(),
                reason: format!(
                    "not a /{} subnet of the cluster CIDR {}",
                    self.cfg.host_subnet_length, self.cfg.cluster_cidr
                ),
            });
        };
        match self.subnets.get(&index) {
            Some(holder) => Err(Finding::Conflict {
                key: ann::NODE_SUBNETS,
                value: net.to_string(),
                holder: holder.clone(),
            }),
            None => Ok(index),
        }
    }

    /// Brings the allocator in line with the live Nodes: releases Nodes that are gone, lets new
    /// Nodes claim what their annotations hold (oldest first), then allocates the rest lowest
    /// free first. Nodes already allocated keep their assignment whatever their annotations
    /// say now (a differing value is reported as [`Finding::Mismatch`]).
    pub fn sync(&mut self, nodes: &[NodeInfo]) -> SyncReport {
        let mut report = SyncReport::default();
        let live: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !live.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.release(&n);
            report.released.push(n);
        }

        let mut fresh: Vec<&NodeInfo> = nodes
            .iter()
            .filter(|n| !self.nodes.contains_key(&n.name))
            .collect();
        fresh.sort_by(|a, b| {
            (a.created.unwrap_or(i64::MAX), &a.name).cmp(&(b.created.unwrap_or(i64::MAX), &b.name))
        });
        fresh.dedup_by(|a, b| a.name == b.name);

        // Phase 1: every new node claims what its annotations hold, oldest first.
        let mut claims: Vec<(&NodeInfo, Option<u32>, Option<u32>)> = Vec::new();
        let mut reported: BTreeSet<(String, &'static str)> = BTreeSet::new();
        for n in &fresh {
            let mut id = None;
            if let Some(raw) = &n.observed.node_id {
                match self.claim_id(raw) {
                    Ok(v) => {
                        self.ids.insert(v, n.name.clone());
                        id = Some(v);
                    }
                    Err(f) => {
                        reported.insert((n.name.clone(), ann::NODE_ID));
                        report.findings.push((n.name.clone(), f));
                    }
                }
            }
            let mut subnet = None;
            if let Some(raw) = &n.observed.subnets {
                match self.claim_subnet(raw) {
                    Ok(v) => {
                        self.subnets.insert(v, n.name.clone());
                        subnet = Some(v);
                    }
                    Err(f) => {
                        reported.insert((n.name.clone(), ann::NODE_SUBNETS));
                        report.findings.push((n.name.clone(), f));
                    }
                }
            }
            claims.push((n, id, subnet));
        }

        // Phase 2: fill the gaps, oldest first.
        let max_id = self.cfg.max_node_id();
        let max_subnet = self.cfg.subnet_count() - 1;
        for (n, id, subnet) in claims {
            let id = id.or_else(|| {
                let v = lowest_free(&self.ids, FIRST_NODE_ID, max_id)?;
                self.ids.insert(v, n.name.clone());
                Some(v)
            });
            let subnet = subnet.or_else(|| {
                let v = lowest_free(&self.subnets, 0, max_subnet)?;
                self.subnets.insert(v, n.name.clone());
                Some(v)
            });
            match (id, subnet) {
                (Some(id), Some(subnet)) => {
                    self.nodes.insert(n.name.clone(), Slot { id, subnet });
                }
                (id, subnet) => {
                    // All or nothing: give back the half that was found.
                    if let Some(id) = id {
                        self.ids.remove(&id);
                    }
                    if let Some(s) = subnet {
                        self.subnets.remove(&s);
                    }
                    let why = if id.is_none() {
                        Exhausted::NodeIds { max: max_id }
                    } else {
                        Exhausted::Subnets {
                            cidr: self.cfg.cluster_cidr,
                            count: self.cfg.subnet_count(),
                        }
                    };
                    report.exhausted.push((n.name.clone(), why));
                }
            }
        }

        // Report every other annotation that differs from the node's assignment.
        for n in nodes {
            let Some(a) = self.get(&n.name) else { continue };
            for (key, found) in stale_keys(&a, &n.observed) {
                if !reported.contains(&(n.name.clone(), key))
                    && let Some(found) = found
                {
                    report
                        .findings
                        .push((n.name.clone(), Finding::Mismatch { key, found }));
                }
            }
        }
        report
    }
}

/// The annotation values an assignment is published as, keyed by annotation.
pub fn annotations(a: &Assignment) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (ann::NODE_ID, a.id.to_string()),
        (
            ann::NODE_SUBNETS,
            ann::format_node_subnets(ann::DEFAULT_NETWORK, &[IpNet::V4(a.subnet)]),
        ),
        (
            ann::NODE_TRANSIT_SWITCH_PORT_IFADDR,
            transit_ifaddr(a).to_annotation(),
        ),
        (
            ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS,
            ann::format_gateway_router_lrp_ifaddrs(ann::DEFAULT_NETWORK, &join_ifaddr(a)),
        ),
    ])
}

fn transit_ifaddr(a: &Assignment) -> IfAddr {
    IfAddr {
        ipv4: Some(IpNet::V4(a.transit)),
        ipv6: None,
    }
}

fn join_ifaddr(a: &Assignment) -> IfAddr {
    IfAddr {
        ipv4: Some(IpNet::V4(a.join)),
        ipv6: None,
    }
}

/// The keys whose observed value does not mean `a` (compared by meaning, not by string, so an
/// equivalent value written differently is left alone), with the value found (None = absent).
fn stale_keys(a: &Assignment, o: &Observed) -> Vec<(&'static str, Option<String>)> {
    let id_ok = o
        .node_id
        .as_deref()
        .is_some_and(|v| ann::parse_node_id(v) == Ok(a.id));
    let subnet_ok = o.subnets.as_deref().is_some_and(|v| {
        ann::parse_node_subnets(v)
            .ok()
            .and_then(|m| m.get(ann::DEFAULT_NETWORK).cloned())
            == Some(vec![IpNet::V4(a.subnet)])
    });
    let transit_ok = o.transit.as_deref().is_some_and(|v| {
        ann::parse_ifaddr(ann::NODE_TRANSIT_SWITCH_PORT_IFADDR, v).ok() == Some(transit_ifaddr(a))
    });
    let join_ok = o.join.as_deref().is_some_and(|v| {
        ann::parse_gateway_router_lrp_ifaddrs(v)
            .ok()
            .and_then(|m| m.get(ann::DEFAULT_NETWORK).cloned())
            == Some(join_ifaddr(a))
    });
    [
        (ann::NODE_ID, id_ok, &o.node_id),
        (ann::NODE_SUBNETS, subnet_ok, &o.subnets),
        (ann::NODE_TRANSIT_SWITCH_PORT_IFADDR, transit_ok, &o.transit),
        (ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS, join_ok, &o.join),
    ]
    .into_iter()
    .filter(|(_, ok, _)| !ok)
    .map(|(k, _, v)| (k, v.clone()))
    .collect()
}

/// The annotations to write so the Node shows `a`: only the keys whose current value does not
/// already mean the same thing. Empty when nothing needs writing.
pub fn annotation_patch(a: &Assignment, o: &Observed) -> BTreeMap<&'static str, String> {
    let mut all = annotations(a);
    let stale: BTreeSet<&'static str> = stale_keys(a, o).into_iter().map(|(k, _)| k).collect();
    all.retain(|k, _| stale.contains(k));
    all
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
