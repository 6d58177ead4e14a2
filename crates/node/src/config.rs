//! Command-line flags of `ovnk node` (every flag also readable from the environment).

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::Ipv4Net;

/// Flags of `ovnk node`.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Name of the Node object this agent serves.
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// Kubeconfig file; without it, kube's defaults ($KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The node's own OVN Northbound database.
    #[arg(
        long,
        env = "OVNK_NB_ADDRESS",
        default_value = "unix:/var/run/ovn/ovnnb_db.sock"
    )]
    pub nb_address: String,
    /// The node's own OVN Southbound database.
    #[arg(
        long,
        env = "OVNK_SB_ADDRESS",
        default_value = "unix:/var/run/ovn/ovnsb_db.sock"
    )]
    pub sb_address: String,
    /// The node's local Open_vSwitch database.
    #[arg(
        long,
        env = "OVNK_OVS_ADDRESS",
        default_value = "unix:/var/run/openvswitch/db.sock"
    )]
    pub ovs_address: String,
    /// Named network namespace for the kernel-side work (`ip netns exec NAME …`); default:
    /// the agent's own namespace.
    #[arg(long, env = "OVNK_NETNS")]
    pub netns: Option<String>,
    /// Geneve encapsulation IP; default: the Node's InternalIP.
    #[arg(long, env = "OVNK_ENCAP_IP")]
    pub encap_ip: Option<IpAddr>,
    /// Underlay interface egress traffic leaves by and is SNATed on (the sandbox uses br-phy).
    #[arg(long, env = "OVNK_GATEWAY_INTERFACE")]
    pub gateway_interface: Option<String>,
    /// MTU of the management port and the pod interfaces (geneve adds 58 bytes).
    #[arg(long, env = "OVNK_MTU", default_value_t = 1400)]
    pub mtu: u32,
    /// The cluster's pod network.
    #[arg(long, env = "OVNK_CLUSTER_CIDR", default_value = "10.244.0.0/16")]
    pub cluster_cidr: Ipv4Net,
    /// The transit switch network (node transit IPs are allocated from it).
    #[arg(long, env = "OVNK_TRANSIT_CIDR", default_value = "100.88.0.0/16")]
    pub transit_cidr: Ipv4Net,
    /// The join network (gateway-router join IPs are allocated from it).
    #[arg(long, env = "OVNK_JOIN_CIDR", default_value = "100.64.0.0/16")]
    pub join_cidr: Ipv4Net,
    /// Skip all kernel-side work (management port address, routes, sysctl, nftables).
    #[arg(long, env = "OVNK_NO_KERNEL", default_value_t = false)]
    pub no_kernel: bool,
    /// Zone enforcements (not a flag: only tests turn one off, to prove the other suffices).
    #[arg(skip)]
    pub enforcement: crate::plan::Enforcement,
}
