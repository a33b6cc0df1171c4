//! `Content-Length` as it goes on: one number (RFC 9110 §8.6).

use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH};

/// A `Content-Length` of one length repeated (`2, 2`, or two fields of `2`) goes on as that
/// one length (RFC 9110 §8.6: a recipient may take the list as the length,
/// and a proxy then forwards the single value); one that is not a number, or a list that
/// disagrees, is refused (502, as nginx). hyper refuses those itself where it frames the body
/// by them, but not on answers without a body (HEAD, 204, 304), where a client would still
/// read the field. One lookup when the field is the usual single number.
pub fn one(headers: &mut HeaderMap) -> Result<(), &'static str> {
    let mut all = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = all.next() else {
        return Ok(());
    };
    let digits = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
    if all.next().is_none() && digits(first.as_bytes()) {
        return Ok(());
    }
    let mut one: Option<&[u8]> = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        for n in v.as_bytes().split(|&b| b == b',').map(<[u8]>::trim_ascii) {
            if !digits(n) || one.is_some_and(|o| o != n) {
                return Err("a Content-Length that is not one number");
            }
            one = Some(n);
        }
    }
    let one = one.and_then(|n| HeaderValue::from_bytes(n).ok());
    let one = one.ok_or("a Content-Length that is not one number")?;
    headers.insert(CONTENT_LENGTH, one);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9110 §8.6 on the answer's way out: one length repeated becomes that length; a list that
    /// disagrees or is not numbers is refused, also where hyper did not frame a body by it (a
    /// HEAD, 204 or 304 answer).
    #[test]
    fn an_answer_content_length_goes_out_as_one_number_or_not_at_all() {
        let cl = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(CONTENT_LENGTH, v.parse().unwrap());
            }
            one(&mut h).map(|()| {
                let all: Vec<String> = h
                    .get_all(CONTENT_LENGTH)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect();
                all.join("|")
            })
        };
        assert_eq!(cl(&[]), Ok(String::new()));
        assert_eq!(cl(&["12"]), Ok("12".into()));
        for same in [&["2, 2"][..], &["2,2"], &["2", "2"], &[" 2 ,2", "2"]] {
            assert_eq!(cl(same), Ok("2".into()), "{same:?}");
        }
        for bad in [
            &["5, 7"][..],
            &["5", "7"],
            &["5,"],
            &["x"],
            &["-1"],
            &["", "5"],
        ] {
            assert!(cl(bad).is_err(), "{bad:?}");
        }
    }
}
