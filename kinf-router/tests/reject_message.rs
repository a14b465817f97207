//! A rule's `route.rejectMessage` is what a client is told when the rule rejects, followed by
//! the rule's and the policy's names; without it the message is the generic one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_router::{ClusterState, Decider, Request};

/// A bundle whose rule `local-only` keeps requests tagged `pii-detected` on worker set `w`
/// (with `extra` under its `route`), and nothing else.
fn bundle(extra: &str) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: w }}
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [{{ name: m }}]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool }}
spec: {{ destinations: [{{ kind: InferenceWorkerSet, name: w }}] }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p }}
spec:
  rules:
  - name: local-only
    matches: [ {{ tag: pii-detected }} ]
    route:
      exclude:
      - name: busy
        drop: {{ queuedPrompts: {{ greaterThan: 4 }} }}
      select: [ {{ type: Local }} ]
{extra}"#
    )
}

/// The refusal of a `pii-detected` request while the only worker's queue is over the filter's
/// limit.
fn refusal(extra: &str) -> kinf_router::Reject {
    let (_, c) = kinf_lang::compile_str("b.yaml", &bundle(extra));
    let policy = c
        .policy
        .unwrap_or_else(|| panic!("does not compile: {:?}", c.diagnostics));
    let mut state = ClusterState::from_policy(&policy, 16);
    let ws = state.worker_sets.values_mut().next().unwrap();
    ws.push_load(
        0,
        kinf_router::state::LoadSample {
            at_ms: 0,
            queued: 9.0,
            running: 1.0,
            kv_usage: 0.5,
        },
    );
    let mut req = Request::new("m", 100);
    req.tags.push("pii-detected".into());
    let d = Decider::decide(&policy, &req, &state);
    d.reject().expect("refused").clone()
}

#[test]
fn a_rule_rejects_with_its_own_message_and_names_itself() {
    let r = refusal(
        "      rejectMessage: 'Personal data is served in the cluster only and it is busy: retry in a minute.'\n",
    );
    assert_eq!((r.status, r.code), (503, "policy_rejected"));
    assert_eq!(
        r.message,
        "Personal data is served in the cluster only and it is busy: retry in a minute. \
         (rejected by rule `local-only` of policy `default/p`)"
    );
    // Without one: the generic message.
    let r = refusal("");
    assert!(
        r.message
            .starts_with("rejected by rule `local-only` of policy `default/p`: no candidate"),
        "{}",
        r.message
    );
}
