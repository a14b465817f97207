//! A rule that matches one model and considers others (`consider: [ { models: ... } ]`, to
//! send requests for an expensive model to a cheaper one) has the destinations serving the
//! considered models as candidates, whether or not they serve the model it matches: no
//! "never has a candidate" warning (KINF0504) for them. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

/// Worker set `big` serves `glm-5.3` only, `small` serves `qwen` only; pool `pool` has both.
const CLUSTER: &str = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: big, namespace: inference }
spec: { endpoints: ["10.0.0.1:8000"], models: [{ name: glm-5.3 }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: small, namespace: inference }
spec: { endpoints: ["10.0.0.2:8000"], models: [{ name: qwen }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool, namespace: inference }
spec: { destinations: [{ kind: InferenceWorkerSet, name: big }, { kind: InferenceWorkerSet, name: small }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: p, namespace: inference }
spec:
  rules:
"#;

fn lint(rules: &str) -> String {
    support::lint("c.yaml", &format!("{CLUSTER}{rules}"))
}

#[test]
fn considering_another_model_has_its_destinations_as_candidates() {
    // Requests for `glm-5.3` go to `small`, which does not serve `glm-5.3`.
    let downgrade = "  - name: downgrade
    matches: [ { model: glm-5.3, tag: complexity-low } ]
    route:
      consider: [ { models: { names: [qwen] } } ]
      select: [ { type: Local, order: [small] } ]
";
    assert_eq!(lint(downgrade), "");
    // With an entry for the requested model too, both worker sets are candidates.
    let both = "  - name: both
    matches: [ { model: glm-5.3 } ]
    route:
      consider: [ { models: { names: [qwen] } }, { destination: big } ]
      select: [ { order: [big] }, { order: [small] } ]
";
    assert_eq!(lint(both), "");
}

#[test]
fn destinations_that_never_serve_the_matched_model_are_still_warned_about() {
    // `small` does not serve `glm-5.3`, and nothing here considers another model.
    let text = "  - name: wrong-destination
    matches: [ { model: glm-5.3 } ]
    route:
      consider: [ { destination: small } ]
      onEmpty: NextRule
  - name: wrong-model-entry
    matches: [ { model: glm-5.3 } ]
    route:
      consider: [ { models: { names: [qwen] }, destination: big } ]
";
    insta::assert_snapshot!("never_candidates", lint(text));
}
