//! Where limiter state lives: the embedded in-process store or Redis.
//!
//! Both answer the same question — "admit this request against all of these limits?" — in
//! one call, all-or-nothing: if any enforced (non-shadow) limit refuses, nothing is consumed;
//! otherwise every limit that admitted is charged (a shadow limit that refused is not).

pub mod batch;
pub mod breaker;
pub mod memory;
pub mod redis;
pub mod scripts;
mod sentinel;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::algo::{Decision, Op, Params};
use memory::MemoryStore;
use redis::RedisStore;

/// One limit of one request, as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitCall {
    /// Full store key: `{prefix}{route}:{limit}:{algorithm}:{{identity hash}}`.
    pub key: String,
    pub params: Params,
    pub cost: u64,
    /// A shadow limit is decided and counted but never refuses the request.
    pub shadow: bool,
    /// What the call does with this limit (decide, probe, charge after the answer, release or
    /// renew a concurrency lease).
    pub op: Op,
}

/// A new call id, unique in this process: names a request's concurrency leases (with the
/// Redis store's per-process prefix, across gateways) and its sliding_log entries.
pub fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether a request passes, given its limits and their decisions (in the same order): every
/// non-shadow limit must have admitted it.
pub fn request_allowed(calls: &[LimitCall], decisions: &[Decision]) -> bool {
    calls
        .iter()
        .zip(decisions)
        .all(|(c, d)| c.shadow || d.allowed())
}

/// A peek at one key without consuming: the state as a cost-0 and a cost-1 request see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek {
    /// Decision for cost 0: current `remaining` and `reset_after_us`.
    pub now: Decision,
    /// Decision for cost 1: `retry_after_us` is 0 when one more unit would pass.
    pub next: Decision,
}

/// Failures of a store call. Mapped to the route's `on_error` policy by the limit stage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out")]
    Timeout,
    #[error("store connection failed: {0}")]
    Connection(String),
    #[error("store script error: {0}")]
    Script(String),
    #[error("store circuit breaker open")]
    BreakerOpen,
}

impl StoreError {
    /// The `kind` label of `sluice_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout => "timeout",
            StoreError::Connection(_) => "connection",
            StoreError::Script(_) => "script",
            StoreError::BreakerOpen => "breaker_open",
        }
    }
}

/// The configured store behind one handle, so the limit stage and the admin API need not
/// care which it is. Cloning it clones a handle.
#[derive(Clone)]
pub enum Store {
    Memory(Arc<MemoryStore>),
    Redis(Arc<RedisStore>),
}

impl Store {
    /// The `store` label of `sluice_store_duration_seconds`.
    pub fn label(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// Decide all limits of one request atomically (see [`super`]).
    ///
    /// The future stays small (a few hundred bytes) whichever store runs: the Redis client's
    /// own call futures are about 15 KB, and inline they would make every request's future
    /// that large, plain proxy requests included; hyper and tokio move a request's future a
    /// few times before polling it, and copying 16 KB each time cost 7 % of the gateway's CPU
    /// (perf, `__memmove_avx_unaligned_erms`). Standalone and Sentinel requests wait on a
    /// queue (small); Cluster boxes its call.
    pub async fn decide(&self, calls: &[LimitCall]) -> Result<Vec<Decision>, StoreError> {
        self.decide_as(calls, next_id()).await
    }

    /// [`Store::decide`] as call `id`: the concurrency leases it takes, releases or renews
    /// are named by it (so a request's later calls reuse its first call's id).
    pub async fn decide_as(
        &self,
        calls: &[LimitCall],
        id: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.decide_as(calls, id)),
            Store::Redis(r) => RedisStore::decide_as(r, calls, id).await,
        }
    }

    pub async fn peek(&self, key: &str, params: &Params) -> Result<Peek, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.peek(key, params)),
            Store::Redis(r) => r.peek(key, params).await,
        }
    }

    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.reset(key);
                Ok(())
            }
            Store::Redis(r) => r.reset(key).await,
        }
    }

    /// Connected and not failing, as far as the client knows without a round trip.
    pub fn healthy(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(r) => r.healthy(),
        }
    }

    /// Does the store answer right now? (`/readyz`; never waits past the store timeout.)
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.ping().await,
        }
    }

    /// Give a freshly created store up to `within` to connect, then ping it (startup and
    /// `sluice check --connect`).
    pub async fn wait_ready(&self, within: Duration) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.wait_connected(within).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::store::memory::Clock;

    /// Every request's future contains this one: it must stay small whichever store is
    /// configured (the type is the same for both), or every request pays for copying it.
    #[test]
    fn the_decision_future_stays_small() {
        let store = Store::Memory(Arc::new(MemoryStore::new(16, Clock::System)));
        let calls = [];
        let fut = store.decide(&calls);
        assert!(
            std::mem::size_of_val(&fut) <= 512,
            "Store::decide's future is {} bytes: box the large branch",
            std::mem::size_of_val(&fut)
        );
    }
}
