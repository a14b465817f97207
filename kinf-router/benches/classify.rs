//! Built-in classifiers (PII with every entity + complexity) on a 2k- and a 16k-token prompt.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use kinf_router::classify::{Classifiers, Message};

#[path = "common/prompt.rs"]
mod common;

use common::prompt;

fn bench(c: &mut Criterion) {
    let cl = Classifiers::default();
    for (name, tokens) in [("2k", 2048), ("16k", 16384)] {
        let text = prompt(tokens);
        let msgs = [
            Message::new("system", "You are a helpful assistant."),
            Message::new("user", &text),
        ];
        c.bench_function(&format!("classify/{name}"), |b| {
            b.iter(|| cl.classify(std::hint::black_box(&msgs)))
        });
        if let Some(p) = cl.pii() {
            c.bench_function(&format!("pii/{name}"), |b| {
                b.iter(|| p.scan(std::hint::black_box(&msgs)))
            });
        }
        if let Some(x) = cl.complexity() {
            c.bench_function(&format!("complexity/{name}"), |b| {
                b.iter(|| x.level(std::hint::black_box(&msgs)))
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
