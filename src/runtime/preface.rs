//! A connection's first bytes, read before hyper-util's version detection gets the socket.
//!
//! That detection reads until the bytes tell HTTP/1 from the HTTP/2 preface, with no deadline
//! of its own, and hyper's `header_read_timeout` only starts once HTTP/1 is chosen: a client
//! that connected and sent nothing, or a byte of the preface, held its connection forever.
//! The same read, done here within `client_header_timeout` of the connection's start (as
//! nginx's `client_header_timeout` runs from accept), closes such a connection; what was read
//! is handed on in front of the socket ([`Rewind`]), so hyper's own detection reads it again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Read until the bytes so far either differ from the HTTP/2 preface (HTTP/1) or hold all of
/// it, or the client closed. `Err(TimedOut)` when that took longer than `limit`.
pub(super) async fn read<IO: AsyncRead + Unpin>(
    io: &mut IO,
    limit: Duration,
) -> io::Result<Vec<u8>> {
    let mut seen = Vec::with_capacity(PREFACE.len());
    let read = async {
        loop {
            let want = PREFACE.len() - seen.len();
            if (&mut *io).take(want as u64).read_buf(&mut seen).await? == 0 {
                return Ok(());
            }
            if seen.len() == PREFACE.len() || !PREFACE.starts_with(&seen) {
                return Ok(());
            }
        }
    };
    match tokio::time::timeout(limit, read).await {
        Ok(r) => r.map(|()| seen),
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// `inner`, with `seen` read first.
pub(super) struct Rewind<IO> {
    seen: Vec<u8>,
    at: usize,
    inner: IO,
}

impl<IO> Rewind<IO> {
    pub(super) fn new(seen: Vec<u8>, inner: IO) -> Rewind<IO> {
        Rewind { seen, at: 0, inner }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.seen.len() {
            let n = buf.remaining().min(this.seen.len() - this.at);
            buf.put_slice(&this.seen[this.at..this.at + n]);
            this.at += n;
            if this.at == this.seen.len() {
                this.seen = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

crate::net::writes_through!(Rewind);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// What `read` took for a client that sent `sent` and then stayed silent.
    async fn seen_after(sent: &[u8]) -> io::Result<Vec<u8>> {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(sent).await.unwrap();
        let seen = read(&mut server, Duration::from_millis(200)).await;
        drop(client);
        seen
    }

    #[tokio::test]
    async fn http_1_is_told_at_its_first_byte() {
        assert_eq!(
            seen_after(b"GET / HTTP/1.1\r\n").await.unwrap(),
            b"GET / HTTP/1.1\r\n"
        );
        assert_eq!(seen_after(b"G").await.unwrap(), b"G");
        // Sharing the preface's first byte, then diverging.
        assert_eq!(seen_after(b"POST /").await.unwrap(), b"POST /");
    }

    #[tokio::test]
    async fn the_http_2_preface_is_read_whole_and_no_further() {
        let mut sent = PREFACE.to_vec();
        sent.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert_eq!(seen_after(&sent).await.unwrap(), PREFACE);
    }

    #[tokio::test]
    async fn silence_or_a_partial_preface_times_out() {
        for sent in [&b""[..], b"P", b"PRI * HTTP/2.0\r\n", &PREFACE[..23]] {
            let e = seen_after(sent).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{sent:?}");
        }
    }

    #[tokio::test]
    async fn a_closed_connection_ends_the_read() {
        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        assert_eq!(
            read(&mut server, Duration::from_secs(5)).await.unwrap(),
            b""
        );
    }

    #[tokio::test]
    async fn rewind_reads_what_was_seen_then_the_rest() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"lo world").await.unwrap();
        drop(client);
        let mut r = Rewind::new(b"hel".to_vec(), server);
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"hello world");
    }
}
