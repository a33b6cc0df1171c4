//! The one body type the gateway answers with: upstream bodies stream through unbuffered,
//! the gateway's own answers are small full bodies.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

use super::settle::Leases;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// An upstream's body, streamed through.
pub fn stream<B>(b: B) -> Body
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
{
    b.boxed()
}

/// `body`, holding `leases` until its end: the frame that ends it (the last data frame of a
/// body of known length, or the end of a chunked one) is passed on only once the slots are
/// released, so a client that sends its next request as soon as this answer is complete
/// finds them free. Dropped unread (the client went away), the leases free themselves.
pub fn holding(body: Body, leases: Box<Leases>) -> Body {
    Holding {
        body,
        leases: Some(leases),
        ending: None,
    }
    .boxed()
}

/// What one `poll_frame` yields once ready.
type Polled = Option<Result<Frame<Bytes>, BoxError>>;

/// The release, on its own task (a body must be `Sync`; a store call's future is not).
type Release = tokio::task::JoinHandle<()>;

struct Holding {
    body: Body,
    leases: Option<Box<Leases>>,
    /// The ending frame (`None`: the end itself), held back while the release runs.
    ending: Option<(Polled, Release)>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Polled> {
        if self.ending.is_none() {
            let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
            let ends = frame.as_ref().is_none_or(|f| f.is_err()) || self.body.is_end_stream();
            match self.leases.take() {
                Some(mut leases) if ends => match leases.release_now() {
                    None => return Poll::Ready(frame),
                    Some(release) => self.ending = Some((frame, super::settle::counted(release))),
                },
                other => {
                    self.leases = other;
                    return Poll::Ready(frame);
                }
            }
        }
        let (_, release) = self.ending.as_mut().expect("set above");
        // A release that failed (panicked) leaves the slots to their lease: go on.
        let _ = ready!(Pin::new(release).poll(cx));
        let (frame, _) = self.ending.take().expect("set above");
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ending.is_none() && self.leases.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
