//! An exact local deny cache in front of a remote store.
//!
//! When the store says a request of cost `c` on key `k` is limited with retry-after `R`, no
//! request of cost `c` on `k` can be admitted before `R` has passed: other gateways only ever
//! consume, never refill. The same holds when it admits a request that leaves nothing, with
//! `c` = 1 and `R` the wait until one unit is back
//! ([`refusal_after`](super::algo::refusal_after)). So until then the gateway answers 429
//! itself, without a store round trip; a hammered key costs about one store call per retry
//! window per gateway (none past the admission that emptied it).
//!
//! It never refuses what the store would admit: `R` is counted from when the call was *sent*
//! (the store decided at or after that instant), on the monotonic clock. And its `Retry-After`
//! is the store's: a request of another cost asks the store (a smaller one may fit, a larger
//! one waits longer by what only the store knows). Shadow limits are never cached. An admin
//! reset forgets the key; a reload forgets everything (a rate edit keeps the key but changes
//! what it admits). Memory is bounded: past [`MAX_ENTRIES`] entries a shard drops its
//! expired ones (at most every `PRUNE_EVERY`, so a cache full of live entries costs an insert
//! no scan), and if it is still full the new entry is not kept (the store simply gets asked
//! again).
//!
//! An entry is held at most [`MAX_HOLD`], however long its wait: what another gateway's admin
//! reset (a consumer's top-up) or a flushed Redis gave back is then seen within a second,
//! not at the end of a monthly window, for one store call per second per hammered key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::algo::Decision;
use super::keyed::Shards;

/// Entries kept at most (≈100 bytes each with its key).
pub const MAX_ENTRIES: usize = 100_000;
/// How long a refusal is answered from the cache before the store is asked again (which
/// refuses again, and is cached again, while the wait lasts).
pub const MAX_HOLD: Duration = Duration::from_secs(1);
/// How often a full cache may scan a shard for expired entries on insert (the periodic sweep
/// still runs).
const PRUNE_EVERY: Duration = Duration::from_millis(100);
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Before this instant, a request of at least `cost` is refused.
    until: Instant,
    /// Until this instant (`until`, or [`MAX_HOLD`] after `sent` if sooner) the cache answers.
    expires: Instant,
    cost: u64,
    /// The store's decision, for the quota and reset shown to the client.
    decision: Decision,
    /// When the call that returned `decision` was sent.
    sent: Instant,
}

pub struct DenyCache {
    shards: Shards<Entry>,
    /// Entries in all shards (a lookup on an empty cache takes no lock).
    len: AtomicUsize,
    /// When a full cache last pruned a shard on insert.
    pruned: Mutex<Option<Instant>>,
}

impl Default for DenyCache {
    fn default() -> Self {
        DenyCache {
            shards: Shards::new(SHARDS),
            len: AtomicUsize::new(0),
            pruned: Mutex::new(None),
        }
    }
}

impl DenyCache {
    /// The decision to answer with if a request of `cost` on `key` is certainly refused at
    /// `now`: the store's (limited, what it said was left), retry-after the time left.
    pub fn check(&self, key: &str, cost: u64, now: Instant) -> Option<Decision> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let k = self.shards.hashed(key);
        let e = *self.shards.of(k).lock().get(k)?;
        if now >= e.expires || cost != e.cost {
            return None;
        }
        let left = e.until.duration_since(now);
        let elapsed = now.duration_since(e.sent);
        let reset = Duration::from_micros(e.decision.reset_after_us).saturating_sub(elapsed);
        Some(Decision {
            retry_after_us: micros(left),
            reset_after_us: micros(reset.max(left)),
            ..e.decision
        })
    }

    /// Remember that the call sent at `sent` on `key` with `cost` was limited as `decision`.
    pub fn refused(&self, key: &str, cost: u64, decision: Decision, sent: Instant) {
        if decision.retry_after_us == 0 {
            return;
        }
        let until = sent + Duration::from_micros(decision.retry_after_us);
        let entry = Entry {
            until,
            expires: until.min(sent + MAX_HOLD),
            cost,
            decision,
            sent,
        };
        let k = self.shards.hashed(key);
        let mut shard = self.shards.of(k).lock();
        if let Some(e) = shard.get_mut(k) {
            // Keep the live entry that refuses the most requests; an expired one is stale.
            if sent >= e.expires || until > e.until || cost < e.cost {
                *e = entry;
            }
            return;
        }
        if self.len.load(Ordering::Relaxed) >= MAX_ENTRIES {
            let now = Instant::now();
            {
                let mut pruned = self.pruned.lock();
                if pruned.is_some_and(|t| now.duration_since(t) < PRUNE_EVERY) {
                    return;
                }
                *pruned = Some(now);
            }
            let before = shard.len();
            shard.retain(|e| e.expires > now);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if self.len.load(Ordering::Relaxed) >= MAX_ENTRIES {
                return;
            }
        }
        shard.insert_new(k, entry);
        self.len.fetch_add(1, Ordering::Relaxed);
    }

    /// Forget one key (an admin reset).
    pub fn forget(&self, key: &str) {
        let k = self.shards.hashed(key);
        if self.shards.of(k).lock().remove(k) {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Forget everything (a reload may have changed what any key admits).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            self.len.fetch_sub(s.len(), Ordering::Relaxed);
            s.clear();
        }
    }

    /// Drop expired entries (the server calls this periodically).
    pub fn sweep(&self, now: Instant) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            let before = s.len();
            s.retain(|e| e.expires > now);
            self.len.fetch_sub(before - s.len(), Ordering::Relaxed);
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::Code;

    fn limited(retry_us: u64) -> Decision {
        Decision {
            code: Code::Limited,
            limit: 10,
            remaining: 0,
            retry_after_us: retry_us,
            reset_after_us: 2 * retry_us,
        }
    }

    #[test]
    fn refuses_the_same_cost_until_the_wait_has_passed() {
        let c = DenyCache::default();
        let t0 = Instant::now();
        c.refused("k", 2, limited(1_000_000), t0);
        let d = c.check("k", 2, t0 + Duration::from_millis(400)).unwrap();
        assert_eq!(d.code, Code::Limited);
        assert_eq!(d.retry_after_us, 600_000);
        assert_eq!(d.reset_after_us, 1_600_000);
        assert_eq!(d.remaining, 0);
        // What the store said was left is what the cache says: 1 of a cost-2 refusal.
        c.refused(
            "one-left",
            2,
            Decision {
                remaining: 1,
                ..limited(1_000_000)
            },
            t0,
        );
        assert_eq!(c.check("one-left", 2, t0).unwrap().remaining, 1);
        assert!(
            c.check("k", 5, t0).is_none(),
            "a larger cost waits longer, by what only the store knows: ask it"
        );
        assert!(
            c.check("k", 1, t0).is_none(),
            "a smaller cost may fit: ask the store"
        );
        assert!(
            c.check("k", 2, t0 + Duration::from_secs(1)).is_none(),
            "the wait is over"
        );
        assert!(c.check("other", 2, t0).is_none());
    }

    #[test]
    fn a_long_wait_is_held_a_second_then_asked_again_with_the_stores_retry() {
        let c = DenyCache::default();
        let t0 = Instant::now();
        let month = 30 * 86_400 * 1_000_000;
        c.refused("k", 1, limited(month), t0);
        // Within the hold, the wait counted down from the store's.
        let d = c.check("k", 1, t0 + Duration::from_millis(900)).unwrap();
        assert_eq!(d.retry_after_us, month - 900_000);
        // Past it, the store is asked (another gateway may have reset the key).
        assert!(c.check("k", 1, t0 + MAX_HOLD).is_none());
        // A later, shorter refusal replaces the stale entry (a reset and new use since).
        let t1 = t0 + Duration::from_secs(2);
        c.refused("k", 1, limited(5_000_000), t1);
        let d = c.check("k", 1, t1 + Duration::from_millis(100)).unwrap();
        assert_eq!(d.retry_after_us, 4_900_000);
        // A live entry is not replaced by a shorter one.
        c.refused("k", 1, limited(1_000_000), t1 + Duration::from_millis(200));
        let d = c.check("k", 1, t1 + Duration::from_millis(300)).unwrap();
        assert_eq!(d.retry_after_us, 4_700_000);
        // Sweeping drops what the cache no longer answers, however long its wait.
        c.sweep(t1 + MAX_HOLD);
        assert!(c.is_empty());
    }

    #[test]
    fn forget_clear_sweep_and_the_bound() {
        let c = DenyCache::default();
        let t0 = Instant::now();
        c.refused("a", 1, limited(1_000_000), t0);
        c.refused("b", 1, limited(1_000), t0);
        assert_eq!(c.len(), 2);
        c.forget("a");
        assert!(c.check("a", 1, t0).is_none());
        c.sweep(t0 + Duration::from_millis(5));
        assert!(c.is_empty(), "b expired");
        c.refused("c", 1, limited(1_000_000), t0);
        c.clear();
        assert!(c.is_empty() && c.check("c", 1, t0).is_none());
        // A zero wait is nothing to cache.
        c.refused("z", 1, limited(0), t0);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_makes_room_from_expired_entries_at_most_every_prune_interval() {
        let c = DenyCache::default();
        let long_ago = Instant::now() - Duration::from_secs(5);
        let fill = |c: &DenyCache, from: usize| {
            let mut i = from;
            while c.len() < MAX_ENTRIES {
                c.refused(&format!("old{i}"), 1, limited(1_000), long_ago);
                i += 1;
            }
            i
        };
        let next = fill(&c, 0);
        c.refused("a", 1, limited(60_000_000), Instant::now());
        assert!(
            c.check("a", 1, Instant::now()).is_some(),
            "a cache full of expired entries made no room"
        );
        fill(&c, next);
        c.refused("b", 1, limited(60_000_000), Instant::now());
        assert!(
            c.check("b", 1, Instant::now()).is_none(),
            "pruned again within the interval"
        );
        std::thread::sleep(PRUNE_EVERY);
        c.refused("b", 1, limited(60_000_000), Instant::now());
        assert!(c.check("b", 1, Instant::now()).is_some());
        assert!(c.len() <= MAX_ENTRIES);
    }

    #[test]
    fn never_holds_more_than_the_bound() {
        let c = DenyCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 500 {
            c.refused(&format!("k{i}"), 1, limited(60_000_000), t0);
        }
        assert_eq!(c.len(), MAX_ENTRIES);
    }
}
