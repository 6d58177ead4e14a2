//! RBAC, the Node authorizer + NodeRestriction, and the CSR flow, through real TLS clients.

mod common;

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn forbidden(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => s.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn rbac_denies_without_binding_and_allows_exactly_the_bound_rules() {
    let sb = common::start().await;
    let admin = sb.server.admin_client().await.expect("admin");
    let alice = sb.server.client("alice", &["team-a"]).await.expect("alice");
    let nodes_alice = Api::<Node>::all(alice.clone());
    let msg = forbidden(
        nodes_alice
            .list(&ListParams::default())
            .await
            .expect_err("no binding"),
    );
    assert!(
        msg.contains("User \"alice\" cannot list resource \"nodes\""),
        "{msg}"
    );

    let roles: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            "clusterroles",
        ),
    );
    let bindings: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
            ),
            "clusterrolebindings",
        ),
    );
    let role = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "node-reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
                  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"], }]})).expect("role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "team-a-read"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
        "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}]})).expect("binding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");

    let admin_nodes = Api::<Node>::all(admin.clone());
    admin_nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node"),
        )
        .await
        .expect("node");
    assert_eq!(
        nodes_alice
            .list(&ListParams::default())
            .await
            .expect("list allowed")
            .items
            .len(),
        1
    );
    nodes_alice.get("n1").await.expect("get allowed");
    let msg = forbidden(
        nodes_alice
            .patch(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await
            .expect_err("patch"),
    );
    assert!(msg.contains("cannot patch resource \"nodes\""), "{msg}");
    forbidden(
        nodes_alice
            .patch_status(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {}})),
            )
            .await
            .expect_err("status"),
    );
    let cms = Api::<ConfigMap>::namespaced(alice.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).expect("cm"),
    )
    .await
    .expect("create allowed");
    forbidden(cms.get("c").await.expect_err("get not listed"));
    // Another user, not in the group, still gets nothing.
    let bob = Api::<Node>::all(sb.server.client("bob", &[]).await.expect("bob"));
    forbidden(bob.get("n1").await.expect_err("bob"));
}

#[tokio::test]
async fn node_restriction_limits_kubelets_to_their_own_node() {
    let sb = common::start().await;
    let admin = Api::<Node>::all(sb.server.admin_client().await.expect("admin"));
    for n in ["node1", "node2"] {
        admin
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": n}, "spec": {"podCIDR": "10.0.0.0/24"}}),
                )
                .expect("node"),
            )
            .await
            .expect("node");
    }
    let kubelet = Api::<Node>::all(
        sb.server
            .client("system:node:node1", &["system:nodes"])
            .await
            .expect("kubelet"),
    );
    // Reads are allowed.
    assert_eq!(
        kubelet
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    kubelet
        .patch(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/x": "y"}}})),
        )
        .await
        .expect("own label");
    let msg = forbidden(
        kubelet
            .patch(
                "node1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}}),
                ),
            )
            .await
            .expect_err("restricted label"),
    );
    assert!(
        msg.contains("is not allowed to modify labels: node-restriction.kubernetes.io/x"),
        "{msg}"
    );
    let msg = forbidden(
        kubelet
            .patch(
                "node2",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"example.com/x": "y"}}})),
            )
            .await
            .expect_err("node2"),
    );
    assert!(msg.contains("node2"), "{msg}");
    forbidden(
        kubelet
            .patch_status(
                "node2",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}})),
            )
            .await
            .expect_err("node2 status"),
    );

    // Through nodes/status: annotations and status persist, a spec change does not.
    let out = kubelet
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"k8s.ovn.org/zone-name": "node1"}}, "spec": {"podCIDR": "10.9.9.0/24"},
                                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .expect("status patch");
    assert_eq!(
        out.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("k8s.ovn.org/zone-name"))
            .map(String::as_str),
        Some("node1")
    );
    let stored = admin.get("node1").await.expect("get");
    assert_eq!(
        stored
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("k8s.ovn.org/zone-name"))
            .map(String::as_str),
        Some("node1")
    );
    assert_eq!(
        stored.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()),
        Some("10.0.0.0/24")
    );
    assert_eq!(
        stored
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c.len()),
        Some(1)
    );
    // The main endpoint ignores status.
    admin
        .patch(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": []}})),
        )
        .await
        .expect("main patch");
    assert_eq!(
        admin
            .get("node1")
            .await
            .expect("get")
            .status
            .and_then(|s| s.conditions)
            .map(|c| c.len()),
        Some(1)
    );
}

#[tokio::test]
async fn csr_created_by_a_node_approved_by_admin_is_signed_by_the_ca() {
    let sb = common::start().await;
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:ovn-node:node1");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:ovn-nodes");
    let csr_pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let node_csrs = Api::<CertificateSigningRequest>::all(
        sb.server
            .client("system:node:node1", &["system:nodes"])
            .await
            .expect("node"),
    );
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "ovn-node-"},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(&csr_pem), "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["digital signature", "client auth"], "expirationSeconds": 3600,
                 "username": "forged", "groups": ["system:masters"]}
    }))
    .expect("csr object");
    let created = node_csrs
        .create(&PostParams::default(), &csr)
        .await
        .expect("create csr");
    let name = created.metadata.name.clone().expect("name");
    // Identity comes from the caller, never the body.
    assert_eq!(created.spec.username.as_deref(), Some("system:node:node1"));
    assert_eq!(
        created.spec.groups.clone().unwrap_or_default(),
        vec![
            "system:nodes".to_string(),
            "system:authenticated".to_string()
        ]
    );

    // The node itself may not approve.
    let approval = json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "ok"}]}});
    forbidden(
        node_csrs
            .patch_approval(
                &name,
                &PatchParams::default(),
                &Patch::Merge(approval.clone()),
            )
            .await
            .expect_err("self approve"),
    );

    let admin_csrs =
        Api::<CertificateSigningRequest>::all(sb.server.admin_client().await.expect("admin"));
    admin_csrs
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(approval))
        .await
        .expect("approve");
    let signed = common::eventually("certificate issued", || {
        let api = admin_csrs.clone();
        let name = name.clone();
        async move { api.get(&name).await.ok()?.status?.certificate }
    })
    .await;
    let pem_text = String::from_utf8(signed.0).expect("utf8");
    let der = pem::parse(&pem_text).expect("pem").contents().to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some("system:ovn-node:node1")
    );
    assert_eq!(
        cert.subject()
            .iter_organization()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some("system:ovn-nodes")
    );
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert!(
        (3600..=3600 + 60).contains(&lifetime),
        "lifetime {lifetime}"
    );
    let ca_der = pem::parse(sb.server.ca_pem())
        .expect("ca pem")
        .contents()
        .to_vec();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
    cert.verify_signature(Some(ca.public_key()))
        .expect("chains to the sandbox CA");

    // The issued certificate authenticates as that user.
    let key_pem = key.serialize_pem();
    let yaml = apiserver::kubeconfig::render(
        &sb.server.url(),
        sb.server.ca_pem(),
        "system:ovn-node:node1",
        &apiserver::pki::CertKey {
            cert_pem: pem_text,
            key_pem,
        },
    );
    let client = apiserver::kubeconfig::client_from_yaml(&yaml)
        .await
        .expect("client");
    let msg = forbidden(
        Api::<Node>::all(client)
            .list(&ListParams::default())
            .await
            .expect_err("no rbac yet"),
    );
    assert!(msg.contains("system:ovn-node:node1"), "{msg}");
}

#[tokio::test]
async fn csr_expiration_below_600s_is_rejected_unless_allowed() {
    let sb = common::start().await;
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "u");
    let csr_pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let body = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "short"},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(&csr_pem), "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["client auth"], "expirationSeconds": 60}});
    let api = Api::<CertificateSigningRequest>::all(sb.server.admin_client().await.expect("admin"));
    match api
        .create(
            &PostParams::default(),
            &serde_json::from_value(body.clone()).expect("csr"),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("expected 422, got {other:?}"),
    }
    let fast = common::start_with(|c| apiserver::ServerConfig {
        min_csr_expiration_seconds: 1,
        ..c
    })
    .await;
    let api =
        Api::<CertificateSigningRequest>::all(fast.server.admin_client().await.expect("admin"));
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).expect("csr"),
    )
    .await
    .expect("allowed by flag");
}
