//! Property tests: parsers never panic, the normal form round-trips, and
//! evaluation is deterministic and total.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::Duration;

use kinf_grammar::expr::{
    CompareOp, Env, EvalContext, Expr, ExprKind, Ident, Literal, LogicalOp, Type, Value,
    parse_expr, typecheck,
};
use kinf_grammar::{Glob, Span, format_duration, parse_duration, parse_quantity, parse_ratio};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Never panic.

/// Fragments of the expression language, so that random strings get deep
/// into the grammar instead of failing on the first byte.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "(", ")", "[", "]", ",", "!", "not", "and", "or", "in", "&&", "||", "==", "!=", "<",
            "<=", ">", ">=", "=", "&", "\"", "\\", "'", "true", "false", "-", "%", ".", "tag", "x",
            "1", "1.5", "70%", "2s", "1m30s", "2sec", "1e5", "\"a\"", "\"\\u{", " ",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,3}",
    ]
}

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(token(), 0..24).prop_map(|tokens| tokens.concat())
}

proptest! {
    #[test]
    fn parsers_never_panic_on_arbitrary_text(input in "\\PC{0,40}") {
        let _ = parse_expr(&input);
        let _ = parse_duration(&input);
        let _ = parse_ratio(&input);
        let _ = parse_quantity(&input);
        let _ = Glob::parse(&input);
    }

    #[test]
    fn expression_parser_never_panics_and_spans_are_in_bounds(input in token_soup()) {
        match parse_expr(&input) {
            Ok(expr) => {
                let typed = typecheck(&expr, &sample_env());
                if let Err(errors) = typed {
                    for e in errors {
                        prop_assert!(e.span.end <= input.len() && e.span.start <= e.span.end);
                        prop_assert!(input.is_char_boundary(e.span.start));
                        prop_assert!(input.is_char_boundary(e.span.end));
                    }
                }
            }
            Err(e) => {
                prop_assert!(e.span.end <= input.len() && e.span.start <= e.span.end, "{:?}", e);
                prop_assert!(input.is_char_boundary(e.span.start), "{:?}", e);
                prop_assert!(input.is_char_boundary(e.span.end), "{:?}", e);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn quantity_parsers_never_panic(input in "[-+0-9.%a-zA-Zµ ]{0,12}") {
        for result in [
            parse_duration(&input).map(|_| ()),
            parse_ratio(&input).map(|_| ()),
            parse_quantity(&input).map(|_| ()),
        ] {
            if let Err(e) = result {
                prop_assert!(e.span.end <= input.len(), "{:?}", e);
            }
        }
    }

    #[test]
    fn durations_round_trip(secs in 0u64..=u64::MAX, nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
    }

    #[test]
    fn quantities_round_trip(n in 0u64..=u64::MAX) {
        prop_assert_eq!(parse_quantity(&n.to_string()).unwrap(), n);
        if let Some(kibi) = n.checked_mul(1024) {
            prop_assert_eq!(parse_quantity(&format!("{n}Ki")).unwrap(), kibi);
        }
    }
}

// ---------------------------------------------------------------------------
// Display → parse round trip on arbitrary well-formed trees.

fn at(kind: ExprKind) -> Expr {
    Expr::new(kind, Span::default())
}

fn ident() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,6}".prop_filter("not a keyword", |s| {
        !matches!(s.as_str(), "and" | "or" | "not" | "in" | "true" | "false")
    })
}

fn literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        any::<i64>().prop_map(Literal::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Literal::Float),
        (0.0f64..2.0).prop_map(Literal::Float),
        any::<String>().prop_map(Literal::Str),
        "[a-z\"\\\\\n\t]{0,5}".prop_map(Literal::Str),
        any::<bool>().prop_map(Literal::Bool),
        (any::<u64>(), 0u32..1_000_000_000)
            .prop_map(|(s, n)| Literal::Duration(Duration::new(s, n))),
        (0u64..100_000).prop_map(|ms| Literal::Duration(Duration::from_millis(ms))),
    ]
}

/// List literals: literals and nested lists only.
fn list() -> impl Strategy<Value = Expr> {
    let element = literal().prop_map(|l| at(ExprKind::Literal(l)));
    element.prop_recursive(2, 8, 3, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(|items| at(ExprKind::List(items)))
    })
}

fn compare_op() -> impl Strategy<Value = CompareOp> {
    prop::sample::select(vec![
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
        CompareOp::In,
        CompareOp::NotIn,
    ])
}

/// Any syntactically well-formed tree (types not considered).
fn any_expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        literal().prop_map(|l| at(ExprKind::Literal(l))),
        ident().prop_map(|n| at(ExprKind::Var(n))),
        list(),
    ];
    leaf.prop_recursive(5, 48, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| at(ExprKind::Not(Box::new(e)))),
            (
                prop::sample::select(vec![LogicalOp::And, LogicalOp::Or]),
                prop::collection::vec(inner.clone(), 2..4)
            )
                .prop_map(|(op, operands)| at(ExprKind::Logical { op, operands })),
            (compare_op(), inner.clone(), inner.clone()).prop_map(|(op, l, r)| at(
                ExprKind::Compare {
                    op,
                    lhs: Box::new(l),
                    rhs: Box::new(r)
                }
            )),
            (ident(), prop::collection::vec(inner, 0..3)).prop_map(|(name, args)| at(
                ExprKind::Call {
                    name: Ident {
                        name,
                        span: Span::default()
                    },
                    args
                }
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn display_then_parse_gives_an_equal_tree(expr in any_expr()) {
        let printed = expr.to_string();
        let parsed = parse_expr(&printed);
        prop_assert!(parsed.is_ok(), "{:?} does not parse: {:?}", printed, parsed);
        let parsed = parsed.unwrap();
        prop_assert_eq!(&parsed, &expr, "printed as {}", printed);
        // The normal form is a fixed point.
        prop_assert_eq!(parsed.to_string(), printed);
    }
}

// ---------------------------------------------------------------------------
// Evaluation: well-typed generated conditions.

fn sample_env() -> Env {
    Env::new()
        .var("n", Type::Int) // 0
        .var("x", Type::Float) // 1
        .var("s", Type::String) // 2
        .var("b", Type::Bool) // 3
        .var("d", Type::Duration) // 4
        .var("tags", Type::list(Type::String)) // 5
        .func("tag", [Type::String], Type::Bool) // 0
        .func("len", [Type::String], Type::Int) // 1
        .func("half", [Type::Float], Type::Float) // 2
}

#[derive(Debug, Clone)]
struct Ctx {
    n: i64,
    x: f64,
    s: String,
    b: bool,
    d: Duration,
    tags: Vec<Value<'static>>,
}

impl EvalContext for Ctx {
    fn var(&self, index: usize) -> Value<'_> {
        match index {
            0 => Value::Int(self.n),
            1 => Value::Float(self.x),
            2 => Value::str(&self.s),
            3 => Value::Bool(self.b),
            4 => Value::from(self.d),
            _ => Value::list(&self.tags),
        }
    }

    fn call(&self, index: usize, args: &[Value<'_>]) -> Value<'_> {
        match (index, args) {
            (0, [Value::Str(t)]) => Value::Bool(self.tags.iter().any(|v| *v == Value::str(t))),
            (1, [Value::Str(t)]) => Value::Int(i64::try_from(t.len()).unwrap_or(0)),
            (2, [Value::Float(f)]) => Value::Float(f / 2.0),
            _ => Value::Bool(false),
        }
    }
}

fn word() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "pii", ""]).prop_map(str::to_owned)
}

fn ctx() -> impl Strategy<Value = Ctx> {
    (
        -5i64..5,
        prop_oneof![-2.0f64..2.0, Just(f64::NAN)],
        word(),
        any::<bool>(),
        0u64..3000,
        prop::collection::vec(word(), 0..3),
    )
        .prop_map(|(n, x, s, b, ms, tags)| Ctx {
            n,
            x,
            s,
            b,
            d: Duration::from_millis(ms),
            tags: tags.into_iter().map(Value::from).collect(),
        })
}

/// Well-typed condition text over [`sample_env`].
fn condition() -> impl Strategy<Value = String> {
    let int = prop_oneof![
        (-5i64..5).prop_map(|i| i.to_string()),
        Just("n".to_owned()),
        word().prop_map(|w| format!("len(\"{w}\")")),
        Just("len(s)".to_owned()),
    ];
    let num = prop_oneof![
        int.clone(),
        (-20i32..20).prop_map(|i| format!("{}", f64::from(i) / 10.0)),
        (0u32..150).prop_map(|p| format!("{p}%")),
        Just("x".to_owned()),
        int.clone().prop_map(|i| format!("half({i})")),
    ];
    let string = prop_oneof![
        word().prop_map(|w| format!("\"{w}\"")),
        Just("s".to_owned())
    ];
    let duration = prop_oneof![
        (0u64..3000).prop_map(|ms| format!("{ms}ms")),
        Just("d".to_owned()),
        Just("1s500ms".to_owned()),
    ];
    let cmp = prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">="]);
    let eq = prop::sample::select(vec!["==", "!="]);
    let membership = prop::sample::select(vec!["in", "not in"]);
    let leaf = prop_oneof![
        Just("b".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        string.clone().prop_map(|s| format!("tag({s})")),
        (num.clone(), cmp.clone(), num.clone()).prop_map(|(a, op, b)| format!("{a} {op} {b}")),
        (duration.clone(), cmp, duration).prop_map(|(a, op, b)| format!("{a} {op} {b}")),
        (string.clone(), eq, string.clone()).prop_map(|(a, op, b)| format!("{a} {op} {b}")),
        (
            string.clone(),
            membership.clone(),
            prop::collection::vec(word(), 1..3)
        )
            .prop_map(|(a, op, items)| {
                let items: Vec<String> = items.iter().map(|w| format!("\"{w}\"")).collect();
                format!("{a} {op} [{}]", items.join(", "))
            }),
        (string, membership.clone()).prop_map(|(a, op)| format!("{a} {op} tags")),
        (int, membership, prop::collection::vec(-3i64..3, 1..3)).prop_map(|(a, op, items)| {
            let items: Vec<String> = items.iter().map(i64::to_string).collect();
            format!("{a} {op} [{}]", items.join(", "))
        }),
    ];
    leaf.prop_recursive(4, 32, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|c| format!("!({c})")),
            inner.clone().prop_map(|c| format!("not ({c})")),
            (
                inner.clone(),
                prop::sample::select(vec!["&&", "||", "and", "or"]),
                inner
            )
                .prop_map(|(a, op, b)| format!("({a}) {op} ({b})")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn evaluation_is_deterministic_and_survives_the_normal_form(src in condition(), ctx in ctx()) {
        let env = sample_env();
        let expr = parse_expr(&src).unwrap();
        let typed = typecheck(&expr, &env);
        prop_assert!(typed.is_ok(), "{}: {:?}", src, typed.err());
        let typed = typed.unwrap();
        let first = typed.eval_bool(&ctx);
        prop_assert_eq!(typed.eval_bool(&ctx), first);
        prop_assert_eq!(typed.eval_bool(&ctx.clone()), first);

        // The normal form means the same thing.
        let normal = typecheck(&parse_expr(&typed.to_string()).unwrap(), &env).unwrap();
        prop_assert_eq!(normal.eval_bool(&ctx), first);

        // Negation negates.
        let negated = typecheck(&parse_expr(&format!("!({src})")).unwrap(), &env).unwrap();
        prop_assert_eq!(negated.eval_bool(&ctx), !first);
    }
}

/// A context whose values have random shapes, whatever the declared types.
#[derive(Debug)]
struct Chaos(Vec<Value<'static>>);

impl EvalContext for Chaos {
    fn var(&self, index: usize) -> Value<'_> {
        self.0
            .get(index)
            .map_or(Value::Bool(false), Value::reborrow)
    }

    fn call(&self, index: usize, _: &[Value<'_>]) -> Value<'_> {
        self.0
            .get(self.0.len().saturating_sub(1 + index))
            .map_or(Value::Int(0), Value::reborrow)
    }
}

fn any_value() -> impl Strategy<Value = Value<'static>> {
    let scalar = prop_oneof![
        any::<i64>().prop_map(Value::Int),
        any::<f64>().prop_map(Value::Float),
        word().prop_map(Value::from),
        any::<bool>().prop_map(Value::Bool),
        any::<f64>().prop_map(Value::Duration),
    ];
    scalar.prop_recursive(2, 8, 3, |inner| {
        prop::collection::vec(inner, 0..3).prop_map(Value::from)
    })
}

proptest! {
    #[test]
    fn evaluation_is_total_for_values_of_any_shape(
        src in condition(),
        values in prop::collection::vec(any_value(), 0..8),
    ) {
        let typed = typecheck(&parse_expr(&src).unwrap(), &sample_env()).unwrap();
        let chaos = Chaos(values);
        let first = typed.eval_bool(&chaos);
        prop_assert_eq!(typed.eval_bool(&chaos), first);
    }
}
