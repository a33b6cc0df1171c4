//! `GET /admin/config`: the effective configuration as JSON, secrets redacted.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::config::compile::redact_url;
use crate::config::file::File;
use crate::model::table::Table;

/// `{"version", "loaded_at", "loaded_at_unix", "config"}`. `config` is the file as loaded,
/// with every default filled in and `workers` resolved, and the consumers of a
/// `consumers_file`; settings that only a restart can change show the running values, not a
/// newer file's.
pub(crate) fn document(
    table: &Table,
    file: &File,
    workers: usize,
) -> Result<Value, serde_json::Error> {
    let mut config = serde_json::to_value(file)?;
    redact(&mut config, None);
    if let Some(w) = config.get_mut("workers") {
        *w = json!(workers);
    }
    // Consumers from `consumers_file` are not in the file as loaded: show the ones serving,
    // by name and plan (their keys, digests or not, are never shown from that file).
    if file.consumers_file.is_some() {
        let c = &table.consumers;
        let list: Vec<Value> = c
            .list
            .iter()
            .map(|k| json!({ "name": &*k.name, "plan": &*c.plans[k.plan].name }))
            .collect();
        config["consumers"] = Value::Array(list);
    }
    let unix = table
        .loaded_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(json!({
        "version": table.version,
        "loaded_at": rfc3339(table.loaded_at),
        "loaded_at_unix": unix,
        "config": config,
    }))
}

/// What replaces a secret value.
pub(crate) const REDACTED: &str = "***";

/// Blank out secrets: the value of any field whose name says pass(word), secret, token,
/// signature, cookie, credential, authorization, api key or private, or ends in `-key` or
/// `_key` (not a certificate's `key`, which is a file path), route `match.headers` included
/// (a route may match on a shared secret header such as `X-Auth-Key`); and the password of
/// any URL. Fields ending in `_env` name an environment variable, not its value, and stay.
fn redact(v: &mut Value, field: Option<&str>) {
    match v {
        Value::String(s) => {
            if field.is_some_and(secret_field) {
                *s = REDACTED.to_string();
            } else if s.contains("://") {
                *s = redact_url(s);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| redact(x, field)),
        Value::Object(map) => map.iter_mut().for_each(|(k, x)| redact(x, Some(k))),
        _ => {}
    }
}

fn secret_field(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.ends_with("_env") {
        return false;
    }
    n.ends_with("-key")
        || n.ends_with("_key")
        || [
            "pass",
            "secret",
            "signature",
            "token",
            "authorization",
            "cookie",
            "credential",
            "api_key",
            "api-key",
            "apikey",
            "private",
        ]
        .iter()
        .any(|w| n.contains(w))
}

/// `2024-05-01T12:34:56Z` (UTC, whole seconds).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        let at = |s| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(at(4_102_444_800), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn redacts_secret_fields_and_url_passwords_only() {
        let mut v = json!({
            "store": { "redis": {
                "url": "redis://app:hunter2@redis:6379/0",
                "password_env": "REDIS_PASSWORD",
                "nodes": ["redis-1:6379"],
            }},
            "identities": {
                "api_key": { "header": "X-Api-Key", "query": "api_key" },
                "user": { "jwt": { "secret_env": "JWT_SECRET", "claim": "sub" } },
            },
            "routes": [{ "match": { "headers": {
                "X-Internal-Token": "tok-123", "Authorization": "Bearer abc", "X-Env": "prod",
            "X-Auth-Key": "k-456", "X-Shared-Pass": "p-789", "X-Signature": "s-012",
            }}}],
            "listen": [{ "tls": { "certificates": [{ "cert": "/tls/a.crt", "key": "/tls/a.key" }] } }],
            "upstreams": { "api": { "targets": ["http://127.0.0.1:3000"] } },
        });
        redact(&mut v, None);
        let text = v.to_string();
        for secret in [
            "hunter2",
            "tok-123",
            "Bearer abc",
            "k-456",
            "p-789",
            "s-012",
        ] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert_eq!(v["store"]["redis"]["url"], "redis://app:***@redis:6379/0");
        assert_eq!(v["store"]["redis"]["password_env"], "REDIS_PASSWORD");
        assert_eq!(v["store"]["redis"]["nodes"][0], "redis-1:6379");
        assert_eq!(v["identities"]["api_key"]["header"], "X-Api-Key");
        assert_eq!(v["identities"]["api_key"]["query"], "api_key");
        assert_eq!(v["identities"]["user"]["jwt"]["secret_env"], "JWT_SECRET");
        assert_eq!(v["routes"][0]["match"]["headers"]["X-Env"], "prod");
        let pair = &v["listen"][0]["tls"]["certificates"][0];
        assert_eq!(
            (pair["cert"].as_str(), pair["key"].as_str()),
            (Some("/tls/a.crt"), Some("/tls/a.key"))
        );
        assert_eq!(v["upstreams"]["api"]["targets"][0], "http://127.0.0.1:3000");
    }
}
