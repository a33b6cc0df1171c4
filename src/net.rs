//! Socket I/O shared by the listener and the upstream pool.
//!
//! [`Gather`] turns a small vectored write into one `send(2)`. hyper hands a message's head
//! and body to `writev(2)`, which on Linux takes a detour through the VFS layer
//! (`do_writev`, `import_iovec`, `rw_verify_area`, `fdget_pos`) before it reaches the socket;
//! `send(2)`, which std's `TcpStream::write` uses, goes to the socket directly. A profile of
//! the embedded 429 path put the detour at about 0.5 µs of kernel time per answer (HAProxy
//! answers with `send` and does not pay it); copying a few hundred bytes costs far less.
//! hyper's own `writev(false)` flattening was measured too and lost: it copies every body
//! chunk, whatever its size, into its head buffer.
//!
//! Every client and upstream TCP socket is wrapped, under TLS too (the records rustls writes
//! then leave in one `send`). Never above TLS: rustls already makes one record of a head and
//! body written together.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Vectored writes of up to this many bytes are copied together and sent as one; a larger
/// one stays vectored, where the copy would cost about as much as the detour it saves.
pub const GATHER_MAX: usize = 4 * 1024;

thread_local! {
    /// One scratch buffer per thread, not per connection: a write gathers into it, sends and
    /// leaves it empty, so an idle connection holds no memory for it.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(GATHER_MAX));
}

/// A socket whose small vectored writes are sent as one plain write. Reads, flushes and
/// shutdowns go straight through.
#[derive(Debug)]
pub struct Gather<T>(pub T);

impl<T: AsyncRead + Unpin> AsyncRead for Gather<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gather<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    /// One non-empty buffer is written as it is; several, up to [`GATHER_MAX`] bytes in all,
    /// are copied into the thread's scratch buffer and written at once. Either way the count
    /// returned is of bytes from the start of `bufs`, as `writev` would report it.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let inner = Pin::new(&mut self.get_mut().0);
        let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
        let Some(first) = nonempty.next() else {
            return inner.poll_write(cx, &[]);
        };
        if nonempty.next().is_none() {
            return inner.poll_write(cx, first);
        }
        if bufs.iter().map(|b| b.len()).sum::<usize>() > GATHER_MAX {
            return inner.poll_write_vectored(cx, bufs);
        }
        SCRATCH.with(|cell| {
            // Busy only if a gathered write reached another `Gather` below it through a layer
            // that turns one write into several (TLS): that one stays vectored.
            let Ok(mut scratch) = cell.try_borrow_mut() else {
                return inner.poll_write_vectored(cx, bufs);
            };
            scratch.clear();
            for b in bufs {
                scratch.extend_from_slice(b);
            }
            let sent = inner.poll_write(cx, &scratch);
            scratch.clear();
            sent
        })
    }

    fn is_write_vectored(&self) -> bool {
        // hyper then queues head and body instead of flattening them itself.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// `AsyncWrite` for a wrapper that only changes how its socket reads (`runtime::preface`'s
/// `Rewind`, `runtime::idle`'s `IdleIo`): every write goes straight to its `inner` field.
macro_rules! writes_through {
    ($wrapper:ident) => {
        impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<IO> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use writes_through;

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that records each call and accepts at most `take` bytes per call.
    #[derive(Default)]
    struct Recorder {
        take: usize,
        plain: Vec<Vec<u8>>,
        vectored: Vec<Vec<Vec<u8>>>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.take);
            self.get_mut().plain.push(buf.to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let n = bufs.iter().map(|b| b.len()).sum::<usize>().min(self.take);
            self.get_mut()
                .vectored
                .push(bufs.iter().map(|b| b.to_vec()).collect());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write(g: &mut Gather<Recorder>, parts: &[&[u8]]) -> usize {
        let bufs: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(g).poll_write_vectored(&mut cx, &bufs) {
            Poll::Ready(Ok(n)) => n,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn gather(take: usize) -> Gather<Recorder> {
        Gather(Recorder {
            take,
            ..Recorder::default()
        })
    }

    #[test]
    fn head_and_body_go_out_as_one_plain_write() {
        let mut g = gather(usize::MAX);
        assert_eq!(write(&mut g, &[b"HTTP/1.1 429 \r\n\r\n", b"", b"{}"]), 19);
        assert_eq!(g.0.plain, vec![b"HTTP/1.1 429 \r\n\r\n{}".to_vec()]);
        assert!(g.0.vectored.is_empty());
    }

    #[test]
    fn one_buffer_among_empty_ones_is_written_as_it_is() {
        let mut g = gather(usize::MAX);
        assert_eq!(write(&mut g, &[b"", b"GET / HTTP/1.1\r\n\r\n", b""]), 18);
        assert_eq!(g.0.plain, vec![b"GET / HTTP/1.1\r\n\r\n".to_vec()]);
        assert_eq!(write(&mut g, &[b"", b""]), 0);
        assert!(g.0.vectored.is_empty());
    }

    #[test]
    fn a_write_past_the_gather_limit_stays_vectored() {
        let mut g = gather(usize::MAX);
        let body = vec![b'x'; GATHER_MAX];
        assert_eq!(write(&mut g, &[b"head", &body]), GATHER_MAX + 4);
        assert!(g.0.plain.is_empty());
        assert_eq!(g.0.vectored, vec![vec![b"head".to_vec(), body]]);
        // Exactly at the limit it is still gathered.
        let mut g = gather(usize::MAX);
        assert_eq!(
            write(&mut g, &[b"head", &vec![b'y'; GATHER_MAX - 4]]),
            GATHER_MAX
        );
        assert_eq!(g.0.plain.len(), 1);
    }

    /// A layer that writes each buffer it is given as two halves, vectored (as TLS turns one
    /// write into records).
    struct Splitter<T>(T);

    impl<T: AsyncWrite + Unpin> AsyncWrite for Splitter<T> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let (a, b) = buf.split_at(buf.len() / 2);
            Pin::new(&mut self.get_mut().0)
                .poll_write_vectored(cx, &[IoSlice::new(a), IoSlice::new(b)])
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
        }
    }

    /// A gathered write that reaches another `Gather` (through a layer like TLS) finds the
    /// thread's scratch buffer in use: the inner write stays vectored instead of panicking.
    #[test]
    fn a_gather_below_a_gather_writes_vectored() {
        let mut g = Gather(Splitter(gather(usize::MAX)));
        let bufs = [IoSlice::new(b"head:"), IoSlice::new(b"body")];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let n = Pin::new(&mut g).poll_write_vectored(&mut cx, &bufs);
        assert!(matches!(n, Poll::Ready(Ok(9))), "{n:?}");
        let rec = &g.0 .0 .0;
        assert!(rec.plain.is_empty());
        assert_eq!(
            rec.vectored,
            vec![vec![b"head".to_vec(), b":body".to_vec()]]
        );
    }

    /// A short write reports the bytes taken from the start of all the buffers, so the caller
    /// resumes at the right place, across the boundary between head and body.
    #[test]
    fn a_short_write_counts_from_the_start_of_the_buffers() {
        let mut g = gather(6);
        assert_eq!(write(&mut g, &[b"head:", b"body"]), 6);
        assert_eq!(write(&mut g, &[b"ody"]), 3);
        let sent: Vec<u8> =
            g.0.plain
                .iter()
                .zip([6, 3])
                .flat_map(|(w, n)| w[..n].to_vec())
                .collect();
        assert_eq!(sent, b"head:body");
    }
}
