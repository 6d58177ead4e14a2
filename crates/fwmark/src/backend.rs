//! The backend a node uses, chosen by `--fwmark-backend`, and the removal of the other
//! backend's leftovers when switching.

use std::path::Path;

use crate::exec::{ExecError, Runner};
use crate::iptables::{IptError, IptablesBackend};
use crate::nft::{NftBackend, NftError};
use crate::plan::Desired;

/// Which packet-filter interface marks the traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// One table of ovnk's own with a verdict map per family (default).
    #[default]
    Nftables,
    /// The seed's layout: mangle chain `OVN-KUBE-SERVICE-FWMARK`.
    Iptables,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Nftables => "nftables",
            BackendKind::Iptables => "iptables",
        })
    }
}

/// Errors of either backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("nftables backend: {0}")]
    Nft(#[from] NftError),
    #[error("iptables backend: {0}")]
    Ipt(#[from] IptError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// What a sync did, for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncReport {
    Nft(crate::nft::SyncStats),
    Ipt(crate::iptables::SyncStats),
}

/// The active backend.
#[derive(Debug)]
pub enum Backend {
    Nft(NftBackend),
    Ipt(IptablesBackend),
}

impl Backend {
    /// Open the chosen backend. Missing binaries are an error here, at start.
    pub fn open(
        kind: BackendKind,
        runner: Runner,
        bin_dir: Option<&Path>,
        nft_table: &str,
    ) -> Result<Self, BackendError> {
        Ok(match kind {
            BackendKind::Nftables => Backend::Nft(NftBackend::new(runner, bin_dir, nft_table)?),
            BackendKind::Iptables => Backend::Ipt(IptablesBackend::new(runner, bin_dir)?),
        })
    }

    /// Open the chosen backend and remove what the other backend left behind (if the other's
    /// tools are installed at all; without them it cannot have left anything we could remove).
    pub fn start(
        kind: BackendKind,
        runner: Runner,
        bin_dir: Option<&Path>,
        nft_table: &str,
    ) -> Result<Self, BackendError> {
        let backend = Self::open(kind, runner.clone(), bin_dir, nft_table)?;
        match kind {
            BackendKind::Nftables => match IptablesBackend::new(runner, bin_dir) {
                Ok(mut other) => {
                    if other.cleanup()? {
                        tracing::info!("removed leftover iptables ServiceFWMark chain");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "iptables not installed, nothing to clean"),
            },
            BackendKind::Iptables => match NftBackend::new(runner, bin_dir, nft_table) {
                Ok(mut other) => {
                    if other.cleanup()? {
                        tracing::info!(
                            table = nft_table,
                            "removed leftover nftables ServiceFWMark table"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "nft not installed, nothing to clean"),
            },
        }
        Ok(backend)
    }

    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Nft(_) => BackendKind::Nftables,
            Backend::Ipt(_) => BackendKind::Iptables,
        }
    }

    /// Apply the whole desired state.
    pub fn sync(&mut self, desired: &Desired) -> Result<SyncReport, BackendError> {
        Ok(match self {
            Backend::Nft(b) => SyncReport::Nft(b.sync(desired)?),
            Backend::Ipt(b) => SyncReport::Ipt(b.sync(desired)?),
        })
    }

    /// Re-read the live ruleset at the next sync (periodic drift repair).
    pub fn resync(&mut self) {
        if let Backend::Nft(b) = self {
            b.resync();
        }
    }
}
