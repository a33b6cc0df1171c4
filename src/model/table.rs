//! The compiled, immutable runtime table: what the request path reads.
//!
//! Built once per (re)load by `config::compile`, then published through an `ArcSwap`; a
//! request takes one `Arc<Table>` snapshot at its start and uses it to the end, so reloads
//! never block requests and in-flight requests finish on the table they started with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::consumer::Consumers;
use crate::model::identity::{ClientIpRules, IdentitySources};
use crate::model::path::PathRules;
use crate::model::policy::{HeadersMode, OnError, RedisMode, StoreKind};
use crate::model::route::Route;
use crate::model::tls::{ClientTls, Listener};

/// What only a restart changes: the listeners, the worker threads, the drain and header
/// deadlines, and the store. Set once at start; a reload that edits them is told so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// Data-plane listeners; their certificate lists are swapped live (the rest is boot).
    pub listeners: Vec<Listener>,
    pub admin_listen: SocketAddr,
    pub workers: usize,
    pub drain_timeout: Duration,
    pub client_header_timeout: Duration,
    /// How long a client may accept nothing of an answer before it is disconnected.
    pub send_timeout: Duration,
    pub store: StoreSettings,
}

impl Boot {
    /// The settings that differ in `next` (which waits for a restart).
    pub fn changed(&self, next: &Boot) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut check = |differs: bool, name| {
            if differs {
                v.push(name);
            }
        };
        check(!self.listeners_changed(next).is_empty(), "listen");
        check(self.admin_listen != next.admin_listen, "admin_listen");
        check(self.workers != next.workers, "workers");
        check(self.drain_timeout != next.drain_timeout, "drain_timeout");
        check(
            self.client_header_timeout != next.client_header_timeout,
            "client_header_timeout",
        );
        check(self.send_timeout != next.send_timeout, "send_timeout");
        check(self.store != next.store, "store");
        v
    }

    /// The listeners added, removed or changed (TLS, `min_version`, PROXY) in `next`, by
    /// address: the order they are written in changes nothing.
    pub fn listeners_changed(&self, next: &Boot) -> Vec<SocketAddr> {
        let shapes = |b: &Boot| b.listeners.iter().map(Listener::shape).collect::<Vec<_>>();
        let (was, now) = (shapes(self), shapes(next));
        let mut v: Vec<SocketAddr> = was
            .iter()
            .filter(|s| !now.contains(s))
            .chain(now.iter().filter(|s| !was.contains(s)))
            .map(|s| s.0)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// What reloads swap: the routing, and everything a request reads.
pub struct Table {
    /// Hash of the file's content (the `version` of `/admin/config` and `sluice_config_info`).
    pub version: String,
    pub loaded_at: SystemTime,
    pub client_ip: ClientIpRules,
    pub identities: IdentitySources,
    pub headers: HeadersMode,
    pub paths: PathRules,
    /// Upstreams as plain settings; a route names one by index. The runtime keeps the
    /// connection pools (see [`crate::runtime`]), so a reload does not drop them.
    pub upstreams: Vec<UpstreamSpec>,
    pub routes: Vec<Route>,
    pub consumers: Consumers,
}

/// One upstream's settings. Two loads with equal specs share one client (and its warm
/// keep-alive connections and round-robin position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    pub name: Arc<str>,
    /// `host:port` authorities (validated by config).
    pub targets: Vec<http::uri::Authority>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// How long an answer's body or an upgraded connection may go without a byte.
    pub idle_timeout: Duration,
    /// `Some` for `https://` targets (all of an upstream's targets share one scheme).
    pub tls: Option<ClientTls>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    pub kind: StoreKind,
    pub on_error: OnError,
    pub memory_max_keys: usize,
    pub redis: RedisSettings,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub url: Option<String>,
    pub mode: RedisMode,
    pub nodes: Vec<String>,
    pub sentinel_service: Option<String>,
    /// Resolved from `password_env` at load time.
    pub password: Option<String>,
    pub pool_size: usize,
    pub timeout: Duration,
    pub key_prefix: String,
    /// How long startup waits for the store before serving per `on_error` anyway.
    pub startup_timeout: Duration,
    /// Keep Redis's refusals locally while they certainly hold (`limiter::deny`).
    pub deny_cache: bool,
    /// `store.redis.tls` (its CA and client certificate), used with `rediss://`.
    pub tls: Option<ClientTls>,
}

impl Table {
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name.as_ref() == name)
    }
}

pub type SharedTable = Arc<arc_swap::ArcSwap<Table>>;
