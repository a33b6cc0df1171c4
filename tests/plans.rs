//! Consumers and plans through the real binary, on the embedded store, a standalone Redis and
//! a Redis Cluster: each tier's limits exact, one quota across a consumer's keys and across
//! routes, all-or-nothing with the route's own limits, 401 on `required` routes, the anonymous
//! plan, a plan change by reload keeping counters, a `consumers_file` reloaded by itself,
//! `headers: false`, the admin API, `sluice check` errors at their positions, and no consumer
//! name or key in logs, metrics or Redis.

mod support;

use std::time::Duration;

use sha2::{Digest, Sha256};
use support::redis::{RedisCluster, RedisServer};
use support::{
    check_config, client, eventually, example_config, get, metric, send, HttpClient, Sluice,
    Upstream,
};

const FREE_KEY: &str = "free-key-Zq81";
const FREE_KEY_2: &str = "free-key-rotated-Pw02";
const PRO_KEY: &str = "pro-key-Xy77";

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Plans: free (3 a minute, 5 a month), pro (10 a minute); `tinkerer` holds two free keys
/// (one as a digest), `bigco` a pro key. `store` is the whole store section.
fn config(up: &Upstream, store: &str, extra: &str) -> String {
    format!(
        "{store}
client_ip: {{ trusted_proxies: [127.0.0.1/32] }}
identities:
  api_key: {{ header: X-API-Key }}
plans:
  free:
    limits:
      - {{ name: per-minute, algorithm: sliding_log, rate: 3/1m }}
      - {{ name: monthly, algorithm: fixed_window, rate: 5/month }}
  pro:
    limits:
      - {{ name: per-minute, algorithm: sliding_log, rate: 10/1m }}
      - {{ name: monthly, algorithm: fixed_window, rate: 1000000/month }}
consumers:
  - name: tinkerer
    plan: free
    keys: [{FREE_KEY}]
    keys_sha256: [{}]
  - name: bigco
    plan: pro
    keys: [{PRO_KEY}]
upstreams:
  up: {{ targets: [{}] }}
routes:
  - name: a
    match: {{ path_prefix: /a }}
    upstream: up
    consumers: required
    limits:
      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 100/1m }}
  - name: b
    match: {{ path_prefix: /b }}
    upstream: up
    consumers: required
  - name: open
    match: {{ path_prefix: /open }}
    upstream: up
    consumers: optional
    limits:
      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 2/1m }}
{extra}",
        sha256_hex(FREE_KEY_2),
        up.url()
    )
}

const MEMORY: &str = "store: { kind: memory }";

fn redis_store(map: &str) -> String {
    format!("store:\n  kind: redis\n  redis: {map}\n  on_error: deny")
}

async fn status(c: &HttpClient, s: &Sluice, path: &str, headers: &[(&str, &str)]) -> u16 {
    get(c, &s.url(path), headers).await.status.as_u16()
}

async fn statuses(c: &HttpClient, s: &Sluice, path: &str, key: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(status(c, s, path, &[("x-api-key", key)]).await);
    }
    out
}

/// The tiers, shared quotas and all-or-nothing, on whatever store `store` names.
async fn tiers_and_quotas(store: &str) {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, store, ""));
    let c = client();

    // pro: 10 a minute.
    let pro = statuses(&c, &s, "/a", PRO_KEY, 11).await;
    assert_eq!(pro.iter().filter(|&&x| x == 200).count(), 10, "{pro:?}");
    assert_eq!(pro[10], 429);

    // free: 3 a minute, across the consumer's two keys and across routes a and b.
    let mut free = statuses(&c, &s, "/a", FREE_KEY, 2).await;
    free.extend(statuses(&c, &s, "/b/x", FREE_KEY_2, 2).await);
    assert_eq!(
        free,
        [200, 200, 200, 429],
        "one quota for two keys on two routes"
    );
    let r = get(&c, &s.url("/a"), &[("x-api-key", FREE_KEY)]).await;
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
    let policy = r.header("ratelimit-policy").unwrap();
    assert!(
        policy.starts_with("\"a/free/per-minute\";q=3;w=60"),
        "{policy}"
    );

    // The plan's monthly limit was charged 3 times (the refused requests charged nothing).
    let doc = get(&c, &s.admin_url("/admin/consumers/tinkerer"), &[])
        .await
        .json();
    assert_eq!(doc["plan"], "free");
    // A name is percent-decoded, as route and limit names are.
    let encoded = get(&c, &s.admin_url("/admin/consumers/%74inkerer"), &[]).await;
    assert_eq!(encoded.status, 200, "{}", encoded.text());
    assert_eq!(encoded.json()["name"], "tinkerer");
    let monthly = doc["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "monthly")
        .unwrap();
    assert_eq!(monthly["remaining"], 2, "{doc}");
    assert_eq!(monthly["quota"], 5);
    assert!(monthly["reset_seconds"].as_u64().unwrap() <= 31 * 86_400);

    // All-or-nothing with the route's own limit: `open` allows 2 per IP; the third request is
    // refused by it and charges the plan nothing (bigco's minute is reset first).
    let reset = send(
        &c,
        http::Method::DELETE,
        &s.admin_url("/admin/consumers/bigco"),
        &[],
        b"",
    )
    .await;
    assert_eq!(reset.status, 204);
    let ip = ("x-forwarded-for", "198.51.100.9");
    let pro_before = remaining(&c, &s, "bigco", "monthly").await;
    for want in [200, 200, 429] {
        assert_eq!(
            status(&c, &s, "/open", &[("x-api-key", PRO_KEY), ip]).await,
            want
        );
    }
    assert_eq!(remaining(&c, &s, "bigco", "monthly").await, pro_before - 2);

    // Reset through the admin API: the free consumer passes again.
    let r = send(
        &c,
        http::Method::DELETE,
        &s.admin_url("/admin/consumers/tinkerer"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        status(&c, &s, "/a", &[("x-api-key", FREE_KEY_2)]).await,
        200
    );
    assert_eq!(
        get(&c, &s.admin_url("/admin/consumers/nobody"), &[])
            .await
            .status,
        404
    );
}

/// Days in the current UTC month, by the calendar (not by the gateway's arithmetic).
fn days_this_month() -> u64 {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y %m"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (y, m) = text.trim().split_once(' ').unwrap();
    let (y, m): (u64, u64) = (y.parse().unwrap(), m.parse().unwrap());
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monthly_limit_advertises_the_current_months_length() {
    let up = Upstream::start();
    let y = config(&up, MEMORY, "").replace("rate: 5/month", "rate: 1/month");
    let s = Sluice::start(&y);
    let c = client();
    assert_eq!(status(&c, &s, "/a", &[("x-api-key", FREE_KEY)]).await, 200);
    let r = get(&c, &s.url("/a"), &[("x-api-key", FREE_KEY)]).await;
    assert_eq!(r.status, 429);
    let days = days_this_month();
    let policy = r.header("ratelimit-policy").unwrap();
    assert_eq!(
        policy,
        format!("\"a/free/monthly\";q=1;w={}", days * 86_400),
        "(a month boundary between the two requests would also change this)"
    );
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry <= days * 86_400, "{retry}");
}

async fn remaining(c: &HttpClient, s: &Sluice, consumer: &str, limit: &str) -> u64 {
    let doc = get(
        c,
        &s.admin_url(&format!("/admin/consumers/{consumer}")),
        &[],
    )
    .await
    .json();
    doc["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == limit)
        .unwrap()["remaining"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_and_quotas_on_the_embedded_store() {
    tiers_and_quotas(MEMORY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_and_quotas_on_redis() {
    let redis = RedisServer::start();
    tiers_and_quotas(&redis_store(&format!("{{ url: \"{}\" }}", redis.url()))).await;
    secrets_absent_from_redis(&mut redis.conn());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_and_quotas_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    tiers_and_quotas(&redis_store(&cluster.store_map(""))).await;
    cluster.for_each_node(secrets_absent_from_redis);
}

/// No consumer name or key, plain or hashed in full, in any Redis key or value.
fn secrets_absent_from_redis(conn: &mut support::redis::Conn) {
    let keys = conn.cmd_ok(&["KEYS", "*"]).as_array();
    let secrets = [
        "tinkerer".to_string(),
        "bigco".to_string(),
        FREE_KEY.to_string(),
        FREE_KEY_2.to_string(),
        PRO_KEY.to_string(),
        sha256_hex(FREE_KEY),
        sha256_hex(FREE_KEY_2),
        sha256_hex(PRO_KEY),
    ];
    for k in keys {
        let k = k.as_str();
        let dump = format!("{k} {:?}", conn.cmd(&["DUMP", &k]));
        for s in &secrets {
            assert!(!dump.contains(s.as_str()), "`{s}` in Redis: {dump}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_missing_keys_on_required_and_optional_routes() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, MEMORY, ""));
    let c = client();
    let r = get(&c, &s.url("/a"), &[]).await;
    assert_eq!(r.status, 401);
    assert!(
        r.text().contains("this route needs an API key"),
        "{}",
        r.text()
    );
    // RFC 9110 §15.5.2: every 401 carries a challenge.
    assert_eq!(r.header("www-authenticate"), Some("Key realm=\"sluice\""));
    let r = get(&c, &s.url("/a"), &[("x-api-key", "nobody's key")]).await;
    assert_eq!(r.status, 401);
    assert!(r.text().contains("belongs to no consumer"), "{}", r.text());
    assert_eq!(r.header("www-authenticate"), Some("Key realm=\"sluice\""));
    // optional: only the route's own limit (2 per IP).
    let ip = ("x-forwarded-for", "203.0.113.4");
    let got = [
        status(&c, &s, "/open", &[ip]).await,
        status(&c, &s, "/open", &[("x-api-key", "nobody's key"), ip]).await,
        status(&c, &s, "/open", &[ip]).await,
    ];
    assert_eq!(got, [200, 200, 429]);
    assert_eq!(up.hits(), 2);
    let m = s.metrics(&c).await;
    assert_eq!(
        metric(
            &m,
            "sluice_requests_total",
            &[("route", "a"), ("outcome", "rejected_identity")]
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anonymous_plan_is_kept_per_client_address() {
    anonymous_plan(MEMORY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anonymous_plan_on_redis() {
    let redis = RedisServer::start();
    anonymous_plan(&redis_store(&format!("{{ url: \"{}\" }}", redis.url()))).await;
}

async fn anonymous_plan(store: &str) {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, store, "anonymous_plan: free\n"));
    let c = client();
    let from = |ip: &'static str| [("x-forwarded-for", ip), ("x-api-key", "unknown-key")];
    let first = [
        status(&c, &s, "/a", &from("192.0.2.1")).await,
        status(&c, &s, "/a", &from("192.0.2.1")).await,
        status(&c, &s, "/b", &from("192.0.2.1")).await,
        status(&c, &s, "/a", &from("192.0.2.1")).await,
    ];
    assert_eq!(first, [200, 200, 200, 429], "the free plan, per address");
    assert_eq!(status(&c, &s, "/a", &from("192.0.2.2")).await, 200);
    // No key at all is anonymous too on a required route, once there is an anonymous plan.
    assert_eq!(
        status(&c, &s, "/a", &[("x-forwarded-for", "192.0.2.3")]).await,
        200
    );
    let m = s.metrics(&c).await;
    assert_eq!(
        metric(
            &m,
            "sluice_plan_requests_total",
            &[("plan", "_anonymous"), ("outcome", "forwarded")]
        ),
        5.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_plan_requests_total",
            &[("plan", "_anonymous"), ("outcome", "limited")]
        ),
        1.0
    );
}

/// A consumer's request refused for its cost header (400, after its plan is known) counts on
/// its plan as on its route: `rejected_identity` stayed at 0 for every plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_bad_cost_header_counts_on_its_plan() {
    let up = Upstream::start();
    let extra = "  - name: costly
    match: { path_prefix: /costly }
    upstream: up
    consumers: required
    limits:
      - { name: units, by: ip, algorithm: fixed_window, rate: 1000/1m, cost: { header: X-Cost, default: 1, max: 10 } }
";
    let s = Sluice::start(&config(&up, MEMORY, extra));
    let c = client();
    let key = [("x-api-key", PRO_KEY)];
    let bad = [("x-api-key", PRO_KEY), ("x-cost", "99")];
    let got = [
        status(&c, &s, "/costly", &key).await,
        status(&c, &s, "/costly", &bad).await,
        status(&c, &s, "/costly", &bad).await,
    ];
    assert_eq!(got, [200, 400, 400]);
    let m = s.metrics(&c).await;
    let count = |outcome| {
        let plan = metric(
            &m,
            "sluice_plan_requests_total",
            &[("plan", "pro"), ("outcome", outcome)],
        );
        let route = metric(
            &m,
            "sluice_requests_total",
            &[("route", "costly"), ("outcome", outcome)],
        );
        (plan, route)
    };
    assert_eq!(count("forwarded"), (1.0, 1.0));
    assert_eq!(count("rejected_identity"), (2.0, 2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_change_by_reload_keeps_the_counters_of_same_named_limits() {
    plan_change(MEMORY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_change_by_reload_on_redis() {
    let redis = RedisServer::start();
    plan_change(&redis_store(&format!("{{ url: \"{}\" }}", redis.url()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_change_by_reload_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    plan_change(&redis_store(&cluster.store_map(""))).await;
}

async fn plan_change(store: &str) {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, store, ""));
    let c = client();
    assert_eq!(statuses(&c, &s, "/a", FREE_KEY, 2).await, [200, 200]);
    assert_eq!(remaining(&c, &s, "tinkerer", "monthly").await, 3);
    // tinkerer moves to pro: `monthly` (fixed_window) keeps its count, now out of 1 000 000.
    let moved = config(&up, store, "").replacen("    plan: free\n", "    plan: pro\n", 1);
    s.replace_config(&moved);
    let c2 = c.clone();
    let s_ref = &s;
    let upgraded = eventually(Duration::from_secs(10), move || {
        let c = c2.clone();
        async move {
            let doc = get(&c, &s_ref.admin_url("/admin/consumers/tinkerer"), &[])
                .await
                .json();
            doc["plan"] == "pro"
        }
    })
    .await;
    assert!(upgraded, "{}", s.log());
    assert_eq!(remaining(&c, &s, "tinkerer", "monthly").await, 999_998);
    assert_eq!(remaining(&c, &s, "tinkerer", "per-minute").await, 8);
    let more = statuses(&c, &s, "/a", FREE_KEY, 8).await;
    assert!(more.iter().all(|&x| x == 200), "{more:?}");
    assert_eq!(status(&c, &s, "/a", &[("x-api-key", FREE_KEY)]).await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_file_reloads_by_itself_and_a_bad_one_keeps_the_old_list() {
    let up = Upstream::start();
    let base = config(&up, MEMORY, "");
    // The same config with its consumers in their own file.
    let start = base.find("consumers:\n  - name: tinkerer").unwrap();
    let end = base.find("upstreams:").unwrap();
    let inline = &base[start..end];
    let list: String = inline
        .lines()
        .skip(1)
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    let yaml = format!(
        "{}consumers_file: consumers.yaml\n{}",
        &base[..start],
        &base[end..]
    );
    // The harness writes the config into its own directory: put the list beside it first.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumers.yaml");
    std::fs::write(&path, &list).unwrap();
    let yaml = yaml.replace(
        "consumers_file: consumers.yaml",
        &format!("consumers_file: {}", path.display()),
    );
    let s = Sluice::start(&yaml);
    let c = client();
    assert_eq!(status(&c, &s, "/a", &[("x-api-key", PRO_KEY)]).await, 200);
    assert_eq!(
        status(&c, &s, "/a", &[("x-api-key", "newcomer-key")]).await,
        401
    );
    let v0 = served_version(&c, &s).await;

    // A new consumer, written by rename-over: served without touching the config.
    let added = format!("{list}- name: newcomer\n  plan: pro\n  keys: [newcomer-key]\n");
    let tmp = dir.path().join(".consumers.tmp");
    std::fs::write(&tmp, &added).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let c2 = c.clone();
    let s_ref = &s;
    let known = eventually(Duration::from_secs(10), move || {
        let c = c2.clone();
        async move { status(&c, s_ref, "/a", &[("x-api-key", "newcomer-key")]).await == 200 }
    })
    .await;
    assert!(known, "{}", s.log());
    // The config file did not change, yet what it serves did: the version says so, so that
    // instances serving different consumer lists show different versions.
    let v1 = served_version(&c, &s).await;
    assert_ne!(v1, v0, "the version must cover the consumers_file");
    // `/admin/config` shows the consumers serving, by name and plan, never a key.
    let doc = get(&c, &s.admin_url("/admin/config"), &[]).await;
    let shown = &doc.json()["config"]["consumers"];
    let names: Vec<(&str, &str)> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["name"].as_str().unwrap(), k["plan"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("tinkerer", "free"), ("bigco", "pro"), ("newcomer", "pro")],
        "{shown}"
    );
    assert!(!doc.text().contains("newcomer-key") && !doc.text().contains(PRO_KEY));

    // A broken list: refused at its own FILE:LINE:COL, and the previous list keeps serving.
    let broken = format!("{added}- name: newcomer\n  plan: gold\n  keys: [x]\n");
    std::fs::write(&tmp, &broken).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    s.wait_reloads("error", 1.0).await;
    let log = s.wait_log(&["config reload rejected"]);
    let at = format!("{}:", path.display());
    assert!(
        log.contains(&at) && log.contains("unknown plan `gold`"),
        "{log}"
    );
    assert!(log.contains("duplicate consumer `newcomer`"), "{log}");
    assert_eq!(
        status(&c, &s, "/a", &[("x-api-key", "newcomer-key")]).await,
        200
    );
    assert_eq!(
        served_version(&c, &s).await,
        v1,
        "a refused list changes nothing"
    );

    // Emptied (or only comments left): no list at all is refused too, rather than read as
    // no consumers, which would refuse every request of a `consumers: required` route.
    std::fs::write(&tmp, "# all gone\n").unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    s.wait_reloads("error", 2.0).await;
    let log = s.wait_log(&["consumers_file holds no list"]);
    assert!(log.contains(&format!("{}:1:1:", path.display())), "{log}");
    assert_eq!(status(&c, &s, "/a", &[("x-api-key", PRO_KEY)]).await, 200);
    assert_eq!(served_version(&c, &s).await, v1);
}

/// The version `/admin/config` shows, checked against `sluice_config_info`'s only series.
async fn served_version(c: &HttpClient, s: &Sluice) -> String {
    let doc = get(c, &s.admin_url("/admin/config"), &[]).await.text();
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let version = doc["version"].as_str().unwrap().to_owned();
    let m = s.metrics(c).await;
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("sluice_config_info{"))
        .collect();
    assert_eq!(series.len(), 1, "{m}");
    assert_eq!(
        metric(&m, "sluice_config_info", &[("version", &version)]),
        1.0,
        "{m}"
    );
    version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_logs_and_metrics() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, MEMORY, ""));
    let c = client();
    for key in [FREE_KEY, FREE_KEY_2, PRO_KEY, "unknown-key-Qq"] {
        for path in ["/a", "/b", "/open"] {
            let _ = status(&c, &s, path, &[("x-api-key", key)]).await;
        }
    }
    let m = s.metrics(&c).await;
    assert!(
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[
                ("route", "a"),
                ("limit", "free/per-minute"),
                ("decision", "allowed")
            ]
        ) > 0.0,
        "{m}"
    );
    assert!(
        metric(
            &m,
            "sluice_plan_requests_total",
            &[("plan", "pro"), ("outcome", "forwarded")]
        ) > 0.0
    );
    // Logs are flushed every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let log = s.log();
    let admin_config = get(&c, &s.admin_url("/admin/config"), &[]).await.text();
    for secret in [
        FREE_KEY,
        FREE_KEY_2,
        PRO_KEY,
        "unknown-key-Qq",
        &sha256_hex(FREE_KEY),
    ] {
        assert!(!m.contains(secret), "{secret} in metrics");
        assert!(!log.contains(secret), "{secret} in the log");
        assert!(!admin_config.contains(secret), "{secret} in /admin/config");
    }
    for name in ["tinkerer", "bigco"] {
        assert!(!m.contains(name), "{name} in metrics");
        assert!(!log.contains(name), "{name} in the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_limit_refuses_with_retry_after_but_no_ratelimit_fields() {
    let up = Upstream::start();
    let y = config(&up, MEMORY, "").replace(
        "      - { name: per-ip, by: ip, algorithm: sliding_log, rate: 2/1m }",
        "      - { name: per-ip, by: ip, algorithm: sliding_log, rate: 2/1m, headers: false }",
    );
    let s = Sluice::start(&y);
    let c = client();
    let ip = ("x-forwarded-for", "198.51.100.50");
    // Without a key only the hidden limit applies: never advertised.
    let r = get(&c, &s.url("/open"), &[ip]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("ratelimit").is_none() && r.header("ratelimit-policy").is_none());
    // With a key, the plan's limits are the ones shown.
    let r = get(&c, &s.url("/open"), &[ip, ("x-api-key", PRO_KEY)]).await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("ratelimit").unwrap().contains("open/pro/"),
        "{:?}",
        r.headers
    );
    // Refused by the hidden limit: Retry-After, and no field names it.
    let r = get(&c, &s.url("/open"), &[ip, ("x-api-key", PRO_KEY)]).await;
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
    for h in ["ratelimit", "ratelimit-policy"] {
        assert!(
            r.header(h).is_none_or(|v| !v.contains("per-ip")),
            "{h}: {:?}",
            r.header(h)
        );
    }
}

fn line_of(text: &str, needle: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(nth)
        .unwrap()
        .0
        + 1
}

#[test]
fn check_lists_plans_and_refuses_bad_consumers_at_their_positions() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\n{}",
        config(&up, MEMORY, "anonymous_plan: free\n")
    );
    let (ok, out, err) = check_config(dir.path(), &good);
    assert!(ok, "{err}");
    assert!(out.contains("plans 2 (anonymous: free):"), "{out}");
    assert!(out.contains("free                 1 consumer(s)"), "{out}");
    assert!(out.contains("pro                  1 consumer(s)"), "{out}");

    let bad = good
        .replacen("    plan: pro\n", "    plan: gold\n", 1)
        .replacen("  - name: bigco\n", "  - name: tinkerer\n", 1)
        .replace(
            &format!("keys: [{PRO_KEY}]"),
            &format!("keys: [{PRO_KEY}, {FREE_KEY}]"),
        )
        .replacen(&sha256_hex(FREE_KEY_2), "abc123", 1)
        .replace("anonymous_plan: free", "anonymous_plan: platinum");
    let (ok, _, err) = check_config(dir.path(), &bad);
    assert!(!ok);
    let file = dir.path().join("sluice.yaml").display().to_string();
    let at = |needle: &str, nth: usize| format!("{file}:{}:", line_of(&bad, needle, nth));
    for (needle, nth, message) in [
        ("keys_sha256", 0, "not a SHA-256 digest"),
        ("name: tinkerer", 1, "duplicate consumer `tinkerer`"),
        ("plan: gold", 0, "unknown plan `gold`"),
        ("anonymous_plan", 0, "unknown plan `platinum`"),
    ] {
        let want = at(needle, nth);
        assert!(
            err.lines()
                .any(|l| l.starts_with(&want) && l.contains(message)),
            "{message} at {want}:\n{err}"
        );
    }
    // One key under two consumers: only reachable once the plan is known.
    let two = good.replace(
        &format!("keys: [{PRO_KEY}]"),
        &format!("keys: [{PRO_KEY}, {FREE_KEY}]"),
    );
    let (ok, _, err) = check_config(dir.path(), &two);
    assert!(!ok);
    assert!(
        err.contains("this key already belongs to consumer `tinkerer`"),
        "{err}"
    );
    assert!(
        !err.contains(FREE_KEY),
        "the key itself is never echoed: {err}"
    );
    // One key twice under one consumer, in `keys` and in `keys_sha256`: an error at its
    // position (it panicked once: the consumer was not in the list yet).
    let twice = good.replace(
        &format!("keys: [{PRO_KEY}]"),
        &format!(
            "keys: [{PRO_KEY}, {PRO_KEY}]\n    keys_sha256: [{}]",
            sha256_hex(PRO_KEY)
        ),
    );
    let (ok, _, err) = check_config(dir.path(), &twice);
    assert!(!ok, "{twice}");
    // The digest is read first; both `keys` entries then repeat it.
    assert_eq!(
        err.matches("this key is already listed for consumer `bigco`")
            .count(),
        2,
        "{err}"
    );
    assert!(!err.contains("panicked") && !err.contains(PRO_KEY), "{err}");
    // A bare `null` or `~` is no key (a template that rendered nothing), not the guessable
    // key "null"; quoted, it is a key like any other.
    for bare in ["null", "~", "Null", "NULL"] {
        let none = good.replace(
            &format!("keys: [{PRO_KEY}]"),
            &format!("keys: [{PRO_KEY}, {bare}]"),
        );
        let (ok, _, err) = check_config(dir.path(), &none);
        assert!(!ok, "`{bare}` was taken for a key");
        let want = at("keys: [", 1);
        assert!(
            err.lines().any(|l| l.starts_with(&want)
                && l.contains("an API key may not be empty (a bare `null` or `~`")),
            "{want}:\n{err}"
        );
    }
    let quoted = good.replace(
        &format!("keys: [{PRO_KEY}]"),
        &format!("keys: [{PRO_KEY}, \"null\"]"),
    );
    let (ok, _, err) = check_config(dir.path(), &quoted);
    assert!(ok, "{err}");
    // With API keys (or users) read from nowhere, a `consumers:` route could only answer 401
    // (or never find a consumer), and a limit by them never apply as written.
    let keyless = good
        .replace(
            "  api_key: { header: X-API-Key }",
            "  api_key: {}\n  user: {}",
        )
        .replacen(
            "{ name: per-ip, by: ip, algorithm: sliding_log, rate: 100/1m }",
            "{ name: per-ip, by: user, algorithm: sliding_log, rate: 100/1m }",
            1,
        );
    let (ok, _, err) = check_config(dir.path(), &keyless);
    assert!(!ok, "{keyless}");
    for (needle, nth, message) in [
        (
            "consumers: required",
            0,
            "consumers are found by API key, and `identities.api_key` reads it from nowhere",
        ),
        ("consumers: optional", 0, "consumers are found by API key"),
        (
            "by: user",
            0,
            "`by: user` never finds one: `identities.user` reads it from nowhere",
        ),
    ] {
        let want = format!("{file}:{}:", line_of(&keyless, needle, nth));
        assert!(
            err.lines()
                .any(|l| l.starts_with(&want) && l.contains(message)),
            "{message} at {want}:\n{err}"
        );
    }
    // A route limit keyed by consumer needs `consumers:` on its route.
    let keyed = good.replace(
        "    consumers: optional\n    limits:\n      - { name: per-ip, by: ip,",
        "    limits:\n      - { name: per-ip, by: consumer,",
    );
    let (ok, _, err) = check_config(dir.path(), &keyed);
    assert!(!ok);
    assert!(err.contains("`by: consumer` needs `consumers:"), "{err}");
    // Calendar windows only on fixed_window.
    let monthly = good.replace(
        "{ name: per-minute, algorithm: sliding_log, rate: 3/1m }",
        "{ name: per-minute, algorithm: gcra, rate: 3/month }",
    );
    let (ok, _, err) = check_config(dir.path(), &monthly);
    assert!(!ok);
    assert!(
        err.contains("calendar windows (`N/month`) apply to fixed_window, not gcra"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plans_example_config_works_as_its_comments_say() {
    let up = Upstream::start();
    let body = example_config("plans.yaml", &up);
    let s = Sluice::start(&body);
    let c = client();
    let free = statuses(&c, &s, "/v1/hello", "demo-free-key", 6).await;
    assert_eq!(free, [200, 200, 200, 200, 200, 429], "free: 5 a minute");
    let pro = statuses(&c, &s, "/v1/hello", "demo-pro-key", 6).await;
    assert!(
        pro.iter().all(|&x| x == 200),
        "the pro key's digest is right: {pro:?}"
    );
    assert_eq!(status(&c, &s, "/v1/hello", &[]).await, 401);
    let doc = get(&c, &s.admin_url("/admin/consumers/demo-pro"), &[])
        .await
        .json();
    assert_eq!(doc["plan"], "pro");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_consumer_keys_a_route_limit_by_the_keys_owner() {
    let up = Upstream::start();
    let y = config(&up, MEMORY, "").replace(
        "    consumers: required\n  - name: open",
        "    consumers: required\n    limits:\n      - { name: per-consumer, by: consumer, algorithm: sliding_log, rate: 2/1m }\n  - name: open",
    );
    assert!(y.contains("by: consumer"), "the route `b` got the limit");
    let s = Sluice::start(&y);
    let c = client();
    // tinkerer's two keys share the route's per-consumer limit (2), bigco has its own.
    let got = [
        status(&c, &s, "/b", &[("x-api-key", FREE_KEY)]).await,
        status(&c, &s, "/b", &[("x-api-key", FREE_KEY_2)]).await,
        status(&c, &s, "/b", &[("x-api-key", FREE_KEY)]).await,
        status(&c, &s, "/b", &[("x-api-key", PRO_KEY)]).await,
    ];
    assert_eq!(got, [200, 200, 429, 200]);
    let r = get(&c, &s.url("/b"), &[("x-api-key", FREE_KEY_2)]).await;
    assert_eq!(r.status, 429);
    assert!(r.text().contains("b/per-consumer"), "{}", r.text());
}

/// `/admin/limits` reaches a plan's limits (`{route}/{plan}/{limit}`, or `plan%2Flimit`) by
/// consumer name, and the anonymous plan's by `fallback_ip`; a `by: consumer` key is a
/// consumer's name. A name no consumer of the plan has (an API key, another plan's consumer)
/// is a 400, not a 200 about (or a 204 reset of) a counter nothing charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reaches_plan_limits_and_consumer_keys() {
    let up = Upstream::start();
    let y = config(&up, MEMORY, "anonymous_plan: free\n").replace(
        "    consumers: required\n  - name: open",
        "    consumers: required\n    limits:\n      - { name: per-consumer, by: consumer, algorithm: sliding_log, rate: 2/1m }\n  - name: open",
    );
    let s = Sluice::start(&y);
    let c = client();
    let admin = |method: http::Method, path: &str| {
        let url = s.admin_url(path);
        let c = c.clone();
        async move { send(&c, method, &url, &[], b"").await }
    };
    let peek = |path: &str| admin(http::Method::GET, path);
    assert_eq!(status(&c, &s, "/b", &[("x-api-key", FREE_KEY)]).await, 200);
    for path in [
        "/admin/limits/b/free/per-minute?key=tinkerer",
        "/admin/limits/b/free%2Fper-minute?key=tinkerer",
        "/admin/limits/a/free/per-minute?key=tinkerer",
    ] {
        let r = peek(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json()["remaining"], 2, "{path}: {}", r.text());
    }
    let r = peek("/admin/limits/b/per-consumer?key=tinkerer").await;
    assert_eq!(r.json()["remaining"], 1, "{}", r.text());
    for (path, says) in [
        (
            "/admin/limits/b/free/per-minute?key=bigco",
            "is on plan `pro`, not `free`",
        ),
        (
            "/admin/limits/b/free/per-minute?key=nobody",
            "no consumer `nobody`",
        ),
        (
            "/admin/limits/b/per-consumer?key=nobody",
            "no consumer `nobody`",
        ),
        (
            &format!("/admin/limits/b/per-consumer?key={FREE_KEY}"),
            "a consumer's name, not an API key",
        ),
        (
            "/admin/limits/b/pro/per-minute?fallback_ip=127.0.0.1",
            "not the anonymous plan's",
        ),
    ] {
        for method in [http::Method::GET, http::Method::DELETE] {
            let r = admin(method.clone(), path).await;
            assert_eq!(r.status, 400, "{method} {path}: {}", r.text());
            assert!(r.text().contains(says), "{method} {path}: {}", r.text());
        }
    }
    // The anonymous plan is kept per client address: inspected and reset by `fallback_ip`.
    let mut anon = Vec::new();
    for _ in 0..4 {
        anon.push(status(&c, &s, "/a", &[]).await);
    }
    assert_eq!(anon, [200, 200, 200, 429]);
    let path = "/admin/limits/a/free/per-minute?fallback_ip=127.0.0.1";
    let r = peek(path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["remaining"], 0, "{}", r.text());
    assert_eq!(admin(http::Method::DELETE, path).await.status, 204);
    assert_eq!(status(&c, &s, "/a", &[]).await, 200, "reset");
    // A consumer's plan limit reset by name.
    let path = "/admin/limits/b/free/per-minute?key=tinkerer";
    assert_eq!(admin(http::Method::DELETE, path).await.status, 204);
    assert_eq!(peek(path).await.json()["remaining"], 3);
}

/// With Redis down, `DELETE /admin/consumers/{name}` answers 503 but resets every plan key's
/// copy in the embedded store that `on_error: local` decides with meanwhile: the reset went
/// on past the first key's store error (it stopped there, so a consumer held by its plan's
/// second limit stayed refused).
#[tokio::test]
async fn a_consumers_reset_with_redis_down_resets_every_local_copy() {
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "store:
  kind: redis
  redis: {{ url: \"{}\", timeout: 100ms }}
  on_error: local
identities:
  api_key: {{ header: X-API-Key }}
plans:
  p:
    limits:
      - {{ name: loose, algorithm: sliding_log, rate: 100/1m }}
      - {{ name: tight, algorithm: fixed_window, rate: 2/1h }}
consumers:
  - name: demo
    plan: p
    keys: [{FREE_KEY}]
upstreams:
  up: {{ targets: [{}] }}
routes:
  - name: b
    match: {{ path_prefix: /b }}
    upstream: up
    consumers: required
",
        redis.url(),
        up.url()
    ));
    let c = client();
    s.wait_log(&["store reachable"]);
    redis.kill();
    // Decided by the embedded store now: the plan's second limit refuses the third.
    assert_eq!(statuses(&c, &s, "/b", FREE_KEY, 3).await, [200, 200, 429]);
    let r = send(
        &c,
        http::Method::DELETE,
        &s.admin_url("/admin/consumers/demo"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        statuses(&c, &s, "/b", FREE_KEY, 1).await,
        [200],
        "{}",
        s.log()
    );
}
