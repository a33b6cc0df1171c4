//! `X-Request-Id`: kept when the client sent a sane one, generated otherwise; forwarded
//! upstream and returned on every response, including the gateway's own.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
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
///
/// Made `PER_CHUNK` at a time into one shared buffer per thread, each id a slice of it: one
/// allocation per chunk instead of two per request (a copy, then a shared header on its
/// first clone, as the id goes upstream and back).
pub fn generate() -> HeaderValue {
    thread_local! {
        static CHUNK: RefCell<(Bytes, usize)> = const { RefCell::new((Bytes::new(), 0)) };
    }
    CHUNK.with_borrow_mut(|(chunk, next)| {
        if *next * ID_LEN >= chunk.len() {
            *chunk = fill();
            *next = 0;
        }
        let id = chunk.slice(*next * ID_LEN..(*next + 1) * ID_LEN);
        *next += 1;
        HeaderValue::from_maybe_shared(id).expect("hex is a valid header value")
    })
}

const ID_LEN: usize = 32;
/// Ids per shared buffer.
const PER_CHUNK: u64 = 64;

/// The next [`PER_CHUNK`] ids, from one reservation of the process-wide counter.
fn fill() -> Bytes {
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
    let first = COUNTER.fetch_add(PER_CHUNK, Ordering::Relaxed);
    let mut ids = vec![0u8; ID_LEN * PER_CHUNK as usize];
    for (n, id) in (first..).zip(ids.chunks_exact_mut(ID_LEN)) {
        hex(prefix, &mut id[..16]);
        hex(n, &mut id[16..]);
    }
    Bytes::from(ids)
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
    fn generated_ids_are_unique_across_chunks_and_threads() {
        // Several chunks on each of several threads, each thread's ids from its own buffer.
        let per_thread = 3 * PER_CHUNK as usize + 5;
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (0..per_thread).map(|_| generate()).collect()))
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut prefixes = std::collections::HashSet::new();
        for t in threads {
            let ids: Vec<HeaderValue> = t.join().unwrap();
            for id in ids {
                let s = id.to_str().unwrap().to_owned();
                assert_eq!(s.len(), 32);
                assert!(s
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
                prefixes.insert(s[..16].to_owned());
                assert!(seen.insert(s), "an id was handed out twice");
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
        assert_eq!(prefixes.len(), 1, "one prefix per process");
    }
}
