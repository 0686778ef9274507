//! Verification: the `cpu.max` the kubelet should have written (from the
//! spec), compared with what the kernel has; drift and resize-verification
//! state machines; inotify on cgroup directories.
//!
//! Pure parts (`expected`, `compare`, `drift`) take plain data and time as
//! arguments; only `watch` does I/O.

pub mod compare;
pub mod drift;
pub mod expected;
pub mod watch;

pub use compare::{Mismatch, Observed, PodAudit, Target, audit, audit_snapshot, compare};
pub use drift::{DEFAULT_GRACE, DriftEvent, InflightResize, PodDrift, ResizeOutcome, kubelet_done};
pub use expected::{Expected, ExpectedContainer, ExpectedMax, expected_cpu_max};
pub use watch::{CgroupWatch, WatchEvent, dirs_to_watch, watch_key};
