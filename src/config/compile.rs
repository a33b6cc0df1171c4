//! Validate a parsed [`File`] and compile it into a runtime [`Table`], collecting every error.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method};
use ipnet::IpNet;
use regex::Regex;

use super::file::{self, File};
use super::position::Positions;
use super::{units, ConfigError, ConfigErrors};
use crate::limiter::algo::{Algorithm, Params, ParamsError};
use crate::model::consumer::{Consumer, Consumers, Plan};
use crate::model::identity::{ClientIpRules, IdentitySources, JwtSource};
use crate::model::limit::{AnswerCost, Charge, Cost, KeyPart, LimitRule, StatusSet};
use crate::model::path::PathRules;
use crate::model::policy::{RedisMode, StoreKind};
use crate::model::route::{HostMatch, Matcher, PathMatch, Route};
use crate::model::table::{Boot, RedisSettings, StoreSettings, Table, UpstreamSpec};
use crate::model::tls::{At, CertFiles, ClientTls, Listener, ListenerTls, TlsVersion};
use crate::pipeline::headers::ratelimit::policy_value;

/// Environment variable holding the admin bearer token.
pub const ADMIN_TOKEN_ENV: &str = "SLUICE_ADMIN_TOKEN";

/// The admin bearer token from [`ADMIN_TOKEN_ENV`], without surrounding whitespace (a secret
/// mounted from a file often ends in a newline). `Ok(None)`: unset or empty. `Err`: it holds
/// a space or a character that is not visible ASCII, which no `Authorization: Bearer` value
/// can carry, so no client could ever present it.
pub fn admin_token() -> Result<Option<String>, String> {
    let Ok(raw) = std::env::var(ADMIN_TOKEN_ENV) else {
        return Ok(None);
    };
    let token = raw.trim();
    if token.is_empty() {
        return Ok(None);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{ADMIN_TOKEN_ENV} holds a space, a control character or non-ASCII: no `Authorization: Bearer` header can carry it"
        ));
    }
    Ok(Some(token.to_owned()))
}

struct Ctx<'a> {
    name: &'a str,
    pos: &'a Positions,
    errors: Vec<ConfigError>,
}

impl Ctx<'_> {
    fn err(&mut self, path: &str, message: impl Into<String>) {
        let p = self.pos.of(path);
        self.errors.push(ConfigError {
            file: self.name.to_string(),
            line: p.line,
            col: p.col,
            message: message.into(),
        });
    }

    fn duration(&mut self, path: &str, s: &str) -> Duration {
        match units::duration(s) {
            Ok(d) if d.is_zero() => {
                self.err(path, format!("`{path}` must be greater than 0"));
                Duration::from_secs(1)
            }
            Ok(d) => d,
            Err(e) => {
                self.err(path, e);
                Duration::from_secs(1)
            }
        }
    }

    /// Where `path` was written, kept for errors found when its files are loaded.
    fn at(&self, path: &str) -> At {
        let p = self.pos.of(path);
        At {
            file: self.name.to_string(),
            line: p.line,
            col: p.col,
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        resolve(self.name, p)
    }

    /// `name` (a `kind` name, at `path`) is `[a-z0-9_-]` and not yet in `seen`; `duplicate`
    /// is the error when it is.
    fn unique_name<'n>(
        &mut self,
        path: &str,
        kind: &str,
        name: &'n str,
        seen: &mut HashSet<&'n str>,
        duplicate: impl FnOnce() -> String,
    ) {
        if !valid_name(name) {
            self.err(
                path,
                format!("{kind} name `{name}` must be non-empty [a-z0-9_-], not starting with `_`"),
            );
        } else if !seen.insert(name) {
            self.err(path, duplicate());
        }
    }

    fn header_name(&mut self, path: &str, s: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(s.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.err(path, format!("invalid header name `{s}`"));
                None
            }
        }
    }

    fn env(&mut self, path: &str, var: &str) -> Option<String> {
        match std::env::var(var) {
            Ok(v) if !v.is_empty() => Some(v),
            _ => {
                self.err(path, format!("environment variable `{var}` is not set"));
                None
            }
        }
    }
}

/// A file named in the config at `config` (its path as given): relative paths are relative to
/// the config file's directory.
fn resolve(config: &str, p: &str) -> PathBuf {
    let p = Path::new(p);
    match Path::new(config).parent() {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    }
}

/// The files besides itself that the config `file` (at `config`) reads, resolved as compile
/// resolves them: the listeners' certificates and keys, and the `consumers_file`. Reloads
/// watch their directories and compare their bytes, even before the file is known to compile.
pub fn watched_files(config: &str, file: &File) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match &file.listen {
        file::Listen::List(listeners) => listeners
            .iter()
            .filter_map(|l| l.tls.as_ref())
            .flat_map(|t| &t.certificates)
            .flat_map(|c| [resolve(config, &c.cert), resolve(config, &c.key)])
            .collect(),
        file::Listen::Address(_) => Vec::new(),
    };
    out.extend(file.consumers_file.iter().map(|f| resolve(config, f)));
    out
}

/// More worker threads than this is a typo, not a machine (each is a thread and a runtime).
const MAX_WORKERS: usize = 1024;

/// `[a-z0-9_-]`, not starting with `_`: names the gateway makes itself start with it (the
/// `_none` route of metrics, the `_plans` route of plan limits' store keys, the `_anonymous`
/// plan), and a route named `_plans` would share its counters with the consumers' plans.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

pub fn compile(
    name: &str,
    file: &File,
    pos: &Positions,
    version: String,
) -> Result<(Boot, Table), ConfigErrors> {
    let mut c = Ctx {
        name,
        pos,
        errors: Vec::new(),
    };

    let listeners = listeners(&mut c, &file.listen);
    let admin_listen = file.admin_listen.parse::<SocketAddr>().unwrap_or_else(|_| {
        c.err(
            "admin_listen",
            format!(
                "invalid admin_listen address `{}` (expected IP:PORT)",
                file.admin_listen
            ),
        );
        // Port 0: a placeholder that clashes with no listener (the error above is the news).
        SocketAddr::from(([127, 0, 0, 1], 0))
    });
    if let Some(i) = listeners
        .iter()
        .position(|l| same_port(l.address, admin_listen))
    {
        let which = match &file.listen {
            file::Listen::Address(_) => "listen".to_string(),
            file::Listen::List(_) => format!("listen[{i}]"),
        };
        c.err(
            "admin_listen",
            format!(
                "admin_listen `{admin_listen}` takes the port of {which} `{}`: the admin API needs a port of its own",
                listeners[i].address
            ),
        );
    }
    if !admin_listen.ip().is_loopback() {
        match admin_token() {
            Ok(Some(_)) => {}
            Ok(None) => c.err("admin_listen", format!("admin_listen `{admin_listen}` is not a loopback address: set {ADMIN_TOKEN_ENV} so /admin/* requires a bearer token")),
            Err(e) => c.err("admin_listen", e),
        }
    }
    let drain_timeout = c.duration("drain_timeout", &file.drain_timeout);
    let client_header_timeout = c.duration("client_header_timeout", &file.client_header_timeout);
    let send_timeout = c.duration("send_timeout", &file.send_timeout);

    let store = store_settings(&mut c, &file.store);
    let client_ip = client_ip_rules(&mut c, &file.client_ip);
    let identities = identity_sources(&mut c, &file.identities);
    let paths = PathRules {
        merge_slashes: file.paths.merge_slashes,
        escaped_slashes: file.paths.escaped_slashes,
    };

    let mut upstreams = Vec::with_capacity(file.upstreams.len());
    for (uname, u) in &file.upstreams {
        let base = format!("upstreams.{uname}");
        if u.targets.is_empty() {
            c.err(
                &format!("{base}.targets"),
                format!("upstream `{uname}` has no targets"),
            );
        }
        let targets: Vec<(Authority, bool)> = u
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| target(&mut c, &format!("{base}.targets[{i}]"), t))
            .collect();
        let https = targets.first().is_some_and(|(_, https)| *https);
        if targets.iter().any(|(_, h)| *h != https) {
            c.err(
                &format!("{base}.targets"),
                format!("upstream `{uname}` mixes http:// and https:// targets: use one scheme"),
            );
        }
        let tls = match (&u.tls, https) {
            (Some(t), true) => Some(client_tls(&mut c, &format!("{base}.tls"), t, false)),
            (None, true) => Some(ClientTls::system_roots(c.at(&format!("{base}.targets")))),
            (Some(_), false) => {
                c.err(
                    &format!("{base}.tls"),
                    format!("upstream `{uname}` has `tls` but its targets are http://"),
                );
                None
            }
            (None, false) => None,
        };
        let targets = targets.into_iter().map(|(a, _)| a).collect();
        upstreams.push(UpstreamSpec {
            tls,
            name: uname.as_str().into(),
            targets,
            connect_timeout: c.duration(&format!("{base}.connect_timeout"), &u.connect_timeout),
            timeout: c.duration(&format!("{base}.timeout"), &u.timeout),
            idle_timeout: c.duration(&format!("{base}.idle_timeout"), &u.idle_timeout),
        });
    }

    let plans = plans(&mut c, file, &store.redis.key_prefix);
    let consumers = consumers(&mut c, file, &plans);

    let mut routes = Vec::with_capacity(file.routes.len());
    let mut seen = HashSet::new();
    for (i, r) in file.routes.iter().enumerate() {
        let base = format!("routes[{i}]");
        c.unique_name(&format!("{base}.name"), "route", &r.name, &mut seen, || {
            format!("duplicate route name `{}`", r.name)
        });
        let matcher = matcher(&mut c, &format!("{base}.match"), &r.matcher, &paths);
        let upstream = upstreams
            .iter()
            .position(|u: &UpstreamSpec| *u.name == *r.upstream);
        if upstream.is_none() {
            c.err(
                &format!("{base}.upstream"),
                format!("unknown upstream `{}`", r.upstream),
            );
        }
        if r.strip_prefix && r.matcher.path_regex.is_some() {
            c.err(
                &format!("{base}.strip_prefix"),
                "strip_prefix needs `path` or `path_prefix`, not `path_regex`",
            );
        }
        let owner = Owner::Route(&r.name);
        let mut limits = limit_list(&mut c, &base, &r.limits, owner, &store.redis.key_prefix);
        for (j, rule) in limits.iter().enumerate() {
            if rule.by.contains(&KeyPart::Consumer) && r.consumers.is_none() {
                c.err(
                    &format!("{base}.limits[{j}].by"),
                    "`by: consumer` needs `consumers: required` or `optional` on the route",
                );
            }
            // `identities.api_key: {}` (or `user: {}`) reads that identity from nowhere: such
            // a limit would only ever fall back, skip or refuse, whatever requests carry.
            for (part, name, other) in [
                (KeyPart::ApiKey, "api_key", "query"),
                (KeyPart::User, "user", "jwt"),
            ] {
                if rule.by.contains(&part) && disabled(&file.identities, &part) {
                    c.err(
                        &format!("{base}.limits[{j}].by"),
                        format!("`by: {name}` never finds one: `identities.{name}` reads it from nowhere (it has no `header`, no `{other}`)"),
                    );
                }
            }
        }
        if r.consumers.is_some() && disabled(&file.identities, &KeyPart::ApiKey) {
            c.err(
                &format!("{base}.consumers"),
                "consumers are found by API key, and `identities.api_key` reads it from nowhere (it has no `header`, no `query`)",
            );
        }
        if r.consumers.is_some() {
            if plans.is_empty() {
                c.err(
                    &format!("{base}.consumers"),
                    format!(
                        "route `{}` looks up consumers but no `plans` are defined",
                        r.name
                    ),
                );
            }
            // Every plan's limits, tagged with their plan; a request is decided on its own.
            for (p, (_, plan_limits)) in plans.iter().enumerate() {
                for rule in plan_limits {
                    limits.push(LimitRule {
                        policy: policy_value(&r.name, &rule.name, &rule.params),
                        plan: Some(p),
                        ..rule.clone()
                    });
                }
            }
        }
        if let (Some(matcher), Some(upstream)) = (matcher, upstream) {
            routes.push(Route {
                name: r.name.as_str().into(),
                matcher,
                upstream,
                strip_prefix: r.strip_prefix,
                on_store_error: r.on_store_error.unwrap_or(file.store.on_error),
                limits,
                consumers: r.consumers,
            });
        }
    }

    if file.workers > MAX_WORKERS {
        c.err(
            "workers",
            format!("`workers` must be at most {MAX_WORKERS} (0: one per core)"),
        );
    }
    if !c.errors.is_empty() {
        c.errors.sort_by_key(|e| (e.line, e.col));
        return Err(ConfigErrors(c.errors));
    }
    let workers = if file.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        file.workers
    };
    // When the config was loaded, for /admin/config: metadata, not a decision.
    #[allow(clippy::disallowed_methods)]
    let loaded_at = SystemTime::now();
    let boot = Boot {
        listeners,
        admin_listen,
        workers,
        drain_timeout,
        client_header_timeout,
        send_timeout,
        store,
    };
    let table = Table {
        version,
        loaded_at,
        headers: file.responses.headers,
        paths,
        upstreams,
        client_ip,
        identities,
        routes,
        consumers: Consumers {
            plans: plans
                .into_iter()
                .map(|(name, limits)| Plan { name, limits })
                .collect(),
            ..consumers
        },
    };
    Ok((boot, table))
}

fn store_settings(c: &mut Ctx<'_>, s: &file::Store) -> StoreSettings {
    if s.memory.max_keys == 0 {
        c.err("store.memory.max_keys", "max_keys must be at least 1");
    }
    let r = &s.redis;
    let timeout = c.duration("store.redis.timeout", &r.timeout);
    if !(1..=256).contains(&r.pool_size) {
        c.err("store.redis.pool_size", "pool_size must be from 1 to 256");
    }
    let password = r.password_env.as_deref().and_then(|v| {
        if s.kind == StoreKind::Redis {
            c.env("store.redis.password_env", v)
        } else {
            None
        }
    });
    if let Some(url) = &r.url {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            c.err(
                "store.redis.url",
                format!(
                    "redis url must start with redis:// or rediss:// (got `{}`)",
                    redact_url(url)
                ),
            );
        }
    }
    for (i, n) in r.nodes.iter().enumerate() {
        let ok = n.rsplit_once(':').is_some_and(|(h, p)| {
            !h.is_empty() && !h.contains(['@', '/']) && p.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            // Credentials written into a node are not repeated in the error.
            let shown = match n.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => n.clone(),
            };
            c.err(
                &format!("store.redis.nodes[{i}]"),
                format!("node `{shown}` must be host:port, with no user or password"),
            );
        }
    }
    // Whether the mode has what it needs; only then is what fred would refuse worth asking
    // (it would say the same again: one problem, one error).
    let mut shaped = true;
    if s.kind == StoreKind::Redis {
        shaped = false;
        match r.mode {
            RedisMode::Standalone if r.url.is_none() => c.err(
                "store.redis",
                "store.kind redis in standalone mode needs `url`",
            ),
            RedisMode::Cluster if r.url.is_none() && r.nodes.is_empty() => c.err(
                "store.redis",
                "cluster mode needs seed `nodes` (or a `url`)",
            ),
            RedisMode::Sentinel if r.nodes.is_empty() => c.err(
                "store.redis",
                "sentinel mode needs the sentinels in `nodes`",
            ),
            RedisMode::Sentinel if r.sentinel_service.is_none() => {
                c.err("store.redis", "sentinel mode needs `sentinel_service`")
            }
            _ => shaped = true,
        }
    }
    let mut redis = RedisSettings {
        url: r.url.clone(),
        mode: r.mode,
        nodes: r.nodes.clone(),
        sentinel_service: r.sentinel_service.clone(),
        password,
        pool_size: r.pool_size,
        timeout,
        key_prefix: r.key_prefix.clone(),
        startup_timeout: c.duration("store.redis.startup_timeout", &r.startup_timeout),
        deny_cache: r.deny_cache,
        tls: r
            .tls
            .as_ref()
            .map(|t| client_tls(c, "store.redis.tls", t, true)),
    };
    if redis.tls.is_none() && r.url.as_deref().is_some_and(|u| u.starts_with("rediss://")) {
        // `rediss://` without a `tls` block: the system roots, no client certificate.
        redis.tls = Some(ClientTls::system_roots(c.at("store.redis.url")));
    }
    if redis.tls.is_some() && r.url.as_deref().is_some_and(|u| u.starts_with("redis://")) {
        c.err(
            "store.redis.tls",
            "store.redis.tls is used with a rediss:// url (this one is redis://)",
        );
    }
    // What the client itself would refuse (fred parses the URL), reported here with a position.
    if s.kind == StoreKind::Redis && shaped {
        if let Err(e) = crate::limiter::store::redis::validate(&redis) {
            match &r.url {
                Some(url) => c.err(
                    "store.redis.url",
                    format!("not a valid Redis URL ({e}): `{}`", redact_url(url)),
                ),
                None => c.err("store.redis", format!("redis settings rejected: {e}")),
            }
        }
    }
    StoreSettings {
        kind: s.kind,
        on_error: s.on_error,
        memory_max_keys: s.memory.max_keys,
        redis,
    }
}

/// `redis://user:secret@host` → `redis://user:***@host`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

fn client_ip_rules(c: &mut Ctx<'_>, s: &file::ClientIp) -> ClientIpRules {
    let mut trusted = Vec::new();
    for (i, t) in s.trusted_proxies.iter().enumerate() {
        match t
            .parse::<IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
        {
            Ok(n) => trusted.push(n),
            Err(_) => c.err(
                &format!("client_ip.trusted_proxies[{i}]"),
                format!("invalid CIDR `{t}`"),
            ),
        }
    }
    if s.ipv6_prefix > 128 {
        c.err("client_ip.ipv6_prefix", "ipv6_prefix must be from 0 to 128");
    }
    ClientIpRules {
        trusted,
        ipv6_prefix: s.ipv6_prefix.min(128),
    }
}

/// Whether `identities` reads `part` (an API key or a user) from nowhere: `api_key: {}` or
/// `user: {}` switch them off.
fn disabled(s: &file::Identities, part: &KeyPart) -> bool {
    match part {
        KeyPart::ApiKey => s.api_key.header.is_none() && s.api_key.query.is_none(),
        KeyPart::User => s.user.header.is_none() && s.user.jwt.is_none(),
        _ => false,
    }
}

fn identity_sources(c: &mut Ctx<'_>, s: &file::Identities) -> IdentitySources {
    let api_key_header = s
        .api_key
        .header
        .as_deref()
        .and_then(|h| c.header_name("identities.api_key.header", h));
    let user_header = s
        .user
        .header
        .as_deref()
        .and_then(|h| c.header_name("identities.user.header", h));
    let jwt = s.user.jwt.as_ref().and_then(|j| {
        let header = c.header_name("identities.user.jwt.header", &j.header)?;
        let secret = c.env("identities.user.jwt.secret_env", &j.secret_env)?;
        Some(JwtSource {
            header,
            secret: secret.into_bytes(),
            claim: j.claim.clone(),
        })
    });
    IdentitySources {
        api_key_header,
        api_key_query: s.api_key.query.clone(),
        user_header,
        jwt,
    }
}

/// `http://HOST[:PORT]` or `https://HOST[:PORT]`: the authority (default port filled in)
/// and whether it is https.
fn target(c: &mut Ctx<'_>, path: &str, t: &str) -> Option<(Authority, bool)> {
    // A password in a target is refused, and never repeated in the error.
    let shown = redact_url(t);
    let (rest, https, port) = match (t.strip_prefix("http://"), t.strip_prefix("https://")) {
        (Some(r), _) => (r, false, 80),
        (_, Some(r)) => (r, true, 443),
        _ => {
            c.err(
                path,
                format!("target `{shown}` must be http://HOST:PORT or https://HOST:PORT"),
            );
            return None;
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let parsed = match rest.parse::<Authority>() {
        Ok(a) if !rest.contains('/') && !rest.contains('@') => a,
        _ => {
            c.err(
                path,
                format!("target `{shown}` must be http(s)://HOST:PORT with no path or user"),
            );
            return None;
        }
    };
    // The port as written (`host()` keeps an IPv6 address's brackets): none is the
    // scheme's; one written must be 1–65535 (the authority parser takes any digits, or none).
    match rest[parsed.host().len()..].strip_prefix(':') {
        None if rest.len() == parsed.host().len() => {
            format!("{rest}:{port}").parse().ok().map(|a| (a, https))
        }
        Some(p) if p.parse::<u16>().is_ok_and(|p| p > 0) => Some((parsed, https)),
        _ => {
            c.err(
                path,
                format!("target `{shown}` has no valid port (1-65535 after the host, or none)"),
            );
            None
        }
    }
}

/// Whether two sockets cannot both bind: one port (not 0, which asks the kernel for any) on
/// one address, or on a wildcard that covers the other (`0.0.0.0` covers IPv4; `::` covers
/// both, as Linux binds it dual-stack by default).
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |w: IpAddr, x: IpAddr| w.is_unspecified() && (w.is_ipv6() || x.is_ipv4());
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || covers(a.ip(), b.ip()) || covers(b.ip(), a.ip()))
}

/// `listen`: one cleartext address, or the list of listeners.
fn listeners(c: &mut Ctx<'_>, listen: &file::Listen) -> Vec<Listener> {
    let address = |c: &mut Ctx<'_>, path: &str, a: &str| {
        a.parse::<SocketAddr>().unwrap_or_else(|_| {
            c.err(
                path,
                format!("invalid listen address `{a}` (expected IP:PORT)"),
            );
            // Port 0: a placeholder that clashes with nothing (see `same_port`), so an
            // unreadable address is reported once, not also as sharing a port.
            SocketAddr::from(([0, 0, 0, 0], 0))
        })
    };
    let list = match listen {
        file::Listen::Address(a) => {
            return vec![Listener {
                address: address(c, "listen", a),
                tls: None,
                proxy_protocol: false,
            }]
        }
        file::Listen::List(l) => l,
    };
    if list.is_empty() {
        c.err("listen", "listen needs at least one listener");
    }
    let mut out: Vec<Listener> = Vec::with_capacity(list.len());
    for (i, l) in list.iter().enumerate() {
        let base = format!("listen[{i}]");
        let addr = address(c, &format!("{base}.address"), &l.address);
        if let Some(j) = out.iter().position(|o| same_port(o.address, addr)) {
            c.err(
                &format!("{base}.address"),
                format!(
                    "two listeners on one port: `{addr}` and listen[{j}] `{}`",
                    out[j].address
                ),
            );
        }
        let tls = l.tls.as_ref().map(|t| {
            if t.certificates.is_empty() {
                c.err(
                    &format!("{base}.tls.certificates"),
                    "a TLS listener needs at least one certificate",
                );
            }
            let min_version = match t.min_version.as_str() {
                "1.2" => TlsVersion::V1_2,
                "1.3" => TlsVersion::V1_3,
                v => {
                    c.err(
                        &format!("{base}.tls.min_version"),
                        format!("min_version must be \"1.2\" or \"1.3\" (got `{v}`)"),
                    );
                    TlsVersion::V1_2
                }
            };
            let certificates = t
                .certificates
                .iter()
                .enumerate()
                .map(|(j, p)| CertFiles {
                    cert: c.path(&p.cert),
                    key: c.path(&p.key),
                    at: c.at(&format!("{base}.tls.certificates[{j}]")),
                })
                .collect();
            ListenerTls {
                certificates,
                min_version,
            }
        });
        out.push(Listener {
            address: addr,
            tls,
            proxy_protocol: l.proxy_protocol,
        });
    }
    out
}

/// An upstream's `tls`, or `store.redis.tls` (`for_redis`: no SNI override or skip there).
fn client_tls(c: &mut Ctx<'_>, base: &str, t: &file::ClientTls, for_redis: bool) -> ClientTls {
    if t.client_cert.is_some() != t.client_key.is_some() {
        c.err(base, "give both `client_cert` and `client_key`, or neither");
    }
    if for_redis && (t.server_name.is_some() || t.insecure_skip_verify) {
        c.err(
            base,
            "store.redis.tls takes `ca`, `client_cert` and `client_key` only",
        );
    }
    if let Some(n) = &t.server_name {
        if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
            c.err(
                &format!("{base}.server_name"),
                format!("`{n}` is not a DNS name or IP address"),
            );
        }
    }
    ClientTls {
        ca: t.ca.as_deref().map(|p| c.path(p)),
        client_cert: t.client_cert.as_deref().map(|p| c.path(p)),
        client_key: t.client_key.as_deref().map(|p| c.path(p)),
        server_name: t.server_name.clone(),
        insecure_skip_verify: t.insecure_skip_verify,
        at: c.at(base),
    }
}

fn matcher(c: &mut Ctx<'_>, base: &str, m: &file::Match, paths: &PathRules) -> Option<Matcher> {
    let path = match (&m.path, &m.path_prefix, &m.path_regex) {
        (Some(p), None, None) => Some(PathMatch::Exact(p.clone())),
        (None, Some(p), None) => Some(PathMatch::Prefix(p.clone())),
        (None, None, Some(r)) => match Regex::new(&format!("^(?:{r})$")) {
            Ok(re) => Some(PathMatch::Regex(re)),
            Err(e) => {
                c.err(
                    &format!("{base}.path_regex"),
                    format!(
                        "invalid regex: {}",
                        e.to_string().lines().last().unwrap_or("")
                    ),
                );
                None
            }
        },
        _ => {
            c.err(
                base,
                "match needs exactly one of `path`, `path_prefix`, `path_regex`",
            );
            None
        }
    };
    for (key, v) in [("path", &m.path), ("path_prefix", &m.path_prefix)] {
        let Some(p) = v.as_deref() else { continue };
        if !p.starts_with('/') {
            c.err(
                &format!("{base}.{key}"),
                format!("`{key}` must start with `/`"),
            );
            continue;
        }
        // A route matches the path alone: the query and a fragment are not part of it.
        if let Some(at) = p.find(['?', '#']) {
            c.err(
                &format!("{base}.{key}"),
                format!(
                    "`{p}` never matches: `{}` is not part of the path a route sees (match the path alone, `{}`)",
                    &p[at..at + 1],
                    &p[..at]
                ),
            );
            continue;
        }
        // Requests are matched on their normalized path: a pattern that is not normal would
        // never match anything.
        match crate::model::path::normalize(p, paths) {
            Ok(n) if n == p => {}
            Ok(n) => c.err(
                &format!("{base}.{key}"),
                format!("`{p}` never matches: request paths are normalized first; write `{n}`"),
            ),
            Err(e) => c.err(
                &format!("{base}.{key}"),
                format!("`{p}` never matches: {e}, which is refused with 400"),
            ),
        }
    }
    // `GET` brings `HEAD` along (nginx's `limit_except GET` does too): frameworks answer HEAD
    // with the GET handler, so a limit on `methods: [GET]` that HEAD missed would be a way
    // around it.
    if m.methods.as_ref().is_some_and(Vec::is_empty) {
        c.err(
            &format!("{base}.methods"),
            "`methods: []` matches no request: leave `methods` out for every method",
        );
    }
    let methods = m.methods.as_ref().map(|ms| {
        let mut methods: Vec<Method> = ms
            .iter()
            .enumerate()
            .filter_map(
                |(i, s)| match Method::from_bytes(s.to_ascii_uppercase().as_bytes()) {
                    Ok(m) => Some(m),
                    Err(_) => {
                        c.err(
                            &format!("{base}.methods[{i}]"),
                            format!("invalid method `{s}`"),
                        );
                        None
                    }
                },
            )
            .collect();
        if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
            methods.push(Method::HEAD);
        }
        methods
    });
    let host = m.host.as_ref().and_then(|h| {
        let h = h.to_ascii_lowercase();
        let (exact, rest) = match h.strip_prefix("*.") {
            Some(rest) => (false, rest.to_string()),
            None => (true, h.clone()),
        };
        // A request's host is ASCII (RFC 3986 §3.2.2): an internationalized name arrives as
        // its punycode, so `bücher.example` written here would never match.
        if !rest.is_ascii() {
            c.err(
                &format!("{base}.host"),
                format!("host `{h}` is not ASCII: write an internationalized name as its punycode (`xn--…`), as clients send it"),
            );
            return None;
        }
        let name = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
        if rest.is_empty() || !rest.bytes().all(name) {
            c.err(
                &format!("{base}.host"),
                format!("invalid host `{h}` (exact name or `*.example.com`, of `a-z 0-9 - . _`)"),
            );
            return None;
        }
        Some(if exact {
            HostMatch::Exact(rest)
        } else {
            HostMatch::Wildcard(format!(".{rest}"))
        })
    });
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (k, v) in &m.headers {
        let p = format!("{base}.headers.{k}");
        // HTTP trims a field value (RFC 9110 §5.5): no request carries these spaces.
        if v.trim_matches([' ', '\t']) != v {
            c.err(
                &p,
                format!("`{k}: {v:?}` never matches: requests' field values have no white space at either end"),
            );
            continue;
        }
        if let (Some(n), Ok(v)) = (c.header_name(&p, k), HeaderValue::from_str(v)) {
            // Field names match in any case: `X-Env` and `x-env` are one field twice.
            if let Some((first, _)) = headers.iter().find(|(h, _)| *h == n) {
                c.err(
                    &p,
                    format!("duplicate key `{k}` (the field `{first}` is matched already; names match in any case)"),
                );
                continue;
            }
            headers.push((n, v));
        } else if HeaderValue::from_str(v).is_err() {
            c.err(&p, format!("invalid header value for `{k}`"));
        }
    }
    Some(Matcher {
        path: path?,
        methods,
        host,
        headers,
    })
}

fn key_parts(c: &mut Ctx<'_>, path: &str, by: &serde_yaml::Value) -> Option<Vec<KeyPart>> {
    let one = |c: &mut Ctx<'_>, s: &str| -> Option<KeyPart> {
        match s {
            "ip" => Some(KeyPart::Ip),
            "api_key" => Some(KeyPart::ApiKey),
            "user" => Some(KeyPart::User),
            "route" => Some(KeyPart::Route),
            "consumer" => Some(KeyPart::Consumer),
            _ => match s.strip_prefix("header:") {
                Some(h) => c.header_name(path, h).map(KeyPart::Header),
                None => {
                    c.err(path, format!("unknown key `{s}` in `by` (expected ip, api_key, user, header:NAME, route, consumer or a list)"));
                    None
                }
            },
        }
    };
    match by {
        serde_yaml::Value::String(s) => one(c, s).map(|p| vec![p]),
        serde_yaml::Value::Sequence(items) if !items.is_empty() => {
            let mut parts = Vec::new();
            for item in items {
                let Some(s) = item.as_str() else {
                    c.err(path, "`by` list items must be strings");
                    return None;
                };
                let p = one(c, s)?;
                if p == KeyPart::Route {
                    c.err(
                        path,
                        "`route` cannot be part of a composite key (it is the whole route already)",
                    );
                    return None;
                }
                if parts.contains(&p) {
                    c.err(path, format!("`{s}` appears twice in `by`"));
                    return None;
                }
                parts.push(p);
            }
            Some(parts)
        }
        _ => {
            c.err(
                path,
                "`by` must be ip, api_key, user, header:NAME, route, or a non-empty list of them",
            );
            None
        }
    }
}

/// The limits of a route or a plan (at `base`): names unique within it, each compiled.
fn limit_list(
    c: &mut Ctx<'_>,
    base: &str,
    list: &[file::Limit],
    owner: Owner<'_>,
    prefix: &str,
) -> Vec<LimitRule> {
    let whose = match owner {
        Owner::Route(r) => format!("route `{r}`"),
        Owner::Plan(_, p) => format!("plan `{p}`"),
    };
    let mut names = HashSet::new();
    let mut limits = Vec::with_capacity(list.len());
    for (j, l) in list.iter().enumerate() {
        let lbase = format!("{base}.limits[{j}]");
        c.unique_name(
            &format!("{lbase}.name"),
            "limit",
            &l.name,
            &mut names,
            || format!("duplicate limit name `{}` in {whose}", l.name),
        );
        if let Some(rule) = limit_rule(c, &lbase, owner, l, prefix) {
            limits.push(rule);
        }
    }
    limits
}

/// Whose limit is compiled: a route's own, or a plan's (index, name).
#[derive(Clone, Copy)]
enum Owner<'a> {
    Route(&'a str),
    Plan(usize, &'a str),
}

fn limit_rule(
    c: &mut Ctx<'_>,
    base: &str,
    owner: Owner<'_>,
    l: &file::Limit,
    prefix: &str,
) -> Option<LimitRule> {
    let by = match owner {
        Owner::Route(_) if l.by.is_null() => {
            c.err(base, format!("limit `{}` needs `by`", l.name));
            None
        }
        Owner::Route(_) => key_parts(c, &format!("{base}.by"), &l.by),
        Owner::Plan(..) if l.by.is_null() => Some(vec![KeyPart::Consumer]),
        Owner::Plan(..) => {
            c.err(
                &format!("{base}.by"),
                "a plan's limits are kept per consumer: omit `by`",
            );
            None
        }
    };
    let Some(algorithm) = Algorithm::from_name(&l.algorithm) else {
        let all = Algorithm::ALL.iter().chain([&Algorithm::Concurrency]);
        let names: Vec<_> = all.map(|a| a.name()).collect();
        c.err(
            &format!("{base}.algorithm"),
            format!(
                "unknown algorithm `{}` (expected one of {})",
                l.algorithm,
                names.join(", ")
            ),
        );
        return None;
    };
    let burst_path = format!("{base}.burst");
    if l.burst.is_some() && !algorithm.is_bucket() && algorithm != Algorithm::Concurrency {
        c.err(
            &burst_path,
            format!(
                "`burst` applies to token_bucket, leaky_bucket and gcra, not {}",
                algorithm.name()
            ),
        );
        return None;
    }
    let params = if algorithm == Algorithm::Concurrency {
        concurrency(c, base, l)?
    } else {
        for (field, set) in [("max", l.max.is_some()), ("lease", l.lease.is_some())] {
            if set {
                c.err(
                    &format!("{base}.{field}"),
                    format!("`{field}` applies to concurrency limits; this one has a `rate`"),
                );
                return None;
            }
        }
        let Some(rate) = &l.rate else {
            c.err(base, format!("limit `{}` needs `rate`", l.name));
            return None;
        };
        rate_params(c, base, l, algorithm, rate)?
    };
    let (cost, charge) = if algorithm == Algorithm::Concurrency {
        (Cost::Static(1), Charge::InFlight)
    } else {
        charge(c, base, l, params.capacity)?
    };
    let by = by?;
    let (name, key_base, plan, policy) = match owner {
        Owner::Route(route) => (
            l.name.clone(),
            format!("{prefix}{route}:{}:{}:", l.name, algorithm.name()),
            None,
            policy_value(route, &l.name, &params),
        ),
        // Kept per consumer, whatever the route and the plan: every route draws on one
        // quota, and a plan change keeps the counters of a limit of the same name and
        // algorithm. The policy item is the route's, filled in per route.
        Owner::Plan(p, plan) => (
            format!("{plan}/{}", l.name),
            format!("{prefix}_plans:{}:{}:", l.name, algorithm.name()),
            Some(p),
            HeaderValue::from_static(""),
        ),
    };
    Some(LimitRule {
        name: name.into(),
        by,
        params,
        cost,
        shadow: l.shadow,
        on_missing: l.on_missing,
        key_base,
        policy,
        headers: l.headers,
        plan,
        charge,
    })
}

/// A rate limit's parameters from `rate` (and `burst`), errors at their own lines.
fn rate_params(
    c: &mut Ctx<'_>,
    base: &str,
    l: &file::Limit,
    algorithm: Algorithm,
    rate: &str,
) -> Option<Params> {
    let rate_path = format!("{base}.rate");
    let burst_path = format!("{base}.burst");
    let params = if let Some(n) = monthly(rate) {
        if algorithm != Algorithm::FixedWindow {
            c.err(
                &rate_path,
                format!(
                    "calendar windows (`N/month`) apply to fixed_window, not {}",
                    algorithm.name()
                ),
            );
            return None;
        }
        n.map_err(|_| ParamsError::ZeroLimit)
            .and_then(Params::monthly)
    } else {
        let (n, window) = match units::rate(rate) {
            Ok(r) => r,
            Err(e) => {
                c.err(&rate_path, e);
                return None;
            }
        };
        Params::new(
            algorithm,
            n,
            u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            l.burst,
        )
    };
    let params = match params {
        Ok(p) => p,
        Err(e) => {
            let at = match e {
                ParamsError::ZeroBurst | ParamsError::Overflow(_) if l.burst.is_some() => {
                    &burst_path
                }
                _ => &rate_path,
            };
            c.err(at, format!("{e} (rate `{}`)", rate));
            return None;
        }
    };
    Some(params)
}

/// `algorithm: concurrency`: `max` (required) and `lease` (default 30s); no `rate`, `cost` or
/// `count_when` (a request holds one slot, whatever it costs or answers).
fn concurrency(c: &mut Ctx<'_>, base: &str, l: &file::Limit) -> Option<Params> {
    for (field, set) in [
        ("rate", l.rate.is_some()),
        ("burst", l.burst.is_some()),
        ("cost", l.cost.is_some()),
        ("count_when", l.count_when.is_some()),
    ] {
        if set {
            c.err(
                &format!("{base}.{field}"),
                format!("a concurrency limit takes `max` and `lease`, not `{field}`"),
            );
            return None;
        }
    }
    let Some(max) = l.max else {
        c.err(base, format!("concurrency limit `{}` needs `max`", l.name));
        return None;
    };
    let lease = match l.lease.as_deref().map(units::duration) {
        None => Duration::from_secs(30),
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            c.err(&format!("{base}.lease"), e);
            return None;
        }
    };
    let lease_us = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
    match Params::concurrency(max, lease_us) {
        Ok(p) => Some(p),
        Err(e @ ParamsError::Lease) => {
            c.err(&format!("{base}.lease"), e.to_string());
            None
        }
        Err(e) => {
            c.err(&format!("{base}.max"), e.to_string());
            None
        }
    }
}

/// When a rate limit is charged: before forwarding, or by the answer (`count_when`, or a
/// `response_header` cost). Returns the request-time cost too (1 for the probe of a limit
/// charged by the answer).
fn charge(c: &mut Ctx<'_>, base: &str, l: &file::Limit, capacity: u64) -> Option<(Cost, Charge)> {
    let cost_path = format!("{base}.cost");
    let parsed = cost(c, &cost_path, l.cost.as_ref(), capacity)?;
    let when = match &l.count_when {
        None => None,
        Some(w) => Some(status_set(
            c,
            &format!("{base}.count_when.status"),
            &w.status,
        )?),
    };
    match (parsed, when) {
        (ParsedCost::Request(cost), None) => Some((cost, Charge::Request)),
        (ParsedCost::Request(Cost::Static(n)), when @ Some(_)) => Some((
            Cost::Static(1),
            Charge::Answer {
                when,
                cost: AnswerCost::Static(n),
            },
        )),
        (ParsedCost::Request(_), Some(_)) => {
            c.err(
                &cost_path,
                "with `count_when` the cost is charged after the answer: a number or \
                 { response_header, default, max }",
            );
            None
        }
        (ParsedCost::Response(cost), when) => {
            Some((Cost::Static(1), Charge::Answer { when, cost }))
        }
    }
}

/// `count_when.status`: codes 100–599 and classes `1xx`–`5xx`, at least one.
fn status_set(c: &mut Ctx<'_>, path: &str, list: &[serde_yaml::Value]) -> Option<StatusSet> {
    if list.is_empty() {
        c.err(path, "`status` needs at least one code or class");
        return None;
    }
    let mut set = StatusSet::default();
    for (i, v) in list.iter().enumerate() {
        let text = match v {
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::String(s) => s.trim().to_ascii_lowercase(),
            _ => String::new(),
        };
        let class = text
            .strip_suffix("xx")
            .and_then(|d| d.parse::<u16>().ok())
            .filter(|d| (1..=5).contains(d));
        match (class, text.parse::<u16>().ok()) {
            (Some(d), _) => (d * 100..d * 100 + 100).for_each(|code| set.insert(code)),
            (None, Some(code)) if (100..=599).contains(&code) => set.insert(code),
            _ => {
                c.err(
                    &format!("{path}[{i}]"),
                    format!("`{text}` is not a status code (100-599) or class (1xx-5xx)"),
                );
                return None;
            }
        }
    }
    Some(set)
}

/// `N/month`: `Some(Ok(N))`; `Some(Err)` for a bad N; `None` for any other rate.
fn monthly(rate: &str) -> Option<Result<u64, ()>> {
    let (n, w) = rate.trim().split_once('/')?;
    (w.trim() == "month").then(|| n.trim().parse().map_err(|_| ()))
}

/// `plans`: each plan's limits, in name order (a plan is referred to by its index).
fn plans(c: &mut Ctx<'_>, file: &File, prefix: &str) -> Vec<(Arc<str>, Vec<LimitRule>)> {
    let mut out = Vec::with_capacity(file.plans.len());
    for (p, (name, plan)) in file.plans.iter().enumerate() {
        let base = format!("plans.{name}");
        if !valid_name(name) {
            c.err(
                &base,
                format!("plan name `{name}` must be non-empty [a-z0-9_-], not starting with `_`"),
            );
        }
        if plan.limits.is_empty() {
            c.err(
                &format!("{base}.limits"),
                format!("plan `{name}` has no limits"),
            );
        }
        let limits = limit_list(c, &base, &plan.limits, Owner::Plan(p, name), prefix);
        out.push((Arc::from(name.as_str()), limits));
    }
    out
}

/// `consumers` (or `consumers_file`) and `anonymous_plan`, against the compiled `plans`.
fn consumers(c: &mut Ctx<'_>, file: &File, plans: &[(Arc<str>, Vec<LimitRule>)]) -> Consumers {
    let mut out = Consumers::default();
    if let Some(a) = &file.anonymous_plan {
        out.anonymous = plans.iter().position(|(p, _)| p.as_ref() == a.as_str());
        if out.anonymous.is_none() {
            c.err(
                "anonymous_plan",
                format!("unknown plan `{a}` (plans: {})", plan_names(plans)),
            );
        }
    }
    // The list, from this file or its own (errors then point into that file).
    match &file.consumers_file {
        None => consumer_list(c, &file.consumers, "consumers", plans, &mut out),
        Some(_) if !file.consumers.is_empty() => {
            c.err(
                "consumers_file",
                "give `consumers` or `consumers_file`, not both",
            );
        }
        Some(path) => {
            let path = c.path(path);
            match read_consumers(&path) {
                Ok((list, pos)) => {
                    let name = path.display().to_string();
                    let mut sub = Ctx {
                        name: &name,
                        pos: &pos,
                        errors: Vec::new(),
                    };
                    consumer_list(&mut sub, &list, "", plans, &mut out);
                    c.errors.extend(sub.errors);
                }
                Err(e) => c.errors.extend(e.0),
            }
        }
    }
    out
}

/// Add `list` (at `prefix` in the file `here` reports into) to `out`.
fn consumer_list(
    here: &mut Ctx<'_>,
    list: &[file::Consumer],
    prefix: &str,
    plans: &[(Arc<str>, Vec<LimitRule>)],
    out: &mut Consumers,
) {
    let plan_index = |name: &str| plans.iter().position(|(p, _)| &**p == name);
    let mut names = HashSet::new();
    for (i, k) in list.iter().enumerate() {
        let base = format!("{prefix}[{i}]");
        here.unique_name(
            &format!("{base}.name"),
            "consumer",
            &k.name,
            &mut names,
            || format!("duplicate consumer `{}`", k.name),
        );
        let Some(plan) = plan_index(&k.plan) else {
            here.err(
                &format!("{base}.plan"),
                format!("unknown plan `{}` (plans: {})", k.plan, plan_names(plans)),
            );
            continue;
        };
        if k.keys.is_empty() && k.keys_sha256.is_empty() {
            here.err(
                &base,
                format!("consumer `{}` has no `keys` or `keys_sha256`", k.name),
            );
        }
        let index = out.list.len();
        let mut add = |here: &mut Ctx<'_>, at: String, digest: [u8; 32], shown: &str| match out
            .by_digest
            .get(&digest)
        {
            // This consumer is not in `list` yet: a key it names twice is its own.
            Some(&other) if other == index => here.err(
                &at,
                format!("{shown} is already listed for consumer `{}`", k.name),
            ),
            Some(&other) => here.err(
                &at,
                format!(
                    "{shown} already belongs to consumer `{}`",
                    out.list[other].name
                ),
            ),
            None => {
                out.by_digest.insert(digest, index);
            }
        };
        for (j, h) in k.keys_sha256.iter().enumerate() {
            let at = format!("{base}.keys_sha256[{j}]");
            match sha256_hex(h) {
                Some(d) => add(here, at, d, &format!("key sha256 `{}…`", &h[..8])),
                None => here.err(&at, "not a SHA-256 digest: expected 64 hexadecimal digits"),
            }
        }
        for (j, key) in k.keys.iter().enumerate() {
            let at = format!("{base}.keys[{j}]");
            if key.is_empty() {
                here.err(
                    &at,
                    "an API key may not be empty (a bare `null` or `~` is YAML for none: quote a key spelled so)",
                );
                continue;
            }
            // A request's key is read as a field value (trimmed, visible ASCII): any other key
            // could never match.
            if crate::model::identity::field_value(key) != Some(key.as_str()) {
                here.err(
                    &at,
                    "an API key must be visible ASCII (spaces and tabs only inside) to be sent at all",
                );
                continue;
            }
            use sha2::{Digest, Sha256};
            // The key itself is never echoed: errors name its position only.
            add(here, at, Sha256::digest(key.as_bytes()).into(), "this key");
        }
        out.list.push(Consumer {
            name: k.name.as_str().into(),
            plan,
        });
    }
}

fn plan_names(plans: &[(Arc<str>, Vec<LimitRule>)]) -> String {
    plans
        .iter()
        .map(|(p, _)| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// 64 hex digits (either case) as 32 bytes.
fn sha256_hex(h: &str) -> Option<[u8; 32]> {
    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The consumer list of a `consumers_file`, with positions for its errors.
fn read_consumers(path: &Path) -> Result<(Vec<file::Consumer>, Positions), ConfigErrors> {
    let name = path.display().to_string();
    let text = super::read(path, "consumers_file")?;
    // A file with no list at all (empty, or only comments) is more likely caught mid-write or
    // emptied by mistake than meant: with `consumers: required` it would refuse every request.
    let list: Option<Vec<file::Consumer>> = super::parse_yaml(&name, &text)?;
    let Some(list) = list else {
        return Err(ConfigErrors(vec![ConfigError {
            file: name,
            line: 1,
            col: 1,
            message: "consumers_file holds no list (write `[]` for no consumers)".into(),
        }]));
    };
    Ok((list, Positions::index(super::without_bom(&text))))
}

/// A limit's `cost` as written: charged from the request, or from the answer.
enum ParsedCost {
    Request(Cost),
    Response(AnswerCost),
}

/// `cost`: a number, `{ header, default, max }` or `{ response_header, default, max }`.
fn cost(
    c: &mut Ctx<'_>,
    path: &str,
    v: Option<&serde_yaml::Value>,
    capacity: u64,
) -> Option<ParsedCost> {
    let Some(v) = v else {
        return Some(ParsedCost::Request(Cost::Static(1)));
    };
    if let Some(n) = v.as_u64() {
        if n == 0 || n > capacity {
            c.err(
                path,
                format!("cost {n} must be from 1 to the limit's capacity {capacity}"),
            );
            return None;
        }
        return Some(ParsedCost::Request(Cost::Static(n)));
    }
    let Some(map) = v.as_mapping() else {
        c.err(
            path,
            "cost must be a positive integer, { header, default, max } or \
             { response_header, default, max }",
        );
        return None;
    };
    let (mut header, mut response) = (None, None);
    let mut default = None;
    let mut max = None;
    let mut named = false;
    for (k, val) in map {
        match (k.as_str(), val) {
            (Some("header"), serde_yaml::Value::String(h)) => {
                named = true;
                header = c.header_name(&format!("{path}.header"), h)
            }
            (Some("response_header"), serde_yaml::Value::String(h)) => {
                named = true;
                response = c.header_name(&format!("{path}.response_header"), h)
            }
            (Some("default"), v) if v.as_u64().is_some() => default = v.as_u64(),
            (Some("max"), v) if v.as_u64().is_some() => max = v.as_u64(),
            (Some(k @ ("header" | "response_header" | "default" | "max")), _) => {
                c.err(
                    &format!("{path}.{k}"),
                    format!("invalid value for cost `{k}`"),
                );
                return None;
            }
            (k, _) => {
                c.err(
                    path,
                    format!(
                        "unknown key `{}` in cost (expected header or response_header, \
                         default, max)",
                        k.unwrap_or("?")
                    ),
                );
                return None;
            }
        }
    }
    let response_side = match (header, response) {
        (Some(_), Some(_)) => {
            c.err(path, "a cost has `header` or `response_header`, not both");
            return None;
        }
        // A name that is not a valid field name was reported where it is.
        (None, None) if named => return None,
        (None, None) => {
            c.err(path, "a header cost needs `header` or `response_header`");
            return None;
        }
        (h, r) => r.map(Ok).unwrap_or_else(|| Err(h)),
    };
    let Some(max) = max else {
        c.err(
            path,
            "a header cost needs `max` (the largest cost one request may be charged)",
        );
        return None;
    };
    if max == 0 || max > capacity {
        c.err(
            &format!("{path}.max"),
            format!("cost max {max} must be from 1 to the limit's capacity {capacity}"),
        );
        return None;
    }
    // The upstream may report 0 (nothing used); a client's header always costs at least 1.
    let least = u64::from(response_side.is_err());
    let default = default.unwrap_or(least.max(1).min(max));
    if default < least || default > max {
        c.err(
            &format!("{path}.default"),
            format!("cost default {default} must be from {least} to max {max}"),
        );
        return None;
    }
    Some(match response_side {
        Ok(name) => ParsedCost::Response(AnswerCost::ResponseHeader { name, default, max }),
        Err(name) => ParsedCost::Request(Cost::Header {
            name: name?,
            default,
            max,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::same_port;

    #[test]
    fn same_port_is_what_bind_would_refuse() {
        let clash = |a: &str, b: &str| same_port(a.parse().unwrap(), b.parse().unwrap());
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:80"),
            ("0.0.0.0:80", "127.0.0.1:80"),
            ("[::]:80", "10.0.0.1:80"),
            ("[::]:80", "[::1]:80"),
            ("[::]:80", "0.0.0.0:80"),
        ] {
            assert!(clash(a, b) && clash(b, a), "{a} {b}");
        }
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:81"),
            ("127.0.0.1:80", "127.0.0.2:80"),
            ("0.0.0.0:80", "[::1]:80"),
            ("127.0.0.1:0", "127.0.0.1:0"),
        ] {
            assert!(!clash(a, b) && !clash(b, a), "{a} {b}");
        }
    }
}
