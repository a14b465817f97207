//! Snapshots of rendered syntax and type errors: the message, the help and
//! the exact underlined bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_grammar::expr::{Env, Type, parse_expr, typecheck};
use kinf_grammar::{Glob, Span, parse_duration, parse_quantity, parse_ratio};

/// Renders one diagnostic under its (single-line) source.
fn render(src: &str, span: Span, message: &str, help: Option<&str>) -> String {
    let column = src[..span.start].chars().count();
    let width = src[span.range()].chars().count().max(1);
    let mut out = format!(
        "{src}\n{}{} {message}\n",
        " ".repeat(column),
        "^".repeat(width)
    );
    if let Some(help) = help {
        out.push_str(&format!("help: {help}\n"));
    }
    out
}

fn env() -> Env {
    Env::new()
        .var("promptTokens", Type::Int)
        .var("tenant", Type::String)
        .var("qos", Type::String)
        .var("kvCacheUsage", Type::Float)
        .func("tag", [Type::String], Type::Bool)
}

/// Parses and checks `src`, rendering every error.
fn diagnose(src: &str) -> String {
    let expr = match parse_expr(src) {
        Ok(expr) => expr,
        Err(e) => {
            return render(
                src,
                e.span,
                &format!("error: {}", e.message),
                e.help.as_deref(),
            );
        }
    };
    match typecheck(&expr, &env()) {
        Ok(typed) => panic!("{src:?} is valid: {typed}"),
        Err(errors) => errors
            .iter()
            .map(|e| {
                render(
                    src,
                    e.span,
                    &format!("error[{:?}]: {}", e.kind, e.message),
                    e.help.as_deref(),
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

macro_rules! snapshot {
    ($name:ident, $src:expr) => {
        #[test]
        fn $name() {
            insta::assert_snapshot!(diagnose($src));
        }
    };
}

// Syntax errors.
snapshot!(missing_operand, "promptTokens >");
snapshot!(missing_operand_after_and, "promptTokens > 8000 &&");
snapshot!(unclosed_string, r#"tag("pii-detected) && qos != 1"#);
snapshot!(unclosed_paren, r#"(promptTokens > 8000 || tag("x")"#);
snapshot!(stray_paren, "promptTokens > 1)");
snapshot!(chained_comparison, "1 < promptTokens < 10");
snapshot!(unquoted_list_element, "tenant in [acme, globex]");
snapshot!(single_quotes, "tenant == 'acme'");
snapshot!(single_equals, r#"qos = "batch""#);
snapshot!(bad_duration_unit, "latency > 2sec");

// Type errors.
snapshot!(wrong_argument_type, "tag(1)");
snapshot!(string_ordering, "tenant > 3");
snapshot!(misspelt_variable, "promptToken > 5");
snapshot!(string_as_condition, r#""a" && true"#);
snapshot!(not_a_condition, "promptTokens");
snapshot!(
    every_error_at_once,
    r#"promptToken > 5 && tga("x") || tenant in [1, "b"] || kvCacheUsage > 2s"#
);

#[test]
fn quantity_and_glob_errors() {
    let mut out = String::new();
    type Parse = fn(&str) -> Option<kinf_grammar::SyntaxError>;
    let cases: [(&str, Parse); 7] = [
        ("30", |s| parse_duration(s).err()),
        ("1m-30s", |s| parse_duration(s).err()),
        ("30s1m", |s| parse_duration(s).err()),
        ("70 %", |s| parse_ratio(s).err()),
        ("16K", |s| parse_quantity(s).err()),
        ("1.5", |s| parse_quantity(s).err()),
        ("qwen-[0-9", |s| Glob::parse(s).err()),
    ];
    for (src, parse) in cases {
        let e = parse(src).unwrap();
        out.push_str(&render(
            src,
            e.span,
            &format!("error: {}", e.message),
            e.help.as_deref(),
        ));
        out.push('\n');
    }
    insta::assert_snapshot!(out);
}
