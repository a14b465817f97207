//! Limits of equally named policies in two namespaces keep separate budgets in the shared store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use futures_util::FutureExt;
use kinf_handler::tenants::{LimitError, Limiter, MemoryStore, TokenEstimate};
use kinf_router::Request;

fn bundle(namespace: &str) -> String {
    format!(
        r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: workers, namespace: {namespace} }}
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [ {{ name: qwen }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: {namespace} }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: workers }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: limits, namespace: {namespace} }}
spec:
  targetRefs: [ {{ kind: InferencePool, name: pool }} ]
  rules:
  - name: all
    route:
      select: [ {{ type: Local }} ]
  limits:
  - name: per-tenant
    tokensPerMinute: 1000
"#
    )
}

#[test]
fn equally_named_limits_of_two_namespaces_spend_separate_budgets() {
    let mut sources = kinf_lang::Sources::new();
    for ns in ["default", "team-a", "team-b"] {
        sources.add(format!("{ns}.yaml"), bundle(ns));
    }
    let c = kinf_lang::compile(&sources);
    assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
    let policy = c.policy.unwrap();
    let store = Arc::new(MemoryStore::new());
    let limiter = |ns: &str| {
        let pool = policy.pool(ns, "pool").unwrap();
        Limiter::new(&pool.limits, store.clone())
    };
    let names: Vec<String> = ["default", "team-a", "team-b"]
        .iter()
        .map(|ns| policy.pool(ns, "pool").unwrap().limits[0].name.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "limits/per-tenant",
            "team-a/limits/per-tenant",
            "team-b/limits/per-tenant"
        ]
    );
    let mut req = Request::new("qwen", 500);
    req.tenant = Some("alice".into());
    req.max_tokens = 300;
    let admit = |l: &Limiter| {
        l.admit(&req, TokenEstimate::of(&req))
            .now_or_never()
            .unwrap()
    };
    // Tenant alice spends 800 of team-a's 1000 tokens: another 800 there is refused…
    let held = admit(&limiter("team-a")).unwrap();
    match admit(&limiter("team-a")) {
        Err(LimitError::Exceeded(x)) => assert_eq!(&*x.limit, "team-a/limits/per-tenant"),
        other => panic!("expected team-a's limit to refuse, got {other:?}"),
    }
    // …while the same tenant's budgets in team-b and default are untouched.
    let b = admit(&limiter("team-b")).unwrap();
    let d = admit(&limiter("default")).unwrap();
    drop((held, b, d));
}
