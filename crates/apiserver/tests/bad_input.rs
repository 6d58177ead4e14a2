//! Bad input gets a proper Status error and the server keeps serving.

mod common;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(body)
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("send");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn assert_status(v: &Value, code: u16, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

#[tokio::test]
async fn bad_requests_get_status_errors_and_the_server_keeps_serving() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        b"{\"metadata\": {\"name\": ".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        b"[1,2,3]".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");

    let (code, v) = raw(
        &c,
        "GET",
        "/apis/nope.example.com/v1/widgets",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 404);
    assert_status(&v, 404, "NotFound");
    let (code, _) = raw(&c, "GET", "/api/v1/flurbs", "application/json", vec![]).await;
    assert_eq!(code, 404);

    let (code, v) = raw(
        &c,
        "GET",
        "/api/v1/nodes?labelSelector=a%20in%20(b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");
    let (code, v) = raw(
        &c,
        "GET",
        "/api/v1/nodes?fieldSelector=spec.bogus%3Dx",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");

    let big = format!(
        "{{\"metadata\":{{\"name\":\"big\"}},\"pad\":\"{}\"}}",
        "x".repeat(4 * 1024 * 1024)
    );
    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        big.into_bytes(),
    )
    .await;
    assert_eq!(code, 413);
    assert_status(&v, 413, "RequestEntityTooLarge");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        json!({"kind": "Pod", "metadata": {"name": "x"}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        json!({"metadata": {"name": "Not_A_Name"}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 422);
    assert_status(&v, 422, "Invalid");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/nodes",
        "application/json",
        json!({"metadata": {"name": "n", "labels": {"a": 5}}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 422);
    assert_status(&v, 422, "Invalid");

    let (code, v) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/nope/pods",
        "application/json",
        json!({"metadata": {"name": "p"}}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 404);
    assert_status(&v, 404, "NotFound");

    let (code, _) = raw(
        &c,
        "PATCH",
        "/api/v1/nodes/missing",
        "application/merge-patch+json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 404);
    let (code, v) = raw(
        &c,
        "PATCH",
        "/api/v1/nodes/missing",
        "text/plain",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 415);
    assert_status(&v, 415, "UnsupportedMediaType");

    // Optimistic concurrency and duplicates.
    let nodes = Api::<Node>::all(c.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node");
    let created = nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("create");
    match nodes.create(&PostParams::default(), &n).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("unexpected {other:?}"),
    }
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    match nodes.replace("n1", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("unexpected {other:?}"),
    }
    let (code, _) = raw(
        &c,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/json-patch+json",
        b"[{\"op\":\"test\",\"path\":\"/metadata/name\",\"value\":\"zz\"}]".to_vec(),
    )
    .await;
    assert_eq!(code, 422);
    let (code, _) = raw(
        &c,
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        b"not json".to_vec(),
    )
    .await;
    assert_eq!(code, 400);

    // Anonymous callers are refused, /version is public.
    // Still serving.
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    let (code, v) = raw(&c, "GET", "/version", "application/json", vec![]).await;
    assert_eq!(code, 200);
    assert_eq!(v["minor"], "33");
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");
    let nodes = Api::<Node>::all(c.clone());
    for i in 0..7 {
        let env = if i % 2 == 0 { "prod" } else { "dev" };
        let n: Node = serde_json::from_value(json!({"metadata": {"name": format!("n{i}"), "labels": {"env": env, "idx": i.to_string()}}})).expect("node");
        nodes
            .create(&PostParams::default(), &n)
            .await
            .expect("create");
    }
    let names = |l: kube::api::ObjectList<Node>| {
        l.items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("env=prod"))
                .await
                .expect("list")
        ),
        vec!["n0", "n2", "n4", "n6"]
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("env in (dev),idx notin (1)"))
                .await
                .expect("list")
        ),
        vec!["n3", "n5"]
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().labels("!env"))
                .await
                .expect("list")
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            nodes
                .list(&ListParams::default().fields("metadata.name=n3"))
                .await
                .expect("list")
        ),
        vec!["n3"]
    );
    let mut all = Vec::new();
    let mut lp = ListParams::default().limit(3);
    loop {
        let page = nodes.list(&lp).await.expect("page");
        let token = page.metadata.continue_.clone();
        all.extend(names(page));
        match token {
            Some(t) if !t.is_empty() => lp = ListParams::default().limit(3).continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(all, vec!["n0", "n1", "n2", "n3", "n4", "n5", "n6"]);
}

#[tokio::test]
async fn malformed_shapes_never_crash_the_server() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");
    let nodes = Api::<Node>::all(c.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node"),
        )
        .await
        .expect("create");
    let cases: &[(&str, &str, &str, &[u8])] = &[
        (
            "POST",
            "/api/v1/namespaces/default/services",
            "application/json",
            b"{\"metadata\":{\"name\":\"s\"},\"spec\":\"x\"}",
        ),
        (
            "POST",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            "application/json",
            b"{\"metadata\":{\"name\":\"c\"},\"spec\":[1]}",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            b"{\"metadata\":\"x\"}",
        ),
        (
            "PATCH",
            "/api/v1/nodes/n1",
            "application/json-patch+json",
            b"[{\"op\":\"replace\",\"path\":\"\",\"value\":5}]",
        ),
        (
            "PATCH",
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            b"{\"metadata\":7}",
        ),
        (
            "PATCH",
            "/api/v1/nodes/n1/status",
            "application/merge-patch+json",
            b"{\"status\":\"up\"}",
        ),
        (
            "PATCH",
            "/api/v1/nodes/new",
            "application/apply-patch+yaml",
            b"5",
        ),
        (
            "PATCH",
            "/api/v1/nodes/new?fieldManager=x",
            "application/apply-patch+yaml",
            b"metadata: [1, 2]",
        ),
        (
            "PATCH",
            "/api/v1/nodes/n1",
            "application/strategic-merge-patch+json",
            b"{\"spec\":{\"taints\":{\"$patch\":\"delete\"}},\"$retainKeys\":5}",
        ),
        (
            "POST",
            "/api/v1/namespaces",
            "application/vnd.kubernetes.protobuf",
            b"k8s\x00\x0a\xff\xff",
        ),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            "application/json",
            b"{\"spec\":5}",
        ),
        (
            "PUT",
            "/api/v1/nodes/n1",
            "application/json",
            b"{\"metadata\":{\"name\":\"other\"}}",
        ),
        (
            "DELETE",
            "/api/v1/nodes/n1",
            "application/json",
            b"{\"preconditions\": 5",
        ),
    ];
    for (method, path, ct, body) in cases {
        let (code, v) = raw(&c, method, path, ct, body.to_vec()).await;
        assert!((200..500).contains(&code), "{method} {path}: {code} {v}");
    }
    assert!(nodes.get("n1").await.is_ok(), "still serving");
}
