//! The edge beyond framing, over raw sockets through the real binary: a request the gateway
//! cannot name one host or method for (400, so a limited route cannot be missed by spelling
//! them differently), an upgrade it does not pass (`h2c`), a connection that never sends a
//! request (closed after `client_header_timeout`), heads hyper refuses itself (logged and
//! counted), and upstream answers the client could not read as the upstream sent them (502).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::raw::{exchange, Exchange};
use support::*;

/// How long a silent connection is taken to be left open (kept alive) by the gateway.
const QUIET: Duration = Duration::from_millis(1500);

/// A login route limited to one request, before a catch-all to the same upstream: the
/// shape of SPEC §2's example, where missing the first route means reaching the handler it
/// guards without a limit.
fn login_gateway(up: &Upstream) -> Sluice {
    Sluice::start(&format!(
        "client_header_timeout: 1s
upstreams:
  up: {{ targets: [{}], timeout: 5s }}
routes:
  - name: login
    match: {{ path: /auth/login, methods: [POST], host: api.example.com }}
    upstream: up
    limits: [ {{ name: k, by: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    ))
}

fn send(s: &Sluice, req: &str) -> Exchange {
    exchange(s.addr, req.as_bytes(), QUIET)
}

fn status(ex: &Exchange) -> u16 {
    match ex.statuses().as_slice() {
        [one] => *one,
        other => panic!("expected one answer, got {other:?}:\n{}", ex.text()),
    }
}

/// `sluice_requests_total{route, outcome}` as the admin listener reports it now.
fn requests_total(s: &Sluice, route: &str, outcome: &str) -> f64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let text = rt
        .block_on(get(&client(), &s.admin_url("/metrics"), &[]))
        .text();
    let labels = [("route", route), ("outcome", outcome)];
    metric(&text, "sluice_requests_total", &labels)
}

/// The upstream's hit count once anything the gateway might still be sending has landed.
fn settled_hits(up: &Upstream) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    up.hits()
}

const LOGIN: &str = "Content-Length: 0\r\nConnection: close\r\n\r\n";

#[test]
fn a_limited_route_is_not_missed_by_another_spelling_of_its_host_or_method() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let first = send(
        &s,
        &format!("POST /auth/login HTTP/1.1\r\nHost: api.example.com\r\n{LOGIN}"),
    );
    assert_eq!(status(&first), 200, "{}", first.text());
    // The same name, fully qualified (as nginx's `server_name` matching has it) and with a
    // port: the same route, already spent.
    for host in ["api.example.com", "api.example.com.", "API.example.com.:80"] {
        let ex = send(
            &s,
            &format!("POST /auth/login HTTP/1.1\r\nHost: {host}\r\n{LOGIN}"),
        );
        assert_eq!(status(&ex), 429, "{host}: {}", ex.text());
    }
    // Refused outright, where they would have reached the catch-all: a method frameworks
    // upper-case (RFC 9110 §9.1: methods are case-sensitive), no `Host` on HTTP/1.1
    // (RFC 9112 §3.2), userinfo in the target (RFC 9110 §4.2.4), an empty label.
    for req in [
        format!("post /auth/login HTTP/1.1\r\nHost: api.example.com\r\n{LOGIN}"),
        format!("Post /auth/login HTTP/1.1\r\nHost: api.example.com\r\n{LOGIN}"),
        format!("POST /auth/login HTTP/1.1\r\n{LOGIN}"),
        format!(
            "POST http://u@api.example.com/auth/login HTTP/1.1\r\nHost: api.example.com\r\n{LOGIN}"
        ),
        format!("POST /auth/login HTTP/1.1\r\nHost: u@api.example.com\r\n{LOGIN}"),
        // An empty label: no name at all (nginx: 400), not `api.example.com.`.
        format!("POST /auth/login HTTP/1.1\r\nHost: api.example.com..\r\n{LOGIN}"),
        format!("POST http://api.example.com../auth/login HTTP/1.1\r\nHost: x\r\n{LOGIN}"),
    ] {
        let ex = send(&s, &req);
        assert_eq!(status(&ex), 400, "{req:?}: {}", ex.text());
        let doc = ex.one().json();
        assert_eq!(doc["status"], 400, "problem+json: {doc}");
    }
    assert_eq!(
        settled_hits(&up),
        1,
        "only the first login reached the upstream"
    );
}

/// An API key given twice (two fields, two query parameters, or the header and the query
/// disagreeing) is 400: the gateway would count one value while the upstream may read the
/// other (PHP and Rails take the last parameter, Node joins repeated fields), so a fresh
/// value where the gateway looks would buy unlimited use of the real key.
#[test]
fn an_api_key_given_twice_is_refused() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits: [ {{ name: k, by: api_key, on_missing: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]\n",
        up.url()
    ));
    let close = "Connection: close\r\n\r\n";
    let first = send(
        &s,
        &format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Api-Key: REAL\r\n{close}"),
    );
    assert_eq!(status(&first), 200, "{}", first.text());
    for req in [
        format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Api-Key: fresh\r\nX-Api-Key: REAL\r\n{close}"),
        format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Api-Key: REAL\r\nx-api-key: REAL\r\n{close}"),
        format!("GET /x?api_key=fresh&api_key=REAL HTTP/1.1\r\nHost: x\r\n{close}"),
        format!("GET /x?api_key=fresh HTTP/1.1\r\nHost: x\r\nX-Api-Key: REAL\r\n{close}"),
        format!("GET /x?api_key=REAL HTTP/1.1\r\nHost: x\r\nX-Api-Key: fresh\r\n{close}"),
    ] {
        let ex = send(&s, &req);
        assert_eq!(status(&ex), 400, "{req:?}: {}", ex.text());
        let doc = ex.one().json();
        assert!(
            doc["detail"].as_str().unwrap_or_default().contains("api"),
            "{req:?}: {doc}"
        );
    }
    // The same key in both places is one key: spent.
    let ex = send(
        &s,
        &format!("GET /x?api_key=REAL HTTP/1.1\r\nHost: x\r\nX-Api-Key: REAL\r\n{close}"),
    );
    assert_eq!(status(&ex), 429, "{}", ex.text());
    assert_eq!(
        settled_hits(&up),
        1,
        "only the first request reached the upstream"
    );
    assert_eq!(requests_total(&s, "api", "rejected_identity"), 5.0);
}

/// A key in the query is read as the upstream reads it, and held to a header value's rules.
/// A control byte cannot spell the `on_missing: ip` namespace of another client's address
/// (`%01ip%00<address>` used up that address's keyless quota); `K%20` is `K` (an upstream
/// trims it); and `api.key`, `api+key`, `api[key` (PHP's `api_key`), a `;`-separated
/// `api_key` (Rack 2's), `api_key[]` (PHP's and Rack's list) and `API_KEY` (ASP.NET Core's
/// names have no case) are the key, so none of them hides the real key behind a fresh one.
#[test]
fn a_query_key_is_read_as_the_upstream_reads_it() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "client_ip: {{ trusted_proxies: [127.0.0.1/32] }}\nupstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits: [ {{ name: k, by: api_key, on_missing: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]\n",
        up.url()
    ));
    let get = |target: &str, extra: &str| {
        let ex = send(
            &s,
            &format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"),
        );
        (status(&ex), ex.text())
    };
    let attacker = "X-Forwarded-For: 198.51.100.9\r\n";
    let victim = "X-Forwarded-For: 203.0.113.7\r\n";
    // The attacker's crafted key is no key: it is counted on its own address.
    let (st, text) = get("/x?api_key=%01ip%00203.0.113.7", attacker);
    assert_eq!(st, 200, "{text}");
    let (st, text) = get("/x", victim);
    assert_eq!(
        st, 200,
        "the victim's keyless quota was used up by another client: {text}"
    );
    let (st, text) = get("/x", attacker);
    assert_eq!(
        st, 429,
        "the crafted key was not counted as the attacker's own: {text}"
    );

    // The real key, spent once; then every other spelling of it is that key.
    assert_eq!(get("/x", "X-Api-Key: REAL\r\n").0, 200);
    for target in [
        "/x?api_key=REAL%20",
        "/x?api.key=REAL",
        "/x?api+key=REAL",
        "/x?api[key=REAL",
        "/x?a=1;api_key=REAL",
        "/x?api_key[]=REAL",
        "/x?api_key%5B0%5D=REAL",
        "/x?API_KEY=REAL",
    ] {
        let (st, text) = get(target, "");
        assert_eq!(st, 429, "{target}: {text}");
    }
    for target in [
        "/x?api_key=fresh1&api.key=REAL",
        "/x?api_key=fresh2;api_key=REAL",
        "/x?api_key=fresh3&api[key=REAL",
        "/x?api_key=fresh4&api_key[]=REAL",
        "/x?api_key=fresh5&Api_Key=REAL",
    ] {
        let (st, text) = get(target, "");
        assert_eq!(st, 400, "{target}: {text}");
    }
    assert_eq!(settled_hits(&up), 3, "what reached the upstream");
}

/// `methods: [GET]` matches HEAD too: frameworks answer HEAD with the GET handler, so a HEAD
/// that fell through to the catch-all would reach what the limit guards, unlimited.
#[test]
fn head_is_limited_with_get() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: search\n    match: {{ path: /search, methods: [GET] }}\n    upstream: up\n    limits: [ {{ name: k, by: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n",
        up.url()
    ));
    // A HEAD answer's head announces a body that does not follow: read its status line.
    let head = || {
        send(
            &s,
            "HEAD /search HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .text()
    };
    let first = head();
    assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
    let ex = send(
        &s,
        "GET /search HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&ex), 429, "{}", ex.text());
    let again = head();
    assert!(again.starts_with("HTTP/1.1 429 "), "{again}");
    assert!(again.contains("\"search/k\""), "{again}");
    // Other methods still go by the list: POST is the catch-all's.
    let post = "POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&send(&s, post)), 200);
}

/// RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
/// HTTP/1.1 request message that lacks a Host header field and to any request message that
/// contains more than one Host header field line or a Host header field with an invalid field
/// value." Otherwise the gateway routes on one host while the upstream may pick the other.
#[test]
fn a_request_needs_exactly_one_valid_host() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    for head in [
        "GET /two HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n",
        "GET /two HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n",
        "GET /bad HTTP/1.1\r\nHost: a.example/../x?y\r\n",
        "GET /bad HTTP/1.1\r\nHost: a.example:8o\r\n",
        "GET /empty HTTP/1.1\r\nHost:\r\n",
        "GET /none HTTP/1.1\r\n",
        "GET /ten HTTP/1.0\r\nHost: a\r\nHost: b\r\n",
    ] {
        let ex = send(&s, &format!("{head}Connection: close\r\n\r\n"));
        assert_eq!(status(&ex), 400, "{head:?}: {}", ex.text());
    }
    assert_eq!(settled_hits(&up), 0);
    // The one a valid request names is what the upstream gets.
    let ex = send(
        &s,
        "GET /one HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&ex), 200, "{}", ex.text());
    assert_eq!(ex.one().json()["headers"]["host"][0], "[::1]:8080");
}

/// Only WebSocket upgrades pass. After an `h2c` upgrade the client's requests would travel
/// inside the tunnel, past every route and limit ("h2c smuggling"): the request goes on as a
/// plain one, without its `Upgrade` and the fields its `Connection` names.
#[test]
fn an_h2c_upgrade_is_not_passed_through() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    for upgrade in ["h2c", "websocket, h2c", "TLS/1.2"] {
        let ex = send(
            &s,
            &format!(
                "GET /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                 Upgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            ),
        );
        assert_eq!(ex.statuses(), vec![200], "{upgrade}: {}", ex.text());
        let echo = ex.one().json();
        let headers = &echo["headers"];
        for gone in ["upgrade", "http2-settings", "connection"] {
            assert!(
                headers[gone].is_null(),
                "{upgrade}: `{gone}` reached the upstream: {echo}"
            );
        }
    }
}

/// Fields named in `Connection` are for that one connection (RFC 9110 §7.6.1): the gateway
/// removes them, so they must not pick the route, the identity or the cost either. Otherwise a
/// fresh `X-Api-Key` listed in `Connection` is counted under a key of its own each time while
/// the upstream, which never sees it, serves an anonymous request past the per-IP fallback.
#[test]
fn fields_named_by_connection_neither_route_nor_identify() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:
  up: {{ targets: [{}], timeout: 5s }}
routes:
  - name: keyed
    match: {{ path_prefix: /api }}
    upstream: up
    limits: [ {{ name: k, by: api_key, on_missing: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]
  - name: users
    match: {{ path_prefix: /u }}
    upstream: up
    limits: [ {{ name: u, by: user, on_missing: reject, algorithm: token_bucket, rate: 100/1h }} ]
  - name: prod
    match: {{ path_prefix: /env, headers: {{ X-Env: prod }} }}
    upstream: up
    limits: [ {{ name: p, by: route, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    ));
    // The anonymous client's one request an hour, by its address.
    let first = send(&s, "GET /api/x HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status(&first), 200, "{}", first.text());
    for (i, connection) in ["X-Api-Key", "close, x-api-key", "keep-alive,X-API-KEY"]
        .iter()
        .enumerate()
    {
        let ex = send(
            &s,
            &format!(
                "GET /api/x HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\nX-Api-Key: fresh-{i}\r\n\r\n"
            ),
        );
        assert_eq!(status(&ex), 429, "{connection}: {}", ex.text());
    }

    let ex = send(
        &s,
        "GET /u/x HTTP/1.1\r\nHost: x\r\nConnection: X-User-Id\r\nX-User-Id: alice\r\n\r\n",
    );
    assert_eq!(status(&ex), 401, "{}", ex.text());

    // Not the `prod` route (limited to one an hour) but the catch-all, twice.
    for _ in 0..2 {
        let ex = send(
            &s,
            "GET /env/x HTTP/1.1\r\nHost: x\r\nConnection: X-Env\r\nX-Env: prod\r\n\r\n",
        );
        assert_eq!(status(&ex), 200, "{}", ex.text());
        let echo = ex.one().json();
        assert!(echo["headers"]["x-env"].is_null(), "{echo}");
    }
    // `prod` as an item of a list (RFC 9110 §5.3: the same field as two lines) is the `prod`
    // route, limited: its one request, then 429s, however the list is spelled.
    let lists = ["X-Env: staging, prod", "X-Env: prod,x", "X-Env: a ,\tprod"];
    let got: Vec<u16> = lists
        .iter()
        .map(|f| {
            status(&send(
                &s,
                &format!("GET /env/x HTTP/1.1\r\nHost: x\r\n{f}\r\n\r\n"),
            ))
        })
        .collect();
    assert_eq!(got, [200, 429, 429]);
}

/// A field whose name holds `_` is not forwarded (nginx's `underscores_in_headers off`):
/// CGI-style upstreams read `X_Api_Key` and `X-Api-Key` as one name, so the real key could
/// ride beside a made-up one the gateway counts. The gateway itself still reads such a field.
#[test]
fn fields_with_an_underscore_are_not_forwarded() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: t\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits: [ {{ name: k, by: \"header:X_Tenant\", on_missing: reject, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]\n",
        up.url()
    ));
    let req = "GET /x HTTP/1.1\r\nHost: x\r\nX_Tenant: a\r\nX-Api-Key: fresh\r\nX_Api_Key: REAL\r\nConnection: close\r\n\r\n";
    let ex = send(&s, req);
    assert_eq!(status(&ex), 200, "{}", ex.text());
    let headers = &ex.one().json()["headers"];
    assert_eq!(
        headers["x-api-key"],
        serde_json::json!(["fresh"]),
        "{headers}"
    );
    for gone in ["x_api_key", "x_tenant"] {
        assert!(
            headers[gone].is_null(),
            "`{gone}` reached the upstream: {headers}"
        );
    }
    // The limit keyed by `X_Tenant` saw it: tenant `a` is spent.
    let ex = send(&s, req);
    assert_eq!(status(&ex), 429, "{}", ex.text());
}

/// A connection that connects and sends nothing, or only part of the HTTP/2 preface, is
/// closed `client_header_timeout` after it opened (hyper's own header timeout only starts once
/// HTTP/1 has been told from HTTP/2).
#[test]
fn a_connection_that_never_begins_a_request_is_closed() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let sent: [&[u8]; 4] = [
        b"",
        b"P",
        b"PRI * HTTP/2.0\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r",
    ];
    let conns: Vec<TcpStream> = sent
        .iter()
        .map(|bytes| {
            let mut c = TcpStream::connect(s.addr).unwrap();
            c.write_all(bytes).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            c
        })
        .collect();
    for (mut c, bytes) in conns.into_iter().zip(sent) {
        let mut buf = [0; 64];
        let started = Instant::now();
        match c.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!(
                "{bytes:?}: answered {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
            Err(e) => panic!(
                "{bytes:?}: still open after {:?} (client_header_timeout is 1s): {e}",
                started.elapsed()
            ),
        }
    }
}

/// hyper answers a head it cannot parse itself (400, or 431 past 64 KiB), before there is a
/// request for the gateway to handle; each is still one access-log event and one
/// `rejected_request` on the `_none` route.
#[test]
fn heads_hyper_refuses_are_logged_and_counted() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let folded = send(&s, "GET /fold HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n");
    assert_eq!(status(&folded), 400, "{}", folded.text());
    let big = format!(
        "GET /big HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_eq!(status(&send(&s, &big)), 431);
    s.wait_log(&["\"status\":400", "\"status\":431"]);
    let log = s.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sluice::access") && l.contains("rejected_request"))
        .collect();
    assert_eq!(refused.len(), 2, "{log}");
    assert!(
        refused.iter().all(|l| l.contains("\"route\":\"_none\"")),
        "{refused:?}"
    );
    assert_eq!(requests_total(&s, "_none", "rejected_request"), 2.0);
}

/// An upstream that answers every request with `answer` and closes.
fn raw_upstream(answer: &'static str) -> SocketAddr {
    raw_upstream_holding(answer, false).0
}

type Held = std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>;

/// An upstream that reads each request's head and answers `answer`; then closes, or with
/// `hold` keeps the connection open and reads no more (its sockets are in the list).
fn raw_upstream_holding(answer: &'static str, hold: bool) -> (SocketAddr, Held) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Held::default();
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut byte = [0; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = conn.write_all(answer.as_bytes());
            if hold {
                keep.lock().unwrap().push(conn);
            }
        }
    });
    (addr, held)
}

/// Answers the client could not read as the upstream sent them are 502 (as nginx answers):
/// `chunked` beside a `Content-Length` (forwarded, the length would cut the body short), a
/// transfer coding other than `chunked` (its label is hop-by-hop and removed, so the client
/// would take coded bytes for the body), a 101 to a request that asked no upgrade. And an
/// HTTP/1.0 answer goes to an HTTP/1.1 client as HTTP/1.1 (RFC 9110 §2.5).
#[test]
fn answers_the_client_could_not_read_as_sent_are_502() {
    let cases = [
        (
            "cl-te",
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            502,
        ),
        (
            "gzip",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x08\x00g",
            502,
        ),
        (
            "gzip-chunked",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n4\r\n\x1f\x08\x00g\r\n0\r\n\r\n",
            502,
        ),
        (
            "unasked-101",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            502,
        ),
        ("ten", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200),
        // RFC 9110 §8.6: a list of one length repeated may be taken as that length, and a
        // proxy then sends the one value; differing lengths frame nothing.
        ("cl-list", "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", 200),
        ("cl-list-tight", "HTTP/1.1 200 OK\r\nContent-Length: 2,2\r\n\r\nok", 200),
        (
            "cl-twice",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nok",
            200,
        ),
        ("cl-differ", "HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok", 502),
        // Heads the HTTP/1 parser cannot read: the upstream answered, wrongly.
        ("status-099", "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok", 502),
        ("nul-field", "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", 502),
        ("cl-sign", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", 502),
        ("space-colon", "HTTP/1.1 200 OK\r\nX-A : b\r\nContent-Length: 2\r\n\r\nok", 502),
    ];
    let mut yaml = String::from("upstreams:\n");
    for (name, answer, _) in &cases {
        yaml += &format!(
            "  {name}: {{ targets: [\"http://{}\"], timeout: 5s }}\n",
            raw_upstream(answer)
        );
    }
    yaml += "routes:\n";
    for (name, _, _) in &cases {
        yaml += &format!("  - {{ name: {name}, match: {{ path: /{name} }}, upstream: {name} }}\n");
    }
    let s = Sluice::start(&yaml);
    for (name, _, want) in cases {
        let ex = send(
            &s,
            &format!("GET /{name} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status(&ex), want, "{name}: {}", ex.text());
        let text = ex.text();
        assert!(text.starts_with("HTTP/1.1 "), "{name}: {text}");
        if want == 502 {
            let problem = ex.one().json();
            assert_eq!(problem["status"], 502, "{name}: problem+json: {text}");
            // An answer came: refused, not "unreachable".
            assert!(
                problem["detail"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("upstream answer refused")),
                "{name}: {text}"
            );
        } else {
            assert!(text.ends_with("\r\n\r\nok"), "{name}: {text}");
            let lengths: Vec<&str> = text
                .lines()
                .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
                .collect();
            assert_eq!(lengths.len(), 1, "{name}: {text}");
            assert_eq!(lengths[0][15..].trim(), "2", "{name}: {text}");
        }
    }
}

/// An upstream that answers at once without reading the request's body and keeps its socket
/// open (a 413 or a 401 from a handler that ignores the body): the client gets the answer and
/// then its connection is closed. Before, the upstream connection went on writing the body
/// into a full window forever, and the client's upload stalled with it, its connection held.
#[test]
fn an_answer_before_the_body_was_read_frees_the_client() {
    let (addr, held) = raw_upstream_holding(
        "HTTP/1.1 413 Content Too Large\r\nContent-Length: 2\r\n\r\nno",
        true,
    );
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [\"http://{addr}\"] }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n"
    ));
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let total: usize = 256 << 20;
    c.write_all(
        format!("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'a'; 64 << 10];
        let mut sent = 0;
        while sent < total {
            match w.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    });
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = c.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    // Closed (a reset when the gateway leaves unread upload bytes behind), not timed out.
    assert!(
        read.as_ref().map_or_else(
            |e| e.kind() == std::io::ErrorKind::ConnectionReset,
            |_| true
        ),
        "the connection was held open after the answer ({:?}): {read:?} {text:?}",
        started.elapsed()
    );
    assert!(text.starts_with("HTTP/1.1 413 "), "{text:?}");
    assert!(text.ends_with("\r\n\r\nno"), "{text:?}");
    let sent = writer.join().unwrap();
    assert!(sent < total, "the whole upload went through ({sent} bytes)");
    assert_eq!(held.lock().unwrap().len(), 1, "one upstream connection");
}

/// A client that leaves before its answer: hyper drops the request's future, and the request
/// is still one access-log event (status 499, nginx's "client closed request") and one count,
/// since the upstream ran it.
#[test]
fn a_request_whose_client_left_is_still_logged_as_499() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(b"GET /slow?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    s.wait_log(&["\"status\":499"]);
    let log = s.log();
    let line = log.lines().find(|l| l.contains("\"status\":499")).unwrap();
    assert!(
        line.contains("\"route\":\"all\"") && line.contains("\"path\":\"/slow\""),
        "{line}"
    );
    assert_eq!(up.hits(), 1, "the upstream ran it");
    assert_eq!(requests_total(&s, "all", "forwarded"), 1.0);
}

/// A failed upstream's cause (its address, the socket or TLS error) goes to the log, not to
/// the client: the 502 says what kind of failure it was, as nginx's and Envoy's pages do.
#[test]
fn a_502_tells_the_client_the_kind_and_the_log_the_cause() {
    let dead = format!("127.0.0.1:{}", free_port());
    let s = Sluice::start(&format!(
        "upstreams:\n  gone: {{ targets: [\"http://{dead}\"], timeout: 2s }}\nroutes:\n  - {{ name: gone, match: {{ path_prefix: / }}, upstream: gone }}\n"
    ));
    let ex = send(
        &s,
        "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&ex), 502, "{}", ex.text());
    let doc = ex.one().json();
    assert_eq!(doc["detail"], "upstream unreachable", "{doc}");
    assert!(!ex.text().contains(&dead), "{}", ex.text());
    let log = s.wait_log(&["upstream failed", "\"status\":502"]);
    let line = log.lines().find(|l| l.contains("upstream failed")).unwrap();
    assert!(
        line.contains(&dead) && line.contains("\"route\":\"gone\""),
        "{line}"
    );
    // SPEC §1: the access-log event names the upstream it tried, answered or not.
    access_line(&log, 502, "gone", "upstream_error", &dead);
}

/// The access-log event of the one request answered `status` (SPEC §1: route, method, path,
/// status, decision, upstream, duration, request id), checked field by field.
fn access_line(log: &str, status: u16, route: &str, decision: &str, upstream: &str) {
    let line = log
        .lines()
        .find(|l| l.contains("sluice::access") && l.contains(&format!("\"status\":{status}")))
        .unwrap_or_else(|| panic!("no access line with status {status}:\n{log}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let f = v.get("fields").unwrap_or(&v);
    assert_eq!(f["route"], route, "{line}");
    assert_eq!(f["method"], "GET", "{line}");
    assert_eq!(f["path"], "/x", "{line}");
    assert_eq!(f["decision"], decision, "{line}");
    assert_eq!(f["upstream"], upstream, "{line}");
    assert!(f["duration_us"].is_u64(), "{line}");
    let rid = f["request_id"].as_str().unwrap_or_default();
    assert!(rid.len() >= 8 && rid != "-", "{line}");
}

/// A target that accepts no connection within `connect_timeout` (a listener whose accept
/// queue is full, so the kernel drops the SYN) answers 504, once the connect timeout has
/// passed and well before the response timeout; the access log names the target.
#[test]
fn a_connect_timeout_is_504_and_the_access_log_names_the_target() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _g = rt.enter();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = sock.listen(1).unwrap();
    let addr = full.local_addr().unwrap();
    // Fill the accept queue (never accepted): later SYNs get no answer.
    let mut held = Vec::new();
    while let Ok(c) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        held.push(c);
        assert!(held.len() < 64, "the accept queue never filled");
    }
    let target = addr.to_string();
    let s = Sluice::start(&format!(
        "upstreams:\n  full: {{ targets: [\"http://{target}\"], connect_timeout: 500ms, timeout: 20s }}\nroutes:\n  - {{ name: full, match: {{ path_prefix: / }}, upstream: full }}\n"
    ));
    let started = Instant::now();
    let ex = exchange(
        s.addr,
        b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(15),
    );
    let took = started.elapsed();
    assert_eq!(status(&ex), 504, "{}", ex.text());
    assert_eq!(ex.one().json()["status"], 504);
    assert!(
        took >= Duration::from_millis(450),
        "before the connect timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "waited for the response timeout: {took:?}"
    );
    let log = s.wait_log(&["timed out", "\"status\":504"]);
    assert!(
        log.contains(&format!("connect to {target} timed out")),
        "{log}"
    );
    access_line(&log, 504, "full", "upstream_error", &target);
    drop(held);
}

/// An HTTP/2 connection with no request open is closed after `client_header_timeout` (hyper's
/// HTTP/2 server has no idle timer): one that sent the preface and its SETTINGS, then nothing.
#[test]
fn an_idle_http2_connection_is_closed() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    let mut buf = [0; 256];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue, // the server's SETTINGS and its acknowledgement of ours
            Err(e) => panic!("still open after {:?}: {e}", started.elapsed()),
        }
    }
}

/// … but not one whose request is still being answered, however long the upstream takes.
#[test]
fn a_slow_http2_answer_is_not_idle() {
    let up = Upstream::start();
    let s = login_gateway(&up);
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
        ])
        .arg(s.url("/slow?ms=2500"))
        .output()
        .expect("curl (apt-get install -y curl)");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 2", "{out:?}");
}

/// A client that stops sending its body holds the upstream connection waiting for it: when the
/// upstream `timeout` passes, that is the client's doing. It is answered 408 with the
/// connection closed (as nginx's `client_body_timeout` answers), counted `rejected_request`,
/// neither logged nor counted as an upstream failure, and a limit charging 5xx answers is not
/// charged. It was a 504 "upstream timed out", charged as one.
#[test]
fn a_body_that_stops_arriving_is_408_not_an_upstream_504() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:
  up: {{ targets: [{}], timeout: 1s }}
routes:
  - name: r
    match: {{ path_prefix: / }}
    upstream: up
    limits: [ {{ name: fails, by: ip, algorithm: fixed_window, rate: 100/1h, count_when: {{ status: [5xx] }} }} ]
",
        up.url()
    ));
    let body = "x".repeat(100);
    let ex = send(
        &s,
        &format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n{body}"),
    );
    assert_eq!(status(&ex), 408, "{}", ex.text());
    let res = ex.one();
    assert_eq!(res.header("connection"), Some("close"), "{}", ex.text());
    assert!(ex.closed, "the rest of the body would be read as a request");
    assert_eq!(res.json()["status"], 408);
    assert_eq!(requests_total(&s, "r", "rejected_request"), 1.0);
    assert_eq!(requests_total(&s, "r", "upstream_error"), 0.0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let peek = rt
        .block_on(get(
            &client(),
            &s.admin_url("/admin/limits/r/fails?key=127.0.0.1"),
            &[],
        ))
        .json();
    assert_eq!(peek["remaining"], 100, "charged as a 5xx: {peek}");
    let log = s.wait_log(&["\"status\":408"]);
    assert!(!log.contains("upstream failed"), "{log}");
}

/// The upstream `timeout` counts from the last body bytes the client sent: an upload that
/// keeps moving is not cut however long it takes (here 2 s against a 1 s timeout), as Envoy's
/// route timeout starts once the request is complete; and an upstream that has the whole body
/// and does not answer within `timeout` of it is still the upstream's 504.
#[test]
fn a_steady_upload_outlasts_the_timeout_and_a_silent_upstream_is_504() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}], timeout: 1s }}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n",
        up.url()
    ));
    let mut conn = TcpStream::connect(s.addr).unwrap();
    conn.write_all(
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 500\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(400));
        // A gateway that gave up has closed: what it answered is read below.
        let _ = conn.write_all(&[b'x'; 100]);
    }
    let ex = support::raw::read_all(&mut conn, QUIET);
    assert_eq!(status(&ex), 200, "{}", ex.text());
    assert_eq!(ex.one().text(), "500");
    let ex = send(
        &s,
        "POST /slow?ms=3000 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!(status(&ex), 504, "{}", ex.text());
    assert_eq!(requests_total(&s, "r", "upstream_error"), 1.0);
}

/// RFC 9110 §8.6: a 204 carries no Content-Length. An upstream's is dropped, so an HTTP/2
/// client is not promised DATA that never comes (curl reset the stream: PROTOCOL_ERROR), as
/// an HTTP/1.1 client was already spared.
#[test]
fn a_204_goes_out_without_its_content_length() {
    let addr = raw_upstream("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-Up: yes\r\n\r\n");
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [\"http://{addr}\"] }}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n"
    ));
    for proto in ["--http2-prior-knowledge", "--http1.1"] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-D", "-", "-o", "/dev/null", proto])
            .arg(s.url("/nothing"))
            .output()
            .expect("curl (apt-get install -y curl)");
        let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        assert!(out.status.success(), "{proto}: {out:?}");
        assert!(head.contains(" 204"), "{proto}: {head}");
        assert!(head.contains("x-up: yes"), "{proto}: {head}");
        assert!(!head.contains("content-length"), "{proto}: {head}");
    }
}

/// An upstream that answers its head with the body's first bytes, then writes `rest` one byte
/// every `every` (none at all when `rest` is empty), holding the connection open after.
fn dripping_upstream(head: &'static str, rest: &'static [u8], every: Duration) -> SocketAddr {
    support::raw::upstream(move |conn| {
        let _ = conn.write_all(head.as_bytes());
        for b in rest {
            std::thread::sleep(every);
            let _ = conn.write_all(&[*b]);
        }
        // Held open, silent, until the gateway closes it.
        let _ = conn.read(&mut [0; 1]);
    })
}

/// An upstream that closes its connection mid-body: the client's answer is cut (closed, not
/// completed) and the log says so, as for a stall (nginx: "upstream prematurely closed
/// connection"); it logged nothing, a 200 with a `forwarded` decision.
#[test]
fn an_upstream_body_that_breaks_off_is_cut_and_logged() {
    let up = support::raw::upstream(|conn| {
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf");
    });
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [\"http://{up}\"] }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n"
    ));
    let ex = exchange(
        s.addr,
        b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(ex.closed, "{}", ex.text());
    assert!(ex.text().starts_with("HTTP/1.1 200"), "{}", ex.text());
    assert!(ex.text().ends_with("half"), "{}", ex.text());
    s.wait_log(&["upstream's answer body broke off: the answer is cut"]);
}

/// An upstream that stops mid-body is cut after `idle_timeout` without a byte (nginx's
/// `proxy_read_timeout`, HAProxy's `timeout server`), so a stuck handler cannot hold the
/// client, the connection and its concurrency slot forever; a body that keeps dripping
/// (a byte every 0.3 s against 1 s, 1.5 s in all) is never cut, nor is one resting longer
/// than the head's `timeout` (1.2 s against 1 s) while under `idle_timeout` (60 s by default).
#[test]
fn an_upstream_that_stops_mid_body_is_cut_after_its_idle_timeout() {
    let stuck = dripping_upstream(
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf",
        b"",
        Duration::ZERO,
    );
    let dripping = dripping_upstream(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        b"drops",
        Duration::from_millis(300),
    );
    let resting = dripping_upstream(
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
        b"ok",
        Duration::from_millis(1200),
    );
    let s = Sluice::start(&format!(
        "upstreams:
  stuck: {{ targets: [\"http://{stuck}\"], idle_timeout: 1s }}
  dripping: {{ targets: [\"http://{dripping}\"], idle_timeout: 1s }}
  resting: {{ targets: [\"http://{resting}\"], timeout: 1s }}
routes:
  - name: resting
    match: {{ path_prefix: /rest }}
    upstream: resting
  - name: stuck
    match: {{ path_prefix: /stuck }}
    upstream: stuck
    limits: [ {{ name: inflight, by: ip, algorithm: concurrency, max: 1 }} ]
  - name: dripping
    match: {{ path_prefix: /drip }}
    upstream: dripping
"
    ));
    // Quiet for 5 s: a gateway that waits on the body forever leaves the read timing out.
    let ex = exchange(
        s.addr,
        b"GET /stuck HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(ex.closed, "still waiting on the body: {}", ex.text());
    assert!(ex.text().starts_with("HTTP/1.1 200"), "{}", ex.text());
    assert!(ex.text().ends_with("half"), "{}", ex.text());
    s.wait_log(&["upstream stopped sending its answer's body"]);
    // The slot was given back when the body failed: the next request is admitted, and cut too.
    let ex = exchange(
        s.addr,
        b"GET /stuck HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(ex.text().starts_with("HTTP/1.1 200"), "{}", ex.text());
    assert!(ex.closed, "{}", ex.text());
    // Over HTTP/2 the stream is reset (curl: exit 92, or 18 for the short body); 28 would be
    // curl's own timeout, a body still waited on.
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "8",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
        ])
        .arg(s.url("/stuck"))
        .output()
        .expect("curl (apt-get install -y curl)");
    let code = out.status.code();
    assert!(
        !matches!(code, Some(0) | Some(28)),
        "{code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ex = send(
        &s,
        "GET /drip HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&ex), 200, "{}", ex.text());
    assert_eq!(ex.one().text(), "drops");
    let ex = exchange(
        s.addr,
        b"GET /rest HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert_eq!(status(&ex), 200, "{}", ex.text());
    assert_eq!(ex.one().text(), "ok");
}
