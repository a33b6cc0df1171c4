//! The one key builder: how a limit's identity becomes a store key. The request path and the
//! admin API (`/admin/limits/…?key=`) both build keys here, so a key an operator peeks or
//! resets is exactly the key requests are charged on.
//!
//! Key: `{prefix}{route}:{limit}:{algorithm}:{HASH}` with HASH 128 bits of SHA-256 of the
//! identity material, in hex, in braces (a Redis Cluster hash tag). Identities never appear
//! in clear in a key; rate and burst are not part of it, so editing them keeps the counters.

use sha2::{Digest, Sha256};

/// Marks the `on_missing: ip` fallback: an API key equal to an IP string is another client.
const IP_FALLBACK: &str = "\u{1}ip\0";

/// Separates the parts of a composite key (`by: [ip, api_key]`).
const PART_SEPARATOR: char = '\0';

/// The material of an identity whose parts (in `by` order) are `values`.
pub fn material<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let mut m = String::new();
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            m.push(PART_SEPARATOR);
        }
        m.push_str(v);
    }
    m
}

/// Marks the anonymous plan's identity (the client's address): never a consumer's name.
const ANONYMOUS: &str = "\u{1}anonymous\0";

/// The material of a plan limit for a request on `anonymous_plan` from `ip_key`. (Joined
/// with `concat`, not `format!`: these are built per request.)
pub fn anonymous(ip_key: &str) -> String {
    [ANONYMOUS, ip_key].concat()
}

/// The material of the `on_missing: ip` fallback for a client whose `by: ip` value is `ip_key`.
pub fn ip_fallback(ip_key: &str) -> String {
    [IP_FALLBACK, ip_key].concat()
}

/// `key_base{hash}`: 128 bits of SHA-256 of the material, hex.
pub fn store_key(key_base: &str, material: &str) -> String {
    let digest = Sha256::digest(material.as_bytes());
    let mut key = String::with_capacity(key_base.len() + 34);
    key.push_str(key_base);
    key.push('{');
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in &digest[..16] {
        key.push(HEX[usize::from(b >> 4)] as char);
        key.push(HEX[usize::from(b & 15)] as char);
    }
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_key_is_the_base_and_128_bits_of_sha256_in_hex_braces() {
        // SHA-256("") = e3b0c442 98fc1c14 9afbf4c8 996fb924 27ae41e4 ...
        assert_eq!(
            store_key("sluice:r:all:gcra:", ""),
            "sluice:r:all:gcra:{e3b0c44298fc1c149afbf4c8996fb924}"
        );
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 ...
        assert!(store_key("b:", "abc").ends_with(":{ba7816bf8f01cfea414140de5dae2223}"));
    }

    #[test]
    fn parts_and_the_fallback_never_collide() {
        assert_eq!(material(["1.2.3.4", "k"]), "1.2.3.4\0k");
        assert_eq!(material(["only"]), "only");
        assert_ne!(ip_fallback("1.2.3.4"), material(["1.2.3.4"]));
    }
}
