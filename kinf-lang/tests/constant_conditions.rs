//! `when:` conditions that never change (KINF0412): a `drop` whose only condition is a `when`
//! that is always true drops every candidate; a `when` that is always false never holds, in a
//! `drop`, a `matches` entry, an exclude filter's `if` or a limit. Accept changed snapshots
//! with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("c.yaml", text)
}

const CLUSTER: &str = concat!(cluster!(), policy_head!());

/// A policy with rule `r` matching `request`, one exclude filter `f` guarded by `guard` (an
/// `if:` condition, or none) dropping by `drop`, and a limit on `limit` requests.
fn policy(request: &str, guard: Option<&str>, drop: &str, limit: &str) -> String {
    let guard = guard.map_or(String::new(), |g| {
        format!("        if: {{ when: '{g}' }}\n")
    });
    format!(
        "{CLUSTER}  rules:\n  - name: r\n    matches: [ {{ when: '{request}' }} ]\n    route:\n      exclude:\n      - name: f\n{guard}        drop: {drop}\n      select: [ {{ type: Local, minimize: PredictedTTFT }} ]\n  limits:\n  - name: l\n    matches: {{ when: '{limit}' }}\n    requestsPerMinute: 60\n"
    )
}

#[test]
fn conditions_that_depend_on_the_request_or_candidate_are_clean() {
    for (request, guard, drop, limit) in [
        ("stream", None, "{ when: 'queuedPrompts > 2' }", "!stream"),
        // Always true where that is the same as no condition, or next to other conditions (a
        // load threshold: with only `backend: { type: Local }` the filter would drop every
        // candidate of the pool, whatever the request, KINF0504).
        (
            "true",
            Some("true || stream"),
            "{ queuedPrompts: { greaterThan: 2 }, when: 'true' }",
            "not false",
        ),
        (
            "stream || false",
            None,
            "{ when: 'true && kvCacheUsage > 0.9' }",
            "false || promptTokens > 10",
        ),
    ] {
        assert_eq!(
            lint(&policy(request, guard, drop, limit)),
            "",
            "{request} / {guard:?} / {drop} / {limit}"
        );
    }
}

#[test]
fn a_drop_that_is_always_true_drops_every_candidate() {
    let text = policy("stream", None, "{ when: 'true' }", "stream");
    insta::assert_snapshot!("drop_always_true", lint(&text));
    let text = policy(
        "stream",
        Some("tag(\"over-limit\")"),
        "{ when: '!false' }",
        "stream",
    );
    insta::assert_snapshot!("guarded_drop_always_true", lint(&text));
}

#[test]
fn conditions_that_are_always_false_never_hold() {
    let text = policy(
        "false",
        Some("stream && false"),
        "{ backend: { type: Local }, when: 'false || !true' }",
        "(false)",
    );
    insta::assert_snapshot!("always_false", lint(&text));
}
