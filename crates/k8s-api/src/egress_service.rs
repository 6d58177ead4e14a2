//! `EgressService` (`k8s.ovn.org/v1`, namespaced), as shipped by upstream OVN-Kubernetes.
//!
//! ovnk only reads it: `status.host` names the node that handles the Service's egress traffic,
//! or [`EGRESS_SERVICE_HOST_ALL`] when every node handles its own endpoints
//! (`sourceIPBy: Network`). It is named after the Service it applies to.
//!
//! Before this CRD, upstream used the Service annotations [`EGRESS_SERVICE_ANNOTATION`] and
//! [`EGRESS_SERVICE_HOST_ANNOTATION`] (removed upstream in 2023); ovnk still honours the host one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Legacy Service annotation (`{"nodeSelector": …}`) that made a Service an Egress Service.
pub const EGRESS_SERVICE_ANNOTATION: &str = "k8s.ovn.org/egress-service";
/// Legacy Service annotation holding the node name that hosts an Egress Service.
pub const EGRESS_SERVICE_HOST_ANNOTATION: &str = "k8s.ovn.org/egress-service-host";
/// `status.host` value meaning every node handles its own endpoints.
pub const EGRESS_SERVICE_HOST_ALL: &str = "ALL";

/// How the source IP of an Egress Service's traffic is chosen.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SourceIpBy {
    /// SNAT to the Service's LoadBalancer ingress IP on the host node.
    LoadBalancerIP,
    /// Keep the source IP of the network the traffic leaves through; no single host.
    Network,
}

/// Desired state of an EgressService (upstream schema, the fields ovnk reads or keeps).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressService",
    plural = "egressservices",
    singular = "egressservice",
    namespaced,
    status = "EgressServiceStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct EgressServiceSpec {
    /// `LoadBalancerIP` (default) or `Network`.
    #[serde(
        default,
        rename = "sourceIPBy",
        skip_serializing_if = "Option::is_none"
    )]
    pub source_ip_by: Option<SourceIpBy>,
    /// Nodes eligible to host the Service's egress traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Routing table (id or name) used for the Service's egress traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// Observed state of an EgressService.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EgressServiceStatus {
    /// The node handling the Service's egress traffic, or `ALL`.
    #[serde(default)]
    pub host: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_object() {
        let obj: EgressService = serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "EgressService",
            "metadata": {"name": "svc", "namespace": "ns"},
            "spec": {"sourceIPBy": "Network", "network": "100",
                     "nodeSelector": {"matchLabels": {"a": "b"}}},
            "status": {"host": "ALL"}
        }))
        .expect("parses");
        assert_eq!(obj.spec.source_ip_by, Some(SourceIpBy::Network));
        assert_eq!(
            obj.status.map(|s| s.host).as_deref(),
            Some(EGRESS_SERVICE_HOST_ALL)
        );
    }
}
