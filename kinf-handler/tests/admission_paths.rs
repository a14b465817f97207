//! Large bodies take one of two admission paths: in place when the request is alone in the
//! gateway (and at most 256 KiB), on the blocking pool otherwise. Both must give the same
//! answer: a 40 KiB prompt alone and eight of them at once, and a 300 KiB prompt alone, reach
//! the worker with the same prompt-token counts as when sent to the worker directly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{Value, json};
use support::{gateway, post_json, temp_dir, tiny_sim, tiny_tokenizer, write_tiny_bundle};

fn body(words: usize, salt: usize) -> Value {
    let text: String = (0..words)
        .map(|i| ["alpha ", "beta ", "gamma ", "delta "][(i + salt) % 4])
        .collect();
    json!({"model": "tiny-llama", "max_tokens": 1,
        "messages": [{"role": "user", "content": text}]})
}

fn prompt_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_pooled_admission_agree() {
    let tok = tiny_tokenizer();
    let worker = tiny_sim(
        "1000000",
        &[
            "--tokenizer",
            &tok,
            "--block-size",
            "16",
            "--max-model-len",
            "200000",
            "--num-gpu-blocks",
            "60000",
        ],
    )
    .await;
    let dir = temp_dir("admission-paths");
    write_tiny_bundle(
        &dir,
        &worker.http.to_string(),
        &format!("  blockSize: 16\n  tokenizer: {{ path: {tok} }}\n"),
    );
    let (_gw, addr) = gateway(&dir).await;

    // ≈40 KiB: over the 16 KiB threshold, under the 256 KiB in-place limit.
    let mid = body(6_500, 0);
    assert!(mid.to_string().len() > 16 << 10 && mid.to_string().len() < 256 << 10);
    let (s, _, direct) = post_json(worker.http, "/v1/chat/completions", &mid, &[]).await;
    assert_eq!(s, 200, "{direct}");
    let want = prompt_tokens(&direct);

    // Alone: admitted in place.
    let (s, _, alone) = post_json(addr, "/v1/chat/completions", &mid, &[]).await;
    assert_eq!(s, 200, "{alone}");
    assert_eq!(prompt_tokens(&alone), want);

    // Eight at once: the blocking pool (others are in flight).
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let b = mid.clone();
        tasks.push(tokio::spawn(async move {
            post_json(addr, "/v1/chat/completions", &b, &[]).await
        }));
    }
    for t in tasks {
        let (s, _, v) = t.await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(prompt_tokens(&v), want);
    }

    // ≈300 KiB alone: over the in-place limit, so the blocking pool.
    let big = body(50_000, 1);
    assert!(big.to_string().len() > 256 << 10);
    let (s, _, direct) = post_json(worker.http, "/v1/chat/completions", &big, &[]).await;
    assert_eq!(s, 200, "{direct}");
    let (s, _, via) = post_json(addr, "/v1/chat/completions", &big, &[]).await;
    assert_eq!(s, 200, "{via}");
    assert_eq!(prompt_tokens(&via), prompt_tokens(&direct));
}
