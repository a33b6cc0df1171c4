//! An HTTP/2 connection with nothing to do is closed after `client_header_timeout`.
//!
//! hyper's HTTP/1 server closes a keep-alive connection that sends no next request within
//! its header timeout; its HTTP/2 server has no such timer, so a client that sent the preface
//! and then nothing (or only pings) held its connection, and a worker's file descriptors,
//! forever. nginx closes such a connection after `keepalive_timeout`. Here a connection is
//! idle while no request of it is being handled and no answer body of it is still streaming
//! (an event stream may send nothing for minutes and is not idle); once idle for the timeout,
//! its socket reads as closed, and hyper ends the connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::pipeline::body::{Body, BoxError};

/// What a connection is busy with: requests being handled, plus answer bodies streaming.
pub(super) struct Activity {
    open: AtomicUsize,
    /// When `open` last fell to 0 (or the connection began).
    since: Mutex<Instant>,
    /// The connection's reader, woken when `open` falls to 0 so that it arms its timer.
    reader: AtomicWaker,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
            reader: AtomicWaker::new(),
        })
    }

    /// One request begins; it ends when the guard is dropped (with the answer's body, see
    /// [`track`], or with the request's future if it never answered).
    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// When the connection turns idle past `timeout`: `None` while busy.
    fn deadline(&self, timeout: Duration) -> Option<Instant> {
        (self.open.load(Ordering::Acquire) == 0).then(|| *self.since.lock() + timeout)
    }
}

/// Holds its connection busy until dropped.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        if a.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *a.since.lock() = Instant::now();
            a.reader.wake();
        }
    }
}

/// The answer, whose body holds the connection busy until it has been sent (or dropped).
pub(super) fn track(res: Response<Body>, busy: Busy) -> Response<Body> {
    res.map(|body| Tracked { body, _busy: busy }.boxed())
}

struct Tracked {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A socket that reads as closed once its connection has been idle for `timeout`.
pub(super) struct IdleIo<IO> {
    inner: IO,
    activity: Arc<Activity>,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<IO> IdleIo<IO> {
    pub(super) fn new(inner: IO, activity: Arc<Activity>, timeout: Duration) -> IdleIo<IO> {
        let timer = Box::pin(tokio::time::sleep(timeout));
        IdleIo {
            inner,
            activity,
            timeout,
            timer,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_ready() {
            return read;
        }
        this.activity.reader.register(cx.waker());
        match this.activity.deadline(this.timeout) {
            // Idle: wait for the deadline, then read as closed (nothing was read into `buf`).
            Some(deadline) => {
                if this.timer.deadline() != deadline {
                    this.timer.as_mut().reset(deadline);
                }
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Ok(())),
                    Poll::Pending => Poll::Pending,
                }
            }
            None => Poll::Pending,
        }
    }
}

crate::net::writes_through!(IdleIo);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const TIMEOUT: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn an_idle_connection_reads_as_closed_after_the_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(server, Activity::new(), TIMEOUT);
        let started = Instant::now();
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(started.elapsed() >= TIMEOUT);
    }

    /// Busy for 400 ms: not closed meanwhile, whatever the timeout; closed once it has been
    /// idle for the timeout after that.
    #[tokio::test]
    async fn a_busy_connection_is_not_idle_and_its_timeout_starts_when_it_is_done() {
        let (_client, server) = tokio::io::duplex(64);
        let a = Activity::new();
        let mut io = IdleIo::new(server, a.clone(), TIMEOUT);
        let busy = a.begin();
        let started = Instant::now();
        let done = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            drop(busy);
        });
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(started.elapsed() >= Duration::from_millis(400) + TIMEOUT);
        done.await.unwrap();
    }

    #[tokio::test]
    async fn bytes_that_arrive_are_read() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(server, Activity::new(), Duration::from_secs(60));
        tokio::io::AsyncWriteExt::write_all(&mut client, b"ping")
            .await
            .unwrap();
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 4);
        assert_eq!(&buf[..4], b"ping");
    }
}
