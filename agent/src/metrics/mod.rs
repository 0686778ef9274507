//! Prometheus metrics: the registry of every `headroom_` family and the HTTP
//! server (`/metrics`, `/healthz`, `/readyz`).

pub mod negotiate;
pub mod probe;
pub mod registry;
pub mod server;

pub use registry::{
    Direction, Metrics, NodeValues, PatchErrorClass, PodValues, ResizeResult, ScanErrorKind,
};
pub use server::{
    ConnLimits, DEFAULT_ADDR, DEFAULT_UNREADY_AFTER, Readiness, bind, serve, serve_listener,
    serve_listener_with,
};

#[cfg(test)]
mod tests;
