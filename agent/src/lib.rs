//! Headroom: a node-level CPU right-sizer for Kubernetes.
//!
//! observe (cgroup, slack) → decide (policy) → act (kube) → verify (verify).

pub mod cgroup;
pub mod kube;
pub mod metrics;
pub mod model;
pub mod names;
pub mod policy;
pub mod quantity;
pub mod reconcile;
pub mod signal;
#[cfg(any(test, feature = "test-kit"))]
pub mod testkit;
pub mod verify;
