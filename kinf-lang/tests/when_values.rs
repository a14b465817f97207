//! `when:` conditions that compare a variable with a value it never takes (`qos == "Batch"`,
//! `backend == "local"`, `kvCacheUsage > 1.5`, `promptTokens < 0`) are always true or always
//! false: they are reported as the structured forms of the same tests are (KINF0103, KINF0105),
//! at the literal. Accept changed snapshots with `INSTA_UPDATE=always`.
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
