//! The configured store behind one handle, so the limit stage and the admin API need not
//! care which it is.

use std::sync::Arc;

use super::memory::MemoryStore;
use super::{LimitCall, Peek, StoreError};
use crate::algo::{Decision, Params};

pub enum Backend {
    Memory(Arc<MemoryStore>),
}

impl Backend {
    /// The `store` label of `sluice_store_duration_seconds`.
    pub fn label(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
        }
    }

    /// Decide all limits of one request atomically (see [`super`]).
    pub async fn decide(
        &self,
        calls: &[LimitCall],
        _request_id: &str,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            Backend::Memory(m) => Ok(m.decide(calls)),
        }
    }

    pub async fn peek(&self, key: &str, params: &Params) -> Result<Peek, StoreError> {
        match self {
            Backend::Memory(m) => Ok(m.peek(key, params)),
        }
    }

    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => {
                m.reset(key);
                Ok(())
            }
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Backend::Memory(_) => Ok(()),
        }
    }
}
