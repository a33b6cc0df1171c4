//! The local deny cache in front of Redis, through the real binary on a real redis-server:
//! a hammered key costs one store call per retry window (none at all once an admission took
//! the last unit), the cached 429s carry the same fields as the store's, and the cache never
//! refuses what the store would admit (an admin reset and a reload that raises the limit are
//! seen at once; another cost than the refused one asks the store, so every Retry-After is
//! the store's; an admission that empties a sliding limit keeps nothing; a request refused by
//! another limit charged nothing and caches nothing).

mod support;

use std::time::Duration;

use support::redis::RedisServer;
use support::{client, eventually, get, HttpClient, Reply, Sluice, Upstream};

/// One route whose limits are `limits` (YAML flow mappings, one per line).
fn config_with(redis: &RedisServer, up: &Upstream, limits: &[String]) -> String {
    let limits: String = limits.iter().map(|l| format!("      - {l}\n")).collect();
    format!(
        "store:\n  kind: redis\n  redis: {{ url: \"{}\", timeout: 500ms }}\n  on_error: deny\n\
         upstreams:\n  up: {{ targets: [{}] }}\n\
         routes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n{limits}",
        redis.url(),
        up.url()
    )
}

/// A fixed window of `rate` by IP, each request costing `X-Cost` (default 2, at most 2).
fn config(redis: &RedisServer, up: &Upstream, rate: &str) -> String {
    config_with(
        redis,
        up,
        &[format!(
            "{{ name: per-ip, by: ip, algorithm: fixed_window, rate: {rate}, cost: {{ header: X-Cost, default: 2, max: 2 }} }}"
        )],
    )
}

/// Script calls Redis has served (FCALL of the library; EVALSHA and EVAL where functions are
/// refused).
fn script_calls(redis: &RedisServer) -> u64 {
    let stats = redis.conn().commandstats();
    ["fcall", "evalsha", "eval"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .map(|(calls, _)| calls)
        .sum()
}

async fn hit(c: &HttpClient, s: &Sluice, cost: &str) -> Reply {
    get(c, &s.url("/x"), &[("x-cost", cost)]).await
}

#[tokio::test]
async fn a_hammered_key_costs_one_store_call_per_retry_window() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(&redis, &up, "3/1h"));
    let c = client();
    // A request of cost 2 leaves 1 of 3/1h: the next one is refused by the store …
    assert_eq!(hit(&c, &s, "2").await.status, 200);
    let base = script_calls(&redis);
    let first = hit(&c, &s, "2").await;
    assert_eq!(first.status, 429);
    assert_eq!(script_calls(&redis), base + 1, "the store refused once");
    // … and then by the gateway alone, asking the store again once a second (another
    // gateway may have reset the key), until the window ends.
    let started = std::time::Instant::now();
    for _ in 0..200 {
        let r = hit(&c, &s, "2").await;
        assert_eq!(r.status, 429);
        // The cached answer carries what the store's did.
        for h in [
            "retry-after",
            "ratelimit",
            "ratelimit-policy",
            "x-request-id",
        ] {
            assert!(r.header(h).is_some(), "{h} missing: {:?}", r.headers);
        }
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        let store_retry: u64 = first.header("retry-after").unwrap().parse().unwrap();
        assert!(retry <= store_retry, "{retry} > {store_retry}");
        assert_eq!(r.json()["limit"], "per-ip");
    }
    let held = started.elapsed().as_secs();
    let calls = script_calls(&redis) - base;
    assert!(
        calls <= 2 + held,
        "200 refusals in {held} s asked the store {calls} times, not once a second"
    );
    // Past the hold, one store call refuses (the hour is not over) and is cached again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let base = script_calls(&redis);
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(hit(&c, &s, "2").await.status, 429);
    }
    let (held, calls) = (started.elapsed().as_secs(), script_calls(&redis) - base);
    assert!(
        (1..=1 + held).contains(&calls),
        "20 refusals in {held} s past the hold asked the store {calls} times"
    );
    assert_eq!(up.hits(), 1);
    let m = s.metrics(&c).await;
    assert_eq!(
        support::metric(
            &m,
            "sluice_requests_total",
            &[("route", "r"), ("outcome", "limited")]
        ),
        221.0
    );
    assert_eq!(
        support::metric(
            &m,
            "sluice_limit_decisions_total",
            &[("route", "r"), ("limit", "per-ip"), ("decision", "limited")]
        ),
        221.0
    );
}

#[tokio::test]
async fn the_cache_never_refuses_what_the_store_would_admit() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(&redis, &up, "3/1h"));
    let c = client();
    // 2 of 3 used; a cost-2 request is refused (and cached) …
    assert_eq!(hit(&c, &s, "2").await.status, 200);
    let store_said = hit(&c, &s, "2").await;
    assert_eq!(store_said.status, 429);
    // … and refused again from the cache, with the fields the store gave (1 left).
    let base = script_calls(&redis);
    let cached = hit(&c, &s, "2").await;
    assert_eq!(cached.status, 429);
    assert_eq!(script_calls(&redis), base, "answered from the cache");
    for r in [&store_said, &cached] {
        let fields = r.header("ratelimit").unwrap();
        assert!(fields.contains(";r=1;"), "{fields}");
    }
    // … but a cost-1 request may still fit: it asks the store, which admits it.
    let base = script_calls(&redis);
    assert_eq!(hit(&c, &s, "1").await.status, 200);
    assert_eq!(script_calls(&redis), base + 1);

    // An admin reset is seen at once (the cached refusal is forgotten with the key).
    assert_eq!(hit(&c, &s, "2").await.status, 429);
    let reset = support::send(
        &c,
        http::Method::DELETE,
        &s.admin_url("/admin/limits/r/per-ip?key=127.0.0.1"),
        &[],
        b"",
    )
    .await;
    assert_eq!(reset.status, 204, "{}", reset.text());
    assert_eq!(hit(&c, &s, "2").await.status, 200);

    // A reload that raises the limit is seen at once too.
    assert_eq!(hit(&c, &s, "2").await.status, 429);
    s.rewrite_config(&config(&redis, &up, "10/1h"));
    s.wait_reloads("success", 1.0).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            hit(&c, &s, "2").await.status == 200
        })
        .await,
        "the raised limit was refused from the cache"
    );
}

/// Each gateway keeps its own cache: a key reset through another one (a consumer's top-up)
/// is seen once this one's hold of a second has passed, not when the window ends.
#[tokio::test]
async fn a_reset_through_another_gateway_is_seen_within_the_hold() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let cfg = config(&redis, &up, "2/30d");
    let (one, two) = (Sluice::start(&cfg), Sluice::start(&cfg));
    let c = client();
    assert_eq!(hit(&c, &one, "2").await.status, 200);
    let cached_at = std::time::Instant::now();
    let refused = hit(&c, &two, "2").await;
    assert_eq!(refused.status, 429);
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(wait > 3600, "a month's wait: {wait}");
    let base = script_calls(&redis);
    assert_eq!(hit(&c, &two, "2").await.status, 429);
    // Within the hold (a machine slow enough to take longer asks again, as it should).
    if cached_at.elapsed() < Duration::from_millis(900) {
        assert_eq!(
            script_calls(&redis),
            base,
            "refused from the second gateway's cache"
        );
    }
    let reset = support::send(
        &c,
        http::Method::DELETE,
        &one.admin_url("/admin/limits/r/per-ip?key=127.0.0.1"),
        &[],
        b"",
    )
    .await;
    assert_eq!(reset.status, 204, "{}", reset.text());
    assert!(
        eventually(Duration::from_secs(5), || async {
            hit(&c, &two, "2").await.status == 200
        })
        .await,
        "the second gateway kept refusing a reset key from its cache"
    );
}

#[tokio::test]
async fn an_admission_that_takes_the_last_unit_is_remembered_until_one_is_back() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    // One token every 15 s, 3 at most: after 3 requests the first token is back in 15 s, the
    // bucket full again in 45 s.
    let bucket = "{ name: per-ip, by: ip, algorithm: token_bucket, rate: 4/1m, burst: 3 }";
    let s = Sluice::start(&config_with(&redis, &up, &[bucket.to_owned()]));
    let c = client();
    for _ in 0..3 {
        assert_eq!(hit(&c, &s, "1").await.status, 200);
    }
    let base = script_calls(&redis);
    for _ in 0..50 {
        let r = hit(&c, &s, "1").await;
        assert_eq!(r.status, 429, "{}", r.text());
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(
            (1..=15).contains(&retry),
            "Retry-After {retry}: the wait for one token is at most 15 s, not the 45 s to full"
        );
        assert_eq!(r.json()["limit"], "per-ip");
    }
    assert_eq!(
        script_calls(&redis),
        base,
        "the admission that took the last token already said the next request is refused"
    );
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn a_request_another_limit_refused_charged_nothing_and_caches_nothing() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let limits = [
        "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 2/1h }".to_owned(),
        "{ name: per-key, by: api_key, algorithm: fixed_window, rate: 3/1h, cost: { header: X-Cost, default: 1, max: 3 } }".to_owned(),
    ];
    let s = Sluice::start(&config_with(&redis, &up, &limits));
    let c = client();
    let send = |cost: &'static str| {
        let (c, url) = (&c, s.url("/x"));
        async move { get(c, &url, &[("x-api-key", "k1"), ("x-cost", cost)]).await }
    };
    // per-ip 1 of 2 left, per-key 2 of 3.
    assert_eq!(send("1").await.status, 200);
    // per-ip would take its last unit, but per-key refuses cost 3: nothing is charged …
    let refused = send("3").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["limit"], "per-key");
    // … so per-ip still has its last unit, and the gateway must not have remembered it gone.
    assert_eq!(send("1").await.status, 200, "per-ip was cached as used up");
    // Now it is gone, and both limits say so.
    let last = send("1").await;
    assert_eq!(last.status, 429);
    assert_eq!(last.json()["limit"], "per-ip");
    assert_eq!(up.hits(), 2);
}

/// The cache's `Retry-After` is the store's. A larger cost than the cached refusal's waits
/// longer, by what only the store knows, so it asks the store (with cost 2 cached, a cost-6
/// request on a bucket of one token per 2 s needs 10 s more, not the 2 s the entry says).
#[tokio::test]
async fn a_larger_cost_asks_the_store_for_its_exact_wait() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let bucket = "{ name: per-ip, by: ip, algorithm: token_bucket, rate: 1/2s, burst: 6, cost: { header: X-Cost, default: 1, max: 6 } }";
    let s = Sluice::start(&config_with(&redis, &up, &[bucket.to_owned()]));
    let c = client();
    assert_eq!(hit(&c, &s, "6").await.status, 200);
    // Cost 1 refused from the entry the emptying admission left: 2 s for the first token.
    let one = hit(&c, &s, "1").await;
    assert_eq!(one.status, 429, "{}", one.text());
    let base = script_calls(&redis);
    let six = hit(&c, &s, "6").await;
    assert_eq!(six.status, 429, "{}", six.text());
    assert_eq!(
        script_calls(&redis),
        base + 1,
        "the larger cost asked the store"
    );
    let retry: u64 = six.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (11..=12).contains(&retry),
        "six tokens are 12 s away, not 2: {retry}"
    );
}

/// An admission that empties two limits, one of them sliding (whose reply does not say when
/// its first unit frees), keeps no entry: the other limit's entry would answer with its own
/// wait, shorter than the request's.
#[tokio::test]
async fn an_admission_that_also_empties_a_sliding_limit_caches_nothing() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let limits = [
        "{ name: burst, by: ip, algorithm: gcra, rate: 1/3s }".to_owned(),
        "{ name: hourly, by: ip, algorithm: sliding_log, rate: 1/1h }".to_owned(),
    ];
    let s = Sluice::start(&config_with(&redis, &up, &limits));
    let c = client();
    assert_eq!(hit(&c, &s, "1").await.status, 200);
    let base = script_calls(&redis);
    let r = hit(&c, &s, "1").await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(script_calls(&redis), base + 1, "the store was asked");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry > 3500,
        "the hourly limit's wait, not the burst's 3 s: {retry}"
    );
    assert_eq!(r.json()["limit"], "hourly");
}
