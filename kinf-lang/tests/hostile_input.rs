//! Input built to exhaust the compiler (the gateway compiles objects users submit): deep
//! nesting and alias bombs are reported as diagnostics, never a crash or a hang.
//!
//! Every compilation runs on a thread with the 2 MiB stack of a Tokio worker, where the
//! gateway compiles. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

/// Compiles `text` as `name` on a 2 MiB stack; returns the plain rendering of every diagnostic.
fn lint(name: &str, text: String) -> String {
    let name = name.to_string();
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let (sources, c) = kinf_lang::compile_str(&name, &text);
            c.diagnostics
                .iter()
                .map(|d| d.render_plain(&sources))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .expect("spawn")
        .join()
        .expect("the compiler panicked")
}

const HEAD: &str = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p, namespace: inference }\n";

#[test]
fn deep_flow_lists_are_reported_not_a_stack_overflow() {
    let text = format!("{HEAD}spec: {}\n", "[".repeat(2000));
    insta::assert_snapshot!("deep_flow_lists", lint("deep.yaml", text));
    // Closed, and as flow mappings: the same.
    let closed = format!("{HEAD}spec: {}x{}\n", "[".repeat(2000), "]".repeat(2000));
    assert!(lint("deep.yaml", closed).contains("4:134: error[KINF0001]"));
    let maps = format!("{HEAD}spec: {}x{}\n", "{a: ".repeat(2000), "}".repeat(2000));
    assert!(
        lint("deep.yaml", maps).contains("error[KINF0001]: collections are nested more than 128")
    );
}

#[test]
fn the_full_parser_has_the_same_limit() {
    // An anchor is outside the fast parser's subset: `saphyr-parser` reads these.
    let anchored = format!("{HEAD}x: &a 1\n");
    // 200 levels: the tree builder stops at level 129.
    let text = format!("{anchored}spec: {}\n", "[".repeat(200));
    let out = lint("deep.yaml", text);
    assert!(
        out.starts_with(
            "deep.yaml:5:134: error[KINF0001]: collections are nested more than 128 levels deep"
        ),
        "{out}"
    );
    // 2000 levels: the scanner, ahead of the events, stops at its own bound (255 levels) first.
    let text = format!("{anchored}spec: {}\n", "[".repeat(2000));
    let out = lint("deep.yaml", text);
    assert!(
        out.starts_with(
            "deep.yaml:5:262: error[KINF0001]: collections are nested more than 128 levels deep"
        ),
        "{out}"
    );
}

#[test]
fn deep_block_mappings_and_lists_are_reported() {
    // `spec:` then 2000 mappings, each indented one more space.
    let mut text = format!("{HEAD}spec:\n");
    for i in 0..2000 {
        text.push_str(&" ".repeat(i + 1));
        text.push_str("a:\n");
    }
    text.push_str(&" ".repeat(2001));
    text.push_str("x\n");
    let out = lint("deep.yaml", text);
    // The root is level 1, `spec`'s mapping level 2: level 129 is the 128th `a:`, on line 132.
    assert!(
        out.starts_with(
            "deep.yaml:132:129: error[KINF0001]: collections are nested more than 128 levels deep"
        ),
        "{out}"
    );
    let mut list = format!("{HEAD}spec:\n");
    for i in 0..2000 {
        list.push_str(&" ".repeat(i + 1));
        list.push_str("-\n");
    }
    list.push_str(&" ".repeat(2001));
    list.push_str("x\n");
    let out = lint("deep.yaml", list);
    assert!(
        out.contains("error[KINF0001]: collections are nested more than 128"),
        "{out}"
    );
}

#[test]
fn nesting_up_to_the_limit_is_read() {
    // 127 lists under the root mapping: 128 levels, allowed; `spec` is then just the wrong type.
    let text = format!("{HEAD}spec: {}x{}\n", "[".repeat(127), "]".repeat(127));
    let out = lint("deep.yaml", text);
    assert!(!out.contains("KINF0001"), "{out}");
    assert!(out.contains("KINF0102"), "{out}");
}

#[test]
fn aliases_cannot_nest_past_the_limit() {
    // Each anchor repeats the previous one 100 levels deeper: 100 levels of text, 1000 of tree.
    let mut text = format!("{HEAD}spec: {{}}\n");
    text.push_str(&format!(
        "x0: &a0 {}x{}\n",
        "[".repeat(100),
        "]".repeat(100)
    ));
    for i in 1..10 {
        text.push_str(&format!(
            "x{i}: &a{i} {}*a{}{}\n",
            "[".repeat(20),
            i - 1,
            "]".repeat(20)
        ));
    }
    let out = lint("deep.yaml", text);
    assert!(
        out.contains("error[KINF0001]: collections are nested more than 128 levels deep"),
        "{out}"
    );
}

/// `x0: &a0 [x, ×10]`, then `xN: &aN [*aN-1 ×10]`: 10^levels values from a few hundred bytes.
fn laughs(levels: usize) -> String {
    let mut text = format!("{HEAD}spec:\n  rules: []\n");
    text.push_str("x0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..levels {
        let items = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("x{i}: &a{i} [{items}]\n"));
    }
    text
}

#[test]
fn an_alias_bomb_is_reported_at_its_alias_quickly() {
    let start = Instant::now();
    let out = lint("laugh.yaml", laughs(10));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    insta::assert_snapshot!("alias_bomb", out);
    // A few levels are fine (and only the unknown fields are reported).
    let out = lint("laugh.yaml", laughs(3));
    assert!(!out.contains("KINF0001"), "{out}");
    assert!(out.contains("unknown field `x2`"), "{out}");
}

#[test]
fn the_alias_budget_is_the_files_and_anchors_are_the_documents() {
    // Each document's aliases repeat 11,220 values, 112,200 in all: many small bombs in one
    // file must not add up to a large one.
    let doc = |d: usize, text: &mut String| {
        text.push_str(&format!(
            "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {{ name: p{d}, namespace: inference }}\nspec: {{}}\n"
        ));
        text.push_str("x0: &a0 [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..4 {
            let items = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("x{i}: &a{i} [{items}]\n"));
        }
    };
    let mut text = String::new();
    for d in 0..8 {
        doc(d, &mut text);
    }
    let out = lint("docs.yaml", text.clone());
    assert!(!out.contains("KINF0001"), "89,760 values are read: {out}");
    for d in 8..10 {
        doc(d, &mut text);
    }
    let out = lint("docs.yaml", text);
    assert!(
        out.contains("error[KINF0001]: the aliases of this file repeat more than 100000 values"),
        "{out}"
    );
    // An anchor of one document is unknown in the next (YAML's anchors are per document).
    let text = format!("{HEAD}spec: {{}}\nx: &a [1]\n---\n{HEAD}spec: {{}}\ny: *a\n");
    let out = lint("anchors.yaml", text);
    assert!(
        out.contains(
            "anchors.yaml:11:4: error[KINF0001]: this alias names an anchor of an earlier document"
        ),
        "{out}"
    );
}

#[test]
fn a_mapping_of_many_keys_is_read_in_linear_time() {
    // 100,000 keys (about 1.2 MB, what an object of the API server's size limit can hold):
    // duplicates are looked up in an index, not by comparing each key with every earlier one.
    let mut text = format!("{HEAD}spec: {{}}\nx:\n");
    for i in 0..100_000 {
        text.push_str(&format!("  k{i}: 1\n"));
    }
    // A repeated key is still found, and related to the first one.
    text.push_str("  k77777: 2\n");
    let start = Instant::now();
    let out = lint("keys.yaml", text);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(
        out.contains("keys.yaml:100006:3: error[KINF0003]: duplicate key `k77777`\n  note: keys.yaml:77783:3: first written here"),
        "{out}"
    );
}
