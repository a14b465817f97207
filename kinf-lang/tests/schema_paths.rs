//! Schema errors are reported at the value they are about, whatever its key: a mapping key made
//! of digits (a label `"8080"`) is a key, not a list index. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[test]
fn keys_made_of_digits_are_keys() {
    let text = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata:
  name: w
  namespace: inference
  labels:
    "1": [x]
spec:
  selector:
    matchLabels:
      app: vllm
      "8080": 5
  models: [{ name: m }]
"#;
    insta::assert_snapshot!("digit_keys", support::lint("w.yaml", text));
}
