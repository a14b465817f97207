//! `parse_expr` (a hand-written fast path, falling back to pest) gives exactly what the pest
//! grammar alone gives: the same trees with the same spans, the same errors.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use kinf_grammar::expr::{parse_expr, parse_expr_reference};
use proptest::prelude::*;

fn assert_same(input: &str) {
    let fast = format!("{:?}", parse_expr(input));
    let reference = format!("{:?}", parse_expr_reference(input));
    assert!(
        fast == reference,
        "input {input:?}\n--- parse_expr ---\n{fast}\n--- pest ---\n{reference}"
    );
}

#[test]
fn hand_written_conditions_parse_the_same() {
    let cases = [
        "promptTokens < 8000 && tenant in [\"t1\", \"u1\"]",
        "promptTokens > 8000 && tag(\"pii-detected\")",
        "a",
        " a ",
        "a > 1 ",
        "  a > 1 && b   ",
        "a > 1 || b && c || d",
        "(a || b) && c",
        "( a || b ) && ( c )",
        "!a",
        "! a",
        "not a",
        "not not a",
        "!!a",
        "a != b",
        "a !b",
        "a not in [1, 2]",
        "a not  in [1]",
        "a notin [1]",
        "a in []",
        "a in [1, 2,]",
        "a in [[1], [true, false], \"x\"]",
        "f()",
        "f(a, b,)",
        "f (a)",
        "f(,)",
        "f(a,,b)",
        "a < b < c",
        "a < b && b < c",
        "android && orange && notable && inside",
        "true",
        "false || true",
        "truex",
        "true_",
        "x == -5",
        "x == 0.5",
        "x == 70%",
        "x > 2s",
        "x > 2sec",
        "x > 1e5",
        "x > 1_000",
        "x > 99999999999999999999",
        "x == \"a\\\"b\"",
        "x == \"a\\u{e9}b\"",
        "x == \"a\\qb\"",
        "x == \"é\"",
        "x == \"unclosed",
        "",
        "   ",
        "&&",
        "a &&",
        "a || ",
        "(a",
        "a)",
        "[1, 2]",
        "a in [b]",
        "in",
        "not in x",
        "a\t>\n1\r",
        "((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))",
        "(((((((((((((((((((((((((((((((a)))))))))))))))))))))))))))))))",
        "a == - 1",
        "a == -x",
        "_a_1 == 1",
        "tag(\"x\") and not tag(\"y\") or qos == \"batch\"",
    ];
    for c in cases {
        assert_same(c);
    }
    let deep_not = format!("{}a", "!".repeat(200));
    assert_same(&deep_not);
    let deep_not = format!("{}a", "!".repeat(128));
    assert_same(&deep_not);
    let deep_not = format!("{}a", "!".repeat(127));
    assert_same(&deep_not);
    let wide = (0..300)
        .map(|i| format!("a{i} > {i}"))
        .collect::<Vec<_>>()
        .join(" && ");
    assert_same(&wide);
}

const TOKENS: &[&str] = &[
    "a",
    "promptTokens",
    "tenant",
    "tag",
    "f",
    "(",
    ")",
    "[",
    "]",
    ",",
    "\"x\"",
    "\"a\\\"b\"",
    "\"\\n\"",
    "\"\\z\"",
    "1",
    "-2",
    "0.5",
    "70%",
    "2s",
    "2sec",
    "1e5",
    "true",
    "false",
    "&&",
    "||",
    "and",
    "or",
    "not",
    "in",
    "!",
    "!=",
    "==",
    "<",
    "<=",
    ">",
    ">=",
    "=",
    " ",
    " ",
    " ",
    "\t",
    "\n",
    "android",
    "_x",
    "-",
    "\"",
    "é",
    "\\",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(0..TOKENS.len(), 0..24)
        .prop_map(|ix| ix.into_iter().map(|i| TOKENS[i]).collect::<String>())
}

/// Well-formed conditions, so that the fast path's trees (not only its refusals) are compared.
fn condition() -> impl Strategy<Value = String> {
    let sp = prop_oneof![Just(""), Just(" "), Just("  "), Just("\n ")];
    let leaf = prop_oneof![
        Just("promptTokens".to_string()),
        Just("tenant".to_string()),
        Just("true".to_string()),
        Just("7".to_string()),
        Just("-3".to_string()),
        Just("0.25".to_string()),
        Just("80%".to_string()),
        Just("150ms".to_string()),
        Just("\"str\"".to_string()),
        Just("tag(\"pii\")".to_string()),
        Just("[\"a\", 1, [true]]".to_string()),
        Just("[]".to_string()),
    ];
    leaf.prop_recursive(4, 32, 4, move |inner| {
        let sp = sp.clone();
        prop_oneof![
            (
                inner.clone(),
                sp.clone(),
                0..8usize,
                sp.clone(),
                inner.clone()
            )
                .prop_map(|(a, s1, op, s2, b)| {
                    let op = ["==", "!=", "<", "<=", ">", ">=", "in", "not in"][op];
                    format!("{a}{s1} {op} {s2}{b}")
                }),
            (
                prop::collection::vec(inner.clone(), 2..4),
                0..4usize,
                sp.clone()
            )
                .prop_map(|(xs, op, s)| {
                    let op = ["&&", "||", "and", "or"][op];
                    xs.join(&format!("{s} {op} {s}"))
                }),
            (inner.clone(), sp.clone()).prop_map(|(a, s)| format!("({s}{a}{s})")),
            (inner.clone(), 0..2usize).prop_map(|(a, n)| format!("{}{a}", ["!", "not "][n])),
            (prop::collection::vec(inner, 0..3), sp)
                .prop_map(|(xs, s)| format!("f({s}{}{s})", xs.join(", "))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn token_soup_parses_the_same(s in token_soup()) {
        assert_same(&s);
    }

    #[test]
    fn conditions_parse_the_same(s in condition(), lead in "[ \n]{0,2}", trail in "[ \n]{0,2}") {
        assert_same(&format!("{lead}{s}{trail}"));
    }

    #[test]
    fn any_text_parses_the_same(s in "\\PC{0,40}") {
        assert_same(&s);
    }
}
