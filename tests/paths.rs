//! Path normalization through the real binary (SPEC §7): every spelling of a limited path is
//! limited as that path, and the upstream receives the normalized path it will serve. Each
//! request is sent as raw bytes, so no client library tidies the path first.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use support::{raw, Sluice, Upstream};

/// One request as raw bytes on a fresh connection (`Connection: close`): status and body.
fn raw_get(addr: SocketAddr, target: &str) -> (u16, String) {
    let req = format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n");
    let ex = raw::exchange(addr, req.as_bytes(), Duration::from_secs(10));
    let res = ex.one();
    (res.status, res.text())
}

/// The JSON the test upstream echoes (path and query as it received them), or a problem.
fn echoed(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn config(up: &Upstream, paths: &str) -> String {
    format!(
        "{paths}upstreams: {{ up: {{ targets: [{}] }} }}
routes:
  - name: login
    match: {{ path: /auth/login }}
    upstream: up
    limits:
      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 2/1m }}
  - name: files
    match: {{ path_prefix: /files/ }}
    upstream: up
  - name: rest
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    )
}

fn problem_detail(body: &str) -> String {
    echoed(body)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn every_spelling_of_a_limited_path_is_limited_and_forwarded_normalized() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, ""));
    // The variants nginx, Express, Spring and Rails all serve as /auth/login.
    let variants = [
        "/auth//login",
        "/auth/./login",
        "/x/../auth/login",
        "/auth/%6cogin",
        "/auth/%6Cogin",
        "/%61uth/login",
        "//auth/login",
        "/auth/x/%2e%2e/login",
        "/auth/x/%2E%2e/login",
        "/auth/x/.%2E/login",
    ];
    // Two variants use up the limit of 2, and the upstream saw the normalized path each time.
    for v in &variants[..2] {
        let (status, body) = raw_get(s.addr, v);
        assert_eq!(status, 200, "{v}: {body}");
        assert_eq!(echoed(&body)["path"], "/auth/login", "{v}");
    }
    // Every spelling, and the plain one, is now the same limited route.
    for v in variants.iter().chain(&["/auth/login"]) {
        let (status, body) = raw_get(s.addr, v);
        assert_eq!(status, 429, "{v} slipped past the limit: {body}");
        assert_eq!(echoed(&body)["route"], "login", "{v}");
    }
    assert_eq!(
        up.hits(),
        2,
        "only the two admitted requests reached the upstream"
    );
}

#[test]
fn the_upstream_receives_the_normalized_path_and_the_query_untouched() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, ""));
    for (sent, path) in [
        ("/files//a/./b/../c", "/files/a/c"),
        ("/files/%7euser/%41%2d", "/files/~user/A-"),
        ("/files/a%3ab%c3%a9", "/files/a%3Ab%C3%A9"),
        ("/files/a/.", "/files/a/"),
        ("/files/x/..", "/files/"),
        ("/files/.well-known/x", "/files/.well-known/x"),
    ] {
        let (status, body) = raw_get(s.addr, sent);
        assert_eq!(status, 200, "{sent}: {body}");
        assert_eq!(echoed(&body)["path"], path, "{sent}");
    }
    // The query is forwarded exactly as received, dots, slashes and escapes included.
    let (status, body) = raw_get(s.addr, "/files//q?x=%2F..//&y=%6c&z=a/../b");
    assert_eq!(status, 200, "{body}");
    let doc = echoed(&body);
    assert_eq!(doc["path"], "/files/q");
    assert_eq!(doc["query"], "x=%2F..//&y=%6c&z=a/../b");
}

#[tokio::test]
async fn unsafe_paths_are_refused_with_400_problem_json_and_never_forwarded() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, ""));
    for (target, why) in [
        ("/..", "climbs above the root"),
        ("/a/../../etc/passwd", "climbs above the root"),
        ("/%2e%2e/etc/passwd", "climbs above the root"),
        ("/files/a%00b", "NUL"),
        ("/files/a%2Fb", "encoded slash"),
        ("/files/a%2fb", "encoded slash"),
        ("/files/a%5Cb", "encoded slash"),
        ("/auth%2flogin", "encoded slash"),
        ("/files/a%zzb", "malformed"),
        ("/files/a%2", "malformed"),
    ] {
        let (status, body) = raw_get(s.addr, target);
        assert_eq!(status, 400, "{target}: {body}");
        let detail = problem_detail(&body);
        assert!(detail.contains(why), "{target}: {detail}");
    }
    assert_eq!(up.hits(), 0, "nothing refused reached the upstream");
    let m = support::metric(
        &s.metrics(&support::client()).await,
        "sluice_requests_total",
        &[("route", "_none"), ("outcome", "rejected_request")],
    );
    assert_eq!(m, 10.0, "each refusal counted once as rejected_request");
}

#[test]
fn a_raw_backslash_is_refused() {
    // http's URI parser may refuse a raw `\` before the gateway sees it: either way a 400.
    let up = Upstream::start();
    let s = Sluice::start(&config(&up, ""));
    let (status, body) = raw_get(s.addr, "/files/a\\..\\b");
    assert_eq!(status, 400, "{body}");
    assert_eq!(up.hits(), 0);
}

#[test]
fn escaped_slashes_keep_and_merge_slashes_off() {
    let up = Upstream::start();
    let s = Sluice::start(&config(
        &up,
        "paths: { merge_slashes: false, escaped_slashes: keep }\n",
    ));
    // Kept encoded (upper-case hex), matched as written, never turned into separators.
    let (status, body) = raw_get(s.addr, "/files/a%2fb");
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body)["path"], "/files/a%2Fb");
    let (_, body) = raw_get(s.addr, "/files/a/..%2f..%2fb");
    assert_eq!(echoed(&body)["path"], "/files/a/..%2F..%2Fb");
    // `/auth%2Flogin` is not `/auth/login`: another route, not the login limit.
    let (status, body) = raw_get(s.addr, "/auth%2Flogin");
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body)["path"], "/auth%2Flogin");
    // Slashes are not merged: `//x` stays, and does not match the exact login route.
    let (_, body) = raw_get(s.addr, "/files//x");
    assert_eq!(echoed(&body)["path"], "/files//x");
    // Dot segments are still removed.
    let (_, body) = raw_get(s.addr, "/files/a/./b/../c");
    assert_eq!(echoed(&body)["path"], "/files/a/c");
}

#[test]
fn a_route_pattern_that_could_never_match_is_a_config_error() {
    let out = std::process::Command::new(support::sluice_bin())
        .args(["check", "-c", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(
                b"upstreams: { up: { targets: [http://127.0.0.1:1] } }
routes:
  - name: a
    match: { path: /auth//login }
    upstream: up
  - name: b
    match: { path_prefix: /x/%2e%2e/ }
    upstream: up
",
            )?;
            c.wait_with_output()
        })
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("/dev/stdin:4:14: `/auth//login` never matches")
            && err.contains("write `/auth/login`"),
        "{err}"
    );
    assert!(
        err.contains("/dev/stdin:7:14: `/x/%2e%2e/` never matches"),
        "{err}"
    );
}

/// `path_regex` must match the whole (normalized) path, not a part of it: `/users/[0-9]+`
/// takes `/users/12` and its spellings, never `/users/12/x` or `/api/users/12`; and the
/// case-folding regex the configuration reference suggests takes what frameworks fold into
/// `/deny`.
#[test]
fn a_path_regex_matches_the_whole_path() {
    let up = Upstream::start();
    let s = Sluice::start(&format!(
        "upstreams: {{ up: {{ targets: [{}] }} }}
routes:
  - name: user
    match: {{ path_regex: \"/users/[0-9]+\" }}
    upstream: up
    limits: [ {{ name: k, by: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]
  - name: deny
    match: {{ path_regex: \"(?i)/deny/?\" }}
    upstream: up
    limits: [ {{ name: k, by: ip, algorithm: token_bucket, rate: 1/1h, burst: 1 }} ]
  - name: rest
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url()
    ));
    assert_eq!(raw_get(s.addr, "/users/12").0, 200);
    for spent in ["/users/12", "/users//12", "/x/../users/%31%32"] {
        assert_eq!(raw_get(s.addr, spent).0, 429, "{spent}");
    }
    for other in ["/users/12/x", "/api/users/12", "/users/12a", "/users/"] {
        let (status, body) = raw_get(s.addr, other);
        assert_eq!(status, 200, "{other}: {body}");
    }
    assert_eq!(raw_get(s.addr, "/deny").0, 200);
    for spent in ["/DENY", "/deny/", "/Deny/"] {
        assert_eq!(raw_get(s.addr, spent).0, 429, "{spent}");
    }
    assert_eq!(raw_get(s.addr, "/denyx").0, 200);
}
