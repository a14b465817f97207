//! A tab in indentation is reported at the tab, on its line: the YAML parser marks what follows
//! it, or the start of a plain scalar on a line above it. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

const HEAD: &str = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p, namespace: inference }\nspec:\n";

#[test]
fn tabs_of_indentation_are_marked_where_they_are() {
    let cases = [
        // The tab before `rules` (the parser marks `r`).
        format!("{HEAD}\trules: []\n"),
        // A line indented with spaces and a tab, after a plain scalar (the parser marks the
        // scalar `r`, a line above), with a blank line holding a tab (allowed) between them.
        format!("{HEAD}  rules:\n    - name: r\n\t\n  \t  route: {{}}\n"),
    ];
    let out: Vec<String> = cases.iter().map(|c| support::lint("t.yaml", c)).collect();
    insta::assert_snapshot!("tab_indentation", out.join("\n"));
}
