//! An HTTP/2 request's fields as they go on to an HTTP/1.1 upstream.
//!
//! HTTP/2 lets a client split `Cookie` into one field per cookie (RFC 9113 §8.2.3), which an
//! intermediary MUST join with `"; "` before HTTP/1.1: an upstream that reads the first line,
//! or joins lines with `,`, would lose cookies or sessions. And the h2 parser checks a
//! `Content-Length` against the DATA it frames but passes a repeated field on as it came
//! (HTTP/1.1's parser keeps one); a strict HTTP/1.1 upstream refuses two (RFC 9110 §8.6).

use http::header::{HeaderMap, HeaderValue, COOKIE};

use super::content_length;

/// Join split cookies and settle `Content-Length` to one number; `Err` is a request the
/// upstream could not read as the client meant it (400).
pub fn to_http1(headers: &mut HeaderMap) -> Result<(), &'static str> {
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
}
