//! Tenants through the gateway: API keys mapped to tenants (held as hashes), spoofing refused,
//! a tenant over its token budget gets 429 with OpenAI-style rate-limit headers while the other
//! is unaffected, and every request is accounted to the right tenant.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use serde_json::json;
use support::post_json as post;
use support::*;

fn config(worker: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
  cost: {{ uncachedPromptPerMillion: 1.0, cachedPromptPerMillion: 0.5, outputPerMillion: 4.0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: t }}
spec:
  pool: pool
  tenants:
    apiKeys: {{ file: keys.txt }}
    trustedHeader: x-tenant
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  limits:
  - name: acme-budget
    matches: {{ tenant: acme }}
    tokensPerMinute: 200
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_identity_and_accounting_per_tenant() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("tenants");
    // One key in plain text, one as its SHA-256 hash.
    let globex_hash = kinf_handler::tenants::identity::hash_for_file("sk-globex-2");
    std::fs::write(
        dir.join("keys.txt"),
        format!("acme: sk-acme-1\nglobex: {globex_hash}\n"),
    )
    .unwrap();
    let cfg = config(worker.http);
    std::fs::write(dir.join("c.yaml"), &cfg).unwrap();
    let (gw, addr) = gateway(&dir).await;
    let chat = json!({"model": "tiny", "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello there"}]});

    // Identity: keys map to tenants; spoofing is refused.
    let acme = [("authorization", "Bearer sk-acme-1")];
    let globex = [("x-api-key", "sk-globex-2")];
    let (s, _, v) = post(addr, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("missing_api_key")),
        "{v}"
    );
    let (s, _, v) = post(
        addr,
        "/v1/chat/completions",
        &chat,
        &[("authorization", "Bearer sk-nope")],
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key")),
        "{v}"
    );
    assert!(!v.to_string().contains("sk-nope"), "the key is echoed: {v}");
    let (s, _, v) = post(
        addr,
        "/v1/chat/completions",
        &chat,
        &[("x-api-key", "sk-globex-2"), ("x-tenant", "acme")],
    )
    .await;
    assert_eq!(
        s, 401,
        "a forged tenant header with another tenant's key: {v}"
    );
    let (s, _, v) = post(
        addr,
        "/v1/messages",
        &json!({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
        &[("x-api-key", "sk-nope")],
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (401, Some("authentication_error")),
        "{v}"
    );

    // acme has 200 tokens per minute; each request reserves its prompt + 40.
    let mut ok = 0;
    let mut limited = None;
    for _ in 0..6 {
        let (s, h, v) = post(addr, "/v1/chat/completions", &chat, &acme).await;
        match s {
            200 => {
                ok += 1;
                assert!(h.contains_key("x-ratelimit-remaining-tokens"), "{h:?}");
            }
            429 => {
                limited = Some((h, v));
                break;
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    let (h, v) = limited.expect("acme was never limited");
    assert!(ok >= 1, "acme got nothing through");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "tokens", "{v}");
    assert_eq!(h["x-ratelimit-limit-tokens"], "200");
    assert!(h.contains_key("x-ratelimit-reset-tokens"));
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");

    // globex is unaffected.
    for _ in 0..4 {
        let (s, _, v) = post(addr, "/v1/chat/completions", &chat, &globex).await;
        assert_eq!(s, 200, "{v}");
    }

    // Accounting per tenant equals what the worker reported.
    let mut m = String::new();
    gw.metrics.render(&mut m);
    let output = |tenant: &str| -> f64 {
        m.lines()
            .filter(|l| {
                l.starts_with("kinference_tenant_tokens_total{")
                    && l.contains(&format!("tenant=\"{tenant}\""))
                    && l.contains("kind=\"output\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(output("acme"), 40.0 * ok as f64, "{m}");
    assert_eq!(output("globex"), 160.0, "{m}");
}

/// A limit with `whenExceeded: Tag` does not refuse: over-limit requests go through uncharged,
/// tagged `over-limit`, and a rule routes them to a cheaper model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_traffic_is_routed_elsewhere_when_the_policy_says_so() {
    let main = tiny_sim("50", &[]).await;
    let cheap = sim(&[
        "--port",
        "0",
        "--model",
        "tiny-small",
        "--profile",
        "tiny",
        "--speed",
        "50",
    ])
    .await;
    let dir = temp_dir("overlimit");
    std::fs::write(dir.join("keys.txt"), "acme: sk-acme-1\n").unwrap();
    let cfg = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: main, namespace: t }}
spec:
  endpoints: ["{main}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: cheap, namespace: t }}
spec:
  endpoints: ["{cheap}"]
  models: [ {{ name: tiny-small }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: main }}, {{ kind: InferenceWorkerSet, name: cheap }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: t }}
spec:
  pool: pool
  tenants: {{ apiKeys: {{ file: keys.txt }} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  rules:
  - name: over-budget-to-cheap
    matches: [ {{ tag: over-limit }} ]
    route:
      consider: [ {{ models: {{ names: [tiny-small] }} }} ]
  limits:
  - name: acme-premium
    matches: {{ tenant: acme }}
    tokensPerMinute: 150
    whenExceeded: Tag
"#,
        main = main.http,
        cheap = cheap.http
    );
    std::fs::write(dir.join("c.yaml"), cfg).unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let chat = json!({"model": "tiny", "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello there"}]});
    let acme = [("authorization", "Bearer sk-acme-1")];
    let mut served_by = Vec::new();
    for _ in 0..5 {
        let (s, h, v) = post(addr, "/v1/chat/completions", &chat, &acme).await;
        assert_eq!(s, 200, "over-limit requests are not refused: {v}");
        served_by.push(h["x-kinference-model"].to_str().unwrap().to_owned());
    }
    assert_eq!(
        served_by[0], "tiny-llama",
        "within budget: the requested model"
    );
    assert!(
        served_by.iter().any(|m| m == "tiny-small"),
        "over budget: the cheaper model: {served_by:?}"
    );
    let last = served_by.last().unwrap();
    assert_eq!(last, "tiny-small", "{served_by:?}");
}
