//! Who a client is, as configured: which proxies may name the client's address, how IPv6
//! clients are grouped, and where API keys and users are read from. The request-time reading
//! of these (headers, tokens) is the identify stage's (`crate::identify`).

use std::net::{IpAddr, Ipv6Addr};

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
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let p = u32::from(self.ipv6_prefix.min(128));
                let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
                format!("{}/{}", Ipv6Addr::from(bits & mask), p)
            }
        }
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
