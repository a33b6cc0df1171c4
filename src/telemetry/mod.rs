//! What the gateway tells operators: Prometheus metrics (handles resolved once per table) and
//! logs (written off the request path).

pub mod logging;
pub mod metrics;
