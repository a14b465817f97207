//! `route.rejectMessage`: what a client is told when its rule rejects. A message with a control
//! character is refused (KINF0106), one on a rule that never rejects is not read (KINF0410), and
//! the schema bounds its length. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

const CLUSTER: &str = concat!(cluster!(), policy_head!());

fn rule(on_empty: &str, message: &str) -> String {
    format!(
        "{CLUSTER}  rules:\n  - name: pii-stays-local\n    matches: [ {{ tag: pii-detected }} ]\n    route:\n      select: [ {{ type: Local }} ]\n      onEmpty: {on_empty}\n      rejectMessage: {message}\n"
    )
}

#[test]
fn a_reject_message_on_a_rule_that_rejects_is_clean_and_compiled() {
    let text = rule(
        "Reject",
        "'Requests with personal data are served in the cluster only, and no worker is free: retry in a minute.'",
    );
    assert_eq!(support::lint("r.yaml", &text), "");
    let (_, c) = kinf_lang::compile_str("r.yaml", &text);
    let policy = c.policy.unwrap();
    let rule = &policy.pools[0].rules[0];
    assert_eq!(
        rule.reject_message.as_deref(),
        Some(
            "Requests with personal data are served in the cluster only, and no worker is free: retry in a minute."
        )
    );
}

#[test]
fn bad_and_unread_reject_messages_are_reported() {
    let mut out = String::new();
    for (on_empty, message) in [
        ("NextRule", "'never shown'"),
        ("Reject", "\"two\\nlines\""),
        ("Reject", "''"),
        ("Reject", &"x".repeat(1025)),
    ] {
        out.push_str(&support::lint("r.yaml", &rule(on_empty, message)));
        out.push('\n');
    }
    insta::assert_snapshot!("bad_reject_messages", out);
}
