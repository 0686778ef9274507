//! testkit

pub mod agent;
pub mod certs;
pub mod control_plane;
pub mod kubelet_sim;
pub mod node_vm;
pub mod process;
pub mod workload;
