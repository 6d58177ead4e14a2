//! The checked-in manifests (`manifests/identity/`), embedded, plus what an installer needs:
//! the webhook configurations with the CA bundle and the webhook address filled in.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use serde_json::Value;

/// `manifests/identity/webhooks.yaml`.
pub const WEBHOOKS_YAML: &str = include_str!("../../../manifests/identity/webhooks.yaml");
/// `manifests/identity/rbac.yaml`.
pub const RBAC_YAML: &str = include_str!("../../../manifests/identity/rbac.yaml");
/// `manifests/identity/daemonset.yaml`.
pub const DAEMONSET_YAML: &str = include_str!("../../../manifests/identity/daemonset.yaml");

/// Manifest errors.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("parsing manifest YAML: {0}")]
    Yaml(String),
    #[error("manifest object: {0}")]
    Object(#[from] serde_json::Error),
}

/// Parses a multi-document YAML manifest into JSON values.
pub fn documents(yaml: &str) -> Result<Vec<Value>, ManifestError> {
    serde_saphyr::from_multiple(yaml).map_err(|e| ManifestError::Yaml(e.to_string()))
}

/// The webhook configurations, with `caBundle` set and the URLs pointed at
/// `https://<host_port>/…` (the shipped files say `localhost:9443`).
pub fn webhook_configurations(
    ca_bundle_pem: &[u8],
    host_port: &str,
) -> Result<Vec<ValidatingWebhookConfiguration>, ManifestError> {
    let mut out = Vec::new();
    for doc in documents(WEBHOOKS_YAML)? {
        let mut vwc: ValidatingWebhookConfiguration = serde_json::from_value(doc)?;
        for hook in vwc.webhooks.iter_mut().flatten() {
            hook.client_config.ca_bundle = Some(ByteString(ca_bundle_pem.to_vec()));
            if let Some(url) = hook.client_config.url.as_mut() {
                *url = url.replacen("localhost:9443", host_port, 1);
            }
        }
        out.push(vwc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_ca_and_address() {
        let v = webhook_configurations(b"-----BEGIN CERTIFICATE-----\n", "127.0.0.1:19443")
            .expect("ok");
        assert_eq!(v.len(), 3);
        for vwc in &v {
            for h in vwc.webhooks.iter().flatten() {
                assert!(h.client_config.ca_bundle.is_some());
                let url = h.client_config.url.as_deref().unwrap_or_default();
                assert!(url.starts_with("https://127.0.0.1:19443/"), "{url}");
            }
        }
        assert!(documents(RBAC_YAML).expect("rbac").len() >= 5);
        assert_eq!(documents(DAEMONSET_YAML).expect("ds").len(), 1);
    }
}
