//! Stage 2 — identify the client: its IP (believing forwarding headers only from trusted
//! proxies), API key, user, and any header a limit is keyed by.

use std::borrow::Cow;
use std::net::IpAddr;

use base64::Engine;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

use crate::model::identity::{
    field_value, trimmed, ClientIpRules, IdentitySources, IpText, JwtSource,
};

impl ClientIpRules {
    /// The client address: the peer, or — when the peer is a trusted proxy — the rightmost
    /// address in `X-Forwarded-For` (else `Forwarded: for=`) that is not itself trusted.
    /// A malformed entry stops the walk: the last believed hop is then taken as the client,
    /// so a broken or hostile header can never mint new identities.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        // Read as bytes: a byte that is not ASCII spoils its own entry, not the entries the
        // proxies appended after it (nginx appends the peer to whatever the client sent).
        let mut hops: Vec<Option<IpAddr>> = Vec::new();
        for v in headers.get_all("x-forwarded-for") {
            hops.extend(v.as_bytes().split(|&b| b == b',').map(|h| {
                let h = std::str::from_utf8(h).ok()?;
                parse_hop(h.trim())
            }));
        }
        if hops.is_empty() {
            for v in headers.get_all("forwarded") {
                forwarded_for(v.as_bytes(), &mut hops);
            }
        }
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) => {
                    client = ip.to_canonical();
                    if !self.is_trusted(client) {
                        break;
                    }
                }
                None => break,
            }
        }
        client
    }
}

/// One X-Forwarded-For entry: an address, optionally with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse().ok())
}

/// The `for=` values of a `Forwarded` field (RFC 7239 §4), one per element that has one, in
/// order, into `hops`; `unknown` and obfuscated identifiers are not addresses. Elements and
/// pairs are split outside quoted strings, so `host="a,for=9.9.9.9"` is one pair whose quoted
/// text names nobody. An element that does not parse (a quote left open, a pair without `=`,
/// `for` twice, a byte that is not ASCII) is a malformed hop, which stops the walk there.
fn forwarded_for(v: &[u8], hops: &mut Vec<Option<IpAddr>>) {
    // A quote left open (a client's `for="x`, to which a proxy appended its own element on
    // the same line) cannot say where quoted text ends: the line is then split at every
    // comma, and the elements whose quotes do not pair are malformed. The proxies' elements,
    // appended to the right, still count, and whatever a client wrote stays to their left,
    // where the walk from the right stops first.
    let plain = || v.split(|&b| b == b',').collect();
    for elem in split_unquoted(v, b',').unwrap_or_else(plain) {
        if let Some(hop) = element_for(elem) {
            hops.push(hop);
        }
    }
}

/// One element's `for=` address: `None` without one, `Some(None)` if malformed.
fn element_for(elem: &[u8]) -> Option<Option<IpAddr>> {
    let Some(pairs) = split_unquoted(elem, b';') else {
        return Some(None);
    };
    let mut found = None;
    for pair in pairs {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Some(None);
        };
        if !pair[..eq].trim_ascii().eq_ignore_ascii_case(b"for") {
            continue;
        }
        if found.is_some() {
            return Some(None);
        }
        found = Some(unquote(pair[eq + 1..].trim_ascii()).and_then(|v| parse_hop(&v)));
    }
    found
}

/// `s` split at each `sep` outside a quoted string (RFC 9110 §5.6.4: `\` escapes the next
/// byte inside one); `None` if a quote is left open.
fn split_unquoted(s: &[u8], sep: u8) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in s.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ if b == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    (!quoted).then_some(parts)
}

/// A value as a token or a quoted string, its escapes undone (copied only then); `None` if it
/// is not ASCII.
fn unquote(v: &[u8]) -> Option<Cow<'_, str>> {
    let v = std::str::from_utf8(v).ok().filter(|v| v.is_ascii())?;
    let inner = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
    let Some(inner) = inner.filter(|i| i.contains('\\')) else {
        return Some(Cow::Borrowed(inner.unwrap_or(v)));
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(Cow::Owned(out))
}

/// An identity the request gives more than one value for. The gateway would count one while
/// the upstream may read another (the last of two fields or query parameters, as PHP and
/// Rails do; both joined, as Node does; the query's where the gateway read the header), so
/// a fresh value in the counted place would buy unlimited use of the one the upstream takes.
/// Answered 400, like Kong's "Duplicate API key found".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    #[error("`{0}` appears more than once")]
    Header(HeaderName),
    #[error("the query parameter `{0}` appears more than once")]
    Query(String),
    #[error("the API key differs between `{0}` and the query parameter `{1}`")]
    HeaderAndQuery(HeaderName, String),
}

impl IdentitySources {
    /// API key from the header, else the query string; empty counts as missing. Read from the
    /// header, it is borrowed, not copied. More than one value (see [`Ambiguous`]) is an error.
    pub fn api_key<'h>(
        &self,
        headers: &'h HeaderMap,
        query: Option<&str>,
    ) -> Result<Option<Cow<'h, str>>, Ambiguous> {
        let header = match &self.api_key_header {
            Some(h) => one_header(headers, h)?.map(|v| (h, v)),
            None => None,
        };
        let from_query = match (self.api_key_query.as_deref(), query) {
            (Some(name), Some(q)) => query_value(q, name)?.map(|v| (name, v)),
            _ => None,
        };
        Ok(match (header, from_query) {
            (Some((h, v)), Some((name, q))) if q != v => {
                return Err(Ambiguous::HeaderAndQuery(h.clone(), name.to_owned()))
            }
            (Some((_, v)), _) => Some(Cow::Borrowed(v)),
            (None, q) => q.map(|(_, v)| Cow::Owned(v)),
        })
    }

    /// User from the trusted header, or from a valid JWT; an invalid or expired token is missing.
    pub fn user<'h>(
        &self,
        headers: &'h HeaderMap,
        now_secs: u64,
    ) -> Result<Option<Cow<'h, str>>, Ambiguous> {
        if let Some(jwt) = &self.jwt {
            let token = one_header(headers, &jwt.header)?;
            return Ok(token.and_then(|t| jwt.user(t, now_secs)).map(Cow::Owned));
        }
        Ok(match &self.user_header {
            Some(h) => one_header(headers, h)?.map(Cow::Borrowed),
            None => None,
        })
    }
}

/// The one value of a query parameter, decoded, and held to a header value's rules (trimmed;
/// empty, or with a byte that is not visible ASCII, it counts as missing: a control byte could
/// otherwise spell another namespace's key, and `K%20` another counter for the key `K` an
/// upstream trims). Two of them, even an empty one beside a value, are [`Ambiguous::Query`].
///
/// Parameters are split on `;` as well as `&` (Rack 2, so Rails 6 and 7, reads `a=1;b=2` as
/// two), and their names are read as the upstream may read them ([`names`]): what any of them
/// takes for the key is the key here too.
fn query_value(query: &str, name: &str) -> Result<Option<String>, Ambiguous> {
    // Most queries cannot name it at all: one scan, nothing decoded or allocated.
    let stem = name.split(['_', ' ', '.', '[']).next().unwrap_or(name);
    if !stem.is_empty() && !contains_ignoring_case(query, stem) && !query.contains(['%', '+']) {
        return Ok(None);
    }
    let mut found: Option<String> = None;
    for pair in query.split(['&', ';']) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if names(k, name) {
            if found.is_some() {
                return Err(Ambiguous::Query(name.to_owned()));
            }
            found = Some(percent_decode(v));
        }
    }
    Ok(found.and_then(|v| {
        let t = field_value(&v)?;
        // Already as taken (the usual case): no second copy.
        if t.len() == v.len() {
            return Some(v);
        }
        Some(t.to_owned())
    }))
}

/// What PHP reads as `_` in a parameter's name.
const PHP_UNDERSCORES: [char; 3] = [' ', '.', '['];

/// Whether the parameter name `k`, as sent, names `name` as an upstream may read it: decoded;
/// as PHP reads names (leading spaces dropped; a space, `.` or `[` read as `_`), so that
/// `api.key=`, `api+key=` and `api[key=` are `$_GET['api_key']`; as an array (`api_key[]=`,
/// `api_key[0]=`: PHP and Rack make `api_key` a list holding the value, and a lookup by a list
/// still finds the key); and in any case (ASP.NET Core reads names so).
fn names(k: &str, name: &str) -> bool {
    let decoded;
    let k = if k.contains(['%', '+']) {
        decoded = percent_decode(k);
        decoded.as_str()
    } else {
        k
    };
    let php = |c: char| if PHP_UNDERSCORES.contains(&c) { '_' } else { c };
    let k = k.trim_start_matches(' ');
    let k = match k.find('[') {
        Some(i) if k[i..].contains(']') => &k[..i],
        _ => k,
    };
    k.len() == name.len()
        && k.chars()
            .map(php)
            .zip(name.chars().map(php))
            .all(|(a, b)| a.eq_ignore_ascii_case(&b))
}

/// Whether `hay` holds `needle`, ASCII letters in either case.
fn contains_ignoring_case(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A header's one value, trimmed; a missing, empty or non-visible-ASCII value is none, and
/// more than one field line is [`Ambiguous::Header`].
pub fn one_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, Ambiguous> {
    Ok(one_field(headers, name)?
        // `to_str` has checked every byte is visible ASCII (or a tab): only trimmed here.
        .and_then(|v| v.to_str().ok())
        .and_then(trimmed))
}

/// A field's one line, as sent; more than one is [`Ambiguous::Header`].
pub fn one_field<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, Ambiguous> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (Some(_), Some(_)) => Err(Ambiguous::Header(name.clone())),
        (v, _) => Ok(v),
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, bad escapes stay as they are.
pub(crate) fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (
                    b.get(i + 1).and_then(|&c| hex(c)),
                    b.get(i + 2).and_then(|&c| hex(c)),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The token of an `Authorization: Bearer <token>` value (RFC 6750 §2.1; the scheme is
/// case-insensitive, RFC 9110 §11.1). Any other scheme, or none, is no token at all: a bare
/// token must not authenticate, or a client could skip the scheme a verifying proxy checks.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

impl JwtSource {
    /// The user a verified, unexpired token in `value` (an `Authorization`-style field) names.
    fn user(&self, value: &str, now_secs: u64) -> Option<String> {
        let token = bearer_token(value)?;
        let mut it = token.split('.');
        let (h, p, sig) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header: serde_json::Value = serde_json::from_slice(&b64.decode(h).ok()?).ok()?;
        if header.get("alg")?.as_str()? != "HS256" {
            return None;
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).ok()?;
        mac.update(h.as_bytes());
        mac.update(b".");
        mac.update(p.as_bytes());
        mac.verify_slice(&b64.decode(sig).ok()?).ok()?;
        let claims: serde_json::Value = serde_json::from_slice(&b64.decode(p).ok()?).ok()?;
        if let Some(exp) = claims.get("exp") {
            if exp.as_u64().is_none_or(|exp| exp <= now_secs) {
                return None;
            }
        }
        match claims.get(&self.claim)? {
            // Any text an issuer may use (Unicode included), but no control character: those
            // could spell another namespace's key (see `limiter::key`).
            serde_json::Value::String(s) if !s.is_empty() && !s.chars().any(char::is_control) => {
                Some(s.clone())
            }
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// The identity facts of one request, each computed at most once and only if a limit asks.
pub struct Identity<'a> {
    pub client_ip: IpAddr,
    /// The `by: ip` value: the client IP, IPv6 grouped by prefix.
    pub ip_key: IpText,
    headers: &'a HeaderMap,
    query: Option<&'a str>,
    sources: &'a IdentitySources,
    api_key: std::cell::OnceCell<Result<Option<Cow<'a, str>>, Ambiguous>>,
    user: std::cell::OnceCell<Result<Option<Cow<'a, str>>, Ambiguous>>,
    /// The consumer whose key the request carries (routes with `consumers:` only).
    pub consumer: Option<&'a str>,
}

impl<'a> Identity<'a> {
    /// `forwarding_believed`: whether the headers may name the client at all (see
    /// `Ctx::forwarding_believed`); then `rules` say which hop it is.
    pub fn new(
        peer: IpAddr,
        forwarding_believed: bool,
        headers: &'a HeaderMap,
        query: Option<&'a str>,
        rules: &ClientIpRules,
        sources: &'a IdentitySources,
    ) -> Self {
        let client_ip = if forwarding_believed {
            rules.client_ip(peer, headers)
        } else {
            peer.to_canonical()
        };
        Identity {
            client_ip,
            ip_key: rules.group(client_ip),
            headers,
            query,
            sources,
            api_key: Default::default(),
            user: Default::default(),
            consumer: None,
        }
    }

    pub fn api_key(&self) -> Result<Option<&str>, Ambiguous> {
        self.api_key
            .get_or_init(|| self.sources.api_key(self.headers, self.query))
            .as_ref()
            .map(|v| v.as_deref())
            .map_err(Clone::clone)
    }

    pub fn user(&self) -> Result<Option<&str>, Ambiguous> {
        self.user
            .get_or_init(|| {
                // A token's `exp` is checked against the wall clock (as every JWT verifier
                // does); it decides who the client is, never how much it may send.
                #[allow(clippy::disallowed_methods)]
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                self.sources.user(self.headers, now)
            })
            .as_ref()
            .map(|v| v.as_deref())
            .map_err(Clone::clone)
    }

    pub fn header(&self, name: &HeaderName) -> Result<Option<&'a str>, Ambiguous> {
        one_header(self.headers, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn rules(trusted: &[&str]) -> ClientIpRules {
        ClientIpRules {
            trusted: trusted.iter().map(|s| s.parse().unwrap()).collect(),
            ipv6_prefix: 64,
        }
    }

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_it_claims() {
        let r = rules(&["10.0.0.0/8"]);
        let hdr = h(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(r.client_ip(ip("8.8.8.8"), &hdr), ip("8.8.8.8"));
    }

    #[test]
    fn trusted_peer_rightmost_untrusted_hop() {
        let r = rules(&["10.0.0.0/8", "127.0.0.1/32"]);
        // client spoofs 6.6.6.6; real client 1.2.3.4 reached proxy 10.0.0.2, then us.
        let hdr = h(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.2")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("1.2.3.4"));
        // Several header lines are one list, in order.
        let hdr = h(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("1.2.3.4"));
        // All hops trusted: the leftmost is the client.
        let hdr = h(&[("x-forwarded-for", "10.1.1.1, 10.0.0.2")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("10.1.1.1"));
        // No header: the peer itself.
        assert_eq!(
            r.client_ip(ip("127.0.0.1"), &HeaderMap::new()),
            ip("127.0.0.1")
        );
    }

    #[test]
    fn garbage_stops_the_walk_at_the_last_believed_hop() {
        let r = rules(&["10.0.0.0/8", "127.0.0.1/32"]);
        let hdr = h(&[("x-forwarded-for", "1.2.3.4, nonsense, 10.0.0.2")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("10.0.0.2"));
        let hdr = h(&[("x-forwarded-for", "")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("127.0.0.1"));
    }

    #[test]
    fn ports_and_brackets_in_hops() {
        let r = rules(&["127.0.0.1/32"]);
        let hdr = h(&[("x-forwarded-for", "1.2.3.4:5678")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("1.2.3.4"));
        let hdr = h(&[("x-forwarded-for", "[2001:db8::1]:443")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("2001:db8::1"));
    }

    #[test]
    fn forwarded_header_rfc7239() {
        let r = rules(&["127.0.0.1/32"]);
        let hdr = h(&[(
            "forwarded",
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711""#,
        )]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("2001:db8:cafe::17"));
        let hdr = h(&[("forwarded", "for=unknown")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("127.0.0.1"));
        // X-Forwarded-For wins when both are present.
        let hdr = h(&[("forwarded", "for=9.9.9.9"), ("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("1.2.3.4"));
    }

    /// A byte that is not ASCII spoils its own entry only: the hops a proxy appended after a
    /// client's `X-Forwarded-For: café` (nginx's `$proxy_add_x_forwarded_for`) still count,
    /// where the whole field used to be dropped and the proxy's own address taken.
    #[test]
    fn a_non_ascii_entry_spoils_only_itself() {
        let r = rules(&["127.0.0.1/32"]);
        let mut hdr = HeaderMap::new();
        let v = HeaderValue::from_bytes(b"caf\xe9, 203.0.113.50").unwrap();
        hdr.append("x-forwarded-for", v);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("203.0.113.50"));
        let mut hdr = HeaderMap::new();
        hdr.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        hdr.append("x-forwarded-for", HeaderValue::from_static("203.0.113.51"));
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("203.0.113.51"));
        let mut hdr = HeaderMap::new();
        let v = HeaderValue::from_bytes(b"for=\"caf\xe9\", for=203.0.113.61").unwrap();
        hdr.append("forwarded", v);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("203.0.113.61"));
        // The non-ASCII entry itself is still a malformed hop: the walk stops there.
        let r = rules(&["127.0.0.1/32", "10.0.0.0/8"]);
        let mut hdr = HeaderMap::new();
        let v = HeaderValue::from_bytes(b"6.6.6.6, caf\xe9, 10.0.0.2").unwrap();
        hdr.append("x-forwarded-for", v);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("10.0.0.2"));
    }

    /// RFC 7239 §4: a value may be a quoted string, and a `,` or `;` inside one separates
    /// nothing. A client-chosen `host="x;for=9.9.9.9"` (Spring Cloud Gateway quotes the
    /// client's Host there) must not name a client.
    #[test]
    fn forwarded_quoted_strings_hide_no_pairs() {
        let r = rules(&["127.0.0.1/32"]);
        for v in [
            r#"proto=http;host="x;for=9.9.8.1";for="5.5.5.5:1234""#,
            r#"for=5.5.5.5;host="a,for=9.9.9.1""#,
            r#"for=5.5.5.5;by="_x,for=9.9.7.1""#,
            r#"for=5.5.5.5;host="a\",for=9.9.6.1""#,
        ] {
            let hdr = h(&[("forwarded", v)]);
            assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("5.5.5.5"), "{v}");
        }
        // An unclosed quote spoils its own element only: a proxy's element appended on the
        // same line still counts, and what the client wrote stays to its left.
        for v in [
            r#"for="x, for=5.5.5.7"#,
            r#"for="x, for="5.5.5.7:80""#,
            r#"host="a,for=9.9.9.2, for=5.5.5.7"#,
        ] {
            let hdr = h(&[("forwarded", v)]);
            assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("5.5.5.7"), "{v}");
        }
        // Malformed: an unclosed quote, a pair without `=`, `for` twice in one element. The
        // walk stops at them (the proxy is the client), whatever the element holds.
        for v in [
            r#"for=5.5.5.5;host="a"#,
            "for=5.5.5.5;junk",
            "for=5.5.5.5;for=9.9.9.3",
        ] {
            let hdr = h(&[("forwarded", v)]);
            assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("127.0.0.1"), "{v}");
        }
        // Elements without `for` are passed over; escapes in a quoted `for` are undone.
        let hdr = h(&[("forwarded", r#"for="\5.5.5.6", proto=https"#)]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &hdr), ip("5.5.5.6"));
    }

    #[test]
    fn v4_mapped_peers_are_v4() {
        let r = rules(&["127.0.0.1/32"]);
        let hdr = h(&[("x-forwarded-for", "5.6.7.8")]);
        assert_eq!(r.client_ip(ip("::ffff:127.0.0.1"), &hdr), ip("5.6.7.8"));
        assert_eq!(r.group(ip("::ffff:1.2.3.4")), "1.2.3.4");
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let mut r = rules(&[]);
        assert_eq!(r.group(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(r.group(ip("2001:db8:1:2:bbbb::9")), "2001:db8:1:2::/64");
        r.ipv6_prefix = 128;
        assert_eq!(r.group(ip("2001:db8::1")), "2001:db8::1/128");
        r.ipv6_prefix = 48;
        assert_eq!(r.group(ip("2001:db8:1:2::1")), "2001:db8:1::/48");
        assert_eq!(r.group(ip("1.2.3.4")), "1.2.3.4");
    }

    fn sources() -> IdentitySources {
        IdentitySources {
            api_key_header: Some(HeaderName::from_static("x-api-key")),
            api_key_query: Some("api_key".into()),
            user_header: Some(HeaderName::from_static("x-user-id")),
            jwt: None,
        }
    }

    /// The API key `s` reads from headers `h` and query `q`, owned.
    fn api_key(
        s: &IdentitySources,
        h: &[(&str, &str)],
        q: Option<&str>,
    ) -> Result<Option<String>, Ambiguous> {
        s.api_key(&super::tests::h(h), q)
            .map(|k| k.map(Cow::into_owned))
    }

    #[test]
    fn api_key_header_then_query() {
        let s = sources();
        let key = |h: &[(&str, &str)], q: Option<&str>| api_key(&s, h, q);
        assert_eq!(key(&[("x-api-key", "k1")], None), Ok(Some("k1".into())));
        assert_eq!(
            key(&[("x-api-key", "k1")], Some("api_key=k1&a=2")),
            Ok(Some("k1".into())),
            "the same key in both places"
        );
        assert_eq!(key(&[], Some("a=1&api_key=k%202")), Ok(Some("k 2".into())));
        assert_eq!(key(&[("x-api-key", " ")], Some("api_key=")), Ok(None));
        assert_eq!(key(&[], None), Ok(None));
        assert_eq!(key(&[], Some("api_keyx=1")), Ok(None));
    }

    /// A query key is held to a header value's rules: trimmed, and missing when empty or not
    /// visible ASCII, so no control byte spells the `on_missing: ip` namespace
    /// (`%01ip%00<address>`) and no `K%20` is a counter apart from `K`.
    #[test]
    fn a_query_key_is_trimmed_and_visible_ascii() {
        let s = sources();
        let key = |q: &str| api_key(&s, &[], Some(q));
        assert_eq!(key("api_key=K%20"), Ok(Some("K".into())));
        assert_eq!(key("api_key=%09K+"), Ok(Some("K".into())));
        assert_eq!(key("api_key=%01ip%00203.0.113.7"), Ok(None));
        assert_eq!(key("api_key=Z%FF"), Ok(None));
        assert_eq!(key("api_key=%C3%A9"), Ok(None));
        assert_eq!(key("api_key=a%20b"), Ok(Some("a b".into())));
        assert_eq!(
            api_key(&s, &[("x-api-key", "K")], Some("api_key=K%20")),
            Ok(Some("K".into())),
            "the same key, trimmed, in both places"
        );
    }

    /// PHP reads `api.key`, `api+key` and `api[key` as `api_key`, PHP and Rack read
    /// `api_key[]` as a list holding the key, ASP.NET Core reads `API_KEY` as `api_key`, and
    /// Rack 2 splits on `;`: each of them names the key here too (alone, it is the key;
    /// beside another value, the request is ambiguous).
    #[test]
    fn a_query_key_is_named_as_upstreams_read_names() {
        let s = sources();
        let key = |q: &str| api_key(&s, &[], Some(q));
        for q in [
            "api.key=K",
            "api+key=K",
            "api%20key=K",
            "api[key=K",
            "a=1;api_key=K",
            "api_key[]=K",
            "api_key%5B%5D=K",
            "api_key[0]=K",
            "api.key[x][y]=K",
            "API_KEY=K",
            "Api_Key=K",
            "API%5FKEY=K",
        ] {
            assert_eq!(key(q), Ok(Some("K".into())), "{q}");
        }
        let twice = Err(Ambiguous::Query("api_key".into()));
        for q in [
            "api_key=junk&api.key=K",
            "api_key=junk;api_key=K",
            "api_key=junk&api[key=K",
            "api_key=junk&+api_key=K",
            "api_key=junk&api_key[]=K",
            "api_key[]=junk&api_key[]=K",
            "api_key=junk&API_KEY=K",
        ] {
            assert_eq!(key(q), twice, "{q}");
        }
        for q in [
            "api[key]=K",
            "apikey=K",
            "api_keys=K",
            "xapi_key=K",
            "api__key=K",
            "api_key]=K",
            "api[]_key=K",
        ] {
            assert_eq!(key(q), Ok(None), "{q}");
        }
    }

    /// Two values for one identity: the gateway would count one and the upstream might read
    /// the other, so a fresh value where the gateway looks buys unlimited use of the real one.
    #[test]
    fn an_api_key_or_user_given_twice_is_ambiguous() {
        let s = sources();
        let key = |h: &[(&str, &str)], q: Option<&str>| api_key(&s, h, q);
        let header = || Ambiguous::Header(HeaderName::from_static("x-api-key"));
        assert_eq!(
            key(&[("x-api-key", "a"), ("x-api-key", "b")], None),
            Err(header())
        );
        assert_eq!(
            key(&[("x-api-key", "a"), ("X-Api-Key", "a")], None),
            Err(header())
        );
        let query = Err(Ambiguous::Query("api_key".into()));
        assert_eq!(key(&[], Some("api_key=a&api_key=b")), query);
        assert_eq!(key(&[], Some("api_key=&api_key=b")), query);
        assert_eq!(key(&[], Some("api_key=a&api%5Fkey=a")), query);
        assert_eq!(
            key(&[("x-api-key", "a")], Some("api_key=b")),
            Err(Ambiguous::HeaderAndQuery(
                HeaderName::from_static("x-api-key"),
                "api_key".into()
            ))
        );
        assert_eq!(
            s.user(&h(&[("x-user-id", "a"), ("x-user-id", "b")]), 0),
            Err(Ambiguous::Header(HeaderName::from_static("x-user-id")))
        );
    }

    fn jwt(claims: &str, secret: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let head = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = b64.encode(claims.as_bytes());
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(format!("{head}.{body}").as_bytes());
        let sig = b64.encode(mac.finalize().into_bytes());
        format!("Bearer {head}.{body}.{sig}")
    }

    #[test]
    fn jwt_users() {
        let mut s = sources();
        s.jwt = Some(JwtSource {
            header: HeaderName::from_static("authorization"),
            secret: b"s3cret".to_vec(),
            claim: "sub".into(),
        });
        let ok = jwt(r#"{"sub":"alice","exp":2000}"#, b"s3cret");
        assert_eq!(
            s.user(&h(&[("authorization", &ok)]), 1000).unwrap(),
            Some("alice".into())
        );
        assert_eq!(
            s.user(&h(&[("authorization", &ok)]), 2000).unwrap(),
            None,
            "expired"
        );
        let forged = jwt(r#"{"sub":"alice"}"#, b"other");
        assert_eq!(
            s.user(&h(&[("authorization", &forged)]), 1000).unwrap(),
            None
        );
        let control = jwt(r#"{"sub":"\u0001ip\u00001.2.3.4","exp":2000}"#, b"s3cret");
        assert_eq!(
            s.user(&h(&[("authorization", &control)]), 1000).unwrap(),
            None,
            "a control character in the subject"
        );
        let unicode = jwt(r#"{"sub":"josé","exp":2000}"#, b"s3cret");
        assert_eq!(
            s.user(&h(&[("authorization", &unicode)]), 1000).unwrap(),
            Some("josé".into())
        );
        let no_exp = jwt(r#"{"sub":"bob"}"#, b"s3cret");
        assert_eq!(
            s.user(&h(&[("authorization", &no_exp)]), 1000).unwrap(),
            Some("bob".into())
        );
        assert_eq!(
            s.user(&h(&[("authorization", "Bearer x.y")]), 1000)
                .unwrap(),
            None
        );
        // The plain user header is not believed when JWT is configured.
        assert_eq!(s.user(&h(&[("x-user-id", "mallory")]), 1000).unwrap(), None);
        // Only the Bearer scheme carries a token (RFC 6750 §2.1), in any case (RFC 9110 §11.1).
        let bare = ok.strip_prefix("Bearer ").unwrap();
        assert_eq!(s.user(&h(&[("authorization", bare)]), 1000).unwrap(), None);
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let v = format!("{scheme} {bare}");
            assert_eq!(
                s.user(&h(&[("authorization", &v)]), 1000).unwrap(),
                Some("alice".into())
            );
        }
        for v in [format!("Basic {bare}"), format!("Token {bare}")] {
            assert_eq!(
                s.user(&h(&[("authorization", &v)]), 1000).unwrap(),
                None,
                "{v}"
            );
        }
    }

    #[test]
    fn bearer_token_needs_the_scheme_and_one_token() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer   abc"), Some("abc"));
        assert_eq!(bearer_token("abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer a b"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token("Basic abc"), None);
    }
}
