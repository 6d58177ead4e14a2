//! ovnk's cluster manager role (`ovnk cluster-manager`) and the sandbox's stand-ins for
//! kube-controller-manager and kube-scheduler ([`kcm`]).
//!
//! The cluster manager gives every Node a node ID, a node subnet from the cluster CIDR, a
//! transit switch port address and a gateway-router join address, and publishes them as the
//! annotations upstream OVN-Kubernetes' cluster manager writes (`k8s.ovn.org/node-id`,
//! `node-subnets`, `node-transit-switch-port-ifaddr`, `node-gateway-router-lrp-ifaddrs`).
//!
//! - [`alloc`]: the allocator, a pure core with no I/O.
//! - [`controller`]: the kube-runtime shell that feeds it Nodes and writes annotations + Events.
//! - [`leader`]: optional leader election on a Lease (`--leader-elect`).
//! - [`zone_status`]: the pure core of TrustZone status (members, `Ready`,
//!   `SelectorProtected`); [`zone_controller`]: its watcher shell, the single writer of
//!   `TrustZone.status` (docs/zones.md).
//! - [`kcm`]: EndpointSlice controller, pod GC for deleted Nodes and a trivial scheduler, used
//!   only by the sandbox (a real cluster has kube-controller-manager and kube-scheduler).

pub mod alloc;
pub mod controller;
pub mod kcm;
pub mod leader;
pub mod zone_controller;
pub mod zone_status;

pub use controller::{ClusterManagerArgs, run, run_with_client};
pub use zone_controller::{ZoneStatusConfig, run_zone_status};
