//! A client that stops reading its answer is disconnected after `send_timeout`.
//!
//! Without it, a client that asks for a large answer and never reads it holds its connection,
//! the upstream connection streaming the answer and that answer's buffers for as long as it
//! likes: a few such clients take every file descriptor a gateway has. nginx's
//! `send_timeout` (60 s) closes a connection whose client accepted nothing for that long,
//! counted between two writes, not over the whole answer; so is this.
//!
//! Here a write to the client's socket that cannot proceed (its buffers full: the client is
//! not reading) arms a timer, and any write that proceeds disarms it; once it fires, the
//! write fails with `TimedOut` and hyper ends the connection. That covers HTTP/1.1 and a
//! socket-level stall of HTTP/2. An HTTP/2 client can also stall an answer without filling
//! the socket, by opening no flow-control window for it: `runtime::idle` watches that.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A client socket whose writes fail once none has proceeded for `timeout`.
pub(super) struct Stall<IO> {
    inner: IO,
    timeout: Duration,
    /// Made at the first stall (most connections never stall), then reused.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` runs for the stall now under way.
    armed: bool,
}

impl<IO> Stall<IO> {
    pub(super) fn new(inner: IO, timeout: Duration) -> Stall<IO> {
        Stall {
            inner,
            timeout,
            timer: None,
            armed: false,
        }
    }

    /// The outcome of one write (or flush): a write that proceeded ends the stall; one that
    /// did not starts it, or fails once it has lasted `timeout`.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            timer.as_mut().reset(deadline);
            self.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client accepted nothing for send_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stall<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stall<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, polled)
    }

    /// Watched too: over TLS a shutdown writes `close_notify`, which waits on a full socket.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_millis(200);

    /// Nobody reads the other end: once its buffer is full, the write fails after the
    /// timeout, not before.
    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_timeout() {
        let (_client, server) = tokio::io::duplex(1024);
        let mut io = Stall::new(server, TIMEOUT);
        io.write_all(&[0; 1024]).await.unwrap();
        let started = Instant::now();
        let err = io.write_all(&[0; 1]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= TIMEOUT, "{:?}", started.elapsed());
    }

    /// A reader that keeps taking bytes, however slowly, never trips it: the timer counts
    /// from the last write that proceeded, not from the first stall.
    #[tokio::test]
    async fn a_slow_reader_is_not_a_stalled_one() {
        let (mut client, server) = tokio::io::duplex(32);
        let reader = tokio::spawn(async move {
            let mut buf = [0; 32];
            let mut n = 0;
            while n < 256 {
                tokio::time::sleep(TIMEOUT / 4).await;
                n += client.read(&mut buf).await.unwrap();
            }
        });
        let mut io = Stall::new(server, TIMEOUT);
        let started = Instant::now();
        io.write_all(&[0; 256]).await.unwrap();
        assert!(
            started.elapsed() > TIMEOUT,
            "the writes took longer than one timeout"
        );
        reader.await.unwrap();
    }
}
