//! Sluice: an HTTP reverse-proxy gateway with built-in, distributed rate limiting.
//!
//! A request goes through one module per stage: [`route`] (match) → [`identify`] →
//! [`limit`] (one atomic [`store`] call deciding every [`algo`] limit) → [`forward`] →
//! [`respond`] → log (in [`proxy`], which runs the phases). Config is parsed and compiled by
//! [`config`] into an immutable [`table::Table`] that [`reload`] swaps atomically.

pub mod admin;
pub mod alloc;
pub mod config;
pub mod limiter;
pub mod model;
pub mod net;
pub mod pipeline;
pub mod runtime;
pub mod telemetry;
pub mod tls;
