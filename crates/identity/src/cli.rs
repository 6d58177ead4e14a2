//! `ovnk identity`: arguments (upstream `ovnkube-identity` flags, each also from the
//! environment) and [`run`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;

use crate::admission::node::{NodeAdmission, NodeAdmissionConfig};
use crate::admission::owned::NodeOwnedResources;
use crate::admission::pod::{PodAdmission, PodAdmissionCondition, PodAdmissionConfig};
use crate::csr::checks::{ApproverPolicy, CsrAcceptanceCondition};
use crate::metrics::Metrics;
use crate::nodecache::NodeCache;
use crate::tls::{CertReloader, TlsError, TlsMinVersion};
use crate::webhook::{WebhookState, router, serve_metrics, serve_tls};

/// `ovnk identity` flags. Flatten into the subcommand with `#[command(flatten)]`.
#[derive(clap::Args, Debug, Clone)]
pub struct IdentityArgs {
    /// Kubeconfig of the identity service (in-cluster config when absent).
    #[arg(long, env = "OVNK_IDENTITY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// API server URL; overrides the kubeconfig's server.
    #[arg(long = "k8s-apiserver", env = "OVNK_IDENTITY_K8S_APISERVER")]
    pub k8s_apiserver: Option<String>,

    /// Directory holding the webhook serving certificate (tls.crt, tls.key).
    #[arg(long, env = "OVNK_IDENTITY_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,

    /// Host the webhook listens on.
    #[arg(long, env = "OVNK_IDENTITY_WEBHOOK_HOST", default_value = "localhost")]
    pub webhook_host: String,

    /// Port the webhook listens on.
    #[arg(long, env = "OVNK_IDENTITY_WEBHOOK_PORT", default_value_t = 9443)]
    pub webhook_port: u16,

    /// Do not run the admission webhook.
    #[arg(long, env = "OVNK_IDENTITY_DISABLE_WEBHOOK")]
    pub disable_webhook: bool,

    /// Do not run the CSR approver.
    #[arg(long, env = "OVNK_IDENTITY_DISABLE_APPROVER")]
    pub disable_approver: bool,

    /// Allow the interconnect annotations (layer2-topology-version).
    #[arg(long, env = "OVNK_IDENTITY_ENABLE_INTERCONNECT")]
    pub enable_interconnect: bool,

    /// Allow the hybrid-overlay annotations.
    #[arg(long, env = "OVNK_IDENTITY_ENABLE_HYBRID_OVERLAY")]
    pub enable_hybrid_overlay: bool,

    /// Users (other than ovnkube-node identities) allowed to set the allow-listed annotations.
    /// Repeatable; comma-separated in the environment.
    #[arg(
        long = "extra-allowed-user",
        env = "OVNK_IDENTITY_EXTRA_ALLOWED_USER",
        value_delimiter = ','
    )]
    pub extra_allowed_users: Vec<String>,

    /// JSON file with extra CSR acceptance conditions
    /// (`[{"commonNamePrefix","organizations","groups","userPrefixes"}]`).
    #[arg(long, env = "OVNK_IDENTITY_CSR_ACCEPTANCE_CONDITIONS")]
    pub csr_acceptance_conditions: Option<PathBuf>,

    /// JSON file with extra pod admission conditions
    /// (`[{"commonNamePrefix","allowedPodAnnotations"}]`).
    #[arg(long, env = "OVNK_IDENTITY_POD_ADMISSION_CONDITIONS")]
    pub pod_admission_conditions: Option<PathBuf>,

    /// Address of the plain-HTTP `/metrics` endpoint (`host:port`); empty or `0` disables it.
    #[arg(long, env = "OVNK_IDENTITY_METRICS_ADDRESS", default_value = "")]
    pub metrics_address: String,

    /// Minimum TLS version of the webhook server (VersionTLS12 or VersionTLS13).
    #[arg(
        long,
        env = "OVNK_IDENTITY_TLS_MIN_VERSION",
        default_value = "VersionTLS12"
    )]
    pub tls_min_version: TlsMinVersion,

    /// ovnk: extra annotation keys node identities may not set/change/remove
    /// (k8s.ovn.org/transport-zones is always protected).
    #[arg(
        long = "protected-annotation",
        env = "OVNK_IDENTITY_PROTECTED_ANNOTATION",
        value_delimiter = ','
    )]
    pub protected_annotations: Vec<String>,

    /// ovnk: label keys (selected by TrustZones) node identities may not set/change/remove.
    #[arg(
        long = "protected-label-key",
        env = "OVNK_IDENTITY_PROTECTED_LABEL_KEY",
        value_delimiter = ','
    )]
    pub protected_label_keys: Vec<String>,

    /// ovnk: do not watch TrustZones (by default every label key a TrustZone selector reads is
    /// protected from node identities, in addition to --protected-label-key).
    #[arg(long, env = "OVNK_IDENTITY_NO_WATCH_TRUST_ZONES")]
    pub no_watch_trust_zones: bool,

    /// ovnk: `resource.group` whose objects a node identity may only write under its own name
    /// (served on `/node-owned`), e.g. tunnelreports.k8s.ovn.org.
    #[arg(
        long = "node-owned-resource",
        env = "OVNK_IDENTITY_NODE_OWNED_RESOURCE",
        value_delimiter = ','
    )]
    pub node_owned_resources: Vec<String>,

    /// How often the serving certificate files are checked for changes, in seconds.
    #[arg(long, env = "OVNK_IDENTITY_CERT_RELOAD_INTERVAL", default_value_t = 10)]
    pub cert_reload_interval: u64,
}

/// Errors of `ovnk identity`.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("--webhook-cert-dir is required unless --disable-webhook is set")]
    NoCertDir,
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("invalid --metrics-address {0:?}")]
    MetricsAddress(String),
    #[error("cannot resolve --webhook-host {host:?}: {message}")]
    Host { host: String, message: String },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("webhook server: {0}")]
    Serve(std::io::Error),
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, IdentityError> {
    let bytes = std::fs::read(path).map_err(|source| IdentityError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| IdentityError::Json {
        path: path.to_path_buf(),
        source,
    })
}

impl IdentityArgs {
    /// Node webhook configuration from the flags.
    pub fn node_config(&self) -> NodeAdmissionConfig {
        NodeAdmissionConfig {
            enable_interconnect: self.enable_interconnect,
            enable_hybrid_overlay: self.enable_hybrid_overlay,
            extra_allowed_users: self.extra_allowed_users.iter().cloned().collect(),
            protected_annotations: self.protected_annotations.iter().cloned().collect(),
        }
    }

    /// Pod webhook configuration (reads `--pod-admission-conditions`).
    pub fn pod_config(&self) -> Result<PodAdmissionConfig, IdentityError> {
        let conditions: Vec<PodAdmissionCondition> = match &self.pod_admission_conditions {
            Some(p) => read_json(p)?,
            None => Vec::new(),
        };
        Ok(PodAdmissionConfig {
            extra_allowed_users: self.extra_allowed_users.iter().cloned().collect(),
            conditions,
        })
    }

    /// Approver policy (reads `--csr-acceptance-conditions`).
    pub fn approver_policy(&self) -> Result<ApproverPolicy, IdentityError> {
        let extra: Vec<CsrAcceptanceCondition> = match &self.csr_acceptance_conditions {
            Some(p) => read_json(p)?,
            None => Vec::new(),
        };
        Ok(ApproverPolicy::with_extra(extra))
    }

    /// The metrics listen address, if enabled.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, IdentityError> {
        match self.metrics_address.trim() {
            "" | "0" => Ok(None),
            a => a
                .parse()
                .map(Some)
                .map_err(|_| IdentityError::MetricsAddress(a.to_string())),
        }
    }

    /// Resolves `--webhook-host`/`--webhook-port` (IPv4 preferred, as `localhost` usually means).
    pub async fn webhook_addr(&self) -> Result<SocketAddr, IdentityError> {
        let host = self.webhook_host.as_str();
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, self.webhook_port))
            .await
            .map_err(|e| IdentityError::Host {
                host: host.to_string(),
                message: e.to_string(),
            })?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| IdentityError::Host {
                host: host.to_string(),
                message: "no addresses".into(),
            })
    }

    /// Builds the kube client from `--kubeconfig` / `--k8s-apiserver` (or the in-cluster config).
    pub async fn kube_client(&self) -> Result<Client, IdentityError> {
        let mut cfg = match &self.kubeconfig {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .map_err(|e| IdentityError::Kubeconfig(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(
                    kc,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(|e| IdentityError::Kubeconfig(e.to_string()))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| IdentityError::Kubeconfig(e.to_string()))?,
        };
        if let Some(url) = &self.k8s_apiserver {
            cfg.cluster_url = url
                .parse()
                .map_err(|e| IdentityError::Kubeconfig(format!("--k8s-apiserver {url:?}: {e}")))?;
        }
        Ok(Client::try_from(cfg)?)
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn on_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Runs `ovnk identity` until SIGINT/SIGTERM (installs the ring CryptoProvider).
pub async fn run(args: IdentityArgs) -> Result<(), IdentityError> {
    run_until(args, shutdown_signal()).await
}

/// Runs `ovnk identity` until `shutdown` resolves (in-process use, e.g. the sandbox).
pub async fn run_until(
    args: IdentityArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), IdentityError> {
    crate::install_crypto_provider();
    let (stop_tx, stop_rx) = watch::channel(false);
    let client = args.kube_client().await?;
    let metrics = Metrics::shared();

    let (nodes, node_driver) = NodeCache::start(client.clone());
    let node_task = tokio::spawn(node_driver);
    let mut tasks = Vec::new();

    if let Some(addr) = args.metrics_addr()? {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| IdentityError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        tracing::info!(%addr, "serving metrics");
        let m = metrics.clone();
        let stop = on_shutdown(stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve_metrics(m, listener, stop).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        }));
    }

    let mut server = None;
    if !args.disable_webhook {
        let dir = args
            .webhook_cert_dir
            .as_ref()
            .ok_or(IdentityError::NoCertDir)?;
        let certs = CertReloader::from_dir(dir, args.tls_min_version).await?;
        let state = Arc::new(WebhookState::new(
            NodeAdmission::new(&args.node_config()),
            PodAdmission::new(args.pod_config()?),
            NodeOwnedResources::new(args.node_owned_resources.iter().cloned()),
            Arc::new(nodes.clone()),
            metrics.clone(),
        ));
        let fixed: BTreeSet<String> = args.protected_label_keys.iter().cloned().collect();
        state.set_protected_labels(fixed.clone());
        if !args.no_watch_trust_zones {
            let watch = crate::zonekeys::run(client.clone(), state.clone(), fixed);
            let stop = on_shutdown(stop_rx.clone());
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    _ = watch => {}
                    _ = stop => {}
                }
            }));
        }
        let addr = args.webhook_addr().await?;
        let (handle, task) = serve_tls(router(state.clone()), addr, &certs);
        tracing::info!(%addr, "serving admission webhook");
        tasks.push(tokio::spawn(certs.watch(
            Duration::from_secs(args.cert_reload_interval.max(1)),
            on_shutdown(stop_rx.clone()),
        )));
        let ready_nodes = nodes.clone();
        let ready_state = state.clone();
        let stop = on_shutdown(stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                ready = ready_nodes.wait_until_ready() => {
                    if ready {
                        ready_state.set_ready(true);
                    }
                }
                _ = stop => {}
            }
        }));
        server = Some((handle, task));
    }

    if !args.disable_approver {
        let policy = args.approver_policy()?;
        tasks.push(tokio::spawn(crate::csr::controller::run(
            client.clone(),
            policy,
            nodes.clone(),
            metrics.clone(),
            on_shutdown(stop_rx.clone()),
        )));
    }

    let server_failed = match &mut server {
        Some((_, task)) => {
            tokio::select! {
                _ = shutdown => None,
                r = task => Some(r),
            }
        }
        None => {
            shutdown.await;
            None
        }
    };
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    if let Some((handle, _)) = &server {
        handle.shutdown(Duration::from_secs(5));
    }
    node_task.abort();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    match server_failed {
        Some(Ok(Ok(()))) | None => Ok(()),
        Some(Ok(Err(e))) => Err(IdentityError::Serve(e)),
        Some(Err(join)) => Err(IdentityError::Serve(std::io::Error::other(
            join.to_string(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: IdentityArgs,
    }

    #[test]
    fn defaults_match_upstream() {
        let cli = Cli::try_parse_from(["ovnk"]).expect("parses");
        assert_eq!(cli.args.webhook_host, "localhost");
        assert_eq!(cli.args.webhook_port, 9443);
        assert!(!cli.args.disable_webhook && !cli.args.disable_approver);
        assert_eq!(cli.args.tls_min_version, TlsMinVersion::Tls12);
        assert_eq!(cli.args.metrics_addr().expect("ok"), None);
    }

    #[test]
    fn all_flags() {
        let cli = Cli::try_parse_from([
            "ovnk",
            "--kubeconfig=/k",
            "--webhook-cert-dir=/d",
            "--webhook-host=127.0.0.1",
            "--webhook-port=1234",
            "--disable-approver",
            "--enable-interconnect",
            "--enable-hybrid-overlay",
            "--extra-allowed-user=a",
            "--extra-allowed-user=b",
            "--metrics-address=127.0.0.1:9410",
            "--tls-min-version=VersionTLS13",
            "--protected-label-key=zone.example/x",
            "--node-owned-resource=tunnelreports.k8s.ovn.org",
        ])
        .expect("parses");
        let a = cli.args;
        assert_eq!(a.extra_allowed_users, vec!["a", "b"]);
        assert_eq!(a.tls_min_version, TlsMinVersion::Tls13);
        assert_eq!(
            a.metrics_addr().expect("ok"),
            Some("127.0.0.1:9410".parse().expect("addr"))
        );
        let nc = a.node_config();
        assert!(nc.enable_interconnect && nc.enable_hybrid_overlay);
        assert!(nc.extra_allowed_users.contains("b"));
    }

    #[test]
    fn every_flag_has_an_env_var() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            if arg.get_id() == "help" {
                continue;
            }
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
            assert!(
                env.starts_with("OVNK_IDENTITY_"),
                "--{} has no env var",
                arg.get_id()
            );
        }
    }

    #[test]
    fn bad_values_rejected() {
        assert!(Cli::try_parse_from(["ovnk", "--tls-min-version=VersionTLS10"]).is_err());
        assert!(Cli::try_parse_from(["ovnk", "--webhook-port=notaport"]).is_err());
        let cli = Cli::try_parse_from(["ovnk", "--metrics-address=nope"]).expect("parses");
        assert!(cli.args.metrics_addr().is_err());
    }

    #[test]
    fn condition_files() {
        let dir = tempfile::tempdir().expect("tmp");
        let csr = dir.path().join("csr.json");
        std::fs::write(&csr, r#"[{"commonNamePrefix":"system:x","organizations":["o"],"groups":["g"],"userPrefixes":["system:x"]}]"#).expect("write");
        let pod = dir.path().join("pod.json");
        std::fs::write(
            &pod,
            r#"[{"commonNamePrefix":"system:x","allowedPodAnnotations":["a/b"]}]"#,
        )
        .expect("write");
        let cli = Cli::try_parse_from([
            "ovnk",
            &format!("--csr-acceptance-conditions={}", csr.display()),
            &format!("--pod-admission-conditions={}", pod.display()),
        ])
        .expect("parses");
        assert_eq!(
            cli.args.approver_policy().expect("policy").conditions.len(),
            2
        );
        assert_eq!(cli.args.pod_config().expect("pod").conditions.len(), 1);
        std::fs::write(&pod, "garbage").expect("write");
        assert!(matches!(
            cli.args.pod_config(),
            Err(IdentityError::Json { .. })
        ));
    }

    #[tokio::test]
    async fn run_until_serves_the_webhook_without_an_api_server() {
        use crate::loadgen::{Conn, client_config, localhost_pki};
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tmp");
        let (ca, cert, key) = localhost_pki().expect("pki");
        std::fs::write(dir.path().join("tls.crt"), cert).expect("write");
        std::fs::write(dir.path().join("tls.key"), key).expect("write");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        )
        .expect("write");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let cli = Cli::try_parse_from([
            "ovnk".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--webhook-cert-dir={}", dir.path().display()),
            "--webhook-host=127.0.0.1".to_string(),
            format!("--webhook-port={port}"),
            "--enable-interconnect".to_string(),
        ])
        .expect("parses");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_until(cli.args, async move {
            let _ = rx.await;
        }));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let cfg = client_config(&[ca.as_bytes()]).expect("cfg");
        let mut conn = None;
        for _ in 0..200 {
            if let Ok(c) = Conn::connect_tls(addr, "localhost", cfg.clone()).await {
                conn = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut c = conn.expect("webhook came up");
        let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": "UPDATE", "userInfo": {"username": "system:ovn-node:node1"},
                "object": {"kind": "Node", "metadata": {"name": "node1", "annotations": {"k8s.ovn.org/layer2-topology-version": "2.0"}}},
                "oldObject": {"kind": "Node", "metadata": {"name": "node1", "annotations": {"k8s.ovn.org/layer2-topology-version": "1.0"}}}}});
        let (code, body) = c
            .request("POST", "/node", &serde_json::to_vec(&review).expect("json"))
            .await
            .expect("request");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            v["response"]["status"]["message"],
            "user: \"system:ovn-node:node1\" is not allowed to set k8s.ovn.org/layer2-topology-version on node \"node1\": k8s.ovn.org/layer2-topology-version can only be added or removed, not updated"
        );
        let (code, _) = c.request("GET", "/readyz", b"").await.expect("readyz");
        assert_eq!(code, 503, "no API server, so the node cache is not synced");
        drop(c);
        let _ = tx.send(());
        let res = task.await.expect("joined");
        assert!(res.is_ok(), "{res:?}");
    }
}
