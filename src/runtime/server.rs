//! Listeners: accept connections (a PROXY header and a TLS handshake first where the listener
//! asks for them), serve HTTP/1.1 and HTTP/2 (h2c in cleartext, ALPN over TLS, upgrades
//! included), and drain gracefully on shutdown.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::proxy_protocol::{self, Proxied};
use super::spread::{Handover, Open, Share};
use super::{idle, preface, stall};
use crate::net::Gather;
use crate::pipeline::context::{ConnInfo, Drain, Phase};

use crate::pipeline::body::{full, Body};
use crate::pipeline::headers::request_id::{self, X_REQUEST_ID};

/// The largest request head (request line and header fields) the gateway reads: a longer
/// one is answered `431 Request Header Fields Too Large` and the connection closed.
///
/// HTTP/1: hyper's read buffer limit (`max_buf_size`). While the head is incomplete,
/// reaching it is `Parse::TooLarge`, which hyper answers with 431 itself. Bodies are not
/// limited by it: they are read in pieces and streamed on, never held whole in this buffer
/// (the same limit also caps hyper's write buffer, which response bodies pass through in
/// pieces as well).
/// HTTP/2: `SETTINGS_MAX_HEADER_LIST_SIZE` (decoded size, RFC 9113 §6.5.2); h2 answers a
/// larger header block with 431 and resets the stream.
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// The answer to a request whose handler panicked: a 500 problem document (RFC 9457).
/// The panic is caught per request, so the connection and the process keep serving.
fn panicked(
    payload: &(dyn Any + Send),
    method: &http::Method,
    uri: &http::Uri,
    peer: SocketAddr,
    client_rid: Option<HeaderValue>,
) -> Response<Body> {
    // The handler's own request id died with it: keep the client's if sane, else make one.
    let mut h = HeaderMap::new();
    if let Some(v) = client_rid {
        h.insert(X_REQUEST_ID, v);
    }
    let rid = request_id::get_or_make(&h);
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)");
    tracing::error!(
        panic = msg,
        %method,
        path = uri.path(),
        %peer,
        request_id = rid.to_str().unwrap_or("-"),
        "request handler panicked; answered 500"
    );
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Internal Server Error",
        "status": 500,
        "detail": "the gateway failed while handling this request",
    });
    let mut res = Response::new(full(Bytes::from(body.to_string())));
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    h.insert(X_REQUEST_ID, rid);
    res
}

/// How a listener's connections are opened before HTTP: a PROXY header first, then TLS.
#[derive(Clone, Default)]
pub struct Accept {
    pub tls: Option<TlsAcceptor>,
    pub proxy_protocol: bool,
}

/// How long a client may take, on every connection of a listener.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To send a request head (and its first bytes, a PROXY header, a TLS handshake), and
    /// the longest an idle keep-alive connection is kept.
    pub header: Duration,
    /// To accept any of an answer's bytes (`runtime::stall`).
    pub send: Duration,
}

/// Serve `listener` with `handler` until `stop` leaves `Serving`, then give in-flight
/// requests (and upgraded tunnels) up to `drain` to finish (or until `stop` is `Cut`), and
/// close what is left. A connection that has not begun a request when the drain starts is
/// closed at once, as nginx closes its idle ones; one whose first bytes are in has that
/// request served, with `Connection: close`. `timeouts` cut off clients that are slow to
/// send a request head or to read an answer. With a `share`, this worker takes part in
/// spreading the listener's connections over the workers (see [`super::spread`]).
#[allow(clippy::too_many_arguments)]
pub async fn serve<H, F, R>(
    listener: TcpListener,
    accept: Accept,
    handler: H,
    refused: R,
    timeouts: Timeouts,
    mut stop: Drain,
    drain: Duration,
    mut share: Option<Share>,
) where
    H: Fn(Request<Incoming>, Arc<ConnInfo>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
    R: Fn(StatusCode) + Clone + Send + Sync + 'static,
{
    let (phase, watched) = watch::channel(Phase::Serving);
    let local = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header)
        .max_buf_size(MAX_REQUEST_HEAD);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_REQUEST_HEAD as u32);
    let builder = Arc::new(builder);
    let start = |stream: TcpStream, peer: SocketAddr, open: Option<Open>| {
        let _ = stream.set_nodelay(true);
        // Below any PROXY header reader and TLS: see `crate::net`.
        let stream = Gather(stream);
        let conn = Connection {
            builder: builder.clone(),
            handler: handler.clone(),
            refused: refused.clone(),
            timeouts,
            phase: watched.clone(),
        };
        if accept.tls.is_none() && !accept.proxy_protocol {
            // The plain path: no extra task hop, no handshake.
            let mut info = ConnInfo::new(peer, None, false);
            info.drain = Some(watched.clone());
            let info = Arc::new(info);
            let first_bytes = timeouts.header;
            tokio::spawn(counted(open, conn.serve(stream, info, None, first_bytes)));
        } else {
            let opened = conn.open(stream, peer, accept.clone(), timeouts.header);
            tokio::spawn(counted(open, opened));
        }
    };
    let (mut last_warned, mut failed): (Option<tokio::time::Instant>, u64) = (None, 0);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning, and say so once a
                        // second (with how many were not said), not fifty times.
                        failed += 1;
                        if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            tracing::warn!(error = %e, failed, "accept failed");
                            (last_warned, failed) = (Some(tokio::time::Instant::now()), 0);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let Some(share) = &share else {
                    start(stream, peer, None);
                    continue;
                };
                let (to, open) = share.spread.assign(share.worker);
                if to == share.worker {
                    start(stream, peer, Some(open));
                    continue;
                }
                let stream = match stream.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "cannot hand a connection over; closed");
                        continue;
                    }
                };
                if let Err(back) = share.spread.hand(to, Handover { stream, peer, open }) {
                    // That worker stopped receiving meanwhile: serve it here after all (its
                    // count on the other worker goes with `back`).
                    let open = share.spread.count(share.worker);
                    receive(Handover { open, ..back }, &start);
                }
            }
            Some(h) = handed(&mut share) => receive(h, &start),
            _ = draining(&mut stop) => break,
        }
    }
    // Connections already handed to this worker are served and drained like its own.
    if let Some(share) = &mut share {
        share.inbox.close();
        while let Ok(h) = share.inbox.try_recv() {
            receive(h, &start);
        }
    }
    drop(listener);
    // Every connection holds a receiver: `closed` is the last of them ending.
    drop(watched);
    phase.send_replace(Phase::Draining);
    tokio::select! {
        _ = phase.closed() => tracing::info!(listen = %local, "all connections drained"),
        _ = cut(&mut stop) => {
            tracing::warn!(listen = %local, "drain cut short; closing the connections and tunnels left");
            phase.send_replace(Phase::Cut);
            let _ = tokio::time::timeout(CUT_WAIT, phase.closed()).await;
        }
        _ = tokio::time::sleep(drain) => {
            tracing::warn!(listen = %local, ?drain, "drain deadline passed; closing the connections and tunnels left");
            phase.send_replace(Phase::Cut);
            // They end at their next poll; what they leave to settle runs meanwhile.
            let _ = tokio::time::timeout(CUT_WAIT, phase.closed()).await;
        }
    }
}

/// How long the connections closed at the drain deadline are given to end: each ends at its
/// next poll, dropping its requests, whose charges and releases then start (see
/// `pipeline::settle`).
const CUT_WAIT: Duration = Duration::from_secs(1);

/// Until `phase` leaves `Serving` (or its listener is gone).
async fn draining(phase: &mut Drain) {
    let _ = phase.wait_for(|p| *p != Phase::Serving).await;
}

/// Until `phase` is `Cut` (or its listener is gone).
async fn cut(phase: &mut Drain) {
    let _ = phase.wait_for(|p| *p == Phase::Cut).await;
}

/// The next connection another worker handed to this one; never, without a share.
async fn handed(share: &mut Option<Share>) -> Option<Handover> {
    match share {
        Some(s) => s.inbox.recv().await,
        None => std::future::pending().await,
    }
}

/// Serve a connection another worker accepted, on this worker's poller.
fn receive(h: Handover, start: &impl Fn(TcpStream, SocketAddr, Option<Open>)) {
    match TcpStream::from_std(h.stream) {
        Ok(s) => start(s, h.peer, Some(h.open)),
        Err(e) => tracing::debug!(peer = %h.peer, error = %e, "connection lost in handover"),
    }
}

/// `task`, holding its connection's place on the worker's count until it ends.
async fn counted(open: Option<Open>, task: impl Future<Output = ()>) {
    task.await;
    drop(open);
}

/// One accepted connection and what serving it needs.
struct Connection<H, R> {
    builder: Arc<auto::Builder<TokioExecutor>>,
    handler: H,
    /// Told of each request hyper refused itself (a head it could not parse), which the
    /// handler never sees.
    refused: R,
    /// How long the client may take to send its first bytes (then hyper's own
    /// `header_read_timeout` takes over for HTTP/1), and to accept an answer's bytes.
    timeouts: Timeouts,
    phase: Drain,
}

impl<H, F, R> Connection<H, R>
where
    H: Fn(Request<Incoming>, Arc<ConnInfo>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
    R: Fn(StatusCode) + Clone + Send + Sync + 'static,
{
    /// Read the PROXY header and/or complete the TLS handshake, then serve HTTP. A connection
    /// that fails either is closed without an answer (there is no HTTP to answer in yet).
    /// The header, the handshake and the first bytes of HTTP share one `limit` from accept:
    /// each given a fresh one, a client could hold the connection for three times it.
    async fn open(
        self,
        mut stream: Gather<TcpStream>,
        peer: SocketAddr,
        accept: Accept,
        limit: Duration,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let (mut proxied, mut unnamed) = (None, false);
        // Draining: a connection that has not begun a request is closed (see `serve`).
        let mut phase = self.phase.clone();
        if accept.proxy_protocol {
            let header = tokio::select! {
                biased;
                h = proxy_protocol::read_header(&mut stream, left()) => h,
                _ = draining(&mut phase) => return,
            };
            match header {
                Ok(Proxied::Client(addr)) => proxied = Some(addr),
                Ok(Proxied::Local) => unnamed = true,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "PROXY header refused; connection closed");
                    return;
                }
            }
        }
        let watched = self.phase.clone();
        let info = |tls| {
            let mut info = ConnInfo::new(peer, proxied, tls);
            info.unnamed = unnamed;
            info.drain = Some(watched);
            Arc::new(info)
        };
        let Some(acceptor) = accept.tls else {
            return self.serve(stream, info(false), None, left()).await;
        };
        let handshake = tokio::select! {
            biased;
            h = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => h,
            _ = draining(&mut phase) => return,
        };
        match handshake {
            Ok(Ok(tls)) => {
                let info = info(true);
                let h2 = tls.get_ref().1.alpn_protocol().map(|p| p == b"h2");
                self.serve(tls, info, h2, left()).await
            }
            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
        }
    }

    /// Serve HTTP/1.1 or HTTP/2 (by preface; over TLS the client chose it by ALPN) on `io`,
    /// whose TCP socket is [`Gather`]ed (below TLS, never above it: rustls already makes one
    /// record of a head and body written together).
    /// `alpn_h2`: what ALPN settled over TLS (`Some(true)`: `h2`), which the first bytes must
    /// then agree with (RFC 9113 §3.2, RFC 7301 §3.2); a front end that allows one protocol by
    /// ALPN is not gone around by speaking the other. `first_bytes`: the time left for them.
    async fn serve<IO>(
        self,
        mut io: IO,
        info: Arc<ConnInfo>,
        alpn_h2: Option<bool>,
        first_bytes: Duration,
    ) where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mut phase = self.phase.clone();
        // Bytes already in are read first: a request that began before the drain is served.
        let read = tokio::select! {
            biased;
            r = preface::read(&mut io, first_bytes) => r,
            _ = draining(&mut phase) => return,
        };
        let seen = match read {
            Ok(seen) => seen,
            Err(e) => {
                let peer = info.peer.addr;
                tracing::debug!(%peer, error = %e, "no request began; connection closed");
                return;
            }
        };
        let h2 = seen == preface::PREFACE;
        if alpn_h2.is_some_and(|alpn| alpn != h2) {
            let peer = info.peer.addr;
            tracing::debug!(%peer, h2, ?alpn_h2, "the first bytes are not the protocol ALPN settled; connection closed");
            return;
        }
        let io = stall::Stall::new(preface::Rewind::new(seen, io), self.timeouts.send);
        if h2 {
            // HTTP/2 has no idle timer of its own in hyper, nor one for a client that opens
            // no flow-control window for an answer: see `idle`.
            let activity = idle::Activity::new(info.peer.addr);
            let io = idle::IdleIo::new(io, activity.clone(), self.timeouts);
            self.serve_http(io, info, Some(activity)).await
        } else {
            self.serve_http(io, info, None).await
        }
    }

    /// Serve HTTP on `io` (its first bytes read already); an HTTP/2 connection's requests
    /// and answer bodies are counted in `activity`.
    async fn serve_http<IO>(
        self,
        io: IO,
        info: Arc<ConnInfo>,
        activity: Option<Arc<idle::Activity>>,
    ) where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let h = self.handler;
        let svc = service_fn(move |req: Request<Incoming>| {
            let h = h.clone();
            let busy = activity.as_ref().map(idle::Activity::begin);
            // What the panic log and answer need, taken before the handler owns `req`.
            let (method, uri) = (req.method().clone(), req.uri().clone());
            let client_rid = req.headers().get(X_REQUEST_ID).cloned();
            let (info, peer) = (info.clone(), info.peer.addr);
            async move {
                // The handler call itself is inside the caught future, so a panic while
                // building the future is caught as well as one while polling it.
                let res = match AssertUnwindSafe(async move { h(req, info).await })
                    .catch_unwind()
                    .await
                {
                    Ok(res) => res,
                    Err(p) => panicked(&*p, &method, &uri, peer, client_rid),
                };
                Ok::<_, Infallible>(match busy {
                    Some(busy) => idle::track(res, busy),
                    None => res,
                })
            }
        });
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), svc)
            .into_owned();
        let mut conn = std::pin::pin!(conn);
        let mut phase = self.phase;
        // The connection is polled first, so a request whose bytes are in is read before a
        // drain could close the connection as idle: it is answered, with `Connection: close`
        // (HTTP/2: a GOAWAY naming the streams it took).
        let ended = tokio::select! {
            biased;
            r = conn.as_mut() => r,
            _ = draining(&mut phase) => {
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    biased;
                    r = conn.as_mut() => r,
                    _ = cut(&mut phase) => return,
                }
            }
        };
        if let Err(e) = ended {
            if let Some(status) = refused_head(&*e) {
                (self.refused)(status);
            }
        }
    }
}

/// The answer hyper wrote itself, if `e` ended a connection on a request head it could not
/// parse: 431 past [`MAX_REQUEST_HEAD`] (or hyper's 100 fields), otherwise 400 (hyper's
/// `role::Server::on_error`; the rare 414 of an over-long target reads as 400 here).
fn refused_head(e: &(dyn std::error::Error + 'static)) -> Option<StatusCode> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if e.is_parse_too_large() {
        Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    } else if e.is_parse() {
        Some(StatusCode::BAD_REQUEST)
    } else {
        None
    }
}
