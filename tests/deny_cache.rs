//! The local deny cache in front of Redis, through the real binary on a real redis-server:
//! a hammered key costs one store call per retry window, the cached 429s carry the same fields
//! as the store's, and the cache never refuses what the store would admit (an admin reset and a
//! reload that raises the limit are seen at once; a smaller cost still asks the store).

mod support;

use std::time::Duration;

use support::redis::RedisServer;
use support::{client, eventually, get, HttpClient, Reply, Sluice, Upstream};

fn config(redis: &RedisServer, up: &Upstream, rate: &str) -> String {
    format!(
        "store:\n  kind: redis\n  redis: {{ url: \"{}\", timeout: 500ms }}\n  on_error: deny\n\
         upstreams:\n  up: {{ targets: [{}] }}\n\
         routes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n\
         \x20     - {{ name: per-ip, by: ip, algorithm: fixed_window, rate: {rate}, cost: {{ header: X-Cost, default: 2, max: 2 }} }}\n",
        redis.url(),
        up.url()
    )
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    redis
        .conn()
        .commandstats()
        .get("evalsha")
        .map_or(0, |(calls, _)| *calls)
}

async fn hit(c: &HttpClient, s: &Sluice, cost: &str) -> Reply {
    get(c, &s.url("/x"), &[("x-cost", cost)]).await
}

#[tokio::test]
async fn a_hammered_key_costs_one_store_call_per_retry_window() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(&redis, &up, "4/1h"));
    let c = client();
    // Two requests of cost 2 use up 4/1h.
    for _ in 0..2 {
        assert_eq!(hit(&c, &s, "2").await.status, 200);
    }
    let base = evalsha_calls(&redis);
    let first = hit(&c, &s, "2").await;
    assert_eq!(first.status, 429);
    assert_eq!(evalsha_calls(&redis), base + 1, "the store refused once");
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
    assert_eq!(
        evalsha_calls(&redis),
        base + 1,
        "200 refusals within the retry window asked the store again"
    );
    assert_eq!(up.hits(), 2);
    let m = s.metrics(&c).await;
    assert_eq!(
        support::metric(
            &m,
            "sluice_requests_total",
            &[("route", "r"), ("outcome", "limited")]
        ),
        201.0
    );
    assert_eq!(
        support::metric(
            &m,
            "sluice_limit_decisions_total",
            &[("route", "r"), ("limit", "per-ip"), ("decision", "limited")]
        ),
        201.0
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
    assert_eq!(hit(&c, &s, "2").await.status, 429);
    // … but a cost-1 request may still fit: it asks the store, which admits it.
    let base = evalsha_calls(&redis);
    assert_eq!(hit(&c, &s, "1").await.status, 200);
    assert_eq!(evalsha_calls(&redis), base + 1);

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
