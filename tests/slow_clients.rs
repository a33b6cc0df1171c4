//! Clients that stop reading their answer, through the real binary over real sockets: the
//! gateway disconnects them after `send_timeout` (nginx's `send_timeout`), so that they do not
//! hold their connection, the upstream connection streaming the answer and its buffers for
//! good. Over HTTP/1.1 the socket fills and the connection is closed; over HTTP/2 the client
//! can also open no flow-control window, the socket never fills, and that answer alone is
//! given up.

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer far larger than the socket buffers on both sides.
const BIG: u64 = 256 << 20;

fn gateway(up: &Upstream) -> Sluice {
    Sluice::start(&format!(
        "send_timeout: 1s\nupstreams: {{ up: {{ targets: [{}], timeout: 10s }} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n",
        up.url()
    ))
}

/// HTTP/1.1: the client reads nothing for 3 s (three send timeouts), then everything it can.
/// It gets what the socket buffers held, then the end of the connection, not the rest.
#[tokio::test]
async fn an_http1_client_that_stops_reading_is_disconnected() {
    let up = Upstream::start();
    let s = gateway(&up);
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    let mut c = sock.connect(s.addr).await.unwrap();
    c.write_all(
        format!("GET /download?bytes={BIG} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut got = 0u64;
    let mut buf = vec![0; 64 * 1024];
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "still open after {got} bytes");
    assert!(got > 0, "nothing was sent at all");
    assert!(got < BIG / 4, "{got} of {BIG} bytes: the stall was not cut");
}

/// HTTP/2: the client opens a 64 KiB window and never another; the socket stays empty, and
/// the gateway still gives the answer up once it waited for the send timeout (its stream is
/// reset when the client reads on, and the upstream connection was released long before),
/// while the connection's next request is served.
#[tokio::test]
async fn an_http2_answer_the_client_opens_no_window_for_is_given_up() {
    let up = Upstream::start();
    let s = gateway(&up);
    let c: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(65_535)
            .http2_initial_connection_window_size(65_535)
            .build_http();
    let res = c
        .get(s.url(&format!("/download?bytes={BIG}")).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut body = res.into_body();
    let mut got = 0u64;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match body.frame().await {
                Some(Ok(f)) => got += f.data_ref().map_or(0, |d| d.len() as u64),
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        }
    })
    .await;
    let ended = ended.unwrap_or_else(|_| panic!("still streaming after {got} bytes"));
    assert!(ended.is_err(), "the whole answer came ({got} bytes)");
    assert!(got < BIG / 4, "{got} of {BIG} bytes");
    let next = get(&c, &s.url("/next"), &[]).await;
    assert_eq!(next.status, 200, "the connection's next request");
}

/// HTTP/2's rapid reset, slowed down to get past h2's own guard (which refuses streams reset
/// before the server took them up): batches of requests to a slow route, each cancelled 50 ms
/// later, when the gateway is already forwarding it. The gateway closes the connection once
/// the client has cancelled most of its requests (past 100), so the upstream sees a bounded
/// number of them, not one per frame the client can send.
#[tokio::test]
async fn an_http2_client_that_cancels_its_requests_is_disconnected() {
    let up = Upstream::start();
    let s = gateway(&up);
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let mut sent = 0;
    let closed = 'batches: {
        for _ in 0..20 {
            let mut batch = Vec::new();
            for _ in 0..50 {
                if send.ready().await.is_err() {
                    break 'batches true;
                }
                let req = http::Request::get(s.url("/slow?ms=5000"))
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap();
                batch.push(send.send_request(req));
                sent += 1;
            }
            let all = futures_util::future::join_all(batch);
            let _ = tokio::time::timeout(Duration::from_millis(50), all).await;
        }
        false
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        closed,
        "all {sent} requests sent and cancelled on one connection"
    );
    assert!(sent < 400, "{sent} requests before the connection closed");
    s.wait_log(&["cancelled most of its requests"]);
}
