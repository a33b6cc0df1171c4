//! The real `sluice` binary on real `redis-server` processes (standalone, cluster, sentinel):
//! one exact limit shared by several gateways with one script call per request, decisions at
//! Redis's clock whatever the gateway's clock says, each `on_error` policy while Redis is
//! dead, paused or sleeping (never waiting past `timeout`), startup without Redis, and
//! automatic recovery when it comes back.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::redis::{key_slot, Conn, RedisCluster, RedisServer, Sentinel, SilentRelay};
use support::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// One route under `path_prefix: /{name}` with one or more limits (YAML flow maps).
fn route(name: &str, extra: &str, limits: &[&str]) -> String {
    let mut s = format!(
        "  - name: {name}\n    match: {{ path_prefix: /{name} }}\n    upstream: up\n{extra}    limits:\n"
    );
    for l in limits {
        s.push_str(&format!("      - {l}\n"));
    }
    s
}

/// The `store.redis` map for a standalone `redis` with this timeout and pool size.
fn standalone(redis: &RedisServer, timeout: &str, pool_size: usize) -> String {
    format!(
        "{{ url: \"{}\", timeout: {timeout}, pool_size: {pool_size} }}",
        redis.url()
    )
}

/// A whole config (minus the listeners) on the given `store.redis` map and `on_error`.
fn config(redis: &str, on_error: &str, up: &Upstream, routes: &[String]) -> String {
    format!(
        "store:\n  kind: redis\n  redis: {redis}\n  on_error: {on_error}\n\
         client_ip:\n  trusted_proxies: [127.0.0.1/32]\n\
         upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n{}",
        up.url(),
        routes.concat()
    )
}

/// GET `path` on `s` as client `ip` (through the trusted X-Forwarded-For).
async fn hit(c: &HttpClient, s: &Sluice, path: &str, ip: &str) -> Reply {
    get(c, &s.url(path), &[("x-forwarded-for", ip)]).await
}

/// `n` sequential requests as client `ip`: their statuses.
async fn statuses(c: &HttpClient, s: &Sluice, path: &str, ip: &str, n: usize) -> Vec<u16> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(hit(c, s, path, ip).await.status.as_u16());
    }
    v
}

fn times(status: u16, n: usize) -> Vec<u16> {
    vec![status; n]
}

/// Sluice's log once its buffer is flushed (it flushes every 100 ms): for failure messages.
fn log_of(s: &Sluice) -> String {
    std::thread::sleep(Duration::from_millis(250));
    s.log()
}

/// Wait until the gateway has connected its whole Redis pool ("store reachable") and
/// `/readyz` answers 200: requests before that follow `on_error` by design.
async fn wait_store(c: &HttpClient, s: &Sluice) {
    s.wait_log(&["store reachable"]);
    let ok = eventually(Duration::from_secs(5), || async {
        readyz(c, s).await == 200
    })
    .await;
    assert!(ok, "/readyz never answered 200\n{}", log_of(s));
}

/// `remaining` of one key through the admin peek (`key` None for `by: route`); retried for
/// up to 3 s while the store does not answer.
async fn peek_remaining(
    c: &HttpClient,
    s: &Sluice,
    route: &str,
    limit: &str,
    key: Option<&str>,
) -> u64 {
    let url = match key {
        Some(k) => s.admin_url(&format!("/admin/limits/{route}/{limit}?key={k}")),
        None => s.admin_url(&format!("/admin/limits/{route}/{limit}")),
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = get(c, &url, &[]).await;
        if r.status == 200 {
            return r.json()["remaining"].as_u64().expect("remaining");
        }
        assert!(Instant::now() < deadline, "peek {url}: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After Redis is back (`back`): wait (≤ 5 s) until `path` is decided by Redis again for a
/// throw-away client, then until SPEC §3's bound (2 s after Redis answers) has passed.
async fn wait_recovered(c: &HttpClient, s: &Sluice, path: &str, back: Instant) {
    let ok = eventually(Duration::from_secs(5), || async {
        hit(c, s, path, "10.255.255.255").await.status == 200
    })
    .await;
    assert!(
        ok,
        "{path} never recovered after Redis came back\n{}",
        log_of(s)
    );
    eprintln!(
        "first Redis decision {:?} after Redis restarted",
        back.elapsed()
    );
    if let Some(rest) = Duration::from_secs(2).checked_sub(back.elapsed()) {
        tokio::time::sleep(rest).await;
    }
}

async fn readyz(c: &HttpClient, s: &Sluice) -> u16 {
    get(c, &s.admin_url("/readyz"), &[]).await.status.as_u16()
}

/// Sum of `sluice_store_errors_total` over the given kinds.
fn store_errors(text: &str, kinds: &[&str]) -> f64 {
    kinds
        .iter()
        .map(|k| metric(text, "sluice_store_errors_total", &[("kind", k)]))
        .sum()
}

fn outcome(text: &str, route: &str, outcome: &str) -> f64 {
    metric(
        text,
        "sluice_requests_total",
        &[("route", route), ("outcome", outcome)],
    )
}

/// Seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date_secs(s: &str) -> i64 {
    let p: Vec<&str> = s.split_whitespace().collect();
    assert!(p.len() == 6 && p[5] == "GMT", "not an HTTP date: {s:?}");
    let day: i64 = p[1].parse().unwrap();
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == p[2])
    .unwrap_or_else(|| panic!("bad month in {s:?}")) as i64
        + 1;
    let year: i64 = p[3].parse().unwrap();
    let hms: Vec<i64> = p[4].split(':').map(|x| x.parse().unwrap()).collect();
    // Days from civil (Howard Hinnant).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
}

/// The preload library of the `faketime` Debian package; panics with how to install it.
fn libfaketime() -> String {
    const HINT: &str = "install faketime: apt-get install -y faketime";
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|d| d.join("faketime").is_file()) {
        panic!("faketime not found on PATH: {HINT}");
    }
    let mut candidates: Vec<String> = std::process::Command::new("dpkg")
        .args(["-L", "libfaketime"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.ends_with("/libfaketime.so.1"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    candidates.extend(
        [
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/faketime/libfaketime.so.1",
            "/usr/local/lib/faketime/libfaketime.so.1",
        ]
        .map(str::to_owned),
    );
    candidates
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .unwrap_or_else(|| panic!("libfaketime.so.1 not found: {HINT}"))
}

/// `sluice check --connect -c FILE`: (exit code, stdout, stderr).
async fn check_connect(s: &Sluice) -> (i32, String, String) {
    let path = s.config_path.clone();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(sluice_bin())
            .arg("check")
            .arg("--connect")
            .arg("-c")
            .arg(&path)
            .output()
            .expect("run sluice check");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// A `MONITOR` connection: tells the commands clients sent from those scripts ran.
struct Monitor {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK", "MONITOR");
        Monitor { reader }
    }

    /// Stop after a marker sent on `conn`; the command names clients sent (without the
    /// marker), each with the requests it decided (a batch's count, else 1), and the set of
    /// command names scripts ran.
    fn finish(
        mut self,
        conn: &mut Conn,
    ) -> (Vec<(String, u64)>, std::collections::BTreeSet<String>) {
        use std::io::BufRead;
        let marker = "sluice-test-monitor-end";
        conn.cmd_ok(&["ECHO", marker]);
        let (mut clients, mut scripts) = (Vec::new(), std::collections::BTreeSet::new());
        for _ in 0..1_000_000 {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("MONITOR stream");
            assert!(n > 0, "MONITOR stream closed");
            if line.contains(marker) {
                return (clients, scripts);
            }
            // +1700000000.123456 [0 127.0.0.1:5555] "fcall" "..." / [0 lua] "get" "..."
            let Some((source, rest)) = line.split_once("] ") else {
                continue;
            };
            let name = rest
                .split('"')
                .nth(1)
                .unwrap_or_default()
                .to_ascii_lowercase();
            if source.ends_with(" lua") {
                scripts.insert(name);
            } else {
                // "fcall" "NAME" "NUMKEYS" KEY… "batch" "R" …: a batch of R requests.
                let args: Vec<&str> = rest.split('"').skip(1).step_by(2).collect();
                let numkeys: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
                let carried = match (args.get(3 + numkeys), args.get(4 + numkeys)) {
                    (Some(&"batch"), Some(r)) => r.parse().unwrap_or(0),
                    _ => 1,
                };
                clients.push((name, carried));
            }
        }
        panic!("MONITOR never showed the end marker");
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Trap 1: three gateways, one Redis, ~450 concurrent requests over several connections
/// against limits of 10: exactly 10 admitted per limit, and Redis saw only script calls, which
/// together decided each request exactly once (concurrent requests share calls: batches).
#[tokio::test]
async fn several_gateways_share_one_exact_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    // A generous timeout and fail-closed: a slow decision under this burst must show up as a
    // 503, never as an extra 200. Without the deny cache, so every request is a store call
    // (tests/deny_cache.rs shows the cache saving them).
    let yaml = config(
        &standalone(&redis, "3s", 4).replace(" }", ", deny_cache: false }"),
        "deny",
        &up,
        &[
            route(
                "warm",
                "",
                &["{ name: w, by: ip, algorithm: sliding_log, rate: 100/1h }"],
            ),
            route(
                "tb",
                "",
                &["{ name: shared, by: route, algorithm: token_bucket, rate: 10/1h }"],
            ),
            route(
                "gcra",
                "",
                &["{ name: shared, by: route, algorithm: gcra, rate: 10/1h }"],
            ),
        ],
    );
    let gws: Vec<Sluice> = (0..3).map(|_| Sluice::start(&yaml)).collect();
    let c = client();
    // Every gateway has its whole pool connected and the script is cached before counting.
    for g in &gws {
        wait_store(&c, g).await;
        assert_eq!(hit(&c, g, "/warm", "10.9.9.9").await.status, 200);
    }
    let mut conn = redis.conn();
    conn.cmd_ok(&["CONFIG", "RESETSTAT"]);
    let monitor = Monitor::start(redis.port);
    let hits_before = up.hits();

    let mut sent = 0u64;
    for (path, n) in [("/tb", 300usize), ("/gcra", 150)] {
        let clients: Vec<HttpClient> = (0..6).map(|_| client()).collect();
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let c = clients[i % clients.len()].clone();
            let url = gws[(i / 2) % gws.len()].url(path);
            tasks.push(tokio::spawn(async move {
                get(&c, &url, &[]).await.status.as_u16()
            }));
        }
        let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
        for t in tasks {
            *by_status.entry(t.await.unwrap()).or_default() += 1;
        }
        sent += n as u64;
        let expected: BTreeMap<u16, usize> = [(200, 10), (429, n - 10)].into();
        assert_eq!(
            by_status,
            expected,
            "{path}: {n} concurrent requests over 3 gateways against one limit of 10\n\
             gateway 0 log:\n{}",
            log_of(&gws[0])
        );
    }
    assert_eq!(
        up.hits() - hits_before,
        20,
        "only admitted requests reach upstream"
    );

    // What the gateways sent, told apart from what the script ran inside Redis.
    let (from_clients, from_scripts) = monitor.finish(&mut conn);
    let sent_by_gateways: BTreeMap<&str, usize> =
        from_clients.iter().fold(BTreeMap::new(), |mut m, (c, _)| {
            *m.entry(c.as_str()).or_default() += 1;
            m
        });
    assert!(
        sent_by_gateways
            .keys()
            .all(|k| matches!(*k, "fcall" | "evalsha" | "eval")),
        "the gateways sent commands other than script calls: {sent_by_gateways:?}"
    );
    let decided: u64 = from_clients.iter().map(|(_, n)| n).sum();
    let script_calls = from_clients.len() as u64;

    let stats = conn.commandstats();
    let calls = |name: &str| stats.get(name).copied().unwrap_or((0, 0));
    let (fcall, fcall_failed) = calls("fcall");
    let (evalsha, eval) = (calls("evalsha").0, calls("eval").0);
    // The library was loaded before counting: no call found it missing, so none ran twice,
    // and Redis allows functions here, so no EVALSHA either.
    assert_eq!((fcall_failed, evalsha, eval), (0, 0, 0), "{stats:?}");
    assert_eq!(
        decided, sent,
        "the script calls decided each request exactly once: {sent_by_gateways:?}"
    );
    assert!(
        script_calls < sent,
        "{script_calls} calls for {sent} requests: concurrent requests share calls"
    );
    assert_eq!(
        script_calls, fcall,
        "MONITOR and INFO commandstats disagree: {stats:?}"
    );
    // Each script run reads Redis's clock once.
    assert_eq!(calls("time").0, script_calls, "{stats:?}");
    // Every other command in the stats ran inside the script, or is this test's own.
    let stray: Vec<&String> = stats
        .keys()
        .filter(|k| {
            !matches!(k.as_str(), "fcall" | "info" | "echo" | "monitor")
                && !k.starts_with("config")
                && !from_scripts.contains(*k)
        })
        .collect();
    assert!(
        stray.is_empty(),
        "stray commands {stray:?} in {stats:?} (inside scripts: {from_scripts:?})"
    );
}

/// Each worker decides over Redis connections of its own, its share of `pool_size` rounded
/// up: with two workers and `pool_size: 3`, four connections, every one of them carrying
/// script calls; with one worker, exactly three. Either way one limit stays exact for
/// hundreds of concurrent requests spread over the workers.
#[tokio::test]
async fn each_worker_decides_over_connections_of_its_own() {
    let up = Upstream::start();
    let limit = "{ name: shared, by: route, algorithm: token_bucket, rate: 10/1h }";
    for (workers, pool_size, connections) in [(2, 3, 4), (1, 3, 3)] {
        let redis = RedisServer::start();
        let store = standalone(&redis, "3s", pool_size).replace(" }", ", deny_cache: false }");
        let yaml = format!(
            "workers: {workers}\n{}",
            config(&store, "deny", &up, &[route("tb", "", &[limit])])
        );
        let s = Sluice::start(&yaml);
        let c = client();
        wait_store(&c, &s).await;
        // Startup waited for every worker's connections, not only the first worker's.
        let list = redis.conn().cmd_ok(&["CLIENT", "LIST"]).as_str();
        assert_eq!(
            gateway_connections(&list).len(),
            connections,
            "connections when ready: workers: {workers}, pool_size: {pool_size}\n{list}"
        );
        // Many client connections at once: new connections go to the worker holding fewest.
        let clients: Vec<HttpClient> = (0..16).map(|_| client()).collect();
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let (c, url) = (clients[i % clients.len()].clone(), s.url("/tb"));
                tokio::spawn(async move { get(&c, &url, &[]).await.status.as_u16() })
            })
            .collect();
        let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
        for t in tasks {
            *by_status.entry(t.await.unwrap()).or_default() += 1;
        }
        assert_eq!(
            by_status,
            [(200, 10), (429, 190)].into(),
            "workers: {workers}\n{}",
            log_of(&s)
        );
        // The clients' connections are still open: every worker served some of them.
        let text = s.metrics(&c).await;
        for w in 1..=workers {
            let open = metric(
                &text,
                "sluice_connections_open",
                &[("worker", &w.to_string())],
            );
            assert!(open > 0.0, "worker {w} served no connection:\n{text}");
        }

        let list = redis.conn().cmd_ok(&["CLIENT", "LIST"]).as_str();
        let gateway = gateway_connections(&list);
        assert_eq!(
            gateway.len(),
            connections,
            "workers: {workers}, pool_size: {pool_size}\n{list}"
        );
        assert!(
            gateway.iter().all(|l| l.contains("cmd=fcall")),
            "a connection that carried no decision: workers: {workers}\n{list}"
        );
    }
}

/// A gateway of two workers with one Redis connection each (`pool_size: 2`, `on_error:
/// deny`, `limit` on route `/tb`) on a Redis with room for one of them: `maxclients` counts
/// the returned connection (which can raise it) and one of the gateway's. Returned once the
/// gateway has stopped waiting for the store at startup.
fn one_worker_without_redis(
    redis: &RedisServer,
    up: &Upstream,
    timeout: &str,
    limit: &str,
) -> (Conn, Sluice) {
    let mut conn = redis.conn();
    conn.cmd_ok(&["CONFIG", "SET", "maxclients", "2"]);
    let store = standalone(redis, timeout, 2).replace(" }", ", startup_timeout: 1s }");
    let yaml = format!(
        "workers: 2\n{}",
        config(&store, "deny", up, &[route("tb", "", &[limit])])
    );
    let s = Sluice::start(&yaml);
    s.wait_log(&["store not ready within startup_timeout"]);
    (conn, s)
}

/// `/readyz` answers for every worker's Redis connections, not only the first worker's:
/// with room in Redis for one connection of the two (`workers: 2`, `pool_size: 2`), one
/// worker cannot decide, and the gateway is not ready until it can. Which worker gets the
/// room is a race; asking the first worker's connections alone answered 200 in 4 of 6 runs.
#[tokio::test]
async fn readyz_needs_every_workers_redis_connections() {
    let (redis, up) = (RedisServer::start(), Upstream::start());
    let limit = "{ name: k, by: ip, algorithm: token_bucket, rate: 10/1h }";
    let (mut conn, s) = one_worker_without_redis(&redis, &up, "200ms", limit);
    let c = client();
    for _ in 0..3 {
        let r = get(&c, &s.admin_url("/readyz"), &[]).await;
        assert_eq!(r.status, 503, "one worker without Redis\n{}", log_of(&s));
        let body = r.text();
        assert!(body.contains("not connected to redis"), "{body}");
    }

    conn.cmd_ok(&["CONFIG", "SET", "maxclients", "100"]);
    let ok = eventually(Duration::from_secs(5), || async {
        readyz(&c, &s).await == 200
    })
    .await;
    assert!(ok, "/readyz never became ready\n{}", log_of(&s));
    let list = conn.cmd_ok(&["CLIENT", "LIST"]).as_str();
    assert_eq!(gateway_connections(&list).len(), 2, "{list}");
}

/// Each worker has a breaker of its own: with room in Redis for one worker's connection of
/// two, the worker without one trips its breaker (its requests then fail fast, by
/// `on_error`) while the other keeps deciding by Redis, its successes neither resetting the
/// first's failures nor being refused by its open breaker. Each client connection stays on
/// the worker that accepted it, so it sees 200s only or 503s only.
#[tokio::test]
async fn a_worker_without_redis_trips_only_its_own_breaker() {
    let (redis, up) = (RedisServer::start(), Upstream::start());
    let limit = "{ name: k, by: route, algorithm: token_bucket, rate: 1000000/1h }";
    let (_conn, s) = one_worker_without_redis(&redis, &up, "100ms", limit);

    // Eight client connections (spread over the two workers), each sending one request after
    // another for 2 s: the healthy worker's successes interleave with the other's failures.
    let until = Instant::now() + Duration::from_secs(2);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, url) = (client(), s.url("/tb"));
            tokio::spawn(async move {
                let mut seen: BTreeMap<u16, usize> = BTreeMap::new();
                while Instant::now() < until {
                    *seen
                        .entry(get(&c, &url, &[]).await.status.as_u16())
                        .or_default() += 1;
                }
                seen
            })
        })
        .collect();
    let mut per_client = Vec::new();
    for t in tasks {
        per_client.push(t.await.unwrap());
    }
    let text = s.metrics(&client()).await;
    let by_status = |code: u16| per_client.iter().filter(|m| m.contains_key(&code)).count();
    assert!(
        per_client.iter().all(|m| m.len() == 1),
        "a client saw both answers (or another): {per_client:?}\n{}",
        log_of(&s)
    );
    assert!(
        by_status(200) > 0 && by_status(503) > 0,
        "one worker decides by Redis, the other by on_error: {per_client:?}"
    );
    let open = metric(
        &text,
        "sluice_store_errors_total",
        &[("kind", "breaker_open")],
    );
    assert!(
        open > 0.0,
        "the worker without Redis never tripped its breaker: {per_client:?}\n{text}"
    );
}

/// The lines of a `CLIENT LIST` answer but the connection asking.
fn gateway_connections(list: &str) -> Vec<&str> {
    list.lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .collect()
}

/// Trap 2: a gateway one hour ahead (libfaketime) and a normal one share a sliding log of
/// 5/1m: together they admit exactly 5, and their Retry-After values agree.
#[tokio::test]
async fn skewed_gateway_clock_changes_nothing() {
    let lib = libfaketime();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = config(
        &standalone(&redis, "1s", 2),
        "deny",
        &up,
        &[route(
            "r",
            "",
            &["{ name: shared, by: route, algorithm: sliding_log, rate: 5/1m }"],
        )],
    );
    let normal = Sluice::start(&yaml);
    let skewed = Sluice::start_with(
        &yaml,
        &[
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME", "+1h"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let c = client();
    wait_store(&c, &normal).await;
    wait_store(&c, &skewed).await;

    // The skew is real: the gateways' own Date headers are an hour apart.
    let date = |r: &Reply| http_date_secs(r.header("date").expect("Date header"));
    let d_normal = date(&get(&c, &normal.admin_url("/healthz"), &[]).await);
    let d_skewed = date(&get(&c, &skewed.admin_url("/healthz"), &[]).await);
    let skew = d_skewed - d_normal;
    assert!(
        (3590..=3610).contains(&skew),
        "the skewed gateway's clock is {skew}s ahead, not ~3600s (is libfaketime working?)"
    );

    let mut seen = Vec::new();
    let mut retry: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..12 {
        let g = if i % 2 == 0 { &normal } else { &skewed };
        let r = get(&c, &g.url("/r"), &[]).await;
        seen.push(r.status.as_u16());
        if r.status == 429 {
            let ra: u64 = r
                .header("retry-after")
                .expect("Retry-After on a 429")
                .parse()
                .unwrap();
            retry[i % 2].push(ra);
        }
    }
    let mut expected = times(200, 5);
    expected.extend(times(429, 7));
    assert_eq!(
        seen,
        expected,
        "alternating between a normal and a +1h gateway on one 5/1m limit\nskewed log:\n{}",
        log_of(&skewed)
    );
    let all: Vec<u64> = retry.concat();
    let (lo, hi) = (*all.iter().min().unwrap(), *all.iter().max().unwrap());
    assert!(
        hi - lo <= 1 && (55..=60).contains(&lo),
        "Retry-After normal {:?} vs skewed {:?}",
        retry[0],
        retry[1]
    );
}

/// Trap 13 (dead Redis): each route's policy applies promptly while Redis is killed, metrics
/// and /readyz say so, and limiting resumes on its own once Redis is back.
#[tokio::test]
async fn redis_down_follows_each_policy_and_recovers() {
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: token_bucket, rate: 3/1h }";
    let yaml = config(
        &standalone(&redis, "100ms", 2),
        "allow",
        &up,
        &[
            route("allow", "    on_store_error: allow\n", &[limit]),
            route("deny", "    on_store_error: deny\n", &[limit]),
            route("local", "    on_store_error: local\n", &[limit]),
        ],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    let ip = "10.0.0.1";
    for path in ["/allow", "/deny", "/local"] {
        assert_eq!(
            statuses(&c, &s, path, ip, 4).await,
            [200, 200, 200, 429],
            "{path} with Redis up\n{}",
            log_of(&s)
        );
    }
    assert_eq!(readyz(&c, &s).await, 200);
    let before = s.metrics(&c).await;
    let hits_before = up.hits();

    redis.kill();
    let started = Instant::now();
    let mut deny = Vec::new();
    for _ in 0..10 {
        let r = hit(&c, &s, "/deny", "10.0.0.2").await;
        deny.push(r.status.as_u16());
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{r:?}"
        );
        assert!(r.header("x-request-id").is_some(), "{r:?}");
        assert_eq!(r.json()["status"], 503, "{r:?}");
    }
    // This client is limited in Redis: fail-open forwards it anyway.
    let allow = statuses(&c, &s, "/allow", ip, 10).await;
    // Limited in Redis too, but the embedded fallback starts from nothing.
    let local = statuses(&c, &s, "/local", ip, 10).await;
    let elapsed = started.elapsed();
    assert_eq!(allow, times(200, 10), "/allow with Redis dead");
    assert_eq!(deny, times(503, 10), "/deny with Redis dead");
    let mut expected = times(200, 3);
    expected.extend(times(429, 7));
    assert_eq!(local, expected, "/local with Redis dead\n{}", log_of(&s));
    assert!(
        elapsed < Duration::from_secs(10),
        "30 requests with Redis dead took {elapsed:?}"
    );
    assert_eq!(up.hits() - hits_before, 13, "10 allowed + 3 local");

    let m = s.metrics(&c).await;
    let delta = |route: &str, out: &str| outcome(&m, route, out) - outcome(&before, route, out);
    assert_eq!(delta("allow", "store_error_allowed"), 10.0, "{m}");
    assert_eq!(delta("deny", "store_error_denied"), 10.0, "{m}");
    assert_eq!(delta("local", "store_error_allowed"), 3.0, "{m}");
    assert_eq!(delta("local", "limited"), 7.0, "{m}");
    let dead_kinds = ["connection", "breaker_open"];
    assert!(
        store_errors(&m, &dead_kinds) > 0.0,
        "no connection/breaker_open store errors:\n{m}"
    );
    assert_eq!(
        store_errors(&m, &["connection", "breaker_open", "timeout", "script"])
            - store_errors(
                &before,
                &["connection", "breaker_open", "timeout", "script"]
            ),
        30.0,
        "one store error per request:\n{m}"
    );
    // A call that never reached Redis is not timed: store latency must not look fastest while
    // the store is out.
    let timed = |m: &str| metric(m, "sluice_store_duration_seconds_count", &[]);
    let reached = |m: &str| store_errors(m, &["timeout", "script"]);
    assert_eq!(
        timed(&m) - timed(&before),
        reached(&m) - reached(&before),
        "calls that never reached Redis were timed:\n{m}"
    );
    assert_eq!(
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[
                ("route", "deny"),
                ("limit", "per-ip"),
                ("decision", "error")
            ]
        ),
        10.0,
        "{m}"
    );
    let r = get(&c, &s.admin_url("/readyz"), &[]).await;
    assert_eq!(r.status, 503, "/readyz with Redis dead: {}", r.text());
    // An admin reset while Redis is dead cannot reach Redis (503), but it resets the
    // embedded store that `local` decides with meanwhile: the client is admitted again.
    let url = s.admin_url(&format!("/admin/limits/local/per-ip?key={ip}"));
    let r = send(&c, http::Method::DELETE, &url, &[], b"").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        hit(&c, &s, "/local", ip).await.status,
        200,
        "{}",
        log_of(&s)
    );

    redis.restart();
    wait_recovered(&c, &s, "/deny", Instant::now()).await;
    // Limiting is fully back: a fresh client gets exactly its 3, with no policy answer.
    assert_eq!(
        statuses(&c, &s, "/deny", "10.0.0.3", 4).await,
        [200, 200, 200, 429],
        "limiting after recovery\n{}",
        log_of(&s)
    );
    // The restarted Redis starts empty; nothing decided while it was dead (503s, local
    // decisions) may be charged to it afterwards.
    for (route, ip) in [("deny", "10.0.0.2"), ("local", ip)] {
        assert_eq!(
            peek_remaining(&c, &s, route, "per-ip", Some(ip)).await,
            3,
            "{route}: requests answered while Redis was dead were charged once it came back\n{}",
            log_of(&s)
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&c, &s).await == 200
        })
        .await,
        "/readyz never became ready again"
    );
}

/// Trap 13 (slow Redis): under CLIENT PAUSE and DEBUG SLEEP no request waits past `timeout`
/// (fail-open here), timeouts are counted, and limiting resumes afterwards.
#[tokio::test]
async fn paused_redis_never_holds_a_request_past_the_timeout() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = config(
        &standalone(&redis, "50ms", 2),
        "allow",
        &up,
        &[route(
            "a",
            "",
            &["{ name: per-ip, by: ip, algorithm: sliding_log, rate: 2/1h }"],
        )],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    let r = hit(&c, &s, "/a", "10.1.1.1").await;
    assert!(
        r.status == 200 && r.header("ratelimit").is_some(),
        "Redis did not decide: {r:?}\n{}",
        log_of(&s)
    );

    // Twenty requests while Redis is paused: each answered fast, all forwarded.
    let batch = |ip: &'static str| {
        let (c, s) = (&c, &s);
        async move {
            let started = Instant::now();
            for i in 0..20 {
                let t = Instant::now();
                let r = hit(c, s, "/a", ip).await;
                let took = t.elapsed();
                assert_eq!(r.status, 200, "request {i} as {ip}: {r:?}");
                assert!(took < Duration::from_secs(1), "request {i} took {took:?}");
            }
            started.elapsed()
        }
    };
    let m0 = s.metrics(&c).await;
    redis.conn().cmd_ok(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let paused_at = Instant::now();
    let took = batch("10.1.1.2").await;
    assert!(
        took < Duration::from_secs(5),
        "batch under CLIENT PAUSE took {took:?}"
    );
    let m1 = s.metrics(&c).await;
    let timeouts = |m: &str| store_errors(m, &["timeout"]);
    assert!(
        timeouts(&m1) > timeouts(&m0),
        "no timeout counted under CLIENT PAUSE:\n{m1}"
    );
    assert!(
        outcome(&m1, "a", "store_error_allowed") - outcome(&m0, "a", "store_error_allowed") >= 5.0,
        "{m1}"
    );

    // Limiting resumes once the pause is over.
    let ok = eventually(Duration::from_secs(8), || async {
        hit(&c, &s, "/a", "10.1.1.3").await.status == 429
    })
    .await;
    assert!(ok, "no 429 after CLIENT PAUSE ended\n{}", log_of(&s));
    assert!(
        paused_at.elapsed() >= Duration::from_millis(2900),
        "a 429 during the pause?"
    );

    // The same under DEBUG SLEEP, from another connection.
    let port = redis.port;
    let sleeper =
        tokio::task::spawn_blocking(move || Conn::connect(port).cmd(&["DEBUG", "SLEEP", "2"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let took = batch("10.1.1.4").await;
    assert!(
        took < Duration::from_secs(5),
        "batch under DEBUG SLEEP took {took:?}"
    );
    let m2 = s.metrics(&c).await;
    assert!(
        timeouts(&m2) > timeouts(&m1),
        "no timeout counted under DEBUG SLEEP:\n{m2}"
    );
    assert_eq!(sleeper.await.unwrap().as_str(), "OK");
    let ok = eventually(Duration::from_secs(5), || async {
        hit(&c, &s, "/a", "10.1.1.5").await.status == 429
    })
    .await;
    assert!(ok, "no 429 after DEBUG SLEEP ended\n{}", log_of(&s));
}

/// A client that goes away while its decision waits on a stalled Redis was never forwarded:
/// it counts as `client_gone`, not `forwarded`, and the upstream never sees it.
#[tokio::test]
async fn a_client_gone_before_its_decision_is_not_counted_forwarded() {
    use std::io::Write as _;
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = config(
        &standalone(&redis, "3s", 1),
        "deny",
        &up,
        &[route(
            "a",
            "",
            &["{ name: per-ip, by: ip, algorithm: fixed_window, rate: 100/1h }"],
        )],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    let before = s.metrics(&c).await;
    redis.conn().cmd_ok(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let addr = s.addr;
    tokio::task::spawn_blocking(move || {
        let mut st = std::net::TcpStream::connect(addr).unwrap();
        st.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    })
    .await
    .unwrap();
    let log = s.wait_log(&["\"status\":499"]);
    // The pause ends; the call it held is answered and dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let m = s.metrics(&c).await;
    let delta = |out: &str| outcome(&m, "a", out) - outcome(&before, "a", out);
    assert_eq!(delta("client_gone"), 1.0, "{m}\n{log}");
    assert_eq!(delta("forwarded"), 0.0, "{m}\n{log}");
    assert!(log.contains("\"decision\":\"client_gone\""), "{log}");
    assert_eq!(up.hits(), 0);
}

/// Connections to Redis that go silent without closing (its peer gone behind a virtual IP, a
/// NAT or firewall entry dropped: no reset, so the kernel keeps them open for minutes): the
/// policy decides at first, each request within the timeout; once the breaker opens, the
/// gateway drops those connections and opens new ones, and limiting resumes within SPEC §3's
/// 2 s while Redis never stopped answering new connections.
#[tokio::test]
async fn connections_that_go_silent_are_replaced() {
    let redis = RedisServer::start();
    let relay = SilentRelay::start(redis.port);
    let up = Upstream::start();
    let yaml = format!(
        "workers: 1\n{}",
        config(
            &format!(
                "{{ url: \"{}\", timeout: 50ms, pool_size: 1 }}",
                relay.url()
            ),
            "deny",
            &up,
            &[route(
                "a",
                "",
                &["{ name: per-ip, by: ip, algorithm: sliding_log, rate: 1/1h }"],
            )],
        )
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    assert_eq!(
        statuses(&c, &s, "/a", "10.2.0.1", 2).await,
        [200, 429],
        "{}",
        log_of(&s)
    );

    assert!(relay.silence_open() >= 1, "no connection through the relay");
    let silenced = Instant::now();
    let t = Instant::now();
    let first = hit(&c, &s, "/a", "10.2.0.2").await;
    assert_eq!(first.status, 503, "{first:?}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    let ok = eventually(Duration::from_secs(5), || async {
        hit(&c, &s, "/a", "10.2.0.3").await.status == 200
    })
    .await;
    assert!(
        ok,
        "limiting never resumed over new connections\n{}",
        log_of(&s)
    );
    eprintln!(
        "decided by Redis again {:?} after its connections went silent",
        silenced.elapsed()
    );
    // Redis decides again, with the counts from before the silence.
    assert_eq!(hit(&c, &s, "/a", "10.2.0.3").await.status, 429);
    assert_eq!(hit(&c, &s, "/a", "10.2.0.1").await.status, 429);
    assert!(
        log_of(&s).contains("dropping them and connecting again"),
        "{}",
        log_of(&s)
    );
}

/// One worker on one Redis connection with a 50 ms timeout, and route `name` holding one
/// slot per client for 30 s, under `on_error`; ready once its store is.
async fn one_slot_gateway(
    redis: &RedisServer,
    up: &Upstream,
    name: &str,
    on_error: &str,
) -> (Sluice, HttpClient) {
    let limit = "{ name: one, by: ip, algorithm: concurrency, max: 1, lease: 30s }";
    let routes = [route(name, "", &[limit])];
    let yaml = config(&standalone(redis, "50ms", 1), on_error, up, &routes);
    let s = Sluice::start(&format!("workers: 1\n{yaml}"));
    let c = client();
    wait_store(&c, &s).await;
    (s, c)
}

/// A concurrency decision that timed out still runs once Redis resumes, and would take a slot
/// no request holds until its lease ran out (here 30 s, locking the client out). The gateway
/// releases such slots itself, and counts those release calls (and their timeouts) in the
/// store metrics like every other store call.
#[tokio::test]
async fn a_timed_out_concurrency_decision_leaves_no_slot_held() {
    let (redis, up) = (RedisServer::start(), Upstream::start());
    let (s, c) = one_slot_gateway(&redis, &up, "c", "deny").await;
    let ip = "10.3.0.1";
    assert_eq!(
        statuses(&c, &s, "/c", ip, 2).await,
        [200, 200],
        "{}",
        log_of(&s)
    );

    let m0 = s.metrics(&c).await;
    let port = redis.port;
    let sleeper =
        tokio::task::spawn_blocking(move || Conn::connect(port).cmd(&["DEBUG", "SLEEP", "0.4"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = hit(&c, &s, "/c", ip).await;
    assert_eq!(r.status, 503, "decided while Redis slept? {r:?}");
    assert_eq!(sleeper.await.unwrap().as_str(), "OK");

    // The decision ran when Redis woke; the releases after it free its slot.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let members = redis.conn().cmd(&["KEYS", "*"]);
    assert_eq!(
        statuses(&c, &s, "/c", ip, 2).await,
        [200, 200],
        "the slot the timed-out decision took is still held (keys {members:?})\n{}",
        log_of(&s)
    );
    // The decision and the first release timed out (both sent while Redis slept).
    let m1 = s.metrics(&c).await;
    let timeouts = |m: &str| store_errors(m, &["timeout"]);
    assert!(
        timeouts(&m1) - timeouts(&m0) >= 2.0,
        "release calls are not counted:\n{m1}"
    );
}

/// The same under `on_error: local` when the embedded store refuses the request: the timed-out
/// Redis decision still takes its slot when Redis wakes, and the gateway frees it (it did
/// only for requests the embedded store admitted, so one refusal locked the key in Redis for
/// the whole lease).
#[tokio::test]
async fn a_timed_out_concurrency_decision_refused_locally_leaves_no_slot_held() {
    let (redis, up) = (RedisServer::start(), Upstream::start());
    let (s, c) = one_slot_gateway(&redis, &up, "slow", "local").await;
    let ip = "10.3.0.2";
    let port = redis.port;
    let sleeper =
        tokio::task::spawn_blocking(move || Conn::connect(port).cmd(&["DEBUG", "SLEEP", "0.6"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Admitted by the embedded store, and held 1.5 s; the next refused by it.
    let first = tokio::spawn({
        let (c, url) = (c.clone(), s.url("/slow?ms=1500"));
        async move {
            get(&c, &url, &[("x-forwarded-for", "10.3.0.2")])
                .await
                .status
                .as_u16()
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = hit(&c, &s, "/slow?ms=1", ip).await;
    assert_eq!(second.status, 429, "{}", log_of(&s));
    assert_eq!(sleeper.await.unwrap().as_str(), "OK");
    assert_eq!(first.await.unwrap(), 200);
    // Both decisions ran when Redis woke; the releases after them (the second 1 s later)
    // free both slots.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let members = redis.conn().cmd(&["KEYS", "*"]);
    // In Redis itself, whatever decides the next request: no slot is held.
    let mut conn = redis.conn();
    for key in conn.cmd(&["KEYS", "*:concurrency:*"]).as_array() {
        let held = conn.cmd(&["ZCARD", &key.as_str()]).as_int();
        assert_eq!(held, 0, "{} holds a slot no request has", key.as_str());
    }
    let third = hit(&c, &s, "/slow?ms=1", ip).await;
    assert_eq!(
        third.status,
        200,
        "a slot the locally refused decision took is still held (keys {members:?})\n{}",
        log_of(&s)
    );
}

/// Redis answering every decision with an error (out of memory under `noeviction`): the
/// breaker stays closed (Redis answers), each route follows its policy, the errors count as
/// `script`, and the log names the cause; limiting resumes once Redis accepts writes again.
#[tokio::test]
async fn error_replies_follow_the_policy_and_are_logged() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: token_bucket, rate: 5/1h }";
    let yaml = config(
        &standalone(&redis, "200ms", 2),
        "allow",
        &up,
        &[
            route("allow", "    on_store_error: allow\n", &[limit]),
            route("deny", "    on_store_error: deny\n", &[limit]),
        ],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    let m0 = s.metrics(&c).await;
    let mut conn = redis.conn();
    conn.cmd_ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    conn.cmd_ok(&["CONFIG", "SET", "maxmemory", "1"]);

    let d = hit(&c, &s, "/deny", "10.4.0.1").await;
    assert_eq!(d.status, 503, "{d:?}");
    assert!(d.text().contains("OOM"), "the 503 does not say why: {d:?}");
    let a = hit(&c, &s, "/allow", "10.4.0.1").await;
    assert!(
        a.status == 200 && a.header("ratelimit").is_none(),
        "/allow under OOM: {a:?}"
    );
    let m1 = s.metrics(&c).await;
    assert!(
        store_errors(&m1, &["script"]) - store_errors(&m0, &["script"]) >= 2.0,
        "{m1}"
    );
    assert_eq!(outcome(&m1, "allow", "store_error_allowed"), 1.0, "{m1}");
    assert_eq!(readyz(&c, &s).await, 200, "PING still answers: ready");
    let log = log_of(&s);
    assert!(
        log.contains("redis answers decisions with an error") && log.contains("OOM"),
        "the log does not name the error replies:\n{log}"
    );

    conn.cmd_ok(&["CONFIG", "SET", "maxmemory", "0"]);
    let r = hit(&c, &s, "/deny", "10.4.0.1").await;
    assert!(
        r.status == 200 && r.header("ratelimit").is_some(),
        "not decided by Redis once it accepts writes: {r:?}"
    );
}

/// Startup without Redis: the gateway serves per policy, is not ready, `check --connect`
/// fails; once Redis appears on that port, limiting works and `check --connect` passes.
#[tokio::test]
async fn startup_with_redis_down_serves_per_policy() {
    let mut redis = RedisServer::start();
    redis.kill();
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: gcra, rate: 3/1h }";
    let yaml = config(
        &standalone(&redis, "50ms", 2),
        "allow",
        &up,
        &[
            route("deny", "    on_store_error: deny\n", &[limit]),
            route("allow", "", &[limit]),
        ],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    let ip = "10.2.0.1";
    let deny = statuses(&c, &s, "/deny", ip, 5).await;
    assert_eq!(deny, times(503, 5), "{}", log_of(&s));
    assert_eq!(statuses(&c, &s, "/allow", ip, 5).await, times(200, 5));
    assert_eq!(readyz(&c, &s).await, 503);
    assert_eq!(
        get(&c, &s.admin_url("/healthz"), &[]).await.status,
        200,
        "the process keeps serving"
    );
    let (code, stdout, stderr) = check_connect(&s).await;
    assert_eq!(code, 1, "check --connect with Redis down: {stderr}");
    assert!(stderr.contains("store unreachable"), "{stderr}");
    assert!(
        stdout.is_empty(),
        "no summary when the store is unreachable: {stdout}"
    );

    redis.restart();
    wait_recovered(&c, &s, "/deny", Instant::now()).await;
    assert_eq!(
        statuses(&c, &s, "/deny", "10.2.0.2", 4).await,
        [200, 200, 200, 429],
        "limiting once Redis is up\n{}",
        log_of(&s)
    );
    // The requests refused with 503 before Redis existed were never charged.
    assert_eq!(
        peek_remaining(&c, &s, "deny", "per-ip", Some(ip)).await,
        3,
        "requests answered 503 while Redis was down were charged once it came up\n{}",
        log_of(&s)
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&c, &s).await == 200
        })
        .await,
        "/readyz never became ready"
    );
    let (code, stdout, stderr) = check_connect(&s).await;
    assert_eq!(code, 0, "check --connect with Redis up: {stderr}");
    assert!(stdout.contains("store: reachable"), "{stdout}");
}

/// A gateway on `cluster` (`on_error: deny`, timeout 500 ms, two connections) with one route
/// `r` of `limits`, its store connected.
async fn cluster_gateway(
    cluster: &RedisCluster,
    up: &Upstream,
    limits: &[&str],
) -> (Sluice, HttpClient) {
    let store = cluster.store_map("timeout: 500ms, pool_size: 2");
    let s = Sluice::start(&config(&store, "deny", up, &[route("r", "", limits)]));
    let c = client();
    wait_store(&c, &s).await;
    (s, c)
}

/// Trap 10: on a three-primary cluster, a route with limits on two identities (so two slots)
/// admits exactly 3 per client IP, and refused requests charge the per-route limit nothing.
#[tokio::test]
async fn cluster_gateway_limits_exactly() {
    let cluster = RedisCluster::start();
    let up = Upstream::start();
    let (s, c) = cluster_gateway(
        &cluster,
        &up,
        &[
            "{ name: per-ip, by: ip, algorithm: gcra, rate: 3/1h }",
            "{ name: per-route, by: route, algorithm: sliding_log, rate: 100/1h }",
        ],
    )
    .await;

    assert_eq!(
        statuses(&c, &s, "/r", "10.3.0.1", 5).await,
        [200, 200, 200, 429, 429],
        "{}",
        log_of(&s)
    );
    assert_eq!(
        peek_remaining(&c, &s, "r", "per-route", None).await,
        97,
        "refused requests consumed the per-route limit"
    );
    for i in 2..=4 {
        let ip = format!("10.3.0.{i}");
        assert_eq!(
            statuses(&c, &s, "/r", &ip, 4).await,
            [200, 200, 200, 429],
            "{ip}"
        );
    }
    assert_eq!(
        peek_remaining(&c, &s, "r", "per-route", None).await,
        100 - 12
    );
    assert_eq!(
        peek_remaining(&c, &s, "r", "per-ip", Some("10.3.0.1")).await,
        0
    );

    // The two limits really live on different slots.
    let keys = cluster.keys();
    let route_key: Vec<&String> = keys.iter().filter(|k| k.contains(":per-route:")).collect();
    let ip_keys: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains(":per-ip:") && !k.ends_with(":i"))
        .collect();
    assert_eq!(route_key.len(), 1, "{keys:?}");
    assert_eq!(ip_keys.len(), 4, "{keys:?}");
    // Each GCRA key keeps its interval beside it, in its own slot (on the same node).
    for k in &ip_keys {
        let interval = format!("{k}:i");
        assert!(
            keys.contains(&interval),
            "{k} without its interval: {keys:?}"
        );
        assert_eq!(key_slot(interval.as_bytes()), key_slot(k.as_bytes()));
    }
    let route_slot = key_slot(route_key[0].as_bytes());
    assert!(
        ip_keys.iter().all(|k| key_slot(k.as_bytes()) != route_slot),
        "expected the limits on different slots: {keys:?}"
    );
}

/// `mode: standalone` pointed at a Redis Cluster node: `check --connect` names the mistake,
/// and the node's `MOVED` replies (keys of other nodes' slots) are Redis answering, script
/// errors under `on_error`, not connection failures: they do not open the breaker for the
/// keys that node serves (six in a row did, and then every key failed).
#[tokio::test]
async fn a_cluster_node_configured_as_standalone_is_named_and_moved_trips_no_breaker() {
    let cluster = RedisCluster::start();
    let up = Upstream::start();
    let store = format!(
        "{{ url: \"{}\", timeout: 500ms, pool_size: 1 }}",
        cluster.url()
    );
    let limit = "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 100/1h }";
    let s = Sluice::start(&config(&store, "deny", &up, &[route("r", "", &[limit])]));
    let (code, _, stderr) = check_connect(&s).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("this Redis is a Cluster node (cluster_enabled:1): set `mode: cluster`"),
        "{stderr}"
    );
    let c = client();
    let mut served = Vec::new();
    let mut moved = Vec::new();
    for i in 1..=30 {
        let ip = format!("10.5.0.{i}");
        match hit(&c, &s, "/r", &ip).await.status.as_u16() {
            200 => served.push(ip),
            503 => moved.push(ip),
            other => panic!("{ip}: {other}\n{}", log_of(&s)),
        }
    }
    assert!(
        served.len() >= 2 && moved.len() >= 6,
        "{served:?} {moved:?}"
    );
    for ip in &moved[..6] {
        assert_eq!(hit(&c, &s, "/r", ip).await.status.as_u16(), 503);
    }
    for ip in &served {
        assert_eq!(
            hit(&c, &s, "/r", ip).await.status.as_u16(),
            200,
            "{ip}: {}",
            log_of(&s)
        );
    }
    let m = s.metrics(&c).await;
    assert_eq!(
        store_errors(&m, &["connection", "breaker_open"]),
        0.0,
        "{m}"
    );
    assert!(store_errors(&m, &["script"]) >= 12.0, "{m}");
}

/// A graceful failover (`CLUSTER FAILOVER`) keeps the old primary up, as a replica: batched
/// calls routed by the gateway's stale slot map reach it and are refused `READONLY` before
/// anything is charged. The gateway reads the map again and sends them once more, so limiting
/// goes on at once, exactly, on the new primary (it failed every request on that shard until
/// something else refreshed the map, minutes in the audit).
#[tokio::test]
async fn cluster_a_graceful_failover_is_followed_at_once() {
    let mut cluster = RedisCluster::start();
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 10/1h }";
    let (s, c) = cluster_gateway(&cluster, &up, &[limit]).await;
    assert_eq!(statuses(&c, &s, "/r", "10.4.0.1", 3).await, [200; 3]);
    let keys = cluster.keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let primary = cluster.port_for_slot(key_slot(keys[0].as_bytes()));
    let replica = cluster.add_replica(primary);
    cluster.fail_over_to(replica);
    assert_ne!(cluster.port_for_slot(key_slot(keys[0].as_bytes())), primary);
    let mut want = vec![200; 7];
    want.push(429);
    assert_eq!(
        statuses(&c, &s, "/r", "10.4.0.1", 8).await,
        want,
        "{}",
        log_of(&s)
    );
}

/// On a cluster, a request whose limits live on two slots is decided in two rounds (a dry
/// run, then the charges). One refused in the charge round (another request took the last
/// unit in between) holds no concurrency slot afterwards: the slot that round took is freed at
/// once, not when its 30 s lease ends.
#[tokio::test]
async fn cluster_a_request_refused_in_the_charge_round_holds_no_slot() {
    let cluster = RedisCluster::start();
    let up = Upstream::start();
    let yaml = |rate: &str| {
        config(
            &cluster.store_map("timeout: 2s, pool_size: 4"),
            "deny",
            &up,
            &[route(
                "r",
                "",
                &[
                    "{ name: one, by: ip, algorithm: concurrency, max: 1, lease: 30s }",
                    &format!("{{ name: rt, by: route, algorithm: fixed_window, rate: {rate} }}"),
                ],
            )],
        )
    };
    let s = Sluice::start(&yaml("1/1h"));
    let c = client();
    wait_store(&c, &s).await;
    // 40 clients at once, one request each: they all pass the dry run before the first charge
    // takes the one unit, so most are refused in the charge round.
    let ips: Vec<String> = (1..=40).map(|i| format!("10.9.0.{i}")).collect();
    let all = futures_util::future::join_all(ips.iter().map(|ip| hit(&c, &s, "/r", ip))).await;
    let admitted = all.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        admitted,
        1,
        "{:?}",
        all.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // With the route's rate lifted, every client, with nothing in flight, gets its slot.
    s.rewrite_config(&yaml("1000/1h"));
    s.wait_reloads("success", 1.0).await;
    let mut held = Vec::new();
    for ip in &ips {
        let r = hit(&c, &s, "/r", ip).await;
        if r.status != 200 {
            held.push(format!("{ip}: {} {}", r.status, r.text()));
        }
    }
    assert!(
        held.is_empty(),
        "slots still held by refused requests: {held:#?}"
    );
}

/// A sentinel-discovered master: 3 admitted, then 429 with Retry-After, state in the master.
#[tokio::test]
async fn sentinel_gateway_limits() {
    let sentinel = Sentinel::start();
    let up = Upstream::start();
    let yaml = config(
        &sentinel.store_map("timeout: 500ms, pool_size: 2"),
        "deny",
        &up,
        &[route(
            "r",
            "",
            &["{ name: per-ip, by: ip, algorithm: sliding_window, rate: 3/1h }"],
        )],
    );
    let s = Sluice::start(&yaml);
    let c = client();
    wait_store(&c, &s).await;
    assert_eq!(
        statuses(&c, &s, "/r", "10.4.0.1", 3).await,
        [200, 200, 200],
        "{}",
        log_of(&s)
    );
    let r = hit(&c, &s, "/r", "10.4.0.1").await;
    assert_eq!(r.status, 429);
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1, "{retry}");
    let keys = sentinel.master.conn().cmd_ok(&["KEYS", "*"]).as_array();
    assert!(
        keys.iter().any(|k| k.as_str().contains(":per-ip:")),
        "no limiter key in the master: {keys:?}"
    );
}

/// A sentinel that accepts connections and never answers (a paused or wedged process),
/// listed first, is passed over. fred asks the sentinels in order and gives up the whole
/// attempt on one that times out, starting the next attempt with it again: the gateway never
/// connected, and served every request per `on_error`.
#[tokio::test]
async fn a_hung_sentinel_listed_first_is_passed_over() {
    let sentinel = Sentinel::start();
    // Never accepted: connections complete in the backlog, and nothing ever answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = hung.local_addr().unwrap();
    let store = sentinel.store_map("timeout: 500ms, pool_size: 2").replacen(
        "nodes: [",
        &format!("nodes: [\"{addr}\", "),
        1,
    );
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 3/1h }";
    let s = Sluice::start(&config(&store, "deny", &up, &[route("r", "", &[limit])]));
    let c = client();
    wait_store(&c, &s).await;
    assert_eq!(
        statuses(&c, &s, "/r", "10.6.0.1", 4).await,
        [200, 200, 200, 429],
        "{}",
        log_of(&s)
    );
    drop(hung);
}

/// A Sentinel failover whose old primary stays up is followed when Sentinel announces it
/// (`+switch-master`), not when Sentinel later reconfigures the old primary (its periodic
/// check, about 10 s): what the gateway charged in between went to the old primary and was
/// lost with its data, and the limit admitted that much again.
#[tokio::test]
async fn sentinel_a_failover_is_followed_when_announced() {
    let sentinel = Sentinel::start();
    let replica = sentinel.add_replica();
    let up = Upstream::start();
    let limit = "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 5/1h }";
    let store = sentinel.store_map("timeout: 500ms, pool_size: 2");
    let yaml = config(&store, "deny", &up, &[route("r", "", &[limit])]);
    let s = Sluice::start(&format!("workers: 1\n{yaml}"));
    let c = client();
    wait_store(&c, &s).await;
    let ip = "10.7.0.1";
    assert_eq!(statuses(&c, &s, "/r", ip, 3).await, [200; 3]);
    let mut r = replica.conn();
    let synced = eventually(Duration::from_secs(5), || {
        let keys = r.cmd_ok(&["KEYS", "*"]).as_array().len();
        async move { keys == 1 }
    })
    .await;
    assert!(synced, "the replica never got the key");
    drop(r);
    sentinel.fail_over(&replica);
    s.wait_log(&["sentinel switched the primary"]);
    // The gateway's two connections are new ones, to the new primary (unnamed, where the
    // sentinel's are named; this poll's own is the one running CLIENT LIST).
    let moved = eventually(Duration::from_secs(15), || {
        let list = replica.conn().cmd_ok(&["CLIENT", "LIST"]).as_str();
        let ours = list
            .lines()
            .filter(|l| {
                l.contains(" name= ") && l.contains(" flags=N ") && !l.contains("cmd=client|list")
            })
            .count();
        async move { ours >= 2 }
    })
    .await;
    assert!(
        moved,
        "the gateway never connected to the new primary\n{}",
        log_of(&s)
    );
    assert_eq!(
        statuses(&c, &s, "/r", ip, 2).await,
        [200; 2],
        "{}",
        log_of(&s)
    );
    // Once the old primary is a replica of the new one, the 5 are spent: nothing was charged
    // where it would be lost.
    let old = sentinel.master.port;
    let demoted = eventually(Duration::from_secs(30), || {
        // A new connection each time: Sentinel's reconfiguration closes the old primary's.
        let role = Conn::try_connect(old)
            .and_then(|mut c| c.try_cmd(&["ROLE"]))
            .map(|r| r.as_array()[0].as_str());
        async move { role.is_ok_and(|r| r == "slave") }
    })
    .await;
    assert!(demoted, "Sentinel never reconfigured the old primary");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        statuses(&c, &s, "/r", ip, 3).await,
        [429; 3],
        "charges went to the old primary and were lost\n{}",
        log_of(&s)
    );
}

/// Limit state lives in Redis across reloads: editing `rate` keeps the counters (the key has
/// no rate in it), editing the algorithm starts fresh.
#[tokio::test]
async fn redis_counters_survive_a_rate_edit() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = |limit: &str| {
        config(
            &standalone(&redis, "200ms", 4),
            "deny",
            &up,
            &[route("r", "", &[limit])],
        )
    };
    let s = Sluice::start(&yaml(
        "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 3/1h }",
    ));
    let c = client();
    wait_store(&c, &s).await;
    let ip = "10.9.0.1";
    assert_eq!(statuses(&c, &s, "/r", ip, 2).await, times(200, 2));
    s.rewrite_config(&yaml(
        "{ name: per-ip, by: ip, algorithm: fixed_window, rate: 5/1h }",
    ));
    s.wait_reloads("success", 1.0).await;
    // 2 used of the new 5.
    assert_eq!(
        statuses(&c, &s, "/r", ip, 4).await,
        vec![200, 200, 200, 429]
    );
    s.rewrite_config(&yaml(
        "{ name: per-ip, by: ip, algorithm: sliding_log, rate: 5/1h }",
    ));
    s.wait_reloads("success", 2.0).await;
    assert_eq!(
        statuses(&c, &s, "/r", ip, 6).await,
        [times(200, 5), times(429, 1)].concat()
    );
}

/// An upstream that reads each request's head, waits `after`, then writes `answer` (empty:
/// writes nothing) and closes.
fn late_upstream(after: Duration, answer: &'static str) -> std::net::SocketAddr {
    support::raw::upstream(move |conn| {
        use std::io::Write;
        std::thread::sleep(after);
        let _ = conn.write_all(answer.as_bytes());
    })
}

/// A client that leaves while its settling call waits behind a busy Redis connection still
/// pays and frees: the release of a 502's concurrency slot and the charge of an answer's
/// `X-Tokens-Used` run on their own task. They were awaited in the request's future, which
/// hyper drops when the client leaves, and a queued call whose caller is gone is never sent:
/// the slot stayed taken until its lease ran out (`max: 1` refused everyone for 30 s), and
/// the answer was free.
///
/// Each round: A is admitted; Redis is paused (`CLIENT PAUSE`) and B's decision call waits in
/// it on the gateway's one connection; A's upstream then answers (or fails), so A's settling
/// call queues behind B's; A resets its connection; the pause ends.
#[tokio::test]
async fn a_client_that_leaves_while_its_settling_call_waits_still_pays_and_frees() {
    use std::io::Write;
    let redis = RedisServer::start();
    let up = Upstream::start();
    let failing = late_upstream(Duration::from_millis(1000), "");
    let answering = late_upstream(
        Duration::from_millis(1000),
        "HTTP/1.1 200 OK\r\nX-Tokens-Used: 50\r\nContent-Length: 2\r\n\r\nok",
    );
    let s = Sluice::start(&format!(
        "workers: 1
store:
  kind: redis
  redis: {}
  on_error: deny
upstreams:
  up: {{ targets: [{}] }}
  failing: {{ targets: [\"http://{failing}\"] }}
  answering: {{ targets: [\"http://{answering}\"] }}
routes:
  - name: conc
    match: {{ path_prefix: /conc }}
    upstream: failing
    limits: [ {{ name: inflight, by: route, algorithm: concurrency, max: 1, lease: 30s }} ]
  - name: tok
    match: {{ path_prefix: /tok }}
    upstream: answering
    limits: [ {{ name: tokens, by: route, algorithm: token_bucket, rate: 100/1h, cost: {{ response_header: X-Tokens-Used, default: 5, max: 50 }} }} ]
  - name: other
    match: {{ path_prefix: /other }}
    upstream: up
    limits: [ {{ name: r, by: route, algorithm: fixed_window, rate: 1000/1h }} ]
",
        standalone(&redis, "5s", 1),
        up.url()
    ));
    let c = client();
    wait_store(&c, &s).await;
    for path in ["/conc", "/tok"] {
        let mut a = std::net::TcpStream::connect(s.addr).unwrap();
        a.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.conn().cmd_ok(&["CLIENT", "PAUSE", "2500", "ALL"]);
        // B's decision call, held in Redis by the pause.
        let b = tokio::spawn({
            let (c, url) = (c.clone(), s.url("/other"));
            async move { get(&c, &url, &[]).await.status.as_u16() }
        });
        // A's upstream answers at +1 s; A leaves at +1.5 s, its settling call still queued.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        drop(a);
        assert_eq!(b.await.unwrap(), 200, "{}", log_of(&s));
    }
    // The answer's 50 tokens were charged.
    let left = peek_remaining(&c, &s, "tok", "tokens", None).await;
    assert_eq!(left, 50, "{}", log_of(&s));
    // The slot is free again: the next request is admitted (and its upstream fails: 502).
    let next = hit(&c, &s, "/conc", "10.0.0.1").await;
    assert_eq!(next.status, 502, "{}", next.text());
}
