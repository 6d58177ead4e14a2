use std::collections::BTreeSet;

use rstest::rstest;
use serde_json::{Value, json};

use super::*;
use crate::admission::review::decode;

const OVN1: &str = "system:ovn-node:node1";
const KUBELET1: &str = "system:node:node1";
const ADMIN: &str = "kubernetes-admin";
const DPU_HOST: &str = "system:serviceaccount:ovn:dpu-host";

fn node_with(name: &str, annotations: &[(&str, &str)], labels: &[(&str, &str)]) -> Value {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let lab: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "8b7c7a4e-0000-4000-8000-000000000001",
            "resourceVersion": "42",
            "annotations": ann,
            "labels": lab,
            "managedFields": [{"manager": "kubelet", "operation": "Update"}]
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "NetworkUnavailable", "status": "True"}
            ]
        }
    })
}

fn node(name: &str, annotations: &[(&str, &str)]) -> Value {
    node_with(name, annotations, &[])
}

fn review(op: &str, user: &str, old: Option<Value>, new: Option<Value>) -> AdmissionRequest {
    let name = new
        .as_ref()
        .or(old.as_ref())
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or("")
        .to_string();
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f1e2d3c",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "subResource": "status",
            "name": name,
            "operation": op,
            "userInfo": {"username": user, "groups": ["system:ovn-nodes", "system:authenticated"]},
            "object": new,
            "oldObject": old
        }
    });
    decode(&serde_json::to_vec(&body).expect("json")).expect("decodes")
}

fn admission(ic: bool, ho: bool, extra: &[&str]) -> NodeAdmission {
    NodeAdmission::new(&NodeAdmissionConfig {
        enable_interconnect: ic,
        enable_hybrid_overlay: ho,
        extra_allowed_users: extra.iter().map(|s| s.to_string()).collect(),
        protected_annotations: BTreeSet::new(),
    })
}

fn run(adm: &NodeAdmission, user: &str, old: Value, new: Value) -> Verdict {
    adm.review(
        &review("UPDATE", user, Some(old), Some(new)),
        &BTreeSet::new(),
    )
    .expect("well-formed")
}

fn msg(v: &Verdict) -> Option<&str> {
    v.message()
}

#[rstest]
fn ovnkube_node_may_set_every_common_key(
    #[values(
        BRIDGE_EGRESS_IPS,
        HOST_CIDRS,
        SECONDARY_HOST_EGRESS_IPS,
        L3_GATEWAY_CONFIG,
        NODE_MGMT_PORT_MAC_ADDRESSES,
        NODE_PRIMARY_IFADDR,
        NODE_MASQUERADE_SUBNET,
        GATEWAY_MTU_SUPPORT,
        NODE_MGMT_PORT,
        NODE_INGRESS_SNAT_EXCLUDE_SUBNETS,
        PRIMARY_DPU_HOST_ADDR,
        NODE_CHASSIS_ID,
        NODE_ENCAP_IPS,
        VTEPS
    )]
    key: &str,
) {
    let adm = admission(false, false, &[]);
    let v = run(&adm, OVN1, node("node1", &[]), node("node1", &[(key, "v")]));
    assert_eq!(v, Verdict::Allowed, "{key}");
    // and change / remove it (chassis-id excepted, see its own cases)
    if key != NODE_CHASSIS_ID {
        let v = run(
            &adm,
            OVN1,
            node("node1", &[(key, "a")]),
            node("node1", &[(key, "b")]),
        );
        assert_eq!(v, Verdict::Allowed, "{key}");
        let v = run(&adm, OVN1, node("node1", &[(key, "a")]), node("node1", &[]));
        assert_eq!(v, Verdict::Allowed, "{key}");
    }
}

#[rstest]
#[case::ic_key_with_ic(true, false, LAYER2_TOPOLOGY_VERSION, None)]
#[case::ic_key_without_ic(
    false,
    false,
    LAYER2_TOPOLOGY_VERSION,
    Some(
        "ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [k8s.ovn.org/layer2-topology-version]"
    )
)]
#[case::ho_mac_with_ho(false, true, HYBRID_OVERLAY_DR_MAC, None)]
#[case::ho_ip_with_ho(false, true, HYBRID_OVERLAY_DR_IP, None)]
#[case::ho_mac_without_ho(
    true,
    false,
    HYBRID_OVERLAY_DR_MAC,
    Some(
        "ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [k8s.ovn.org/hybrid-overlay-distributed-router-gateway-mac]"
    )
)]
#[case::ho_ip_without_ho(
    false,
    false,
    HYBRID_OVERLAY_DR_IP,
    Some(
        "ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [k8s.ovn.org/hybrid-overlay-distributed-router-gateway-ip]"
    )
)]
#[case::r12_remote_zone_migrated_not_listed(
    true,
    true,
    "k8s.ovn.org/remote-zone-migrated",
    Some(
        "ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [k8s.ovn.org/remote-zone-migrated]"
    )
)]
fn feature_lists(
    #[case] ic: bool,
    #[case] ho: bool,
    #[case] key: &str,
    #[case] want: Option<&str>,
) {
    let adm = admission(ic, ho, &[]);
    let v = run(&adm, OVN1, node("node1", &[]), node("node1", &[(key, "x")]));
    assert_eq!(msg(&v), want);
}

#[rstest]
#[case::chassis_add(&[], &[(NODE_CHASSIS_ID, "c1")], None)]
#[case::chassis_same(&[(NODE_CHASSIS_ID, "c1")], &[(NODE_CHASSIS_ID, "c1")], None)]
#[case::chassis_change(&[(NODE_CHASSIS_ID, "c1")], &[(NODE_CHASSIS_ID, "c2")],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/node-chassis-id on node \"node1\": k8s.ovn.org/node-chassis-id cannot be changed once set"))]
#[case::chassis_remove(&[(NODE_CHASSIS_ID, "c1")], &[],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/node-chassis-id on node \"node1\": k8s.ovn.org/node-chassis-id cannot be removed"))]
#[case::zone_add_global(&[], &[(ZONE_NAME, "global")], None)]
#[case::zone_add_node(&[], &[(ZONE_NAME, "node1")], None)]
#[case::zone_change_to_node(&[(ZONE_NAME, "global")], &[(ZONE_NAME, "node1")], None)]
#[case::zone_add_other(&[], &[(ZONE_NAME, "node2")],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/zone-name on node \"node1\": k8s.ovn.org/zone-name can only be set to global or node1, it cannot be removed"))]
#[case::zone_change_other(&[(ZONE_NAME, "node1")], &[(ZONE_NAME, "zoneX")],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/zone-name on node \"node1\": k8s.ovn.org/zone-name can only be set to global or node1, it cannot be removed"))]
#[case::zone_remove(&[(ZONE_NAME, "node1")], &[],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/zone-name on node \"node1\": k8s.ovn.org/zone-name can only be set to global or node1, it cannot be removed"))]
#[case::l2_add(&[], &[(LAYER2_TOPOLOGY_VERSION, "2.0")], None)]
#[case::l2_remove(&[(LAYER2_TOPOLOGY_VERSION, "2.0")], &[], None)]
#[case::l2_change(&[(LAYER2_TOPOLOGY_VERSION, "1.0")], &[(LAYER2_TOPOLOGY_VERSION, "2.0")],
    Some("user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/layer2-topology-version on node \"node1\": k8s.ovn.org/layer2-topology-version can only be added or removed, not updated"))]
fn value_checks(
    #[case] old: &[(&str, &str)],
    #[case] new: &[(&str, &str)],
    #[case] want: Option<&str>,
) {
    let adm = admission(true, false, &[]);
    let v = run(&adm, OVN1, node("node1", old), node("node1", new));
    assert_eq!(msg(&v), want);
    if want.is_some() {
        assert!(matches!(
            v,
            Verdict::Denied {
                reason: DenyReason::ValueCheck,
                ..
            }
        ));
    }
}

#[rstest]
#[case::admin_unlisted(ADMIN, &[], &[("example.com/foo", "1")], None)]
#[case::admin_listed(ADMIN, &[], &[(HOST_CIDRS, "[]"), (NODE_ENCAP_IPS, "[]"), ("example.com/foo", "1")],
    Some("user \"kubernetes-admin\" is not allowed to set the following annotations on node: \"node1\": [k8s.ovn.org/host-cidrs k8s.ovn.org/node-encap-ips]"))]
#[case::kubelet_listed(KUBELET1, &[(NODE_CHASSIS_ID, "c")], &[],
    Some("user \"system:node:node1\" is not allowed to set the following annotations on node: \"node1\": [k8s.ovn.org/node-chassis-id]"))]
#[case::extra_user_listed(DPU_HOST, &[], &[(HOST_CIDRS, "[]")], None)]
#[case::extra_user_value_check(DPU_HOST, &[], &[(ZONE_NAME, "node2")],
    Some("user: \"system:serviceaccount:ovn:dpu-host\" is not allowed to set k8s.ovn.org/zone-name on node \"node1\": k8s.ovn.org/zone-name can only be set to global or node1, it cannot be removed"))]
#[case::extra_user_other_annotations(DPU_HOST, &[], &[(HOST_CIDRS, "[]"), ("example.com/x", "y")], None)]
fn other_users(
    #[case] user: &str,
    #[case] old: &[(&str, &str)],
    #[case] new: &[(&str, &str)],
    #[case] want: Option<&str>,
) {
    let adm = admission(false, false, &[DPU_HOST]);
    let v = run(&adm, user, node("node1", old), node("node1", new));
    assert_eq!(msg(&v), want);
}

#[test]
fn other_node_denied() {
    let adm = admission(false, false, &[]);
    let v = run(
        &adm,
        OVN1,
        node("node2", &[]),
        node("node2", &[(HOST_CIDRS, "[]")]),
    );
    assert_eq!(
        msg(&v),
        Some(
            "ovnkube-node on node: \"node1\" is not allowed to modify nodes \"node2\" annotations"
        )
    );
    assert!(matches!(
        v,
        Verdict::Denied {
            reason: DenyReason::OtherNode,
            ..
        }
    ));
    // even with no annotation change at all
    let v = run(&adm, OVN1, node("node2", &[]), node("node2", &[]));
    assert!(!v.is_allowed());
}

#[test]
fn unlisted_annotations_denied_sorted() {
    let adm = admission(false, false, &[]);
    let v = run(
        &adm,
        OVN1,
        node("node1", &[("z.example/x", "1")]),
        node(
            "node1",
            &[
                (HOST_CIDRS, "[]"),
                ("k8s.ovn.org/node-subnets", "{}"),
                ("a.example/y", "1"),
            ],
        ),
    );
    assert_eq!(
        msg(&v),
        Some(
            "ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [a.example/y k8s.ovn.org/node-subnets z.example/x]"
        )
    );
}

fn with(mut v: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut v);
    v
}

const NOT_ONLY: &str =
    "ovnkube-node on node: \"node1\" is not allowed to modify anything other than annotations";

#[rstest]
#[case::label(with(node("node1", &[]), |n| n["metadata"]["labels"]["foo"] = json!("bar")), Some(NOT_ONLY))]
#[case::status(with(node("node1", &[]), |n| n["status"]["conditions"][0]["status"] = json!("False")), Some(NOT_ONLY))]
#[case::spec_taint(with(node("node1", &[]), |n| n["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}])), Some(NOT_ONLY))]
#[case::finalizer(with(node("node1", &[]), |n| n["metadata"]["finalizers"] = json!(["x"])), Some(NOT_ONLY))]
#[case::managed_fields_only(with(node("node1", &[]), |n| n["metadata"]["managedFields"] = json!([])), None)]
#[case::empty_vs_absent_labels(with(node("node1", &[]), |n| { n["metadata"].as_object_mut().map(|m| m.remove("labels")); }), None)]
#[case::network_unavailable_not_gce(with(node("node1", &[]), |n| n["status"]["conditions"][1]["status"] = json!("False")), Some(NOT_ONLY))]
fn only_annotations(#[case] new: Value, #[case] want: Option<&str>) {
    let adm = admission(false, false, &[]);
    let v = run(&adm, OVN1, node("node1", &[]), new);
    assert_eq!(msg(&v), want);
}

#[test]
fn gce_network_unavailable_exception() {
    let adm = admission(false, false, &[]);
    let gce = |n: Value| {
        with(n, |n| {
            n["spec"]["providerID"] = json!("gce://project/zone/node1")
        })
    };
    let old = gce(node("node1", &[]));
    let new = with(old.clone(), |n| {
        n["status"]["conditions"][1]["status"] = json!("False")
    });
    assert_eq!(run(&adm, OVN1, old.clone(), new), Verdict::Allowed);
    // other conditions still may not change
    let new = with(old.clone(), |n| {
        n["status"]["conditions"][0]["status"] = json!("False")
    });
    assert_eq!(msg(&run(&adm, OVN1, old, new)), Some(NOT_ONLY));
}

#[rstest]
#[case::delete("DELETE")]
#[case::connect("CONNECT")]
fn delete_and_connect_allowed(#[case] op: &str) {
    let adm = admission(false, false, &[]);
    let r = review(op, OVN1, Some(node("node2", &[])), None);
    assert_eq!(adm.review(&r, &BTreeSet::new()), Ok(Verdict::Allowed));
}

// ---- ovnk additions ----

fn tz_labels() -> BTreeSet<String> {
    ["trust.example.com/zone".to_string()].into_iter().collect()
}

const TZ_ANN_DENY_KUBELET: &str = "user \"system:node:node1\" is not allowed to set, change or remove the following protected annotations on node \"node1\": [k8s.ovn.org/transport-zones]";
const TZ_LABEL_DENY_KUBELET: &str = "user \"system:node:node1\" is not allowed to set, change or remove the following trust-zone labels on node \"node1\": [trust.example.com/zone]";

#[rstest]
#[case::kubelet_adds_tz(KUBELET1, node("node1", &[]), node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]), Some(TZ_ANN_DENY_KUBELET))]
#[case::kubelet_changes_tz(KUBELET1, node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]), node("node1", &[(TRANSPORT_ZONES, "[\"b\"]")]), Some(TZ_ANN_DENY_KUBELET))]
#[case::kubelet_removes_tz(KUBELET1, node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]), node("node1", &[]), Some(TZ_ANN_DENY_KUBELET))]
#[case::kubelet_keeps_tz(KUBELET1, node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]), node("node1", &[(TRANSPORT_ZONES, "[\"a\"]"), ("x.example/y", "1")]), None)]
#[case::kubelet_adds_tz_label(KUBELET1, node("node1", &[]), node_with("node1", &[], &[("trust.example.com/zone", "red")]), Some(TZ_LABEL_DENY_KUBELET))]
#[case::kubelet_other_label(KUBELET1, node("node1", &[]), node_with("node1", &[], &[("topology.kubernetes.io/zone", "z1")]), None)]
#[case::ovn_node_tz_upstream_message(OVN1, node("node1", &[]), node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]),
    Some("ovnkube-node on node: \"node1\" is not allowed to set the following annotations: [k8s.ovn.org/transport-zones]"))]
#[case::ovn_node_label_upstream_message(OVN1, node("node1", &[]), node_with("node1", &[], &[("trust.example.com/zone", "red")]), Some(NOT_ONLY))]
#[case::admin_may_set_tz(ADMIN, node("node1", &[]), node_with("node1", &[(TRANSPORT_ZONES, "[\"a\"]")], &[("trust.example.com/zone", "red")]), None)]
fn protected_keys_update(
    #[case] user: &str,
    #[case] old: Value,
    #[case] new: Value,
    #[case] want: Option<&str>,
) {
    let adm = admission(false, false, &[]);
    let v = adm
        .review(&review("UPDATE", user, Some(old), Some(new)), &tz_labels())
        .expect("well-formed");
    assert_eq!(msg(&v), want);
}

#[rstest]
#[case::kubelet_plain(KUBELET1, node("node1", &[]), None)]
#[case::kubelet_tz(KUBELET1, node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]), Some(TZ_ANN_DENY_KUBELET))]
#[case::kubelet_label(KUBELET1, node_with("node1", &[], &[("trust.example.com/zone", "red")]), Some(TZ_LABEL_DENY_KUBELET))]
#[case::ovn_node_tz(OVN1, node("node1", &[(TRANSPORT_ZONES, "[\"a\"]")]),
    Some("user \"system:ovn-node:node1\" is not allowed to set, change or remove the following protected annotations on node \"node1\": [k8s.ovn.org/transport-zones]"))]
#[case::admin_tz(ADMIN, node_with("node1", &[(TRANSPORT_ZONES, "[\"a\"]")], &[("trust.example.com/zone", "red")]), None)]
fn protected_keys_create(#[case] user: &str, #[case] new: Value, #[case] want: Option<&str>) {
    let adm = admission(false, false, &[]);
    let v = adm
        .review(&review("CREATE", user, None, Some(new)), &tz_labels())
        .expect("well-formed");
    assert_eq!(msg(&v), want);
    if want.is_some() {
        assert!(matches!(
            v,
            Verdict::Denied {
                reason: DenyReason::ProtectedKey,
                ..
            }
        ));
    }
}

#[test]
fn extra_protected_annotation_from_config() {
    let adm = NodeAdmission::new(&NodeAdmissionConfig {
        protected_annotations: ["k8s.ovn.org/trust-zones".to_string()]
            .into_iter()
            .collect(),
        ..Default::default()
    });
    let v = adm
        .review(
            &review(
                "UPDATE",
                KUBELET1,
                Some(node("node1", &[])),
                Some(node("node1", &[("k8s.ovn.org/trust-zones", "x")])),
            ),
            &BTreeSet::new(),
        )
        .expect("well-formed");
    assert!(matches!(
        v,
        Verdict::Denied {
            reason: DenyReason::ProtectedKey,
            ..
        }
    ));
}

// ---- malformed ----

#[rstest]
#[case::update_without_old("UPDATE", None, Some(node("node1", &[])), ReviewError::NoOldObject("UPDATE"))]
#[case::update_without_new("UPDATE", Some(node("node1", &[])), None, ReviewError::NoObject("UPDATE"))]
#[case::create_without_object("CREATE", None, None, ReviewError::NoObject("CREATE"))]
#[case::wrong_kind("UPDATE", Some(json!({"kind": "Pod", "metadata": {"name": "p"}})), Some(json!({"kind": "Pod", "metadata": {"name": "p"}})),
    ReviewError::WrongKind { expected: "Node", got: "Pod".into() })]
#[case::not_an_object("UPDATE", Some(json!("node")), Some(json!(5)), ReviewError::NotAnObject)]
fn malformed(
    #[case] op: &str,
    #[case] old: Option<Value>,
    #[case] new: Option<Value>,
    #[case] want: ReviewError,
) {
    let adm = admission(false, false, &[]);
    assert_eq!(
        adm.review(&review(op, OVN1, old, new), &BTreeSet::new()),
        Err(want)
    );
}

#[rstest]
#[case::metadata_not_object(json!({"kind": "Node", "metadata": 7}))]
#[case::annotations_not_object(json!({"kind": "Node", "metadata": {"name": "node1", "annotations": ["x"]}}))]
#[case::annotation_value_not_string(json!({"kind": "Node", "metadata": {"name": "node1", "annotations": {(HOST_CIDRS): 5}}}))]
#[case::empty(json!({}))]
fn odd_shapes_never_panic(#[case] new: Value) {
    let adm = admission(true, true, &[]);
    for user in [OVN1, KUBELET1, ADMIN] {
        let _ = adm.review(
            &review("UPDATE", user, Some(node("node1", &[])), Some(new.clone())),
            &tz_labels(),
        );
        let _ = adm.review(
            &review("UPDATE", user, Some(new.clone()), Some(node("node1", &[]))),
            &tz_labels(),
        );
        let _ = adm.review(
            &review("CREATE", user, None, Some(new.clone())),
            &tz_labels(),
        );
    }
}
