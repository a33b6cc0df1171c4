//! Sluice: an HTTP reverse-proxy gateway with built-in, distributed rate limiting.

pub mod algo;
pub mod store;
