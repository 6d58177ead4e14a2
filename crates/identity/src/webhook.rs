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
    addr: Option<SocketAddr>,
    stop: Arc<tokio::sync::watch::Sender<Option<Duration>>>,
}

impl ServerHandle {
    /// The bound address (`None` if binding failed; the task then returns the error).
    pub async fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Stops accepting, asks open connections to finish their in-flight request and close,
    /// and aborts what is left after `grace`.
    pub fn shutdown(&self, grace: Duration) {
        self.stop.send_replace(Some(grace));
    }
}

/// Starts the HTTPS server (HTTP/1.1 and HTTP/2 by ALPN/preface) on `addr`; returns its handle
/// and the task driving it. Every handshake uses the reloader's current certificate.
pub fn serve_tls(
    router: Router,
    addr: SocketAddr,
    certs: &CertReloader,
) -> (ServerHandle, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<Duration>);
    let stop = Arc::new(stop_tx);
    let bound = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .and_then(tokio::net::TcpListener::from_std);
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            let task = tokio::spawn(async move { Err(e) });
            return (ServerHandle { addr: None, stop }, task);
        }
    };
    let local = listener.local_addr().ok();
    let task = tokio::spawn(accept_loop(listener, router, certs.clone(), stop_rx));
    (ServerHandle { addr: local, stop }, task)
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    certs: CertReloader,
    mut stop: tokio::sync::watch::Receiver<Option<Duration>>,
) -> std::io::Result<()> {
    let mut conns = tokio::task::JoinSet::new();
    let grace = loop {
        tokio::select! {
            changed = stop.changed() => {
                let grace = if changed.is_ok() { *stop.borrow() } else { Some(Duration::ZERO) };
                if let Some(g) = grace {
                    break g;
                }
            }
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = tokio_rustls::TlsAcceptor::from(certs.server_config());
                let router = router.clone();
                let stop = stop.clone();
                conns.spawn(serve_connection(tcp, peer, acceptor, router, stop));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    };
    drop(listener);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        conns.abort_all();
    }
    Ok(())
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    mut stop: tokio::sync::watch::Receiver<Option<Duration>>,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let mut r = router.clone();
        async move { tower::Service::call(&mut r, req).await }
    });
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
    tokio::pin!(conn);
    if stop.borrow().is_some() {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            changed = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                if changed.is_err() {
                    let _ = conn.as_mut().await;
                    return;
                }
            }
        }
    }
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
