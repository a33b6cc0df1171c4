//! Stage 5 — the gateway's own answers. Every error of every layer becomes a status code
//! here, and nowhere else, as an RFC 9457 `application/problem+json` body.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{Response, StatusCode};

use crate::limiter::store::StoreError;
use crate::model::limit::LimitRule;
use crate::model::outcome::Outcome;
use crate::model::route::Route;
use crate::pipeline::body::{full, Body};
use crate::pipeline::headers::ratelimit;
use crate::pipeline::identify::Ambiguous;
use crate::pipeline::upstream::ForwardError;

/// Why the gateway answered instead of the upstream.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("no route matches this request")]
    NoRoute,
    #[error("limit `{limit}` needs an identity this request does not carry")]
    MissingIdentity { limit: Arc<str> },
    #[error("header `{header}` must be an integer cost from 1 to {max}")]
    BadCost { header: String, max: u64 },
    /// An identity given twice (see [`Ambiguous`]).
    #[error("{0}")]
    AmbiguousIdentity(#[from] Ambiguous),
    /// A `consumers: required` route, and the request's API key is missing or nobody's.
    #[error("{}", if *key_present { "this API key belongs to no consumer" } else { "this route needs an API key" })]
    UnknownConsumer { key_present: bool },
    /// Refused by a limit: its 429, rendered but for the wait, and the wait in seconds.
    #[error("{}", limited_detail(&.refusal.route, &.refusal.limit, *.retry_after))]
    Limited {
        refusal: Arc<Refusal>,
        retry_after: u64,
    },
    #[error("rate-limit store unavailable: {0}")]
    StoreUnavailable(StoreError),
    #[error(transparent)]
    Upstream(#[from] ForwardError),
    /// A request the gateway will not pass on, though its head was framed: a path it cannot
    /// normalize safely, a host it cannot name, a method in lower case. The connection
    /// stays open.
    #[error("{0}")]
    BadRequest(String),
    /// A request whose body cannot be framed as the client meant it (a transfer coding other
    /// than `chunked`, a broken chunk). Answered with `Connection: close`: nothing after it on
    /// the connection can be trusted to start where the client thinks it does.
    #[error("{0}")]
    Unframeable(String),
    /// A request head larger than the gateway accepts.
    #[error("request header fields too large")]
    HeadTooLarge,
    /// `CONNECT` (a tunnel, not a request this gateway routes) or `TRACE` (an echo of the
    /// request's credentials).
    #[error("method {0} is not supported by this gateway")]
    MethodNotAllowed(http::Method),
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::NoRoute => StatusCode::NOT_FOUND,
            GatewayError::MissingIdentity { .. } | GatewayError::UnknownConsumer { .. } => {
                StatusCode::UNAUTHORIZED
            }
            GatewayError::BadCost { .. } | GatewayError::AmbiguousIdentity(_) => {
                StatusCode::BAD_REQUEST
            }
            GatewayError::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Upstream(ForwardError::Timeout(_)) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::Upstream(ForwardError::ClientBody(_)) => StatusCode::BAD_REQUEST,
            GatewayError::Upstream(ForwardError::ClientBodyTimeout(_)) => {
                StatusCode::REQUEST_TIMEOUT
            }
            GatewayError::Upstream(_) => StatusCode::BAD_GATEWAY,
            GatewayError::BadRequest(_) | GatewayError::Unframeable(_) => StatusCode::BAD_REQUEST,
            GatewayError::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// Whether the client's connection is closed after this answer: a request whose framing
    /// cannot be trusted, or whose body broke off, leaves the connection's bytes unknowable.
    fn closes(&self) -> bool {
        match self {
            GatewayError::Unframeable(_) => true,
            GatewayError::Upstream(e) => e.clients_fault(),
            _ => false,
        }
    }

    /// The outcome a request answered with this error counts as.
    pub fn outcome(&self) -> Outcome {
        match self {
            GatewayError::NoRoute => Outcome::NoRoute,
            GatewayError::MissingIdentity { .. }
            | GatewayError::BadCost { .. }
            | GatewayError::AmbiguousIdentity(_)
            | GatewayError::UnknownConsumer { .. } => Outcome::RejectedIdentity,
            GatewayError::Limited { .. } => Outcome::Limited,
            GatewayError::StoreUnavailable(_) => Outcome::StoreErrorDenied,
            GatewayError::Upstream(e) if e.clients_fault() => Outcome::RejectedRequest,
            GatewayError::BadRequest(_)
            | GatewayError::Unframeable(_)
            | GatewayError::HeadTooLarge
            | GatewayError::MethodNotAllowed(_) => Outcome::RejectedRequest,
            GatewayError::Upstream(_) => Outcome::UpstreamError,
        }
    }

    /// What the client is told. An upstream failure's cause (the target's address, a TLS or
    /// socket error) is the operator's, not the client's: the log has it
    /// ([`Gateway::forward`](super::Gateway)), the client the kind of failure, as nginx's
    /// and Envoy's own 502 and 504 pages say no more.
    fn public_detail(&self) -> String {
        match self {
            GatewayError::Upstream(ForwardError::Unreachable(_)) => "upstream unreachable".into(),
            GatewayError::Upstream(ForwardError::Timeout(_)) => "upstream timed out".into(),
            GatewayError::Upstream(ForwardError::Unreadable(_)) => {
                "upstream answer refused: its head could not be parsed".into()
            }
            _ => self.to_string(),
        }
    }

    /// The problem+json document (RFC 9457 §3.1). Rate limiting uses the IANA
    /// `quota-exceeded` problem type; the others are `about:blank` with the status title.
    pub fn problem(&self) -> Problem<'_> {
        let status = self.status();
        match self {
            GatewayError::Limited {
                refusal,
                retry_after,
            } => quota_exceeded(&refusal.route, &refusal.limit, *retry_after),
            _ => Problem {
                kind: "about:blank",
                title: status.canonical_reason().unwrap_or("Error"),
                status: status.as_u16(),
                detail: self.public_detail(),
                route: None,
                limit: None,
                retry_after: None,
                errors: None,
            },
        }
    }

    /// The gateway's answer: problem+json; a 429 carries `Retry-After` (whatever
    /// `responses.headers` says); an unframeable request closes the connection. The request
    /// id is added with every answer's other fields, by the pipeline's `respond` phase.
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        match &self {
            // The refusing limit's body was rendered when its table was applied.
            GatewayError::Limited {
                refusal,
                retry_after,
            } => {
                let mut res = with_body(status, refusal.body(*retry_after));
                ratelimit::set_retry_after(res.headers_mut(), *retry_after);
                res
            }
            _ if self.closes() => {
                let mut res = render(status, &self.problem());
                let close = HeaderValue::from_static("close");
                res.headers_mut().insert(CONNECTION, close);
                res
            }
            // RFC 9110 §15.5.6: a 405 MUST carry `Allow`; CONNECT and TRACE are the methods
            // refused.
            GatewayError::MethodNotAllowed(_) => {
                let mut res = render(status, &self.problem());
                let allow =
                    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
                res.headers_mut().insert(http::header::ALLOW, allow);
                res
            }
            // RFC 9110 §15.5.2: a 401 MUST carry a challenge. The credential is an API key
            // (or another identity) in a field, not a registered scheme: Kong's `Key` form.
            GatewayError::MissingIdentity { .. } | GatewayError::UnknownConsumer { .. } => {
                let mut res = render(status, &self.problem());
                let challenge = HeaderValue::from_static("Key realm=\"sluice\"");
                res.headers_mut().insert(WWW_AUTHENTICATE, challenge);
                res
            }
            _ => render(status, &self.problem()),
        }
    }
}

/// The problem document of a refusal by `route`'s limit `limit`, `secs` before a retry can
/// pass.
fn quota_exceeded<'a>(route: &'a str, limit: &'a str, secs: u64) -> Problem<'a> {
    Problem {
        kind: QUOTA_EXCEEDED,
        title: "Too Many Requests",
        status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
        detail: limited_detail(route, limit, secs),
        route: Some(route),
        limit: Some(limit),
        retry_after: Some(secs),
        errors: None,
    }
}

/// One limit's 429 body, rendered once per loaded table (by [`Problem::to_json`], the one
/// writer of problem documents) and cut around the two places its wait goes: the detail's
/// "retry in N s" and `retry_after`. A refusal then costs one allocation and four copies
/// instead of a document written member by member, each string scanned for escapes.
#[derive(Debug)]
pub struct Refusal {
    pub route: Arc<str>,
    pub limit: Arc<str>,
    /// The document up to the detail's wait.
    head: Box<[u8]>,
    /// From after the detail's wait up to `retry_after`'s value.
    middle: Box<[u8]>,
}

impl Refusal {
    pub fn new(route: Arc<str>, limit: Arc<str>) -> Refusal {
        let doc = quota_exceeded(&route, &limit, 0).to_json();
        // A `"` inside a JSON string is escaped, so this unescaped one ends the detail: the
        // first match is the detail's wait, whatever the names hold.
        const DETAIL_END: &[u8] = b"0 s\",\"route\":";
        let at = doc
            .windows(DETAIL_END.len())
            .position(|w| w == DETAIL_END)
            .expect("a refusal's detail ends with its wait");
        // The document ends `"retry_after":0}`.
        debug_assert!(doc.ends_with(b",\"retry_after\":0}"));
        let last = doc.len() - 2;
        Refusal {
            head: doc[..at].into(),
            middle: doc[at + 1..last].into(),
            route,
            limit,
        }
    }

    /// A refusal of every limit of `route`, by index of its limits.
    pub fn all(route: &Route) -> Vec<Arc<Refusal>> {
        let refusal = |l: &LimitRule| Arc::new(Refusal::new(route.name.clone(), l.name.clone()));
        route.limits.iter().map(refusal).collect()
    }

    /// The body for a wait of `secs`: the document [`GatewayError::problem`] renders for it.
    pub fn body(&self, secs: u64) -> Vec<u8> {
        let mut buf = [0; 20];
        let digits = ratelimit::decimal(secs, &mut buf);
        let len = self.head.len() + self.middle.len() + 2 * digits.len() + 1;
        // Exactly its length: the body takes the buffer over without a shared handle.
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&self.head);
        out.extend_from_slice(digits);
        out.extend_from_slice(&self.middle);
        out.extend_from_slice(digits);
        out.push(b'}');
        out
    }
}

/// A 429's detail: "rate limit `<route>/<limit>` exceeded; retry in <secs> s" (its Display
/// text too), built by hand: every refusal renders it.
fn limited_detail(route: &str, limit: &str, secs: u64) -> String {
    let mut buf = [0; 20];
    let digits = ratelimit::decimal(secs, &mut buf);
    let mut d = String::with_capacity(route.len() + limit.len() + digits.len() + 36);
    for part in ["rate limit `", route, "/", limit, "` exceeded; retry in "] {
        d.push_str(part);
    }
    // ASCII digits, pushed as they are (no UTF-8 check of bytes known to be digits).
    d.extend(digits.iter().map(|&b| char::from(b)));
    d.push_str(" s");
    d
}

/// An `about:blank` problem (RFC 9457 §4.2.1) with this status and detail: the admin API's
/// errors use it too, so every answer the gateway makes itself has one shape.
pub fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    problem_with_errors(status, detail, None)
}

/// [`problem`], listing `errors` (a rejected reload's config errors).
pub fn problem_with_errors(
    status: StatusCode,
    detail: &str,
    errors: Option<Vec<String>>,
) -> Response<Body> {
    let doc = Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail: detail.to_owned(),
        route: None,
        limit: None,
        retry_after: None,
        errors,
    };
    render(status, &doc)
}

/// The one renderer of problem documents.
fn render(status: StatusCode, doc: &Problem<'_>) -> Response<Body> {
    with_body(status, doc.to_json())
}

/// A gateway answer with this problem+json body.
fn with_body(status: StatusCode, mut json: Vec<u8>) -> Response<Body> {
    // Trimmed to its length (in place, when it is not already), so the body takes the
    // buffer over instead of allocating a shared handle for it.
    json.shrink_to_fit();
    let mut res = Response::new(full(Bytes::from(json)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// An RFC 9457 problem document. Absent members are left out.
#[derive(Debug)]
pub struct Problem<'a> {
    /// `type`.
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    pub route: Option<&'a str>,
    pub limit: Option<&'a str>,
    pub retry_after: Option<u64>,
    /// Every config error of a rejected reload (`POST /admin/reload`).
    pub errors: Option<Vec<String>>,
}

impl Problem<'_> {
    /// The document as JSON (RFC 8259), written directly rather than through a serializer:
    /// every 429 renders one, and this is a fixed shape of strings and integers.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(192 + self.detail.len());
        out.extend_from_slice(b"{\"type\":");
        json_str(&mut out, self.kind);
        out.extend_from_slice(b",\"title\":");
        json_str(&mut out, self.title);
        out.extend_from_slice(b",\"status\":");
        ratelimit::push_u64(&mut out, u64::from(self.status));
        out.extend_from_slice(b",\"detail\":");
        json_str(&mut out, &self.detail);
        if let Some(route) = self.route {
            out.extend_from_slice(b",\"route\":");
            json_str(&mut out, route);
        }
        if let Some(limit) = self.limit {
            out.extend_from_slice(b",\"limit\":");
            json_str(&mut out, limit);
        }
        if let Some(secs) = self.retry_after {
            out.extend_from_slice(b",\"retry_after\":");
            ratelimit::push_u64(&mut out, secs);
        }
        if let Some(errors) = &self.errors {
            out.extend_from_slice(b",\"errors\":[");
            for (i, e) in errors.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_str(&mut out, e);
            }
            out.push(b']');
        }
        out.push(b'}');
        out
    }
}

/// `s` as a JSON string (RFC 8259 §7): `"` and `\` escaped, control characters as `\u00XX`,
/// everything else (UTF-8 included) as is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Almost no string needs escaping: find that out with a scan that has no early exit
    // (it compiles to a vector loop, where testing byte by byte cost ~5 instructions a
    // byte on every 429), then copy the string whole.
    if bytes.iter().fold(false, |any, &b| any | needs_escape(b)) {
        escape(out, bytes);
    } else {
        out.extend_from_slice(bytes);
    }
    out.push(b'"');
}

fn needs_escape(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

fn escape(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::RETRY_AFTER;

    #[test]
    fn statuses() {
        assert_eq!(GatewayError::NoRoute.status(), 404);
        assert_eq!(
            GatewayError::MissingIdentity { limit: "l".into() }.status(),
            401
        );
        assert_eq!(
            GatewayError::BadCost {
                header: "x-cost".into(),
                max: 3
            }
            .status(),
            400
        );
        assert_eq!(
            GatewayError::StoreUnavailable(StoreError::Timeout).status(),
            503
        );
        assert_eq!(
            GatewayError::Upstream(ForwardError::Unreachable("x".into())).status(),
            502
        );
        assert_eq!(
            GatewayError::Upstream(ForwardError::Timeout("x".into())).status(),
            504
        );
    }

    #[test]
    fn quota_exceeded_problem() {
        let e = GatewayError::Limited {
            refusal: Arc::new(Refusal::new("login".into(), "per-ip".into())),
            retry_after: 12,
        };
        assert_eq!(
            e.problem().detail,
            e.to_string(),
            "the written detail is the Display text"
        );
        assert_eq!(
            e.to_string(),
            "rate limit `login/per-ip` exceeded; retry in 12 s"
        );
        let p: serde_json::Value = serde_json::from_slice(&e.problem().to_json()).unwrap();
        assert_eq!(
            p["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(p["title"], "Too Many Requests");
        assert_eq!(p["status"], 429);
        assert_eq!(p["route"], "login");
        assert_eq!(p["limit"], "per-ip");
        assert_eq!(p["retry_after"], 12);
        assert_eq!(
            p.as_object().unwrap().len(),
            7,
            "type, title, status, detail, route, limit, retry_after: {p}"
        );
        let res = e.into_response();
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(res.headers()[RETRY_AFTER], "12");
    }

    /// A refusal's pre-rendered body is, byte for byte, the document the one writer makes
    /// for the same names and wait: names that need escaping, names that look like the
    /// marks it is cut at, waits of every digit count.
    #[test]
    fn a_refusals_body_is_the_document_it_was_cut_from() {
        let names = [
            "r",
            "per-ip",
            "0 s\",\"route\":",
            "quote \" backslash \\ nul \u{0} tab \t \u{e9}\u{1f600}",
            "retry in 0 s",
            "",
        ];
        let waits = [0, 1, 9, 10, 59, 3600, 86_400 * 366, u64::MAX];
        for route in names {
            for limit in names {
                let refusal = Refusal::new(route.into(), limit.into());
                for secs in waits {
                    let body = refusal.body(secs);
                    let doc = quota_exceeded(route, limit, secs).to_json();
                    assert_eq!(
                        String::from_utf8_lossy(&body),
                        String::from_utf8_lossy(&doc),
                        "{route:?} {limit:?} {secs}"
                    );
                    assert_eq!(body.len(), body.capacity(), "allocated to its length");
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(v["route"], route);
                    assert_eq!(v["limit"], limit);
                    assert_eq!(v["retry_after"], secs);
                }
            }
        }
    }

    /// What the client receives is the pre-rendered body, and the answer is a complete 429.
    #[tokio::test]
    async fn a_refusal_answers_with_its_body() {
        use http_body_util::BodyExt;
        let e = GatewayError::Limited {
            refusal: Arc::new(Refusal::new("login".into(), "per-ip".into())),
            retry_after: 3,
        };
        let expected = e.problem().to_json();
        let res = e.into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER], "3");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], &expected[..]);
    }

    /// Whatever the strings hold, the document parses back to the same values (serde_json as
    /// the reference parser).
    #[test]
    fn problem_json_escapes_what_json_requires() {
        let nasty = "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} del \u{7f} \u{e9}\u{1f600} </script>";
        let doc = Problem {
            kind: "about:blank",
            title: "Bad Request",
            status: 400,
            detail: nasty.to_owned(),
            route: Some("r\"1"),
            limit: None,
            retry_after: Some(u64::MAX),
            errors: Some(vec![nasty.to_owned(), String::new()]),
        };
        let v: serde_json::Value = serde_json::from_slice(&doc.to_json()).unwrap();
        assert_eq!(v["detail"], nasty);
        assert_eq!(v["route"], "r\"1");
        assert_eq!(v["retry_after"], u64::MAX);
        assert_eq!(v["errors"], serde_json::json!([nasty, ""]));
        assert!(v.get("limit").is_none());
        let empty = Problem {
            errors: None,
            route: None,
            retry_after: None,
            ..doc
        };
        let v: serde_json::Value = serde_json::from_slice(&empty.to_json()).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 4, "{v}");
    }

    /// The whole-string scan must see one byte that needs escaping wherever it sits: every
    /// ASCII character at the start, middle and end of strings on both sides of the vector
    /// widths the scan may be compiled to.
    #[test]
    fn one_escaped_byte_anywhere_is_found() {
        for len in [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 200] {
            for c in (0u8..0x80).map(char::from) {
                for at in [0, len / 2, len - 1] {
                    let mut s: Vec<char> = vec!['a'; len];
                    s[at] = c;
                    let s: String = s.into_iter().collect();
                    let mut out = Vec::new();
                    json_str(&mut out, &s);
                    let back: String = serde_json::from_slice(&out)
                        .unwrap_or_else(|e| panic!("{c:?} at {at} of {len}: {e}"));
                    assert_eq!(back, s);
                    let escaped = needs_escape(c as u8);
                    assert_eq!(out.len() > s.len() + 2, escaped, "{c:?} at {at} of {len}");
                }
            }
        }
    }
}
