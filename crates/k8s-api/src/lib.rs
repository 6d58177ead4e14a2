//! Kubernetes API types of ovnk: the `k8s.ovn.org` custom resources ovnk serves or reads.
//!
//! Each kind lives in its own module and derives its CRD with kube-derive (`K::crd()`).
//! [`crd_manifests`] renders every CRD as the YAML checked in under `manifests/crds/`; a test in
//! `tests/crds_in_sync.rs` keeps the two equal.

pub mod annotations;
pub mod egress_service;
pub mod service_fwmark;
pub mod trust_zone;
pub mod watch;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every ovnk / OVN-Kubernetes custom resource.
pub const GROUP: &str = "k8s.ovn.org";

/// Errors rendering CRD manifests.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("rendering CRD {name} as YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// Every CRD defined in this crate, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        egress_service::EgressService::crd(),
        service_fwmark::ServiceFWMark::crd(),
        trust_zone::TrustZone::crd(),
        trust_zone::TunnelReport::crd(),
    ]
}

/// `(file name, YAML text)` for each CRD, as checked in under `manifests/crds/`.
pub fn crd_manifests() -> Result<Vec<(String, String)>, CrdError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| CrdError::Yaml {
                name: name.clone(),
                source,
            })?;
            Ok((format!("{name}.yaml"), yaml))
        })
        .collect()
}
