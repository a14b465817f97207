//! `when:` conditions that compare a variable with a value it never takes (`qos == "Batch"`,
//! `backend == "local"`, `kvCacheUsage > 1.5`, `promptTokens < 0`) are always true or always
//! false: they are reported as the structured forms of the same tests are (KINF0103, KINF0105),
//! at the literal. Names compared with `model`, `servedModel` or `destination` that the targeted
//! pools do not have are warned about (KINF0509). Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("w.yaml", text)
}

const CLUSTER: &str = concat!(cluster!(), policy_head!(), "  rules:\n");

/// A rule matching `request` and dropping candidates by `candidate`.
fn rule(request: &str, candidate: &str) -> String {
    format!(
        "{CLUSTER}  - name: r\n    matches: [ {{ when: '{request}' }} ]\n    route:\n      exclude:\n      - name: f\n        drop: {{ when: '{candidate}' }}\n      select: [ {{ type: Local, minimize: PredictedTTFT }} ]\n"
    )
}

#[test]
fn values_the_variables_take_are_clean() {
    for (request, candidate) in [
        (r#"qos == "batch""#, r#"backend == "Provider""#),
        (
            r#"qos in ["interactive", "deferrable"]"#,
            "kvCacheUsage > 0.9",
        ),
        ("promptTokens >= 0 && messages > 2", "kvCacheUsage >= 90%"),
        (
            r#""batch" != qos"#,
            "queuedPrompts > 0 || 1 >= kvCacheUsage",
        ),
    ] {
        assert_eq!(
            lint(&rule(request, candidate)),
            "",
            "{request} / {candidate}"
        );
    }
}

#[test]
fn values_the_variables_never_take_are_reported() {
    let text = rule(
        r#"qos == "Batch" || qos in ["interactive", "bulk"] || promptTokens < -1"#,
        r#"backend == "local" || kvCacheUsage > 1.5 || 90 < kvCacheUsage"#,
    );
    insta::assert_snapshot!("never_taken", lint(&text));
}

/// Worker set `w` (model `m`, alias `small`), provider `cloud` (client name `gpt`, sent upstream
/// as `gpt-4o`) and the pool over both, then the head of policy `p` up to its rules.
const NAMED: &str = concat!(
    r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w, namespace: inference }
spec: { endpoints: ["10.0.0.1:8000"], models: [{ name: m, aliases: [small] }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: cloud, namespace: inference }
spec:
  type: OpenAI
  url: https://api.example.com
  credentials: { secretRef: { name: key } }
  models: [{ name: gpt, providerModel: gpt-4o }]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool, namespace: inference }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: w }, { kind: InferenceProvider, name: cloud }]
"#,
    policy_head!(),
    "  rules:\n"
);

/// [`rule`] against [`NAMED`].
fn named_rule(request: &str, candidate: &str) -> String {
    rule(request, candidate).replacen(CLUSTER, NAMED, 1)
}

#[test]
fn names_the_targeted_pools_have_are_clean() {
    for (request, candidate) in [
        (r#"model == "m""#, r#"destination == "cloud""#),
        (
            r#"model in ["small", "gpt"] && tenant == "acme""#,
            r#"servedModel not in ["gpt-4o", "m"] || destination != "w""#,
        ),
    ] {
        assert_eq!(
            lint(&named_rule(request, candidate)),
            "",
            "{request} / {candidate}"
        );
    }
}

#[test]
fn names_the_targeted_pools_lack_are_warned_about() {
    let text = named_rule(
        r#"model == "smal" || model in ["m", "gpt-4o", "gpt-4o-mni"] || tenant == "nobody""#,
        r#"destination not in ["w", "clod"] || "bedrock" == destination || servedModel == "gpt""#,
    );
    insta::assert_snapshot!("unknown_names", lint(&text));
}

#[test]
fn names_are_not_checked_without_a_targeted_pool() {
    // A policy linted on its own: no pool says which names exist.
    let text = format!(
        "{}  rules:\n  - name: r\n    matches: [ {{ when: 'model == \"gpt-4o-mni\"' }} ]\n    route:\n      exclude:\n      - name: f\n        drop: {{ when: 'destination == \"bedrock\"' }}\n",
        policy_head!().trim_start_matches("---\n")
    );
    let out = lint(&text);
    assert!(!out.contains("KINF0509"), "{out}");
}

#[test]
fn candidate_variables_in_a_request_condition_are_unknown_not_out_of_domain() {
    // `backend` and `kvCacheUsage` are not variables of `matches[].when`: the error says so
    // (and where to test them), not that their values are wrong: fixing the values would only
    // lead to that error.
    let text = rule(
        r#"backend == "local" || kvCacheUsage > 90 || servedModel == "nope""#,
        r#"backend == "Local""#,
    );
    insta::assert_snapshot!("candidate_variables_in_request", lint(&text));
}
