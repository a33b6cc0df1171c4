//! Sliding log: one entry per admitted unit (its admission µs); entries ≤ now − W are gone;
//! admit iff live + cost ≤ N. Exact: at most N in every half-open interval (t − W, t].
//!
//! Memory is O(N) per key (8 B per entry here), which is why N is capped at 10 000.
use super::{verdict, Code, Params, Verdict};
use std::collections::VecDeque;

/// Admission times, sorted ascending (the constructor enforces it, so pruning is a pop
/// from the front and the k-th oldest is an index).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    log: VecDeque<u64>,
}

impl State {
    pub fn from_entries(entries: impl IntoIterator<Item = u64>) -> State {
        let mut v: Vec<u64> = entries.into_iter().collect();
        v.sort_unstable();
        State { log: v.into() }
    }

    pub fn entries(&self) -> &VecDeque<u64> {
        &self.log
    }
}

/// How many of the oldest entries are gone at `now`: those admitted at or before now − W
/// (written without subtracting, now may be < W), or all of a log from the future.
fn gone_at(log: &VecDeque<u64>, now: u64, w: u64) -> usize {
    match log.back() {
        Some(&newest) if newest > now => log.len(),
        _ => log.partition_point(|&e| e.saturating_add(w) <= now),
    }
}

/// A log holding entries after `now` cannot come from this store clock (corruption, or the
/// clock stepped back): it reads as fresh, as every algorithm reads a state from the future.
/// That admits at most one fresh quota, and keeps retries exact (a reading that changed as
/// time passes without a write would make them lie).
pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let (n, w) = (p.limit, p.window_us);
    let empty = VecDeque::new();
    let log = state.as_ref().map_or(&empty, |s| &s.log);
    let gone = gone_at(log, now, w);
    let live = (log.len() - gone) as u64;
    let until_gone = |e: u64| e.saturating_add(w) - now;
    let reset = log
        .back()
        .filter(|_| live > 0)
        .map_or(0, |&e| until_gone(e));
    let remaining = n.saturating_sub(live);
    if cost > n {
        return verdict(Code::CannotFit, n, remaining, 0, reset, None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, n, remaining, 0, reset, None);
    }
    if cost > remaining {
        // The (live + cost − N)-th oldest live entry must age out first.
        let retry = until_gone(log[gone + (live + cost - n) as usize - 1]);
        return verdict(Code::Limited, n, remaining, retry, reset, None);
    }
    let reset = w; // the newest entry is now
    let ttl = commit.then(|| {
        let s = state.get_or_insert_with(State::default);
        s.log.drain(..gone);
        s.log.extend(std::iter::repeat_n(now, cost as usize));
        reset
    });
    verdict(Code::Allowed, n, remaining - cost, 0, reset, ttl)
}

/// Charge `cost` after the answer, even past N: the units that fit and the excess alike are
/// entries of now (at most 2N live), which later requests wait out as they age.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let before = decide(p, state, now, 0, false).decision;
    if cost <= before.remaining {
        return decide(p, state, now, cost, true);
    }
    let s = state.get_or_insert_with(State::default);
    let w = p.window_us;
    let gone = gone_at(&s.log, now, w);
    s.log.drain(..gone);
    let room = (2 * p.limit).saturating_sub(s.log.len() as u64);
    s.log
        .extend(std::iter::repeat_n(now, cost.min(room) as usize));
    // Until the newest entry ages out (now, unless the log was full already).
    let reset = decide(p, state, now, 0, false).decision.reset_after_us;
    verdict(Code::Allowed, p.limit, 0, 0, reset, Some(reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, step};
    use crate::limiter::algo::Algorithm::SlidingLog;
    use crate::limiter::algo::State as Any;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;

    fn log_of(st: &Option<Any>) -> Vec<u64> {
        match st {
            Some(Any::SlidingLog(s)) => s.entries().iter().copied().collect(),
            None => vec![],
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retry_waits_for_the_right_entry_and_the_log_stays_bounded() {
        let p = params(SlidingLog, 3, 10 * S, None);
        let mut st = None;
        for t in [S, 2 * S, 3 * S] {
            assert!(step(&p, &mut st, t, 1).decision.allowed());
        }
        // cost 2 needs the two oldest (1 s and 2 s) gone: at 2 s + W.
        let d = step(&p, &mut st, 5 * S, 2).decision;
        assert_eq!(
            (d.code, d.retry_after_us, d.reset_after_us),
            (Code::Limited, 7 * S, 8 * S)
        );
        let v = step(&p, &mut st, 12 * S, 2);
        assert_eq!((v.decision.remaining, v.ttl_us), (0, Some(10 * S)));
        assert_eq!(log_of(&st), vec![3 * S, 12 * S, 12 * S]);
        for t in (12 * S..60 * S).step_by(S as usize / 3) {
            step(&p, &mut st, t, 1);
            assert!(log_of(&st).len() <= 3);
        }
    }

    #[test]
    fn a_log_from_the_future_reads_as_fresh() {
        let p = params(SlidingLog, 2, S, None);
        let mut st = Some(Any::SlidingLog(State::from_entries([
            50 * S,
            10 * S,
            u64::MAX,
        ])));
        let d = step(&p, &mut st, 11 * S, 0).decision;
        assert_eq!((d.remaining, d.reset_after_us), (2, 0));
        let d = step(&p, &mut st, 11 * S, 1).decision;
        assert_eq!((d.remaining, d.reset_after_us), (1, S));
        assert_eq!(log_of(&st), vec![11 * S]);
    }

    proptest! {
        /// Reference: the full list of admitted units, counted in (now − W, now].
        #[test]
        fn matches_counting_a_list(
            n in 1u64..12,
            w in S..3 * S,
            start in 0u64..1 << 52,
            sched in proptest::collection::vec((0u64..800_000, 0u64..15), 1..100),
        ) {
            let p = params(SlidingLog, n, w, None);
            let mut st = None;
            let mut admitted: Vec<(u64, u64)> = vec![];
            let mut now = start;
            for (dt, c) in sched {
                now += dt;
                let cost = c % (n + 2);
                let live: u64 = admitted.iter().filter(|(t, _)| t + w > now).map(|a| a.1).sum();
                let v = step(&p, &mut st, now, cost);
                prop_assert_eq!(v.decision.allowed(), cost == 0 || live + cost <= n);
                if v.decision.allowed() && cost > 0 {
                    admitted.push((now, cost));
                }
                prop_assert!(log_of(&st).len() as u64 <= n);
                let window: u64 = admitted.iter().filter(|(t, _)| t + w > now).map(|a| a.1).sum();
                prop_assert!(window <= n);
            }
        }
    }
}
