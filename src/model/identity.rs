//! Who a client is, as configured: which proxies may name the client's address, how IPv6
//! clients are grouped, and where API keys and users are read from. The request-time reading
//! of these (headers, tokens) is the identify stage's (`crate::identify`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderName;
use ipnet::IpNet;

/// Who may tell us the client's address, and how IPv6 clients are grouped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIpRules {
    pub trusted: Vec<IpNet>,
    pub ipv6_prefix: u8,
}

impl ClientIpRules {
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The `by: ip` identity: IPv4 as is, IPv6 masked to `ipv6_prefix` (one customer often
    /// holds a whole /64, so per-address limits would be trivially evaded).
    pub fn group(&self, ip: IpAddr) -> String {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ipv4_text(v4),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let p = u32::from(self.ipv6_prefix.min(128));
                let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
                format!("{}/{}", Ipv6Addr::from(bits & mask), p)
            }
        }
    }
}

/// `ip` as text, as `to_string` writes it. Every request writes its client's address (its
/// `by: ip` identity, its `X-Forwarded-For`): an IPv4 one is written digit by digit, where
/// `to_string` goes through the formatting machinery and grows its string twice.
pub fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => ipv4_text(v4),
        IpAddr::V6(v6) => v6.to_string(),
    }
}

fn ipv4_text(ip: Ipv4Addr) -> String {
    let mut out = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

/// Where API keys and users are read from.
#[derive(Debug, Clone)]
pub struct IdentitySources {
    pub api_key_header: Option<HeaderName>,
    pub api_key_query: Option<String>,
    pub user_header: Option<HeaderName>,
    pub jwt: Option<JwtSource>,
}

/// `user: { jwt: ... }`: HS256 tokens, `exp` checked, the claim names the user.
#[derive(Clone)]
pub struct JwtSource {
    pub header: HeaderName,
    pub secret: Vec<u8>,
    pub claim: String,
}

impl std::fmt::Debug for JwtSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSource")
            .field("header", &self.header)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_to_string_writes_them() {
        for s in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "10.200.5.250",
            "::1",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: IpAddr = s.parse().unwrap();
            assert_eq!(ip_text(ip), s, "{s}");
        }
        for n in 0..=255u8 {
            let ip = IpAddr::from([n, 255 - n, n / 3, n.wrapping_mul(7)]);
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    #[test]
    fn ipv4_groups_are_the_address_and_ipv6_ones_the_prefix() {
        let rules = ClientIpRules {
            trusted: Vec::new(),
            ipv6_prefix: 64,
        };
        assert_eq!(rules.group("203.0.113.7".parse().unwrap()), "203.0.113.7");
        assert_eq!(rules.group("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1");
        assert_eq!(
            rules.group("2001:db8:1:2:3:4:5:6".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
    }
}
