//! `GET /v1/models` carries vLLM's `max_model_len`, read from each worker's own `/v1/models`
//! by live ingestion: the smallest over the workers serving a name, for the name and its
//! aliases; absent for a name no worker reported a length for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{gateway, get_text, temp_dir, tiny_sim};

async fn models(addr: std::net::SocketAddr, path: &str) -> Value {
    let (s, text) = get_text(addr, path).await;
    assert_eq!(s, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_carries_the_smallest_max_model_len_of_the_workers() {
    let a = tiny_sim("1000", &["--max-model-len", "3000"]).await;
    let b = tiny_sim("1000", &["--max-model-len", "2048"]).await;
    let dir = temp_dir("models-list");
    std::fs::write(
        dir.join("bundle.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{a}", "{b}"]
  models: [ {{ name: tiny-llama, aliases: [small] }} ]
  metrics: {{ interval: 200ms }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: silent, namespace: t }}
spec:
  endpoints: ["127.0.0.1:9"]
  models: [ {{ name: other }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }}, {{ kind: InferenceWorkerSet, name: silent }} ]
"#,
            a = a.http,
            b = b.http
        ),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let list = loop {
        let list = models(addr, "/v1/models").await;
        if list["data"][1]["max_model_len"] == 2048 && list["data"][2]["max_model_len"] == 2048 {
            break list;
        }
        assert!(tokio::time::Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["other", "small", "tiny-llama"]);
    // A worker set whose worker never answered: no length, and no made-up one.
    assert!(list["data"][0].get("max_model_len").is_none(), "{list}");
    let one = models(addr, "/v1/models/small").await;
    assert_eq!(one["max_model_len"], 2048);
    assert_eq!(one["id"], "small");
}
