//! End to end on real vLLM 0.32 data: KV-event frames captured from a real server are decoded,
//! applied to the cluster state, and a request repeating the cached prompt is routed to the
//! endpoint that holds it; evictions remove what they name.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use kinf_router::kv_events::{KvEvent, decode_payload};
use kinf_router::{ClusterState, Decider, Request};

fn events(rel: &str) -> Vec<KvEvent> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/vllm-0.32.0-cpu")
        .join(rel);
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let j: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(hex) = j["payload_hex"].as_str() else {
            continue;
        };
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let (_, evs, _) = decode_payload(&bytes).unwrap();
        out.extend(evs);
    }
    out
}

const BUNDLE: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: tiny }
spec:
  endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]
  models: [{ name: tiny-llama, aliases: [tiny] }]
  kvEvents: { port: 5557 }
  blockSize: 32
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: tiny }]
"#;

#[test]
fn a_repeat_goes_to_the_worker_that_reported_the_blocks() {
    let (_, c) = kinf_lang::compile_str("b.yaml", BUNDLE);
    let policy = c.policy.expect("compiles");
    let mut st = ClusterState::from_policy(&policy, 32);
    let evs = events("kv_frames_run1.jsonl");
    // The prompt of the first stored chain, as vLLM reported it.
    let mut prompt: Vec<u32> = Vec::new();
    for e in &evs {
        if let KvEvent::BlockStored(b) = e
            && b.parent.is_none()
            && prompt.is_empty()
        {
            prompt = b.token_ids.clone();
        }
    }
    assert!(
        prompt.len() >= 32,
        "captured prompt of {} tokens",
        prompt.len()
    );
    let ws = st.worker_sets.get_mut("default/tiny").unwrap();
    assert!(ws.apply_kv_events("127.0.0.1:8002", &evs));
    assert!(!ws.apply_kv_events("127.0.0.1:9999", &evs));
    let mut req = Request::new("tiny", prompt.len() as u32 + 7);
    let mut tokens = prompt.clone();
    tokens.extend([1, 2, 3, 4, 5, 6, 7]);
    req.token_ids = Some(Arc::from(tokens));
    let d = Decider::decide(&policy, &req, &st);
    let r = d.route().expect("routed");
    assert_eq!(&*r.endpoint, "127.0.0.1:8002");
    // After a sequence gap the endpoint's entries are dropped: nothing is cached anywhere.
    let mut gapped = st.clone();
    assert!(
        gapped
            .worker_sets
            .get_mut("default/tiny")
            .unwrap()
            .reset_endpoint("127.0.0.1:8002")
    );
    let d2 = Decider::decide(&policy, &req, &gapped);
    assert_eq!(d2.route().map(|r| r.cached_tokens), Some(0));
    assert_eq!(r.cached_tokens as usize, prompt.len() / 32 * 32);
    assert_eq!(&*r.model, "tiny-llama");
    assert!(r.rewrite_model);
}

#[test]
fn evictions_and_clears_from_a_real_server_empty_the_index() {
    let (_, c) = kinf_lang::compile_str("b.yaml", BUNDLE);
    let policy = c.policy.expect("compiles");
    let mut st = ClusterState::from_policy(&policy, 32);
    let evs = events("kv_frames_run2_evictions.jsonl");
    assert!(evs.iter().any(|e| matches!(e, KvEvent::BlockRemoved(_))));
    let ws = st.worker_sets.get_mut("default/tiny").unwrap();
    // Apply event by event; after an AllBlocksCleared the endpoint holds nothing.
    for e in &evs {
        ws.apply_kv_events("127.0.0.1:8001", std::slice::from_ref(e));
        if matches!(e, KvEvent::AllBlocksCleared)
            && let kinf_router::state::PrefixTracking::Exact(i) = &ws.prefix
        {
            assert_eq!(
                i.endpoint_blocks(kinf_router::prefix_index::EndpointId(0)),
                0
            );
        }
    }
}
