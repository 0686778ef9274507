//! The workload of the benefit benchmark (docs/benefit.md): a
//! latency-sensitive HTTP service whose requests each burn a fixed amount of
//! CPU *time*, and an open-loop load generator that follows a bursty
//! schedule and records coordinated-omission-corrected latency histograms.
//!
//! Pure logic lives here (schedule, recording, HTTP framing) so it is unit
//! tested; the binaries are thin I/O shells around it.

pub mod agent_log;
pub mod analysis;
pub mod args;
pub mod burn;
pub mod http;
pub mod koordlet;
pub mod load;
pub mod matrix;
pub mod record;
pub mod schedule;
pub mod serve;
pub mod stats;
pub mod summary;
