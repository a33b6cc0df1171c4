//! Circuit breaker in front of a remote store: after a run of failures it answers
//! "breaker open" at once instead of making every request wait out the store timeout, and lets
//! one probe through every [`PROBE_EVERY`] so limiting resumes soon after the store is back.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::StoreError;

/// Consecutive failures (timeouts, connection errors) that open the breaker.
pub const TRIP_AFTER: u32 = 5;
/// While open, one call is let through this often (the spec asks for at least once a second;
/// this leaves room for the reconnect inside the 2 s recovery budget).
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

pub struct Breaker {
    failures: AtomicU32,
    /// 0 when closed; otherwise ms since `epoch` (+1) from which the next probe may pass.
    open_until_ms: AtomicU64,
    epoch: Instant,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Breaker {
    fn now_ms(&self) -> u64 {
        // +1 keeps 0 free to mean "closed".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// May this call go to the store? `Err(BreakerOpen)` means fail fast.
    pub fn admit(&self) -> Result<(), StoreError> {
        let until = self.open_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return Ok(());
        }
        let now = self.now_ms();
        let next = now + PROBE_EVERY.as_millis() as u64;
        // Exactly one caller wins each probe slot; the others keep failing fast.
        if now >= until
            && self
                .open_until_ms
                .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return Ok(());
        }
        Err(StoreError::BreakerOpen)
    }

    /// Record the outcome of a call that was admitted. Script errors mean the store answered,
    /// so they count as success here (the policy still applies to that request).
    pub fn record(&self, result: &Result<(), StoreError>) {
        match result {
            Err(StoreError::BreakerOpen) => {}
            Ok(()) | Err(StoreError::Script(_)) => {
                self.failures.store(0, Ordering::Release);
                if self.open_until_ms.swap(0, Ordering::AcqRel) != 0 {
                    tracing::info!("store answers again: circuit breaker closed");
                }
            }
            Err(e) => {
                let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= TRIP_AFTER {
                    let next = self.now_ms() + PROBE_EVERY.as_millis() as u64;
                    if self
                        .open_until_ms
                        .compare_exchange(0, next, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        tracing::warn!(error = %e, failures = n, "store keeps failing: circuit breaker open, probing every {PROBE_EVERY:?}");
                    }
                }
            }
        }
    }

    pub fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(b: &Breaker) {
        b.record(&Err(StoreError::Timeout));
    }

    #[test]
    fn opens_after_a_run_of_failures_and_lets_one_probe_through() {
        let b = Breaker::default();
        for _ in 0..TRIP_AFTER - 1 {
            assert!(b.admit().is_ok());
            fail(&b);
        }
        assert!(!b.is_open());
        fail(&b);
        assert!(b.is_open());
        assert_eq!(b.admit(), Err(StoreError::BreakerOpen));
        std::thread::sleep(PROBE_EVERY + Duration::from_millis(20));
        assert!(b.admit().is_ok(), "one probe passes");
        assert_eq!(b.admit(), Err(StoreError::BreakerOpen), "only one");
        b.record(&Ok(()));
        assert!(!b.is_open());
        assert!(b.admit().is_ok());
    }

    #[test]
    fn script_errors_and_successes_reset_the_run() {
        let b = Breaker::default();
        for _ in 0..TRIP_AFTER - 1 {
            fail(&b);
        }
        b.record(&Err(StoreError::Script("WRONGTYPE".into())));
        for _ in 0..TRIP_AFTER - 1 {
            fail(&b);
        }
        assert!(!b.is_open());
        b.record(&Err(StoreError::Connection("refused".into())));
        assert!(b.is_open());
    }
}
