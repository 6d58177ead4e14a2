//! Test helpers: the embedded API server and bounded polling.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

/// Upper bound of every wait; a poll that is still false then fails the test.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub async fn server() -> (apiserver::ApiServer, kube::Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn,apiserver=warn".into()),
        )
        .with_test_writer()
        .try_init();
    apiserver::install_crypto_provider();
    let s = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let c = s.admin_client().await.expect("admin client");
    (s, c)
}

/// Polls `check` until it returns Some, or fails naming `what` after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("fixture parses")
}

pub async fn create_node(c: &kube::Client, name: &str, annotations: serde_json::Value) -> Node {
    let api: Api<Node> = Api::all(c.clone());
    api.create(
        &PostParams::default(),
        &from(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations},
        })),
    )
    .await
    .expect("create node")
}
