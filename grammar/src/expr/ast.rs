//! The syntax tree of a condition, as written (names unresolved).

use std::time::Duration;

use crate::error::Span;

/// A condition or one of its sub-expressions.
///
/// Equality ignores spans (here and in every child), so two trees parsed from
/// differently spaced text compare equal.
#[derive(Debug, Clone)]
pub struct Expr {
    /// What the expression is.
    pub kind: ExprKind,
    /// Where it is in the source, parentheses excluded.
    pub span: Span,
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

impl Expr {
    /// A new node.
    pub fn new(kind: ExprKind, span: Span) -> Self {
        Self { kind, span }
    }
}

/// The kinds of expression.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// A literal value.
    Literal(Literal),
    /// A list literal `[a, b]`; the parser only puts literals and lists in it.
    List(Vec<Expr>),
    /// A variable, by name.
    Var(String),
    /// A function call `name(args)`.
    Call {
        /// The function name and its span.
        name: Ident,
        /// The arguments, in order.
        args: Vec<Expr>,
    },
    /// `!e` or `not e`.
    Not(Box<Expr>),
    /// Two or more operands joined by the same `&&` or `||` (a chain
    /// `a && b && c` is one node; parenthesized groups stay separate nodes).
    Logical {
        /// `&&` or `||`.
        op: LogicalOp,
        /// The operands, at least two, in order.
        operands: Vec<Expr>,
    },
    /// A comparison, `in` or `not in`.
    Compare {
        /// The operator.
        op: CompareOp,
        /// The left operand.
        lhs: Box<Expr>,
        /// The right operand (the list, for `in`).
        rhs: Box<Expr>,
    },
}

/// A name with its span; equality ignores the span.
#[derive(Debug, Clone)]
pub struct Ident {
    /// The name as written.
    pub name: String,
    /// Where it is in the source.
    pub span: Span,
}

impl PartialEq for Ident {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// A literal value.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// An integer such as `8000` or `-1`.
    Int(i64),
    /// A float such as `0.5`; a percentage `70%` is the float `0.7`.
    Float(f64),
    /// A string in double quotes, escapes resolved.
    Str(String),
    /// `true` or `false`.
    Bool(bool),
    /// A duration such as `2s` or `150ms`.
    Duration(Duration),
}

/// `&&` or `||`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicalOp {
    /// `&&` (also written `and`).
    And,
    /// `||` (also written `or`).
    Or,
}

impl LogicalOp {
    /// The operator in normal form: `&&` or `||`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogicalOp::And => "&&",
            LogicalOp::Or => "||",
        }
    }
}

/// Comparison operators, `in` and `not in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `in`: membership in a list.
    In,
    /// `not in`: non-membership in a list.
    NotIn,
}

impl CompareOp {
    /// The operator as written in normal form.
    pub fn as_str(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
            CompareOp::In => "in",
            CompareOp::NotIn => "not in",
        }
    }

    /// Whether the operator orders its operands (`<`, `<=`, `>`, `>=`).
    pub fn is_ordering(self) -> bool {
        matches!(
            self,
            CompareOp::Lt | CompareOp::Le | CompareOp::Gt | CompareOp::Ge
        )
    }
}
