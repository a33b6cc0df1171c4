//! The one body type the gateway answers with: upstream bodies stream through unbuffered,
//! the gateway's own answers are small full bodies.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

pub fn stream(b: hyper::body::Incoming) -> Body {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}
