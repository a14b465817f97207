//! Parsing conditions: every syntactic form, precedence, spans, normal form
//! and syntax errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::Duration;

use kinf_grammar::Span;
use kinf_grammar::expr::{
    CompareOp, Expr, ExprKind, Literal, LogicalOp, MAX_DEPTH, MAX_NESTING, parse_expr,
};

fn parse(s: &str) -> Expr {
    parse_expr(s).unwrap_or_else(|e| panic!("{s:?}: {e} at {}", e.span))
}

/// The normal form of `s`.
fn norm(s: &str) -> String {
    parse(s).to_string()
}

fn err(s: &str) -> kinf_grammar::SyntaxError {
    parse_expr(s).expect_err(s)
}

fn lit(e: &Expr) -> &Literal {
    match &e.kind {
        ExprKind::Literal(l) => l,
        other => panic!("not a literal: {other:?}"),
    }
}

#[test]
fn literals() {
    assert_eq!(lit(&parse("8000")), &Literal::Int(8000));
    assert_eq!(lit(&parse("-1")), &Literal::Int(-1));
    assert_eq!(lit(&parse("-9223372036854775808")), &Literal::Int(i64::MIN));
    assert_eq!(lit(&parse("0.5")), &Literal::Float(0.5));
    assert_eq!(lit(&parse("-2.25")), &Literal::Float(-2.25));
    assert_eq!(lit(&parse("70%")), &Literal::Float(0.7));
    assert_eq!(lit(&parse("12.5%")), &Literal::Float(0.125));
    assert_eq!(lit(&parse("true")), &Literal::Bool(true));
    assert_eq!(lit(&parse("false")), &Literal::Bool(false));
    assert_eq!(
        lit(&parse("2s")),
        &Literal::Duration(Duration::from_secs(2))
    );
    assert_eq!(
        lit(&parse("150ms")),
        &Literal::Duration(Duration::from_millis(150))
    );
    assert_eq!(
        lit(&parse("1m30s")),
        &Literal::Duration(Duration::from_secs(90))
    );
    assert_eq!(
        lit(&parse(r#""pii-detected""#)),
        &Literal::Str("pii-detected".into())
    );
}

#[test]
fn string_escapes() {
    assert_eq!(
        lit(&parse(r#""a\"b\\c\nd\te\rf\u{e9}\u{1F600}""#)),
        &Literal::Str("a\"b\\c\nd\te\rf\u{e9}\u{1F600}".into())
    );
    assert_eq!(lit(&parse(r#""""#)), &Literal::Str(String::new()));
    assert_eq!(
        lit(&parse(r#""héllo wörld""#)),
        &Literal::Str("héllo wörld".into())
    );
}

#[test]
fn identifiers_calls_and_lists() {
    assert_eq!(
        parse("promptTokens").kind,
        ExprKind::Var("promptTokens".into())
    );
    assert_eq!(parse("_x9").kind, ExprKind::Var("_x9".into()));
    // Keywords are whole words only.
    assert_eq!(parse("index").kind, ExprKind::Var("index".into()));
    assert_eq!(parse("trueish").kind, ExprKind::Var("trueish".into()));
    assert_eq!(parse("notes").kind, ExprKind::Var("notes".into()));

    let ExprKind::Call { name, args } = parse(r#"tag( "pii" , 2 )"#).kind else {
        panic!("not a call")
    };
    assert_eq!(name.name, "tag");
    assert_eq!(name.span, Span::new(0, 3));
    assert_eq!(args.len(), 2);
    assert_eq!(norm("now()"), "now()");
    assert_eq!(norm("f(a, b,)"), "f(a, b)");
    assert_eq!(norm("f(a && b, !c)"), "f(a && b, !c)");

    assert_eq!(norm(r#"["a","b",]"#), r#"["a", "b"]"#);
    assert_eq!(norm("[]"), "[]");
    assert_eq!(norm("[[1, 2], [3]]"), "[[1, 2], [3]]");
    assert_eq!(norm("[1, 2.5, 70%, 2s, true]"), "[1, 2.5, 0.7, 2s, true]");
}

#[test]
fn operators_and_keywords() {
    assert_eq!(norm("a and b or not c"), "a && b || !c");
    assert_eq!(norm("a&&b||!c"), "a && b || !c");
    assert_eq!(norm("x not in [1]"), "x not in [1]");
    assert_eq!(norm("x   not\n in [1]"), "x not in [1]");
    assert_eq!(norm("x in[1]"), "x in [1]");
    for op in ["==", "!=", "<", "<=", ">", ">="] {
        assert_eq!(norm(&format!("a{op}b")), format!("a {op} b"));
    }
    assert_eq!(norm("x in tags"), "x in tags");
}

#[test]
fn precedence() {
    // `!` binds tighter than comparisons, which bind tighter than `&&`,
    // which binds tighter than `||`.
    let e = parse("a || b && c");
    let ExprKind::Logical {
        op: LogicalOp::Or,
        operands,
    } = &e.kind
    else {
        panic!("{e:?}")
    };
    assert!(matches!(
        operands[1].kind,
        ExprKind::Logical {
            op: LogicalOp::And,
            ..
        }
    ));

    let e = parse("!a == b");
    let ExprKind::Compare {
        op: CompareOp::Eq,
        lhs,
        ..
    } = &e.kind
    else {
        panic!("{e:?}")
    };
    assert!(matches!(lhs.kind, ExprKind::Not(_)));

    let e = parse("a == 1 && b in [2]");
    let ExprKind::Logical { operands, .. } = &e.kind else {
        panic!("{e:?}")
    };
    assert!(matches!(
        operands[0].kind,
        ExprKind::Compare {
            op: CompareOp::Eq,
            ..
        }
    ));
    assert!(matches!(
        operands[1].kind,
        ExprKind::Compare {
            op: CompareOp::In,
            ..
        }
    ));

    // `not x in l` is `(not x) in l`, unlike `x not in l`.
    assert_eq!(norm("not x in [1]"), "!x in [1]");
    assert_eq!(norm("not (x in [1])"), "!(x in [1])");
}

#[test]
fn chains_are_flat_and_groups_are_kept() {
    let e = parse("a && b && c && d");
    let ExprKind::Logical { operands, .. } = &e.kind else {
        panic!("{e:?}")
    };
    assert_eq!(operands.len(), 4);
    assert_eq!(norm("(a && b) && c"), "(a && b) && c");
    assert_eq!(norm("a && (b && c)"), "a && (b && c)");
    assert_eq!(norm("(a || b) && c"), "(a || b) && c");
    assert_eq!(norm("(a && b) || c"), "a && b || c");
    assert_eq!(norm("((a))"), "a");
    assert_eq!(norm("!(!(a))"), "!!a");
    assert_eq!(norm("!(a || b)"), "!(a || b)");
    assert_eq!(norm("(a == b) == c"), "(a == b) == c");
    assert_eq!(norm("a == (b == c)"), "a == (b == c)");
    assert_eq!(norm("(a < b) && (c > d)"), "a < b && c > d");
}

#[test]
fn normal_form_of_literals() {
    assert_eq!(norm("x > 70%"), "x > 0.7");
    assert_eq!(norm("x > 1.0"), "x > 1.0");
    assert_eq!(norm("x > 1.50"), "x > 1.5");
    assert_eq!(norm("d > 90s"), "d > 1m30s");
    assert_eq!(norm("d > 1.5s"), "d > 1s500ms");
    assert_eq!(norm("d > 0s"), "d > 0s");
    assert_eq!(norm(r#"s == "tab\there""#), r#"s == "tab\there""#);
    assert_eq!(norm("s == \"\u{1}\""), r#"s == "\u{1}""#);
}

#[test]
fn spans() {
    let src = r#"promptTokens > 8000 && tag("pii-detected")"#;
    let e = parse(src);
    assert_eq!(e.span, Span::new(0, src.len()));
    let ExprKind::Logical { operands, .. } = &e.kind else {
        panic!()
    };
    assert_eq!(&src[operands[0].span.range()], "promptTokens > 8000");
    assert_eq!(&src[operands[1].span.range()], r#"tag("pii-detected")"#);
    let ExprKind::Compare { lhs, rhs, .. } = &operands[0].kind else {
        panic!()
    };
    assert_eq!(lhs.span, Span::new(0, 12));
    assert_eq!(rhs.span, Span::new(15, 19));
    let ExprKind::Call { args, .. } = &operands[1].kind else {
        panic!()
    };
    assert_eq!(&src[args[0].span.range()], r#""pii-detected""#);

    // Surrounding whitespace is not part of any span; parentheses are not
    // part of the span of what they enclose.
    let e = parse("  ( a )  ");
    assert_eq!(e.span, Span::new(4, 5));
    let e = parse("!(a)");
    assert_eq!(e.span, Span::new(0, 4));
}

#[test]
fn equality_ignores_spans() {
    assert_eq!(parse("a&&b"), parse("  a   and   b "));
    assert_ne!(parse("a && b"), parse("a || b"));
}

#[test]
fn syntax_errors() {
    let cases: &[(&str, &str, (usize, usize))] = &[
        ("", "empty condition", (0, 0)),
        ("   ", "empty condition", (0, 3)),
        (
            "promptTokens >",
            "expected an operand after `>`, found end of input",
            (14, 14),
        ),
        (
            "a &&",
            "expected an operand after `&&`, found end of input",
            (4, 4),
        ),
        (
            "a or",
            "expected an operand after `or`, found end of input",
            (4, 4),
        ),
        (
            "a && )",
            "expected an operand after `&&`, found `)`",
            (5, 6),
        ),
        (
            "!",
            "expected an operand after `!`, found end of input",
            (1, 1),
        ),
        (
            "a b",
            "expected an operator or end of input, found `b`",
            (2, 3),
        ),
        ("(a && b", "unclosed `(`", (0, 1)),
        ("tag(\"x\"", "unclosed `(`", (3, 4)),
        ("x in [1, 2", "unclosed `[`", (5, 6)),
        ("\"abc", "unclosed string", (0, 4)),
        ("x == \"a\\\"", "unclosed string", (5, 9)),
        (
            "a && b)",
            "expected an operator or end of input, found `)`",
            (6, 7),
        ),
        (
            "x < y < z",
            "comparisons cannot be chained: `<` follows `<`",
            (6, 7),
        ),
        ("x in [a]", "expected a literal or `]`, found `a`", (6, 7)),
        ("d > 2sec", "unknown duration unit `sec`", (5, 8)),
        ("d > -2s", "durations cannot be negative", (4, 5)),
        (
            "x > 1e5",
            "exponent notation `1e5` is not supported",
            (4, 7),
        ),
        ("x > 1_000", "invalid number `1_000`", (4, 9)),
        ("x > 1.2.3", "invalid number `1.2.3`", (4, 9)),
        (
            "x > 99999999999999999999",
            "integer `99999999999999999999` is out of range",
            (4, 24),
        ),
        (r#"s == "\q""#, "unknown escape `\\q`", (6, 8)),
        (r#"s == "\u{110000}""#, "invalid unicode escape", (6, 16)),
        (r#"s == "\u{}""#, "invalid unicode escape", (6, 10)),
        (
            "a = 1",
            "expected an operator or end of input, found `=`",
            (2, 3),
        ),
        ("and", "expected an operand, found `and`", (0, 3)),
        ("f(,)", "expected an operand or `)`, found `,`", (2, 3)),
        ("x > .5", "expected an operand after `>`, found `.`", (4, 5)),
        (
            "tenant == 'a'",
            "expected an operand after `==`, found `'`",
            (10, 11),
        ),
    ];
    for (src, message, (start, end)) in cases {
        let e = err(src);
        assert_eq!(&e.message, message, "{src:?}");
        assert_eq!(e.span, Span::new(*start, *end), "{src:?}");
    }
}

#[test]
fn syntax_error_help() {
    let help = |s: &str| err(s).help.unwrap_or_default();
    assert_eq!(help("a = 1"), "use `==` to test equality");
    assert!(help("tenant == 'a'").contains("double quotes"));
    assert!(help("x in [a]").contains("`\"a\"`"));
    assert!(help("x < y < z").contains("`&&`"));
    assert!(help("d > 2sec").starts_with("did you mean `s`?"));
    assert_eq!(help("a && b)"), "this `)` closes no `(`; remove it");
    assert_eq!(help("x > .5"), "write a digit before the point, e.g. `0.5`");
    assert_eq!(help("(a"), "add a `)` to close it");
}

#[test]
fn nesting_is_bounded() {
    let ok = format!("{}a{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
    assert_eq!(norm(&ok), "a");
    let deep = format!(
        "{}a{}",
        "(".repeat(MAX_NESTING + 1),
        ")".repeat(MAX_NESTING + 1)
    );
    let e = err(&deep);
    assert_eq!(e.message, "the condition is nested too deeply");
    assert_eq!(e.span, Span::new(MAX_NESTING, MAX_NESTING + 1));

    let lists = format!(
        "x in {}1{}",
        "[".repeat(MAX_NESTING + 1),
        "]".repeat(MAX_NESTING + 1)
    );
    assert_eq!(err(&lists).message, "the condition is nested too deeply");

    let nots = format!("{}a", "!".repeat(MAX_DEPTH + 1));
    assert_eq!(err(&nots).message, "the condition is nested too deeply");
    let nots = format!("{}a", "!".repeat(100_000));
    assert_eq!(err(&nots).message, "the condition is nested too deeply");

    // Nested parentheses around negations multiply depth; still bounded.
    let mixed = format!("{}a{}", "!(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
    assert!(parse_expr(&mixed).is_ok());
    let level = format!("{}(", "!".repeat(MAX_DEPTH / MAX_NESTING + 1));
    let mixed = format!("{}a{}", level.repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
    assert_eq!(err(&mixed).message, "the condition is nested too deeply");
}

#[test]
fn the_reference_states_the_nesting_limits() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/conditions.md"),
    )
    .expect("docs/reference/conditions.md");
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = format!("At most {MAX_NESTING} levels of brackets");
    assert!(doc.contains(&stated), "conditions.md must say `{stated}`");
    let stated = format!("and {MAX_DEPTH} nested operators");
    assert!(doc.contains(&stated), "conditions.md must say `{stated}`");
}

#[test]
fn long_chains_are_fine() {
    // A flat chain is one node, so length does not add depth.
    let src = vec!["a"; 50_000].join(" && ");
    let e = parse(&src);
    let ExprKind::Logical { operands, .. } = &e.kind else {
        panic!()
    };
    assert_eq!(operands.len(), 50_000);
    assert_eq!(e.to_string(), src);
}
