//! Which worker the current thread is. Each worker is a thread with a single-threaded runtime
//! of its own (`runtime::app`); what a request needs across its awaits (idle upstream
//! connections, the Redis store's connections and batch queue) is kept per worker, so a
//! request, its upstream I/O and its store calls all run on one thread and never wake another.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Mark this thread as worker `index`. Called once by each worker thread before it serves;
/// every other thread (the first worker, admin, reload, tests) is worker 0.
pub fn set(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The worker this thread serves.
pub fn index() -> usize {
    WORKER.with(|w| w.get())
}

/// How operators see worker `index`: counted from 1, in logs, thread names, `/readyz` and the
/// `worker` label of `sluice_connections_open`.
pub fn number(index: usize) -> usize {
    index + 1
}
