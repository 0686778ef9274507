//! cgroup v2 reading: layout discovery, file parsers, tree scan.

mod types;

pub use types::*;
