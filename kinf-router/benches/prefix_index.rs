//! Prefix index and KV-event decoder micro-benchmarks.
//!
//! Run: `cargo bench -p kinf-router --bench prefix_index -- --warm-up-time 1 --measurement-time 3`
//! Memory per (endpoint, block) pair is printed on stderr while the fixtures are built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kinf_router::kv_events::{
    BlockRemoved, BlockStored, KvEvent, Medium, decode_payload, encode_payload,
};
use kinf_router::prefix_index::{EndpointId, PrefixIndex, block_hashes};

const BS: usize = 32;

/// Deterministic xorshift64* generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next() % 32_000) as u32).collect()
    }
}

/// A vLLM-like engine hash: a function of the block's place in the chain, salted per endpoint.
fn engine(ep: u32, own: u64) -> u64 {
    own ^ u64::from(ep).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.into_iter().collect(),
        parent,
        token_ids: tokens,
        block_size: BS as u32,
        medium: Some(Medium::Gpu),
        extra_keys: None,
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
        ..Default::default()
    })
}

/// Events storing `prompt` on `ep` from block `from` on, `per_event` blocks per event, chained
/// by parent engine hash as vLLM does.
fn store_prompt(ep: u32, prompt: &[u32], from: usize, per_event: usize) -> Vec<KvEvent> {
    let own = block_hashes(prompt, BS);
    let mut out = Vec::new();
    let mut b = from;
    while b < own.len() {
        let e = (b + per_event).min(own.len());
        let parent = (b > 0).then(|| engine(ep, own[b - 1]));
        out.push(stored(
            own[b..e].iter().map(|&o| engine(ep, o)).collect(),
            parent,
            prompt[b * BS..e * BS].to_vec(),
        ));
        b = e;
    }
    out
}

/// Ingest workload: 8 endpoints × 128 conversations × 4 events of 16 blocks × 32 tokens.
fn ingest_workload() -> (Vec<(EndpointId, KvEvent)>, u64) {
    let mut rng = Rng(7);
    let mut evs = Vec::new();
    let mut blocks = 0;
    for _ in 0..128 {
        for ep in 0..8u32 {
            let prompt = rng.tokens(4 * 16 * BS);
            for e in store_prompt(ep, &prompt, 0, 16) {
                blocks += 16;
                evs.push((EndpointId(ep), e));
            }
        }
    }
    (evs, blocks)
}

fn per_pair(ix: &PrefixIndex, label: &str) {
    let st = ix.stats();
    eprintln!(
        "[memory] {label}: {} endpoints, {} blocks, {} pairs, {} bytes → {:.1} B/pair",
        st.endpoints,
        st.blocks,
        st.pairs,
        ix.memory_bytes(),
        ix.memory_bytes() as f64 / st.pairs.max(1) as f64
    );
}

fn bench_ingest(c: &mut Criterion) {
    let (events, blocks) = ingest_workload();
    let mut full = PrefixIndex::new(BS);
    for (ep, e) in &events {
        full.apply(*ep, e);
    }
    per_pair(&full, "ingest (8 endpoints, no sharing)");

    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(blocks));
    g.bench_function("block_stored_16x32", |b| {
        b.iter_batched(
            || PrefixIndex::new(BS),
            |mut ix| {
                for (ep, e) in &events {
                    ix.apply(*ep, e);
                }
                ix
            },
            BatchSize::PerIteration,
        );
    });
    // Evict everything again, 16 blocks per BlockRemoved.
    let removals: Vec<(EndpointId, KvEvent)> = events
        .iter()
        .map(|(ep, e)| {
            let KvEvent::BlockStored(s) = e else {
                unreachable!()
            };
            (
                *ep,
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: s.block_hashes.clone(),
                    medium: Some(Medium::Gpu),
                    group_idx: Some(0),
                }),
            )
        })
        .collect();
    g.bench_function("block_removed_16", |b| {
        b.iter_batched(
            || full.clone(),
            |mut ix| {
                for (ep, e) in &removals {
                    ix.apply(*ep, e);
                }
                ix
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

/// 8 endpoints, a 1,024-token request: a 16-block system prompt on every endpoint, the
/// conversation's next 16 blocks fully on endpoint 0 and half on endpoint 1, plus 4,096 unrelated
/// blocks per endpoint.
fn small_fleet() -> (PrefixIndex, Vec<u64>) {
    let mut rng = Rng(11);
    let mut ix = PrefixIndex::new(BS);
    let system = rng.tokens(16 * BS);
    let mut request = system.clone();
    request.extend(rng.tokens(16 * BS));
    for ep in 0..8u32 {
        let held = match ep {
            0 => 32,
            1 => 24,
            _ => 16,
        };
        for e in store_prompt(ep, &request[..held * BS], 0, 16) {
            ix.apply(EndpointId(ep), &e);
        }
        for _ in 0..128 {
            let mut other = system.clone();
            other.extend(rng.tokens(32 * BS));
            for e in store_prompt(ep, &other, 16, 16) {
                ix.apply(EndpointId(ep), &e);
            }
        }
    }
    per_pair(&ix, "8 endpoints, 1k-token request");
    (ix, block_hashes(&request, BS).to_vec())
}

/// `eps` endpoints, a 16,384-token request (512 blocks); endpoint i holds the first
/// `prefix(i)` blocks of it plus `noise` unrelated blocks.
fn big_fleet(
    eps: u32,
    prefix: impl Fn(u32) -> usize,
    noise: usize,
    label: &str,
) -> (PrefixIndex, Vec<u64>) {
    let mut rng = Rng(13);
    let mut ix = PrefixIndex::new(BS);
    let request = rng.tokens(512 * BS);
    for ep in 0..eps {
        let n = prefix(ep);
        for e in store_prompt(ep, &request[..n * BS], 0, 16) {
            ix.apply(EndpointId(ep), &e);
        }
        let other = rng.tokens(noise * BS);
        for e in store_prompt(ep, &other, 0, 16) {
            ix.apply(EndpointId(ep), &e);
        }
    }
    per_pair(&ix, label);
    (ix, block_hashes(&request, BS).to_vec())
}

fn bench_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("match_prefix");
    let mut out = Vec::with_capacity(1024);

    let (ix, req) = small_fleet();
    ix.match_prefix(&req, &mut out);
    assert_eq!(out.len(), 8);
    g.bench_function("8ep_1k_tokens", |b| {
        b.iter(|| {
            ix.match_prefix(black_box(&req), &mut out);
            black_box(out.len())
        });
    });
    drop(ix);

    // Many endpoints share parts of the prefix: every one holds ≥ 32 blocks (a system prompt),
    // spread up to all 512.
    let (ix, req) = big_fleet(
        512,
        |i| 32 + (i as usize * 97) % 481,
        512,
        "512 endpoints, 16k-token request, prefixes 32..512 blocks",
    );
    ix.match_prefix(&req, &mut out);
    assert_eq!(out.len(), 512);
    g.bench_function("512ep_16k_tokens", |b| {
        b.iter(|| {
            ix.match_prefix(black_box(&req), &mut out);
            black_box(out.len())
        });
    });
    drop(ix);

    // The shapes of dynamo-kv-router's published figures (NOTES.md §6): a 500-block request
    // matched fully by 4 and by 256 workers.
    for matching in [4u32, 256] {
        let (ix, req) = big_fleet(
            matching,
            |_| 500,
            256,
            &format!("{matching} endpoints all holding a 500-block request"),
        );
        let req = req[..500].to_vec();
        ix.match_prefix(&req, &mut out);
        assert_eq!(out.len(), matching as usize);
        g.bench_function(format!("500_blocks_{matching}_matching"), |b| {
            b.iter(|| {
                ix.match_prefix(black_box(&req), &mut out);
                black_box(out.len())
            });
        });
    }
    g.finish();

    let mut g = c.benchmark_group("hash");
    let toks = Rng(5).tokens(16_384);
    g.throughput(Throughput::Elements(toks.len() as u64));
    g.bench_function("block_hashes_16k_tokens", |b| {
        b.iter(|| black_box(block_hashes(black_box(&toks), BS)));
    });
    g.finish();
}

fn bench_decode(c: &mut Criterion) {
    let mut rng = Rng(3);
    let evs = store_prompt(0, &rng.tokens(16 * BS), 0, 16);
    let payload = encode_payload(1_795_960_068.145_685, &evs, Some(0));
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(16));
    g.bench_function("block_stored_16x32_ours", |b| {
        b.iter(|| black_box(decode_payload(black_box(&payload)).unwrap()));
    });
    g.bench_function("block_stored_16x32_rmpv_value_only", |b| {
        b.iter(|| {
            let mut r = black_box(&payload[..]);
            black_box(rmpv::decode::read_value(&mut r).unwrap())
        });
    });
    g.finish();
}

criterion_group!(benches, bench_ingest, bench_match, bench_decode);
criterion_main!(benches);
