//! Prometheus metrics (SPEC §5), in a registry of our own. Labels are route and limit names
//! only — never client identities — so series stay bounded by the config.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::model::limit::Charge;
use crate::model::outcome::Outcome;
use crate::model::route::Route;
use crate::pipeline::admit::DecisionLabel;

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
    pub tls_expiry: IntGaugeVec,
    pub plan_requests: IntCounterVec,
    pub limit_inflight: IntGaugeVec,
    pub limit_charged: IntCounterVec,
    pub connections_open: IntGaugeVec,
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
            tls_expiry: gauge(
                "sluice_tls_certificate_expiry_timestamp_seconds",
                "Each served certificate's notAfter as a Unix time, by listener and first DNS name.",
                &["listener", "cert"],
            ),
            limit_inflight: gauge(
                "sluice_limit_inflight",
                "Concurrency slots this gateway holds, by route and limit.",
                &["route", "limit"],
            ),
            limit_charged: counter(
                "sluice_limit_charged_total",
                "Units charged after the answer, by route and limit.",
                &["route", "limit"],
            ),
            connections_open: gauge(
                "sluice_connections_open",
                "Client connections open on the data listeners, by worker (from 1).",
                &["worker"],
            ),
            plan_requests: counter(
                "sluice_plan_requests_total",
                "Requests on routes with consumers, by plan and outcome (never by consumer).",
                &["plan", "outcome"],
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

    /// Resolve a route's handles once (the request path never looks a series up by its
    /// labels). Creating them also creates every counter and gauge series at zero, so a
    /// dashboard shows 0 rather than "No data" and `rate()` sees the first increment.
    pub fn route(&self, route: &Route) -> RouteMetrics {
        let name: &str = &route.name;
        let outcomes = Outcome::ALL.iter().filter(|o| **o != Outcome::NoRoute);
        RouteMetrics {
            requests: self.outcomes(name, outcomes),
            duration: self.request_duration.with_label_values(&[name]),
            upstream: STATUS_CLASSES
                .iter()
                .map(|c| self.upstream_duration.with_label_values(&[name, c]))
                .collect(),
            inflight: Some(self.inflight.with_label_values(&[name])),
            limits: route
                .limits
                .iter()
                .map(|rule| {
                    DecisionLabel::ALL
                        .iter()
                        .map(|d| {
                            self.limit_decisions
                                .with_label_values(&[name, &rule.name, d.as_str()])
                        })
                        .collect()
                })
                .collect(),
            settle: route
                .limits
                .iter()
                .map(|rule| {
                    let labels = [name, &*rule.name];
                    match rule.charge {
                        Charge::Request => Settle::None,
                        Charge::Answer { .. } => {
                            Settle::Charged(self.limit_charged.with_label_values(&labels))
                        }
                        Charge::InFlight => {
                            Settle::InFlight(self.limit_inflight.with_label_values(&labels))
                        }
                    }
                })
                .collect(),
        }
    }

    /// The handles of a plan (`_anonymous` for the anonymous plan's requests).
    pub fn plan(&self, plan: &str) -> PlanMetrics {
        // Every outcome a routed request can have.
        let mut v = vec![None; Outcome::ALL.len()];
        for o in Outcome::ALL.iter().filter(|o| **o != Outcome::NoRoute) {
            v[*o as usize] = Some(self.plan_requests.with_label_values(&[plan, o.as_str()]));
        }
        PlanMetrics(v)
    }

    /// Forget the series of plans a reload removed.
    pub fn forget_plans(&self, plans: &[String]) {
        for plan in plans {
            for o in Outcome::ALL {
                let _ = self.plan_requests.remove_label_values(&[plan, o.as_str()]);
            }
        }
    }

    /// Each worker's open-connection gauge, worker 1 first (resolved once, at start).
    pub fn connections(&self, workers: usize) -> std::sync::Arc<[IntGauge]> {
        (0..workers.max(1))
            .map(crate::worker::number)
            .map(|w| {
                self.connections_open
                    .with_label_values(&[w.to_string().as_str()])
            })
            .collect()
    }

    /// The handles of the configured store (`store` label `memory` or `redis`), resolved
    /// once at start (the store kind needs a restart to change).
    pub fn store(&self, label: &str) -> StoreMetrics {
        StoreMetrics {
            duration: self.store_duration.with_label_values(&[label]),
            errors: STORE_ERROR_KINDS.map(|k| self.store_errors.with_label_values(&[k])),
        }
    }

    /// The handles of route `_none`: requests refused before any route was chosen.
    pub fn no_route(&self) -> RouteMetrics {
        let outcomes = [Outcome::NoRoute, Outcome::RejectedRequest];
        RouteMetrics {
            requests: self.outcomes(NO_ROUTE, outcomes.iter()),
            duration: self.request_duration.with_label_values(&[NO_ROUTE]),
            upstream: Vec::new(),
            inflight: None,
            limits: Vec::new(),
            settle: Vec::new(),
        }
    }

    fn outcomes<'a>(
        &self,
        route: &str,
        which: impl Iterator<Item = &'a Outcome>,
    ) -> Vec<Option<IntCounter>> {
        let mut v = vec![None; Outcome::ALL.len()];
        for o in which {
            v[*o as usize] = Some(self.requests.with_label_values(&[route, o.as_str()]));
        }
        v
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

    /// The certificates each TLS listener now serves: `(listener, cert name, notAfter)`.
    /// Series of certificates no longer served are removed.
    /// Certificates of one listener that share their first DNS name (an RSA and an ECDSA
    /// pair for one site, say) share a series, which holds the soonest notAfter: the one an
    /// expiry alert must see.
    pub fn set_certificates(&self, certs: &[(String, String, i64)]) {
        self.tls_expiry.reset();
        for ((listener, name), not_after) in soonest(certs) {
            self.tls_expiry
                .with_label_values(&[listener, name])
                .set(not_after);
        }
    }

    /// Forget the series of routes and limits that a reload removed (the label values are
    /// a closed set, so every combination can be named).
    pub fn forget(&self, routes: &[String], limits: &[(String, String)]) {
        for route in routes {
            for outcome in Outcome::ALL {
                let _ = self
                    .requests
                    .remove_label_values(&[route, outcome.as_str()]);
            }
            for class in STATUS_CLASSES {
                let _ = self.upstream_duration.remove_label_values(&[route, class]);
            }
            let _ = self.request_duration.remove_label_values(&[route]);
            let _ = self.inflight.remove_label_values(&[route]);
        }
        for (route, limit) in limits {
            for d in DecisionLabel::ALL.map(DecisionLabel::as_str) {
                let _ = self.limit_decisions.remove_label_values(&[route, limit, d]);
            }
            let _ = self.limit_inflight.remove_label_values(&[route, limit]);
            let _ = self.limit_charged.remove_label_values(&[route, limit]);
        }
    }

    /// Remove the settling series of limits that no longer settle that way: (route, limit,
    /// whether it was charged by the answer; else it held concurrency slots). Their other
    /// series, and a new kind's, stay.
    pub fn forget_settled(&self, limits: &[(String, String, bool)]) {
        for (route, limit, by_answer) in limits {
            let _ = if *by_answer {
                self.limit_charged.remove_label_values(&[route, limit])
            } else {
                self.limit_inflight.remove_label_values(&[route, limit])
            };
        }
    }
}

/// The route label of requests that matched no route.
pub const NO_ROUTE: &str = "_none";

/// The store's metric handles.
#[derive(Clone)]
pub struct StoreMetrics {
    duration: Histogram,
    /// By [`STORE_ERROR_KINDS`] index.
    errors: [IntCounter; 4],
}

impl StoreMetrics {
    /// One store call: how long it took, and how it failed (`kind` as in
    /// [`STORE_ERROR_KINDS`]). A call that never reached the store (no connection, the
    /// breaker open) is counted as an error but not timed: its microseconds would pull the
    /// latency panels down just when the store is out.
    pub fn call(&self, secs: f64, failed: Option<&str>) {
        if !matches!(failed, Some("connection" | "breaker_open")) {
            self.duration.observe(secs);
        }
        if let Some(i) = failed.and_then(|k| STORE_ERROR_KINDS.iter().position(|x| *x == k)) {
            self.errors[i].inc();
        }
    }
}

/// One route's metric handles, resolved when its table is applied and held for as long as
/// that table serves. A reload that removes the route removes its series; requests still in
/// flight on the old table then count into detached handles, which never re-create them.
pub struct RouteMetrics {
    /// By [`Outcome`] index; `None` for outcomes this route cannot have.
    requests: Vec<Option<IntCounter>>,
    duration: Histogram,
    /// By [`status_class`] index.
    upstream: Vec<Histogram>,
    pub inflight: Option<IntGauge>,
    /// By limit index in the route, then [`DecisionLabel`] index.
    limits: Vec<Vec<IntCounter>>,
    /// By limit index in the route: what it counts after admission.
    settle: Vec<Settle>,
}

/// A limit's handle for what happens after admission.
enum Settle {
    None,
    /// `sluice_limit_charged_total`: units charged by the answer.
    Charged(IntCounter),
    /// `sluice_limit_inflight`: slots held.
    InFlight(IntGauge),
}

impl RouteMetrics {
    pub fn request(&self, outcome: Outcome, secs: f64) {
        if let Some(c) = &self.requests[outcome as usize] {
            c.inc();
        }
        self.duration.observe(secs);
    }

    pub fn upstream(&self, class: usize, secs: f64) {
        if let Some(h) = self.upstream.get(class) {
            h.observe(secs);
        }
    }

    /// `cost` units charged to limit `limit` by an answer.
    pub fn charged(&self, limit: usize, cost: u64) {
        if let Some(Settle::Charged(c)) = self.settle.get(limit) {
            c.inc_by(cost);
        }
    }

    /// The slot gauge of concurrency limit `limit`.
    pub fn inflight_limit(&self, limit: usize) -> Option<IntGauge> {
        match self.settle.get(limit) {
            Some(Settle::InFlight(g)) => Some(g.clone()),
            _ => None,
        }
    }

    pub fn decision(&self, limit: usize, d: DecisionLabel) {
        if let Some(c) = self.limits.get(limit) {
            c[d as usize].inc();
        }
    }
}

/// A plan's request counters, by [`Outcome`] index.
pub struct PlanMetrics(Vec<Option<IntCounter>>);

impl PlanMetrics {
    pub fn request(&self, outcome: Outcome) {
        if let Some(c) = &self.0[outcome as usize] {
            c.inc();
        }
    }
}

/// The `kind` label of `sluice_store_errors_total` (see `StoreError::kind`).
pub const STORE_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "breaker_open"];

/// The `status_class` label of `sluice_upstream_duration_seconds`.
pub const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];
/// Index of `error` in [`STATUS_CLASSES`]: no answer from the upstream.
pub const UPSTREAM_FAILED: usize = 5;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Index in [`STATUS_CLASSES`] of an upstream status: `1xx` … `5xx`.
pub fn status_class(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// Each (listener, name)'s soonest notAfter.
fn soonest(certs: &[(String, String, i64)]) -> std::collections::BTreeMap<(&str, &str), i64> {
    let mut by_name = std::collections::BTreeMap::new();
    for (listener, name, not_after) in certs {
        by_name
            .entry((listener.as_str(), name.as_str()))
            .and_modify(|t: &mut i64| *t = (*t).min(*not_after))
            .or_insert(*not_after);
    }
    by_name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_sharing_a_name_show_the_soonest_expiry() {
        let c = |l: &str, n: &str, t| (l.to_owned(), n.to_owned(), t);
        let certs = [
            c("a:443", "shared.example", 300),
            c("a:443", "shared.example", 100),
            c("a:443", "other.example", 200),
            c("b:443", "shared.example", 400),
        ];
        let m = Metrics::new();
        m.set_certificates(&certs);
        let text = m.render();
        let series = "sluice_tls_certificate_expiry_timestamp_seconds";
        for (listener, cert, t) in [
            ("a:443", "shared.example", 100),
            ("a:443", "other.example", 200),
            ("b:443", "shared.example", 400),
        ] {
            let line = format!("{series}{{cert=\"{cert}\",listener=\"{listener}\"}} {t}");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        assert_eq!(text.matches(&format!("{series}{{")).count(), 3, "{text}");
    }
}
