//! Text → [`Expr`]: the pest grammar, the tree builder and the wording of
//! syntax errors.

use pest::Parser;
use pest::iterators::Pair;
use pest_derive::Parser;

use super::ast::{CompareOp, Expr, ExprKind, Ident, Literal, LogicalOp};
use crate::decimal;
use crate::duration::parse_duration;
use crate::error::{Failure, Span, SyntaxError, found_at};

#[derive(Parser)]
#[grammar = "expr/expr.pest"]
struct ExprParser;

/// Most parentheses and brackets open at once. The parser recurses on
/// nesting: at this limit it needs about 200 KiB of stack in release builds
/// (about 900 KiB unoptimized).
pub const MAX_NESTING: usize = 32;

/// Most nested operators (`!`, comparisons, `&&`/`||` groups, calls, lists)
/// in one tree.
pub const MAX_DEPTH: usize = 128;

/// Parses a condition such as `promptTokens > 8000 && tag("pii-detected")`.
///
/// The result is untyped; check it with [`typecheck`](super::typecheck).
/// Errors say what was expected in words ("expected an operand after `&&`")
/// and point at the byte span where parsing stopped.
pub fn parse_expr(input: &str) -> Result<Expr, SyntaxError> {
    match super::parse_fast::parse(input) {
        Some(e) => Ok(e),
        None => parse_expr_reference(input),
    }
}

/// [`parse_expr`] with the pest grammar only: the reference the hand-written fast path (taken
/// for well-formed input) is tested against. Same trees, same errors.
pub fn parse_expr_reference(input: &str) -> Result<Expr, SyntaxError> {
    if input.trim().is_empty() {
        return Err(
            SyntaxError::new(Span::new(0, input.len()), "empty condition")
                .with_help("write a condition such as `promptTokens > 8000`"),
        );
    }
    let scan = Scan::of(input);
    if let Some(quote) = scan.unclosed_string {
        return Err(
            SyntaxError::new(Span::new(quote, input.len()), "unclosed string")
                .with_help("add a closing `\"`"),
        );
    }
    if let Some(pos) = scan.too_deep {
        return Err(too_deep(Span::new(pos, pos + 1)));
    }
    let mut pairs = ExprParser::parse(Rule::condition, input).map_err(|e| pest_error(&e, input))?;
    let root = pairs
        .next()
        .and_then(|condition| condition.into_inner().next())
        .ok_or_else(|| SyntaxError::new(Span::new(0, input.len()), "empty condition"))?;
    build(root, 0)
}

fn too_deep(span: Span) -> SyntaxError {
    SyntaxError::new(span, "the condition is nested too deeply").with_help(format!(
        "split it up; at most {MAX_NESTING} levels of brackets and {MAX_DEPTH} nested operators are allowed"
    ))
}

/// Builds the node for `pair`; `depth` counts the operator nodes above it.
fn build(pair: Pair<'_, Rule>, depth: usize) -> Result<Expr, SyntaxError> {
    let span = Span::of(pair.as_span());
    if depth > MAX_DEPTH {
        return Err(too_deep(span));
    }
    let text = pair.as_str();
    let kind = match pair.as_rule() {
        Rule::disjunction => return logical(pair, LogicalOp::Or, depth),
        Rule::conjunction => return logical(pair, LogicalOp::And, depth),
        Rule::comparison => return comparison(pair, depth),
        Rule::unary => return unary(pair, depth),
        Rule::paren => {
            let inner = pair.into_inner().next();
            return inner.map_or_else(|| Err(unexpected(span)), |p| build(p, depth));
        }
        Rule::call => {
            let mut inner = pair.into_inner();
            let name = inner.next().ok_or_else(|| unexpected(span))?;
            let name = Ident {
                name: name.as_str().to_owned(),
                span: Span::of(name.as_span()),
            };
            let args = inner
                .filter(|p| p.as_rule() == Rule::disjunction)
                .map(|p| build(p, depth + 1))
                .collect::<Result<_, _>>()?;
            ExprKind::Call { name, args }
        }
        Rule::list => ExprKind::List(
            pair.into_inner()
                .filter(|p| !matches!(p.as_rule(), Rule::comma | Rule::rbracket))
                .map(|p| build(p, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Rule::string => {
            let body = pair.into_inner().next().ok_or_else(|| unexpected(span))?;
            ExprKind::Literal(Literal::Str(unescape(
                body.as_str(),
                body.as_span().start(),
            )?))
        }
        Rule::boolean => ExprKind::Literal(Literal::Bool(text == "true")),
        Rule::number => ExprKind::Literal(number(text, span)?),
        Rule::ident => ExprKind::Var(text.to_owned()),
        _ => return Err(unexpected(span)),
    };
    Ok(Expr::new(kind, span))
}

fn unexpected(span: Span) -> SyntaxError {
    SyntaxError::new(span, "unexpected syntax")
}

fn logical(pair: Pair<'_, Rule>, op: LogicalOp, depth: usize) -> Result<Expr, SyntaxError> {
    let span = Span::of(pair.as_span());
    let operands: Vec<Pair<'_, Rule>> = pair
        .into_inner()
        .filter(|p| !matches!(p.as_rule(), Rule::or_op | Rule::and_op))
        .collect();
    if operands.len() == 1 {
        return operands
            .into_iter()
            .next()
            .map_or_else(|| Err(unexpected(span)), |p| build(p, depth));
    }
    let operands = operands
        .into_iter()
        .map(|p| build(p, depth + 1))
        .collect::<Result<_, _>>()?;
    Ok(Expr::new(ExprKind::Logical { op, operands }, span))
}

fn comparison(pair: Pair<'_, Rule>, depth: usize) -> Result<Expr, SyntaxError> {
    let span = Span::of(pair.as_span());
    let mut inner = pair.into_inner();
    let lhs = inner.next().ok_or_else(|| unexpected(span))?;
    let Some(op) = inner.next() else {
        return build(lhs, depth);
    };
    let rhs = inner.next().ok_or_else(|| unexpected(span))?;
    if let Some(second) = inner.next() {
        return Err(SyntaxError::new(
            Span::of(second.as_span()),
            format!(
                "comparisons cannot be chained: `{}` follows `{}`",
                second.as_str(),
                op.as_str()
            ),
        )
        .with_help("join two comparisons with `&&`, e.g. `a < b && b < c`, or add parentheses"));
    }
    let op = match (op.as_rule(), op.as_str()) {
        (Rule::in_op, _) => CompareOp::In,
        (Rule::not_in_op, _) => CompareOp::NotIn,
        (_, "==") => CompareOp::Eq,
        (_, "!=") => CompareOp::Ne,
        (_, "<") => CompareOp::Lt,
        (_, "<=") => CompareOp::Le,
        (_, ">") => CompareOp::Gt,
        (_, ">=") => CompareOp::Ge,
        _ => return Err(unexpected(Span::of(op.as_span()))),
    };
    let lhs = Box::new(build(lhs, depth + 1)?);
    let rhs = Box::new(build(rhs, depth + 1)?);
    Ok(Expr::new(ExprKind::Compare { op, lhs, rhs }, span))
}

fn unary(pair: Pair<'_, Rule>, depth: usize) -> Result<Expr, SyntaxError> {
    let span = Span::of(pair.as_span());
    let mut nots = Vec::new();
    let mut operand = None;
    for p in pair.into_inner() {
        if p.as_rule() == Rule::not_op {
            nots.push(p.as_span().start());
        } else {
            operand = Some(p);
        }
    }
    if depth + nots.len() > MAX_DEPTH {
        return Err(too_deep(span));
    }
    let operand = operand.ok_or_else(|| unexpected(span))?;
    let mut expr = build(operand, depth + nots.len())?;
    for start in nots.into_iter().rev() {
        expr = Expr::new(ExprKind::Not(Box::new(expr)), Span::new(start, span.end));
    }
    Ok(expr)
}

/// Classifies a number-like token: integer, float, percentage or duration.
pub(super) fn number(text: &str, span: Span) -> Result<Literal, SyntaxError> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(body) => (true, body),
        None => (false, text),
    };
    let is_decimal = |s: &str| {
        let (int, frac) = s.split_once('.').unwrap_or((s, "0"));
        !int.is_empty()
            && !frac.is_empty()
            && int.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
    };
    let sign = if negative { -1.0 } else { 1.0 };
    let float = |digits: &str, shift: i32| {
        decimal::to_f64(digits, shift)
            .filter(|f| f.is_finite())
            .map(|f| Literal::Float(sign * f))
            .ok_or_else(|| SyntaxError::new(span, format!("number `{text}` is too large")))
    };
    if body.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<i64>().map(Literal::Int).map_err(|_| {
            SyntaxError::new(span, format!("integer `{text}` is out of range")).with_help(format!(
                "integers are between {} and {}; write a float such as `{text}.0` for larger numbers",
                i64::MIN,
                i64::MAX
            ))
        });
    }
    if let Some(percent) = body.strip_suffix('%').filter(|p| is_decimal(p)) {
        return float(percent, -2);
    }
    if is_decimal(body) {
        return float(body, 0);
    }
    if let Some((mantissa, exponent)) = body.split_once(['e', 'E'])
        && is_decimal(mantissa)
        && !exponent.is_empty()
        && exponent
            .trim_start_matches(['-', '+'])
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        return Err(
            SyntaxError::new(span, format!("exponent notation `{text}` is not supported"))
                .with_help("write the number out in full, e.g. `100000` or `0.001`"),
        );
    }
    if body.bytes().any(|b| b.is_ascii_alphabetic()) {
        return parse_duration(text)
            .map(Literal::Duration)
            .map_err(|e| e.shifted(span.start));
    }
    let help = if body.contains('_') {
        "digit separators are not supported; write e.g. `1000`"
    } else {
        "write an integer (`8000`), a float (`0.5`), a percentage (`70%`) or a duration (`2s`)"
    };
    Err(SyntaxError::new(span, format!("invalid number `{text}`")).with_help(help))
}

const ESCAPES_HELP: &str =
    r#"valid escapes are `\"`, `\\`, `\n`, `\r`, `\t` and `\u{…}` (1 to 6 hex digits)"#;

/// Resolves the escapes of a string body that starts at byte `offset`.
pub(super) fn unescape(body: &str, offset: usize) -> Result<String, SyntaxError> {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some((_, escape)) = chars.next() else {
            return Err(SyntaxError::new(
                Span::new(offset + i, offset + i + 1),
                "unfinished escape",
            )
            .with_help(ESCAPES_HELP));
        };
        let resolved = match escape {
            '"' => '"',
            '\\' => '\\',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let rest = body.get(i + 2..).unwrap_or("");
                let hex = rest
                    .strip_prefix('{')
                    .and_then(|r| r.split_once('}'))
                    .map(|(hex, _)| hex)
                    .filter(|hex| (1..=6).contains(&hex.len()));
                let value = hex
                    .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                    .and_then(char::from_u32);
                match (hex, value) {
                    (Some(hex), Some(value)) => {
                        // Skip `{`, the digits and `}` (all ASCII).
                        for _ in 0..hex.len() + 2 {
                            chars.next();
                        }
                        value
                    }
                    _ => {
                        let end = rest.find('}').map_or(i + 2, |j| i + 2 + j + 1);
                        return Err(SyntaxError::new(
                            Span::new(offset + i, offset + end),
                            "invalid unicode escape",
                        )
                        .with_help("write a unicode scalar value in hex, e.g. `\\u{e9}`"));
                    }
                }
            }
            other => {
                return Err(SyntaxError::new(
                    Span::new(offset + i, offset + i + 1 + other.len_utf8()),
                    format!("unknown escape `\\{other}`"),
                )
                .with_help(ESCAPES_HELP));
            }
        };
        out.push(resolved);
    }
    Ok(out)
}

/// A lexical pre-pass: strings, bracket nesting.
struct Scan {
    /// Offset of the `"` of a string that is never closed.
    unclosed_string: Option<usize>,
    /// Offset of the first bracket beyond [`MAX_NESTING`].
    too_deep: Option<usize>,
    /// Brackets still open at the end, innermost last.
    open: Vec<(char, usize)>,
}

impl Scan {
    fn of(input: &str) -> Scan {
        let mut scan = Scan {
            unclosed_string: None,
            too_deep: None,
            open: Vec::new(),
        };
        let mut chars = input.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    scan.unclosed_string = Some(i);
                    while let Some((_, c)) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '"' => {
                                scan.unclosed_string = None;
                                break;
                            }
                            _ => {}
                        }
                    }
                }
                '(' | '[' => {
                    scan.open.push((c, i));
                    if scan.open.len() > MAX_NESTING && scan.too_deep.is_none() {
                        scan.too_deep = Some(i);
                    }
                }
                ')' | ']' => {
                    scan.open.pop();
                }
                _ => {}
            }
        }
        scan
    }
}

/// Whether the rule stands for an operand.
fn is_operand(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::condition
            | Rule::disjunction
            | Rule::conjunction
            | Rule::comparison
            | Rule::unary
            | Rule::not_op
            | Rule::paren
            | Rule::call
            | Rule::ident
            | Rule::list
            | Rule::string
            | Rule::boolean
            | Rule::number
    )
}

/// Whether the rule stands for a literal (what a list holds).
fn is_literal(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::list | Rule::string | Rule::boolean | Rule::number
    )
}

fn describe(rule: Rule, literals_only: bool) -> &'static str {
    match rule {
        _ if literals_only && is_literal(rule) => "a literal",
        _ if is_operand(rule) => "an operand",
        Rule::rparen => "`)`",
        Rule::rbracket => "`]`",
        Rule::comma => "`,`",
        Rule::EOI => "end of input",
        _ => "an operator",
    }
}

/// The operator that ends `input[..pos]`, if any.
fn operator_before(input: &str, pos: usize) -> Option<&'static str> {
    let before = input.get(..pos)?.trim_end();
    let symbol = ["&&", "||", "==", "!=", "<=", ">=", "<", ">", "!"]
        .into_iter()
        .find(|op| before.ends_with(op));
    symbol.or_else(|| {
        ["and", "or", "not", "in"].into_iter().find(|kw| {
            before.strip_suffix(kw).is_some_and(|rest| {
                !rest
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
    })
}

fn pest_error(err: &pest::error::Error<Rule>, input: &str) -> SyntaxError {
    let failure = Failure::from_pest(err);
    if failure.expected.is_empty() {
        // pest's own guard stopped it (stack or call limit).
        return too_deep(Span::new(0, input.len()));
    }
    let (span, found) = found_at(input, failure.pos);
    let at_end = input
        .get(failure.pos..)
        .is_some_and(|rest| rest.trim().is_empty());
    let expects = |rule: Rule| failure.expected.contains(&rule);

    if at_end && (expects(Rule::rparen) || expects(Rule::rbracket)) {
        let open = Scan::of(input).open.last().copied();
        if let Some((bracket, pos)) = open {
            let close = if bracket == '(' { ')' } else { ']' };
            return SyntaxError::new(Span::new(pos, pos + 1), format!("unclosed `{bracket}`"))
                .with_help(format!("add a `{close}` to close it"));
        }
    }

    let expects_operand = failure.expected.iter().any(|r| is_operand(*r));
    let literals_only = expects_operand
        && failure
            .expected
            .iter()
            .all(|r| is_literal(*r) || !is_operand(*r));
    let message = match operator_before(input, failure.pos) {
        Some(op) if expects_operand && !literals_only => {
            format!("expected an operand after `{op}`, found {found}")
        }
        _ => format!(
            "expected {}, found {found}",
            failure.expected_words(|r| describe(r, literals_only))
        ),
    };
    let error = SyntaxError::new(span, message);
    let token = input.get(span.range()).unwrap_or("");
    let help = match token.chars().next() {
        _ if token == "=" => Some("use `==` to test equality".to_owned()),
        _ if token == "&" => Some("use `&&` (or `and`) to combine conditions".to_owned()),
        _ if token == "|" => Some("use `||` (or `or`) to combine conditions".to_owned()),
        Some('\'') => Some("write strings in double quotes, e.g. `\"pii-detected\"`".to_owned()),
        Some('.') => Some("write a digit before the point, e.g. `0.5`".to_owned()),
        Some(')')
            if Scan::of(input.get(..failure.pos).unwrap_or(""))
                .open
                .is_empty() =>
        {
            Some("this `)` closes no `(`; remove it".to_owned())
        }
        _ if expects_operand && matches!(token, "and" | "or" | "not" | "in") => Some(format!(
            "`{token}` is a reserved word; it cannot name a variable"
        )),
        Some(c) if literals_only && (c.is_ascii_alphabetic() || c == '_') => Some(format!(
            "list elements are literals; write text in double quotes, e.g. `\"{token}\"`"
        )),
        _ => None,
    };
    match help {
        Some(help) => error.with_help(help),
        None => error,
    }
}
