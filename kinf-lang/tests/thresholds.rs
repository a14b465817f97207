//! Lint of the Complexity classifier's `thresholds`.
#![allow(clippy::unwrap_used, clippy::panic)]

fn codes(yaml: &str) -> Vec<&'static str> {
    let (_, c) = kinf_lang::compile_str("g.yaml", yaml);
    c.diagnostics.iter().map(|d| d.code.as_str()).collect()
}

const BASE: &str = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w }
spec: { endpoints: ["10.0.0.1:8000"], models: [{ name: m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p }
spec: { destinations: [{ kind: InferenceWorkerSet, name: w }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: { name: g }
spec:
  pool: p
  classifiers:
"#;

#[test]
fn valid_thresholds_lint_clean_and_bad_ones_are_reported() {
    let ok = format!(
        "{BASE}  - {{ name: c, type: Complexity, thresholds: {{ tokens: [128, 512, 2048], questions: [1, 3], mediumAt: 3, highAt: 6 }} }}\n"
    );
    assert!(codes(&ok).is_empty(), "{:?}", codes(&ok));
    let decreasing =
        format!("{BASE}  - {{ name: c, type: Complexity, thresholds: {{ turns: [10, 4] }} }}\n");
    assert_eq!(codes(&decreasing), ["KINF0206"]);
    let overlap = format!(
        "{BASE}  - {{ name: c, type: Complexity, thresholds: {{ mediumAt: 5, highAt: 5 }} }}\n"
    );
    assert_eq!(codes(&overlap), ["KINF0206"]);
    let wrong_len =
        format!("{BASE}  - {{ name: c, type: Complexity, thresholds: {{ tokens: [1, 2] }} }}\n");
    assert_eq!(codes(&wrong_len), ["KINF0105"]);
    let wrong_type = format!("{BASE}  - {{ name: c, type: Pii, thresholds: {{ mediumAt: 1 }} }}\n");
    assert_eq!(codes(&wrong_type).len(), 1, "{:?}", codes(&wrong_type));
}
