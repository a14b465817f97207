//! Classifier fields that the server never reads, or whose value never makes a difference
//! (KINF0410). Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("g.yaml", text)
}

/// The cluster and a GatewayBackend with `classifiers`, one YAML flow mapping per entry.
fn gateway(classifiers: &[&str]) -> String {
    let mut s = format!(
        "{}---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: GatewayBackend\nmetadata: {{ name: g, namespace: inference }}\nspec:\n  pool: pool\n  classifiers:\n",
        cluster!()
    );
    for c in classifiers {
        s.push_str(&format!("  - {c}\n"));
    }
    s
}

/// Every field where it is read: nothing to say.
#[test]
fn fields_that_are_read_are_clean() {
    for classifiers in [
        &[
            "{ name: pii, type: Pii, entities: [email, phone] }",
            "{ name: cards, type: Pii, entities: [credit-card] }",
            "{ name: complexity, type: Complexity, thresholds: { mediumAt: 3 } }",
            "{ name: topics, type: External, url: http://c:8080/x, tags: [topic-code], timeout: 20ms, failureMode: FailClosed, failureTag: topic-unknown }",
            "{ name: open, type: External, url: http://c:8080/y, tags: [t], failureMode: FailOpen }",
        ][..],
        // Two classifiers detecting every entity: neither is the one that adds nothing.
        &[
            "{ name: a, type: Pii }",
            "{ name: b, type: Pii, entities: [] }",
        ][..],
    ] {
        assert_eq!(lint(&gateway(classifiers)), "", "{classifiers:?}");
    }
}

/// `url`, `tags`, `timeout`, `failureMode` and `failureTag` on the built-in classifiers, which
/// run in the gateway and cannot fail; `entities` on a classifier that is not `Pii`.
#[test]
fn external_only_fields_on_built_in_classifiers() {
    let text = gateway(&[
        "{ name: pii, type: Pii, url: http://c:8080/x, tags: [pii-unknown], timeout: 20ms, failureMode: FailClosed, failureTag: pii-detected }",
        "{ name: complexity, type: Complexity, entities: [email], failureMode: FailOpen }",
        "{ name: topics, type: External, url: http://c:8080/x, tags: [t], entities: [email] }",
    ]);
    let out = lint(&text);
    assert_eq!(out.matches("warning[KINF0410]").count(), 8, "{out}");
    assert!(!out.contains("error"), "{out}");
    insta::assert_snapshot!("external_only_fields", out);
}

/// `failureTag` with `failureMode: FailOpen`; a `Complexity` classifier before another one;
/// `entities` next to a `Pii` classifier that detects every entity.
#[test]
fn fields_without_effect_in_combination() {
    let text = gateway(&[
        "{ name: open, type: External, url: http://c:8080/x, tags: [t], failureMode: FailOpen, failureTag: t-unknown }",
        "{ name: strict, type: Complexity, thresholds: { mediumAt: 1 } }",
        "{ name: plain, type: Complexity }",
        "{ name: complexity, type: Complexity, thresholds: { highAt: 8 } }",
        "{ name: cards, type: Pii, entities: [credit-card] }",
        "{ name: pii, type: Pii }",
    ]);
    insta::assert_snapshot!("in_combination", lint(&text));
}

/// A tag only an inert `failureTag` would add is produced by no classifier (KINF0502).
#[test]
fn an_inert_failure_tag_is_not_a_tag_policies_can_test() {
    let policy = |tag: &str| {
        format!(
            "{}{}  targetRefs: [{{ name: pool }}]\n  rules:\n  - name: r\n    matches: [ {{ tag: {tag} }} ]\n    route:\n      select: [ {{ type: Local, minimize: PredictedTTFT }} ]\n",
            gateway(&[
                "{ name: pii, type: Pii, failureTag: pii-unknown }",
                "{ name: open, type: External, url: http://c:8080/x, tags: [t], failureMode: FailOpen, failureTag: t-unknown }",
                "{ name: closed, type: External, url: http://c:8080/y, tags: [u], failureTag: u-unknown }",
            ]),
            policy_head!()
        )
    };
    let codes = |tag: &str| {
        let (_, c) = kinf_lang::compile_str("g.yaml", &policy(tag));
        c.diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .collect::<Vec<_>>()
    };
    // The two inert `failureTag`s themselves.
    assert_eq!(codes("u-unknown"), ["KINF0410", "KINF0410"]);
    assert_eq!(codes("pii-unknown"), ["KINF0410", "KINF0410", "KINF0502"]);
    assert_eq!(codes("t-unknown"), ["KINF0410", "KINF0410", "KINF0502"]);
}

/// Without any GatewayBackend the gateway classifies every request with its default
/// classifiers (`Pii` with every entity, and `Complexity`): the tags they produce are known
/// (no KINF0502), in `matches[].tag`, `exclude[].if.tag` and `tag(...)` alike, and the help of a
/// tag they do not produce says where the tags come from. With a GatewayBackend, its
/// classifiers alone count: one without classifiers produces nothing, and the help says so.
#[test]
fn without_a_gateway_backend_the_default_classifiers_tags_are_known() {
    let policy = |head: &str, tag: &str| {
        format!(
            "{head}{}  targetRefs: [{{ name: pool }}]\n  rules:\n  - name: r\n    matches: [ {{ tag: {tag} }} ]\n    route:\n      exclude:\n      - {{ name: x, if: {{ tag: {tag} }}, drop: {{ backend: {{ type: Provider }} }} }}\n      select: [ {{ type: Local, minimize: PredictedTTFT }} ]\n  - name: w\n    matches: [ {{ when: 'tag(\"{tag}\")' }} ]\n    route:\n      select: [ {{ type: Local, minimize: PredictedTTFT }} ]\n",
            policy_head!()
        )
    };
    for tag in [
        "pii-detected",
        "pii-ssn",
        "pii-email",
        "pii-credential",
        "complexity-low",
        "complexity-high",
        "over-limit",
    ] {
        assert_eq!(lint(&policy(cluster!(), tag)), "", "{tag}");
    }
    insta::assert_snapshot!(
        "default_classifiers_typo",
        lint(&policy(cluster!(), "pii-detect"))
    );
    // A GatewayBackend without classifiers: the defaults are not run, nothing is produced.
    let bare = format!(
        "{}---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: GatewayBackend\nmetadata: {{ name: g, namespace: inference }}\nspec:\n  pool: pool\n",
        cluster!()
    );
    insta::assert_snapshot!(
        "gateway_without_classifiers",
        lint(&policy(&bare, "pii-detected"))
    );
}
