//! Startup (SPEC §3): the data port accepts only once the store is ready, so requests sent the
//! instant it accepts — as load balancers and clients do — are decided by Redis like every
//! other. Each test fires 300 concurrent requests at a limit of 10 with no wait beyond the
//! port accepting (no `/readyz`), on `on_error: deny`: a request decided by the policy instead
//! of by Redis would be a 503, and one let through unlimited would be an 11th 200.

mod support;

use std::collections::BTreeMap;

use support::redis::{RedisCluster, RedisServer, Sentinel};
use support::{client, get, Sluice, Upstream};

fn config(store: &str, up: &Upstream) -> String {
    format!(
        "store:\n  kind: redis\n  redis: {store}\n  on_error: deny\n\
         upstreams:\n  up: {{ targets: [{}] }}\n\
         routes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n\
         \x20     - {{ name: all, by: route, algorithm: fixed_window, rate: 10/1h }}\n",
        up.url()
    )
}

/// 300 concurrent requests spread over `gateways`, sent at once: the count of each status.
async fn burst(gateways: &[Sluice]) -> BTreeMap<u16, usize> {
    let c = client();
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let (c, url) = (c.clone(), gateways[i % gateways.len()].url("/x"));
            tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    counts
}

fn assert_exact(counts: &BTreeMap<u16, usize>, up: &Upstream, logs: &[&Sluice]) {
    let want = BTreeMap::from([(200, 10), (429, 290)]);
    assert_eq!(
        *counts,
        want,
        "{}",
        logs.iter()
            .map(|s| s.log())
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    assert_eq!(up.hits(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_decides_the_first_requests() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(
        &format!("{{ url: \"{}\", timeout: 500ms }}", redis.url()),
        &up,
    ));
    assert_exact(&burst(std::slice::from_ref(&s)).await, &up, &[&s]);
    assert!(
        s.log().contains("store reachable"),
        "startup waited for the store: {}",
        s.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_started_together_decide_the_first_requests() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = config(
        &format!("{{ url: \"{}\", timeout: 500ms }}", redis.url()),
        &up,
    );
    let gws = Sluice::start_together(&[yaml.clone(), yaml]);
    assert_exact(&burst(&gws).await, &up, &[&gws[0], &gws[1]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_decides_the_first_requests() {
    let cluster = RedisCluster::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(
        &cluster.store_map("timeout: 500ms, pool_size: 2"),
        &up,
    ));
    assert_exact(&burst(std::slice::from_ref(&s)).await, &up, &[&s]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_decides_the_first_requests() {
    let sentinel = Sentinel::start();
    let up = Upstream::start();
    let s = Sluice::start(&config(
        &sentinel.store_map("timeout: 500ms, pool_size: 2"),
        &up,
    ));
    assert_exact(&burst(std::slice::from_ref(&s)).await, &up, &[&s]);
}

/// A Redis that is not there: the data port still opens after `startup_timeout`, and the
/// log says why requests follow `on_error` meanwhile.
#[tokio::test]
async fn an_absent_store_delays_the_listener_by_startup_timeout_only() {
    let up = Upstream::start();
    let port = support::free_port();
    let s = Sluice::start(&config(
        &format!("{{ url: \"redis://127.0.0.1:{port}\", timeout: 50ms, startup_timeout: 1s }}"),
        &up,
    ));
    let log = s.wait_log(&["store not ready within startup_timeout", "sluice serving"]);
    let (gave_up, serving) = (
        log.find("store not ready within startup_timeout").unwrap(),
        log.find("sluice serving").unwrap(),
    );
    assert!(
        gave_up < serving,
        "the data port opened before giving up on the store: {log}"
    );
    let r = get(&client(), &s.url("/x"), &[]).await;
    assert_eq!(r.status, 503, "deny while Redis is absent: {}", r.text());
}
