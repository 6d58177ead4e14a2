//! CSR approver: pure checks ([`checks`]) and the kube-rs controller ([`controller`]).

pub mod checks;
pub mod controller;
