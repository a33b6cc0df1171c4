//! Forwarding through the real binary to a real upstream over real sockets.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use http::Method;
use http_body_util::BodyExt;
use support::*;

fn plain(up: &Upstream) -> String {
    format!(
        "client_ip: {{ trusted_proxies: [10.0.0.0/8] }}
upstreams:
  up: {{ targets: [{}], timeout: 1s, connect_timeout: 1s }}
routes:
  - name: strip
    match: {{ path_prefix: /api }}
    upstream: up
    strip_prefix: true
  - name: only-post
    match: {{ path: /post-only, methods: [POST] }}
    upstream: up
  - name: everything
    match: {{ path_prefix: /, host: '*.example.com' }}
    upstream: up
  - name: localhost
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    )
}

#[tokio::test]
async fn forwards_headers_per_rfc9110() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    let r = send(
        &c,
        Method::GET,
        &s.url("/echo?a=1"),
        &[
            ("host", "shop.example.com"),
            ("connection", "x-private, keep-alive"),
            ("x-private", "secret"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic abc"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=10.0.0.1;proto=https;host=admin.internal"),
            ("x-real-ip", "10.0.0.1"),
            ("x-request-id", "client-id-1"),
            ("authorization", "Bearer keep-me"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", s.log());
    let echo = r.json();
    let h = &echo["headers"];
    assert_eq!(echo["path"], "/echo");
    assert_eq!(echo["query"], "a=1");
    assert_eq!(h["host"][0], "shop.example.com", "Host passes through");
    for hop in ["x-private", "keep-alive", "te", "proxy-authorization"] {
        assert!(h.get(hop).is_none(), "{hop} must not be forwarded: {h}");
    }
    assert_eq!(h["authorization"][0], "Bearer keep-me");
    assert_eq!(h["x-forwarded-for"][0], "6.6.6.6, 127.0.0.1");
    assert_eq!(
        h["x-forwarded-proto"][0], "http",
        "an untrusted peer cannot claim https"
    );
    assert_eq!(h["x-forwarded-host"][0], "shop.example.com");
    assert!(
        h.get("forwarded").is_none(),
        "an untrusted peer's Forwarded does not reach the upstream: {h}"
    );
    assert_eq!(
        h["x-real-ip"],
        serde_json::json!(["127.0.0.1"]),
        "an untrusted peer's X-Real-IP is replaced by its address"
    );
    assert_eq!(h["x-request-id"][0], "client-id-1");
    assert_eq!(r.header("x-request-id"), Some("client-id-1"));
    // Hop-by-hop fields of the upstream's response do not reach the client either.
    assert!(r.header("x-hop").is_none());
    assert!(r.header("keep-alive").is_none());

    // A request id is generated when absent, forwarded, and returned.
    let r = get(&c, &s.url("/echo"), &[]).await;
    let rid = r.header("x-request-id").unwrap().to_string();
    assert_eq!(rid.len(), 32);
    assert_eq!(r.json()["headers"]["x-request-id"][0], rid.as_str());
}

/// The upstream's echoes of two requests sent as `raw` on one connection, both answered 200.
fn two_echoes(s: &Sluice, raw: &[u8]) -> Vec<serde_json::Value> {
    let ex = support::raw::exchange(s.addr, raw, Duration::from_millis(1500));
    assert_eq!(ex.responses.len(), 2, "{}", ex.text());
    ex.responses
        .iter()
        .map(|r| {
            assert_eq!(r.status, 200, "{}", ex.text());
            r.json()
        })
        .collect()
}

/// `Connection` may name any field for removal, but not `Host`: the upstream gets the host
/// the request was routed on, whatever the client lists (raw bytes, one connection).
#[test]
fn connection_cannot_strip_the_host() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    for echo in two_echoes(
        &s,
        b"GET /echo HTTP/1.1\r\nHost: shop.example.com\r\nConnection: Host, x-private\r\nx-private: 1\r\n\r\nGET /echo HTTP/1.1\r\nHost: shop.example.com\r\nConnection: host, close\r\n\r\n",
    ) {
        assert_eq!(
            echo["headers"]["host"],
            serde_json::json!(["shop.example.com"]),
            "{echo}"
        );
        assert_eq!(echo["headers"]["x-forwarded-host"][0], "shop.example.com");
        assert!(echo["headers"].get("x-private").is_none(), "{echo}");
    }
}

#[tokio::test]
async fn routes_first_match_and_strip_prefix() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    assert_eq!(
        get(&c, &s.url("/api/users?x=1"), &[]).await.json()["path"],
        "/users"
    );
    assert_eq!(get(&c, &s.url("/api"), &[]).await.json()["path"], "/");
    assert_eq!(get(&c, &s.url("/apiary"), &[]).await.json()["path"], "/ary");
    let r = send(&c, Method::POST, &s.url("/post-only"), &[], b"hello").await;
    assert_eq!(r.json()["body_len"], 5);
    assert_eq!(r.json()["method"], "POST");
}

#[tokio::test]
async fn no_route_is_404_problem_json() {
    let up = Upstream::start();
    let s = Sluice::start(&format!("upstreams: {{ up: {{ targets: [{}] }} }}\nroutes:\n  - name: only\n    match: {{ path: /x }}\n    upstream: up\n", up.url()));
    let r = get(&client(), &s.url("/nope"), &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["status"], 404);
    assert!(r.header("x-request-id").is_some());
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn trusted_proxy_keeps_forwarded_proto_and_host() {
    let up = Upstream::start();
    let s = Sluice::start(&format!("client_ip: {{ trusted_proxies: [127.0.0.1/32] }}\nupstreams: {{ up: {{ targets: [{}] }} }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n", up.url()));
    let r = get(
        &client(),
        &s.url("/"),
        &[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "public.example.com"),
            ("x-forwarded-for", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4;proto=https"),
        ],
    )
    .await;
    let h = &r.json()["headers"];
    assert_eq!(h["forwarded"][0], "for=1.2.3.4;proto=https");
    assert_eq!(h["x-forwarded-proto"][0], "https");
    assert_eq!(h["x-forwarded-host"][0], "public.example.com");
    assert_eq!(h["x-forwarded-for"][0], "1.2.3.4, 127.0.0.1");
    assert_eq!(
        h["x-real-ip"],
        serde_json::json!(["1.2.3.4"]),
        "behind a trusted proxy, the client it names"
    );
    // A trusted proxy's own X-Real-IP is kept.
    let r = get(
        &client(),
        &s.url("/"),
        &[("x-forwarded-for", "1.2.3.4"), ("x-real-ip", "5.6.7.8")],
    )
    .await;
    assert_eq!(
        r.json()["headers"]["x-real-ip"],
        serde_json::json!(["5.6.7.8"])
    );
}

/// A client's `X-Real-IP` never reaches the upstream as its address, whatever its spelling or
/// number of lines (raw bytes, one connection, the gateway's peer untrusted).
#[test]
fn a_client_cannot_name_its_own_address_to_the_upstream() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    for echo in two_echoes(
        &s,
        b"GET /echo HTTP/1.1\r\nHost: a\r\nX-Real-IP: 10.0.0.1\r\nx-real-ip: 10.0.0.2\r\n\r\nGET /echo HTTP/1.1\r\nHost: a\r\nX-REAL-IP:  8.8.8.8 \r\nConnection: close\r\n\r\n",
    ) {
        assert_eq!(
            echo["headers"]["x-real-ip"],
            serde_json::json!(["127.0.0.1"]),
            "{echo}"
        );
    }
}

/// Behind a trusted proxy, the client is the rightmost untrusted hop the proxy wrote, however
/// the client dressed up what came before it (raw bytes, one connection each):
/// - a byte that is not ASCII in the client's own `X-Forwarded-For` entry (the proxy appends
///   to it) spoils that entry only, where it used to make the proxy the client: one bucket
///   shared by everyone behind it, and the upstream told the proxy's address;
/// - a `for=` inside a quoted `Forwarded` value (RFC 7239 §4) is text, not an address: a
///   client choosing it would choose its own rate-limit key.
#[test]
fn a_trusted_proxys_hops_are_read_past_what_the_client_wrote() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "client_ip: {{ trusted_proxies: [127.0.0.1/32] }}
upstreams: {{ up: {{ targets: [{}] }} }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
    limits: [ {{ name: per-ip, by: ip, algorithm: fixed_window, rate: 1/1h, headers: false }} ]
",
        up.url()
    ));
    let one = |raw: &[u8]| {
        let ex = support::raw::exchange(s.addr, raw, Duration::from_millis(1500));
        let r = ex.one();
        (r.status, (r.status == 200).then(|| r.json()))
    };
    let (status, echo) = one(
        b"GET /echo HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: caf\xe9, 203.0.113.50\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert_eq!(echo.unwrap()["headers"]["x-real-ip"][0], "203.0.113.50");
    // The proxy's own address kept its quota: another client's request behind it passes.
    let (status, _) = one(b"GET /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200, "the proxy's own bucket was charged");
    let (status, echo) = one(
        b"GET /echo HTTP/1.1\r\nHost: a\r\nForwarded: proto=http;host=\"x;for=9.9.8.1\";for=\"5.5.5.5:1234\"\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert_eq!(echo.unwrap()["headers"]["x-real-ip"][0], "5.5.5.5");
    // A quote the client left open does not swallow what the proxy appended to its line.
    let (status, echo) = one(
        b"GET /echo HTTP/1.1\r\nHost: a\r\nForwarded: for=\"x, for=203.0.113.70\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert_eq!(echo.unwrap()["headers"]["x-real-ip"][0], "203.0.113.70");
    // A fresh quoted address buys nothing: it is still 5.5.5.5's one request an hour.
    let (status, _) = one(
        b"GET /echo HTTP/1.1\r\nHost: a\r\nForwarded: proto=http;host=\"x;for=9.9.8.2\";for=\"5.5.5.5:1234\"\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 429);
}

#[tokio::test]
async fn h2c_prior_knowledge() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let r = get(&c, &s.url("/echo"), &[]).await;
    assert_eq!(r.status, 200, "{}", s.log());
    let echo = r.json();
    assert_eq!(echo["version"], "HTTP/1.1", "upstream side is HTTP/1.1");
    assert_eq!(
        echo["headers"]["host"][0],
        s.addr.to_string(),
        "h2 :authority becomes Host"
    );
    assert!(r.header("x-request-id").is_some());
}

/// What HTTP/1.1's parser would not carry is refused over HTTP/2 too, so both protocols reach
/// the routes alike: a value with white space at either end (RFC 9113 §8.2.1: malformed;
/// passed on, `prod ` would miss the route matching `prod` and its limit, while the upstream
/// reads `prod`), a name that is not a token, and more than 100 fields (431).
#[tokio::test]
async fn http2_requests_http1_could_not_send_are_refused() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams: {{ up: {{ targets: [{}] }} }}\nroutes:\n  - name: prod\n    match: {{ path_prefix: /, headers: {{ X-Env: prod }} }}\n    upstream: up\n    limits: [ {{ name: l, by: ip, algorithm: fixed_window, rate: 1/1m }} ]\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n",
        up.url()
    ));
    let c: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    assert_eq!(
        get(&c, &s.url("/a"), &[("x-env", "prod")]).await.status,
        200
    );
    for v in ["prod ", " prod", "prod\t", "\tprod"] {
        let r = get(&c, &s.url("/a"), &[("x-env", v)]).await;
        assert_eq!(r.status, 400, "{v:?}: {}", r.text());
        assert!(r.text().contains("white space"), "{}", r.text());
    }
    assert_eq!(
        get(&c, &s.url("/a"), &[("x-env", "prod")]).await.status,
        429,
        "the limit still holds"
    );
    let quoted = http::Request::builder()
        .uri(s.url("/b"))
        .header(http::HeaderName::from_lowercase(b"x\"q").unwrap(), "v")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = c.request(quoted).await.unwrap();
    assert_eq!(r.status(), 400);
    let many: Vec<(String, String)> = (0..101).map(|i| (format!("x-f{i}"), "1".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(get(&c, &s.url("/b"), &many).await.status, 431);
    // (The gateway adds its forwarding fields, and the test upstream too takes 100 at most.)
    let r = get(&c, &s.url("/b"), &many[..90]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        up.hits(),
        2,
        "only the two well-formed requests went upstream"
    );
}

/// A gateway whose `/dead` goes to a target that refuses connections, and everything else to
/// `mixed`: that refusing target first, then `up`.
fn refusing_first(up: &Upstream) -> Sluice {
    let dead = format!("http://127.0.0.1:{}", free_port());
    Sluice::start(&format!(
        "upstreams:\n  dead: {{ targets: [{dead}] }}\n  mixed: {{ targets: [{dead}, {}] }}\nroutes:\n  - name: dead\n    match: {{ path_prefix: /dead }}\n    upstream: dead\n  - name: mixed\n    match: {{ path_prefix: / }}\n    upstream: mixed\n",
        up.url()
    ))
}

#[tokio::test]
async fn refused_upstream_is_502_and_round_robin_skips_it() {
    let up = Upstream::start();
    let s = refusing_first(&up);
    let c = client();
    let t = Instant::now();
    let r = get(&c, &s.url("/dead"), &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "refusal must not wait for the connect timeout"
    );
    // With one refusing target and one live one, every request succeeds (body included).
    for i in 0..6 {
        let r = send(
            &c,
            Method::POST,
            &s.url("/x"),
            &[],
            format!("body-{i}").as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.json()["body_len"], 6);
    }
    assert_eq!(up.hits(), 6);
}

/// A request without a body has nothing to replay: refused by the first target (round robin
/// starts at the refusing one), it is sent to the next one all the same, once.
#[tokio::test]
async fn a_bodyless_request_refused_by_one_target_goes_to_the_next() {
    let up = Upstream::start();
    let s = refusing_first(&up);
    let c = client();
    let r = get(&c, &s.url("/first"), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_len"], 0);
    assert_eq!(up.hits(), 1);
    let r = send(&c, Method::DELETE, &s.url("/second"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.hits(), 2);
}

#[tokio::test]
async fn round_robin_over_live_targets() {
    let a = Upstream::start();
    let b = Upstream::start();
    let s = Sluice::start(&format!("upstreams: {{ up: {{ targets: [{}, {}] }} }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n", a.url(), b.url()));
    let c = client();
    for _ in 0..10 {
        assert_eq!(get(&c, &s.url("/"), &[]).await.status, 200);
    }
    assert_eq!((a.hits(), b.hits()), (5, 5));
}

/// Upstream connections are kept alive and reused: sequential requests share one, concurrent
/// ones open one each (past the idle one) and are then reused, and a connection the upstream
/// closes is not used again.
#[tokio::test]
async fn upstream_connections_are_reused_until_closed() {
    let up = Upstream::start();
    // One worker: each worker keeps its own connections (see the next test).
    let s = Sluice::start(&format!("workers: 1\n{}", plain(&up)));
    let c = client();
    for i in 0..20 {
        let r = get(&c, &s.url(&format!("/seq/{i}")), &[]).await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        up.conns(),
        1,
        "sequential requests share one upstream connection"
    );

    // The upstream answers `Connection: close` and closes: the next request opens another.
    assert_eq!(get(&c, &s.url("/close"), &[]).await.text(), "closing");
    for _ in 0..5 {
        assert_eq!(get(&c, &s.url("/after"), &[]).await.status, 200);
    }
    assert_eq!(
        up.conns(),
        2,
        "a closed connection is replaced once, then reused"
    );

    // 8 at once (each held 300 ms at the upstream) need 8 connections, then 8 more reuse them.
    let burst = |tag: &'static str| {
        let url = s.url(&format!("/burst?ms=300&tag={tag}"));
        futures_util::future::join_all((0..8).map(move |_| {
            let url = url.clone();
            async move { get(&client(), &url, &[]).await.status }
        }))
    };
    assert_eq!(burst("a").await, vec![200; 8]);
    let after_first = up.conns();
    assert_eq!(after_first, 2 + 7, "one idle connection reused, 7 opened");
    assert_eq!(burst("b").await, vec![200; 8]);
    assert_eq!(
        up.conns(),
        after_first,
        "the second burst reuses the first's"
    );
    assert_eq!(up.hits(), 20 + 1 + 5 + 16);
}

/// `workers: 3` is three threads serving the same port; many client connections at once are
/// all answered, each on a worker that keeps its upstream connections, and SIGTERM drains
/// every worker's requests in flight.
#[tokio::test]
async fn every_worker_serves_and_drains() {
    let up = Upstream::start();
    let mut s = Sluice::start(&format!("workers: 3\n{}", plain(&up)));
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", s.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    let mut workers: Vec<&str> = threads
        .iter()
        .map(|n| n.trim_end())
        .filter(|n| n.starts_with("sluice-worker-"))
        .collect();
    workers.sort_unstable();
    // Counted from 1 as in the metrics and logs; the first worker is the main thread.
    assert_eq!(
        workers,
        ["sluice-worker-2", "sluice-worker-3"],
        "the first worker and two more: {threads:?}"
    );

    // 24 clients, each on its own connection, 3 requests in a row, all at once.
    let rounds = futures_util::future::join_all((0..24).map(|i| {
        let url = s.url(&format!("/w/{i}?ms=50"));
        async move {
            let c = client();
            let mut statuses = Vec::new();
            for _ in 0..3 {
                statuses.push(get(&c, &url, &[]).await.status);
            }
            statuses
        }
    }))
    .await;
    assert!(rounds.iter().flatten().all(|&st| st == 200), "{rounds:?}");
    assert_eq!(up.hits(), 72);
    // Held concurrently, 24 requests need 24 upstream connections at most; kept alive and
    // reused by the second and third requests of each client.
    let conns = up.conns();
    assert!((1..=24).contains(&conns), "{conns} upstream connections");

    // Requests in flight on every worker finish when SIGTERM arrives.
    let slow = futures_util::future::join_all((0..12).map(|i| {
        let url = s.url(&format!("/slow?ms=400&i={i}"));
        async move { get(&client(), &url, &[]).await.status }
    }));
    let term = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.signal("TERM");
    };
    let (statuses, ()) = tokio::join!(slow, term);
    assert_eq!(statuses, vec![200; 12]);
    let status = s.stop();
    assert!(status.success(), "{status:?}");
}

/// The kernel wakes every worker for a new connection and the first awake takes all that
/// are queued; sluice then hands each to the worker holding the fewest. 12 clients
/// connecting one after another to 3 workers end up 4 on each, whichever worker accepted
/// them, and closing them brings every worker's count back to 0.
#[tokio::test]
async fn connections_are_spread_evenly_over_the_workers() {
    let up = Upstream::start();
    let s = Sluice::start(&format!("workers: 3\n{}", plain(&up)));
    let open = |text: &str| -> Vec<f64> {
        (1..=3)
            .map(|w| {
                metric(
                    text,
                    "sluice_connections_open",
                    &[("worker", &w.to_string())],
                )
            })
            .collect()
    };
    let mut held = Vec::new();
    for i in 0..12 {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(c, "GET /spread/{i} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0; 64];
        let n = c.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        held.push(c);
    }
    let metrics = get(&client(), &s.admin_url("/metrics"), &[]).await.text();
    assert_eq!(open(&metrics), [4.0, 4.0, 4.0], "connections per worker");

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = get(&client(), &s.admin_url("/metrics"), &[]).await.text();
        let now = open(&metrics);
        if now == [0.0, 0.0, 0.0] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still counted after closing: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn upstream_timeout_is_504() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let t = Instant::now();
    let r = get(&client(), &s.url("/slow?ms=5000"), &[]).await;
    let took = t.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["status"], 504);
    assert!(
        took >= Duration::from_millis(950),
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "did not answer near the 1s timeout: {took:?}"
    );
}

#[tokio::test]
async fn upstream_closing_without_answer_is_502() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(3) {
            let mut st = stream.unwrap();
            let mut buf = [0u8; 1024];
            let _ = st.read(&mut buf);
            drop(st);
        }
    });
    let s = Sluice::start(&format!("upstreams: {{ up: {{ targets: [http://{addr}] }} }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n"));
    let r = get(&client(), &s.url("/"), &[]).await;
    assert_eq!(r.status, 502, "{}", r.text());
}

/// "Max open files" of a process: (soft, hard), `None` for unlimited.
fn open_files(pid: &str) -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut v = line["Max open files".len()..].split_whitespace();
    let mut next = || v.next().and_then(|x| x.parse().ok());
    (next(), next())
}

/// The soft open-file limit is raised to the hard one at start (as Go's runtime and nginx's
/// `worker_rlimit_nofile` do): every client and upstream connection is a descriptor, and under
/// systemd's default soft limit of 1024 a few HTTP/2 clients with streams waiting on a slow
/// upstream used them all.
#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    assert!(
        which("prlimit"),
        "prlimit not found: apt-get install -y util-linux"
    );
    let (_, hard) = open_files("self");
    let Some(hard) = hard else {
        panic!("this test needs a finite hard open-file limit (ulimit -Hn)");
    };
    assert!(hard > 256, "hard open-file limit {hard}: nothing to raise");
    let up = Upstream::start();
    let nofile = format!("--nofile=256:{hard}");
    let s = Sluice::start_under(&plain(&up), &["prlimit", &nofile, "--"]);
    assert_eq!(
        open_files(&s.pid().to_string()),
        (Some(hard), Some(hard)),
        "{}",
        s.log()
    );
    s.wait_log(&["open file limit raised to the hard limit"]);
    assert_eq!(get(&client(), &s.url("/"), &[]).await.status, 200);
}

/// Out of descriptors: the accept loop says so once a second (with the count), not fifty
/// times; a request that needs a new upstream connection gets 502 and the log names the
/// gateway's own shortage, not the upstream; and serving resumes once descriptors free up.
#[tokio::test]
async fn out_of_descriptors_the_gateway_says_so_and_recovers() {
    assert!(
        which("prlimit"),
        "prlimit not found: apt-get install -y util-linux"
    );
    let (a, b) = (Upstream::start(), Upstream::start());
    let yaml = format!(
        "workers: 1\nupstreams:\n  a: {{ targets: [{}] }}\n  b: {{ targets: [{}] }}\nroutes:\n  - {{ name: b, match: {{ path_prefix: /b }}, upstream: b }}\n  - {{ name: a, match: {{ path_prefix: / }}, upstream: a }}\n",
        a.url(),
        b.url()
    );
    let s = Sluice::start_under(&yaml, &["prlimit", "--nofile=64:64", "--"]);
    let request = |st: &mut TcpStream, path: &str| {
        st.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && st.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut body = vec![0; len];
        st.read_exact(&mut body).unwrap();
        head
    };
    let mut kept = TcpStream::connect(s.addr).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(request(&mut kept, "/").starts_with("HTTP/1.1 200"));
    // Idle connections until the gateway has no descriptor left.
    let idle: Vec<TcpStream> = (0..80)
        .filter_map(|_| TcpStream::connect(s.addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    let head = request(&mut kept, "/b");
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    std::thread::sleep(Duration::from_millis(300));
    let log = s.log();
    let warnings = log.matches("accept failed").count();
    assert!(
        (1..=5).contains(&warnings),
        "{warnings} accept warnings in about 2.5 s:\n{log}"
    );
    assert!(log.contains("out of resources"), "{log}");
    drop(idle);
    let ok = eventually(Duration::from_secs(5), || async {
        get(&client(), &s.url("/b"), &[]).await.status == 200
    })
    .await;
    assert!(ok, "no recovery once descriptors were free\n{}", s.log());
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

#[tokio::test]
async fn websocket_upgrade_passes_through() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let (head, mut st) = support::raw::websocket(s.addr);
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for msg in [&b"hello"[..], b"second frame", &[0u8, 1, 2, 255]] {
        st.write_all(msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        st.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
    }
}

/// RFC 9110 §15.2.2: a 101 MUST say what it switches to. One to a WebSocket request without
/// `Upgrade: websocket` is a 502, not a tunnel of bytes the client cannot read (it was
/// tunnelled).
#[test]
fn a_101_that_does_not_switch_to_websocket_is_a_502() {
    let up = support::raw::upstream(|conn| {
        let _ = conn.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n");
        let _ = conn.read(&mut [0; 1]);
    });
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [\"http://{up}\"] }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n"
    ));
    let (head, _st) = support::raw::websocket(s.addr);
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
}

/// A tunnel with no byte either way for the upstream's `idle_timeout` (1 s here) is closed,
/// as nginx closes one after `proxy_read_timeout`: a client that upgrades and goes silent
/// would otherwise hold both sockets, and any concurrency slot, until the process stops. One
/// that keeps talking (a frame every 0.4 s for 2 s) is never cut.
#[test]
fn an_idle_tunnel_is_closed_after_the_upstreams_idle_timeout() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up).replace("timeout: 1s,", "timeout: 1s, idle_timeout: 1s,"));
    let (head, mut st) = support::raw::websocket(s.addr);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(400));
        st.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        st.read_exact(&mut back)
            .expect("a talking tunnel stays open");
        assert_eq!(&back, b"ping");
    }
    // Silent now: the gateway closes it (EOF), well before the 10 s read timeout.
    let mut rest = Vec::new();
    let read = st.read_to_end(&mut rest);
    assert!(
        matches!(read, Ok(0)),
        "the idle tunnel was not closed: {read:?}"
    );
}

#[tokio::test]
async fn slow_client_headers_are_cut_off() {
    let up = Upstream::start();
    let s = Sluice::start(&format!("client_header_timeout: 1s\n{}", plain(&up)));
    let mut st = TcpStream::connect(s.addr).unwrap();
    st.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
    st.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let _ = st.read_to_end(&mut buf);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "connection was not closed"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(buf.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests() {
    let up = Upstream::start();
    let mut s = Sluice::start(&plain(&up));
    let url = s.url("/slow?ms=700");
    let inflight = tokio::spawn(async move { get(&client(), &url, &[]).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = tokio::task::spawn_blocking(move || {
        let st = s.stop();
        (st, s)
    });
    let r = inflight.await.unwrap();
    assert_eq!(r.status, 200, "in-flight request finished");
    let (st, s) = status.await.unwrap();
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(s.log().contains("drain"), "{}", s.log());
}

/// 1 GiB each way through the gateway while its RSS is sampled: memory stays flat.
#[tokio::test]
async fn large_bodies_stream_without_buffering() {
    const GIB: u64 = 1 << 30;
    let up = Upstream::start();
    // `timeout` covers the response head, which comes after the whole upload: leave room.
    let s = Sluice::start(&format!("upstreams: {{ up: {{ targets: [{}], timeout: 5m }} }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n", up.url()));
    let baseline = s.rss_kib();
    let pid = s.pid();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let p = peak.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let sampler = std::thread::spawn(move || {
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            p.fetch_max(
                proc_status_kib(pid, "VmRSS:"),
                std::sync::atomic::Ordering::Relaxed,
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    });

    // Download: count frames as they arrive.
    let c = client();
    let res = c
        .get(s.url(&format!("/download?bytes={GIB}")).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let mut n = 0u64;
    while let Some(f) = body.frame().await {
        n += f.unwrap().data_ref().map_or(0, |d| d.len() as u64);
    }
    assert_eq!(n, GIB);

    // Upload: a streamed request body of 1 GiB, counted by the upstream.
    let chunk = bytes::Bytes::from(vec![7u8; 256 * 1024]);
    let chunks =
        futures_util::stream::iter((0..GIB / chunk.len() as u64).map(move |_| {
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk.clone()))
        }));
    let body = http_body_util::StreamBody::new(chunks);
    let uc: hyper_util::client::legacy::Client<_, _> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = http::Request::post(s.url("/upload")).body(body).unwrap();
    let res = uc
        .request(req)
        .await
        .unwrap_or_else(|e| panic!("upload failed: {e:?}\n{}", s.log()));
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(String::from_utf8_lossy(&got), GIB.to_string());

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let growth_mib = (peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(baseline))
        / 1024;
    assert!(
        growth_mib < 64,
        "RSS grew by {growth_mib} MiB while streaming 2 GiB"
    );
}

/// Messages on either side of the gather limit (`src/net.rs`: small head-and-body writes go
/// out as one `send`, larger ones stay vectored) arrive intact both ways: a request head that
/// echoes back in the answer's body, and a request body counted by the upstream.
#[tokio::test]
async fn messages_around_the_gather_limit_arrive_intact() {
    use sluice::net::GATHER_MAX;
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up));
    let c = client();
    let sizes = [
        0,
        1,
        GATHER_MAX / 2 - 200,
        GATHER_MAX / 2,
        GATHER_MAX - 500,
        GATHER_MAX - 250,
        GATHER_MAX,
        GATHER_MAX + 1,
        3 * GATHER_MAX + 7,
    ];
    for n in sizes {
        let pad: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let r = send(&c, Method::POST, &s.url("/echo"), &[("x-pad", &pad)], &body).await;
        assert_eq!(r.status, 200, "n = {n}: {}", r.text());
        let doc = r.json();
        assert_eq!(doc["body_len"], n, "n = {n}");
        let echoed = doc["headers"]["x-pad"][0].as_str().unwrap_or_default();
        assert!(echoed == pad, "n = {n}: the echoed head differs");
        assert_eq!(
            r.header("content-length"),
            Some(r.body.len().to_string().as_str()),
            "n = {n}"
        );
    }
}

/// SPEC §1: `sluice` with no subcommand serves as `sluice run`, and `--log-format human`
/// writes human lines where JSON would go by default (stderr is not a terminal here). SIGINT
/// drains like SIGTERM, and past `drain_timeout` a request still running is cut: logged as
/// 499 (the client never got an answer), and the process exits 0.
#[tokio::test]
async fn bare_sluice_serves_and_sigint_drains_to_the_deadline() {
    let up = Upstream::start();
    let yaml = format!(
        "drain_timeout: 1s\nupstreams: {{ up: {{ targets: [{}], timeout: 30s }} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n",
        up.url()
    );
    let mut s = Sluice::start_args(&yaml, &["--log-format", "human"]);
    let r = get(&client(), &s.url("/x"), &[]).await;
    assert_eq!(r.status, 200);
    let url = s.url("/slow?ms=10000");
    let inflight = tokio::spawn(async move {
        let c = client();
        let req = c.get(url.parse().unwrap());
        tokio::time::timeout(Duration::from_secs(20), req).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (st, s) = tokio::task::spawn_blocking(move || (s.stop_with("INT"), s))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(took < Duration::from_secs(8), "{took:?}: {}", s.log());
    let cut = inflight.await.unwrap().expect("not left hanging");
    assert!(cut.is_err(), "the slow request was answered: {cut:?}");
    let log = s.log();
    let access: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sluice::access"))
        .collect();
    assert_eq!(access.len(), 2, "{log}");
    assert!(
        access.iter().all(|l| !l.trim_start().starts_with('{')),
        "human lines, not JSON: {access:?}"
    );
    assert!(
        access[1].contains("499") && access[1].contains("/slow"),
        "{access:?}"
    );
    assert!(log.contains("drain"), "{log}");
}
