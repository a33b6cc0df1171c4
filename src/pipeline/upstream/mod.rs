//! Stage 4 — forward to an upstream: keep-alive connections per target (`pool`),
//! round-robin over targets skipping those that refuse, bodies streamed both ways.

mod pool;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::Authority;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, Version};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

pub use pool::Streamed;
use pool::{Connector, Dest, Pool, SendError};

use crate::model::table::UpstreamSpec;

/// How long a target that refused a connection is skipped before being tried again.
const REFUSED_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// Refused, reset, or closed without an answer: 502.
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// Connect or response-head timeout: 504.
    #[error("upstream timed out: {0}")]
    Timeout(String),
    /// An answer the gateway will not pass on, because the client could not read it as the
    /// upstream meant it: 502 (as nginx answers).
    #[error("upstream answer refused: {0}")]
    BadAnswer(&'static str),
    /// An answer head the HTTP/1 parser could not read (a bad status line or field, too
    /// large, too many fields): 502. The upstream was reached; it answered wrong.
    #[error("upstream answer refused: {0}")]
    Unreadable(String),
    /// The client's own body broke off or could not be decoded (a bad chunk size, say) before
    /// the upstream answered: 400, and the client's connection is closed.
    #[error("the request body could not be read: {0}")]
    ClientBody(String),
    /// The upstream connection waited `timeout` for body the client did not send (a client
    /// that stopped uploading): 408, as nginx's `client_body_timeout` answers, and the
    /// client's connection is closed. Not the upstream's failure.
    #[error("no request body arrived for {0:?}")]
    ClientBodyTimeout(Duration),
}

impl ForwardError {
    /// Whether the client broke the exchange (its body broke off or stopped arriving): no
    /// upstream failure is logged or counted, the answer is the client's 400 or 408, and its
    /// connection is closed.
    pub fn clients_fault(&self) -> bool {
        matches!(
            self,
            ForwardError::ClientBody(_) | ForwardError::ClientBodyTimeout(_)
        )
    }
}

struct Target {
    /// `host:port` as logged and counted.
    name: Arc<str>,
    /// The `Host` a request without one is sent with (the port only if not the scheme's).
    host: HeaderValue,
    /// Milliseconds since process start until which this target is skipped.
    down_until_ms: AtomicU64,
}

pub struct Upstream {
    spec: UpstreamSpec,
    targets: Vec<Target>,
    next: AtomicUsize,
    pool: Arc<Pool>,
}

/// What to send upstream, minus the body.
pub struct Outgoing {
    pub method: Method,
    /// Origin form (`/path?query`): hyper writes the target as given.
    pub target: Uri,
    pub headers: HeaderMap,
    /// `headers` holds the request's `Host`; without one (HTTP/1.0) the target's is sent.
    pub has_host: bool,
}

/// A target's `Target` and its pool `Dest`: the port (the scheme's when none is given), the
/// `Host` header (the port only if not the scheme's), the TLS name.
fn target(authority: &Authority, spec: &UpstreamSpec) -> (Target, Dest) {
    let default = if spec.tls.is_some() { 443 } else { 80 };
    let port = authority.port_u16().unwrap_or(default);
    let host_field = if port == default {
        authority.host()
    } else {
        authority.as_str()
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    // A `server_name` is checked by config; a host that is no valid name fails at connect.
    let tls_name = match spec.tls.as_ref().and_then(|t| t.server_name.clone()) {
        Some(name) => ServerName::try_from(name).ok(),
        None => ServerName::try_from(host.to_owned()).ok(),
    };
    let target = Target {
        name: authority.as_str().into(),
        host: HeaderValue::from_str(host_field).expect("an authority is a valid header value"),
        down_until_ms: AtomicU64::new(0),
    };
    let dest = Dest {
        host: host.into(),
        port,
        tls_name,
    };
    (target, dest)
}

/// Milliseconds from process start to `at`: an instant that fits an atomic, for activity
/// stamped by one task and read by another (an upload's progress, a tunnel's bytes).
pub(super) fn ms_at(at: Instant) -> u64 {
    at.saturating_duration_since(start()).as_millis() as u64
}

/// The instant `ms` milliseconds after process start (the inverse of [`ms_at`]).
pub(super) fn at_ms(ms: u64) -> Instant {
    start() + Duration::from_millis(ms)
}

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl Upstream {
    /// A client with its own connection pool for these settings (idle connections kept per
    /// worker, of `workers`); `tls` is the loaded client configuration of an https upstream.
    pub fn new(
        spec: &UpstreamSpec,
        tls: Option<Arc<rustls::ClientConfig>>,
        workers: usize,
    ) -> Upstream {
        let connector = Connector {
            connect_timeout: spec.connect_timeout,
            read_timeout: spec.idle_timeout,
            tls: tls.map(TlsConnector::from),
        };
        let (targets, dests) = spec.targets.iter().map(|a| target(a, spec)).unzip();
        Upstream {
            spec: spec.clone(),
            targets,
            next: AtomicUsize::new(0),
            pool: Arc::new(Pool::new(connector, dests, workers)),
        }
    }

    /// `sent`'s answer, or `None` once `timeout` has passed since the later of `deadline`'s
    /// start and the last request-body bytes the upstream connection took (or the body's
    /// end): an upload that keeps moving is not cut, however long it takes, and the wait for
    /// the head counts from when the body was all sent, as Envoy's route timeout does.
    async fn head_within<F: std::future::Future>(
        &self,
        sent: F,
        slot: Option<&Slot>,
        mut deadline: tokio::time::Instant,
    ) -> Option<F::Output> {
        let mut sent = std::pin::pin!(sent);
        loop {
            match tokio::time::timeout_at(deadline, sent.as_mut()).await {
                Ok(answer) => return Some(answer),
                Err(_) => {
                    let moved = at_ms(slot?.moved_ms.load(Ordering::Acquire));
                    let later = tokio::time::Instant::from_std(moved) + self.spec.timeout;
                    if later <= deadline {
                        return None;
                    }
                    deadline = later;
                }
            }
        }
    }

    /// The settings this client was built for (a reload with equal settings reuses it).
    pub fn spec(&self) -> &UpstreamSpec {
        &self.spec
    }

    /// Send the request; on a refused connection try the next target with the same,
    /// still unread, body. Returns the upstream's response head; its body streams on. `tried`
    /// names the last target the request went to, answered or not (for the access log). `now` is the caller's clock reading, taken just before: the
    /// deadline, the refused-target check and the idle pool's pruning all use it rather than
    /// reading the clock again each.
    pub async fn send(
        &self,
        out: Outgoing,
        body: Incoming,
        now: Instant,
        tried: &mut Option<Arc<str>>,
    ) -> Result<Response<Streamed>, ForwardError> {
        let deadline = tokio::time::Instant::from_std(now) + self.spec.timeout;
        // No body (most requests): nothing to share between attempts, nothing to allocate.
        let slot = (!body.is_end_stream()).then(|| {
            Arc::new(Slot {
                body: Mutex::new(Some(body)),
                failed: AtomicBool::new(false),
                ended: AtomicBool::new(false),
                starved: AtomicBool::new(false),
                moved_ms: AtomicU64::new(ms_at(now)),
            })
        });
        // A GET or HEAD body of unknown length (chunked, or HTTP/2 DATA without a length):
        // hyper's client would send these methods with no body at all unless told the coding,
        // and the client's bytes would be dropped without a word. Sent chunked, as received.
        let mut headers = out.headers;
        if slot.is_some()
            && matches!(out.method, Method::GET | Method::HEAD)
            && !headers.contains_key(CONTENT_LENGTH)
        {
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        let mut headers = Some(headers);
        let n = self.targets.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let now_ms = ms_at(now);
        // Prefer targets not recently refused; if all are, try them all anyway.
        let order = (0..n)
            .map(|i| (first + i) % n)
            .filter(|&i| self.targets[i].down_until_ms.load(Ordering::Relaxed) <= now_ms)
            .chain((0..n).map(|i| (first + i) % n))
            .take(n);
        let mut last = None;
        for (attempt, i) in order.enumerate() {
            let target = &self.targets[i];
            *tried = Some(target.name.clone());
            let mut req = Request::new(ReplayBody {
                slot: slot.clone(),
                inner: None,
            });
            *req.method_mut() = out.method.clone();
            *req.uri_mut() = out.target.clone();
            *req.version_mut() = Version::HTTP_11;
            // The last possible attempt takes the headers; earlier ones (a refused connection
            // is retried on the next target) copy them.
            *req.headers_mut() = if attempt + 1 == n {
                headers.take().unwrap_or_default()
            } else {
                headers.clone().unwrap_or_default()
            };
            // A client without `Host` (HTTP/1.0): the target's.
            if !out.has_host {
                req.headers_mut().insert(HOST, target.host.clone());
            }
            let sent = self.pool.send(i, req, now);
            let err = match self.head_within(sent, slot.as_deref(), deadline).await {
                None if slot.as_ref().is_some_and(|s| s.awaits_client()) => {
                    return Err(ForwardError::ClientBodyTimeout(self.spec.timeout))
                }
                None => {
                    return Err(ForwardError::Timeout(format!(
                        "no response head from {} within {:?}",
                        target.name, self.spec.timeout
                    )))
                }
                Some(Ok(res)) => return Ok(res),
                Some(Err(e)) => e,
            };
            let err = match err {
                SendError::Http(e)
                    if slot
                        .as_ref()
                        .is_some_and(|s| s.failed.load(Ordering::Acquire)) =>
                {
                    return Err(ForwardError::ClientBody(chain(&e)))
                }
                SendError::Http(e) => return Err(classify(&e, &target.name)),
                SendError::ConnectTimeout => {
                    return Err(ForwardError::Timeout(format!(
                        "connect to {} timed out after {:?}",
                        target.name, self.spec.connect_timeout
                    )))
                }
                // The gateway's own descriptors or memory ran out: the target is not at
                // fault and is not set aside, and no other would fare better.
                SendError::Connect(e) if out_of_resources(&e) => {
                    return Err(ForwardError::Unreachable(format!(
                        "cannot connect to {}: this gateway is out of resources: {}",
                        target.name,
                        chain(&e)
                    )))
                }
                SendError::Connect(e) => ForwardError::Unreachable(format!(
                    "cannot connect to {}: {}",
                    target.name,
                    chain(&e)
                )),
            };
            // The body went out with the failed attempt: the request cannot be sent again.
            if slot.as_ref().is_some_and(|s| s.body.lock().is_none()) {
                return Err(err);
            }
            target.down_until_ms.store(
                ms_at(Instant::now()) + REFUSED_BACKOFF.as_millis() as u64,
                Ordering::Relaxed,
            );
            last = Some(err);
        }
        Err(last.unwrap_or_else(|| ForwardError::Unreachable("no targets".into())))
    }
}

/// A connection to `target` that failed after the request went out: 504 if a read or write
/// timed out, else 502 (an answer that could not be parsed, or none).
fn classify(e: &hyper::Error, target: &str) -> ForwardError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut timed_out = false;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            timed_out |= io.kind() == std::io::ErrorKind::TimedOut;
        }
        src = s.source();
    }
    let what = format!("{target}: {}", chain(e));
    if timed_out {
        ForwardError::Timeout(what)
    } else if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        ForwardError::Unreadable(what)
    } else {
        ForwardError::Unreachable(what)
    }
}

/// EMFILE, ENFILE, ENOBUFS, ENOMEM: the failure is this process's or this host's.
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// An error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The client's body, until a request to some target starts reading it.
struct Slot {
    body: Mutex<Option<Incoming>>,
    /// Reading the client's body failed: the request's fault, not the upstream's.
    failed: AtomicBool,
    /// The whole body was handed to the upstream connection (see [`pool::Streamed`]).
    ended: AtomicBool,
    /// The upstream connection asked for more of the body and the client has not sent it
    /// yet (false while the connection is not asking: the upstream is not reading).
    starved: AtomicBool,
    /// When ([`ms_at`]) the upstream connection last took body bytes, or the body ended.
    moved_ms: AtomicU64,
}

impl Slot {
    /// Whether the request is held up by its client: the upstream connection is waiting for
    /// body the client has not sent.
    fn awaits_client(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && self.starved.load(Ordering::Acquire)
    }
}

/// The client's request body, shared so that a connection refused before the body was read
/// leaves it available for the next target. The first poll takes it out of the slot. No slot:
/// the request has no body.
pub struct ReplayBody {
    slot: Option<Arc<Slot>>,
    inner: Option<Incoming>,
}

impl ReplayBody {
    /// Whether the whole body has been handed to the upstream connection (no body: it has).
    fn ended(slot: &Option<Arc<Slot>>) -> bool {
        slot.as_ref()
            .is_none_or(|s| s.ended.load(Ordering::Acquire))
    }
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(slot) = &this.slot else {
            return Poll::Ready(None);
        };
        if this.inner.is_none() {
            this.inner = slot.body.lock().take();
        }
        let polled = match this.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        };
        slot.starved.store(polled.is_pending(), Ordering::Release);
        if let Poll::Ready(Some(Ok(_)) | None) = &polled {
            slot.moved_ms
                .store(ms_at(Instant::now()), Ordering::Release);
        }
        match &polled {
            Poll::Ready(Some(Err(_))) => slot.failed.store(true, Ordering::Release),
            Poll::Ready(None) => slot.ended.store(true, Ordering::Release),
            Poll::Ready(Some(Ok(_))) if this.inner.as_ref().is_some_and(|b| b.is_end_stream()) => {
                slot.ended.store(true, Ordering::Release)
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match (&self.inner, &self.slot) {
            (Some(b), _) => b.is_end_stream(),
            (None, None) => true,
            (None, Some(slot)) => slot.body.lock().as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.slot) {
            (Some(b), _) => b.size_hint(),
            (None, None) => SizeHint::with_exact(0),
            (None, Some(slot)) => slot
                .body
                .lock()
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}
