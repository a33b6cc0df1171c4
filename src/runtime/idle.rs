//! An HTTP/2 connection with nothing to do is closed after `client_header_timeout`.
//!
//! hyper's HTTP/1 server closes a keep-alive connection that sends no next request within
//! its header timeout; its HTTP/2 server has no such timer, so a client that sent the preface
//! and then nothing (or only pings) held its connection, and a worker's file descriptors,
//! forever. nginx closes such a connection after `keepalive_timeout`. Here a connection is
//! idle while no request of it is being handled and no answer body of it is still streaming
//! (an event stream may send nothing for minutes and is not idle); once idle for the timeout,
//! its socket reads as closed, and hyper ends the connection.
//!
//! An answer whose client gave no room for its next frame for `send_timeout` (an HTTP/2 client
//! that sends no `WINDOW_UPDATE` for it, which never fills the socket `stall` watches) is
//! given up alone, as nginx resets that stream alone: its upstream body is dropped (which
//! releases the upstream connection) and it stops counting as busy; hyper resets the stream
//! with an error if the client ever makes room. The connection's other streams go on.
//!
//! And it reads as closed at once when the client has cancelled most of its requests within
//! [`PREMATURE`] of their start, before or during their answers ([`CANCELS_MIN`]): HTTP/2's
//! "rapid reset" (CVE-2023-44487) in its slower form. h2 refuses streams reset before they are taken up; one reset a moment later has
//! already become an upstream request, which the reset turns into a broken upstream
//! connection, so a client repeating it makes the gateway open upstream connections as fast
//! as it can send frames. Envoy closes such a connection on its "premature resets", nginx
//! bounds the requests of one connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::server::Timeouts;
use crate::pipeline::body::{Body, BoxError};

/// What a connection is busy with: requests being handled, plus answer bodies streaming.
pub(super) struct Activity {
    open: AtomicUsize,
    /// When `open` last fell to 0 (or the connection began).
    since: Mutex<Instant>,
    /// Answers that yielded a frame and have not been asked for the next (waiting for the
    /// client to make room), with since when.
    stalls: Mutex<Vec<Stall>>,
    /// Requests begun, and those the client cancelled within [`PREMATURE`] of their start.
    begun: AtomicUsize,
    cancelled: AtomicUsize,
    /// Cancelling most of its requests: the connection is to close now.
    abusive: AtomicBool,
    /// The connection's reader, woken when `open` falls to 0, an answer starts waiting, or
    /// the client turns out abusive, so that it arms its timer.
    reader: AtomicWaker,
    peer: SocketAddr,
}

/// How many requests a connection may cancel prematurely, at least, before it is closed for
/// cancelling more than half of those it began (Envoy closes on the same share of its
/// "premature resets").
const CANCELS_MIN: usize = 100;

/// A request cancelled younger than this is a premature cancel (Envoy's minimum stream
/// lifetime): a client giving up on a slow answer, or a long poll, is not counted.
const PREMATURE: Duration = Duration::from_secs(1);

impl Activity {
    pub(super) fn new(peer: SocketAddr) -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
            stalls: Mutex::new(Vec::new()),
            begun: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            abusive: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            peer,
        })
    }

    /// One request begins; it ends when the guard is dropped (with the answer's body, see
    /// [`track`], or with the request's future if it never answered).
    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.begun.fetch_add(1, Ordering::Relaxed);
        Busy {
            activity: self.clone(),
            answered: false,
            begun: Instant::now(),
        }
    }

    /// A request begun at `begun` dropped before its answer ended: if it was premature,
    /// count it, and past [`CANCELS_MIN`] with more than half of the connection's requests
    /// cancelled, close the connection.
    fn cancelled(&self, begun: Instant) {
        if begun.elapsed() >= PREMATURE {
            return;
        }
        let cancelled = self.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        let begun = self.begun.load(Ordering::Relaxed);
        if cancelled >= CANCELS_MIN
            && cancelled * 2 > begun
            && !self.abusive.swap(true, Ordering::AcqRel)
        {
            tracing::warn!(peer = %self.peer, cancelled, begun, "HTTP/2 client cancelled most of its requests before their answers; connection closed");
            self.reader.wake();
        }
    }

    /// When something is due: the connection idle past the header timeout, or its oldest
    /// stalled answer past the send timeout. `None` while busy and moving.
    fn deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) == 0 {
            return Some(*self.since.lock() + timeouts.header);
        }
        let oldest = self.stalls.lock().iter().map(|s| s.since).min()?;
        Some(oldest + timeouts.send)
    }

    /// Give up the answers stalled for `send` or longer at `now`: their upstream bodies and
    /// busy marks are dropped. How many.
    fn give_up(&self, now: Instant, send: Duration) -> usize {
        let gone: Vec<Stall> = {
            let mut stalls = self.stalls.lock();
            let (gone, kept) = std::mem::take(&mut *stalls)
                .into_iter()
                .partition(|s| s.since + send <= now);
            *stalls = kept;
            gone
        };
        for s in &gone {
            s.answer.lock().take();
        }
        gone.len()
    }
}

/// An answer waiting for its client to make room.
struct Stall {
    since: Instant,
    answer: Arc<Mutex<Option<Live>>>,
}

/// Holds its connection busy until dropped; dropped unanswered, the request was cancelled.
pub(super) struct Busy {
    activity: Arc<Activity>,
    answered: bool,
    begun: Instant,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.activity;
        if !self.answered && !std::thread::panicking() {
            a.cancelled(self.begun);
        }
        if a.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *a.since.lock() = Instant::now();
            a.reader.wake();
        }
    }
}

/// The answer, whose body holds the connection busy until it has been sent (or dropped).
pub(super) fn track(res: Response<Body>, mut busy: Busy) -> Response<Body> {
    busy.answered = true;
    let activity = busy.activity.clone();
    res.map(|body| {
        Tracked {
            answer: Arc::new(Mutex::new(Some(Live { body, busy }))),
            activity,
            stalled: false,
            ended: false,
        }
        .boxed()
    })
}

/// An answer still streaming: its body, and the mark that keeps its connection busy.
struct Live {
    body: Body,
    busy: Busy,
}

struct Tracked {
    /// `None` once given up for a stall.
    answer: Arc<Mutex<Option<Live>>>,
    activity: Arc<Activity>,
    /// In the connection's stalls (found by `answer`): a frame went out and the next was not
    /// asked.
    stalled: bool,
    /// It gave its last frame (or an error): dropped before that, the client cancelled it.
    ended: bool,
}

impl Tracked {
    fn unstall(&mut self) {
        if std::mem::take(&mut self.stalled) {
            let mine = &self.answer;
            self.activity
                .stalls
                .lock()
                .retain(|s| !Arc::ptr_eq(&s.answer, mine));
        }
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        this.unstall();
        let mut answer = this.answer.lock();
        let Some(live) = answer.as_mut() else {
            return Poll::Ready(Some(Err("the client made no room for send_timeout".into())));
        };
        let polled = Pin::new(&mut live.body).poll_frame(cx);
        this.ended = match &polled {
            Poll::Ready(Some(Ok(_))) => live.body.is_end_stream(),
            Poll::Ready(_) => true,
            Poll::Pending => false,
        };
        if matches!(polled, Poll::Ready(Some(Ok(_)))) && !this.ended {
            drop(answer);
            let first = {
                let mut stalls = this.activity.stalls.lock();
                stalls.push(Stall {
                    since: Instant::now(),
                    answer: this.answer.clone(),
                });
                stalls.len() == 1
            };
            this.stalled = true;
            // Only a first stall moves the reader's deadline (a later one is younger).
            if first {
                this.activity.reader.wake();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.answer
            .lock()
            .as_ref()
            .is_some_and(|l| l.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.answer
            .lock()
            .as_ref()
            .map_or_else(SizeHint::default, |l| l.body.size_hint())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.unstall();
        // Reset mid-answer (not given up for a stall): a cancel as much as one before the head.
        if !self.ended && !std::thread::panicking() {
            if let Some(live) = self.answer.lock().as_ref() {
                if !live.body.is_end_stream() {
                    self.activity.cancelled(live.busy.begun);
                }
            }
        }
    }
}

/// A socket that reads as closed once its connection has been idle for the header timeout,
/// or stalled for the send timeout.
pub(super) struct IdleIo<IO> {
    inner: IO,
    activity: Arc<Activity>,
    timeouts: Timeouts,
    timer: Pin<Box<Sleep>>,
}

impl<IO> IdleIo<IO> {
    pub(super) fn new(inner: IO, activity: Arc<Activity>, timeouts: Timeouts) -> IdleIo<IO> {
        let timer = Box::pin(tokio::time::sleep(timeouts.header));
        IdleIo {
            inner,
            activity,
            timeouts,
            timer,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.activity.abusive.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_ready() {
            return read;
        }
        this.activity.reader.register(cx.waker());
        // Turned abusive meanwhile (its wake may have come before this registration).
        if this.activity.abusive.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let Some(deadline) = this.activity.deadline(this.timeouts) else {
            return Poll::Pending;
        };
        if this.timer.deadline() != deadline {
            this.timer.as_mut().reset(deadline);
        }
        ready!(this.timer.as_mut().poll(cx));
        if this.activity.open.load(Ordering::Acquire) == 0 {
            // Idle: read as closed (nothing was read into `buf`).
            return Poll::Ready(Ok(()));
        }
        // Stalled answers: give them up, and look again (the next deadline, or idle now).
        let gone = this.activity.give_up(Instant::now(), this.timeouts.send);
        tracing::debug!(peer = %this.activity.peer, answers = gone, "answers whose client made no room for send_timeout given up");
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

crate::net::writes_through!(IdleIo);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const TIMEOUT: Duration = Duration::from_millis(100);
    const PEER: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);
    /// The header (idle) timeout, and a send timeout twice as long.
    const TIMEOUTS: Timeouts = Timeouts {
        header: TIMEOUT,
        send: Duration::from_millis(200),
    };

    #[tokio::test]
    async fn an_idle_connection_reads_as_closed_after_the_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(server, Activity::new(PEER), TIMEOUTS);
        let started = Instant::now();
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(started.elapsed() >= TIMEOUT);
    }

    /// Busy for 400 ms: not closed meanwhile, whatever the timeout; closed once it has been
    /// idle for the timeout after that.
    #[tokio::test]
    async fn a_busy_connection_is_not_idle_and_its_timeout_starts_when_it_is_done() {
        let (_client, server) = tokio::io::duplex(64);
        let a = Activity::new(PEER);
        let mut io = IdleIo::new(server, a.clone(), TIMEOUTS);
        let busy = a.begin();
        let started = Instant::now();
        let done = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            drop(busy);
        });
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(started.elapsed() >= Duration::from_millis(400) + TIMEOUT);
        done.await.unwrap();
    }

    #[tokio::test]
    async fn bytes_that_arrive_are_read() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(
            server,
            Activity::new(PEER),
            Timeouts {
                header: Duration::from_secs(60),
                send: Duration::from_secs(60),
            },
        );
        tokio::io::AsyncWriteExt::write_all(&mut client, b"ping")
            .await
            .unwrap();
        let mut buf = [0; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 4);
        assert_eq!(&buf[..4], b"ping");
    }

    /// An answer with a frame out and the next never asked for (an HTTP/2 client that opens
    /// no window for it) is given up alone once it waited for the send timeout: its upstream
    /// body is dropped and it fails if asked again; the connection stays open (then idle).
    /// While it is asked for its frames, however slowly the client makes room, it goes on.
    #[tokio::test]
    async fn an_answer_the_client_gives_no_room_is_given_up_after_the_send_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        let a = Activity::new(PEER);
        let mut io = IdleIo::new(server, a.clone(), TIMEOUTS);
        // The upstream body: dropped, it drops `upstream`.
        let (upstream, released) = tokio::sync::oneshot::channel::<()>();
        let chunks = futures_util::stream::iter((0..1000).map(move |_| {
            let _held = &upstream;
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"x")))
        }));
        let body: Body = http_body_util::StreamBody::new(chunks).boxed();
        let mut answer = track(Response::new(body), a.begin()).into_body();
        let reader = tokio::spawn(async move {
            let mut buf = [0; 8];
            let n = io.read(&mut buf).await.unwrap();
            (n, Instant::now())
        });
        // Asked for a frame every 50 ms for 400 ms (twice the send timeout): it goes on.
        let mut last = Instant::now();
        for _ in 0..8 {
            last = Instant::now();
            answer.frame().await.unwrap().unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Not asked again: given up no sooner than one send timeout after its last frame.
        let _ = released.await;
        let given_up = Instant::now();
        assert!(given_up >= last + TIMEOUTS.send, "{:?}", given_up - last);
        assert!(
            !reader.is_finished(),
            "the connection was closed with the answer"
        );
        assert!(
            answer.frame().await.unwrap().is_err(),
            "asked again, it fails"
        );
        // The connection itself stays until it has been idle for the header timeout.
        drop(answer);
        let (n, _) = reader.await.unwrap();
        assert_eq!(n, 0);
    }

    /// A client that cancels most of its requests before their answers (HTTP/2's rapid
    /// reset, slowed down) has its connection read as closed at once; one that cancels some
    /// does not.
    #[tokio::test]
    async fn a_connection_that_cancels_most_of_its_requests_is_closed() {
        let (_client, server) = tokio::io::duplex(64);
        let a = Activity::new(PEER);
        let mut io = IdleIo::new(
            server,
            a.clone(),
            Timeouts {
                header: Duration::from_secs(60),
                send: Duration::from_secs(60),
            },
        );
        let answered = |n| {
            for _ in 0..n {
                let busy = a.begin();
                drop(track(Response::new(crate::pipeline::body::empty()), busy));
            }
        };
        // Cancels within the limit: many, but not most, or not yet enough.
        answered(CANCELS_MIN);
        for _ in 0..CANCELS_MIN - 1 {
            drop(a.begin());
        }
        let _open = a.begin();
        let mut buf = [0; 8];
        let read = tokio::time::timeout(Duration::from_millis(200), io.read(&mut buf)).await;
        assert!(read.is_err(), "closed too soon: {read:?}");
        // 102 of 203 cancelled: past the minimum, and more than half (101 of 202 was not).
        for _ in 0..3 {
            drop(a.begin());
        }
        let read = tokio::time::timeout(Duration::from_secs(5), io.read(&mut buf)).await;
        assert_eq!(read.expect("closed").unwrap(), 0);
    }

    /// Answers reset mid-body within [`PREMATURE`] count as cancels too; requests cancelled
    /// older than that (a client giving up on a slow answer) do not.
    #[tokio::test(start_paused = true)]
    async fn only_premature_cancels_count_and_mid_answer_ones_do() {
        let a = Activity::new(PEER);
        let mid_answer = || {
            let frames = futures_util::stream::iter(
                (0..2).map(|_| Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"x")))),
            );
            let body: Body = http_body_util::StreamBody::new(frames).boxed();
            track(Response::new(body), a.begin()).into_body()
        };
        let old: Vec<Busy> = (0..3 * CANCELS_MIN).map(|_| a.begin()).collect();
        tokio::time::advance(PREMATURE).await;
        drop(old);
        assert!(
            !a.abusive.load(Ordering::Acquire),
            "cancels a second old count"
        );
        // One more than the old ones: more than half of all begun.
        for _ in 0..=3 * CANCELS_MIN {
            let mut answer = mid_answer();
            answer.frame().await.unwrap().unwrap();
            drop(answer);
        }
        assert!(
            a.abusive.load(Ordering::Acquire),
            "answers reset mid-body count"
        );
    }
}
