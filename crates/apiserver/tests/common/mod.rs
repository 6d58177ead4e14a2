//! Shared helpers for the integration tests: a server in a temp dir, clients for any identity,
//! bounded waiting (never a timing assertion), kubectl.
#![allow(dead_code)]

use apiserver::{ApiServer, ServerConfig};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Sandbox {
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
}

pub fn init() {
    apiserver::install_crypto_provider();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn start() -> Sandbox {
    start_with(|c| c).await
}

pub async fn start_with(f: impl FnOnce(ServerConfig) -> ServerConfig) -> Sandbox {
    init();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = f(ServerConfig::with_dir(dir.path()));
    let server = ApiServer::start(cfg).await.expect("start server");
    Sandbox { server, dir }
}

/// Poll `check` until it returns Some, failing the test after a generous bound.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("gave up waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn kubectl_path() -> PathBuf {
    let p = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/kubectl"));
    if !p.exists() {
        panic!(
            "kubectl not found at {} (set KUBECTL or install kubectl; CI installs it)",
            p.display()
        );
    }
    p
}

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(kubectl_path());
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp")))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn kubectl");
    if let Some(mut si) = child.stdin.take() {
        if let Some(s) = stdin {
            si.write_all(s.as_bytes()).await.expect("write stdin");
        }
        drop(si);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("kubectl hung")
        .expect("kubectl output");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}
