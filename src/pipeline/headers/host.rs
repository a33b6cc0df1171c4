//! The request's host: what `match.host` sees and what the upstream is sent as `Host`.
//!
//! A request the gateway cannot name exactly one host for is refused with 400, as nginx
//! does: the gateway would match and limit on one host while the upstream might serve
//! another.
//! - More than one `Host` field, or a value that is not `host[:port]` (RFC 9112 §3.2: a
//!   server MUST answer 400 to either), in the field or the target's authority; a name with
//!   an empty label (`a..b`) is not one either, as nginx has it.
//! - Userinfo (`user@`) in the target's authority or in `Host` (RFC 9110 §4.2.4: a recipient
//!   SHOULD treat it as an error).
//! - An HTTP/1.1 or HTTP/2 request with no host at all (RFC 9112 §3.2: a server MUST answer
//!   400 to an HTTP/1.1 request without `Host`). HTTP/1.0 may omit it; the upstream then
//!   gets the target's.
//!
//! An absolute-form target's authority (HTTP/2's `:authority` arrives the same way) is the
//! host, whatever `Host` says (RFC 9112 §3.2.2); on HTTP/2 a `Host` beside `:authority` must
//! name the same host (RFC 9113 §8.3.1).

use http::header::{HeaderMap, HeaderValue, HOST};
use http::{Uri, Version};

use crate::model::route::host_name;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("more than one `Host` field")]
    Duplicate,
    #[error("`Host` is not `host[:port]`")]
    Invalid,
    #[error("userinfo (`user@`) in the request's host")]
    Userinfo,
    #[error("an HTTP/1.1 or HTTP/2 request needs a `Host`")]
    Missing,
    #[error("`Host` names another host than `:authority`")]
    Mismatch,
}

/// The request's host, or why it has none the gateway can trust (`None`: an HTTP/1.0
/// request without one).
pub fn of(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Option<HeaderValue>, HostError> {
    let mut fields = headers.get_all(HOST).iter();
    let field = fields.next();
    if fields.next().is_some() {
        return Err(HostError::Duplicate);
    }
    if let Some(v) = field {
        check(v.as_bytes())?;
    }
    if let Some(a) = uri.authority() {
        if a.as_str().contains('@') {
            return Err(HostError::Userinfo);
        }
        check(a.as_str().as_bytes())?;
        // RFC 9113 §8.3.1: an HTTP/2 request whose `Host` names another host than its
        // `:authority` SHOULD be treated as malformed (HTTP/1.1's absolute form MUST ignore
        // `Host` instead, RFC 9112 §3.2.2). Compared as `match.host` compares: the name,
        // without port, case or the root's trailing dot.
        if version == Version::HTTP_2 {
            fn name(v: &[u8]) -> &str {
                std::str::from_utf8(v).map(host_name).unwrap_or_default()
            }
            if let Some(v) = field {
                if !name(v.as_bytes()).eq_ignore_ascii_case(name(a.as_str().as_bytes())) {
                    return Err(HostError::Mismatch);
                }
            }
        }
        return HeaderValue::from_str(a.as_str())
            .map(Some)
            .map_err(|_| HostError::Invalid);
    }
    match field {
        Some(v) => Ok(Some(v.clone())),
        None if version <= Version::HTTP_10 => Ok(None),
        None => Err(HostError::Missing),
    }
}

/// `uri-host [ ":" port ]` (RFC 3986 §3.2.2 and §3.2.3): a bracketed IP literal or a
/// non-empty reg-name / IPv4 address, then digits after one colon.
fn check(v: &[u8]) -> Result<(), HostError> {
    let (host, port) = if let Some(rest) = v.strip_prefix(b"[") {
        let end = rest
            .iter()
            .position(|&b| b == b']')
            .ok_or(HostError::Invalid)?;
        let literal = &rest[..end];
        let ok = !literal.is_empty()
            && literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        if !ok {
            return Err(HostError::Invalid);
        }
        match &rest[end + 1..] {
            [] => return Ok(()),
            [b':', port @ ..] => (None, port),
            _ => return Err(HostError::Invalid),
        }
    } else {
        match v.iter().rposition(|&b| b == b':') {
            Some(i) => (Some(&v[..i]), &v[i + 1..]),
            None => (Some(v), &[][..]),
        }
    };
    if !port.iter().all(u8::is_ascii_digit) {
        return Err(HostError::Invalid);
    }
    match host {
        None => Ok(()),
        Some(h) if h.contains(&b'@') => Err(HostError::Userinfo),
        // An empty label (`api.example.com..`, `a..b`, `.a`) names no host; it would miss
        // `match.host` while a resolver-minded upstream trims it. nginx answers 400 to `..`.
        Some(h) if h.first() == Some(&b'.') || h.windows(2).any(|w| w == b"..") => {
            Err(HostError::Invalid)
        }
        Some(h) if !h.is_empty() && h.iter().all(|&b| reg_name(b)) => Ok(()),
        Some(_) => Err(HostError::Invalid),
    }
}

/// A byte of a reg-name: unreserved, `%` of a percent-encoding, or a sub-delim.
fn reg_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(version: Version, target: &str, hosts: &[&str]) -> Result<Option<String>, HostError> {
        let mut headers = HeaderMap::new();
        for h in hosts {
            headers.append(HOST, HeaderValue::from_str(h).unwrap());
        }
        let uri: Uri = target.parse().unwrap();
        of(version, &uri, &headers).map(|h| h.map(|v| v.to_str().unwrap().to_owned()))
    }

    fn h11(target: &str, hosts: &[&str]) -> Result<Option<String>, HostError> {
        host(Version::HTTP_11, target, hosts)
    }

    #[test]
    fn one_valid_host_is_the_host() {
        for v in [
            "api.example.com",
            "api.example.com:8080",
            "API.Example.COM.",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "[::ffff:10.0.0.1]:8080",
            "xn--bcher-kva.example",
            "a_b.example",
            "host:",
        ] {
            assert_eq!(h11("/x", &[v]), Ok(Some(v.to_owned())), "{v}");
        }
    }

    /// RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
    /// HTTP/1.1 request message that lacks a Host header field and to any request message
    /// that contains more than one Host header field line or a Host header field with an
    /// invalid field value."
    #[test]
    fn two_hosts_an_invalid_one_or_none_on_http_1_1_are_refused() {
        assert_eq!(
            h11("/x", &["a.example", "b.example"]),
            Err(HostError::Duplicate)
        );
        assert_eq!(
            h11("/x", &["a.example", "a.example"]),
            Err(HostError::Duplicate)
        );
        for v in [
            "",
            "a.example/../x?y",
            "a.example/x",
            "a.example?x",
            "a.example#x",
            "a example",
            "a.example:80:80",
            "a.example:8o",
            ":80",
            "[::1",
            "[]",
            "[::1]x",
            "[::1]:8o",
            "[zz::1]",
            "a\"b",
            "a<b>",
            // Empty labels (nginx: 400); one trailing dot is a name (matched without it).
            "a.example..",
            "a..example",
            "..",
            "a.example..:80",
            ".a.example",
            ".",
        ] {
            assert_eq!(h11("/x", &[v]), Err(HostError::Invalid), "{v:?}");
        }
        assert_eq!(h11("/x", &[]), Err(HostError::Missing));
        assert_eq!(host(Version::HTTP_2, "/x", &[]), Err(HostError::Missing));
    }

    /// RFC 9110 §4.2.4: "A recipient SHOULD parse for userinfo and treat its presence as an
    /// error."
    #[test]
    fn userinfo_anywhere_is_refused() {
        assert_eq!(h11("/x", &["u@a.example"]), Err(HostError::Userinfo));
        assert_eq!(h11("/x", &["u:p@a.example:80"]), Err(HostError::Userinfo));
        assert_eq!(
            h11("http://u@a.example/x", &["a.example"]),
            Err(HostError::Userinfo)
        );
    }

    /// RFC 9112 §3.2.2: the target's authority is the host, whatever `Host` says; `Host`
    /// itself must still be one valid field.
    #[test]
    fn an_absolute_target_names_the_host() {
        assert_eq!(
            h11("http://b.example:81/x", &["a.example"]),
            Ok(Some("b.example:81".into()))
        );
        assert_eq!(h11("http://b.example/x", &[]), Ok(Some("b.example".into())));
        assert_eq!(
            h11("http://b.example/x", &["a.example", "c.example"]),
            Err(HostError::Duplicate)
        );
        assert_eq!(h11("http://b.example/x", &["a b"]), Err(HostError::Invalid));
        assert_eq!(
            h11("http://b.example../x", &["b.example"]),
            Err(HostError::Invalid)
        );
        assert_eq!(
            h11("http://b.example./x", &[]),
            Ok(Some("b.example.".into()))
        );
    }

    /// RFC 9113 §8.3.1: "A server SHOULD treat a request as malformed if it contains a Host
    /// header field that identifies an entity that differs from the entity in the
    /// `:authority` pseudo-header field."
    #[test]
    fn on_http_2_host_and_authority_agree() {
        fn h2(target: &str, hosts: &[&str]) -> Result<Option<String>, HostError> {
            host(Version::HTTP_2, target, hosts)
        }
        assert_eq!(
            h2("http://a.example/x", &["b.example"]),
            Err(HostError::Mismatch)
        );
        assert_eq!(
            h2("http://a.example/x", &["a.example.com"]),
            Err(HostError::Mismatch)
        );
        // The same name: another case, a port, the root's trailing dot.
        for same in [
            "A.Example",
            "a.example:443",
            "a.example.",
            "a.example.:8443",
        ] {
            assert_eq!(
                h2("http://a.example/x", &[same]),
                Ok(Some("a.example".into())),
                "{same}"
            );
        }
        assert_eq!(h2("http://a.example/x", &[]), Ok(Some("a.example".into())));
    }

    #[test]
    fn http_1_0_may_omit_the_host() {
        assert_eq!(host(Version::HTTP_10, "/x", &[]), Ok(None));
        assert_eq!(host(Version::HTTP_09, "/x", &[]), Ok(None));
        assert_eq!(
            host(Version::HTTP_10, "/x", &["a.example"]),
            Ok(Some("a.example".into()))
        );
        assert_eq!(
            host(Version::HTTP_10, "/x", &["a", "b"]),
            Err(HostError::Duplicate)
        );
    }
}
