//! PredictedTTFT selection charges a recompute and a request's decode at their capacity cost,
//! and exact prefix tracking counts prompts routed moments ago whose KV events have not arrived
//! yet.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_router::kv_events::{BlockStored, KvEvent};
use kinf_router::state::SPECULATIVE_MAX_AGE;
use kinf_router::{ClusterState, Decider, Decision, Request};

const NS: &str = "default";
const WS: &str = "w";
const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";

const POLICY: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w }
spec:
  endpoints: ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
  models: [{ name: m }]
  kvEvents: {}
  blockSize: 16
  performance: { prefillTokensPerSecond: 3000, overhead: 200ms }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p }
spec: { destinations: [{ kind: InferenceWorkerSet, name: w }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: ttft }
spec:
  rules:
  - name: fastest
    route:
      select: [ { type: Local, minimize: PredictedTTFT } ]
"#;

fn policy() -> Arc<CompiledPolicy> {
    let (_, c) = kinf_lang::compile_str("p.yaml", POLICY);
    c.policy
        .unwrap_or_else(|| panic!("does not compile: {:?}", c.diagnostics))
}

/// A 16,000-token shared prefix followed by 256 tokens of the request's own.
fn prompt(own: u32) -> Vec<u32> {
    (0..16_000u32)
        .chain((0..256).map(|i| 1_000_000 + own * 1_000 + i))
        .collect()
}

/// A request with the shared prefix and 256 tokens of its own (`own` tells them apart).
fn request(own: u32) -> Request {
    let mut req = Request::new("m", 16_256);
    req.token_ids = Some(prompt(own).into());
    req
}

/// The policy's state at t = 1 s, nothing cached, nothing in flight.
fn state(policy: &CompiledPolicy) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 16);
    st.set_now(1_000);
    st
}

/// `address` reports (by KV event) that it caches the 16,000-token prefix.
fn cache_prefix(st: &mut ClusterState, address: &str) {
    let tokens: Vec<u32> = (0..16_000u32).collect();
    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: (1..=1_000u64).collect(),
        parent: None,
        token_ids: tokens,
        block_size: 16,
        ..Default::default()
    });
    let ws = st.worker_sets.get_mut("default/w").unwrap();
    assert!(ws.apply_kv_events(address, &[ev]));
}

/// `address` has `n` requests of this gateway in flight, `pending` tokens of them not yet
/// prefilled.
fn in_flight(st: &mut ClusterState, address: &str, n: u32, pending: u32) {
    for i in 0..n {
        st.begin_request(NS, WS, address, if i == 0 { pending } else { 0 });
    }
}

/// `(endpoint, cached tokens, predicted TTFT, recompute cost, decode cost)` per candidate.
fn candidates(d: &Decision) -> Vec<(String, u32, f64, f64, f64)> {
    let stages = d
        .trace
        .rules
        .iter()
        .find_map(|r| r.stages.as_ref())
        .expect("a rule decided");
    stages
        .considered
        .iter()
        .map(|c| {
            (
                c.id.endpoint.to_string(),
                c.cached_prompt_tokens,
                c.predicted_ttft.total_s,
                c.predicted_ttft.recompute_s,
                c.predicted_ttft.decode_s,
            )
        })
        .collect()
}

fn routed_to(d: &Decision) -> &str {
    &d.route().expect("routed").endpoint
}

#[test]
fn under_saturation_a_hot_prefix_stays_where_ttft_plus_recompute_cost_is_lowest() {
    let policy = policy();
    let mut st = state(&policy);
    cache_prefix(&mut st, A);
    // A holds the hot prefix and is the busiest: 12 requests in flight, 24,000 tokens of
    // prefill queued ahead (≈ 8 s). B and C are cold and busy too (8 requests each, decoding).
    in_flight(&mut st, A, 12, 24_000);
    in_flight(&mut st, B, 8, 0);
    in_flight(&mut st, C, 8, 0);
    let req = request(1);
    let d = Decider::decide(&policy, &req, &st);
    let c = candidates(&d);
    let (a, b) = (&c[0], &c[1]);
    assert_eq!((a.1, b.1), (16_000, 0), "{c:?}");
    // For this request alone, recomputing the prefix on B is faster...
    assert!(b.2 < a.2, "greedy would pick B: {c:?}");
    // ...but the recompute would delay the 8 requests decoding on B by its prefill time each,
    // and A, which holds the prefix, recomputes nothing.
    assert_eq!(a.3, 0.0, "{c:?}");
    assert!(b.3 > 7.0 * (b.2 - 0.5), "{c:?}");
    assert_eq!(routed_to(&d), A, "{c:?}");
    // The route's predicted TTFT is the request's own, without the capacity cost.
    assert_eq!(d.route().unwrap().predicted_ttft_s, Some(a.2));
    // The pick is the candidate with the lowest predicted TTFT plus capacity costs.
    let best = c
        .iter()
        .min_by(|x, y| (x.2 + x.3 + x.4).total_cmp(&(y.2 + y.3 + y.4)))
        .unwrap();
    assert_eq!(best.0, A);
}

#[test]
fn a_request_goes_to_the_warm_worker_its_decode_slows_down_least() {
    // A and B both hold the prefix. A has 30 requests decoding; B has 5, and 1,000 tokens of
    // prefill queued, so this request's first token would come sooner on A. But each of its
    // 256 decode steps is longer for every request in flight where it runs: 30 on A, 5 on B.
    let policy = policy();
    let mut st = state(&policy);
    cache_prefix(&mut st, A);
    cache_prefix(&mut st, B);
    in_flight(&mut st, A, 30, 0);
    in_flight(&mut st, B, 5, 1_000);
    in_flight(&mut st, C, 8, 0);
    let req = request(1);
    let d = Decider::decide(&policy, &req, &st);
    let c = candidates(&d);
    let (a, b) = (&c[0], &c[1]);
    assert!(a.2 < b.2, "A is faster for this request alone: {c:?}");
    assert_eq!((a.3, b.3), (0.0, 0.0), "{c:?}");
    assert!(
        (a.4 / b.4 - 6.0).abs() < 1e-9,
        "decode cost ∝ requests in flight: {c:?}"
    );
    assert!(a.2 + a.4 > b.2 + b.4, "{c:?}");
    assert_eq!(routed_to(&d), B, "{c:?}");
    // Nothing in flight, no decode cost.
    let idle = ClusterState::from_policy(&policy, 16);
    let d = Decider::decide(&policy, &req, &idle);
    assert!(candidates(&d).iter().all(|x| x.4 == 0.0), "{d:#?}");
}

#[test]
fn an_idle_cold_worker_still_beats_a_warm_busy_one() {
    // Nothing in flight on B: the recompute delays nobody, so it costs nothing and the faster
    // cold prefill wins (the point of predicting TTFT rather than maximizing cache hits).
    let policy = policy();
    let mut st = state(&policy);
    cache_prefix(&mut st, A);
    in_flight(&mut st, A, 12, 24_000);
    in_flight(&mut st, C, 8, 0);
    let req = request(1);
    let d = Decider::decide(&policy, &req, &st);
    let c = candidates(&d);
    assert_eq!(c[1].3, 0.0, "{c:?}");
    assert!(c[2].3 > 0.0, "{c:?}");
    assert_eq!(routed_to(&d), B, "{c:?}");
}

#[test]
fn a_prefix_nobody_caches_costs_no_recompute() {
    // Cold everywhere: every candidate prefills the same tokens, none is charged, and the
    // choice is by predicted TTFT alone.
    let policy = policy();
    let mut st = state(&policy);
    in_flight(&mut st, A, 12, 0);
    in_flight(&mut st, B, 8, 0);
    in_flight(&mut st, C, 8, 4_000);
    let req = request(1);
    let d = Decider::decide(&policy, &req, &st);
    let c = candidates(&d);
    assert!(c.iter().all(|x| x.3 == 0.0), "{c:?}");
    assert_eq!(routed_to(&d), B, "{c:?}");
}

#[test]
fn exact_tracking_counts_a_prompt_routed_before_its_kv_events_arrive() {
    let policy = policy();
    let mut st = state(&policy);
    // Every worker is busy decoding, so recomputing a prefix held elsewhere has a cost.
    for ep in [A, B, C] {
        in_flight(&mut st, ep, 4, 0);
    }
    let first = request(1);
    let d1 = Decider::decide(&policy, &first, &st);
    let r1 = d1.route().unwrap().clone();
    let p1 = r1.prediction.unwrap();
    st.record_routed(
        &r1.namespace,
        &r1.destination,
        &r1.endpoint,
        &first,
        r1.cached_tokens,
        1_000,
    );
    st.begin_request(
        &r1.namespace,
        &r1.destination,
        &r1.endpoint,
        p1.uncached_tokens,
    );
    // A second request with the same prefix, before any KV event: the first one's endpoint
    // will hold the prefix by the time the second one's prefill runs there.
    st.set_now(1_500);
    let second = request(2);
    let d2 = Decider::decide(&policy, &second, &st);
    let c = candidates(&d2);
    let on_first = c.iter().find(|x| *x.0 == *r1.endpoint).unwrap();
    assert_eq!(on_first.1, 16_000, "{c:?}");
    assert_eq!(routed_to(&d2), &*r1.endpoint, "{c:?}");
    // Unconfirmed by KV events, the claim expires.
    st.set_now(1_000 + SPECULATIVE_MAX_AGE.as_millis() as u64 + 1);
    let d3 = Decider::decide(&policy, &second, &st);
    assert!(candidates(&d3).iter().all(|x| x.1 == 0), "{d3:#?}");
}

#[test]
fn a_request_for_several_sequences_is_charged_the_decode_of_each() {
    // OpenAI's `n`: four sequences decode side by side, each for `max_tokens` steps, so the
    // request adds four times the decode load of a single one wherever it runs.
    let policy = policy();
    let mut st = state(&policy);
    in_flight(&mut st, A, 6, 0);
    let one = request(1);
    let mut four = request(1);
    four.sequences = 4;
    let d1 = candidates(&Decider::decide(&policy, &one, &st));
    let d4 = candidates(&Decider::decide(&policy, &four, &st));
    let a1 = d1.iter().find(|c| c.0 == A).unwrap();
    let a4 = d4.iter().find(|c| c.0 == A).unwrap();
    assert!(a1.4 > 0.0, "{d1:?}");
    assert!((a4.4 - 4.0 * a1.4).abs() < 1e-9, "{a1:?} vs {a4:?}");
    // The first token is one prefill either way.
    assert_eq!(a1.2, a4.2);
    // `0` is read as one sequence.
    let mut zero = request(1);
    zero.sequences = 0;
    let d0 = candidates(&Decider::decide(&policy, &zero, &st));
    assert_eq!(d0, d1);
}

#[test]
fn the_cost_measure_counts_the_output_of_every_sequence() {
    let priced = POLICY.replace(
        "blockSize: 16\n",
        "blockSize: 16\n  cost: { uncachedPromptPerMillion: 0, cachedPromptPerMillion: 0, outputPerMillion: 10 }\n",
    );
    let (_, c) = kinf_lang::compile_str("p.yaml", &priced);
    let policy = c.policy.unwrap_or_else(|| panic!("{:?}", c.diagnostics));
    let st = state(&policy);
    let mut req = request(1);
    req.max_tokens = 100;
    req.sequences = 3;
    let d = Decider::decide(&policy, &req, &st);
    let stages = d
        .trace
        .rules
        .iter()
        .find_map(|r| r.stages.as_ref())
        .unwrap();
    // 100 tokens × 3 sequences at 10 per million.
    assert!(
        stages
            .considered
            .iter()
            .all(|c| (c.cost - 300.0 * 10.0 / 1e6).abs() < 1e-12),
        "{:?}",
        stages.considered.iter().map(|c| c.cost).collect::<Vec<_>>()
    );
}
