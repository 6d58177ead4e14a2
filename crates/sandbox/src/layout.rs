//! Names and addresses of one sandbox, all derived from its short id so two sandboxes never
//! clash and a crashed run's leftovers can be found again.
//!
//! Every network namespace is called `ok-<id>-…`. Links are created directly inside the
//! namespaces (`ip -n A link add … peer … netns B`), so no sandbox interface ever exists in the
//! root namespace and names only have to be unique inside their own namespace.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The underlay ("fabric") network every node and the external namespace sit on.
pub const FABRIC_PREFIX_LEN: u8 = 16;
/// The external namespace's address on the fabric (the nodes' default gateway).
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 1);
/// The TCP port every pod and the external namespace listen on.
pub const PROBE_PORT: u16 = 8080;
/// The pods' and management ports' MTU: Geneve adds 58 bytes and the userspace datapath does
/// not fragment.
pub const POD_MTU: u32 = 1400;
/// Underlay interface of a node, inside the node's namespace (a port of `br-phy`).
pub const NODE_UPLINK: &str = "eth0";
/// The netdev bridge whose internal port carries the node's underlay IP.
pub const PHYS_BRIDGE: &str = "br-phy";
/// The bridge inside the fabric namespace.
pub const FABRIC_BRIDGE: &str = "br0";

/// The identity of one sandbox: its directory and short id.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Layout {
    /// Absolute state directory.
    pub dir: PathBuf,
    /// Short hex id (4 characters).
    pub id: String,
}

impl Layout {
    /// A layout with a fresh random id.
    pub fn new(dir: PathBuf) -> Self {
        let id = format!("{:04x}", rand::random::<u16>());
        Self { dir, id }
    }

    /// Prefix of every network namespace this sandbox creates.
    pub fn netns_prefix(&self) -> String {
        format!("ok-{}-", self.id)
    }
    /// The fabric namespace (a Linux bridge joining the nodes' and the external underlay).
    pub fn fabric_netns(&self) -> String {
        format!("ok-{}-fabric", self.id)
    }
    /// The external namespace (stands for the world outside the cluster).
    pub fn external_netns(&self) -> String {
        format!("ok-{}-ext", self.id)
    }
    /// Node `nodeK`'s namespace.
    pub fn node_netns(&self, node: &str) -> String {
        format!("ok-{}-{node}", self.id)
    }
    /// A pod's namespace, from its uid (unique per pod object).
    pub fn pod_netns(&self, uid: &str) -> String {
        format!("ok-{}-pod-{}", self.id, short_uid(uid))
    }
    /// Node state directory (databases, sockets, logs).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }
    /// Where the pid of every started process is recorded.
    pub fn pid_dir(&self) -> PathBuf {
        self.dir.join("pids")
    }
    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    /// The embedded API server's state directory.
    pub fn apiserver_dir(&self) -> PathBuf {
        self.dir.join("apiserver")
    }
    /// The sandbox description file.
    pub fn state_file(dir: &Path) -> PathBuf {
        dir.join("sandbox.json")
    }
}

/// `node1` … `nodeN`.
pub fn node_name(k: u32) -> String {
    format!("node{k}")
}

/// The index K of `nodeK`.
pub fn node_index(name: &str) -> Option<u32> {
    name.strip_prefix("node")?.parse().ok().filter(|k| *k > 0)
}

/// Node K's underlay (and Geneve encap) address: 172.18.0.0 + 10 + K.
pub fn node_ip(k: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 18, 0, 10)) + k)
}

/// The host-side veth name of a pod inside its node's namespace (at most 15 characters).
pub fn pod_host_ifname(uid: &str) -> String {
    format!("v{}", short_uid(uid))
}

fn short_uid(uid: &str) -> String {
    let s: String = uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(10)
        .collect();
    s.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_do_not_clash() {
        let l = Layout {
            dir: "/x".into(),
            id: "ab12".into(),
        };
        assert_eq!(l.node_netns("node3"), "ok-ab12-node3");
        assert!(
            l.pod_netns("0f1e2d3c-aaaa-bbbb")
                .starts_with(&l.netns_prefix())
        );
        let ifname = pod_host_ifname("0f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff");
        assert!(ifname.len() <= 15, "{ifname}");
        assert_eq!(ifname, "v0f1e2d3caa");
        assert_eq!(node_ip(1), Ipv4Addr::new(172, 18, 0, 11));
        assert_eq!(node_ip(300), Ipv4Addr::new(172, 18, 1, 54));
        assert_eq!(node_index("node12"), Some(12));
        assert_eq!(node_index("node0"), None);
        assert_eq!(node_index("worker"), None);
    }
}
