//! Compile time of a large bundle (1,000 rules, 200 worker sets). Target: ≤ 20 ms.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

// The allocator `kinfctl` and `kinference` ship with: compile time is what they see.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn compile_large(c: &mut Criterion) {
    let text = kinf_lang::synthetic::synthetic_bundle(1000, 200);
    let mut sources = kinf_lang::Sources::new();
    sources.add("bundle.yaml", text);
    // Warm the schema validators once (process start-up cost, measured separately).
    let _ = kinf_lang::compile(&sources);
    c.bench_function("compile_1000_rules_200_worker_sets", |b| {
        b.iter(|| black_box(kinf_lang::compile(black_box(&sources))))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = compile_large
}
criterion_main!(benches);
