//! Kubeconfig rendering and `kube::Client` construction for any identity.

use crate::pki::{CertKey, PkiError};
use base64::Engine;

/// Client construction failures.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Minting the certificate failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The kubeconfig did not parse.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The client could not be built.
    #[error("client: {0}")]
    Client(#[from] kube::Error),
}

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Render a kubeconfig (YAML) for `user` with its client certificate.
pub fn render(server: &str, ca_pem: &str, user: &str, ck: &CertKey) -> String {
    let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ovnk-sandbox\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {u}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: ovnk-sandbox\n  context:\n    cluster: ovnk-sandbox\n    user: {u}\n    namespace: default\ncurrent-context: ovnk-sandbox\npreferences: {{}}\n",
        server = q(server),
        ca = b(ca_pem),
        u = q(user),
        cert = b(&ck.cert_pem),
        key = b(&ck.key_pem),
    )
}

/// Build a client from kubeconfig YAML.
pub async fn client_from_yaml(yaml: &str) -> Result<kube::Client, ClientError> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Mint a kubeconfig for `user`/`groups` from a state dir (its CA and `apiserver.url`), without a
/// running server. `server` overrides the URL.
pub fn from_dir(
    dir: &std::path::Path,
    user: &str,
    groups: &[String],
    server: Option<&str>,
) -> Result<String, PkiError> {
    let ca = crate::pki::Ca::load_or_create(dir)?;
    let url = match server {
        Some(s) => s.to_string(),
        None => std::fs::read_to_string(dir.join("apiserver.url"))?
            .trim()
            .to_string(),
    };
    let ck = ca.client_cert(user, groups, time::Duration::days(365))?;
    Ok(render(&url, &ca.cert_pem, user, &ck))
}
