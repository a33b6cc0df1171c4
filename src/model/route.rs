//! Stage 1 — match a request to a route: first match wins, in file order.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use regex::Regex;

use crate::model::consumer::ConsumerMode;
use crate::model::limit::LimitRule;
use crate::model::policy::OnError;

pub struct Route {
    pub name: Arc<str>,
    pub matcher: Matcher,
    /// Index into [`crate::model::table::Table::upstreams`].
    pub upstream: usize,
    pub strip_prefix: bool,
    pub on_store_error: OnError,
    /// The route's own limits, then (with `consumers`) every plan's limits, each tagged with
    /// its plan: a request is decided on its own and its plan's, by index into this list.
    pub limits: Vec<LimitRule>,
    /// `consumers:`: whether the caller's API key is looked up for a plan.
    pub consumers: Option<ConsumerMode>,
}

pub enum PathMatch {
    Exact(String),
    /// A plain string prefix, as in nginx and Envoy (`/api` matches `/apiary`).
    Prefix(String),
    /// Anchored at both ends when compiled.
    Regex(Regex),
}

pub enum HostMatch {
    Exact(String),
    /// `*.example.com`: stored as `.example.com`; matches deeper names only.
    Wildcard(String),
}

pub struct Matcher {
    pub path: PathMatch,
    pub methods: Option<Vec<Method>>,
    pub host: Option<HostMatch>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Matcher {
    /// A matcher of `path` alone (any method, host and fields), for tests.
    #[cfg(test)]
    pub(crate) fn on(path: PathMatch) -> Matcher {
        Matcher {
            path,
            methods: None,
            host: None,
            headers: Vec::new(),
        }
    }

    pub fn matches(
        &self,
        method: &Method,
        path: &str,
        host: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        let path_ok = match &self.path {
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Regex(r) => r.is_match(path),
        };
        path_ok
            && self.methods.as_ref().is_none_or(|m| m.contains(method))
            && self
                .host
                .as_ref()
                .is_none_or(|h| host.is_some_and(|host| host_matches(h, host)))
            // Any line of the field, and any item of a line's list: with `X-Env: staging` and
            // `X-Env: prod` on one request, or `X-Env: staging, prod` (the same field, RFC 9110
            // §5.3), an upstream may act on either, so the route (and the limit) for `prod`
            // applies.
            && self
                .headers
                .iter()
                .all(|(n, v)| headers.get_all(n).iter().any(|have| has_item(have, v)))
    }

    /// The path to send upstream when `strip_prefix` is set: the matched prefix removed, and
    /// always starting with `/` (`/api` on `/apiary` leaves `/ary`, as nginx and Envoy do).
    pub fn strip<'a>(&self, path: &'a str) -> Cow<'a, str> {
        let rest = match &self.path {
            PathMatch::Prefix(p) | PathMatch::Exact(p) => path.get(p.len()..).unwrap_or(path),
            PathMatch::Regex(_) => path,
        };
        if rest.starts_with('/') {
            Cow::Borrowed(rest)
        } else {
            Cow::Owned(format!("/{rest}"))
        }
    }
}

/// `have` is `want`, or a comma-separated list with `want` as one of its items (optional
/// whitespace around them). A `want` with a comma in it is compared whole.
fn has_item(have: &HeaderValue, want: &HeaderValue) -> bool {
    have == want
        || (have.as_bytes().contains(&b',')
            && !want.as_bytes().contains(&b',')
            && have
                .as_bytes()
                .split(|&b| b == b',')
                .any(|item| item.trim_ascii() == want.as_bytes()))
}

/// Host compared without port and case (RFC 9110 §4.2.3: the host is case-insensitive), and
/// without the root's trailing dot: `api.example.com.` is the same name (as nginx's
/// `server_name` matching has it), and would otherwise miss the route that limits it.
fn host_matches(m: &HostMatch, host: &str) -> bool {
    let host = host_name(host);
    match m {
        HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
        HostMatch::Wildcard(suffix) => {
            host.len() > suffix.len()
                && host.as_bytes()[host.len() - suffix.len()..]
                    .eq_ignore_ascii_case(suffix.as_bytes())
        }
    }
}

/// The name a `host[:port]` is matched by: without its port and the root's trailing dot
/// (compare it without case).
pub fn host_name(host: &str) -> &str {
    let host = strip_port(host);
    host.strip_suffix('.').unwrap_or(host)
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host.split(']').next().map_or(host, |h| &h[1..]);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// The index of the first route matching the request.
pub fn find(
    routes: &[Route],
    method: &Method,
    path: &str,
    host: Option<&str>,
    headers: &HeaderMap,
) -> Option<usize> {
    routes
        .iter()
        .position(|r| r.matcher.matches(method, path, host, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: PathMatch) -> Matcher {
        Matcher::on(path)
    }

    #[test]
    fn prefix_is_a_plain_string_prefix() {
        let p = m(PathMatch::Prefix("/api".into()));
        let h = HeaderMap::new();
        assert!(p.matches(&Method::GET, "/api", None, &h));
        assert!(p.matches(&Method::GET, "/apiary", None, &h));
        assert!(!p.matches(&Method::GET, "/ap", None, &h));
    }

    #[test]
    fn exact_and_regex() {
        let h = HeaderMap::new();
        let e = m(PathMatch::Exact("/auth/login".into()));
        assert!(e.matches(&Method::POST, "/auth/login", None, &h));
        assert!(!e.matches(&Method::POST, "/auth/login/", None, &h));
        let r = m(PathMatch::Regex(Regex::new("^(?:/users/[0-9]+)$").unwrap()));
        assert!(r.matches(&Method::GET, "/users/42", None, &h));
        assert!(!r.matches(&Method::GET, "/users/42/x", None, &h));
    }

    /// A field on several lines matches when any line does: an upstream may act on either.
    #[test]
    fn a_header_on_several_lines_matches_by_any_of_them() {
        let mut x = m(PathMatch::Prefix("/".into()));
        x.headers = vec![(
            HeaderName::from_static("x-env"),
            HeaderValue::from_static("prod"),
        )];
        let mut h = HeaderMap::new();
        h.append("x-env", HeaderValue::from_static("staging"));
        assert!(!x.matches(&Method::GET, "/", None, &h));
        h.append("x-env", HeaderValue::from_static("prod"));
        assert!(x.matches(&Method::GET, "/", None, &h));
        // The same as one line's list (RFC 9110 §5.3), whatever the whitespace.
        for list in ["staging, prod", "prod,staging", "a ,\tprod\t, b"] {
            let mut h = HeaderMap::new();
            h.insert("x-env", HeaderValue::from_static(list));
            assert!(x.matches(&Method::GET, "/", None, &h), "{list}");
        }
        for other in ["staging, production", "prod-eu, x", "Prod"] {
            let mut h = HeaderMap::new();
            h.insert("x-env", HeaderValue::from_static(other));
            assert!(!x.matches(&Method::GET, "/", None, &h), "{other}");
        }
        // A wanted value with a comma is compared whole.
        x.headers[0].1 = HeaderValue::from_static("a, b");
        let mut h = HeaderMap::new();
        h.insert("x-env", HeaderValue::from_static("a, b"));
        assert!(x.matches(&Method::GET, "/", None, &h));
        h.insert("x-env", HeaderValue::from_static("a, b, c"));
        assert!(!x.matches(&Method::GET, "/", None, &h));
    }

    #[test]
    fn methods_hosts_headers() {
        let mut x = m(PathMatch::Prefix("/".into()));
        x.methods = Some(vec![Method::POST]);
        x.host = Some(HostMatch::Wildcard(".example.com".into()));
        x.headers = vec![(
            HeaderName::from_static("x-env"),
            HeaderValue::from_static("prod"),
        )];
        let mut h = HeaderMap::new();
        h.insert("x-env", HeaderValue::from_static("prod"));
        assert!(x.matches(&Method::POST, "/", Some("API.Example.com:8080"), &h));
        assert!(x.matches(&Method::POST, "/", Some("a.b.example.com"), &h));
        assert!(!x.matches(&Method::POST, "/", Some("example.com"), &h));
        assert!(!x.matches(&Method::POST, "/", Some("badexample.com"), &h));
        assert!(!x.matches(&Method::GET, "/", Some("a.example.com"), &h));
        assert!(!x.matches(&Method::POST, "/", None, &h));
        h.insert("x-env", HeaderValue::from_static("dev"));
        assert!(!x.matches(&Method::POST, "/", Some("a.example.com"), &h));
        let exact = Matcher {
            host: Some(HostMatch::Exact("api.example.com".into())),
            ..m(PathMatch::Prefix("/".into()))
        };
        assert!(exact.matches(
            &Method::GET,
            "/",
            Some("API.EXAMPLE.COM"),
            &HeaderMap::new()
        ));
        assert!(!exact.matches(
            &Method::GET,
            "/",
            Some("x.api.example.com"),
            &HeaderMap::new()
        ));
    }

    #[test]
    fn strip_prefix_never_leaves_an_empty_path() {
        let p = m(PathMatch::Prefix("/api".into()));
        assert_eq!(p.strip("/api/users"), "/users");
        assert_eq!(p.strip("/api"), "/");
        assert_eq!(p.strip("/apiary"), "/ary");
    }

    #[test]
    fn a_fully_qualified_host_is_the_same_name() {
        let exact = HostMatch::Exact("api.example.com".into());
        let wild = HostMatch::Wildcard(".example.com".into());
        for h in [
            "api.example.com.",
            "API.example.com.:8080",
            "api.example.com",
        ] {
            assert!(host_matches(&exact, h), "{h}");
            assert!(host_matches(&wild, h), "{h}");
        }
        assert!(!host_matches(&exact, "api.example.com.."));
        assert!(!host_matches(&wild, "example.com."));
    }

    #[test]
    fn ports_and_v6_hosts() {
        assert_eq!(strip_port("a.com:80"), "a.com");
        assert_eq!(strip_port("[::1]:80"), "::1");
        assert_eq!(strip_port("a.com"), "a.com");
    }
}
