//! Rate-limit fields on responses: the IETF draft-ietf-httpapi-ratelimit-headers-10
//! `RateLimit-Policy` / `RateLimit` structured fields, the legacy `X-RateLimit-*` trio, and
//! `Retry-After` (RFC 9110 §10.2.3, delay-seconds).

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::limiter::algo::{calendar, Algorithm, Decision, Params};
use crate::model::policy::HeadersMode;

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds a client must wait: ceil(µs / 10^6), at least 1 (RFC 9110 delay-seconds
/// cannot say "less than a second", and 0 would invite an immediate retry that fails).
pub fn retry_after_secs(retry_after_us: u64) -> u64 {
    retry_after_us.div_ceil(1_000_000).max(1)
}

/// The draft's policy item for one limit, computed once per config load:
/// `"<route>/<limit>";q=<N>;w=<window seconds>` (+ `;sluice-burst=<C>` for buckets).
/// A window that is not whole seconds is rounded up (`w` is an integer in the draft).
pub fn policy_value(route: &str, limit: &str, p: &Params) -> HeaderValue {
    policy_with_window(route, limit, p, p.window_us)
}

/// The policy item at `now_us` (Unix µs): for a calendar month, `w` is that month's length.
pub fn policy_at(route: &str, limit: &str, p: &Params, now_us: u64) -> HeaderValue {
    policy_with_window(route, limit, p, calendar::window_at(p, now_us))
}

fn policy_with_window(route: &str, limit: &str, p: &Params, window_us: u64) -> HeaderValue {
    let mut s = if p.algorithm == Algorithm::Concurrency {
        // Not a rate: a quota of requests at once, with no window.
        format!(
            "\"{route}/{limit}\";q={};qu=\"concurrent-requests\"",
            p.limit
        )
    } else {
        format!(
            "\"{route}/{limit}\";q={};w={}",
            p.limit,
            window_us.div_ceil(1_000_000)
        )
    };
    if p.algorithm.is_bucket() {
        s.push_str(&format!(";sluice-burst={}", p.capacity));
    }
    // A name outside [a-z0-9_-] is a config error, but the compiler still builds the rest of
    // the limit to report every error at once: never panic on one here.
    s.retain(|c| !c.is_control());
    HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Add the fields for `d`, the most constraining limit, according to `mode`. A concurrency
/// limit (`in_flight`) has no reset: `r` is its free slots and there is no `t`.
pub fn apply(
    headers: &mut HeaderMap,
    mode: HeadersMode,
    (route, limit): (&str, &str),
    policy: &HeaderValue,
    d: &Decision,
    in_flight: bool,
) {
    let reset = (!in_flight).then(|| d.reset_after_us.div_ceil(1_000_000));
    if matches!(mode, HeadersMode::Draft | HeadersMode::Both) {
        headers.insert(RATELIMIT_POLICY, policy.clone());
        // `"<route>/<limit>";r=<remaining>[;t=<reset>]`, written without the formatter and
        // into a buffer of its exact length (so the value takes it over, with no second
        // allocation): every answer on a limited route carries it.
        let (mut r, mut t) = ([0; 20], [0; 20]);
        let r = decimal(d.remaining, &mut r);
        let t = reset.map(|secs| decimal(secs, &mut t));
        let len = route.len() + limit.len() + 6 + r.len() + t.map_or(0, |t| 3 + t.len());
        let mut v = Vec::with_capacity(len);
        v.push(b'"');
        v.extend_from_slice(route.as_bytes());
        v.push(b'/');
        v.extend_from_slice(limit.as_bytes());
        v.extend_from_slice(b"\";r=");
        v.extend_from_slice(r);
        if let Some(t) = t {
            v.extend_from_slice(b";t=");
            v.extend_from_slice(t);
        }
        debug_assert_eq!(v.len(), len);
        headers.insert(RATELIMIT, HeaderValue::try_from(v).expect("ascii"));
    }
    if matches!(mode, HeadersMode::Legacy | HeadersMode::Both) {
        headers.insert(X_LIMIT, number(d.limit));
        headers.insert(X_REMAINING, number(d.remaining));
        if let Some(t) = reset {
            headers.insert(X_RESET, number(t));
        }
    }
}

/// `n`'s ASCII decimal digits, written into `buf` (what `{n}` formats, without the
/// formatter, and bytes rather than `str` so nothing checks them for UTF-8 again: the
/// `RateLimit` field and every 429 carry numbers).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// `n` in decimal, appended to `out`.
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal(n, &mut [0; 20]));
}

/// `n` as a field value in one allocation of its exact length (`HeaderValue::from(u64)`
/// makes two: a 20-byte buffer, then a shared handle for it).
pub fn number(n: u64) -> HeaderValue {
    HeaderValue::from_bytes(decimal(n, &mut [0; 20])).expect("ASCII digits")
}

pub fn set_retry_after(headers: &mut HeaderMap, secs: u64) {
    headers.insert(RETRY_AFTER, number(secs));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::Code;

    fn d(remaining: u64, reset_us: u64) -> Decision {
        Decision {
            code: Code::Allowed,
            limit: 5,
            remaining,
            retry_after_us: 0,
            reset_after_us: reset_us,
        }
    }

    #[test]
    fn push_u64_writes_decimal() {
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            let mut v = Vec::new();
            push_u64(&mut v, n);
            assert_eq!(String::from_utf8(v).unwrap(), n.to_string());
            assert_eq!(number(n), HeaderValue::from(n));
        }
    }

    #[test]
    fn retry_after_is_ceiling_seconds_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000_000), 1);
        assert_eq!(retry_after_secs(1_000_001), 2);
        assert_eq!(retry_after_secs(11_999_999), 12);
    }

    #[test]
    fn draft_policy_and_ratelimit() {
        let p = Params::new(Algorithm::SlidingLog, 5, 60_000_000, None).unwrap();
        let pol = policy_value("login", "per-ip", &p);
        assert_eq!(pol, "\"login/per-ip\";q=5;w=60");
        let g = Params::new(Algorithm::Gcra, 100, 60_000_000, Some(20)).unwrap();
        assert_eq!(
            policy_value("api", "per-user", &g),
            "\"api/per-user\";q=100;w=60;sluice-burst=20"
        );
        let w = Params::new(Algorithm::FixedWindow, 10, 1_500_000, None).unwrap();
        assert_eq!(policy_value("a", "b", &w), "\"a/b\";q=10;w=2");

        let mut h = HeaderMap::new();
        apply(
            &mut h,
            HeadersMode::Draft,
            ("login", "per-ip"),
            &pol,
            &d(3, 12_000_001),
            false,
        );
        assert_eq!(h.get(RATELIMIT).unwrap(), "\"login/per-ip\";r=3;t=13");
        assert_eq!(
            h.get(RATELIMIT_POLICY).unwrap(),
            "\"login/per-ip\";q=5;w=60"
        );
        assert!(h.get(X_LIMIT).is_none());
    }

    #[test]
    fn legacy_both_none() {
        let pol = HeaderValue::from_static("\"r/l\";q=5;w=60");
        let mut h = HeaderMap::new();
        apply(
            &mut h,
            HeadersMode::Legacy,
            ("r", "l"),
            &pol,
            &d(2, 500_000),
            false,
        );
        assert_eq!(h.get(X_LIMIT).unwrap(), "5");
        assert_eq!(h.get(X_REMAINING).unwrap(), "2");
        assert_eq!(h.get(X_RESET).unwrap(), "1");
        assert!(h.get(RATELIMIT).is_none());
        let mut h = HeaderMap::new();
        apply(&mut h, HeadersMode::Both, ("r", "l"), &pol, &d(2, 0), false);
        assert_eq!(h.get(RATELIMIT).unwrap(), "\"r/l\";r=2;t=0");
        assert_eq!(h.get(X_RESET).unwrap(), "0");
        let mut h = HeaderMap::new();
        apply(&mut h, HeadersMode::None, ("r", "l"), &pol, &d(2, 0), false);
        assert!(h.is_empty());
    }

    /// A concurrency limit: `qu="concurrent-requests"` (the draft's quota unit for requests
    /// at once), no `w`; the field has `r` (free slots) and no `t`, and no X-RateLimit-Reset.
    #[test]
    fn concurrency_has_a_quota_unit_and_no_window_or_reset() {
        let p = Params::concurrency(10, 30_000_000).unwrap();
        let pol = policy_value("api", "in-flight", &p);
        assert_eq!(pol, "\"api/in-flight\";q=10;qu=\"concurrent-requests\"");
        let mut h = HeaderMap::new();
        apply(
            &mut h,
            HeadersMode::Both,
            ("api", "in-flight"),
            &pol,
            &d(4, 0),
            true,
        );
        assert_eq!(h.get(RATELIMIT).unwrap(), "\"api/in-flight\";r=4");
        assert_eq!(h.get(X_REMAINING).unwrap(), "4");
        assert!(h.get(X_RESET).is_none());
    }
}
