//! The embedded store: limiter state in this process, decided by [`crate::limiter::algo`] directly.
//!
//! Keys live in up to 64 shards ([`crate::limiter::keyed`]), each key hashed once per call.
//! A request's limits are decided all-or-nothing under the locks of every shard they touch,
//! taken in ascending shard order (no deadlock between requests naming the same keys in
//! another order).
use super::{LimitCall, Peek};
use crate::limiter::algo::{self, gcra, Decision, Params, State};
use crate::limiter::keyed::{Hashed, Shards, Table};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where the store reads `now` (integer µs since the Unix epoch).
#[derive(Debug, Clone)]
pub enum Clock {
    /// Wall time at first use, advanced by the monotonic clock: reads as Unix µs but never
    /// steps back when NTP does.
    System,
    /// Whatever the test stored: deterministic decisions without sleeping.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn manual(start_us: u64) -> (Clock, Arc<AtomicU64>) {
        let t = Arc::new(AtomicU64::new(start_us));
        (Clock::Manual(t.clone()), t)
    }

    pub fn now_us(&self) -> u64 {
        match self {
            Clock::System => {
                static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
                let (at, base) = ANCHOR.get_or_init(|| {
                    // The embedded store's clock is the store clock: it decides here.
                    #[allow(clippy::disallowed_methods)]
                    let unix = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default();
                    (
                        Instant::now(),
                        u64::try_from(unix.as_micros()).unwrap_or(u64::MAX),
                    )
                });
                base.saturating_add(u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX))
            }
            Clock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    /// Absent from this µs on (`expires_at_us <= now` counts as missing).
    expires_at_us: u64,
}

const MAX_SHARDS: usize = 64;

/// Bounded, sharded, in-process limiter state.
///
/// Memory per key, 64-bit: a map slot holds `(String, Entry)` = 24 + 40 = 64 B (Entry is the
/// 32 B `State` enum plus the 8 B expiry; the test `memory_per_key` pins these sizes), plus
/// one control byte, at a load factor between 7/16 and 7/8 → 75–150 B; plus the key's heap
/// bytes (~50–90 B for `sluice:route:limit:algorithm:{hash}`). About 130–240 B per key, so
/// a million keys ≈ 200 MB; sliding_log adds 8 B per logged unit (≤ 80 KB at N = 10 000).
pub struct MemoryStore {
    shards: Shards<Entry>,
    /// Keys per shard; shards × this ≤ `max_keys`.
    per_shard: usize,
    clock: Clock,
}

impl MemoryStore {
    /// Holds at most `max_keys` keys (at least 1): 64 shards of `max_keys / 64` each, or fewer
    /// shards for small stores so the bound holds exactly.
    pub fn new(max_keys: usize, clock: Clock) -> Self {
        let max_keys = max_keys.max(1);
        let n = max_keys.min(MAX_SHARDS);
        MemoryStore {
            shards: Shards::new(n),
            per_shard: max_keys / n,
            clock,
        }
    }

    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    fn hashed(&self, key: &str) -> Hashed {
        self.shards.hashed(key)
    }

    fn shard_of(&self, k: Hashed) -> usize {
        self.shards.index_of(k)
    }

    /// Decide one request against all its limits, atomically and all-or-nothing: if any
    /// non-shadow limit refuses, nothing is charged; otherwise every limit that admitted is
    /// (a shadow limit that refused is not). When a request is refused, the other limits'
    /// decisions are what they would have been (an admitted one reports its would-be
    /// `remaining`). A key named twice is decided in order, the second call seeing the first's
    /// charge. Returns one decision per call, in order.
    pub fn decide(&self, calls: &[LimitCall]) -> Vec<Decision> {
        self.decide_as(calls, super::next_id())
    }

    /// [`MemoryStore::decide`] as call `id` (the id of the concurrency leases it names).
    pub fn decide_as(&self, calls: &[LimitCall], id: u64) -> Vec<Decision> {
        let now = self.clock.now_us();
        if let [call] = calls {
            // Alone, committing directly is all-or-nothing already: a refusal writes nothing.
            let k = self.hashed(&call.key);
            let mut shard = self.shards.of(k).lock();
            return vec![self.apply(&mut shard, k, call, id, now, true)];
        }
        let keys: Vec<Hashed> = calls.iter().map(|c| self.hashed(&c.key)).collect();
        let at: Vec<usize> = keys.iter().map(|&k| self.shard_of(k)).collect();
        let mut order = at.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<_> = order.iter().map(|&i| self.shards.at(i).lock()).collect();
        let slot = |i: usize| order.binary_search(&i).unwrap_or_default();

        let repeated = calls
            .iter()
            .enumerate()
            .any(|(j, c)| calls[..j].iter().any(|b| b.key == c.key));
        let dry: Vec<Decision> = if repeated {
            // Copies of the states involved, charged in order, so a repeated key sees itself.
            let mut scratch: Vec<(&str, Option<State>)> = Vec::new();
            calls
                .iter()
                .zip(keys.iter().zip(&at))
                .map(|(c, (&k, &i))| {
                    let pos = scratch
                        .iter()
                        .position(|(k, _)| *k == c.key)
                        .unwrap_or_else(|| {
                            let live = guards[slot(i)].get(k).filter(|e| e.expires_at_us > now);
                            scratch.push((&c.key, live.map(|e| e.state.clone())));
                            scratch.len() - 1
                        });
                    let st = &mut scratch[pos].1;
                    algo::run(&c.params, st, now, c.cost, c.op, id, true).decision
                })
                .collect()
        } else {
            let shards = calls.iter().zip(keys.iter().zip(&at));
            shards
                .map(|(c, (&k, &i))| self.apply(&mut guards[slot(i)], k, c, id, now, false))
                .collect()
        };
        if !super::request_allowed(calls, &dry) {
            // Nothing is charged, but a state read under other parameters is written as read
            // (a look of cost 0 that commits), or the waits just stated would not hold.
            let shards = calls.iter().zip(keys.iter().zip(&at));
            for (c, (&k, &i)) in shards.filter(|(c, _)| c.op.decides()) {
                if c.params.algorithm.restates() {
                    self.look(&mut guards[slot(i)], k, &c.params, now);
                }
            }
            return dry;
        }
        // Deterministic: replaying in order with commit gives the dry run's decisions. (Only
        // a full shard evicting a key of this very request can differ, and a key read fresh
        // admits any cost that fits, so nothing admitted in the dry run is refused here.)
        let shards = calls.iter().zip(keys.iter().zip(&at));
        shards
            .map(|(c, (&k, &i))| self.apply(&mut guards[slot(i)], k, c, id, now, true))
            .collect()
    }

    /// The key's state without consuming: as a cost-0 and as a cost-1 request see it.
    pub fn peek(&self, key: &str, params: &Params) -> Peek {
        let now = self.clock.now_us();
        let k = self.hashed(key);
        let mut shard = self.shards.of(k).lock();
        let call = |cost| LimitCall {
            key: key.to_owned(),
            params: *params,
            cost,
            shadow: true,
            // Not written (commit false): a cost-1 decision as it would be made.
            op: algo::Op::Decide,
        };
        Peek {
            now: self.apply(&mut shard, k, &call(0), 0, now, false),
            next: self.apply(&mut shard, k, &call(1), 0, now, false),
        }
    }

    /// Forget a key: its limit is back to full.
    pub fn reset(&self, key: &str) {
        let k = self.hashed(key);
        self.shards.of(k).lock().remove(k);
    }

    /// Keys held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop expired keys, one shard lock at a time (the server calls this periodically).
    pub fn sweep(&self) {
        let now = self.clock.now_us();
        for shard in self.shards.iter() {
            shard.lock().retain(|e| e.expires_at_us > now);
        }
    }

    /// A cost-0 decision that commits: writes only a restatement (see
    /// [`Algorithm::restates`](crate::limiter::algo::Algorithm::restates)).
    fn look(&self, shard: &mut Table<Entry>, key: Hashed, params: &Params, now: u64) {
        let call = LimitCall {
            key: String::new(),
            params: *params,
            cost: 0,
            shadow: true,
            op: algo::Op::Decide,
        };
        self.apply(shard, key, &call, 0, now, true);
    }

    /// Run one limit's call on a locked shard; with `commit`, write what the algorithm wrote.
    fn apply(
        &self,
        shard: &mut Table<Entry>,
        key: Hashed,
        c: &LimitCall,
        id: u64,
        now: u64,
        commit: bool,
    ) -> Decision {
        let (p, cost) = (&c.params, c.cost);
        match shard.get_mut(key) {
            Some(entry) if entry.expires_at_us > now => {
                // Borrow the state out of the map (a cheap placeholder stands in meanwhile).
                let placeholder = State::Gcra(gcra::State {
                    tat: 0,
                    interval: 0,
                });
                let mut state = Some(std::mem::replace(&mut entry.state, placeholder));
                let v = algo::run(p, &mut state, now, cost, c.op, id, commit);
                match state {
                    Some(s) => {
                        entry.state = s;
                        if let Some(ttl) = v.ttl_us {
                            entry.expires_at_us = now.saturating_add(ttl);
                        }
                    }
                    None => {
                        shard.remove(key);
                    }
                }
                v.decision
            }
            expired => {
                let mut state = None;
                let v = algo::run(p, &mut state, now, cost, c.op, id, commit);
                if let (Some(state), Some(ttl)) = (state, v.ttl_us) {
                    let entry = Entry {
                        state,
                        expires_at_us: now.saturating_add(ttl),
                    };
                    match expired {
                        Some(old) => *old = entry,
                        None => {
                            if shard.len() >= self.per_shard {
                                make_room(shard, self.per_shard, now);
                            }
                            shard.insert_new(key, entry);
                        }
                    }
                }
                v.decision
            }
        }
    }
}

/// Called on a full shard before inserting: drop expired entries; if none were, drop those
/// closest to expiry, 1/64 of the shard at once (at least one), so a flood of new keys costs
/// amortised O(64) per insert instead of a full scan each.
fn make_room(shard: &mut Table<Entry>, cap: usize, now: u64) {
    shard.retain(|e| e.expires_at_us > now);
    if shard.len() < cap {
        return;
    }
    let evict = shard.len() + 1 - cap + (cap / 64).saturating_sub(1);
    let mut expiries: Vec<u64> = shard.values().map(|e| e.expires_at_us).collect();
    let cut = *expiries.select_nth_unstable(evict - 1).1;
    // Everything before `cut`, then entries at exactly `cut` until `evict` are gone.
    let mut ties = evict - expiries.iter().filter(|&&x| x < cut).count();
    shard.retain(|e| match e.expires_at_us.cmp(&cut) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal if ties > 0 => {
            ties -= 1;
            false
        }
        _ => true,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::{Algorithm, Code};
    use crate::limiter::store::request_allowed;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicUsize;

    const S: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * S;

    fn call(key: &str, a: Algorithm, n: u64, w: u64, cost: u64, shadow: bool) -> LimitCall {
        let params = Params::new(a, n, w, None).unwrap();
        LimitCall {
            key: key.into(),
            params,
            cost,
            shadow,
            op: Default::default(),
        }
    }

    fn remaining(store: &MemoryStore, c: &LimitCall) -> u64 {
        store.peek(&c.key, &c.params).now.remaining
    }

    #[test]
    fn a_refused_request_consumes_no_limit() {
        let store = MemoryStore::new(1000, Clock::manual(T0).0);
        let a = call("a", Algorithm::TokenBucket, 5, 60 * S, 1, false);
        let b = call("b", Algorithm::FixedWindow, 1, 60 * S, 1, false);
        let req = [a.clone(), b.clone()];
        assert!(request_allowed(&req, &store.decide(&req)));
        let d = store.decide(&req);
        assert!(!request_allowed(&req, &d));
        assert_eq!(
            (d[0].code, d[0].remaining, d[1].code),
            (Code::Allowed, 3, Code::Limited)
        );
        assert_eq!((remaining(&store, &a), remaining(&store, &b)), (4, 0));
    }

    #[test]
    fn shadow_never_refuses_and_is_not_charged_when_it_would() {
        let store = MemoryStore::new(1000, Clock::manual(T0).0);
        let a = call("a", Algorithm::Gcra, 5, 60 * S, 1, false);
        let s = call("s", Algorithm::SlidingLog, 2, 60 * S, 1, true);
        let req = [s.clone(), a.clone()];
        for i in 0..4u64 {
            let d = store.decide(&req);
            assert!(request_allowed(&req, &d));
            assert_eq!(d[0].allowed(), i < 2);
        }
        assert_eq!((remaining(&store, &a), remaining(&store, &s)), (1, 0));
        let s = store.hashed("s");
        let log = match &store.shards.of(s).lock().get(s).unwrap().state {
            State::SlidingLog(l) => l.entries().len(),
            other => panic!("{other:?}"),
        };
        assert_eq!(log, 2);
    }

    #[test]
    fn a_key_named_twice_is_charged_in_order() {
        let store = MemoryStore::new(1000, Clock::manual(T0).0);
        let c = call("k", Algorithm::TokenBucket, 2, 60 * S, 1, false);
        let d = store.decide(&[c.clone(), c.clone()]);
        assert_eq!((d[0].remaining, d[1].remaining), (1, 0));
        let d = store.decide(&[c.clone(), c.clone()]);
        assert!(!d[0].allowed());
        let store = MemoryStore::new(1000, Clock::manual(T0).0);
        let d = store.decide(&[
            c.clone(),
            call("k", Algorithm::TokenBucket, 2, 60 * S, 2, false),
        ]);
        assert_eq!((d[0].code, d[1].code), (Code::Allowed, Code::Limited));
        assert_eq!(
            remaining(&store, &c),
            2,
            "refused as a whole: nothing charged"
        );
    }

    #[test]
    fn peek_and_reset() {
        let store = MemoryStore::new(1000, Clock::manual(T0).0);
        let c = call("k", Algorithm::FixedWindow, 1, 60 * S, 1, false);
        let p = store.peek("k", &c.params);
        assert_eq!(
            (p.now.remaining, p.now.reset_after_us, p.next.retry_after_us),
            (1, 0, 0)
        );
        store.decide(std::slice::from_ref(&c));
        let p = store.peek("k", &c.params);
        assert_eq!((p.now.remaining, p.next.code), (0, Code::Limited));
        assert_eq!(p.next.retry_after_us, 60 * S - T0 % (60 * S));
        store.reset("k");
        assert_eq!((remaining(&store, &c), store.len()), (1, 0));
    }

    #[test]
    fn expired_keys_read_as_absent_and_are_swept() {
        let (clock, t) = Clock::manual(T0);
        let store = MemoryStore::new(1000, clock);
        for i in 0..50 {
            store.decide(&[call(&format!("k{i}"), Algorithm::Gcra, 1, S, 1, false)]);
        }
        let long = call("long", Algorithm::Gcra, 1, 60 * S, 1, false);
        store.decide(std::slice::from_ref(&long));
        assert_eq!(store.len(), 51);
        t.store(T0 + S - 1, Ordering::Relaxed);
        store.sweep();
        assert_eq!(store.len(), 51);
        t.store(T0 + S, Ordering::Relaxed);
        store.sweep();
        assert_eq!((store.len(), remaining(&store, &long)), (1, 0));
    }

    #[test]
    fn keys_stay_bounded_and_the_closest_to_expiry_goes_first() {
        let (clock, t) = Clock::manual(T0);
        let store = MemoryStore::new(128, clock);
        assert_eq!((store.shards.len(), store.per_shard), (64, 2));
        for i in 0..5000 {
            t.store(T0 + i, Ordering::Relaxed);
            store.decide(&[call(
                &format!("k{i}"),
                Algorithm::SlidingWindow,
                3,
                60 * S,
                1,
                false,
            )]);
            assert!(store.len() <= 128);
        }
        // Three keys of one shard: the one expiring first is evicted for the newcomer.
        let store = MemoryStore::new(128, Clock::manual(T0).0);
        let shard0: Vec<String> = (0..)
            .map(|i| format!("x{i}"))
            .filter(|k| store.shard_of(store.hashed(k)) == 0)
            .take(3)
            .collect();
        let week = call(&shard0[0], Algorithm::Gcra, 1, 7 * 86_400 * S, 1, false);
        let sec = call(&shard0[1], Algorithm::Gcra, 1, S, 1, false);
        let new = call(&shard0[2], Algorithm::Gcra, 1, 60 * S, 1, false);
        for c in [&week, &sec, &new] {
            assert!(store.decide(std::slice::from_ref(c))[0].allowed());
        }
        assert_eq!(
            (
                remaining(&store, &week),
                remaining(&store, &sec),
                remaining(&store, &new)
            ),
            (0, 1, 0)
        );
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn exactly_capacity_admitted_under_contention() {
        let store = Arc::new(MemoryStore::new(10_000, Clock::manual(T0).0));
        let week = 7 * 86_400 * S;
        let hot = call("hot", Algorithm::TokenBucket, 10, week, 1, false);
        let other = call("other", Algorithm::FixedWindow, 1000, week, 1, false);
        // Admitted requests: one-limit ones, and two-limit ones (which also charge `other`).
        let admitted = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, admitted) = (store.clone(), admitted.clone());
                let (hot, other) = (hot.clone(), other.clone());
                std::thread::spawn(move || {
                    for i in 0..500 {
                        // Both orders of two keys (lock ordering), and the one-limit path.
                        let req = match i % 3 {
                            0 => vec![hot.clone(), other.clone()],
                            1 => vec![other.clone(), hot.clone()],
                            _ => vec![hot.clone()],
                        };
                        if request_allowed(&req, &store.decide(&req)) {
                            admitted[req.len() - 1].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let [one, two] = [0, 1].map(|i| admitted[i].load(Ordering::Relaxed) as u64);
        assert_eq!(one + two, 10);
        assert_eq!(1000 - remaining(&store, &other), two);
    }

    #[test]
    fn memory_per_key() {
        assert_eq!(std::mem::size_of::<State>(), 32);
        assert_eq!(std::mem::size_of::<(String, Entry)>(), 64);
        fn send_sync<T: Send + Sync>() {}
        send_sync::<MemoryStore>();
    }

    proptest! {
        /// The store decides exactly as the algorithm does on one state, expiring or not.
        #[test]
        fn single_limits_match_the_algorithm(
            a in proptest::sample::select(Algorithm::ALL.to_vec()),
            n in 1u64..8,
            sched in proptest::collection::vec((0u64..4 * S, 0u64..10), 1..60),
        ) {
            let (clock, t) = Clock::manual(T0);
            let store = MemoryStore::new(100, clock);
            let (mut st, mut now) = (None, T0);
            for (dt, cost) in sched {
                now += dt;
                t.store(now, Ordering::Relaxed);
                let c = call("k", a, n, 3 * S, cost, false);
                let want = algo::decide(&c.params, &mut st, now, cost, true).decision;
                prop_assert_eq!(store.decide(&[c])[0], want);
            }
        }
    }
}
