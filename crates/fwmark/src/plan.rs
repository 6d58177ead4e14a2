//! The pure plan: (cluster snapshot, local node, node mask) → the marks this node must apply,
//! and (cluster snapshot) → the status conditions of every ServiceFWMark.
//!
//! No I/O, no clock, no Kubernetes types: [`crate::index`] turns API objects into a
//! [`Snapshot`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::mark::{self, FULL_MASK, Mark, MarkError};

/// `namespace/name` of a Service and of the ServiceFWMark / EgressService named after it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One ServiceFWMark object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkRequest {
    pub key: ServiceKey,
    /// `spec.fwmark` as given (validated here, not trusted).
    pub fwmark: i64,
    /// `metadata.creationTimestamp` in seconds since the epoch, if known: the older object wins
    /// a conflict, so adding a conflicting object never disturbs a working one.
    pub created: Option<i64>,
}

/// One Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    /// `spec.clusterIPs` (or `spec.clusterIP`), parsed; `None`/headless gives none.
    pub cluster_ips: Vec<IpAddr>,
    /// The legacy `k8s.ovn.org/egress-service-host` annotation, if set and non-empty.
    pub egress_host_annotation: Option<String>,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addresses: Vec<IpAddr>,
    /// `nodeName` of the endpoint.
    pub node: Option<String>,
    /// The endpoint is a hostNetwork pod (its address is a node address): never marked, because
    /// marking it would mark all traffic from that node's address.
    pub host_network: bool,
}

/// A cluster snapshot, as far as ServiceFWMark needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub marks: BTreeMap<ServiceKey, MarkRequest>,
    pub services: BTreeMap<ServiceKey, ServiceInfo>,
    /// Endpoints of each Service, merged over all its EndpointSlices.
    pub endpoints: BTreeMap<ServiceKey, Vec<Endpoint>>,
    /// `status.host` of each EgressService that has one (node name or `ALL`).
    pub egress_hosts: BTreeMap<ServiceKey, String>,
}

/// Who hosts a Service's egress traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EgressScope {
    /// Not an Egress Service (or one without a host yet): every node marks the ClusterIPs and
    /// its own endpoints.
    PerNode,
    /// `ALL`: every node handles its own endpoints (same rules as `PerNode`).
    All,
    /// Only this node has rules, for the ClusterIPs and every endpoint.
    Host(String),
}

/// The egress scope of a Service: `EgressService.status.host` wins over the legacy annotation.
pub fn egress_scope(snap: &Snapshot, key: &ServiceKey) -> EgressScope {
    let host = snap.egress_hosts.get(key).cloned().or_else(|| {
        snap.services
            .get(key)
            .and_then(|s| s.egress_host_annotation.clone())
    });
    match host {
        None => EgressScope::PerNode,
        Some(h) if h.trim().is_empty() => EgressScope::PerNode,
        Some(h) if h == k8s_api::egress_service::EGRESS_SERVICE_HOST_ALL => EgressScope::All,
        Some(h) => EgressScope::Host(h),
    }
}

/// One source address to mark.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub mark: Mark,
    /// The ServiceFWMark this entry comes from (rule comment `<ns>/<svc>`).
    pub owner: ServiceKey,
}

/// What a node must apply: source address → mark.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub entries: BTreeMap<IpAddr, Entry>,
}

impl Desired {
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Entries of one family (IPv4 when `v4`).
    pub fn family(&self, v4: bool) -> impl Iterator<Item = (&IpAddr, &Entry)> {
        self.entries
            .iter()
            .filter(move |(ip, _)| ip.is_ipv4() == v4)
    }
}

/// A problem the node met while planning (logged by the shell; the status writer reports the
/// cluster-wide ones as conditions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanWarning {
    InvalidMark {
        key: ServiceKey,
        error: MarkError,
    },
    Conflict {
        ip: IpAddr,
        winner: ServiceKey,
        loser: ServiceKey,
    },
}

/// The plan for one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePlan {
    pub desired: Desired,
    pub warnings: Vec<PlanWarning>,
}

/// Precedence of ServiceFWMarks in a conflict: older first, then by namespace/name.
fn precedence(m: &MarkRequest) -> (i64, &ServiceKey) {
    (m.created.unwrap_or(i64::MAX), &m.key)
}

/// Every source address of a Service, regardless of node (ClusterIPs, then endpoints).
fn all_sources(snap: &Snapshot, key: &ServiceKey) -> BTreeSet<IpAddr> {
    let mut out: BTreeSet<IpAddr> = BTreeSet::new();
    if let Some(svc) = snap.services.get(key) {
        out.extend(svc.cluster_ips.iter().copied());
    }
    for ep in snap.endpoints.get(key).into_iter().flatten() {
        if !ep.host_network {
            out.extend(ep.addresses.iter().copied());
        }
    }
    out
}

/// The source addresses of a Service that `node` marks.
fn node_sources(snap: &Snapshot, key: &ServiceKey, node: &str) -> BTreeSet<IpAddr> {
    let local_only = match egress_scope(snap, key) {
        EgressScope::PerNode | EgressScope::All => true,
        EgressScope::Host(h) if h == node => false,
        EgressScope::Host(_) => return BTreeSet::new(),
    };
    let mut out = BTreeSet::new();
    if let Some(svc) = snap.services.get(key) {
        out.extend(svc.cluster_ips.iter().copied());
    }
    for ep in snap.endpoints.get(key).into_iter().flatten() {
        if ep.host_network {
            continue;
        }
        if local_only && ep.node.as_deref() != Some(node) {
            continue;
        }
        out.extend(ep.addresses.iter().copied());
    }
    out
}

/// ServiceFWMarks whose Service exists, with their validated mark, in precedence order.
fn usable(snap: &Snapshot, mask: u32) -> (Vec<(&MarkRequest, Mark)>, Vec<PlanWarning>) {
    let mut ok = Vec::new();
    let mut warnings = Vec::new();
    for m in snap.marks.values() {
        if !snap.services.contains_key(&m.key) {
            continue;
        }
        match mark::validate(m.fwmark, mask) {
            Ok(mk) => ok.push((m, mk)),
            Err(error) => warnings.push(PlanWarning::InvalidMark {
                key: m.key.clone(),
                error,
            }),
        }
    }
    ok.sort_by(|a, b| precedence(a.0).cmp(&precedence(b.0)));
    (ok, warnings)
}

/// The marks `node` applies, under the node's `mask`.
pub fn plan_node(snap: &Snapshot, node: &str, mask: u32) -> NodePlan {
    let (usable, mut warnings) = usable(snap, mask);
    let mut desired = Desired::default();
    for (req, mk) in usable {
        for ip in node_sources(snap, &req.key, node) {
            match desired.entries.get(&ip) {
                None => {
                    desired.entries.insert(
                        ip,
                        Entry {
                            mark: mk,
                            owner: req.key.clone(),
                        },
                    );
                }
                Some(winner) if winner.mark != mk => warnings.push(PlanWarning::Conflict {
                    ip,
                    winner: winner.owner.clone(),
                    loser: req.key.clone(),
                }),
                Some(_) => {}
            }
        }
    }
    NodePlan { desired, warnings }
}

/// Status of one condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionReport {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// Cluster-wide conditions of every ServiceFWMark (`ServiceFound`, `MarkValid`, `ConflictFree`,
/// `Ready`). Validity is judged under the full mask (node masks are reported by the nodes' logs).
pub fn plan_status(snap: &Snapshot) -> BTreeMap<ServiceKey, Vec<ConditionReport>> {
    use k8s_api::service_fwmark::{
        CONDITION_CONFLICT_FREE, CONDITION_MARK_VALID, CONDITION_READY, CONDITION_SERVICE_FOUND,
    };
    let (usable, _) = usable(snap, FULL_MASK);
    // ip → claims in precedence order
    let mut claims: BTreeMap<IpAddr, Vec<(&ServiceKey, Mark)>> = BTreeMap::new();
    for (req, mk) in &usable {
        for ip in all_sources(snap, &req.key) {
            claims.entry(ip).or_default().push((&req.key, *mk));
        }
    }
    // key → (other key, other mark, this one wins) → shared addresses
    type Others<'a> = BTreeMap<(&'a ServiceKey, Mark, bool), Vec<IpAddr>>;
    let mut conflicts: BTreeMap<&ServiceKey, Others<'_>> = BTreeMap::new();
    for (ip, cl) in &claims {
        for (i, (k, mk)) in cl.iter().enumerate() {
            for (j, (ok, omk)) in cl.iter().enumerate() {
                if i != j && mk != omk {
                    conflicts
                        .entry(*k)
                        .or_default()
                        .entry((*ok, *omk, i < j))
                        .or_default()
                        .push(*ip);
                }
            }
        }
    }

    let mut out = BTreeMap::new();
    for m in snap.marks.values() {
        let found = snap.services.contains_key(&m.key);
        let mut conds = vec![ConditionReport {
            type_: CONDITION_SERVICE_FOUND,
            status: found,
            reason: if found {
                "ServiceFound"
            } else {
                "ServiceNotFound"
            }
            .into(),
            message: if found {
                format!("Service {} exists", m.key)
            } else {
                format!(
                    "no Service named {} in namespace {}",
                    m.key.name, m.key.namespace
                )
            },
        }];
        let valid = mark::validate(m.fwmark, FULL_MASK);
        conds.push(ConditionReport {
            type_: CONDITION_MARK_VALID,
            status: valid.is_ok(),
            reason: match &valid {
                Ok(_) => "Valid",
                Err(MarkError::Reserved { .. }) => "ReservedMarkCollision",
                Err(MarkError::OutOfRange { .. }) => "OutOfRange",
                Err(_) => "Invalid",
            }
            .into(),
            message: match &valid {
                Ok(mk) => format!("fwmark {} applied as {mk}", m.fwmark),
                Err(e) => e.to_string(),
            },
        });
        let mine = conflicts.get(&m.key);
        let conflict_msg = mine.map(|others| {
            others
                .iter()
                .map(|((ok, omk, wins), ips)| {
                    let shown: Vec<String> = ips.iter().take(5).map(|ip| ip.to_string()).collect();
                    let more = if ips.len() > 5 {
                        format!(" and {} more", ips.len() - 5)
                    } else {
                        String::new()
                    };
                    format!(
                        "{} also claimed by ServiceFWMark {ok} (fwmark {}); {} wins",
                        shown.join(", ") + &more,
                        omk.value(),
                        if *wins {
                            m.key.to_string()
                        } else {
                            ok.to_string()
                        },
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        });
        conds.push(ConditionReport {
            type_: CONDITION_CONFLICT_FREE,
            status: conflict_msg.is_none(),
            reason: if conflict_msg.is_some() {
                "SourceConflict"
            } else {
                "NoConflict"
            }
            .into(),
            message: conflict_msg
                .clone()
                .unwrap_or_else(|| "no source address is claimed by another mark".into()),
        });
        let ready = found && valid.is_ok() && conflict_msg.is_none();
        conds.push(ConditionReport {
            type_: CONDITION_READY,
            status: ready,
            reason: if ready {
                "Ready"
            } else if !found {
                "ServiceNotFound"
            } else if valid.is_err() {
                "InvalidMark"
            } else {
                "SourceConflict"
            }
            .into(),
            message: if ready {
                "marks are applied".into()
            } else {
                "see the other conditions".into()
            },
        });
        out.insert(m.key.clone(), conds);
    }
    out
}

#[cfg(test)]
mod tests;
