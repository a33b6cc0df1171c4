//! `X-Forwarded-For`, `-Proto` and `-Host` on the way upstream (the de-facto fields nginx,
//! Envoy and HAProxy send). The peer address is always appended to X-Forwarded-For; Proto
//! and Host are set by us unless the peer is a trusted proxy that already sent them.
//!
//! `Forwarded` (RFC 7239) says the same things in one field. The gateway does not write it,
//! but an upstream framework may read it (Spring, ASP.NET, Express with `trust proxy`), so a
//! client's `Forwarded: for=10.0.0.1;proto=https` would speak for the gateway: from a peer
//! that is not a trusted proxy it is removed, as that peer's Proto and Host are replaced.
//!
//! `X-Real-IP` is the client address many upstreams read (what nginx configs set with
//! `proxy_set_header X-Real-IP $remote_addr`, and Traefik sets by default): a
//! client's own would otherwise reach such an upstream as its address. It is set to the peer,
//! unless the peer is a trusted proxy: then the one it sent is kept, and if it sent none, the
//! client address resolved from its `X-Forwarded-For` (the `by: ip` address) is written.

use std::net::IpAddr;

use http::header::{Entry, HeaderMap, HeaderName, HeaderValue, FORWARDED, HOST};

pub const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// `peer` is the peer's IP as text (IPv4-mapped IPv6 as IPv4); `host` the request's
/// authority (Host header, or `:authority` for HTTP/2); `tls` whether the request reached the
/// gateway over TLS; `client` resolves the client address from the request's headers as
/// received (asked only when a trusted peer sent no `X-Real-IP`).
pub fn apply(
    headers: &mut HeaderMap,
    peer: &HeaderValue,
    peer_trusted: bool,
    host: Option<&HeaderValue>,
    tls: bool,
    client: impl FnOnce(&HeaderMap) -> IpAddr,
) {
    if !peer_trusted {
        headers.insert(X_REAL_IP, peer.clone());
    } else if !headers.contains_key(&X_REAL_IP) {
        let ip = client(headers).to_canonical().to_string();
        if let Ok(v) = HeaderValue::try_from(ip) {
            headers.insert(X_REAL_IP, v);
        }
    }
    // One lookup for reading the prior hops and writing the new value.
    match headers.entry(XFF) {
        // The usual case, the first proxy: the address alone.
        Entry::Vacant(e) => {
            e.insert(peer.clone());
        }
        Entry::Occupied(mut e) => {
            let mut joined: Vec<u8> = Vec::new();
            for v in e.iter() {
                joined.extend_from_slice(v.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(peer.as_bytes());
            // Replaces every prior line.
            if let Ok(v) = HeaderValue::try_from(joined) {
                e.insert(v);
            }
        }
    }
    if !peer_trusted {
        headers.remove(FORWARDED);
    }
    if !(peer_trusted && headers.contains_key(&XFP)) {
        let proto = if tls { "https" } else { "http" };
        headers.insert(XFP, HeaderValue::from_static(proto));
    }
    if !(peer_trusted && headers.contains_key(&XFH)) {
        match host.or_else(|| headers.get(HOST)).cloned() {
            Some(h) => headers.insert(XFH, h),
            None => headers.remove(XFH),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IP's text as the connection writes it once (IPv4-mapped IPv6 as IPv4).
    fn text(ip: &str) -> HeaderValue {
        let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 1);
        crate::pipeline::context::Peer::new(addr).text
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// For an untrusted peer: the client is the peer, nothing to resolve.
    fn unasked(_: &HeaderMap) -> IpAddr {
        panic!("the client address is resolved only behind a trusted proxy")
    }

    #[test]
    fn appends_peer_and_sets_proto_host() {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("api.example.com"));
        h.append(XFF, HeaderValue::from_static("1.1.1.1"));
        h.append(XFF, HeaderValue::from_static("2.2.2.2"));
        h.insert(XFP, HeaderValue::from_static("https"));
        h.insert(XFH, HeaderValue::from_static("spoofed"));
        h.append(
            FORWARDED,
            HeaderValue::from_static("for=10.0.0.1;proto=https"),
        );
        h.append(FORWARDED, HeaderValue::from_static("for=10.0.0.2"));
        apply(&mut h, &text("9.9.9.9"), false, None, false, unasked);
        assert!(
            h.get(FORWARDED).is_none(),
            "every line of an untrusted peer's Forwarded"
        );
        assert_eq!(h.get(XFF).unwrap(), "1.1.1.1, 2.2.2.2, 9.9.9.9");
        assert_eq!(h.get_all(XFF).iter().count(), 1);
        assert_eq!(
            h.get(XFP).unwrap(),
            "http",
            "untrusted peer cannot claim https"
        );
        assert_eq!(h.get(XFH).unwrap(), "api.example.com");
        assert_eq!(h.get(X_REAL_IP).unwrap(), "9.9.9.9");
    }

    #[test]
    fn x_real_ip_is_the_peer_unless_a_trusted_proxy_says() {
        // An untrusted client's own, every line of it, is replaced by its address.
        let mut h = HeaderMap::new();
        h.append(X_REAL_IP, HeaderValue::from_static("10.0.0.1"));
        h.append(X_REAL_IP, HeaderValue::from_static("10.0.0.2"));
        apply(&mut h, &text("::ffff:9.9.9.9"), false, None, false, unasked);
        let all: Vec<_> = h.get_all(X_REAL_IP).iter().collect();
        assert_eq!(all, ["9.9.9.9"]);
        // A trusted proxy's is kept, and the client is not resolved.
        let mut h = HeaderMap::new();
        h.insert(X_REAL_IP, HeaderValue::from_static("5.6.7.8"));
        apply(&mut h, &text("10.0.0.1"), true, None, false, unasked);
        assert_eq!(h.get(X_REAL_IP).unwrap(), "5.6.7.8");
        // A trusted proxy that sent none: the client resolved from the headers as received
        // (before this hop is appended to X-Forwarded-For), IPv4-mapped written as IPv4.
        let mut h = HeaderMap::new();
        h.insert(XFF, HeaderValue::from_static("1.2.3.4"));
        apply(&mut h, &text("10.0.0.1"), true, None, false, |h| {
            assert_eq!(h.get(XFF).unwrap(), "1.2.3.4");
            ip("::ffff:1.2.3.4")
        });
        assert_eq!(h.get(X_REAL_IP).unwrap(), "1.2.3.4");
        assert_eq!(h.get(XFF).unwrap(), "1.2.3.4, 10.0.0.1");
    }

    #[test]
    fn tls_sets_https_unless_a_trusted_proxy_said_otherwise() {
        let mut h = HeaderMap::new();
        h.insert(XFP, HeaderValue::from_static("http"));
        apply(&mut h, &text("9.9.9.9"), false, None, true, unasked);
        assert_eq!(
            h.get(XFP).unwrap(),
            "https",
            "an untrusted client's value is replaced"
        );
        let mut h = HeaderMap::new();
        h.insert(XFP, HeaderValue::from_static("http"));
        apply(&mut h, &text("10.0.0.1"), true, None, true, |_| {
            ip("1.2.3.4")
        });
        assert_eq!(
            h.get(XFP).unwrap(),
            "http",
            "a trusted proxy's value is kept"
        );
    }

    #[test]
    fn trusted_peer_keeps_proto_and_host() {
        let mut h = HeaderMap::new();
        h.insert(XFP, HeaderValue::from_static("https"));
        h.insert(XFH, HeaderValue::from_static("public.example.com"));
        h.insert(
            FORWARDED,
            HeaderValue::from_static("for=1.2.3.4;proto=https"),
        );
        apply(
            &mut h,
            &text("::ffff:127.0.0.1"),
            true,
            Some(&HeaderValue::from_static("internal")),
            false,
            |_| ip("1.2.3.4"),
        );
        assert_eq!(h.get(XFF).unwrap(), "127.0.0.1");
        assert_eq!(h.get(XFP).unwrap(), "https");
        assert_eq!(h.get(XFH).unwrap(), "public.example.com");
        assert_eq!(h.get(FORWARDED).unwrap(), "for=1.2.3.4;proto=https");
    }

    #[test]
    fn authority_used_when_no_host_header() {
        let mut h = HeaderMap::new();
        apply(
            &mut h,
            &text("::1"),
            false,
            Some(&HeaderValue::from_static("h2.example.com")),
            false,
            unasked,
        );
        assert_eq!(h.get(XFF).unwrap(), "::1");
        assert_eq!(h.get(XFH).unwrap(), "h2.example.com");
    }
}
