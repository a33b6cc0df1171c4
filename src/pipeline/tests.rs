//! The pipeline's phases driven in-process: outcome precedence, the store-error policies and
//! the header rules, on the embedded store with a manual clock and on a Redis store that is
//! down (a pool pointed at a closed port: a real client that never connects).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use http::header::{CONNECTION, RETRY_AFTER};
use http::HeaderMap;

use super::admit::{Admission, DecisionLabel};
use super::*;
use crate::config::{self, Loaded};
use crate::limiter::store::memory::Clock;
use crate::limiter::store::redis::RedisStore;
use crate::model::policy::RedisMode;
use crate::model::table::RedisSettings;
use crate::telemetry::metrics::Metrics;

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
/// A store time at the start of a minute (so a fresh fixed window resets in exactly 60 s).
const START_US: u64 = 1_800_000_000_000_000;

fn loaded(on_error: &str, limits: &[&str]) -> Loaded {
    let mut yaml = format!(
        "store: {{ on_error: {on_error} }}\nupstreams: {{ up: {{ targets: [http://127.0.0.1:1] }} }}\n\
         routes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n"
    );
    for l in limits {
        yaml.push_str(&format!("      - {l}\n"));
    }
    config::load_str("t.yaml", &yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn live_of(l: Loaded, metrics: &Metrics) -> Live {
    Live::new(l.table, l.file, &l.tls.upstreams, None, metrics, 1)
}

/// Room for every key a test makes: the store holds `max_keys` as 64 shards of
/// `max_keys / 64`, so 64 would be one key per shard, and two keys hashed to one shard would
/// evict each other (which made `a_refusing_limit_wins_and_reports_the_longest_wait` fail about
/// once in 64 runs, the hash being keyed afresh per process).
const KEYS: usize = 64 * 64;

fn memory() -> Store {
    Store::Memory(Arc::new(MemoryStore::new(KEYS, Clock::manual(START_US).0)))
}

/// A Redis store whose server is not there: every decision fails within its timeout.
fn store_down() -> Store {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let settings = RedisSettings {
        url: Some(format!("redis://127.0.0.1:{port}")),
        mode: RedisMode::Standalone,
        nodes: vec![],
        sentinel_service: None,
        password: None,
        pool_size: 1,
        timeout: Duration::from_millis(20),
        key_prefix: "t:".into(),
        startup_timeout: Duration::from_millis(20),
        deny_cache: true,
        tls: None,
    };
    Store::Redis(Arc::new(RedisStore::connect(&settings, None).unwrap()))
}

/// The admit phase for one request with `headers`, as `Gateway::admit` runs it.
async fn admit(
    l: &Loaded,
    store: &Store,
    local: &MemoryStore,
    headers: &HeaderMap,
) -> Result<(Admission, Verdict), GatewayError> {
    let t = &l.table;
    let route = &t.routes[0];
    let mut who = Identity::new(PEER, true, headers, None, &t.client_ip, &t.identities);
    let plan = admit::plan(route, &mut who, headers, &t.consumers, &mut None)?;
    let stores = admit::Stores {
        store,
        local,
        deny: None,
    };
    Ok(admit::decide(route, &Refusal::all(route), plan, stores).await)
}

fn local() -> MemoryStore {
    MemoryStore::new(KEYS, Clock::manual(START_US).0)
}

fn outcome(v: &Result<(Admission, Verdict), GatewayError>) -> Outcome {
    match v {
        Ok((_, Verdict::Pass(o))) => *o,
        Ok((_, Verdict::Refuse(e))) | Err(e) => e.outcome(),
    }
}

#[tokio::test]
async fn a_refusing_limit_wins_and_reports_the_longest_wait() {
    let l = loaded(
        "allow",
        &[
            // Buckets, not windows: a window aligned to the clock could roll over between the
            // two requests and admit the second (seen once under a loaded CI machine).
            "{ name: short, by: ip, algorithm: token_bucket, rate: 1/10s }",
            "{ name: long, by: ip, algorithm: token_bucket, rate: 1/1h }",
        ],
    );
    let (store, local) = (memory(), local());
    let h = HeaderMap::new();
    assert_eq!(
        outcome(&admit(&l, &store, &local, &h).await),
        Outcome::Forwarded
    );
    let second = admit(&l, &store, &local, &h).await.unwrap();
    let Verdict::Refuse(GatewayError::Limited { refusal, .. }) = &second.1 else {
        panic!("{:?}", second.1);
    };
    assert_eq!(
        &*refusal.limit, "long",
        "the limit with the longest wait is reported"
    );
    assert_eq!(second.0.headline.map(|(i, _)| i), Some(1));
    assert!(second
        .0
        .decisions
        .iter()
        .all(|(_, d)| *d == DecisionLabel::Limited));
}

#[tokio::test]
async fn shadow_limits_count_but_never_refuse() {
    let l = loaded(
        "allow",
        &["{ name: s, by: ip, algorithm: fixed_window, rate: 1/1h, shadow: true }"],
    );
    let (store, local) = (memory(), local());
    let h = HeaderMap::new();
    assert_eq!(
        outcome(&admit(&l, &store, &local, &h).await),
        Outcome::Forwarded
    );
    let (adm, verdict) = admit(&l, &store, &local, &h).await.unwrap();
    assert!(matches!(verdict, Verdict::Pass(Outcome::ShadowLimited)));
    assert_eq!(adm.decisions, [(0, DecisionLabel::ShadowLimited)]);
    assert_eq!(adm.headline, None, "a shadow limit is never advertised");
}

#[tokio::test]
async fn store_down_follows_each_policy() {
    let limit = "{ name: a, by: ip, algorithm: gcra, rate: 5/1m }";
    let down = store_down();
    let h = HeaderMap::new();

    let (adm, verdict) = admit(&loaded("allow", &[limit]), &down, &local(), &h)
        .await
        .unwrap();
    assert!(matches!(verdict, Verdict::Pass(Outcome::StoreErrorAllowed)));
    assert_eq!(adm.decisions, [(0, DecisionLabel::Error)]);
    assert!(adm.store.as_ref().is_some_and(|c| c.error.is_some()));

    let denied = admit(&loaded("deny", &[limit]), &down, &local(), &h).await;
    assert_eq!(outcome(&denied), Outcome::StoreErrorDenied);
    let (_, Verdict::Refuse(e)) = denied.unwrap() else {
        panic!("deny must refuse")
    };
    assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);

    // `local` decides on the embedded store: the request passes as store_error_allowed…
    let l = loaded("local", &[limit]);
    let fallback = local();
    let (adm, verdict) = admit(&l, &down, &fallback, &h).await.unwrap();
    assert!(matches!(verdict, Verdict::Pass(Outcome::StoreErrorAllowed)));
    assert_eq!(adm.decisions, [(0, DecisionLabel::Allowed)]);
    // …and is limited by it like by any store.
    for _ in 0..4 {
        admit(&l, &down, &fallback, &h).await.unwrap();
    }
    assert_eq!(
        outcome(&admit(&l, &down, &fallback, &h).await),
        Outcome::Limited
    );
}

#[tokio::test]
async fn shadow_limited_outranks_store_error_allowed() {
    let l = loaded(
        "local",
        &["{ name: s, by: ip, algorithm: fixed_window, rate: 1/1h, shadow: true }"],
    );
    let (down, fallback, h) = (store_down(), local(), HeaderMap::new());
    admit(&l, &down, &fallback, &h).await.unwrap();
    let (_, verdict) = admit(&l, &down, &fallback, &h).await.unwrap();
    assert!(
        matches!(verdict, Verdict::Pass(Outcome::ShadowLimited)),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_missing_identity_or_bad_cost_is_answered_before_any_store_call() {
    let l = loaded(
        "allow",
        &["{ name: k, by: api_key, on_missing: reject, algorithm: gcra, rate: 5/1m }"],
    );
    let r = admit(&l, &store_down(), &local(), &HeaderMap::new()).await;
    assert_eq!(outcome(&r), Outcome::RejectedIdentity);
    assert_eq!(r.unwrap_err().status(), StatusCode::UNAUTHORIZED);

    let l = loaded(
        "allow",
        &["{ name: c, by: ip, algorithm: gcra, rate: 5/1m, cost: { header: X-Cost, default: 1, max: 3 } }"],
    );
    let mut h = HeaderMap::new();
    h.insert("x-cost", "4".parse().unwrap());
    let r = admit(&l, &store_down(), &local(), &h).await;
    assert_eq!(r.unwrap_err().status(), StatusCode::BAD_REQUEST);

    // A cost given twice: charged one way, acted on the other.
    let mut h = HeaderMap::new();
    h.append("x-cost", "1".parse().unwrap());
    h.append("x-cost", "3".parse().unwrap());
    let r = admit(&l, &store_down(), &local(), &h).await;
    assert_eq!(outcome(&r), Outcome::RejectedIdentity);
    assert_eq!(r.unwrap_err().status(), StatusCode::BAD_REQUEST);
}

/// SPEC §2 `shadow: true`: "never reject", also where an enforced limit would answer before
/// any store call (a missing identity under `on_missing: reject`, a bad cost header).
#[tokio::test]
async fn a_shadow_limit_never_refuses_for_a_missing_identity_or_a_bad_cost() {
    let l = loaded(
        "allow",
        &[
            "{ name: s, by: api_key, on_missing: reject, algorithm: gcra, rate: 5/1m, shadow: true, cost: { header: X-Cost, default: 1, max: 3 } }",
            "{ name: e, by: ip, algorithm: gcra, rate: 5/1m }",
        ],
    );
    let (store, local) = (memory(), local());
    let mut bad_cost = HeaderMap::new();
    bad_cost.insert("x-api-key", "k1".parse().unwrap());
    bad_cost.insert("x-cost", "4".parse().unwrap());
    for h in [HeaderMap::new(), bad_cost] {
        let (adm, verdict) = admit(&l, &store, &local, &h).await.unwrap();
        assert!(
            matches!(verdict, Verdict::Pass(Outcome::ShadowLimited)),
            "{verdict:?}"
        );
        assert_eq!(
            adm.decisions,
            vec![
                (0, DecisionLabel::ShadowLimited),
                (1, DecisionLabel::Allowed)
            ]
        );
    }

    // Alone on its route: no store call at all (the store is down and would refuse).
    let l = loaded(
        "deny",
        &["{ name: s, by: api_key, on_missing: reject, algorithm: gcra, rate: 5/1m, shadow: true }"],
    );
    let (adm, verdict) = admit(&l, &store_down(), &local, &HeaderMap::new())
        .await
        .unwrap();
    assert!(matches!(verdict, Verdict::Pass(Outcome::ShadowLimited)));
    assert!(adm.store.is_none(), "{:?}", adm.store);
    // But a key given twice is a malformed request, whatever limit reads it.
    let mut twice = HeaderMap::new();
    twice.append("x-api-key", "a".parse().unwrap());
    twice.append("x-api-key", "b".parse().unwrap());
    let r = admit(&l, &store_down(), &local, &twice).await;
    assert_eq!(r.unwrap_err().status(), StatusCode::BAD_REQUEST);

    // With an enforced limit whose store call fails under `allow`: shadow_limited outranks
    // store_error_allowed.
    let l = loaded(
        "allow",
        &[
            "{ name: s, by: api_key, on_missing: reject, algorithm: gcra, rate: 5/1m, shadow: true }",
            "{ name: e, by: ip, algorithm: gcra, rate: 5/1m }",
        ],
    );
    let (adm, verdict) = admit(&l, &store_down(), &local, &HeaderMap::new())
        .await
        .unwrap();
    assert!(matches!(verdict, Verdict::Pass(Outcome::ShadowLimited)));
    assert_eq!(
        adm.decisions,
        vec![(0, DecisionLabel::ShadowLimited), (1, DecisionLabel::Error)]
    );
}

#[test]
fn every_gateway_answer_is_rendered_in_one_shape() {
    let limited = GatewayError::Limited {
        refusal: Arc::new(Refusal::new("r".into(), "l".into())),
        retry_after: 7,
    };
    assert_eq!(limited.outcome(), Outcome::Limited);
    let res = limited.into_response();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()[RETRY_AFTER],
        "7",
        "Retry-After is set with the 429"
    );
    assert_eq!(
        res.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );

    let res = GatewayError::Unframeable("te".into()).into_response();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()[CONNECTION], "close");
    let res = GatewayError::BadRequest("path".into()).into_response();
    assert!(
        res.headers().get(CONNECTION).is_none(),
        "a bad path keeps the connection"
    );

    for (e, o) in [
        (GatewayError::NoRoute, Outcome::NoRoute),
        (
            GatewayError::Upstream(ForwardError::Timeout("t".into())),
            Outcome::UpstreamError,
        ),
        (
            GatewayError::Upstream(ForwardError::ClientBody("b".into())),
            Outcome::RejectedRequest,
        ),
        (
            GatewayError::Upstream(ForwardError::ClientBodyTimeout(Duration::from_secs(1))),
            Outcome::RejectedRequest,
        ),
        (
            GatewayError::MethodNotAllowed(http::Method::CONNECT),
            Outcome::RejectedRequest,
        ),
    ] {
        assert_eq!(e.outcome(), o, "{e}");
    }
}

#[tokio::test]
async fn respond_advertises_the_headline_limit_and_always_the_request_id() {
    let l = loaded(
        "allow",
        &["{ name: per-ip, by: ip, algorithm: fixed_window, rate: 5/1m }"],
    );
    let (store, local) = (memory(), local());
    let (adm, _) = admit(&l, &store, &local, &HeaderMap::new()).await.unwrap();
    let metrics = Metrics::new();
    let gw = Gateway {
        live: ArcSwap::from_pointee(live_of(
            loaded(
                "allow",
                &["{ name: x, by: ip, algorithm: gcra, rate: 1/1s }"],
            ),
            &metrics,
        )),
        store: memory(),
        local: Arc::new(self::local()),
        store_metrics: metrics.store("memory"),
        deny: None,
        metrics,
    };
    let live = Arc::new(live_of(l, &gw.metrics));
    let parts = Request::builder()
        .uri("/x")
        .header(X_REQUEST_ID, "rid-1")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut ctx = Ctx::new(live, parts, Arc::new(ConnInfo::plain((PEER, 1234).into())));

    // No route matched: only the request id.
    let res = gw.respond(&ctx, Response::new(body::empty()));
    assert!(res.headers().get("ratelimit").is_none());
    assert_eq!(res.headers()[X_REQUEST_ID], "rid-1");

    ctx.route = Some(0);
    ctx.admission = adm;
    // A gateway answer gets its request id here too (`into_response` leaves it out).
    let refused = GatewayError::Limited {
        refusal: Arc::new(Refusal::new("r".into(), "per-ip".into())),
        retry_after: 60,
    };
    let res = gw.respond(&ctx, refused.into_response());
    assert_eq!(res.headers()[X_REQUEST_ID], "rid-1");
    assert_eq!(res.headers()["ratelimit"], "\"r/per-ip\";r=4;t=60");
    assert_eq!(res.headers()["ratelimit-policy"], "\"r/per-ip\";q=5;w=60");
}
