//! Prometheus metrics: the registry of every `headroom_` family and the HTTP
//! server (`/metrics`, `/healthz`, `/readyz`).

mod counters;
pub mod labels;
pub mod negotiate;
pub mod probe;
pub mod registry;
pub mod series;
pub mod server;

pub use labels::{Direction, LoweringEffect, PatchErrorClass, ResizeResult, ScanErrorKind};
pub use registry::Metrics;
pub use series::{NodeValues, PodValues};
pub use server::{
    ConnLimits, DEFAULT_ADDR, DEFAULT_UNREADY_AFTER, Readiness, bind, serve, serve_listener,
    serve_listener_with,
};

#[cfg(test)]
mod tests;
