//! Logs on stderr via tracing-subscriber, written without ever blocking a request.
//!
//! A log line is appended to an in-memory buffer under a lock held only for the copy; a
//! background thread takes the whole buffer every 100 ms (or as soon as it passes 64 KiB) and
//! writes it to stderr with the lock released. A request never pays a `write(2)`, and a stalled
//! reader of stderr (a full pipe, a paused log shipper) cannot stall the data plane: past
//! [`MAX_PENDING`] bytes waiting, lines are dropped and counted, and the count is written once
//! the sink drains. At worst the last 100 ms of lines are lost on SIGKILL.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Wake the writer early once this much is waiting.
const FLUSH_AT: usize = 64 * 1024;
/// Waiting bytes past which new lines are dropped (the sink is not keeping up).
pub const MAX_PENDING: usize = 8 * 1024 * 1024;

struct Shared {
    pending: Mutex<Vec<u8>>,
    wake: Condvar,
    dropped: AtomicU64,
    /// Serializes writes to stderr (the writer thread and a final [`Buffered::flush`]).
    sink: Mutex<()>,
}

/// The log buffer; cloning shares it.
#[derive(Clone)]
pub struct Buffered(Arc<Shared>);

impl Buffered {
    fn new() -> Buffered {
        Buffered(Arc::new(Shared {
            pending: Mutex::new(Vec::with_capacity(FLUSH_AT)),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            sink: Mutex::new(()),
        }))
    }

    /// Write out everything waiting (at exit; the writer thread does this continuously).
    pub fn flush(&self) {
        let mut out = Vec::new();
        self.write_out(&mut out);
    }

    /// Swap the waiting bytes into `out` (so buffers are reused) and write them, unlocked.
    /// Lines dropped since the last write are told by a log event of their own, formatted
    /// like every other line (a JSON reader would refuse a bare text line), written after
    /// what was waiting.
    fn write_out(&self, out: &mut Vec<u8>) {
        out.clear();
        std::mem::swap(&mut *self.0.pending.lock(), out);
        let dropped = self.0.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            // At error: a filter that keeps only errors must still say that lines were lost.
            tracing::error!(
                dropped,
                "log lines dropped: stderr was not being read fast enough"
            );
            out.append(&mut self.0.pending.lock());
        }
        if out.is_empty() {
            return;
        }
        let _sink = self.0.sink.lock();
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(out);
        let _ = err.flush();
    }

    fn run_writer(self) {
        let mut out = Vec::with_capacity(FLUSH_AT);
        loop {
            {
                let mut pending = self.0.pending.lock();
                if pending.len() < FLUSH_AT {
                    self.0.wake.wait_for(&mut pending, FLUSH_EVERY);
                }
            }
            self.write_out(&mut out);
        }
    }
}

/// One log event's writer: appends to the shared buffer, or discards when it is full.
pub struct Line<'a> {
    buf: Option<MutexGuard<'a, Vec<u8>>>,
    wake: &'a Condvar,
}

impl Write for Line<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(buf) = self.buf.as_mut() {
            buf.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        // Wake the writer only when a line crosses the threshold, not once per line.
        if self.buf.as_ref().is_some_and(|b| b.len() >= FLUSH_AT) {
            self.wake.notify_one();
        }
    }
}

impl<'a> MakeWriter<'a> for Buffered {
    type Writer = Line<'a>;
    fn make_writer(&'a self) -> Line<'a> {
        let guard = self.0.pending.lock();
        let buf = if guard.len() >= MAX_PENDING {
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            Some(guard)
        };
        Line {
            buf,
            wake: &self.0.wake,
        }
    }
}

/// Install the global subscriber: JSON when `json`, human otherwise; level from `RUST_LOG`
/// (default `info`). Returns the buffer so the caller can flush it before exiting.
pub fn init(json: bool, ansi: bool) -> Buffered {
    let buf = Buffered::new();
    let writer = buf.clone();
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || writer.run_writer())
        .expect("spawn log writer");
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(buf.clone())
        .with_ansi(ansi);
    if json {
        b.json().flatten_event(true).init();
    } else {
        b.init();
    }
    buf
}

/// The level filter for `RUST_LOG` (`None` or blank: `info`). Libraries that log what others
/// do at levels an operator reads as the gateway's own are held down unless `RUST_LOG` names
/// them: rustls logs what a client does wrong at WARN (each refused renegotiation is a line,
/// and a client may ask again and again, so a remote client could fill the log), and notify
/// logs at INFO that a watch on a file already swapped away (a Kubernetes `..data` swap)
/// could not be removed.
fn filter(rust_log: Option<&str>) -> EnvFilter {
    const QUIET: [(&str, &str); 2] = [("rustls", "rustls=error"), ("notify", "notify=warn")];
    let given = rust_log.map(str::trim).filter(|s| !s.is_empty());
    let quiet = |spec: &str| {
        QUIET
            .iter()
            .filter(|(name, _)| !spec.contains(name))
            .fold(spec.to_owned(), |s, (_, q)| format!("{s},{q}"))
    };
    EnvFilter::try_new(quiet(given.unwrap_or("info")))
        .unwrap_or_else(|_| EnvFilter::new(quiet("info")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_and_notify_are_held_down_unless_named() {
        let quiet = "rustls=error,notify=warn,info";
        assert_eq!(filter(None).to_string(), quiet);
        assert_eq!(filter(Some(" ")).to_string(), quiet);
        assert_eq!(
            filter(Some("debug,sluice::access=off")).to_string(),
            "sluice::access=off,rustls=error,notify=warn,debug"
        );
        assert_eq!(
            filter(Some("info,rustls=debug")).to_string(),
            "rustls=debug,notify=warn,info"
        );
        assert_eq!(
            filter(Some("info,notify=debug")).to_string(),
            "rustls=error,notify=debug,info"
        );
        // A spec that does not parse is `info`, as before.
        assert_eq!(filter(Some("=[")).to_string(), quiet);
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_growing() {
        let b = Buffered::new();
        let line = vec![b'x'; 1024];
        for _ in 0..(MAX_PENDING / 1024 + 10) {
            let mut w = b.make_writer();
            w.write_all(&line).unwrap();
        }
        assert_eq!(b.0.pending.lock().len(), MAX_PENDING);
        assert_eq!(b.0.dropped.load(Ordering::Relaxed), 10);
    }
}
