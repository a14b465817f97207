//! The small textual sub-languages used inside Kinference policy YAML.
//!
//! - [`parse_duration`], [`parse_ratio`], [`parse_quantity`]: `30s`, `70%`,
//!   `16Ki`.
//! - [`Glob`]: model-name patterns such as `qwen-*` or `Qwen/Qwen3.?-*`.
//! - [`expr`]: the condition language of `when:` fields, parsed with
//!   [`parse_expr`], checked against an [`Env`] with [`typecheck`] and
//!   evaluated with [`TypedExpr::eval_bool`].
//!
//! Every error carries a byte [`Span`] into the string that was given, so the
//! caller can map it onto its YAML file. Nothing here does I/O.

mod decimal;
mod duration;
mod error;
pub mod expr;
mod glob;
mod quantity;
pub mod suggest;

pub use duration::{format_duration, parse_duration};
pub use error::{Span, SyntaxError};
pub use expr::{
    Env, EvalContext, Expr, FnSig, Type, TypeError, TypeErrorKind, TypedExpr, Value, parse_expr,
    typecheck, typecheck_owned,
};
pub use glob::Glob;
pub use quantity::{parse_quantity, parse_ratio};
