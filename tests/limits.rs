//! Rate limiting through the real binary on the embedded store: 429s with every header and
//! body field, each identity kind, costs, shadow limits, all-or-nothing, concurrency.

mod support;

use std::sync::Arc;

use http::Method;
use support::*;

fn cfg(up: &Upstream, extra: &str, limits: &str) -> String {
    format!(
        "client_ip: {{ trusted_proxies: [127.0.0.1/32] }}\n{extra}upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: login\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n{limits}",
        up.url()
    )
}

const PER_IP_5: &str = "      - { name: per-ip, by: ip, algorithm: sliding_log, rate: 5/1m }\n";

async fn statuses(s: &Sluice, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let c = client();
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(get(&c, &s.url("/"), headers).await.status.as_u16());
    }
    v
}

#[tokio::test]
async fn n_allowed_then_429_with_every_field() {
    let up = Upstream::start();
    let s = Sluice::start(&cfg(&up, "", PER_IP_5));
    let c = client();
    for i in 0..5 {
        let r = get(&c, &s.url("/"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"login/per-ip\";q=5;w=60")
        );
        let rl = r.header("ratelimit").unwrap();
        assert!(
            rl.starts_with(&format!("\"login/per-ip\";r={};t=", 4 - i)),
            "{rl}"
        );
        assert!(r.header("retry-after").is_none());
    }
    let r = get(&c, &s.url("/"), &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"login/per-ip\";q=5;w=60")
    );
    let rl = r.header("ratelimit").unwrap();
    assert!(rl.starts_with("\"login/per-ip\";r=0;t="), "{rl}");
    assert!(r.header("x-request-id").is_some());
    let p = r.json();
    assert_eq!(
        p["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(p["title"], "Too Many Requests");
    assert_eq!(p["status"], 429);
    assert_eq!(p["route"], "login");
    assert_eq!(p["limit"], "per-ip");
    assert_eq!(p["retry_after"], retry);
    assert!(p["detail"].as_str().unwrap().contains("login/per-ip"));
    assert_eq!(up.hits(), 5, "the 429 never reached the upstream");
}

#[tokio::test]
async fn header_modes() {
    let up = Upstream::start();
    let limit = "      - { name: b, by: ip, algorithm: token_bucket, rate: 10/1m, burst: 3 }\n";
    for (mode, draft, legacy) in [
        ("draft", true, false),
        ("legacy", false, true),
        ("both", true, true),
        ("none", false, false),
    ] {
        let s = Sluice::start(&cfg(
            &up,
            &format!("responses: {{ headers: {mode} }}\n"),
            limit,
        ));
        let c = client();
        let r = get(&c, &s.url("/"), &[]).await;
        assert_eq!(r.header("ratelimit-policy").is_some(), draft, "{mode}");
        if draft {
            assert_eq!(
                r.header("ratelimit-policy"),
                Some("\"login/b\";q=10;w=60;sluice-burst=3")
            );
            assert_eq!(r.header("ratelimit"), Some("\"login/b\";r=2;t=6"));
        }
        assert_eq!(
            r.header("x-ratelimit-remaining").is_some(),
            legacy,
            "{mode}"
        );
        if legacy {
            assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
            assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
            assert_eq!(r.header("x-ratelimit-reset"), Some("6"));
        }
        get(&c, &s.url("/"), &[]).await;
        get(&c, &s.url("/"), &[]).await;
        let r = get(&c, &s.url("/"), &[]).await;
        assert_eq!(r.status, 429);
        assert_eq!(
            r.header("retry-after"),
            Some("6"),
            "Retry-After on every 429 ({mode})"
        );
    }
}

#[tokio::test]
async fn distinct_clients_via_trusted_xff_but_spoofing_does_not_help() {
    let up = Upstream::start();
    let limit = "      - { name: per-ip, by: ip, algorithm: fixed_window, rate: 2/1h }\n";
    // Peer 127.0.0.1 is trusted: X-Forwarded-For names the client.
    let s = Sluice::start(&cfg(&up, "", limit));
    assert_eq!(
        statuses(&s, 3, &[("x-forwarded-for", "1.1.1.1")]).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&s, 3, &[("x-forwarded-for", "2.2.2.2")]).await,
        [200, 200, 429]
    );
    // IPv6 clients in one /64 share a bucket.
    assert_eq!(
        statuses(&s, 1, &[("x-forwarded-for", "2001:db8:0:1::1")]).await,
        [200]
    );
    assert_eq!(
        statuses(&s, 2, &[("x-forwarded-for", "2001:db8:0:1::ffff")]).await,
        [200, 429]
    );

    // Untrusted peer: every spoofed X-Forwarded-For is the same client (the peer).
    let untrusted = cfg(&up, "", limit).replace(
        "trusted_proxies: [127.0.0.1/32]",
        "trusted_proxies: [10.0.0.0/8]",
    );
    let s = Sluice::start(&untrusted);
    let c = client();
    let mut codes = Vec::new();
    for i in 0..4 {
        codes.push(
            get(
                &c,
                &s.url("/"),
                &[("x-forwarded-for", &format!("9.9.9.{i}"))],
            )
            .await
            .status
            .as_u16(),
        );
    }
    assert_eq!(codes, [200, 200, 429, 429]);
}

#[tokio::test]
async fn api_key_user_header_route_and_composite_keys() {
    let up = Upstream::start();
    let limits =
        "      - { name: k, by: api_key, algorithm: gcra, rate: 2/1h, on_missing: skip }\n";
    let s = Sluice::start(&cfg(&up, "", limits));
    assert_eq!(
        statuses(&s, 3, &[("x-api-key", "alpha")]).await,
        [200, 200, 429]
    );
    // The query parameter is the same identity as the header.
    let r = get(&client(), &s.url("/?api_key=alpha"), &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(statuses(&s, 2, &[("x-api-key", "beta")]).await, [200, 200]);
    // on_missing: skip — no key, no limit.
    assert_eq!(statuses(&s, 4, &[]).await, [200, 200, 200, 200]);

    let s = Sluice::start(&cfg(
        &up,
        "",
        "      - { name: u, by: user, algorithm: leaky_bucket, rate: 1/1h, on_missing: reject }\n",
    ));
    assert_eq!(statuses(&s, 2, &[("x-user-id", "ann")]).await, [200, 429]);
    let r = get(&client(), &s.url("/"), &[]).await;
    assert_eq!(r.status, 401, "on_missing: reject");
    assert_eq!(r.json()["status"], 401);
    assert_eq!(r.header("www-authenticate"), Some("Key realm=\"sluice\""));

    let s = Sluice::start(&cfg(
        &up,
        "",
        "      - { name: t, by: 'header:X-Tenant', algorithm: sliding_window, rate: 1/1h }\n",
    ));
    assert_eq!(statuses(&s, 2, &[("x-tenant", "acme")]).await, [200, 429]);
    assert_eq!(statuses(&s, 1, &[("x-tenant", "other")]).await, [200]);
    // on_missing defaults to ip: a request without the header is limited by its IP.
    assert_eq!(statuses(&s, 2, &[]).await, [200, 429]);

    let s = Sluice::start(&cfg(
        &up,
        "",
        "      - { name: all, by: route, algorithm: fixed_window, rate: 3/1h }\n",
    ));
    assert_eq!(
        statuses(&s, 2, &[("x-forwarded-for", "1.1.1.1")]).await,
        [200, 200]
    );
    assert_eq!(
        statuses(&s, 2, &[("x-forwarded-for", "2.2.2.2")]).await,
        [200, 429]
    );

    let s = Sluice::start(&cfg(&up, "", "      - { name: c, by: [ip, api_key], algorithm: token_bucket, rate: 1/1h, on_missing: reject }\n"));
    assert_eq!(
        statuses(&s, 2, &[("x-api-key", "a"), ("x-forwarded-for", "1.1.1.1")]).await,
        [200, 429]
    );
    assert_eq!(
        statuses(&s, 1, &[("x-api-key", "a"), ("x-forwarded-for", "2.2.2.2")]).await,
        [200]
    );
    assert_eq!(
        statuses(&s, 1, &[("x-api-key", "b"), ("x-forwarded-for", "1.1.1.1")]).await,
        [200]
    );
    assert_eq!(
        statuses(&s, 1, &[("x-forwarded-for", "3.3.3.3")]).await,
        [401],
        "a composite key needs every part"
    );
}

#[tokio::test]
async fn header_cost() {
    let up = Upstream::start();
    let s = Sluice::start(&cfg(&up, "", "      - { name: c, by: ip, algorithm: token_bucket, rate: 10/1h, cost: { header: X-Cost, default: 2, max: 5 } }\n"));
    let c = client();
    let r = get(&c, &s.url("/"), &[("x-cost", "5")]).await;
    assert_eq!(r.header("ratelimit"), Some("\"login/c\";r=5;t=1800"));
    let r = get(&c, &s.url("/"), &[]).await;
    assert_eq!(
        r.header("ratelimit")
            .map(|v| v.split(';').nth(1).unwrap().to_string()),
        Some("r=3".into()),
        "default cost 2"
    );
    for bad in ["0", "6", "-1", "1.5", "x", ""] {
        let r = get(&c, &s.url("/"), &[("x-cost", bad)]).await;
        assert_eq!(r.status, 400, "cost {bad:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    let r = get(&c, &s.url("/"), &[("x-cost", "4")]).await;
    assert_eq!(r.status, 429, "4 > 3 remaining");
    let r = get(&c, &s.url("/"), &[("x-cost", "3")]).await;
    assert_eq!(r.status, 200, "the refused request consumed nothing");
}

#[tokio::test]
async fn shadow_limits_count_but_never_refuse() {
    let up = Upstream::start();
    let limits = "      - { name: real, by: ip, algorithm: fixed_window, rate: 100/1h }\n      - { name: trial, by: ip, algorithm: fixed_window, rate: 2/1h, shadow: true }\n";
    let s = Sluice::start(&cfg(&up, "", limits));
    let c = client();
    for _ in 0..4 {
        let r = get(&c, &s.url("/"), &[]).await;
        assert_eq!(r.status, 200);
        assert!(
            r.header("ratelimit").unwrap().starts_with("\"login/real\""),
            "shadow limits never appear in headers"
        );
    }
    let m = get(&c, &s.admin_url("/metrics"), &[]).await.text();
    assert_eq!(
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[
                ("route", "login"),
                ("limit", "trial"),
                ("decision", "allowed")
            ]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[
                ("route", "login"),
                ("limit", "trial"),
                ("decision", "shadow_limited")
            ]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_requests_total",
            &[("route", "login"), ("outcome", "shadow_limited")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_requests_total",
            &[("route", "login"), ("outcome", "forwarded")]
        ),
        2.0
    );
    s.wait_log(&["shadow limit would have refused"]);
}

#[tokio::test]
async fn a_request_refused_by_one_limit_consumes_none_of_the_others() {
    let up = Upstream::start();
    let limits = "      - { name: per-ip, by: ip, algorithm: sliding_log, rate: 5/1h }\n      - { name: per-key, by: 'header:X-K', algorithm: gcra, rate: 3/1h }\n";
    let s = Sluice::start(&cfg(&up, "", limits));
    assert_eq!(statuses(&s, 3, &[("x-k", "a")]).await, [200, 200, 200]);
    // Refused by per-key: must not use per-ip's last two units.
    let r = get(&client(), &s.url("/"), &[("x-k", "a")]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["limit"], "per-key");
    assert_eq!(statuses(&s, 5, &[("x-k", "a")]).await, [429; 5]);
    assert_eq!(
        statuses(&s, 3, &[("x-k", "b")]).await,
        [200, 200, 429],
        "per-ip still had 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_concurrent_requests_admit_exactly_ten() {
    let up = Upstream::start();
    let s = Arc::new(Sluice::start(&cfg(
        &up,
        "",
        "      - { name: ten, by: route, algorithm: token_bucket, rate: 10/1d }\n",
    )));
    let mut tasks = Vec::new();
    for _ in 0..500 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            // A fresh client each: many connections at once.
            send(&client(), Method::GET, &s.url("/"), &[], b"")
                .await
                .status
                .as_u16()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok, 10);
    assert_eq!(up.hits(), 10);
}

/// The newcomer's experience: the shipped config, 5 × 200 then 429 on /hello.
#[tokio::test]
async fn default_config_shows_a_limit_in_action() {
    let up = Upstream::start();
    let text = std::fs::read_to_string("config/sluice.yaml").unwrap();
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("listen:") && !l.starts_with("admin_listen:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let s = Sluice::start(&body.replace("http://127.0.0.1:3000", &up.url()));
    assert_eq!(
        statuses_at(&s, "/hello", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
}

async fn statuses_at(s: &Sluice, path: &str, n: usize) -> Vec<u16> {
    let c = client();
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(get(&c, &s.url(path), &[]).await.status.as_u16());
    }
    v
}
