//! Decision latency (prefix lookup included, tokenization excluded).
//! Targets on one core: ≤ 5 µs p50 with 8 endpoints and a 1k-token prompt, ≤ 50 µs with 512
//! endpoints and a 16k-token prompt.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kinf_router::synthetic::decide_scenario;
use kinf_router::{Decider, TraceDetail};
use std::hint::black_box;

fn decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide");
    for (endpoints, tokens) in [(8usize, 1024usize), (64, 4096), (512, 16384)] {
        let (policy, req, state) = decide_scenario(endpoints, tokens).expect("scenario compiles");
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{endpoints}ep_{tokens}tok")),
            &(),
            |b, _| b.iter(|| black_box(Decider::decide(&policy, black_box(&req), &state))),
        );
    }
    g.finish();
}

/// The gateway's path (`TraceDetail::Summary`) at fleet size: 1,000 endpoints, 2k-token prompt.
fn decide_summary(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide_summary");
    for (endpoints, tokens) in [(8usize, 1024usize), (1000, 2048)] {
        let (policy, req, state) = decide_scenario(endpoints, tokens).expect("scenario compiles");
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{endpoints}ep_{tokens}tok")),
            &(),
            |b, _| {
                b.iter(|| {
                    black_box(Decider::decide_with(
                        &policy,
                        black_box(&req),
                        &state,
                        TraceDetail::Summary,
                    ))
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, decide, decide_summary);
criterion_main!(benches);
