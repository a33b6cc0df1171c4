//! One decision of each algorithm on a warm key: through `algo::decide` directly, and through
//! `MemoryStore::decide` (hash, shard lock, map lookup, write-back), uncontended. Also what a
//! limit charged by the answer adds (a probe, then a charge) and a concurrency slot taken
//! and released, through the store.
//!
//! Every limit is 10 000 per second (I = 100 µs) and the clock advances by I per decision, so
//! each decision is an admission on a key in steady state (sliding_log holds ~10 000 entries).
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice::limiter::algo::{self, Algorithm, Op, Params};
use sluice::limiter::store::memory::{Clock, MemoryStore};
use sluice::limiter::store::LimitCall;
use std::sync::atomic::Ordering;

const T0: u64 = 1_700_000_000_000_000;
const STEP: u64 = 100;

fn params(a: Algorithm) -> Params {
    Params::new(a, 10_000, 1_000_000, None).expect("valid params")
}

fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("algo::decide");
    for a in Algorithm::ALL {
        let p = params(a);
        let (mut state, mut now) = (None, T0);
        g.bench_function(a.name(), |b| {
            b.iter(|| {
                now += STEP;
                black_box(algo::decide(&p, &mut state, black_box(now), 1, true))
            })
        });
    }
    g.finish();
}

fn store(c: &mut Criterion) {
    let mut g = c.benchmark_group("MemoryStore::decide");
    for a in Algorithm::ALL {
        let (clock, t) = Clock::manual(T0);
        let store = MemoryStore::new(100_000, clock);
        let calls = [LimitCall {
            key: format!("sluice:bench:per-ip:{}:{{0123456789abcdef}}", a.name()),
            params: params(a),
            cost: 1,
            shadow: false,
            op: Default::default(),
        }];
        g.bench_function(a.name(), |b| {
            b.iter(|| {
                t.fetch_add(STEP, Ordering::Relaxed);
                black_box(store.decide(black_box(&calls)))
            })
        });
    }
    g.finish();
}

/// The two store calls of an answer-charged limit (probe, charge), and of a concurrency
/// limit (take a slot, release it), per request.
fn settle(c: &mut Criterion) {
    let mut g = c.benchmark_group("MemoryStore two calls");
    let (clock, t) = Clock::manual(T0);
    let store = MemoryStore::new(100_000, clock);
    let call = |p: Params, op: Op| LimitCall {
        key: format!("sluice:bench:k:{}:{{0123456789abcdef}}", p.algorithm.name()),
        params: p,
        cost: 1,
        shadow: false,
        op,
    };
    let p = params(Algorithm::TokenBucket);
    let (probe, charge) = ([call(p, Op::Probe)], [call(p, Op::Charge)]);
    g.bench_function("token_bucket probe + charge", |b| {
        b.iter(|| {
            t.fetch_add(STEP, Ordering::Relaxed);
            black_box(store.decide(black_box(&probe)));
            black_box(store.decide(black_box(&charge)))
        })
    });
    let p = Params::concurrency(100, 30_000_000).expect("valid");
    let (take, release) = ([call(p, Op::Decide)], [call(p, Op::Release)]);
    let mut id = 0;
    g.bench_function("concurrency take + release", |b| {
        b.iter(|| {
            id += 1;
            black_box(store.decide_as(black_box(&take), id));
            black_box(store.decide_as(black_box(&release), id))
        })
    });
    g.finish();
}

criterion_group!(benches, direct, store, settle);
criterion_main!(benches);
