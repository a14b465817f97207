//! A value that an alias (`*name`) repeats is checked in every place it is repeated, but an
//! error inside it is one error: it is reported once, where the anchored value (`&name`) is
//! written, with a note at each alias that repeats it. Accept changed snapshots with
//! `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

const HEAD: &str = concat!(cluster!(), policy_head!(), "  rules:\n");

fn lint(text: &str) -> String {
    support::lint("a.yaml", text)
}

/// Rules `a`, `b` and `c`, each with the exclude filter anchored in `a` (`busy`, whose window
/// is `window`): `b` repeats it with an alias, `c` merges it.
fn three_rules(window: &str) -> String {
    format!(
        "{HEAD}  - name: a
    matches: [ {{ tenant: t }} ]
    route:
      exclude:
      - &busy
        name: busy
        window: {window}
        drop: {{ queuedPrompts: {{ greaterThan: 2 }} }}
      select: [ {{ minimize: PredictedTTFT }} ]
  - name: b
    matches: [ {{ tenant: u }} ]
    route:
      exclude: [ *busy ]
      select: [ {{ minimize: PredictedTTFT }} ]
  - name: c
    route:
      exclude:
      - <<: *busy
        name: busy-too
      select: [ {{ minimize: PredictedTTFT }} ]
"
    )
}

#[test]
fn an_error_under_an_alias_is_reported_once_at_the_anchor() {
    assert_eq!(lint(&three_rules("10s")), "");
    let out = lint(&three_rules("10x"));
    assert_eq!(out.matches("KINF0201").count(), 1, "{out}");
    insta::assert_snapshot!("error_under_alias", out);
}

#[test]
fn errors_under_an_anchored_list_are_reported_once_each() {
    // Two errors in one anchored list, repeated twice: two diagnostics.
    let text = format!(
        "{HEAD}  - name: a
    matches: &entries
    - {{ tenant: t, qos: fast }}
    - {{ tenant: u, model: [m, n] }}
    route: {{ onEmpty: NextRule, select: [ {{ minimize: PredictedTTFT }} ] }}
  - name: b
    matches: *entries
    route: {{ onEmpty: NextRule, select: [ {{ minimize: QueuedPrompts }} ] }}
  - name: c
    matches: *entries
"
    );
    let out = lint(&text);
    assert_eq!(out.matches("error[").count(), 2, "{out}");
    insta::assert_snapshot!("errors_under_anchored_list", lint(&text));
}

#[test]
fn an_error_under_nested_anchors_notes_every_alias_that_repeats_it() {
    // `inner` is anchored inside `outer`: an error in it is repeated by `*inner` and by each
    // `*outer`; five aliases, of which four are noted and the last note counts the other one.
    let text = format!(
        "{HEAD}  - name: a
    route:
      exclude: &outer
      - &inner
        name: busy
        window: 10x
        drop: {{ queuedPrompts: {{ greaterThan: 2 }} }}
      - {{ name: idle, drop: {{ queuedPrompts: {{ lessThan: 1 }} }} }}
      select: [ {{ minimize: PredictedTTFT }} ]
  - name: b
    route: {{ exclude: [ *inner ], select: [ {{ minimize: PredictedTTFT }} ] }}
  - name: c
    route: {{ exclude: *outer, select: [ {{ minimize: PredictedTTFT }} ] }}
  - name: d
    route: {{ exclude: *outer, select: [ {{ minimize: PredictedTTFT }} ] }}
  - name: e
    route: {{ exclude: *outer, select: [ {{ minimize: PredictedTTFT }} ] }}
  - name: f
    route: {{ exclude: *outer, select: [ {{ minimize: PredictedTTFT }} ] }}
"
    );
    let out = lint(&text);
    assert_eq!(out.matches("KINF0201").count(), 1, "{out}");
    insta::assert_snapshot!("error_under_nested_anchors", out);
}

#[test]
fn an_aliased_scalar_is_checked_where_each_alias_is() {
    // The alias of a scalar is the repeated node itself: an error about it is at each alias,
    // where it is used (a place of its own, not a repeat).
    let text = format!(
        "{HEAD}  - name: a
    route:
      exclude:
      - {{ name: x, window: &w 10x, drop: {{ queuedPrompts: {{ greaterThan: 2 }} }} }}
      - {{ name: y, window: *w, drop: {{ queuedPrompts: {{ greaterThan: 3 }} }} }}
      select: [ {{ minimize: PredictedTTFT }} ]
"
    );
    let out = lint(&text);
    assert_eq!(out.matches("KINF0201").count(), 2, "{out}");
    assert!(!out.contains("repeats it here"), "{out}");
}

#[test]
fn many_aliases_of_many_anchors_with_errors_stay_fast() {
    // Thousands of anchored values with an error each, each repeated: one diagnostic apiece,
    // noted without comparing every diagnostic with every alias.
    let n = 4000;
    let mut text = format!("{HEAD}  - name: a\n    route:\n      exclude:\n");
    for i in 0..n {
        text.push_str(&format!(
            "      - &f{i} {{ name: f{i}, window: 1x, drop: {{ queuedPrompts: {{ greaterThan: 2 }} }} }}\n"
        ));
    }
    text.push_str(
        "      select: [ { minimize: PredictedTTFT } ]\n  - name: b\n    route:\n      exclude:\n",
    );
    for i in 0..n {
        text.push_str(&format!("      - *f{i}\n"));
    }
    text.push_str("      select: [ { minimize: PredictedTTFT } ]\n");
    let started = std::time::Instant::now();
    let (_, c) = kinf_lang::compile_str("a.yaml", &text);
    let errors: Vec<_> = c
        .diagnostics
        .iter()
        .filter(|d| d.code.as_str() == "KINF0201")
        .collect();
    assert_eq!(errors.len(), n);
    assert!(
        errors.iter().all(|d| d.related.len() == 1),
        "{:?}",
        errors[0]
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}
