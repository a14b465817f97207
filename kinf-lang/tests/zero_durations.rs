//! A timeout or a scrape interval of zero is refused (KINF0201): every request would time out,
//! every endpoint would be scraped in a busy loop. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn bundle(interval: &str, provider_timeout: &str, classifier_timeout: &str) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: w, namespace: inference }}
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [{{ name: m }}]
  metrics: {{ interval: {interval} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud, namespace: inference }}
spec:
  type: OpenAI
  url: https://api.example.com/v1
  models: [{{ name: m, providerModel: gpt-4o-mini }}]
  timeout: {provider_timeout}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: inference }}
spec:
  destinations: [{{ kind: InferenceWorkerSet, name: w }}, {{ kind: InferenceProvider, name: cloud }}]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: g, namespace: inference }}
spec:
  pool: pool
  classifiers:
  - {{ name: ext, type: External, url: "http://classify:8080/v1/classify", tags: [pii-detected], timeout: {classifier_timeout} }}
"#
    )
}

#[test]
fn zero_timeouts_and_intervals_are_refused() {
    assert_eq!(support::lint("z.yaml", &bundle("2s", "30s", "100ms")), "");
    insta::assert_snapshot!(
        "zero_durations",
        support::lint("z.yaml", &bundle("0s", "0ms", "0s"))
    );
}
