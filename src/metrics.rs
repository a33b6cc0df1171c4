//! Prometheus metrics (SPEC §5), in a registry of our own. Labels are route and limit names
//! only — never client identities — so series stay bounded by the config.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::table::Table;

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub limit_decisions: IntCounterVec,
    pub request_duration: HistogramVec,
    pub upstream_duration: HistogramVec,
    pub store_duration: HistogramVec,
    pub store_errors: IntCounterVec,
    pub inflight: IntGaugeVec,
    pub reloads: IntCounterVec,
    pub config_info: IntGaugeVec,
}

/// Request latency buckets: 0.5 ms to 10 s.
const LATENCY: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Store round trips are sub-millisecond when healthy; the top buckets catch timeouts.
const STORE: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let m = Metrics {
            requests: counter(
                "sluice_requests_total",
                "Requests by route and outcome.",
                &["route", "outcome"],
            ),
            limit_decisions: counter(
                "sluice_limit_decisions_total",
                "Limit decisions by route, limit and decision.",
                &["route", "limit", "decision"],
            ),
            request_duration: histogram(
                "sluice_request_duration_seconds",
                "Time from request to response head.",
                &["route"],
                LATENCY,
            ),
            upstream_duration: histogram(
                "sluice_upstream_duration_seconds",
                "Upstream response-head time.",
                &["route", "status_class"],
                LATENCY,
            ),
            store_duration: histogram(
                "sluice_store_duration_seconds",
                "One limiter decision round trip.",
                &["store"],
                STORE,
            ),
            store_errors: counter(
                "sluice_store_errors_total",
                "Failed store calls by kind.",
                &["kind"],
            ),
            inflight: gauge(
                "sluice_inflight_requests",
                "Requests being handled, by route.",
                &["route"],
            ),
            reloads: counter(
                "sluice_config_reloads_total",
                "Config reloads by result.",
                &["result"],
            ),
            config_info: gauge(
                "sluice_config_info",
                "The loaded config's version (always 1).",
                &["version"],
            ),
            registry,
        };
        for kind in STORE_ERROR_KINDS {
            m.store_errors.with_label_values(&[kind]);
        }
        for result in ["success", "error"] {
            m.reloads.with_label_values(&[result]);
        }
        m
    }

    /// Create at zero every counter and gauge series the loaded config can produce, so a
    /// dashboard shows 0 rather than "No data" and `rate()` sees the first increment.
    /// Histograms appear with their first observation.
    pub fn init_series(&self, table: &Table) {
        self.requests.with_label_values(&["_none", "no_route"]);
        for route in &table.routes {
            let name: &str = &route.name;
            for outcome in OUTCOMES.iter().filter(|o| **o != "no_route") {
                self.requests.with_label_values(&[name, outcome]);
            }
            self.inflight.with_label_values(&[name]);
            for rule in &route.limits {
                for d in DECISIONS {
                    self.limit_decisions
                        .with_label_values(&[name, &rule.name, d]);
                }
            }
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8")
    }

    /// Publish the loaded config's version, dropping the previous one's series.
    pub fn set_config_version(&self, old: Option<&str>, new: &str) {
        if let Some(old) = old.filter(|o| *o != new) {
            let _ = self.config_info.remove_label_values(&[old]);
        }
        self.config_info.with_label_values(&[new]).set(1);
    }

    /// Forget the series of routes and limits that a reload removed (the label values are
    /// a closed set, so every combination can be named).
    pub fn forget(&self, routes: &[String], limits: &[(String, String)]) {
        for route in routes {
            for outcome in OUTCOMES {
                let _ = self.requests.remove_label_values(&[route, outcome]);
            }
            for class in STATUS_CLASSES {
                let _ = self.upstream_duration.remove_label_values(&[route, class]);
            }
            let _ = self.request_duration.remove_label_values(&[route]);
            let _ = self.inflight.remove_label_values(&[route]);
        }
        for (route, limit) in limits {
            for d in DECISIONS {
                let _ = self.limit_decisions.remove_label_values(&[route, limit, d]);
            }
        }
    }
}

pub const OUTCOMES: [&str; 8] = [
    "forwarded",
    "limited",
    "shadow_limited",
    "store_error_allowed",
    "store_error_denied",
    "rejected_identity",
    "no_route",
    "upstream_error",
];

/// The `decision` label of `sluice_limit_decisions_total`.
pub const DECISIONS: [&str; 4] = ["allowed", "limited", "shadow_limited", "error"];

/// The `kind` label of `sluice_store_errors_total` (see `StoreError::kind`).
pub const STORE_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "breaker_open"];

const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// `2xx` … `5xx` for an upstream status.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
