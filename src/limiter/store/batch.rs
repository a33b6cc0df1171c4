//! Many requests' decisions in one script call (the Redis store's lever against Redis's
//! per-call cost): while a call is in flight, the requests that arrive queue; the next call
//! carries all of them, and the script decides them one after another in arrival order, each
//! atomic and all-or-nothing on its own. No timer: at low load a request goes alone, at once.
//!
//! At most `senders` calls are in flight (one per pooled connection). A sender is a task that
//! takes everything queued, makes one call, answers each request, and goes on until the queue
//! is empty. A request that stopped waiting (its timeout passed, its client left) is skipped
//! when the next call is made up, so a decision is never sent for a request that was already
//! answered by the store-error policy.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{LimitCall, StoreError};
use crate::limiter::algo::Decision;

/// The most requests one call carries.
pub const MAX_BATCH: usize = 64;

/// One request waiting for its decisions.
pub struct Job {
    pub calls: Vec<LimitCall>,
    /// The call id (its nonce names the request's concurrency leases).
    pub id: u64,
    /// Its keys' slot on Redis Cluster (0 elsewhere): a batch goes to the node serving it.
    pub slot: u16,
    pub answer: oneshot::Sender<Result<Vec<Decision>, StoreError>>,
}

pub struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    senders: AtomicUsize,
    max_senders: usize,
}

impl Queue {
    pub fn new(max_senders: usize) -> Queue {
        Queue {
            jobs: Mutex::new(VecDeque::new()),
            senders: AtomicUsize::new(0),
            max_senders: max_senders.max(1),
        }
    }

    /// Queue `job`; `true` when the caller must start a sender (fewer than the maximum run).
    pub fn push(&self, job: Job) -> bool {
        self.jobs.lock().push_back(job);
        self.acquire()
    }

    /// Up to [`MAX_BATCH`] queued requests still waiting, in arrival order.
    pub fn take(&self) -> Vec<Job> {
        let mut jobs = self.jobs.lock();
        let mut out = Vec::with_capacity(jobs.len().min(MAX_BATCH));
        while out.len() < MAX_BATCH {
            match jobs.pop_front() {
                Some(j) if j.answer.is_closed() => continue,
                Some(j) => out.push(j),
                None => break,
            }
        }
        out
    }

    /// A sender found the queue empty: it stops, unless a request arrived meanwhile and no
    /// other sender is free to take it (then it goes on: `true`).
    pub fn finish(&self) -> bool {
        self.senders.fetch_sub(1, Ordering::AcqRel);
        !self.jobs.lock().is_empty() && self.acquire()
    }

    fn acquire(&self) -> bool {
        self.senders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_senders).then_some(n + 1)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> (Job, oneshot::Receiver<Result<Vec<Decision>, StoreError>>) {
        let (answer, rx) = oneshot::channel();
        let job = Job {
            calls: Vec::new(),
            id: 0,
            slot: 0,
            answer,
        };
        (job, rx)
    }

    #[test]
    fn senders_are_bounded_and_the_last_one_out_checks_the_queue() {
        let q = Queue::new(2);
        let (a, _ra) = job();
        let (b, _rb) = job();
        let (c, _rc) = job();
        assert!(q.push(a), "first request starts a sender");
        assert!(q.push(b), "second sender");
        assert!(!q.push(c), "no third");
        assert_eq!(q.take().len(), 3);
        assert!(!q.finish(), "queue empty: the sender stops");
        let (d, _rd) = job();
        // One sender still runs (2 − 1): a new request may start another.
        assert!(q.push(d));
        // Both senders find the queue empty and stop; then a request starts one again.
        assert_eq!(q.take().len(), 1);
        assert!(!q.finish());
        assert!(!q.finish());
        let (e, _re) = job();
        assert!(q.push(e));
    }

    #[test]
    fn a_request_that_stopped_waiting_is_never_sent() {
        let q = Queue::new(1);
        let (a, ra) = job();
        let (b, _rb) = job();
        q.push(a);
        q.push(b);
        drop(ra);
        assert_eq!(q.take().len(), 1);
    }

    #[test]
    fn a_call_carries_at_most_max_batch() {
        let q = Queue::new(1);
        let rxs: Vec<_> = (0..MAX_BATCH + 5)
            .map(|_| {
                let (j, rx) = job();
                q.push(j);
                rx
            })
            .collect();
        assert_eq!(q.take().len(), MAX_BATCH);
        assert_eq!(q.take().len(), 5);
        drop(rxs);
    }
}
