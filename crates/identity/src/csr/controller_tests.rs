//! Reconcile against a mock API server (tower-test): what is written, where, and that a 409
//! is not an error.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::client::Body;
use kube::runtime::reflector;
use kube::runtime::watcher::Event as WatchEvent;
use serde_json::{Value, json};

use super::*;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn csr_pem(cn: &str) -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:ovn-nodes");
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
        .into_bytes()
}

fn csr(name: &str, cn: &str, user: &str, exp: i32) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some("0c1d2e3f".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem(cn)),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            username: Some(user.into()),
            groups: Some(vec!["system:nodes".into(), "system:authenticated".into()]),
            expiration_seconds: Some(exp),
            ..Default::default()
        },
        status: None,
    }
}

fn ctx(nodes: &[&str]) -> (Arc<Ctx>, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let (store, mut writer) = reflector::store::<PartialObjectMeta<Node>>();
    writer.apply_watcher_event(&WatchEvent::Init);
    for n in nodes {
        let obj = PartialObjectMeta::<Node> {
            types: None,
            metadata: ObjectMeta {
                name: Some(n.to_string()),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        };
        writer.apply_watcher_event(&WatchEvent::InitApply(obj));
    }
    writer.apply_watcher_event(&WatchEvent::InitDone);
    let ctx = Ctx {
        api: Api::all(client.clone()),
        nodes_api: Api::all(client.clone()),
        nodes: NodeCache::from_store(store),
        policy: ApproverPolicy::default(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER_NAME.into(),
                instance: Some("test".into()),
            },
        ),
        metrics: Metrics::shared(),
    };
    (Arc::new(ctx), handle)
}

async fn body_json(req: Request<Body>) -> Value {
    let bytes = req.into_body().collect_bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: StatusCode, body: Value) {
    let resp = Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).expect("json")))
        .expect("response");
    send.send_response(resp);
}

async fn next(
    handle: &mut Handle,
) -> (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("a request is made")
        .expect("client alive")
}

fn status_409() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "Operation cannot be fulfilled on certificatesigningrequests.certificates.k8s.io \"csr-1\": the object has been modified"})
}

#[tokio::test]
async fn approves_through_the_approval_subresource_and_records_an_event() {
    let (ctx, mut handle) = ctx(&["node1"]);
    let obj = Arc::new(csr(
        "csr-1",
        "system:ovn-node:node1",
        "system:node:node1",
        600,
    ));
    let server = tokio::spawn(async move {
        let (req, send) = next(&mut handle).await;
        assert_eq!(req.method(), http::Method::PUT);
        assert_eq!(
            req.uri().path(),
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1/approval"
        );
        let body = body_json(req).await;
        assert_eq!(
            body["metadata"]["resourceVersion"], "7",
            "optimistic concurrency"
        );
        let cond = &body["status"]["conditions"][0];
        assert_eq!(cond["type"], "Approved");
        assert_eq!(cond["status"], "True");
        assert_eq!(cond["reason"], "AutoApproved");
        assert_eq!(cond["message"], "Auto-approved CSR \"csr-1\"");
        respond(send, StatusCode::OK, body);
        let (req, send) = next(&mut handle).await;
        assert_eq!(req.method(), http::Method::POST);
        assert!(req.uri().path().ends_with("/events"), "{}", req.uri());
        let ev = body_json(req).await;
        assert_eq!(ev["reason"], "CSRApproved");
        assert_eq!(ev["type"], "Normal");
        assert_eq!(ev["action"], "Approving");
        assert_eq!(ev["note"], "CSR \"csr-1\" has been approved");
        assert_eq!(ev["regarding"]["name"], "csr-1");
        respond(send, StatusCode::CREATED, ev);
    });
    let action = reconcile(obj, ctx).await.expect("reconciled");
    assert_eq!(action, Action::await_change());
    server.await.expect("server assertions");
}

#[tokio::test]
async fn denies_with_a_warning_event() {
    let (ctx, mut handle) = ctx(&["node1", "node2"]);
    let obj = Arc::new(csr(
        "csr-2",
        "system:ovn-node:node2",
        "system:node:node1",
        600,
    ));
    let server = tokio::spawn(async move {
        let (req, send) = next(&mut handle).await;
        assert!(req.uri().path().ends_with("/csr-2/approval"));
        let body = body_json(req).await;
        let cond = &body["status"]["conditions"][0];
        assert_eq!(cond["type"], "Denied");
        assert_eq!(cond["reason"], "CSRDenied");
        assert_eq!(
            cond["message"],
            "expected the CSR's commonName to be \"system:ovn-node:node1\", but it is \"system:ovn-node:node2\""
        );
        respond(send, StatusCode::OK, body);
        let (req, send) = next(&mut handle).await;
        let ev = body_json(req).await;
        assert_eq!(ev["reason"], "CSRDenied");
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["action"], "Denying");
        assert!(ev["note"].as_str().is_some_and(|n| {
            n.starts_with("The CSR \"csr-2\" has been denied: expected the CSR's commonName")
        }));
        respond(send, StatusCode::CREATED, ev);
    });
    reconcile(obj, ctx).await.expect("reconciled");
    server.await.expect("server assertions");
}

#[tokio::test]
async fn conflict_is_not_an_error_and_emits_no_event() {
    let (ctx, mut handle) = ctx(&["node1"]);
    let obj = Arc::new(csr(
        "csr-1",
        "system:ovn-node:node1",
        "system:node:node1",
        600,
    ));
    let server = tokio::spawn(async move {
        let (_req, send) = next(&mut handle).await;
        respond(send, StatusCode::CONFLICT, status_409());
        // no event may follow: the next call would hang here; the test ends instead
        handle
    });
    let action = reconcile(obj, ctx.clone()).await.expect("409 is fine");
    assert_eq!(action, Action::await_change());
    let mut handle = server.await.expect("server");
    let extra = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(
        !matches!(extra, Ok(Some(_))),
        "no event after losing the race"
    );
}

#[tokio::test]
async fn missing_node_is_checked_live_before_denying() {
    let (ctx, mut handle) = ctx(&[]);
    let obj = Arc::new(csr(
        "csr-3",
        "system:ovn-node:node9",
        "system:node:node9",
        600,
    ));
    let server = tokio::spawn(async move {
        let (req, send) = next(&mut handle).await;
        assert_eq!(req.method(), http::Method::GET);
        assert_eq!(req.uri().path(), "/api/v1/nodes/node9");
        respond(
            send,
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "nodes \"node9\" not found"}),
        );
        let (req, send) = next(&mut handle).await;
        let body = body_json(req).await;
        assert_eq!(
            body["status"]["conditions"][0]["message"],
            "CSR \"csr-3\" was created for node \"node9\", which does not exist"
        );
        respond(send, StatusCode::OK, body);
        let (req, send) = next(&mut handle).await;
        let ev = body_json(req).await;
        respond(send, StatusCode::CREATED, ev);
    });
    reconcile(obj, ctx).await.expect("reconciled");
    server.await.expect("server assertions");
}

#[tokio::test]
async fn foreign_and_decided_csrs_make_no_calls() {
    let (ctx, mut handle) = ctx(&["node1"]);
    let mut foreign = csr("csr-4", "system:node:node1", "system:node:node1", 600);
    foreign.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".into();
    assert_eq!(
        reconcile(Arc::new(foreign), ctx.clone()).await.expect("ok"),
        Action::await_change()
    );
    let mut decided = csr("csr-5", "system:ovn-node:node1", "system:node:node1", 600);
    decided.status = Some(
        k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus {
            conditions: Some(vec![condition("Approved", "AutoApproved", "x".into())]),
            certificate: None,
        },
    );
    assert_eq!(
        reconcile(Arc::new(decided), ctx).await.expect("ok"),
        Action::await_change()
    );
    let extra = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(!matches!(extra, Ok(Some(_))), "no API calls");
}

#[tokio::test]
async fn unparsable_request_is_retried_not_denied() {
    let (ctx, _handle) = ctx(&["node1"]);
    let mut bad = csr("csr-6", "system:ovn-node:node1", "system:node:node1", 600);
    bad.spec.request = k8s_openapi::ByteString(b"garbage".to_vec());
    // not ours (no CN) → ignored; a CSR with a PEM that is not a CSR is retried
    let r = reconcile(Arc::new(bad), ctx.clone()).await;
    assert!(matches!(r, Err(ApproverError::Retry { .. })), "{r:?}");
}
