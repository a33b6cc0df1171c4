//! Test helpers: every decision made through [`step`] is checked against the contract that
//! all six algorithms share (dry run = commit, code 2 writes nothing, a limit at most restates
//! the state as read, peeks write
//! nothing, admitted iff cost ≤ remaining, exact retry and reset, TTL leaves a fresh key).
use super::{charge, decide, Algorithm, Code, Decision, Params, State, Verdict};

pub(crate) fn params(a: Algorithm, n: u64, w: u64, burst: Option<u64>) -> Params {
    Params::new(a, n, w, burst).expect("valid params")
}

/// A dry run that must leave the state as it was.
pub(crate) fn peek(p: &Params, st: &Option<State>, now: u64, cost: u64) -> Decision {
    let mut copy = st.clone();
    let v = decide(p, &mut copy, now, cost, false);
    assert_eq!(&copy, st, "dry run changed the state");
    assert_eq!(v.ttl_us, None, "dry run reported a write");
    v.decision
}

/// A decision that charged nothing but wrote: only an algorithm that restates, and only the
/// state as it read before (for costs 0, 1 and `cost`), kept at least until it is full again.
fn restated(p: &Params, st: &Option<State>, before: &Option<State>, now: u64, ttl: u64, cost: u64) {
    assert!(
        p.algorithm.restates(),
        "{:?} wrote without charging",
        p.algorithm
    );
    for c in [0, 1, cost] {
        assert_eq!(peek(p, st, now, c), peek(p, before, now, c), "restated");
    }
    assert!(
        ttl >= 1 && ttl >= peek(p, st, now, 0).reset_after_us,
        "restated for {ttl} µs"
    );
}

/// Decide and commit one request, asserting the shared contract around it.
pub(crate) fn step(p: &Params, st: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let before = st.clone();
    let dry = peek(p, st, now, cost);
    let now0 = peek(p, st, now, 0);
    let v = decide(p, st, now, cost, true);
    let d = v.decision;
    assert_eq!(d, dry, "commit and dry run disagree");
    assert_eq!(d.limit, p.capacity);
    assert!(d.remaining <= d.limit);
    assert!(now0.allowed() && now0.retry_after_us == 0);
    let unchanged = |st: &Option<State>| assert_eq!(st, &before, "{d:?} changed the state");
    match d.code {
        Code::CannotFit => {
            assert!(cost > p.capacity);
            assert_eq!((d.retry_after_us, v.ttl_us), (0, None));
            unchanged(st);
        }
        Code::Limited => {
            assert!(cost > now0.remaining && cost <= p.capacity);
            match v.ttl_us {
                None => unchanged(st),
                // A restatement only (GCRA read at another interval, or held to its bound):
                // the state reads now exactly as it did.
                Some(ttl) => restated(p, st, &before, now, ttl, cost),
            }
            let r = d.retry_after_us;
            assert!(r > 0);
            assert_eq!(
                peek(p, st, now + r - 1, cost).code,
                Code::Limited,
                "retry too long"
            );
            assert!(
                peek(p, st, now + r, cost).allowed(),
                "retry too short: {d:?}"
            );
        }
        Code::Allowed => {
            assert!(cost <= now0.remaining, "admitted beyond remaining");
            assert_eq!((d.remaining, d.retry_after_us), (now0.remaining - cost, 0));
            if cost == 0 {
                match v.ttl_us {
                    None => unchanged(st),
                    Some(ttl) => restated(p, st, &before, now, ttl, p.capacity),
                }
            } else {
                let ttl = v.ttl_us.expect("an admission writes");
                assert!(ttl >= 1 && ttl >= d.reset_after_us);
                for c in [0, 1, p.capacity] {
                    let later = now + ttl;
                    assert_eq!(
                        peek(p, st, later, c),
                        peek(p, &None, later, c),
                        "alive past TTL"
                    );
                }
            }
        }
    }
    let full = peek(p, st, now, 0);
    assert_eq!(
        (full.remaining, full.reset_after_us),
        (d.remaining, d.reset_after_us)
    );
    if d.allowed() && d.remaining == 0 {
        let next = peek(p, st, now, 1);
        match super::refusal_after(p, &d) {
            Some(cached) => assert_eq!(cached, next, "the deny cache would answer otherwise"),
            None => assert!(
                matches!(
                    p.algorithm,
                    Algorithm::SlidingLog | Algorithm::SlidingWindow
                ) || next.allowed()
                    // A fixed window that may carry a charge's debt into the next.
                    || (p.algorithm == Algorithm::FixedWindow
                        && d.reset_after_us
                            > if p.month {
                                28 * super::calendar::DAY_US - 1
                            } else {
                                p.window_us
                            }),
                "{:?} says nothing about its next refusal: {d:?}",
                p.algorithm
            ),
        }
    }
    if full.reset_after_us == 0 {
        assert_eq!(full.remaining, full.limit, "not full but reset 0");
    } else {
        let r = full.reset_after_us;
        assert!(
            peek(p, st, now + r - 1, 0).remaining < full.limit,
            "reset too long"
        );
        assert_eq!(
            peek(p, st, now + r, 0).remaining,
            full.limit,
            "reset too short"
        );
    }
    v
}

/// Charge `cost` after the answer, asserting what a charge promises: admitted; what fits is
/// charged as an ordinary request would be; otherwise `remaining` is 0 and the state is no
/// further from full than one more capacity (buckets) or the window's quota (windows).
pub(crate) fn charge_step(p: &Params, st: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    let before = peek(p, st, now, cost);
    let v = charge(p, st, now, cost);
    let d = v.decision;
    assert_eq!(d.code, Code::Allowed, "a charge is always admitted");
    if before.allowed() {
        assert_eq!(d, before, "a charge that fits is an ordinary request");
    } else {
        assert_eq!(d.remaining, 0, "{d:?}");
    }
    let after = peek(p, st, now, 0);
    assert_eq!(
        (after.remaining, after.reset_after_us),
        (d.remaining, d.reset_after_us)
    );
    if cost > 0 && (p.algorithm.is_bucket() || before.remaining > 0) {
        let ttl = v.ttl_us.expect("a charge writes");
        assert!(ttl >= 1 && ttl >= d.reset_after_us);
        assert!(ttl <= 2 * p.capacity * p.interval_us + p.window_us, "{ttl}");
        let later = now + ttl;
        assert_eq!(
            peek(p, st, later, 1),
            peek(p, &None, later, 1),
            "alive past TTL"
        );
    }
    v
}
