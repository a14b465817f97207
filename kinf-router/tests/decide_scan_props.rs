//! The summary fast path (`decide/scan.rs`) decides exactly what the general path decides:
//! on random fleets — many endpoints with equal loads (ties), stale and unready ones, work in
//! flight, learned TTFT models, prompts cached per the prefix index or assumed — a summary
//! decision equals a full one with its per-candidate lists removed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_router::prefix_index::block_hashes;
use kinf_router::state::LoadSample;
use kinf_router::{ClusterState, Decider, Decision, Request, TraceDetail};
use proptest::prelude::*;

mod support;
use support::{compile, without_candidate_lists};

/// A pool of one worker set of `n` endpoints and two providers, and one of four policies.
fn bundle(n: usize, which: usize) -> String {
    let eps: Vec<String> = (0..n).map(|i| format!("\"10.0.0.{i}:8000\"")).collect();
    let mut text = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: local }}
spec:
  endpoints: [{}]
  models: [{{ name: m }}]
  blockSize: 16
  cost: {{ uncachedPromptPerMillion: 3, cachedPromptPerMillion: 0.5, outputPerMillion: 9 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud-a }}
spec: {{ type: OpenAI, url: "https://a.example.com/v1", models: [{{ name: m, providerModel: a-m }}] }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud-b }}
spec: {{ type: OpenAI, url: "https://b.example.com/v1", models: [{{ name: m, providerModel: b-m }}] }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool }}
spec:
  destinations:
  - {{ kind: InferenceProvider, name: cloud-a }}
  - {{ kind: InferenceWorkerSet, name: local }}
  - {{ kind: InferenceProvider, name: cloud-b }}
"#,
        eps.join(", ")
    );
    let rules = match which {
        // No policy: the default route (Local, then Provider, by PredictedTTFT).
        0 => return text,
        // A filter that applies only to `pii-detected` requests, one tier over every backend.
        1 => {
            "  - name: any\n    route:\n      exclude:\n      - { name: pii, if: { tag: pii-detected }, drop: { backend: { type: Provider } } }\n      select: [{ minimize: PredictedTTFT }]\n      onEmpty: Reject\n"
        }
        // Providers first, then Local.
        2 => {
            "  - name: tiers\n    route:\n      select: [{ type: Provider, minimize: PredictedTTFT }, { type: Local, minimize: PredictedTTFT }]\n      onEmpty: NextRule\n"
        }
        // Load filters over two windows, a predicted-TTFT filter, a destination filter; the
        // other measures, and an order tier.
        3 => {
            "  - name: batch\n    matches: [{ qos: batch }]\n    route:\n      consider: [{ type: Local }]\n      exclude:\n      - { name: busy, drop: { backend: { type: Local }, kvCacheUsage: { greaterThan: 0.5 } } }\n      - { name: queue, window: 5s, drop: { queuedPrompts: { greaterThan: 1.5 } } }\n      select: [{ type: Local, minimize: QueuedPrompts }]\n      onEmpty: NextRule\n  - name: slow\n    matches: [{ tag: pii-detected }]\n    route:\n      exclude:\n      - { name: slow, drop: { predictedTTFT: { greaterThan: 1s } } }\n      - { name: not-a, drop: { backend: { name: cloud-a } } }\n      - { name: running, drop: { runningPrompts: { lessThan: 0.5 } } }\n      select: [{ type: Local, order: [cloud-b, local] }, { type: Provider, order: [cloud-a, cloud-b] }, { type: Local, minimize: KvCacheUsage }]\n      onEmpty: NextRule\n  - name: local\n    route:\n      consider: [{ type: Local }]\n      exclude:\n      - { name: overloaded, drop: { backend: { type: Local }, queuedPrompts: { greaterThan: 4 } } }\n      select: [{ type: Local, minimize: PredictedTTFT }, { minimize: RunningPrompts }]\n      onEmpty: Reject\n"
        }
        // Every other measure, by tag.
        4 => {
            "  - name: kv\n    matches: [{ tag: kv }]\n    route:\n      select: [{ type: Local, minimize: KvCacheUsage }]\n      onEmpty: NextRule\n  - name: cheap\n    matches: [{ tag: cheap }]\n    route:\n      select: [{ type: Local, minimize: Cost }]\n      onEmpty: NextRule\n  - name: running\n    route:\n      select: [{ type: Local, minimize: RunningPrompts }, { type: Provider, minimize: QueuedPrompts }]\n      onEmpty: Reject\n"
        }
        // A `when:` filter (the general path), then an order tier over every destination.
        _ => {
            "  - name: when\n    route:\n      exclude:\n      - { name: cold, drop: { when: 'cachedPromptTokens < 100 && queuedPrompts > 1.0' } }\n      select: [{ order: [local, cloud-b] }, { type: Local, minimize: PredictedTTFT }]\n      onEmpty: Reject\n"
        }
    };
    text.push_str(
        "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec:\n  rules:\n",
    );
    text.push_str(rules);
    text
}

#[derive(Debug, Clone)]
struct Ep {
    ready: bool,
    stale: bool,
    queued: f64,
    running: f64,
    kv: f64,
    inflight: u32,
    inflight_tokens: u32,
    /// `Some`: assumed cached tokens; `None`: what the prefix index says.
    assumed: Option<u32>,
    /// Routed prompts the index learns: how many leading blocks of the request's prompt.
    routed_blocks: usize,
}

/// Few distinct values, so that many endpoints tie.
fn ep() -> impl Strategy<Value = Ep> {
    (
        (0u8..10, any::<bool>()),
        prop::sample::select(vec![0.0, 1.0, 2.0, 5.0]),
        prop::sample::select(vec![0.0, 1.0, 3.0]),
        prop::sample::select(vec![0.1, 0.6]),
        (0u32..3, prop::sample::select(vec![0u32, 512, 4096])),
        prop::option::weighted(0.3, prop::sample::select(vec![0u32, 512, 2048])),
        prop::sample::select(vec![0usize, 0, 8, 64]),
    )
        .prop_map(
            |((r, stale), queued, running, kv, (inflight, inflight_tokens), assumed, routed)| Ep {
                ready: r != 0,
                stale: stale && r % 3 == 0,
                queued,
                running,
                kv,
                inflight,
                inflight_tokens,
                assumed,
                routed_blocks: routed,
            },
        )
}

fn state_for(
    policy: &CompiledPolicy,
    eps: &[Ep],
    prompt: &[u32],
    learn: &[(u32, f64)],
    providers: (bool, f64),
) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 16);
    st.now_ms = 10_000;
    let key = st.worker_sets.keys().next().cloned().expect("a worker set");
    let (ns, name) = key.split_once('/').expect("namespace/name");
    let (ns, name) = (ns.to_string(), name.to_string());
    for (i, e) in eps.iter().enumerate() {
        let addr = format!("10.0.0.{i}:8000");
        if e.routed_blocks > 0 {
            let n = (e.routed_blocks * 16).min(prompt.len());
            let mut routed = Request::new("m", n as u32);
            routed.token_ids = Some(prompt[..n].into());
            st.record_routed(&ns, &name, &addr, &routed, 0, 9_000);
        }
        for _ in 0..e.inflight {
            st.begin_request(&ns, &name, &addr, e.inflight_tokens);
        }
        for &(tokens, ttft) in learn
            .iter()
            .filter(|(t, _)| t % eps.len() as u32 == i as u32)
        {
            st.observe_ttft(
                &ns,
                &name,
                &addr,
                f64::from(tokens),
                e.queued,
                e.running,
                ttft,
            );
        }
    }
    let ws = st.worker_sets.get_mut(&*key).expect("the worker set");
    for (ep, e) in ws.endpoints.iter_mut().zip(eps) {
        ep.ready = e.ready;
        ep.stale = e.stale;
        ep.assumed_cached_tokens = e.assumed;
        // An older sample inside the default 30 s window but outside a 5 s one.
        ep.load.push(LoadSample {
            at_ms: 2_000,
            queued: e.queued * 2.0 + 1.0,
            running: e.running / 2.0,
            kv_usage: 1.0 - e.kv,
        });
        ep.load.push(LoadSample {
            at_ms: 9_500,
            queued: e.queued,
            running: e.running,
            kv_usage: e.kv,
        });
    }
    ws.rebuild_floor();
    for (k, p) in st.providers.iter_mut() {
        p.ready = providers.0 || k.ends_with("cloud-b");
        p.ttft_s = Some(providers.1);
    }
    st.set_now(10_000);
    st
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn summary_fast_path_decides_as_the_general_path(
        which in 0usize..6,
        eps in prop::collection::vec(ep(), 1..40),
        prompt_blocks in 1usize..80,
        tail in 0usize..16,
        max_tokens in prop::sample::select(vec![1u32, 128, 1024]),
        learn in prop::collection::vec((0u32..8192, 0.01..5.0f64), 0..12),
        // Garbage observed provider TTFTs too (NaN, negative, infinite): ranked by the prior.
        providers in (any::<bool>(), prop::sample::select(vec![0.2, 0.5, 3.0, f64::NAN, -1.0, f64::INFINITY])),
        // The prompt-token estimate: the token ids' count, none, fewer or more.
        estimate in prop::sample::select(vec![1.0, 0.0, 0.5, 2.0]),
        pii in any::<bool>(),
        cheap in any::<bool>(),
        kv in any::<bool>(),
        batch in any::<bool>(),
        // The workers' `max_model_len` (none reported, or one that may be too short) and
        // whether the request says what context it needs.
        context in (prop::option::weighted(0.5, prop::sample::select(vec![512u32, 1300, 100_000])), any::<bool>()),
    ) {
        let policy = compile(&bundle(eps.len(), which));
        let prompt: Vec<u32> = (0..(prompt_blocks * 16 + tail) as u32).map(|t| t * 7 + 3).collect();
        let mut st = state_for(&policy, &eps, &prompt, &learn, providers);
        if let Some(len) = context.0 {
            let ws = st.worker_sets.values_mut().next().expect("a worker set");
            let addrs: Vec<Arc<str>> = ws.endpoints.iter().map(|e| e.address.clone()).collect();
            for a in addrs {
                ws.set_max_model_lens(&a, vec![(Arc::from("m"), u64::from(len))]);
            }
        }
        let mut req = Request::new("m", (prompt.len() as f64 * estimate) as u32);
        req.token_ids = Some(prompt.clone().into());
        req.max_tokens = max_tokens;
        if context.1 {
            req.required_context = Some(prompt.len() as u32 + max_tokens);
        }
        let tags = [(pii, "pii-detected"), (cheap, "cheap"), (kv, "kv")];
        req.tags = tags.iter().filter(|(on, _)| *on).map(|(_, t)| Arc::from(*t)).collect();
        if batch {
            req.qos = kinf_policy::Qos::Batch;
        }
        let full = Decider::decide_with(&policy, &req, &st, TraceDetail::Full);
        let summary = Decider::decide_with(&policy, &req, &st, TraceDetail::Summary);
        if let Some(r) = full.route() {
            prop_assert!(r.predicted_ttft_s.is_some_and(|t| t.is_finite() && t >= 0.0), "{:?}", r);
        }
        let expected = Decision {
            trace: without_candidate_lists(&full.trace),
            ..full
        };
        prop_assert_eq!(&summary, &expected);

        // A caller that hashed the prompt itself (the gateway does, outside its state lock)
        // gets the same decision; hashes of another block size are ignored.
        let mut hashed = req.clone();
        hashed.block_hashes = Some((16, block_hashes(&prompt, 16).to_vec().into()));
        prop_assert_eq!(&Decider::decide_with(&policy, &hashed, &st, TraceDetail::Summary), &summary);
        hashed.token_ids = None;
        prop_assert_eq!(&Decider::decide_with(&policy, &hashed, &st, TraceDetail::Summary), &summary);
        let mut other = req.clone();
        other.block_hashes = Some((32, Arc::from(vec![1u64, 2, 3])));
        prop_assert_eq!(&Decider::decide_with(&policy, &other, &st, TraceDetail::Summary), &summary);
    }
}

/// One change to the state between decisions, through the methods that keep the load floor
/// current.
#[derive(Debug, Clone)]
enum Op {
    Begin {
        ep: usize,
        tokens: u32,
    },
    FirstToken {
        ep: usize,
        tokens: u32,
    },
    End {
        ep: usize,
        tokens: u32,
        pending: bool,
    },
    Sample {
        ep: usize,
        queued: f64,
        running: f64,
    },
    Ready {
        ep: usize,
        ready: bool,
    },
    Stale {
        ep: usize,
        stale: bool,
    },
    Route {
        ep: usize,
        blocks: usize,
    },
    Decide {
        prompt: usize,
        max_tokens: u32,
    },
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    let ep = 0..n;
    prop_oneof![
        4 => (ep.clone(), prop::sample::select(vec![0u32, 256, 2048])).prop_map(|(ep, tokens)| Op::Begin { ep, tokens }),
        2 => (ep.clone(), prop::sample::select(vec![0u32, 256, 2048])).prop_map(|(ep, tokens)| Op::FirstToken { ep, tokens }),
        2 => (ep.clone(), prop::sample::select(vec![0u32, 256, 2048]), any::<bool>()).prop_map(|(ep, tokens, pending)| Op::End { ep, tokens, pending }),
        3 => (ep.clone(), 0.0..6.0f64, 0.0..6.0f64).prop_map(|(ep, q, r)| Op::Sample { ep, queued: q.floor(), running: r.floor() }),
        1 => (ep.clone(), prop::bool::weighted(0.8)).prop_map(|(ep, ready)| Op::Ready { ep, ready }),
        1 => (ep.clone(), prop::bool::weighted(0.2)).prop_map(|(ep, stale)| Op::Stale { ep, stale }),
        2 => (ep.clone(), 0usize..40).prop_map(|(ep, blocks)| Op::Route { ep, blocks }),
        6 => (0usize..3, prop::sample::select(vec![1u32, 128, 1024])).prop_map(|(prompt, max_tokens)| Op::Decide { prompt, max_tokens }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The bounded scan (only the endpoints holding part of the prompt are scored while the
    /// load floor shows that no other can rank lower) decides as the general path after any
    /// sequence of in-flight changes, samples, readiness and staleness changes and routed
    /// prompts; the incrementally kept floor equals a rebuilt one throughout.
    #[test]
    fn bounded_scan_decides_as_the_general_path_as_the_state_changes(
        (n, ops) in (1usize..48).prop_flat_map(|n| (Just(n), prop::collection::vec(op(n), 1..60))),
        which in prop::sample::select(vec![0usize, 2]),
    ) {
        let policy = compile(&bundle(n, which));
        let mut st = ClusterState::from_policy(&policy, 16);
        let key = st.worker_sets.keys().next().cloned().expect("a worker set");
        let (ns, name) = key.split_once('/').expect("namespace/name");
        let (ns, name) = (ns.to_string(), name.to_string());
        // Three system prompts, 40 blocks each, and a unique tail.
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .map(|p| (0..(40 * 16 + 7)).map(|t| t * 7 + 3 + p * 1_000_003).collect())
            .collect();
        let mut now = 1_000u64;
        for op in ops {
            now += 100;
            st.set_now(now);
            let addr = |ep: usize| format!("10.0.0.{ep}:8000");
            match op {
                Op::Begin { ep, tokens } => st.begin_request(&ns, &name, &addr(ep), tokens),
                Op::FirstToken { ep, tokens } => st.first_token(&ns, &name, &addr(ep), tokens),
                Op::End { ep, tokens, pending } => st.end_request(&ns, &name, &addr(ep), tokens, pending),
                Op::Sample { ep, queued, running } => {
                    let ws = st.worker_sets.get_mut(&*key).expect("the worker set");
                    ws.push_load(ep, LoadSample { at_ms: now, queued, running, kv_usage: 0.3 });
                }
                Op::Ready { ep, ready } => st.worker_sets.get_mut(&*key).expect("ws").set_ready(ep, ready),
                Op::Stale { ep, stale } => st.worker_sets.get_mut(&*key).expect("ws").set_stale(ep, stale),
                Op::Route { ep, blocks } => {
                    let p = &prompts[ep % 3];
                    let n = (blocks * 16).min(p.len());
                    let mut routed = Request::new("m", n as u32);
                    routed.token_ids = Some(p[..n].into());
                    st.record_routed(&ns, &name, &addr(ep), &routed, 0, now);
                }
                Op::Decide { prompt, max_tokens } => {
                    let ws = st.worker_sets.get(&*key).expect("the worker set");
                    prop_assert!(ws.floor.agrees_with(&ws.endpoints), "the kept floor differs from a rebuilt one");
                    let mut req = Request::new("m", prompts[prompt].len() as u32);
                    req.token_ids = Some(prompts[prompt].clone().into());
                    req.max_tokens = max_tokens;
                    let full = Decider::decide_with(&policy, &req, &st, TraceDetail::Full);
                    let summary = Decider::decide_with(&policy, &req, &st, TraceDetail::Summary);
                    let expected = Decision { trace: without_candidate_lists(&full.trace), ..full };
                    prop_assert_eq!(&summary, &expected);
                }
            }
        }
    }
}
