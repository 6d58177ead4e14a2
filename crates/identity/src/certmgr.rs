//! Node certificate manager (`ovnk node`): per-node client certificate for
//! `system:ovn-node:<node>` in `system:ovn-nodes`, bootstrapped from the kubelet-like
//! bootstrap kubeconfig and rotated through CSRs.
//!
//! Behaviour (upstream `StartNodeCertificateManager` + client-go certificate manager):
//! - the stored cert lives in `<cert-dir>/ovnkube-client-current.pem` (key and cert in one file,
//!   a symlink to a timestamped file, switched atomically);
//! - at start a stored cert for another node name, or a corrupt one, is deleted so the node
//!   bootstraps again (node rename); an expired one is ignored (bootstrap again); one not yet
//!   valid is an error (clock problem);
//! - each CSR uses a new ECDSA P-256 key; `spec.expirationSeconds` = `--cert-duration`;
//! - rotation at notBefore + lifetime × U[0.7, 0.9); failures back off 2 s ×2 (jitter 0.1,
//!   5 steps), then every 32 s;
//! - a watchdog (every 10 s) returns [`CertError::Expired`] / [`CertError::NotYetValid`] when
//!   the current cert stops being valid (suspend, clock jump): the process must exit non-zero.
//!
//! The CSR API is the [`CsrApi`] trait and time is the [`Clock`] trait, so the whole flow is
//! unit-tested with a controllable clock; [`KubeCsrApi`] is the kube-rs implementation.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use tokio::sync::watch;

use crate::csr::checks::{
    KUBE_APISERVER_CLIENT_SIGNER, USAGE_CLIENT_AUTH, USAGE_DIGITAL_SIGNATURE,
};
use crate::user::{OVN_NODE_PREFIX, OVN_NODES_GROUP};

/// File name prefix (client-go FileStore, upstream pair name `ovnkube-client`).
pub const FILE_PREFIX: &str = "ovnkube-client";
/// Default `--cert-duration`.
pub const DEFAULT_CERT_DURATION: Duration = Duration::from_secs(10 * 60);

/// Certificate manager errors.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(
        "the current client certificate expired at {not_after:?} (now {now:?}); exiting so the node restarts and bootstraps again"
    )]
    Expired {
        not_after: SystemTime,
        now: SystemTime,
    },
    #[error(
        "the current client certificate is not valid before {not_before:?} (now {now:?}); is the clock right?"
    )]
    NotYetValid {
        not_before: SystemTime,
        now: SystemTime,
    },
    #[error("no client certificate obtained within {0:?}")]
    BootstrapTimeout(Duration),
    #[error("CSR {name} was denied: {message}")]
    Denied { name: String, message: String },
    #[error("CSR {name} failed: {message}")]
    Failed { name: String, message: String },
    #[error("timed out waiting for CSR {0} to be signed")]
    WaitTimeout(String),
    #[error("CSR API: {0}")]
    Api(String),
    #[error("certificate: {0}")]
    Parse(String),
    #[error("key generation: {0}")]
    Key(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A client certificate and its key (PEM) with the facts the manager needs.
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    pub cert_pem: String,
    pub key_pem: String,
    pub common_name: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for CertBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertBundle")
            .field("common_name", &self.common_name)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertBundle {
    /// Parses `cert_pem` (first CERTIFICATE block) and keeps `key_pem` as is.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        use x509_parser::prelude::FromDer;
        let block = pem::parse_many(cert_pem.as_bytes())
            .map_err(|e| CertError::Parse(e.to_string()))?
            .into_iter()
            .find(|b| b.tag() == "CERTIFICATE")
            .ok_or_else(|| CertError::Parse("no CERTIFICATE block".into()))?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(block.contents())
            .map_err(|e| CertError::Parse(e.to_string()))?;
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let to_time = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs >= 0 {
                UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
            } else {
                UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            }
        };
        let v = cert.validity();
        Ok(CertBundle {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            common_name: cn,
            not_before: to_time(v.not_before),
            not_after: to_time(v.not_after),
        })
    }

    /// Parses the combined file format (key and cert blocks in one PEM file).
    pub fn from_combined_pem(data: &str) -> Result<Self, CertError> {
        let blocks =
            pem::parse_many(data.as_bytes()).map_err(|e| CertError::Parse(e.to_string()))?;
        let mut certs = String::new();
        let mut key = None;
        for b in blocks {
            if b.tag() == "CERTIFICATE" {
                certs.push_str(&pem::encode_config(&b, lf()));
            } else if b.tag().ends_with("PRIVATE KEY") {
                key = Some(pem::encode_config(&b, lf()));
            }
        }
        let key = key.ok_or_else(|| CertError::Parse("no private key block".into()))?;
        if certs.is_empty() {
            return Err(CertError::Parse("no CERTIFICATE block".into()));
        }
        Self::from_pem(&certs, &key)
    }

    /// The combined file content: key first, then the certificate chain (client-go order).
    pub fn to_combined_pem(&self) -> String {
        let mut s = self.key_pem.clone();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s.push_str(&self.cert_pem);
        s
    }

    /// Total lifetime.
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }
}

fn lf() -> pem::EncodeConfig {
    pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF)
}

// ---------- pure helpers ----------

/// Rotation deadline: notBefore + lifetime × (0.7 + 0.2·u), `u` ∈ [0, 1).
pub fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, u: f64) -> SystemTime {
    let total = not_after.duration_since(not_before).unwrap_or_default();
    let frac = 0.7 + 0.2 * u.clamp(0.0, 1.0);
    not_before + total.mul_f64(frac)
}

/// Watchdog check: `Err` when `now` is outside [notBefore, notAfter).
pub fn check_validity(now: SystemTime, cert: &CertBundle) -> Result<(), CertError> {
    if now < cert.not_before {
        return Err(CertError::NotYetValid {
            not_before: cert.not_before,
            now,
        });
    }
    if now >= cert.not_after {
        return Err(CertError::Expired {
            not_after: cert.not_after,
            now,
        });
    }
    Ok(())
}

/// Delay before retry number `attempt` (0-based): 2 s × 2^attempt × (1 + 0.1·u) for the first
/// five, then 32 s (client-go: ExponentialBackoff{2s, ×2, jitter 0.1, 5 steps}, PollInfinite(32s)).
pub fn retry_delay(attempt: u32, u: f64) -> Duration {
    if attempt < 5 {
        Duration::from_secs(2u64 << attempt).mul_f64(1.0 + 0.1 * u.clamp(0.0, 1.0))
    } else {
        Duration::from_secs(32)
    }
}

/// What is stored in the cert dir, judged against the expected CN and the time.
#[derive(Debug, PartialEq, Eq)]
pub enum Stored {
    None,
    Usable(CertBundle),
    /// Written for another CN (node renamed): deleted; bootstrap again.
    OtherNode(String),
    /// Unparsable: deleted; bootstrap again.
    Corrupt(String),
    /// Expired: bootstrap again.
    Expired,
}

/// The `ovnk node` certificate settings.
#[derive(Debug, Clone)]
pub struct CertManagerConfig {
    pub node_name: String,
    pub cert_dir: PathBuf,
    /// `--cert-duration` (requested lifetime).
    pub cert_duration: Duration,
    /// How long the first certificate may take (upstream: 2 min).
    pub bootstrap_timeout: Duration,
    /// How long one CSR may wait to be signed (client-go: 15 min).
    pub csr_wait_timeout: Duration,
    /// Watchdog period (upstream: 10 s).
    pub watchdog_interval: Duration,
}

impl CertManagerConfig {
    pub fn new(
        node_name: impl Into<String>,
        cert_dir: impl Into<PathBuf>,
        cert_duration: Duration,
    ) -> Self {
        CertManagerConfig {
            node_name: node_name.into(),
            cert_dir: cert_dir.into(),
            cert_duration,
            bootstrap_timeout: Duration::from_secs(120),
            csr_wait_timeout: Duration::from_secs(15 * 60),
            watchdog_interval: Duration::from_secs(10),
        }
    }

    /// `system:ovn-node:<node>`.
    pub fn common_name(&self) -> String {
        format!("{OVN_NODE_PREFIX}:{}", self.node_name)
    }

    /// `<cert-dir>/ovnkube-client-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.cert_dir.join(format!("{FILE_PREFIX}-current.pem"))
    }
}

// ---------- seams ----------

/// Wall clock and sleeping, injectable for tests.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// A CSR to submit.
#[derive(Debug, Clone)]
pub struct CsrSubmission {
    /// PKCS#10 PEM.
    pub request_pem: String,
    pub signer_name: &'static str,
    pub usages: [&'static str; 2],
    pub expiration_seconds: i32,
}

/// The CSR API. `auth` is the current certificate, or `None` for the bootstrap credentials.
pub trait CsrApi: Send + Sync + 'static {
    /// Creates the CSR; returns its name.
    fn submit(
        &self,
        auth: Option<&CertBundle>,
        csr: &CsrSubmission,
    ) -> impl Future<Output = Result<String, CertError>> + Send;
    /// Waits until the CSR has a certificate (PEM) or is denied/failed.
    fn wait_signed(
        &self,
        auth: Option<&CertBundle>,
        name: &str,
    ) -> impl Future<Output = Result<String, CertError>> + Send;
}

// ---------- the manager ----------

/// The node certificate manager.
pub struct CertManager<A: CsrApi, C: Clock> {
    cfg: CertManagerConfig,
    api: A,
    clock: C,
    tx: watch::Sender<Option<Arc<CertBundle>>>,
}

impl<A: CsrApi, C: Clock> CertManager<A, C> {
    pub fn new(cfg: CertManagerConfig, api: A, clock: C) -> Self {
        let (tx, _) = watch::channel(None);
        CertManager {
            cfg,
            api,
            clock,
            tx,
        }
    }

    /// Receives every new certificate (switch the API client on change).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<CertBundle>>> {
        self.tx.subscribe()
    }

    pub fn config(&self) -> &CertManagerConfig {
        &self.cfg
    }

    /// Reads and judges the stored certificate; deletes it when it is for another node or
    /// corrupt. A not-yet-valid stored cert is an error.
    pub fn load_stored(&self) -> Result<Stored, CertError> {
        let path = self.cfg.current_path();
        let data = match std::fs::read_to_string(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Stored::None),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable client certificate; bootstrapping again");
                remove_current(&path)?;
                return Ok(Stored::Corrupt(e.to_string()));
            }
        };
        let bundle = match CertBundle::from_combined_pem(&data) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "corrupt client certificate; bootstrapping again");
                remove_current(&path)?;
                return Ok(Stored::Corrupt(e.to_string()));
            }
        };
        let expected = self.cfg.common_name();
        if bundle.common_name != expected {
            tracing::warn!(stored = %bundle.common_name, %expected, "stored client certificate is for another node name; bootstrapping again");
            remove_current(&path)?;
            return Ok(Stored::OtherNode(bundle.common_name));
        }
        match check_validity(self.clock.now(), &bundle) {
            Ok(()) => Ok(Stored::Usable(bundle)),
            Err(CertError::Expired { .. }) => Ok(Stored::Expired),
            Err(e) => Err(e),
        }
    }

    /// Ensures a usable certificate: the stored one, or a bootstrapped one (retrying with
    /// backoff up to `bootstrap_timeout`). Publishes it to subscribers.
    pub async fn start(&self) -> Result<Arc<CertBundle>, CertError> {
        if let Stored::Usable(b) = self.load_stored()? {
            tracing::info!(not_after = ?b.not_after, "using stored client certificate");
            let b = Arc::new(b);
            self.tx.send_replace(Some(b.clone()));
            return Ok(b);
        }
        let started = self.clock.now();
        let mut attempt = 0;
        loop {
            match self.request_once(None).await {
                Ok(b) => {
                    tracing::info!(not_after = ?b.not_after, "bootstrapped client certificate");
                    return Ok(b);
                }
                Err(e) => {
                    let elapsed = self.clock.now().duration_since(started).unwrap_or_default();
                    if elapsed >= self.cfg.bootstrap_timeout {
                        tracing::error!(error = %e, "bootstrap failed");
                        return Err(CertError::BootstrapTimeout(self.cfg.bootstrap_timeout));
                    }
                    let d = retry_delay(attempt, rand::rng().random::<f64>());
                    tracing::warn!(error = %e, retry_in = ?d, "bootstrap CSR failed");
                    self.clock.sleep(d).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Rotates forever; returns only with the watchdog's error (or a file-system error).
    pub async fn run(&self, mut current: Arc<CertBundle>) -> Result<(), CertError> {
        loop {
            let deadline = rotation_deadline(
                current.not_before,
                current.not_after,
                rand::rng().random::<f64>(),
            );
            tracing::info!(?deadline, "next client certificate rotation");
            // Sleep until the deadline, checking validity every watchdog interval.
            loop {
                let now = self.clock.now();
                check_validity(now, &current)?;
                let Ok(left) = deadline.duration_since(now) else {
                    break;
                };
                if left.is_zero() {
                    break;
                }
                self.clock.sleep(left.min(self.cfg.watchdog_interval)).await;
            }
            let mut attempt = 0;
            current = loop {
                let res = tokio::select! {
                    r = self.request_once(Some(&current)) => r,
                    e = self.watchdog(&current) => return Err(e),
                };
                match res {
                    Ok(b) => break b,
                    Err(e @ CertError::Io { .. }) => return Err(e),
                    Err(e) => {
                        let d = retry_delay(attempt, rand::rng().random::<f64>());
                        tracing::warn!(error = %e, retry_in = ?d, "certificate rotation failed");
                        tokio::select! {
                            _ = self.clock.sleep(d) => {}
                            e = self.watchdog(&current) => return Err(e),
                        }
                        attempt += 1;
                    }
                }
            };
            tracing::info!(not_after = ?current.not_after, "rotated client certificate");
        }
    }

    /// [`Self::start`] then [`Self::run`].
    pub async fn start_and_run(&self) -> Result<(), CertError> {
        let b = self.start().await?;
        self.run(b).await
    }

    /// Resolves with an error once `cert` stops being valid.
    async fn watchdog(&self, cert: &CertBundle) -> CertError {
        loop {
            if let Err(e) = check_validity(self.clock.now(), cert) {
                return e;
            }
            self.clock.sleep(self.cfg.watchdog_interval).await;
        }
    }

    /// One CSR round: new key, submit, wait, check, store, publish.
    async fn request_once(&self, auth: Option<&CertBundle>) -> Result<Arc<CertBundle>, CertError> {
        let (key_pem, request_pem) = new_key_and_csr(&self.cfg.common_name())?;
        let secs = i32::try_from(self.cfg.cert_duration.as_secs()).unwrap_or(i32::MAX);
        let sub = CsrSubmission {
            request_pem,
            signer_name: KUBE_APISERVER_CLIENT_SIGNER,
            usages: [USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH],
            expiration_seconds: secs,
        };
        let name = self.api.submit(auth, &sub).await?;
        tracing::info!(csr = %name, "created CSR");
        let wait = self.api.wait_signed(auth, &name);
        let cert_pem = tokio::select! {
            r = wait => r?,
            _ = self.clock.sleep(self.cfg.csr_wait_timeout) => return Err(CertError::WaitTimeout(name)),
        };
        let bundle = CertBundle::from_pem(&cert_pem, &key_pem)?;
        if bundle.common_name != self.cfg.common_name() {
            return Err(CertError::Parse(format!(
                "issued certificate has CN {:?}, expected {:?}",
                bundle.common_name,
                self.cfg.common_name()
            )));
        }
        check_validity(self.clock.now(), &bundle)?;
        write_atomically(&self.cfg, &bundle, self.clock.now())?;
        let b = Arc::new(bundle);
        self.tx.send_replace(Some(b.clone()));
        Ok(b)
    }
}

fn remove_current(path: &Path) -> Result<(), CertError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CertError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// New ECDSA P-256 key and a CSR for `cn` in `system:ovn-nodes` (PEM, PEM).
pub fn new_key_and_csr(cn: &str) -> Result<(String, String), CertError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CertError::Key(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, OVN_NODES_GROUP);
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&key)
        .map_err(|e| CertError::Key(e.to_string()))?;
    let pem = csr.pem().map_err(|e| CertError::Key(e.to_string()))?;
    Ok((key.serialize_pem(), pem))
}

/// Writes `<prefix>-<timestamp>.pem` (0600, fsync) and atomically points
/// `<prefix>-current.pem` at it; removes the previously current file.
pub fn write_atomically(
    cfg: &CertManagerConfig,
    b: &CertBundle,
    now: SystemTime,
) -> Result<(), CertError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Io { path, source }
    };
    std::fs::create_dir_all(&cfg.cert_dir).map_err(io(&cfg.cert_dir))?;
    let ts = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let file_name = format!(
        "{FILE_PREFIX}-{}-{:09}.pem",
        ts.as_secs(),
        ts.subsec_nanos()
    );
    let target = cfg.cert_dir.join(&file_name);
    let tmp = cfg.cert_dir.join(format!(".{file_name}.tmp"));
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        opts.mode(0o600);
        let mut f = opts.open(&tmp).map_err(io(&tmp))?;
        f.write_all(b.to_combined_pem().as_bytes())
            .map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, &target).map_err(io(&target))?;
    let current = cfg.current_path();
    let previous = std::fs::read_link(&current).ok();
    let link_tmp = cfg.cert_dir.join(format!(".{FILE_PREFIX}-current.pem.tmp"));
    let _ = std::fs::remove_file(&link_tmp);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&file_name, &link_tmp).map_err(io(&link_tmp))?;
    #[cfg(not(unix))]
    std::fs::copy(&target, &link_tmp)
        .map(|_| ())
        .map_err(io(&link_tmp))?;
    std::fs::rename(&link_tmp, &current).map_err(io(&current))?;
    if let Some(prev) = previous {
        let prev = cfg.cert_dir.join(prev);
        if prev != target {
            let _ = std::fs::remove_file(prev);
        }
    }
    if let Ok(dir) = std::fs::File::open(&cfg.cert_dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// A kube config that authenticates with the current certificate file (key and cert in one
/// PEM file), keeping the bootstrap config's server and CA. Use it to (re)build the node's
/// API client whenever [`CertManager::subscribe`] reports a new certificate.
pub fn config_with_cert_file(bootstrap: &kube::Config, cert_file: &Path) -> kube::Config {
    let mut cfg = bootstrap.clone();
    let path = cert_file.to_string_lossy().into_owned();
    cfg.auth_info = kube::config::AuthInfo {
        client_certificate: Some(path.clone()),
        client_key: Some(path),
        ..Default::default()
    };
    cfg
}

/// [`CsrApi`] over kube-rs: `auth = None` uses the bootstrap config; `Some` uses the current
/// certificate file in the cert dir.
#[derive(Clone)]
pub struct KubeCsrApi {
    bootstrap: kube::Config,
    cert_file: PathBuf,
}

impl std::fmt::Debug for KubeCsrApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCsrApi")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

impl KubeCsrApi {
    pub fn new(bootstrap: kube::Config, cfg: &CertManagerConfig) -> Self {
        KubeCsrApi {
            bootstrap,
            cert_file: cfg.current_path(),
        }
    }

    /// Loads the bootstrap kubeconfig (`--bootstrap-kubeconfig`).
    pub async fn bootstrap_config(path: &Path) -> Result<kube::Config, CertError> {
        let kc =
            kube::config::Kubeconfig::read_from(path).map_err(|e| CertError::Api(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| CertError::Api(e.to_string()))
    }

    fn client(&self, auth: Option<&CertBundle>) -> Result<kube::Client, CertError> {
        let cfg = match auth {
            None => self.bootstrap.clone(),
            Some(_) => config_with_cert_file(&self.bootstrap, &self.cert_file),
        };
        kube::Client::try_from(cfg).map_err(|e| CertError::Api(e.to_string()))
    }
}

impl CsrApi for KubeCsrApi {
    async fn submit(
        &self,
        auth: Option<&CertBundle>,
        csr: &CsrSubmission,
    ) -> Result<String, CertError> {
        use k8s_openapi::api::certificates::v1::{
            CertificateSigningRequest, CertificateSigningRequestSpec,
        };
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.client(auth)?);
        let obj = CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                generate_name: Some("csr-".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: k8s_openapi::ByteString(csr.request_pem.clone().into_bytes()),
                signer_name: csr.signer_name.to_string(),
                usages: Some(csr.usages.iter().map(|u| u.to_string()).collect()),
                expiration_seconds: Some(csr.expiration_seconds),
                ..Default::default()
            },
            status: None,
        };
        let created = api
            .create(&kube::api::PostParams::default(), &obj)
            .await
            .map_err(|e| CertError::Api(e.to_string()))?;
        created
            .metadata
            .name
            .ok_or_else(|| CertError::Api("created CSR has no name".into()))
    }

    async fn wait_signed(
        &self,
        auth: Option<&CertBundle>,
        name: &str,
    ) -> Result<String, CertError> {
        use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.client(auth)?);
        let done = |o: Option<&CertificateSigningRequest>| {
            o.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
                    || s.conditions.as_ref().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Denied" || c.type_ == "Failed")
                    })
            })
        };
        let obj = kube::runtime::wait::await_condition(api, name, done)
            .await
            .map_err(|e| CertError::Api(e.to_string()))?
            .ok_or_else(|| CertError::Api(format!("CSR {name} was deleted")))?;
        let status = obj.status.unwrap_or_default();
        if let Some(c) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
        {
            let message = c.message.unwrap_or_default();
            return Err(if c.type_ == "Denied" {
                CertError::Denied {
                    name: name.to_string(),
                    message,
                }
            } else {
                CertError::Failed {
                    name: name.to_string(),
                    message,
                }
            });
        }
        let cert = status.certificate.map(|c| c.0).unwrap_or_default();
        String::from_utf8(cert).map_err(|e| CertError::Parse(e.to_string()))
    }
}

/// `ovnk node` certificate flags; flatten into the node subcommand. Identity is enabled when
/// both `--bootstrap-kubeconfig` and `--cert-dir` are given.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeCertArgs {
    /// Kubeconfig with the node's bootstrap (kubelet-like) credentials used for the first CSR.
    #[arg(long, env = "OVNK_NODE_BOOTSTRAP_KUBECONFIG")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Directory for the per-node client certificate (`ovnkube-client-current.pem`).
    #[arg(long, env = "OVNK_NODE_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Requested certificate lifetime (`spec.expirationSeconds`), e.g. `10m`, `24h`, `1h30m`.
    /// Kubernetes API servers reject less than 10m.
    #[arg(long, env = "OVNK_NODE_CERT_DURATION", default_value = "10m", value_parser = parse_duration)]
    pub cert_duration: Duration,
}

impl NodeCertArgs {
    /// Whether per-node identity is configured.
    pub fn enabled(&self) -> bool {
        self.bootstrap_kubeconfig.is_some() && self.cert_dir.is_some()
    }

    /// Builds the manager for `node_name` (None when not [`Self::enabled`]), plus the bootstrap
    /// config (server and CA for the node's own client: see [`config_with_cert_file`]).
    pub async fn manager(
        &self,
        node_name: &str,
    ) -> Result<Option<(CertManager<KubeCsrApi, SystemClock>, kube::Config)>, CertError> {
        let (Some(kc), Some(dir)) = (&self.bootstrap_kubeconfig, &self.cert_dir) else {
            return Ok(None);
        };
        let cfg = CertManagerConfig::new(node_name, dir, self.cert_duration);
        let bootstrap = KubeCsrApi::bootstrap_config(kc).await?;
        let api = KubeCsrApi::new(bootstrap.clone(), &cfg);
        Ok(Some((CertManager::new(cfg, api, SystemClock), bootstrap)))
    }
}

/// Parses Go-style durations made of `<n>h`, `<n>m`, `<n>s` parts (`10m`, `1h30m`, `600s`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0u64;
    let mut num = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            num.push(ch);
            continue;
        }
        let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
        num.clear();
        let unit = match ch {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(format!("invalid duration {s:?}: unknown unit {ch:?}")),
        };
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {s:?} is too large"))?;
    }
    if !num.is_empty() {
        return Err(format!("invalid duration {s:?}: missing unit"));
    }
    if total == 0 {
        return Err("duration must be positive".into());
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
#[path = "certmgr_tests.rs"]
mod tests;
