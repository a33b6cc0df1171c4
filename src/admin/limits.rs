//! `GET|DELETE /admin/limits/{route}/{limit}?key=VALUE`: peek at one identity's state
//! without consuming, or reset it.
//!
//! `key` is the raw identity (an IP, an API key, a user id, a header value); a composite
//! key's parts are joined with `|` in the order of `by` (the last part may itself contain
//! `|`); `by: route` takes no key. `fallback_ip=IP` instead names the key a request without
//! the identity falls back to under `on_missing: ip`. The store key is derived exactly as
//! the request path derives it.
//!
//! A plan's limit is `/admin/limits/{route}/{plan}/{limit}` (its name is `plan/limit`), keyed
//! by the name of a consumer on that plan, or, for the anonymous plan, by `fallback_ip=IP`.
//! A `by: consumer` part is a consumer's name. A name no consumer of the plan has is a 400:
//! nothing is ever charged on it.

use serde_json::json;

use super::{json_reply, no_content, problem, Body};
use crate::limiter::key::Material;
use crate::limiter::store::StoreError;
use crate::model::consumer::Consumers;
use crate::model::identity::{field_value, trimmed, ClientIpRules};
use crate::model::limit::{KeyPart, LimitRule};
use crate::model::params::Params;
use crate::model::policy::OnMissing;
use crate::pipeline::headers::ratelimit::retry_after_secs;
use crate::pipeline::identify::percent_decode;
use crate::pipeline::Gateway;
use http::{Response, StatusCode};

pub(crate) async fn peek(
    gw: &Gateway,
    route: &str,
    limit: &str,
    query: Option<&str>,
) -> Response<Body> {
    let (params, key) = match target(gw, route, limit, query) {
        Ok(t) => t,
        Err(res) => return res,
    };
    match state(gw, &key, &params).await {
        Ok(mut doc) => {
            doc["route"] = json!(route);
            doc["limit"] = json!(limit);
            json_reply(StatusCode::OK, &doc)
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &format!("store: {e}")),
    }
}

/// One key's state under `params`, without consuming: the fields both `/admin/limits` and
/// `/admin/consumers` answer with.
pub(super) async fn state(
    gw: &Gateway,
    key: &str,
    params: &Params,
) -> Result<serde_json::Value, StoreError> {
    let p = gw.store.peek(key, params).await?;
    let retry = if p.next.allowed() {
        0
    } else {
        retry_after_secs(p.next.retry_after_us)
    };
    Ok(json!({
        "algorithm": params.algorithm.name(),
        "quota": params.limit,
        "remaining": p.now.remaining,
        "reset_seconds": p.now.reset_after_us.div_ceil(1_000_000),
        "retry_after_seconds": retry,
    }))
}

/// Reset one key in the store, and wherever this gateway keeps a copy of its decisions.
/// The embedded copy goes first: while Redis is down, it is the one `on_error: local` decides
/// with, and its reset must not wait on (or fail with) Redis's. The deny cache is cleared
/// after the store's reset too: a refusal cached from the old state between the two would
/// otherwise outlive the reset.
pub(super) async fn reset_key(gw: &Gateway, key: &str) -> Result<(), StoreError> {
    gw.local.reset(key);
    let forget = || {
        if let Some(deny) = &gw.deny {
            deny.forget(key);
        }
    };
    forget();
    let reset = gw.store.reset(key).await;
    forget();
    reset
}

pub(crate) async fn reset(
    gw: &Gateway,
    route: &str,
    limit: &str,
    query: Option<&str>,
) -> Response<Body> {
    let (_, key) = match target(gw, route, limit, query) {
        Ok(t) => t,
        Err(res) => return res,
    };
    match reset_key(gw, &key).await {
        Ok(()) => {
            tracing::info!(route, limit, "limit state reset through the admin API");
            no_content()
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &format!("store: {e}")),
    }
}

/// The parameters of the limit named by the path, in the live table, and the store key
/// named by the query.
#[allow(clippy::result_large_err)]
fn target(
    gw: &Gateway,
    route: &str,
    limit: &str,
    query: Option<&str>,
) -> Result<(Params, String), Response<Body>> {
    let live = gw.live.load();
    let table = &live.table;
    let Some(r) = table.route(route) else {
        return Err(problem(
            StatusCode::NOT_FOUND,
            &format!("no route `{route}`"),
        ));
    };
    let Some(rule) = r.limits.iter().find(|l| l.name.as_ref() == limit) else {
        return Err(problem(
            StatusCode::NOT_FOUND,
            &format!("route `{route}` has no limit `{limit}`"),
        ));
    };
    let (key, fallback) = match (param(query, "key"), param(query, "fallback_ip")) {
        (Ok(k), Ok(f)) => (k, f),
        (Err(e), _) | (_, Err(e)) => return Err(problem(StatusCode::BAD_REQUEST, &e)),
    };
    let consumers = &table.consumers;
    let material = match (key, fallback) {
        (Some(_), Some(_)) => Err("give `key` or `fallback_ip`, not both".to_string()),
        (None, Some(ip)) => match rule.plan {
            Some(p) => anonymous_material(rule, p, &ip, consumers, &table.client_ip),
            None => fallback_material(rule, &ip, &table.client_ip),
        },
        (key, None) => material(
            rule,
            key.as_deref(),
            &table.client_ip,
            table.identities.jwt.is_some(),
            consumers,
        ),
    }
    .map_err(|msg| problem(StatusCode::BAD_REQUEST, &msg))?;
    Ok((rule.params, material.store_key(&rule.key_base)))
}

/// The decoded value of `name` in a query string; given twice, which one is meant is not
/// known (a reset must not guess), and that is an error.
fn param(query: Option<&str>, name: &str) -> Result<Option<String>, String> {
    let mut values = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k) == name).then(|| percent_decode(v))
        });
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(format!("`{name}` is given more than once")),
        (v, _) => Ok(v),
    }
}

/// The identity material of a raw `key`, as `limit::identity_material` builds it from a
/// request: parts in `by` order joined by NUL, IPs grouped like the request path groups them,
/// and field values (API keys, headers, a user from a header rather than a JWT, `jwt_users`)
/// trimmed and held to visible ASCII as a request's are. A key no request can carry is a 400,
/// not a peek at (or reset of) a counter nothing ever charges.
fn material(
    rule: &LimitRule,
    key: Option<&str>,
    ips: &ClientIpRules,
    jwt_users: bool,
    consumers: &Consumers,
) -> Result<Material, String> {
    if rule.by == [KeyPart::Route] {
        return match key {
            Some(k) if !k.is_empty() => Err(format!(
                "limit `{}` is shared by the whole route (by: route): omit `key`",
                rule.name
            )),
            _ => Ok(Material::of([""])),
        };
    }
    let names: Vec<String> = rule.by.iter().map(part_name).collect();
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return Err(format!(
            "`key` is required: the raw {} value",
            names.join("|")
        ));
    };
    let raw: Vec<&str> = key.splitn(rule.by.len(), '|').collect();
    if raw.len() != rule.by.len() {
        return Err(format!(
            "limit `{}` is keyed by {}: give {} parts joined with `|`",
            rule.name,
            names.join(", "),
            rule.by.len()
        ));
    }
    let mut values = Vec::with_capacity(raw.len());
    for (i, (part, value)) in rule.by.iter().zip(raw).enumerate() {
        let field = matches!(part, KeyPart::ApiKey | KeyPart::Header(_))
            || (*part == KeyPart::User && !jwt_users);
        let value = match part {
            KeyPart::Ip => ip_key(value, ips)?,
            KeyPart::Consumer => consumer(rule, value, consumers)?,
            _ if field => match field_value(value) {
                Some(v) => v.to_string(),
                None if trimmed(value).is_none() => String::new(),
                None => {
                    return Err(format!(
                        "the {} part of `key` is not visible ASCII: no request carries it",
                        names[i]
                    ))
                }
            },
            _ => value.to_string(),
        };
        if value.is_empty() {
            return Err(format!("the {} part of `key` is empty", names[i]));
        }
        values.push(value);
    }
    Ok(Material::of(values.iter().map(String::as_str)))
}

/// A `by: consumer` part: the name of a consumer (of the limit's plan, for a plan's limit).
fn consumer(rule: &LimitRule, name: &str, consumers: &Consumers) -> Result<String, String> {
    let Some(c) = consumers.by_name(name).map(|i| &consumers.list[i]) else {
        return Err(format!(
            "no consumer `{name}`: a `by: consumer` key is a consumer's name, not an API key"
        ));
    };
    match rule.plan {
        Some(p) if c.plan != p => Err(format!(
            "consumer `{name}` is on plan `{}`, not `{}`",
            consumers.plans[c.plan].name, consumers.plans[p].name
        )),
        _ => Ok(name.to_owned()),
    }
}

/// The material of plan `p`'s limit for an anonymous client at `ip` (see `admit::limit_call`).
fn anonymous_material(
    rule: &LimitRule,
    p: usize,
    ip: &str,
    consumers: &Consumers,
    ips: &ClientIpRules,
) -> Result<Material, String> {
    if consumers.anonymous != Some(p) {
        return Err(format!(
            "limit `{}` is not the anonymous plan's: `fallback_ip` names no key of it; give `key=CONSUMER`",
            rule.name
        ));
    }
    Ok(Material::anonymous(&ip_key(ip, ips)?))
}

/// The material of the `on_missing: ip` fallback (see `limit::identity_material`).
fn fallback_material(rule: &LimitRule, ip: &str, ips: &ClientIpRules) -> Result<Material, String> {
    if rule.on_missing != OnMissing::Ip || rule.by == [KeyPart::Ip] || rule.by == [KeyPart::Route] {
        return Err(format!(
            "limit `{}` has no per-IP fallback key (it needs on_missing: ip and another `by`)",
            rule.name
        ));
    }
    Ok(Material::ip_fallback(&ip_key(ip, ips)?))
}

/// `by: ip` identity of an address: IPv4 as is, IPv6 grouped by the configured prefix.
/// Accepts `1.2.3.4`, `2001:db8::1`, `[2001:db8::1]` and a grouped `2001:db8::/64`.
fn ip_key(s: &str, ips: &ClientIpRules) -> Result<String, String> {
    let s = s.trim();
    let bare = s.split_once('/').map_or(s, |(a, _)| a);
    let bare = bare
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(bare);
    bare.parse()
        .map(|ip| ips.group(ip).as_str().to_owned())
        .map_err(|_| format!("`{s}` is not an IP address"))
}

fn part_name(p: &KeyPart) -> String {
    match p {
        KeyPart::Ip => "ip".into(),
        KeyPart::ApiKey => "api_key".into(),
        KeyPart::User => "user".into(),
        KeyPart::Header(h) => format!("header:{h}"),
        KeyPart::Route => "route".into(),
        KeyPart::Consumer => "consumer".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use crate::model::table::Table;
    use crate::pipeline::admit::identity_material;
    use crate::pipeline::identify::Identity;
    use http::{HeaderMap, HeaderValue};

    const CONFIG: &str = "
client_ip: { ipv6_prefix: 48 }
upstreams:
  up: { targets: ['http://127.0.0.1:9'] }
routes:
  - name: r
    match: { path_prefix: / }
    upstream: up
    limits:
      - { name: by-ip, by: ip, algorithm: fixed_window, rate: 5/1m }
      - { name: by-key, by: api_key, algorithm: gcra, rate: 5/1m }
      - { name: by-user, by: user, algorithm: token_bucket, rate: 5/1m, on_missing: skip }
      - { name: by-header, by: 'header:X-Tenant', algorithm: sliding_log, rate: 5/1m }
      - { name: combo, by: [api_key, ip, 'header:X-Tenant', user], algorithm: fixed_window, rate: 5/1m }
      - { name: whole, by: route, algorithm: fixed_window, rate: 5/1m }
";

    fn table() -> Table {
        load_str("t.yaml", CONFIG)
            .unwrap_or_else(|e| panic!("{e}"))
            .table
    }

    fn rule<'t>(t: &'t Table, name: &str) -> &'t LimitRule {
        t.routes[0]
            .limits
            .iter()
            .find(|l| l.name.as_ref() == name)
            .unwrap()
    }

    /// The key the admin API derives equals the key a real request derives.
    #[test]
    fn admin_keys_match_request_keys() {
        let t = table();
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k|1"));
        h.insert("x-user-id", HeaderValue::from_static("alice"));
        h.insert("x-tenant", HeaderValue::from_static(" acme "));
        for (peer, admin_ip) in [
            ("203.0.113.7", "203.0.113.7"),
            ("2001:db8:1:2::9", "2001:db8:1:ffff::1"),
            ("::ffff:198.51.100.1", "198.51.100.1"),
        ] {
            let who = Identity::new(
                peer.parse().unwrap(),
                true,
                &h,
                None,
                &t.client_ip,
                &t.identities,
            );
            for (limit, key) in [
                ("by-ip", admin_ip.to_string()),
                ("by-key", "k|1".to_string()),
                ("by-user", "alice".to_string()),
                ("by-header", "acme".to_string()),
                ("combo", format!("k|1|{admin_ip}|acme|alice")),
            ] {
                let r = rule(&t, limit);
                let want = identity_material(r, &who).unwrap().unwrap();
                // A composite key's `|` separates parts, so only the last part may hold one.
                if limit == "combo" {
                    assert!(material(r, Some(&key), &t.client_ip, false, &t.consumers).is_err());
                    let mut h2 = h.clone();
                    h2.insert("x-user-id", HeaderValue::from_static("al|ice"));
                    h2.insert("x-api-key", HeaderValue::from_static("k1"));
                    let who2 = Identity::new(
                        peer.parse().unwrap(),
                        true,
                        &h2,
                        None,
                        &t.client_ip,
                        &t.identities,
                    );
                    assert_eq!(
                        material(
                            r,
                            Some(&format!("k1|{admin_ip}|acme|al|ice")),
                            &t.client_ip,
                            false,
                            &t.consumers
                        )
                        .unwrap(),
                        identity_material(r, &who2).unwrap().unwrap()
                    );
                    continue;
                }
                assert_eq!(
                    material(r, Some(&key), &t.client_ip, false, &t.consumers).unwrap(),
                    want,
                    "{limit} {peer}"
                );
            }
            let whole = rule(&t, "whole");
            assert_eq!(
                material(whole, None, &t.client_ip, false, &t.consumers).unwrap(),
                identity_material(whole, &who).unwrap().unwrap()
            );
        }
    }

    #[test]
    fn fallback_key_matches_a_request_without_the_identity() {
        let t = table();
        let h = HeaderMap::new();
        let who = Identity::new(
            "203.0.113.7".parse().unwrap(),
            true,
            &h,
            None,
            &t.client_ip,
            &t.identities,
        );
        let r = rule(&t, "by-key");
        assert_eq!(
            fallback_material(r, "203.0.113.7", &t.client_ip).unwrap(),
            identity_material(r, &who).unwrap().unwrap()
        );
        assert!(fallback_material(rule(&t, "by-user"), "1.2.3.4", &t.client_ip).is_err());
        assert!(fallback_material(rule(&t, "by-ip"), "1.2.3.4", &t.client_ip).is_err());
    }

    #[test]
    fn bad_keys_are_explained() {
        let t = table();
        let ips = &t.client_ip;
        assert!(material(rule(&t, "by-ip"), None, ips, false, &t.consumers)
            .unwrap_err()
            .contains("required"));
        assert!(
            material(rule(&t, "by-ip"), Some("nope"), ips, false, &t.consumers)
                .unwrap_err()
                .contains("not an IP")
        );
        assert!(material(
            rule(&t, "combo"),
            Some("k1|1.2.3.4"),
            ips,
            false,
            &t.consumers
        )
        .unwrap_err()
        .contains("4 parts"));
        assert!(material(
            rule(&t, "combo"),
            Some("k1||acme|bob"),
            ips,
            false,
            &t.consumers
        )
        .is_err());
        assert!(material(rule(&t, "whole"), Some("x"), ips, false, &t.consumers).is_err());
        assert_eq!(
            material(rule(&t, "whole"), Some(""), ips, false, &t.consumers).unwrap(),
            Material::of([""])
        );
    }

    /// A key as a request carries it: padded with spaces or tabs it is the same key (a
    /// request's is read trimmed); with a byte no header or query can carry it is refused.
    #[test]
    fn keys_are_read_as_requests_read_them() {
        let t = table();
        let ips = &t.client_ip;
        for limit in ["by-key", "by-header", "by-user"] {
            let r = rule(&t, limit);
            let k1 = material(r, Some("k1"), ips, false, &t.consumers).unwrap();
            assert_eq!(
                material(r, Some(" k1\t"), ips, false, &t.consumers).unwrap(),
                k1
            );
            assert_eq!(
                material(r, Some("a b"), ips, false, &t.consumers).unwrap(),
                Material::of(["a b"])
            );
            let e = material(r, Some("k\u{e9}y"), ips, false, &t.consumers).unwrap_err();
            assert!(e.contains("not visible ASCII"), "{e}");
            assert!(material(r, Some("k\u{1}"), ips, false, &t.consumers).is_err());
            assert!(material(r, Some("  "), ips, false, &t.consumers)
                .unwrap_err()
                .contains("empty"));
        }
        // A user from a JWT is taken as its claim is: Unicode, untrimmed.
        let r = rule(&t, "by-user");
        assert_eq!(
            material(r, Some("\u{e9}lise "), ips, true, &t.consumers).unwrap(),
            Material::of(["\u{e9}lise "])
        );
    }

    #[test]
    fn query_params_are_form_decoded() {
        assert_eq!(
            param(Some("a=1&key=k%7C1%20x+y"), "key")
                .unwrap()
                .as_deref(),
            Some("k|1 x y")
        );
        assert_eq!(param(Some("keyx=1"), "key"), Ok(None));
        assert_eq!(param(None, "key"), Ok(None));
        assert!(param(Some("key=a&key=b"), "key").is_err());
        assert!(param(Some("key=a&%6Bey=a"), "key").is_err());
    }
}
