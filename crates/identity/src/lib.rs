//! ovnk node identity (seed 002): admission webhook, CSR approver and node certificate manager.
//!
//! The crate is split into a functional core and thin shells:
//!
//! - [`admission`]: pure admission checks for `nodes`, `nodes/status`, `pods/status` and
//!   node-owned objects, plus AdmissionReview v1 decoding and encoding.
//! - [`csr`]: pure CSR approval checks ([`csr::checks`]) and the kube-rs approver controller
//!   ([`csr::controller`]).
//! - [`webhook`]: the HTTPS server (axum + rustls/ring) with certificate reload and metrics.
//! - [`certmgr`]: the node certificate manager used by `ovnk node`.
//! - [`cli`]: `ovnk identity` arguments and [`cli::run`].
//!
//! Upstream compatibility target: ovn-kubernetes release-1.3 (see `docs/identity.md`).

pub mod admission;
pub mod bare;
pub mod certmgr;
pub mod cli;
pub mod csr;
pub mod dns;
pub mod loadgen;
pub mod manifests;
pub mod metrics;
pub mod nodecache;
pub mod tls;
pub mod user;
pub mod webhook;
pub mod zonekeys;

/// Installs the ring rustls `CryptoProvider` as the process default (idempotent).
///
/// Call this first thing in `main` and in every test that makes TLS connections.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod manifests_tests;
