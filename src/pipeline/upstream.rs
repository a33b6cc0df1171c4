//! Stage 4 — forward to an upstream: pooled keep-alive connections (one hyper-util client per
//! upstream), round-robin over targets skipping those that refuse, bodies streamed both ways.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use rustls::pki_types::ServerName;

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
    /// The client's own body broke off or could not be decoded (a bad chunk size, say) before
    /// the upstream answered: 400, and the client's connection is closed.
    #[error("the request body could not be read: {0}")]
    ClientBody(String),
}

struct Target {
    authority: Authority,
    /// Milliseconds since process start until which this target is skipped.
    down_until_ms: AtomicU64,
}

pub struct Upstream {
    spec: UpstreamSpec,
    targets: Vec<Target>,
    next: AtomicUsize,
    client: Pool,
    scheme: Scheme,
}

/// The connection pool: cleartext, or TLS through rustls (the plain path pays nothing for
/// the TLS one).
enum Pool {
    Plain(Client<HttpConnector, ReplayBody>),
    Tls(Client<HttpsConnector<HttpConnector>, ReplayBody>),
}

impl Pool {
    fn request(&self, req: Request<ReplayBody>) -> ResponseFuture {
        match self {
            Pool::Plain(c) => c.request(req),
            Pool::Tls(c) => c.request(req),
        }
    }
}

/// What to send upstream, minus the body.
pub struct Outgoing {
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Upstream {
    /// A client with its own connection pool for these settings; `tls` is the loaded client
    /// configuration of an https upstream.
    pub fn new(spec: &UpstreamSpec, tls: Option<Arc<rustls::ClientConfig>>) -> Upstream {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(spec.connect_timeout));
        conn.set_nodelay(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(usize::MAX);
        let (client, scheme) = match tls {
            None => (Pool::Plain(builder.build(conn)), Scheme::HTTP),
            Some(cfg) => {
                // hyper-rustls checks the scheme itself: an https target is never sent in
                // cleartext.
                conn.enforce_http(false);
                let https = HttpsConnectorBuilder::new().with_tls_config((*cfg).clone());
                let https = https.https_only();
                let https = match spec.tls.as_ref().and_then(|t| t.server_name.clone()) {
                    Some(name) => match ServerName::try_from(name) {
                        Ok(n) => https.with_server_name_resolver(FixedServerNameResolver::new(n)),
                        // Refused by config already; the target's host stands.
                        Err(_) => https,
                    },
                    None => https,
                };
                let https = https.enable_http1().wrap_connector(conn);
                (Pool::Tls(builder.build(https)), Scheme::HTTPS)
            }
        };
        Upstream {
            scheme,
            spec: spec.clone(),
            targets: spec
                .targets
                .iter()
                .map(|authority| Target {
                    authority: authority.clone(),
                    down_until_ms: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            client,
        }
    }

    /// The settings this client was built for (a reload with equal settings reuses it).
    pub fn spec(&self) -> &UpstreamSpec {
        &self.spec
    }

    /// Send the request; on a refused connection try the next target with the same,
    /// still unread, body. Returns the upstream's response head; its body streams on.
    pub async fn send(
        &self,
        out: Outgoing,
        body: Incoming,
    ) -> Result<(Response<Incoming>, String), ForwardError> {
        let deadline = tokio::time::Instant::now() + self.spec.timeout;
        let slot = Arc::new(Slot {
            body: Mutex::new(Some(body)),
            failed: AtomicBool::new(false),
        });
        let n = self.targets.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        // Prefer targets not recently refused; if all are, try them all anyway.
        let order = (0..n)
            .map(|i| (first + i) % n)
            .filter(|&i| self.targets[i].down_until_ms.load(Ordering::Relaxed) <= now)
            .chain((0..n).map(|i| (first + i) % n))
            .take(n);
        let mut last = None;
        let mut headers = Some(out.headers);
        for (attempt, i) in order.enumerate() {
            let target = &self.targets[i];
            let uri = Uri::builder()
                .scheme(self.scheme.clone())
                .authority(target.authority.clone())
                .path_and_query(out.path_and_query.as_str())
                .build()
                .map_err(|e| ForwardError::Unreachable(e.to_string()))?;
            let mut req = Request::new(ReplayBody {
                slot: slot.clone(),
                inner: None,
            });
            *req.method_mut() = out.method.clone();
            *req.uri_mut() = uri;
            *req.version_mut() = Version::HTTP_11;
            // The last possible attempt takes the headers; earlier ones (a refused connection
            // is retried on the next target) copy them.
            *req.headers_mut() = if attempt + 1 == n {
                headers.take().unwrap_or_default()
            } else {
                headers.clone().unwrap_or_default()
            };
            match tokio::time::timeout_at(deadline, self.client.request(req)).await {
                Err(_) => {
                    return Err(ForwardError::Timeout(format!(
                        "no response head within {:?}",
                        self.spec.timeout
                    )))
                }
                Ok(Ok(res)) => return Ok((res, target.authority.to_string())),
                Ok(Err(e)) => {
                    if slot.failed.load(Ordering::Acquire) {
                        return Err(ForwardError::ClientBody(chain(&e)));
                    }
                    let err = classify(&e);
                    let retry = e.is_connect()
                        && matches!(err, ForwardError::Unreachable(_))
                        && slot.body.lock().is_some();
                    if !retry {
                        return Err(err);
                    }
                    target.down_until_ms.store(
                        now_ms() + REFUSED_BACKOFF.as_millis() as u64,
                        Ordering::Relaxed,
                    );
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or_else(|| ForwardError::Unreachable("no targets".into())))
    }
}

fn classify(e: &hyper_util::client::legacy::Error) -> ForwardError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut timed_out = false;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            timed_out |= io.kind() == std::io::ErrorKind::TimedOut;
        }
        src = s.source();
    }
    if timed_out {
        ForwardError::Timeout(chain(e))
    } else {
        ForwardError::Unreachable(chain(e))
    }
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
}

/// The client's request body, shared so that a connection refused before the body was read
/// leaves it available for the next target. The first poll takes it out of the slot.
pub struct ReplayBody {
    slot: Arc<Slot>,
    inner: Option<Incoming>,
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.inner.is_none() {
            this.inner = this.slot.body.lock().take();
        }
        let polled = match this.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        };
        if let Poll::Ready(Some(Err(_))) = &polled {
            this.slot.failed.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(b) => b.is_end_stream(),
            None => self
                .slot
                .body
                .lock()
                .as_ref()
                .is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) => b.size_hint(),
            None => self
                .slot
                .body
                .lock()
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}
