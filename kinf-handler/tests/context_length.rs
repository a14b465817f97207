//! The gateway routes a prompt too long for one worker set's context (the `max_model_len` its
//! workers report on `/v1/models`, read by live ingestion) to a worker set where it fits, and
//! refuses one that fits nowhere with 400 `context_length_exceeded` naming the prompt field,
//! in the caller's API shape, without sending it to a worker.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::json;
use support::{gateway, post_json, temp_dir, tiny_sim};

/// Requests each worker set was sent (`kinference_tenant_requests_total` by destination).
fn sent_to(gw: &kinf_handler::gateway::Gateway, destination: &str) -> f64 {
    let mut text = String::new();
    gw.metrics.render(&mut text);
    text.lines()
        .filter(|l| {
            l.starts_with("kinference_tenant_requests_total{")
                && l.contains(&format!("destination=\"{destination}\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_its_context_fits_and_one_that_fits_nowhere_is_a_400() {
    let short = tiny_sim("1000", &["--max-model-len", "256"]).await;
    let long = tiny_sim("1000", &["--max-model-len", "2048"]).await;
    let dir = temp_dir("context-length");
    let worker_set = |name: &str, endpoint: std::net::SocketAddr| {
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: {name}, namespace: t }}
spec:
  endpoints: ["{endpoint}"]
  models: [ {{ name: tiny-llama }} ]
  metrics: {{ interval: 200ms }}
---
"#
        )
    };
    std::fs::write(
        dir.join("bundle.yaml"),
        format!(
            r#"{}{}apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: short }}, {{ kind: InferenceWorkerSet, name: long }} ]
"#,
            worker_set("short", short.http),
            worker_set("long", long.http)
        ),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;
    // Live ingestion reads each worker's `/v1/models` once it is healthy.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let known = gw.state.with(|st| {
            (
                st.worker_sets["t/short"].context_limit("tiny-llama"),
                st.worker_sets["t/long"].context_limit("tiny-llama"),
            )
        });
        if known == (Some(256), Some(2048)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{known:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Token-id prompts: an exact count. 300 tokens + 8 do not fit `short`'s 256.
    let prompt: Vec<u32> = (1..=300).collect();
    for _ in 0..3 {
        let (s, _, body) = post_json(
            addr,
            "/v1/completions",
            &json!({"model": "tiny-llama", "prompt": prompt, "max_tokens": 8}),
            &[],
        )
        .await;
        assert_eq!(s, 200, "{body}");
    }
    assert_eq!((sent_to(&gw, "short"), sent_to(&gw, "long")), (0.0, 3.0));
    // 3,000 tokens fit nowhere: a 400 in OpenAI's shape, naming `prompt`; no worker saw it.
    let prompt: Vec<u32> = (1..=3000).collect();
    let (s, _, body) = post_json(
        addr,
        "/v1/completions",
        &json!({"model": "tiny-llama", "prompt": prompt, "max_tokens": 8}),
        &[],
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(body["error"]["param"], "prompt", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs 3008 tokens of context"),
        "{body}"
    );
    assert_eq!(sent_to(&gw, "long"), 3.0);
}
