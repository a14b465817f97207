//! Chat requests without `max_tokens`: the gateway reserves 256 output tokens for each until the
//! model has answered 20 of them, then what they generated on average (per sequence). Seen in
//! the token-rate limit's reservation (`x-ratelimit-remaining-tokens` at admission) and the
//! `kinference_output_tokens_estimate` metric, against a `kinf-sim` worker whose context of 64
//! tokens ends every answer early.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use support::post_json as post;
use support::*;

/// A pool-wide token limit over the tiny worker set of [`write_tiny_bundle`].
const BUDGET: &str = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: budgets, namespace: t }
spec:
  limits:
  - name: pool-budget
    tokensPerMinute: 6000000
"#;

/// Sends `body`; its status, the tokens left in the budget once it was admitted, and what it
/// generated.
async fn send(addr: SocketAddr, path: &str, body: &serde_json::Value) -> (u16, u64, u64) {
    let (s, h, v) = post(addr, path, body, &[]).await;
    let left = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let usage = &v["usage"];
    let out = usage["completion_tokens"]
        .as_u64()
        .or(usage["output_tokens"].as_u64())
        .unwrap_or_else(|| panic!("{v}"));
    (s, left, out)
}

async fn estimate_metric(addr: SocketAddr) -> Option<f64> {
    let (_, text) = get_text(addr, "/metrics").await;
    text.lines()
        .find(|l| l.starts_with("kinference_output_tokens_estimate{model=\"tiny-llama\"}"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_max_tokens_reserve_what_the_model_answers_on_average() {
    let worker = tiny_sim("50", &["--max-model-len", "64"]).await;
    let dir = temp_dir("output-lengths");
    write_tiny_bundle(&dir, &worker.http.to_string(), "");
    std::fs::write(dir.join("budgets.yaml"), BUDGET).unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let chat =
        json!({"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]});
    // The bucket holds 6,000,000 tokens and refills 100,000 a second: it is full again at the
    // next admission, which then reserves its prompt and its output estimate.
    let capacity = 6_000_000;

    // Explicit limits teach nothing: the default stays.
    for _ in 0..25 {
        let (s, _, _) = send(
            addr,
            "/v1/chat/completions",
            &json!({"model": "tiny-llama", "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hello there"}]}),
        )
        .await;
        assert_eq!(s, 200);
    }
    assert_eq!(estimate_metric(addr).await, None);

    let (s, left, answered) = send(addr, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200);
    let prompt = capacity - left - 256;
    assert!(
        answered > 3 && answered < 64,
        "the context ends the answer: {answered}"
    );
    for i in 2..=20 {
        let (s, left, out) = send(addr, "/v1/chat/completions", &chat).await;
        assert_eq!((s, out), (200, answered));
        assert_eq!(
            capacity - left,
            prompt + 256,
            "request {i}: still the default"
        );
    }
    // Twenty answers known: the next reserves what they generated.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s, left, _) = send(addr, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200);
    assert_eq!(capacity - left, prompt + answered);
    assert_eq!(estimate_metric(addr).await, Some(answered as f64));
    let (_, status) = get_text(addr, "/admin/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let learned = &status["outputEstimates"];
    assert_eq!(learned.as_array().map(Vec::len), Some(1), "{status}");
    assert_eq!(
        (
            &learned[0]["model"],
            &learned[0]["meanOutputTokens"],
            &learned[0]["estimate"]
        ),
        (
            &json!("tiny-llama"),
            &json!(answered as f64),
            &json!(answered)
        ),
        "{status}"
    );
    // The 21st answer may have been learned by now.
    assert!(
        matches!(learned[0]["observations"].as_u64(), Some(20 | 21)),
        "{status}"
    );
    // A completion without `max_tokens` gets vLLM's default of 16, learned nothing from.
    let prompt_only = json!({"model": "tiny-llama", "prompt": "hello there"});
    let (s, left, out) = send(addr, "/v1/completions", &prompt_only).await;
    assert_eq!((s, out), (200, 16));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let explicit = json!({"model": "tiny-llama", "prompt": "hello there", "max_tokens": 16});
    let (s, left_explicit, _) = send(addr, "/v1/completions", &explicit).await;
    assert_eq!((s, left), (200, left_explicit));
}
