//! Edge cases of the decision engine: garbage in the state it reads (a provider's observed TTFT
//! that is NaN or negative, TTFT observations that are absurd, zero or not finite), worker sets
//! with no endpoint at all, and the same decision at both trace details throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_lang::CompiledPolicy;
use kinf_router::state::LoadSample;
use kinf_router::{ClusterState, Decider, Decision, Request, TraceDetail};

mod support;
use support::{compile, without_candidate_lists};

/// A pool of a provider (first), a worker set of two endpoints, and a second provider; `rules`
/// is the policy's rule list (empty: no policy, the default route).
fn bundle(rules: &str) -> String {
    let mut text = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: local }
spec:
  endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
  models: [{ name: m }]
  blockSize: 16
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud-a }
spec: { type: OpenAI, url: "https://a.example.com/v1", models: [{ name: m, providerModel: a-m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud-b }
spec: { type: OpenAI, url: "https://b.example.com/v1", models: [{ name: m, providerModel: b-m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool }
spec:
  destinations:
  - { kind: InferenceProvider, name: cloud-a }
  - { kind: InferenceWorkerSet, name: local }
  - { kind: InferenceProvider, name: cloud-b }
"#
    .to_string();
    if !rules.is_empty() {
        text.push_str(
            "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec:\n  rules:\n",
        );
        text.push_str(rules);
    }
    text
}

/// One tier over every backend, by predicted TTFT.
const ANY_BY_TTFT: &str =
    "  - name: fastest\n    route:\n      select: [{ minimize: PredictedTTFT }]\n";
/// Providers only, by predicted TTFT.
const PROVIDERS_BY_TTFT: &str =
    "  - name: cloud\n    route:\n      select: [{ type: Provider, minimize: PredictedTTFT }]\n";

/// An idle cluster at 10 s, the providers' observed TTFTs set to `a` and `b`.
fn state(policy: &CompiledPolicy, a: Option<f64>, b: Option<f64>) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 16);
    for ws in st.worker_sets.values_mut() {
        for i in 0..ws.endpoints.len() {
            ws.push_load(
                i,
                LoadSample {
                    at_ms: 9_000,
                    queued: 0.0,
                    running: 0.0,
                    kv_usage: 0.1,
                },
            );
        }
    }
    for (k, p) in st.providers.iter_mut() {
        p.ttft_s = if k.ends_with("cloud-a") { a } else { b };
    }
    st.set_now(10_000);
    st
}

/// Decides at both trace details, checks that they agree, and returns the full decision.
fn decide(policy: &CompiledPolicy, req: &Request, st: &ClusterState) -> Decision {
    let full = Decider::decide_with(policy, req, st, TraceDetail::Full);
    let summary = Decider::decide_with(policy, req, st, TraceDetail::Summary);
    let expected = Decision {
        trace: without_candidate_lists(&full.trace),
        ..full.clone()
    };
    assert_eq!(summary, expected, "summary and full decisions differ");
    assert_eq!(Decider::decide(policy, req, st), full);
    full
}

fn destination(d: &Decision) -> String {
    match d.route() {
        Some(r) => format!("{}@{}", r.destination, r.endpoint),
        None => format!("reject: {:?}", d.reject()),
    }
}

#[test]
fn a_provider_whose_observed_ttft_is_nan_or_negative_is_ranked_by_its_prior() {
    // cloud-a comes first in the pool. A NaN moving average (a gateway's 0/0) compared as
    // "never lower", so the first candidate that had it was never replaced: cloud-a won every
    // decision, over an idle local worker and over a provider with a 0.5 s TTFT. A negative
    // one won every decision the other way.
    let req = Request::new("m", 1_000);
    for garbage in [f64::NAN, -3.0, f64::NEG_INFINITY] {
        let policy = compile(&bundle(ANY_BY_TTFT));
        let st = state(&policy, Some(garbage), Some(0.5));
        let d = decide(&policy, &req, &st);
        assert_eq!(
            destination(&d),
            "local@10.0.0.1:8000",
            "cloud-a's TTFT {garbage}: {d:#?}"
        );
        let route = d.route().unwrap();
        assert!(route.predicted_ttft_s.unwrap().is_finite());

        let policy = compile(&bundle(PROVIDERS_BY_TTFT));
        let st = state(&policy, Some(garbage), Some(0.5));
        let d = decide(&policy, &req, &st);
        assert_eq!(
            destination(&d),
            "cloud-b@https://b.example.com/v1",
            "cloud-a's TTFT {garbage}"
        );
        // Every candidate's prediction in the trace is a number (JSON has no NaN).
        let stages = d.trace.rules[0].stages.as_ref().unwrap();
        for c in &stages.considered {
            assert!(c.predicted_ttft.total_s.is_finite(), "{c:?}");
            assert!(c.predicted_ttft.total_s >= 0.0, "{c:?}");
        }
        serde_json::to_string(&d).unwrap();
    }
}

#[test]
fn an_infinite_provider_ttft_is_no_observation_and_ties_go_by_pool_order() {
    let req = Request::new("m", 1_000);
    let policy = compile(&bundle(PROVIDERS_BY_TTFT));
    // An infinite observed TTFT: no observation to rank by, the prior (1 s) then.
    let st = state(&policy, Some(f64::INFINITY), Some(1.5));
    assert_eq!(
        destination(&decide(&policy, &req, &st)),
        "cloud-a@https://a.example.com/v1"
    );
    // Equal TTFTs: the destination first in the pool.
    let st = state(&policy, Some(0.7), Some(0.7));
    assert_eq!(
        destination(&decide(&policy, &req, &st)),
        "cloud-a@https://a.example.com/v1"
    );
    // Equal local endpoints: the first endpoint.
    let policy = compile(&bundle(ANY_BY_TTFT));
    let st = state(&policy, Some(30.0), Some(30.0));
    assert_eq!(
        destination(&decide(&policy, &req, &st)),
        "local@10.0.0.1:8000"
    );
}

/// Teaches the worker set's model `n` observations of a worker with a 0.1 s overhead and
/// 5,000 prefill tokens per second.
fn learn_truth(st: &mut ClusterState, n: usize) {
    for i in 0..n {
        let tokens = 500.0 + (i % 8) as f64 * 500.0;
        let addr = if i % 2 == 0 {
            "10.0.0.1:8000"
        } else {
            "10.0.0.2:8000"
        };
        st.observe_ttft(
            "default",
            "local",
            addr,
            tokens,
            0.0,
            0.0,
            0.1 + tokens / 5_000.0,
        );
    }
}

/// The predicted TTFT of a 2,000-token prompt, routed to the first endpoint.
fn predicted(policy: &CompiledPolicy, st: &ClusterState) -> f64 {
    let d = decide(policy, &Request::new("m", 2_000), st);
    assert_eq!(destination(&d), "local@10.0.0.1:8000", "{d:#?}");
    d.route().unwrap().predicted_ttft_s.unwrap()
}

#[test]
fn one_absurd_ttft_observation_does_not_wreck_the_model() {
    // One observed TTFT of 2^64 ms (a clock that went backwards, subtracted unsigned), or of
    // a day (a stuck stream), among observations of a 0.5 s worker. Least squares moved the
    // overhead to its 60 s limit at once and it stayed there for hundreds of observations:
    // every request went to a 2 s provider in the meantime.
    let truth = 0.1 + 2_000.0 / 5_000.0;
    for outlier in [u64::MAX as f64 / 1000.0, 86_400.0, 600.0] {
        let policy = compile(&bundle(ANY_BY_TTFT));
        let mut st = state(&policy, Some(2.0), Some(2.0));
        learn_truth(&mut st, 100);
        let before = predicted(&policy, &st);
        assert!((before - truth).abs() < 0.05 * truth, "{before} vs {truth}");
        st.observe_ttft(
            "default",
            "local",
            "10.0.0.1:8000",
            1_000.0,
            0.0,
            0.0,
            outlier,
        );
        let after = predicted(&policy, &st);
        assert!(
            after < 2.0 * truth,
            "after a {outlier} s outlier: {after} vs {truth}"
        );
        learn_truth(&mut st, 20);
        let recovered = predicted(&policy, &st);
        assert!(
            (recovered - truth).abs() < 0.1 * truth,
            "20 observations after a {outlier} s outlier: {recovered} vs {truth}"
        );
        // The reported error recovers with it: the outlier counts at the learning limit
        // (at most a few seconds here), not at its absurd size.
        let error = st.prediction_errors()[0].abs_error_s;
        assert!(
            error < 0.5,
            "20 observations after a {outlier} s outlier: {error}"
        );
    }
}

#[test]
fn a_worker_that_really_slows_down_is_still_learned_quickly() {
    // The outlier guard must not stop the model from following a real change: the worker
    // becomes ten times slower for good.
    let policy = compile(&bundle(ANY_BY_TTFT));
    let mut st = state(&policy, Some(60.0), Some(60.0));
    learn_truth(&mut st, 100);
    let slower = |st: &mut ClusterState, n: usize| {
        for i in 0..n {
            let tokens = 500.0 + (i % 8) as f64 * 500.0;
            st.observe_ttft(
                "default",
                "local",
                "10.0.0.1:8000",
                tokens,
                0.0,
                0.0,
                1.0 + tokens / 500.0,
            );
        }
    };
    let truth = 1.0 + 2_000.0 / 500.0;
    slower(&mut st, 30);
    let p = predicted(&policy, &st);
    assert!(p > 0.4 * truth, "after 30: {p} vs {truth}");
    slower(&mut st, 90);
    let p = predicted(&policy, &st);
    assert!((p - truth).abs() < 0.15 * truth, "{p} vs {truth}");
}

#[test]
fn zero_and_non_finite_observations_are_ignored() {
    // A TTFT of exactly 0 is a reporter's "unknown" (no first token comes in no time), and
    // inputs that are not finite cannot be learned from; either made every later prediction
    // error report infinite or taught the model that prefill is free.
    let policy = compile(&bundle(ANY_BY_TTFT));
    let mut st = state(&policy, Some(2.0), Some(2.0));
    learn_truth(&mut st, 100);
    let before = predicted(&policy, &st);
    for _ in 0..200 {
        st.observe_ttft("default", "local", "10.0.0.1:8000", 2_000.0, 0.0, 0.0, 0.0);
    }
    for bad in [f64::NAN, f64::INFINITY, -f64::INFINITY] {
        st.observe_ttft("default", "local", "10.0.0.1:8000", bad, 0.0, 0.0, 0.5);
        st.observe_ttft("default", "local", "10.0.0.1:8000", 2_000.0, bad, 0.0, 0.5);
        st.observe_ttft("default", "local", "10.0.0.1:8000", 2_000.0, 0.0, bad, 0.5);
    }
    assert_eq!(predicted(&policy, &st), before);
    for e in st.prediction_errors() {
        assert!(e.abs_error_s.is_finite() && e.abs_error_s < 0.1, "{e:?}");
        assert!(e.rel_error.is_finite(), "{e:?}");
    }
}

#[test]
fn a_worker_set_without_endpoints_is_named_in_the_trace() {
    // A selector that matches no pod leaves a worker set with no endpoint: the rule rejects,
    // and the trace must say why, as it does for endpoints that are not ready.
    let rules = "  - name: local-only\n    route:\n      consider: [{ type: Local }]\n      onEmpty: Reject\n";
    let policy = compile(&bundle(rules));
    let mut st = state(&policy, None, None);
    let ws = st.worker_sets.values_mut().next().unwrap();
    ws.endpoints.clear();
    ws.rebuild_floor();
    let d = decide(&policy, &Request::new("m", 100), &st);
    assert_eq!(d.reject().unwrap().code, "policy_rejected");
    let stages = d.trace.rules[0].stages.as_ref().unwrap();
    assert_eq!(stages.result, "Reject");
    assert_eq!(stages.unavailable, vec!["local: no endpoints".to_string()]);
}

#[test]
fn every_endpoint_unavailable_rejects_with_each_named() {
    let rules = "  - name: local-only\n    route:\n      consider: [{ type: Local }]\n      onEmpty: NextRule\n";
    let policy = compile(&bundle(rules));
    let mut st = state(&policy, Some(0.5), Some(0.4));
    let ws = st.worker_sets.values_mut().next().unwrap();
    ws.set_ready(0, false);
    ws.set_ready(1, false);
    for p in st.providers.values_mut() {
        p.ready = false;
    }
    let d = decide(&policy, &Request::new("m", 100), &st);
    assert_eq!(d.reject().unwrap().code, "no_capacity");
    let stages = d.trace.rules[0].stages.as_ref().unwrap();
    assert_eq!(stages.result, "NextRule");
    assert_eq!(
        stages.unavailable,
        vec![
            "local@10.0.0.1:8000: not ready".to_string(),
            "local@10.0.0.2:8000: not ready".to_string()
        ]
    );
    let default = d.trace.default.as_ref().unwrap();
    assert_eq!(default.result, "Reject");
    assert_eq!(default.unavailable.len(), 4, "{:?}", default.unavailable);
}

/// A cluster at 41 s whose two endpoints have both used 80 % of their KV cache in every
/// sample of the last 30 s (one per second), the second after 11 samples at 90 %.
fn at_80_percent(policy: &CompiledPolicy) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 16);
    let ws = st.worker_sets.values_mut().next().unwrap();
    for (i, kv) in [(0usize, 0.8), (1, 0.9)] {
        for t in 0..11u64 {
            if i == 1 {
                ws.push_load(
                    i,
                    LoadSample {
                        at_ms: t * 1000,
                        queued: 0.0,
                        running: 1.0,
                        kv_usage: kv,
                    },
                );
            }
        }
    }
    for i in 0..2 {
        for t in 11..=41u64 {
            ws.push_load(
                i,
                LoadSample {
                    at_ms: t * 1000,
                    queued: 0.0,
                    running: 1.0,
                    kv_usage: 0.8,
                },
            );
        }
    }
    st.set_now(41_000);
    st
}

#[test]
fn a_constant_load_averages_to_itself_whatever_came_before() {
    // Floating-point running sums averaged the 31 samples of 0.8 as 0.8000000000000004 on
    // the first endpoint and 0.8000000000000002 on the second (a difference of rounded prefix
    // sums, which depend on the samples before the window).
    let policy = compile(&bundle(ANY_BY_TTFT));
    let st = at_80_percent(&policy);
    let ws = st.worker_sets.values().next().unwrap();
    for ep in &ws.endpoints {
        for secs in [1u64, 5, 10, 29, 30] {
            let w = std::time::Duration::from_secs(secs);
            assert_eq!(ep.load.average(w, 41_000).kv_cache_usage, 0.8, "{secs} s");
            assert_eq!(ep.load.average(w, 41_000).running_prompts, 1.0, "{secs} s");
        }
    }
}

#[test]
fn a_worker_exactly_at_a_load_threshold_is_not_dropped() {
    // Thresholds are strict: an endpoint at exactly 80 % is not over 80 % (it was dropped).
    let rules = "  - name: cool\n    route:\n      consider: [{ type: Local }]\n      exclude:\n      - { name: hot, drop: { kvCacheUsage: { greaterThan: 80% } } }\n      - { name: hot-5s, window: 5s, drop: { kvCacheUsage: { greaterThan: 0.8 } } }\n      onEmpty: Reject\n";
    let policy = compile(&bundle(rules));
    let d = decide(&policy, &Request::new("m", 100), &at_80_percent(&policy));
    assert_eq!(destination(&d), "local@10.0.0.1:8000", "{:#?}", d.trace);
    assert!(d.trace.rules[0].stages.as_ref().unwrap().dropped.is_empty());
}

#[test]
fn equal_window_averages_tie_and_go_to_the_first_endpoint() {
    // Equal loads tie, and ties go to the first endpoint (the second won: its sample history
    // rounded its average lower).
    let rules =
        "  - name: least-kv\n    route:\n      select: [{ type: Local, minimize: KvCacheUsage }]\n";
    let policy = compile(&bundle(rules));
    let d = decide(&policy, &Request::new("m", 100), &at_80_percent(&policy));
    assert_eq!(destination(&d), "local@10.0.0.1:8000");
}
