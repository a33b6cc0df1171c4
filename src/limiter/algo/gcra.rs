//! GCRA: one theoretical arrival time (TAT). With tat = max(stored, now), a request of cost c
//! is admitted iff now ≥ tat + c·I − C·I, and then TAT becomes tat + c·I. Every decision
//! equals token_bucket's with the same C and I (tokens = floor((C·I − (tat − now)) / I)).
//!
//! The TAT is time owed, which means units only at the interval it was written with: the
//! state keeps that interval too, so that a new rate (a reload, a consumer moved to another
//! plan) keeps the units owed rather than the time (`60/1m` tightened to `60/1h` owes the same
//! 60 units, an hour's worth, not 60 seconds' worth, which read at the new rate would give an
//! exhausted client 59 of 60 back).
use super::{at_interval, verdict, Code, Params, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub tat: u64,
    /// The interval (µs) `tat` was written with; 0 when not known (a state written by a
    /// version that did not keep it), read as the current one.
    pub interval: u64,
}

/// How far the bucket is from full at `now`, in µs at the current interval, and whether the
/// stored state must be written again to say so (it was written at another interval, or
/// beyond the bound).
///
/// The units owed are kept across a change of interval, to the µs (rounded up: never less
/// owed than before). Up to 2·C·I is legitimate: past C·I is the debt a charge after the
/// answer leaves ([`charge`] never goes further). More can come only from a lowered burst (or
/// a store clock stepping back) on a state these rules wrote, which is held to 2·C·I: the
/// client waits out at most two bucket's worth, and no lowered limit gives anyone a fresh
/// quota. A state with no interval kept that is that far ahead (corruption, or a clock step
/// under an older version) reads as fresh, which admits at most C at once.
fn debt(p: &Params, state: &Option<State>, now: u64) -> (u64, bool) {
    let Some(s) = state else {
        return (0, false);
    };
    let bound = 2 * p.capacity * p.interval_us;
    let (d, rescaled) = at_interval(s.tat.saturating_sub(now), s.interval, p.interval_us);
    match d > bound {
        false => (d, rescaled),
        true if s.interval != 0 => (bound, true),
        true => (0, false),
    }
}

pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let full = c * i;
    let (debt, rewrite) = debt(p, state, now);
    let remaining = full.saturating_sub(debt) / i;
    if cost > c {
        return verdict(Code::CannotFit, c, remaining, 0, debt, None);
    }
    // A state read at another interval (or held to the bound) is written as read, so that
    // the wait a refusal states, and the reset any answer states, is what the next reading
    // finds. Nothing is charged.
    let mut restate = || {
        (commit && rewrite).then(|| {
            *state = Some(State {
                tat: now + debt,
                interval: i,
            });
            debt
        })
    };
    if cost == 0 {
        return verdict(Code::Allowed, c, remaining, 0, debt, restate());
    }
    let debt2 = debt + cost * i;
    if debt2 > full {
        return verdict(Code::Limited, c, remaining, debt2 - full, debt, restate());
    }
    let ttl = commit.then(|| {
        *state = Some(State {
            tat: now + debt2,
            interval: i,
        });
        debt2
    });
    verdict(Code::Allowed, c, (full - debt2) / i, 0, debt2, ttl)
}

/// Charge `cost` whatever is left (after the answer): the TAT may pass now + C·I, up to
/// now + 2·C·I. Always admitted.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let debt2 = (debt(p, state, now).0 + cost * i).min(2 * c * i);
    *state = Some(State {
        tat: now + debt2,
        interval: i,
    });
    let remaining = (c * i).saturating_sub(debt2) / i;
    verdict(Code::Allowed, c, remaining, 0, debt2, Some(debt2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, peek, step};
    use crate::limiter::algo::Algorithm::Gcra;
    use crate::limiter::algo::State as Any;

    const S: u64 = 1_000_000;

    #[test]
    fn golden_vector() {
        let p = params(Gcra, 5, 5 * S, None);
        assert_eq!((p.capacity, p.interval_us), (5, S));
        let t0 = 1_700_000_000 * S;
        let mut st = None;
        let left: Vec<u64> = (0..5)
            .map(|_| step(&p, &mut st, t0, 1).decision.remaining)
            .collect();
        assert_eq!(left, [4, 3, 2, 1, 0]);
        let d = step(&p, &mut st, t0, 1).decision;
        assert_eq!(
            (d.code, d.retry_after_us, d.reset_after_us),
            (Code::Limited, S, 5 * S)
        );
        let v = step(&p, &mut st, t0 + 3 * S, 1);
        assert_eq!((v.decision.code, v.decision.remaining), (Code::Allowed, 2));
        assert_eq!(
            (v.ttl_us, st),
            (
                Some(3 * S),
                Some(Any::Gcra(State {
                    tat: t0 + 6 * S,
                    interval: S
                }))
            )
        );
        let d = step(&p, &mut None, t0, 6).decision;
        assert_eq!((d.code, d.remaining), (Code::CannotFit, 5));
    }

    #[test]
    fn tat_in_the_past_is_now_and_beyond_twice_capacity_is_fresh_unless_written_here() {
        let p = params(Gcra, 5, 5 * S, None);
        let now = 1_700_000_000 * S;
        let at = |tat, interval| Some(Any::Gcra(State { tat, interval }));
        for tat in [0, now - 1, now + 10 * S + 1, u64::MAX] {
            let d = step(&p, &mut at(tat, 0), now, 1).decision;
            assert_eq!(d.remaining, 4, "{tat}");
        }
        let d = step(&p, &mut at(now + 5 * S, 0), now, 1).decision;
        assert_eq!((d.code, d.retry_after_us), (Code::Limited, S));
        // Written by these rules (its interval kept), it is held to 2·C·I and written so.
        let mut st = at(now + 60 * S, S);
        let v = step(&p, &mut st, now, 1);
        assert_eq!(
            (v.decision.code, v.decision.retry_after_us, v.ttl_us),
            (Code::Limited, 6 * S, Some(10 * S))
        );
        assert_eq!(st, at(now + 10 * S, S));
    }

    /// A new rate keeps the units owed, not the time: `60/1m` exhausted, then tightened to
    /// `60/1h`, owes 60 units of a minute each (it gave 59 of 60 back when the 60 s owed
    /// were read at the new interval); loosened back, it owes 60 of a second each.
    #[test]
    fn a_new_interval_keeps_the_units_owed() {
        let fast = params(Gcra, 60, 60 * S, None);
        let slow = params(Gcra, 60, 3600 * S, None);
        let now = 1_700_000_000 * S;
        let mut st = None;
        step(&fast, &mut st, now, 60);
        assert!(!step(&fast, &mut st, now, 1).decision.allowed());
        let v = step(&slow, &mut st, now, 1);
        assert_eq!(
            (
                v.decision.code,
                v.decision.remaining,
                v.decision.retry_after_us
            ),
            (Code::Limited, 0, 60 * S)
        );
        // Restated at the new interval: the wait it gave is the one found next.
        assert_eq!(
            st,
            Some(Any::Gcra(State {
                tat: now + 3600 * S,
                interval: 60 * S
            }))
        );
        let d = step(&slow, &mut st, now + 60 * S, 1).decision;
        assert_eq!((d.code, d.remaining), (Code::Allowed, 0));
        // Half a unit owed stays half a unit: 30.5 s at 1 s each is 30.5 units, 30.5 min.
        let mut st = Some(Any::Gcra(State {
            tat: now + 30 * S + S / 2,
            interval: S,
        }));
        let before = st.clone();
        // A peek (no commit) writes nothing.
        assert_eq!(peek(&slow, &st, now, 0).remaining, 60 - 31);
        assert_eq!(st, before);
        let v = step(&slow, &mut st, now, 0);
        assert_eq!(
            (v.decision.remaining, v.ttl_us),
            (60 - 31, Some(30 * 60 * S + 30 * S))
        );
        // Read back and forth under two rates (two gateways mid-rollout), time owed still
        // runs out: a refill of a tenth of a unit between reads is kept, not rounded away.
        let mut st = Some(Any::Gcra(State {
            tat: now + 10 * S,
            interval: S,
        }));
        let mut t = now;
        for k in 0..200 {
            t += S / 10;
            let p = if k % 2 == 0 { &slow } else { &fast };
            step(p, &mut st, t, 0);
        }
        assert_eq!(
            peek(&fast, &st, t, 0).remaining,
            60,
            "20 s later, 10 s owed are gone"
        );
    }
}
