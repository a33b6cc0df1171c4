//! Warnings about a config that loads but cannot do what it says: a route no request can
//! reach, because a route before it (the first match wins) matches every request it would.
//! Its limits then never apply, and nothing else would say so. Told by `sluice check`, and
//! logged at start and at each reload; the config still loads.

use super::position::Positions;
use super::ConfigError;
use crate::model::route::{HostMatch, Matcher, PathMatch};
use crate::model::table::Table;

/// One warning per route an earlier route shadows, at that route's `match`.
pub fn warnings(name: &str, pos: &Positions, table: &Table) -> Vec<ConfigError> {
    let routes = &table.routes;
    let mut out = Vec::new();
    for (j, later) in routes.iter().enumerate() {
        let Some(earlier) = routes[..j]
            .iter()
            .find(|r| covers(&r.matcher, &later.matcher))
        else {
            continue;
        };
        let p = pos.of(&format!("routes[{j}].match"));
        out.push(ConfigError {
            file: name.to_string(),
            line: p.line,
            col: p.col,
            message: format!(
                "route `{}` is never reached: route `{}` before it matches every request it would (the first match wins){}",
                later.name,
                earlier.name,
                if later.limits.is_empty() { "" } else { ", so its limits never apply" }
            ),
        });
    }
    out
}

/// Whether every request `b` matches, `a` matches too (as far as can be told without running a
/// regex: a regex path is taken to shadow nothing and to be shadowed only by a prefix of `/`).
fn covers(a: &Matcher, b: &Matcher) -> bool {
    let path = match (&a.path, &b.path) {
        (PathMatch::Prefix(p), PathMatch::Prefix(q) | PathMatch::Exact(q)) => q.starts_with(p),
        (PathMatch::Prefix(p), PathMatch::Regex(_)) => p == "/",
        (PathMatch::Exact(p), PathMatch::Exact(q)) => p == q,
        _ => false,
    };
    let methods = match (&a.methods, &b.methods) {
        (None, _) => true,
        (Some(m), Some(n)) => n.iter().all(|x| m.contains(x)),
        (Some(_), None) => false,
    };
    let host = match (&a.host, &b.host) {
        (None, _) => true,
        (Some(HostMatch::Exact(h)), Some(HostMatch::Exact(k))) => h.eq_ignore_ascii_case(k),
        (Some(HostMatch::Wildcard(s)), Some(HostMatch::Exact(k) | HostMatch::Wildcard(k))) => {
            k.len() > s.len() && k.to_ascii_lowercase().ends_with(&s.to_ascii_lowercase())
                || k.eq_ignore_ascii_case(s)
        }
        _ => false,
    };
    path && methods && host && a.headers.iter().all(|h| b.headers.contains(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue, Method};

    fn m(path: PathMatch) -> Matcher {
        Matcher::on(path)
    }

    fn prefix(p: &str) -> Matcher {
        m(PathMatch::Prefix(p.into()))
    }

    fn exact(p: &str) -> Matcher {
        m(PathMatch::Exact(p.into()))
    }

    #[test]
    fn what_shadows_what() {
        assert!(covers(&prefix("/"), &exact("/auth/login")));
        assert!(covers(&prefix("/api"), &prefix("/api/v2")));
        assert!(covers(&prefix("/api"), &exact("/apiary")));
        assert!(!covers(&prefix("/api/v2"), &prefix("/api")));
        assert!(covers(&exact("/a"), &exact("/a")));
        assert!(!covers(&exact("/a"), &prefix("/a")));
        let regex = || m(PathMatch::Regex(regex::Regex::new("^/x$").unwrap()));
        assert!(covers(&prefix("/"), &regex()));
        assert!(!covers(&prefix("/x"), &regex()));
        assert!(!covers(&regex(), &exact("/x")));

        // Narrower conditions on the earlier route leave the later one reachable …
        let mut post = prefix("/");
        post.methods = Some(vec![Method::POST]);
        assert!(!covers(&post, &exact("/login")));
        let mut login_post = exact("/login");
        login_post.methods = Some(vec![Method::POST]);
        assert!(covers(&post, &login_post));
        let mut hosted = prefix("/");
        hosted.host = Some(HostMatch::Exact("api.example.com".into()));
        assert!(!covers(&hosted, &exact("/login")));
        let mut same_host = exact("/login");
        same_host.host = Some(HostMatch::Exact("API.example.com".into()));
        assert!(covers(&hosted, &same_host));
        let mut wild = prefix("/");
        wild.host = Some(HostMatch::Wildcard(".example.com".into()));
        assert!(covers(&wild, &same_host));
        let mut apex = exact("/login");
        apex.host = Some(HostMatch::Exact("example.com".into()));
        assert!(!covers(&wild, &apex));
        let env = (
            HeaderName::from_static("x-env"),
            HeaderValue::from_static("prod"),
        );
        let mut prod = prefix("/");
        prod.headers = vec![env.clone()];
        assert!(!covers(&prod, &exact("/login")));
        let mut prod_login = exact("/login");
        prod_login.headers = vec![env];
        assert!(covers(&prod, &prod_login));
        // … and so do broader ones on the later route.
        assert!(covers(&prefix("/"), &prod_login));
    }
}
