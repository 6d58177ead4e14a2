//! `ovnk sandbox`: a multi-node OVN Interconnect cluster on one machine, made of real parts.
//!
//! Each node is a network namespace with its own ovs-vswitchd (userspace datapath) and its own
//! NB/SB/Open_vSwitch ovsdb-servers, ovn-northd and ovn-controller (in the root namespace, on
//! unix sockets under the node's directory); pods are network namespaces wired into the node's
//! `br-int`, and traffic between nodes crosses real Geneve tunnels over a fabric bridge. The
//! embedded Kubernetes API server, the cluster manager, one `ovnk node` agent per node, a
//! minimal kubelet/CNI and the kube-controller-manager share complete the cluster.
//!
//! See `docs/sandbox.md` for the layout, the addresses and the commands.

pub mod cli;
pub mod controllers;
pub mod demo;
pub mod kubelet;
pub mod layout;
pub mod netns;
pub mod probe;
pub mod procs;
pub mod report;
pub mod stack;
pub mod state;
pub mod supervisor;
