//! ServiceFWMark on the node: mark a Service's traffic with a firewall mark.
//!
//! - [`mark`]: mark values, the node mask, reserved bits;
//! - [`plan`]: the pure plan (snapshot → desired marks, snapshot → status conditions);
//! - [`index`]: Kubernetes objects → plan snapshot (pure);
//! - [`nft`] and [`iptables`]: the two backends, each applying the whole desired state
//!   atomically and owning only its own table/chain;
//! - [`backend`]: choosing a backend, and removing the other one's leftovers;
//! - [`exec`]: running `nft`/`iptables-restore` (optionally inside a network namespace);
//! - [`controller`] and [`status`]: kube-rs shells for the node agent and the status writer;
//! - [`config`]: the command-line flags.
//!
//! See `docs/fwmark.md`.

pub mod backend;
pub mod config;
pub mod controller;
pub mod exec;
pub mod index;
pub mod iptables;
pub mod mark;
pub mod nft;
pub mod plan;
pub mod status;
pub mod testbed;

pub use backend::{Backend, BackendKind};
pub use config::FwmarkArgs;
pub use controller::{run_node, run_node_with};
pub use status::run_status_writer;
