//! The admin listener (SPEC §5): `/metrics`, `/healthz`, `/readyz` for scrapers and probes,
//! and the `/admin/*` API for operators. Nothing here runs on the request path.
//!
//! When `admin_listen` is not a loopback address, every `/admin/*` call needs
//! `Authorization: Bearer $SLUICE_ADMIN_TOKEN`; the scrape and probe endpoints stay open.

mod config;
mod consumers;
mod limits;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::compile::admin_token;
use crate::pipeline::body::{empty, full, Body};
use crate::pipeline::headers::request_id::{self, X_REQUEST_ID};
use crate::pipeline::identify::{bearer_token, percent_decode};
use crate::pipeline::Gateway;
use crate::runtime::reload::{reload, Trigger};
use crate::runtime::Runtime;

/// How long `/readyz` waits for the store before calling it unready.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn handle(gw: Arc<Runtime>, req: Request<Incoming>, _peer: SocketAddr) -> Response<Body> {
    let rid = request_id::get_or_make(req.headers());
    let mut res = route(gw, req).await;
    res.headers_mut().insert(X_REQUEST_ID, rid);
    res
}

async fn route(gw: Arc<Runtime>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path == "/admin" || path.starts_with("/admin/") {
        if !from_this_machine(&gw, req.uri(), req.headers()) {
            return problem(
                StatusCode::FORBIDDEN,
                "the open (loopback) admin API answers only requests to localhost or an IP address, and none from a web page of another site",
            );
        }
        if !authorized(&gw, req.headers()) {
            let mut res = problem(
                StatusCode::UNAUTHORIZED,
                "the admin API needs `Authorization: Bearer <token>` (the value of SLUICE_ADMIN_TOKEN)",
            );
            res.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice-admin\""),
            );
            return res;
        }
        return admin(gw, req).await;
    }
    let read_only = [Method::GET, Method::HEAD];
    if matches!(path, "/metrics" | "/healthz" | "/readyz") && !read_only.contains(req.method()) {
        return method_not_allowed("GET, HEAD");
    }
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            gw.metrics.render(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/readyz" => readyz(&gw).await,
        _ => problem(StatusCode::NOT_FOUND, "no such admin endpoint"),
    }
}

/// Ready when the store answers (a config is always loaded once the process serves).
async fn readyz(gw: &Gateway) -> Response<Body> {
    let why = match tokio::time::timeout(READY_TIMEOUT, gw.store.ping()).await {
        Ok(Ok(())) => return reply(StatusCode::OK, "text/plain; charset=utf-8", "ready\n"),
        Ok(Err(e)) => format!("{} store: {e}", gw.store.label()),
        Err(_) => format!(
            "{} store: no answer within {READY_TIMEOUT:?}",
            gw.store.label()
        ),
    };
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        format!("not ready: {why}\n"),
    )
}

async fn admin(gw: Arc<Runtime>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    // Exact paths, as `/metrics` and `/healthz` are: `/admin/config/` is no endpoint.
    let segments: Vec<&str> = path.split('/').skip(2).collect();
    let method = req.method().clone();
    match segments.as_slice() {
        ["config"] => match method {
            Method::GET | Method::HEAD => {
                let live = gw.live.load_full();
                let table = &live.table;
                match config::document(table, &live.file, gw.boot.workers) {
                    Ok(doc) => json_reply(StatusCode::OK, &doc),
                    Err(e) => problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("cannot render the config: {e}"),
                    ),
                }
            }
            _ => method_not_allowed("GET, HEAD"),
        },
        ["reload"] => match method {
            Method::POST => reload_now(gw).await,
            _ => method_not_allowed("POST"),
        },
        // Percent-decoded as route and limit names are: a client's `%64emo` is `demo`.
        ["consumers", name] if !name.is_empty() => match method {
            Method::GET | Method::HEAD => consumers::peek(&gw, &percent_decode(name)).await,
            Method::DELETE => consumers::reset(&gw, &percent_decode(name)).await,
            _ => method_not_allowed("GET, HEAD, DELETE"),
        },
        // A plan's limit is named `plan/limit`: two segments, or one with `%2F`.
        ["limits", route, limit @ ..]
            if matches!(limit.len(), 1 | 2)
                && !route.is_empty()
                && limit.iter().all(|s| !s.is_empty()) =>
        {
            let route = percent_decode(route);
            let limit = limit
                .iter()
                .map(|s| percent_decode(s))
                .collect::<Vec<_>>()
                .join("/");
            let query = req.uri().query();
            match method {
                Method::GET | Method::HEAD => limits::peek(&gw, &route, &limit, query).await,
                Method::DELETE => limits::reset(&gw, &route, &limit, query).await,
                _ => method_not_allowed("GET, HEAD, DELETE"),
            }
        }
        _ => problem(StatusCode::NOT_FOUND, "no such admin endpoint"),
    }
}

/// `POST /admin/reload`: 200 `{"version"}`, or 400 with every error (the old config stays).
async fn reload_now(gw: Arc<Runtime>) -> Response<Body> {
    match tokio::task::spawn_blocking(move || reload(&gw, Trigger::Admin)).await {
        Ok(Ok(version)) => json_reply(StatusCode::OK, &json!({ "version": version })),
        Ok(Err(errors)) => {
            let errors: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
            problem_with_errors(
                StatusCode::BAD_REQUEST,
                "the new config was rejected; the old one keeps serving",
                Some(errors),
            )
        }
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("reload failed: {e}"),
        ),
    }
}

/// On an open (loopback) admin listener, a request's `Host` must be `localhost` or an IP
/// address: a web page whose name an attacker pointed at 127.0.0.1 (DNS rebinding) could
/// otherwise make a browser on this host read `/admin/config` or reset limits, with the
/// page's name as `Host`. And a browser's request from a page not served by this machine
/// (`Origin` naming anything but `localhost` or a loopback address, a public IP included) is
/// refused, so a page cannot post `/admin/reload` blind either. A token-guarded listener
/// needs neither check.
fn from_this_machine(gw: &Runtime, uri: &http::Uri, headers: &HeaderMap) -> bool {
    if !gw.boot.admin_listen.ip().is_loopback() {
        return true;
    }
    // `localhost`, or an IP address (a loopback one only, with `loopback`).
    let named = |host: &str, loopback: bool| {
        let name = crate::model::route::host_name(host);
        name.eq_ignore_ascii_case("localhost")
            || name
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| !loopback || ip.to_canonical().is_loopback())
    };
    let local = |host: &str| named(host, false);
    // `Origin: scheme://host[:port]`, or `null` from an opaque origin (a sandboxed page).
    if let Some(origin) = headers.get(ORIGIN) {
        let from = origin.to_str().ok().and_then(|o| o.split_once("://"));
        if !from.is_some_and(|(_, host)| named(host, true)) {
            return false;
        }
    }
    // The target's authority (HTTP/2's `:authority`, the absolute form), else `Host`;
    // HTTP/1.0 may have neither, and then no page name to have been rebound.
    match uri.authority() {
        Some(a) => local(a.as_str()),
        None => headers
            .get(HOST)
            .is_none_or(|h| h.to_str().is_ok_and(local)),
    }
}

/// Loopback admin listeners are open; any other needs the bearer token (no token set:
/// nothing passes — `sluice check` refuses that config anyway).
fn authorized(gw: &Runtime, headers: &HeaderMap) -> bool {
    if gw.boot.admin_listen.ip().is_loopback() {
        return true;
    }
    let Ok(Some(expected)) = admin_token() else {
        return false;
    };
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| bearer_token(v.trim()))
        .is_some_and(|presented| same_secret(presented, &expected))
}

/// Compare in constant time: hashing first makes the work independent of where (and
/// whether) the inputs differ, and of their lengths.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn reply(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(full(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    res
}

fn json_reply(status: StatusCode, doc: &serde_json::Value) -> Response<Body> {
    let mut body = serde_json::to_vec_pretty(doc).expect("json");
    body.push(b'\n');
    reply(status, "application/json", body)
}

fn no_content() -> Response<Body> {
    let mut res = Response::new(empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    res
}

use crate::pipeline::respond::{problem, problem_with_errors};

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut res = problem(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("this endpoint answers {allow}"),
    );
    res.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_value_only() {
        assert!(same_secret("s3cret-token", "s3cret-token"));
        assert!(!same_secret("s3cret-token", "s3cret-tokem"));
        assert!(!same_secret("s3cret", "s3cret-token"));
        assert!(!same_secret("", "x"));
    }
}
