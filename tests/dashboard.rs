//! dashboards/sluice.json against reality: a real Prometheus scrapes a real sluice under
//! traffic (forwarded, 429, shadow-limited, 404, 502), then every panel query and every
//! variable query of the dashboard is evaluated through Prometheus's HTTP API and must
//! return data — and the panels about that traffic must show it.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::Value;
use support::*;

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/sluice.json");

/// The metric families of SPEC §5 and the labels that the dashboard variables filter on.
const FAMILIES: &[(&str, &[&str])] = &[
    ("sluice_requests_total", &["route"]),
    ("sluice_limit_decisions_total", &["route", "limit"]),
    ("sluice_request_duration_seconds", &["route"]),
    ("sluice_upstream_duration_seconds", &["route"]),
    ("sluice_store_duration_seconds", &[]),
    ("sluice_store_errors_total", &[]),
    ("sluice_inflight_requests", &["route"]),
    ("sluice_config_reloads_total", &[]),
    ("sluice_config_info", &[]),
    ("sluice_tls_certificate_expiry_timestamp_seconds", &[]),
    ("sluice_plan_requests_total", &["plan"]),
    ("sluice_limit_charged_total", &["route", "limit"]),
    ("sluice_limit_inflight", &["route", "limit"]),
    ("sluice_connections_open", &[]),
];

fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("dashboards/sluice.json");
    serde_json::from_str(&text).expect("dashboards/sluice.json is JSON")
}

/// Every non-row panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

fn exprs(p: &Value) -> Vec<&str> {
    p["targets"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| t["expr"].as_str().unwrap_or(""))
                .collect()
        })
        .unwrap_or_default()
}

/// What Grafana would send with every variable at "All" (a rate window wide enough to hold
/// the zero samples scraped before the traffic started).
fn substitute(expr: &str) -> String {
    expr.replace("${route}", ".*")
        .replace("$route", ".*")
        .replace("${limit}", ".*")
        .replace("$limit", ".*")
        .replace("${plan}", ".*")
        .replace("$plan", ".*")
        .replace("$__rate_interval", "30s")
        .replace("$__interval", "5s")
        .replace("$__range", "5m")
}

#[test]
fn dashboard_is_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "sluice-overview");
    let vars = d["templating"]["list"].as_array().expect("templating");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["route", "limit"] {
        let v = var(name);
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["includeAll"], true, "{name}");
        assert_eq!(v["multi"], true, "{name}");
        assert_eq!(v["allValue"], ".*", "{name}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "{name}");
    }

    let family_of = Regex::new(r"\b(sluice_[a-z_]+?)(_bucket|_sum|_count)?\b").unwrap();
    let selector = Regex::new(r"(sluice_[a-z_]+)(\{[^}]*\})?").unwrap();
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().expect("title");
        assert!(titles.insert(title), "duplicate title {title}");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id in {title}"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && g["h"].as_u64().unwrap() > 0,
            "{title}: gridPos {g}"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
        for e in exprs(p) {
            assert!(!e.trim().is_empty(), "{title}: empty expr");
            for m in family_of.captures_iter(e) {
                let fam = &m[1];
                assert!(
                    FAMILIES.iter().any(|(f, _)| *f == fam),
                    "{title}: `{fam}` is not a sluice metric (typo?) in {e}"
                );
            }
            // Every selector honours the dashboard's route and limit variables.
            for s in selector.captures_iter(e) {
                let name = &s[1];
                let fam = family_of.captures(name).unwrap()[1].to_string();
                let labels = FAMILIES.iter().find(|(f, _)| *f == fam).unwrap().1;
                let sel = s.get(2).map_or("", |m| m.as_str());
                for l in labels {
                    assert!(
                        sel.contains(&format!("{l}=~\"${l}\"")),
                        "{title}: {name} is not filtered by ${l}: {e}"
                    );
                }
            }
        }
    }
    for required in REQUIRED_PANELS {
        assert!(titles.contains(required), "missing panel {required}");
    }
}

/// The panels the dashboard must have (SPEC §8 and the issue).
const REQUIRED_PANELS: &[&str] = &[
    "Requests per second by route and outcome",
    "429s per second by route",
    "429s per second by route and limit",
    "429 ratio by route",
    "429 ratio by route and limit",
    "Shadow-limited per second by route and limit",
    "Gateway latency p50 / p95 / p99",
    "Upstream latency p50 / p95 / p99 by status class",
    "Store latency p50 / p99",
    "Store errors per second by kind",
    "Circuit breaker open (calls skipped)",
    "Store failures: fail-open / fail-closed",
    "Config reloads",
    "In-flight requests by route",
    "Config version",
    "TLS certificates: days left",
    "Plan requests per second by plan and outcome",
    "Plan 429s per second by plan limit",
    "Plan limit decisions with room per second",
];

/// A real Prometheus on a temp dir, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: std::net::SocketAddr) -> Prometheus {
        let bin = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("prometheus is not installed (this test runs a real one): apt-get install -y prometheus")
            });
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}
scrape_configs:
  - job_name: sluice
    static_configs: [{{ targets: ['{target}'] }}]
"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn prometheus");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn api(&self, c: &HttpClient, path_and_query: &str) -> Value {
        let r = get(c, &format!("{}{path_and_query}", self.url), &[]).await;
        let doc = r.json();
        assert_eq!(doc["status"], "success", "{path_and_query}: {doc}");
        doc["data"].clone()
    }

    /// An instant query's result vector.
    async fn query(&self, c: &HttpClient, q: &str) -> Vec<Value> {
        let data = self
            .api(c, &format!("/api/v1/query?query={}", enc(q)))
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encode for a query string.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn value(series: &Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn matches(series: &Value, labels: &[(&str, &str)]) -> bool {
    labels
        .iter()
        .all(|(k, v)| series["metric"][*k].as_str() == Some(*v))
}

/// Per panel title: series (by labels) that its queries must return.
type Expectations<'a> = Vec<(&'a str, Vec<(Vec<(&'a str, &'a str)>, Want)>)>;

#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// A series with these labels exists.
    Present,
    /// A series with these labels has a finite value above zero.
    Positive,
}

/// `tls`: a certificate pair for the TLS listener beside the cleartext one.
fn sluice_config(up: &Upstream, tls: &support::certs::Pair) -> String {
    format!(
        "{}client_ip: {{ trusted_proxies: [127.0.0.1/32] }}
upstreams:
  up: {{ targets: [{}] }}
  dead: {{ targets: [http://127.0.0.1:{}], connect_timeout: 1s }}
routes:
  - name: limited
    match: {{ path_prefix: /limited }}
    upstream: up
    limits:
      - {{ name: per-ip, by: ip, algorithm: sliding_log, rate: 3/1m }}
      - {{ name: shadow, by: ip, algorithm: token_bucket, rate: 1/1m, shadow: true }}
  - name: dead
    match: {{ path_prefix: /dead }}
    upstream: dead
  - name: plain
    match: {{ path_prefix: /plain }}
    upstream: up
  - name: charged
    match: {{ path_prefix: /charged }}
    upstream: up
    limits:
      - {{ name: answers, by: ip, algorithm: gcra, rate: 1000/1m, count_when: {{ status: [2xx] }} }}
  - name: held
    match: {{ path_prefix: /slow }}
    upstream: up
    limits:
      - {{ name: in-flight, by: ip, algorithm: concurrency, max: 4 }}
  - name: sold
    match: {{ path_prefix: /sold }}
    upstream: up
    consumers: required
plans:
  starter:
    limits:
      - {{ name: per-minute, algorithm: sliding_log, rate: 2/1m }}
consumers:
  - {{ name: shop, plan: starter, keys: [shop-key] }}
",
        support::certs::listen_with_tls(tls),
        up.url(),
        free_port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_data_from_a_real_prometheus() {
    let d = dashboard();
    let up = Upstream::start();
    let certs = tempfile::tempdir().unwrap();
    let pair = support::certs::Ca::new("test CA").leaf(certs.path(), "api", &["localhost"], 90);
    let s = Sluice::start(&sluice_config(&up, &pair));
    let prom = Prometheus::start(s.admin);
    let c = client();

    // Prometheus up and scraping sluice before any traffic: the counters' zero samples are
    // what rate() needs to see the traffic's increase.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = c
            .get(format!("{}/-/ready", prom.url).parse().unwrap())
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            let up = prom.query(&c, "up{job=\"sluice\"} == 1").await;
            if !up.is_empty() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus not scraping sluice:\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Traffic for 6 s: forwarded, limited (after 3) and shadow-limited, 404, 502, charged by
    // the answer; and one request holding a concurrency slot through it all.
    let _held = tokio::spawn({
        let (c, url) = (c.clone(), s.url("/slow?ms=20000"));
        async move { get(&c, &url, &[]).await.status.as_u16() }
    });
    let ip = [("x-forwarded-for", "198.51.100.77")];
    let mut seen = BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        for (path, headers) in [
            ("/sold", &[("x-api-key", "shop-key")][..]),
            ("/limited", &ip[..]),
            ("/plain", &[][..]),
            ("/charged", &[][..]),
            ("/nowhere", &[][..]),
            ("/dead", &[][..]),
        ] {
            let st = get(&c, &s.url(path), headers).await.status.as_u16();
            seen.insert((path, st));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for want in [
        ("/plain", 200),
        ("/nowhere", 404),
        ("/dead", 502),
        ("/limited", 200),
    ] {
        assert!(seen.contains(&want), "{want:?} not produced: {seen:?}");
    }
    // A few more scrapes after the traffic (the held request is still in flight).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let version = s.config_version();
    use Want::*;
    let expectations: Expectations = vec![
        (
            "Requests per second by route and outcome",
            vec![
                (vec![("route", "plain"), ("outcome", "forwarded")], Positive),
                (vec![("route", "_none"), ("outcome", "no_route")], Positive),
                (
                    vec![("route", "dead"), ("outcome", "upstream_error")],
                    Positive,
                ),
                (vec![("route", "limited"), ("outcome", "limited")], Positive),
                (
                    vec![("route", "limited"), ("outcome", "shadow_limited")],
                    Positive,
                ),
            ],
        ),
        (
            "429s per second by route",
            vec![(vec![("route", "limited")], Positive)],
        ),
        (
            "429s per second by route and limit",
            vec![(vec![("route", "limited"), ("limit", "per-ip")], Positive)],
        ),
        (
            "429 ratio by route",
            vec![(vec![("route", "limited")], Positive)],
        ),
        (
            "429 ratio by route and limit",
            vec![(vec![("route", "limited"), ("limit", "per-ip")], Positive)],
        ),
        (
            "Shadow-limited per second by route and limit",
            vec![(vec![("route", "limited"), ("limit", "shadow")], Positive)],
        ),
        ("Gateway latency p50 / p95 / p99", vec![(vec![], Positive)]),
        (
            "Upstream latency p50 / p95 / p99 by status class",
            vec![
                (vec![("status_class", "2xx")], Positive),
                (vec![("status_class", "error")], Positive),
            ],
        ),
        (
            "Store latency p50 / p99",
            vec![(vec![("store", "memory")], Positive)],
        ),
        (
            "Store errors per second by kind",
            vec![
                (vec![("kind", "timeout")], Present),
                (vec![("kind", "breaker_open")], Present),
            ],
        ),
        (
            "Circuit breaker open (calls skipped)",
            vec![(vec![], Present)],
        ),
        (
            "Store failures: fail-open / fail-closed",
            vec![(vec![], Present)],
        ),
        (
            "Config reloads",
            vec![
                (vec![("result", "success")], Present),
                (vec![("result", "error")], Present),
            ],
        ),
        (
            "In-flight requests by route",
            vec![
                (vec![("route", "limited")], Present),
                (vec![("route", "plain")], Present),
            ],
        ),
        (
            "Config version",
            vec![(vec![("version", version.as_str())], Present)],
        ),
        (
            "Units charged by the answer per second by route and limit",
            vec![(vec![("route", "charged"), ("limit", "answers")], Positive)],
        ),
        (
            "Concurrency slots held by route and limit",
            vec![(vec![("route", "held"), ("limit", "in-flight")], Positive)],
        ),
        (
            "TLS certificates: days left",
            vec![(vec![("cert", "localhost")], Positive)],
        ),
        (
            "Plan requests per second by plan and outcome",
            vec![
                (
                    vec![("plan", "starter"), ("outcome", "forwarded")],
                    Positive,
                ),
                (vec![("plan", "starter"), ("outcome", "limited")], Positive),
            ],
        ),
        (
            "Plan 429s per second by plan limit",
            vec![(vec![("limit", "starter/per-minute")], Positive)],
        ),
        (
            "Plan limit decisions with room per second",
            vec![(vec![("limit", "starter/per-minute")], Positive)],
        ),
        (
            "Open client connections by worker",
            vec![(vec![("worker", "1")], Present)],
        ),
    ];

    let mut failures = Vec::new();
    let all = panels(&d);
    for p in &all {
        let title = p["title"].as_str().unwrap();
        let Some((_, wants)) = expectations.iter().find(|(t, _)| *t == title) else {
            failures.push(format!("panel `{title}` has no expectation in this test"));
            continue;
        };
        let mut results = Vec::new();
        for e in exprs(p) {
            let q = substitute(e);
            let r = prom.query(&c, &q).await;
            if r.is_empty() {
                failures.push(format!("`{title}`: no data for {q}"));
            }
            results.extend(r);
        }
        for (labels, want) in wants {
            let ok = results
                .iter()
                .filter(|r| matches(r, labels))
                .any(|r| match want {
                    Present => true,
                    Positive => value(r).is_finite() && value(r) > 0.0,
                });
            if !ok {
                let got: Vec<String> = results
                    .iter()
                    .map(|r| format!("{} = {}", r["metric"], r["value"][1]))
                    .collect();
                let what = if *want == Positive {
                    "a value > 0"
                } else {
                    "a series"
                };
                failures.push(format!("`{title}`: {what} for {labels:?}; got {got:?}"));
            }
        }
    }
    for (t, _) in &expectations {
        if !all.iter().any(|p| p["title"] == *t) {
            failures.push(format!("expected panel `{t}` is not in the dashboard"));
        }
    }

    // Variable queries: label_values(SELECTOR, LABEL) must list the config's names.
    let label_values = Regex::new(r"^label_values\((.+),\s*(\w+)\)$").unwrap();
    let vars = d["templating"]["list"].as_array().unwrap();
    for (name, must) in [
        ("route", &["limited", "plain", "dead", "_none"][..]),
        ("limit", &["per-ip", "shadow", "starter/per-minute"][..]),
        ("plan", &["starter"][..]),
    ] {
        let v = vars.iter().find(|v| v["name"] == name).unwrap();
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        let m = label_values
            .captures(q)
            .unwrap_or_else(|| panic!("{name}: {q}"));
        let data = prom
            .api(
                &c,
                &format!(
                    "/api/v1/label/{}/values?match[]={}",
                    &m[2],
                    enc(&substitute(&m[1]))
                ),
            )
            .await;
        let got: Vec<&str> = data
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for want in must {
            if !got.contains(want) {
                failures.push(format!(
                    "variable ${name}: `{want}` not offered; got {got:?}"
                ));
            }
        }
    }

    assert!(
        failures.is_empty(),
        "{} problem(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
