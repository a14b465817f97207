//! Synthetic decision scenarios, for benchmarks (`kinf-bench decide`, criterion) and tests.

use std::fmt::Write as _;
use std::sync::Arc;

use kinf_lang::CompiledPolicy;

use crate::kv_events::{BlockStored, KvEvent};
use crate::prefix_index::EndpointId;
use crate::request::Request;
use crate::state::{ClusterState, LoadSample};

/// Block size of the scenarios.
pub const BLOCK_SIZE: usize = 32;

/// A burst-style policy over one worker set of `endpoints` endpoints and a provider; a request
/// of `prompt_tokens` tokens with token ids; a state where endpoint `i` caches the first
/// `(i mod 8) / 8` of the prompt and has some load. Returns `None` if the bundle fails to
/// compile (it does not).
pub fn decide_scenario(
    endpoints: usize,
    prompt_tokens: usize,
) -> Option<(Arc<CompiledPolicy>, Request, ClusterState)> {
    let mut eps = String::new();
    for i in 0..endpoints.max(1) {
        let _ = write!(
            eps,
            "\"10.{}.{}.{}:8000\", ",
            i / 65536,
            (i / 256) % 256,
            i % 256
        );
    }
    let text = format!(
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{ name: workers }}\nspec:\n  endpoints: [{eps}]\n  models: [{{ name: org/model, aliases: [model] }}]\n  kvEvents: {{ port: 5557 }}\n  blockSize: {BLOCK_SIZE}\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: cloud }}\nspec:\n  type: OpenAI\n  url: https://cloud.example.com/v1\n  models: [{{ name: model, providerModel: remote-model }}]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {{ name: pool }}\nspec:\n  destinations:\n  - {{ kind: InferenceWorkerSet, name: workers }}\n  - {{ kind: InferenceProvider, name: cloud }}\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {{ name: burst }}\nspec:\n  rules:\n  - name: batch-idle-only\n    matches: [{{ qos: batch }}]\n    route:\n      exclude:\n      - {{ name: busy, drop: {{ backend: {{ type: Local }}, kvCacheUsage: {{ greaterThan: 0.7 }} }} }}\n  - name: burst\n    route:\n      exclude:\n      - name: overloaded\n        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 6 }} }}\n      select:\n      - {{ type: Local, minimize: PredictedTTFT }}\n      - {{ type: Provider, order: [cloud] }}\n"
    );
    let (_, c) = kinf_lang::compile_str("scenario.yaml", &text);
    let policy = c.policy?;
    let mut state = ClusterState::from_policy(&policy, BLOCK_SIZE);
    let tokens: Arc<[u32]> = (0..prompt_tokens as u32)
        .map(|t| (t * 7 + 3) % 50_000)
        .collect();
    let ws = state.worker_sets.values_mut().next()?;
    for (i, ep) in ws.endpoints.iter_mut().enumerate() {
        for s in 0..30u64 {
            ep.load.push(LoadSample {
                at_ms: 30_000 + s * 1000,
                queued: (i % 9) as f64,
                running: (i % 5) as f64,
                kv_usage: (i % 10) as f64 / 10.0,
            });
        }
        let blocks = (prompt_tokens / BLOCK_SIZE) * (i % 8) / 8;
        if blocks > 0 {
            let ev = KvEvent::BlockStored(BlockStored {
                block_hashes: (0..blocks as u64)
                    .map(|b| b + 1 + (i as u64) * 1_000_000)
                    .collect(),
                parent: None,
                token_ids: tokens[..blocks * BLOCK_SIZE].to_vec(),
                block_size: BLOCK_SIZE as u32,
                ..Default::default()
            });
            if let crate::state::PrefixTracking::Exact(index) = &mut ws.prefix {
                index.apply(EndpointId(i as u32), &ev);
            }
        }
    }
    ws.rebuild_floor();
    state.set_now(60_000);
    let mut req = Request::new("model", prompt_tokens as u32);
    req.token_ids = Some(tokens);
    Some((policy, req, state))
}
