//! The condition language of `when:` fields.
//!
//! ```text
//! promptTokens > 8000 && tag("pii-detected") && tenant in ["a", "b"]
//! ```
//!
//! Three steps, each its own module: [`parse_expr`] turns text into an
//! [`Expr`] (every node with its byte span), [`typecheck`] checks it against
//! an [`Env`] of the variables and functions of the context and resolves
//! names to indices, giving a [`TypedExpr`], and [`TypedExpr::eval_bool`]
//! evaluates that against an [`EvalContext`]. `Display` on [`Expr`] and
//! [`TypedExpr`] prints the normal form.
//!
//! ```
//! use kinf_grammar::expr::{Env, EvalContext, Type, Value, parse_expr, typecheck};
//!
//! let env = Env::new()
//!     .var("promptTokens", Type::Int)
//!     .var("tenant", Type::String)
//!     .func("tag", [Type::String], Type::Bool);
//! let expr = parse_expr(r#"promptTokens > 8000 and tenant in ["a", "b"]"#).unwrap();
//! let typed = typecheck(&expr, &env).unwrap();
//! assert_eq!(typed.to_string(), r#"promptTokens > 8000 && tenant in ["a", "b"]"#);
//!
//! struct Request { prompt_tokens: i64, tenant: String }
//! impl EvalContext for Request {
//!     fn var(&self, index: usize) -> Value<'_> {
//!         match index {
//!             0 => Value::Int(self.prompt_tokens),
//!             _ => Value::str(&self.tenant),
//!         }
//!     }
//!     fn call(&self, _index: usize, _args: &[Value<'_>]) -> Value<'_> {
//!         Value::Bool(false)
//!     }
//! }
//! assert!(typed.eval_bool(&Request { prompt_tokens: 9000, tenant: "a".into() }));
//! assert!(!typed.eval_bool(&Request { prompt_tokens: 9000, tenant: "c".into() }));
//! ```

mod ast;
mod display;
mod eval;
mod parse;
mod parse_fast;
mod typecheck;
mod typed;
mod types;

pub use ast::{CompareOp, Expr, ExprKind, Ident, Literal, LogicalOp};
pub use eval::{EvalContext, Value, ValueList};
pub use parse::{MAX_DEPTH, MAX_NESTING, parse_expr, parse_expr_reference};
pub use typecheck::{TypeError, TypeErrorKind, typecheck, typecheck_owned};
pub use typed::TypedExpr;
pub use types::{Env, FnSig, Type};
