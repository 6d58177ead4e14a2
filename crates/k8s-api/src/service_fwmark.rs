//! `ServiceFWMark` (`k8s.ovn.org/v1`, namespaced): a firewall mark for a Service's traffic.
//!
//! The object is named after the Service it applies to (same namespace). Nodes mark packets whose
//! source is one of the Service's ClusterIPs (reply traffic) or one of its endpoints (egress).
//! `spec.fwmark` is validated to `1000..=2000` by the CRD schema, as in the OpenShift enhancement
//! this API comes from; ovnk additionally rejects marks whose bits collide with marks OVN-K or
//! ovnk use on the node (see the `fwmark` crate's `mark` module and `docs/fwmark.md`).
//!
//! `status.conditions` has exactly one writer (the cluster-level status controller in the
//! `fwmark` crate), never the nodes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Smallest `spec.fwmark` the schema accepts.
pub const FWMARK_MIN: i64 = 1000;
/// Largest `spec.fwmark` the schema accepts.
pub const FWMARK_MAX: i64 = 2000;

/// Condition type: the Service named like this object exists in its namespace.
pub const CONDITION_SERVICE_FOUND: &str = "ServiceFound";
/// Condition type: `spec.fwmark` is in range and collides with no reserved mark bits.
pub const CONDITION_MARK_VALID: &str = "MarkValid";
/// Condition type: no source address of this Service is also claimed by another ServiceFWMark
/// with a different mark. `False` names the other object(s) and which one wins.
pub const CONDITION_CONFLICT_FREE: &str = "ConflictFree";
/// Condition type: summary; `True` when the three conditions above are all `True`.
pub const CONDITION_READY: &str = "Ready";

/// Desired state of a ServiceFWMark.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "ServiceFWMark",
    plural = "servicefwmarks",
    singular = "servicefwmark",
    shortname = "sfm",
    namespaced,
    status = "ServiceFWMarkStatus",
    printcolumn(name = "Mark", type_ = "integer", json_path = ".spec.fwmark"),
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
pub struct ServiceFWMarkSpec {
    /// The fwmark value to set on the Service's traffic (source = a ClusterIP or an endpoint).
    /// Applied on each node as value/mask, with the node's configured mask.
    #[schemars(range(min = 1000, max = 2000))]
    pub fwmark: i64,
}

/// Observed state of a ServiceFWMark, written by one controller only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceFWMarkStatus {
    /// `ServiceFound`, `MarkValid`, `ConflictFree` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_is_namespaced_v1_with_range() {
        let crd = ServiceFWMark::crd();
        assert_eq!(crd.spec.group, "k8s.ovn.org");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, "servicefwmarks");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1");
        let schema = serde_json::to_value(&v.schema).expect("schema serializes");
        let fw = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["fwmark"];
        assert_eq!(fw["minimum"], serde_json::json!(1000.0));
        assert_eq!(fw["maximum"], serde_json::json!(2000.0));
        assert_eq!(
            schema["openAPIV3Schema"]["properties"]["spec"]["required"],
            serde_json::json!(["fwmark"])
        );
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }

    #[test]
    fn parses_seed_example() {
        let obj: ServiceFWMark = serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "ServiceFWMark",
            "metadata": {"name": "service1", "namespace": "default"},
            "spec": {"fwmark": 1000}
        }))
        .expect("seed example parses");
        assert_eq!(obj.spec.fwmark, 1000);
        assert!(obj.status.is_none());
    }
}
