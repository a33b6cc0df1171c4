//! Sliding window (Cloudflare's counter): counts of the current and previous epoch-aligned
//! windows; the previous one weighs what is left of it. With e = now − k·W, admit iff
//! prev·(W − e) + (cur + cost)·W ≤ N·W (integers, no division). Only admitted units count.
//! Any interval t ≤ W admits at most N + N·t/W.
//!
//! The weighting runs in units of `Params::unit_us` (1 µs, or 1 ms when N·W in µs would pass
//! 2^53): with Wu = W / u and eu = floor(e / u), the rule is prev·(Wu − eu) + (cur + cost)·Wu
//! ≤ N·Wu, exact in a Lua double too. Flooring e only ever over-weighs the previous window.
use super::{verdict, Code, Params, Verdict};

/// Counts of window `window` (= floor(now / W)) and of the window before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub window: u64,
    pub cur: u64,
    pub prev: u64,
}

/// (cur, prev) at window `k`: a state of window k − 1 becomes `prev`; an older state, or one
/// from a future window (the store clock stepped back), counts nothing.
fn counts_at(state: &Option<State>, k: u64) -> (u64, u64) {
    match state {
        Some(s) if s.window == k => (s.cur, s.prev),
        Some(s) if k.checked_sub(1) == Some(s.window) => (0, s.cur),
        _ => (0, 0),
    }
}

/// Decide at `now` from the counts of `counts_at`. Exact times (`unit` u, `zero` = Wu·u, the elapsed time at which the previous window's
/// weight reaches 0, = W whenever u divides W, i.e. always for whole-millisecond windows):
/// - retry, cur + cost > N: the current window can never fit it, so wait into the next one
///   until cur·(Wu − eu') ≤ (N − cost)·Wu: (W − e) + u·(Wu − floor((N − cost)·Wu / cur));
/// - retry otherwise: wait in this window until prev·(Wu − eu) ≤ (N − cost − cur)·Wu:
///   u·(Wu − floor((N − cost − cur)·Wu / prev)) − e;
/// - reset (back to N remaining): cur > 0 → (W − e) + zero (end of the next window);
///   else prev weighs → zero − e (end of this window); else 0;
/// - TTL: end of the next window, after which the key reads as fresh.
pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let (n, w, u) = (p.limit, p.window_us, p.unit_us);
    let (k, e) = (now / w, now % w);
    let (cur, prev) = counts_at(state, k);
    let (wu, eu) = (u128::from(w / u), u128::from(e / u));
    let zero = w / u * u;
    // Largest cur' with prev·(Wu − eu) + cur'·Wu ≤ N·Wu; remaining is what it leaves.
    let room = (u128::from(n) * wu)
        .checked_sub(u128::from(prev) * (wu - eu))
        .map_or(0, |b| b / wu) as u64;
    let remaining = room.saturating_sub(cur);
    let reset = |cur: u64| {
        if cur > 0 {
            w - e + zero
        } else if prev > 0 && e < zero {
            zero - e
        } else {
            0
        }
    };
    if cost > n {
        return verdict(Code::CannotFit, n, remaining, 0, reset(cur), None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, n, remaining, 0, reset(cur), None);
    }
    if cost > remaining {
        // Elapsed units from which a count `by` weighing `room` fits: Wu − floor(room·Wu/by).
        let from = |room: u64, by: u64| (wu - u128::from(room) * wu / u128::from(by)) as u64 * u;
        let retry = match cur.checked_add(cost) {
            Some(sum) if sum <= n => from(n - sum, prev) - e,
            _ => w - e + from(n - cost, cur),
        };
        return verdict(Code::Limited, n, remaining, retry, reset(cur), None);
    }
    let ttl = commit.then(|| {
        *state = Some(State {
            window: k,
            cur: cur + cost,
            prev,
        });
        2 * w - e
    });
    verdict(
        Code::Allowed,
        n,
        remaining - cost,
        0,
        reset(cur + cost),
        ttl,
    )
}

/// Charge `cost` after the answer, even past N: the current count goes up to 2N, and the
/// excess weighs on the next window as `prev`, which later requests wait out.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let before = decide(p, state, now, 0, false).decision;
    if cost <= before.remaining {
        return decide(p, state, now, cost, true);
    }
    let w = p.window_us;
    let (k, e) = (now / w, now % w);
    let (cur, prev) = counts_at(state, k);
    *state = Some(State {
        window: k,
        cur: (cur + cost).min(2 * p.limit),
        prev,
    });
    let after = decide(p, state, now, 0, false).decision;
    verdict(
        Code::Allowed,
        p.limit,
        0,
        0,
        after.reset_after_us,
        Some(2 * w - e),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, peek, step};
    use crate::limiter::algo::Algorithm::SlidingWindow;
    use crate::limiter::algo::State as Any;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const S: u64 = 1_000_000;

    #[test]
    fn weighs_the_previous_window() {
        let p = params(SlidingWindow, 10, 10 * S, None);
        let mut st = None;
        assert!(step(&p, &mut st, 100 * S - 1, 10).decision.allowed());
        // A quarter into the next window the 10 previous units weigh 7.5 → room for 2.
        let d = step(&p, &mut st, 102_500_000, 0).decision;
        assert_eq!((d.remaining, d.reset_after_us), (2, 7_500_000));
        let d = step(&p, &mut st, 102_500_000, 3).decision;
        // 3 fits once 10·(W − e) ≤ 7·W: e ≥ 3 s.
        assert_eq!((d.code, d.retry_after_us), (Code::Limited, 500_000));
        let v = step(&p, &mut st, 102_500_000, 2);
        assert_eq!(
            (v.decision.remaining, v.decision.reset_after_us),
            (0, 17_500_000)
        );
        assert_eq!(v.ttl_us, Some(17_500_000));
        // cur + cost > N: wait into the next window until 2·(W − e') ≤ 1·W: e' ≥ 5 s.
        let d = step(&p, &mut st, 103 * S, 9).decision;
        assert_eq!((d.code, d.retry_after_us), (Code::Limited, 7 * S + 5 * S));
    }

    #[test]
    fn bound_n_plus_nt_over_w_is_reached() {
        let (n, w) = (10, 10 * S);
        let p = params(SlidingWindow, n, w, None);
        let mut st = None;
        let start = 50 * w - 1;
        let mut admitted = (0..2 * n)
            .filter(|_| step(&p, &mut st, start, 1).decision.allowed())
            .count() as u64;
        let end = 50 * w + w / 2;
        admitted += (0..2 * n)
            .filter(|_| step(&p, &mut st, end, 1).decision.allowed())
            .count() as u64;
        let t = end - start;
        assert_eq!(admitted, n + n * t / w); // 15 within half a window
    }

    #[test]
    fn millisecond_units_for_large_n_times_w() {
        let (n, w) = (10_000_000, 7 * 86_400 * S);
        let p = params(SlidingWindow, n, w, None);
        assert_eq!(p.unit_us, 1000);
        let mut st = Some(Any::SlidingWindow(State {
            window: 4,
            cur: n,
            prev: 0,
        }));
        // Half a week into window 5 the previous week weighs exactly N/2.
        let d = step(&p, &mut st, 5 * w + w / 2 + 999, 0).decision;
        assert_eq!(d.remaining, n / 2);
        assert_eq!(peek(&p, &st, 5 * w + w / 2 - 1, 0).remaining, n / 2 - 1);
    }

    proptest! {
        /// Reference: per-window admitted totals with the weighted rule (u = 1 µs here).
        #[test]
        fn matches_per_window_totals_and_the_bound(
            n in 1u64..15,
            w in S..3 * S,
            start in 0u64..1 << 52,
            sched in proptest::collection::vec((0u64..900_000, 0u64..20), 1..100),
        ) {
            let p = params(SlidingWindow, n, w, None);
            prop_assert_eq!(p.unit_us, 1);
            let mut st = None;
            let mut totals: HashMap<u64, u64> = HashMap::new();
            let mut admitted: Vec<(u64, u64)> = vec![];
            let mut now = start;
            for (dt, c) in sched {
                now += dt;
                let cost = c % (n + 2);
                let (k, e) = (now / w, u128::from(now % w));
                let cur = totals.get(&k).copied().unwrap_or(0);
                let prev = k.checked_sub(1).and_then(|j| totals.get(&j)).copied().unwrap_or(0);
                let lhs = u128::from(prev) * (u128::from(w) - e) + u128::from(cur + cost) * u128::from(w);
                let v = step(&p, &mut st, now, cost);
                prop_assert_eq!(v.decision.allowed(), cost == 0 || (cost <= n && lhs <= u128::from(n * w)));
                if v.decision.allowed() && cost > 0 {
                    *totals.entry(k).or_default() += cost;
                    admitted.push((now, cost));
                }
            }
            for (i, &(a, _)) in admitted.iter().enumerate() {
                let mut sum = 0;
                for &(b, c) in &admitted[i..] {
                    sum += c;
                    if b - a <= w {
                        prop_assert!(sum <= n + n * (b - a) / w, "{sum} in {}", b - a);
                    }
                }
            }
        }
    }
}
