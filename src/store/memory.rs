//! TEMPORARY stub so the proxy compiles until the algorithms branch lands.
use super::{LimitCall, Peek};
use crate::algo::{Code, Decision, Params};

pub enum Clock {
    System,
}

pub struct MemoryStore;

impl MemoryStore {
    pub fn new(_max_keys: usize, _clock: Clock) -> Self {
        MemoryStore
    }
    pub fn decide(&self, calls: &[LimitCall]) -> Vec<Decision> {
        calls
            .iter()
            .map(|c| Decision {
                code: Code::Allowed,
                limit: c.params.limit,
                remaining: c.params.limit,
                retry_after_us: 0,
                reset_after_us: 0,
            })
            .collect()
    }
    pub fn peek(&self, _key: &str, p: &Params) -> Peek {
        let d = Decision {
            code: Code::Allowed,
            limit: p.limit,
            remaining: p.limit,
            retry_after_us: 0,
            reset_after_us: 0,
        };
        Peek { now: d, next: d }
    }
    pub fn reset(&self, _key: &str) {}
    pub fn sweep(&self) {}
}
