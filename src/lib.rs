//! Sluice: an HTTP reverse-proxy gateway with built-in, distributed rate limiting.
//!
//! A request goes through one module per stage, run in order by [`pipeline`]: the route is
//! matched ([`model::route`]), the client identified ([`pipeline::identify`]), every limit
//! decided in one atomic store call ([`pipeline::admit`], [`limiter::store`], the algorithms
//! in [`limiter::algo`]), the request forwarded ([`pipeline::upstream`]), the gateway's own
//! answers rendered ([`pipeline::respond`]), then logged. Config is parsed and compiled by
//! [`config`] into an immutable [`model::table::Table`] that [`runtime::reload`] swaps
//! atomically.

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
pub mod worker;
