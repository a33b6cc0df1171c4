//! Raw HTTP/1.1 over a plain `std::net::TcpStream`: write exact bytes (malformed ones
//! included), read back every response until the server closes the connection or goes
//! quiet, and split what came back into responses.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// An upstream on a free port that reads each request's head and then hands the connection
/// to `answer`, each connection on a thread of its own: for answers no well-behaved server
/// gives (late, stalled, dripping, none at all).
pub fn upstream(answer: impl Fn(&mut TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let (mut head, mut byte) = (Vec::new(), [0; 1]);
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                answer(&mut conn);
            });
        }
    });
    addr
}

/// Open a WebSocket tunnel through the gateway at `addr` (its test upstream's `/ws` echoes):
/// the answer's head and the client's socket (reads time out after 10 s).
pub fn websocket(addr: SocketAddr) -> (String, TcpStream) {
    let mut st = TcpStream::connect(addr).unwrap();
    st.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    st.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
    let (mut head, mut byte) = (Vec::new(), [0u8; 1]);
    while !head.ends_with(b"\r\n\r\n") && st.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    (String::from_utf8_lossy(&head).into_owned(), st)
}

/// One response parsed off the wire.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    /// `(lower-case name, value)` in wire order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not json ({e}): {}", self.text()))
    }
}

/// Everything the server sent back on one connection.
#[derive(Debug)]
pub struct Exchange {
    /// Every byte received.
    pub raw: Vec<u8>,
    /// The complete responses, in order.
    pub responses: Vec<RawResponse>,
    /// The server closed (EOF or reset) before `quiet` passed without data.
    pub closed: bool,
}

impl Exchange {
    pub fn statuses(&self) -> Vec<u16> {
        self.responses.iter().map(|r| r.status).collect()
    }

    /// The received bytes, lossily, for assertion messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// The only response; panics (with what was received) if there is not exactly one.
    pub fn one(&self) -> &RawResponse {
        assert_eq!(
            self.responses.len(),
            1,
            "expected exactly one response, got {:?}:\n{}",
            self.statuses(),
            self.text()
        );
        &self.responses[0]
    }
}

/// Connect, write `bytes`, and read until the server closes or sends nothing for `quiet`.
pub fn exchange(addr: SocketAddr, bytes: &[u8], quiet: Duration) -> Exchange {
    exchange_with(addr, bytes, quiet, false)
}

/// Like [`exchange`], then shut down the write half: the server sees EOF right after
/// `bytes` (a client that stopped mid-message).
pub fn exchange_then_eof(addr: SocketAddr, bytes: &[u8], quiet: Duration) -> Exchange {
    exchange_with(addr, bytes, quiet, true)
}

fn exchange_with(addr: SocketAddr, bytes: &[u8], quiet: Duration, eof: bool) -> Exchange {
    let mut st = TcpStream::connect(addr).expect("connect");
    st.set_nodelay(true).unwrap();
    // The server may answer (and close) before reading everything: a write error then is
    // part of the behaviour under test, not a test failure.
    let _ = st.write_all(bytes);
    if eof {
        let _ = st.shutdown(Shutdown::Write);
    }
    read_all(&mut st, quiet)
}

/// Read from `st` until EOF/reset (`closed: true`) or `quiet` without data.
pub fn read_all(st: &mut TcpStream, quiet: Duration) -> Exchange {
    st.set_read_timeout(Some(quiet)).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let hard_stop = Instant::now() + Duration::from_secs(30);
    let closed = loop {
        if Instant::now() > hard_stop {
            break false;
        }
        match st.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // Reset/aborted: the server closed with unread input in its buffer.
            Err(_) => break true,
        }
    };
    let responses = parse_responses(&raw);
    Exchange {
        raw,
        responses,
        closed,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Split `raw` into complete responses (Content-Length or chunked bodies; a response
/// without either runs to the end). A trailing incomplete response is left out.
pub fn parse_responses(raw: &[u8]) -> Vec<RawResponse> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(end) = find(rest, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let Some(status) = status_line
            .strip_prefix("HTTP/1.")
            .and_then(|s| s.get(2..5))
            .and_then(|s| s.parse().ok())
        else {
            break;
        };
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let after = &rest[end + 4..];
        let (body, used) = if (100..200).contains(&status) || status == 204 || status == 304 {
            (Vec::new(), 0)
        } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            match dechunk(after) {
                Some(x) => x,
                None => break,
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
            if after.len() < n {
                break;
            }
            (after[..n].to_vec(), n)
        } else {
            (after.to_vec(), after.len())
        };
        out.push(RawResponse {
            status,
            headers,
            body,
        });
        rest = &after[used..];
    }
    out
}

/// A chunked body from the start of `b`: `(body, bytes consumed)`, None if incomplete.
fn dechunk(b: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + find(&b[at..], b"\r\n")?;
        let line = std::str::from_utf8(&b[at..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailer section: lines until an empty one.
            loop {
                let e = at + find(&b[at..], b"\r\n")?;
                let empty = e == at;
                at = e + 2;
                if empty {
                    return Some((body, at));
                }
            }
        }
        if b.len() < at + size + 2 {
            return None;
        }
        body.extend_from_slice(&b[at..at + size]);
        at += size + 2;
    }
}
