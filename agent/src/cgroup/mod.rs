//! cgroup v2 reading: layout discovery, file parsers, tree scan.
//!
//! A small reader of our own over any root path, rather than a crate:
//! - `cgroups-rs` hard-codes `/sys/fs/cgroup` (it cannot read a fixture tree
//!   or a `/host/sys/fs/cgroup` mount), has no PSI API, and pulls ~177 crates;
//! - procfs's PSI parser is not a no-panic parser over arbitrary bytes, and
//!   we need one (the parsers here are property-tested on random input).
//!
//! Layers: [`parse`] (bytes → typed values, pure), [`layout`] (find kubepods
//! and name rules), [`scan`] (one read of the whole tree into a
//! [`NodeSnapshot`]).

/// Names of the cgroup v2 interface files Headroom reads.
pub mod file {
    pub const CPU_MAX: &str = "cpu.max";
    pub const CPU_STAT: &str = "cpu.stat";
    pub const CPU_PRESSURE: &str = "cpu.pressure";
    pub const CPU_WEIGHT: &str = "cpu.weight";
    pub const CPUSET_CPUS_EFFECTIVE: &str = "cpuset.cpus.effective";
    /// Present in every cgroup v2 directory: tells v2 from v1.
    pub const CONTROLLERS: &str = "cgroup.controllers";
}

pub mod cpuset;
pub mod layout;
pub mod parse;
pub mod read;
pub mod scan;
mod types;

pub use layout::{LayoutError, discover};
pub use scan::{Depth, ScanError, Scanner, mark_roles, reindex, rescan, scan};
pub use types::*;
