//! Running the packet-filter tools: `nft`, `iptables-restore`/`-save`, `ip6tables-restore`/`-save`.
//!
//! A [`Tools`] value holds resolved binary paths and, optionally, a network namespace the
//! commands run in (`ip netns exec <ns> …`, used by tests and the bench).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Errors running a tool.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(
        "`{name}` not found (looked in {searched}); install the Debian package `{package}` or pass its directory with --fwmark-bin-dir"
    )]
    Missing {
        name: String,
        package: &'static str,
        searched: String,
    },
    #[error("running {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
}

/// Which binaries a backend needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Nft,
    IptablesRestore,
    IptablesSave,
    Ip6tablesRestore,
    Ip6tablesSave,
    Ip,
}

impl Tool {
    pub fn binary(self) -> &'static str {
        match self {
            Tool::Nft => "nft",
            Tool::IptablesRestore => "iptables-restore",
            Tool::IptablesSave => "iptables-save",
            Tool::Ip6tablesRestore => "ip6tables-restore",
            Tool::Ip6tablesSave => "ip6tables-save",
            Tool::Ip => "ip",
        }
    }
    pub fn package(self) -> &'static str {
        match self {
            Tool::Nft => "nftables",
            Tool::Ip => "iproute2",
            _ => "iptables",
        }
    }
}

/// Find a binary in `dir` (when given) or else in `$PATH` plus the sbin directories.
pub fn find(tool: Tool, dir: Option<&Path>) -> Result<PathBuf, ExecError> {
    let name = tool.binary();
    let mut dirs: Vec<PathBuf> = Vec::new();
    match dir {
        Some(d) => dirs.push(d.to_path_buf()),
        None => {
            if let Some(p) = std::env::var_os("PATH") {
                dirs.extend(std::env::split_paths(&p));
            }
            for d in ["/usr/sbin", "/sbin", "/usr/local/sbin"] {
                dirs.push(PathBuf::from(d));
            }
        }
    }
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(ExecError::Missing {
        name: name.to_string(),
        package: tool.package(),
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":"),
    })
}

/// How to run commands: plain, or inside a named network namespace.
#[derive(Clone, Debug, Default)]
pub struct Runner {
    /// `ip` binary and namespace name when commands run in a netns.
    netns: Option<(PathBuf, String)>,
}

impl Runner {
    /// Commands run in the caller's network namespace.
    pub fn host() -> Self {
        Self { netns: None }
    }

    /// Commands run in network namespace `ns` via `ip netns exec`.
    pub fn in_netns(ns: impl Into<String>) -> Result<Self, ExecError> {
        Ok(Self {
            netns: Some((find(Tool::Ip, None)?, ns.into())),
        })
    }

    fn command(&self, program: &Path, args: &[OsString]) -> (Command, String) {
        let mut words: Vec<OsString> = Vec::new();
        let mut cmd = match &self.netns {
            Some((ip, ns)) => {
                let mut c = Command::new(ip);
                let pre: [OsString; 3] = ["netns".into(), "exec".into(), ns.into()];
                c.args(&pre).arg(program);
                words.push(ip.clone().into_os_string());
                words.extend(pre);
                c
            }
            None => Command::new(program),
        };
        words.push(program.as_os_str().to_owned());
        words.extend(args.iter().cloned());
        cmd.args(args);
        let text = words
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        (cmd, text)
    }

    /// Run `program args`, feeding `stdin`; return stdout, or an error with stderr.
    pub fn run(
        &self,
        program: &Path,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, ExecError> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let (mut cmd, text) = self.command(program, &args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let spawn_err = |source| ExecError::Spawn {
            cmd: text.clone(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A write error shows up as the command's own failure below.
            let _ = pipe.write_all(input);
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        if !out.status.success() {
            return Err(ExecError::Failed {
                cmd: text,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }
}
