//! A limit name may not hold `/`: limits are known (and their budgets keyed) as
//! `policy/limit`, or `namespace/policy/limit` outside `default`, so `team-a`'s policy `p`
//! limit `x` and the default namespace's policy `team-a` limit `p/x` would share one budget.
//! Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

const HEAD: &str = concat!(cluster!(), policy_head!());

#[test]
fn limit_names_hold_no_slash() {
    let rules = "  rules:\n  - name: r\n    route:\n      select: [ { type: Local } ]\n";
    let ok =
        format!("{HEAD}{rules}  limits:\n  - name: per-tenant.tokens\n    tokensPerMinute: 1000\n");
    assert_eq!(support::lint("l.yaml", &ok), "");
    let bad = format!("{HEAD}{rules}  limits:\n  - name: p/x\n    tokensPerMinute: 1000\n");
    insta::assert_snapshot!("slash_in_limit_name", support::lint("l.yaml", &bad));
}
