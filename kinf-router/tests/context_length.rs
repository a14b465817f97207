//! A worker set whose workers reported a `max_model_len` too short for the request's context
//! (prompt plus `max_tokens`) is no candidate: the request goes where it fits, even to a busier
//! worker set, and when it fits nowhere it is refused with 400 `context_length_exceeded`, in
//! summary decisions (the scan fast path) as in full ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use kinf_router::{ClusterState, Decider, Decision, Outcome, Request, TraceDetail};

mod support;
use support::compile;

/// Two worker sets serve `chat` (upstream `m`): `short` first in the pool, then `long`.
/// `onEmpty` of the one rule, if any.
fn bundle(rule_on_empty: Option<&str>) -> String {
    let mut text = String::from(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: short }
spec:
  endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
  models: [{ name: m, aliases: [chat] }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: long }
spec:
  endpoints: ["10.0.1.1:8000"]
  models: [{ name: m, aliases: [chat] }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: short }, { kind: InferenceWorkerSet, name: long }]
"#,
    );
    if let Some(on_empty) = rule_on_empty {
        text.push_str(&format!(
            r#"---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: pol }}
spec:
  rules:
  - name: fastest
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
      onEmpty: {on_empty}
"#
        ));
    }
    text
}

/// The state: `long` busy (12 requests in flight), `short` idle; `short`'s workers reported a
/// 4,096-token context (one of them 8,192: the smallest counts), `long`'s 32,768.
fn state(policy: &kinf_lang::CompiledPolicy) -> ClusterState {
    let mut st = ClusterState::from_policy(policy, 16);
    st.set_now(1_000);
    let m: Arc<str> = "m".into();
    let short = st.worker_sets.get_mut("default/short").unwrap();
    short.set_max_model_lens("10.0.0.1:8000", vec![(m.clone(), 8_192)]);
    short.set_max_model_lens("10.0.0.2:8000", vec![(m.clone(), 4_096)]);
    assert_eq!(short.context_limit("m"), Some(4_096));
    let long = st.worker_sets.get_mut("default/long").unwrap();
    long.set_max_model_lens("10.0.1.1:8000", vec![(m, 32_768)]);
    for _ in 0..12 {
        st.begin_request("default", "long", "10.0.1.1:8000", 0);
    }
    st
}

fn request(prompt: u32, context: Option<u32>) -> Request {
    let mut r = Request::new("chat", prompt);
    r.required_context = context;
    r
}

fn both(policy: &kinf_lang::CompiledPolicy, req: &Request, st: &ClusterState) -> Decision {
    let full = Decider::decide_with(policy, req, st, TraceDetail::Full);
    let summary = Decider::decide_with(policy, req, st, TraceDetail::Summary);
    assert_eq!(
        format!("{:?}", full.outcome),
        format!("{:?}", summary.outcome),
        "the scan fast path decides as the general path"
    );
    full
}

fn endpoint(d: &Decision) -> String {
    d.route()
        .map(|r| r.endpoint.to_string())
        .unwrap_or_default()
}

#[test]
fn a_long_request_goes_where_its_context_fits_even_to_a_busier_worker_set() {
    for on_empty in [None, Some("Reject"), Some("NextRule")] {
        let policy = compile(&bundle(on_empty));
        let st = state(&policy);
        // Short enough for both: the idle `short` wins.
        let d = both(&policy, &request(2_000, Some(2_256)), &st);
        assert!(endpoint(&d).starts_with("10.0.0."), "{on_empty:?}: {d:#?}");
        // 4,097 tokens: `short` is out, named in the trace; the busy `long` serves it.
        let d = both(&policy, &request(3_841, Some(4_097)), &st);
        assert_eq!(endpoint(&d), "10.0.1.1:8000", "{on_empty:?}: {d:#?}");
        let stages = d
            .trace
            .rules
            .iter()
            .find_map(|r| r.stages.as_ref())
            .or(d.trace.default.as_ref())
            .unwrap();
        assert_eq!(
            stages.unavailable,
            ["short: the request needs 4097 tokens of context; `m` has 4096 (max_model_len)"],
            "{on_empty:?}"
        );
        // Without a required context (an inexact count), nothing is left out.
        let d = both(&policy, &request(3_841, None), &st);
        assert!(endpoint(&d).starts_with("10.0.0."), "{on_empty:?}: {d:#?}");
    }
}

#[test]
fn a_request_that_fits_nowhere_is_a_400_naming_the_longest_context() {
    for on_empty in [None, Some("Reject")] {
        let policy = compile(&bundle(on_empty));
        let st = state(&policy);
        let d = both(&policy, &request(40_000, Some(40_100)), &st);
        let Outcome::Reject(r) = &d.outcome else {
            panic!("{on_empty:?}: {d:#?}");
        };
        assert_eq!((r.status, r.code), (400, "context_length_exceeded"));
        assert_eq!(
            r.message,
            "the request needs 40100 tokens of context (its prompt and max_tokens); the longest context (max_model_len) of the models that could serve `chat` is 32768 tokens"
        );
    }
}

#[test]
fn other_reasons_to_be_unavailable_keep_the_503() {
    // `long` has no ready endpoint: the request fits nowhere that is up, but a retry may find
    // `long` back, so this stays a 503.
    let policy = compile(&bundle(None));
    let mut st = state(&policy);
    st.worker_sets
        .get_mut("default/long")
        .unwrap()
        .set_ready(0, false);
    let d = both(&policy, &request(5_000, Some(5_100)), &st);
    let Outcome::Reject(r) = &d.outcome else {
        panic!("{d:#?}");
    };
    assert_eq!((r.status, r.code), (503, "no_capacity"), "{d:#?}");
}

#[test]
fn lengths_follow_the_workers_reports_and_survive_a_policy_reload() {
    let policy = compile(&bundle(None));
    let mut st = state(&policy);
    // A restarted worker reports nothing yet: the other one's length is the limit.
    let short = st.worker_sets.get_mut("default/short").unwrap();
    short.set_max_model_lens("10.0.0.2:8000", Vec::new());
    assert_eq!(short.context_limit("m"), Some(8_192));
    assert_eq!(short.context_limit("other"), None);
    // Carried over to the state of a reloaded policy.
    let mut next = ClusterState::from_policy(&policy, 16);
    next.worker_sets
        .get_mut("default/short")
        .unwrap()
        .carry_over_from(st.worker_sets.remove("default/short").unwrap());
    assert_eq!(
        next.worker_sets["default/short"].context_limit("m"),
        Some(8_192)
    );
}
