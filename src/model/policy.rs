//! The operator's policy choices, as plain enums. The config file spells them in snake_case
//! (hence the serde derives); everything else matches on them.

use serde::{Deserialize, Serialize};

/// Where limiter state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    #[default]
    Memory,
    Redis,
}

/// What a request gets when the store fails or is slower than its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    #[default]
    Allow,
    Deny,
    Local,
}

/// How the Redis store finds its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    #[default]
    Standalone,
    Cluster,
    Sentinel,
}

/// Which rate-limit response fields are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadersMode {
    #[default]
    Draft,
    Legacy,
    Both,
    None,
}

/// What a limit does when the request lacks its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    #[default]
    Ip,
    Skip,
    Reject,
}
