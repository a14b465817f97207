//! [`Expr`] + [`Env`] → [`TypedExpr`], reporting every type error at once.

use std::borrow::Cow;

use super::ast::{CompareOp, Expr, ExprKind, Literal, LogicalOp};
use super::eval::{Value, ValueList};
use super::typed::{Node, TypedExpr};
use super::types::{Env, Type};
use crate::error::Span;
use crate::suggest;

/// A condition that does not type-check against its [`Env`].
///
/// The message is lowercase and quotes user input in backticks; `help` says
/// how to fix it; `kind` lets the caller pick a diagnostic code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TypeError {
    /// What kind of problem this is.
    pub kind: TypeErrorKind,
    /// Where the problem is, as byte offsets into the parsed string.
    pub span: Span,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
}

/// The kinds of [`TypeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TypeErrorKind {
    /// A name that is not a variable of the environment.
    UnknownVariable,
    /// A call of a name that is not a function of the environment.
    UnknownFunction,
    /// A call with too few or too many arguments.
    WrongArgumentCount,
    /// A call argument of the wrong type.
    WrongArgumentType,
    /// Operands that the operator does not apply to.
    Mismatch,
    /// The whole condition is not `Bool`.
    NotBool,
    /// A list literal whose elements have different types.
    MixedList,
    /// A list literal with no elements.
    EmptyList,
}

/// Checks `expr` against `env`: every name must exist, every operator must
/// get operands it applies to, and the whole condition must be `Bool`.
///
/// Returns all the errors found, in source order, not only the first; an
/// error in a sub-expression is not reported again by the expressions
/// around it.
pub fn typecheck(expr: &Expr, env: &Env) -> Result<TypedExpr, Vec<TypeError>> {
    typecheck_cow(Cow::Borrowed(expr), env)
}

/// [`typecheck`] of an expression given by value: the typed expression keeps it, without a
/// copy.
pub fn typecheck_owned(expr: Expr, env: &Env) -> Result<TypedExpr, Vec<TypeError>> {
    typecheck_cow(Cow::Owned(expr), env)
}

fn typecheck_cow(source: Cow<'_, Expr>, env: &Env) -> Result<TypedExpr, Vec<TypeError>> {
    let expr: &Expr = &source;
    let mut checker = Checker {
        env,
        errors: Vec::new(),
        vars: Vec::new(),
        funcs: Vec::new(),
    };
    let root = checker.check(expr);
    if let Some((ty, _)) = &root
        && *ty != Type::Bool
    {
        let help = bool_hint(expr, ty).unwrap_or_else(|| {
            "a condition is a comparison, a `Bool` variable or call, or such conditions combined with `&&`, `||` and `!`".to_owned()
        });
        checker.error(
            TypeErrorKind::NotBool,
            expr.span,
            format!("a condition must be `Bool`, found `{ty}`"),
            Some(help),
        );
    }
    match root {
        Some((_, root)) if checker.errors.is_empty() => {
            let Checker {
                mut vars,
                mut funcs,
                ..
            } = checker;
            vars.sort_unstable();
            vars.dedup();
            funcs.sort_unstable();
            funcs.dedup();
            Ok(TypedExpr {
                expr: source.into_owned(),
                root,
                vars,
                funcs,
            })
        }
        _ => {
            let mut errors = checker.errors;
            errors.sort_by_key(|e| (e.span.start, e.span.end));
            Err(errors)
        }
    }
}

struct Checker<'env> {
    env: &'env Env,
    errors: Vec<TypeError>,
    vars: Vec<usize>,
    funcs: Vec<usize>,
}

const STRING_OPS: &str = "`String` values support only `==`, `!=`, `in` and `not in`";

impl Checker<'_> {
    fn error(&mut self, kind: TypeErrorKind, span: Span, message: String, help: Option<String>) {
        self.errors.push(TypeError {
            kind,
            span,
            message,
            help,
        });
    }

    /// The type and evaluation node of `expr`, or `None` after reporting
    /// an error in it.
    fn check(&mut self, expr: &Expr) -> Option<(Type, Node)> {
        match &expr.kind {
            ExprKind::Literal(literal) => Some(literal_value(literal)),
            ExprKind::List(items) => self.list(expr.span, items),
            ExprKind::Var(name) => self.var(name, expr.span),
            ExprKind::Call { name, args } => self.call(expr.span, &name.name, name.span, args),
            ExprKind::Not(inner) => {
                let node = self.condition(inner, "`!`")?;
                Some((Type::Bool, Node::Not(Box::new(node))))
            }
            ExprKind::Logical { op, operands } => {
                let what = format!("`{}`", op.as_str());
                let nodes: Vec<Option<Node>> =
                    operands.iter().map(|o| self.condition(o, &what)).collect();
                let nodes: Box<[Node]> = nodes.into_iter().collect::<Option<_>>()?;
                Some((
                    Type::Bool,
                    match op {
                        LogicalOp::And => Node::And(nodes),
                        LogicalOp::Or => Node::Or(nodes),
                    },
                ))
            }
            ExprKind::Compare { op, lhs, rhs } => self.compare(expr.span, *op, lhs, rhs),
        }
    }

    /// Checks an operand that must be `Bool`.
    fn condition(&mut self, expr: &Expr, operator: &str) -> Option<Node> {
        let (ty, node) = self.check(expr)?;
        if ty == Type::Bool {
            return Some(node);
        }
        let help = bool_hint(expr, &ty).or_else(|| {
            Some(format!(
                "{operator} applies to conditions: comparisons and `Bool` values"
            ))
        });
        self.error(
            TypeErrorKind::Mismatch,
            expr.span,
            format!("{operator} needs `Bool` operands, found `{ty}`"),
            help,
        );
        None
    }

    fn list(&mut self, span: Span, items: &[Expr]) -> Option<(Type, Node)> {
        if items.is_empty() {
            self.error(
                TypeErrorKind::EmptyList,
                span,
                "empty list".to_owned(),
                Some("an empty list contains nothing; add elements or remove the test".to_owned()),
            );
            return None;
        }
        let mut elem: Option<Type> = None;
        let mut values = Vec::with_capacity(items.len());
        let mut failed = false;
        for item in items {
            let Some((ty, node)) = self.check(item) else {
                failed = true;
                continue;
            };
            if let Node::Lit(value) = node {
                values.push(value);
            }
            elem = match elem {
                None => Some(ty),
                Some(acc) => match unify(&acc, &ty) {
                    Some(joined) => Some(joined),
                    None => {
                        self.error(
                            TypeErrorKind::MixedList,
                            item.span,
                            format!("list elements must have one type: found `{ty}` after `{acc}`"),
                            Some(format!("the elements before it are `{acc}`")),
                        );
                        failed = true;
                        Some(acc)
                    }
                },
            };
        }
        let elem = elem.filter(|_| !failed)?;
        let values = values.into_iter().map(|v| coerce_value(v, &elem)).collect();
        Some((
            Type::list(elem),
            Node::Lit(Value::List(ValueList::Owned(values))),
        ))
    }

    fn var(&mut self, name: &str, span: Span) -> Option<(Type, Node)> {
        if let Some((index, ty)) = self.env.lookup_var(name) {
            self.vars.push(index);
            return Some((ty.clone(), Node::Var(index)));
        }
        let help = if self.env.lookup_func(name).is_some() {
            format!("`{name}` is a function; call it, e.g. `{name}(…)`")
        } else {
            let names = self.env.vars.iter().map(|(n, _)| n.as_str());
            match suggest::closest(name, names.clone()) {
                Some(close) => format!("did you mean `{close}`?"),
                None if self.env.vars.is_empty() => "no variables are available here".to_owned(),
                None => format!("the variables are {}", suggest::list(names)),
            }
        };
        self.error(
            TypeErrorKind::UnknownVariable,
            span,
            format!("unknown variable `{name}`"),
            Some(help),
        );
        None
    }

    fn call(
        &mut self,
        span: Span,
        name: &str,
        name_span: Span,
        args: &[Expr],
    ) -> Option<(Type, Node)> {
        let checked: Vec<(Option<(Type, Node)>, Span)> =
            args.iter().map(|a| (self.check(a), a.span)).collect();
        let Some((index, sig)) = self.env.lookup_func(name) else {
            let help = if self.env.lookup_var(name).is_some() {
                format!("`{name}` is a variable, not a function; remove the parentheses")
            } else {
                let names = self.env.funcs.iter().map(|f| f.name.as_str());
                match suggest::closest(name, names.clone()) {
                    Some(close) => format!("did you mean `{close}`?"),
                    None if self.env.funcs.is_empty() => {
                        "no functions are available here".to_owned()
                    }
                    None => format!("the functions are {}", suggest::list(names)),
                }
            };
            self.error(
                TypeErrorKind::UnknownFunction,
                name_span,
                format!("unknown function `{name}`"),
                Some(help),
            );
            return None;
        };
        self.funcs.push(index);
        let signature = Some(format!("the signature is `{sig}`"));
        if sig.params.len() != args.len() {
            let plural = if sig.params.len() == 1 { "" } else { "s" };
            self.error(
                TypeErrorKind::WrongArgumentCount,
                span,
                format!(
                    "`{name}` takes {} argument{plural}, found {}",
                    sig.params.len(),
                    args.len()
                ),
                signature,
            );
            return None;
        }
        let mut nodes = Vec::with_capacity(args.len());
        let mut failed = false;
        for (position, ((arg, arg_span), param)) in checked.into_iter().zip(&sig.params).enumerate()
        {
            let Some((ty, node)) = arg else {
                failed = true;
                continue;
            };
            match assign(node, &ty, param) {
                Some(node) => nodes.push(node),
                None => {
                    self.error(
                        TypeErrorKind::WrongArgumentType,
                        arg_span,
                        format!(
                            "argument {} of `{name}` must be `{param}`, found `{ty}`",
                            position + 1
                        ),
                        signature.clone(),
                    );
                    failed = true;
                }
            }
        }
        if failed {
            return None;
        }
        Some((
            sig.ret.clone(),
            Node::Call {
                index,
                args: nodes.into_boxed_slice(),
            },
        ))
    }

    fn compare(
        &mut self,
        span: Span,
        op: CompareOp,
        lhs: &Expr,
        rhs: &Expr,
    ) -> Option<(Type, Node)> {
        let left = self.check(lhs);
        let right = self.check(rhs);
        let ((lt, ln), (rt, rn)) = (left?, right?);
        let (lhs_node, rhs_node) = (Box::new(ln), Box::new(rn));
        let symbol = op.as_str();
        if matches!(op, CompareOp::In | CompareOp::NotIn) {
            let Type::List(elem) = &rt else {
                self.error(
                    TypeErrorKind::Mismatch,
                    rhs.span,
                    format!("`{symbol}` needs a list on its right, found `{rt}`"),
                    Some(format!(
                        "write a list, e.g. `{lhs} {symbol} [\"a\", \"b\"]`"
                    )),
                );
                return None;
            };
            if !equatable(&lt, elem) {
                self.error(
                    TypeErrorKind::Mismatch,
                    span,
                    format!("cannot look for `{lt}` in `{rt}`"),
                    Some(format!("the list elements must be `{lt}` values")),
                );
                return None;
            }
            let node = Node::In {
                needle: lhs_node,
                list: rhs_node,
                negated: op == CompareOp::NotIn,
            };
            return Some((Type::Bool, node));
        }
        let fits = if op.is_ordering() {
            (lt.is_numeric() && rt.is_numeric()) || (lt == Type::Duration && rt == Type::Duration)
        } else {
            equatable(&lt, &rt)
        };
        if !fits {
            let (message, help) = if lt == rt {
                let help = match lt {
                    Type::String => STRING_OPS.to_owned(),
                    Type::Bool => "`Bool` values support only `==` and `!=`".to_owned(),
                    _ => format!("`{lt}` values cannot be compared"),
                };
                (format!("`{symbol}` cannot compare `{lt}` values"), help)
            } else {
                (
                    format!("cannot compare `{lt}` with `{rt}`"),
                    mismatch_help(&lt, &rt, op),
                )
            };
            self.error(TypeErrorKind::Mismatch, span, message, Some(help));
            return None;
        }
        let node = Node::Compare {
            op,
            lhs: lhs_node,
            rhs: rhs_node,
        };
        Some((Type::Bool, node))
    }
}

fn mismatch_help(lt: &Type, rt: &Type, op: CompareOp) -> String {
    let has = |t: &Type| lt == t || rt == t;
    if has(&Type::Duration) && (lt.is_numeric() || rt.is_numeric()) {
        "write the number as a duration with a unit, e.g. `5s` or `150ms`".to_owned()
    } else if has(&Type::String) && op.is_ordering() {
        STRING_OPS.to_owned()
    } else if has(&Type::String) {
        "both sides must be `String`; write text in double quotes, e.g. `\"a\"`".to_owned()
    } else {
        "both sides must have the same type (`Int` and `Float` also compare with each other)"
            .to_owned()
    }
}

/// A hint for turning a non-`Bool` variable or call into a condition.
fn bool_hint(expr: &Expr, ty: &Type) -> Option<String> {
    if !matches!(expr.kind, ExprKind::Var(_) | ExprKind::Call { .. }) {
        return None;
    }
    let example = match ty {
        Type::Int | Type::Float => format!("{expr} > 0"),
        Type::String => format!("{expr} == \"a\""),
        Type::Duration => format!("{expr} > 1s"),
        Type::List(_) => format!("\"a\" in {expr}"),
        Type::Bool => return None,
    };
    Some(format!("compare it with a value, e.g. `{example}`"))
}

fn literal_value(literal: &Literal) -> (Type, Node) {
    let (ty, value) = match literal {
        Literal::Int(i) => (Type::Int, Value::Int(*i)),
        Literal::Float(x) => (Type::Float, Value::Float(*x)),
        Literal::Str(s) => (Type::String, Value::Str(Cow::Owned(s.clone()))),
        Literal::Bool(b) => (Type::Bool, Value::Bool(*b)),
        Literal::Duration(d) => (Type::Duration, Value::Duration(d.as_secs_f64())),
    };
    (ty, Node::Lit(value))
}

/// Whether `==` applies to the two types.
fn equatable(a: &Type, b: &Type) -> bool {
    (a.is_numeric() && b.is_numeric())
        || (a == b && matches!(a, Type::String | Type::Bool | Type::Duration))
}

/// The type of a list holding both types, if any (`Int` and `Float` join as
/// `Float`).
fn unify(a: &Type, b: &Type) -> Option<Type> {
    match (a, b) {
        _ if a == b => Some(a.clone()),
        (Type::Int, Type::Float) | (Type::Float, Type::Int) => Some(Type::Float),
        (Type::List(x), Type::List(y)) => unify(x, y).map(Type::list),
        _ => None,
    }
}

/// Converts `Int`s to `Float`s where `ty` says `Float`.
fn coerce_value(value: Value<'static>, ty: &Type) -> Value<'static> {
    match (value, ty) {
        (Value::Int(i), Type::Float) => Value::Float(i as f64),
        (Value::List(items), Type::List(elem)) => Value::List(ValueList::Owned(
            items
                .iter()
                .cloned()
                .map(|v| coerce_value(v, elem))
                .collect(),
        )),
        (value, _) => value,
    }
}

/// `node` of type `from` passed where `to` is expected: as is, widened from
/// `Int` to `Float`, or `None` when it does not fit.
fn assign(node: Node, from: &Type, to: &Type) -> Option<Node> {
    if from == to {
        return Some(node);
    }
    match (node, from, to) {
        (Node::Lit(value), _, _) if unify(from, to).as_ref() == Some(to) => {
            Some(Node::Lit(coerce_value(value, to)))
        }
        (node, Type::Int, Type::Float) => Some(Node::ToFloat(Box::new(node))),
        _ => None,
    }
}
