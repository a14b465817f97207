//! YAML merge keys (`<<: *defaults`), which `kubectl apply` resolves, are resolved by lint too:
//! a policy that repeats fields through an anchor lints and compiles as the one written out.
//! Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

const HEAD: &str = concat!(cluster!(), policy_head!(), "  rules:\n");

/// The exclude filters of every rule of the only pool, as compiled.
fn filters(text: &str) -> Vec<String> {
    let (sources, c) = kinf_lang::compile_str("m.yaml", text);
    let rendered: Vec<String> = c
        .diagnostics
        .iter()
        .map(|d| d.render_plain(&sources))
        .collect();
    assert_eq!(c.errors(), 0, "{rendered:#?}");
    let policy = c.policy.expect("compiled");
    policy.pools[0]
        .rules
        .iter()
        .map(|r| format!("{}: {:?}", r.name, r.exclude))
        .collect()
}

#[test]
fn merged_fields_compile_as_written_out() {
    let merged = format!(
        "{HEAD}  - name: a
    matches: [ {{ tag: pii-detected }} ]
    route:
      exclude:
      - &busy
        name: busy
        window: 10s
        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 2 }} }}
  - name: b
    matches: [ {{ qos: batch }} ]
    route:
      exclude:
      - <<: *busy
        window: 5s
  - name: c
    route:
      exclude:
      - {{ <<: [ *busy, {{ name: other, window: 1s }} ], name: mine }}
"
    );
    let written = format!(
        "{HEAD}  - name: a
    matches: [ {{ tag: pii-detected }} ]
    route:
      exclude:
      - name: busy
        window: 10s
        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 2 }} }}
  - name: b
    matches: [ {{ qos: batch }} ]
    route:
      exclude:
      - name: busy
        window: 5s
        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 2 }} }}
  - name: c
    route:
      exclude:
      - name: mine
        window: 10s
        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 2 }} }}
"
    );
    assert_eq!(filters(&merged), filters(&written));
    // The mapping's own fields win (`window: 5s`, `name: mine`), and of a list of merged
    // mappings the first (`window: 10s`, not `1s`).
    let out = filters(&merged);
    assert!(out[1].contains("window: 5s"), "{out:?}");
    assert!(
        out[2].contains("name: \"mine\"") && out[2].contains("window: 10s"),
        "{out:?}"
    );
}

#[test]
fn merged_values_are_checked_where_they_are_written() {
    let text = format!(
        "{HEAD}  - name: a
    route:
      exclude:
      - &busy
        name: busy
        window: 10x
        drop: {{ queuedPrompts: {{ greaterThan: 2 }} }}
  - name: b
    route:
      exclude:
      - <<: *busy
        if: {{ qos: batch }}
      - <<: 5
        name: five
        drop: {{ queuedPrompts: {{ greaterThan: 2 }} }}
"
    );
    insta::assert_snapshot!("merged_values", support::lint("m.yaml", &text));
}
