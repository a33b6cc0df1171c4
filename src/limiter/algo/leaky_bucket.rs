//! Leaky bucket, policing form (the seeds' "funnel"): level L leaks one unit per I µs
//! (remainder carried); leak first, then admit iff L + cost ≤ C, all in one step. The same
//! admissions as token_bucket with the same C and I (tokens = C − L). An empty bucket is no
//! state: a missing key means empty.
//!
//! A charge after the answer ([`charge`]) may fill it past C, up to 2C: the overflow is debt
//! that later requests wait out (the same as token_bucket's, in levels).
use super::{verdict, Code, Params, Verdict};

/// `level` was valid at `t`; the next unit leaks at t + I.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub level: u64,
    pub t: u64,
}

/// The level at `now`, as (level, t) with t ≤ now and now − t < I unless empty (t = now).
/// Divides first (no overflow after a long idle). A level above 2C (more than a charge after
/// the answer can leave) reads as 2C. A `t` after
/// `now` (corruption, or the store clock stepped back) reads as fresh, i.e. empty, as in
/// token_bucket: at most C at once, and retries stay exact.
fn leak(p: &Params, s: Option<&State>, now: u64) -> (u64, u64) {
    let Some(s) = s.filter(|s| s.t <= now) else {
        return (0, now);
    };
    let (l, t) = (s.level.min(2 * p.capacity), s.t);
    let leaked = (now - t) / p.interval_us;
    if leaked >= l {
        (0, now)
    } else {
        (l - leaked, t + leaked * p.interval_us)
    }
}

pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let c = p.capacity;
    let (l, t) = leak(p, state.as_ref(), now);
    // Time until `units` more have leaked: the first one leaks at t + I.
    let after = |units: u64| units * p.interval_us - (now - t);
    let left = c.saturating_sub(l);
    if cost > c {
        return verdict(Code::CannotFit, c, left, 0, after(l), None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, c, left, 0, after(l), None);
    }
    if l + cost > c {
        return verdict(Code::Limited, c, left, after(l + cost - c), after(l), None);
    }
    let level = l + cost;
    let ttl = commit.then(|| {
        *state = Some(State { level, t });
        after(level)
    });
    verdict(Code::Allowed, c, c - level, 0, after(level), ttl)
}

/// Charge `cost` whatever room is left (after the answer): the level may pass C, up to 2C
/// (then it is 2C as of now). Always admitted.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let (l, t) = leak(p, state.as_ref(), now);
    if l + cost <= c {
        return decide(p, state, now, cost, true);
    }
    let (level, t) = if t + (l + cost) * i > now + 2 * c * i {
        (2 * c, now)
    } else {
        (l + cost, t)
    };
    *state = Some(State { level, t });
    let reset = t + level * i - now;
    verdict(Code::Allowed, c, 0, 0, reset, Some(reset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, step};
    use crate::limiter::algo::Algorithm::LeakyBucket;
    use crate::limiter::algo::State as Any;

    const S: u64 = 1_000_000;

    #[test]
    fn leaks_with_the_remainder_carried() {
        let p = params(LeakyBucket, 4, 4 * S, Some(2));
        let t0 = 1_700_000_000 * S;
        let mut st = None;
        step(&p, &mut st, t0, 2);
        // 1.5 intervals later one unit has leaked and the half interval is kept.
        let v = step(&p, &mut st, t0 + 1_500_000, 1);
        assert_eq!((v.decision.remaining, v.ttl_us), (0, Some(1_500_000)));
        assert_eq!(
            st,
            Some(Any::LeakyBucket(State {
                level: 2,
                t: t0 + S
            }))
        );
        let d = step(&p, &mut st, t0 + 1_500_000, 1).decision;
        assert_eq!((d.code, d.retry_after_us), (Code::Limited, 500_000));
    }

    #[test]
    fn level_above_twice_capacity_clamps_and_future_t_reads_fresh() {
        let p = params(LeakyBucket, 4, 4 * S, None);
        let now = 1_700_000_000 * S;
        let mut st = Some(Any::LeakyBucket(State { level: 99, t: now }));
        let d = step(&p, &mut st, now, 1).decision;
        assert_eq!(
            (d.code, d.remaining, d.retry_after_us, d.reset_after_us),
            (Code::Limited, 0, 5 * S, 8 * S)
        );
        let mut st = Some(Any::LeakyBucket(State {
            level: 99,
            t: now + 1,
        }));
        assert_eq!(step(&p, &mut st, now, 1).decision.remaining, 3);
    }
}
