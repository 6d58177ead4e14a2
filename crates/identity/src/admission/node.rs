//! Node admission (`nodes` and `nodes/status`), upstream `pkg/ovnwebhook/nodeadmission.go`
//! (release-1.3 allow-lists and messages) plus ovnk's protected keys.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::review::{meta, meta_map, name_of};
use super::semantic::{objects_eq_except, semantic_eq};
use super::{AdmissionRequest, Change, DenyReason, Operation, ReviewError, Verdict, map_diff};
use crate::dns::go_list;
use crate::user::{any_node_identity, ovnkube_node_identity};

pub const BRIDGE_EGRESS_IPS: &str = "k8s.ovn.org/bridge-egress-ips";
pub const HOST_CIDRS: &str = "k8s.ovn.org/host-cidrs";
pub const SECONDARY_HOST_EGRESS_IPS: &str = "k8s.ovn.org/secondary-host-egress-ips";
pub const L3_GATEWAY_CONFIG: &str = "k8s.ovn.org/l3-gateway-config";
pub const NODE_MGMT_PORT_MAC_ADDRESSES: &str = "k8s.ovn.org/node-mgmt-port-mac-addresses";
pub const NODE_PRIMARY_IFADDR: &str = "k8s.ovn.org/node-primary-ifaddr";
pub const NODE_MASQUERADE_SUBNET: &str = "k8s.ovn.org/node-masquerade-subnet";
pub const GATEWAY_MTU_SUPPORT: &str = "k8s.ovn.org/gateway-mtu-support";
pub const NODE_MGMT_PORT: &str = "k8s.ovn.org/node-mgmt-port";
pub const NODE_INGRESS_SNAT_EXCLUDE_SUBNETS: &str = "k8s.ovn.org/node-ingress-snat-exclude-subnets";
pub const PRIMARY_DPU_HOST_ADDR: &str = "k8s.ovn.org/primary-dpu-host-addr";
pub const NODE_CHASSIS_ID: &str = "k8s.ovn.org/node-chassis-id";
pub const ZONE_NAME: &str = "k8s.ovn.org/zone-name";
pub const NODE_ENCAP_IPS: &str = "k8s.ovn.org/node-encap-ips";
pub const VTEPS: &str = "k8s.ovn.org/vteps";
pub const LAYER2_TOPOLOGY_VERSION: &str = "k8s.ovn.org/layer2-topology-version";
pub const HYBRID_OVERLAY_DR_MAC: &str = "k8s.ovn.org/hybrid-overlay-distributed-router-gateway-mac";
pub const HYBRID_OVERLAY_DR_IP: &str = "k8s.ovn.org/hybrid-overlay-distributed-router-gateway-ip";
/// ovnk: the transport-zones annotation (seed 001), protected from node identities.
pub const TRANSPORT_ZONES: &str = "k8s.ovn.org/transport-zones";
/// Zone name upstream treats as "the default zone".
pub const OVN_DEFAULT_ZONE: &str = "global";

/// A value check: `Err(msg)` is wrapped into upstream's `user: ... is not allowed to set` text.
pub type AnnotationCheck = fn(Change<'_>, &str) -> Result<(), String>;

/// Common allow-list (release-1.3), with value checks.
pub const COMMON_ANNOTATIONS: &[(&str, Option<AnnotationCheck>)] = &[
    (BRIDGE_EGRESS_IPS, None),
    (HOST_CIDRS, None),
    (SECONDARY_HOST_EGRESS_IPS, None),
    (L3_GATEWAY_CONFIG, None),
    (NODE_MGMT_PORT_MAC_ADDRESSES, None),
    (NODE_PRIMARY_IFADDR, None),
    (NODE_MASQUERADE_SUBNET, None),
    (GATEWAY_MTU_SUPPORT, None),
    (NODE_MGMT_PORT, None),
    (NODE_INGRESS_SNAT_EXCLUDE_SUBNETS, None),
    (PRIMARY_DPU_HOST_ADDR, None),
    (NODE_CHASSIS_ID, Some(check_chassis_id)),
    (ZONE_NAME, Some(check_zone_name)),
    (NODE_ENCAP_IPS, None),
    (VTEPS, None),
];

/// Added with `--enable-interconnect` (release-1.3).
pub const INTERCONNECT_ANNOTATIONS: &[(&str, Option<AnnotationCheck>)] =
    &[(LAYER2_TOPOLOGY_VERSION, Some(check_layer2_topology_version))];

/// Added with `--enable-hybrid-overlay`.
pub const HYBRID_OVERLAY_ANNOTATIONS: &[(&str, Option<AnnotationCheck>)] =
    &[(HYBRID_OVERLAY_DR_MAC, None), (HYBRID_OVERLAY_DR_IP, None)];

fn check_chassis_id(c: Change<'_>, _node: &str) -> Result<(), String> {
    match c {
        Change::Removed(_) => Err(format!("{NODE_CHASSIS_ID} cannot be removed")),
        Change::Changed(_) => Err(format!("{NODE_CHASSIS_ID} cannot be changed once set")),
        Change::Added(_) => Ok(()),
    }
}

fn check_zone_name(c: Change<'_>, node: &str) -> Result<(), String> {
    match c {
        Change::Added(v) | Change::Changed(v) if v == OVN_DEFAULT_ZONE || v == node => Ok(()),
        _ => Err(format!(
            "{ZONE_NAME} can only be set to {OVN_DEFAULT_ZONE} or {node}, it cannot be removed"
        )),
    }
}

fn check_layer2_topology_version(c: Change<'_>, _node: &str) -> Result<(), String> {
    match c {
        Change::Changed(_) => Err(format!(
            "{LAYER2_TOPOLOGY_VERSION} can only be added or removed, not updated"
        )),
        _ => Ok(()),
    }
}

/// Configuration of the node webhook.
#[derive(Debug, Clone, Default)]
pub struct NodeAdmissionConfig {
    pub enable_interconnect: bool,
    pub enable_hybrid_overlay: bool,
    /// `--extra-allowed-user`: non-ovnkube users allowed to set allow-listed annotations.
    pub extra_allowed_users: BTreeSet<String>,
    /// ovnk: annotation keys node identities may never set, change or remove.
    /// [`NodeAdmission::new`] always adds [`TRANSPORT_ZONES`].
    pub protected_annotations: BTreeSet<String>,
}

/// The node webhook's checks.
#[derive(Debug, Clone)]
pub struct NodeAdmission {
    checks: BTreeMap<&'static str, Option<AnnotationCheck>>,
    extra_allowed_users: BTreeSet<String>,
    protected_annotations: BTreeSet<String>,
}

impl NodeAdmission {
    pub fn new(cfg: &NodeAdmissionConfig) -> Self {
        let mut checks = BTreeMap::new();
        checks.extend(COMMON_ANNOTATIONS.iter().copied());
        if cfg.enable_interconnect {
            checks.extend(INTERCONNECT_ANNOTATIONS.iter().copied());
        }
        if cfg.enable_hybrid_overlay {
            checks.extend(HYBRID_OVERLAY_ANNOTATIONS.iter().copied());
        }
        let mut protected_annotations = cfg.protected_annotations.clone();
        protected_annotations.insert(TRANSPORT_ZONES.to_string());
        NodeAdmission {
            checks,
            extra_allowed_users: cfg.extra_allowed_users.clone(),
            protected_annotations,
        }
    }

    /// The allow-listed annotation keys, sorted.
    pub fn allowed_keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.checks.keys().copied()
    }

    /// Reviews a `nodes` or `nodes/status` request.
    ///
    /// `protected_labels` are the label keys selected by TrustZones: node identities may not set,
    /// change or remove them. DELETE and CONNECT are always allowed.
    pub fn review(
        &self,
        req: &AdmissionRequest,
        protected_labels: &BTreeSet<String>,
    ) -> Result<Verdict, ReviewError> {
        match req.operation {
            Operation::Create => {
                let new = req.object_of_kind("Node")?;
                Ok(self.check_protected_create(&req.user_info.username, new, protected_labels))
            }
            Operation::Update => {
                let new = req.object_of_kind("Node")?;
                let old = req.old_object_of_kind("Node")?;
                let v = self.check_update(&req.user_info.username, old, new);
                if !v.is_allowed() {
                    return Ok(v);
                }
                Ok(
                    self.check_protected_update(
                        &req.user_info.username,
                        old,
                        new,
                        protected_labels,
                    ),
                )
            }
            Operation::Delete | Operation::Connect => Ok(Verdict::Allowed),
        }
    }

    /// Upstream `ValidateUpdate`.
    pub fn check_update(
        &self,
        username: &str,
        old: &serde_json::Map<String, Value>,
        new: &serde_json::Map<String, Value>,
    ) -> Verdict {
        let new_name = name_of(new);
        let changes = map_diff(meta_map(old, "annotations"), meta_map(new, "annotations"));
        let ovn_identity = ovnkube_node_identity(username);
        let node_name = match ovn_identity {
            Some(n) => n,
            None => {
                let listed: Vec<&str> = changes
                    .iter()
                    .map(|(k, _)| *k)
                    .filter(|k| self.checks.contains_key(*k))
                    .collect();
                if listed.is_empty() {
                    return Verdict::Allowed;
                }
                if !self.extra_allowed_users.contains(username) {
                    return Verdict::deny(
                        DenyReason::UserNotAllowed,
                        format!(
                            "user {username:?} is not allowed to set the following annotations on node: {new_name:?}: {}",
                            go_list(&listed)
                        ),
                    );
                }
                new_name
            }
        };

        for (key, change) in &changes {
            if let Some(Some(check)) = self.checks.get(*key)
                && let Err(msg) = check(*change, node_name)
            {
                return Verdict::deny(
                    DenyReason::ValueCheck,
                    format!(
                        "user: {username:?} is not allowed to set {key} on node {new_name:?}: {msg}"
                    ),
                );
            }
        }

        let Some(node_name) = ovn_identity else {
            return Verdict::Allowed;
        };
        if new_name != node_name {
            return Verdict::deny(
                DenyReason::OtherNode,
                format!(
                    "ovnkube-node on node: {node_name:?} is not allowed to modify nodes {new_name:?} annotations"
                ),
            );
        }
        let outside: Vec<&str> = changes
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| !self.checks.contains_key(*k))
            .collect();
        if !outside.is_empty() {
            return Verdict::deny(
                DenyReason::AnnotationNotAllowed,
                format!(
                    "ovnkube-node on node: {node_name:?} is not allowed to set the following annotations: {}",
                    go_list(&outside)
                ),
            );
        }
        if !only_annotations_changed(old, new) {
            return Verdict::deny(
                DenyReason::NotOnlyAnnotations,
                format!(
                    "ovnkube-node on node: {node_name:?} is not allowed to modify anything other than annotations"
                ),
            );
        }
        Verdict::Allowed
    }

    /// ovnk addition on CREATE: node identities may not create a node carrying protected keys.
    pub fn check_protected_create(
        &self,
        username: &str,
        new: &serde_json::Map<String, Value>,
        protected_labels: &BTreeSet<String>,
    ) -> Verdict {
        if any_node_identity(username).is_none() {
            return Verdict::Allowed;
        }
        let present = |field: &str, keys: &BTreeSet<String>| -> Vec<String> {
            meta_map(new, field)
                .map(|m| m.keys().filter(|k| keys.contains(*k)).cloned().collect())
                .unwrap_or_default()
        };
        protected_verdict(
            username,
            name_of(new),
            &present("annotations", &self.protected_annotations),
            &present("labels", protected_labels),
        )
    }

    /// ovnk addition on UPDATE: node identities may not set, change or remove protected keys.
    pub fn check_protected_update(
        &self,
        username: &str,
        old: &serde_json::Map<String, Value>,
        new: &serde_json::Map<String, Value>,
        protected_labels: &BTreeSet<String>,
    ) -> Verdict {
        if any_node_identity(username).is_none() {
            return Verdict::Allowed;
        }
        let changed = |field: &str, keys: &BTreeSet<String>| -> Vec<String> {
            map_diff(meta_map(old, field), meta_map(new, field))
                .into_iter()
                .filter(|(k, _)| keys.contains(*k))
                .map(|(k, _)| k.to_string())
                .collect()
        };
        protected_verdict(
            username,
            name_of(new),
            &changed("annotations", &self.protected_annotations),
            &changed("labels", protected_labels),
        )
    }
}

fn protected_verdict(
    username: &str,
    node: &str,
    annotations: &[String],
    labels: &[String],
) -> Verdict {
    if !annotations.is_empty() {
        return Verdict::deny(
            DenyReason::ProtectedKey,
            format!(
                "user {username:?} is not allowed to set, change or remove the following protected annotations on node {node:?}: {}",
                go_list(annotations)
            ),
        );
    }
    if !labels.is_empty() {
        return Verdict::deny(
            DenyReason::ProtectedKey,
            format!(
                "user {username:?} is not allowed to set, change or remove the following trust-zone labels on node {node:?}: {}",
                go_list(labels)
            ),
        );
    }
    Verdict::Allowed
}

/// Nothing but annotations (and managedFields) changed: metadata, spec and status are
/// semantically equal. Upstream compares metadata and status only (on `nodes/status` the API
/// server resets spec anyway); ovnk also compares spec because it also guards `nodes`.
/// GCE exception: with `spec.providerID` starting with `gce`, the `NetworkUnavailable`
/// condition may change.
fn only_annotations_changed(
    old: &serde_json::Map<String, Value>,
    new: &serde_json::Map<String, Value>,
) -> bool {
    let meta_eq = match (meta(old), meta(new)) {
        (Some(o), Some(n)) => objects_eq_except(o, n, &["annotations", "managedFields"]),
        _ => semantic_eq(old.get("metadata"), new.get("metadata")),
    };
    if !meta_eq || !semantic_eq(old.get("spec"), new.get("spec")) {
        return false;
    }
    let provider = new
        .get("spec")
        .and_then(|s| s.get("providerID"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if provider.starts_with("gce") {
        let mut old_status = old.get("status").cloned().unwrap_or(Value::Null);
        allow_network_unavailable_change(&mut old_status, new.get("status"));
        return semantic_eq(Some(&old_status), new.get("status"));
    }
    semantic_eq(old.get("status"), new.get("status"))
}

fn allow_network_unavailable_change(old_status: &mut Value, new_status: Option<&Value>) {
    fn is_nu(c: &Value) -> bool {
        c.get("type").and_then(Value::as_str) == Some("NetworkUnavailable")
    }
    let Some(new_cond) = new_status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| is_nu(c)))
        .cloned()
    else {
        return;
    };
    if let Some(conds) = old_status
        .get_mut("conditions")
        .and_then(Value::as_array_mut)
        && let Some(slot) = conds.iter_mut().find(|c| is_nu(c))
    {
        *slot = new_cond;
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
