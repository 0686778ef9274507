//! Prometheus metrics: the registry of every `headroom_` family and the HTTP
//! server (`/metrics`, `/healthz`, `/readyz`).
