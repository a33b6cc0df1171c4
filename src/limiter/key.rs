//! The one key builder: how a limit's identity becomes a store key. The request path and the
//! admin API (`/admin/limits/…?key=`) both build keys here, so a key an operator peeks or
//! resets is exactly the key requests are charged on.
//!
//! Key: `{prefix}{route}:{limit}:{algorithm}:{HASH}` with HASH 128 bits of SHA-256 of the
//! identity material, in hex, in braces (a Redis Cluster hash tag). Identities never appear
//! in clear in a key; rate and burst are not part of it, so editing them keeps the counters.
//!
//! The material is the identity's parts in `by` order joined by NUL, or a marker and the
//! client's `by: ip` value. It is hashed as it is given: no string of it is ever built, so
//! keying a request costs one allocation (the key).

use sha2::{Digest, Sha256};

/// Marks the `on_missing: ip` fallback: an API key equal to an IP string is another client.
const IP_FALLBACK: &str = "\u{1}ip\0";

/// Marks the anonymous plan's identity (the client's address): never a consumer's name.
const ANONYMOUS: &str = "\u{1}anonymous\0";

/// Separates the parts of a composite key (`by: [ip, api_key]`).
const PART_SEPARATOR: &[u8] = b"\0";

/// The material of one identity, hashed part by part.
#[derive(Clone, Default)]
pub struct Material {
    hash: Sha256,
    parts: usize,
}

impl Material {
    /// The material of an identity whose parts (in `by` order) are `values`.
    pub fn of<'a>(values: impl IntoIterator<Item = &'a str>) -> Material {
        let mut m = Material::default();
        for v in values {
            m.part(v);
        }
        m
    }

    /// Append the next part of a composite identity.
    pub fn part(&mut self, value: &str) {
        if self.parts > 0 {
            self.hash.update(PART_SEPARATOR);
        }
        self.hash.update(value.as_bytes());
        self.parts += 1;
    }

    /// The material of a plan limit for a request on the anonymous plan from `ip_key`.
    pub fn anonymous(ip_key: &str) -> Material {
        Material::marked(ANONYMOUS, ip_key)
    }

    /// The material of the `on_missing: ip` fallback for a client whose `by: ip` value is
    /// `ip_key`.
    pub fn ip_fallback(ip_key: &str) -> Material {
        Material::marked(IP_FALLBACK, ip_key)
    }

    fn marked(marker: &str, ip_key: &str) -> Material {
        let mut hash = Sha256::new();
        hash.update(marker.as_bytes());
        hash.update(ip_key.as_bytes());
        Material { hash, parts: 1 }
    }

    /// SHA-256 of the material so far.
    #[cfg(test)]
    fn digest(&self) -> [u8; 32] {
        self.hash.clone().finalize().into()
    }

    /// `key_base{hash}`: 128 bits of SHA-256 of the material, hex.
    pub fn store_key(self, key_base: &str) -> String {
        let digest = self.hash.finalize();
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
}

/// Equal when the materials hash the same: the same identity (tests compare the admin API's
/// materials with a request's).
#[cfg(test)]
impl PartialEq for Material {
    fn eq(&self, other: &Material) -> bool {
        self.digest() == other.digest()
    }
}

#[cfg(test)]
impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: String = self.digest().iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "Material(sha256 {hex})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(material: &str) -> Material {
        let mut m = Material::default();
        m.part(material);
        m
    }

    #[test]
    fn store_key_is_the_base_and_128_bits_of_sha256_in_hex_braces() {
        // SHA-256("") = e3b0c442 98fc1c14 9afbf4c8 996fb924 27ae41e4 ...
        assert_eq!(
            Material::default().store_key("sluice:r:all:gcra:"),
            "sluice:r:all:gcra:{e3b0c44298fc1c149afbf4c8996fb924}"
        );
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 ...
        assert!(whole("abc")
            .store_key("b:")
            .ends_with(":{ba7816bf8f01cfea414140de5dae2223}"));
    }

    #[test]
    fn parts_are_hashed_as_the_nul_joined_string() {
        let key = |m: Material| m.store_key("b:");
        assert_eq!(
            key(Material::of(["1.2.3.4", "k"])),
            key(whole("1.2.3.4\0k"))
        );
        assert_eq!(key(Material::of(["only"])), key(whole("only")));
        assert_eq!(key(Material::of(["", ""])), key(whole("\0")));
        assert_eq!(
            key(Material::ip_fallback("1.2.3.4")),
            key(whole("\u{1}ip\u{0}1.2.3.4"))
        );
        assert_eq!(
            key(Material::anonymous("1.2.3.4")),
            key(whole("\u{1}anonymous\u{0}1.2.3.4"))
        );
    }

    #[test]
    fn parts_and_the_markers_never_collide() {
        let key = |m: Material| m.store_key("b:");
        let plain = key(Material::of(["1.2.3.4"]));
        assert_ne!(key(Material::ip_fallback("1.2.3.4")), plain);
        assert_ne!(key(Material::anonymous("1.2.3.4")), plain);
        assert_ne!(
            key(Material::anonymous("1.2.3.4")),
            key(Material::ip_fallback("1.2.3.4"))
        );
        // The separator keeps ["a", "bc"] and ["ab", "c"] apart.
        assert_ne!(
            key(Material::of(["a", "bc"])),
            key(Material::of(["ab", "c"]))
        );
    }
}
