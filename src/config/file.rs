//! The YAML file as written by operators: plain serde structs, `deny_unknown_fields`
//! everywhere so typos are errors. Values that need checking (durations, rates, CIDRs,
//! regexes, polymorphic `by` and `cost`) stay raw here and are checked in `compile`, where
//! their position in the file is known.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::consumer::ConsumerMode;
use crate::model::path::EscapedSlashes;
use crate::model::policy::{HeadersMode, OnError, OnMissing, RedisMode, StoreKind};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    #[serde(default)]
    pub listen: Listen,
    #[serde(default = "d_admin_listen")]
    pub admin_listen: String,
    #[serde(default)]
    pub workers: usize,
    #[serde(default = "d_drain")]
    pub drain_timeout: String,
    #[serde(default = "d_header_timeout")]
    pub client_header_timeout: String,
    #[serde(default = "d_send_timeout")]
    pub send_timeout: String,
    #[serde(default)]
    pub store: Store,
    #[serde(default)]
    pub client_ip: ClientIp,
    #[serde(default)]
    pub identities: Identities,
    #[serde(default)]
    pub responses: Responses,
    #[serde(default)]
    pub paths: Paths,
    #[serde(deserialize_with = "present_upstreams")]
    pub upstreams: BTreeMap<String, Upstream>,
    #[serde(deserialize_with = "present_routes")]
    pub routes: Vec<Route>,
    /// Named lists of limits a consumer's requests get (SPEC §10).
    #[serde(default)]
    pub plans: BTreeMap<String, Plan>,
    #[serde(default)]
    pub anonymous_plan: Option<String>,
    #[serde(default)]
    pub consumers: Vec<Consumer>,
    /// A YAML file holding the consumer list (instead of `consumers`), reloaded live.
    #[serde(default)]
    pub consumers_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub limits: Vec<Limit>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Consumer {
    pub name: String,
    pub plan: String,
    /// SHA-256 of each key, hex.
    #[serde(default)]
    pub keys_sha256: Vec<String>,
    /// Plain keys: hashed at load, never logged or stored. Never shown by `/admin/config`.
    #[serde(default, skip_serializing, deserialize_with = "key_list")]
    pub keys: Vec<String>,
}

/// `listen`: one cleartext address, or a list of listeners (SPEC §9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Listen {
    Address(String),
    List(Vec<Listener>),
}

impl Default for Listen {
    fn default() -> Self {
        Listen::Address("0.0.0.0:8080".into())
    }
}

impl<'de> Deserialize<'de> for Listen {
    /// By hand rather than `untagged`, so a typo inside a listener is reported as itself
    /// and not as "did not match any variant"; and straight from the file's events rather
    /// than through a `serde_yaml::Value`, which would lose where in the file it is.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = Listen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an address (IP:PORT) or a list of listeners")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Listen, E> {
                Ok(Listen::Address(s.to_owned()))
            }
            // Any other scalar is read as its text (`listen: 8080` then fails the address
            // check), as for every string key.
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Listen, E> {
                Ok(Listen::Address(n.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Listen, E> {
                Ok(Listen::Address(n.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Listen, E> {
                Ok(Listen::Address(n.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Listen, E> {
                Ok(Listen::Address(b.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Listen, A::Error> {
                let seq = serde::de::value::SeqAccessDeserializer::new(seq);
                Vec::<Listener>::deserialize(seq).map(Listen::List)
            }
        }
        d.deserialize_any(Either)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub address: String,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub proxy_protocol: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    pub certificates: Vec<CertPair>,
    #[serde(default = "d_min_version")]
    pub min_version: String,
}

fn d_min_version() -> String {
    "1.2".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CertPair {
    pub cert: String,
    pub key: String,
}

/// TLS to a server: an upstream's `tls`, or `store.redis.tls` (which has no `server_name`
/// or `insecure_skip_verify`; compile refuses them there).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    #[serde(default)]
    pub ca: Option<String>,
    #[serde(default)]
    pub client_cert: Option<String>,
    #[serde(default)]
    pub client_key: Option<String>,
    #[serde(default)]
    pub server_name: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}
fn d_admin_listen() -> String {
    "127.0.0.1:9090".into()
}
fn d_drain() -> String {
    "30s".into()
}
fn d_header_timeout() -> String {
    "10s".into()
}
fn d_send_timeout() -> String {
    "60s".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    #[serde(default)]
    pub kind: StoreKind,
    #[serde(default)]
    pub redis: Redis,
    #[serde(default)]
    pub memory: Memory,
    #[serde(default)]
    pub on_error: OnError,
}

/// Sluice extension (not in the spec's example): the embedded store's key cap.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    #[serde(default = "d_max_keys")]
    pub max_keys: usize,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            max_keys: d_max_keys(),
        }
    }
}

fn d_max_keys() -> usize {
    1_000_000
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Redis {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub mode: RedisMode,
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub sentinel_service: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    #[serde(default = "d_pool")]
    pub pool_size: usize,
    #[serde(default = "d_redis_timeout")]
    pub timeout: String,
    #[serde(default = "d_prefix")]
    pub key_prefix: String,
    /// How long `sluice run` waits for the store before opening its data listener.
    #[serde(default = "d_startup_timeout")]
    pub startup_timeout: String,
    /// Answer a refusal that certainly still holds without asking Redis again.
    #[serde(default = "d_true")]
    pub deny_cache: bool,
    #[serde(default)]
    pub tls: Option<ClientTls>,
}

impl Default for Redis {
    fn default() -> Self {
        Redis {
            url: None,
            mode: RedisMode::default(),
            nodes: vec![],
            sentinel_service: None,
            password_env: None,
            pool_size: d_pool(),
            timeout: d_redis_timeout(),
            key_prefix: d_prefix(),
            startup_timeout: d_startup_timeout(),
            deny_cache: true,
            tls: None,
        }
    }
}

fn d_pool() -> usize {
    4
}
fn d_redis_timeout() -> String {
    "50ms".into()
}
fn d_prefix() -> String {
    "sluice:".into()
}
fn d_startup_timeout() -> String {
    "5s".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIp {
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    #[serde(default = "d_v6")]
    pub ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp {
            trusted_proxies: vec![],
            ipv6_prefix: d_v6(),
        }
    }
}

fn d_v6() -> u8 {
    64
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Identities {
    #[serde(default = "d_api_key")]
    pub api_key: ApiKeySource,
    #[serde(default = "d_user")]
    pub user: UserSource,
}

impl Default for Identities {
    fn default() -> Self {
        Identities {
            api_key: d_api_key(),
            user: d_user(),
        }
    }
}

fn d_api_key() -> ApiKeySource {
    ApiKeySource {
        header: Some("X-Api-Key".into()),
        query: Some("api_key".into()),
    }
}
fn d_user() -> UserSource {
    UserSource {
        header: Some("X-User-Id".into()),
        jwt: None,
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySource {
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub query: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSource {
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub jwt: Option<Jwt>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    #[serde(default = "d_authz")]
    pub header: String,
    pub secret_env: String,
    #[serde(default = "d_sub")]
    pub claim: String,
}

fn d_authz() -> String {
    "Authorization".into()
}
fn d_sub() -> String {
    "sub".into()
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Responses {
    #[serde(default)]
    pub headers: HeadersMode,
}

/// How request paths are normalized before matching (and forwarded).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    #[serde(default = "d_true")]
    pub merge_slashes: bool,
    #[serde(default)]
    pub escaped_slashes: EscapedSlashes,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::default(),
        }
    }
}

fn d_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub targets: Vec<String>,
    #[serde(default = "d_connect")]
    pub connect_timeout: String,
    #[serde(default = "d_up_timeout")]
    pub timeout: String,
    #[serde(default = "d_idle_timeout")]
    pub idle_timeout: String,
    #[serde(default)]
    pub tls: Option<ClientTls>,
}

fn d_connect() -> String {
    "2s".into()
}
fn d_up_timeout() -> String {
    "30s".into()
}
/// nginx's `proxy_read_timeout` and Kong's `read_timeout` default.
fn d_idle_timeout() -> String {
    "60s".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: Match,
    pub upstream: String,
    #[serde(default)]
    pub strip_prefix: bool,
    #[serde(default)]
    pub on_store_error: Option<OnError>,
    #[serde(default)]
    pub limits: Vec<Limit>,
    #[serde(default)]
    pub consumers: Option<ConsumerMode>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub path_prefix: Option<String>,
    #[serde(default)]
    pub path_regex: Option<String>,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CountWhen {
    /// Codes (`401`) or classes (`"5xx"`).
    pub status: Vec<serde_yaml::Value>,
}

impl Limit {
    /// `rate` (or `max` in flight for `concurrency`) as `sluice check` prints it.
    pub fn describe(&self) -> String {
        match (&self.rate, self.max) {
            (Some(r), _) => r.clone(),
            (None, Some(m)) => format!("max {m}"),
            (None, None) => "-".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub name: String,
    /// `ip | api_key | user | header:NAME | route | consumer`, or a list of them (composite
    /// key). Required on a route's limits; a plan's limits are keyed by consumer and omit it.
    #[serde(default)]
    pub by: serde_yaml::Value,
    pub algorithm: String,
    /// `N/duration`; every algorithm but `concurrency` needs it.
    #[serde(default)]
    pub rate: Option<String>,
    #[serde(default)]
    pub burst: Option<u64>,
    /// `concurrency`: requests in flight at once, across all gateways.
    #[serde(default)]
    pub max: Option<u64>,
    /// `concurrency`: how long a slot outlives a gateway that died holding it.
    #[serde(default)]
    pub lease: Option<String>,
    /// A number, `{ header, default, max }` (from the request) or
    /// `{ response_header, default, max }` (from the answer).
    #[serde(default)]
    pub cost: Option<serde_yaml::Value>,
    /// Charge only answers with these statuses: `{ status: [401, 403, "5xx"] }`.
    #[serde(default)]
    pub count_when: Option<CountWhen>,
    #[serde(default)]
    pub shadow: bool,
    #[serde(default)]
    pub on_missing: OnMissing,
    /// `false`: never shown in the RateLimit fields.
    #[serde(default = "d_true")]
    pub headers: bool,
}

/// A required section written with nothing after it (`routes:`, as a file caught mid-write
/// may read) is an error, not an empty list; `routes: []` says "none" on purpose. The error
/// starts with the section's name in backticks, which [`parse_yaml`](super::parse_yaml)
/// places at the section (serde_yaml gives such an error no position).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    name: &str,
    none: &str,
) -> Result<T, D::Error> {
    use serde::de::Error;
    Option::<T>::deserialize(d)?
        .ok_or_else(|| D::Error::custom(format!("`{name}` is empty (write `{none}` for none)")))
}

fn present_routes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Route>, D::Error> {
    present(d, "routes", "[]")
}

fn present_upstreams<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Upstream>, D::Error> {
    present(d, "upstreams", "{}")
}

/// Plain API keys: a list. Anything else is refused without its value, which would be a key
/// in clear in the error (on stderr, in the log, in the admin API's answer to a reload). A
/// bare `null` or `~` item is YAML for no value, not a key spelled so (a template that
/// rendered nothing would otherwise give a consumer a key anyone can guess): it is read as
/// empty, which validation refuses; a quoted `"null"` is a key.
fn key_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Keys;
    impl<'de> serde::de::Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of API keys")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(k) = seq.next_element::<Option<String>>()? {
                keys.push(k.unwrap_or_default());
            }
            Ok(keys)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(E::custom(NOT_A_LIST))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(E::custom(NOT_A_LIST))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(E::custom(NOT_A_LIST))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom(NOT_A_LIST))
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(E::custom(NOT_A_LIST))
        }
    }
    const NOT_A_LIST: &str = "`keys` must be a list, `keys: [KEY]` (the value is not shown)";
    d.deserialize_any(Keys)
}
