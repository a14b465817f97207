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

    // Not an object, and a field of the wrong type: the Messages validation's errors.
    let (s, _, v) = post_json(addr, path, &json!("count this"), &[]).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    let (s, _, v) = post_json(
        addr,
        path,
        &json!({"model": "tiny-llama", "messages": "hi"}),
        &[],
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`messages`"),
        "{v}"
    );

    let (s, _, v) = post_json(addr, path, &body("nope", "hi"), &[]).await;
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`nope`"),
        "{v}"
    );

    // Whatever `max_tokens` the client sent, a count has none to check (vLLM ignores it):
    // not a missing, zero or too-large output.
    for max in [json!(5), json!(null), json!(0), json!(1_000_000)] {
        let mut with_max = body("tiny-llama", "hi");
        with_max["max_tokens"] = max.clone();
        let (s, _, v) = post_json(addr, path, &with_max, &[]).await;
        assert_eq!(s, 200, "max_tokens {max}: {v}");
    }

    let (_, metrics) = get_text(addr, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "kinference_requests_total",
            "api=\"count_tokens\",status=\"400\""
        ),
        Some(3.0),
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

/// A worker that cannot be reached is marked down and the count goes to the next one; a
/// worker's error in another shape reaches the client in Anthropic's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_worker_is_passed_over_and_worker_errors_are_anthropics() {
    let worker = tiny_sim("1000", &[]).await;
    let dead = format!("127.0.0.1:{}", support::spare_port());
    // FastAPI's answer for a route it does not have (an older vLLM).
    let app = axum::Router::new().route(
        "/v1/messages/count_tokens",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::NOT_FOUND,
                [("content-type", "application/json")],
                r#"{"detail":"Not Found"}"#,
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let old = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });

    let dir = temp_dir("count-tokens-retry");
    std::fs::write(
        dir.join("bundle.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{dead}", "{live}"]
  models: [ {{ name: tiny-llama }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: old, namespace: t }}
spec:
  endpoints: ["{old}"]
  models: [ {{ name: old-model }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }}, {{ kind: InferenceWorkerSet, name: old }} ]
"#,
            live = worker.http,
        ),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let path = "/v1/messages/count_tokens";
    for i in 0..3 {
        let (s, h, v) = post_json(addr, path, &body("tiny-llama", "hi"), &[]).await;
        assert_eq!(s, 200, "count {i}: {v}");
        assert_eq!(h["x-kinference-endpoint"], worker.http.to_string().as_str());
    }
    let (s, _, v) = post_json(addr, path, &body("old-model", "hi"), &[]).await;
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Not Found"),
        "{v}"
    );
}
