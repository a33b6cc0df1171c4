//! The request pipeline, one phase per stage, in the manner of Pingora's `ProxyHttp`:
//!
//! ```text
//! request_filter → match_route → admit (identify + limit) → forward → response_filter
//!       │               │              │                        │        (settle: charge
//!       │               │              │                        │         by the answer,
//!       │               │              │                        │         hold slots)
//!       └───────────────┴──── GatewayError ─────────────────────┴──→ respond::render
//!                                                                        │
//!                                             respond (RateLimit fields, X-Request-Id) → log
//! ```
//!
//! Every phase reads and writes one [`Ctx`]; a phase that answers the request itself returns
//! a [`GatewayError`], which is rendered in one place and names its own [`Outcome`]. A request
//! takes one snapshot of the live table at its start and keeps it to the end.

pub mod admit;
pub mod body;
pub mod context;
pub mod headers;
pub mod identify;
pub mod live;
pub mod respond;
pub mod settle;
pub mod tunnel;
pub mod upstream;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use http::header::{CONTENT_LENGTH, HOST};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;

use crate::model::consumer::PlanOf;
use crate::model::limit::Charge;
use admit::Verdict;
use body::Body;
use context::{ConnInfo, Ctx};
use headers::request_id::X_REQUEST_ID;
use headers::{content_length, forwarded, h2, hop_by_hop, host, ratelimit};
use identify::Identity;
use live::Live;
use respond::{GatewayError, Refusal};
use upstream::{ForwardError, Outgoing, Upstream};

use crate::limiter::deny::DenyCache;
use crate::limiter::store::memory::MemoryStore;
use crate::limiter::store::Store;
use crate::limiter::store::StoreError;
use crate::model::outcome::Outcome;
use crate::model::path::{self, PathError};
use crate::model::route::{self, Route};
use crate::telemetry::metrics::{status_class, Metrics, StoreMetrics, NO_ROUTE, UPSTREAM_FAILED};

/// Everything a request needs, shared by all connections.
pub struct Gateway {
    /// The loaded table and what was resolved for it; swapped whole by a reload.
    pub live: ArcSwap<Live>,
    pub store: Store,
    /// The embedded store used by `on_error: local` (and as the store itself for `memory`).
    pub local: Arc<MemoryStore>,
    pub metrics: Metrics,
    /// The store's metric handles (its kind is fixed until a restart).
    pub store_metrics: StoreMetrics,
    /// Refusals the remote store made that still hold (none for the embedded store, whose
    /// decisions cost no round trip).
    pub deny: Option<DenyCache>,
}

/// Counts one request in `sluice_inflight_requests` until dropped: at the end of the
/// forward phase, or when hyper drops the request's future because the client went away.
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

impl Gateway {
    /// One request, start to end. It owns its handle on the gateway, so its future is
    /// what the server boxes, with no wrapper to move it into (see `runtime::app`).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let mut handling = Handling {
            gw: &self,
            ctx: Ctx::new(self.live.load_full(), parts, conn),
            answered: false,
        };
        let ctx = &mut handling.ctx;
        let res = match self.proxy(ctx, body).await {
            Ok(res) => res,
            Err(e) => {
                ctx.outcome = e.outcome();
                e.into_response()
            }
        };
        let res = self.respond(ctx, res);
        self.log(ctx, res.status());
        handling.answered = true;
        res
    }

    /// The phases up to the answer; an `Err` is the gateway's own answer.
    async fn proxy(&self, ctx: &mut Ctx, body: Incoming) -> Result<Response<Body>, GatewayError> {
        self.request_filter(ctx)?;
        let index = self.match_route(ctx)?;
        let live = ctx.live.clone();
        let _inflight = live.routes[index].inflight.clone().map(Inflight::enter);
        let route = &live.table.routes[index];
        ctx.outcome = self.admit(ctx, route, &live.refusals[index]).await?;
        // Boxed: the upstream exchange is most of a request's state, and answers made here
        // (429s, errors) never need it, so the request's own future stays small to move.
        let res = Box::pin(self.forward(ctx, route, &live.upstreams[route.upstream], body)).await;
        match res {
            Ok(res) => Ok(self.response_filter(ctx, res).await),
            Err(e) if ctx.owed.is_some() || ctx.leases.is_some() => {
                // Boxed: only these requests carry that future.
                Box::pin(settle::unanswered(ctx, e.status().as_u16())).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Refuse what cannot be routed safely, and settle the host, the path and the fields that
    /// are matched, limited and forwarded: CONNECT and TRACE (405), the fields `Connection`
    /// names removed (see [`hop_by_hop::strip_listed`]), the asterisk form (400), a transfer
    /// coding other than `chunked` (400, connection closed: the body cannot be framed the way
    /// the client meant), a method in lower case or a host the gateway cannot name (400, see
    /// [`host`]), a path that does not normalize safely (400, see
    /// [`crate::model::path`]).
    fn request_filter(&self, ctx: &mut Ctx) -> Result<(), GatewayError> {
        let method = &ctx.parts.method;
        // CONNECT asks for a tunnel, which this gateway does not route; TRACE echoes the
        // request, cookies and credentials included, back to whoever can make the client
        // send one (cross-site tracing), and no API needs it. nginx refuses both.
        if *method == http::Method::CONNECT || *method == http::Method::TRACE {
            return Err(GatewayError::MethodNotAllowed(method.clone()));
        }
        if !chunked_only(&ctx.parts.headers) {
            return Err(GatewayError::Unframeable(
                "only the `chunked` transfer coding is accepted".into(),
            ));
        }
        hop_by_hop::strip_listed(&mut ctx.parts.headers);
        if ctx.parts.version == Version::HTTP_2 {
            // What HTTP/1.1's parser settles itself: split cookies joined, one length, and a
            // `:path` that is a path (RFC 9113 §8.3.1; `?a=1` reads as `/` otherwise); and
            // what it would not have carried is refused as it would have.
            if h2::too_many_fields(&ctx.parts.headers) {
                return Err(GatewayError::HeadTooLarge);
            }
            h2::to_http1(&mut ctx.parts.headers).map_err(|e| GatewayError::BadRequest(e.into()))?;
            if ctx
                .uri
                .path_and_query()
                .is_some_and(|p| !p.as_str().starts_with(['/', '*']))
            {
                return Err(GatewayError::BadRequest(
                    "an HTTP/2 `:path` must start with `/`".into(),
                ));
            }
        }
        // Methods are case-sensitive (RFC 9110 §9.1), but many frameworks upper-case them:
        // `post` would miss a `methods: [POST]` route and still reach the handler it guards.
        // nginx refuses them too.
        if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
            return Err(GatewayError::BadRequest(format!(
                "method `{method}` is not in upper case"
            )));
        }
        ctx.host = host::of(ctx.parts.version, &ctx.uri, &ctx.parts.headers)
            .map_err(|e| GatewayError::BadRequest(e.to_string()))?;
        match path::normalize(ctx.uri.path(), &ctx.live.table.paths) {
            Ok(Cow::Borrowed(_)) => Ok(()),
            Ok(Cow::Owned(p)) => {
                ctx.normalized = Some(p);
                Ok(())
            }
            // `OPTIONS *` and the like: nothing this gateway routes, and nothing after it on
            // the connection is worth reading.
            Err(e @ PathError::NotAbsolute) => Err(GatewayError::Unframeable(e.to_string())),
            Err(e) => Err(GatewayError::BadRequest(e.to_string())),
        }
    }

    /// The first route matching the request, in file order.
    fn match_route(&self, ctx: &mut Ctx) -> Result<usize, GatewayError> {
        let index = route::find(
            &ctx.live.table.routes,
            &ctx.parts.method,
            ctx.path(),
            ctx.host.as_ref().and_then(|h| h.to_str().ok()),
            &ctx.parts.headers,
        )
        .ok_or(GatewayError::NoRoute)?;
        ctx.route = Some(index);
        Ok(index)
    }

    /// Identify the client and decide every limit of the route in one store call. `Ok`: the
    /// outcome the request counts as once forwarded. `refusals`: the route's 429s.
    async fn admit(
        &self,
        ctx: &mut Ctx,
        route: &Route,
        refusals: &[Arc<Refusal>],
    ) -> Result<Outcome, GatewayError> {
        // A plain proxy route: no identity to work out, nothing to decide.
        if route.limits.is_empty() {
            return Ok(Outcome::Forwarded);
        }
        let table = &ctx.live.table;
        let plan = {
            let mut who = Identity::new(
                ctx.peer().addr.ip(),
                ctx.forwarding_believed,
                &ctx.parts.headers,
                ctx.uri.query(),
                &table.client_ip,
                &table.identities,
            );
            admit::plan(
                route,
                &mut who,
                &ctx.parts.headers,
                &table.consumers,
                &mut ctx.plan,
            )?
        };
        let stores = admit::Stores {
            store: &self.store,
            local: &self.local,
            deny: self.deny.as_ref(),
        };
        let (mut admission, verdict) = admit::decide(route, refusals, plan, stores).await;
        if let Some(after) = admission.after.take() {
            self.settle_later(ctx, *after);
        }
        ctx.admission = admission;
        match verdict {
            Verdict::Pass(outcome) => Ok(outcome),
            Verdict::Refuse(e) => Err(e),
        }
    }

    /// Keep what an admitted request settles after its answer: the limits its answer is
    /// charged to, and the concurrency slots it took (from the store that decided).
    fn settle_later(&self, ctx: &mut Ctx, mut after: admit::After) {
        let store = if after.local {
            Store::Memory(self.local.clone())
        } else {
            self.store.clone()
        };
        if !after.orphans.is_empty() {
            let orphans = std::mem::take(&mut after.orphans);
            let metrics = self.store_metrics.clone();
            settle::release_orphans(self.store.clone(), metrics, orphans, after.id);
        }
        let route = ctx.route.unwrap_or_default();
        if !after.owed.is_empty() {
            let owed = std::mem::take(&mut after.owed);
            let metrics = self.store_metrics.clone();
            ctx.owed = Some(Box::new(settle::Owed::new(
                ctx.live.clone(),
                route,
                owed,
                store.clone(),
                metrics,
            )));
        }
        if !after.leases.is_empty() {
            let handles = &ctx.live.routes[route];
            let gauges = after
                .leases
                .iter()
                .filter_map(|(i, _)| handles.inflight_limit(*i));
            let gauges = gauges.collect();
            let calls = std::mem::take(&mut after.leases)
                .into_iter()
                .map(|(_, c)| c);
            ctx.leases = Some(Box::new(settle::Leases::hold(
                store,
                self.store_metrics.clone(),
                calls.collect(),
                after.id,
                gauges,
            )));
        }
    }

    /// Send the request upstream; its answer's head comes back, its body streams on.
    async fn forward(
        &self,
        ctx: &mut Ctx,
        route: &Route,
        upstream: &Upstream,
        body: Incoming,
    ) -> Result<Response<Body>, GatewayError> {
        let t = Instant::now();
        let result = self.send(ctx, route, upstream, body, t).await;
        let secs = t.elapsed().as_secs_f64();
        match result {
            Ok(res) => {
                ctx.upstream_time = Some((secs, status_class(res.status().as_u16())));
                Ok(res)
            }
            Err(e) => {
                if !e.clients_fault() {
                    ctx.upstream_time = Some((secs, UPSTREAM_FAILED));
                    // The cause stays here; the client's 502/504 says only what kind it was.
                    tracing::warn!(
                        route = &*route.name,
                        request_id = ctx.rid.to_str().unwrap_or("-"),
                        error = %e,
                        "upstream failed"
                    );
                }
                Err(e.into())
            }
        }
    }

    /// Where the upstream's answer is looked at before it goes back: a 502 or 504 from the
    /// upstream side counts as upstream_error; the limits charged by the answer are charged
    /// (one store call, awaited, so the client's next request sees it); the concurrency slots
    /// go with the body, to be freed when it ends.
    async fn response_filter(&self, ctx: &mut Ctx, res: Response<Body>) -> Response<Body> {
        if matches!(
            res.status(),
            StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
        ) {
            ctx.outcome = Outcome::UpstreamError;
        }
        if let Some(owed) = ctx.owed.take() {
            // Boxed: only these requests carry that future.
            let charged = Box::pin(owed.settle(res.status().as_u16(), Some(res.headers()))).await;
            settle::advertise(ctx, charged);
        }
        match ctx.leases.take() {
            Some(leases) => res.map(|b| body::holding(b, leases)),
            None => res,
        }
    }

    /// Fields every answer carries: the most constraining limit's RateLimit fields (on
    /// forwarded answers and 429s alike) and the request id.
    fn respond(&self, ctx: &Ctx, mut res: Response<Body>) -> Response<Body> {
        if let (Some(index), Some((i, d))) = (ctx.route, ctx.admission.headline) {
            let route = &ctx.live.table.routes[index];
            let rule = &route.limits[i];
            // A calendar month's `w` is the current month's length.
            let policy = if rule.params.month {
                ratelimit::policy_at(&route.name, &rule.name, &rule.params, unix_now_us())
            } else {
                rule.policy.clone()
            };
            ratelimit::apply(
                res.headers_mut(),
                ctx.live.table.headers,
                (&route.name, &rule.name),
                &policy,
                &d,
                rule.charge == Charge::InFlight,
            );
        }
        res.headers_mut().insert(X_REQUEST_ID, ctx.rid.clone());
        res
    }

    async fn send(
        &self,
        ctx: &mut Ctx,
        route: &Route,
        upstream: &Upstream,
        body: Incoming,
        started: Instant,
    ) -> Result<Response<Body>, ForwardError> {
        let (table, host, rid) = (&ctx.live.table, ctx.host.as_ref(), &ctx.rid);
        // `ctx.peer()`, by field: `ctx.parts` is borrowed mutably below.
        let peer = ctx.conn.client(ctx.proxied);
        let parts = &mut ctx.parts;
        let path = ctx.normalized.as_deref().unwrap_or_else(|| ctx.uri.path());
        let query = ctx.uri.query();
        let upgrade = parts.version == Version::HTTP_11 && hop_by_hop::is_upgrade(&parts.headers);
        let client_upgrade = if upgrade {
            parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
        } else {
            None
        };

        // The head's headers are not read after this phase: move them, don't copy them.
        let mut headers = std::mem::take(&mut parts.headers);
        hop_by_hop::strip_request(&mut headers, upgrade);
        forwarded::apply(
            &mut headers,
            &peer.text,
            ctx.forwarding_believed,
            host,
            ctx.conn.tls,
            |h| table.client_ip.client_ip(peer.addr.ip(), h),
        );
        // The host the route was matched on: the target's authority wins over `Host`
        // (absolute form, HTTP/2's `:authority`). Otherwise it is the `Host` field itself,
        // already in place (`strip` never removes it).
        if let (Some(h), Some(_)) = (host, ctx.uri.authority()) {
            headers.insert(HOST, h.clone());
        }
        headers.insert(X_REQUEST_ID, rid.clone());
        let target = if route.strip_prefix || ctx.normalized.is_some() {
            let path = if route.strip_prefix {
                route.matcher.strip(path)
            } else {
                path.into()
            };
            let path_and_query = match query {
                Some(q) => format!("{path}?{q}"),
                None => path.into_owned(),
            };
            Uri::try_from(path_and_query).map_err(|e| ForwardError::Unreachable(e.to_string()))?
        } else {
            // The client's own path and query, shared rather than copied and parsed again.
            let mut origin = http::uri::Parts::default();
            origin.path_and_query = ctx.uri.path_and_query().cloned();
            Uri::from_parts(origin).unwrap_or_default()
        };
        let out = Outgoing {
            method: parts.method.clone(),
            target,
            headers,
            has_host: host.is_some(),
        };
        let mut res = upstream.send(out, body, started, &mut ctx.upstream).await?;

        let switching = res.status() == StatusCode::SWITCHING_PROTOCOLS;
        match (switching, client_upgrade) {
            // RFC 9110 §15.2.2: a 101 MUST name the protocol it switches to, and the client
            // asked for WebSocket (RFC 6455 §4.1): anything else would be tunnelled unread.
            (true, Some(_)) if !hop_by_hop::upgrades_to_websocket(res.headers()) => {
                return Err(ForwardError::BadAnswer(
                    "101 that does not switch to `Upgrade: websocket`",
                ))
            }
            (true, Some(client)) => {
                // The tunnel is the request in flight: its concurrency slots go with it, not
                // with the 101's empty body.
                let idle = upstream.spec().idle_timeout;
                let leases = ctx.leases.take();
                let drain = ctx.conn.drain.clone();
                tunnel::spawn(client, hyper::upgrade::on(&mut res), idle, leases, drain);
            }
            // RFC 9110 §15.2.2: a server MUST NOT switch to a protocol the client did not ask
            // for; the client would be left reading what it cannot.
            (true, None) => {
                return Err(ForwardError::BadAnswer(
                    "101 to a request that asked no upgrade",
                ))
            }
            (false, _) => {
                answer_framing(res.headers()).map_err(ForwardError::BadAnswer)?;
                content_length::one(res.headers_mut()).map_err(ForwardError::BadAnswer)?;
                // RFC 9110 §8.6: a 204 MUST NOT carry Content-Length. hyper's HTTP/1 server
                // drops it; an HTTP/2 client takes it for DATA to come and resets the stream.
                if res.status() == StatusCode::NO_CONTENT {
                    res.headers_mut().remove(CONTENT_LENGTH);
                }
            }
        }
        hop_by_hop::strip(res.headers_mut(), switching);
        // The gateway speaks its own HTTP version to the client (RFC 9110 §2.5), whatever
        // the upstream's was; hyper answers an HTTP/1.0 client in HTTP/1.0 itself.
        *res.version_mut() = Version::HTTP_11;
        Ok(res.map(body::stream))
    }

    /// The one place a finished request is logged and counted.
    fn log(&self, ctx: &Ctx, status: StatusCode) {
        let (route, handles) = match ctx.route {
            Some(i) => (&*ctx.live.table.routes[i].name, &ctx.live.routes[i]),
            None => (NO_ROUTE, &ctx.live.no_route),
        };
        let elapsed = ctx.started.elapsed();
        handles.request(ctx.outcome, elapsed.as_secs_f64());
        let plan = match ctx.plan {
            Some(PlanOf::Consumer(c)) => {
                let p = ctx.live.table.consumers.list[c].plan;
                ctx.live.plans.get(p)
            }
            Some(PlanOf::Anonymous(_)) => ctx.live.anonymous.as_ref(),
            None => None,
        };
        if let Some(p) = plan {
            p.request(ctx.outcome);
        }
        if let Some((secs, class)) = ctx.upstream_time {
            handles.upstream(class, secs);
        }
        let adm = &ctx.admission;
        for (i, label) in &adm.decisions {
            handles.decision(*i, *label);
        }
        if let Some(call) = &adm.store {
            let failed = call.error.as_ref().map(StoreError::kind);
            self.store_metrics.call(call.took.as_secs_f64(), failed);
        }
        access(Access {
            route,
            method: ctx.parts.method.as_str(),
            path: ctx.path(),
            status,
            outcome: ctx.outcome,
            upstream: ctx.upstream.as_deref().unwrap_or("-"),
            duration_us: elapsed.as_micros() as u64,
            request_id: ctx.rid.to_str().unwrap_or("-"),
        });
    }

    /// A request hyper refused before it became one: a head it could not parse (400), or
    /// one over [`MAX_REQUEST_HEAD`](crate::runtime::server::MAX_REQUEST_HEAD) or hyper's
    /// 100 fields (431). hyper wrote the bare answer itself; it is logged and counted like
    /// the gateway's own refusals (no route, `rejected_request`), so that smuggling probes and
    /// oversized heads show.
    pub fn refused_head(&self, status: StatusCode) {
        let outcome = Outcome::RejectedRequest;
        self.live.load().no_route.request(outcome, 0.0);
        access(Access {
            route: NO_ROUTE,
            method: "-",
            path: "-",
            status,
            outcome,
            upstream: "-",
            duration_us: 0,
            request_id: "-",
        });
    }
}

/// A request's context while it is handled. Dropped before its answer (hyper drops the
/// request's future when the client leaves, and the drain deadline drops what is left), it is
/// still logged and counted, once, as status 499 (nginx's "client closed request") under the
/// outcome reached so far: the upstream may have run it. (Dropped by a panic: as the 500 the
/// client gets.)
struct Handling<'g> {
    gw: &'g Gateway,
    ctx: Ctx,
    answered: bool,
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        if !self.answered {
            // Unwinding from a panic, the server answers 500 (`runtime::server::panicked`).
            let status = if std::thread::panicking() {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::from_u16(settle::CLIENT_GONE).expect("499 is a status")
            };
            self.gw.log(&self.ctx, status);
        }
    }
}

/// One access-log event's fields (SPEC: one per request).
struct Access<'a> {
    route: &'a str,
    method: &'a str,
    path: &'a str,
    status: StatusCode,
    outcome: Outcome,
    upstream: &'a str,
    duration_us: u64,
    request_id: &'a str,
}

/// The one access-log event.
fn access(a: Access<'_>) {
    tracing::info!(
        target: "sluice::access",
        route = a.route,
        method = %a.method,
        path = a.path,
        status = a.status.as_u16(),
        decision = a.outcome.as_str(),
        upstream = a.upstream,
        duration_us = a.duration_us,
        request_id = a.request_id,
    );
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

/// An upstream answer whose body the client will read as the upstream framed it. hyper reads
/// a `Transfer-Encoding` other than `chunked` as "until close" and the coding label is a
/// hop-by-hop field the gateway removes, so the client would take coded bytes for the body;
/// beside a `Content-Length`, `chunked` decides the length (RFC 9112 §6.3), and a forwarded
/// `Content-Length` would cut the body short or leave the client waiting. nginx answers 502
/// to both.
fn answer_framing(headers: &http::HeaderMap) -> Result<(), &'static str> {
    if !chunked_only(headers) {
        return Err("a transfer coding other than `chunked`");
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING)
        && headers.contains_key(http::header::CONTENT_LENGTH)
    {
        return Err("both Content-Length and Transfer-Encoding");
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// Unix µs for what the gateway tells clients about calendar windows (the embedded store's
/// clock; a decision on Redis uses Redis's, and a month boundary is the same for both).
fn unix_now_us() -> u64 {
    crate::limiter::store::memory::Clock::System.now_us()
}
