//! A request that no pool can serve is refused with `unknown_pool` and a message that says
//! why in the bundle's terms: no pool at all, a named pool that does not exist, or several
//! pools and nothing choosing one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_router::{ClusterState, Decider, Request};

const WORKERS: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w }
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [{ name: m }]
"#;

const POOL: &str = r#"
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: NAME }
spec: { destinations: [{ kind: InferenceWorkerSet, name: w }] }
"#;

/// The refusal's message for a request naming `pool`, against a bundle with `pools`.
fn refusal(pools: &[&str], pool: Option<&str>) -> String {
    let mut text = WORKERS.to_string();
    for p in pools {
        text.push_str(&POOL.replace("NAME", p));
    }
    let (_, c) = kinf_lang::compile_str("b.yaml", &text);
    let policy = c
        .policy
        .unwrap_or_else(|| panic!("does not compile: {:?}", c.diagnostics));
    let state = ClusterState::from_policy(&policy, 16);
    let mut req = Request::new("m", 100);
    req.pool = pool.map(Into::into);
    let d = Decider::decide(&policy, &req, &state);
    let r = d.reject().expect("refused");
    assert_eq!((r.status, r.code), (404, "unknown_pool"));
    r.message.to_string()
}

#[test]
fn the_refusal_says_why_no_pool_serves_the_request() {
    assert_eq!(
        refusal(&[], None),
        "no InferencePool is configured, so no model is served; add an InferencePool to the bundle"
    );
    assert_eq!(
        refusal(&["a"], Some("default/b")),
        "no pool `default/b` (pools: default/a)"
    );
    assert_eq!(
        refusal(&["a", "b"], None),
        "the request names no pool and there are 2 InferencePools (default/a, default/b): a \
         GatewayBackend's `pool` chooses one"
    );
}
