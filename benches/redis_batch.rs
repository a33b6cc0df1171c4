//! The gateway's side of a batched Redis decision: encoding a batch's ARGV
//! (`scripts::batch_argv`: each distinct limit once, then each request's nonce and shape) and
//! decoding its reply (`scripts::batch_decisions`: one flat array, per request 5 integers per
//! key or its own error).
//! Batches of 1, 16 and 64 requests (the most one call carries), one token-bucket limit each,
//! as on the peer rig's Redis route.
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use fred::types::Value;
use sluice::limiter::algo::{Algorithm, Params};
use sluice::limiter::store::{scripts, LimitCall};

fn requests(n: usize) -> (Vec<String>, Vec<Vec<LimitCall>>) {
    let p = Params::new(
        Algorithm::TokenBucket,
        10_000_000,
        1_000_000,
        Some(10_000_000),
    )
    .expect("valid params");
    let nonces = (0..n)
        .map(|i| format!("0123456789abcdef{i:016x}"))
        .collect();
    let calls = (0..n)
        .map(|i| {
            vec![LimitCall {
                key: format!("sluice:pass:k:token_bucket:{{{i:016x}}}"),
                params: p,
                cost: 1,
                shadow: false,
                op: Default::default(),
            }]
        })
        .collect();
    (nonces, calls)
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("scripts::batch_argv");
    for n in [1, 16, 64] {
        let (nonces, calls) = requests(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let reqs = nonces.iter().zip(&calls).map(|(s, c)| (s.as_str(), &c[..]));
                black_box(scripts::batch_argv(black_box(reqs)))
            })
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("scripts::batch_decisions");
    for n in [1, 16, 64] {
        let reply: Vec<Value> = (0..n)
            .flat_map(|i| [0, 10_000_000, 9_999_999 - i as i64, 0, 100].map(Value::Integer))
            .collect();
        let sizes = vec![1; n];
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(scripts::batch_decisions(black_box(reply.clone()), &sizes)))
        });
    }
    g.finish();
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
