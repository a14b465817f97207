//! How `explain` says why a filter dropped a candidate (text with units, and the structured
//! JSON form), and which `graph` lines show a filter's averaging window.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::path::PathBuf;

use support::{Tmp, root};

/// The `burst-to-cloud` cluster with `policy` (the rules of an InferencePolicy `p`).
fn bundle(tmp: &Tmp, rules: &str) -> PathBuf {
    let cluster =
        std::fs::read_to_string(root().join("testdata/policies/burst-to-cloud/cluster.yaml"))
            .unwrap();
    tmp.file("bundle/cluster.yaml", &cluster);
    tmp.file(
        "bundle/policy.yaml",
        &format!(
            "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\n\
             metadata: {{ name: p, namespace: inference }}\nspec:\n  rules:\n{rules}"
        ),
    );
    tmp.path("bundle")
}

const RULES: &str = r#"  - name: serve
    route:
      exclude:
      - name: busy
        window: 10s
        drop:
          backend: { type: Local }
          queuedPrompts: { greaterThan: 4 }
          kvCacheUsage: { greaterThan: 90%, lessThan: 0.99 }
      - name: slow-cloud
        drop:
          backend: { name: bedrock }
          predictedTTFT: { greaterThan: 2s }
      - name: cold
        drop:
          when: 'backend == "Local" && runningPrompts > 1'
      select:
      - { type: Local, minimize: PredictedTTFT }
      - { type: Provider, minimize: PredictedTTFT }
"#;

fn explain(tmp: &Tmp, format: kinfctl::cli::Format) -> Vec<u8> {
    let policies = bundle(tmp, RULES);
    let req = tmp.file("req.yaml", "model: llama-70b\npromptTokens: 1000\n");
    let state = tmp.file(
        "state.yaml",
        "endpoints:\n  \"10.0.0.1:8000\": { queuedPrompts: 6.5, kvCacheUsage: 0.95 }\n  \
         \"10.0.0.2:8000\": { runningPrompts: 3 }\n  \"10.0.0.3:8000\": { ready: false }\n\
         providers:\n  bedrock: { ttftSeconds: 2.5 }\n",
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(&[policies], &req, Some(&state), format, &mut out, &mut err);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    out
}

#[test]
fn explain_json_gives_each_drop_its_measures() {
    let tmp = Tmp::new("drop-reasons", "json");
    let v: serde_json::Value =
        serde_json::from_slice(&explain(&tmp, kinfctl::cli::Format::Json)).unwrap();
    let dropped = &v["stages"]["rules"][0]["stages"]["dropped"];
    let by = |filter: &str| {
        dropped
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["filter"] == filter)
            .unwrap_or_else(|| panic!("no drop by `{filter}` in {dropped}"))
            .clone()
    };

    // A load filter: both comparisons of a two-sided range, the values as fractions whatever
    // form the policy wrote them in (the text shows them as the policy did), and the window
    // the values are averaged over.
    let busy = by("busy");
    assert_eq!(busy["candidate"], "llama-workers@10.0.0.1:8000");
    assert_eq!(busy["backend"], "Local");
    assert_eq!(busy["destination"], serde_json::Value::Null);
    assert_eq!(busy["when"], serde_json::Value::Null);
    assert_eq!(busy["windowS"], 10.0);
    assert_eq!(
        busy["measures"],
        serde_json::json!([
            { "name": "queuedPrompts", "value": 6.5, "unit": "prompts", "op": ">", "bound": 4.0 },
            { "name": "kvCacheUsage", "value": 0.95, "unit": "ratio", "op": ">", "bound": 0.9 },
            { "name": "kvCacheUsage", "value": 0.95, "unit": "ratio", "op": "<", "bound": 0.99 },
        ])
    );
    // The text is kept, with units.
    assert_eq!(
        busy["reason"],
        "backend Local, queuedPrompts 6.5 > 4, kvCacheUsage 95% > 90% and < 99%; \
         load averaged over 10s"
    );

    // A predicted-TTFT filter: seconds, no window.
    let slow = by("slow-cloud");
    assert_eq!(
        slow["candidate"],
        "bedrock@https://bedrock-runtime.us-east-1.amazonaws.com"
    );
    assert_eq!(slow["backend"], serde_json::Value::Null);
    assert_eq!(slow["destination"], "bedrock");
    assert_eq!(slow["windowS"], serde_json::Value::Null);
    let m = &slow["measures"][0];
    assert_eq!(m["name"], "predictedTTFT");
    assert_eq!(m["unit"], "s");
    assert_eq!(m["op"], ">");
    assert_eq!(m["bound"], 2.0);
    assert!((m["value"].as_f64().unwrap() - 2.5).abs() < 1e-9, "{m}");
    assert_eq!(slow["measures"].as_array().unwrap().len(), 1);
    assert_eq!(
        slow["reason"],
        "destination bedrock, predictedTTFT 2.5s > 2s"
    );

    // A `when` filter: the expression alone, and the window of the load it reads.
    let cold = by("cold");
    assert_eq!(cold["candidate"], "llama-workers@10.0.0.2:8000");
    assert_eq!(cold["measures"], serde_json::json!([]));
    assert_eq!(cold["when"], "backend == \"Local\" && runningPrompts > 1");
    assert_eq!(cold["windowS"], 30.0);
    assert_eq!(
        cold["reason"],
        "when `backend == \"Local\" && runningPrompts > 1` holds; load averaged over 30s"
    );
}

#[test]
fn explain_text_gives_units() {
    let tmp = Tmp::new("drop-reasons", "text");
    let out = String::from_utf8(explain(&tmp, kinfctl::cli::Format::Human)).unwrap();
    assert!(
        out.contains(
            "  exclude `slow-cloud` dropped bedrock@https://bedrock-runtime.us-east-1.amazonaws.com \
             (destination bedrock, predictedTTFT 2.5s > 2s)\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "  exclude `busy` dropped llama-workers@10.0.0.1:8000 (backend Local, \
             queuedPrompts 6.5 > 4, kvCacheUsage 95% > 90% and < 99%; load averaged over 10s)\n"
        ),
        "{out}"
    );
}

#[test]
fn graph_shows_a_window_only_where_the_filter_reads_load() {
    let tmp = Tmp::new("drop-reasons", "graph");
    let policies = bundle(
        &tmp,
        r#"  - name: serve
    route:
      exclude:
      - name: not-cloud
        drop: { backend: { type: Provider } }
      - name: slow
        window: 5s
        drop: { predictedTTFT: { greaterThan: 2s } }
      - name: busy
        window: 5s
        drop: { queuedPrompts: { greaterThan: 4 } }
      - name: cold
        drop: { when: 'runningPrompts > 1' }
      - name: long
        drop: { when: 'promptTokens > 1000' }
      select:
      - { type: Local, minimize: PredictedTTFT }
"#,
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::graph::run(
        &[policies],
        None,
        kinfctl::cli::GraphFormat::Text,
        &mut out,
        &mut err,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let out = String::from_utf8(out).unwrap();
    let line = |filter: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("exclude  {filter}:")))
            .unwrap_or_else(|| panic!("no line for `{filter}` in {out}"))
            .trim()
            .to_string()
    };
    assert_eq!(
        line("not-cloud"),
        "exclude  not-cloud: drop backend Provider"
    );
    assert_eq!(line("slow"), "exclude  slow: drop predictedTTFT > 2s");
    assert_eq!(
        line("busy"),
        "exclude  busy: drop queuedPrompts > 4 (window 5s)"
    );
    assert_eq!(
        line("cold"),
        "exclude  cold: drop when runningPrompts > 1 (window 30s)"
    );
    assert_eq!(line("long"), "exclude  long: drop when promptTokens > 1000");
}
