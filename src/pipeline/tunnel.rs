//! An upgraded connection (a `101 Switching Protocols`, WebSocket's): once both sides have
//! switched, bytes are copied both ways until either closes, the tunnel stays idle for the
//! upstream's `idle_timeout`, or the listener's drain deadline cuts it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::context::{Drain, Phase};
use super::settle::Leases;
use super::upstream::{at_ms, ms_at};

/// Run the tunnel on its own task. It holds `leases` (its concurrency slots: nginx's
/// `limit_conn` counts an upgraded connection for its life) and `drain` (its listener's drain
/// waits for it) until it ends.
///
/// Idle means no byte either way for `idle`: a client (or upstream) that opens a tunnel and
/// goes silent would otherwise hold both sockets and any slot until the process stops. As
/// nginx cuts a tunnel after `proxy_read_timeout` without a read (60 s by default), so the
/// upstream's `idle_timeout` here; an application whose tunnels rest longer sends pings
/// (WebSocket's are bytes like any other) or sets a longer one.
pub fn spawn(
    client: OnUpgrade,
    upstream: OnUpgrade,
    idle: Duration,
    leases: Option<Box<Leases>>,
    mut drain: Option<Drain>,
) {
    tokio::spawn(async move {
        let moved = Arc::new(AtomicU64::new(ms_at(std::time::Instant::now())));
        let tunnel = async {
            if let (Ok(c), Ok(u)) = tokio::join!(client, upstream) {
                let mut c = Watched::new(TokioIo::new(c), &moved);
                let mut u = Watched::new(TokioIo::new(u), &moved);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            }
        };
        let cut = async {
            match &mut drain {
                Some(d) => {
                    let _ = d.wait_for(|p| *p == Phase::Cut).await;
                }
                None => std::future::pending().await,
            }
        };
        let quiet = async {
            loop {
                let last = Instant::from_std(at_ms(moved.load(Ordering::Relaxed)));
                if last + idle <= Instant::now() {
                    return;
                }
                tokio::time::sleep_until(last + idle).await;
            }
        };
        tokio::select! {
            () = tunnel => {}
            () = cut => {}
            () = quiet => tracing::debug!(?idle, "an upgraded connection idle for its timeout is closed"),
        }
        drop(leases);
        drop(drain);
    });
}

/// One side of the tunnel: each read that brings bytes and each write that takes some stamps
/// `moved` ([`ms_at`]), so the idle clock restarts whichever way bytes go,
/// and a slow reader still draining what was read is not idle.
struct Watched<T> {
    io: T,
    moved: Arc<AtomicU64>,
}

impl<T> Watched<T> {
    fn new(io: T, moved: &Arc<AtomicU64>) -> Watched<T> {
        Watched {
            io,
            moved: moved.clone(),
        }
    }
}

impl<T> Watched<T> {
    /// Bytes moved now.
    fn stamp(&self) {
        let ms = ms_at(std::time::Instant::now());
        self.moved.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.stamp();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.stamp();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
