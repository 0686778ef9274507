//! Headroom: a node-level CPU right-sizer for Kubernetes.
//!
//! observe (cgroup, slack) → decide (policy) → act (kube) → verify (verify).

pub mod cgroup;
pub mod kube;
#[expect(
    clippy::too_many_lines,
    reason = "Metrics::new registers every family in one list, read best whole"
)]
pub mod metrics;
#[expect(
    clippy::too_many_lines,
    reason = "PodView::try_from reads a Pod in one pass, in the order of the struct"
)]
pub mod model;
pub mod names;
pub mod node_slack;
pub mod policy;
pub mod quantity;
pub mod reconcile;
#[cfg(any(test, feature = "test-kit"))]
pub mod testkit;
pub mod verify;
