//! `X-Request-Id`: kept when the client sent a sane one, generated otherwise; forwarded
//! upstream and returned on every response, including the gateway's own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use http::header::{HeaderMap, HeaderName, HeaderValue};

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Take the client's id if it is 1–128 visible ASCII characters, else make one.
pub fn get_or_make(headers: &HeaderMap) -> HeaderValue {
    match headers.get(&X_REQUEST_ID) {
        Some(v)
            if !v.is_empty()
                && v.len() <= 128
                && v.as_bytes().iter().all(|b| b.is_ascii_graphic()) =>
        {
            v.clone()
        }
        _ => generate(),
    }
}

/// 32 hex digits: a random per-process prefix and a counter — unique across gateways
/// without a random draw per request.
pub fn generate() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        // Only a seed for request ids; no limit reads it.
        #[allow(clippy::disallowed_methods)]
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(seed);
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = [0u8; 32];
    hex(prefix, &mut id[..16]);
    hex(n, &mut id[16..]);
    HeaderValue::from_bytes(&id).expect("hex is a valid header value")
}

/// `v` as 16 lowercase hex digits into `out` (what `format!("{v:016x}")` writes, without the
/// formatting machinery on every request).
fn hex(v: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in out.iter_mut().enumerate() {
        *b = DIGITS[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_sane_ids_and_replaces_bad_ones() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(get_or_make(&h), "abc-123");
        h.insert(X_REQUEST_ID, HeaderValue::from_static("has space"));
        assert_ne!(get_or_make(&h), "has space");
        h.insert(
            X_REQUEST_ID,
            HeaderValue::from_str(&"x".repeat(129)).unwrap(),
        );
        assert_eq!(get_or_make(&h).len(), 32);
    }

    #[test]
    fn hex_matches_the_formatter() {
        for v in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef, 1 << 63] {
            let mut out = [0u8; 16];
            hex(v, &mut out);
            assert_eq!(std::str::from_utf8(&out).unwrap(), format!("{v:016x}"));
        }
    }

    #[test]
    fn generated_ids_are_unique() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }
}
