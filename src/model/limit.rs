//! A route's limits as compiled: what a limit is keyed by, what a request costs, and the
//! parameters the stores decide with.

use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::params::Params;
use super::policy::OnMissing;

/// One part of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Ip,
    ApiKey,
    User,
    Header(HeaderName),
    /// The whole route shares one counter.
    Route,
    /// The consumer whose API key the request carries (missing when none matched).
    Consumer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Static(u64),
    Header {
        name: HeaderName,
        default: u64,
        max: u64,
    },
}

/// A compiled limit of a route.
#[derive(Debug, Clone)]
pub struct LimitRule {
    pub name: Arc<str>,
    pub by: Vec<KeyPart>,
    pub params: Params,
    pub cost: Cost,
    pub shadow: bool,
    pub on_missing: OnMissing,
    /// `{prefix}{route}:{limit}:{algorithm}:`; the hashed identity follows in braces (a
    /// Redis Cluster hash tag). Rate and burst are not part of it, so editing them keeps state.
    pub key_base: String,
    /// The `RateLimit-Policy` item, computed at load (for calendar months, per request).
    pub policy: HeaderValue,
    /// `false`: never advertised in the RateLimit fields (its 429 still has Retry-After).
    pub headers: bool,
    /// A plan's limit (index into `Consumers::plans`), decided only for requests on that
    /// plan and keyed by consumer across routes; `None`: the route's own.
    pub plan: Option<usize>,
}
