//! `/metrics` after known traffic through the real binary: every family of SPEC §5 with its
//! type and label names, and counters that moved by exactly the traffic sent.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use http::Method;
use support::*;

/// Every family of SPEC §5 and the two sluice adds (certificate expiry, connections per
/// worker): name, `# TYPE`, label names (without `le`).
const FAMILIES: &[(&str, &str, &[&str])] = &[
    ("sluice_requests_total", "counter", &["route", "outcome"]),
    (
        "sluice_limit_decisions_total",
        "counter",
        &["route", "limit", "decision"],
    ),
    ("sluice_request_duration_seconds", "histogram", &["route"]),
    (
        "sluice_upstream_duration_seconds",
        "histogram",
        &["route", "status_class"],
    ),
    ("sluice_store_duration_seconds", "histogram", &["store"]),
    ("sluice_store_errors_total", "counter", &["kind"]),
    ("sluice_inflight_requests", "gauge", &["route"]),
    ("sluice_config_reloads_total", "counter", &["result"]),
    ("sluice_config_info", "gauge", &["version"]),
    (
        "sluice_tls_certificate_expiry_timestamp_seconds",
        "gauge",
        &["listener", "cert"],
    ),
    ("sluice_connections_open", "gauge", &["worker"]),
];

/// A live upstream, a dead one (nothing listens), a keyed route that rejects requests
/// without a key, and a route with an enforced and a shadow limit.
/// A TLS listener beside the cleartext one exports the certificate gauge.
fn config(up: &Upstream) -> String {
    static CERT: std::sync::OnceLock<(tempfile::TempDir, support::certs::Pair)> =
        std::sync::OnceLock::new();
    let (_, pair) = CERT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let pair = support::certs::Ca::new("test CA").leaf(dir.path(), "api", &["localhost"], 90);
        (dir, pair)
    });
    format!(
        "{}client_ip: {{ trusted_proxies: [127.0.0.1/32] }}
upstreams:
  up: {{ targets: [{}] }}
  dead: {{ targets: [http://127.0.0.1:{}], connect_timeout: 1s }}
routes:
  - name: keyed
    match: {{ path_prefix: /keyed }}
    upstream: up
    limits:
      - {{ name: per-key, by: api_key, algorithm: gcra, rate: 100/1m, on_missing: reject }}
  - name: guarded
    match: {{ path_prefix: /guarded }}
    upstream: up
    limits:
      - {{ name: enforced, by: ip, algorithm: sliding_log, rate: 2/1m }}
      - {{ name: watch, by: ip, algorithm: token_bucket, rate: 1/1m, shadow: true }}
  - name: dead
    match: {{ path_prefix: /dead }}
    upstream: dead
  - name: plain
    match: {{ path_prefix: /plain }}
    upstream: up
    strip_prefix: true
",
        support::certs::listen_with_tls(pair),
        up.url(),
        free_port()
    )
}

/// Label names of the samples of `family` (for a histogram, of its `_bucket`s minus `le`).
fn label_names(text: &str, family: &str, kind: &str) -> BTreeSet<BTreeSet<String>> {
    let sample = if kind == "histogram" {
        format!("{family}_bucket{{")
    } else {
        format!("{family}{{")
    };
    text.lines()
        .filter_map(|l| l.strip_prefix(&sample))
        .map(|rest| {
            let labels = &rest[..rest.rfind('}').unwrap()];
            labels
                .split("\",")
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, _)| k.trim_start_matches(',').to_string())
                .filter(|k| k != "le")
                .collect()
        })
        .collect()
}

fn assert_families(text: &str) {
    for (family, kind, labels) in FAMILIES {
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "no `# TYPE {family} {kind}`:\n{text}"
        );
        let want: BTreeSet<String> = labels.iter().map(|s| s.to_string()).collect();
        let seen = label_names(text, family, kind);
        assert_eq!(
            seen,
            BTreeSet::from([want]),
            "{family}: label names of every sample"
        );
    }
    let ours: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let spec: BTreeSet<&str> = FAMILIES.iter().map(|f| f.0).collect();
    assert_eq!(ours, spec, "exactly the spec's families");
}

#[tokio::test]
async fn series_exist_at_zero_before_any_traffic() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up));
    let c = client();
    let m = s.metrics(&c).await;
    for kind in ["timeout", "connection", "script", "breaker_open"] {
        assert!(
            m.contains(&format!("sluice_store_errors_total{{kind=\"{kind}\"}} 0\n")),
            "{kind}:\n{m}"
        );
    }
    for result in ["success", "error"] {
        assert!(m.contains(&format!(
            "sluice_config_reloads_total{{result=\"{result}\"}} 0\n"
        )));
    }
    assert!(m.contains("sluice_requests_total{outcome=\"no_route\",route=\"_none\"} 0\n"));
    for outcome in [
        "forwarded",
        "limited",
        "store_error_allowed",
        "upstream_error",
    ] {
        assert!(
            m.contains(&format!(
                "sluice_requests_total{{outcome=\"{outcome}\",route=\"guarded\"}} 0\n"
            )),
            "{outcome}:\n{m}"
        );
    }
    assert!(m.contains(
        "sluice_limit_decisions_total{decision=\"shadow_limited\",limit=\"watch\",route=\"guarded\"} 0\n"
    ));
    assert!(m.contains("sluice_inflight_requests{route=\"plain\"} 0\n"));
}

#[tokio::test]
async fn outcomes_durations_and_decisions_count_exactly() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up));
    let c = client();

    for _ in 0..3 {
        assert_eq!(get(&c, &s.url("/plain/a"), &[]).await.status, 200);
    }
    // The upstream's own 404 and 502: forwarded, and upstream_error (SPEC §5).
    assert_eq!(get(&c, &s.url("/plain/status/404"), &[]).await.status, 404);
    assert_eq!(get(&c, &s.url("/plain/status/502"), &[]).await.status, 502);
    for _ in 0..2 {
        assert_eq!(get(&c, &s.url("/nowhere"), &[]).await.status, 404);
    }
    assert_eq!(get(&c, &s.url("/dead"), &[]).await.status, 502);
    let key = [("x-api-key", "sekrit-api-key-77")];
    for _ in 0..2 {
        assert_eq!(get(&c, &s.url("/keyed"), &key).await.status, 200);
    }
    assert_eq!(get(&c, &s.url("/keyed"), &[]).await.status, 401);

    let m = s.metrics(&c).await;
    assert_families(&m);
    let req = |route, outcome| {
        metric(
            &m,
            "sluice_requests_total",
            &[("route", route), ("outcome", outcome)],
        )
    };
    assert_eq!(req("plain", "forwarded"), 4.0);
    assert_eq!(req("plain", "upstream_error"), 1.0);
    assert_eq!(req("_none", "no_route"), 2.0);
    assert_eq!(req("dead", "upstream_error"), 1.0);
    assert_eq!(req("dead", "forwarded"), 0.0);
    assert_eq!(req("keyed", "forwarded"), 2.0);
    assert_eq!(req("keyed", "rejected_identity"), 1.0);
    let total: f64 = m
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert_eq!(total, 11.0, "one outcome per request");

    let count = |route| {
        metric(
            &m,
            "sluice_request_duration_seconds_count",
            &[("route", route)],
        )
    };
    assert_eq!(
        (
            count("plain"),
            count("_none"),
            count("dead"),
            count("keyed")
        ),
        (5.0, 2.0, 1.0, 3.0)
    );
    let up_count = |route, class| {
        metric(
            &m,
            "sluice_upstream_duration_seconds_count",
            &[("route", route), ("status_class", class)],
        )
    };
    assert_eq!(up_count("plain", "2xx"), 3.0);
    assert_eq!(up_count("plain", "4xx"), 1.0);
    assert_eq!(up_count("plain", "5xx"), 1.0);
    assert_eq!(up_count("dead", "error"), 1.0);
    assert_eq!(
        up_count("keyed", "2xx"),
        2.0,
        "rejected requests never go upstream"
    );
    // The bucket series is cumulative and ends at +Inf = count.
    assert_eq!(
        metric(
            &m,
            "sluice_request_duration_seconds_bucket",
            &[("route", "plain"), ("le", "+Inf")]
        ),
        5.0
    );

    // The 401 never reached the store: two decisions, two store round trips.
    let dec = |d| {
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[("route", "keyed"), ("limit", "per-key"), ("decision", d)],
        )
    };
    assert_eq!(
        (dec("allowed"), dec("limited"), dec("error")),
        (2.0, 0.0, 0.0)
    );
    assert_eq!(
        metric(
            &m,
            "sluice_store_duration_seconds_count",
            &[("store", "memory")]
        ),
        2.0
    );
    assert_eq!(
        metric(&m, "sluice_store_errors_total", &[("kind", "timeout")]),
        0.0
    );
    for route in ["plain", "keyed", "dead", "guarded"] {
        assert_eq!(
            metric(&m, "sluice_inflight_requests", &[("route", route)]),
            0.0
        );
    }
    assert!(!m.contains("sekrit-api-key-77"), "identities never appear");
    // The client's address never appears (the TLS gauge's `listener` is the gateway's own).
    assert!(
        !m.lines()
            .filter(|l| !l.starts_with("sluice_tls_certificate_expiry_timestamp_seconds{"))
            .any(|l| l.contains("127.0.0.1")),
        "identities never appear"
    );
}

#[tokio::test]
async fn reloads_count_and_config_info_follows_the_version() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up));
    let c = client();
    let v1 = s.config_version();
    let m = s.metrics(&c).await;
    assert_eq!(metric(&m, "sluice_config_info", &[("version", &v1)]), 1.0);
    assert_eq!(m.matches("\nsluice_config_info{").count(), 1);

    // The file watcher sees the change first; wait for it, then reload by hand too.
    s.replace_config(&config(&up).replace("name: plain", "name: plain2"));
    let v2 = s.config_version();
    let reloads = |m: &str, result| metric(m, "sluice_config_reloads_total", &[("result", result)]);
    let seen = eventually(Duration::from_secs(10), || {
        let (c, s) = (c.clone(), &s);
        async move { reloads(&s.metrics(&c).await, "success") == 1.0 }
    })
    .await;
    assert!(seen, "file reload not counted:\n{}", s.log());
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.metrics(&c).await;
    assert_eq!((reloads(&m, "success"), reloads(&m, "error")), (2.0, 0.0));
    assert_eq!(metric(&m, "sluice_config_info", &[("version", &v2)]), 1.0);
    assert!(
        !m.contains(&v1),
        "the old version's series is removed:\n{m}"
    );
    assert_eq!(m.matches("\nsluice_config_info{").count(), 1);
    // The removed route's series are gone, the new route's exist at zero.
    assert!(!m.contains("route=\"plain\""), "{m}");
    assert!(m.contains("sluice_requests_total{outcome=\"forwarded\",route=\"plain2\"} 0\n"));

    // A bad file: counted once by the watcher, once more by hand; nothing else moves.
    s.replace_config("routes: [oops\n");
    let seen = eventually(Duration::from_secs(10), || {
        let (c, s) = (c.clone(), &s);
        async move { reloads(&s.metrics(&c).await, "error") == 1.0 }
    })
    .await;
    assert!(seen, "failed file reload not counted:\n{}", s.log());
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 400);
    // A file event with unchanged content is not a reload.
    let same = std::fs::read(&s.config_path).unwrap();
    std::fs::write(&s.config_path, same).unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let m = s.metrics(&c).await;
    assert_eq!((reloads(&m, "success"), reloads(&m, "error")), (2.0, 2.0));
    assert_eq!(metric(&m, "sluice_config_info", &[("version", &v2)]), 1.0);
    assert_eq!(m.matches("\nsluice_config_info{").count(), 1);
}

/// A reload that keeps a limit's name but changes what it settles (charged by the answer
/// becomes a plain limit, a concurrency limit becomes a window) drops the series it no
/// longer has; a new kind's series appears at zero.
#[tokio::test]
async fn a_limit_that_changes_kind_keeps_no_stale_series() {
    let up = Upstream::start();
    let yaml = |a: &str, b: &str| {
        format!(
            "upstreams: {{ up: {{ targets: [{}] }} }}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n      - {{ name: a, by: ip, {a} }}\n      - {{ name: b, by: ip, {b} }}\n",
            up.url()
        )
    };
    let charged = "algorithm: fixed_window, rate: 100/1m, count_when: { status: [5xx] }";
    let slots = "algorithm: concurrency, max: 5";
    let plain = "algorithm: fixed_window, rate: 100/1m";
    let s = Sluice::start(&yaml(charged, slots));
    let c = client();
    let m = s.metrics(&c).await;
    let series = |m: &str, name: &str, limit: &str| {
        m.lines()
            .any(|l| l.starts_with(name) && l.contains(&format!("limit=\"{limit}\"")))
    };
    assert!(series(&m, "sluice_limit_charged_total", "a"), "{m}");
    assert!(series(&m, "sluice_limit_inflight", "b"), "{m}");

    s.replace_config(&yaml(plain, plain));
    let v = s.config_version();
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.metrics(&c).await;
    assert_eq!(metric(&m, "sluice_config_info", &[("version", &v)]), 1.0);
    assert!(!series(&m, "sluice_limit_charged_total", "a"), "{m}");
    assert!(!series(&m, "sluice_limit_inflight", "b"), "{m}");
    assert!(series(&m, "sluice_limit_decisions_total", "a"), "{m}");

    // And the other way round: the new kinds' series exist again.
    s.replace_config(&yaml(slots, charged));
    let r = send(&c, Method::POST, &s.admin_url("/admin/reload"), &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.metrics(&c).await;
    assert!(series(&m, "sluice_limit_inflight", "a"), "{m}");
    assert!(series(&m, "sluice_limit_charged_total", "b"), "{m}");
    assert!(!series(&m, "sluice_limit_charged_total", "a"), "{m}");
    assert!(!series(&m, "sluice_limit_inflight", "b"), "{m}");
}

#[tokio::test]
async fn inflight_is_released_when_the_client_goes_away() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up));
    let c = client();
    let inflight = |m: &str| metric(m, "sluice_inflight_requests", &[("route", "plain")]);

    let mut conn = std::net::TcpStream::connect(s.addr).unwrap();
    conn.write_all(b"GET /plain/slow?ms=8000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let up_now = eventually(Duration::from_secs(5), || {
        let (c, s) = (c.clone(), &s);
        async move { inflight(&s.metrics(&c).await) == 1.0 }
    })
    .await;
    assert!(up_now, "the slow request is not in flight");
    drop(conn);
    // Long before the upstream would answer (8 s), the gauge is back to zero.
    let released = eventually(Duration::from_secs(3), || {
        let (c, s) = (c.clone(), &s);
        async move { inflight(&s.metrics(&c).await) == 0.0 }
    })
    .await;
    assert!(
        released,
        "sluice_inflight_requests stuck after a client disconnect"
    );
}

// ---- Below: these need the real embedded store (a limit of N admits N, then 429). ----

#[tokio::test]
async fn limited_and_shadow_limited_requests_count_exactly() {
    let up = Upstream::start();
    let s = Sluice::start(&config(&up));
    let c = client();
    let ip = [("x-forwarded-for", "198.51.100.20")];
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(&c, &s.url("/guarded"), &ip).await.status.as_u16());
    }
    // 1: both admit. 2: enforced admits, shadow refuses (forwarded anyway).
    // 3, 4: enforced refuses (nothing charged), shadow still refuses.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let m = s.metrics(&c).await;
    assert_families(&m);
    let req = |outcome| {
        metric(
            &m,
            "sluice_requests_total",
            &[("route", "guarded"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (req("forwarded"), req("shadow_limited"), req("limited")),
        (1.0, 1.0, 2.0)
    );
    let dec = |limit, d| {
        metric(
            &m,
            "sluice_limit_decisions_total",
            &[("route", "guarded"), ("limit", limit), ("decision", d)],
        )
    };
    assert_eq!(
        (dec("enforced", "allowed"), dec("enforced", "limited")),
        (2.0, 2.0)
    );
    assert_eq!(dec("enforced", "shadow_limited"), 0.0);
    assert_eq!(
        (
            dec("watch", "allowed"),
            dec("watch", "shadow_limited"),
            dec("watch", "limited")
        ),
        (1.0, 3.0, 0.0)
    );
    assert_eq!(
        metric(
            &m,
            "sluice_request_duration_seconds_count",
            &[("route", "guarded")]
        ),
        4.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_upstream_duration_seconds_count",
            &[("route", "guarded"), ("status_class", "2xx")]
        ),
        2.0,
        "limited requests never go upstream"
    );
    assert_eq!(
        metric(
            &m,
            "sluice_store_duration_seconds_count",
            &[("store", "memory")]
        ),
        4.0,
        "one store round trip per request, whatever its limits"
    );
}
