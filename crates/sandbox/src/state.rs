//! `DIR/sandbox.json`: what a sandbox is made of, written by `up` before anything is created so
//! that `down` can always find (and sweep) what a crashed run left behind; and `DIR/progress`,
//! the supervisor's progress lines that `up` relays.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// The sandbox description.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxState {
    /// Directory and id.
    pub layout: Layout,
    /// Node names, `node1`…`nodeN`.
    pub nodes: Vec<String>,
    /// Lifetime of the node agents' client certificates, in seconds (the API server's minimum
    /// CSR lifetime is lowered to it when below Kubernetes' 600).
    #[serde(default = "default_cert_seconds")]
    pub node_cert_seconds: u64,
}

fn default_cert_seconds() -> u64 {
    600
}

impl SandboxState {
    /// Reads `DIR/sandbox.json`.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = Layout::state_file(dir);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (is there a sandbox in {}? start one with `ovnk sandbox up --dir {}`)",
                path.display(),
                dir.display(),
                dir.display()
            )
        })?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Writes `DIR/sandbox.json` atomically.
    pub fn save(&self) -> anyhow::Result<()> {
        let path = Layout::state_file(&self.layout.dir);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }
}

/// The supervisor's pid file.
pub fn supervisor_pid_file(dir: &Path) -> PathBuf {
    dir.join("pids").join("supervisor.pid")
}

/// The pid of a live supervisor of `dir`, if one runs.
pub fn running_supervisor(dir: &Path) -> Option<u32> {
    let pid = std::fs::read_to_string(supervisor_pid_file(dir))
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()?;
    crate::procs::alive_with(pid, &dir.to_string_lossy()).then_some(pid)
}

/// Progress lines: `step <text>`, then `ready` or `error <text>`.
pub fn progress_file(dir: &Path) -> PathBuf {
    dir.join("progress")
}

/// Appends one progress line.
pub fn progress(dir: &Path, line: &str) {
    tracing::info!("{line}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(progress_file(dir))
    {
        let _ = writeln!(f, "{line}");
    }
}
