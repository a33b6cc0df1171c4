//! A route's limits as compiled: what a limit is keyed by, what a request costs, and the
//! parameters the stores decide with.

use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::params::Params;
use super::policy::OnMissing;

/// One part of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Ip,
    ApiKey,
    User,
    Header(HeaderName),
    /// The whole route shares one counter.
    Route,
    /// The consumer whose API key the request carries (missing when none matched).
    Consumer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Static(u64),
    Header {
        name: HeaderName,
        default: u64,
        max: u64,
    },
}

/// When a limit is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    /// Before forwarding: the request's `cost`, all-or-nothing with the route's other limits.
    Request,
    /// By the answer: the request passes while a cost-1 request would (nothing is charged
    /// then); once the upstream's response head is in, one store call charges it, even past
    /// the limit.
    Answer {
        /// Charge only answers with these statuses (`None`: every answer).
        when: Option<StatusSet>,
        cost: AnswerCost,
    },
    /// `algorithm: concurrency`: holds one slot from admission until the answer is done.
    InFlight,
}

/// What an answer-charged limit charges when it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerCost {
    Static(u64),
    /// The integer the upstream puts in `name`, clamped to `0..=max` (a negative one is 0,
    /// one too large for any integer type is `max`); `default` when it is absent or not an
    /// integer, and when there is no answer at all. Of several values (lines, or items of
    /// one comma-separated line), the largest: the
    /// gateway cannot tell which one the upstream meant, and charging less than it may have
    /// used is the way around the limit.
    ResponseHeader {
        name: HeaderName,
        default: u64,
        max: u64,
    },
}

impl AnswerCost {
    /// The charge for an answer carrying `headers` (`None`: there was no answer).
    pub fn of(&self, headers: Option<&http::HeaderMap>) -> u64 {
        match self {
            AnswerCost::Static(c) => *c,
            AnswerCost::ResponseHeader { name, default, max } => headers
                .into_iter()
                .flat_map(|h| h.get_all(name))
                .filter_map(|v| v.to_str().ok())
                // One line listing values is the same field as one line each (RFC 9110 §5.3).
                .flat_map(|v| v.split(','))
                .filter_map(|v| clamped(v.trim(), *max))
                .max()
                .unwrap_or(*default),
        }
    }
}

/// `s` as an integer clamped to `0..=max`: an optional sign and at least one digit, nothing
/// else (`None` otherwise).
fn clamped(s: &str, max: u64) -> Option<u64> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if negative {
        return Some(0);
    }
    Some(digits.parse::<u64>().map_or(max, |v| v.min(max)))
}

/// A set of HTTP status codes (100–599), from codes and classes like `5xx`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct StatusSet([u64; 10]);

impl StatusSet {
    pub fn insert(&mut self, code: u16) {
        if let Some(i) = usize::from(code).checked_sub(100).filter(|i| *i < 500) {
            self.0[i / 64] |= 1 << (i % 64);
        }
    }

    pub fn contains(&self, code: u16) -> bool {
        usize::from(code)
            .checked_sub(100)
            .filter(|i| *i < 500)
            .is_some_and(|i| self.0[i / 64] & (1 << (i % 64)) != 0)
    }
}

impl std::fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries((100..600).filter(|c| self.contains(*c)))
            .finish()
    }
}

/// A compiled limit of a route.
#[derive(Debug, Clone)]
pub struct LimitRule {
    pub name: Arc<str>,
    pub by: Vec<KeyPart>,
    pub params: Params,
    pub cost: Cost,
    pub shadow: bool,
    pub on_missing: OnMissing,
    /// `{prefix}{route}:{limit}:{algorithm}:`; the hashed identity follows in braces (a
    /// Redis Cluster hash tag). Rate and burst are not part of it, so editing them keeps state.
    pub key_base: String,
    /// The `RateLimit-Policy` item, computed at load (for calendar months, per request).
    pub policy: HeaderValue,
    /// `false`: never advertised in the RateLimit fields (its 429 still has Retry-After).
    pub headers: bool,
    /// A plan's limit (index into `Consumers::plans`), decided only for requests on that
    /// plan and keyed by consumer across routes; `None`: the route's own.
    pub plan: Option<usize>,
    /// Before forwarding, by the answer, or while in flight.
    pub charge: Charge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_sets_hold_exactly_what_was_put_in() {
        let mut s = StatusSet::default();
        for c in [100, 401, 403, 599] {
            s.insert(c);
        }
        s.insert(99);
        s.insert(600);
        let all: Vec<u16> = (0..1000).filter(|c| s.contains(*c)).collect();
        assert_eq!(all, [100, 401, 403, 599]);
        assert_eq!(format!("{s:?}"), "{100, 401, 403, 599}");
    }

    #[test]
    fn a_response_header_cost_is_clamped_and_defaults() {
        let cost = AnswerCost::ResponseHeader {
            name: HeaderName::from_static("x-tokens-used"),
            default: 7,
            max: 100,
        };
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("x-tokens-used", v.parse().unwrap());
            cost.of(Some(&h))
        };
        assert_eq!(with("42"), 42);
        assert_eq!(with(" 0 "), 0);
        assert_eq!(with("1000"), 100);
        assert_eq!(with("-3"), 0, "clamped to 0");
        assert_eq!(with("-0"), 0);
        assert_eq!(with("+5"), 5);
        assert_eq!(with("1.5"), 7);
        assert_eq!(with("-"), 7);
        assert_eq!(with("1e3"), 7);
        assert_eq!(with("99999999999999999999999"), 100, "clamped to max");
        assert_eq!(with("18446744073709551616"), 100);
        let mut two = http::HeaderMap::new();
        two.append("x-tokens-used", "1".parse().unwrap());
        two.append("x-tokens-used", "9".parse().unwrap());
        two.append("x-tokens-used", "junk".parse().unwrap());
        assert_eq!(cost.of(Some(&two)), 9, "the largest of several lines");
        // RFC 9110 §5.3: one line listing values is those lines. It was read as one value,
        // not an integer, so charged the default (free under `default: 0`).
        assert_eq!(with("30, 40"), 40);
        assert_eq!(with("40,40"), 40);
        assert_eq!(with("junk, 12"), 12);
        assert_eq!(with("a,b"), 7);
        assert_eq!(cost.of(Some(&http::HeaderMap::new())), 7);
        assert_eq!(cost.of(None), 7);
        assert_eq!(AnswerCost::Static(3).of(None), 3);
    }
}
