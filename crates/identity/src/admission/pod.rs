//! Pod admission (`pods/status`), upstream `pkg/ovnwebhook/podadmission.go` (release-1.3).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::review::{meta, meta_map, name_of};
use super::semantic::{objects_eq_except, semantic_eq};
use super::{AdmissionRequest, Change, DenyReason, Operation, ReviewError, Verdict, map_diff};
use crate::dns::go_list;
use crate::user::ovnkube_node_identity;

pub const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
pub const DPU_CONNECTION_DETAILS: &str = "k8s.ovn.org/dpu.connection-details";
pub const DPU_CONNECTION_STATUS: &str = "k8s.ovn.org/dpu.connection-status";
pub const NODE_SUBNETS: &str = "k8s.ovn.org/node-subnets";
/// KubeVirt pods carrying this annotation may live-migrate across node subnets.
pub const KUBEVIRT_LIVE_MIGRATION: &str = "kubevirt.io/allow-pod-bridge-network-live-migration";
const DEFAULT_NETWORK: &str = "default";

/// Pod annotations ovnkube-node may set.
pub const POD_ANNOTATIONS: &[&str] = &[POD_NETWORKS, DPU_CONNECTION_DETAILS, DPU_CONNECTION_STATUS];

/// One entry of `--pod-admission-conditions` (a JSON list of these).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAdmissionCondition {
    pub common_name_prefix: String,
    #[serde(default)]
    pub allowed_pod_annotations: BTreeSet<String>,
}

/// Read-only access to nodes, injected so the check stays pure (the shell backs it with a
/// reflector store).
pub trait NodeLookup {
    /// The node's `k8s.ovn.org/node-subnets` annotation (`Ok(None)` when the node has none);
    /// `Err(text)` when the node cannot be found.
    fn node_subnets_annotation(&self, node: &str) -> Result<Option<String>, String>;
}

/// Configuration of the pod webhook.
#[derive(Debug, Clone, Default)]
pub struct PodAdmissionConfig {
    pub extra_allowed_users: BTreeSet<String>,
    pub conditions: Vec<PodAdmissionCondition>,
}

/// The pod webhook's checks.
#[derive(Debug, Clone)]
pub struct PodAdmission {
    cfg: PodAdmissionConfig,
}

#[derive(Clone, Copy)]
enum Identity<'a> {
    OvnNode(&'a str),
    Condition(&'a PodAdmissionCondition, &'a str),
    Other,
}

impl PodAdmission {
    pub fn new(cfg: PodAdmissionConfig) -> Self {
        PodAdmission { cfg }
    }

    fn identity<'a>(&'a self, username: &'a str) -> Identity<'a> {
        if let Some(n) = ovnkube_node_identity(username) {
            return Identity::OvnNode(n);
        }
        for c in &self.cfg.conditions {
            if let Some(rest) = username.strip_prefix(c.common_name_prefix.as_str()) {
                return Identity::Condition(c, rest.strip_prefix(':').unwrap_or(rest));
            }
        }
        Identity::Other
    }

    /// Reviews a `pods/status` request; only UPDATE is checked.
    pub fn review(
        &self,
        req: &AdmissionRequest,
        nodes: &dyn NodeLookup,
    ) -> Result<Verdict, ReviewError> {
        if req.operation != Operation::Update {
            return Ok(Verdict::Allowed);
        }
        let new = req.object_of_kind("Pod")?;
        let old = req.old_object_of_kind("Pod")?;
        Ok(self.check_update(&req.user_info.username, old, new, nodes))
    }

    /// Upstream `ValidateUpdate`.
    pub fn check_update(
        &self,
        username: &str,
        old: &serde_json::Map<String, Value>,
        new: &serde_json::Map<String, Value>,
        nodes: &dyn NodeLookup,
    ) -> Verdict {
        let pod_name = name_of(new);
        let changes = map_diff(meta_map(old, "annotations"), meta_map(new, "annotations"));
        let identity = self.identity(username);

        if let Identity::Condition(cond, node) = identity {
            let outside: Vec<&str> = changes
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| !cond.allowed_pod_annotations.contains(*k))
                .collect();
            if !outside.is_empty() {
                return Verdict::deny(
                    DenyReason::AnnotationNotAllowed,
                    format!(
                        "{} node: {node:?} is not allowed to set the following annotations on pod: {pod_name:?}: {}",
                        cond.common_name_prefix,
                        go_list(&outside)
                    ),
                );
            }
        }

        let node_name: &str = match identity {
            Identity::OvnNode(n) | Identity::Condition(_, n) => n,
            Identity::Other => {
                let listed: Vec<&str> = changes
                    .iter()
                    .map(|(k, _)| *k)
                    .filter(|k| pod_listed(k))
                    .collect();
                if listed.is_empty() {
                    return Verdict::Allowed;
                }
                if !self.cfg.extra_allowed_users.contains(username) {
                    return Verdict::deny(
                        DenyReason::UserNotAllowed,
                        format!(
                            "user {username:?} is not allowed to set the following annotations on pod: {pod_name:?}: {}",
                            go_list(&listed)
                        ),
                    );
                }
                node_name_of(new)
            }
        };

        for (key, change) in &changes {
            if *key == POD_NETWORKS
                && let Err(msg) = check_pod_networks(*change, new, node_name, nodes)
            {
                let reason = if msg.starts_with("could not get info on node") {
                    DenyReason::NodeLookup
                } else {
                    DenyReason::ValueCheck
                };
                return Verdict::deny(
                    reason,
                    format!(
                        "user: {username:?} is not allowed to set {key} on pod {pod_name:?}: {msg}"
                    ),
                );
            }
        }

        let prefix = match identity {
            Identity::Other => return Verdict::Allowed,
            Identity::OvnNode(_) => "ovnkube-node",
            Identity::Condition(c, _) => c.common_name_prefix.as_str(),
        };
        if node_name_of(old) != node_name || node_name_of(new) != node_name {
            return Verdict::deny(
                DenyReason::OtherNode,
                format!(
                    "{prefix} on node: {node_name:?} is not allowed to modify pods {pod_name:?} annotations"
                ),
            );
        }
        if matches!(identity, Identity::OvnNode(_)) {
            let outside: Vec<&str> = changes
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| !pod_listed(k))
                .collect();
            if !outside.is_empty() {
                return Verdict::deny(
                    DenyReason::AnnotationNotAllowed,
                    format!(
                        "{prefix} on node: {node_name:?} is not allowed to set the following annotations on pod: {pod_name:?}: {}",
                        go_list(&outside)
                    ),
                );
            }
        }
        let meta_eq = match (meta(old), meta(new)) {
            (Some(o), Some(n)) => objects_eq_except(o, n, &["annotations", "managedFields"]),
            _ => semantic_eq(old.get("metadata"), new.get("metadata")),
        };
        if !meta_eq || !semantic_eq(old.get("status"), new.get("status")) {
            return Verdict::deny(
                DenyReason::NotOnlyAnnotations,
                format!(
                    "{prefix} on node: {node_name:?} is not allowed to modify anything other than annotations"
                ),
            );
        }
        Verdict::Allowed
    }
}

fn pod_listed(key: &str) -> bool {
    POD_ANNOTATIONS.contains(&key)
}

fn node_name_of(pod: &serde_json::Map<String, Value>) -> &str {
    pod.get("spec")
        .and_then(|s| s.get("nodeName"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[derive(Deserialize)]
struct PodNetwork {
    #[serde(default)]
    ip_addresses: Vec<String>,
    #[serde(default)]
    ip_address: Option<String>,
}

/// The `k8s.ovn.org/pod-networks` value check: every IP of the default network must lie in one
/// of the node's default-network subnets.
fn check_pod_networks(
    change: Change<'_>,
    pod: &serde_json::Map<String, Value>,
    node_name: &str,
    nodes: &dyn NodeLookup,
) -> Result<(), String> {
    if meta_map(pod, "annotations").is_some_and(|a| a.contains_key(KUBEVIRT_LIVE_MIGRATION)) {
        return Ok(());
    }
    let host_network = pod
        .get("spec")
        .and_then(|s| s.get("hostNetwork"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if host_network {
        return Err("the annotation is not allowed on host networked pods".to_string());
    }
    let value = match change {
        Change::Added(v) | Change::Changed(v) | Change::Removed(v) => v,
    };
    let ips = parse_pod_ips(value)?;
    let annotation = nodes
        .node_subnets_annotation(node_name)
        .map_err(|e| format!("could not get info on node {node_name} from client: {e}"))?;
    let annotation = annotation
        .ok_or_else(|| format!("node {node_name:?} has no {NODE_SUBNETS:?} annotation"))?;
    let subnets = parse_node_subnets(&annotation)?;
    for ip in ips {
        if !subnets.iter().any(|s| s.contains(&ip)) {
            return Err(format!("{ip} does not belong to {node_name} node"));
        }
    }
    Ok(())
}

fn parse_pod_ips(value: &str) -> Result<Vec<IpAddr>, String> {
    let nets: std::collections::BTreeMap<String, PodNetwork> = serde_json::from_str(value)
        .map_err(|e| format!("failed to unmarshal ovn pod annotation {value:?}: {e}"))?;
    let def = nets
        .get(DEFAULT_NETWORK)
        .ok_or_else(|| format!("no ovn pod annotation for network {DEFAULT_NETWORK}: {value:?}"))?;
    let mut addrs: Vec<&str> = def.ip_addresses.iter().map(String::as_str).collect();
    if addrs.is_empty()
        && let Some(a) = def.ip_address.as_deref()
    {
        addrs.push(a);
    }
    addrs
        .into_iter()
        .map(|a| parse_ip_or_cidr(a).ok_or_else(|| format!("failed to parse pod IP {a:?}")))
        .collect()
}

fn parse_ip_or_cidr(s: &str) -> Option<IpAddr> {
    s.parse::<IpNet>()
        .map(|n| n.addr())
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok())
}

/// Parses `k8s.ovn.org/node-subnets` (`{"default":["10.244.1.0/24"]}` or the legacy
/// `{"default":"10.244.1.0/24"}`) and returns the default network's subnets.
pub fn parse_node_subnets(annotation: &str) -> Result<Vec<IpNet>, String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let map: std::collections::BTreeMap<String, OneOrMany> = serde_json::from_str(annotation)
        .map_err(|e| {
            format!("failed to unmarshal {NODE_SUBNETS} annotation {annotation:?}: {e}")
        })?;
    let subnets = match map.get(DEFAULT_NETWORK) {
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
        None => {
            return Err(format!(
                "{NODE_SUBNETS} annotation has no subnet for network {DEFAULT_NETWORK:?}"
            ));
        }
    };
    subnets
        .iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| format!("failed to parse node subnet {s:?}: {e}"))
        })
        .collect()
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
