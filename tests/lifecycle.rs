//! The process's life around its requests, through the real binary: what a drain waits for
//! (upgraded tunnels) and what it does not (connections that began no request), what
//! requests cut at its deadline still settle (their answer's charge, their concurrency
//! slots, on a real `redis-server`), a second signal, a signal while the store is awaited at
//! start-up, and a config that cannot be read for a moment.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::*;

fn plain(up: &Upstream, drain: &str) -> String {
    format!(
        "drain_timeout: {drain}\nclient_header_timeout: 30s\nupstreams: {{ up: {{ targets: [{}], timeout: 30s }} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n",
        up.url()
    )
}

/// SIGTERM (or `sig`) and the exit status, off the test's runtime.
async fn stop(mut s: Sluice, sig: &'static str) -> (std::process::ExitStatus, Sluice) {
    tokio::task::spawn_blocking(move || (s.stop_with(sig), s))
        .await
        .unwrap()
}

/// A connection that sent nothing is closed when the drain starts, as nginx closes its idle
/// ones: it does not hold the exit until `client_header_timeout` or `drain_timeout`.
#[tokio::test]
async fn a_connection_that_began_no_request_does_not_hold_the_drain() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up, "20s"));
    let mut silent = TcpStream::connect(s.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(25)))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (st, s) = stop(s, "TERM").await;
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the exit waited {:?} for a connection that sent nothing\n{}",
        started.elapsed(),
        s.log()
    );
    let mut buf = [0u8; 64];
    assert_eq!(
        silent.read(&mut buf).unwrap_or(0),
        0,
        "closed without an answer"
    );
}

/// An upgraded connection is a request in flight: the drain waits for it (it keeps echoing
/// after SIGTERM) up to `drain_timeout`, then closes it.
#[tokio::test]
async fn a_websocket_tunnel_is_drained_then_closed_at_the_deadline() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up, "2s"));
    let mut ws = TcpStream::connect(s.addr).unwrap();
    ws.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ws.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
    let mut head = [0u8; 1024];
    let n = ws.read(&mut head).unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    let started = Instant::now();
    let stopping = tokio::spawn(stop(s, "TERM"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut echo = [0u8; 16];
    for msg in [&b"during-1"[..], b"during-2"] {
        ws.write_all(msg).unwrap();
        let n = ws.read(&mut echo).unwrap();
        assert_eq!(
            &echo[..n],
            msg,
            "the tunnel stopped echoing during the drain"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (st, s) = stopping.await.unwrap();
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "exited before the drain deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(
        ws.read(&mut echo).unwrap_or(0),
        0,
        "the tunnel outlived the process"
    );
    assert!(s.log().contains("drain deadline passed"), "{}", s.log());
}

/// Requests cut at the drain deadline settle before the process exits: the answer-charged
/// limit is charged its `default` (no answer came) and the concurrency slots are free at
/// once, as when a client goes away, not held for their `lease` (SPEC §11: only a gateway
/// that dies leaves them to expire).
#[tokio::test]
async fn requests_cut_at_the_deadline_are_charged_and_free_their_slots() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let yaml = format!(
        "drain_timeout: 1s\nstore:\n  kind: redis\n  redis: {{ url: \"{}\", timeout: 500ms }}\n  on_error: deny\n\
         upstreams: {{ up: {{ targets: [{}], timeout: 30s }} }}\n\
         routes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n\
         \x20     - {{ name: slots, by: ip, algorithm: concurrency, max: 3, lease: 60s }}\n\
         \x20     - {{ name: tokens, by: ip, algorithm: fixed_window, rate: 100/1h, cost: {{ response_header: X-Tokens-Used, default: 7, max: 50 }} }}\n",
        redis.url(),
        up.url()
    );
    let s = Sluice::start(&yaml);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut st = TcpStream::connect(s.addr).unwrap();
        st.write_all(b"GET /slow?ms=20000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        held.push(st);
    }
    let c = client();
    let peek = |s: &Sluice, limit: &str| {
        let url = s.admin_url(&format!("/admin/limits/all/{limit}?key=127.0.0.1"));
        let c = c.clone();
        async move { get(&c, &url, &[]).await.json()["remaining"].as_u64() }
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            peek(&s, "slots").await == Some(1)
        })
        .await,
        "two slots never taken\n{}",
        s.log()
    );
    let (st, s) = stop(s, "TERM").await;
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(s.log().contains("drain deadline passed"), "{}", s.log());
    // A second gateway on the same Redis sees what the first left behind.
    let next = Sluice::start(&yaml);
    assert_eq!(
        peek(&next, "slots").await,
        Some(3),
        "slots held after a graceful exit\n{}",
        s.log()
    );
    assert_eq!(
        peek(&next, "tokens").await,
        Some(100 - 2 * 7),
        "the cut requests were not charged their default\n{}",
        s.log()
    );
    drop(held);
}

/// A second SIGTERM/SIGINT during the drain closes what is open at once (the process exits
/// well before `drain_timeout`), and says so.
#[tokio::test]
async fn a_second_signal_cuts_the_drain_short() {
    let up = Upstream::start();
    let s = Sluice::start(&plain(&up, "30s"));
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    slow.write_all(b"GET /slow?ms=25000 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (st, s) = stop(s, "INT").await;
    assert!(st.success(), "exit status {st}: {}", s.log());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}\n{}",
        started.elapsed(),
        s.log()
    );
    let log = s.log();
    assert!(log.contains("second signal"), "{log}");
    assert!(
        log.contains("\"status\":499"),
        "the cut request is logged: {log}"
    );
    let mut buf = [0u8; 64];
    assert_eq!(slow.read(&mut buf).unwrap_or(0), 0);
}

/// SIGTERM while start-up waits for an absent Redis (`startup_timeout: 10m`) ends the process
/// at once, exit 0, and the data port never opened.
#[tokio::test]
async fn sigterm_while_waiting_for_the_store_exits() {
    let up = Upstream::start();
    let dead = free_port();
    let data = free_port();
    let admin = free_port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:{data}\nadmin_listen: 127.0.0.1:{admin}\n\
             store:\n  kind: redis\n  redis: {{ url: \"redis://127.0.0.1:{dead}\", startup_timeout: 10m }}\n\
             upstreams: {{ up: {{ targets: [{}] }} }}\n\
             routes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n\
             \x20     - {{ name: l, by: ip, algorithm: gcra, rate: 5/1m }}\n",
            up.url()
        ),
    )
    .unwrap();
    let log = dir.path().join("log");
    /// Killed when the test ends, whichever way.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Child(
        std::process::Command::new(sluice_bin())
            .arg("run")
            .arg("-c")
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // The admin listener opens first, while the store is awaited.
    assert!(
        eventually(Duration::from_secs(10), || async {
            TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
        .await,
        "{}",
        read_log()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.0.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "still waiting for the store after SIGTERM\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = read_log();
    assert!(status.success(), "exit status {status}: {log}");
    assert!(!log.contains("sluice serving"), "{log}");
    assert!(TcpStream::connect(("127.0.0.1", data)).is_err());
}

/// Out of descriptors for a moment, a file event cannot read the config: that is neither a
/// bad edit nor a change, and the next event finds the config unchanged (SPEC §6: an
/// unchanged file is not a reload).
#[tokio::test]
async fn a_config_unreadable_for_a_moment_is_not_a_reload() {
    let up = Upstream::start();
    let s = Sluice::start_under(&plain(&up, "5s"), &["prlimit", "--nofile=64:64", "--"]);
    let c = client();
    let reloads =
        |m: &str, result: &str| metric(m, "sluice_config_reloads_total", &[("result", result)]);
    let before = s.metrics(&c).await;
    // Every descriptor the process may open, taken by connections it accepted.
    let mut hogs = Vec::new();
    for _ in 0..80 {
        match TcpStream::connect(s.addr) {
            Ok(st) => hogs.push(st),
            Err(_) => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let unrelated = s.config_path.with_file_name("unrelated.txt");
    std::fs::write(&unrelated, "x").unwrap();
    s.wait_log(&["cannot read the config now"]);
    drop(hogs);
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&unrelated, "y").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = s.metrics(&c).await;
    for result in ["error", "success"] {
        assert_eq!(
            reloads(&after, result),
            reloads(&before, result),
            "{result}\n{}",
            s.log()
        );
    }
}
