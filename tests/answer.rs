//! Limits that look at the answer, and limits on requests in flight (SPEC §11), through the
//! real binary on the embedded store and on a real `redis-server`: a failed-login limit that
//! only 401s pay for, a cost the upstream reports that goes into debt, the N + k − 1 bound
//! with k answers held at the upstream, concurrency with a slow upstream (freed on completion
//! and on client disconnect), across two gateways, and after one of them is SIGKILLed.

mod support;

use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::*;

/// A config on `store` (empty: the embedded store) with one route `api` and these limits.
fn cfg(store: &str, up: &Upstream, limits: &str) -> String {
    format!(
        "{store}client_ip: {{ trusted_proxies: [127.0.0.1/32] }}\n\
         upstreams:\n  up: {{ targets: [{}] }}\n\
         routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n{limits}",
        up.url()
    )
}

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "store:\n  kind: redis\n  redis: {{ url: \"{}\", timeout: 500ms }}\n  on_error: deny\n",
        redis.url()
    )
}

/// The stores every behaviour is shown on: the embedded one, and a fresh Redis.
fn stores() -> Vec<(&'static str, Option<RedisServer>)> {
    vec![("memory", None), ("redis", Some(RedisServer::start()))]
}

fn store_of(r: &Option<RedisServer>) -> String {
    r.as_ref().map(redis_store).unwrap_or_default()
}

const FAILED_LOGINS: &str = "      - name: failed-logins\n        by: ip\n        algorithm: sliding_window\n        rate: 3/15m\n        count_when: { status: [401, 403] }\n";

/// "3 failed logins per 15 minutes": 200s are free, each 401/403 is charged, and once three
/// are charged the next request — whatever it would have answered — is refused before it
/// reaches the upstream.
#[tokio::test]
async fn failed_logins_are_charged_and_successes_are_free() {
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, FAILED_LOGINS));
        let c = client();
        for _ in 0..6 {
            let r = get(&c, &s.url("/status/200"), &[]).await;
            assert_eq!(r.status, 200, "{kind}");
            // Full, so back to full in 0 s (SPEC §3: reset 0 when empty). The probe advertised
            // what a cost-1 admission would leave: `t` of a whole window for nothing charged.
            let rl = r.header("ratelimit").unwrap();
            assert!(rl.ends_with(";r=3;t=0"), "{kind}: {rl}");
        }
        for (left, path) in [(2, "/status/401"), (1, "/status/403"), (0, "/status/401")] {
            let r = get(&c, &s.url(path), &[]).await;
            assert_ne!(r.status, 429, "{kind}: {path} reaches the upstream");
            let rl = r.header("ratelimit").unwrap();
            assert!(
                rl.starts_with(&format!("\"api/failed-logins\";r={left};")),
                "{kind}: {rl}"
            );
        }
        let before = up.hits();
        for path in ["/status/200", "/status/401"] {
            let r = get(&c, &s.url(path), &[]).await;
            assert_eq!(r.status, 429, "{kind}: {path} after 3 failures");
            let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!(retry > 60, "{kind}: retry-after {retry}");
        }
        assert_eq!(up.hits(), before, "{kind}: refused before the upstream");
        // Another client is not charged for them.
        let r = get(
            &c,
            &s.url("/status/200"),
            &[("x-forwarded-for", "10.9.9.9")],
        )
        .await;
        assert_eq!(r.status, 200, "{kind}");
        let m = s.metrics(&c).await;
        let labels = [("route", "api"), ("limit", "failed-logins")];
        assert_eq!(
            metric(&m, "sluice_limit_charged_total", &labels),
            3.0,
            "{kind}"
        );
    }
}

const TOKENS: &str = "      - name: tokens\n        by: api_key\n        algorithm: token_bucket\n        rate: 10/10s\n        cost: { response_header: X-Tokens-Used, default: 0, max: 10 }\n";

/// A cost the upstream reports: charged after the answer, into debt when it does not fit,
/// and the debt is waited out exactly (I = 1 s per token).
#[tokio::test]
async fn a_response_header_cost_goes_into_debt_that_is_waited_out() {
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, TOKENS));
        let c = client();
        let key = [("x-api-key", "k1")];
        let r = get(&c, &s.url("/tokens?n=8"), &key).await;
        assert_eq!(r.status, 200, "{kind}");
        // The answer shows the state after its own charge.
        assert!(r.header("ratelimit").unwrap().contains(";r=2;"), "{kind}");
        // 2 left: the probe passes, and the upstream says 10.
        let r = get(&c, &s.url("/tokens?n=10"), &key).await;
        assert_eq!(r.status, 200, "{kind}");
        assert!(r.header("ratelimit").unwrap().contains(";r=0;"), "{kind}");
        // 8 tokens owed, then one must come in: 9 s.
        let r = get(&c, &s.url("/tokens?n=0"), &key).await;
        assert_eq!(r.status, 429, "{kind}");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((8..=9).contains(&retry), "{kind}: retry-after {retry}");
        // An absent header charges the default (0 here), and so does a reported 0: free.
        for path in ["/status/200", "/tokens?n=0"] {
            let r = get(&c, &s.url(path), &[("x-api-key", "k2")]).await;
            assert_eq!(r.status, 200, "{kind}");
        }
        let r = get(&c, &s.url("/tokens?n=99"), &[("x-api-key", "k2")]).await;
        assert!(
            r.header("ratelimit").unwrap().contains(";r=0;"),
            "{kind}: clamped to max 10"
        );
        let m = s.metrics(&c).await;
        let labels = [("route", "api"), ("limit", "tokens")];
        assert_eq!(
            metric(&m, "sluice_limit_charged_total", &labels),
            28.0,
            "{kind}"
        );
    }
}

/// A window algorithm keeps a charge's debt too (SPEC §11: the long-run rate holds): 190 units
/// charged against a fixed window of 100 an hour leave the next hour owing 90, so the limit
/// is full again only at the end of the next window, not of this one; the first unit is back
/// when this one ends.
#[tokio::test]
async fn a_window_carries_a_charges_debt_into_the_next_window() {
    let limit = "      - name: tokens\n        by: api_key\n        algorithm: fixed_window\n        rate: 100/1h\n        cost: { response_header: X-Tokens-Used, default: 0, max: 100 }\n";
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&format!(
            "identities: {{ api_key: {{ header: X-Api-Key }} }}\n{}",
            cfg(&store_of(&redis), &up, limit)
        ));
        let c = client();
        let key = [("x-api-key", "k1")];
        for n in [90, 100] {
            let r = get(&c, &s.url(&format!("/tokens?n={n}")), &key).await;
            assert_eq!(r.status, 200, "{kind}: {n} passes its probe");
        }
        let r = get(&c, &s.url("/tokens?n=1"), &key).await;
        assert_eq!(r.status, 429, "{kind}");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(
            retry <= 3600,
            "{kind}: 190 < 200, one unit back at the hour: {retry}"
        );
        let url = s.admin_url("/admin/limits/api/tokens?key=k1");
        let peek = get(&c, &url, &[]).await.json();
        assert_eq!(peek["remaining"], 0, "{kind}: {peek}");
        let reset = peek["reset_seconds"].as_u64().unwrap();
        assert!(
            reset > 3600,
            "{kind}: the debt outlives this window (reset {reset} s)"
        );
    }
}

/// With k answers in flight on one key when it has 1 unit left, all k pass their probe and
/// are charged: one window admits N − 1 + k = N + k − 1, and not one more.
#[tokio::test]
async fn k_answers_in_flight_admit_at_most_n_plus_k_minus_1() {
    const K: usize = 5;
    let limit = "      - name: errors\n        by: ip\n        algorithm: sliding_window\n        rate: 3/1h\n        count_when: { status: [5xx] }\n";
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, limit));
        let c = client();
        for _ in 0..2 {
            assert_eq!(get(&c, &s.url("/status/500"), &[]).await.status, 500);
        }
        let url = s.url("/slow?ms=1500&status=503");
        let held: Vec<_> = (0..K)
            .map(|_| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
            })
            .collect();
        let mut got = Vec::new();
        for h in held {
            got.push(h.await.unwrap());
        }
        assert_eq!(got, vec![503; K], "{kind}: all {K} passed the probe");
        assert_eq!(up.hits(), 2 + K, "{kind}: N + k − 1 reached the upstream");
        let before = up.hits();
        assert_eq!(
            get(&c, &s.url("/status/200"), &[]).await.status,
            429,
            "{kind}"
        );
        assert_eq!(up.hits(), before, "{kind}");
    }
}

/// A gateway-made 502 (no upstream) is charged as a 502: it matches `5xx`.
#[tokio::test]
async fn no_answer_is_charged_as_the_gateways_own_status() {
    let limit = "      - name: errors\n        by: ip\n        algorithm: gcra\n        rate: 2/1h\n        count_when: { status: [5xx] }\n";
    let dead = free_port();
    let yaml = format!(
        "upstreams:\n  up: {{ targets: [\"http://127.0.0.1:{dead}\"] }}\n\
         routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n{limit}"
    );
    let s = Sluice::start(&yaml);
    let c = client();
    // Each 502 advertises the state after its own charge, as an upstream's 5xx does.
    for left in ["1", "0"] {
        let r = get(&c, &s.url("/"), &[]).await;
        assert_eq!(r.status, 502);
        let field = r.header("ratelimit").unwrap_or_default();
        assert!(
            field.contains(&format!(";r={left};")),
            "r={left}: {field:?}"
        );
    }
    assert_eq!(get(&c, &s.url("/"), &[]).await.status, 429);
}

/// A client gone before the answer is charged as 499 (nginx's "client closed request").
#[tokio::test]
async fn a_client_gone_before_the_answer_is_charged_as_499() {
    let limit = "      - name: abandoned\n        by: ip\n        algorithm: token_bucket\n        rate: 1/1h\n        count_when: { status: [499] }\n";
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, limit));
        let c = client();
        for _ in 0..3 {
            assert_eq!(
                get(&c, &s.url("/status/200"), &[]).await.status,
                200,
                "{kind}"
            );
        }
        let gone = tokio::time::timeout(Duration::from_millis(500), {
            let (c, url) = (client(), s.url("/slow?ms=20000"));
            async move { get(&c, &url, &[]).await }
        })
        .await;
        assert!(gone.is_err(), "{kind}");
        assert!(
            eventually(Duration::from_secs(5), || async {
                get(&c, &s.url("/status/200"), &[]).await.status == 429
            })
            .await,
            "{kind}: the abandoned request was never charged"
        );
    }
}

const IN_FLIGHT: &str = "      - name: in-flight\n        by: ip\n        algorithm: concurrency\n        max: 2\n        lease: 30s\n";

async fn inflight_gauge(s: &Sluice) -> f64 {
    let m = s.metrics(&client()).await;
    metric(
        &m,
        "sluice_limit_inflight",
        &[("route", "api"), ("limit", "in-flight")],
    )
}

/// Open a WebSocket tunnel through `s`: the answer's status and the client's socket.
fn websocket(s: &Sluice) -> (u16, std::net::TcpStream) {
    let (head, st) = support::raw::websocket(s.addr);
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, st)
}

#[tokio::test]
async fn a_websocket_holds_its_concurrency_slot_until_it_closes() {
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, IN_FLIGHT));
        let (first, a) = websocket(&s);
        let (second, _b) = websocket(&s);
        assert_eq!((first, second), (101, 101), "{kind}");
        let (third, _) = websocket(&s);
        assert_eq!(third, 429, "{kind}: a third tunnel past max 2");
        assert_eq!(inflight_gauge(&s).await, 2.0, "{kind}");
        drop(a);
        assert!(
            eventually(Duration::from_secs(5), || async {
                inflight_gauge(&s).await == 1.0
            })
            .await,
            "{kind}: the closed tunnel's slot was not freed"
        );
        let (again, _c) = websocket(&s);
        assert_eq!(again, 101, "{kind}");
    }
}

/// Six at once against a slow upstream: exactly `max` reach it, the rest are 429 with
/// `Retry-After: 1` and the concurrency fields; the gauge shows the slots held, and they are
/// free again when the answers are done.
#[tokio::test]
async fn concurrency_admits_max_in_flight_and_frees_on_completion() {
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, IN_FLIGHT));
        let c = client();
        let url = s.url("/slow?ms=1500");
        let all: Vec<_> = (0..6)
            .map(|_| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move { get(&c, &url, &[]).await })
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(5), || async { up.hits() == 2 }).await,
            "{kind}"
        );
        assert_eq!(inflight_gauge(&s).await, 2.0, "{kind}");
        let mut ok = 0;
        for h in all {
            let r = h.await.unwrap();
            match r.status.as_u16() {
                200 => ok += 1,
                429 => {
                    assert_eq!(r.header("retry-after"), Some("1"), "{kind}");
                    assert_eq!(
                        r.header("ratelimit-policy"),
                        Some("\"api/in-flight\";q=2;qu=\"concurrent-requests\""),
                        "{kind}"
                    );
                    assert_eq!(
                        r.header("ratelimit"),
                        Some("\"api/in-flight\";r=0"),
                        "{kind}"
                    );
                }
                other => panic!("{kind}: status {other}"),
            }
        }
        assert_eq!((ok, up.hits()), (2, 2), "{kind}");
        assert!(
            eventually(Duration::from_secs(5), || async {
                inflight_gauge(&s).await == 0.0
            })
            .await,
            "{kind}"
        );
        // Both slots are free again (sequential requests never hold more than one).
        for _ in 0..3 {
            let r = get(&c, &s.url("/"), &[]).await;
            assert_eq!(r.status, 200, "{kind}");
            assert_eq!(
                r.header("ratelimit"),
                Some("\"api/in-flight\";r=1"),
                "{kind}"
            );
        }
        if let Some(redis) = &redis {
            assert!(
                eventually(Duration::from_secs(5), || async {
                    redis.conn().cmd_ok(&["DBSIZE"]).as_int() == 0
                })
                .await,
                "{kind}: the last release deletes the lease set"
            );
        }
    }
}

/// A client that goes away frees its slot at once, long before the upstream answers; so does
/// a client that stops reading a streamed body (it goes away too).
#[tokio::test]
async fn a_client_that_goes_away_frees_its_slot() {
    let one = IN_FLIGHT.replace("max: 2", "max: 1");
    for (kind, redis) in stores() {
        let up = Upstream::start();
        let s = Sluice::start(&cfg(&store_of(&redis), &up, &one));
        let c = client();
        for path in ["/slow?ms=20000", "/download?bytes=10000000000"] {
            let started = Instant::now();
            let gone = tokio::time::timeout(Duration::from_millis(700), {
                let (c, url) = (client(), s.url(path));
                async move { get(&c, &url, &[]).await }
            })
            .await;
            assert!(gone.is_err(), "{kind}: {path} answered within 700 ms");
            assert!(
                eventually(Duration::from_secs(5), || async {
                    get(&c, &s.url("/"), &[]).await.status == 200
                })
                .await,
                "{kind}: {path}: slot still held"
            );
            assert!(started.elapsed() < Duration::from_secs(10), "{kind}");
            assert!(
                eventually(Duration::from_secs(5), || async {
                    inflight_gauge(&s).await == 0.0
                })
                .await,
                "{kind}"
            );
        }
    }
}

/// Two gateways on one Redis share `max`; a gateway renews the leases of long answers, and
/// when it is SIGKILLed its slots free themselves after `lease`.
#[tokio::test]
async fn two_gateways_share_max_and_a_killed_ones_slots_expire() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let limit = IN_FLIGHT.replace("lease: 30s", "lease: 2s");
    let yaml = cfg(&redis_store(&redis), &up, &limit);
    let mut gws = Sluice::start_together(&[yaml.clone(), yaml]);
    let c = client();
    // Three at once on each: exactly two in flight across both.
    let all: Vec<_> = (0..6)
        .map(|i| {
            let (c, url) = (c.clone(), gws[i % 2].url("/slow?ms=1500"));
            tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for h in all {
        statuses.push(h.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    assert_eq!(up.hits(), 2);

    // Gateway 0 holds both slots for 6 s, three leases long: renewed, never lost.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (c, url) = (client(), gws[0].url("/slow?ms=6000"));
            tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || async { up.hits() == 4 }).await);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let r = get(&c, &gws[1].url("/"), &[]).await;
        assert_eq!(r.status, 429, "a renewed lease is still held");
    }
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }

    // Now gateway 0 dies holding both slots.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (c, url) = (client(), gws[0].url("/slow?ms=30000"));
            tokio::spawn(async move { get(&c, &url, &[]).await })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || async { up.hits() == 6 }).await);
    gws[0].signal("KILL");
    let killed = Instant::now();
    assert_eq!(get(&c, &gws[1].url("/"), &[]).await.status, 429);
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&c, &gws[1].url("/"), &[]).await.status == 200
        })
        .await,
        "the dead gateway's slots never expired"
    );
    // Not before the lease ran out: taken (or last renewed) at most 1 s before the kill,
    // for 2 s.
    assert!(
        killed.elapsed() >= Duration::from_millis(900),
        "{:?}",
        killed.elapsed()
    );
    for h in held {
        h.abort();
    }
    let _ = gws.remove(0);
}

/// Every misuse of the new fields is refused at its own line.
#[test]
fn check_refuses_misused_answer_and_concurrency_fields_at_their_lines() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let limits = [
        (
            "count_when: { status: [401, \"6xx\"] }",
            "is not a status code",
        ),
        ("max: 3", "`max` applies to concurrency limits"),
        ("count_when: { status: [] }", "needs at least one code"),
        (
            "cost: { header: X-Cost, response_header: X-Used, max: 5 }",
            "not both",
        ),
        (
            "cost: { header: X-Cost, max: 5 }\n        count_when: { status: [401] }",
            "with `count_when` the cost is charged after the answer",
        ),
    ];
    let mut yaml = format!(
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nupstreams:\n  up: {{ targets: [{}] }}\nroutes:\n",
        up.url()
    );
    for (i, (field, _)) in limits.iter().enumerate() {
        yaml += &format!(
            "  - name: r{i}\n    match: {{ path_prefix: /{i}/ }}\n    upstream: up\n    limits:\n      - name: l\n        by: ip\n        algorithm: gcra\n        rate: 10/1m\n        {field}\n"
        );
    }
    yaml += "  - name: c1\n    match: { path_prefix: /c1/ }\n    upstream: up\n    limits:\n      - name: l\n        by: ip\n        algorithm: concurrency\n        rate: 10/1m\n        max: 1\n";
    yaml += "  - name: c2\n    match: { path_prefix: /c2/ }\n    upstream: up\n    limits:\n      - name: l\n        by: ip\n        algorithm: concurrency\n        lease: 0s\n";
    yaml += "  - name: c3\n    match: { path_prefix: /c3/ }\n    upstream: up\n    limits:\n      - name: l\n        by: ip\n        algorithm: concurrency\n        max: 0\n";
    yaml += "  - name: c4\n    match: { path_prefix: /c4/ }\n    upstream: up\n    limits:\n      - name: l\n        by: ip\n        algorithm: concurrency\n        burst: 5\n        max: 1\n";
    let (ok, _, err) = check_config(dir.path(), &yaml);
    assert!(!ok);
    let file = dir.path().join("sluice.yaml").display().to_string();
    let line = |needle: &str, nth: usize| {
        let n = yaml
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .nth(nth)
            .unwrap()
            .0;
        format!("{file}:{}:", n + 1)
    };
    let mut want: Vec<(String, &str)> = limits
        .iter()
        .map(|(field, message)| {
            (
                line(field.split('\n').next_back().unwrap().trim(), 0),
                *message,
            )
        })
        .collect();
    want[3].0 = line("response_header: X-Used", 0);
    want[4].0 = line("cost: { header: X-Cost, max: 5 }", 0);
    want.push((line("rate: 10/1m", limits.len()), "not `rate`"));
    want.push((line("- name: l", limits.len() + 1), "needs `max`"));
    want.push((line("max: 0", 0), "max must be at least 1"));
    want.push((
        line("burst: 5", 0),
        "a concurrency limit takes `max` and `lease`, not `burst`",
    ));
    for (at, message) in &want {
        assert!(
            err.lines()
                .any(|l| l.starts_with(at) && l.contains(message)),
            "{message} at {at}:\n{err}"
        );
    }

    let good = format!(
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\n{}",
        cfg("", &up, &format!("{FAILED_LOGINS}{TOKENS}{IN_FLIGHT}"))
    );
    let (ok, out, err) = check_config(dir.path(), &good);
    assert!(ok, "{err}");
    assert!(out.contains("in-flight      concurrency max 2"), "{out}");
}

/// `config/answers.yaml` does what its comments say (against the test upstream, which answers
/// `?status=`, `?tokens=` and `?ms=` like the demo upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_example_config_works_as_its_comments_say() {
    let up = Upstream::start();
    let body = example_config("answers.yaml", &up);
    let s = Sluice::start(&body);
    let c = client();
    let mut logins = Vec::new();
    for _ in 0..4 {
        logins.push(
            get(&c, &s.url("/login?status=401"), &[])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(logins, [401, 401, 401, 429]);
    assert_eq!(get(&c, &s.url("/login"), &[]).await.status, 429);
    let key = [("x-api-key", "k1")];
    let r = get(&c, &s.url("/llm?tokens=900"), &key).await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("ratelimit").unwrap().contains(";r=100;"),
        "{:?}",
        r.header("ratelimit")
    );
    assert_eq!(get(&c, &s.url("/llm?tokens=500"), &key).await.status, 200);
    assert_eq!(get(&c, &s.url("/llm"), &key).await.status, 429);
    let all: Vec<_> = (0..3)
        .map(|_| {
            let (c, url) = (c.clone(), s.url("/slow?ms=2000"));
            tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
        })
        .collect();
    let mut got = Vec::new();
    for h in all {
        got.push(h.await.unwrap());
    }
    got.sort();
    assert_eq!(got, [200, 200, 429]);
}
