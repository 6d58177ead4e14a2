//! The HTTPS listener: TLS with optional client certificates (CN = user, O = groups), HTTP/1.1
//! and HTTP/2, persistence and garbage-collection tasks, and the in-process handle.

use crate::api::{self, Settings, State};
use crate::authz::UserInfo;
use crate::kubeconfig;
use crate::pki::{self, Ca, PkiError};
use crate::store::Store;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// State directory (CA, `state.json`, `kubeconfig`); `None` keeps everything in memory
    /// (a fresh CA each time).
    pub dir: Option<PathBuf>,
    /// Listen address; port 0 picks a free port. Loopback by default.
    pub addr: SocketAddr,
    /// Extra DNS names / IPs for the serving certificate.
    pub extra_sans: Vec<String>,
    /// Service ClusterIP range.
    pub service_cidr: ipnet::Ipv4Net,
    /// Smallest CSR `expirationSeconds` accepted (600 on a real server; lower for fast rotation tests).
    pub min_csr_expiration_seconds: u64,
    /// Watch bookmark interval.
    pub bookmark_interval: Duration,
    /// How many recent changes watches can resume from.
    pub watch_log_capacity: usize,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Write `dir/kubeconfig` (admin) on start.
    pub write_admin_kubeconfig: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            dir: None,
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            extra_sans: Vec::new(),
            service_cidr: "10.96.0.0/16"
                .parse()
                .unwrap_or_else(|_| ipnet::Ipv4Net::default()),
            min_csr_expiration_seconds: 600,
            bookmark_interval: Duration::from_secs(5),
            watch_log_capacity: 100_000,
            max_body_bytes: 3 * 1024 * 1024,
            write_admin_kubeconfig: true,
        }
    }
}

impl ServerConfig {
    /// Defaults with a state dir.
    pub fn with_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// State dir or listener I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// CA / certificates.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// TLS configuration.
    #[error("TLS: {0}")]
    Tls(String),
}

/// The admin identity written to `DIR/kubeconfig`.
pub const ADMIN_USER: &str = "kubernetes-admin";
/// The admin group.
pub const ADMIN_GROUP: &str = "system:masters";

/// A running server. Dropping it without [`ApiServer::shutdown`] aborts the tasks without a final
/// state flush.
pub struct ApiServer {
    state: Arc<State>,
    addr: SocketAddr,
    dir: Option<PathBuf>,
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn tls_config(ca: &Ca, serving: &pki::CertKey) -> Result<rustls::ServerConfig, StartError> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca_der = rustls_pki_types::CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
        .map_err(|e| StartError::Tls(e.to_string()))?;
    roots
        .add(ca_der.clone())
        .map_err(|e| StartError::Tls(e.to_string()))?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| StartError::Tls(e.to_string()))?;
    let cert = rustls_pki_types::CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())
        .map_err(|e| StartError::Tls(e.to_string()))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| StartError::Tls(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert, ca_der], key)
        .map_err(|e| StartError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

fn identity(conn: &rustls::ServerConnection) -> UserInfo {
    let Some(cert) = conn.peer_certificates().and_then(|c| c.first()) else {
        return UserInfo::anonymous();
    };
    match pki::cert_identity(cert.as_ref()) {
        Some((cn, mut groups)) if !cn.is_empty() => {
            if !groups.iter().any(|g| g == "system:authenticated") {
                groups.push("system:authenticated".into());
            }
            UserInfo {
                username: cn,
                groups,
            }
        }
        _ => UserInfo::anonymous(),
    }
}

impl ApiServer {
    /// Start serving.
    pub async fn start(cfg: ServerConfig) -> Result<Self, StartError> {
        if let Some(d) = &cfg.dir {
            std::fs::create_dir_all(d)?;
        }
        let ca = match &cfg.dir {
            Some(d) => Ca::load_or_create(d)?,
            None => {
                let tmp = std::env::temp_dir()
                    .join(format!("ovnk-apiserver-ca-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&tmp)?;
                let ca = Ca::load_or_create(&tmp);
                let _ = std::fs::remove_dir_all(&tmp);
                ca?
            }
        };
        let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
        let addr = listener.local_addr()?;
        let mut names = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "::1".to_string(),
            "kubernetes.default.svc".to_string(),
        ];
        if !addr.ip().is_unspecified() {
            names.push(addr.ip().to_string());
        }
        names.extend(cfg.extra_sans.iter().cloned());
        names.dedup();
        let serving = ca.serving_cert(&names)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&ca, &serving)?));
        let store = Store::open(cfg.dir.as_deref(), cfg.watch_log_capacity)?;
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let settings = Settings {
            service_cidr: cfg.service_cidr,
            min_csr_expiration_seconds: cfg.min_csr_expiration_seconds,
            bookmark_interval: cfg.bookmark_interval,
            max_body_bytes: cfg.max_body_bytes,
            server_addr: addr.to_string(),
        };
        let state = Arc::new(State::new(store, ca, settings, shutdown_rx.clone()));
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(
            listener,
            acceptor,
            state.clone(),
            shutdown_rx.clone(),
        ));
        tasks.spawn(persist_loop(state.clone(), shutdown_rx.clone()));
        tasks.spawn(gc_loop(state.clone(), shutdown_rx));
        let server = Self {
            state,
            addr,
            dir: cfg.dir.clone(),
            shutdown_tx,
            tasks,
        };
        if let Some(d) = &cfg.dir {
            std::fs::write(d.join("apiserver.url"), server.url())?;
            if cfg.write_admin_kubeconfig {
                let kc = server.kubeconfig_yaml(ADMIN_USER, &[ADMIN_GROUP.to_string()])?;
                std::fs::write(d.join("kubeconfig"), kc)?;
            }
        }
        tracing::info!(url = %server.url(), dir = ?cfg.dir, "embedded API server listening");
        Ok(server)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        match self.addr.ip() {
            IpAddr::V6(ip) => format!("https://[{ip}]:{}", self.addr.port()),
            IpAddr::V4(ip) if ip.is_unspecified() => {
                format!("https://127.0.0.1:{}", self.addr.port())
            }
            IpAddr::V4(ip) => format!("https://{ip}:{}", self.addr.port()),
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state dir, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.state.ca.cert_pem
    }

    /// Mint a client certificate for `user` in `groups`, signed by the sandbox CA (1 year).
    pub fn client_cert(&self, user: &str, groups: &[String]) -> Result<pki::CertKey, PkiError> {
        self.state
            .ca
            .client_cert(user, groups, time::Duration::days(365))
    }

    /// A kubeconfig (YAML) for `user` in `groups`.
    pub fn kubeconfig_yaml(&self, user: &str, groups: &[String]) -> Result<String, PkiError> {
        let ck = self.client_cert(user, groups)?;
        Ok(kubeconfig::render(
            &self.url(),
            &self.state.ca.cert_pem,
            user,
            &ck,
        ))
    }

    /// A `kube::Client` acting as `user` in `groups`.
    pub async fn client(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<kube::Client, kubeconfig::ClientError> {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let yaml = self.kubeconfig_yaml(user, &groups)?;
        kubeconfig::client_from_yaml(&yaml).await
    }

    /// A `kube::Client` in `system:masters`.
    pub async fn admin_client(&self) -> Result<kube::Client, kubeconfig::ClientError> {
        self.client(ADMIN_USER, &[ADMIN_GROUP]).await
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.current_rv()
    }

    /// How many watches were answered with an in-stream 410 Expired so far.
    pub fn expired_watches(&self) -> u64 {
        self.state
            .expired_watches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Forget the watch history: watches from older resourceVersions get `410 Expired`, as after
    /// an etcd compaction.
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// Run the CSR/Event garbage collection now.
    pub fn garbage_collect(&self) {
        api::garbage_collect(&self.state);
    }

    /// Stop serving (closing every connection and watch) and flush the state to disk.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        let _ = self.shutdown_tx.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.state.store.persist()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
        self.tasks.abort_all();
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (tcp, peer) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let state = state.clone();
                conns.spawn(async move {
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let user = identity(tls.get_ref().1);
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        let user = user.clone();
                        async move { Ok::<_, std::convert::Infallible>(api::handle(state, user, req).await) }
                    });
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Err(e) = builder.serve_connection(TokioIo::new(tls), svc).await {
                        tracing::debug!(%peer, error = %e, "connection ended with error");
                    }
                });
                while conns.try_join_next().is_some() {}
            }
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

async fn persist_loop(state: Arc<State>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = state.store.dirty.notified() => {}
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = shutdown.changed() => return,
        }
        let st = state.clone();
        match tokio::task::spawn_blocking(move || st.store.persist()).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "persisting state failed"),
            Err(e) => tracing::warn!(error = %e, "persist task failed"),
            Ok(Ok(())) => {}
        }
    }
}

async fn gc_loop(state: Arc<State>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tick.tick() => api::garbage_collect(&state),
            _ = shutdown.changed() => return,
        }
    }
}
