use std::collections::BTreeMap;

use rstest::rstest;
use serde_json::{Value, json};

use super::*;
use crate::admission::review::decode;

const OVN1: &str = "system:ovn-node:node1";
const ADMIN: &str = "kubernetes-admin";
const EXTRA: &str = "system:serviceaccount:ovn:dpu-host";
const CUSTOM: &str = "system:custom-node:node1";

struct Nodes(BTreeMap<&'static str, Option<&'static str>>);

impl NodeLookup for Nodes {
    fn node_subnets_annotation(&self, node: &str) -> Result<Option<String>, String> {
        match self.0.get(node) {
            Some(a) => Ok(a.map(str::to_string)),
            None => Err(format!("node \"{node}\" not found")),
        }
    }
}

fn nodes() -> Nodes {
    Nodes(
        [
            (
                "node1",
                Some(r#"{"default":["10.244.1.0/24","fd00:10:244:2::/64"]}"#),
            ),
            ("node2", Some(r#"{"default":"10.244.2.0/24"}"#)),
            ("bare", None),
            ("garbled", Some("not json")),
        ]
        .into_iter()
        .collect(),
    )
}

fn pod(name: &str, node: &str, annotations: &[(&str, &str)]) -> Value {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": ann,
            "labels": {"app": "x"}, "managedFields": [{"manager": "kubelet"}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": "10.244.1.5"}
    })
}

fn pod_networks(ips: &[&str]) -> String {
    json!({"default": {"ip_addresses": ips, "mac_address": "0a:58:0a:f4:01:05",
        "gateway_ips": ["10.244.1.1"], "role": "primary"}})
    .to_string()
}

fn admission() -> PodAdmission {
    PodAdmission::new(PodAdmissionConfig {
        extra_allowed_users: [EXTRA.to_string()].into_iter().collect(),
        conditions: vec![PodAdmissionCondition {
            common_name_prefix: "system:custom-node".into(),
            allowed_pod_annotations: ["example.com/custom".to_string()].into_iter().collect(),
        }],
    })
}

fn run(user: &str, old: Value, new: Value) -> Verdict {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": "UPDATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "status",
            "userInfo": {"username": user},
            "object": new, "oldObject": old
        }
    });
    let req = decode(&serde_json::to_vec(&body).expect("json")).expect("decodes");
    admission().review(&req, &nodes()).expect("well-formed")
}

#[rstest]
#[case::v4(&["10.244.1.5/24"], None)]
#[case::dual(&["10.244.1.5/24", "fd00:10:244:2::5/64"], None)]
#[case::foreign_ip(&["10.244.2.5/24"],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/pod-networks on pod \"p\": 10.244.2.5 does not belong to node1 node"))]
#[case::foreign_v6(&["10.244.1.5/24", "fd00:10:244:3::5/64"],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/pod-networks on pod \"p\": fd00:10:244:3::5 does not belong to node1 node"))]
fn pod_networks_ip_check(#[case] ips: &[&str], #[case] want: Option<&str>) {
    let pn = pod_networks(ips);
    let v = run(
        OVN1,
        pod("p", "node1", &[]),
        pod("p", "node1", &[(POD_NETWORKS, &pn)]),
    );
    assert_eq!(v.message(), want);
}

#[test]
fn allowed_keys_for_ovnkube_node() {
    for key in [DPU_CONNECTION_DETAILS, DPU_CONNECTION_STATUS] {
        let v = run(
            OVN1,
            pod("p", "node1", &[]),
            pod("p", "node1", &[(key, "{}")]),
        );
        assert_eq!(v, Verdict::Allowed, "{key}");
    }
}

#[test]
fn host_network_pod() {
    let pn = pod_networks(&["10.244.1.5/24"]);
    let mut new = pod("p", "node1", &[(POD_NETWORKS, &pn)]);
    new["spec"]["hostNetwork"] = json!(true);
    let mut old = pod("p", "node1", &[]);
    old["spec"]["hostNetwork"] = json!(true);
    assert_eq!(
        run(OVN1, old, new).message(),
        Some(
            "user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/pod-networks on pod \"p\": the annotation is not allowed on host networked pods"
        )
    );
}

#[test]
fn live_migratable_kubevirt_pod_skips_ip_check() {
    let pn = pod_networks(&["10.99.0.5/24"]);
    let old = pod("p", "node1", &[(KUBEVIRT_LIVE_MIGRATION, "")]);
    let new = pod(
        "p",
        "node1",
        &[(KUBEVIRT_LIVE_MIGRATION, ""), (POD_NETWORKS, &pn)],
    );
    assert_eq!(run(OVN1, old, new), Verdict::Allowed);
}

#[rstest]
#[case::bad_json("{", "failed to unmarshal ovn pod annotation")]
#[case::no_default(
    r#"{"blue":{"ip_addresses":["10.244.1.5/24"]}}"#,
    "no ovn pod annotation for network default"
)]
#[case::bad_ip(
    r#"{"default":{"ip_addresses":["nope"]}}"#,
    "failed to parse pod IP \"nope\""
)]
fn pod_networks_parse_errors(#[case] value: &str, #[case] want_part: &str) {
    let v = run(
        OVN1,
        pod("p", "node1", &[]),
        pod("p", "node1", &[(POD_NETWORKS, value)]),
    );
    let m = v.message().expect("denied");
    assert!(m.starts_with("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/pod-networks on pod \"p\": "), "{m}");
    assert!(m.contains(want_part), "{m}");
}

#[test]
fn legacy_single_ip_address_field() {
    let pn = r#"{"default":{"ip_address":"10.244.9.5/24"}}"#;
    let v = run(
        OVN1,
        pod("p", "node1", &[]),
        pod("p", "node1", &[(POD_NETWORKS, pn)]),
    );
    assert_eq!(
        v.message(),
        Some(
            "user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/pod-networks on pod \"p\": 10.244.9.5 does not belong to node1 node"
        )
    );
}

#[rstest]
#[case::missing_node(
    "ghost",
    "could not get info on node ghost from client: node \"ghost\" not found"
)]
#[case::no_subnets("bare", "node \"bare\" has no \"k8s.ovn.org/node-subnets\" annotation")]
#[case::garbled_subnets("garbled", "failed to unmarshal k8s.ovn.org/node-subnets annotation")]
fn node_lookup_errors(#[case] node: &str, #[case] want_part: &str) {
    // an extra allowed user acts for the pod's node
    let pn = pod_networks(&["10.244.1.5/24"]);
    let v = run(
        EXTRA,
        pod("p", node, &[]),
        pod("p", node, &[(POD_NETWORKS, &pn)]),
    );
    let m = v.message().expect("denied");
    assert!(m.contains(want_part), "{m}");
}

#[test]
fn legacy_single_string_node_subnets() {
    let pn = pod_networks(&["10.244.2.7/24"]);
    let v = run(
        EXTRA,
        pod("p", "node2", &[]),
        pod("p", "node2", &[(POD_NETWORKS, &pn)]),
    );
    assert_eq!(v, Verdict::Allowed);
}

#[rstest]
#[case::old_on_other_node(pod("p", "node2", &[]), pod("p", "node1", &[(DPU_CONNECTION_STATUS, "{}")]))]
#[case::new_on_other_node(pod("p", "node1", &[]), pod("p", "node2", &[(DPU_CONNECTION_STATUS, "{}")]))]
#[case::both_other(pod("p", "node2", &[]), pod("p", "node2", &[]))]
fn other_nodes_pod(#[case] old: Value, #[case] new: Value) {
    assert_eq!(
        run(OVN1, old, new).message(),
        Some("ovnkube-node on node: \"node1\" is not allowed to modify pods \"p\" annotations")
    );
}

#[test]
fn unlisted_annotation() {
    let v = run(
        OVN1,
        pod("p", "node1", &[]),
        pod("p", "node1", &[("b.example/x", "1"), ("a.example/y", "2")]),
    );
    assert_eq!(
        v.message(),
        Some(
            "ovnkube-node on node: \"node1\" is not allowed to set the following annotations on pod: \"p\": [a.example/y b.example/x]"
        )
    );
}

#[rstest]
#[case::label(|p: &mut Value| p["metadata"]["labels"]["app"] = json!("y"))]
#[case::status(|p: &mut Value| p["status"]["phase"] = json!("Failed"))]
fn not_only_annotations(#[case] f: fn(&mut Value)) {
    let mut new = pod("p", "node1", &[]);
    f(&mut new);
    assert_eq!(
        run(OVN1, pod("p", "node1", &[]), new).message(),
        Some(
            "ovnkube-node on node: \"node1\" is not allowed to modify anything other than annotations"
        )
    );
}

#[rstest]
#[case::admin_unlisted(ADMIN, &[("x.example/a", "1")], None)]
#[case::admin_listed(ADMIN, &[(DPU_CONNECTION_STATUS, "{}")],
    Some("user \"kubernetes-admin\" is not allowed to set the following annotations on pod: \"p\": [k8s.ovn.org/dpu.connection-status]"))]
#[case::admin_changes_other_things_freely(ADMIN, &[], None)]
#[case::extra_user_listed(EXTRA, &[(DPU_CONNECTION_STATUS, "{}")], None)]
fn other_users(#[case] user: &str, #[case] ann: &[(&str, &str)], #[case] want: Option<&str>) {
    let mut new = pod("p", "node1", ann);
    new["status"]["phase"] = json!("Succeeded");
    assert_eq!(run(user, pod("p", "node1", &[]), new).message(), want);
}

#[rstest]
#[case::allowed_custom(&[("example.com/custom", "1")], "node1", None)]
#[case::not_in_condition(&[(DPU_CONNECTION_STATUS, "{}")], "node1",
    Some("system:custom-node node: \"node1\" is not allowed to set the following annotations on pod: \"p\": [k8s.ovn.org/dpu.connection-status]"))]
#[case::other_node(&[("example.com/custom", "1")], "node2",
    Some("system:custom-node on node: \"node1\" is not allowed to modify pods \"p\" annotations"))]
fn pod_admission_conditions(
    #[case] ann: &[(&str, &str)],
    #[case] node: &str,
    #[case] want: Option<&str>,
) {
    let v = run(CUSTOM, pod("p", node, &[]), pod("p", node, ann));
    assert_eq!(v.message(), want);
}

#[test]
fn non_update_operations_allowed() {
    for op in ["CREATE", "DELETE", "CONNECT"] {
        let body = json!({"request": {"uid": "u", "operation": op, "userInfo": {"username": OVN1},
            "object": pod("p", "node2", &[("x.example/y", "1")])}});
        let req = decode(&serde_json::to_vec(&body).expect("json")).expect("decodes");
        assert_eq!(
            admission().review(&req, &nodes()),
            Ok(Verdict::Allowed),
            "{op}"
        );
    }
}

#[test]
fn malformed_pod_reviews() {
    let body = json!({"request": {"uid": "u", "operation": "UPDATE", "userInfo": {"username": OVN1},
        "object": {"kind": "Node", "metadata": {"name": "n"}}, "oldObject": pod("p", "node1", &[])}});
    let req = decode(&serde_json::to_vec(&body).expect("json")).expect("decodes");
    assert_eq!(
        admission().review(&req, &nodes()),
        Err(ReviewError::WrongKind {
            expected: "Pod",
            got: "Node".into()
        })
    );
    let body = json!({"request": {"uid": "u", "operation": "UPDATE", "userInfo": {"username": OVN1},
        "object": pod("p", "node1", &[])}});
    let req = decode(&serde_json::to_vec(&body).expect("json")).expect("decodes");
    assert_eq!(
        admission().review(&req, &nodes()),
        Err(ReviewError::NoOldObject("UPDATE"))
    );
}

#[test]
fn parse_node_subnets_forms() {
    assert_eq!(
        parse_node_subnets(r#"{"default":"10.0.0.0/24"}"#).map(|v| v.len()),
        Ok(1)
    );
    assert_eq!(
        parse_node_subnets(r#"{"default":["10.0.0.0/24","fd00::/64"]}"#).map(|v| v.len()),
        Ok(2)
    );
    assert!(parse_node_subnets(r#"{"blue":["10.0.0.0/24"]}"#).is_err());
    assert!(parse_node_subnets(r#"{"default":["x"]}"#).is_err());
}
