//! Fixed window: window k = floor(now / W), epoch-aligned; admit iff count + cost ≤ N. With
//! `N/month` the windows are UTC calendar months instead ([`calendar::month_window`]).
//!
//! At most N per window, but up to 2N within any span shorter than W that straddles a
//! boundary: that is the algorithm, not a bug.
use super::{calendar, verdict, Code, Params, Verdict};

/// The window `now` falls in: its index and the µs left until it ends.
pub fn window(p: &Params, now: u64) -> (u64, u64) {
    if p.month {
        let (k, _, end) = calendar::month_window(now);
        (k, end - now)
    } else {
        (now / p.window_us, p.window_us - now % p.window_us)
    }
}

/// Units admitted in window `window` (= floor(now / W)); past N only by a charge after the
/// answer, at most 2N.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub window: u64,
    pub count: u64,
}

/// The count at window `k`: its own, or what a charge put past N in the window just before
/// (debt carried into this one, so the long-run rate holds). Any other window counts nothing:
/// an older one is over, and a future one (the store clock stepped back) belongs to a window
/// that has not started; both read as fresh.
fn count_at(p: &Params, state: &Option<State>, k: u64) -> u64 {
    match state {
        Some(s) if s.window == k => s.count,
        Some(s) if s.window.checked_add(1) == Some(k) => s.count.saturating_sub(p.limit),
        _ => 0,
    }
}

/// µs from `now` until a window holding `count` (at most 2N) at `now` has carried it all
/// off: its end, or the next window's end when it carries debt into that one.
fn until_clear(p: &Params, now: u64, count: u64, to_end: u64) -> u64 {
    match count {
        0 => 0,
        c if c <= p.limit => to_end,
        _ => to_end + calendar::window_at(p, now + to_end),
    }
}

pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let n = p.limit;
    let (k, to_end) = window(p, now);
    let count = count_at(p, state, k);
    let remaining = n.saturating_sub(count);
    let reset = until_clear(p, now, count, to_end);
    if cost > n {
        return verdict(Code::CannotFit, n, remaining, 0, reset, None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, n, remaining, 0, reset, None);
    }
    if cost > remaining {
        // The next window starts with what this one carries (at most N), and the one after
        // it empty; cost ≤ N.
        let retry = if count.saturating_sub(n) + cost <= n {
            to_end
        } else {
            to_end + calendar::window_at(p, now + to_end)
        };
        return verdict(Code::Limited, n, remaining, retry, reset, None);
    }
    let ttl = commit.then(|| {
        *state = Some(State {
            window: k,
            count: count + cost,
        });
        to_end
    });
    verdict(Code::Allowed, n, remaining - cost, 0, to_end, ttl)
}

/// Charge `cost` after the answer, even past N: up to 2N in this window, the excess carried
/// into the next one, which admits that much less.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let n = p.limit;
    let (k, to_end) = window(p, now);
    let count = count_at(p, state, k);
    if count + cost <= n {
        return decide(p, state, now, cost, true);
    }
    let count = (count + cost).min(2 * n);
    *state = Some(State { window: k, count });
    let reset = until_clear(p, now, count, to_end);
    verdict(Code::Allowed, n, 0, 0, reset, Some(reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, step};
    use crate::limiter::algo::Algorithm::FixedWindow;
    use crate::limiter::algo::State as Any;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const S: u64 = 1_000_000;

    #[test]
    fn n_per_window_and_2n_across_a_boundary() {
        let p = params(FixedWindow, 5, 10 * S, None);
        let mut st = None;
        let end = 7 * 10 * S; // a window boundary
        let admitted_before = (0..20)
            .filter(|_| step(&p, &mut st, end - 1, 1).decision.allowed())
            .count();
        let admitted_after = (0..20)
            .filter(|_| step(&p, &mut st, end, 1).decision.allowed())
            .count();
        assert_eq!((admitted_before, admitted_after), (5, 5)); // 10 = 2N within 2 µs
    }

    #[test]
    fn calendar_months_end_exactly_at_midnight_utc_of_the_first() {
        let p = Params::monthly(3).unwrap();
        // 2028-02-29 23:59:59.999999 UTC, then 2028-03-01 00:00:00 UTC (a leap February).
        let march_1: u64 = 1_835_481_600 * S;
        let last_us = march_1 - 1;
        let mut st = None;
        let admitted = (0..5)
            .filter(|_| step(&p, &mut st, last_us, 1).decision.allowed())
            .count();
        assert_eq!(admitted, 3);
        let refused = step(&p, &mut st, last_us, 1).decision;
        assert_eq!(refused.retry_after_us, 1, "the month ends 1 µs later");
        let d = step(&p, &mut st, march_1, 1).decision;
        assert!(d.allowed(), "a new month starts empty");
        assert_eq!(d.remaining, 2);
        assert_eq!(d.reset_after_us, 31 * 86_400 * S, "March has 31 days");
        assert_eq!(calendar::window_at(&p, march_1), 31 * 86_400 * S);
        assert_eq!(calendar::window_at(&p, last_us), 29 * 86_400 * S);
    }

    #[test]
    fn retry_reset_and_ttl_point_at_the_window_end() {
        let p = params(FixedWindow, 2, 10 * S, None);
        let mut st = None;
        let now = 30 * S + 4 * S;
        let d = step(&p, &mut st, now, 1);
        assert_eq!(
            (d.decision.remaining, d.decision.reset_after_us),
            (1, 6 * S)
        );
        assert_eq!(d.ttl_us, Some(6 * S));
        step(&p, &mut st, now, 1);
        let d = step(&p, &mut st, now + 1, 1).decision;
        assert_eq!(
            (d.code, d.retry_after_us, d.remaining),
            (Code::Limited, 6 * S - 1, 0)
        );
        assert!(step(&p, &mut st, 40 * S, 2).decision.allowed());
    }

    #[test]
    fn empty_window_resets_at_zero_and_future_state_reads_fresh() {
        let p = params(FixedWindow, 3, S, None);
        let d = decide(&p, &mut None, 5 * S + 7, 0, true).decision;
        assert_eq!((d.remaining, d.reset_after_us), (3, 0));
        let mut st = Some(Any::FixedWindow(State {
            window: 99,
            count: 3,
        }));
        assert_eq!(step(&p, &mut st, 5 * S, 1).decision.remaining, 2);
        assert_eq!(
            st,
            Some(Any::FixedWindow(State {
                window: 5,
                count: 1
            }))
        );
    }

    proptest! {
        /// Reference model: a count per window, never more than N in any window.
        #[test]
        fn matches_a_per_window_count(
            n in 1u64..20,
            w in S..5 * S,
            start in 0u64..1 << 52,
            sched in proptest::collection::vec((0u64..3_000_000, 0u64..25), 1..80),
        ) {
            let p = params(FixedWindow, n, w, None);
            let mut st = None;
            let mut counts: HashMap<u64, u64> = HashMap::new();
            let mut now = start;
            for (dt, c) in sched {
                now += dt;
                let cost = c % (n + 2);
                let v = step(&p, &mut st, now, cost);
                let used = counts.entry(now / w).or_default();
                let fits = *used + cost <= n && cost <= n;
                prop_assert_eq!(v.decision.allowed(), fits || cost == 0);
                if fits {
                    *used += cost;
                }
                prop_assert_eq!(v.decision.remaining, n - *used);
                prop_assert!(*used <= n);
            }
        }
    }
}
