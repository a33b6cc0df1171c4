//! Rendering the gateway's own 429: the problem+json body and `Retry-After`.
//! Under a flood of refused requests this is most of what the gateway does per request
//! besides HTTP itself.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice::pipeline::respond::GatewayError;

fn limited(c: &mut Criterion) {
    c.bench_function("GatewayError::Limited into_response", |b| {
        b.iter(|| {
            let e = GatewayError::Limited {
                route: "deny".into(),
                limit: "k".into(),
                retry_after: black_box(1),
            };
            black_box(e.into_response())
        })
    });
}

criterion_group!(benches, limited);
criterion_main!(benches);
