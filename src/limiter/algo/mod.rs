//! The six limiter algorithms as pure integer functions over an explicit state.
//!
//! This is the single source of truth for the arithmetic: the embedded store runs these
//! functions directly, and every Lua script in `lua/` is tested against them on the same
//! request sequences. Everything is integer microseconds; nothing here reads a clock.
//!
//! Contract (see ALGORITHMS.md): `decide` never mutates state for a limited request or a
//! cost that can never fit (code 2); it returns the state to store when the request is
//! admitted, or `None` when the resulting state is "empty" (the key should be deleted).

pub mod calendar;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

#[cfg(test)]
pub(crate) mod testkit;

pub use crate::model::params::{Algorithm, Params, ParamsError, MAX_EXACT};

/// Run `$body` on `$state` as the state of algorithm variant `$v`, bound to `$own`. A state of
/// another variant (cannot happen with well-formed keys) reads as none, and is put back
/// unless the call wrote over it. The one way every entry point below reaches a state.
macro_rules! on_state {
    ($state:expr, $v:ident, |$own:ident| $body:expr) => {{
        let (mut $own, foreign) = match $state.take() {
            Some(State::$v(s)) => (Some(s), None),
            other => (None, other),
        };
        let verdict = $body;
        *$state = $own.map(State::$v).or(foreign);
        verdict
    }};
}

/// Outcome code of one decision, as returned by every Lua script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Allowed = 0,
    Limited = 1,
    /// The cost exceeds the capacity: it can never be admitted. State untouched.
    CannotFit = 2,
}

impl Code {
    pub fn from_i64(v: i64) -> Option<Code> {
        match v {
            0 => Some(Code::Allowed),
            1 => Some(Code::Limited),
            2 => Some(Code::CannotFit),
            _ => None,
        }
    }
}

/// `{code, limit, remaining, retry_after_us, reset_after_us}`: the reply of every algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub code: Code,
    /// The quota shown to clients: N for window algorithms, the capacity for buckets.
    pub limit: u64,
    /// Floored, never negative; for an admitted request, after the admission.
    pub remaining: u64,
    /// 0 when admitted; otherwise the exact wait after which the same request alone passes.
    pub retry_after_us: u64,
    /// Time until the limit is back to its full quota if nothing else arrives.
    pub reset_after_us: u64,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.code == Code::Allowed
    }

    /// Whether this decision is the one to advertise over `other` (SPEC §4): the lower
    /// `remaining`, and of two equal, the longer reset.
    pub fn tighter_than(&self, other: &Decision) -> bool {
        (self.remaining, std::cmp::Reverse(self.reset_after_us))
            < (other.remaining, std::cmp::Reverse(other.reset_after_us))
    }
}

/// After an admission that left nothing (`remaining` 0), the decision a cost-1 request would
/// get at the same instant, where the reply alone says it exactly: a bucket has its first unit
/// back C − 1 intervals before it is full again, a fixed window at its end (unless it may
/// carry debt into the next). The sliding algorithms' replies do not say when their first
/// unit frees (`None`).
///
/// The deny cache keeps this: other gateways only consume, so nothing is admitted sooner.
pub fn refusal_after(p: &Params, d: &Decision) -> Option<Decision> {
    if !d.allowed() || d.remaining > 0 {
        return None;
    }
    let wait = match p.algorithm {
        a if a.is_bucket() => d
            .reset_after_us
            .saturating_sub((p.capacity - 1) * p.interval_us),
        // Past N (a charge's debt) the reply's reset is the next window's end, and the first
        // unit may be back sooner, at this one's: said only by a reset no debt can have.
        Algorithm::FixedWindow => {
            let debt_from = if p.month {
                28 * calendar::DAY_US
            } else {
                p.window_us + 1
            };
            if d.reset_after_us >= debt_from {
                return None;
            }
            d.reset_after_us
        }
        _ => return None,
    };
    (wait > 0).then_some(Decision {
        code: Code::Limited,
        retry_after_us: wait,
        ..*d
    })
}

/// Limiter state of one key, whatever the algorithm (the embedded store keeps these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingLog(sliding_log::State),
    SlidingWindow(sliding_window::State),
    TokenBucket(token_bucket::State),
    LeakyBucket(leaky_bucket::State),
    Gcra(gcra::State),
    Concurrency(concurrency::State),
}

/// What a store call does with one limit (see `lua/decide.lua`, which takes the same codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Op {
    /// Admit `cost` iff it fits, and charge it (a concurrency limit takes a slot).
    #[default]
    Decide = 0,
    /// Admit iff `cost` would fit, charge nothing (a limit charged by the answer, before it).
    Probe = 1,
    /// Charge `cost` even past the limit, into debt (the charge after the answer). Admitted.
    Charge = 2,
    /// Free the request's concurrency slot.
    Release = 3,
    /// Extend the request's concurrency lease.
    Renew = 4,
}

impl Op {
    /// Whether the request's admission depends on this call (the others always pass).
    pub fn decides(self) -> bool {
        matches!(self, Op::Decide | Op::Probe)
    }
}

/// One store operation on one limit: `op` at `now`, writing only when `write` (the first,
/// dry pass of an all-or-nothing call has it false). `id` names the request's concurrency
/// lease. This is what the embedded store runs for every call; `lua/decide.lua` is its twin.
pub fn run(
    p: &Params,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    op: Op,
    id: u64,
    write: bool,
) -> Verdict {
    if p.algorithm == Algorithm::Concurrency {
        return on_state!(state, Concurrency, |own| match op {
            Op::Decide | Op::Probe => {
                concurrency::decide(p, &mut own, now, cost, write && op == Op::Decide, id)
            }
            Op::Release if write => concurrency::release(p, &mut own, now, id),
            Op::Renew if write => concurrency::renew(p, &mut own, now, id),
            _ => concurrency::decide(p, &mut own.clone(), now, 0, false, id),
        });
    }
    match op {
        Op::Decide => decide(p, state, now, cost, write),
        Op::Charge if write && cost > 0 => charge(p, state, now, cost),
        Op::Charge => decide(p, state, now, 0, false),
        Op::Probe => probe(p, state, now, cost, write),
        Op::Release | Op::Renew => decide(p, state, now, cost, false),
    }
}

/// Whether `cost` would pass (its code and wait), with what is there now (the remaining and
/// reset of a cost-0 look): a probe charges nothing, so the state it advertises is the one it
/// leaves, not the one a cost-1 admission would. The look commits with `write`, which charges
/// nothing but restates a state read under other parameters.
fn probe(p: &Params, state: &mut Option<State>, now: u64, cost: u64, write: bool) -> Verdict {
    let would = decide(p, state, now, cost, false).decision;
    let mut there = decide(p, state, now, 0, write);
    there.decision.code = would.code;
    there.decision.retry_after_us = would.retry_after_us;
    there
}

/// Charge `cost` whatever is left (after the answer; always admitted, `remaining` 0 when it
/// did not fit), so the long-run rate holds: each algorithm goes into debt, at most one
/// capacity of it, that later requests wait out. Buckets keep it as tokens owed; a fixed
/// window counts up to 2N and carries the excess into the next window; a sliding window's
/// count up to 2N weighs on the next window; a sliding log keeps up to 2N entries.
pub fn charge(p: &Params, state: &mut Option<State>, now: u64, cost: u64) -> Verdict {
    if cost == 0 {
        return decide(p, state, now, 0, false);
    }
    macro_rules! charge {
        ($m:ident, $v:ident) => {
            on_state!(state, $v, |own| $m::charge(p, &mut own, now, cost))
        };
    }
    match p.algorithm {
        Algorithm::FixedWindow => charge!(fixed_window, FixedWindow),
        Algorithm::SlidingLog => charge!(sliding_log, SlidingLog),
        Algorithm::SlidingWindow => charge!(sliding_window, SlidingWindow),
        Algorithm::TokenBucket => charge!(token_bucket, TokenBucket),
        Algorithm::LeakyBucket => charge!(leaky_bucket, LeakyBucket),
        Algorithm::Gcra => charge!(gcra, Gcra),
        Algorithm::Concurrency => decide(p, state, now, 0, false),
    }
}

/// What one call to [`decide`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// When the call committed a write: how long the key must live (µs from now; the store
    /// rounds up). `None` when nothing was written or the state was deleted (empty/full).
    pub ttl_us: Option<u64>,
}

/// Assemble a [`Verdict`]; shared by the algorithm modules.
pub(crate) fn verdict(
    code: Code,
    limit: u64,
    remaining: u64,
    retry_after_us: u64,
    reset_after_us: u64,
    ttl_us: Option<u64>,
) -> Verdict {
    Verdict {
        decision: Decision {
            code,
            limit,
            remaining,
            retry_after_us,
            reset_after_us,
        },
        ttl_us,
    }
}

/// Time owed `d` µs, written at interval `was` (0: not known, a state of an older version),
/// in µs at interval `i`: the units owed kept to the µs, rounded up (never less owed than
/// before; a part unit stays the same part, so two gateways running two rates during a
/// rollout refill nobody), and whether that changed it. GCRA's TAT and token_bucket's debt;
/// twin of `rescale` in `lua/lib.lua`.
fn at_interval(d: u64, was: u64, i: u64) -> (u64, bool) {
    if was == 0 || was == i || d == 0 {
        return (d, false);
    }
    let scaled = (u128::from(d) * u128::from(i)).div_ceil(u128::from(was));
    (u64::try_from(scaled).unwrap_or(u64::MAX), true)
}

/// Decide one request of `cost` units at store time `now` (µs).
///
/// With `commit == false` this is a dry run: `state` is left exactly as it was whatever the
/// outcome. With `commit == true`, an admitted request updates `state` (possibly to `None`,
/// meaning "delete the key"); a code-2 request never changes it, and a limited one only
/// restates it as read (time owed read at another interval: [`gcra`], [`token_bucket`]). A
/// state of the wrong variant (cannot happen with well-formed keys) counts as fresh.
pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    macro_rules! run {
        ($m:ident, $v:ident) => {
            on_state!(state, $v, |own| $m::decide(p, &mut own, now, cost, commit))
        };
    }
    match p.algorithm {
        Algorithm::FixedWindow => run!(fixed_window, FixedWindow),
        Algorithm::SlidingLog => run!(sliding_log, SlidingLog),
        Algorithm::SlidingWindow => run!(sliding_window, SlidingWindow),
        Algorithm::TokenBucket => run!(token_bucket, TokenBucket),
        Algorithm::LeakyBucket => run!(leaky_bucket, LeakyBucket),
        Algorithm::Gcra => run!(gcra, Gcra),
        // No lease id here: the admin peek and tests; requests go through [`run`].
        Algorithm::Concurrency => run(p, state, now, cost, Op::Decide, 0, commit),
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::{charge_step, params, peek, step};
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;
    const YEAR: u64 = 365 * 86_400 * S;

    /// SPEC §4: the lowest `remaining` is advertised; of two equal, the longest reset (a
    /// client waiting for the shorter one would be refused by the other).
    #[test]
    fn the_tighter_decision_is_the_lower_remaining_then_the_longer_reset() {
        let d = |remaining, reset_after_us| Decision {
            code: Code::Allowed,
            limit: 10,
            remaining,
            retry_after_us: 0,
            reset_after_us,
        };
        assert!(d(0, 7 * S).tighter_than(&d(1, 84 * S)));
        assert!(d(0, 84 * S).tighter_than(&d(0, 7 * S)));
        assert!(!d(0, 7 * S).tighter_than(&d(0, 84 * S)));
        assert!(
            !d(0, 7 * S).tighter_than(&d(0, 7 * S)),
            "not over an equal one"
        );
    }

    fn algorithm() -> impl Strategy<Value = Algorithm> {
        proptest::sample::select(Algorithm::ALL.to_vec())
    }

    /// Gaps between requests: same µs, sub-interval, around a window, long idle.
    fn schedule() -> impl Strategy<Value = Vec<(u64, u64)>> {
        let gap = prop_oneof![Just(0u64), 0u64..2_000, 0u64..3 * S, 0u64..30 * S];
        proptest::collection::vec((gap, any::<u64>()), 1..60)
    }

    /// Mostly small costs, sometimes anything in 0..=C+1 (so code 2 shows up).
    fn cost(raw: u64, cap: u64) -> u64 {
        if raw & 1 == 0 {
            (raw >> 1) % 3
        } else {
            (raw >> 1) % (cap + 2)
        }
    }

    proptest! {
        #[test]
        fn every_algorithm_keeps_the_contract(
            a in algorithm(),
            n in prop_oneof![1u64..20, 1u64..=10_000_000],
            w in prop_oneof![S..10 * S, S..=Params::MAX_WINDOW_US],
            burst in proptest::option::of(1u64..40),
            start in 0u64..1 << 52,
            sched in schedule(),
        ) {
            let n = if a == Algorithm::SlidingLog { n.min(200) } else { n };
            let burst = burst.filter(|_| a.is_bucket());
            let Ok(p) = Params::new(a, n, w, burst) else { return Ok(()) };
            let mut st = None;
            let mut now = start;
            for (dt, raw) in sched {
                now += dt;
                step(&p, &mut st, now, cost(raw, p.capacity));
            }
        }

        #[test]
        fn buckets_and_gcra_decide_alike(
            n in 1u64..30,
            w in S..10 * S,
            burst in proptest::option::of(1u64..40),
            start in 0u64..1 << 52,
            sched in schedule(),
        ) {
            let ps = [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra]
                .map(|a| params(a, n, w, burst));
            let mut states: [Option<State>; 3] = Default::default();
            let mut now = start;
            for (dt, raw) in sched {
                now += dt;
                // Every fourth request is a charge after the answer, of up to 2C + 1.
                let charged = raw % 4 == 3;
                let c = if charged { (raw >> 2) % (2 * ps[0].capacity + 2) } else { cost(raw, ps[0].capacity) };
                let v: Vec<Verdict> = ps.iter().zip(&mut states).map(|(p, s)| {
                    if charged { charge_step(p, s, now, c) } else { step(p, s, now, c) }
                }).collect();
                prop_assert_eq!(v[0], v[1]);
                prop_assert_eq!(v[0], v[2]);
            }
        }

        /// Charges after the answer keep every algorithm's contract too (they are checked by
        /// `charge_step`), interleaved with ordinary requests and probes.
        #[test]
        fn charges_and_probes_keep_the_contract(
            a in algorithm(),
            n in 1u64..20,
            w in S..10 * S,
            start in 0u64..1 << 52,
            sched in schedule(),
        ) {
            let p = params(a, n, w, None);
            let (mut st, mut now) = (None, start);
            for (dt, raw) in sched {
                now += dt;
                let c = cost(raw >> 2, p.capacity);
                match raw % 4 {
                    0 => { charge_step(&p, &mut st, now, c); }
                    1 => {
                        let before = st.clone();
                        let probe = run(&p, &mut st, now, c, Op::Probe, 0, true);
                        prop_assert_eq!(&st, &before);
                        let (would, there) = (peek(&p, &st, now, c), peek(&p, &st, now, 0));
                        prop_assert_eq!(
                            (probe.decision.code, probe.decision.retry_after_us),
                            (would.code, would.retry_after_us)
                        );
                        prop_assert_eq!(
                            (probe.decision.remaining, probe.decision.reset_after_us),
                            (there.remaining, there.reset_after_us)
                        );
                    }
                    _ => { step(&p, &mut st, now, c); }
                }
            }
        }
    }

    /// A charge that does not fit leaves the state in debt that a cost-1 request waits out
    /// exactly, at most one capacity of it.
    #[test]
    fn a_charge_past_the_limit_is_waited_out() {
        let t0 = 1_700_000_000 * S;
        for a in Algorithm::ALL {
            let p = params(a, 5, 5 * S, None);
            let mut st = None;
            step(&p, &mut st, t0, 1);
            let v = charge_step(&p, &mut st, t0, 8);
            assert_eq!((v.decision.code, v.decision.remaining), (Code::Allowed, 0));
            let d = peek(&p, &st, t0, 1);
            let want = match a {
                // 9 in this window weigh on the next until 9·(W − e') ≤ 4·W: e' ≥ 5/9 W.
                Algorithm::SlidingWindow => 5 * S + 5 * S - 4 * 5 * S / 9,
                // Buckets: 1 + 8 taken from 5 is 4 owed, and the next token after them. A
                // fixed window carries the 4 into the next one, where 1 more fits; a log's 9
                // entries of now age out together.
                _ => 5 * S,
            };
            assert_eq!((d.code, d.retry_after_us), (Code::Limited, want), "{a:?}");
            // The debt is at most one capacity: a charge of 100 waits it all out.
            charge_step(&p, &mut st, t0, 100);
            let want = match a {
                // 2C owed: the sixth token comes 6 intervals on.
                _ if a.is_bucket() => 6 * S,
                // 2N: the next window starts full, the one after empty.
                Algorithm::FixedWindow => 10 * S,
                // 10 weigh on the next window until 10·(W − e') ≤ 4·W: e' ≥ 3/5 W.
                Algorithm::SlidingWindow => 5 * S + 3 * S,
                // 10 entries of now: all age out at once.
                _ => 5 * S,
            };
            assert_eq!(peek(&p, &st, t0, 1).retry_after_us, want, "{a:?}");
        }
    }

    #[test]
    fn extreme_params_decide_without_overflow() {
        for a in Algorithm::ALL {
            let n = if a == Algorithm::SlidingLog {
                Params::MAX_SLIDING_LOG
            } else {
                10_000_000
            };
            for w in [Params::MIN_WINDOW_US, 7 * 86_400 * S, Params::MAX_WINDOW_US] {
                // sliding_window's N·W (in ms) passes 2^53 past about 10 days at N = 10^7:
                // refused as an overflow, the only combination in range that is.
                let Ok(p) = Params::new(a, n, w, None) else {
                    assert_eq!(a, Algorithm::SlidingWindow, "{w}");
                    assert!(w > 7 * 86_400 * S);
                    continue;
                };
                let mut st = None;
                for now in [0, 1, w - 1, w, 56 * YEAR, 56 * YEAR + w / 3, 200 * YEAR] {
                    for cost in [1, n, 0, n + 1, 1] {
                        step(&p, &mut st, now, cost);
                    }
                }
                let d = step(&p, &mut None, 60 * YEAR, n).decision;
                assert_eq!((d.code, d.remaining), (Code::Allowed, 0), "{a:?} {w}");
            }
        }
    }

    /// Corrupt, ancient and future states (trap 7) for each algorithm, at `now`.
    fn garbage(p: &Params, now: u64) -> Vec<State> {
        let (m, k, full) = (u64::MAX, now / p.window_us, p.capacity * p.interval_us);
        let future = now + 3 * p.window_us;
        match p.algorithm {
            Algorithm::FixedWindow => [(k, m), (m, m), (0, m), (k + 1, 0), (k, 0)]
                .map(|(window, count)| State::FixedWindow(fixed_window::State { window, count }))
                .to_vec(),
            Algorithm::SlidingLog => [
                vec![m, 0, future, now],
                vec![m; 3],
                vec![0; 5],
                vec![now; 1],
            ]
            .map(|e| State::SlidingLog(sliding_log::State::from_entries(e)))
            .to_vec(),
            Algorithm::SlidingWindow => [
                (k, m, m),
                (m, m, m),
                (k - 1, m, 0),
                (k + 1, 0, 0),
                (k, 0, m),
            ]
            .map(|(window, cur, prev)| {
                State::SlidingWindow(sliding_window::State { window, cur, prev })
            })
            .to_vec(),
            Algorithm::TokenBucket => [
                (m, 0),
                (m, m),
                (0, m),
                (m, now - 20 * YEAR),
                (m, future),
                (0, 0),
            ]
            .map(|(tokens, t)| {
                State::TokenBucket(token_bucket::State {
                    tokens,
                    t,
                    interval: 0,
                })
            })
            .to_vec(),
            Algorithm::LeakyBucket => [(m, 0), (0, m), (m, m), (0, now - 20 * YEAR), (0, future)]
                .map(|(level, t)| State::LeakyBucket(leaky_bucket::State { level, t }))
                .to_vec(),
            Algorithm::Gcra => [0, m, now + full, now + full + 1, now - 20 * YEAR, future]
                .map(|tat| State::Gcra(gcra::State { tat, interval: 0 }))
                .to_vec(),
            Algorithm::Concurrency => vec![],
        }
    }

    #[test]
    fn garbage_and_clock_steps_never_admit_more_than_capacity() {
        let now = 56 * YEAR + 123_456;
        for a in Algorithm::ALL {
            let p = params(a, 4, 10 * S, None);
            for g in garbage(&p, now) {
                let mut st = Some(g.clone());
                let burst = (0..20)
                    .filter(|_| decide(&p, &mut st, now, 1, true).decision.allowed())
                    .count();
                assert!(burst as u64 <= p.capacity, "{a:?} {g:?}: {burst}");
                // Whatever the start, a bucket then admits at most C + floor(τ / I) over τ.
                let mut st = Some(g.clone());
                let (mut total, mut t) = (0, now);
                while t < now + 3 * p.window_us {
                    total += decide(&p, &mut st, t, 1, true).decision.allowed() as u64;
                    if a.is_bucket() {
                        assert!(
                            total <= p.capacity + (t - now) / p.interval_us,
                            "{a:?} {g:?}"
                        );
                    }
                    t += p.interval_us / 4;
                }
                for c in [0, 1, 4, 5] {
                    let _ = peek(&p, &Some(g.clone()), now, c); // no panic, no write
                }
            }
        }
    }

    #[test]
    fn first_request_on_a_fresh_bucket_of_ten_leaves_nine() {
        for a in Algorithm::ALL {
            let d = step(&params(a, 10, 60 * S, None), &mut None, 56 * YEAR, 1).decision;
            assert_eq!(
                (d.code, d.limit, d.remaining),
                (Code::Allowed, 10, 9),
                "{a:?}"
            );
        }
    }

    #[test]
    fn cost_above_capacity_is_code_2_and_writes_nothing() {
        for a in Algorithm::ALL {
            let p = params(a, 5, 60 * S, None);
            let mut st = None;
            step(&p, &mut st, 56 * YEAR, 2);
            let before = st.clone();
            let v = decide(&p, &mut st, 56 * YEAR + 9, 6, true);
            assert_eq!(
                (v.decision.code, v.decision.retry_after_us, v.ttl_us),
                (Code::CannotFit, 0, None)
            );
            assert_eq!(v.decision.remaining, 3, "{a:?}");
            assert_eq!(st, before);
        }
    }

    #[test]
    fn a_state_of_another_algorithm_reads_as_fresh() {
        let p = params(Algorithm::Gcra, 3, 60 * S, None);
        let mut st = Some(State::FixedWindow(fixed_window::State {
            window: 0,
            count: 9,
        }));
        assert_eq!(step(&p, &mut st, 56 * YEAR, 1).decision.remaining, 2);
        assert!(matches!(st, Some(State::Gcra(_))));
    }
}
