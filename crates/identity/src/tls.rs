//! Server TLS: rustls (ring) configuration from `tls.crt`/`tls.key`, and hot reload from disk.
//!
//! Reload swaps the `ServerConfig` used for *new* handshakes; established connections keep
//! their session, so nothing is dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::Mutex;

/// TLS errors.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no certificate found in {0}")]
    NoCertificate(PathBuf),
    #[error("parsing PEM in {path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("unknown TLS version {0:?} (use VersionTLS12, VersionTLS13, 1.2 or 1.3)")]
    Version(String),
}

/// Minimum TLS version (`--tls-min-version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMinVersion {
    #[default]
    Tls12,
    Tls13,
}

impl std::str::FromStr for TlsMinVersion {
    type Err = TlsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "VersionTLS12" | "1.2" | "TLS12" | "tls12" => Ok(TlsMinVersion::Tls12),
            "VersionTLS13" | "1.3" | "TLS13" | "tls13" => Ok(TlsMinVersion::Tls13),
            other => Err(TlsError::Version(other.to_string())),
        }
    }
}

impl std::fmt::Display for TlsMinVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMinVersion::Tls12 => "VersionTLS12",
            TlsMinVersion::Tls13 => "VersionTLS13",
        })
    }
}

/// Builds a rustls server config (ring provider, HTTP/2 and HTTP/1.1 ALPN).
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    min: TlsMinVersion,
    cert_path: &Path,
    key_path: &Path,
) -> Result<ServerConfig, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_path_buf(),
        message: e.to_string(),
    })?;
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min {
        TlsMinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Serving certificate loaded from `<dir>/tls.crt` and `<dir>/tls.key`, reloadable.
#[derive(Clone)]
pub struct CertReloader {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_path", &self.inner.cert_path)
            .field("key_path", &self.inner.key_path)
            .field("min", &self.inner.min)
            .finish_non_exhaustive()
    }
}

struct Inner {
    cert_path: PathBuf,
    key_path: PathBuf,
    min: TlsMinVersion,
    config: std::sync::RwLock<Arc<ServerConfig>>,
    last: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl CertReloader {
    /// Loads `<dir>/tls.crt` and `<dir>/tls.key`.
    pub async fn from_dir(dir: &Path, min: TlsMinVersion) -> Result<Self, TlsError> {
        Self::from_files(&dir.join("tls.crt"), &dir.join("tls.key"), min).await
    }

    pub async fn from_files(
        cert_path: &Path,
        key_path: &Path,
        min: TlsMinVersion,
    ) -> Result<Self, TlsError> {
        let (cert, key) = read_pair(cert_path, key_path).await?;
        let cfg = server_config(&cert, &key, min, cert_path, key_path)?;
        Ok(CertReloader {
            inner: Arc::new(Inner {
                cert_path: cert_path.to_path_buf(),
                key_path: key_path.to_path_buf(),
                min,
                config: std::sync::RwLock::new(Arc::new(cfg)),
                last: Mutex::new((cert, key)),
            }),
        })
    }

    /// The current server config; the listener takes it for every new handshake.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        match self.inner.config.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads the files; swaps the config when they changed. Returns whether it swapped.
    /// A broken new pair (e.g. a half-written key) is reported and the old config kept.
    pub async fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let i = &self.inner;
        let (cert, key) = read_pair(&i.cert_path, &i.key_path).await?;
        let mut last = i.last.lock().await;
        if last.0 == cert && last.1 == key {
            return Ok(false);
        }
        let cfg = server_config(&cert, &key, i.min, &i.cert_path, &i.key_path)?;
        match i.config.write() {
            Ok(mut g) => *g = Arc::new(cfg),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(cfg),
        }
        *last = (cert, key);
        tracing::info!(cert = %i.cert_path.display(), "reloaded webhook serving certificate");
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown` resolves.
    pub async fn watch(self, interval: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.reload_if_changed().await {
                        tracing::warn!(error = %e, "webhook certificate reload failed; keeping the current one");
                    }
                }
            }
        }
    }
}

async fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |p: &Path| {
        let p = p.to_path_buf();
        async move {
            tokio::fs::read(&p)
                .await
                .map_err(|source| TlsError::Read { path: p, source })
        }
    };
    Ok((read(cert_path).await?, read(key_path).await?))
}
