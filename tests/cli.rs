//! `sluice check` and `--version` through the real binary: exit codes, the summary, and
//! every config error at its exact FILE:LINE:COL.

mod support;

use std::process::Command;

fn check(yaml: &str) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(support::sluice_bin())
        .arg("check")
        .arg("-c")
        .arg(&path)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path.display().to_string(),
    )
}

/// The stderr lines, with the temp file's name replaced by `F`.
fn errors(yaml: &str) -> Vec<String> {
    let (code, _, err, path) = check(yaml);
    assert_eq!(code, 1, "expected failure; stderr: {err}");
    err.lines().map(|l| l.replacen(&path, "F", 1)).collect()
}

/// `yaml` fails with exactly one error, starting with `at` (`F:LINE:COL: …`, or `F:` for any
/// position), saying `says`, and never repeating `secret`.
fn one_error(yaml: &str, at: &str, says: &str, secret: &str) {
    let e = errors(yaml);
    assert_eq!(e.len(), 1, "{yaml}\n{e:?}");
    assert!(e[0].starts_with(at) && e[0].contains(says), "{yaml}\n{e:?}");
    assert!(!e[0].contains(secret), "{secret} echoed: {e:?}");
}

/// `yaml` passes `sluice check`.
fn passes(yaml: &str) {
    let (code, _, err, _) = check(yaml);
    assert_eq!(code, 0, "{yaml}\n{err}");
}

const OK: &str = "upstreams:
  api: { targets: [http://127.0.0.1:3000] }
routes:
  - name: login
    match: { path: /auth/login, methods: [POST] }
    upstream: api
    limits:
      - name: per-ip
        by: ip
        algorithm: sliding_log
        rate: 5/1m
";

#[test]
fn valid_config_prints_summary_and_exits_0() {
    let (code, out, err, _) = check(OK);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK, version "), "{out}");
    assert!(out.contains("login"), "{out}");
    assert!(out.contains("per-ip"), "{out}");
    assert!(out.contains("sliding_log 5/1m"), "{out}");
    assert!(out.contains("store memory"), "{out}");
    assert!(out.contains("POST path /auth/login"), "{out}");

    // A composite key on one line, as flow style writes it.
    let composite = OK.replace("by: ip", "by: [ip, \"header:X-Tenant\"]");
    let (code, out, err, _) = check(&composite);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("by [ip, header:X-Tenant]"), "{out}");

    // The methods as matched: `GET` brings `HEAD`.
    let (code, out, err, _) = check(&OK.replace("[POST]", "[get]"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("GET,HEAD path /auth/login"), "{out}");

    // The store as written in the YAML: its mode and policy in their YAML spelling, and for
    // Sentinel the sentinels and service rather than the primary's URL.
    for (store, line) in [
        (
            "store: { kind: memory, on_error: deny }\n",
            "store memory (max 1000000 keys)  on_error deny",
        ),
        (
            "store: { kind: redis, redis: { url: \"redis://:pw@10.0.0.1:6379/2\" } }\n",
            "store redis standalone redis://:***@10.0.0.1:6379/2  on_error allow",
        ),
        (
            "store: { kind: redis, on_error: local, redis: { mode: cluster, nodes: [\"10.0.0.1:7000\", \"10.0.0.2:7000\"] } }\n",
            "store redis cluster 10.0.0.1:7000,10.0.0.2:7000  on_error local",
        ),
        (
            "store: { kind: redis, redis: { mode: sentinel, url: \"redis://10.0.0.9/1\", nodes: [\"10.0.0.1:26379\"], sentinel_service: main } }\n",
            "store redis sentinel 10.0.0.1:26379 (service main)  on_error allow",
        ),
    ] {
        let (code, out, err, _) = check(&format!("{store}{OK}"));
        assert_eq!(code, 0, "{err}");
        assert!(out.lines().any(|l| l == line), "{line}\n{out}");
    }
}

/// `sluice check -c F | head -1`: a reader that leaves early is not a crash.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, OK).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    // The read end is gone before the process writes: every write gets EPIPE.
    drop(reader);
    let out = Command::new(support::sluice_bin())
        .arg("check")
        .arg("-c")
        .arg(&path)
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn the_shipped_default_config_is_valid() {
    let out = Command::new(support::sluice_bin())
        .args(["check", "-c", "config/sluice.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An empty `SLUICE_CONFIG` (as templates often set it) is unset: `config/sluice.yaml`.
#[test]
fn an_empty_env_var_falls_back_to_the_default_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(dir.path().join("config/sluice.yaml"), OK).unwrap();
    let out = Command::new(support::sluice_bin())
        .arg("check")
        .env("SLUICE_CONFIG", "")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("config/sluice.yaml"));
}

#[test]
fn config_path_defaults_to_env_var() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("env.yaml");
    std::fs::write(&path, OK).unwrap();
    let out = Command::new(support::sluice_bin())
        .arg("check")
        .env("SLUICE_CONFIG", &path)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("env.yaml"));
}

#[test]
fn version_flag() {
    let out = Command::new(support::sluice_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("sluice {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_key_is_an_error_at_its_position() {
    let e = errors("upstreams:\n  api: { targets: [http://127.0.0.1:1] }\nroutes:\n  - name: x\n    match: { path: / }\n    upstream: api\n    limits:\n      - name: l\n        by: ip\n        algorithm: gcra\n        rate: 5/s\n        burts: 3\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("F:12:9: "), "{e:?}");
    assert!(e[0].contains("unknown field `burts`"), "{e:?}");
}

/// Inside a list of listeners too: each error at its own line, not at the file's start.
#[test]
fn a_listener_error_is_at_its_position() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\nroutes: []\n";
    let cases = [
        (
            "listen:\n  - address: 127.0.0.1:1\n    bogus: 1\n",
            "F:4:5: ",
            "unknown field `bogus`",
        ),
        (
            "listen:\n  - address: 127.0.0.1:1\n    tls:\n      ciphers: []\n",
            "F:5:7: ",
            "unknown field `ciphers`",
        ),
        (
            "listen:\n  - proxy_protocol: true\n",
            "F:3:5: ",
            "missing field `address`",
        ),
        (
            "listen:\n  - address: 127.0.0.1:1\n    proxy_protocol: yes please\n",
            "F:4:21: ",
            "proxy_protocol",
        ),
        (
            "listen: {}\n",
            "F:2:9: ",
            "an address (IP:PORT) or a list of listeners",
        ),
    ];
    for (listen, at, what) in cases {
        let e = errors(&format!("admin_listen: 127.0.0.1:2\n{listen}{up}"));
        assert_eq!(e.len(), 1, "{listen:?}: {e:?}");
        assert!(
            e[0].starts_with(at) && e[0].contains(what),
            "{listen:?}: {e:?}"
        );
    }
}

/// `routes:` or `upstreams:` with nothing after it (a file caught mid-write reads so) is an
/// error at the section, not an empty list that would turn every request into a 404.
#[test]
fn an_empty_required_section_is_an_error_at_it() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    let e = errors(&format!("{up}routes:\n"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("F:3:1: ") && e[0].contains("`routes` is empty"),
        "{e:?}"
    );
    let e = errors("workers: 1\nupstreams:\nroutes: []\n");
    assert!(
        e[0].starts_with("F:2:1: ") && e[0].contains("`upstreams` is empty"),
        "{e:?}"
    );
    let (code, _, err, _) = check(&format!("{up}routes: []\n"));
    assert_eq!(code, 0, "`routes: []` says none on purpose: {err}");
}

/// Names the gateway makes itself start with `_` (a route `_plans` would share the plans'
/// store keys); and a `workers` count no machine has is a typo.
#[test]
fn reserved_names_and_absurd_worker_counts_are_errors() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    let e = errors(&format!(
        "workers: 100000\n{up}routes:\n  - {{ name: _plans, match: {{ path: / }}, upstream: api }}\n"
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("F:1:1: `workers` must be at most 1024"),
        "{e:?}"
    );
    assert!(e[1].starts_with("F:5:7: route name `_plans`"), "{e:?}");
}

/// A host a request can never carry is an error, not a route that silently never matches:
/// an internationalized name (clients send its punycode), a port, a path.
#[test]
fn a_host_no_request_can_carry_is_an_error() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    let e = errors(&format!(
        "{up}routes:\n  - {{ name: a, match: {{ path: /, host: Bücher.example }}, upstream: api }}\n  - {{ name: b, match: {{ path: /, host: 'api.example.com:8080' }}, upstream: api }}\n  - {{ name: c, match: {{ path: /, host: '*.exa mple.com' }}, upstream: api }}\n"
    ));
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("F:4:34: host `bücher.example` is not ASCII") && e[0].contains("punycode"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("F:5:34: invalid host `api.example.com:8080`"),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("F:6:34: invalid host `*.exa mple.com`"),
        "{e:?}"
    );
    let (code, _, err, _) = check(&format!(
        "{up}routes:\n  - {{ name: a, match: {{ path: /, host: xn--bcher-kva.example }}, upstream: api }}\n  - {{ name: b, match: {{ path: /, host: '*.my_svc.internal' }}, upstream: api }}\n"
    ));
    assert_eq!(code, 0, "{err}");
}

/// A match no request can meet is an error, not a route that silently never applies: a
/// path with a query or a fragment (a route sees the path alone), a header value with white
/// space at either end (HTTP trims it), a header named twice in two cases (names match in
/// any case, so only a request sending both values matched). And the hint for an empty
/// `upstreams:` is one that parses.
#[test]
fn a_match_no_request_can_meet_is_an_error() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    let e = errors(&format!(
        "{up}routes:\n  - {{ name: a, match: {{ path_prefix: '/a?x=1' }}, upstream: api }}\n  - {{ name: b, match: {{ path: '/f#x' }}, upstream: api }}\n  - {{ name: c, match: {{ path: /, headers: {{ X-Env: ' prod' }} }}, upstream: api }}\n  - {{ name: d, match: {{ path: /, headers: {{ X-Env: a, x-env: b }} }}, upstream: api }}\n"
    ));
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(
        e[0].starts_with("F:4:25: `/a?x=1` never matches: `?` is not part of the path")
            && e[0].contains("`/a`"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("F:5:25: `/f#x` never matches: `#`"),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("F:6:45: `X-Env: \" prod\"` never matches"),
        "{e:?}"
    );
    assert!(
        e[3].starts_with("F:7:55: duplicate key `x-env`") && e[3].contains("any case"),
        "{e:?}"
    );
    let e = errors("upstreams:\nroutes: []\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("`upstreams` is empty (write `{}` for none)"),
        "{e:?}"
    );
    let (code, _, err, _) = check("upstreams: {}\nroutes: []\n");
    assert_eq!(code, 0, "the hint parses: {err}");
    // One problem, one error: a Redis store with no url was also "redis settings rejected".
    let e = errors("store: { kind: redis }\nupstreams: {}\nroutes: []\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("standalone mode needs `url`"), "{e:?}");
}

/// A YAML syntax error points at the mistake, not where the parser gave up (said in the
/// message): a key with no space after its colon, a quote left open; one found inside a
/// mapping stays where it was found; a tab is named.
#[test]
fn a_syntax_error_points_at_the_mistake() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    let e = errors(&format!(
        "{up}routes:\n  - name: r\n    upstream:api\n    match: {{ path_prefix: / }}\n"
    ));
    assert_eq!(
        e,
        ["F:5:5: could not find expected ':' (at 6:5) while scanning a simple key"]
    );
    let e = errors(&format!(
        "{up}routes:\n  - name: \"r\n    match: {{ path_prefix: / }}\n    upstream: api\n"
    ));
    assert_eq!(
        e,
        ["F:4:11: found unexpected end of stream (at 7:1) while scanning a quoted scalar"]
    );
    // A parser's context is the enclosing mapping: the error stays where it was found.
    let e = errors("upstreams:\n  api:\n    targets: [a]\n   timeout: 1s\nroutes: []\n");
    assert_eq!(
        e,
        ["F:4:4: did not find expected key while parsing a block mapping (begun at 2:3)"]
    );
    let e = errors(&format!(
        "{up}routes:\n  - name: r\n    match: {{ path_prefix: / }}\n  \tupstream: api\n"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("F:6:3: found character that cannot start any token: a tab"),
        "{e:?}"
    );
}

/// YAML's mapping keys are unique: a second `api:` upstream, `free:` plan, header match,
/// top-level section or route field is an error at the second key, not a silent replacement
/// of the first (nor an error at the file's 1:1).
#[test]
fn a_duplicate_mapping_key_is_an_error() {
    let up = "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n";
    for (yaml, at) in [
        (
            "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\n  api: { targets: [http://127.0.0.1:2] }\nroutes: []\n".to_owned(),
            "F:3:3: duplicate key `api`",
        ),
        (
            format!("{up}routes: []\nplans:\n  free: {{ limits: [{{ name: l, by: consumer, algorithm: gcra, rate: 1/s }}] }}\n  \"free\": {{ limits: [{{ name: l, by: consumer, algorithm: gcra, rate: 9/s }}] }}\n"),
            "F:6:3: duplicate key `free`",
        ),
        (
            format!("{up}routes:\n  - name: a\n    match: {{ path: /, headers: {{ X-Env: prod, X-Env: dev }} }}\n    upstream: api\n"),
            "F:5:47: duplicate key `X-Env`",
        ),
        (
            format!("{up}routes: []\nroutes:\n  - {{ name: a, match: {{ path: / }}, upstream: api }}\n"),
            "F:4:1: duplicate key `routes`",
        ),
        (
            format!("{up}routes:\n  - name: a\n    match: {{ path: / }}\n    name: b\n    upstream: api\n"),
            "F:6:5: duplicate key `name`",
        ),
    ] {
        let e = errors(&yaml);
        assert_eq!(e.len(), 1, "{yaml}: {e:?}");
        assert_eq!(e[0], at, "{yaml}");
    }
}

/// A file saved with a UTF-8 byte-order mark reads like one without, errors at the same
/// positions (the first key found by name, columns on line 1 not shifted by the mark).
#[test]
fn a_byte_order_mark_is_not_part_of_the_config() {
    let (code, _, err, _) = check(&format!("\u{feff}{OK}"));
    assert_eq!(code, 0, "{err}");
    let bad = "routes:\n  - name: r\n    match: { path_prefix: / }\n    upstream: nowhere\n    limits: [ { name: l, by: ip, algorithm: gcra, rate: 0/1m } ]\nupstreams: { api: { targets: [http://127.0.0.1:1] } }\n";
    let plain = errors(bad);
    assert_eq!(plain.len(), 2, "{plain:?}");
    assert!(plain[0].starts_with("F:4:5: unknown upstream"), "{plain:?}");
    assert_eq!(errors(&format!("\u{feff}{bad}")), plain);
    // A flow mapping on line 1: the column is the one an editor shows.
    let flow = "upstreams: { api: { targets: [http://127.0.0.1:1] } }\nroutes: [ { name: r, match: { path_prefix: / }, upstream: nope } ]\n";
    assert_eq!(errors(&format!("\u{feff}{flow}")), errors(flow));
}

/// A document nested deeper than any config is refused where it crosses the bound, before
/// the YAML parser spends time quadratic in its depth on it (80 000 levels took 19 s).
#[test]
fn deep_nesting_is_an_error_at_its_position() {
    for n in [65, 300, 80_000] {
        let e = errors(&format!("{OK}x: {}{}\n", "[".repeat(n), "]".repeat(n)));
        assert_eq!(e.len(), 1, "{n}: {e:?}");
        assert!(e[0].starts_with("F:12:"), "{n}: {e:?}");
        assert!(e[0].ends_with("nested deeper than 64 levels"), "{n}: {e:?}");
    }
}

/// An upstream target is `http(s)://HOST[:PORT]` with a real port: one out of range, empty or
/// 0 would pass the check and then fail every request with 502. A password in a target is
/// refused and never repeated.
#[test]
fn a_target_needs_a_real_port_and_no_password() {
    for (target, want) in [
        ("http://127.0.0.1:99999", "has no valid port"),
        ("http://127.0.0.1:", "has no valid port"),
        ("http://127.0.0.1:0", "has no valid port"),
        ("https://[::1]:65536", "has no valid port"),
        ("http://u:hunter2@127.0.0.1:8080", "with no path or user"),
    ] {
        let yaml = OK.replace("http://127.0.0.1:3000", &format!("'{target}'"));
        one_error(&yaml, "F:2:20: target `", want, "hunter2");
    }
    for target in [
        "http://127.0.0.1:65535",
        "https://[::1]:8443",
        "https://api.internal",
        "http://api.internal/",
    ] {
        passes(&OK.replace("http://127.0.0.1:3000", &format!("'{target}'")));
    }
}

/// A Redis node is `host:port`; credentials written into one are refused and not repeated.
#[test]
fn a_redis_node_is_host_and_port_only() {
    let with_node = |n: &str| {
        format!("store: {{ kind: redis, redis: {{ mode: sentinel, sentinel_service: m, nodes: ['{n}'] }} }}\n{OK}")
    };
    for n in [
        "user:hunter2@10.0.0.1:26379",
        "10.0.0.1:0",
        "10.0.0.1",
        "a/b:1",
    ] {
        let says = "must be host:port, with no user or password";
        one_error(&with_node(n), "F:1:", says, "hunter2");
    }
    passes(&with_node("sentinel-1:26379"));
}

/// A consumer key no request could carry (padded, or not visible ASCII: a request's key is
/// read trimmed and only as visible ASCII) is an error at its position, not a key that never
/// matches; the key itself is not echoed.
#[test]
fn a_consumer_key_no_request_can_carry_is_an_error() {
    let with_key = |k: &str| {
        format!("upstreams:\n  api: {{ targets: [http://127.0.0.1:1] }}\nroutes: []\nplans: {{ p: {{ limits: [{{ name: l, algorithm: gcra, rate: 1/s }}] }} }}\nconsumers:\n  - name: c\n    plan: p\n    keys: [ok-key, {k}]\n")
    };
    for k in [
        "' padded-SECRET '",
        "'tab-SECRET\t'",
        "\"k\\u00e9y-SECRET\"",
        "\"nl-SECRET\\n\"",
    ] {
        let says = "an API key must be visible ASCII";
        one_error(&with_key(k), "F:8:20: ", says, "SECRET");
    }
    passes(&with_key("'inner space'"));
    // A tab inside, as a header value may carry one.
    passes(&with_key("\"inner\\ttab\""));
}

/// An API key written as a scalar instead of a list is refused without being echoed.
#[test]
fn a_key_that_is_not_a_list_is_not_echoed() {
    let e = errors(
        "upstreams:\n  api: { targets: [http://127.0.0.1:1] }\nroutes: []\nplans: { p: { limits: [{ name: l, by: consumer, algorithm: gcra, rate: 1/s }] } }\nconsumers:\n  - name: c\n    plan: p\n    keys: SECRET-KEY-123\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("F:8:11: ") && e[0].contains("must be a list"),
        "{e:?}"
    );
    assert!(!e[0].contains("SECRET-KEY-123"), "{e:?}");
}

/// A cost naming an invalid field gets that one error, at the name.
#[test]
fn an_invalid_cost_header_is_one_error() {
    for field in ["header", "response_header"] {
        let yaml = OK.replace(
            "        rate: 5/1m\n",
            &format!("        rate: 5/1m\n        cost: {{ {field}: 'X Cost', max: 3 }}\n"),
        );
        let e = errors(&yaml);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("invalid header name `X Cost`"), "{e:?}");
    }
}

#[test]
fn yaml_syntax_error_has_a_position() {
    let e = errors("upstreams: {}\nroutes: [\n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("F:3:1: "), "{e:?}");
}

#[test]
fn every_semantic_error_is_reported_with_line_and_column() {
    let yaml = r#"listen: 0.0.0.0:99999
drain_timeout: 5 sec
client_ip:
  trusted_proxies: [10.0.0.0/33, 127.0.0.1]
upstreams:
  api:
    targets: [http://127.0.0.1:3000, "ftp://x"]
routes:
  - name: login
    match:
      path: /auth/login
    upstream: api
    limits:
      - name: per-ip
        by: ip
        algorithm: sliding_log
        rate: 5/1x
      - name: per-ip
        by: [ip, bogus]
        algorithm: fixed_window
        rate: 10/1m
        burst: 3
      - name: cost
        by: ip
        algorithm: gcra
        rate: 10/1m
        cost: { header: X-Cost }
      - name: big
        by: ip
        algorithm: sliding_log
        rate: 10001/1m
      - name: heavy
        by: ip
        algorithm: token_bucket
        rate: 10/1m
        cost: 11
      - name: wide
        by: ip
        algorithm: gcra
        rate: 10/1m
        cost: { header: X-Cost, max: 20 }
      - name: algo
        by: ip
        algorithm: leaky
        rate: 1/s
  - name: login
    match: { path_regex: "([a-z" }
    upstream: nope
  - name: Bad Name
    match: { path: /a, path_prefix: /b }
    upstream: api
"#;
    let e = errors(yaml);
    let expect = [
        "F:1:1: invalid listen address",
        "F:2:1: invalid duration `5 sec`",
        "F:4:21: invalid CIDR `10.0.0.0/33`",
        "F:7:38: target `ftp://x` must be http://HOST:PORT",
        "F:17:9: invalid rate `5/1x`",
        "F:18:9: duplicate limit name `per-ip`",
        "F:19:9: unknown key `bogus` in `by`",
        "F:22:9: `burst` applies to token_bucket, leaky_bucket and gcra, not fixed_window",
        "F:27:9: a header cost needs `max`",
        "F:31:9: sliding_log keeps one entry per admitted unit: at most 10000 per window",
        "F:36:9: cost 11 must be from 1 to the limit's capacity 10",
        "F:41:33: cost max 20 must be from 1 to the limit's capacity 10",
        "F:44:9: unknown algorithm `leaky`",
        "F:46:5: duplicate route name `login`",
        "F:47:14: invalid regex",
        "F:48:5: unknown upstream `nope`",
        "F:49:5: route name `Bad Name` must be non-empty [a-z0-9_-]",
        "F:50:5: match needs exactly one of `path`, `path_prefix`, `path_regex`",
    ];
    for (i, want) in expect.iter().enumerate() {
        assert!(
            e.get(i).is_some_and(|got| got.starts_with(want)),
            "error {i}: want `{want}…`, got {:?}\nall: {e:#?}",
            e.get(i)
        );
    }
    assert_eq!(e.len(), expect.len(), "{e:#?}");
}

#[test]
fn a_redis_url_the_client_cannot_parse_is_an_error_at_its_position() {
    // Starts with redis:// (the cheap check passes), but the Redis client refuses it: caught
    // at load, not when the gateway creates its client.
    let yaml = r#"store:
  kind: redis
  redis:
    url: "redis://app:secret@127.0.0.1:notaport/0"
upstreams:
  api: { targets: [http://127.0.0.1:3000] }
routes:
  - { name: r, match: { path_prefix: / }, upstream: api }
"#;
    let e = errors(yaml);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].starts_with("F:4:5: not a valid Redis URL"), "{e:#?}");
    assert!(!e[0].contains("secret"), "password in an error: {}", e[0]);
}

#[test]
fn parameters_beyond_exact_arithmetic_are_rejected_but_the_spec_range_is_accepted() {
    // Every N up to 10^7 with any window from 1 s to 366 d is accepted, for every algorithm
    // (sliding_window up to N·W < 2^53 ms: 10^7 per 7 d, 10^5 per 366 d).
    for algo in [
        "fixed_window",
        "sliding_window",
        "token_bucket",
        "leaky_bucket",
        "gcra",
    ] {
        let long = if algo == "sliding_window" {
            "100000/366d"
        } else {
            "10000000/366d"
        };
        for rate in ["10000000/1s", "10000000/7d", "1/366d", "1/1s", long] {
            let y = OK.replace("sliding_log", algo).replace("5/1m", rate);
            let (code, _, err, _) = check(&y);
            assert_eq!(code, 0, "{algo} {rate}: {err}");
        }
    }
    // A burst whose capacity·interval reaches 2^53 cannot be decided exactly.
    let y = OK
        .replace("sliding_log", "gcra")
        .replace("5/1m", "1/7d\n        burst: 100000000");
    let e = errors(&y);
    assert!(e[0].starts_with("F:12:9: parameters too large"), "{e:?}");
    // Windows outside 1 s..366 d.
    let e = errors(&OK.replace("5/1m", "5/500ms"));
    assert!(
        e[0].starts_with("F:11:9: window must be at least 1s"),
        "{e:?}"
    );
    let e = errors(&OK.replace("5/1m", "5/367d"));
    assert!(
        e[0].starts_with("F:11:9: window must be at least 1s"),
        "{e:?}"
    );
}

#[test]
fn non_loopback_admin_needs_a_token() {
    let e = errors(&format!("admin_listen: 0.0.0.0:9090\n{OK}"));
    assert!(
        e[0].starts_with("F:1:1: admin_listen `0.0.0.0:9090` is not a loopback address"),
        "{e:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, format!("admin_listen: 0.0.0.0:9090\n{OK}")).unwrap();
    let out = Command::new(support::sluice_bin())
        .arg("check")
        .arg("-c")
        .arg(&path)
        .env("SLUICE_ADMIN_TOKEN", "t")
        .output()
        .unwrap();
    assert!(out.status.success());
    // A token no `Authorization: Bearer` header can carry would lock the API for good: it is
    // refused. Around it, whitespace (a mounted secret's newline) is not part of it.
    for (token, ok) in [
        ("t t", false),
        ("t\u{e9}", false),
        ("t\x01", false),
        (" t\n", true),
    ] {
        let out = Command::new(support::sluice_bin())
            .arg("check")
            .arg("-c")
            .arg(&path)
            .env("SLUICE_ADMIN_TOKEN", token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), ok, "{token:?}: {err}");
        if !ok {
            assert!(
                err.contains(":1:1: SLUICE_ADMIN_TOKEN holds a space"),
                "{err}"
            );
        }
    }
}

/// The admin API and every listener need ports of their own. Without this check a gateway
/// on Redis that is down binds `admin_listen` first, answers 404 on the shared port while it
/// waits for the store, and then fails to bind the data listener.
#[test]
fn listeners_sharing_a_port_are_an_error() {
    let e = errors(&format!(
        "listen: 0.0.0.0:9090\nadmin_listen: 127.0.0.1:9090\n{OK}"
    ));
    assert!(
        e[0].starts_with(
            "F:2:1: admin_listen `127.0.0.1:9090` takes the port of listen `0.0.0.0:9090`"
        ),
        "{e:?}"
    );
    let list = "listen:\n  - address: 127.0.0.1:8081\n  - address: \"[::]:8081\"\n  \
                - address: 127.0.0.1:8082\nadmin_listen: 127.0.0.1:8082\n";
    let e = errors(&format!("{list}{OK}"));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with(
            "F:3:5: two listeners on one port: `[::]:8081` and listen[0] `127.0.0.1:8081`"
        ),
        "{e:?}"
    );
    assert!(
        e[1].starts_with(
            "F:5:1: admin_listen `127.0.0.1:8082` takes the port of listen[2] `127.0.0.1:8082`"
        ),
        "{e:?}"
    );
    // Unreadable addresses are reported as such, and not also as sharing a port.
    let e = errors(&format!(
        "listen:\n  - address: nope\n  - address: alsonope\nadmin_listen: 127.0.0.1:8080\n{OK}"
    ));
    assert!(
        e.iter().all(|l| l.contains("invalid listen address")) && e.len() == 2,
        "{e:?}"
    );
    // Different addresses on one port, and one address on different ports, are fine.
    let ok = format!(
        "listen:\n  - address: 127.0.0.1:8081\n  - address: 127.0.0.2:8081\n\
         admin_listen: \"[::1]:8081\"\n{OK}"
    );
    let (code, _, err, _) = check(&ok);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn missing_file_is_an_error() {
    let out = Command::new(support::sluice_bin())
        .args(["check", "-c", "/nonexistent/sluice.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("/nonexistent/sluice.yaml:1:1: cannot read config"));
}

/// A route no request can reach, because a route before it matches every request it would,
/// loads (as nginx and Envoy load it) but `check` says so at its `match`, naming the route
/// that takes its requests: its limits would never apply, and nothing else would tell.
#[test]
fn a_route_an_earlier_one_shadows_is_a_warning_at_its_match() {
    let yaml = "upstreams:
  api: { targets: [http://127.0.0.1:3000] }
routes:
  - name: all
    match: { path_prefix: / }
    upstream: api
  - name: login
    match: { path: /auth/login, methods: [POST] }
    upstream: api
    limits: [ { name: per-ip, by: ip, algorithm: sliding_log, rate: 5/1m } ]
  - name: admin-host
    match: { path_prefix: /, host: admin.example.com }
    upstream: api
";
    let (code, out, err, path) = check(yaml);
    assert_eq!(code, 0, "a warning does not fail the check: {err}");
    assert!(out.contains("routes 3"), "{out}");
    let warnings: Vec<String> = err.lines().map(|l| l.replacen(&path, "F", 1)).collect();
    assert_eq!(
        warnings,
        [
            "F:8:5: warning: route `login` is never reached: route `all` before it matches every request it would (the first match wins), so its limits never apply",
            "F:12:5: warning: route `admin-host` is never reached: route `all` before it matches every request it would (the first match wins)",
        ],
        "{err}"
    );
    // In the other order, every route is reachable.
    let all = "  - name: all\n    match: { path_prefix: / }\n    upstream: api\n";
    let reordered = format!("{}{all}", yaml.replacen(all, "", 1));
    let (code, _, err, _) = check(&reordered);
    assert_eq!(code, 0);
    assert!(!err.contains("warning"), "{err}");
}

/// `methods: []` would match no request (and the route shadow check would blame the route
/// before it): an error at it.
#[test]
fn an_empty_method_list_is_an_error() {
    one_error(
        &OK.replace("methods: [POST]", "methods: []"),
        "F:5:",
        "`methods: []` matches no request: leave `methods` out for every method",
        "no-secret-here",
    );
}
