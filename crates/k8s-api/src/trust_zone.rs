//! `TrustZone` (`k8s.ovn.org/v1alpha1`, cluster-scoped): a set of nodes, chosen by a label
//! selector, that may build Geneve tunnels to each other (seed 000). A node's zones are the
//! TrustZones selecting it plus the names in its `k8s.ovn.org/transport-zones` annotation
//! (seed 001); two nodes are connected iff their zone sets intersect or both are empty.
//!
//! `TunnelReport` (`k8s.ovn.org/v1alpha1`, cluster-scoped, named after its node): the peers a
//! node observes Geneve tunnels to in its own Open_vSwitch database. Each node writes only its
//! own (enforced by the identity webhook), only when the set changes, and only the cluster
//! manager watches them; it is the single writer of TrustZone status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type on a TrustZone: every member observes a tunnel to every other member.
pub const CONDITION_READY: &str = "Ready";
/// Reason of `Ready=True`.
pub const REASON_ALL_TUNNELS: &str = "AllTunnelsEstablished";
/// Condition type on a TrustZone: its selector only uses label keys a node cannot set on itself
/// (or that the identity webhook protects).
pub const CONDITION_SELECTOR_PROTECTED: &str = "SelectorProtected";

/// Desired state of a TrustZone.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1alpha1",
    kind = "TrustZone",
    plural = "trustzones",
    singular = "trustzone",
    shortname = "tz",
    status = "TrustZoneStatus",
    printcolumn(name = "Members", type_ = "integer", json_path = ".status.memberCount"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TrustZoneSpec {
    /// The Nodes in this zone. `{}` selects every Node (Kubernetes semantics).
    #[schemars(schema_with = "node_selector_schema")]
    pub node_selector: LabelSelector,
}

/// LabelSelector's schema with the operators the API accepts spelled out, so a typo is
/// refused when the object is written rather than discovered by the agents.
fn node_selector_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <LabelSelector as JsonSchema>::json_schema(generator);
    if let Some(op) = schema
        .as_object_mut()
        .and_then(|o| o.get_mut("properties"))
        .and_then(|p| p.get_mut("matchExpressions"))
        .and_then(|m| m.get_mut("items"))
        .and_then(|i| i.get_mut("properties"))
        .and_then(|p| p.get_mut("operator"))
        .and_then(|o| o.as_object_mut())
    {
        op.insert(
            "enum".to_owned(),
            serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"]),
        );
    }
    schema
}

/// Observed state of a TrustZone, written by the cluster manager only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustZoneStatus {
    /// Names of the member Nodes, sorted. (Seed 000 lists ovnkube-node pod names; ovnk lists
    /// Node names because zones select Nodes, and pod names change on every rollout.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// `members.len()`, for the printer column.
    #[serde(default)]
    pub member_count: i64,
    /// `Ready` and `SelectorProtected`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// What one node observes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1alpha1",
    kind = "TunnelReport",
    plural = "tunnelreports",
    singular = "tunnelreport",
    printcolumn(name = "Peers", type_ = "string", json_path = ".spec.peers"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TunnelReportSpec {
    /// Names of the Nodes this node has a Geneve tunnel to, sorted.
    #[serde(default)]
    pub peers: Vec<String>,
}

/// A label selector that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector: {0}")]
pub struct SelectorError(pub String);

/// Whether `selector` selects an object with `labels` (Kubernetes semantics: `{}` selects
/// everything; requirements are ANDed).
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    if let Some(ml) = &selector.match_labels {
        for (k, v) in ml {
            if labels.get(k) != Some(v) {
                return Ok(false);
            }
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => {
                if values.is_empty() {
                    return Err(SelectorError(format!("{}: In needs values", e.key)));
                }
                have.is_some_and(|v| values.contains(v))
            }
            "NotIn" => {
                if values.is_empty() {
                    return Err(SelectorError(format!("{}: NotIn needs values", e.key)));
                }
                !have.is_some_and(|v| values.contains(v))
            }
            "Exists" => {
                if !values.is_empty() {
                    return Err(SelectorError(format!("{}: Exists takes no values", e.key)));
                }
                have.is_some()
            }
            "DoesNotExist" => {
                if !values.is_empty() {
                    return Err(SelectorError(format!(
                        "{}: DoesNotExist takes no values",
                        e.key
                    )));
                }
                have.is_none()
            }
            other => {
                return Err(SelectorError(format!(
                    "{}: unknown operator {other:?}",
                    e.key
                )));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The label keys a selector reads (what the identity webhook must protect).
pub fn selector_keys(selector: &LabelSelector) -> Vec<String> {
    let mut keys: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .chain(
            selector
                .match_expressions
                .iter()
                .flatten()
                .map(|e| e.key.clone()),
        )
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Whether a node's own kubelet credentials may set label `key` on its Node under the
/// NodeRestriction admission plugin (anchors B1): labels outside the `kubernetes.io` and
/// `k8s.io` namespaces, and a fixed allow-list inside them.
pub fn kubelet_may_set_label(key: &str) -> bool {
    let prefix = key.split_once('/').map(|(p, _)| p).unwrap_or("");
    let in_k8s_ns = |p: &str| {
        p == "kubernetes.io"
            || p.ends_with(".kubernetes.io")
            || p == "k8s.io"
            || p.ends_with(".k8s.io")
    };
    if !in_k8s_ns(prefix) {
        return true;
    }
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    if ALLOWED.contains(&key) {
        return true;
    }
    // the kubelet.kubernetes.io and node.kubernetes.io namespaces (and their subdomains)
    prefix == "kubelet.kubernetes.io"
        || prefix.ends_with(".kubelet.kubernetes.io")
        || prefix == "node.kubernetes.io"
        || prefix.ends_with(".node.kubernetes.io")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::CustomResourceExt;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn empty_selector_selects_everything() {
        let s = LabelSelector::default();
        assert_eq!(selector_matches(&s, &labels(&[])), Ok(true));
        assert_eq!(selector_matches(&s, &labels(&[("a", "b")])), Ok(true));
    }

    #[test]
    fn label_and_expression_semantics() {
        let s = LabelSelector {
            match_labels: Some(labels(&[("tenant", "a")])),
            match_expressions: Some(vec![
                expr("tier", "In", &["web", "db"]),
                expr("quarantine", "DoesNotExist", &[]),
            ]),
        };
        let m = |kv: &[(&str, &str)]| selector_matches(&s, &labels(kv));
        assert_eq!(m(&[("tenant", "a"), ("tier", "web")]), Ok(true));
        assert_eq!(m(&[("tenant", "a"), ("tier", "cache")]), Ok(false));
        assert_eq!(m(&[("tenant", "b"), ("tier", "web")]), Ok(false));
        assert_eq!(
            m(&[("tenant", "a"), ("tier", "db"), ("quarantine", "")]),
            Ok(false)
        );
        let notin = LabelSelector {
            match_expressions: Some(vec![expr("x", "NotIn", &["1"]), expr("y", "Exists", &[])]),
            ..Default::default()
        };
        assert_eq!(selector_matches(&notin, &labels(&[("y", "")])), Ok(true));
        assert_eq!(
            selector_matches(&notin, &labels(&[("x", "1"), ("y", "")])),
            Ok(false)
        );
        let bad = LabelSelector {
            match_expressions: Some(vec![expr("x", "Like", &["1"])]),
            ..Default::default()
        };
        assert!(selector_matches(&bad, &labels(&[])).is_err());
        assert!(
            selector_matches(
                &LabelSelector {
                    match_expressions: Some(vec![expr("x", "In", &[])]),
                    ..Default::default()
                },
                &labels(&[])
            )
            .is_err()
        );
        assert_eq!(selector_keys(&s), vec!["quarantine", "tenant", "tier"]);
    }

    #[test]
    fn kubelet_label_rules() {
        assert!(kubelet_may_set_label("tenant"));
        assert!(kubelet_may_set_label("example.com/tenant"));
        assert!(kubelet_may_set_label("topology.kubernetes.io/zone"));
        assert!(kubelet_may_set_label("node.kubernetes.io/foo"));
        assert!(!kubelet_may_set_label("node-role.kubernetes.io/worker"));
        assert!(!kubelet_may_set_label("k8s.io/tenant"));
        assert!(!kubelet_may_set_label("zones.k8s.io/tenant"));
    }

    #[test]
    fn crds_cluster_scoped_v1alpha1() {
        let tz = TrustZone::crd();
        assert_eq!(tz.spec.scope, "Cluster");
        assert_eq!(tz.spec.versions[0].name, "v1alpha1");
        let schema = serde_json::to_value(&tz.spec.versions[0].schema).expect("schema");
        let required = &schema["openAPIV3Schema"]["properties"]["spec"]["required"];
        assert_eq!(required, &serde_json::json!(["nodeSelector"]));
        let op = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["nodeSelector"]["properties"]
            ["matchExpressions"]["items"]["properties"]["operator"]["enum"];
        assert_eq!(
            op,
            &serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
        );
        let tr = TunnelReport::crd();
        assert_eq!(tr.spec.scope, "Cluster");
        assert_eq!(tr.spec.names.plural, "tunnelreports");
    }
}
