//! The six limiter algorithms as pure integer functions over an explicit state.
//!
//! This is the single source of truth for the arithmetic: the embedded store runs these
//! functions directly, and every Lua script in `lua/` is tested against them on the same
//! request sequences. Everything is integer microseconds; nothing here reads a clock.
//!
//! Contract (see ALGORITHMS.md): `decide` never mutates state for a limited request or a
//! cost that can never fit (code 2); it returns the state to store when the request is
//! admitted, or `None` when the resulting state is "empty" (the key should be deleted).

pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

/// Which algorithm a limit uses. The snake_case names are the config and key spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    pub fn from_name(s: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
    }

    /// Bucket algorithms take `burst` (capacity); window algorithms do not.
    pub fn is_bucket(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
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
}

/// Validated, compiled parameters of one limit. Construct through [`Params::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    pub algorithm: Algorithm,
    /// N: units admitted per window.
    pub limit: u64,
    /// W in microseconds.
    pub window_us: u64,
    /// C: capacity for bucket algorithms (`burst`, default N); equals N for window algorithms.
    pub capacity: u64,
    /// I = ceil(W / N): microseconds per unit for bucket algorithms (never faster than configured).
    pub interval_us: u64,
    /// Time unit of sliding_window's weighting: 1 µs, or 1000 µs when N·W in µs would pass 2^53
    /// (windows are whole milliseconds, so N·W in ms always fits for N ≤ 10^7, W ≤ 7d).
    pub unit_us: u64,
}

/// Largest integer a double (Lua number) holds exactly.
pub const MAX_EXACT: u64 = 1 << 53;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("rate must admit at least 1 per window")]
    ZeroLimit,
    #[error("window must be at least 1s and at most 7d")]
    Window,
    #[error("burst must be at least 1")]
    ZeroBurst,
    #[error("sliding_log keeps one entry per admitted unit: at most 10000 per window")]
    SlidingLogTooLarge,
    #[error("parameters too large to be decided exactly ({0} reaches 2^53)")]
    Overflow(&'static str),
}

impl Params {
    pub const MIN_WINDOW_US: u64 = 1_000_000;
    pub const MAX_WINDOW_US: u64 = 7 * 86_400 * 1_000_000;
    pub const MAX_SLIDING_LOG: u64 = 10_000;

    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        window_us: u64,
        burst: Option<u64>,
    ) -> Result<Params, ParamsError> {
        if limit == 0 {
            return Err(ParamsError::ZeroLimit);
        }
        if !(Self::MIN_WINDOW_US..=Self::MAX_WINDOW_US).contains(&window_us) {
            return Err(ParamsError::Window);
        }
        if algorithm == Algorithm::SlidingLog && limit > Self::MAX_SLIDING_LOG {
            return Err(ParamsError::SlidingLogTooLarge);
        }
        let capacity = if algorithm.is_bucket() {
            burst.unwrap_or(limit)
        } else {
            limit
        };
        if capacity == 0 {
            return Err(ParamsError::ZeroBurst);
        }
        let interval_us = window_us.div_ceil(limit);
        let unit_us = if algorithm == Algorithm::SlidingWindow
            && limit.checked_mul(window_us).is_none_or(|v| v >= MAX_EXACT)
        {
            1000
        } else {
            1
        };
        let p = Params {
            algorithm,
            limit,
            window_us,
            capacity,
            interval_us,
            unit_us,
        };
        p.check_exact()?;
        Ok(p)
    }

    /// Reject parameters whose products the arithmetic (and a Lua double) cannot hold exactly.
    fn check_exact(&self) -> Result<(), ParamsError> {
        let lt = |a: u64, b: u64, what| match a.checked_mul(b) {
            Some(v) if v < MAX_EXACT => Ok(()),
            _ => Err(ParamsError::Overflow(what)),
        };
        match self.algorithm {
            // prev·(W−e) ≤ (N−cur−c)·W: both sides are at most N·W in `unit_us` units.
            Algorithm::SlidingWindow => lt(self.limit, self.window_us / self.unit_us, "N·window"),
            Algorithm::FixedWindow | Algorithm::SlidingLog => Ok(()),
            _ => lt(self.capacity, self.interval_us, "burst·interval"),
        }
    }

    /// Largest cost that can ever be admitted.
    pub fn max_cost(&self) -> u64 {
        self.capacity
    }
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
}

/// What one call to [`decide`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// When the call committed a write: how long the key must live (µs from now; the store
    /// rounds up). `None` when nothing was written or the state was deleted (empty/full).
    pub ttl_us: Option<u64>,
}

/// Decide one request of `cost` units at store time `now` (µs).
///
/// With `commit == false` this is a dry run: `state` is left exactly as it was whatever the
/// outcome. With `commit == true`, an admitted request updates `state` (possibly to `None`,
/// meaning "delete the key"); a limited or code-2 request never changes it. A state of the
/// wrong variant (cannot happen with well-formed keys) counts as fresh.
pub fn decide(p: &Params, state: &mut Option<State>, now: u64, cost: u64, commit: bool) -> Verdict {
    macro_rules! run {
        ($m:ident, $v:ident) => {{
            let mut own = match state.take() {
                Some(State::$v(s)) => Some(s),
                _ => None,
            };
            let verdict = $m::decide(p, &mut own, now, cost, commit);
            *state = own.map(State::$v);
            verdict
        }};
    }
    match p.algorithm {
        Algorithm::FixedWindow => run!(fixed_window, FixedWindow),
        Algorithm::SlidingLog => run!(sliding_log, SlidingLog),
        Algorithm::SlidingWindow => run!(sliding_window, SlidingWindow),
        Algorithm::TokenBucket => run!(token_bucket, TokenBucket),
        Algorithm::LeakyBucket => run!(leaky_bucket, LeakyBucket),
        Algorithm::Gcra => run!(gcra, Gcra),
    }
}
