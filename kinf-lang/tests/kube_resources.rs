//! Checks of fields that matter in Kubernetes mode: label-selector operators and values,
//! `tokenizer.configMapRef` (not read), and front doors whose hosts overlap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kinf_lang::{Severity, compile_str};

/// `(code, severity, field path, message)` of every diagnostic of `text`.
fn diags(text: &str) -> Vec<(String, Severity, String, String)> {
    let (_, c) = compile_str("bundle.yaml", text);
    c.diagnostics
        .iter()
        .map(|d| {
            (
                d.code.as_str().to_owned(),
                d.severity,
                d.field_path
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                d.message.clone(),
            )
        })
        .collect()
}

const POOL: &str = "
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: main }
spec:
  destinations:
  - { kind: InferenceWorkerSet, name: qwen }
";

fn worker_set(extra: &str) -> String {
    format!(
        "apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: qwen }}
spec:
  models: [{{ name: qwen }}]
{extra}"
    )
}

#[test]
fn label_selector_operators_and_values_are_checked() {
    let text = worker_set(
        "  selector:
    matchExpressions:
    - { key: app, operator: in, values: [vllm] }
    - { key: app, operator: In }
    - { key: tier, operator: Exists, values: [gpu] }
    - { key: zone, operator: NotIn, values: [] }
    - { key: ok, operator: DoesNotExist }
    - { key: ok2, operator: In, values: [x] }
    - { key: ok3, operator: Equals, values: [x] }
",
    );
    let d = diags(&text);
    let got: Vec<(&str, &str)> = d
        .iter()
        .map(|(c, _, p, _)| (c.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("KINF0103", "spec.selector.matchExpressions[0].operator"),
            ("KINF0104", "spec.selector.matchExpressions[1]"),
            ("KINF0106", "spec.selector.matchExpressions[2].values"),
            ("KINF0104", "spec.selector.matchExpressions[3].values"),
            ("KINF0103", "spec.selector.matchExpressions[6].operator"),
        ],
        "{d:#?}"
    );
    assert!(d.iter().all(|(_, s, ..)| *s == Severity::Error));
    assert!(
        d[0].3.contains("`in` is not a label-selector operator"),
        "{d:#?}"
    );
    let (_, c) = compile_str("bundle.yaml", &text);
    let help = c.diagnostics[0].help.as_deref().unwrap();
    assert!(help.contains("did you mean `In`?"), "{help}");
}

#[test]
fn a_config_map_tokenizer_is_a_warning_and_never_a_path() {
    let text = format!(
        "{}---{POOL}",
        worker_set(
            "  endpoints: [\"10.0.0.1:8000\"]\n  tokenizer: { configMapRef: qwen-tokenizer }\n"
        )
    );
    let d = diags(&text);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].0, "KINF0410");
    assert_eq!(d[0].1, Severity::Warning);
    assert_eq!(d[0].2, "spec.tokenizer.configMapRef");
    let (_, c) = compile_str("bundle.yaml", &text);
    let policy = c.policy.expect("a warning does not refuse the bundle");
    let ws = policy.destinations[0].worker_set.as_ref().unwrap();
    assert_eq!(
        ws.tokenizer, None,
        "the ConfigMap name is not read as a path"
    );
}

fn door(namespace: &str, name: &str, hosts: &str) -> String {
    format!(
        "---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: {name}, namespace: {namespace} }}
spec: {{ pool: main{hosts} }}
"
    )
}

fn namespace_bundle(ns: &str) -> String {
    format!(
        "---\n{}---{}",
        worker_set("  endpoints: [\"10.0.0.1:8000\"]\n").replace(
            "metadata: { name: qwen }",
            &format!("metadata: {{ name: qwen, namespace: {ns} }}")
        ),
        POOL.replace(
            "metadata: { name: main }",
            &format!("metadata: {{ name: main, namespace: {ns} }}")
        )
    )
}

#[test]
fn two_front_doors_without_hosts_are_reported_naming_both() {
    let text = format!(
        "{}{}{}{}",
        namespace_bundle("team-a"),
        namespace_bundle("team-b"),
        door("team-a", "front-door", ""),
        door("team-b", "front-door", "")
    );
    let d = diags(&text);
    assert_eq!(d.len(), 1, "{d:#?}");
    let (code, sev, path, msg) = &d[0];
    assert_eq!((code.as_str(), *sev), ("KINF0508", Severity::Warning));
    assert_eq!(path, "spec");
    assert!(
        msg.contains("`team-b/front-door`") && msg.contains("`team-a/front-door`"),
        "{msg}"
    );
    let (_, c) = compile_str("bundle.yaml", &text);
    assert_eq!(
        c.diagnostics[0].related.len(),
        1,
        "points at the other door"
    );
    assert_eq!(
        c.diagnostics[0].resource.as_deref(),
        Some("GatewayBackend/team-b/front-door"),
        "reported on the door that never serves"
    );
}

#[test]
fn a_host_named_by_two_front_doors_is_reported_on_the_later_one() {
    let text = format!(
        "{}{}{}{}",
        namespace_bundle("llm"),
        door("llm", "a", ", hosts: [llm.example.com]"),
        door("llm", "b", ", hosts: [LLM.example.com, other.example.com]"),
        door("llm", "c", ""),
    );
    let d = diags(&text);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].0, "KINF0508");
    assert_eq!(d[0].2, "spec.hosts[0]");
    assert!(
        d[0].3.contains("`llm/b`") && d[0].3.contains("`llm/a`"),
        "{}",
        d[0].3
    );
    // Distinct hosts and one catch-all: nothing to say.
    let text = format!(
        "{}{}{}{}",
        namespace_bundle("llm"),
        door("llm", "a", ", hosts: [a.example.com]"),
        door("llm", "b", ", hosts: [b.example.com]"),
        door("llm", "c", ""),
    );
    assert!(diags(&text).is_empty(), "{:#?}", diags(&text));
}
