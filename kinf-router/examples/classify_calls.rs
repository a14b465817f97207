//! Runs the built-in classifiers on the benchmark prompt a fixed number of times, for
//! instruction counts under callgrind (repeatable where wall-clock timings are not):
//!
//! ```sh
//! cargo build --release -p kinf-router --example classify_calls
//! valgrind --tool=callgrind --toggle-collect='*Classifiers*classify*' \
//!     target/release/examples/classify_calls 2048 100
//! ```
//!
//! Arguments: prompt size in tokens (default 2048), calls (default 100).
#![allow(missing_docs)]

#[path = "../benches/common/prompt.rs"]
mod common;

use kinf_router::classify::{Classifiers, Message};

fn main() {
    let mut args = std::env::args().skip(1);
    let tokens = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let cl = Classifiers::default();
    let text = common::prompt(tokens);
    let msgs = [
        Message::new("system", "You are a helpful assistant."),
        Message::new("user", &text),
    ];
    let mut tags = 0;
    for _ in 0..calls {
        tags += cl.classify(std::hint::black_box(&msgs)).tags.len();
    }
    println!("{tokens} tokens, {calls} calls, {tags} tags");
}
