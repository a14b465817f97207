//! A policy's `targetRefs[].group` other than `kinference.buoyant.io` is ignored, and said so
//! (KINF0413). Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("t.yaml", text)
}

/// The cluster and policy `p` with `refs` as its `targetRefs`.
fn policy(refs: &str) -> String {
    format!(
        "{}{}  targetRefs: {refs}\n  rules:\n  - name: r\n    matches: [ {{ qos: batch }} ]\n",
        cluster!(),
        policy_head!()
    )
}

#[test]
fn the_kinference_group_or_none_is_clean() {
    for refs in [
        "[{ name: pool }]",
        "[{ group: kinference.buoyant.io, kind: InferencePool, name: pool }]",
    ] {
        assert_eq!(lint(&policy(refs)), "", "{refs}");
    }
}

#[test]
fn other_groups_are_reported_as_ignored() {
    let text = policy(
        "[{ group: inference.networking.k8s.io, kind: InferencePool, name: pool }, { group: kinference.buoyant.com, name: nopool }]",
    );
    insta::assert_snapshot!("other_groups", lint(&text));
}
