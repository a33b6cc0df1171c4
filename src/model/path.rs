//! Request-path normalization (SPEC §7): the path a route matches and a limit counts is the
//! path the upstream will serve, so `/auth//login`, `/auth/./login`, `/x/../auth/login` and
//! `/auth/%6cogin` are all `/auth/login` here, as they are to nginx, Envoy (`normalize_path`),
//! Express, Spring or Rails behind the gateway. The normalized path is also the one forwarded,
//! so nothing downstream can read the bytes differently.
//!
//! Steps, in order:
//! 1. percent-encodings of unreserved characters (`A-Z a-z 0-9 - . _ ~`, RFC 3986 §2.3) are
//!    decoded; every other percent-encoding keeps its octet with upper-case hex (§6.2.2.1);
//! 2. runs of `/` become one `/` (when `merge_slashes`);
//! 3. dot segments are removed (RFC 3986 §5.2.4), decoded ones (`%2e%2e`) included.
//!
//! Refused (400): a path that would climb above `/` (an upstream that resolves it differently
//! is exactly the bypass this prevents), a raw `\` (Windows and some Java servers treat it as
//! `/`), `%00`, a malformed `%` escape, and `%2F` / `%5C` unless `escaped_slashes: keep`
//! (then they stay encoded, never become separators, and are matched as written).

use std::borrow::Cow;

/// What to do with `%2F` and `%5C` (an encoded `/` or `\`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// 400: the upstream may decode them into separators the route never saw.
    #[default]
    Reject,
    /// Keep them encoded (upper-case hex); they are part of a segment, not separators.
    Keep,
}

/// The `paths` section of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    pub merge_slashes: bool,
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
        }
    }
}

/// Why a path was refused (each is a 400 problem+json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("the path contains a backslash")]
    Backslash,
    #[error("the path contains an encoded NUL (%00)")]
    Nul,
    #[error("the path contains an encoded slash (%2F or %5C)")]
    EncodedSlash,
    #[error("the path contains a malformed percent-encoding")]
    BadEscape,
    #[error("the request target is not an absolute path")]
    NotAbsolute,
    /// A byte RFC 3986 §3.3 does not allow unescaped (a control, a space, anything not ASCII).
    /// HTTP/1.1's parser lets bytes above 0x7F through and an HTTP/2 `:path` can carry any,
    /// and forwarded they would make an upstream request line RFC 9112 §3.2 does not allow,
    /// which upstreams read in different ways.
    #[error("the path contains a byte that must be percent-encoded")]
    RawByte,
}

/// Normalize an absolute path (no query). Borrows when the path is already normal, which is
/// the common case and costs one scan.
pub fn normalize<'a>(raw: &'a str, rules: &PathRules) -> Result<Cow<'a, str>, PathError> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(b, rules.merge_slashes) {
        return Ok(Cow::Borrowed(raw));
    }
    let decoded = decode(b, rules.escaped_slashes)?;
    let out = remove_dots(&decoded, rules.merge_slashes)?;
    // Only ASCII was produced or kept (a decoded octet is unreserved ASCII; others stay
    // escaped), and the input was a `str`, so the bytes are UTF-8.
    Ok(Cow::Owned(
        String::from_utf8(out).map_err(|_| PathError::BadEscape)?,
    ))
}

/// No `%`, `\`, dot segment or (when merging) `//`: nothing to do.
fn is_normal(b: &[u8], merge_slashes: bool) -> bool {
    let mut prev = 0u8;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'%' | b'\\' => return false,
            c if !c.is_ascii_graphic() => return false,
            b'/' if merge_slashes && prev == b'/' => return false,
            b'.' if prev == b'/' => {
                // "/." then end, "/" or "." (so "/..") starts a dot segment.
                match b.get(i + 1) {
                    None | Some(b'/') | Some(b'.') => return false,
                    _ => {}
                }
            }
            _ => {}
        }
        prev = c;
    }
    true
}

fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Step 1: decode unreserved escapes, upper-case the rest, refuse the dangerous ones.
fn decode(b: &[u8], escaped: EscapedSlashes) -> Result<Vec<u8>, PathError> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => return Err(PathError::Backslash),
            c if !c.is_ascii_graphic() => return Err(PathError::RawByte),
            b'%' => {
                let (Some(h), Some(l)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let v = h << 4 | l;
                match v {
                    0 => return Err(PathError::Nul),
                    b'/' | b'\\' if escaped == EscapedSlashes::Reject => {
                        return Err(PathError::EncodedSlash)
                    }
                    v if unreserved(v) => out.push(v),
                    _ => out.extend_from_slice(&[b'%', HEX[usize::from(h)], HEX[usize::from(l)]]),
                }
                i += 3;
                continue;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(out)
}

/// Steps 2 and 3 over `/`-separated segments (the leading `/` is implied).
fn remove_dots(path: &[u8], merge_slashes: bool) -> Result<Vec<u8>, PathError> {
    let mut segs: Vec<&[u8]> = Vec::new();
    let mut parts = path[1..].split(|&c| c == b'/').peekable();
    // A path ending in a dot segment keeps its trailing slash ("/a/." is "/a/").
    let mut trailing_slash = false;
    while let Some(seg) = parts.next() {
        let last = parts.peek().is_none();
        trailing_slash = false;
        match seg {
            b"." => trailing_slash = true,
            b".." => {
                segs.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = true;
            }
            b"" if merge_slashes && !last => {}
            s => segs.push(s),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for s in &segs {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if trailing_slash || out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p, &PathRules::default()).map(Cow::into_owned)
    }

    fn keep(p: &str, merge: bool) -> Result<String, PathError> {
        let rules = PathRules {
            merge_slashes: merge,
            escaped_slashes: EscapedSlashes::Keep,
        };
        normalize(p, &rules).map(Cow::into_owned)
    }

    #[test]
    fn the_login_bypasses_all_become_the_login_path() {
        for p in [
            "/auth/login",
            "/auth//login",
            "/auth/./login",
            "/x/../auth/login",
            "/auth/%6cogin",
            "/auth/%6Cogin",
            "/%61uth/login",
            "//auth/login",
            "/auth/login/.",
            "/auth/x/%2e%2e/login",
            "/auth/x/%2E%2e/login",
            "/auth/x/.%2e/login",
            "///auth///./login",
        ] {
            let want = if p.ends_with("/.") {
                "/auth/login/"
            } else {
                "/auth/login"
            };
            assert_eq!(n(p).as_deref(), Ok(want), "{p}");
        }
    }

    /// RFC 3986 §3.3: a path is ASCII, with anything else percent-encoded. HTTP/2's `:path`
    /// can carry raw bytes HTTP/1.1's request line cannot; they are refused, not forwarded.
    #[test]
    fn raw_bytes_are_refused() {
        for p in [
            "/d\u{e9}ny",
            "/a b",
            "/a\tb",
            "/a\x7f",
            "/a\0",
            "/x/../d\u{e9}ny",
            "/%41\u{e9}",
        ] {
            assert_eq!(n(p), Err(PathError::RawByte), "{p:?}");
        }
        assert_eq!(n("/d%C3%A9ny").as_deref(), Ok("/d%C3%A9ny"));
    }

    #[test]
    fn rfc3986_5_2_4_examples() {
        // RFC 3986 §5.2.4: "/a/b/c/./../../g" -> "/a/g"; "mid/content=5/../6" -> "mid/6".
        assert_eq!(n("/a/b/c/./../../g").as_deref(), Ok("/a/g"));
        assert_eq!(n("/mid/content=5/../6").as_deref(), Ok("/mid/6"));
        assert_eq!(n("/a/..").as_deref(), Ok("/"));
        assert_eq!(n("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(n("/.").as_deref(), Ok("/"));
        assert_eq!(n("/").as_deref(), Ok("/"));
        assert_eq!(n("/a/").as_deref(), Ok("/a/"));
        // Not dot segments: names that only start with dots.
        assert_eq!(n("/.well-known/x").as_deref(), Ok("/.well-known/x"));
        assert_eq!(n("/a/...").as_deref(), Ok("/a/..."));
        assert_eq!(n("/a/..b").as_deref(), Ok("/a/..b"));
    }

    #[test]
    fn climbing_above_the_root_is_refused() {
        for p in [
            "/..",
            "/../a",
            "/a/../..",
            "/%2e%2e/etc/passwd",
            "/a/./../../b",
        ] {
            assert_eq!(n(p), Err(PathError::AboveRoot), "{p}");
        }
    }

    #[test]
    fn percent_encodings() {
        // RFC 3986 §6.2.2.1: hex digits of other escapes are upper-cased.
        assert_eq!(n("/a%3ab").as_deref(), Ok("/a%3Ab"));
        assert_eq!(n("/a%20b%7e%2D%5f").as_deref(), Ok("/a%20b~-_"));
        assert_eq!(n("/caf%c3%a9").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(
            n("/%25").as_deref(),
            Ok("/%25"),
            "an encoded % stays encoded"
        );
        assert_eq!(
            n("/%252e%252e/").as_deref(),
            Ok("/%252e%252e/"),
            "decoded once only"
        );
        for p in ["/a%", "/a%2", "/a%zz", "/a%2g"] {
            assert_eq!(n(p), Err(PathError::BadEscape), "{p}");
        }
        assert_eq!(n("/a%00b"), Err(PathError::Nul));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
    }

    #[test]
    fn encoded_slashes_reject_or_keep() {
        for p in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb"] {
            assert_eq!(n(p), Err(PathError::EncodedSlash), "{p}");
        }
        assert_eq!(keep("/a%2fb", true).as_deref(), Ok("/a%2Fb"));
        assert_eq!(keep("/a%5cb", true).as_deref(), Ok("/a%5Cb"));
        // Kept escapes are not separators: "..%2F" is a segment name, not a dot segment.
        assert_eq!(keep("/a/..%2Fb", true).as_deref(), Ok("/a/..%2Fb"));
        assert_eq!(keep("/a/%2e%2e%2fb", true).as_deref(), Ok("/a/..%2Fb"));
    }

    #[test]
    fn merge_slashes_off_keeps_empty_segments() {
        assert_eq!(keep("//x", false).as_deref(), Ok("//x"));
        assert_eq!(keep("/a//b", false).as_deref(), Ok("/a//b"));
        assert_eq!(keep("/a//../b", false).as_deref(), Ok("/a/b"));
        assert_eq!(keep("/a/./b", false).as_deref(), Ok("/a/b"));
    }

    #[test]
    fn normal_paths_are_borrowed() {
        let r = PathRules::default();
        for p in ["/", "/api/v1/users", "/a.b/c-d_e~f", "/.well-known/x"] {
            assert!(matches!(normalize(p, &r), Ok(Cow::Borrowed(_))), "{p}");
        }
        assert_eq!(normalize("*", &r), Err(PathError::NotAbsolute));
        assert_eq!(normalize("", &r), Err(PathError::NotAbsolute));
    }
}
