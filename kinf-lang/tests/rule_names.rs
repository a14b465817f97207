//! Rule and limit names are sent in HTTP headers (`x-kinference-rule`), reject messages and
//! metric labels: names that cannot be are reported. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn lint(text: &str) -> String {
    support::lint("n.yaml", text)
}

const CLUSTER: &str = concat!(cluster!(), policy_head!());

#[test]
fn printable_names_are_clean() {
    let text = format!(
        "{CLUSTER}  rules:\n  - name: 'batch to idle GPUs (v2), 50% [a/b]: \"ok\"'\n    matches: [ {{ qos: batch }} ]\n  - name: r2\n  limits:\n  - {{ name: per-tenant tokens, tokensPerMinute: 1000 }}\n"
    );
    assert_eq!(lint(&text), "");
    let long = "x".repeat(kinf_lang::check::MAX_NAME_LEN);
    let text = format!("{CLUSTER}  rules:\n  - name: {long}\n");
    assert_eq!(lint(&text), "");
}

#[test]
fn empty_and_unprintable_names_are_reported() {
    let text = format!(
        "{CLUSTER}  rules:\n  - name: \"\"\n    matches: [ {{ qos: batch }} ]\n  - name: \"line1\\nline2\"\n    matches: [ {{ qos: batch }} ]\n  - name: \"cr\\r\"\n    matches: [ {{ qos: batch }} ]\n  - name: \"tab\\there\"\n    matches: [ {{ qos: batch }} ]\n  - name: \"bell\\a\"\n    matches: [ {{ qos: batch }} ]\n  - name: \"règle\"\n    matches: [ {{ qos: batch }} ]\n  - name: \" padded\"\n    matches: [ {{ qos: batch }} ]\n  - name: {}\n  limits:\n  - {{ name: \"\", tokensPerMinute: 1000 }}\n  - {{ name: \"a\\nb\", tokensPerMinute: 1000 }}\n",
        "y".repeat(kinf_lang::check::MAX_NAME_LEN + 1)
    );
    insta::assert_snapshot!("bad_names", lint(&text));
}
