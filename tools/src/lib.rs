//! What ships beside the agent and is generated or run from code: the
//! Grafana dashboard ([`dashboard`], written by the `gen-dashboard` binary)
//! and the offline demo (the `headroom-demo` binary behind `scripts/demo`,
//! which runs on the test kit's control plane and simulated kubelet).

pub mod dashboard;
