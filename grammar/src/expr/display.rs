//! The normal form of a condition: canonical operators (`&&`, `||`, `!`),
//! single spaces, parentheses only where needed to keep the tree, literals
//! in canonical spelling (`70%` prints as `0.7`, `90s` as `1m30s`).
//! Parsing the normal form gives back an equal tree.

use std::fmt::{self, Write};

use super::ast::{Expr, ExprKind, Literal, LogicalOp};
use crate::duration::format_duration;

/// Binding strength, loosest first.
fn precedence(expr: &Expr) -> u8 {
    match &expr.kind {
        ExprKind::Logical {
            op: LogicalOp::Or, ..
        } => 1,
        ExprKind::Logical {
            op: LogicalOp::And, ..
        } => 2,
        ExprKind::Compare { .. } => 3,
        ExprKind::Not(_) => 4,
        ExprKind::Literal(_) | ExprKind::List(_) | ExprKind::Var(_) | ExprKind::Call { .. } => 5,
    }
}

/// Writes `expr`, in parentheses when it binds looser than `min`.
fn operand(f: &mut fmt::Formatter<'_>, expr: &Expr, min: u8) -> fmt::Result {
    // Direct calls rather than `write!`: the same text without a formatting pass per node
    // (this `Display` uses no formatter flags).
    if precedence(expr) < min {
        f.write_char('(')?;
        fmt::Display::fmt(expr, f)?;
        f.write_char(')')
    } else {
        fmt::Display::fmt(expr, f)
    }
}

fn comma_separated(f: &mut fmt::Formatter<'_>, items: &[Expr]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        fmt::Display::fmt(item, f)?;
    }
    Ok(())
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let own = precedence(self);
        match &self.kind {
            ExprKind::Literal(literal) => fmt::Display::fmt(literal, f),
            ExprKind::Var(name) => f.write_str(name),
            ExprKind::List(items) => {
                f.write_char('[')?;
                comma_separated(f, items)?;
                f.write_char(']')
            }
            ExprKind::Call { name, args } => {
                f.write_str(&name.name)?;
                f.write_char('(')?;
                comma_separated(f, args)?;
                f.write_char(')')
            }
            ExprKind::Not(inner) => {
                f.write_char('!')?;
                operand(f, inner, own)
            }
            ExprKind::Logical { op, operands } => {
                for (i, item) in operands.iter().enumerate() {
                    if i > 0 {
                        f.write_char(' ')?;
                        f.write_str(op.as_str())?;
                        f.write_char(' ')?;
                    }
                    // A nested group of the same operator keeps its parentheses.
                    operand(f, item, own + 1)?;
                }
                Ok(())
            }
            ExprKind::Compare { op, lhs, rhs } => {
                operand(f, lhs, own + 1)?;
                f.write_char(' ')?;
                f.write_str(op.as_str())?;
                f.write_char(' ')?;
                operand(f, rhs, own + 1)
            }
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Int(i) => write!(f, "{i}"),
            Literal::Float(x) => {
                let text = x.to_string();
                f.write_str(&text)?;
                if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                    f.write_str(".0")?;
                }
                Ok(())
            }
            Literal::Str(s) => write_string(f, s),
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Duration(d) => f.write_str(&format_duration(*d)),
        }
    }
}

/// Writes `s` in double quotes with the escapes the parser reads.
fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_char('"')?;
    // Most strings need no escape: one write.
    if !s.chars().any(|c| matches!(c, '"' | '\\') || c.is_control()) {
        f.write_str(s)?;
        return f.write_char('"');
    }
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if c.is_control() => write!(f, "\\u{{{:x}}}", u32::from(c))?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}
