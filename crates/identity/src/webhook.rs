//! The admission webhook HTTPS server: `/node`, `/pod`, `/node-owned`, `/healthz`, `/readyz`,
//! plus a plain-HTTP `/metrics` server. Handlers are thin: decode → pure check → encode.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::admission::node::NodeAdmission;
use crate::admission::owned::NodeOwnedResources;
use crate::admission::pod::{NodeLookup, PodAdmission};
use crate::admission::review::{self, Outcome};
use crate::metrics::{DenyLabels, Metrics, RequestLabels, ReviewResult, Webhook, WebhookLabels};
use crate::tls::CertReloader;

/// Node lookup that knows no nodes (used when the pod webhook runs without a node cache).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoNodes;

impl NodeLookup for NoNodes {
    fn node_subnets_annotation(&self, node: &str) -> Result<Option<String>, String> {
        Err(format!("node \"{node}\" not found"))
    }
}

/// Everything the handlers need.
pub struct WebhookState {
    pub node: NodeAdmission,
    pub pod: PodAdmission,
    pub owned: NodeOwnedResources,
    protected_labels: RwLock<Arc<BTreeSet<String>>>,
    pub nodes: Arc<dyn NodeLookup + Send + Sync>,
    pub metrics: Arc<Metrics>,
    ready: AtomicBool,
}

impl std::fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookState")
            .field("node", &self.node)
            .field("pod", &self.pod)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

impl WebhookState {
    pub fn new(
        node: NodeAdmission,
        pod: PodAdmission,
        owned: NodeOwnedResources,
        nodes: Arc<dyn NodeLookup + Send + Sync>,
        metrics: Arc<Metrics>,
    ) -> Self {
        WebhookState {
            node,
            pod,
            owned,
            protected_labels: RwLock::new(Arc::new(BTreeSet::new())),
            nodes,
            metrics,
            ready: AtomicBool::new(false),
        }
    }

    /// Replaces the TrustZone-selected label keys protected from node identities.
    pub fn set_protected_labels(&self, keys: BTreeSet<String>) {
        if let Ok(mut g) = self.protected_labels.write() {
            *g = Arc::new(keys);
        }
    }

    pub fn protected_labels(&self) -> Arc<BTreeSet<String>> {
        self.protected_labels
            .read()
            .map(|g| g.clone())
            .unwrap_or_default()
    }

    /// Marks the webhook ready (node cache synced); `/readyz` answers 200 from then on.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Runs one review end to end on a request body; returns the response body.
    pub fn handle(&self, webhook: Webhook, body: &[u8]) -> Vec<u8> {
        let start = Instant::now();
        let (uid, outcome) = match review::decode(body) {
            Err((uid, e)) => (uid, Outcome::from(e)),
            Ok(req) => {
                let res = match webhook {
                    Webhook::Node => self.node.review(&req, &self.protected_labels()),
                    Webhook::Pod => self.pod.review(&req, self.nodes.as_ref()),
                    Webhook::NodeOwned => self.owned.review(&req),
                };
                let outcome = match res {
                    Ok(v) => Outcome::from(v),
                    Err(e) => Outcome::from(e),
                };
                if let Outcome::Denied { message, .. } = &outcome {
                    tracing::info!(
                        webhook = webhook.as_str(),
                        user = %req.user_info.username,
                        operation = req.operation.as_str(),
                        resource = %req.resource.resource,
                        sub_resource = %req.sub_resource,
                        name = %req.name,
                        namespace = %req.namespace,
                        message = %message,
                        "denied"
                    );
                }
                (req.uid, outcome)
            }
        };
        if let Outcome::Invalid { message } = &outcome {
            tracing::warn!(webhook = webhook.as_str(), uid = %uid, message = %message, "malformed AdmissionReview");
        }
        let out = review::encode(&uid, &outcome);
        self.record(webhook, &outcome, start.elapsed());
        out
    }

    fn record(&self, webhook: Webhook, outcome: &Outcome, elapsed: Duration) {
        let result = match outcome {
            Outcome::Allowed => ReviewResult::Allowed,
            Outcome::Denied { .. } => ReviewResult::Denied,
            Outcome::Invalid { .. } => ReviewResult::Invalid,
        };
        self.metrics
            .requests
            .get_or_create(&RequestLabels { webhook, result })
            .inc();
        if let Some(reason) = outcome.deny_reason() {
            self.metrics
                .denies
                .get_or_create(&DenyLabels { webhook, reason })
                .inc();
        }
        self.metrics
            .latency
            .get_or_create(&WebhookLabels { webhook })
            .observe(elapsed.as_secs_f64());
    }
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn node_handler(State(s): State<Arc<WebhookState>>, body: Bytes) -> Response {
    json_response(s.handle(Webhook::Node, &body))
}

async fn pod_handler(State(s): State<Arc<WebhookState>>, body: Bytes) -> Response {
    json_response(s.handle(Webhook::Pod, &body))
}

async fn owned_handler(State(s): State<Arc<WebhookState>>, body: Bytes) -> Response {
    json_response(s.handle(Webhook::NodeOwned, &body))
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<Arc<WebhookState>>) -> (StatusCode, &'static str) {
    if s.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "node cache not synced")
    }
}

/// The webhook router (serve it over TLS with [`serve_tls`]).
pub fn router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/node", post(node_handler))
        .route("/pod", post(pod_handler))
        .route("/node-owned", post(owned_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The metrics router (`/metrics`, plain HTTP).
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    )
}

/// Handle to a running TLS server.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    handle: axum_server::Handle<SocketAddr>,
}

impl ServerHandle {
    /// The bound address (after the listener is up).
    pub async fn local_addr(&self) -> Option<SocketAddr> {
        self.handle.listening().await
    }

    /// Stops accepting and lets in-flight requests finish (up to `grace`).
    pub fn shutdown(&self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
    }
}

/// Starts the HTTPS server on `addr`; returns its handle and the task driving it.
pub fn serve_tls(
    router: Router,
    addr: SocketAddr,
    certs: &CertReloader,
) -> (ServerHandle, tokio::task::JoinHandle<std::io::Result<()>>) {
    let handle = axum_server::Handle::new();
    let server = axum_server::bind_rustls(addr, certs.rustls_config())
        .handle(handle.clone())
        .serve(router.into_make_service());
    let task = tokio::spawn(server);
    (ServerHandle { handle }, task)
}

/// Serves `/metrics` on `addr` until `shutdown` resolves.
pub async fn serve_metrics(
    metrics: Arc<Metrics>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, metrics_router(metrics))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
#[path = "webhook_tests.rs"]
mod tests;
