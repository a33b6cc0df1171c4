//! Logs on stderr via tracing-subscriber, written through a shared buffer that a background
//! thread flushes every 100 ms (and when full, and at exit). A request never pays a
//! `write(2)` for its access-log line, and no thread is woken per line; at worst the last
//! 100 ms of lines are lost if the process is killed with SIGKILL.

use std::io::{BufWriter, Stderr, Write};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The shared buffer; cloning shares it.
#[derive(Clone)]
pub struct Buffered(Arc<Mutex<BufWriter<Stderr>>>);

impl Buffered {
    pub fn flush(&self) {
        let _ = self.0.lock().flush();
    }
}

pub struct Line<'a>(parking_lot::MutexGuard<'a, BufWriter<Stderr>>);

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffered {
    type Writer = Line<'a>;
    fn make_writer(&'a self) -> Line<'a> {
        Line(self.0.lock())
    }
}

/// Install the global subscriber: JSON when `json`, human otherwise; level from `RUST_LOG`
/// (default `info`). Returns the buffer so the caller can flush it before exiting.
pub fn init(json: bool, ansi: bool) -> Buffered {
    let buf = Buffered(Arc::new(Mutex::new(BufWriter::with_capacity(
        64 * 1024,
        std::io::stderr(),
    ))));
    let flusher = buf.clone();
    std::thread::Builder::new()
        .name("log-flush".into())
        .spawn(move || loop {
            std::thread::sleep(FLUSH_EVERY);
            flusher.flush();
        })
        .expect("spawn log flusher");
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
