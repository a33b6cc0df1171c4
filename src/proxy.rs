//! The request pipeline, one phase per stage:
//! match route → identify → limit → forward → respond → log.
//!
//! A request takes one snapshot of the runtime table at its start and keeps it to the end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::body::{self, Body};
use crate::forward::Upstream;
use crate::forward::{ForwardError, Outgoing};
use crate::headers::request_id::{self, X_REQUEST_ID};
use crate::headers::{forwarded, hop_by_hop, ratelimit};
use crate::identify::Identity;
use crate::limit::{self, Admission};
use crate::limiter::store::memory::MemoryStore;
use crate::limiter::store::Store;
use crate::model::outcome::Outcome;
use crate::model::route::{self, Route};
use crate::model::table::Table;
use crate::respond::GatewayError;
use crate::runtime::Live;
use crate::telemetry::metrics::{status_class, Metrics, RouteMetrics, NO_ROUTE, UPSTREAM_FAILED};

/// Everything a request needs, shared by all connections.
pub struct Gateway {
    /// The loaded table and what was resolved for it; swapped whole by a reload.
    pub live: ArcSwap<Live>,
    pub store: Store,
    /// The embedded store used by `on_error: local` (and as the store itself for `memory`).
    pub local: Arc<MemoryStore>,
    pub metrics: Metrics,
    pub config_path: std::path::PathBuf,
    /// Reloads run one at a time.
    pub reload_lock: parking_lot::Mutex<()>,
    /// Hash of the config content last seen by a file event (to ignore no-op events).
    pub last_seen: parking_lot::Mutex<String>,
}

/// Counts one request in `sluice_inflight_requests` until dropped: at the end of `handle`,
/// or when hyper drops the request's future because the client went away mid-request.
struct Inflight(prometheus::IntGauge);

impl Inflight {
    fn enter(gauge: prometheus::IntGauge) -> Inflight {
        gauge.inc();
        Inflight(gauge)
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What the forward phase needs.
struct Outbound<'a> {
    route: &'a Route,
    table: &'a Table,
    upstream: &'a Upstream,
    parts: &'a mut http::request::Parts,
    /// The normalized path (before `strip_prefix`).
    path: &'a str,
    query: Option<&'a str>,
    body: Incoming,
    peer: SocketAddr,
    host: Option<&'a HeaderValue>,
    rid: &'a HeaderValue,
}

/// What the log phase needs to know about a finished request.
struct Record<'a> {
    route: Option<&'a Route>,
    status: StatusCode,
    outcome: Outcome,
    upstream: Option<String>,
    /// Seconds to the upstream's response head, and its `STATUS_CLASSES` index.
    upstream_time: Option<(f64, usize)>,
    admission: Option<&'a Admission>,
}

impl Record<'_> {
    /// A request answered by the gateway before any route was chosen.
    fn gateway(status: StatusCode, outcome: Outcome) -> Self {
        Record {
            route: None,
            status,
            outcome,
            upstream: None,
            upstream_time: None,
            admission: None,
        }
    }
}

/// The normalized path of a request the gateway can route, or the answer refusing it:
/// CONNECT (405), the asterisk form (400), a transfer coding other than `chunked` (400,
/// connection closed: the body cannot be framed the way the client meant), and a path that
/// does not normalize safely (400, see [`crate::path`]).
fn request_path<'a>(
    parts: &http::request::Parts,
    uri: &'a http::Uri,
    rules: &crate::model::path::PathRules,
) -> Result<std::borrow::Cow<'a, str>, GatewayError> {
    if parts.method == http::Method::CONNECT {
        return Err(GatewayError::MethodNotAllowed(http::Method::CONNECT));
    }
    if !chunked_only(&parts.headers) {
        return Err(GatewayError::Unframeable(
            "only the `chunked` transfer coding is accepted".into(),
        ));
    }
    crate::model::path::normalize(uri.path(), rules).map_err(|e| match e {
        // `OPTIONS *` and the like: nothing this gateway routes, and nothing after it on the
        // connection is worth reading.
        crate::model::path::PathError::NotAbsolute => GatewayError::Unframeable(e.to_string()),
        e => GatewayError::BadRequest(e.to_string()),
    })
}

/// No `Transfer-Encoding`, or exactly one `chunked` (RFC 9112 §6.1). hyper already refuses a
/// coding list not ending in `chunked`; `gzip, chunked` or `chunked, chunked` it accepts, and
/// forwarding those would hand the upstream a body coded differently than it is told.
fn chunked_only(headers: &http::HeaderMap) -> bool {
    let mut te = headers.get_all(http::header::TRANSFER_ENCODING).iter();
    match (te.next(), te.next()) {
        (None, _) => true,
        (Some(v), None) => v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"),
        _ => false,
    }
}

impl Gateway {
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let live = self.live.load_full();
        let table = &live.table;
        let rid = request_id::get_or_make(req.headers());
        let (mut parts, body) = req.into_parts();
        // The target is read here and never again from `parts`: the normalized path is what
        // is matched, limited, logged and forwarded.
        let uri = std::mem::take(&mut parts.uri);
        // RFC 9112 §3.2.2: an absolute-form target's authority is the host, whatever `Host`
        // says (h2's `:authority` arrives the same way); the upstream gets that same host.
        let host = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| parts.headers.get(HOST).cloned());

        // 0. Refuse what cannot be routed safely; normalize the path that is matched, limited
        // and forwarded.
        let path = match request_path(&parts, &uri, &table.paths) {
            Ok(p) => p,
            Err(e) => {
                let res = e.into_response(&rid);
                let rec = Record::gateway(res.status(), Outcome::RejectedRequest);
                self.log(&live.no_route, &parts, uri.path(), &rid, started, rec);
                return res;
            }
        };

        // 1. Match the route.
        let Some(index) = route::find(
            &table.routes,
            &parts.method,
            &path,
            host.as_ref().and_then(|h| h.to_str().ok()),
            &parts.headers,
        ) else {
            let res = GatewayError::NoRoute.into_response(&rid);
            let rec = Record::gateway(res.status(), Outcome::NoRoute);
            self.log(&live.no_route, &parts, &path, &rid, started, rec);
            return res;
        };
        let route = &table.routes[index];
        let handles = &live.routes[index];
        let inflight = handles.inflight.clone().map(Inflight::enter);

        // 2. Identify, 3. limit.
        let plan = {
            let who = Identity::new(
                peer.ip(),
                &parts.headers,
                uri.query(),
                &table.client_ip,
                &table.identities,
            );
            limit::plan(route, &who, &parts.headers)
        };
        let mut adm = match plan {
            Ok(plan) => limit::decide(route, plan, &self.store, &self.local).await,
            Err(e) => Admission {
                reject: Some(e),
                ..Admission::default()
            },
        };

        // 4. Forward, unless the limit stage answered.
        let mut upstream = None;
        let mut upstream_time = None;
        let reject = adm.reject.take();
        let outcome;
        let mut res = match reject {
            Some(err) => {
                outcome = match &err {
                    GatewayError::Limited { .. } => Outcome::Limited,
                    GatewayError::StoreUnavailable(_) => Outcome::StoreErrorDenied,
                    _ => Outcome::RejectedIdentity,
                };
                let mut res = err.into_response(&rid);
                if let Some((_, d)) = adm
                    .headline
                    .filter(|_| res.status() == StatusCode::TOO_MANY_REQUESTS)
                {
                    ratelimit::set_retry_after(
                        res.headers_mut(),
                        ratelimit::retry_after_secs(d.retry_after_us),
                    );
                }
                res
            }
            None => {
                let t = Instant::now();
                let result = self
                    .forward(Outbound {
                        route,
                        table,
                        upstream: &live.upstreams[route.upstream],
                        parts: &mut parts,
                        path: &path,
                        query: uri.query(),
                        body,
                        peer,
                        host: host.as_ref(),
                        rid: &rid,
                    })
                    .await;
                let secs = t.elapsed().as_secs_f64();
                match result {
                    Ok((res, target)) => {
                        upstream = Some(target);
                        upstream_time = Some((secs, status_class(res.status().as_u16())));
                        outcome = if matches!(
                            res.status(),
                            StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
                        ) {
                            Outcome::UpstreamError
                        } else if adm.shadow_limited {
                            Outcome::ShadowLimited
                        } else if adm.store_error_allowed {
                            Outcome::StoreErrorAllowed
                        } else {
                            Outcome::Forwarded
                        };
                        res
                    }
                    Err(e) => {
                        if let ForwardError::ClientBody(_) = e {
                            outcome = Outcome::RejectedRequest;
                        } else {
                            upstream_time = Some((secs, UPSTREAM_FAILED));
                            outcome = Outcome::UpstreamError;
                        }
                        GatewayError::from(e).into_response(&rid)
                    }
                }
            }
        };

        // 5. Respond: rate-limit fields of the most constraining limit.
        if let Some((i, d)) = adm.headline {
            let rule = &route.limits[i];
            ratelimit::apply(
                res.headers_mut(),
                table.headers,
                &route.name,
                &rule.name,
                &rule.policy,
                &d,
            );
        }
        res.headers_mut().insert(X_REQUEST_ID, rid.clone());

        // 6. Log and count.
        drop(inflight);
        self.log(
            handles,
            &parts,
            &path,
            &rid,
            started,
            Record {
                route: Some(route),
                status: res.status(),
                outcome,
                upstream,
                upstream_time,
                admission: Some(&adm),
            },
        );
        res
    }

    async fn forward(
        &self,
        o: Outbound<'_>,
    ) -> Result<(Response<Body>, String), crate::forward::ForwardError> {
        let Outbound {
            route,
            table,
            upstream,
            parts,
            path,
            query,
            body,
            peer,
            host,
            rid,
        } = o;
        let upgrade = parts.version == Version::HTTP_11 && hop_by_hop::is_upgrade(&parts.headers);
        let client_upgrade = if upgrade {
            parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
        } else {
            None
        };

        let mut headers = parts.headers.clone();
        hop_by_hop::strip(&mut headers, upgrade);
        forwarded::apply(
            &mut headers,
            peer.ip(),
            table.client_ip.is_trusted(peer.ip().to_canonical()),
            host,
        );
        // The host the route was matched on (an absolute-form authority wins over `Host`).
        if let Some(h) = host {
            headers.insert(HOST, h.clone());
        }
        headers.insert(X_REQUEST_ID, rid.clone());
        let path = if route.strip_prefix {
            route.matcher.strip(path)
        } else {
            path.into()
        };
        let path_and_query = match query {
            Some(q) => format!("{path}?{q}"),
            None => path.into_owned(),
        };
        let out = Outgoing {
            method: parts.method.clone(),
            path_and_query,
            headers,
        };
        let (mut res, target) = upstream.send(out, body).await?;

        let switching = res.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let (true, Some(client)) = (switching, client_upgrade) {
            let upstream = hyper::upgrade::on(&mut res);
            tokio::spawn(async move {
                if let (Ok(c), Ok(u)) = tokio::join!(client, upstream) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(u))
                            .await;
                }
            });
        }
        hop_by_hop::strip(res.headers_mut(), switching);
        Ok((res.map(body::stream), target))
    }

    /// The one place a finished request is logged and counted.
    fn log(
        &self,
        handles: &RouteMetrics,
        parts: &http::request::Parts,
        path: &str,
        rid: &HeaderValue,
        started: Instant,
        r: Record<'_>,
    ) {
        let m = &self.metrics;
        let route = r.route.map_or(NO_ROUTE, |r| &r.name);
        let elapsed = started.elapsed();
        handles.request(r.outcome, elapsed.as_secs_f64());
        if let Some((secs, class)) = r.upstream_time {
            handles.upstream(class, secs);
        }
        if let Some(adm) = r.admission {
            for (i, label) in &adm.decisions {
                handles.decision(*i, *label);
            }
            if let Some((store, t)) = adm.store_time {
                m.store_duration
                    .with_label_values(&[store])
                    .observe(t.as_secs_f64());
            }
            if let Some(e) = &adm.store_error {
                m.store_errors.with_label_values(&[e.kind()]).inc();
            }
        }
        tracing::info!(
            target: "sluice::access",
            route,
            method = %parts.method,
            path,
            status = r.status.as_u16(),
            decision = r.outcome.as_str(),
            upstream = r.upstream.as_deref().unwrap_or("-"),
            duration_us = elapsed.as_micros() as u64,
            request_id = rid.to_str().unwrap_or("-"),
        );
    }
}
