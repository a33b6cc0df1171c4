//! Upstream connections, kept alive per target.
//!
//! hyper's HTTP/1 client comes in two halves: a [`SendRequest`] and the connection future
//! that does the connection's I/O, here spawned as a task of its own. The pool is a list of
//! idle senders per target: checking one out is a pop under an uncontended lock, not a hashed
//! lookup by authority and a checkout future (hyper-util's pooled client, which this
//! replaced: 1.24× the requests per gateway CPU-second on the plain path; see
//! docs/performance.md). An answer's body carries its sender ([`Streamed`]) and puts it back
//! when it has ended; the next request takes the most recent one that is ready.
//!
//! Driving the connection from the request's own task instead of a spawned one was measured
//! too, and dropped: 0.83× (one task then interleaves the client's and the upstream's reads
//! and writes, where spawned connection tasks batch the upstream writes of a scheduler tick).
//!
//! With several workers (one single-threaded runtime per thread, `runtime::app`), a
//! connection's task runs on the worker that opened it, and each worker has idle lists of its
//! own: a request and its upstream I/O stay on one thread, as in nginx's workers, and no lock
//! is shared between workers.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use crate::net::Gather;
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{ReplayBody, Slot};
use crate::pipeline::body::BoxError;
use crate::pipeline::headers::hop_by_hop;
use std::future::Future;
use tokio::task::AbortHandle;

/// How long an unused connection is kept (hyper-util's default, kept when the gateway moved
/// to its own pool). Older ones are closed when their target's list is next touched.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Why a request got no answer head from a target.
#[derive(Debug)]
pub(super) enum SendError {
    /// No connection could be opened (refused, unresolvable, TLS handshake failed): nothing
    /// was sent, so another target may be tried with the same body.
    Connect(io::Error),
    /// The TCP connect did not finish within `connect_timeout`.
    ConnectTimeout,
    /// The connection failed once the request was on its way.
    Http(hyper::Error),
}

/// How connections to one upstream's targets are opened.
pub(super) struct Connector {
    pub connect_timeout: Duration,
    /// How long an answer's body may keep the gateway waiting for its next bytes (the
    /// upstream's `idle_timeout`): see [`Streamed`].
    pub read_timeout: Duration,
    /// For https upstreams.
    pub tls: Option<TlsConnector>,
}

/// Where one target's connections go, worked out from its settings once.
pub(super) struct Dest {
    /// The host without IPv6 brackets: an IP literal or a name to resolve.
    pub host: Box<str>,
    pub port: u16,
    /// For https: the name the certificate must carry (the upstream's `server_name`, else the
    /// host); `None` when the host is no valid server name.
    pub tls_name: Option<ServerName<'static>>,
}

impl Connector {
    async fn connect(&self, dest: &Dest) -> Result<Io, SendError> {
        let tcp = tokio::time::timeout(self.connect_timeout, tcp(&dest.host, dest.port))
            .await
            .map_err(|_| SendError::ConnectTimeout)?
            .map_err(SendError::Connect)?;
        let Some(tls) = &self.tls else {
            return Ok(Io::Plain(Gather(tcp)));
        };
        let name = dest.tls_name.clone().ok_or_else(|| {
            let e = format!("{} is not a valid TLS server name", dest.host);
            SendError::Connect(io::Error::new(io::ErrorKind::InvalidInput, e))
        })?;
        let stream = tls
            .connect(name, Gather(tcp))
            .await
            .map_err(SendError::Connect)?;
        Ok(Io::Tls(Box::new(stream)))
    }
}

/// Connect to `host` (an IP literal, or a name resolved by the system resolver), trying its
/// addresses in order.
async fn tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port)).await?.collect(),
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The targets of one upstream (by index): where each one's connections go, and each
/// worker's idle ones (by worker index).
pub(super) struct Pool {
    connector: Connector,
    targets: Vec<(Dest, Box<[IdleList]>)>,
}

/// Idle connections, the most recently used last.
type IdleList = Mutex<Vec<Idle>>;

struct Idle {
    send: SendRequest<ReplayBody>,
    task: AbortHandle,
    since: Instant,
}

impl Pool {
    pub(super) fn new(connector: Connector, dests: Vec<Dest>, workers: usize) -> Pool {
        let lists = || (0..workers.max(1)).map(|_| Mutex::default()).collect();
        Pool {
            connector,
            targets: dests.into_iter().map(|d| (d, lists())).collect(),
        }
    }

    /// `worker`'s idle connections to `target`.
    fn idle(&self, target: usize, worker: usize) -> &IdleList {
        let lists = &self.targets[target].1;
        &lists[worker.min(lists.len() - 1)]
    }

    /// Send `req` to `target` and wait for the answer's head; the body streams on. `req`'s
    /// URI must be in origin form and its `Host` set. A request that was not sent because its
    /// pooled connection was closing is sent on another; a new connection's task supports
    /// upgrades (`101`: the connection is handed over and never pooled).
    pub(super) async fn send(
        self: &Arc<Self>,
        target: usize,
        mut req: Request<ReplayBody>,
        now: Instant,
    ) -> Result<Response<Streamed>, SendError> {
        let body = req.body().slot.clone();
        while let Some((mut send, task)) = self.checkout(target, now) {
            match send.try_send_request(req).await {
                Ok(res) => return Ok(self.lend(target, res, send, task, body)),
                // Not sent: the connection was closing. Another one gets it.
                Err(mut e) => match e.take_message() {
                    Some(r) => req = r,
                    None => return Err(SendError::Http(e.into_error())),
                },
            }
        }
        // Boxed: opening a connection (a TLS handshake's state included) is the rare path, and
        // inline its future would grow every request's.
        Box::pin(self.open(target, req)).await
    }

    /// A new connection to `target`, its task spawned, and `req` sent on it.
    async fn open(
        self: &Arc<Self>,
        target: usize,
        req: Request<ReplayBody>,
    ) -> Result<Response<Streamed>, SendError> {
        let io = self.connector.connect(&self.targets[target].0).await?;
        let (mut send, conn) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(SendError::Http)?;
        let task = tokio::spawn(conn.with_upgrades()).abort_handle();
        let body = req.body().slot.clone();
        match send.send_request(req).await {
            Ok(res) => Ok(self.lend(target, res, send, task, body)),
            Err(e) => Err(SendError::Http(e)),
        }
    }

    /// This worker's most recently used connection of `target` that is ready for a request,
    /// dropping those that are not (and those idle longer than [`IDLE_TIMEOUT`] at `now`).
    fn checkout(
        &self,
        target: usize,
        now: Instant,
    ) -> Option<(SendRequest<ReplayBody>, AbortHandle)> {
        let mut list = self.idle(target, crate::worker::index()).lock();
        prune(&mut list, now);
        while let Some(idle) = list.pop() {
            if idle.send.is_ready() {
                return Some((idle.send, idle.task));
            }
        }
        None
    }

    fn lend(
        self: &Arc<Self>,
        target: usize,
        res: Response<Incoming>,
        send: SendRequest<ReplayBody>,
        task: AbortHandle,
        body: Option<Arc<Slot>>,
    ) -> Response<Streamed> {
        let upgraded = res.status() == http::StatusCode::SWITCHING_PROTOCOLS;
        let lent = (!upgraded).then(|| Lent {
            pool: self.clone(),
            target,
            send,
            task,
            body,
            worker: crate::worker::index(),
        });
        let stall = Stall {
            after: self.connector.read_timeout,
            timer: None,
            since: None,
        };
        res.map(|body| Streamed { body, lent, stall })
    }
}

/// An answer's body; once it has ended and is dropped, its connection goes back to the pool.
///
/// An upstream that stops sending its body (a handler stuck mid-answer, a peer gone without a
/// reset) would hold the client, the connection and any concurrency slot forever: after
/// `idle_timeout` without a byte while the gateway waits for one, the body fails, the client's
/// connection is cut (HTTP/2: its stream reset) and the upstream's closed. The clock runs only
/// while the gateway waits on the upstream, not while a slow client keeps it writing (that is
/// `send_timeout`'s), so it is nginx's `proxy_read_timeout` and HAProxy's `timeout server`:
/// counted between two reads, not over the whole body.
pub struct Streamed {
    body: Incoming,
    lent: Option<Lent>,
    stall: Stall,
}

struct Stall {
    after: Duration,
    /// Made at the first wait, and moved only when it fires early: a wait that begins reads
    /// the clock, but sets no timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the current wait began; `None` while the last poll found a frame.
    since: Option<tokio::time::Instant>,
}

/// The upstream sent no body bytes for this long while the gateway waited.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent no body bytes for {0:?}")]
pub(super) struct Stalled(Duration);

struct Lent {
    pool: Arc<Pool>,
    target: usize,
    send: SendRequest<ReplayBody>,
    /// The connection's task, which writes the request's body.
    task: AbortHandle,
    /// The request's body, `None` without one.
    body: Option<Arc<Slot>>,
    /// Whose idle list it goes back to.
    worker: usize,
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.stall.since = None;
            if let Some(Err(e)) = &frame {
                // The client sees a cut answer; the log says why, as for a stall (nginx:
                // "upstream prematurely closed connection").
                tracing::warn!(upstream = %this.target_name(), error = %e, "upstream's answer body broke off: the answer is cut");
            }
            return Poll::Ready(frame.map(|r| {
                r.map(|mut frame| {
                    if let Some(fields) = frame.trailers_mut() {
                        hop_by_hop::strip_trailers(fields);
                    }
                    frame
                })
                .map_err(BoxError::from)
            }));
        }
        let stall = &mut this.stall;
        let since = *stall.since.get_or_insert_with(tokio::time::Instant::now);
        let deadline = since + stall.after;
        let timer = stall
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // Set for an earlier wait: moved to this one's deadline, then polled again.
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                return self.stalled();
            }
            timer.as_mut().reset(deadline);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Streamed {
    /// The body waited `after` for bytes: logged, and failed (the client's answer is cut).
    fn stalled(&self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        tracing::warn!(
            upstream = %self.target_name(),
            after = ?self.stall.after,
            "upstream stopped sending its answer's body: the answer is cut"
        );
        Poll::Ready(Some(Err(Box::new(Stalled(self.stall.after)))))
    }

    /// The target answering, `host:port`, for the log.
    fn target_name(&self) -> String {
        let Some(lent) = &self.lent else {
            return "-".into();
        };
        let dest = &lent.pool.targets[lent.target].0;
        match dest.host.contains(':') {
            true => format!("[{}]:{}", dest.host, dest.port),
            false => format!("{}:{}", dest.host, dest.port),
        }
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        let Some(lent) = self.lent.take() else { return };
        // The answer is over (or given up) while the request's body is still going out: an
        // upstream that answered without reading it (a 413, a 401, a handler that ignores
        // it) would hold the connection writing forever, and through it the client's, whose
        // upload stalls. The connection is closed; the client's then closes after its answer
        // (nginx too stops sending a body once the answer is in).
        if !ReplayBody::ended(&lent.body) {
            lent.task.abort();
            return;
        }
        // A body dropped before its end leaves the connection mid-answer: it closes.
        if !self.body.is_end_stream() || lent.send.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut list = lent.pool.idle(lent.target, lent.worker).lock();
        prune(&mut list, now);
        list.push(Idle {
            send: lent.send,
            task: lent.task,
            since: now,
        });
    }
}

/// Close the connections idle longer than [`IDLE_TIMEOUT`] (the oldest are first).
fn prune(list: &mut Vec<Idle>, now: Instant) {
    let old = list
        .iter()
        .take_while(|i| now.duration_since(i.since) > IDLE_TIMEOUT)
        .count();
    list.drain(..old);
}

/// A connection's socket: TCP, or TLS over TCP for https upstreams; either way the TCP socket
/// is [`Gather`]ed (under TLS, so the records rustls writes leave together).
pub(super) enum Io {
    Plain(Gather<TcpStream>),
    Tls(Box<TlsStream<Gather<TcpStream>>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
