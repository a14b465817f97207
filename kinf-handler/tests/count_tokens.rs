//! `POST /v1/messages/count_tokens`: counted by a worker that serves the model the request
//! would go to (a kinf-sim worker, which answers as vLLM 0.32 does), decided without being
//! routed; refusals and unreachable workers in Anthropic's shape; a provider route answered
//! with the gateway's own count, marked as an estimate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/fake_provider.rs"]
mod fake_provider;
mod support;

use fake_provider::Fake;
use serde_json::{Value, json};
use support::{gateway, get_text, post_json, temp_dir, tiny_sim, write_tiny_bundle};

fn body(model: &str, text: &str) -> Value {
    json!({
        "model": model,
        "system": "You count.",
        "messages": [{"role": "user", "content": text}],
    })
}

/// The value of the first sample of `name` whose labels contain `labels`, in a `/metrics` text.
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_counts_the_prompt_and_nothing_is_routed() {
    let worker = tiny_sim("1000", &[]).await;
    let dir = temp_dir("count-tokens");
    write_tiny_bundle(&dir, &worker.http.to_string(), "");
    let (_gw, addr) = gateway(&dir).await;

    let text = "How many tokens are in this sentence, with its system prompt?";
    let (s, h, v) = post_json(
        addr,
        "/v1/messages/count_tokens",
        &body("tiny-llama", text),
        &[],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let counted = v["input_tokens"].as_u64().unwrap();
    assert_eq!(v["context_management"]["original_input_tokens"], counted);
    assert_eq!(h["x-kinference-endpoint"], worker.http.to_string().as_str());
    assert!(h.get("x-kinference-count").is_none());

    // Counted without being routed: no decision, no cache claim, no request on the worker.
    let (_, metrics) = get_text(addr, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "kinference_requests_total",
            "api=\"count_tokens\""
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "kinference_decisions_total", ""),
        None,
        "{metrics}"
    );

    // The same prompt as a Messages request: the worker's usage adds up to the count.
    let mut m = body("tiny-llama", text);
    m["max_tokens"] = json!(2);
    let (s, _, v) = post_json(addr, "/v1/messages", &m, &[]).await;
    assert_eq!(s, 200, "{v}");
    let u = &v["usage"];
    let prompt = u["input_tokens"].as_u64().unwrap()
        + u["cache_read_input_tokens"].as_u64().unwrap()
        + u["cache_creation_input_tokens"].as_u64().unwrap();
    assert_eq!(prompt, counted, "{v}");
    let (_, metrics) = get_text(addr, "/metrics").await;
    assert_eq!(
        sample(&metrics, "kinference_decisions_total", ""),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_lost_workers_get_anthropic_errors() {
    let worker = tiny_sim("1000", &[]).await;
    let dir = temp_dir("count-tokens-errors");
    write_tiny_bundle(&dir, &worker.http.to_string(), "");
    let (_gw, addr) = gateway(&dir).await;
    let path = "/v1/messages/count_tokens";

    let (s, _, v) = post_json(addr, path, &json!({"messages": []}), &[]).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`model` is required"),
        "{v}"
    );

    let (s, _, v) = post_json(addr, path, &body("nope", "hi"), &[]).await;
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`nope`"),
        "{v}"
    );

    // A max_tokens the client sent is passed on as it is (vLLM ignores it there).
    let mut with_max = body("tiny-llama", "hi");
    with_max["max_tokens"] = json!(5);
    let (s, _, v) = post_json(addr, path, &with_max, &[]).await;
    assert_eq!(s, 200, "{v}");

    let (_, metrics) = get_text(addr, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "kinference_requests_total",
            "api=\"count_tokens\",status=\"400\""
        ),
        Some(1.0),
        "{metrics}"
    );

    worker.stop();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (s, _, v) = post_json(addr, path, &body("tiny-llama", "hi"), &[]).await;
    assert!(s == 502 || s == 503, "{s} {v}");
    assert_eq!(v["type"], "error", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_route_is_answered_with_the_gateways_estimate() {
    let openai = Fake::start().await;
    let dir = temp_dir("count-tokens-provider");
    std::fs::write(dir.join("openai.token"), fake_provider::OPENAI_KEY).unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: openai, namespace: t }}
spec:
  type: OpenAI
  url: {url}/v1
  credentials: {{ file: openai.token }}
  models:
  - {{ name: llama-70b, providerModel: gpt-5 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceProvider, name: openai }} ]
"#,
            url = openai.url,
        ),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let (s, h, v) = post_json(
        addr,
        "/v1/messages/count_tokens",
        &body("llama-70b", "a few words to count here"),
        &[],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-count"], "estimate");
    assert!(v["input_tokens"].as_u64().unwrap() >= 5, "{v}");
    assert!(openai.requests.lock().is_empty(), "the provider was called");
}
