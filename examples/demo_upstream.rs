//! A trivial upstream for the quick start, the load script and docker-compose: answers every
//! request with 200 and a short text body. Usage: demo_upstream [ADDR] (default 127.0.0.1:3000).
//! For `config/answers.yaml`, three query parameters change the answer: `status=NNN` (its
//! status), `tokens=N` (an `X-Tokens-Used: N` header), `ms=N` (wait before answering).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("demo upstream listening on http://{addr}");
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                let body = format!(
                    "hello from upstream: {} {}\n",
                    req.method(),
                    req.uri().path()
                );
                let param = |name: &str| query(req.uri().query(), name);
                if let Some(ms) = param("ms") {
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                }
                let mut res = Response::new(Full::new(Bytes::from(body)));
                if let Some(s) = param("status").and_then(|s| u16::try_from(s).ok()) {
                    *res.status_mut() = hyper::StatusCode::from_u16(s).unwrap_or_default();
                }
                if let Some(n) = param("tokens") {
                    res.headers_mut().insert("x-tokens-used", n.into());
                }
                Ok::<_, Infallible>(res)
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// The integer value of query parameter `name`.
fn query(q: Option<&str>, name: &str) -> Option<u64> {
    q?.split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}
