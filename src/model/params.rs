//! A limit's algorithm and its validated parameters: what every store decides with.

/// Which algorithm a limit uses. The snake_case names are the config and key spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra,
    /// Requests in flight, not a rate: `limit` is `max`, `window_us` the lease.
    Concurrency,
}

impl Algorithm {
    /// The six rate algorithms (`concurrency` is apart: nothing about it refills with time).
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
            Algorithm::Concurrency => "concurrency",
        }
    }

    pub fn from_name(s: &str) -> Option<Algorithm> {
        let all = Algorithm::ALL.into_iter().chain([Algorithm::Concurrency]);
        all.into_iter().find(|a| a.name() == s)
    }

    /// Algorithms whose state, read under other parameters than it was written with (a
    /// reload, a plan change), is written again as read by a committing call that charges
    /// nothing: GCRA's time owed at a new interval, a bucket's debt held to a lowered burst.
    pub fn restates(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// Bucket algorithms take `burst` (capacity); window algorithms do not.
    pub fn is_bucket(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
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
    /// (windows are whole milliseconds; N·W in ms past 2^53 is refused as an overflow).
    pub unit_us: u64,
    /// `fixed_window` over UTC calendar months (`N/month`); `window_us` is then 31 days, the
    /// longest month, and each window is the month's real length.
    pub month: bool,
}

/// Largest integer a double (Lua number) holds exactly.
pub const MAX_EXACT: u64 = 1 << 53;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("rate must admit at least 1 per window")]
    ZeroLimit,
    #[error("rate must admit at most 10000000 per window")]
    LimitTooLarge,
    #[error("window must be at least 1s and at most 366d")]
    Window,
    #[error("burst must be at least 1")]
    ZeroBurst,
    #[error("sliding_log keeps one entry per admitted unit: at most 10000 per window")]
    SlidingLogTooLarge,
    #[error("max must be at least 1")]
    ZeroMax,
    #[error("max must be at most 10000 requests in flight (one lease each)")]
    ConcurrencyTooLarge,
    #[error("lease must be at least 1s and at most 1d")]
    Lease,
    #[error("parameters too large to be decided exactly ({0} reaches 2^53)")]
    Overflow(&'static str),
}

impl Params {
    pub const MIN_WINDOW_US: u64 = 1_000_000;
    pub const MAX_WINDOW_US: u64 = 366 * 86_400 * 1_000_000;
    /// `window_us` of a calendar-month window: the longest month.
    pub const MONTH_US: u64 = 31 * 86_400 * 1_000_000;
    pub const MAX_SLIDING_LOG: u64 = 10_000;
    /// The largest N per window; `lua/decide.lua` refuses anything above it too.
    pub const MAX_LIMIT: u64 = 10_000_000;

    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        window_us: u64,
        burst: Option<u64>,
    ) -> Result<Params, ParamsError> {
        if limit == 0 {
            return Err(ParamsError::ZeroLimit);
        }
        if limit > Self::MAX_LIMIT {
            return Err(ParamsError::LimitTooLarge);
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
            month: false,
        };
        p.check_exact()?;
        Ok(p)
    }

    /// The most requests of one key in flight a concurrency limit may allow (one lease each).
    pub const MAX_CONCURRENCY: u64 = 10_000;
    pub const MAX_LEASE_US: u64 = 86_400 * 1_000_000;

    /// `algorithm: concurrency`: at most `max` in flight, leases of `lease_us`.
    pub fn concurrency(max: u64, lease_us: u64) -> Result<Params, ParamsError> {
        if max == 0 {
            return Err(ParamsError::ZeroMax);
        }
        if max > Self::MAX_CONCURRENCY {
            return Err(ParamsError::ConcurrencyTooLarge);
        }
        if !(Self::MIN_WINDOW_US..=Self::MAX_LEASE_US).contains(&lease_us) {
            return Err(ParamsError::Lease);
        }
        Ok(Params {
            algorithm: Algorithm::Concurrency,
            limit: max,
            window_us: lease_us,
            capacity: max,
            interval_us: 1,
            unit_us: 1,
            month: false,
        })
    }

    /// `fixed_window` at `limit` per UTC calendar month.
    pub fn monthly(limit: u64) -> Result<Params, ParamsError> {
        let mut p = Params::new(Algorithm::FixedWindow, limit, Self::MONTH_US, None)?;
        p.month = true;
        Ok(p)
    }

    /// The algorithm's name in the script's ARGV (`fixed_month` for calendar months).
    pub fn script_name(&self) -> &'static str {
        if self.month {
            "fixed_month"
        } else {
            self.algorithm.name()
        }
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
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::Concurrency => Ok(()),
            // Twice: a charge after the answer may leave one capacity of debt.
            _ => lt(
                self.capacity.saturating_mul(2),
                self.interval_us,
                "burst·interval",
            ),
        }
    }

    /// Largest cost that can ever be admitted.
    pub fn max_cost(&self) -> u64 {
        self.capacity
    }
}
