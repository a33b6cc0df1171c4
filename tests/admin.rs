//! The admin listener (SPEC §5) through the real binary: probes, config, reload, auth, and
//! peeking at and resetting limits.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use http::Method;
use serde_json::Value;
use support::*;

const TOKEN: &str = "test-admin-token-3f9a";

fn plain(up: &Upstream) -> String {
    format!(
        "upstreams:
  up: {{ targets: [{}] }}
routes:
  - name: plain
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    )
}

/// A route per keying style, each with a small quota so tests can count (no epoch-aligned
/// windows: a minute boundary in mid-test would refill them).
fn limited(up: &Upstream) -> String {
    format!(
        "client_ip: {{ trusted_proxies: [127.0.0.1/32], ipv6_prefix: 64 }}
upstreams:
  up: {{ targets: [{}] }}
routes:
  - name: by-ip
    match: {{ path_prefix: /ip }}
    upstream: up
    limits:
      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 3/1m }}
  - name: by-key
    match: {{ path_prefix: /key }}
    upstream: up
    limits:
      - {{ name: per-key, by: api_key, algorithm: sliding_log, rate: 2/1m }}
  - name: combo
    match: {{ path_prefix: /combo }}
    upstream: up
    limits:
      - {{ name: key-and-ip, by: [api_key, ip], algorithm: token_bucket, rate: 2/1m }}
  - name: shared
    match: {{ path_prefix: /shared }}
    upstream: up
    limits:
      - {{ name: whole, by: route, algorithm: gcra, rate: 4/1m }}
",
        up.url()
    )
}

async fn json_of(c: &HttpClient, method: Method, url: &str, headers: &[(&str, &str)]) -> Value {
    let r = send(c, method, url, headers, b"").await;
    assert_eq!(r.status, 200, "{url}: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

async fn peek(c: &HttpClient, s: &Sluice, path_and_query: &str) -> Value {
    json_of(
        c,
        Method::GET,
        &s.admin_url(&format!("/admin/limits/{path_and_query}")),
        &[],
    )
    .await
}

fn assert_problem(r: &Reply, status: u16) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["status"], status);
    assert!(r.header("x-request-id").is_some());
}

#[tokio::test]
async fn probes_and_metrics_answer() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    let r = get(&c, &s.admin_url("/healthz"), &[]).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "ok\n"));
    let r = get(&c, &s.admin_url("/readyz"), &[]).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "ready\n"));
    let r = get(&c, &s.admin_url("/metrics"), &[]).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(r.text().contains("# TYPE sluice_config_info gauge"));
    let r = send(&c, Method::POST, &s.admin_url("/metrics"), &[], b"").await;
    assert_problem(&r, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    let r = get(&c, &s.admin_url("/nope"), &[]).await;
    assert_problem(&r, 404);
    let r = get(&c, &s.admin_url("/admin/nope"), &[]).await;
    assert_problem(&r, 404);
}

#[tokio::test]
async fn config_is_json_with_version_load_time_and_no_secrets() {
    let up = Upstream::start();
    let yaml = format!(
        "store:
  kind: memory
  redis: {{ url: 'redis://app:hunter2-pass@redis.internal:6379/0', password_env: REDIS_PASSWORD }}
identities:
  user: {{ jwt: {{ secret_env: TEST_JWT_SECRET }} }}
upstreams:
  up: {{ targets: [{}] }}
routes:
  - name: internal
    match: {{ path_prefix: /internal, headers: {{ X-Internal-Token: tok-sekrit-42, X-Env: prod }} }}
    upstream: up
  - name: plain
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    );
    let s = Sluice::start_with(&yaml, &[("TEST_JWT_SECRET", "jwt-sekrit-value")]);
    let c = client();
    // The test compares /admin/config's load time with the wall clock.
    #[allow(clippy::disallowed_methods)]
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = get(&c, &s.admin_url("/admin/config"), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let text = r.text();
    for secret in ["hunter2-pass", "tok-sekrit-42", "jwt-sekrit-value"] {
        assert!(!text.contains(secret), "{secret} leaked:\n{text}");
    }
    let doc = r.json();
    let version = s.config_version();
    assert_eq!(doc["version"], version.as_str());
    // The same version string as the metric's label.
    let m = s.metrics(&c).await;
    assert_eq!(
        metric(&m, "sluice_config_info", &[("version", &version)]),
        1.0
    );

    let loaded = doc["loaded_at_unix"].as_u64().unwrap();
    assert!(
        loaded <= before && before - loaded < 60,
        "{loaded} vs {before}"
    );
    let at = doc["loaded_at"].as_str().unwrap();
    assert_eq!(at.len(), 20, "{at}");
    assert!(at.ends_with('Z') && at.as_bytes()[10] == b'T', "{at}");

    let cfg = &doc["config"];
    assert_eq!(
        cfg["store"]["redis"]["url"],
        "redis://app:***@redis.internal:6379/0"
    );
    assert_eq!(cfg["store"]["redis"]["password_env"], "REDIS_PASSWORD");
    assert_eq!(
        cfg["identities"]["user"]["jwt"]["secret_env"],
        "TEST_JWT_SECRET"
    );
    let headers = &cfg["routes"][0]["match"]["headers"];
    assert_eq!(headers["X-Internal-Token"], "***");
    assert_eq!(headers["X-Env"], "prod");
    // Effective: defaults filled in, workers resolved.
    assert_eq!(cfg["drain_timeout"], "30s");
    assert_eq!(cfg["listen"], s.addr.to_string());
    assert!(cfg["workers"].as_u64().unwrap() >= 1);
    assert_eq!(cfg["upstreams"]["up"]["targets"][0], up.url());
    assert_eq!(cfg["routes"][1]["name"], "plain");
}

#[tokio::test]
async fn reload_endpoint_swaps_config_or_reports_every_error() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    let v1 = json_of(&c, Method::GET, &s.admin_url("/admin/config"), &[]).await["version"]
        .as_str()
        .unwrap()
        .to_string();

    // A valid change: the new version is answered and served.
    let renamed = plain(&up).replace("name: plain", "name: renamed");
    s.replace_config(&renamed);
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v2 = r.json()["version"].as_str().unwrap().to_string();
    assert_eq!(v2, s.config_version());
    assert_ne!(v1, v2);
    let doc = json_of(&c, Method::GET, &s.admin_url("/admin/config"), &[]).await;
    assert_eq!(doc["version"], v2.as_str());
    assert_eq!(doc["config"]["routes"][0]["name"], "renamed");
    assert_eq!(
        get(&c, &s.url("/x"), &[]).await.status,
        200,
        "still serving"
    );

    // A broken file: 400 with every error at FILE:LINE:COL, the old config keeps serving.
    let broken = renamed
        .replace("name: renamed", "name: Bad Name")
        .replace("upstream: up", "upstream: nowhere");
    s.replace_config(&broken);
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_problem(&r, 400);
    let errors: Vec<String> = r.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    let file = s.config_path.display().to_string();
    // The harness writes two lines (listen, admin_listen) before the yaml.
    let lines = [
        (6, "route name `Bad Name`"),
        (8, "unknown upstream `nowhere`"),
    ];
    for (e, (line, what)) in errors.iter().zip(lines) {
        assert!(
            e.starts_with(&format!("{file}:{line}:")) && e.contains(what),
            "{e}"
        );
    }
    let doc = json_of(&c, Method::GET, &s.admin_url("/admin/config"), &[]).await;
    assert_eq!(doc["version"], v2.as_str(), "old config kept");
    assert_eq!(get(&c, &s.url("/x"), &[]).await.status, 200);
    let r = get(&c, &s.admin_url("/admin/reload"), &[]).await;
    assert_problem(&r, 405);
    assert_eq!(r.header("allow"), Some("POST"));
}

#[tokio::test]
async fn settings_that_need_a_restart_show_their_running_values() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    s.replace_config(&format!(
        "drain_timeout: 5s\nsend_timeout: 5s\n{}",
        plain(&up)
    ));
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = json_of(&c, Method::GET, &s.admin_url("/admin/config"), &[]).await;
    assert_eq!(doc["version"], r.json()["version"]);
    assert_eq!(doc["config"]["drain_timeout"], "30s", "still draining 30s");
    assert_eq!(
        doc["config"]["send_timeout"], "60s",
        "still the running send timeout"
    );
    // The kept settings are logged (a log line is written a moment after the reload answers).
    let log = s.wait_log(&["need a restart"]);
    let line = log.lines().find(|l| l.contains("need a restart")).unwrap();
    assert!(
        line.contains("send_timeout") && line.contains("drain_timeout"),
        "{line}"
    );
}

/// A token mounted from a file usually ends in a newline: it is not part of the token, or no
/// client could ever present it.
#[tokio::test]
async fn a_token_with_a_trailing_newline_opens_the_api() {
    let up = Upstream::start();
    let env = [("SLUICE_ADMIN_TOKEN", format!("{TOKEN}\n"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let s = Sluice::start_admin_on(&limited(&up), &env, "0.0.0.0");
    let c = client();
    let good = format!("Bearer {TOKEN}");
    let r = get(
        &c,
        &s.admin_url("/admin/config"),
        &[("authorization", &good)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(&c, &s.admin_url("/admin/config"), &[]).await;
    assert_problem(&r, 401);
}

#[tokio::test]
async fn non_loopback_admin_needs_the_bearer_token() {
    let up = Upstream::start();
    let s = Sluice::start_admin_on(&limited(&up), &[("SLUICE_ADMIN_TOKEN", TOKEN)], "0.0.0.0");
    assert!(!s.admin_listen.ip().is_loopback());
    let c = client();
    let good = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {TOKEN}x");
    let calls = [
        (Method::GET, "/admin/config"),
        (Method::POST, "/admin/reload"),
        (Method::GET, "/admin/limits/by-ip/per-ip?key=1.2.3.4"),
        (Method::DELETE, "/admin/limits/by-ip/per-ip?key=1.2.3.4"),
        (Method::GET, "/admin/no-such-thing"),
    ];
    for (method, path) in &calls {
        for auth in [
            None,
            Some(wrong.as_str()),
            Some(TOKEN),
            Some("Basic Zm9vOmJhcg=="),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let r = send(&c, method.clone(), &s.admin_url(path), &headers, b"").await;
            assert_problem(&r, 401);
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"sluice-admin\"")
            );
        }
    }
    let with = |m: Method, p: &str| {
        let (c, url, good) = (c.clone(), s.admin_url(p), good.clone());
        async move { send(&c, m, &url, &[("authorization", &good)], b"").await }
    };
    assert_eq!(with(Method::GET, "/admin/config").await.status, 200);
    assert_eq!(with(Method::POST, "/admin/reload").await.status, 200);
    let r = with(Method::GET, "/admin/limits/by-ip/per-ip?key=1.2.3.4").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = with(Method::DELETE, "/admin/limits/by-ip/per-ip?key=1.2.3.4").await;
    assert_eq!(r.status, 204);
    assert_eq!(with(Method::GET, "/admin/no-such-thing").await.status, 404);
    let r = send(
        &c,
        Method::GET,
        &s.admin_url("/admin/config"),
        &[("authorization", &format!("bearer {TOKEN}"))],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "the auth scheme is case-insensitive");
    // Scrapers and probes need no token.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(&c, &s.admin_url(path), &[]).await.status, 200, "{path}");
    }
}

#[tokio::test]
async fn loopback_admin_needs_no_token() {
    let up = Upstream::start();
    let s = Sluice::start_with(&plain(&up), &[("SLUICE_ADMIN_TOKEN", TOKEN)]);
    assert!(s.admin_listen.ip().is_loopback());
    let c = client();
    let r = get(&c, &s.admin_url("/admin/config"), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn limit_lookups_validate_route_limit_and_key() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up));
    let c = client();
    for (path, status, says) in [
        (
            "/admin/limits/nope/per-ip?key=1.2.3.4",
            404,
            "no route `nope`",
        ),
        (
            "/admin/limits/by-ip/nope?key=1.2.3.4",
            404,
            "no limit `nope`",
        ),
        ("/admin/limits/by-ip/per-ip", 400, "`key` is required"),
        ("/admin/limits/by-ip/per-ip?key=", 400, "`key` is required"),
        ("/admin/limits/by-ip/per-ip?key=not-an-ip", 400, "not an IP"),
        (
            "/admin/limits/by-ip/per-ip?key=1.2.3.4&key=5.6.7.8",
            400,
            "more than once",
        ),
        ("/admin/limits/combo/key-and-ip?key=k1", 400, "2 parts"),
        ("/admin/limits/shared/whole?key=x", 400, "omit `key`"),
        (
            "/admin/limits/by-ip/per-ip/extra?key=1.2.3.4",
            404,
            "route `by-ip` has no limit `per-ip/extra`",
        ),
        ("/admin/limits/by-ip/a/b/c?key=1.2.3.4", 404, "no such"),
        // Paths are exact, as `/metrics` is: a trailing slash names no endpoint.
        (
            "/admin/limits/by-ip/per-ip/?key=1.2.3.4",
            404,
            "no such admin endpoint",
        ),
        (
            "/admin/limits/by-ip//per-ip?key=1.2.3.4",
            404,
            "no such admin endpoint",
        ),
        ("/admin/config/", 404, "no such admin endpoint"),
        ("/admin/consumers/acme//", 404, "no such admin endpoint"),
    ] {
        for method in [Method::GET, Method::DELETE] {
            let r = send(&c, method.clone(), &s.admin_url(path), &[], b"").await;
            assert_problem(&r, status);
            let detail = r.json()["detail"].as_str().unwrap().to_string();
            assert!(detail.contains(says), "{method} {path}: {detail}");
        }
    }
    let r = send(
        &c,
        Method::PUT,
        &s.admin_url("/admin/limits/by-ip/per-ip?key=1.2.3.4"),
        &[],
        b"",
    )
    .await;
    assert_problem(&r, 405);
    // A never-used key: full quota, nothing to wait for.
    let p = peek(&c, &s, "by-ip/per-ip?key=203.0.113.9").await;
    assert_eq!(
        p,
        serde_json::json!({"route": "by-ip", "limit": "per-ip", "algorithm": "sliding_log",
            "quota": 3, "remaining": 3, "reset_seconds": 0, "retry_after_seconds": 0})
    );
    let p = peek(&c, &s, "shared/whole").await;
    assert_eq!(
        (p["algorithm"].as_str(), p["quota"].as_u64()),
        (Some("gcra"), Some(4))
    );
}

// ---- Below: these need the real embedded store (a limit of N admits N, then 429). ----

#[tokio::test]
async fn peek_does_not_consume_and_reset_restores_the_quota() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up));
    let c = client();
    let ip = "203.0.113.7";
    let hit = || {
        let (c, url) = (c.clone(), s.url("/ip"));
        async move {
            get(&c, &url, &[("x-forwarded-for", ip)])
                .await
                .status
                .as_u16()
        }
    };
    let q = format!("by-ip/per-ip?key={ip}");
    assert_eq!(hit().await, 200);
    assert_eq!(hit().await, 200);
    for _ in 0..5 {
        let p = peek(&c, &s, &q).await;
        assert_eq!(p["quota"], 3);
        assert_eq!(p["remaining"], 1, "{p}");
        assert_eq!(p["retry_after_seconds"], 0, "one more would pass: {p}");
        let reset = p["reset_seconds"].as_u64().unwrap();
        assert!((1..=60).contains(&reset), "{p}");
    }
    assert_eq!(hit().await, 200, "peeking consumed nothing");
    let p = peek(&c, &s, &q).await;
    assert_eq!(p["remaining"], 0, "{p}");
    let retry = p["retry_after_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&retry), "{p}");
    let r = get(&c, &s.url("/ip"), &[("x-forwarded-for", ip)]).await;
    assert_eq!(r.status, 429);
    let told: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        told.abs_diff(retry) <= 1,
        "Retry-After {told} vs peek {retry}"
    );
    // Another client's key is untouched.
    assert_eq!(
        peek(&c, &s, "by-ip/per-ip?key=203.0.113.8").await["remaining"],
        3
    );

    let r = send(
        &c,
        Method::DELETE,
        &s.admin_url(&format!("/admin/limits/{q}")),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    let p = peek(&c, &s, &q).await;
    assert_eq!(
        (
            p["remaining"].as_u64(),
            p["reset_seconds"].as_u64(),
            p["retry_after_seconds"].as_u64()
        ),
        (Some(3), Some(0), Some(0)),
        "{p}"
    );
    for _ in 0..3 {
        assert_eq!(hit().await, 200, "full quota again after reset");
    }
    assert_eq!(hit().await, 429);
}

#[tokio::test]
async fn peek_keys_match_what_requests_use() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up));
    let c = client();
    // IPv6 clients are grouped by /64: another address of the same /64 names the same key.
    let r = get(&c, &s.url("/ip"), &[("x-forwarded-for", "2001:db8:1:2::5")]).await;
    assert_eq!(r.status, 200);
    for key in ["2001:db8:1:2::99", "[2001:db8:1:2::5]", "2001:db8:1:2::/64"] {
        let p = peek(&c, &s, &format!("by-ip/per-ip?key={key}")).await;
        assert_eq!(p["remaining"], 2, "{key}: {p}");
    }
    assert_eq!(
        peek(&c, &s, "by-ip/per-ip?key=2001:db8:1:3::5").await["remaining"],
        3
    );

    // API keys are taken raw (URL-encoded in the query).
    let r = get(&c, &s.url("/key"), &[("x-api-key", "k/1 +x")]).await;
    assert_eq!(r.status, 200);
    let p = peek(&c, &s, "by-key/per-key?key=k%2F1%20%2Bx").await;
    assert_eq!(
        (p["algorithm"].as_str(), p["remaining"].as_u64()),
        (Some("sliding_log"), Some(1)),
        "{p}"
    );
    // Read as a request reads it: padded, the same key (a reset of a phantom one would answer
    // 204 and clear nothing); not visible ASCII, a key no request carries.
    let p = peek(&c, &s, "by-key/per-key?key=%20k%2F1%20%2Bx%09").await;
    assert_eq!(p["remaining"].as_u64(), Some(1), "{p}");
    let r = get(
        &c,
        &s.admin_url("/admin/limits/by-key/per-key?key=k%C3%A9y"),
        &[],
    )
    .await;
    assert_problem(&r, 400);
    // A request without a key falls back to its IP (on_missing: ip): a separate key.
    assert_eq!(
        get(&c, &s.url("/key"), &[("x-forwarded-for", "198.51.100.4")])
            .await
            .status,
        200
    );
    let p = peek(&c, &s, "by-key/per-key?fallback_ip=198.51.100.4").await;
    assert_eq!(p["remaining"], 1, "{p}");
    assert_eq!(
        peek(&c, &s, "by-key/per-key?key=198.51.100.4").await["remaining"],
        2
    );

    // Composite keys: parts joined with `|` in `by` order.
    let headers = [("x-api-key", "k2"), ("x-forwarded-for", "198.51.100.7")];
    assert_eq!(get(&c, &s.url("/combo"), &headers).await.status, 200);
    let p = peek(&c, &s, "combo/key-and-ip?key=k2%7C198.51.100.7").await;
    assert_eq!(p["remaining"], 1, "{p}");
    assert_eq!(
        peek(&c, &s, "combo/key-and-ip?key=k2|198.51.100.8").await["remaining"],
        2
    );

    // by: route: one key for everyone.
    assert_eq!(get(&c, &s.url("/shared"), &[]).await.status, 200);
    assert_eq!(
        get(&c, &s.url("/shared"), &[("x-forwarded-for", "192.0.2.1")])
            .await
            .status,
        200
    );
    let p = peek(&c, &s, "shared/whole").await;
    assert_eq!(p["remaining"], 2, "{p}");
    let r = send(
        &c,
        Method::DELETE,
        &s.admin_url("/admin/limits/shared/whole"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(peek(&c, &s, "shared/whole").await["remaining"], 4);
}

#[tokio::test]
async fn limit_state_survives_reload_and_peek_follows_it() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up));
    let c = client();
    let headers = [("x-forwarded-for", "203.0.113.50")];
    assert_eq!(get(&c, &s.url("/ip"), &headers).await.status, 200);
    // Editing only the rate keeps the counters (SPEC §3).
    s.replace_config(&limited(&up).replace("rate: 3/1m", "rate: 5/1m"));
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = peek(&c, &s, "by-ip/per-ip?key=203.0.113.50").await;
    assert_eq!(
        (p["quota"].as_u64(), p["remaining"].as_u64()),
        (Some(5), Some(4)),
        "{p}"
    );
}

/// The open (loopback) admin API answers `/admin/*` only for `Host: localhost` or an IP
/// address, and not to a page of another site: a page whose name an attacker pointed at
/// 127.0.0.1 (DNS rebinding) must not get a browser on this host to read the config or reset
/// limits, nor any page post a reload blind. Probes and scrapes stay open.
#[tokio::test]
async fn the_open_admin_api_refuses_a_rebound_host() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    let port = s.admin.port();
    // A page of another site, even posting to the IP, is refused; curl sends no `Origin`.
    for (origin, want) in [
        ("https://evil.example".to_string(), 403),
        ("null".into(), 403),
        // A page served from a public address is another site too.
        ("http://203.0.113.5".into(), 403),
        ("http://[2001:db8::1]:8080".into(), 403),
        (format!("http://127.0.0.1:{port}"), 200),
        (format!("http://localhost:{port}"), 200),
        ("http://[::1]".into(), 200),
    ] {
        let url = s.admin_url("/admin/reload");
        let r = send(&c, Method::POST, &url, &[("origin", origin.as_str())], b"").await;
        assert_eq!(r.status, want, "{origin}: {}", r.text());
    }
    for (host, want) in [
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
        ("[::1]".into(), 200),
        (format!("evil.example:{port}"), 403),
        ("localhost.evil.example".into(), 403),
    ] {
        let host = [("host", host.as_str())];
        let r = get(&c, &s.admin_url("/admin/config"), &host).await;
        assert_eq!(r.status, want, "{host:?}: {}", r.text());
        let r = get(&c, &s.admin_url("/metrics"), &host).await;
        assert_eq!(r.status, 200, "{host:?}: /metrics stays open");
    }
}
