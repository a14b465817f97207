//! Evaluating checked conditions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::cell::Cell;
use std::time::Duration;

use kinf_grammar::expr::{Env, EvalContext, Type, TypedExpr, Value, parse_expr, typecheck};

fn env() -> Env {
    Env::new()
        .var("promptTokens", Type::Int) // 0
        .var("kvCacheUsage", Type::Float) // 1
        .var("tenant", Type::String) // 2
        .var("streaming", Type::Bool) // 3
        .var("waited", Type::Duration) // 4
        .var("tags", Type::list(Type::String)) // 5
        .func("tag", [Type::String], Type::Bool) // 0
        .func("scaled", [Type::Float], Type::Float) // 1
        .func(
            "sum",
            [Type::Int, Type::Int, Type::Int, Type::Int, Type::Int],
            Type::Int,
        ) // 2
        .func("header", [Type::String], Type::String) // 3
}

/// A request as the router might see it.
struct Request {
    prompt_tokens: i64,
    kv_cache_usage: f64,
    tenant: String,
    streaming: bool,
    waited: Duration,
    tags: Vec<Value<'static>>,
    calls: Cell<usize>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            prompt_tokens: 9000,
            kv_cache_usage: 0.5,
            tenant: "a".into(),
            streaming: false,
            waited: Duration::from_millis(200),
            tags: vec![Value::from("pii-detected")],
            calls: Cell::new(0),
        }
    }
}

impl EvalContext for Request {
    fn var(&self, index: usize) -> Value<'_> {
        match index {
            0 => Value::Int(self.prompt_tokens),
            1 => Value::Float(self.kv_cache_usage),
            2 => Value::str(&self.tenant),
            3 => Value::Bool(self.streaming),
            4 => Value::from(self.waited),
            _ => Value::list(&self.tags),
        }
    }

    fn call(&self, index: usize, args: &[Value<'_>]) -> Value<'_> {
        self.calls.set(self.calls.get() + 1);
        match (index, args) {
            (0, [Value::Str(t)]) => Value::Bool(self.tags.iter().any(|x| x == &Value::str(t))),
            (1, [Value::Float(x)]) => Value::Float(x * 2.0),
            (2, args) => Value::Int(
                args.iter()
                    .map(|a| if let Value::Int(i) = a { *i } else { 0 })
                    .sum(),
            ),
            (3, [Value::Str(name)]) if name == "x-team" => Value::str("search"),
            (3, _) => Value::str(""),
            _ => Value::Bool(false),
        }
    }
}

fn typed(src: &str) -> TypedExpr {
    typecheck(&parse_expr(src).unwrap(), &env()).unwrap_or_else(|e| panic!("{src:?}: {e:?}"))
}

fn eval(src: &str, req: &impl EvalContext) -> bool {
    typed(src).eval_bool(req)
}

fn holds(src: &str) -> bool {
    eval(src, &Request::default())
}

#[test]
fn example_condition() {
    let src = r#"promptTokens > 8000 && tag("pii-detected") && tenant in ["a", "b"]"#;
    assert!(holds(src));
    let req = Request {
        tenant: "c".into(),
        ..Request::default()
    };
    assert!(!eval(src, &req));
    let req = Request {
        prompt_tokens: 10,
        ..Request::default()
    };
    assert!(!eval(src, &req));
}

#[test]
fn numbers() {
    assert!(holds("promptTokens == 9000"));
    assert!(holds("promptTokens != 9001"));
    assert!(holds("promptTokens >= 9000 && promptTokens <= 9000"));
    assert!(holds("promptTokens > 8999.5"));
    assert!(holds("promptTokens < 9000.5"));
    assert!(holds("promptTokens == 9000.0"));
    assert!(holds("kvCacheUsage == 50%"));
    assert!(holds("kvCacheUsage < 70%"));
    assert!(!holds("kvCacheUsage > 0.7"));
    assert!(holds("1 < 2"));
    assert!(holds("-1 < 0"));
    assert!(holds("promptTokens in [1, 9000]"));
    assert!(holds("promptTokens in [1.5, 9000.0]"));
    assert!(holds("kvCacheUsage not in [1, 2]"));
    assert!(holds("scaled(1) == 2"));
    assert!(holds("scaled(promptTokens) == 18000"));
    assert!(holds("sum(1, 2, 3, 4, promptTokens) == 9010"));
}

#[test]
fn strings_bools_durations_lists() {
    assert!(holds(r#"tenant == "a""#));
    assert!(holds(r#"tenant != "b""#));
    assert!(holds(r#"tenant not in ["b", "c"]"#));
    assert!(holds(r#"header("x-team") == "search""#));
    assert!(!holds(r#"header("other") == "search""#));
    assert!(holds("!streaming"));
    assert!(holds("streaming == false"));
    assert!(holds("streaming in [false]"));
    assert!(holds("waited > 150ms"));
    assert!(holds("waited == 200ms"));
    assert!(holds("waited < 1s"));
    assert!(holds("waited in [100ms, 200ms]"));
    assert!(holds(r#""pii-detected" in tags"#));
    assert!(holds(r#""other" not in tags"#));
    assert!(holds("true"));
    assert!(!holds("false"));
}

#[test]
fn keywords_and_precedence() {
    assert!(holds("true or false and false"));
    assert!(!holds("(true or false) and false"));
    assert!(holds("not false"));
    assert!(holds("!!true"));
    assert!(holds("!streaming == true"));
}

#[test]
fn short_circuit() {
    let req = Request::default();
    assert!(!eval(r#"false && tag("x")"#, &req));
    assert!(eval(r#"true || tag("x")"#, &req));
    assert_eq!(req.calls.get(), 0);
    assert!(!eval(r#"tag("x") && tag("y")"#, &req));
    assert_eq!(req.calls.get(), 1);
}

/// A context that returns values of the wrong shape.
struct Liar;

impl EvalContext for Liar {
    fn var(&self, index: usize) -> Value<'_> {
        match index {
            0 => Value::str("not a number"),
            2 => Value::Int(7),
            3 => Value::Int(1),
            5 => Value::Bool(true),
            _ => Value::Float(f64::NAN),
        }
    }

    fn call(&self, _: usize, _: &[Value<'_>]) -> Value<'_> {
        Value::from(vec![Value::Int(1)])
    }
}

#[test]
fn wrong_shapes_make_their_comparison_false() {
    assert!(!eval("promptTokens > 1", &Liar));
    assert!(!eval("promptTokens <= 1", &Liar));
    assert!(!eval("promptTokens != 1", &Liar));
    assert!(!eval(r#"tenant == "a""#, &Liar));
    assert!(!eval(r#"tenant in ["a"]"#, &Liar));
    assert!(!eval(r#"tenant not in ["a"]"#, &Liar));
    assert!(!eval(r#""a" in tags"#, &Liar));
    assert!(!eval("streaming", &Liar));
    assert!(!eval(r#"tag("a")"#, &Liar));
    // The enclosing `!` applies as usual.
    assert!(eval("!(promptTokens > 1)", &Liar));
    assert!(eval("!streaming", &Liar));
    // NaN: unordered, unequal.
    assert!(!eval("kvCacheUsage > 0", &Liar));
    assert!(!eval("kvCacheUsage == 0", &Liar));
    assert!(eval("kvCacheUsage != 0", &Liar));
}

#[test]
fn large_chains_evaluate_without_deep_recursion() {
    let src = vec!["promptTokens > 1"; 20_000].join(" && ");
    assert!(holds(&src));
    let src = vec!["promptTokens < 1"; 20_000].join(" || ");
    assert!(!holds(&src));
}

#[test]
fn deepest_accepted_condition_runs_on_a_small_stack() {
    // Every stage recurses over nesting, which the parser bounds; this checks
    // that the bound fits in a default 2 MiB thread stack, even unoptimized.
    let n = kinf_grammar::expr::MAX_NESTING;
    // The call's own `(` is one more level.
    let src = format!(
        "{}streaming{}",
        "!(scaled(kvCacheUsage) > 0 || ".repeat(n - 1),
        ")".repeat(n - 1)
    );
    let src2 = format!("{}streaming{}", "!(".repeat(n), ")".repeat(n));
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            for src in [src, src2] {
                let typed = typed(&src);
                let _ = typed.eval_bool(&Request::default());
                let printed = typed.to_string();
                assert_eq!(parse_expr(&printed).unwrap(), *typed.expr());
            }
        })
        .unwrap();
    handle.join().unwrap();
}
