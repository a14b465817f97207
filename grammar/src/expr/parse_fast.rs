//! A hand-written parser for well-formed conditions, about 20 times faster than the pest
//! grammar. It builds the tree the pest path builds, spans included (comparisons and `&&`/`||`
//! chains end after the whitespace that follows their last operand, as pest's rules do). Any
//! input it does not fully understand, and every invalid one, gives `None`: the pest path then
//! parses it and words the error.

use super::ast::{CompareOp, Expr, ExprKind, Ident, Literal, LogicalOp};
use super::parse::{MAX_DEPTH, MAX_NESTING, number, unescape};
use crate::error::Span;

/// The tree of `input`, or `None` when the pest path must decide.
pub(super) fn parse(input: &str) -> Option<Expr> {
    let mut p = Fast {
        text: input,
        b: input.as_bytes(),
        pos: 0,
        nesting: 0,
    };
    p.ws();
    let e = p.disjunction()?;
    p.ws();
    (p.pos == p.b.len() && within_depth(&e, 0)).then_some(e)
}

/// Whether no node is deeper than [`MAX_DEPTH`], counted as the pest path's tree builder does.
fn within_depth(e: &Expr, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    match &e.kind {
        ExprKind::Literal(_) | ExprKind::Var(_) => true,
        ExprKind::Not(inner) => within_depth(inner, depth + 1),
        ExprKind::List(items) => items.iter().all(|x| within_depth(x, depth + 1)),
        ExprKind::Call { args, .. } => args.iter().all(|x| within_depth(x, depth + 1)),
        ExprKind::Logical { operands, .. } => operands.iter().all(|x| within_depth(x, depth + 1)),
        ExprKind::Compare { lhs, rhs, .. } => {
            within_depth(lhs, depth + 1) && within_depth(rhs, depth + 1)
        }
    }
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

const KEYWORDS: [&str; 6] = ["and", "or", "not", "in", "true", "false"];

struct Fast<'a> {
    text: &'a str,
    b: &'a [u8],
    pos: usize,
    /// Brackets open at the cursor.
    nesting: usize,
}

impl Fast<'_> {
    fn at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.at(self.pos), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.pos += 1;
        }
    }

    /// Whether the keyword `kw` (not followed by an identifier character) is at `i`.
    fn keyword_at(&self, i: usize, kw: &str) -> bool {
        self.b[i..].starts_with(kw.as_bytes()) && !self.at(i + kw.len()).is_some_and(is_ident_char)
    }

    /// Length of the `||`/`or` (or `&&`/`and`) operator at the cursor.
    fn logical_op(&self, op: LogicalOp) -> Option<usize> {
        let (sym, kw) = match op {
            LogicalOp::Or => ("||", "or"),
            LogicalOp::And => ("&&", "and"),
        };
        if self.b[self.pos..].starts_with(sym.as_bytes()) {
            Some(2)
        } else if self.keyword_at(self.pos, kw) {
            Some(kw.len())
        } else {
            None
        }
    }

    fn disjunction(&mut self) -> Option<Expr> {
        self.chain(LogicalOp::Or)
    }

    /// `a || b || ...` (or `a && b && ...`): one node for two or more operands.
    ///
    /// Where the cursor ends is where pest's rule ends: after the whitespace that follows a
    /// lone operand (the skip between an operand and an empty repetition is kept), but right
    /// after the last operand of a chain (a failed repetition gives its skip back).
    fn chain(&mut self, op: LogicalOp) -> Option<Expr> {
        let start = self.pos;
        let operand = |p: &mut Self| match op {
            LogicalOp::Or => p.chain(LogicalOp::And),
            LogicalOp::And => p.comparison(),
        };
        let first = operand(self)?;
        self.ws();
        let Some(mut len) = self.logical_op(op) else {
            return Some(first);
        };
        let mut operands = vec![first];
        loop {
            self.pos += len;
            self.ws();
            operands.push(operand(self)?);
            let end = self.pos;
            self.ws();
            match self.logical_op(op) {
                Some(l) => len = l,
                None => {
                    self.pos = end;
                    break;
                }
            }
        }
        Some(Expr::new(
            ExprKind::Logical { op, operands },
            Span::new(start, self.pos),
        ))
    }

    /// The comparison operator at the cursor and its length.
    fn compare_op(&self) -> Option<(CompareOp, usize)> {
        let rest = &self.b[self.pos..];
        let two = |s: &[u8]| rest.starts_with(s);
        let op = if two(b"==") {
            (CompareOp::Eq, 2)
        } else if two(b"!=") {
            (CompareOp::Ne, 2)
        } else if two(b"<=") {
            (CompareOp::Le, 2)
        } else if two(b">=") {
            (CompareOp::Ge, 2)
        } else if two(b"<") {
            (CompareOp::Lt, 1)
        } else if two(b">") {
            (CompareOp::Gt, 1)
        } else if self.keyword_at(self.pos, "in") {
            (CompareOp::In, 2)
        } else if self.keyword_at(self.pos, "not") {
            let mut i = self.pos + 3;
            while matches!(self.at(i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
                i += 1;
            }
            if !self.keyword_at(i, "in") {
                return None;
            }
            (CompareOp::NotIn, i + 2 - self.pos)
        } else {
            return None;
        };
        Some(op)
    }

    /// `unary (op unary)?`. The cursor ends after the whitespace that follows a lone operand,
    /// right after the right operand of a comparison (as pest's rule does).
    fn comparison(&mut self) -> Option<Expr> {
        let start = self.pos;
        let lhs = self.unary()?;
        self.ws();
        let Some((op, len)) = self.compare_op() else {
            return Some(lhs);
        };
        self.pos += len;
        self.ws();
        let rhs = self.unary()?;
        let end = self.pos;
        self.ws();
        if self.compare_op().is_some() {
            // A chained comparison: the pest path words the error.
            return None;
        }
        self.pos = end;
        Some(Expr::new(
            ExprKind::Compare {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            },
            Span::new(start, end),
        ))
    }

    /// `!`/`not` repeated, then a primary.
    fn unary(&mut self) -> Option<Expr> {
        let mut nots = Vec::new();
        loop {
            if self.at(self.pos) == Some(b'!') && self.at(self.pos + 1) != Some(b'=') {
                nots.push(self.pos);
                self.pos += 1;
            } else if self.keyword_at(self.pos, "not") {
                nots.push(self.pos);
                self.pos += 3;
            } else {
                break;
            }
            if nots.len() > MAX_DEPTH {
                return None;
            }
            self.ws();
        }
        let mut e = self.primary()?;
        let end = self.pos;
        for start in nots.into_iter().rev() {
            e = Expr::new(ExprKind::Not(Box::new(e)), Span::new(start, end));
        }
        Some(e)
    }

    fn open(&mut self) -> Option<()> {
        self.nesting += 1;
        self.pos += 1;
        (self.nesting <= MAX_NESTING).then_some(())
    }

    fn primary(&mut self) -> Option<Expr> {
        match self.at(self.pos)? {
            b'(' => {
                self.open()?;
                self.ws();
                let e = self.disjunction()?;
                self.ws();
                self.close(b')')?;
                Some(e)
            }
            b'[' => self.list(),
            b'"' => self.string(),
            b'-' | b'0'..=b'9' => self.number(),
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos;
                let mut i = start;
                while self.at(i).is_some_and(is_ident_char) {
                    i += 1;
                }
                let word = &self.text[start..i];
                let span = Span::new(start, i);
                match word {
                    "true" | "false" => {
                        self.pos = i;
                        return Some(Expr::new(
                            ExprKind::Literal(Literal::Bool(word == "true")),
                            span,
                        ));
                    }
                    _ if KEYWORDS.contains(&word) => return None,
                    _ => {}
                }
                self.pos = i;
                self.ws();
                if self.at(self.pos) == Some(b'(') {
                    return self.call(Ident {
                        name: word.to_owned(),
                        span,
                    });
                }
                self.pos = i;
                Some(Expr::new(ExprKind::Var(word.to_owned()), span))
            }
            _ => None,
        }
    }

    fn close(&mut self, c: u8) -> Option<()> {
        if self.at(self.pos) != Some(c) {
            return None;
        }
        self.pos += 1;
        self.nesting -= 1;
        Some(())
    }

    /// `name(args)`, the cursor on the `(`.
    fn call(&mut self, name: Ident) -> Option<Expr> {
        let start = name.span.start;
        self.open()?;
        self.ws();
        let mut args = Vec::new();
        while self.at(self.pos) != Some(b')') {
            args.push(self.disjunction()?);
            self.ws();
            match self.at(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                _ => break,
            }
        }
        self.close(b')')?;
        Some(Expr::new(
            ExprKind::Call { name, args },
            Span::new(start, self.pos),
        ))
    }

    /// `[literal, ...]`, the cursor on the `[`.
    fn list(&mut self) -> Option<Expr> {
        let start = self.pos;
        self.open()?;
        self.ws();
        let mut items = Vec::new();
        while self.at(self.pos) != Some(b']') {
            let item = match self.at(self.pos)? {
                b'[' => self.list()?,
                b'"' => self.string()?,
                b'-' | b'0'..=b'9' => self.number()?,
                b't' | b'f' => {
                    let word = if self.keyword_at(self.pos, "true") {
                        "true"
                    } else if self.keyword_at(self.pos, "false") {
                        "false"
                    } else {
                        return None;
                    };
                    let span = Span::new(self.pos, self.pos + word.len());
                    self.pos += word.len();
                    Expr::new(ExprKind::Literal(Literal::Bool(word == "true")), span)
                }
                _ => return None,
            };
            items.push(item);
            self.ws();
            match self.at(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                _ => break,
            }
        }
        self.close(b']')?;
        Some(Expr::new(ExprKind::List(items), Span::new(start, self.pos)))
    }

    /// `"..."`, the cursor on the opening quote.
    fn string(&mut self) -> Option<Expr> {
        let start = self.pos;
        let mut i = start + 1;
        loop {
            match self.at(i)? {
                b'"' => break,
                b'\\' => {
                    // The escaped character may be several bytes long: none of them is `"`.
                    i += 2;
                }
                _ => i += 1,
            }
        }
        let body = self.text.get(start + 1..i)?;
        let value = unescape(body, start + 1).ok()?;
        self.pos = i + 1;
        Some(Expr::new(
            ExprKind::Literal(Literal::Str(value)),
            Span::new(start, self.pos),
        ))
    }

    /// `-`? digit (alphanumeric | `_` | `.` | `%`)*, classified as the pest path does.
    fn number(&mut self) -> Option<Expr> {
        let start = self.pos;
        let mut i = start;
        if self.at(i) == Some(b'-') {
            i += 1;
        }
        if !self.at(i)?.is_ascii_digit() {
            return None;
        }
        while self
            .at(i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'%'))
        {
            i += 1;
        }
        let span = Span::new(start, i);
        let lit = number(&self.text[start..i], span).ok()?;
        self.pos = i;
        Some(Expr::new(ExprKind::Literal(lit), span))
    }
}
