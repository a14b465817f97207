//! Runtime values, the evaluation context and the evaluator.
//!
//! Evaluation is total: it never panics. A value of unexpected shape (say,
//! the context returns `Str` for a variable declared `Int`) makes the
//! smallest enclosing comparison, `in`, variable or call used as a condition
//! evaluate to `false`; `!`, `&&` and `||` then apply as usual.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::ops::Deref;

use smallvec::SmallVec;

use super::ast::CompareOp;
use super::typed::Node;

/// A value seen by a condition at evaluation time.
///
/// The lifetime lets a context lend strings and lists it owns without
/// copying them.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// An `Int`.
    Int(i64),
    /// A `Float`.
    Float(f64),
    /// A `String`, borrowed or owned.
    Str(Cow<'a, str>),
    /// A `Bool`.
    Bool(bool),
    /// A `Duration`, in seconds.
    Duration(f64),
    /// A `List`.
    List(ValueList<'a>),
}

/// The elements of a [`Value::List`], borrowed or owned.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueList<'a> {
    /// Elements lent by their owner.
    Borrowed(&'a [Value<'a>]),
    /// Elements owned by the list.
    Owned(Vec<Value<'a>>),
}

impl<'a> Deref for ValueList<'a> {
    type Target = [Value<'a>];

    fn deref(&self) -> &[Value<'a>] {
        match self {
            ValueList::Borrowed(items) => items,
            ValueList::Owned(items) => items,
        }
    }
}

impl<'a> Value<'a> {
    /// A borrowed string value.
    pub fn str(s: &'a str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }

    /// A borrowed list value.
    pub fn list(items: &'a [Value<'a>]) -> Self {
        Value::List(ValueList::Borrowed(items))
    }

    /// A view of this value that borrows from it instead of cloning.
    pub fn reborrow(&self) -> Value<'_> {
        match self {
            Value::Int(i) => Value::Int(*i),
            Value::Float(x) => Value::Float(*x),
            Value::Str(s) => Value::Str(Cow::Borrowed(s)),
            Value::Bool(b) => Value::Bool(*b),
            Value::Duration(d) => Value::Duration(*d),
            Value::List(items) => Value::List(ValueList::Borrowed(items)),
        }
    }
}

impl From<i64> for Value<'_> {
    fn from(value: i64) -> Self {
        Value::Int(value)
    }
}

impl From<f64> for Value<'_> {
    fn from(value: f64) -> Self {
        Value::Float(value)
    }
}

impl From<bool> for Value<'_> {
    fn from(value: bool) -> Self {
        Value::Bool(value)
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(value: &'a str) -> Self {
        Value::str(value)
    }
}

impl From<String> for Value<'_> {
    fn from(value: String) -> Self {
        Value::Str(Cow::Owned(value))
    }
}

impl From<std::time::Duration> for Value<'_> {
    fn from(value: std::time::Duration) -> Self {
        Value::Duration(value.as_secs_f64())
    }
}

impl<'a> From<Vec<Value<'a>>> for Value<'a> {
    fn from(value: Vec<Value<'a>>) -> Self {
        Value::List(ValueList::Owned(value))
    }
}

/// What a condition reads at evaluation time: the values of the variables
/// and the results of the functions of the [`Env`](super::Env) it was
/// checked against, by index into `Env::vars` and `Env::funcs`.
pub trait EvalContext {
    /// The value of variable `index`. It should have the declared type; a
    /// value of another shape makes the comparison using it false.
    fn var(&self, index: usize) -> Value<'_>;

    /// The result of calling function `index` with `args` (as many as the
    /// signature has, of the declared types).
    fn call(&self, index: usize, args: &[Value<'_>]) -> Value<'_>;
}

impl Node {
    /// Evaluates a node of any type.
    pub(crate) fn eval<'e, C: EvalContext + ?Sized>(&'e self, ctx: &'e C) -> Value<'e> {
        match self {
            Node::Lit(value) => value.reborrow(),
            Node::Var(index) => ctx.var(*index),
            Node::Call { index, args } => {
                let values: SmallVec<[Value<'e>; 4]> = args.iter().map(|a| a.eval(ctx)).collect();
                ctx.call(*index, &values)
            }
            Node::ToFloat(inner) => match inner.eval(ctx) {
                Value::Int(i) => Value::Float(i as f64),
                other => other,
            },
            Node::Not(_) | Node::And(_) | Node::Or(_) | Node::Compare { .. } | Node::In { .. } => {
                Value::Bool(self.eval_bool(ctx))
            }
        }
    }

    /// Evaluates a node of type `Bool`, short-circuiting `&&` and `||`.
    pub(crate) fn eval_bool<C: EvalContext + ?Sized>(&self, ctx: &C) -> bool {
        match self {
            Node::Not(inner) => !inner.eval_bool(ctx),
            Node::And(items) => items.iter().all(|n| n.eval_bool(ctx)),
            Node::Or(items) => items.iter().any(|n| n.eval_bool(ctx)),
            Node::Compare { op, lhs, rhs } => {
                compare(*op, &lhs.eval(ctx), &rhs.eval(ctx)).unwrap_or(false)
            }
            Node::In {
                needle,
                list,
                negated,
            } => match list.eval(ctx) {
                Value::List(items) => {
                    contains(&needle.eval(ctx), &items).is_some_and(|found| found != *negated)
                }
                _ => false,
            },
            Node::Lit(_) | Node::Var(_) | Node::Call { .. } | Node::ToFloat(_) => {
                matches!(self.eval(ctx), Value::Bool(true))
            }
        }
    }
}

/// `needle in items`; `None` when some element cannot be compared.
fn contains(needle: &Value<'_>, items: &[Value<'_>]) -> Option<bool> {
    let mut comparable = true;
    for item in items {
        match compare(CompareOp::Eq, needle, item) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => comparable = false,
        }
    }
    comparable.then_some(false)
}

/// Applies a comparison operator; `None` when the operands have shapes the
/// operator does not apply to. `NaN` compares unequal to everything.
pub(crate) fn compare(op: CompareOp, lhs: &Value<'_>, rhs: &Value<'_>) -> Option<bool> {
    let equality = |equal: bool| match op {
        CompareOp::Eq => Some(equal),
        CompareOp::Ne => Some(!equal),
        _ => None,
    };
    let order = match (lhs, rhs) {
        (Value::Str(a), Value::Str(b)) => return equality(a == b),
        (Value::Bool(a), Value::Bool(b)) => return equality(a == b),
        (Value::Int(a), Value::Int(b)) => Some(a.cmp(b)),
        (Value::Int(a), Value::Float(b)) => cmp_int_float(*a, *b),
        (Value::Float(a), Value::Int(b)) => cmp_int_float(*b, *a).map(Ordering::reverse),
        (Value::Float(a), Value::Float(b)) | (Value::Duration(a), Value::Duration(b)) => {
            a.partial_cmp(b)
        }
        _ => return None,
    };
    let Some(order) = order else {
        // NaN on one side.
        return Some(op == CompareOp::Ne);
    };
    match op {
        CompareOp::Eq => Some(order == Ordering::Equal),
        CompareOp::Ne => Some(order != Ordering::Equal),
        CompareOp::Lt => Some(order == Ordering::Less),
        CompareOp::Le => Some(order != Ordering::Greater),
        CompareOp::Gt => Some(order == Ordering::Greater),
        CompareOp::Ge => Some(order != Ordering::Less),
        CompareOp::In | CompareOp::NotIn => None,
    }
}

/// Exact comparison of an integer with a float (no rounding of large
/// integers); `None` for `NaN`.
fn cmp_int_float(int: i64, float: f64) -> Option<Ordering> {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    if float.is_nan() {
        return None;
    }
    if float >= TWO_POW_63 {
        return Some(Ordering::Less);
    }
    if float < -TWO_POW_63 {
        return Some(Ordering::Greater);
    }
    let whole = float.trunc();
    // Exact: `whole` is integral and within the range of `i64`.
    let whole_int = whole as i64;
    match int.cmp(&whole_int) {
        Ordering::Equal => 0.0_f64.partial_cmp(&(float - whole)),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_float_comparison_is_exact() {
        assert_eq!(cmp_int_float(1, 1.0), Some(Ordering::Equal));
        assert_eq!(cmp_int_float(1, 1.5), Some(Ordering::Less));
        assert_eq!(cmp_int_float(-1, -1.5), Some(Ordering::Greater));
        assert_eq!(
            cmp_int_float(i64::MAX, 9.223_372_036_854_776e18),
            Some(Ordering::Less)
        );
        assert_eq!(
            cmp_int_float(i64::MIN, -9.223_372_036_854_776e18),
            Some(Ordering::Equal)
        );
        assert_eq!(
            cmp_int_float((1 << 53) + 1, 9_007_199_254_740_992.0),
            Some(Ordering::Greater)
        );
        assert_eq!(cmp_int_float(0, f64::NAN), None);
    }

    #[test]
    fn comparisons_by_shape() {
        let s = |x: &'static str| Value::str(x);
        assert_eq!(compare(CompareOp::Eq, &s("a"), &s("a")), Some(true));
        assert_eq!(compare(CompareOp::Lt, &s("a"), &s("b")), None);
        assert_eq!(
            compare(CompareOp::Ge, &Value::Int(3), &Value::Float(2.5)),
            Some(true)
        );
        assert_eq!(
            compare(CompareOp::Eq, &Value::Int(3), &Value::Duration(3.0)),
            None
        );
        assert_eq!(
            compare(CompareOp::Ne, &Value::Float(f64::NAN), &Value::Float(1.0)),
            Some(true)
        );
        assert_eq!(
            compare(CompareOp::Eq, &Value::Float(f64::NAN), &Value::Float(1.0)),
            Some(false)
        );
        let items = [s("a"), s("b")];
        assert_eq!(contains(&s("b"), &items), Some(true));
        assert_eq!(contains(&s("c"), &items), Some(false));
        assert_eq!(contains(&Value::Int(1), &items), None);
    }
}
