//! Request fields whose name holds an underscore are not forwarded, as nginx's default
//! (`underscores_in_headers off`) and gunicorn's have it.
//!
//! CGI, WSGI and Rack hand an upstream its fields as `HTTP_*` variables, where `-` and `_`
//! both become `_`: `X_Api_Key` and `X-Api-Key` are then one name, and which of them the
//! upstream reads depends on its server. The gateway counts `X-Api-Key`; if the upstream
//! could read a made-up value's twin under the other spelling, a fresh key per request would
//! go past every limit keyed by it. Field names with `_` are legal (RFC 9110 §5.1) but rare,
//! and the gateway itself still reads them (a limit may be keyed by one); only the upstream
//! does not get them.

use http::{HeaderMap, HeaderName};

/// A name the upstream does not get.
pub fn is_underscored(name: &HeaderName) -> bool {
    name.as_str().contains('_')
}

/// Remove every field whose name contains `_` (the request's
/// [`strip_request`](super::hop_by_hop::strip_request) calls this only once its pass over the
/// names found one).
pub fn strip(headers: &mut HeaderMap) {
    let found: Vec<_> = headers
        .keys()
        .filter(|k| is_underscored(k))
        .cloned()
        .collect();
    for name in found {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn names_with_an_underscore_go_and_the_rest_stay() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-api-key", "fresh"),
            ("x_api_key", "real"),
            ("X_Api_Key", "real2"),
            ("_", "x"),
            ("accept", "*/*"),
            ("x-forwarded-for", "1.2.3.4"),
        ] {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_static(v),
            );
        }
        strip(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-api-key", "x-forwarded-for"]);
        assert_eq!(h["x-api-key"], "fresh");
    }
}
