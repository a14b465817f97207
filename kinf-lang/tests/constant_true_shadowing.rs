//! A request condition whose `when` is always true is the same as no condition (KINF0412 does
//! not report it): a rule matching that way takes every request its other fields match, so it
//! shadows later rules (KINF0501) exactly as the rule without the `when`. One whose `when` is
//! always false never matches (KINF0412) and shadows nothing. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("s.yaml", text)
}

const HEAD: &str = concat!(cluster!(), policy_head!(), "  rules:\n");

/// A policy whose rule `first` matches `first` (a `matches` list), followed by rule `later`
/// matching `later`.
fn rules(first: &str, later: &str) -> String {
    format!(
        "{HEAD}  - name: first\n    matches: {first}\n    route:\n      select: [ {{ minimize: PredictedTTFT }} ]\n  - name: later\n    matches: {later}\n    route:\n      select: [ {{ minimize: QueuedPrompts }} ]\n"
    )
}

/// The diagnostics of rule `with_when` before `later`, and of rule `without` before `later`
/// (the same text without the `when`, so the same lines and columns), for comparing the two.
fn same_as_without_when(with_when: &str, without: &str, later: &str) -> (String, String) {
    (lint(&rules(with_when, later)), lint(&rules(without, later)))
}

#[test]
fn a_catch_all_with_an_always_true_when_shadows_every_later_rule() {
    for when in [
        "'true'",
        "\"true\"",
        "'!false'",
        "'stream || true'",
        "'(true)'",
    ] {
        let text = rules(
            &format!("[ {{ when: {when} }} ]"),
            "[ { model: m, tenant: t } ]",
        );
        let out = lint(&text);
        assert!(out.contains("warning[KINF0501]"), "{when}: {out}");
    }
    insta::assert_snapshot!(
        "catch_all_when_true",
        lint(&rules("[ { when: 'true' } ]", "[ { model: m } ]"))
    );
}

#[test]
fn an_entry_with_an_always_true_when_covers_as_without_it() {
    // Not a catch-all: the earlier entry covers by its other fields, the `when` adds nothing.
    for (first, later) in [
        (
            "[ { model: m, when: 'true' } ]",
            "[ { model: m, tenant: t } ]",
        ),
        (
            "[ { tenant: t, when: 'true && !false' } ]",
            "[ { tenant: t, when: 'stream' } ]",
        ),
        (
            "[ { model: m, when: 'true' } ]",
            "[ { model: m, when: 'true' } ]",
        ),
    ] {
        let (with, without) = same_as_without_when(
            first,
            &first
                .replace(", when: 'true && !false'", "")
                .replace(", when: 'true'", ""),
            later,
        );
        assert!(
            with.contains("warning[KINF0501]"),
            "{first} / {later}: {with}"
        );
        assert_eq!(with, without, "{first} / {later}");
    }
    insta::assert_snapshot!(
        "entry_when_true",
        lint(&rules(
            "[ { model: m, when: 'true' } ]",
            "[ { model: m, tenant: t } ]"
        ))
    );
}

#[test]
fn an_always_true_when_in_the_later_rule_is_no_condition_either() {
    // `later` matches every request for `m`: an earlier rule matching only `m` with a tenant
    // does not cover it, one matching `m` does.
    let out = lint(&rules(
        "[ { model: m, tenant: t } ]",
        "[ { model: m, when: 'true' } ]",
    ));
    assert_eq!(out, "");
    let out = lint(&rules(
        "[ { model: m } ]",
        "[ { model: m, when: '!false' } ]",
    ));
    assert!(out.contains("warning[KINF0501]"), "{out}");
}

#[test]
fn an_always_false_when_shadows_nothing() {
    // The entry never matches (KINF0412 says so): the rule covers no later rule, not even as a
    // catch-all.
    for first in ["[ { when: 'false' } ]", "[ { model: m, when: '!true' } ]"] {
        let out = lint(&rules(first, "[ { model: m, tenant: t } ]"));
        assert!(!out.contains("KINF0501"), "{first}: {out}");
        assert!(out.contains("warning[KINF0412]"), "{first}: {out}");
    }
    insta::assert_snapshot!(
        "catch_all_when_false",
        lint(&rules("[ { when: 'false' } ]", "[ { model: m } ]"))
    );
}

#[test]
fn a_rule_that_never_matches_is_neither_shadowed_nor_shadows() {
    // Each rule whose entries all have an always false `when` gets KINF0412 (one per entry)
    // and nothing else: not shadowed by an earlier rule with the same `when`, nor by a
    // catch-all, and shadowing no later rule.
    for (first, later) in [
        ("[ { when: 'false' } ]", "[ { when: 'false' } ]"),
        (
            "[ { model: m, when: '!true' } ]",
            "[ { model: m, when: '!true' } ]",
        ),
        ("[ { model: m } ]", "[ { model: m, when: 'false' } ]"),
        ("[ { when: 'true' } ]", "[ { model: m, when: 'false' } ]"),
        ("[]", "[ { when: 'false' } ]"),
        (
            "[ { when: 'false' } ]",
            "[ { when: 'false' }, { model: m, when: 'false' } ]",
        ),
    ] {
        let out = lint(&rules(first, later));
        assert!(!out.contains("KINF0501"), "{first} / {later}: {out}");
        assert!(
            out.contains("warning[KINF0412]"),
            "{first} / {later}: {out}"
        );
    }
    insta::assert_snapshot!(
        "same_when_false",
        lint(&rules("[ { when: 'false' } ]", "[ { when: 'false' } ]"))
    );
    // An entry that never matches needs no cover, and the others of its rule are compared as
    // before: `later` is shadowed by its one live entry.
    let out = lint(&rules(
        "[ { model: m } ]",
        "[ { model: m, tenant: t }, { when: 'false' } ]",
    ));
    assert!(out.contains("warning[KINF0501]"), "{out}");
}
