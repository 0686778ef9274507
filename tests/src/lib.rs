//! testkit

pub mod agent;
pub mod certs;
pub mod control_plane;
pub mod kubelet_sim;
pub mod manifests;
pub mod node_vm;
pub mod process;
pub mod scale;
pub mod scenario;
pub mod vpa;
pub mod workload;
