//! An embedded Kubernetes-API-compatible server: **a development and test component** for the
//! ovnk sandbox and integration tests. It is never a production dependency: nothing outside
//! tests, benches and the `ovnk sandbox` subcommands may depend on it.
//!
//! It speaks the REST API for the kinds ovnk uses (Nodes, Namespaces, Pods, Services, Events,
//! EndpointSlices, NetworkPolicies, CSRs, Leases, RBAC, ValidatingWebhookConfigurations, CRDs and
//! the custom resources they define) faithfully enough for kube-rs watchers/controllers and the
//! real `kubectl`: watches with resourceVersions, bookmarks and in-stream 410s, optimistic
//! concurrency, patches, status subresources, discovery, OpenAPI v3, Table output, client-cert
//! authentication, RBAC, the Node authorizer, NodeRestriction, validating webhooks and a CSR
//! signer. See `docs/apiserver.md`.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! apiserver::install_crypto_provider();
//! let dir = tempfile::tempdir()?;
//! let server = apiserver::ApiServer::start(apiserver::ServerConfig::with_dir(dir.path())).await?;
//! let admin = server.admin_client().await?;
//! let node1 = server.client("system:node:node1", &["system:nodes"]).await?;
//! # let _ = (admin, node1);
//! server.shutdown().await?;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod api;
pub mod authz;
pub mod cel;
pub mod cli;
pub mod discovery;
pub mod error;
pub mod kubeconfig;
pub mod patch;
pub mod pki;
pub mod proto;
pub mod registry;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod timeutil;

pub use authz::UserInfo;
pub use error::ApiError;
pub use server::{ADMIN_GROUP, ADMIN_USER, ApiServer, ServerConfig, StartError};

/// Install rustls' ring provider as the process default (kube's client needs one); harmless if
/// one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
