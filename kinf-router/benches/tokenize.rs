//! Chat tokenization micro-benchmarks (`kinf_router::tokenize`, tiny-llama tokenizer).
//!
//! Run: `cargo bench -p kinf-router --bench tokenize -- --warm-up-time 1 --measurement-time 3`
//! Medians are in `target/criterion/<group>/<bench>/new/estimates.json` (`median`).
//!
//! * `chat16k/system_warm_user_new`: a ≈16k-token chat whose ≈15k-token system prompt was seen
//!   before; the ≈1k-token user message is new on every iteration (the realistic hot path).
//! * `chat16k/all_warm`: the same request again (every segment cached).
//! * `chat16k/cold`: the segment cache is emptied before every iteration.
//! * `chat1k/cold`, `chat1k/warm`: a ≈1k-token chat.
//! * `render16k`: rendering the chat template only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::cell::Cell;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kinf_router::tokenize::{ChatMessage, ChatTokenizer};

const TOKENIZER_JSON: &str = include_str!("../../testdata/tokenizers/tiny-llama/tokenizer.json");
const CONFIG_JSON: &str =
    include_str!("../../testdata/tokenizers/tiny-llama/tokenizer_config.json");

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "that",
    "with",
    "as",
    "on",
    "by",
    "this",
    "be",
    "are",
    "from",
    "or",
    "it",
    "an",
    "at",
    "which",
    "not",
    "can",
    "return",
    "value",
    "self",
    "import",
    "def",
    "class",
    "None",
    "True",
    "False",
    "list",
    "dict",
    "string",
    "token",
    "prefix",
    "cache",
    "block",
    "router",
    "worker",
    "request",
    "policy",
    "model",
    "latency",
    "throughput",
    "queue",
    "schedule",
    "decode",
    "prefill",
    "(",
    ")",
    ":",
    ",",
    ".",
    "\n",
];

/// Deterministic prose of `n` words.
fn words(seed: u64, n: usize) -> String {
    let mut x = seed;
    let mut out = String::with_capacity(n * 6);
    for i in 0..n {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[((x >> 33) % WORDS.len() as u64) as usize]);
    }
    out
}

/// Prose of about `tokens` tokens.
fn text_of_tokens(tok: &ChatTokenizer, seed: u64, tokens: usize) -> String {
    let probe = words(seed, 1000);
    let per_word = tok.encode_text_uncached(&probe, false).unwrap().len() as f64 / 1000.0;
    words(seed, (tokens as f64 / per_word) as usize)
}

fn chat(system: &str, user: String) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", system),
        ChatMessage::new("user", user),
    ]
}

fn bench(c: &mut Criterion) {
    let tok = ChatTokenizer::from_files_content(TOKENIZER_JSON, Some(CONFIG_JSON)).unwrap();
    let system = text_of_tokens(&tok, 1, 15_000);
    let user = text_of_tokens(&tok, 2, 1_000);
    let n16 = tok.encode_chat(&chat(&system, user.clone())).unwrap().len();
    let small_system = text_of_tokens(&tok, 3, 200);
    let small_user = text_of_tokens(&tok, 4, 800);
    let n1 = tok
        .encode_chat(&chat(&small_system, small_user.clone()))
        .unwrap()
        .len();
    eprintln!(
        "chat16k: {n16} tokens ({} bytes), chat1k: {n1} tokens",
        system.len() + user.len()
    );

    let mut g = c.benchmark_group("chat16k");
    // A new user message per iteration: a counter in front makes the segment unique.
    let counter = Cell::new(0u64);
    tok.encode_chat(&chat(&system, user.clone())).unwrap();
    g.bench_function("system_warm_user_new", |b| {
        b.iter_batched(
            || {
                counter.set(counter.get() + 1);
                chat(&system, format!("Request {}: {user}", counter.get()))
            },
            |msgs| black_box(tok.encode_chat(&msgs).unwrap()),
            BatchSize::SmallInput,
        )
    });
    let same = chat(&system, user.clone());
    g.bench_function("all_warm", |b| {
        b.iter(|| black_box(tok.encode_chat(black_box(&same)).unwrap()))
    });
    g.bench_function("cold", |b| {
        b.iter_batched(
            || tok.clear_cache(),
            |()| black_box(tok.encode_chat(&same).unwrap()),
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("chat1k");
    let small = chat(&small_system, small_user.clone());
    g.bench_function("cold", |b| {
        b.iter_batched(
            || tok.clear_cache(),
            |()| black_box(tok.encode_chat(&small).unwrap()),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("warm", |b| {
        b.iter(|| black_box(tok.encode_chat(black_box(&small)).unwrap()))
    });
    g.finish();

    c.bench_function("render16k", |b| {
        b.iter(|| black_box(tok.render_chat(black_box(&same)).unwrap()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
