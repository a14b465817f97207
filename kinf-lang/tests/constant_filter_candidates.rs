//! An exclude filter's `if:` or `drop.when` that is always true is no condition, and one that
//! is always false never holds, for the analysis of which destinations a rule can ever pick
//! (KINF0504, KINF0503) as for the rest: a filter whose `if` is always true applies to every
//! request, so when it drops every destination the rule considers the rule never has a
//! candidate. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("x.yaml", text)
}

/// Rule `r` (line 16) with one exclude filter `f`: its `if` (when `guard` is some) on line 21,
/// its `drop` on the line after.
fn rule(guard: Option<&str>, drop: &str) -> String {
    let guard = guard.map_or(String::new(), |g| format!("        if: {g}\n"));
    format!(
        "{}{}  rules:\n  - name: r\n    matches: [ {{ model: m }} ]\n    route:\n      exclude:\n      - name: f\n{guard}        drop: {drop}\n      select: [ {{ minimize: PredictedTTFT }} ]\n",
        cluster!(),
        policy_head!()
    )
}

#[test]
fn a_filter_that_always_applies_and_drops_everything_empties_the_rule() {
    for (guard, drop) in [
        (Some("{ when: 'true' }"), "{ backend: { type: Local } }"),
        (
            Some("{ when: '!false || stream' }"),
            "{ backend: { name: w } }",
        ),
        (None, "{ backend: { type: Local }, when: 'true' }"),
        (
            Some("{ when: 'true' }"),
            "{ backend: { type: Local }, when: 'not false' }",
        ),
    ] {
        let out = lint(&rule(guard, drop));
        assert!(
            out.starts_with("x.yaml:16:11: warning[KINF0504]: rule `r` never has a candidate")
                && out.contains("exclude filter `f` drops every destination"),
            "{guard:?} / {drop}: {out}"
        );
        // The note points at the filter's `drop`.
        let line = if guard.is_some() { 22 } else { 21 };
        assert!(
            out.contains(&format!(
                "note: x.yaml:{line}:15: drops `w` (Local) for every request"
            )),
            "{guard:?} / {drop}: {out}"
        );
    }
    insta::assert_snapshot!(
        "if_always_true",
        lint(&rule(
            Some("{ when: 'true' }"),
            "{ backend: { type: Local } }"
        ))
    );
    insta::assert_snapshot!(
        "drop_when_always_true",
        lint(&rule(None, "{ backend: { type: Local }, when: 'true' }"))
    );
}

#[test]
fn a_drop_of_only_an_always_true_when_is_reported_once() {
    // KINF0412 says at the `when` that the filter drops every candidate, and what that does to
    // the rule: KINF0504 does not repeat it.
    for guard in [None, Some("{ when: 'true' }")] {
        let out = lint(&rule(guard, "{ when: 'true' }"));
        assert!(!out.contains("KINF0504"), "{guard:?}: {out}");
        assert!(
            out.contains("warning[KINF0412]: filter `f` drops every candidate"),
            "{guard:?}: {out}"
        );
    }
}

#[test]
fn a_filter_that_never_applies_is_not_said_to_drop_every_candidate() {
    // An `if` that is always false: the filter never applies, whatever its `drop`. KINF0412
    // says so at the `if`, once; it does not also say at an always-true `drop.when` that the
    // filter drops every candidate.
    let out = lint(&rule(Some("{ when: 'false' }"), "{ when: 'true' }"));
    assert_eq!(out.matches("warning[KINF0412]").count(), 1, "{out}");
    assert!(
        out.contains("`when` is always false, so the filter never applies"),
        "{out}"
    );
    assert!(!out.contains("drops every candidate"), "{out}");
    assert!(!out.contains("KINF0504"), "{out}");
}

#[test]
fn a_filter_that_never_applies_or_never_drops_empties_nothing() {
    // KINF0412 says the filter never applies, or never drops anything; the rule keeps its
    // candidates.
    for (guard, drop) in [
        (Some("{ when: 'false' }"), "{ backend: { type: Local } }"),
        (
            Some("{ when: 'true && !true' }"),
            "{ backend: { type: Local }, when: 'true' }",
        ),
        (None, "{ backend: { type: Local }, when: 'false' }"),
        (
            Some("{ when: 'true' }"),
            "{ backend: { type: Local }, when: '!true' }",
        ),
    ] {
        let out = lint(&rule(guard, drop));
        assert!(!out.contains("KINF0504"), "{guard:?} / {drop}: {out}");
        assert!(
            out.contains("warning[KINF0412]"),
            "{guard:?} / {drop}: {out}"
        );
    }
    // With a condition on the request or the load it applies only sometimes.
    for (guard, drop) in [
        (
            Some("{ when: 'true && stream' }"),
            "{ backend: { type: Local } }",
        ),
        (
            None,
            "{ backend: { type: Local }, when: 'queuedPrompts > 2 || false' }",
        ),
    ] {
        assert_eq!(lint(&rule(guard, drop)), "", "{guard:?} / {drop}");
    }
}

#[test]
fn tiers_see_the_candidates_an_always_applying_filter_leaves() {
    // A pool of a worker set and a provider: the filter drops the worker set for every
    // request, so the `type: Local` tier never has a candidate, and the help lists only the
    // provider.
    let text = format!(
        "{}---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: cloud, namespace: inference }}\nspec:\n  type: OpenAI\n  url: https://api.example.com\n  credentials: {{ secretRef: {{ name: key }} }}\n  models: [{{ name: m, providerModel: m }}]\n{}  rules:\n  - name: r\n    route:\n      exclude:\n      - name: no-local\n        if: {{ when: 'true' }}\n        drop: {{ backend: {{ type: Local }} }}\n      select:\n      - {{ type: Local, minimize: PredictedTTFT }}\n      - {{ type: Provider, minimize: PredictedTTFT }}\n",
        cluster!().replace(
            "[{ kind: InferenceWorkerSet, name: w }]",
            "[{ kind: InferenceWorkerSet, name: w }, { kind: InferenceProvider, name: cloud }]"
        ),
        policy_head!()
    );
    let out = lint(&text);
    assert!(out.contains("warning[KINF0503]"), "{out}");
    insta::assert_snapshot!("tier_after_filter_if_always_true", out);
}

#[test]
fn filters_that_together_drop_everything_are_all_named() {
    // `a` drops the worker set for every request, `b` the provider: the message names both, a
    // note at each `drop` says what it drops.
    let text = format!(
        "{}---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: cloud, namespace: inference }}\nspec:\n  type: OpenAI\n  url: https://api.example.com\n  credentials: {{ secretRef: {{ name: key }} }}\n  models: [{{ name: m, providerModel: m }}]\n{}  rules:\n  - name: r\n    route:\n      exclude:\n      - name: a\n        if: {{ when: 'true' }}\n        drop: {{ backend: {{ type: Local }} }}\n      - name: b\n        drop: {{ backend: {{ name: cloud }}, when: '!false' }}\n      select: [ {{ minimize: PredictedTTFT }} ]\n",
        cluster!().replace(
            "[{ kind: InferenceWorkerSet, name: w }]",
            "[{ kind: InferenceWorkerSet, name: w }, { kind: InferenceProvider, name: cloud }]"
        ),
        policy_head!()
    );
    insta::assert_snapshot!("two_filters", lint(&text));
}
