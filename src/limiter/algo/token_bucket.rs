//! Token bucket: capacity C, one token per I µs (remainder carried); admit iff tokens ≥ cost.
//! Admitted cost in any interval of length τ is at most C + floor(τ/I), and that is reached.
//! A full bucket is no state: a missing key means full.
//!
//! A charge after the answer ([`charge`]) may take more than is left: the bucket then owes
//! tokens, stored as no tokens until a `t` in the future, at most one bucket's worth
//! (C·I) ahead, so later requests wait the debt out and the long-run rate holds. The debt
//! keeps the interval it was written at, so that a new rate (a reload, a plan change) keeps
//! the tokens owed rather than the time, and a lowered burst holds it to the new C·I rather
//! than forgetting it.
use super::{at_interval, verdict, Code, Params, Verdict};

/// `tokens` were valid at `t`; the next token arrives at t + I.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub tokens: u64,
    pub t: u64,
    /// The interval (µs) a debt (`t` after now) was written at; 0 when not known (an older
    /// version's state), read as the current one. Written with a debt only, and left as it
    /// was by other writes (as Lua's `HSET` of `n` and `t` leaves `i`). Nothing else reads
    /// it: a `t` in the past is elapsed time, read at the current interval.
    pub interval: u64,
}

impl State {
    /// A debt: no tokens until `t`, written with its interval (Lua's `token_owe`).
    fn owing(t: u64, interval: u64) -> State {
        State {
            tokens: 0,
            t,
            interval,
        }
    }
}

/// The bucket at `now`, as (tokens, t) with t ≤ now and now − t < I unless full (t = now),
/// or in debt: (0, t) with now < t ≤ now + C·I, no token before t + I; and whether the state
/// must be written again to say so.
/// Divides before adding, so a bucket idle for years cannot overflow. More than C tokens reads
/// as C. A debt written at another interval keeps its tokens owed, to the µs. One further
/// ahead than C·I (a burst lowered after a charge by the answer, or the store clock stepped
/// back) is held to C·I, so a lowered limit gives nobody a fresh bucket. Either is restated
/// at the next decision that commits, since a reading that changed as time passes without a
/// write would make retries lie. Any other `t` after `now` (tokens and a future time:
/// corruption, or the clock stepped back) reads as fresh, i.e. full: at most C at once.
fn refill(p: &Params, s: Option<&State>, now: u64) -> (u64, u64, bool) {
    let (c, i) = (p.capacity, p.interval_us);
    let Some(s) = s else {
        return (c, now, false);
    };
    if s.t > now {
        if s.tokens != 0 {
            return (c, now, false);
        }
        let (debt, rescaled) = at_interval(s.t - now, s.interval, i);
        return match debt <= c * i {
            true => (0, now + debt, rescaled),
            false => (0, now + c * i, true),
        };
    }
    let (n, t) = (s.tokens.min(c), s.t);
    let add = (now - t) / i;
    if add >= c - n {
        (c, now, false)
    } else {
        (n + add, t + add * i, false)
    }
}

pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let (n, t, rewrite) = refill(p, state.as_ref(), now);
    // Time until `need` tokens have been added: the first one arrives at t + I.
    let after = |need: u64| (t + need * i).saturating_sub(now);
    // A debt read at another interval or held to its bound is written as read (nothing
    // charged).
    let mut restate = || {
        (commit && rewrite).then(|| {
            *state = Some(State::owing(t, i));
            after(c)
        })
    };
    if cost > c {
        return verdict(Code::CannotFit, c, n, 0, after(c - n), None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, c, n, 0, after(c - n), restate());
    }
    if cost > n {
        let ttl = restate();
        return verdict(Code::Limited, c, n, after(cost - n), after(c - n), ttl);
    }
    let left = n - cost;
    let ttl = commit.then(|| {
        // Not a debt: the interval stored with the last one stays as it was (Lua's `HSET` of
        // `n` and `t` leaves `i`), so that both twins read the same state.
        let interval = state.as_ref().map_or(0, |s| s.interval);
        *state = Some(State {
            tokens: left,
            t,
            interval,
        });
        after(c - left)
    });
    verdict(Code::Allowed, c, left, 0, after(c - left), ttl)
}

/// Charge `cost` whatever is left (after the answer): what does not fit becomes debt, at most
/// C·I of it ahead of now. Always admitted; `remaining` is 0 while in debt.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let (n, t, _) = refill(p, state.as_ref(), now);
    if cost <= n {
        return decide(p, state, now, cost, true);
    }
    let t = (t + (cost - n) * i).min(now + c * i);
    *state = Some(State::owing(t, i));
    let reset = t + c * i - now;
    verdict(Code::Allowed, c, 0, 0, reset, Some(reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, step};
    use crate::limiter::algo::Algorithm::TokenBucket;
    use crate::limiter::algo::State as Any;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;

    #[test]
    fn bound_c_plus_tau_over_i_is_tight() {
        let p = params(TokenBucket, 5, 5 * S, None);
        let t0 = 1_700_000_000 * S;
        let mut st = None;
        let mut admitted = (0..10)
            .filter(|_| step(&p, &mut st, t0, 1).decision.allowed())
            .count();
        for k in 1..=10 {
            assert!(!step(&p, &mut st, t0 + k * S - 1, 1).decision.allowed());
            admitted += (0..3)
                .filter(|_| step(&p, &mut st, t0 + k * S, 1).decision.allowed())
                .count();
        }
        assert_eq!(admitted, 5 + 10);
    }

    /// A bucket owing 30 tokens (a charge by the answer) whose burst is lowered to 20 owes
    /// 20, written so; it read as a full bucket of 20.
    #[test]
    fn a_lowered_burst_holds_the_debt_to_the_new_bucket() {
        let before = params(TokenBucket, 60, 60 * S, Some(60));
        let after = params(TokenBucket, 60, 60 * S, Some(20));
        let now = 1_700_000_000 * S;
        let mut st = None;
        super::super::charge(&before, &mut st, now, 90);
        assert_eq!(
            st,
            Some(Any::TokenBucket(State {
                tokens: 0,
                t: now + 30 * S,
                interval: S
            }))
        );
        let v = step(&after, &mut st, now, 1);
        assert_eq!(
            (v.decision.code, v.decision.retry_after_us, v.ttl_us),
            (Code::Limited, 21 * S, Some(40 * S))
        );
        assert_eq!(
            st,
            Some(Any::TokenBucket(State {
                tokens: 0,
                t: now + 20 * S,
                interval: S
            }))
        );
    }

    /// A bucket owing 30 tokens at `60/1m` (30 s) still owes 30 when the rate becomes `60/1h`
    /// (30 min, restated so), not 30 s, which read at the new interval forgave 29 of them;
    /// and one owing 30 min at `60/1h` owes 30 s at `60/1m`, not the minute its bound would
    /// hold it to. A state of an older version (no interval) reads as before.
    #[test]
    fn a_new_rate_keeps_the_tokens_owed() {
        let fast = params(TokenBucket, 60, 60 * S, None);
        let slow = params(TokenBucket, 60, 3600 * S, None);
        let now = 1_700_000_000 * S;
        for (from, to) in [(fast, slow), (slow, fast)] {
            let mut st = None;
            super::super::charge(&from, &mut st, now, 90);
            let owed = 30 * to.interval_us;
            let v = step(&to, &mut st, now, 1);
            let wait = owed + to.interval_us;
            assert_eq!(
                (v.decision.code, v.decision.retry_after_us),
                (Code::Limited, wait),
                "{} to {}",
                from.interval_us,
                to.interval_us
            );
            assert_eq!(
                st,
                Some(Any::TokenBucket(State {
                    tokens: 0,
                    t: now + owed,
                    interval: to.interval_us
                }))
            );
            // Read again at the new rate: the same wait, nothing more restated.
            let again = step(&to, &mut st, now, 1);
            assert_eq!((again.decision.retry_after_us, again.ttl_us), (wait, None));
        }
        let mut old = Some(Any::TokenBucket(State {
            tokens: 0,
            t: now + 30 * S,
            interval: 0,
        }));
        let v = step(&slow, &mut old, now, 1);
        assert_eq!(
            (v.decision.retry_after_us, v.ttl_us),
            (30 * S + 60 * S, None)
        );
    }

    #[test]
    fn refill_carries_the_remainder_and_full_means_no_state() {
        let p = params(TokenBucket, 3, 3 * S, None);
        let t0 = 1_700_000_000 * S;
        let mut st = None;
        step(&p, &mut st, t0, 3);
        let v = step(&p, &mut st, t0 + 2_500_000, 1);
        assert_eq!(
            (v.decision.remaining, v.decision.reset_after_us),
            (1, 1_500_000)
        );
        assert_eq!(
            st,
            Some(Any::TokenBucket(State {
                tokens: 1,
                t: t0 + 2 * S,
                interval: 0
            }))
        );
        let d = step(&p, &mut st, t0 + 5 * S, 0).decision;
        assert_eq!((d.remaining, d.reset_after_us), (3, 0));
        // Years idle: divide first, no overflow, full.
        let mut st = Some(Any::TokenBucket(State {
            tokens: 0,
            t: 0,
            interval: 0,
        }));
        assert_eq!(step(&p, &mut st, u64::MAX / 2, 0).decision.remaining, 3);
    }

    proptest! {
        /// Brute force over every pair of admissions: cost in [a, b] ≤ C + floor((b − a) / I).
        #[test]
        fn admitted_cost_in_any_interval_is_bounded(
            n in 1u64..10,
            w in S..4 * S,
            burst in proptest::option::of(1u64..12),
            start in 0u64..1 << 52,
            sched in proptest::collection::vec((0u64..700_000, 0u64..4), 1..120),
        ) {
            let p = params(TokenBucket, n, w, burst);
            let (mut st, mut now, mut admitted) = (None, start, vec![]);
            for (dt, cost) in sched {
                now += dt;
                if step(&p, &mut st, now, cost).decision.allowed() && cost > 0 {
                    admitted.push((now, cost));
                }
            }
            for (i, &(a, _)) in admitted.iter().enumerate() {
                let mut sum = 0;
                for &(b, c) in &admitted[i..] {
                    sum += c;
                    prop_assert!(sum <= p.capacity + (b - a) / p.interval_us);
                }
            }
        }
    }
}
