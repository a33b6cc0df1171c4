//! Concurrency: at most `max` requests of a key in flight at once. Each admitted request holds
//! a lease (its id, valid until an expiry) that it releases when its answer is done; a lease
//! its gateway never released (the process died) frees itself at its expiry, and a gateway
//! renews the leases of long answers. Not a rate: nothing refills with time, so a refusal's
//! retry is a fixed 1 s (a slot may free at any moment).
//!
//! `limit` is `max` and `window_us` the lease. Twin of `lua/concurrency.lua` (a sorted set of
//! lease ids scored by expiry).
use super::{verdict, Code, Params, Verdict};

/// What a refused request is told to wait: slots free whenever answers end.
pub const RETRY_US: u64 = 1_000_000;

/// The live leases of one key: (expiry µs, lease id).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub leases: Vec<(u64, u64)>,
}

impl State {
    fn live(&self, now: u64) -> u64 {
        self.leases.iter().filter(|(exp, _)| *exp > now).count() as u64
    }

    /// The longest a lease here lives: how long the key must be kept.
    fn last(&self, now: u64) -> u64 {
        let last = self.leases.iter().map(|(exp, _)| *exp).max();
        last.unwrap_or(now).saturating_sub(now)
    }
}

/// Take a slot for lease `id` (cost 1; cost 0 only looks). Admitted iff fewer than `max` live
/// leases; with `commit`, the expired ones are dropped and `id` holds a slot until now + lease.
pub fn decide(
    p: &Params,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    commit: bool,
    id: u64,
) -> Verdict {
    let max = p.limit;
    let live = state.as_ref().map_or(0, |s| s.live(now));
    let free = max.saturating_sub(live);
    if cost == 0 {
        return verdict(Code::Allowed, max, free, 0, 0, None);
    }
    if cost > free {
        return verdict(Code::Limited, max, free, RETRY_US, 0, None);
    }
    let ttl = commit.then(|| {
        let s = state.get_or_insert_with(State::default);
        s.leases.retain(|(exp, _)| *exp > now);
        s.leases.push((now + p.window_us, id));
        p.window_us
    });
    verdict(Code::Allowed, max, free - 1, 0, 0, ttl)
}

/// Free lease `id`'s slot. Reports the slots free afterwards; the key goes when none is held.
pub fn release(p: &Params, state: &mut Option<State>, now: u64, id: u64) -> Verdict {
    if let Some(s) = state.as_mut() {
        s.leases.retain(|&(exp, l)| exp > now && l != id);
    }
    finish(p, state, now)
}

/// Push lease `id`'s expiry to now + lease, if it is still held (an expired lease is not
/// taken back: its slot may have gone to another request meanwhile).
pub fn renew(p: &Params, state: &mut Option<State>, now: u64, id: u64) -> Verdict {
    if let Some(s) = state.as_mut() {
        for lease in s.leases.iter_mut() {
            if lease.1 == id && lease.0 > now {
                lease.0 = now + p.window_us;
            }
        }
    }
    finish(p, state, now)
}

fn finish(p: &Params, state: &mut Option<State>, now: u64) -> Verdict {
    let live = state.as_ref().map_or(0, |s| s.live(now));
    let ttl = state.as_ref().map(|s| s.last(now)).filter(|&t| t > 0);
    if ttl.is_none() {
        *state = None;
    }
    let free = p.limit.saturating_sub(live);
    verdict(Code::Allowed, p.limit, free, 0, 0, ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn p(max: u64, lease_s: u64) -> Params {
        Params::concurrency(max, lease_s * S).expect("valid")
    }

    #[test]
    fn at_most_max_until_released_or_expired() {
        let p = p(2, 30);
        let (mut st, now) = (None, 1_700_000_000 * S);
        let d = |v: Verdict| (v.decision.code, v.decision.remaining);
        assert_eq!(d(decide(&p, &mut st, now, 1, true, 1)), (Code::Allowed, 1));
        assert_eq!(d(decide(&p, &mut st, now, 1, true, 2)), (Code::Allowed, 0));
        let refused = decide(&p, &mut st, now, 1, true, 3);
        assert_eq!(d(refused), (Code::Limited, 0));
        assert_eq!(refused.decision.retry_after_us, RETRY_US);
        assert_eq!(d(release(&p, &mut st, now, 1)), (Code::Allowed, 1));
        assert_eq!(d(decide(&p, &mut st, now, 1, true, 3)), (Code::Allowed, 0));
        // Lease 2 is renewed at +20 s; lease 3 is not and expires at +30 s.
        assert_eq!(d(renew(&p, &mut st, now + 20 * S, 2)), (Code::Allowed, 0));
        assert_eq!(
            d(decide(&p, &mut st, now + 30 * S, 0, false, 0)),
            (Code::Allowed, 1)
        );
        assert_eq!(
            d(decide(&p, &mut st, now + 50 * S, 0, false, 0)),
            (Code::Allowed, 2)
        );
        // An expired lease is not renewed back into a slot.
        assert_eq!(d(renew(&p, &mut st, now + 60 * S, 2)), (Code::Allowed, 2));
        assert_eq!(st, None);
    }

    #[test]
    fn a_dry_run_and_a_foreign_release_change_nothing() {
        let p = p(1, 10);
        let (mut st, now) = (None, 5 * S);
        decide(&p, &mut st, now, 1, false, 1);
        assert_eq!(st, None);
        decide(&p, &mut st, now, 1, true, 1);
        let before = st.clone();
        assert_eq!(release(&p, &mut st, now, 9).ttl_us, Some(10 * S));
        assert_eq!(st, before);
    }
}
