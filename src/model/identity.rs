//! Who a client is, as configured: which proxies may name the client's address, how IPv6
//! clients are grouped, and where API keys and users are read from. The request-time reading
//! of these (headers, tokens) is the identify stage's (`crate::identify`).

use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderName;
use ipnet::IpNet;

/// A field value as identities take it: trimmed; none if empty or if a byte is not visible
/// ASCII (a space or tab inside is kept), as `HeaderValue::to_str` reads header values. One
/// rule for the identify stage (header and query keys), the admin API's key lookups and the
/// config's consumer keys, so that all three read a key alike.
pub fn field_value(v: &str) -> Option<&str> {
    let visible = |b: u8| b == b'\t' || (0x20..0x7f).contains(&b);
    trimmed(v).filter(|v| v.bytes().all(visible))
}

/// `v` without spaces and tabs at either end; none if that leaves nothing.
pub fn trimmed(v: &str) -> Option<&str> {
    Some(v.trim_matches([' ', '\t'])).filter(|v| !v.is_empty())
}

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
    pub fn group(&self, ip: IpAddr) -> IpText {
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpText::v4(v4),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let p = u32::from(self.ipv6_prefix.min(128));
                let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
                let mut text = IpText::default();
                // 39 bytes of address, `/`, 3 digits: always fits.
                let _ = write!(text, "{}/{}", Ipv6Addr::from(bits & mask), p);
                text
            }
        }
    }
}

/// An address (or a grouped IPv6 prefix) as text, held inline: every request writes its
/// client's (its `by: ip` identity, its `X-Forwarded-For`), and this costs no allocation.
/// The longest, `xxxx:…:xxxx/128`, is 43 bytes.
#[derive(Clone, Copy)]
pub struct IpText {
    len: u8,
    buf: [u8; 47],
}

impl Default for IpText {
    fn default() -> Self {
        IpText {
            len: 0,
            buf: [0; 47],
        }
    }
}

impl IpText {
    /// `ip` as text, as `to_string` writes it. IPv4 is written digit by digit, where
    /// `to_string` goes through the formatting machinery.
    #[inline]
    pub fn of(ip: IpAddr) -> IpText {
        match ip {
            IpAddr::V4(v4) => IpText::v4(v4),
            IpAddr::V6(v6) => {
                let mut text = IpText::default();
                // At most 39 bytes (RFC 5952 text of 8 groups): always fits.
                let _ = write!(text, "{v6}");
                text
            }
        }
    }

    #[inline]
    fn v4(ip: Ipv4Addr) -> IpText {
        let mut text = IpText::default();
        for (i, octet) in ip.octets().into_iter().enumerate() {
            if i > 0 {
                text.push(b'.');
            }
            if octet >= 100 {
                text.push(b'0' + octet / 100);
            }
            if octet >= 10 {
                text.push(b'0' + octet / 10 % 10);
            }
            text.push(b'0' + octet % 10);
        }
        text
    }

    fn push(&mut self, b: u8) {
        self.buf[usize::from(self.len)] = b;
        self.len += 1;
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever pushed (digits, hex, `.`, `:`, `/`).
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let at = usize::from(self.len);
        let end = at + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[at..end].copy_from_slice(s.as_bytes());
        self.len = end as u8;
        Ok(())
    }
}

impl std::ops::Deref for IpText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for IpText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for IpText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
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
            assert_eq!(IpText::of(ip), s, "{s}");
        }
        for n in 0..=255u8 {
            let ip = IpAddr::from([n, 255 - n, n / 3, n.wrapping_mul(7)]);
            assert_eq!(IpText::of(ip).as_str(), ip.to_string());
        }
    }

    #[test]
    fn the_longest_texts_fit() {
        let all = Ipv6Addr::from(u128::MAX);
        assert_eq!(IpText::of(IpAddr::V6(all)).as_str(), all.to_string());
        let rules = ClientIpRules {
            trusted: Vec::new(),
            ipv6_prefix: 128,
        };
        assert_eq!(
            rules.group(IpAddr::V6(all)),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"
        );
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
