//! Consumers and plans (API products): who holds which API keys, and which plan's limits they
//! get. Looked up by the SHA-256 of the presented key in a map built once per load, so a
//! request costs one hash and one map probe whatever the number of consumers; the file itself
//! may hold only digests, never a secret.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::limit::LimitRule;

/// A route's `consumers:` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerMode {
    /// No key, or a key of no consumer (and no `anonymous_plan`): 401.
    Required,
    /// Such a request gets the route's own limits only (or the anonymous plan).
    Optional,
}

#[derive(Debug, Clone)]
pub struct Consumer {
    pub name: Arc<str>,
    /// Index into [`Consumers::plans`].
    pub plan: usize,
}

/// A plan: its limits as compiled once (the routes with `consumers:` carry copies, tagged).
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: Arc<str>,
    pub limits: Vec<LimitRule>,
}

/// The consumers and plans of a table.
#[derive(Debug, Clone, Default)]
pub struct Consumers {
    /// In name order; a plan limit refers to its plan by index.
    pub plans: Vec<Plan>,
    pub list: Vec<Consumer>,
    /// SHA-256 of each API key → index into `list`.
    pub by_digest: HashMap<[u8; 32], usize>,
    /// The plan of a request whose key matches no consumer.
    pub anonymous: Option<usize>,
}

/// Which plan a request's limits were taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanOf {
    /// Consumer `list[i]`, on its plan.
    Consumer(usize),
    /// No consumer matched: `anonymous_plan`, keyed by the client's address.
    Anonymous(usize),
}

impl PlanOf {
    pub fn plan(self, c: &Consumers) -> usize {
        match self {
            PlanOf::Consumer(i) => c.list[i].plan,
            PlanOf::Anonymous(p) => p,
        }
    }
}

impl Consumers {
    /// The consumer holding `key`.
    pub fn find(&self, key: &str) -> Option<usize> {
        use sha2::{Digest, Sha256};
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_digest.get(&digest).copied()
    }

    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.list.iter().position(|c| &*c.name == name)
    }
}

/// The label of plan metrics for requests on the anonymous plan.
pub const ANONYMOUS: &str = "_anonymous";
