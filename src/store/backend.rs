//! The configured store behind one handle, so the limit stage and the admin API need not
//! care which it is.

use std::sync::Arc;
use std::time::Duration;

use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::{LimitCall, Peek, StoreError};
use crate::algo::{Decision, Params};

pub enum Backend {
    Memory(Arc<MemoryStore>),
    Redis(Arc<RedisStore>),
}

impl Backend {
    /// The `store` label of `sluice_store_duration_seconds`.
    pub fn label(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
        }
    }

    /// Decide all limits of one request atomically (see [`super`]).
    pub async fn decide(&self, calls: &[LimitCall]) -> Result<Vec<Decision>, StoreError> {
        match self {
            Backend::Memory(m) => Ok(m.decide(calls)),
            Backend::Redis(r) => r.decide(calls).await,
        }
    }

    pub async fn peek(&self, key: &str, params: &Params) -> Result<Peek, StoreError> {
        match self {
            Backend::Memory(m) => Ok(m.peek(key, params)),
            Backend::Redis(r) => r.peek(key, params).await,
        }
    }

    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => {
                m.reset(key);
                Ok(())
            }
            Backend::Redis(r) => r.reset(key).await,
        }
    }

    /// Does the store answer right now? (`/readyz`; never waits past the store timeout.)
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(r) => r.ping().await,
        }
    }

    /// Give a freshly created store up to `within` to connect, then ping it (startup and
    /// `sluice check --connect`).
    pub async fn wait_ready(&self, within: Duration) -> Result<(), StoreError> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(r) => r.wait_connected(within).await,
        }
    }
}
