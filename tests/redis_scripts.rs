//! The Lua scripts in `lua/`, run by a real `redis-server` (standalone and a three-primary
//! Cluster), against their Rust twins in `src/algo/` and the embedded store: the same random
//! schedules must give identical integer decisions. Also the script-level traps of
//! ALGORITHMS.md: TTLs, garbage state, cost above capacity, wrong-typed keys, bad ARGV,
//! sorted-set member collisions, bounded memory and exact retries at Redis's own clock.
//!
//! The schedules pin `now` through a test-only entry point appended to the production body
//! (`decide_all(now_from_last_argv)`); production's entry reads `TIME` and is used by the
//! real-clock tests at the end.
mod support;

use fred::types::Value;
use sluice::limiter::algo::{self, Algorithm, Code, Decision, Op, Params, State};
use sluice::limiter::store::memory::{Clock, MemoryStore};
use sluice::limiter::store::{scripts, LimitCall};
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::redis::{Conn, RedisCluster, RedisServer, Resp};

const S: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * S;

/// xorshift64*: reproducible schedules without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A script under test on one connection: the production body with a chosen entry point.
struct Lua {
    conn: Conn,
    /// How a call names it: `EVALSHA SHA` or `FCALL NAME`.
    target: [String; 2],
    nonce: u64,
}

impl Lua {
    /// `now` pinned by the last ARGV (test-only entry).
    fn pinned(conn: Conn) -> Lua {
        let script = format!(
            "#!lua\n{}local _, decide = sluice()\nreturn decide(tonumber(ARGV[#ARGV]), 1, KEYS, ARGV)\n",
            scripts::BODY
        );
        Lua::load(conn, &script)
    }

    /// The pinned entry as a library of Redis Functions: a library keeps what its calls read
    /// (parsed integers, request shapes) for the next calls, which an EVAL script never does.
    fn pinned_library(conn: Conn) -> Lua {
        let code = format!(
            "#!lua name=sluice_pinned\n{}local decide\n\
             redis.register_function{{function_name = 'sluice_pinned', \
             flags = {{'allow-cross-slot-keys'}}, callback = function(keys, argv)\n\
             if decide == nil then local _; _, decide = sluice() end\n\
             return decide(tonumber(argv[#argv]), 1, keys, argv)\nend}}\n",
            scripts::BODY
        );
        Lua::load_library(conn, &code)
    }

    /// The production script: `now` is Redis's `TIME`.
    fn production(conn: Conn) -> Lua {
        Lua::load(conn, scripts::SCRIPT)
    }

    /// The production library (Redis Functions, FCALL): `now` is Redis's `TIME`.
    fn library(conn: Conn) -> Lua {
        let lib = scripts::Library::new();
        let lua = Lua::load_library(conn, &lib.code);
        assert_eq!(lua.target[1], lib.name);
        lua
    }

    fn load(mut conn: Conn, script: &str) -> Lua {
        let sha = conn.cmd_ok(&["SCRIPT", "LOAD", script]).as_str();
        Lua::on(conn, "EVALSHA", &sha)
    }

    /// A library whose one function is named as the library (both of ours are).
    fn load_library(mut conn: Conn, code: &str) -> Lua {
        let name = conn.cmd_ok(&["FUNCTION", "LOAD", "REPLACE", code]).as_str();
        Lua::on(conn, "FCALL", &name)
    }

    /// Calls of what `command` (`EVALSHA` or `FCALL`) names, loaded already.
    fn on(conn: Conn, command: &str, name: &str) -> Lua {
        Lua {
            conn,
            target: [command.into(), name.into()],
            nonce: 0,
        }
    }

    /// A call's command and what it names, to which its key count, KEYS and ARGV follow.
    fn head(&self) -> Vec<String> {
        self.target.to_vec()
    }

    /// A batch on the one limit `p`, written out by hand so that its shapes may be malformed:
    /// per request its shape and its keys (nonces `n0`, `n1`, …); `now` appended for the
    /// pinned entry.
    fn raw_batch(&self, p: &Params, requests: &[(&str, &[&str])], now: Option<u64>) -> Vec<String> {
        let keys: Vec<&str> = requests.iter().flat_map(|r| r.1.iter().copied()).collect();
        let mut args = self.head();
        args.push(keys.len().to_string());
        args.extend(keys.iter().map(|k| k.to_string()));
        args.extend(["batch".into(), requests.len().to_string(), "1".into()]);
        args.push(p.script_name().to_owned());
        args.extend(
            [p.limit, p.window_us, p.capacity, p.interval_us, p.unit_us].map(|v| v.to_string()),
        );
        for (i, (shape, _)) in requests.iter().enumerate() {
            args.extend([format!("n{i}"), shape.to_string()]);
        }
        args.extend(now.map(|n| n.to_string()));
        args
    }

    /// One call; `now` is appended only for the pinned entry.
    fn call(
        &mut self,
        calls: &[LimitCall],
        commit: bool,
        now: Option<u64>,
    ) -> Result<Vec<Decision>, String> {
        self.nonce += 1;
        let id = self.nonce;
        self.call_as(calls, commit, now, id)
    }

    /// One call whose nonce (concurrency leases, sliding_log members) is made of `id`.
    fn call_as(
        &mut self,
        calls: &[LimitCall],
        commit: bool,
        now: Option<u64>,
        id: u64,
    ) -> Result<Vec<Decision>, String> {
        let mut args = self.head();
        args.push(calls.len().to_string());
        args.extend(calls.iter().map(|c| c.key.clone()));
        args.extend(scripts::argv(&format!("t{id}"), commit, calls));
        args.extend(now.map(|n| n.to_string()));
        self.raw(&args)
    }

    fn raw(&mut self, args: &[String]) -> Result<Vec<Decision>, String> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match self.conn.cmd(&args) {
            Resp::Error(e) => Err(e),
            r => {
                let ints: Vec<i64> = r.as_array().iter().map(Resp::as_int).collect();
                scripts::decisions(&ints, ints.len() / 5)
            }
        }
    }

    /// A batch call (`args` as [`Lua::raw_batch`] or `scripts::batch_argv` make them), its
    /// reply read as the gateway reads it: per request (of `keys[r]` keys) its decisions or its
    /// own error.
    fn batch(&mut self, args: &[String], keys: &[usize]) -> Vec<Result<Vec<Decision>, String>> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let items = self
            .conn
            .cmd(&args)
            .as_array()
            .into_iter()
            .map(|r| match r {
                Resp::Int(i) => Value::Integer(i),
                Resp::Bulk(Some(e)) => Value::Bytes(e.into()),
                _ => Value::Null,
            })
            .collect();
        scripts::batch_decisions(items, keys).unwrap_or_else(|e| panic!("batch reply: {e}"))
    }

    fn at(&mut self, call: &LimitCall, now: u64) -> Decision {
        self.call(std::slice::from_ref(call), true, Some(now))
            .unwrap_or_else(|e| panic!("script error: {e}"))[0]
    }
}

fn limit(key: &str, p: Params, cost: u64) -> LimitCall {
    LimitCall {
        key: key.to_owned(),
        params: p,
        cost,
        shadow: false,
        op: Default::default(),
    }
}

fn params(a: Algorithm, n: u64, w: u64, burst: Option<u64>) -> Params {
    Params::new(a, n, w, burst).unwrap()
}

/// Parameter sets per algorithm: small, bursty, and the largest the config accepts; for
/// fixed_window also calendar months (the random gaps cross month ends, February included).
fn param_sets(a: Algorithm) -> Vec<Params> {
    let burst = a.is_bucket().then_some(7);
    let big = if a == Algorithm::SlidingLog {
        150
    } else {
        10_000_000
    };
    // sliding_window's N·W (ms) must stay below 2^53: 10^7 per 7 d, not per 366 d.
    let longest = if a == Algorithm::SlidingWindow {
        7 * 86_400 * S
    } else {
        Params::MAX_WINDOW_US
    };
    let mut sets = vec![
        params(a, 5, 10 * S, None),
        params(a, 3, 2 * S, burst),
        params(a, 1000, 3600 * S, None),
        params(a, big, longest, None),
    ];
    if a == Algorithm::FixedWindow {
        sets.push(Params::monthly(5).unwrap());
        sets.push(Params::monthly(big).unwrap());
    }
    sets
}

/// The next gap: same µs, sub-interval, around the interval, around the window, long idle.
fn gap(r: &mut Rng, p: &Params) -> u64 {
    match r.below(6) {
        0 => 0,
        1 => r.below(2_000),
        2 => r.below(2 * p.interval_us),
        3 => r.below(p.window_us / 4),
        4 => r.below(p.window_us + 1),
        _ => r.below(3 * p.window_us),
    }
}

/// Mostly small costs, sometimes anything up to C + 1 (so code 2 shows up).
fn cost(r: &mut Rng, p: &Params) -> u64 {
    if r.below(4) == 0 {
        r.below(p.capacity + 2)
    } else {
        r.below(3)
    }
}

fn pttl(conn: &mut Conn, key: &str) -> i64 {
    conn.cmd_ok(&["PTTL", key]).as_int()
}

/// After an admitted write of `ttl_us`: ceil(ttl / 1 ms) − (real time since) ≤ PTTL ≤ ceil.
fn assert_ttl(conn: &mut Conn, key: &str, ttl_us: u64) {
    let want = ttl_us.div_ceil(1000) as i64;
    let got = pttl(conn, key);
    assert!(
        got <= want && got + 1000 >= want,
        "{key}: PTTL {got} ms after a write needing {ttl_us} µs"
    );
}

/// Every script equals its Rust twin, decision by decision, on long random schedules, with
/// the TTL the twin asks for, and no key ever left without one.
fn twins_agree(conn_for: &dyn Fn(&str) -> Conn, tag: &str, steps: usize) {
    let mut r = Rng(0x5EED_0001);
    for a in Algorithm::ALL {
        for (j, p) in param_sets(a).into_iter().enumerate() {
            let key = format!("twin:{}:{j}:{{{tag}}}", a.name());
            let (mut lua, mut conn) = (Lua::pinned(conn_for(&key)), conn_for(&key));
            let mut state: Option<State> = None;
            let mut now = T0 + r.below(S);
            for step in 0..steps {
                now += gap(&mut r, &p);
                let c = cost(&mut r, &p);
                let want = algo::decide(&p, &mut state, now, c, true);
                let got = lua.at(&limit(&key, p, c), now);
                assert_eq!(
                    got, want.decision,
                    "{a:?} {p:?} step {step}: now {now} cost {c}"
                );
                match want.ttl_us {
                    Some(ttl) => assert_ttl(&mut conn, &key, ttl),
                    None => assert_ne!(pttl(&mut conn, &key), -1, "{key} has no TTL"),
                }
            }
        }
    }
}

/// Two concurrency limits: 3 in flight with 5 s leases, 1 with 60 s leases.
fn concurrency_sets() -> [Params; 2] {
    [
        Params::concurrency(3, 5 * S).unwrap(),
        Params::concurrency(1, 60 * S).unwrap(),
    ]
}

/// Several limits per call (some shadow), against the embedded store at the same `now`:
/// ordinary decisions, probes and charges after the answer on the six rate algorithms, and
/// concurrency leases taken, released and renewed by the same call ids on both sides.
fn multi_limit_agrees_with_the_embedded_store(mut lua: Lua, tag: &str, steps: usize) {
    let mut r = Rng(0x5EED_0002);
    let (clock, time) = Clock::manual(T0);
    let mem = MemoryStore::new(10_000, clock);
    let mut now = T0;
    let mut held: Vec<(LimitCall, u64)> = Vec::new();
    for step in 0..steps {
        let id = 1_000_000 + step as u64;
        now += r.below(3 * S);
        time.store(now, Ordering::Relaxed);
        if !held.is_empty() && r.below(4) == 0 {
            // Release (or renew) a lease an earlier call took.
            let (mut c, lease) = held.swap_remove(r.below(held.len() as u64) as usize);
            c.op = if r.below(3) == 0 {
                Op::Renew
            } else {
                Op::Release
            };
            let want = mem.decide_as(std::slice::from_ref(&c), lease);
            let got = lua.call_as(std::slice::from_ref(&c), true, Some(now), lease);
            assert_eq!(got.unwrap(), want, "step {step}: {c:?}");
            if c.op == Op::Renew {
                c.op = Op::Decide;
                held.push((c, lease));
            }
            continue;
        }
        let n = 1 + r.below(3) as usize;
        let calls: Vec<LimitCall> = (0..n)
            .map(|i| {
                let k = r.below(7) as usize;
                let set = r.below(2);
                let (p, op, cost) = if k == 6 {
                    (concurrency_sets()[set as usize], Op::Decide, 1)
                } else {
                    let p = param_sets(Algorithm::ALL[k])[set as usize];
                    let op = [Op::Decide, Op::Decide, Op::Probe, Op::Charge][r.below(4) as usize];
                    let cost = match op {
                        // Charges past the limit, often past the debt a bucket may keep.
                        Op::Charge if r.below(2) == 0 => r.below(2 * p.capacity.min(500) + 2),
                        _ => cost(&mut r, &p),
                    };
                    (p, op, cost)
                };
                LimitCall {
                    // Few distinct keys, so limits of different requests meet. The params are
                    // part of the key: a changed window is a config edit, after which Redis's
                    // real-time TTLs and the pinned clock would disagree on expiry.
                    key: format!("multi:{}:{set}:{i}:{{{tag}}}", p.algorithm.name()),
                    params: p,
                    cost,
                    shadow: r.below(4) == 0,
                    op,
                }
            })
            .collect();
        // A key named twice in one request cannot come from a config (limit names are unique).
        if (1..n).any(|i| calls[..i].iter().any(|c| c.key == calls[i].key)) {
            continue;
        }
        let want = mem.decide_as(&calls, id);
        let got = lua.call_as(&calls, true, Some(now), id).unwrap();
        assert_eq!(got, want, "step {step}: {calls:?}");
        if sluice::limiter::store::request_allowed(&calls, &want) {
            for (c, d) in calls.iter().zip(&want) {
                if c.params.algorithm == Algorithm::Concurrency && d.allowed() {
                    held.push((c.clone(), id));
                }
            }
        }
        // Peeks (commit 0) agree too and write nothing.
        let c = &calls[0];
        let peek = mem.peek(&c.key, &c.params);
        let probe = [limit(&c.key, c.params, 0), limit(&c.key, c.params, 1)];
        let got = lua.call(&probe, false, Some(now)).unwrap();
        assert_eq!(got, vec![peek.now, peek.next], "peek at step {step}");
    }
}

#[test]
fn scripts_match_their_rust_twins_on_standalone_redis() {
    let redis = RedisServer::start();
    twins_agree(&|_| redis.conn(), "t", 250);
    multi_limit_agrees_with_the_embedded_store(Lua::pinned(redis.conn()), "m", 600);
    // Trap 6: after the run, no limiter key is left without a TTL.
    let mut conn = redis.conn();
    let keys = conn.cmd_ok(&["KEYS", "*"]).as_array();
    assert!(keys.len() > 20, "the schedules wrote keys");
    for k in keys {
        let k = k.as_str();
        // -1: the key has no TTL (the trap). 0: under a millisecond left; -2: it expired
        // between KEYS and PTTL. Both fine.
        let ttl = pttl(&mut conn, &k);
        assert!(ttl >= 0 || ttl == -2, "{k} without TTL (PTTL {ttl})");
    }
}

#[test]
fn scripts_match_their_rust_twins_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    // Every key of a call shares the hash tag, so it runs on the node owning that slot; with
    // `#!lua`, Redis 7 refuses any key that is not declared in KEYS.
    for tag in ["t", "{}", ""] {
        twins_agree(&|key| cluster.conn_for_key(key), tag, 60);
    }
    let key = "multi:x:{m}";
    multi_limit_agrees_with_the_embedded_store(Lua::pinned(cluster.conn_for_key(key)), "m", 200);
    // Keys on different slots in one call are refused by Redis, not half-run.
    let mut lua = Lua::pinned(cluster.conn_for_key("a{1}"));
    let p = params(Algorithm::Gcra, 5, 10 * S, None);
    let err = lua
        .call(&[limit("a{1}", p, 1), limit("b{2}", p, 1)], true, Some(T0))
        .unwrap_err();
    assert!(err.contains("CROSSSLOT") || err.contains("MOVED"), "{err}");
}

#[test]
fn gcra_golden_vector_and_a_fresh_bucket_of_ten() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let p = params(Algorithm::Gcra, 5, 5 * S, None); // C = 5, I = 1 s
    let rem: Vec<u64> = (0..5)
        .map(|_| lua.at(&limit("g", p, 1), T0).remaining)
        .collect();
    assert_eq!(rem, [4, 3, 2, 1, 0]);
    let d = lua.at(&limit("g", p, 1), T0);
    assert_eq!((d.code, d.retry_after_us), (Code::Limited, S));
    let d = lua.at(&limit("g", p, 1), T0 + 3 * S);
    assert_eq!((d.code, d.remaining), (Code::Allowed, 2));
    assert_eq!(lua.at(&limit("g2", p, 6), T0).code, Code::CannotFit);
    // Trap 3: the first request on an empty bucket of 10 leaves exactly 9, for each bucket.
    for a in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ] {
        let d = lua.at(&limit(a.name(), params(a, 10, 10 * S, None), 1), T0);
        assert_eq!(
            (d.code, d.limit, d.remaining),
            (Code::Allowed, 10, 9),
            "{a:?}"
        );
    }
}

/// DUMP and PTTL of a key, to show a call left it byte-identical.
fn snapshot(conn: &mut Conn, key: &str) -> (Resp, i64) {
    (conn.cmd_ok(&["DUMP", key]), pttl(conn, key))
}

/// GCRA and token_bucket across new rates and bursts on one key (a reload, a consumer moved to
/// another plan): each script keeps the units owed, as its twin does, decision by decision
/// and TTL by TTL.
/// `60/1m` exhausted and then tightened to `60/1h` owes its 60 units at the new rate (the
/// 60 s owed, read at the new interval, gave 59 of 60 back), and a lowered burst holds the
/// debt to two buckets' worth instead of giving a fresh one.
#[test]
fn buckets_keep_the_units_owed_across_new_rates() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let mut conn = redis.conn();
    let fast = params(Algorithm::Gcra, 60, 60 * S, None);
    let slow = params(Algorithm::Gcra, 60, 3600 * S, None);
    let key = "gcra:rate:{k}";
    assert_eq!(lua.at(&limit(key, fast, 60), T0).remaining, 0);
    let d = lua.at(&limit(key, slow, 1), T0 + 1);
    assert_eq!(
        (d.code, d.remaining, d.retry_after_us),
        (Code::Limited, 0, 60 * S - 60)
    );
    // Restated at the new interval, with the interval kept beside it.
    assert_eq!(
        conn.cmd_ok(&["GET", "gcra:rate:{k}:i"]).as_str(),
        (60 * S).to_string()
    );
    // A token bucket's debt (a charge by the answer) likewise: 30 tokens owed at one a
    // second are 30 minutes at one a minute, restated with its interval.
    let (fast, slow) = (
        params(Algorithm::TokenBucket, 60, 60 * S, None),
        params(Algorithm::TokenBucket, 60, 3600 * S, None),
    );
    let key = "tb:rate:{k}";
    let charge = LimitCall {
        op: Op::Charge,
        ..limit(key, fast, 90)
    };
    assert_eq!(lua.at(&charge, T0).remaining, 0);
    let d = lua.at(&limit(key, slow, 1), T0);
    assert_eq!(
        (d.code, d.retry_after_us),
        (Code::Limited, 30 * 60 * S + 60 * S)
    );
    let Resp::Array(Some(state)) = conn.cmd_ok(&["HMGET", key, "n", "t", "i"]) else {
        panic!("HMGET gives an array");
    };
    assert_eq!(
        state.iter().map(Resp::as_str).collect::<Vec<_>>(),
        [
            "0".to_string(),
            (T0 + 30 * 60 * S).to_string(),
            (60 * S).to_string()
        ]
    );

    // Random schedules over several rates and bursts per key, with charges by the answer
    // (debts a lowered burst must hold to its bound): token_bucket as well.
    let mut r = Rng(0x5EED_0002);
    for a in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let sets = [
            params(a, 60, 60 * S, None),
            params(a, 60, 3600 * S, None),
            params(a, 10, 60 * S, Some(3)),
            params(a, 600, 60 * S, Some(100)),
            params(a, 5, S, None),
        ];
        for round in 0..40 {
            let key = format!("mix:{}:{round}:{{t}}", a.name());
            let mut state: Option<State> = None;
            let mut now = T0 + r.below(S);
            let mut p = sets[0];
            for step in 0..60 {
                if r.below(5) == 0 {
                    p = sets[r.below(sets.len() as u64) as usize];
                }
                now += gap(&mut r, &p);
                let charge = r.below(4) == 0;
                let (c, want) = if charge {
                    let c = 1 + r.below(2 * p.capacity);
                    (c, algo::charge(&p, &mut state, now, c))
                } else {
                    let c = cost(&mut r, &p);
                    (c, algo::decide(&p, &mut state, now, c, true))
                };
                let call = LimitCall {
                    op: if charge { Op::Charge } else { Op::Decide },
                    ..limit(&key, p, c)
                };
                let got = lua.at(&call, now);
                assert_eq!(
                    got, want.decision,
                    "{p:?} round {round} step {step}: now {now} cost {c} charge {charge}"
                );
                if let Some(ttl) = want.ttl_us {
                    assert_ttl(&mut conn, &key, ttl);
                    if a == Algorithm::Gcra {
                        assert_ttl(&mut conn, &format!("{key}:i"), ttl);
                    }
                }
            }
        }
    }
}

/// A state read under a new rate is written as read whatever refuses the request: a route's
/// other limit (the dry run of several limits stops at a refusal), or the probe of a limit
/// charged by the answer. Otherwise the stored time owed keeps decaying at the old rate and
/// gives units back: `60/1m` exhausted, tightened to `60/1h`, had one unit back a second
/// later. Both stores, the same decisions.
#[test]
fn a_rate_change_is_restated_by_refusals_and_probes() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let (clock, time) = Clock::manual(T0);
    let mem = MemoryStore::new(10_000, clock);
    let fast = params(Algorithm::Gcra, 60, 60 * S, None);
    let slow = params(Algorithm::Gcra, 60, 3600 * S, None);
    let window = params(Algorithm::FixedWindow, 1000, 3600 * S, None);
    for (n, op) in [(0, Op::Decide), (1, Op::Probe)] {
        let key = format!("restate:{n}:{{k}}");
        let other = format!("restate:{n}:other:{{k}}");
        let mut both = |calls: &[LimitCall], now: u64| {
            time.store(now, Ordering::Relaxed);
            let want = mem.decide_as(calls, 7);
            let got = lua.call_as(calls, true, Some(now), 7).unwrap();
            assert_eq!(got, want, "{calls:?} at {now}");
            want
        };
        both(&[limit(&key, fast, 60)], T0);
        // Refused by the tightened limit beside another limit (or probed): restated.
        let tight = LimitCall {
            op,
            ..limit(&key, slow, 1)
        };
        let d = both(&[limit(&other, window, 1), tight.clone()], T0 + 1);
        assert!(!d[1].allowed(), "{op:?}: {d:?}");
        // A second later the tightened limit still has nothing: 3599 s of a 60 s unit owed.
        let d = both(&[limit(&key, slow, 0)], T0 + S);
        assert_eq!(d[0].remaining, 0, "{op:?}: a unit came back");
    }
}

#[test]
fn cost_above_capacity_and_cost_zero_change_nothing() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let mut conn = redis.conn();
    for a in Algorithm::ALL {
        let p = params(a, 4, 3600 * S, None);
        let key = format!("k:{}", a.name());
        // Cost 0 on a fresh key: a peek, no key written.
        let d = lua.at(&limit(&key, p, 0), T0);
        assert_eq!((d.code, d.remaining), (Code::Allowed, 4), "{a:?}");
        assert_eq!(conn.cmd_ok(&["EXISTS", &key]).as_int(), 0, "{a:?}");
        lua.at(&limit(&key, p, 2), T0);
        let before = snapshot(&mut conn, &key);
        let d = lua.at(&limit(&key, p, 5), T0 + 1);
        assert_eq!((d.code, d.retry_after_us), (Code::CannotFit, 0), "{a:?}");
        let d = lua.at(&limit(&key, p, 0), T0 + 2);
        assert_eq!((d.code, d.remaining), (Code::Allowed, 2), "{a:?}");
        let after = snapshot(&mut conn, &key);
        assert_eq!(before.0, after.0, "{a:?}: value changed");
        assert!(before.1 - after.1 < 1000, "{a:?}: TTL rewritten");
    }
}

#[test]
fn garbage_and_old_state_never_admit_more_than_capacity() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let mut conn = redis.conn();
    let now = T0 + 123_456;
    let (past, future) = (
        (now - 20 * 365 * 86_400 * S).to_string(),
        (now + 3600 * S).to_string(),
    );
    let values = [
        "0",
        past.as_str(),
        future.as_str(),
        "-5",
        "abc",
        "1.5",
        "9007199254740993",
        "",
        // Another spelling of an integer reads as that integer (the script checks the value
        // of stored state, not its digits): still never more than capacity.
        "1e1",
    ];
    let c = 4;
    let mut seeded = 0;
    for a in Algorithm::ALL {
        let p = params(a, c, 3600 * S, None);
        for (i, x) in values.iter().enumerate() {
            for (j, y) in values.iter().enumerate() {
                let key = format!("g:{}:{i}:{j}", a.name());
                match a {
                    Algorithm::Concurrency => unreachable!("not a rate algorithm"),
                    Algorithm::FixedWindow => conn.cmd_ok(&["HSET", &key, "w", x, "n", y]),
                    Algorithm::SlidingWindow => {
                        conn.cmd_ok(&["HSET", &key, "w", x, "c", y, "p", y])
                    }
                    Algorithm::TokenBucket => conn.cmd_ok(&["HSET", &key, "n", x, "t", y]),
                    Algorithm::LeakyBucket => conn.cmd_ok(&["HSET", &key, "l", x, "t", y]),
                    Algorithm::Gcra => conn.cmd_ok(&["SET", &key, x]),
                    Algorithm::SlidingLog => {
                        let score = x.parse::<f64>().unwrap_or(-1.0).to_string();
                        conn.cmd_ok(&["ZADD", &key, &score, y, &future, "f"])
                    }
                };
                seeded += 1;
                let admitted = (0..20)
                    .filter(|_| lua.at(&limit(&key, p, 1), now).code == Code::Allowed)
                    .count() as u64;
                assert!(
                    admitted <= c,
                    "{a:?} seeded {x:?}/{y:?}: {admitted} admitted"
                );
            }
        }
    }
    assert_eq!(seeded, 6 * values.len() * values.len());
}

#[test]
fn wrong_typed_keys_and_bad_arguments_are_errors_that_write_nothing() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let mut conn = redis.conn();
    // Trap 12: the second limit's key has the wrong type; the first must not be charged.
    conn.cmd_ok(&["RPUSH", "wrong", "x"]);
    for a in Algorithm::ALL {
        let p = params(a, 5, 60 * S, None);
        let good = format!("good:{}", a.name());
        let err = lua
            .call(&[limit(&good, p, 1), limit("wrong", p, 1)], true, Some(T0))
            .unwrap_err();
        assert!(err.contains("WRONGTYPE"), "{a:?}: {err}");
        assert_eq!(conn.cmd_ok(&["EXISTS", &good]).as_int(), 0, "{a:?}");
    }
    // Every ARGV is checked before any write.
    let p = params(Algorithm::TokenBucket, 5, 60 * S, None);
    let good = scripts::argv("n", true, &[limit("k", p, 1)]);
    let cases: Vec<(usize, &str)> = vec![
        (1, "2"),     // commit flag
        (2, "nope"),  // algorithm
        (3, "0"),     // limit
        (4, "-1"),    // window
        (5, "1.5"),   // capacity
        (6, "abc"),   // interval
        (7, "5000"),  // unit
        (8, "1e3"),   // cost
        (9, "7"),     // shadow flag
        (4, "1e300"), // window
    ];
    for (i, bad) in cases {
        let mut args = good.clone();
        args[i] = bad.to_owned();
        let mut cmd: Vec<String> = [lua.head(), vec!["1".into(), "k".into()]].concat();
        cmd.extend(args);
        cmd.push(T0.to_string());
        let err = lua.raw(&cmd).unwrap_err();
        assert!(err.contains("sluice: "), "ARGV[{}] = {bad}: {err}", i + 1);
        assert_eq!(conn.cmd_ok(&["EXISTS", "k"]).as_int(), 0);
    }
    let mut cmd: Vec<String> = [lua.head(), vec!["1".into(), "k".into()]].concat();
    cmd.extend(good[..5].iter().cloned());
    cmd.push(T0.to_string());
    assert!(lua.raw(&cmd).unwrap_err().contains("expected"));
}

#[test]
fn sorted_set_members_never_collide_within_a_microsecond() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let p = params(Algorithm::SlidingLog, 1000, 60 * S, None);
    // Many calls, several connections, all at the very same µs (trap 4).
    let (mut admitted, mut sent) = (0, 0);
    let mut luas: Vec<Lua> = (0..4).map(|_| Lua::pinned(redis.conn())).collect();
    for (i, lua) in luas.iter_mut().enumerate() {
        lua.nonce = i as u64 * 1_000_000;
    }
    for round in 0..100 {
        let lua = &mut luas[round % 4];
        let c = 1 + round as u64 % 3;
        sent += c;
        if lua.at(&limit("log", p, c), T0).code == Code::Allowed {
            admitted += c;
        }
    }
    assert_eq!(admitted, sent, "N = 1000 admits all");
    assert_eq!(conn.cmd_ok(&["ZCARD", "log"]).as_int() as u64, admitted);
}

#[test]
fn a_hammered_sliding_log_stays_bounded_and_expires() {
    // Real clock (production entry): 10× the limit for 3 windows, then silence (trap 5).
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let mut lua = Lua::production(redis.conn());
    let p = params(Algorithm::SlidingLog, 5, S, None);
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut sent = 0;
    while std::time::Instant::now() < until && sent < 10_000 {
        lua.call(&[limit("hammer", p, 1)], true, None).unwrap();
        sent += 1;
        let n = conn.cmd_ok(&["ZCARD", "hammer"]).as_int();
        assert!(n <= 5, "ZCARD {n}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sent > 50, "sent {sent}");
    let gone = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        conn.cmd_ok(&["EXISTS", "hammer"]).as_int() == 0
    });
    assert!(gone, "the key outlived a window of silence");
}

/// Redis's own clock, in µs.
fn redis_now(conn: &mut Conn) -> u64 {
    let t = conn.cmd_ok(&["TIME"]).as_array();
    t[0].as_int() as u64 * S + t[1].as_int() as u64
}

#[test]
fn retry_after_is_exact_at_the_store_clock() {
    // Trap 9 with the production entries. The script's `now` for a call lies between TIME
    // read just before and just after it, which makes every check below certain, not timed.
    // The two production forms (EVALSHA, and the library through FCALL) take turns.
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let mut forms = [Lua::production(redis.conn()), Lua::library(redis.conn())];
    for (i, a) in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ]
    .into_iter()
    .enumerate()
    {
        let lua = &mut forms[i % 2];
        let p = params(a, 2, S, None);
        let key = format!("retry:{}", a.name());
        let one = limit(&key, p, 1);
        let (mut limited_at, mut retry) = (None, 0);
        for _ in 0..10 {
            let before = redis_now(&mut conn);
            let d = lua.call(std::slice::from_ref(&one), true, None).unwrap()[0];
            if d.code == Code::Limited {
                (limited_at, retry) = (Some((before, redis_now(&mut conn))), d.retry_after_us);
                break;
            }
        }
        let (b0, a0) = limited_at.expect("the limit was reached");
        assert!(retry > 0 && retry <= 2 * S, "{a:?} retry {retry}");
        let mut saw_allowed = false;
        for _ in 0..400 {
            let before = redis_now(&mut conn);
            let d = lua.call(&[limit(&key, p, 0)], true, None).unwrap()[0];
            let after = redis_now(&mut conn);
            let would = d.remaining >= 1;
            if after - b0 < retry {
                assert!(
                    !would,
                    "{a:?}: passes {} µs before the retry",
                    retry - (after - b0)
                );
            } else if before - a0 >= retry {
                assert!(
                    would,
                    "{a:?}: still limited {} µs after the retry",
                    (before - a0) - retry
                );
                saw_allowed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(saw_allowed, "{a:?}: never admitted after the retry");
    }
}

/// `N/month` in the script at the pinned clock: full on the last µs of a leap February, empty
/// on the first µs of March, and every answer timed to the month's end.
#[test]
fn calendar_months_end_exactly_in_the_script() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned(redis.conn());
    let p = Params::monthly(3).unwrap();
    let march_1 = 1_835_481_600 * S; // 2028-03-01T00:00:00Z
    let key = "month:{m}";
    let last = march_1 - 1;
    let admitted: Vec<bool> = (0..4)
        .map(|_| lua.at(&limit(key, p, 1), last).allowed())
        .collect();
    assert_eq!(admitted, [true, true, true, false]);
    let refused = lua.at(&limit(key, p, 1), last);
    assert_eq!(refused.retry_after_us, 1, "the month ends one µs later");
    let d = lua.at(&limit(key, p, 1), march_1);
    assert!(d.allowed(), "March starts empty");
    assert_eq!((d.remaining, d.reset_after_us), (2, 31 * 86_400 * S));
    // 2027-12-31T23:59:59.999999Z then 2028-01-01: across a year end.
    let jan_1 = 1_830_297_600 * S;
    let key = "month:{y}";
    for _ in 0..3 {
        assert!(lua.at(&limit(key, p, 1), jan_1 - 1).allowed());
    }
    assert!(!lua.at(&limit(key, p, 1), jan_1 - 1).allowed());
    assert!(lua.at(&limit(key, p, 1), jan_1).allowed());
}

/// A batch (several requests in one call, `lua/decide.lua`'s `decide_batch`) decides exactly
/// as the same requests one after another: against the embedded store, on random mixes of
/// algorithms, ops and shadow limits, requests naming the same keys in one batch, the keys
/// declared or (as a batch for one Cluster node sends them) in ARGV. A request with bad input
/// gets its own error and writes nothing; the others are decided.
#[test]
fn a_batch_decides_like_its_requests_one_after_another() {
    let redis = RedisServer::start();
    batch_decides_like_a_sequence(Lua::pinned(redis.conn()));
    // A library keeps parsed shapes and integers from call to call: the same schedule holds.
    let redis = RedisServer::start();
    batch_decides_like_a_sequence(Lua::pinned_library(redis.conn()));
}

fn batch_decides_like_a_sequence(mut lua: Lua) {
    let mut r = Rng(0x5EED_0003);
    let (clock, time) = Clock::manual(T0);
    let mem = MemoryStore::new(10_000, clock);
    let mut now = T0;
    let mut id = 5_000_000;
    for round in 0..120 {
        now += r.below(2 * S);
        time.store(now, Ordering::Relaxed);
        let size = 2 + r.below(7) as usize;
        let bad = (round % 3 == 0).then(|| r.below(size as u64) as usize);
        let mut requests: Vec<(u64, Vec<LimitCall>)> = Vec::new();
        for q in 0..size {
            id += 1;
            let n = 1 + r.below(2) as usize;
            let mut calls: Vec<LimitCall> = (0..n)
                .map(|i| {
                    let a = Algorithm::ALL[r.below(6) as usize];
                    let p = param_sets(a)[0];
                    let op = [Op::Decide, Op::Decide, Op::Probe, Op::Charge][r.below(4) as usize];
                    LimitCall {
                        // Few keys: requests of one batch meet on them.
                        key: format!("batch:{}:{}:{{b}}", a.name(), (i as u64 + r.below(2)) % 2),
                        params: p,
                        cost: cost(&mut r, &p),
                        shadow: r.below(5) == 0,
                        op,
                    }
                })
                .collect();
            calls.dedup_by(|a, b| a.key == b.key);
            if bad == Some(q) {
                calls[0].params.limit = 0; // refused by the script's argument checks
            }
            requests.push((id, calls));
        }
        let nonces: Vec<String> = requests.iter().map(|(id, _)| format!("t{id}")).collect();
        let keys: Vec<String> = requests
            .iter()
            .flat_map(|(_, c)| c.iter().map(|c| c.key.clone()))
            .collect();
        // Every other round the keys follow in ARGV, as a batch for one Cluster node sends them.
        let in_argv = round % 2 == 1;
        let declared = if in_argv { 0 } else { keys.len() };
        let mut args: Vec<String> = [lua.head(), vec![declared.to_string()]].concat();
        if !in_argv {
            args.extend(keys.iter().cloned());
        }
        args.extend(scripts::batch_argv(
            nonces
                .iter()
                .zip(&requests)
                .map(|(n, (_, c))| (n.as_str(), &c[..])),
        ));
        if in_argv {
            args.extend(keys);
        }
        args.push(now.to_string());
        let sizes: Vec<usize> = requests.iter().map(|(_, c)| c.len()).collect();
        let reply = lua.batch(&args, &sizes);
        for (q, ((rid, calls), got)) in requests.iter().zip(reply).enumerate() {
            if bad == Some(q) {
                let e = got.expect_err("the bad request was decided");
                assert!(e.contains("bad limit"), "round {round}: {e}");
                continue;
            }
            let want = mem.decide_as(calls, *rid);
            assert_eq!(got, Ok(want), "round {round}, request {q}: {calls:?}");
        }
    }
}

/// A request whose shape (its part of a batch's ARGV: `index:cost:shadow:op` per key) is
/// malformed gets its own error naming that argument, and writes nothing; the requests before
/// and after it, even one with the same shape as a bad one, are told apart and decided. A
/// batch missing arguments is refused whole. A library, which keeps the valid shapes it read
/// for its next calls, keeps none of the bad ones: the same batch a second time is answered
/// the same.
#[test]
fn a_malformed_request_shape_fails_that_request_alone() {
    let redis = RedisServer::start();
    malformed_shapes_fail_alone(Lua::pinned(redis.conn()), redis.conn());
    let redis = RedisServer::start();
    malformed_shapes_fail_alone(Lua::pinned_library(redis.conn()), redis.conn());
    // FLUSHALL keeps the library, and what it read: called again, on a new connection.
    redis.conn().cmd_ok(&["FLUSHALL"]);
    let again = Lua::on(redis.conn(), "FCALL", "sluice_pinned");
    malformed_shapes_fail_alone(again, redis.conn());
}

fn malformed_shapes_fail_alone(mut lua: Lua, mut conn: Conn) {
    let p = params(Algorithm::TokenBucket, 5, 60 * S, None);
    // (shape, its keys, what the request must answer: 5 integers per key, or an error)
    let cases: [(&str, &[&str], Option<&str>); 7] = [
        ("1:1:0:0", &["s:ok1"], None),
        ("1:1:0", &["s:bad1"], Some("bad request shape")),
        ("2:1:0:0", &["s:bad2"], Some("bad limit index")),
        ("1:1:2:0", &["s:bad3"], Some("bad shadow flag")),
        (
            "1:1e3:0:0,1:1:0:0",
            &["s:bad4", "s:bad5"],
            Some("bad request shape"),
        ),
        ("1:1:0:0,1:2:0:0", &["s:ok2", "s:ok3"], None),
        ("1:1:0", &["s:bad6"], Some("bad request shape")),
    ];
    let requests: Vec<(&str, &[&str])> = cases.iter().map(|c| (c.0, c.1)).collect();
    let args = lua.raw_batch(&p, &requests, Some(T0));
    // ARGV index of the first request's nonce: after `batch`, the counts and one limit's six.
    let first = 3 + 6 + 1;
    // Cut short (the last shape missing, or the last two arguments): the whole call is
    // refused before anything is written.
    for cut in [2, 3] {
        let mut short = args.clone();
        short.drain(short.len() - cut..short.len() - 1);
        let short: Vec<&str> = short.iter().map(String::as_str).collect();
        match lua.conn.cmd(&short) {
            Resp::Error(e) => assert!(e.contains("does not match"), "{e}"),
            other => panic!("a batch cut short answered {other:?}"),
        }
        assert_eq!(conn.cmd_ok(&["EXISTS", "s:ok1"]).as_int(), 0);
    }
    let sizes: Vec<usize> = cases.iter().map(|c| c.1.len()).collect();
    let reply = lua.batch(&args, &sizes);
    for (i, ((shape, keys, want), got)) in cases.iter().zip(reply).enumerate() {
        match want {
            None => {
                let d = got.unwrap();
                assert!(d.iter().all(|d| d.code == Code::Allowed), "{shape}: {d:?}");
                for k in *keys {
                    assert_eq!(conn.cmd_ok(&["EXISTS", k]).as_int(), 1, "{shape}: {k}");
                }
            }
            Some(err) => {
                let e = got.expect_err(shape);
                let at = format!("ARGV[{}]", first + 2 * i + 1);
                assert!(e.contains(err) && e.contains(&at), "{shape}: {e}");
                for k in *keys {
                    assert_eq!(conn.cmd_ok(&["EXISTS", k]).as_int(), 0, "{shape}: {k}");
                }
            }
        }
    }
}

/// A library keeps the shapes a call read for the next calls with the same limits, but a limit
/// that is bad at a call's `now` (its window reaching past 2^53 µs) lends none: every request
/// naming it fails, and nothing is written. The same limit before and after is decided.
#[test]
fn a_limit_bad_at_this_calls_clock_is_not_saved_by_shapes_read_before() {
    let redis = RedisServer::start();
    let mut lua = Lua::pinned_library(redis.conn());
    let mut conn = redis.conn();
    let p = params(Algorithm::TokenBucket, 5, 60 * S, None);
    let late = (1u64 << 53) - 60 * S;
    for (now, key, ok) in [(T0, "c:a", true), (late, "c:b", false), (T0, "c:c", true)] {
        let args = lua.raw_batch(&p, &[("1:1:0:0", &[key]), ("1:1:0:0", &[key])], Some(now));
        for got in lua.batch(&args, &[1, 1]) {
            match got {
                Ok(d) => assert!(ok && d[0].limit == 5, "{key} at {now}: {d:?}"),
                Err(e) => assert!(!ok && e.contains("past 2^53"), "{key} at {now}: {e}"),
            }
        }
        assert_eq!(
            conn.cmd_ok(&["EXISTS", key]).as_int(),
            i64::from(ok),
            "{key}"
        );
    }
}

/// The production library keeps the shapes a call read for the next calls, but per set of
/// limits: three batches send the same shape (`1:1:0:0`, "the first limit, cost 1") for limits
/// of different sizes, and each is decided on its own limit. A bad shape in one call is not
/// remembered in the next either.
#[test]
fn a_library_call_reads_its_own_limits_not_the_previous_calls() {
    let redis = RedisServer::start();
    let mut lua = Fcall::on(redis.conn());
    for (n, key) in [(1, "lib:a"), (5, "lib:b"), (1, "lib:a")] {
        let p = params(Algorithm::TokenBucket, n, 60 * S, None);
        let d = lua.batch(&[(key, "1:1:0:0")], p).remove(0).unwrap();
        assert_eq!(d[0].limit, n, "{key}: {d:?}");
    }
    // lib:a had one token, taken by the first call: the third was refused.
    let p = params(Algorithm::TokenBucket, 1, 60 * S, None);
    let d = lua.batch(&[("lib:a", "1:1:0:0")], p).remove(0).unwrap();
    assert_eq!(d[0].code, Code::Limited);
    let bad = lua.batch(&[("lib:c", "1:1:0")], p).remove(0);
    assert!(bad.unwrap_err().contains("bad request shape"));
    let d = lua.batch(&[("lib:c", "1:1:0:0")], p).remove(0).unwrap();
    assert_eq!(d[0].code, Code::Allowed);
}

/// The production library on one connection, called with FCALL (not `scripts::Library`,
/// which is its name and code).
struct Fcall(Lua);

impl Fcall {
    fn on(conn: Conn) -> Fcall {
        Fcall(Lua::library(conn))
    }

    /// One batch through FCALL: per request its key and shape, all on limit `p`.
    fn batch(
        &mut self,
        requests: &[(&str, &str)],
        p: Params,
    ) -> Vec<Result<Vec<Decision>, String>> {
        let lua = &mut self.0;
        let one_key: Vec<[&str; 1]> = requests.iter().map(|r| [r.0]).collect();
        let requests: Vec<(&str, &[&str])> = requests
            .iter()
            .zip(&one_key)
            .map(|(r, k)| (r.1, &k[..]))
            .collect();
        let args = lua.raw_batch(&p, &requests, None);
        lua.batch(&args, &vec![1; requests.len()])
    }
}
