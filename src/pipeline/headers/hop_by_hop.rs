//! Hop-by-hop fields (RFC 9110 §7.6.1): meaningful for one connection only, so a proxy
//! removes them in both directions — `Connection` and every field it names, plus the
//! well-known ones below. `Upgrade` (and `Connection: upgrade`) survive only for a
//! WebSocket pass-through, where the handshake itself must reach the other side.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::underscore;

/// The fields that are hop-by-hop whatever `Connection` says (RFC 9110 §7.6.1, and the
/// de-facto `Keep-Alive` and `Proxy-Connection`), indexed as [`fixed`] numbers them.
static FIXED: [HeaderName; 9] = [
    header::CONNECTION,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];
const CONNECTION_BIT: u16 = 1 << 0;
const UPGRADE_BIT: u16 = 1 << 1;

/// `name`'s index in [`FIXED`]. Switched on the length first: most names have a length no
/// fixed one has and cost one jump, the rest one or two comparisons (callgrind: 45
/// instructions per forwarded request fewer than one `match` on the string).
fn fixed(name: &HeaderName) -> Option<u32> {
    let s = name.as_str();
    let candidates: &[(&str, u32)] = match s.len() {
        2 => &[("te", 4)],
        7 => &[("upgrade", 1), ("trailer", 5)],
        10 => &[("connection", 0), ("keep-alive", 7)],
        16 => &[("proxy-connection", 8)],
        17 => &[("transfer-encoding", 6)],
        18 => &[("proxy-authenticate", 2)],
        19 => &[("proxy-authorization", 3)],
        _ => return None,
    };
    candidates.iter().find(|(n, _)| *n == s).map(|&(_, i)| i)
}

/// Is this an HTTP/1.1 WebSocket upgrade request (`Connection: upgrade` and one `Upgrade:
/// websocket`, RFC 6455 §4.1)? No other protocol is passed through: after an `h2c` upgrade
/// the client's requests would travel inside the tunnel, where no route, limit or path
/// normalization sees them ("h2c smuggling"; Envoy likewise passes only the upgrades it is
/// configured for). Any other `Upgrade` is removed like the hop-by-hop field it is, and the
/// request goes on as a plain one.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    upgrades_to_websocket(headers)
        && connection_names(headers).any(|n| n.eq_ignore_ascii_case("upgrade"))
}

/// Does a 101 answer switch to WebSocket: one `Upgrade: websocket` (RFC 6455 §4.2.2)?
pub fn upgrades_to_websocket(headers: &HeaderMap) -> bool {
    let mut upgrade = headers.get_all(header::UPGRADE).iter();
    match (upgrade.next(), upgrade.next()) {
        (Some(v), None) => v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"),
        _ => false,
    }
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

/// Remove an answer's hop-by-hop fields; with `keep_upgrade`, keep `Upgrade` and send
/// `Connection: upgrade`.
///
/// The fixed ones by one pass over the head's distinct names, noting which are present, then
/// removing only those (removing each of the nine by name would hash every one of them, twice
/// per request: the request and the answer). `Connection` is read only when present, and
/// each name it lists is removed by one lookup (any case), so a hostile head listing
/// thousands costs one pass over them, not a comparison per name and field.
pub fn strip(headers: &mut HeaderMap, keep_upgrade: bool) {
    strip_as(headers, keep_upgrade, Side::Answer);
}

/// An answer's trailers: its hop-by-hop fields, as [`strip`] removes a head's (they are the
/// upstream connection's, and an HTTP/2 client's stream is reset on them, RFC 9113 §8.2.2),
/// and the fields no trailer may carry (RFC 9110 §6.5.1: framing, routing, the content's own
/// metadata), which HTTP/2 clients refuse as a protocol error. HTTP/1.1 clients are sent no
/// trailers (hyper drops them).
pub fn strip_trailers(fields: &mut HeaderMap) {
    strip(fields, false);
    for name in [
        header::CONTENT_LENGTH,
        header::HOST,
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_RANGE,
    ] {
        fields.remove(name);
    }
}

/// [`strip`] for a request whose listed fields [`strip_listed`] already removed (its
/// `Connection` is not read again), and, in the same pass over the names, the fields
/// [`underscore`] keeps from the upstream.
pub fn strip_request(headers: &mut HeaderMap, keep_upgrade: bool) {
    strip_as(headers, keep_upgrade, Side::Request);
}

#[derive(PartialEq, Eq)]
enum Side {
    Request,
    Answer,
}

fn strip_as(headers: &mut HeaderMap, keep_upgrade: bool, side: Side) {
    let mut present = 0u16;
    let mut underscored = false;
    for k in headers.keys() {
        if let Some(i) = fixed(k) {
            present |= 1 << i;
        } else if side == Side::Request && underscore::is_underscored(k) {
            underscored = true;
        }
    }
    if keep_upgrade {
        present &= !UPGRADE_BIT;
    }
    if present & CONNECTION_BIT != 0 && side == Side::Answer {
        remove_listed(headers);
    }
    for (i, name) in FIXED.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if underscored {
        underscore::strip(headers);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Remove the fields `Connection` lists, before the request is routed, identified or costed:
/// they are for this connection only and never reach the upstream, so they must not decide
/// anything either. Otherwise `Connection: X-Api-Key` with a fresh `X-Api-Key` on every
/// request would be counted under a key of its own each time while the upstream serves it as
/// anonymous, out of reach of the per-IP fallback; `X-User-Id` likewise passes
/// `on_missing: reject`, and a `match.headers` field picks a route. One lookup when there is
/// no `Connection` (the usual HTTP/1.1 and every HTTP/2 request).
pub fn strip_listed(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        remove_listed(headers);
    }
}

fn remove_listed(headers: &mut HeaderMap) {
    // Copied out (one string, none for the usual `keep-alive` or `upgrade`) so the map can be
    // changed while they are read.
    let listed: String = connection_names(headers)
        .filter(|n| !exempt(n))
        .flat_map(|n| [n, ","])
        .collect();
    for n in listed.split_terminator(',') {
        // Not a valid field name: nothing by that name to remove.
        headers.remove(n);
    }
}

/// Names `Connection` may list that are not removed for it: `keep-alive` (the `Keep-Alive`
/// field) and `upgrade` (`Upgrade`, removed or kept for a pass-through), which the fixed pass
/// has already dealt with, and `host`: the target's authority (RFC 9110 §7.2) is not a
/// property of one connection, and the gateway forwards the host it routed the request on.
/// `close` is still looked up: RFC 9112 §9.6 reserves `Close` as a field name, and any other
/// field named by `Connection` goes whatever its name.
fn exempt(name: &str) -> bool {
    name.eq_ignore_ascii_case("keep-alive")
        || name.eq_ignore_ascii_case("upgrade")
        || name.eq_ignore_ascii_case("host")
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
    fn fixed_numbers_each_fixed_name_as_the_list_does_and_nothing_else() {
        for (i, name) in FIXED.iter().enumerate() {
            assert_eq!(fixed(name), Some(i as u32), "{name}");
        }
        // Names of the same lengths as fixed ones, and ones that merely contain them.
        for other in [
            "host",
            "user-agent",
            "tk",
            "trailers",
            "upgrade-insecure-requests",
            "x-connection",
            "content-encoding",
            "proxy-authorizatio",
            "access-control-max-age",
        ] {
            let name = HeaderName::from_bytes(other.as_bytes()).unwrap();
            assert_eq!(fixed(&name), None, "{other}");
        }
    }

    /// A request after `strip_listed`: the fixed list and the underscored names go in the same
    /// pass; an answer keeps its underscored names.
    #[test]
    fn strip_request_also_drops_underscored_names() {
        let pairs = [
            ("connection", "close, x-gone"),
            ("te", "trailers"),
            ("x_api_key", "real"),
            ("x-api-key", "fresh"),
            ("accept", "*/*"),
        ];
        let mut req = map(&pairs);
        strip_listed(&mut req);
        strip_request(&mut req, false);
        let mut left: Vec<&str> = req.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-api-key"]);

        let mut answer = map(&pairs);
        strip(&mut answer, false);
        let mut left: Vec<&str> = answer.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-api-key", "x_api_key"]);
    }

    /// RFC 9110 §7.6.1: what `Connection` lists goes before routing; the fixed list, the
    /// exempt names and `Connection` itself stay for [`strip`] (an upgrade is judged on them).
    #[test]
    fn strip_listed_removes_only_what_connection_names() {
        let mut h = map(&[
            ("connection", "close, X-Api-Key"),
            ("connection", "upgrade,host ,x-user-id"),
            ("upgrade", "websocket"),
            ("x-api-key", "k"),
            ("X-User-Id", "u"),
            ("host", "h"),
            ("te", "trailers"),
            ("x-other", "o"),
        ]);
        strip_listed(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["connection", "host", "te", "upgrade", "x-other"]);
        assert!(is_upgrade(&h));

        let mut none = map(&[("x-api-key", "k")]);
        strip_listed(&mut none);
        assert_eq!(none.len(), 1);
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
            ("close", "4"),
        ]);
        strip(&mut h, false);
        assert!(h.get("connection").is_none());
        assert!(h.get("close").is_none());
        assert!(h.get("x-secret").is_none());
        assert!(h.get("x-other").is_none());
        assert_eq!(h.get("x-kept").unwrap(), "3");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn host_named_by_connection_stays() {
        let mut h = map(&[
            ("connection", "Host, x-a"),
            ("host", "api.example.com"),
            ("x-a", "1"),
        ]);
        strip(&mut h, false);
        assert_eq!(h.get("host").unwrap(), "api.example.com");
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
            ("upgrade", " WebSocket ")
        ])));
    }

    /// Only WebSocket passes: `h2c` (RFC 7540 §3.2, removed from RFC 9113) would tunnel
    /// requests past routing and limits, and a list could let the upstream pick it.
    #[test]
    fn only_a_websocket_upgrade_passes() {
        for upgrade in [
            &[("upgrade", "h2c")][..],
            &[("upgrade", "websocket, h2c")],
            &[("upgrade", "h2c, websocket")],
            &[("upgrade", "websocket"), ("upgrade", "h2c")],
            &[("upgrade", "TLS/1.2")],
            &[("upgrade", "websocketx")],
        ] {
            let mut h = map(&[
                ("connection", "Upgrade, HTTP2-Settings"),
                ("http2-settings", "AAMAAABkAAQAAP__"),
            ]);
            for (n, v) in upgrade {
                h.append(*n, HeaderValue::from_static(v));
            }
            assert!(!is_upgrade(&h), "{upgrade:?}");
            strip(&mut h, false);
            assert!(h.is_empty(), "{upgrade:?}: {h:?}");
        }
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
        // Each listed name is one lookup, in any case.
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
