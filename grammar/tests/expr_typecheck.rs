//! Type checking conditions against an environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use kinf_grammar::Span;
use kinf_grammar::expr::{Env, Type, TypeError, TypeErrorKind, TypedExpr, parse_expr, typecheck};

fn env() -> Env {
    Env::new()
        .var("promptTokens", Type::Int)
        .var("kvCacheUsage", Type::Float)
        .var("tenant", Type::String)
        .var("streaming", Type::Bool)
        .var("waited", Type::Duration)
        .var("tags", Type::list(Type::String))
        .func("tag", [Type::String], Type::Bool)
        .func("header", [Type::String], Type::String)
        .func("scaled", [Type::Float], Type::Float)
        .func("now", [], Type::Duration)
}

fn check(src: &str) -> Result<TypedExpr, Vec<TypeError>> {
    typecheck(&parse_expr(src).unwrap(), &env())
}

fn ok(src: &str) -> TypedExpr {
    check(src).unwrap_or_else(|e| panic!("{src:?}: {e:?}"))
}

fn errors(src: &str) -> Vec<TypeError> {
    check(src).expect_err(src)
}

fn one_error(src: &str) -> TypeError {
    let mut errors = errors(src);
    assert_eq!(errors.len(), 1, "{src:?}: {errors:?}");
    errors.remove(0)
}

#[test]
fn well_typed_conditions() {
    for src in [
        r#"promptTokens > 8000 && tag("pii-detected") && tenant in ["a", "b"]"#,
        "streaming",
        "!streaming",
        "true",
        "promptTokens >= 1.5",
        "kvCacheUsage > 70%",
        "kvCacheUsage < 1",
        "1 == 1.0",
        "waited > 2s",
        "waited <= 150ms && now() > 1m",
        r#"tenant == "a" || tenant != "b""#,
        r#"tenant not in ["a"]"#,
        r#""pii" in tags"#,
        "promptTokens in [1, 2, 3]",
        "promptTokens in [1, 2.5]",
        "kvCacheUsage in [1, 2]",
        "waited in [1s, 2s]",
        "streaming == true",
        "streaming in [true]",
        r#"header("x-team") == "search""#,
        "scaled(1) > 0.5",
        "scaled(promptTokens) > 0.5",
        "scaled(kvCacheUsage) > 0.5",
        "(streaming || tag(\"a\")) && !(promptTokens < 10)",
    ] {
        ok(src);
    }
}

#[test]
fn resolves_names_to_indices() {
    let typed = ok(r#"tag("a") && promptTokens > 1 && tenant == "x" && promptTokens < 9"#);
    assert_eq!(typed.vars(), &[0, 2]);
    assert_eq!(typed.funcs(), &[0]);
    assert_eq!(
        typed.to_string(),
        r#"tag("a") && promptTokens > 1 && tenant == "x" && promptTokens < 9"#
    );
}

#[test]
fn unknown_names() {
    let e = one_error("promptToken > 5");
    assert_eq!(e.kind, TypeErrorKind::UnknownVariable);
    assert_eq!(e.message, "unknown variable `promptToken`");
    assert_eq!(e.help.as_deref(), Some("did you mean `promptTokens`?"));
    assert_eq!(e.span, Span::new(0, 11));

    let e = one_error("model == \"x\"");
    assert_eq!(
        e.help.as_deref(),
        Some(
            "the variables are `promptTokens`, `kvCacheUsage`, `tenant`, `streaming`, `waited`, `tags`"
        )
    );

    let e = one_error("tga(\"x\")");
    assert_eq!(e.kind, TypeErrorKind::UnknownFunction);
    assert_eq!(e.message, "unknown function `tga`");
    assert_eq!(e.help.as_deref(), Some("did you mean `tag`?"));
    assert_eq!(e.span, Span::new(0, 3));

    let e = one_error("classify(\"x\")");
    assert_eq!(
        e.help.as_deref(),
        Some("the functions are `tag`, `header`, `scaled`, `now`")
    );

    let e = one_error("tag");
    assert_eq!(
        e.help.as_deref(),
        Some("`tag` is a function; call it, e.g. `tag(…)`")
    );
    let e = one_error("tenant()");
    assert_eq!(
        e.help.as_deref(),
        Some("`tenant` is a variable, not a function; remove the parentheses")
    );

    let e = typecheck(&parse_expr("x").unwrap(), &Env::new()).unwrap_err();
    assert_eq!(
        e[0].help.as_deref(),
        Some("no variables are available here")
    );
}

#[test]
fn calls() {
    let e = one_error("tag(1)");
    assert_eq!(e.kind, TypeErrorKind::WrongArgumentType);
    assert_eq!(
        e.message,
        "argument 1 of `tag` must be `String`, found `Int`"
    );
    assert_eq!(e.span, Span::new(4, 5));
    assert_eq!(
        e.help.as_deref(),
        Some("the signature is `tag(String) -> Bool`")
    );

    let e = one_error(r#"tag("a", "b")"#);
    assert_eq!(e.kind, TypeErrorKind::WrongArgumentCount);
    assert_eq!(e.message, "`tag` takes 1 argument, found 2");
    let e = one_error("now(1) > 1s");
    assert_eq!(e.message, "`now` takes 0 arguments, found 1");
    assert_eq!(
        e.help.as_deref(),
        Some("the signature is `now() -> Duration`")
    );

    // A Float parameter does not take a Duration.
    let e = one_error("scaled(1s) > 1");
    assert_eq!(
        e.message,
        "argument 1 of `scaled` must be `Float`, found `Duration`"
    );
}

#[test]
fn comparisons() {
    let e = one_error("tenant > 3");
    assert_eq!(e.kind, TypeErrorKind::Mismatch);
    assert_eq!(e.message, "cannot compare `String` with `Int`");
    assert_eq!(
        e.help.as_deref(),
        Some("`String` values support only `==`, `!=`, `in` and `not in`")
    );
    assert_eq!(e.span, Span::new(0, 10));

    let e = one_error(r#"tenant < "b""#);
    assert_eq!(e.message, "`<` cannot compare `String` values");
    let e = one_error("streaming < true");
    assert_eq!(
        e.help.as_deref(),
        Some("`Bool` values support only `==` and `!=`")
    );
    let e = one_error("waited > 5");
    assert_eq!(e.message, "cannot compare `Duration` with `Int`");
    assert!(e.help.unwrap().contains("`5s`"));
    let e = one_error("tenant == 1");
    assert!(e.help.unwrap().contains("double quotes"));
    let e = one_error("tags == tags");
    assert_eq!(e.message, "`==` cannot compare `List<String>` values");
    let e = one_error("streaming == 1");
    assert_eq!(e.message, "cannot compare `Bool` with `Int`");
}

#[test]
fn membership() {
    let e = one_error(r#"tenant in "abc""#);
    assert_eq!(e.message, "`in` needs a list on its right, found `String`");
    assert_eq!(e.span, Span::new(10, 15));
    let e = one_error("promptTokens in [\"a\"]");
    assert_eq!(e.message, "cannot look for `Int` in `List<String>`");
    let e = one_error("tenant not in []");
    assert_eq!(e.kind, TypeErrorKind::EmptyList);
    let e = one_error(r#"tenant in ["a", 1, "b"]"#);
    assert_eq!(e.kind, TypeErrorKind::MixedList);
    assert_eq!(
        e.message,
        "list elements must have one type: found `Int` after `String`"
    );
    assert_eq!(e.span, Span::new(16, 17));
}

#[test]
fn conditions_must_be_bool() {
    let e = one_error(r#""a" && true"#);
    assert_eq!(e.message, "`&&` needs `Bool` operands, found `String`");
    assert_eq!(e.span, Span::new(0, 3));
    let e = one_error("promptTokens");
    assert_eq!(e.kind, TypeErrorKind::NotBool);
    assert_eq!(e.message, "a condition must be `Bool`, found `Int`");
    assert_eq!(
        e.help.as_deref(),
        Some("compare it with a value, e.g. `promptTokens > 0`")
    );
    let e = one_error("!tenant");
    assert_eq!(e.message, "`!` needs `Bool` operands, found `String`");
    assert_eq!(
        e.help.as_deref(),
        Some("compare it with a value, e.g. `tenant == \"a\"`")
    );
    let e = one_error("tags || streaming");
    assert_eq!(
        e.help.as_deref(),
        Some("compare it with a value, e.g. `\"a\" in tags`")
    );
    let e = one_error("[1]");
    assert_eq!(e.message, "a condition must be `Bool`, found `List<Int>`");
}

#[test]
fn reports_every_error_in_source_order() {
    let errors = errors(r#"promptToken > 5 && tag(1) || tenant > 3 && "a""#);
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "unknown variable `promptToken`",
            "argument 1 of `tag` must be `String`, found `Int`",
            "cannot compare `String` with `Int`",
            "`&&` needs `Bool` operands, found `String`",
        ]
    );
    // An error inside an operand is not reported again around it.
    one_error("!(x > 1)");
}

#[test]
fn first_declaration_wins() {
    let env = Env::new().var("x", Type::Int).var("x", Type::String);
    let typed = typecheck(&parse_expr("x > 1").unwrap(), &env).unwrap();
    assert_eq!(typed.vars(), &[0]);
}
