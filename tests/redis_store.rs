//! `RedisStore` (fred, pooled, pipelined) against real `redis-server` processes: exact
//! admission under concurrency from several clients, one script call per decision (FCALL, or
//! EVALSHA where an ACL refuses functions), a flushed library or script,
//! no double charge when connections are killed, timeouts and the breaker, Cluster slots.
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::limiter::algo::{Algorithm, Code, Decision, Params};
use sluice::limiter::store::redis::RedisStore;
use sluice::limiter::store::{LimitCall, StoreError};
use sluice::model::policy::RedisMode;
use sluice::model::table::RedisSettings;
use support::redis::{info_field, Conn, RedisCluster, RedisServer};

const S: u64 = 1_000_000;

fn settings(mode: RedisMode, url: Option<String>, nodes: Vec<String>) -> RedisSettings {
    RedisSettings {
        url,
        mode,
        nodes,
        sentinel_service: None,
        password: None,
        pool_size: 4,
        timeout: Duration::from_millis(200),
        key_prefix: "sluice:".into(),
        startup_timeout: Duration::from_secs(5),
        deny_cache: true,
        tls: None,
    }
}

async fn standalone(redis: &RedisServer, timeout_ms: u64) -> Arc<RedisStore> {
    let mut s = settings(RedisMode::Standalone, Some(redis.url()), vec![]);
    s.timeout = Duration::from_millis(timeout_ms);
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    store.wait_connected(Duration::from_secs(5)).await.unwrap();
    store
}

fn call(key: &str, a: Algorithm, n: u64, w: u64) -> LimitCall {
    LimitCall {
        key: key.to_owned(),
        params: Params::new(a, n, w, None).unwrap(),
        cost: 1,
        shadow: false,
        op: Default::default(),
    }
}

fn stat(conn: &mut Conn, cmd: &str) -> u64 {
    let info = conn.cmd_ok(&["INFO", "commandstats"]).as_str();
    info_field(&info, &format!("cmdstat_{cmd}"))
        .and_then(|v| v.split(',').next()?.strip_prefix("calls=")?.parse().ok())
        .unwrap_or(0)
}

/// `n` concurrent decisions of `c`, spread over `stores`: how many were admitted.
async fn admitted_concurrently(stores: &[Arc<RedisStore>], c: &LimitCall, n: usize) -> u32 {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (s, c) = (stores[i % stores.len()].clone(), c.clone());
            tokio::spawn(async move { s.decide(&[c]).await.unwrap()[0].allowed() as u32 })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

/// The first decision of `c` that succeeds within `within` (polling every 50 ms).
async fn first_decision(
    store: &Arc<RedisStore>,
    c: &LimitCall,
    within: Duration,
) -> Option<Decision> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(d) = store.decide(std::slice::from_ref(c)).await {
            return Some(d[0]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_from_several_clients_admit_exactly_capacity() {
    let redis = RedisServer::start();
    let stores = [
        standalone(&redis, 2000).await,
        standalone(&redis, 2000).await,
        standalone(&redis, 2000).await,
    ];
    let mut conn = redis.conn();
    for round in 0..3 {
        conn.cmd_ok(&["CONFIG", "RESETSTAT"]);
        let key = format!("sluice:r:l:token_bucket:{{{round}}}");
        // Capacity 10, negligible refill (10 per 7 days).
        let c = call(&key, Algorithm::TokenBucket, 10, 7 * 86_400 * S);
        let admitted = admitted_concurrently(&stores, &c, 500).await;
        assert_eq!(admitted, 10, "round {round}");
        // Trap 1: script calls only, each decision made once. Concurrent decisions share
        // calls (batches), so there are fewer FCALLs than decisions, but the script read
        // the bucket once per decision and wrote once per admission. (commandstats also
        // counts the commands a script runs; GET/SET and friends are not its commands, so
        // they must stay at 0.)
        let calls = stat(&mut conn, "fcall");
        assert!(
            (1..500).contains(&calls),
            "{calls} FCALLs for 500 decisions"
        );
        assert_eq!(stat(&mut conn, "time"), calls, "one clock read per call");
        assert_eq!(stat(&mut conn, "evalsha") + stat(&mut conn, "eval"), 0);
        assert_eq!(stat(&mut conn, "hmget"), 500);
        assert_eq!(stat(&mut conn, "hset"), 10);
        for stray in ["get", "set", "hget", "incr", "zadd", "multi", "watch"] {
            assert_eq!(stat(&mut conn, stray), 0, "{stray} outside the script");
        }
    }
}

#[tokio::test]
async fn after_a_flush_the_next_decision_succeeds_and_is_charged_once() {
    let redis = RedisServer::start();
    let store = standalone(&redis, 2000).await;
    let mut conn = redis.conn();
    let c = call(
        "sluice:r:l:sliding_log:{x}",
        Algorithm::SlidingLog,
        100,
        3600 * S,
    );
    conn.cmd_ok(&["CONFIG", "RESETSTAT"]);
    for i in 1..=4u64 {
        // The library gone (FUNCTION FLUSH), and the script cache with it for good measure.
        conn.cmd_ok(&["FUNCTION", "FLUSH"]);
        conn.cmd_ok(&["SCRIPT", "FLUSH"]);
        let d = store.decide(std::slice::from_ref(&c)).await.unwrap()[0];
        assert_eq!((d.code, d.remaining), (Code::Allowed, 100 - i));
        assert_eq!(conn.cmd_ok(&["ZCARD", &c.key]).as_int() as u64, i);
    }
    // Each flush cost one FUNCTION LOAD, and no call went by EVAL: the missing function was
    // loaded again, not given up on.
    assert_eq!(stat(&mut conn, "function|load"), 4);
    assert_eq!(stat(&mut conn, "evalsha") + stat(&mut conn, "eval"), 0);
    // After a restart too (no persistence: the library is gone with the process).
    let mut redis = redis;
    redis.restart();
    let ok = first_decision(&store, &c, Duration::from_secs(5))
        .await
        .is_some();
    assert!(ok, "no decision within 5 s of the restart");
    assert_eq!(redis.conn().cmd_ok(&["ZCARD", &c.key]).as_int(), 1);
}

/// An ACL user Redis will not let load or call functions still gets exact decisions: the
/// store falls back to EVALSHA of the script, whether FUNCTION LOAD is refused at startup or
/// FCALL at the first call, and never charges a call twice on the way. One that may not run
/// INFO starts and decides as well.
#[tokio::test]
async fn without_function_permissions_decisions_go_by_evalsha_and_stay_exact() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    // `noload` may call functions but not load them; `nocall` may load them but not call.
    conn.cmd_ok(&[
        "ACL",
        "SETUSER",
        "noload",
        "on",
        ">pw",
        "~*",
        "+@all",
        "-function",
    ]);
    conn.cmd_ok(&[
        "ACL", "SETUSER", "nocall", "on", ">pw", "~*", "+@all", "-fcall",
    ]);
    // `noinfo` may not run INFO, which the start uses to tell a Cluster node: not needed.
    conn.cmd_ok(&[
        "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info",
    ]);
    for user in ["noload", "nocall", "noinfo"] {
        let url = format!("redis://{user}:pw@127.0.0.1:{}", redis.port);
        let s = settings(RedisMode::Standalone, Some(url), vec![]);
        let store = Arc::new(RedisStore::connect(&s, None).unwrap());
        store.wait_connected(Duration::from_secs(5)).await.unwrap();
        conn.cmd_ok(&["CONFIG", "RESETSTAT"]);
        let key = format!("sluice:r:l:token_bucket:{{{user}}}");
        let c = call(&key, Algorithm::TokenBucket, 10, 7 * 86_400 * S);
        let admitted = admitted_concurrently(std::slice::from_ref(&store), &c, 50).await;
        assert_eq!(admitted, 10, "{user}");
        if user == "noinfo" {
            continue;
        }
        let by_evalsha = stat(&mut conn, "evalsha");
        assert!(by_evalsha >= 1, "{user}: no EVALSHA");
        // One clock read per script that ran: each decision ran once, none by FCALL.
        assert_eq!(stat(&mut conn, "fcall"), 0, "{user}");
        assert_eq!(
            stat(&mut conn, "time"),
            by_evalsha + stat(&mut conn, "eval")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_never_cause_a_double_charge() {
    // Trap 14: decisions in flight while CLIENT KILL drops the connections. A re-sent
    // decision would log a second entry with the same nonce (members are
    // `now:nonce:limit:unit`), so every nonce must appear at most once.
    let redis = RedisServer::start();
    let store = standalone(&redis, 500).await;
    let key = "sluice:r:l:sliding_log:{kill}";
    let c = call(key, Algorithm::SlidingLog, 10_000, 3600 * S);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let (mut conn, stop) = (redis.conn(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                conn.cmd_ok(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            }
        })
    };
    let started = Instant::now();
    let (mut ok, mut failed) = (0u64, 0u64);
    // Until a few decisions were cut off in flight (bounded: 10 s).
    while (failed < 5 || started.elapsed() < Duration::from_millis(500))
        && started.elapsed() < Duration::from_secs(10)
    {
        let batch: Vec<_> = (0..50)
            .map(|_| {
                let (s, c) = (store.clone(), c.clone());
                tokio::spawn(async move { s.decide(&[c]).await })
            })
            .collect();
        for t in batch {
            match t.await.unwrap() {
                Ok(d) => ok += d[0].allowed() as u64,
                Err(_) => failed += 1,
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    killer.join().unwrap();
    let mut conn = redis.conn();
    let members = conn.cmd_ok(&["ZRANGE", key, "0", "-1"]).as_array();
    let mut nonces: Vec<String> = members
        .iter()
        .map(|m| m.as_str().split(':').nth(1).unwrap().to_owned())
        .collect();
    let n = nonces.len() as u64;
    nonces.sort();
    nonces.dedup();
    assert_eq!(nonces.len() as u64, n, "a decision was applied twice");
    assert!(n >= ok, "admitted {ok} but logged {n}");
    assert!(n <= ok + failed, "logged {n} > sent {}", ok + failed);
    assert!(failed > 0, "the kills hit nothing in flight (ok {ok})");
}

#[tokio::test]
async fn a_paused_redis_times_out_then_the_breaker_fails_fast_and_recovers() {
    let redis = RedisServer::start();
    let store = standalone(&redis, 50).await;
    let c = call("sluice:r:l:gcra:{p}", Algorithm::Gcra, 100, 60 * S);
    let mut conn = redis.conn();
    conn.cmd_ok(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let mut kinds = vec![];
    let started = Instant::now();
    for _ in 0..10 {
        kinds.push(store.decide(std::slice::from_ref(&c)).await.unwrap_err());
    }
    // Five timeouts open the breaker; after that, no call waits at all.
    let timeouts = kinds.iter().filter(|k| **k == StoreError::Timeout).count();
    assert_eq!(timeouts, 5, "{kinds:?}");
    assert_eq!(kinds[5..], vec![StoreError::BreakerOpen; 5]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "10 calls with a 50 ms timeout took {:?}",
        started.elapsed()
    );
    // Probes go through at least twice a second; once Redis answers, decisions resume.
    let resumed = first_decision(&store, &c, Duration::from_secs(4))
        .await
        .is_some();
    assert!(resumed, "limiting did not resume after the pause");
}

#[tokio::test]
async fn a_dead_redis_fails_fast_and_peek_and_reset_work_once_back() {
    let mut redis = RedisServer::start();
    let store = standalone(&redis, 100).await;
    let c = call(
        "sluice:r:l:fixed_window:{d}",
        Algorithm::FixedWindow,
        3,
        3600 * S,
    );
    store.decide(std::slice::from_ref(&c)).await.unwrap();
    redis.kill();
    let started = Instant::now();
    for _ in 0..20 {
        let e = store.decide(std::slice::from_ref(&c)).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Connection(_) | StoreError::BreakerOpen | StoreError::Timeout
            ),
            "{e:?}"
        );
    }
    assert!(store.ping().await.is_err());
    assert!(started.elapsed() < Duration::from_secs(3));
    redis.restart();
    let back = first_decision(&store, &c, Duration::from_secs(4))
        .await
        .is_some();
    assert!(back, "no recovery within 4 s");
    // The restarted Redis (no persistence) holds the one charge made since.
    let peek = store.peek(&c.key, &c.params).await.unwrap();
    assert_eq!((peek.now.remaining, peek.next.code), (2, Code::Allowed));
    store.reset(&c.key).await.unwrap();
    let peek = store.peek(&c.key, &c.params).await.unwrap();
    assert_eq!((peek.now.remaining, peek.now.reset_after_us), (3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_decides_across_slots_without_charging_refused_requests() {
    let cluster = RedisCluster::start();
    let s = settings(RedisMode::Cluster, None, cluster.seeds());
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    store.wait_connected(Duration::from_secs(10)).await.unwrap();
    let store = Arc::new(store);
    // Two identities on (almost surely) different slots, and a third limit sharing a slot.
    let per_ip = call("sluice:r:ip:gcra:{10.0.0.1}", Algorithm::Gcra, 3, 3600 * S);
    let same_slot = call(
        "sluice:r:ip2:fixed_window:{10.0.0.1}",
        Algorithm::FixedWindow,
        50,
        3600 * S,
    );
    let per_route = call(
        "sluice:r:all:token_bucket:{}",
        Algorithm::TokenBucket,
        100,
        3600 * S,
    );
    assert_ne!(
        support::redis::key_slot(per_ip.key.as_bytes()),
        support::redis::key_slot(per_route.key.as_bytes())
    );
    let req = [per_ip.clone(), same_slot.clone(), per_route.clone()];
    for i in 0..6 {
        let d = store.decide(&req).await.unwrap();
        assert_eq!(d[0].allowed(), i < 3, "request {i}: {d:?}");
    }
    // Refused requests charged nothing anywhere.
    let peek = store.peek(&per_route.key, &per_route.params).await.unwrap();
    assert_eq!(peek.now.remaining, 97);
    let peek = store.peek(&same_slot.key, &same_slot.params).await.unwrap();
    assert_eq!(peek.now.remaining, 47);
    // Exact under concurrency on the cluster too.
    let c = call(
        "sluice:r:c:sliding_window:{conc}",
        Algorithm::SlidingWindow,
        10,
        3600 * S,
    );
    let admitted = admitted_concurrently(std::slice::from_ref(&store), &c, 300).await;
    assert_eq!(admitted, 10);
    // The library flushed on the node that owns the key: the next call loads it there and is
    // charged once.
    cluster.for_each_node(|conn| {
        conn.cmd_ok(&["FUNCTION", "FLUSH"]);
    });
    let d = store
        .decide(std::slice::from_ref(&per_route))
        .await
        .unwrap()[0];
    assert_eq!((d.code, d.remaining), (Code::Allowed, 96));
}

/// Script calls (FCALL, EVALSHA and EVAL) every node of the cluster has served.
fn cluster_calls(cluster: &RedisCluster) -> u64 {
    let mut calls = 0;
    cluster.for_each_node(|conn| {
        calls += stat(conn, "fcall") + stat(conn, "evalsha") + stat(conn, "eval")
    });
    calls
}

/// Decide every call of `calls` at once, each alone: its decision, in order.
async fn decide_each_concurrently(store: &Arc<RedisStore>, calls: &[LimitCall]) -> Vec<Decision> {
    let tasks: Vec<_> = calls
        .iter()
        .map(|c| {
            let (s, c) = (store.clone(), c.clone());
            tokio::spawn(async move { s.decide(std::slice::from_ref(&c)).await })
        })
        .collect();
    let mut out = Vec::new();
    for (t, c) in tasks.into_iter().zip(calls) {
        let d = t.await.unwrap();
        out.push(d.unwrap_or_else(|e| panic!("{}: {e}", c.key))[0]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_batches_per_node_and_resends_a_request_whose_slot_moved() {
    let cluster = RedisCluster::start();
    let mut s = settings(RedisMode::Cluster, None, cluster.seeds());
    // Hundreds of requests at once on a busy test machine: this test is about batching and
    // exactness, not about the timeout.
    s.timeout = Duration::from_secs(5);
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    store.wait_connected(Duration::from_secs(10)).await.unwrap();
    let limit = |key: String| call(&key, Algorithm::FixedWindow, 1, 3600 * S);

    // 400 identities (as many slots, on every node), two requests each, all at once.
    let keys: Vec<String> = (0..400)
        .map(|i| format!("sluice:r:k:fixed_window:{{id-{i}}}"))
        .collect();
    let ports: std::collections::BTreeSet<u16> = keys
        .iter()
        .map(|k| cluster.port_for_slot(support::redis::key_slot(k.as_bytes())))
        .collect();
    assert_eq!(ports.len(), 3, "the identities span every node");
    let calls: Vec<LimitCall> = keys
        .iter()
        .flat_map(|k| [limit(k.clone()), limit(k.clone())])
        .collect();
    let before = cluster_calls(&cluster);
    let decisions = decide_each_concurrently(&store, &calls).await;
    let script_calls = cluster_calls(&cluster) - before;
    for (i, pair) in decisions.chunks(2).enumerate() {
        let admitted = pair.iter().filter(|d| d.allowed()).count();
        assert_eq!(admitted, 1, "{}: {pair:?}", keys[i]);
    }
    // One call per request would be 800; per slot, 400 at best.
    assert!(
        script_calls * 4 <= calls.len() as u64,
        "{script_calls} script calls for {} requests",
        calls.len()
    );

    // Move an empty slot to another node behind the store's back: its cached routing still
    // names the old node, whose script refuses the key; the request is sent again, routed by
    // its key, redirected, and decided once.
    let moved = "sluice:r:k:fixed_window:{moved}";
    let slot = support::redis::key_slot(moved.as_bytes());
    let from = cluster.port_for_slot(slot);
    let to = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|&p| p != from)
        .unwrap();
    let id = |port: u16| Conn::connect(port).cmd_ok(&["CLUSTER", "MYID"]).as_str();
    let (from_id, to_id) = (id(from), id(to));
    let slot = slot.to_string();
    Conn::connect(to).cmd_ok(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    Conn::connect(from).cmd_ok(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    cluster.for_each_node(|conn| {
        conn.cmd_ok(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    });
    // Requests on the moved slot among requests for the old node's other slots, so that
    // they share its calls.
    let neighbours = keys
        .iter()
        .filter(|k| cluster.port_for_slot(support::redis::key_slot(k.as_bytes())) == from);
    let moved_limit = call(moved, Algorithm::FixedWindow, 5, 3600 * S);
    let mut calls = Vec::new();
    for k in neighbours.take(60) {
        calls.push(limit(k.clone()));
        calls.push(moved_limit.clone());
    }
    let decisions = decide_each_concurrently(&store, &calls).await;
    let admitted = calls
        .iter()
        .zip(&decisions)
        .filter(|(c, d)| c.key == moved && d.allowed())
        .count();
    assert_eq!(admitted, 5, "exactly the limit of the moved slot's key");
    // The neighbours were each charged in the first round: refused now.
    assert!(calls
        .iter()
        .zip(&decisions)
        .all(|(c, d)| c.key == moved || !d.allowed()));
    assert_eq!(Conn::connect(to).cmd_ok(&["EXISTS", moved]).as_int(), 1);
}

#[tokio::test]
async fn password_protected_redis_needs_the_password() {
    let redis = RedisServer::start();
    redis
        .conn()
        .cmd_ok(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let mut s = settings(RedisMode::Standalone, Some(redis.url()), vec![]);
    // Without it: the store never answers, and says why (no hang): Redis's own refusal, so
    // that an operator looks at the credentials, not the network.
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    let e = store
        .wait_connected(Duration::from_secs(2))
        .await
        .unwrap_err();
    let why = e.to_string();
    assert!(
        why.contains("NOAUTH") || why.contains("WRONGPASS") || why.contains("auth"),
        "{why}"
    );
    // A decision then fails as what it is, a connection refused with that reason, not as a
    // timeout after waiting for a connection that will not come.
    let c = call("sluice:r:l:gcra:{nopw}", Algorithm::Gcra, 2, 60 * S);
    match store.decide(std::slice::from_ref(&c)).await {
        Err(StoreError::Connection(why)) => assert!(
            why.contains("NOAUTH") || why.contains("WRONGPASS") || why.contains("auth"),
            "{why}"
        ),
        other => panic!("expected a connection error naming the refusal: {other:?}"),
    }
    // `password_env` resolves into `password`, which wins over the URL.
    s.password = Some("s3cret".into());
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    store.wait_connected(Duration::from_secs(5)).await.unwrap();
    let c = call("sluice:r:l:gcra:{pw}", Algorithm::Gcra, 2, 60 * S);
    let d = store.decide(std::slice::from_ref(&c)).await.unwrap()[0];
    assert_eq!((d.code, d.remaining), (Code::Allowed, 1));
    // And in the URL itself.
    let url = format!("redis://:s3cret@{}/0", redis.addr());
    let store = Arc::new(
        RedisStore::connect(&settings(RedisMode::Standalone, Some(url), vec![]), None).unwrap(),
    );
    store.wait_connected(Duration::from_secs(5)).await.unwrap();
    let d = store.decide(&[c]).await.unwrap()[0];
    assert_eq!((d.code, d.remaining), (Code::Allowed, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_deciding_and_charges_once() {
    let mut sentinel = support::redis::Sentinel::start();
    let master_port = sentinel.master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]);
    let mut sc = sentinel.sentinel_conn();
    // The sentinel discovers replicas through the master's INFO (every 10 s at most).
    let known = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        sc.cmd_ok(&["SENTINEL", "REPLICAS", "mymaster"])
            .as_array()
            .len()
            == 1
    });
    assert!(
        known,
        "the sentinel never saw the replica:\n{}",
        sentinel.log()
    );

    let mut s = settings(RedisMode::Sentinel, None, sentinel.sentinel_nodes());
    s.sentinel_service = Some("mymaster".into());
    let store = Arc::new(RedisStore::connect(&s, None).unwrap());
    store.wait_connected(Duration::from_secs(5)).await.unwrap();
    let store = Arc::new(store);
    let c = call(
        "sluice:r:l:sliding_log:{fo}",
        Algorithm::SlidingLog,
        100,
        3600 * S,
    );
    for _ in 0..3 {
        store.decide(std::slice::from_ref(&c)).await.unwrap();
    }
    let mut master = sentinel.master.conn();
    assert_eq!(
        master.cmd_ok(&["WAIT", "1", "2000"]).as_int(),
        1,
        "replica in sync"
    );

    // The primary dies; the sentinel notices within a second and promotes the replica.
    sentinel.master.kill();
    let promoted = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let addr = sc.cmd_ok(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
        addr.as_array()[1].as_str() == replica.port.to_string()
    });
    assert!(promoted, "no failover:\n{}", sentinel.log());
    // The client follows the new primary (which has the library: functions replicate), and
    // the first decision that succeeds there is charged exactly once.
    let d = first_decision(&store, &c, Duration::from_secs(10))
        .await
        .expect("no decision within 10 s of the promotion");
    assert_eq!((d.code, d.remaining), (Code::Allowed, 96));
    let mut new_master = replica.conn();
    assert_eq!(new_master.cmd_ok(&["ZCARD", &c.key]).as_int(), 4);
}
