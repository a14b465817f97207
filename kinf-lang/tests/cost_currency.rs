//! A `cost.currency` other than `USD` (KINF0414): prices are never converted and every cost is
//! counted in US dollars. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("c.yaml", text)
}

/// Worker set `w` and provider `cloud`, each with `cost` set to `worker` and `provider`.
fn bundle(worker: &str, provider: &str) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: w, namespace: inference }}
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [{{ name: m }}]
  cost: {worker}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud, namespace: inference }}
spec:
  type: OpenAI
  url: https://api.example.com
  credentials: {{ secretRef: {{ name: key }} }}
  models: [{{ name: m, providerModel: m }}]
  cost: {provider}
"#
    )
}

#[test]
fn usd_or_no_currency_is_clean() {
    for (worker, provider) in [
        (
            "{ outputPerMillion: 2 }",
            "{ currency: USD, outputPerMillion: 3 }",
        ),
        ("{ currency: usd, outputPerMillion: 2 }", "{}"),
    ] {
        assert_eq!(lint(&bundle(worker, provider)), "", "{worker} {provider}");
    }
}

#[test]
fn other_currencies_are_reported_on_worker_sets_and_providers() {
    let text = bundle(
        "{ currency: EUR, uncachedPromptPerMillion: 0.5 }",
        "{ currency: JPY, outputPerMillion: 300 }",
    );
    let out = lint(&text);
    assert_eq!(out.matches("warning[KINF0414]").count(), 2, "{out}");
    insta::assert_snapshot!("other_currencies", out);
}
