//! Properties of the decision engine: deterministic, total, PII never leaves the cluster when a
//! policy says so, every reject names its rule and code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_policy::{BackendType, Qos};
use kinf_router::state::LoadSample;
use kinf_router::{ClusterState, Decider, Outcome, Request, TraceDetail};
use proptest::prelude::*;

mod support;
use support::{compile, without_candidate_lists};

const CLUSTER: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: local }
spec:
  endpoints: ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
  models: [{ name: org/m, aliases: [m] }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud-a }
spec: { type: OpenAI, url: "https://a.example.com/v1", models: [{ name: m, providerModel: a-m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud-b }
spec: { type: Anthropic, url: "https://b.example.com/v1", models: [{ name: m, providerModel: b-m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool }
spec:
  destinations:
  - { kind: InferenceWorkerSet, name: local }
  - { kind: InferenceProvider, name: cloud-a }
  - { kind: InferenceProvider, name: cloud-b }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: { name: gw }
spec: { pool: pool, classifiers: [{ name: pii, type: Pii }, { name: c, type: Complexity }] }
"#;

/// Policies that all exclude providers when `pii-detected` is present, in different shapes.
fn pii_policies() -> Vec<String> {
    let tiers = [
        "[{ type: Provider, order: [cloud-a, cloud-b] }, { type: Local, minimize: PredictedTTFT }]",
        "[{ minimize: PredictedTTFT }]",
        "[{ minimize: Cost }, { type: Provider, order: [cloud-b] }]",
        "[{ type: Local, minimize: QueuedPrompts }, { minimize: KvCacheUsage }]",
    ];
    let mut out = Vec::new();
    for (i, t) in tiers.iter().enumerate() {
        let on_empty = if i % 2 == 0 { "Reject" } else { "NextRule" };
        out.push(format!(
            "{CLUSTER}---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {{ name: pii }}\nspec:\n  rules:\n  - name: low\n    matches: [{{ tag: complexity-low }}]\n    route:\n      exclude:\n      - {{ name: pii-a, if: {{ tag: pii-detected }}, drop: {{ backend: {{ type: Provider }} }} }}\n      - {{ name: busy, drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 3 }} }} }}\n      select: {t}\n      onEmpty: {on_empty}\n  - name: all\n    route:\n      exclude:\n      - {{ name: pii-b, if: {{ when: 'tag(\"pii-detected\")' }}, drop: {{ backend: {{ type: Provider }} }} }}\n      select: {t}\n      onEmpty: Reject\n"
        ));
    }
    out
}

#[derive(Debug, Clone)]
struct Ep {
    ready: bool,
    queued: f64,
    running: f64,
    kv: f64,
    cached: u32,
}

fn ep() -> impl Strategy<Value = Ep> {
    (
        any::<bool>(),
        0.0..20.0f64,
        0.0..20.0f64,
        0.0..1.0f64,
        0u32..20_000,
    )
        .prop_map(|(r, q, ru, kv, c)| Ep {
            ready: r || c % 3 == 0,
            queued: q,
            running: ru,
            kv,
            cached: c,
        })
}

fn state_for(
    policy: &CompiledPolicy,
    eps: &[Ep],
    providers: (bool, bool),
    ttfts: (f64, f64),
) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 32);
    st.now_ms = 1000;
    for ws in st.worker_sets.values_mut() {
        for (e, s) in ws.endpoints.iter_mut().zip(eps) {
            e.ready = s.ready;
            e.assumed_cached_tokens = Some(s.cached);
            e.load.push(LoadSample {
                at_ms: 900,
                queued: s.queued,
                running: s.running,
                kv_usage: s.kv,
            });
        }
        ws.rebuild_floor();
    }
    for (k, p) in st.providers.iter_mut() {
        let (ready, ttft) = if k.ends_with("cloud-a") {
            (providers.0, ttfts.0)
        } else {
            (providers.1, ttfts.1)
        };
        p.ready = ready;
        p.ttft_s = Some(ttft);
    }
    st
}

fn request(tags: &[&str], prompt: u32, qos: Qos) -> Request {
    let mut r = Request::new("m", prompt);
    r.tags = tags.iter().map(|t| Arc::from(*t)).collect();
    r.qos = qos;
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pii_tagged_requests_never_reach_a_provider(
        which in 0usize..4,
        eps in proptest::collection::vec(ep(), 3),
        providers in (any::<bool>(), any::<bool>()),
        ttfts in (0.0..10.0f64, 0.0..10.0f64),
        low in any::<bool>(),
        prompt in 1u32..30_000,
    ) {
        let policies = pii_policies();
        let policy = compile(&policies[which]);
        let st = state_for(&policy, &eps, providers, ttfts);
        let mut tags = vec!["pii-detected"];
        if low { tags.push("complexity-low"); }
        let d = Decider::decide(&policy, &request(&tags, prompt, Qos::Interactive), &st);
        if let Outcome::Route(r) = &d.outcome {
            prop_assert_eq!(r.backend_type, BackendType::Local, "PII routed to {:?}", r);
        }
    }

    #[test]
    fn decisions_are_deterministic_and_rejects_are_named(
        which in 0usize..4,
        eps in proptest::collection::vec(ep(), 3),
        providers in (any::<bool>(), any::<bool>()),
        ttfts in (0.0..10.0f64, 0.0..10.0f64),
        tags in proptest::sample::subsequence(vec!["pii-detected", "complexity-low", "other"], 0..3),
        prompt in 0u32..40_000,
        model in prop_oneof![Just("m"), Just("org/m"), Just("nope")],
    ) {
        let policies = pii_policies();
        let policy = compile(&policies[which]);
        let st = state_for(&policy, &eps, providers, ttfts);
        let mut req = request(&tags, prompt, Qos::Batch);
        req.model = model.into();
        let a = Decider::decide(&policy, &req, &st);
        let b = Decider::decide(&policy, &req, &st);
        prop_assert_eq!(&a, &b);
        // A summary trace decides the same, and is the full trace without its per-candidate
        // lists.
        let summary = Decider::decide_with(&policy, &req, &st, TraceDetail::Summary);
        prop_assert_eq!(&summary.outcome, &a.outcome);
        prop_assert_eq!(&summary.policy, &a.policy);
        prop_assert_eq!(&summary.rule, &a.rule);
        prop_assert_eq!(&summary.trace, &without_candidate_lists(&a.trace));
        if let Outcome::Reject(r) = &a.outcome {
            prop_assert!(!r.code.is_empty());
            prop_assert!(r.status == 503 || r.status == 404);
            if r.code == "policy_rejected" {
                let rule = a.rule.clone().expect("a policy reject names its rule");
                prop_assert!(r.message.contains(&*rule), "{}", r.message);
            }
        }
    }
}

#[test]
fn warm_idle_beats_cold_and_cold_idle_beats_warm_busy() {
    let policies = pii_policies();
    let policy = compile(&policies[1]);
    let eps = [
        Ep {
            ready: true,
            queued: 0.0,
            running: 0.0,
            kv: 0.1,
            cached: 15_000,
        },
        Ep {
            ready: true,
            queued: 0.0,
            running: 0.0,
            kv: 0.1,
            cached: 0,
        },
        Ep {
            ready: false,
            queued: 0.0,
            running: 0.0,
            kv: 0.1,
            cached: 0,
        },
    ];
    let st = state_for(&policy, &eps, (false, false), (1.0, 1.0));
    let d = Decider::decide(
        &policy,
        &request(&["complexity-low"], 16_000, Qos::Interactive),
        &st,
    );
    assert_eq!(
        d.route().map(|r| &*r.endpoint),
        Some("10.0.0.1:8000"),
        "warm idle wins: {d:#?}"
    );
    let busy = [
        Ep {
            queued: 30.0,
            running: 10.0,
            ..eps[0].clone()
        },
        eps[1].clone(),
        eps[2].clone(),
    ];
    let st = state_for(&policy, &busy, (false, false), (1.0, 1.0));
    let d = Decider::decide(&policy, &request(&[], 16_000, Qos::Interactive), &st);
    assert_eq!(
        d.route().map(|r| &*r.endpoint),
        Some("10.0.0.2:8000"),
        "cold idle wins over warm busy: {d:#?}"
    );
}

#[test]
fn prefix_index_drives_cached_tokens() {
    let (policy, req, state) = kinf_router::synthetic::decide_scenario(8, 1024).expect("scenario");
    let d = Decider::decide(&policy, &req, &state);
    let route = d.route().expect("routed");
    // Endpoint 7 caches 7/8 of the prompt but is the most loaded; the decision must report the
    // cached tokens of whichever endpoint won, from the index.
    let considered = &d
        .trace
        .rules
        .iter()
        .find(|r| r.matched)
        .and_then(|r| r.stages.clone())
        .expect("stages")
        .considered;
    let cached: Vec<u32> = considered.iter().map(|c| c.cached_prompt_tokens).collect();
    assert_eq!(cached, vec![0, 128, 256, 384, 512, 640, 768, 896, 0]);
    assert!(considered.iter().any(|c| c.id.endpoint == route.endpoint));
}

const APPROX: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: plain }
spec:
  endpoints: ["10.1.0.1:8000", "10.1.0.2:8000"]
  models: [{ name: m }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: plain }]
"#;

#[test]
fn approximate_tracking_sends_a_repeat_where_the_prompt_went() {
    let policy = compile(APPROX);
    let mut st = ClusterState::from_policy(&policy, 32);
    let tokens: Arc<[u32]> = (0..4096u32).collect();
    let mut req = Request::new("m", 4096);
    req.token_ids = Some(tokens.clone());
    // Cold: ties go to the first endpoint; record that the prompt went to the second instead.
    st.record_routed("default", "plain", "10.1.0.2:8000", &req, 0, 1_000);
    st.now_ms = 2_000;
    let d = Decider::decide(&policy, &req, &st);
    let route = d.route().expect("routed");
    assert_eq!(&*route.endpoint, "10.1.0.2:8000", "{d:#?}");
    assert_eq!(route.cached_tokens, 4096);
    let considered = &d.trace.default.as_ref().expect("default route").considered;
    assert!(
        considered
            .iter()
            .all(|c| c.prefix_tracking == "approximate")
    );
    // Forgotten after the maximum age.
    st.now_ms = 1_000 + kinf_router::state::APPROX_MAX_AGE.as_millis() as u64 + 1;
    let d = Decider::decide(&policy, &req, &st);
    assert_eq!(d.route().map(|r| r.cached_tokens), Some(0));
}

#[test]
fn observed_ttfts_teach_the_predictor_and_report_error() {
    let policy = compile(APPROX);
    let mut st = ClusterState::from_policy(&policy, 32);
    let mut last = f64::MAX;
    for _ in 0..100 {
        // The worker is 4× slower than the default prior.
        let err = st
            .observe_ttft(
                "default",
                "plain",
                "10.1.0.1:8000",
                4000.0,
                0.0,
                0.0,
                0.02 + 4000.0 / 1250.0,
            )
            .expect("known endpoint");
        last = err.abs();
    }
    assert!(last < 0.05, "error after learning: {last}");
    let errors = st.prediction_errors();
    let e = &errors[0];
    assert_eq!((&*e.endpoint, e.observations), ("10.1.0.1:8000", 100));
    assert!(
        st.observe_ttft("default", "plain", "10.9.9.9:1", 1.0, 0.0, 0.0, 1.0)
            .is_none()
    );
}

#[test]
fn caller_supplied_block_hashes_match_like_token_ids() {
    let (policy, req, state) = kinf_router::synthetic::decide_scenario(8, 1024).expect("scenario");
    let with_tokens = Decider::decide(&policy, &req, &state);
    let mut hashed = req.clone();
    let tokens = hashed.token_ids.take().expect("tokens");
    let hashes =
        kinf_router::prefix_index::block_hashes(&tokens, kinf_router::synthetic::BLOCK_SIZE);
    hashed.block_hashes = Some((
        kinf_router::synthetic::BLOCK_SIZE as u32,
        hashes.to_vec().into(),
    ));
    assert_eq!(Decider::decide(&policy, &hashed, &state), with_tokens);
    // A different block size cannot be used: nothing is cached then.
    hashed.block_hashes = Some((16, Arc::from(vec![1u64, 2, 3])));
    let d = Decider::decide(&policy, &hashed, &state);
    assert_eq!(d.route().map(|r| r.cached_tokens), Some(0));
}

/// Stale endpoints (no recent metrics) are passed over while a fresh one is ready, and used when
/// every ready endpoint of the set is stale.
#[test]
fn stale_endpoints_are_used_only_when_no_fresh_one_is_ready() {
    let policy = compile(CLUSTER);
    let mut state = ClusterState::from_policy(&policy, 16);
    let ws = state.worker_sets.get_mut("default/local").unwrap();
    // The best-looking endpoint (idle) is stale; the others carry load.
    ws.endpoints[0].stale = true;
    for ep in &mut ws.endpoints[1..] {
        ep.load.push(LoadSample {
            at_ms: 0,
            queued: 4.0,
            running: 8.0,
            kv_usage: 0.5,
        });
    }
    ws.rebuild_floor();
    let req = Request::new("m", 1000);
    let d = Decider::decide(&policy, &req, &state);
    let ep = &d.route().unwrap().endpoint;
    assert_ne!(
        &**ep, "10.0.0.1:8000",
        "a stale endpoint won over fresh ones"
    );

    let ws = state.worker_sets.get_mut("default/local").unwrap();
    for i in 0..ws.endpoints.len() {
        ws.set_stale(i, true);
    }
    let d = Decider::decide(&policy, &req, &state);
    assert_eq!(d.route().unwrap().backend_type, BackendType::Local);
}

#[test]
fn in_flight_prefill_steers_the_next_request_before_any_scrape() {
    // Three idle endpoints, nothing cached, no scrape yet: the first pick is endpoint order.
    let policy = compile(CLUSTER);
    let mut state = ClusterState::from_policy(&policy, 16);
    let req = Request::new("m", 8_000);
    let first = Decider::decide(&policy, &req, &state);
    let r = first.route().unwrap().clone();
    let p = r
        .prediction
        .expect("local routes carry their prediction inputs");
    assert_eq!((p.uncached_tokens, p.pending_prefill_tokens), (8_000, 0));
    // The gateway counts it in flight: the next identical request goes elsewhere, because its
    // prefill would queue behind 8,000 tokens there.
    state.begin_request(&r.namespace, &r.destination, &r.endpoint, p.uncached_tokens);
    let second = Decider::decide(&policy, &req, &state);
    let r2 = second.route().unwrap();
    assert_ne!(r2.endpoint, r.endpoint, "{second:#?}");
    let first_pred = r.predicted_ttft_s.unwrap();
    // Queued behind it, the first endpoint would now predict about twice the TTFT.
    let ws = state.worker_set(&r.namespace, &r.destination).unwrap();
    let ep = ws
        .endpoints
        .iter()
        .find(|e| e.address == r.endpoint)
        .unwrap();
    assert_eq!(ep.inflight.requests, 1);
    assert_eq!(ep.inflight.prefill_tokens, 8_000);
    let behind = ws.ttft.predict_behind(8_000.0, 8_000.0, 0.0, 1.0);
    assert!(
        behind.total_s > 1.8 * first_pred,
        "{behind:?} vs {first_pred}"
    );
    assert!(behind.wait_s > 0.0 && behind.prefill_s > 0.0);
    // First token: prefill released, the request still counts as running; done: nothing left.
    state.first_token(&r.namespace, &r.destination, &r.endpoint, p.uncached_tokens);
    state.end_request(
        &r.namespace,
        &r.destination,
        &r.endpoint,
        p.uncached_tokens,
        false,
    );
    let ws = state.worker_set(&r.namespace, &r.destination).unwrap();
    let ep = ws
        .endpoints
        .iter()
        .find(|e| e.address == r.endpoint)
        .unwrap();
    assert_eq!(ep.inflight, kinf_router::state::InFlight::default());
    // An abandoned request (no first token) releases its prefill at the end; counts never
    // underflow.
    state.begin_request(&r.namespace, &r.destination, &r.endpoint, 500);
    state.end_request(&r.namespace, &r.destination, &r.endpoint, 500, true);
    state.end_request(&r.namespace, &r.destination, &r.endpoint, 500, true);
    let ws = state.worker_set(&r.namespace, &r.destination).unwrap();
    let ep = ws
        .endpoints
        .iter()
        .find(|e| e.address == r.endpoint)
        .unwrap();
    assert_eq!(ep.inflight, kinf_router::state::InFlight::default());
}

#[test]
fn one_ttft_model_per_worker_set_learns_from_every_endpoint() {
    let policy = compile(CLUSTER);
    let mut state = ClusterState::from_policy(&policy, 16);
    let req = Request::new("m", 4_000);
    // The prediction for endpoint `i`, with only that endpoint ready.
    let predicted_on = |state: &ClusterState, i: usize| {
        let mut st = state.clone();
        let ws = st.worker_sets.get_mut("default/local").unwrap();
        for j in 0..ws.endpoints.len() {
            ws.set_ready(j, i == j);
        }
        Decider::decide(&policy, &req, &st)
            .route()
            .unwrap()
            .predicted_ttft_s
            .unwrap()
    };
    let before: Vec<f64> = (0..3).map(|i| predicted_on(&state, i)).collect();
    // Endpoint 0 observes much slower prefills than the prior says.
    for _ in 0..50 {
        state.observe_ttft("default", "local", "10.0.0.1:8000", 4_000.0, 0.0, 0.0, 9.0);
    }
    // Every endpoint's prediction moved the same way: the set shares one model, so an idle
    // endpoint that got no traffic is not left with a stale, better-looking estimate.
    for (i, before) in before.iter().enumerate() {
        let p = predicted_on(&state, i);
        assert!(p > 4.0 * before, "endpoint {i}: {p} vs {before}");
    }
}
