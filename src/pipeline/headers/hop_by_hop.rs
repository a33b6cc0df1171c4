//! Hop-by-hop fields (RFC 9110 §7.6.1): meaningful for one connection only, so a proxy
//! removes them in both directions — `Connection` and every field it names, plus the
//! well-known ones below. `Upgrade` (and `Connection: upgrade`) survive only for an upgrade
//! pass-through, where the handshake itself must reach the other side.

use std::collections::HashSet;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const ALWAYS: [HeaderName; 7] = [
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Is this an HTTP/1.1 upgrade request/response (`Connection: upgrade` + `Upgrade`)?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_names(headers).any(|n| n.eq_ignore_ascii_case("upgrade"))
}

fn connection_names(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Is `name` hop-by-hop whatever `Connection` says: `Connection` and `Upgrade` themselves
/// and the fixed list.
fn always(name: &HeaderName) -> bool {
    name == header::CONNECTION || name == header::UPGRADE || ALWAYS.contains(name)
}

/// Past this many names in `Connection`, each is looked up among the head's field names by
/// hash ([`present`]) rather than compared with each of them: a hostile head can list tens of
/// thousands (64 KiB of `a,a,...`) against up to 100 fields, millions of comparisons.
const SCAN: usize = 8;

/// The head's field names that `named` lists: one pass over the names, each lowercased into
/// one reused buffer and looked up among the head's (at most a hundred) distinct names.
fn present<'h>(headers: &'h HeaderMap, named: &[&str]) -> HashSet<&'h str> {
    let fields: HashSet<&str> = headers.keys().map(HeaderName::as_str).collect();
    let mut lower = String::new();
    let mut hit = HashSet::new();
    for n in named {
        lower.clear();
        lower.push_str(n);
        lower.make_ascii_lowercase();
        if let Some(f) = fields.get(lower.as_str()) {
            hit.insert(*f);
        }
    }
    hit
}

/// Remove hop-by-hop fields; with `keep_upgrade`, keep `Upgrade` and send `Connection: upgrade`.
///
/// One pass over the head's distinct names, removing only those present: most heads carry
/// none or only `Connection`, and removing each of the ten or so candidates by name would
/// hash every one of them, twice per request (the request and the answer).
pub fn strip(headers: &mut HeaderMap, keep_upgrade: bool) {
    let doomed: Vec<HeaderName> = {
        let named: Vec<&str> = connection_names(headers).collect();
        // Field names are stored lowercase; `Connection` may name them in any case.
        let many = (named.len() > SCAN).then(|| present(headers, &named));
        let listed = |k: &HeaderName| match &many {
            Some(set) => set.contains(k.as_str()),
            None => named.iter().any(|n| k.as_str().eq_ignore_ascii_case(n)),
        };
        headers
            .keys()
            .filter(|k| (always(k) || listed(k)) && !(keep_upgrade && *k == header::UPGRADE))
            .cloned()
            .collect()
    };
    for n in doomed {
        headers.remove(n);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn removes_the_fixed_list() {
        // RFC 9110 §7.6.1 and the de-facto Keep-Alive / Proxy-Connection.
        let mut h = map(&[
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authenticate", "Basic"),
            ("proxy-authorization", "Basic xyz"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("content-type", "text/plain"),
            ("authorization", "Bearer t"),
        ]);
        strip(&mut h, false);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-type"]);
    }

    #[test]
    fn removes_fields_named_by_connection() {
        // RFC 9110 §7.6.1: "a proxy ... MUST remove ... any header fields listed in Connection";
        // §5.1: names are case-insensitive; §5.3: every line of a listed field goes.
        let mut h = map(&[
            ("connection", "close, X-Secret , x-other"),
            ("x-secret", "1"),
            ("x-secret", "1b"),
            ("x-other", "2"),
            ("x-kept", "3"),
        ]);
        strip(&mut h, false);
        assert!(h.get("connection").is_none());
        assert!(h.get("x-secret").is_none());
        assert!(h.get("x-other").is_none());
        assert_eq!(h.get("x-kept").unwrap(), "3");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn several_connection_lines() {
        let mut h = map(&[
            ("connection", "x-a"),
            ("connection", "x-b"),
            ("x-a", "1"),
            ("x-b", "2"),
        ]);
        strip(&mut h, false);
        assert!(h.is_empty());
    }

    #[test]
    fn upgrade_pass_through_keeps_the_handshake() {
        let mut h = map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("keep-alive", "1"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_upgrade(&h));
        strip(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        assert!(h.get("keep-alive").is_none());
        assert_eq!(h.get("sec-websocket-key").unwrap(), "k");
    }

    #[test]
    fn upgrade_needs_both_fields() {
        assert!(!is_upgrade(&map(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&map(&[("connection", "upgrade")])));
        assert!(is_upgrade(&map(&[
            ("connection", "UPGRADE"),
            ("upgrade", "h2c")
        ])));
    }

    #[test]
    fn a_head_without_hop_by_hop_fields_is_left_as_is() {
        let mut h = map(&[
            ("host", "a"),
            ("x-a", "1"),
            ("x-a", "2"),
            ("content-length", "3"),
        ]);
        let before = h.clone();
        strip(&mut h, false);
        assert_eq!(h, before);
    }

    #[test]
    fn an_upgrade_named_by_connection_is_kept_only_for_the_pass_through() {
        let head = [("connection", "upgrade"), ("upgrade", "websocket")];
        let mut h = map(&head);
        strip(&mut h, false);
        assert!(h.is_empty());
        let mut h = map(&head);
        strip(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("connection").unwrap(), "upgrade");
    }

    #[test]
    fn a_connection_naming_thousands_of_fields_drops_exactly_those_named() {
        // Past `SCAN` names the lookup is by hash: same answer, any case.
        let mut list: Vec<String> = (0..5_000).map(|i| format!("X-N{i}")).collect();
        list.push("x-secret".into());
        let mut h = map(&[
            ("connection", &list.join(", ")),
            ("x-secret", "s"),
            ("x-kept", "k"),
        ]);
        for i in (0..5_000).step_by(500) {
            h.append(
                HeaderName::from_bytes(format!("x-n{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        h.append("x-n5000", HeaderValue::from_static("unlisted"));
        strip(&mut h, false);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["x-kept", "x-n5000"]);
    }
}
