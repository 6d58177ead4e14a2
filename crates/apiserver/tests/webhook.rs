//! Validating admission webhooks: a test HTTPS server receives real AdmissionReviews.

mod common;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// A webhook that records reviews and denies objects labelled `deny=yes`.
async fn webhook_server() -> (
    String,
    String,
    Arc<Mutex<Vec<Value>>>,
    tokio::task::JoinHandle<()>,
) {
    use rustls_pki_types::pem::PemObject;
    let dir = tempfile::tempdir().expect("tmp");
    let ca = apiserver::pki::Ca::load_or_create(dir.path()).expect("ca");
    let serving = ca.serving_cert(&["127.0.0.1".to_string()]).expect("cert");
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![
            rustls_pki_types::CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())
                .expect("cert"),
        ],
        rustls_pki_types::PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).expect("key"),
    )
    .expect("tls");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "https://127.0.0.1:{}/validate",
        listener.local_addr().expect("addr").port()
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            let review: Value =
                                serde_json::from_slice(&body).unwrap_or(Value::Null);
                            seen.lock().expect("lock").push(review.clone());
                            let r = &review["request"];
                            let deny = r["object"]["metadata"]["labels"]["deny"] == "yes";
                            let resp = if deny {
                                json!({"uid": r["uid"], "allowed": false, "status": {"code": 403, "message": "label deny=yes is not welcome"}})
                            } else {
                                json!({"uid": r["uid"], "allowed": true})
                            };
                            let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp});
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                Bytes::from(out.to_string()),
                            )))
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (url, ca.cert_pem.clone(), seen, task)
}

fn vwc_api(client: kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
            ),
            "validatingwebhookconfigurations",
        ),
    )
}

fn config(
    name: &str,
    url: &str,
    ca_pem: &str,
    policy: &str,
    match_conditions: Value,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.example.com"),
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
            "rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes/status"]}],
            "failurePolicy": policy, "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
            "matchConditions": match_conditions
        }]
    }))
    .expect("vwc")
}

#[tokio::test]
async fn webhook_receives_matching_reviews_and_its_denial_reaches_the_client() {
    let sb = common::start().await;
    let (url, ca, seen, task) = webhook_server().await;
    let admin = sb.server.admin_client().await.expect("admin");
    let mc = json!([{"name": "ovn-nodes-only", "expression": "request.userInfo.username.startsWith(\"system:ovn-node:\")"}]);
    vwc_api(admin.clone())
        .create(
            &PostParams::default(),
            &config("node-check", &url, &ca, "Fail", mc),
        )
        .await
        .expect("vwc");
    let nodes = Api::<Node>::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).expect("node"),
        )
        .await
        .expect("node");

    // Not matching: main endpoint (rules name nodes/status), and a user outside the matchCondition.
    nodes
        .patch(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}})),
        )
        .await
        .expect("main endpoint");
    nodes
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"x": "1"}}})),
        )
        .await
        .expect("admin status");
    assert!(
        seen.lock().expect("lock").is_empty(),
        "no review expected yet"
    );

    // Grant the ovn-node identity access to nodes/status via RBAC, then act as it.
    let rbac = |kind: &str, plural: &str| {
        Api::<DynamicObject>::all_with(
            admin.clone(),
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
                plural,
            ),
        )
    };
    rbac("ClusterRole", "clusterroles")
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "ovn-node"},
            "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get", "patch", "update"]}]})).expect("role"))
        .await
        .expect("role");
    rbac("ClusterRoleBinding", "clusterrolebindings")
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "ovn-node"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ovn-node"},
            "subjects": [{"kind": "Group", "name": "system:ovn-nodes"}]})).expect("binding"))
        .await
        .expect("binding");
    let ovn = Api::<Node>::all(
        sb.server
            .client("system:ovn-node:node1", &["system:ovn-nodes"])
            .await
            .expect("ovn"),
    );
    ovn.patch_status(
        "node1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"k8s.ovn.org/a": "1"}}})),
    )
    .await
    .expect("allowed");
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        let r = &seen[0]["request"];
        assert_eq!(seen[0]["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(seen[0]["kind"], "AdmissionReview");
        assert!(r["uid"].as_str().is_some_and(|u| !u.is_empty()));
        assert_eq!(
            r["kind"],
            json!({"group": "", "version": "v1", "kind": "Node"})
        );
        assert_eq!(
            r["resource"],
            json!({"group": "", "version": "v1", "resource": "nodes"})
        );
        assert_eq!(r["subResource"], "status");
        assert_eq!(r["operation"], "UPDATE");
        assert_eq!(r["name"], "node1");
        assert_eq!(r["userInfo"]["username"], "system:ovn-node:node1");
        assert!(
            r["userInfo"]["groups"]
                .as_array()
                .is_some_and(|g| g.iter().any(|x| x == "system:authenticated"))
        );
        assert_eq!(r["object"]["metadata"]["annotations"]["k8s.ovn.org/a"], "1");
        assert!(r["oldObject"]["metadata"]["annotations"]["k8s.ovn.org/a"].is_null());
        assert_eq!(r["dryRun"], false);
    }
    let err = ovn
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"deny": "yes"}}})),
        )
        .await
        .expect_err("denied");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403);
            assert!(s.message.contains("admission webhook \"node-check.example.com\" denied the request: label deny=yes is not welcome"), "{}", s.message);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        nodes
            .get("node1")
            .await
            .expect("get")
            .metadata
            .labels
            .and_then(|l| l.get("deny").cloned())
            .is_none()
    );
    task.abort();
}

#[tokio::test]
async fn unreachable_webhook_fails_closed_or_open_per_policy() {
    let sb = common::start().await;
    let (_, ca, _, task) = webhook_server().await;
    task.abort();
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!(
            "https://127.0.0.1:{}/validate",
            l.local_addr().expect("addr").port()
        )
    };
    let admin = sb.server.admin_client().await.expect("admin");
    let vwcs = vwc_api(admin.clone());
    let nodes = Api::<Node>::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).expect("node"),
        )
        .await
        .expect("node");
    vwcs.create(
        &PostParams::default(),
        &config("closed", &dead, &ca, "Fail", json!([])),
    )
    .await
    .expect("vwc");
    let err = nodes
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .expect_err("fail closed");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 500);
            assert!(
                s.message
                    .contains("failed calling webhook \"closed.example.com\""),
                "{}",
                s.message
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    vwcs.delete("closed", &Default::default())
        .await
        .expect("delete");
    vwcs.create(
        &PostParams::default(),
        &config("open", &dead, &ca, "Ignore", json!([])),
    )
    .await
    .expect("vwc");
    nodes
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .expect("fail open");
}

#[tokio::test]
async fn a_webhook_that_never_answers_times_out_per_timeout_seconds() {
    let sb = common::start().await;
    let (_, ca, _, task) = webhook_server().await;
    task.abort();
    // Accepts TCP connections and never speaks TLS.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "https://127.0.0.1:{}/validate",
        silent.local_addr().expect("addr").port()
    );
    let hold = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let admin = sb.server.admin_client().await.expect("admin");
    let nodes = Api::<Node>::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).expect("node"),
        )
        .await
        .expect("node");
    let mut cfg = config("slow", &url, &ca, "Fail", json!([]));
    cfg.data["webhooks"][0]["timeoutSeconds"] = json!(1);
    vwc_api(admin)
        .create(&PostParams::default(), &cfg)
        .await
        .expect("vwc");
    let err = nodes
        .patch_status(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "1"}}})),
        )
        .await
        .expect_err("timed out");
    match err {
        kube::Error::Api(s) => assert!(
            s.code == 500 && s.message.contains("context deadline exceeded"),
            "{}",
            s.message
        ),
        other => panic!("unexpected {other:?}"),
    }
    hold.abort();
}

#[tokio::test]
async fn unsupported_match_condition_is_rejected_at_create_time() {
    let sb = common::start().await;
    let admin = sb.server.admin_client().await.expect("admin");
    let mc = json!([{"name": "authz", "expression": "authorizer.group('').resource('nodes').check('get').allowed()"}]);
    let err = vwc_api(admin)
        .create(
            &PostParams::default(),
            &config("bad", "https://127.0.0.1:1/x", "", "Fail", mc),
        )
        .await
        .expect_err("rejected");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message.contains("matchConditions[0].expression"),
                "{}",
                s.message
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}
