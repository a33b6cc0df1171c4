//! Rendering the gateway's own 429: the problem+json body and `Retry-After`.
//! Under a flood of refused requests this is most of what the gateway does per request
//! besides HTTP itself.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::sync::Arc;

use sluice::pipeline::respond::{GatewayError, Refusal};

fn limited(c: &mut Criterion) {
    let refusal = Arc::new(Refusal::new("deny".into(), "k".into()));
    c.bench_function("GatewayError::Limited into_response", |b| {
        b.iter(|| {
            let e = GatewayError::Limited {
                refusal: refusal.clone(),
                retry_after: black_box(1),
            };
            black_box(e.into_response())
        })
    });
}

criterion_group!(benches, limited);
criterion_main!(benches);
