//! GCRA: one theoretical arrival time (TAT). With tat = max(stored, now), a request of cost c
//! is admitted iff now ≥ tat + c·I − C·I, and then TAT becomes tat + c·I. Every decision
//! equals token_bucket's with the same C and I (tokens = floor((C·I − (tat − now)) / I)).
use super::{verdict, Code, Params, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub tat: u64,
}

/// How far the bucket is from full at `now`, in µs: tat − now ∈ [0, 2·C·I]. Past C·I is the
/// debt a charge after the answer leaves ([`charge`] never goes further). A TAT more than
/// 2·C·I ahead cannot come from these rules under a monotone clock (only from corruption, a
/// store clock stepping back, or a lowered burst): it reads as fresh, which admits at most C
/// at once. Clamping it instead would lock the key until the stored TAT (a limited request
/// writes nothing, so a clamp would never stick and retry would lie).
fn debt(p: &Params, state: &Option<State>, now: u64) -> u64 {
    match state {
        Some(s) if s.tat.saturating_sub(now) <= 2 * p.capacity * p.interval_us => {
            s.tat.saturating_sub(now)
        }
        _ => 0,
    }
}

pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let full = c * i;
    let debt = debt(p, state, now);
    let remaining = full.saturating_sub(debt) / i;
    if cost > c {
        return verdict(Code::CannotFit, c, remaining, 0, debt, None);
    }
    if cost == 0 {
        return verdict(Code::Allowed, c, remaining, 0, debt, None);
    }
    let debt2 = debt + cost * i;
    if debt2 > full {
        return verdict(Code::Limited, c, remaining, debt2 - full, debt, None);
    }
    let ttl = commit.then(|| {
        *state = Some(State { tat: now + debt2 });
        debt2
    });
    verdict(Code::Allowed, c, (full - debt2) / i, 0, debt2, ttl)
}

/// Charge `cost` whatever is left (after the answer): the TAT may pass now + C·I, up to
/// now + 2·C·I. Always admitted.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let (c, i) = (p.capacity, p.interval_us);
    let debt2 = (debt(p, state, now) + cost * i).min(2 * c * i);
    *state = Some(State { tat: now + debt2 });
    let remaining = (c * i).saturating_sub(debt2) / i;
    verdict(Code::Allowed, c, remaining, 0, debt2, Some(debt2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::testkit::{params, step};
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
            (Some(3 * S), Some(Any::Gcra(State { tat: t0 + 6 * S })))
        );
        let d = step(&p, &mut None, t0, 6).decision;
        assert_eq!((d.code, d.remaining), (Code::CannotFit, 5));
    }

    #[test]
    fn tat_in_the_past_is_now_and_beyond_twice_capacity_is_fresh() {
        let p = params(Gcra, 5, 5 * S, None);
        let now = 1_700_000_000 * S;
        for tat in [0, now - 1, now + 10 * S + 1, u64::MAX] {
            let d = step(&p, &mut Some(Any::Gcra(State { tat })), now, 1).decision;
            assert_eq!(d.remaining, 4, "{tat}");
        }
        let d = step(&p, &mut Some(Any::Gcra(State { tat: now + 5 * S })), now, 1).decision;
        assert_eq!((d.code, d.retry_after_us), (Code::Limited, S));
    }
}
