//! Request framing at the edge, over raw sockets through the real binary (SPEC §7):
//! requests the gateway cannot frame unambiguously are refused with 400 and the connection
//! closed; a head over 64 KiB answers 431; the upstream never sees two requests where the
//! gateway saw one, nor one it refused. And a panicking handler answers 500 without taking
//! the connection or the process down (in-process `server::serve` on a real socket).
//!
//! Every case asserts both what the client got and what the upstream saw (its `hits()`
//! counts request heads its HTTP parser completed; its echo reports path, headers, body
//! length).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Response};
use http_body_util::BodyExt;
use support::raw::{exchange, exchange_then_eof, Exchange};
use support::*;

/// How long a silent connection is taken to be left open (kept alive) by the gateway.
const QUIET: Duration = Duration::from_millis(1500);

fn gateway(up: &Upstream) -> Sluice {
    Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}], timeout: 5s, connect_timeout: 1s }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n",
        up.url()
    ))
}

/// The upstream's hit count once anything the gateway might still be sending has landed.
fn settled_hits(up: &Upstream) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    up.hits()
}

/// Refused at the edge: exactly one 400, the connection closed, the upstream saw nothing.
fn assert_refused(s: &Sluice, up: &Upstream, req: &[u8], status: u16, what: &str) {
    let ex = exchange(s.addr, req, QUIET);
    assert_eq!(
        ex.statuses(),
        vec![status],
        "{what}: expected one {status}; received:\n{}",
        ex.text()
    );
    assert!(
        ex.closed,
        "{what}: connection must close after {status}; received:\n{}",
        ex.text()
    );
    assert_eq!(
        settled_hits(up),
        0,
        "{what}: the upstream must not see a refused request"
    );
}

// ---------------------------------------------------------------------------------------
// Content-Length together with Transfer-Encoding: request smuggling.
// ---------------------------------------------------------------------------------------

/// Either refused (400, upstream untouched) or forwarded as exactly one request framed by
/// chunked, with the connection closed after the one answer so nothing behind the body is
/// ever parsed as a next request. hyper takes the second branch: it drops Content-Length
/// when Transfer-Encoding is present and turns keep-alive off (hyper
/// proto/h1/role.rs:275-314 and 359-361), so the handler never sees both.
fn assert_smuggling_blocked(ex: &Exchange, up: &Upstream, chunked_body_len: usize) {
    let hits = settled_hits(up);
    match ex.statuses().as_slice() {
        [400] => assert_eq!(hits, 0, "refused, yet the upstream saw {hits} request(s)"),
        [200] => {
            let echo = ex.one().json();
            assert_eq!(hits, 1, "the upstream saw {hits} requests; echo {echo}");
            assert_eq!(echo["path"], "/smug", "{echo}");
            assert_eq!(
                echo["body_len"], chunked_body_len,
                "the body is what chunked framing says: {echo}"
            );
            let cl = &echo["headers"]["content-length"];
            assert!(
                cl.is_null() || cl[0] == chunked_body_len.to_string().as_str(),
                "the client's Content-Length must not reach the upstream: {echo}"
            );
            assert!(
                ex.closed,
                "after a CL+TE request the connection must close; received:\n{}",
                ex.text()
            );
        }
        other => panic!(
            "expected one 400, or one 200 then close; got {other:?}:\n{}",
            ex.text()
        ),
    }
}

/// CL.TE: Content-Length (first) spans the smuggled request; chunked ends the body before it.
#[test]
fn cl_te_smuggling_is_never_two_requests() {
    let up = Upstream::start();
    let s = gateway(&up);
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let body = format!("0\r\n\r\n{smuggled}");
    let req = format!(
        "POST /smug HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{body}",
        body.len()
    );
    let ex = exchange(s.addr, req.as_bytes(), QUIET);
    assert_smuggling_blocked(&ex, &up, 0);
}

/// TE.CL: Transfer-Encoding first; a Content-Length of 4 would end the body after the chunk
/// size line and expose the chunk's content as a second request.
#[test]
fn te_cl_smuggling_is_never_two_requests() {
    let up = Upstream::start();
    let s = gateway(&up);
    let smuggled = "GPOST /smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\nx=1";
    let req = format!(
        "POST /smug HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n{:x}\r\n{smuggled}\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
        smuggled.len()
    );
    let ex = exchange(s.addr, req.as_bytes(), QUIET);
    assert_smuggling_blocked(&ex, &up, smuggled.len());
}

/// Obfuscated Transfer-Encoding next to a Content-Length: every variant a lenient parser
/// might read differently is refused outright.
#[test]
fn cl_with_obfuscated_te_is_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    for te in [
        "Transfer-Encoding: xchunked\r\n",
        "Transfer-Encoding : chunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "X-Pad: 1\r\n Transfer-Encoding: chunked\r\n",
    ] {
        let req =
            format!("POST /smug HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n{te}\r\n0\r\n\r\n");
        assert_refused(&s, &up, req.as_bytes(), 400, &format!("{te:?}"));
    }
}

// ---------------------------------------------------------------------------------------
// Content-Length values.
// ---------------------------------------------------------------------------------------

/// Differing values (on two lines or in one list) and values that are not a plain decimal
/// are invalid framing (RFC 9112 §6.3 item 5): 400 and close.
#[test]
fn differing_or_invalid_content_lengths_are_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    for cl in [
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: 5, 6\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: 0x5\r\n",
    ] {
        let req = format!("POST / HTTP/1.1\r\nHost: x\r\n{cl}\r\nhello!");
        assert_refused(&s, &up, req.as_bytes(), 400, &format!("{cl:?}"));
    }
}

/// Two `Content-Length` lines with the same value are one length (RFC 9110 §8.6 allows
/// accepting them): hyper keeps the first line and drops the duplicate
/// (proto/h1/role.rs:302-311), so the upstream sees a single `Content-Length: 5`.
#[test]
fn equal_content_lengths_are_one_length() {
    let up = Upstream::start();
    let s = gateway(&up);
    let ex = exchange(
        s.addr,
        b"POST /dup HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        QUIET,
    );
    let r = ex.one();
    assert_eq!(r.status, 200, "{}", ex.text());
    let echo = r.json();
    assert_eq!(echo["body_len"], 5, "{echo}");
    assert_eq!(echo["headers"]["content-length"], serde_json::json!(["5"]));
    assert_eq!(settled_hits(&up), 1);

    // The same value repeated in one list: RFC 9110 §8.6 lets a recipient reject it or
    // replace it with the single value, but not forward it as is. hyper rejects it (its
    // server-side parse takes the whole field value as digits: headers.rs `from_digits`).
    let ex = exchange(
        s.addr,
        b"POST /dup HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nhello",
        QUIET,
    );
    match ex.statuses().as_slice() {
        [400] => assert_eq!(settled_hits(&up), 1, "refused, not forwarded"),
        [200] => assert_eq!(
            ex.one().json()["headers"]["content-length"],
            serde_json::json!(["5"]),
            "a list must be replaced by the single value"
        ),
        other => panic!("{other:?}: {}", ex.text()),
    }
}

/// A GET or HEAD with a chunked body reaches the upstream with that body, chunked: hyper's
/// client sends these methods bodiless unless told the coding, which dropped the client's
/// bytes without a word. With a `Content-Length` they always went; a GET without a body
/// still goes without one.
#[test]
fn a_chunked_get_body_is_forwarded() {
    let up = Upstream::start();
    let s = gateway(&up);
    let ex = exchange(
        s.addr,
        b"GET /q HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        QUIET,
    );
    let echo = ex.one().json();
    assert_eq!(echo["method"], "GET", "{echo}");
    assert_eq!(echo["body_len"], 11, "{echo}");
    assert_eq!(
        echo["headers"]["transfer-encoding"],
        serde_json::json!(["chunked"])
    );

    let ex = exchange(
        s.addr,
        b"GET /q HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        QUIET,
    );
    let echo = ex.one().json();
    assert_eq!(echo["body_len"], 5, "{echo}");
    assert!(echo["headers"]["transfer-encoding"].is_null(), "{echo}");

    let ex = exchange(
        s.addr,
        b"GET /q HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    let echo = ex.one().json();
    assert_eq!(echo["body_len"], 0, "{echo}");
    assert!(echo["headers"]["transfer-encoding"].is_null(), "{echo}");
    assert!(echo["headers"]["content-length"].is_null(), "{echo}");
    assert_eq!(settled_hits(&up), 3);
}

// ---------------------------------------------------------------------------------------
// Transfer codings: only exactly `chunked` is framed; anything else is 400 and close.
// ---------------------------------------------------------------------------------------

fn te_refused(te_lines: &str) {
    let up = Upstream::start();
    let s = gateway(&up);
    let req = format!("POST / HTTP/1.1\r\nHost: x\r\n{te_lines}\r\n5\r\nhello\r\n0\r\n\r\n");
    assert_refused(&s, &up, req.as_bytes(), 400, &format!("{te_lines:?}"));
}

/// hyper refuses a request whose final coding is not chunked (proto/h1/role.rs:354-357).
#[test]
fn te_gzip_alone_is_400() {
    te_refused("Transfer-Encoding: gzip\r\n");
}

#[test]
fn te_identity_is_400() {
    te_refused("Transfer-Encoding: identity\r\n");
}

/// hyper accepts any list ending in chunked (headers.rs:159-168 `is_chunked_`); forwarded,
/// the upstream would get the still gzip-coded body labelled only `chunked` (TE is dropped
/// as hop-by-hop and the client re-chunks): the gateway must refuse it instead.
#[test]
fn te_gzip_then_chunked_is_400() {
    te_refused("Transfer-Encoding: gzip, chunked\r\n");
}

#[test]
fn te_chunked_twice_is_400() {
    te_refused("Transfer-Encoding: chunked, chunked\r\n");
}

/// Two TE lines: hyper judges each line on its own and keeps the verdict of the last.
#[test]
fn te_two_lines_chunked_is_400() {
    te_refused("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n");
}

#[test]
fn te_two_lines_gzip_then_chunked_is_400() {
    te_refused("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n");
}

/// HTTP/1.0 has no chunked coding: hyper refuses TE on a 1.0 request (role.rs:280-283).
#[test]
fn te_on_http10_is_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    assert_refused(
        &s,
        &up,
        b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        400,
        "TE on HTTP/1.0",
    );
}

// ---------------------------------------------------------------------------------------
// Bad chunked bodies. The head is valid, so the gateway has already started forwarding
// when the framing error shows up in the body: the upstream may have received the head
// (hits 0 or 1) but never a complete body, so its handler never produced an answer the
// client could get. Observable here: the client gets 400 (a client error, not 502) or just
// a closed connection, never a 2xx, and the connection does not stay open.
// ---------------------------------------------------------------------------------------

fn assert_bad_body(ex: &Exchange, up: &Upstream, what: &str) {
    let statuses = ex.statuses();
    assert!(
        statuses.is_empty() || statuses == [400],
        "{what}: expected a 400 or no answer; got {statuses:?}:\n{}",
        ex.text()
    );
    assert!(
        ex.closed,
        "{what}: connection must close; received:\n{}",
        ex.text()
    );
    let hits = settled_hits(up);
    assert!(hits <= 1, "{what}: the upstream saw {hits} requests");
}

fn bad_chunks(body: &str, eof: bool) {
    let up = Upstream::start();
    let s = gateway(&up);
    let req = format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
    let ex = if eof {
        exchange_then_eof(s.addr, req.as_bytes(), QUIET)
    } else {
        exchange(s.addr, req.as_bytes(), QUIET)
    };
    assert_bad_body(&ex, &up, &format!("{body:?}"));
}

#[test]
fn chunk_size_not_hex_is_refused() {
    bad_chunks("zz\r\nhello\r\n0\r\n\r\n", false);
}

#[test]
fn chunk_size_overflow_is_refused() {
    bad_chunks("ffffffffffffffffff\r\nhello\r\n0\r\n\r\n", false);
}

#[test]
fn chunk_size_negative_is_refused() {
    bad_chunks("-1\r\nhello\r\n0\r\n\r\n", false);
}

#[test]
fn chunk_longer_than_its_size_is_refused() {
    bad_chunks("3\r\nhello\r\n0\r\n\r\n", false);
}

#[test]
fn chunk_shorter_than_its_size_then_eof_is_refused() {
    bad_chunks("5\r\nab", true);
}

// ---------------------------------------------------------------------------------------
// Header field syntax: obs-fold and control characters.
// ---------------------------------------------------------------------------------------

#[test]
fn obs_fold_and_control_characters_are_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    for (what, field) in [
        ("obs-fold", &b"X-A: b\r\n c\r\n"[..]),
        ("obs-fold with tab", b"X-A: b\r\n\tc\r\n"),
        ("CR alone", b"X-A: b\rc\r\n"),
        // A bare LF ends the line (RFC 9112 §2.2), so `c` is a field line without a colon.
        ("LF alone", b"X-A: b\nc\r\n"),
        ("NUL", b"X-A: b\0c\r\n"),
        ("SOH", b"X-A: b\x01c\r\n"),
        ("DEL", b"X-A: b\x7fc\r\n"),
    ] {
        let mut req = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        req.extend_from_slice(field);
        req.extend_from_slice(b"\r\n");
        assert_refused(&s, &up, &req, 400, what);
    }
}

// ---------------------------------------------------------------------------------------
// Head size: 64 KiB.
// ---------------------------------------------------------------------------------------

fn with_headers(fields: &[(String, String)]) -> Vec<u8> {
    let mut req = String::from("GET /big HTTP/1.1\r\nHost: x\r\n");
    for (n, v) in fields {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    req.into_bytes()
}

#[test]
fn one_header_over_64k_is_431() {
    let up = Upstream::start();
    let s = gateway(&up);
    let req = with_headers(&[("X-Big".into(), "a".repeat(70_000))]);
    assert_refused(&s, &up, &req, 431, "one 70 000-byte header");
}

/// 70 fields of 1000 bytes: each small, the head 70 KB. (Fewer than hyper's default cap of
/// 100 fields, so it is the size limit that answers.)
#[test]
fn many_headers_over_64k_are_431() {
    let up = Upstream::start();
    let s = gateway(&up);
    let fields: Vec<_> = (0..70)
        .map(|i| (format!("X-F{i}"), "b".repeat(1000)))
        .collect();
    let req = with_headers(&fields);
    assert!(req.len() > 70_000);
    assert_refused(&s, &up, &req, 431, "70 headers of 1000 bytes");
}

#[test]
fn head_of_60k_is_accepted() {
    let up = Upstream::start();
    let s = gateway(&up);
    // One big field, and many fields: both about 60 KB.
    let one = with_headers(&[("X-Big".into(), "a".repeat(60_000))]);
    let many: Vec<_> = (0..60)
        .map(|i| (format!("X-F{i}"), "b".repeat(1000)))
        .collect();
    let many = with_headers(&many);
    for (what, req) in [("one field", one), ("60 fields", many)] {
        let ex = exchange(s.addr, &req, QUIET);
        let r = ex.one();
        assert_eq!(r.status, 200, "{what}: {}", ex.text());
        let echo = r.json();
        if what == "one field" {
            assert_eq!(echo["headers"]["x-big"][0].as_str().unwrap().len(), 60_000);
        } else {
            assert_eq!(echo["headers"]["x-f59"][0].as_str().unwrap().len(), 1000);
        }
    }
    assert_eq!(settled_hits(&up), 2);
}

/// RFC 9110 §7.6.1: the fields a request's `Connection` names are not forwarded. A hostile
/// head lists thousands of names there (about 60 KB of them, under the head limit): the
/// request is still answered, and exactly the named fields are dropped.
#[test]
fn connection_naming_thousands_of_fields_is_answered_without_them() {
    let up = Upstream::start();
    let s = gateway(&up);
    let mut names: Vec<String> = (0..6_500).map(|i| format!("X-N{i}")).collect();
    names.push("x-secret".into());
    let mut fields = vec![("Connection".to_string(), names.join(","))];
    fields.extend(
        (0..6_500)
            .step_by(250)
            .map(|i| (format!("x-n{i}"), "1".to_string())),
    );
    fields.push(("X-N6500".into(), "unlisted".into()));
    fields.push(("X-Secret".into(), "s".into()));
    fields.push(("X-Kept".into(), "k".into()));
    let req = with_headers(&fields);
    assert!(req.len() > 50_000 && req.len() < 64 * 1024, "{}", req.len());
    let ex = exchange(s.addr, &req, QUIET);
    let r = ex.one();
    assert_eq!(r.status, 200, "{}", ex.text());
    let seen = &r.json()["headers"];
    assert_eq!(seen["x-kept"][0], "k");
    assert_eq!(seen["x-n6500"][0], "unlisted");
    for gone in ["x-secret", "x-n0", "x-n250", "x-n6250", "connection"] {
        assert!(seen.get(gone).is_none(), "{gone} was forwarded: {seen}");
    }
    assert_eq!(settled_hits(&up), 1);
}

/// A head near the limit followed at once by a body in the same write: the body bytes
/// sharing the read buffer with the head must not count against the head limit.
#[test]
fn head_of_60k_with_body_in_the_same_write_is_accepted() {
    let up = Upstream::start();
    let s = gateway(&up);
    let body = vec![b'z'; 1 << 20];
    let mut req = format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(60_000),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let ex = exchange(s.addr, &req, QUIET);
    let r = ex.one();
    assert_eq!(r.status, 200, "{}", ex.text());
    assert_eq!(r.text(), (1 << 20).to_string());
}

/// The smaller read buffer (64 KiB) does not limit bodies: several MB stream both ways,
/// with a known length and chunked.
#[tokio::test]
async fn multi_megabyte_bodies_still_stream() {
    const N: usize = 8 << 20;
    let up = Upstream::start();
    let s = gateway(&up);
    let c = client();
    let r = send(&c, Method::POST, &s.url("/upload"), &[], &vec![1u8; N]).await;
    assert_eq!(r.status, 200, "{}", s.log());
    assert_eq!(r.text(), N.to_string());

    let chunk = bytes::Bytes::from(vec![7u8; 100_000]);
    let chunks =
        futures_util::stream::iter((0..N / 100_000).map(move |_| {
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk.clone()))
        }));
    let uc: hyper_util::client::legacy::Client<_, _> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = http::Request::post(s.url("/upload"))
        .body(http_body_util::StreamBody::new(chunks))
        .unwrap();
    let res = uc.request(req).await.unwrap();
    assert_eq!(res.status(), 200, "{}", s.log());
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&got),
        (N / 100_000 * 100_000).to_string()
    );

    let r = get(&c, &s.url(&format!("/download?bytes={N}")), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), N);
}

/// A client that speaks HTTP/2 only (prior knowledge, over cleartext).
fn h2_client() -> HttpClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// HTTP/2 header blocks get the same 64 KiB (h2's own default is 16 KiB): 60 KB passes,
/// 70 KB does not reach the upstream.
#[tokio::test]
async fn h2_header_list_limit_is_64k() {
    let up = Upstream::start();
    let s = gateway(&up);
    let c = h2_client();
    let ok = "a".repeat(60_000);
    let r = get(&c, &s.url("/h2"), &[("x-big", ok.as_str())]).await;
    assert_eq!(r.status, 200, "{}", s.log());
    assert_eq!(
        r.json()["headers"]["x-big"][0].as_str().unwrap().len(),
        60_000
    );

    let big = "a".repeat(70_000);
    let req = http::Request::get(s.url("/h2"))
        .header("x-big", big.as_str())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    // h2 decodes the whole block, finds it over the limit, answers 431 and resets the stream
    // (h2 proto/streams/recv.rs:221-238). (A block whose *compressed* size already passes the
    // limit is a connection error instead: h2 codec/framed_read.rs:350-367. `a` Huffman-codes
    // to 5 bits, so this one is ~44 KB on the wire.)
    let res = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("h2 request timed out")
        .expect("a 431 answer, not a connection error");
    assert_eq!(res.status(), 431);
    assert_eq!(settled_hits(&up), 1);
}

/// A path with raw bytes (UTF-8 here) is 400 over HTTP/2 and HTTP/1.1 alike (both parsers let
/// them through): not forwarded into the upstream's request line (RFC 3986 §3.3, RFC 9112
/// §3.2), nor matched beside the percent-encoded spelling.
#[tokio::test]
async fn h2_path_with_raw_bytes_is_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    let c = h2_client();
    let r = get(&c, &s.url("/d\u{e9}ny"), &[]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = get(&c, &s.url("/d%C3%A9ny"), &[]).await;
    assert_eq!(r.status, 200, "the encoded spelling passes");
    assert_eq!(settled_hits(&up), 1);

    let raw = exchange(
        s.addr,
        "GET /d\u{e9}ny HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".as_bytes(),
        Duration::from_millis(1500),
    );
    assert_eq!(raw.statuses(), vec![400], "{}", raw.text());
    assert_eq!(settled_hits(&up), 1);
}

/// RFC 9113 §8.3.1: an HTTP/2 request whose `Host` names another host than its
/// `:authority` is malformed (400): the gateway routes on the authority, and an upstream
/// behind another proxy might take the `Host`.
#[tokio::test]
async fn h2_host_that_differs_from_authority_is_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    let c = h2_client();
    let authority = s.addr.to_string();
    for (host, want) in [("other.example", 400), (authority.as_str(), 200)] {
        let r = get(&c, &s.url("/h2"), &[("host", host)]).await;
        assert_eq!(r.status, want, "{host}: {}", r.text());
    }
    assert_eq!(settled_hits(&up), 1);
}

/// RFC 9113 §8.2.3: an HTTP/2 client may send one `cookie` field per cookie; before an
/// HTTP/1.1 upstream they MUST be joined with "; " (an upstream reading the first line would
/// lose the others).
#[tokio::test]
async fn h2_split_cookies_reach_the_upstream_as_one_field() {
    let up = Upstream::start();
    let s = gateway(&up);
    let c = h2_client();
    let r = get(
        &c,
        &s.url("/c"),
        &[("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["headers"]["cookie"],
        serde_json::json!(["a=1; b=2; c=3"])
    );

    // Split cookies count as the one field they become: 150 of them pass (they were 431 past
    // 100 fields, while HTTP/1.1 carries the same cookies on one line), but 101 other
    // fields are still too many.
    let crumbs: Vec<String> = (0..150).map(|i| format!("c{i}={i}")).collect();
    let fields: Vec<(&str, &str)> = crumbs.iter().map(|c| ("cookie", c.as_str())).collect();
    let r = get(&c, &s.url("/c"), &fields).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["headers"]["cookie"],
        serde_json::json!([crumbs.join("; ")])
    );
    let names: Vec<String> = (0..101).map(|i| format!("x-f{i}")).collect();
    let mut fields: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    fields.push(("cookie", "a=1"));
    assert_eq!(get(&c, &s.url("/c"), &fields).await.status, 431);
}

/// RFC 9113 §8.2.2: an intermediary MUST remove connection-specific fields when it turns
/// HTTP/1.1 into HTTP/2, trailers included (and RFC 9110 §6.5.1's fields no trailer carries). An upstream's chunked answer ending in
/// `connection: close` and `keep-alive` trailers reached an HTTP/2 client as a stream reset
/// after the whole body (curl exit 92); now its other trailers arrive, those two do not.
#[tokio::test]
async fn h2_trailers_lose_their_hop_by_hop_fields() {
    let up = support::raw::upstream(|conn| {
        use std::io::Write;
        let _ = conn.write_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n\
              3\r\nabc\r\n0\r\nx-sum: 7\r\nconnection: close\r\nkeep-alive: timeout=5\r\n\
              content-length: 3\r\nhost: elsewhere\r\n\r\n",
        );
    });
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [\"http://{up}\"] }}\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n"
    ));
    let req = http::Request::get(s.url("/t"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), h2_client().request(req))
        .await
        .expect("answered")
        .expect("an answer");
    assert_eq!(res.status(), 200);
    let body = res
        .into_body()
        .collect()
        .await
        .expect("the stream ends cleanly");
    let trailers = body.trailers().cloned().expect("trailers");
    assert_eq!(body.to_bytes(), "abc");
    assert_eq!(trailers.get("x-sum").map(|v| v.as_bytes()), Some(&b"7"[..]));
    // Nor the fields no trailer may carry (RFC 9110 §6.5.1), which an HTTP/2 client refuses
    // as a protocol error (curl: exit 92).
    for name in ["connection", "keep-alive", "content-length", "host"] {
        assert!(trailers.get(name).is_none(), "{name}: {trailers:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Request-target forms.
// ---------------------------------------------------------------------------------------

/// RFC 9112 §3.2.2: with an absolute-form target the target's authority is the host, and a
/// different `Host` field is ignored, for routing and for what goes upstream.
#[test]
fn absolute_form_target_authority_wins_over_host() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: by-host-field\n    match: {{ path_prefix: /a, host: other.com }}\n    upstream: up\n  - name: by-target\n    match: {{ path_prefix: /b, host: example.com }}\n    upstream: up\n",
        up.url()
    ));
    let ex = exchange(
        s.addr,
        b"GET http://example.com/b/x HTTP/1.1\r\nHost: other.com\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    let r = ex.one();
    assert_eq!(r.status, 200, "routed by the target's host: {}", ex.text());
    let echo = r.json();
    assert_eq!(echo["path"], "/b/x", "{echo}");
    assert_eq!(
        echo["headers"]["host"],
        serde_json::json!(["example.com"]),
        "{echo}"
    );

    let ex = exchange(
        s.addr,
        b"GET http://example.com/a/x HTTP/1.1\r\nHost: other.com\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    assert_eq!(
        ex.one().status,
        404,
        "the Host field must not route an absolute-form request: {}",
        ex.text()
    );
    assert_eq!(settled_hits(&up), 1);
}

#[test]
fn asterisk_form_is_400() {
    let up = Upstream::start();
    let s = gateway(&up);
    assert_refused(
        &s,
        &up,
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "OPTIONS *",
    );
}

/// CONNECT (a tunnel) and TRACE (an echo of the request's cookies and credentials: cross-site
/// tracing) never reach the upstream.
#[test]
fn connect_and_trace_are_405() {
    let up = Upstream::start();
    let s = gateway(&up);
    for (raw, method) in [
        (
            &b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"[..],
            "CONNECT",
        ),
        (
            b"TRACE /api/x HTTP/1.1\r\nHost: x\r\nCookie: session=s3cret\r\n\r\n",
            "TRACE",
        ),
    ] {
        let ex = exchange(s.addr, raw, QUIET);
        assert_eq!(ex.statuses(), vec![405], "{}", ex.text());
        // RFC 9110 §15.5.6: a 405 MUST list the methods the target supports.
        let allow = ex.one().header("allow").unwrap_or_default();
        assert!(
            allow.contains("GET") && !allow.contains(method),
            "{}",
            ex.text()
        );
        assert!(!ex.text().contains("s3cret"), "{}", ex.text());
    }
    assert_eq!(settled_hits(&up), 0);
}

/// An HTTP/1.0 request may omit Host; it is forwarded, and the upstream still gets a Host
/// field: the gateway fills it from the target, as `host:port` unless the port is the
/// scheme's (`host_header` in src/pipeline/upstream/mod.rs).
#[test]
fn http10_without_host_is_forwarded_with_a_host() {
    let up = Upstream::start();
    let s = gateway(&up);
    let ex = exchange(s.addr, b"GET /ten HTTP/1.0\r\n\r\n", QUIET);
    let r = ex.one();
    assert_eq!(r.status, 200, "{}", ex.text());
    assert!(ex.closed, "HTTP/1.0 without keep-alive closes");
    let echo = r.json();
    assert_eq!(echo["path"], "/ten");
    assert_eq!(
        echo["headers"]["host"],
        serde_json::json!([up.addr.to_string()]),
        "{echo}"
    );
    assert_eq!(settled_hits(&up), 1);
}

// ---------------------------------------------------------------------------------------
// Pipelining.
// ---------------------------------------------------------------------------------------

/// hyper refuses the first request while parsing it; the request behind it is never read.
#[test]
fn pipelined_after_unframeable_request_is_dropped() {
    let up = Upstream::start();
    let s = gateway(&up);
    assert_refused(
        &s,
        &up,
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "gzip TE then a pipelined GET",
    );
}

/// Refused by the gateway after hyper parsed it (a coding list ending in chunked): the
/// 400 must close the connection, so the pipelined request is not served either.
#[test]
fn pipelined_after_refused_coding_list_is_dropped() {
    let up = Upstream::start();
    let s = gateway(&up);
    assert_refused(
        &s,
        &up,
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "gzip, chunked TE then a pipelined GET",
    );
}

/// A 429 in the middle of a pipeline on a keep-alive connection: every request answered in
/// order, the upstream sees exactly the allowed ones.
#[test]
fn pipelined_429_then_valid_request() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: limited\n    match: {{ path_prefix: /limited }}\n    upstream: up\n    limits:\n      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 1/1m }}\n  - name: free\n    match: {{ path_prefix: / }}\n    upstream: up\n",
        up.url()
    ));
    let ex = exchange(
        s.addr,
        b"GET /limited/1 HTTP/1.1\r\nHost: x\r\n\r\nGET /limited/2 HTTP/1.1\r\nHost: x\r\n\r\nGET /free HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    assert_eq!(ex.statuses(), vec![200, 429, 200], "{}", ex.text());
    assert_eq!(ex.responses[0].json()["path"], "/limited/1");
    assert_eq!(ex.responses[1].json()["status"], 429);
    assert_eq!(ex.responses[2].json()["path"], "/free");
    assert!(ex.closed, "Connection: close on the last request");
    assert_eq!(settled_hits(&up), 2);
}

// ---------------------------------------------------------------------------------------
// Panic safety: the real binary cannot be made to panic, so `server::serve` runs
// in-process, on a real socket, with a handler that panics on two paths.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

fn panicking_server(
    rt: &tokio::runtime::Runtime,
) -> (
    SocketAddr,
    tokio::sync::watch::Sender<sluice::pipeline::context::Phase>,
) {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(sluice::pipeline::context::Phase::Serving);
    rt.spawn(sluice::runtime::server::serve(
        listener,
        sluice::runtime::server::Accept::default(),
        |req: http::Request<hyper::body::Incoming>, _peer| {
            // Panics while creating the handler's future …
            if req.uri().path() == "/panic-sync" {
                panic!("synchronous handler panic (on purpose)");
            }
            async move {
                // … and while polling it.
                if req.uri().path() == "/panic" {
                    panic!("async handler panic (on purpose)");
                }
                Response::new(sluice::pipeline::body::full(format!(
                    "ok {}",
                    req.uri().path()
                )))
            }
        },
        |_| {},
        sluice::runtime::server::Timeouts {
            header: Duration::from_secs(5),
            send: Duration::from_secs(5),
        },
        stop_rx,
        Duration::from_secs(1),
        None,
    ));
    (addr, stop_tx)
}

#[test]
fn handler_panic_is_500_and_serving_continues() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (addr, stop) = panicking_server(&rt);

    // One keep-alive connection: panic, panic, then a normal request, pipelined.
    let ex = exchange(
        addr,
        b"GET /panic HTTP/1.1\r\nHost: x\r\nX-Request-Id: rid-panic-1\r\n\r\nGET /panic-sync HTTP/1.1\r\nHost: x\r\n\r\nGET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    assert_eq!(ex.statuses(), vec![500, 500, 200], "{}", ex.text());
    let p = &ex.responses[0];
    assert_eq!(p.header("content-type"), Some("application/problem+json"));
    assert_eq!(p.header("x-request-id"), Some("rid-panic-1"));
    let doc = p.json();
    assert_eq!(doc["type"], "about:blank");
    assert_eq!(doc["title"], "Internal Server Error");
    assert_eq!(doc["status"], 500);
    assert!(doc["detail"].is_string());
    assert!(
        !p.text().contains("on purpose"),
        "the panic message is logged, not sent to the client"
    );
    assert_eq!(
        ex.responses[1].header("x-request-id").map(str::len),
        Some(32),
        "a generated id when the client sent none"
    );
    assert_eq!(ex.responses[2].text(), "ok /fine");

    // Same connection, one request at a time (not pipelined).
    let mut st = std::net::TcpStream::connect(addr).unwrap();
    for (path, status) in [("/panic", 500), ("/a", 200), ("/panic", 500), ("/b", 200)] {
        use std::io::Write;
        write!(st, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // Each answer is small: read until one whole response is in.
        while support::raw::parse_responses(&got).is_empty() {
            use std::io::Read;
            st.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let n = st.read(&mut buf).expect("connection must stay open");
            assert!(n > 0, "connection closed after {path}");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(
            support::raw::parse_responses(&got)[0].status,
            status,
            "{path}"
        );
    }

    // New connections, h1 and h2.
    let ex = exchange(
        addr,
        b"GET /new HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        QUIET,
    );
    assert_eq!(ex.statuses(), vec![200], "{}", ex.text());
    rt.block_on(async {
        let c: HttpClient =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http();
        let r = get(&c, &format!("http://{addr}/panic"), &[]).await;
        assert_eq!(r.status, 500);
        assert_eq!(r.json()["status"], 500);
        let r = get(&c, &format!("http://{addr}/h2"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "ok /h2");
    });

    let log = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(log.contains("request handler panicked"), "{log}");
    assert!(log.contains("async handler panic (on purpose)"), "{log}");
    assert!(
        log.contains("synchronous handler panic (on purpose)"),
        "{log}"
    );
    assert!(log.contains("rid-panic-1"), "{log}");
    let _ = stop.send(sluice::pipeline::context::Phase::Draining);
}
