//! A real upstream HTTP server for tests, on its own thread and runtime.
//!
//! Paths: `/download?bytes=N` streams N bytes; `/upload` counts the body as it streams and
//! answers the count; `/slow?ms=N[&status=NNN]` waits before the head; `/tokens?n=N[&ms=M]`
//! answers `X-Tokens-Used: N`; `/status/NNN`; `/close` answers and closes the connection;
//! `/ws` answers 101 and echoes raw bytes;
//! anything else echoes the request as JSON.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Body = BoxBody<Bytes, Infallible>;

pub struct Upstream {
    pub addr: SocketAddr,
    /// Requests answered.
    pub hits: Arc<AtomicUsize>,
    /// Connections accepted.
    pub conns: Arc<AtomicUsize>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let h = hits.clone();
        let conns = Arc::new(AtomicUsize::new(0));
        let accepted = conns.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        a = listener.accept() => {
                            let Ok((stream, _)) = a else { continue };
                            accepted.fetch_add(1, Ordering::SeqCst);
                            let h = h.clone();
                            tokio::spawn(async move {
                                let svc = service_fn(move |req| {
                                    h.fetch_add(1, Ordering::SeqCst);
                                    handle(req)
                                });
                                let _ = auto::Builder::new(TokioExecutor::new()).serve_connection_with_upgrades(TokioIo::new(stream), svc).await;
                            });
                        }
                    }
                }
            });
        });
        Upstream {
            addr,
            hits,
            conns,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn query_num(req: &Request<Incoming>, key: &str) -> u64 {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| {
            kv.strip_prefix(&format!("{key}="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn handle(mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    if path == "/download" {
        let total = query_num(&req, "bytes");
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = stream::unfold(total, move |left| {
            let chunk = chunk.clone();
            async move {
                if left == 0 {
                    return None;
                }
                let n = left.min(chunk.len() as u64);
                Some((
                    Ok::<_, Infallible>(Frame::data(chunk.slice(..n as usize))),
                    left - n,
                ))
            }
        });
        let mut res = Response::new(StreamBody::new(chunks).boxed());
        res.headers_mut().insert("content-length", total.into());
        return Ok(res);
    }
    if path == "/upload" {
        let mut n: u64 = 0;
        let mut body = req.into_body();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                Err(_) => break,
            }
        }
        return Ok(Response::new(full(n.to_string())));
    }
    if path == "/slow" {
        tokio::time::sleep(Duration::from_millis(query_num(&req, "ms"))).await;
        let mut res = Response::new(full("slow done"));
        if let Some(s) = Some(query_num(&req, "status")).filter(|s| *s > 0) {
            *res.status_mut() = StatusCode::from_u16(s as u16).unwrap();
        }
        return Ok(res);
    }
    if path == "/tokens" {
        tokio::time::sleep(Duration::from_millis(query_num(&req, "ms"))).await;
        let mut res = Response::new(full("used"));
        res.headers_mut()
            .insert("x-tokens-used", query_num(&req, "n").into());
        return Ok(res);
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let mut res = Response::new(full(format!("status {code}")));
        *res.status_mut() = StatusCode::from_u16(code.parse().unwrap_or(500)).unwrap();
        return Ok(res);
    }
    if path == "/close" {
        let mut res = Response::new(full("closing"));
        res.headers_mut()
            .insert("connection", "close".parse().unwrap());
        return Ok(res);
    }
    if path == "/ws" {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on_upgrade.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 4096];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut res = Response::new(full(Bytes::new()));
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        res.headers_mut()
            .insert("upgrade", "websocket".parse().unwrap());
        res.headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        return Ok(res);
    }
    // Echo: method, path, query, headers (all values per name), body length; like the demo
    // upstream, `ms=N` waits, `status=NNN` and `tokens=N` shape the answer.
    tokio::time::sleep(Duration::from_millis(query_num(&req, "ms"))).await;
    let status = StatusCode::from_u16(query_num(&req, "status") as u16).unwrap_or(StatusCode::OK);
    let tokens = req
        .uri()
        .query()
        .is_some_and(|q| q.contains("tokens="))
        .then(|| query_num(&req, "tokens"));
    let mut headers = serde_json::Map::new();
    for name in req.headers().keys() {
        let vals: Vec<serde_json::Value> = req
            .headers()
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned().into())
            .collect();
        headers.insert(name.to_string(), vals.into());
    }
    let method = req.method().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let version = format!("{:?}", req.version());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let doc = serde_json::json!({"method": method, "path": path, "query": query, "headers": headers, "body_len": body, "version": version});
    let mut res = Response::new(full(doc.to_string()));
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    res.headers_mut()
        .insert("connection", "x-hop".parse().unwrap());
    res.headers_mut()
        .insert("x-hop", "must-not-reach-client".parse().unwrap());
    res.headers_mut()
        .insert("keep-alive", "timeout=5".parse().unwrap());
    *res.status_mut() = status;
    if let Some(n) = tokens {
        res.headers_mut().insert("x-tokens-used", n.into());
    }
    Ok(res)
}
