//! `ovnk node`: the node agent of an OVN Interconnect cluster (one node per zone).
//!
//! Functional core, thin shell:
//! - [`snapshot`] turns Node and Pod objects into plain data (bad annotations become errors
//!   on the node, never panics);
//! - [`plan`] is pure: `(Snapshot, LocalNode) -> Desired`;
//! - [`apply`] diffs the desired state against the OVSDB replicas into at most one
//!   transaction per database;
//! - [`kernel`] programs the node's network namespace;
//! - [`trust_zones`] keeps TrustZone membership (a zone source) in step with the stores;
//! - [`tunnels`] maps the geneve tunnels of the local OVS to peers and writes the TunnelReport;
//! - [`run`] is the shell: watches, debounced reconciles, annotations, Events.
//!
//! See docs/node.md for the records written and the reconcile order.

pub mod apply;
pub mod config;
pub mod kernel;
pub mod plan;
pub mod run;
pub mod snapshot;
pub mod trust_zones;
pub mod tunnels;

pub use config::NodeArgs;
pub use run::{Extensions, run, run_with, run_with_extensions};
