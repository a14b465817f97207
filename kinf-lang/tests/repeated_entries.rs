//! Entries of a list repeated where a repeat would double something at run time (a pool's
//! rules, a worker, a candidate) are reported (KINF0106). Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("r.yaml", text)
}

const BUNDLE: &str = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w, namespace: inference }
spec:
  endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
  models:
  - { name: llama-70b, aliases: [llama, llama-70b, llama] }
  - { name: qwen, aliases: [small] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud, namespace: inference }
spec:
  type: OpenAI
  url: https://api.example.com
  credentials: { secretRef: { name: key } }
  models:
  - { name: llama, providerModel: llama-3.3-70b }
  - { name: gpt, providerModel: gpt-4o }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool, namespace: inference }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: w }, { kind: InferenceProvider, name: cloud }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: other, namespace: inference }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: w }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: p, namespace: inference }
spec:
  targetRefs: [{ name: pool }, { name: other }]
  rules:
  - name: r
    matches: [ { qos: batch } ]
"#;

#[test]
fn distinct_entries_are_clean() {
    // An alias equal to its model's name, or given twice by one model, is ignored.
    assert_eq!(lint(BUNDLE), "");
}

#[test]
fn repeated_target_refs_endpoints_and_model_names_are_reported() {
    let text = BUNDLE
        .replace(
            "[{ name: pool }, { name: other }]",
            "[{ name: pool }, { name: other }, { kind: InferencePool, name: pool }]",
        )
        .replace(
            r#"["10.0.0.1:8000", "10.0.0.2:8000"]"#,
            r#"["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000"]"#,
        )
        .replace("aliases: [small]", "aliases: [small, llama]")
        .replace(
            "  - { name: gpt, providerModel: gpt-4o }\n",
            "  - { name: gpt, providerModel: gpt-4o }\n  - { name: llama, providerModel: llama-3.1-8b }\n",
        );
    insta::assert_snapshot!("repeated_entries", lint(&text));
    // The same pool under the same name in another entry: the same.
    let twice = BUNDLE.replace("{ name: other }", "{ name: pool }");
    let out = lint(&twice);
    assert!(out.contains("targets pool `pool` twice"), "{out}");
}
