//! A checked condition, ready to evaluate.

use std::fmt;

use super::ast::{CompareOp, Expr};
use super::eval::{EvalContext, Value};

/// A condition that passed [`typecheck`](super::typecheck): `Bool`-typed,
/// names resolved to indices into its [`Env`](super::Env), literal lists
/// built once. Evaluation does no name lookups and allocates only for the
/// arguments of calls with more than four of them.
///
/// `Display` prints the normal form of the source condition.
#[derive(Debug, Clone)]
pub struct TypedExpr {
    pub(crate) expr: Expr,
    pub(crate) root: Node,
    pub(crate) vars: Vec<usize>,
    pub(crate) funcs: Vec<usize>,
}

/// The evaluation tree.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// A literal, lists included, built at check time.
    Lit(Value<'static>),
    /// Variable by index.
    Var(usize),
    /// Function by index.
    Call {
        index: usize,
        args: Box<[Node]>,
    },
    /// `Int` argument passed where a `Float` is declared.
    ToFloat(Box<Node>),
    Not(Box<Node>),
    And(Box<[Node]>),
    Or(Box<[Node]>),
    /// `==`, `!=`, `<`, `<=`, `>`, `>=`.
    Compare {
        op: CompareOp,
        lhs: Box<Node>,
        rhs: Box<Node>,
    },
    /// `in` / `not in`.
    In {
        needle: Box<Node>,
        list: Box<Node>,
        negated: bool,
    },
}

impl TypedExpr {
    /// Evaluates the condition against `ctx`, short-circuiting `&&` and
    /// `||`.
    ///
    /// Total: never panics. A value of unexpected shape from `ctx` makes the
    /// comparison (or `in`, or `Bool` variable or call) that uses it `false`;
    /// enclosing `!`, `&&` and `||` apply as usual.
    pub fn eval_bool<C: EvalContext + ?Sized>(&self, ctx: &C) -> bool {
        self.root.eval_bool(ctx)
    }

    /// The source tree.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// Indices (into `Env::vars`) of the variables the condition reads,
    /// sorted, without duplicates.
    pub fn vars(&self) -> &[usize] {
        &self.vars
    }

    /// Indices (into `Env::funcs`) of the functions the condition calls,
    /// sorted, without duplicates.
    pub fn funcs(&self) -> &[usize] {
        &self.funcs
    }
}

impl fmt::Display for TypedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.expr)
    }
}
