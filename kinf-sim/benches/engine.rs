//! Criterion benchmarks of the simulated engine: block hashing, one request through an engine,
//! and a 100-engine fleet (simulated requests per second of wall time).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kinf_sim::bench::{BenchSpec, BenchWorkload};
use kinf_sim::hash::{Rng, block_hashes};
use kinf_sim::{Engine, EngineOptions, Profile, Request};

fn hashing(c: &mut Criterion) {
    let toks = Rng::new(1).tokens(16_256, 151_936);
    let mut g = c.benchmark_group("hash");
    g.throughput(Throughput::Elements(toks.len() as u64));
    g.bench_function("block_hashes_16k_tokens_bs16", |b| {
        b.iter(|| block_hashes(black_box(&toks), 16))
    });
    g.finish();
}

fn one_request(c: &mut Criterion) {
    let profile = Profile::l40s_qwen27b_fp8();
    let prompt: std::sync::Arc<[u32]> = Rng::new(2).tokens(16_256, 151_936).into();
    let quiet = EngineOptions {
        kv_events: false,
        token_outputs: false,
    };
    let mut g = c.benchmark_group("engine");
    g.bench_function("cold_16k_prompt_256_out", |b| {
        b.iter(|| {
            let mut e = Engine::new(profile.clone(), quiet).unwrap();
            e.submit(Request::new(1, prompt.clone(), 256), 0.0).unwrap();
            let mut out = Vec::new();
            e.run_until_idle(&mut out);
            black_box(out.len())
        })
    });
    let mut warm = Engine::new(profile.clone(), quiet).unwrap();
    warm.submit(Request::new(0, prompt.clone(), 1), 0.0)
        .unwrap();
    let mut out = Vec::new();
    warm.run_until_idle(&mut out);
    let mut id = 1;
    g.bench_function("warm_16k_prompt_256_out", |b| {
        b.iter(|| {
            id += 1;
            let now = warm.now();
            warm.submit(Request::new(id, prompt.clone(), 256), now)
                .unwrap();
            out.clear();
            warm.run_until_idle(&mut out);
            black_box(out.len())
        })
    });
    g.finish();
}

fn fleet(c: &mut Criterion) {
    let mut g = c.benchmark_group("fleet");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    let requests = 20_000;
    g.throughput(Throughput::Elements(requests as u64));
    g.bench_function("100_workers_chat_20k_requests", |b| {
        b.iter(|| {
            let spec = BenchSpec {
                profile: Profile::l40s_qwen27b_fp8(),
                workers: 100,
                requests,
                workload: BenchWorkload::Chat,
                rate_per_worker: 1.0,
                kv_events: false,
                seed: 1,
            };
            black_box(kinf_sim::bench::run(&spec).unwrap().finished)
        })
    });
    g.finish();
}

criterion_group!(benches, hashing, one_request, fleet);
criterion_main!(benches);
