//! An HTTP/2 request's fields as they go on to an HTTP/1.1 upstream.
//!
//! HTTP/2 lets a client split `Cookie` into one field per cookie (RFC 9113 §8.2.3), which an
//! intermediary MUST join with `"; "` before HTTP/1.1: an upstream that reads the first line,
//! or joins lines with `,`, would lose cookies or sessions. And the h2 parser checks a
//! `Content-Length` against the DATA it frames but passes a repeated field on as it came
//! (HTTP/1.1's parser keeps one); a strict HTTP/1.1 upstream refuses two (RFC 9110 §8.6).
//!
//! What HTTP/1.1's parser refuses or settles, the h2 parser passes on, and such a request is
//! refused here too, so both protocols reach the routes alike:
//! - a field value with a space or tab at either end is malformed (RFC 9113 §8.2.1). HTTP/1.1's
//!   parser trims it; passed on, `X-Env: prod ` would miss a route matching `prod` exactly
//!   (and its limits), while the upstream, trimming, reads `prod`;
//! - a field name with a character that is not a token's (RFC 9110 §5.6.2; the h2 parser
//!   takes `"`, which HTTP/1.1's refuses);
//! - more than [`MAX_FIELDS`] fields: 431, as HTTP/1.1's parser answers. Split cookies count
//!   as the one field they are joined into (HTTP/1.1 carries them on one line; the h2
//!   parser has already held the whole list to 64 KiB).

use http::header::{HeaderMap, HeaderValue, COOKIE};

use super::content_length;

/// Fields a request head may have: hyper's HTTP/1.1 parser answers 431 past it (Envoy's
/// default limit too).
pub const MAX_FIELDS: usize = 100;

/// Join split cookies and settle `Content-Length` to one number; `Err` is a request the
/// upstream could not read as the client meant it, or that HTTP/1.1 would not have carried
/// (400). Call [`too_many_fields`] first.
pub fn to_http1(headers: &mut HeaderMap) -> Result<(), &'static str> {
    let white = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    for (name, value) in headers.iter() {
        let v = value.as_bytes();
        if white(v.first()) || white(v.last()) {
            return Err("a field value with white space at either end (RFC 9113 §8.2.1)");
        }
        if !name.as_str().bytes().all(token_char) {
            return Err("a field name that is not a token (RFC 9110 §5.6.2)");
        }
    }
    content_length::one(headers)?;
    let mut cookies = headers.get_all(COOKIE).iter();
    if let (Some(_), Some(_)) = (cookies.next(), cookies.next()) {
        let joined: Vec<u8> = headers
            .get_all(COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect::<Vec<_>>()
            .join(&b"; "[..]);
        let joined =
            HeaderValue::from_bytes(&joined).map_err(|_| "a cookie that cannot be joined")?;
        headers.insert(COOKIE, joined);
    }
    Ok(())
}

/// More fields than HTTP/1.1's parser takes (431).
pub fn too_many_fields(headers: &HeaderMap) -> bool {
    let cookies = headers.get_all(COOKIE).iter().count();
    headers.len() - cookies.saturating_sub(1) > MAX_FIELDS
}

/// `tchar` (RFC 9110 §5.6.2).
fn token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_LENGTH;

    #[test]
    fn split_cookies_are_joined_and_one_content_length_goes_on() {
        let mut h = HeaderMap::new();
        for c in ["a=1", "b=2", "c=3"] {
            h.append(COOKIE, HeaderValue::from_static(c));
        }
        h.append(CONTENT_LENGTH, HeaderValue::from_static("1"));
        h.append(CONTENT_LENGTH, HeaderValue::from_static("1"));
        to_http1(&mut h).unwrap();
        let cookies: Vec<_> = h.get_all(COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3"]);
        let lengths: Vec<_> = h.get_all(CONTENT_LENGTH).iter().collect();
        assert_eq!(lengths, ["1"]);

        let mut one = HeaderMap::new();
        one.append(COOKIE, HeaderValue::from_static("a=1; b=2"));
        to_http1(&mut one).unwrap();
        assert_eq!(one[COOKIE], "a=1; b=2");

        let mut differ = HeaderMap::new();
        differ.append(CONTENT_LENGTH, HeaderValue::from_static("1"));
        differ.append(CONTENT_LENGTH, HeaderValue::from_static("2"));
        assert!(to_http1(&mut differ).is_err());
    }

    #[test]
    fn what_http1_would_not_carry_is_refused() {
        for v in ["prod ", " prod", "prod\t", "\tprod", " ", "\t"] {
            let mut h = HeaderMap::new();
            h.insert("x-env", HeaderValue::from_str(v).unwrap());
            assert!(
                to_http1(&mut h).unwrap_err().contains("white space"),
                "{v:?}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert("x-env", HeaderValue::from_static("p r o d"));
        h.insert("x-empty", HeaderValue::from_static(""));
        h.insert("x-q'~|", HeaderValue::from_static("1"));
        assert_eq!(
            to_http1(&mut h),
            Ok(()),
            "inner spaces, empty values, token names"
        );
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_lowercase(b"x\"q").unwrap(),
            HeaderValue::from_static("v"),
        );
        assert!(to_http1(&mut h).unwrap_err().contains("not a token"));

        let mut h = HeaderMap::new();
        for i in 0..MAX_FIELDS - 1 {
            h.append("x-n", HeaderValue::from(i));
        }
        for c in ["a=1", "b=2", "c=3"] {
            h.append(COOKIE, HeaderValue::from_static(c));
        }
        assert!(!too_many_fields(&h), "split cookies count as one field");
        h.append("x-n", HeaderValue::from_static("one more"));
        assert!(too_many_fields(&h));
    }
}
