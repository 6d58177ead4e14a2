//! The kernel side in the node's network namespace: management port address, MTU and
//! checksum offload, the route to the cluster network through OVN, IP forwarding, and the
//! SNAT table. Every command runs through `ip netns exec NAME` when a namespace is given.

use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use crate::plan::{KernelDesired, MGMT_PORT, NFT_TABLE};

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("running {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("management port {MGMT_PORT} does not exist yet")]
    NoMgmtPort,
}

/// Runs commands in the node's namespace.
#[derive(Clone, Debug, Default)]
pub struct Kernel {
    netns: Option<String>,
}

impl Kernel {
    /// Commands run in `netns` (or the current namespace).
    pub fn new(netns: Option<String>) -> Self {
        Self { netns }
    }

    /// Runs `program args` (with `stdin`), returning stdout.
    pub fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, KernelError> {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args);
        let text = format!(
            "{}{program} {}",
            self.netns
                .as_ref()
                .map(|n| format!("ip netns exec {n} "))
                .unwrap_or_default(),
            args.join(" ")
        );
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let spawn = |source| KernelError::Spawn {
            cmd: text.clone(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(input.as_bytes());
        }
        let out = child.wait_with_output().map_err(spawn)?;
        if !out.status.success() {
            return Err(KernelError::Failed {
                cmd: text,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The address (with prefix) configured on some interface that equals `ip`.
    pub fn find_ifaddr(&self, ip: IpAddr) -> Option<IpNet> {
        let out = self.run("ip", &["-j", "addr", "show"], None).ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v.as_array()?.iter().find_map(|link| {
            link.get("addr_info")?.as_array()?.iter().find_map(|a| {
                let local: IpAddr = a.get("local")?.as_str()?.parse().ok()?;
                let len = u8::try_from(a.get("prefixlen")?.as_u64()?).ok()?;
                (local == ip).then(|| IpNet::new(ip, len).ok()).flatten()
            })
        })
    }

    /// Makes the kernel side match `want` (idempotent).
    pub fn apply(&self, want: &KernelDesired) -> Result<(), KernelError> {
        if self
            .run("ip", &["link", "show", "dev", MGMT_PORT], None)
            .is_err()
        {
            return Err(KernelError::NoMgmtPort);
        }
        let mtu = want.mtu.to_string();
        self.run(
            "ip",
            &[
                "link",
                "set",
                "dev",
                MGMT_PORT,
                "address",
                &want.mgmt_mac,
                "mtu",
                &mtu,
                "up",
            ],
            None,
        )?;
        self.run(
            "ip",
            &[
                "addr",
                "replace",
                &want.mgmt_ip.to_string(),
                "dev",
                MGMT_PORT,
            ],
            None,
        )?;
        self.run(
            "ip",
            &[
                "route",
                "replace",
                &want.cluster_cidr.to_string(),
                "via",
                &want.router_ip.to_string(),
                "dev",
                MGMT_PORT,
                "mtu",
                &mtu,
            ],
            None,
        )?;
        self.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"], None)?;
        // The userspace datapath forwards CHECKSUM_PARTIAL packets with bad checksums.
        if let Err(e) = self.run("ethtool", &["-K", MGMT_PORT, "tx", "off"], None) {
            tracing::warn!(error = %e, "could not turn tx checksum offload off on the management port");
        }
        // Replace ovnk's own table atomically; other tables are never touched.
        let mut script = format!("table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n");
        script.push_str(&want.nft);
        self.run("nft", &["-f", "-"], Some(&script))?;
        Ok(())
    }
}
