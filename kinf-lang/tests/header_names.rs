//! A request match's `header.name` that no HTTP header can have (empty, with a space, a `:`, or
//! the value pasted in) never holds: it is reported (KINF0106) instead of silently matching
//! nothing. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

const HEAD: &str = concat!(cluster!(), policy_head!());

#[test]
fn header_names_are_http_header_names() {
    let ok = format!(
        "{HEAD}  rules:\n  - name: r\n    matches:\n    - header: {{ name: X-Team, value: search }}\n    - header: {{ name: \"x_canary.v2\", value: \"true\" }}\n"
    );
    assert_eq!(support::lint("h.yaml", &ok), "");
    let bad = format!(
        "{HEAD}  rules:\n  - name: r\n    matches:\n    - header: {{ name: \"\", value: a }}\n    - header: {{ name: \"x-team: search\", value: search }}\n    - header: {{ name: \"x team\", value: a }}\n  limits:\n  - name: l\n    requestsPerMinute: 60\n    matches: {{ header: {{ name: \"x-team:\", value: a }} }}\n"
    );
    insta::assert_snapshot!("bad_header_names", support::lint("h.yaml", &bad));
}
