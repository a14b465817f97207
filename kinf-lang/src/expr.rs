//! Checking `when:` expressions: parse and type-check with the grammar crate, map errors onto
//! the YAML scalar that holds the expression.

use kinf_grammar::{Env, TypedExpr};

use crate::check::{Checker, Scope};
use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::path::FieldPath;
use crate::source::Span;

/// Parses and type-checks `text` (the value at `path` of document `doc`) in `env`.
/// Reports every error; returns the typed expression when there is none.
pub(crate) fn check(
    ck: &mut Checker<'_>,
    doc: usize,
    path: &FieldPath,
    text: &str,
    env: &Env,
    scope: &Scope,
) -> Option<TypedExpr> {
    let node = ck.bundle.node(doc, path);
    // Offsets inside the expression map onto the file wherever the scalar's source can be
    // aligned with its value (plain, quoted, block scalars; escapes other than `\"`, `\\`
    // and `''` are not followed); otherwise the whole value is labelled, without its trailing
    // line breaks.
    let raw = node.and_then(|n| {
        let file = ck.sources.get(n.span.file)?;
        Some((n.span, file.text.get(n.span.start..n.span.end)?))
    });
    let offsets = raw.and_then(|(span, raw)| {
        let map = align(raw, text)?;
        Some((span, map))
    });
    let whole = raw.map(|(span, raw)| {
        let kept = raw.trim_end_matches([' ', '\t', '\r', '\n']).len().max(1);
        Span::new(span.file, span.start, span.start + kept.min(span.len()))
    });
    let label = ck.resource_label(doc);
    let span_of = |start: usize, end: usize| -> Option<Span> {
        match &offsets {
            Some((span, map)) => {
                // An error at the end of the text (`a &&`, or an empty expression) is labelled
                // at the end of the value: one character wide, never nothing.
                let start = start.min(text.len());
                let Some(&from) = map.get(start) else {
                    return whole;
                };
                let to = map
                    .get(end.clamp(start, text.len()))
                    .copied()
                    .unwrap_or(from);
                Some(Span::new(
                    span.file,
                    span.start + from,
                    span.start + to.max(from + 1),
                ))
            }
            None => whole,
        }
    };
    let expr = match kinf_grammar::parse_expr(text) {
        Ok(e) => e,
        Err(e) => {
            let mut d = Diagnostic::new(
                Code::ExprSyntax,
                format!("invalid `when` expression: {}", e.message),
            )
            .with_path(path.clone())
            .with_help_opt(e.help.clone().or_else(|| operator_help(text, e.span.start)))
            .with_resource_opt(label.clone());
            if let Some(s) = span_of(e.span.start, e.span.end) {
                d = d.at(s, "here");
            }
            ck.push(d);
            return None;
        }
    };
    for (tag, start, end) in tag_literals(&expr) {
        if !scope.incomplete && !scope.tags.contains(tag.as_str()) {
            let mut d = Diagnostic::new(
                Code::UnknownTag,
                format!("no configured classifier produces tag `{tag}`"),
            )
            .with_path(path.clone())
            .with_help(scope.unknown_tag_help(&tag))
            .with_resource_opt(label.clone());
            if let Some(s) = span_of(start, end) {
                d = d.at(s, "never set");
            }
            ck.push(d);
        }
    }
    let mut out_of_domain = false;
    for m in literals_out_of_domain(&expr, env, scope) {
        // Values outside an enum or a range are errors, and the expression is not compiled;
        // names the targeted pools lack are warnings (the pools may gain them).
        out_of_domain |= m.code.severity() == crate::diagnostic::Severity::Error;
        let mut d = Diagnostic::new(m.code, m.message)
            .with_path(path.clone())
            .with_help_opt(m.help)
            .with_resource_opt(label.clone());
        if let Some(s) = span_of(m.start, m.end) {
            let label = match m.code {
                Code::UnknownWhenName => "no such name",
                _ => "never this value",
            };
            d = d.at(s, label);
        }
        ck.push(d);
    }
    if out_of_domain {
        return None;
    }
    match kinf_grammar::typecheck_owned(expr, env) {
        Ok(t) => Some(t),
        Err(errors) => {
            for e in errors {
                let help = endpoint_var_help(text, &e, env).or_else(|| e.help.clone());
                let mut d = Diagnostic::new(
                    Code::ExprType,
                    format!("`when` expression does not type-check: {}", e.message),
                )
                .with_path(path.clone())
                .with_help_opt(help)
                .with_resource_opt(label.clone());
                if let Some(s) = span_of(e.span.start, e.span.end) {
                    d = d.at(s, "here");
                }
                ck.push(d);
            }
            None
        }
    }
}

/// Help for a candidate measure (`kvCacheUsage`, ...) used in a request condition, where only
/// request variables exist.
fn endpoint_var_help(text: &str, e: &kinf_grammar::TypeError, env: &Env) -> Option<String> {
    if e.kind != kinf_grammar::expr::TypeErrorKind::UnknownVariable {
        return None;
    }
    let name = text.get(e.span.start..e.span.end)?;
    let is_endpoint_var = crate::env::ENDPOINT_VARS.iter().any(|(n, _)| *n == name);
    (is_endpoint_var && env.lookup_var(name).is_none()).then(|| {
        format!("`{name}` describes a candidate endpoint, not the request: test it in an exclude filter's `drop` instead")
    })
}

/// The values a string variable can take, when they are a closed set (the spellings of the
/// resources' own enums).
fn string_domain(var: &str) -> Option<Vec<&'static str>> {
    match var {
        "qos" => Some(kinf_policy::Qos::ALL.iter().map(|q| q.as_str()).collect()),
        "backend" => Some(
            kinf_policy::BackendType::ALL
                .iter()
                .map(|b| b.as_str())
                .collect(),
        ),
        _ => None,
    }
}

/// The range a number variable takes: `(min, max, what it is)`.
fn number_domain(var: &str) -> Option<(f64, f64, &'static str)> {
    match var {
        "kvCacheUsage" => Some((
            0.0,
            1.0,
            "a fraction from 0 to 1 (write `0.9` or `90%` for 90 %)",
        )),
        "promptTokens" | "maxTokens" | "messages" | "cachedPromptTokens" => {
            Some((0.0, f64::INFINITY, "a count, never negative"))
        }
        "queuedPrompts" | "runningPrompts" => {
            Some((0.0, f64::INFINITY, "an average count, never negative"))
        }
        _ => None,
    }
}

/// A literal compared with a variable that never takes its value.
struct OutOfDomain {
    code: Code,
    message: String,
    help: Option<String>,
    start: usize,
    end: usize,
}

/// Literals compared with a variable (`==`, `!=`, `<`, …, `in`, `not in`, either side) that the
/// variable never takes: `qos == "Batch"`, `backend == "local"`, `kvCacheUsage > 1.5`,
/// `promptTokens < 0`. Such a comparison is always true or always false, so it is an error in
/// the policy, as the structured forms of the same tests are. Also names that the targeted
/// pools do not have, compared (`==`, `!=`, `in`, `not in`) with `model`, `servedModel` or
/// `destination`: `model == "gpt-4o-mni"` (a warning, KINF0509). Only variables of `env`:
/// another context's (`backend` in a request condition) are the type check's, as unknown.
fn literals_out_of_domain(expr: &kinf_grammar::Expr, env: &Env, scope: &Scope) -> Vec<OutOfDomain> {
    use kinf_grammar::expr::{CompareOp, ExprKind, Literal};
    let mut out = Vec::new();
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match &e.kind {
            ExprKind::Compare { op, lhs, rhs } => {
                let pair = match (&lhs.kind, &rhs.kind) {
                    (ExprKind::Var(v), _) => Some((v, &**rhs)),
                    (_, ExprKind::Var(v)) => Some((v, &**lhs)),
                    _ => None,
                };
                // A variable of another context (`backend` in a request condition) is reported
                // by the type check as unknown here, with where to test it: not its values.
                let pair = pair.filter(|(var, _)| env.lookup_var(var).is_some());
                if let Some((var, other)) = pair {
                    let literals: Vec<&kinf_grammar::Expr> = match &other.kind {
                        ExprKind::List(items) => items.iter().collect(),
                        _ => vec![other],
                    };
                    for lit in literals {
                        let (start, end) = (lit.span.start, lit.span.end);
                        match &lit.kind {
                            ExprKind::Literal(Literal::Str(s)) => {
                                if let Some(domain) = string_domain(var)
                                    && !domain.contains(&s.as_str())
                                {
                                    out.push(OutOfDomain {
                                        code: Code::UnknownEnumValue,
                                        message: format!(
                                            "`{var}` is never \"{s}\": it is one of {}",
                                            domain
                                                .iter()
                                                .map(|d| format!("\"{d}\""))
                                                .collect::<Vec<_>>()
                                                .join(", ")
                                        ),
                                        help: Some(crate::suggest::help_for(
                                            s,
                                            domain.iter().copied(),
                                            "values",
                                        )),
                                        start,
                                        end,
                                    });
                                }
                                let by_name = matches!(
                                    op,
                                    CompareOp::Eq
                                        | CompareOp::Ne
                                        | CompareOp::In
                                        | CompareOp::NotIn
                                );
                                if by_name
                                    && let Some((message, help)) =
                                        crate::when_names::unknown_name(var, s, scope)
                                {
                                    out.push(OutOfDomain {
                                        code: Code::UnknownWhenName,
                                        message,
                                        help: Some(help),
                                        start,
                                        end,
                                    });
                                }
                            }
                            ExprKind::Literal(Literal::Int(_) | Literal::Float(_)) => {
                                let value = match &lit.kind {
                                    ExprKind::Literal(Literal::Int(i)) => *i as f64,
                                    ExprKind::Literal(Literal::Float(f)) => *f,
                                    _ => continue,
                                };
                                if let Some((min, max, what)) = number_domain(var)
                                    && !(min..=max).contains(&value)
                                {
                                    out.push(OutOfDomain {
                                        code: Code::OutOfRange,
                                        message: format!(
                                            "`{var}` is {what}: compared with {value} the test \
                                             never changes"
                                        ),
                                        help: None,
                                        start,
                                        end,
                                    });
                                }
                            }
                            _ => {}
                        }
                    }
                }
                stack.push(lhs);
                stack.push(rhs);
            }
            ExprKind::Call { args, .. } => stack.extend(args.iter()),
            ExprKind::List(items) => stack.extend(items.iter()),
            ExprKind::Not(inner) => stack.push(inner),
            ExprKind::Logical { operands, .. } => stack.extend(operands.iter()),
            ExprKind::Literal(_) | ExprKind::Var(_) => {}
        }
    }
    out.sort_by_key(|m| m.start);
    out
}

/// String literals passed to `tag(...)`, with their spans (for the unknown-tag warning).
fn tag_literals(expr: &kinf_grammar::Expr) -> Vec<(String, usize, usize)> {
    use kinf_grammar::expr::{ExprKind, Literal};
    let mut out = Vec::new();
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match &e.kind {
            ExprKind::Call { name, args } => {
                if name.name == "tag"
                    && let [arg] = args.as_slice()
                    && let ExprKind::Literal(Literal::Str(s)) = &arg.kind
                {
                    out.push((s.clone(), arg.span.start, arg.span.end));
                }
                stack.extend(args.iter());
            }
            ExprKind::List(items) => stack.extend(items.iter()),
            ExprKind::Not(inner) => stack.push(inner),
            ExprKind::Logical { operands, .. } => stack.extend(operands.iter()),
            ExprKind::Compare { lhs, rhs, .. } => {
                stack.push(lhs);
                stack.push(rhs);
            }
            ExprKind::Literal(_) | ExprKind::Var(_) => {}
        }
    }
    out.sort_by_key(|t| t.1);
    out
}

/// Maps each byte offset of a scalar's `value` (and its end) to a byte offset in `raw`, the
/// scalar's source text, by walking both: a value character matches the same character in the
/// source, and the source may skip what YAML removes on the way to the value: the quotes, a
/// block scalar's header (`|`, `>`, chomping and indentation indicators, before its first
/// line break), indentation and line breaks (a folded line break becomes a space), and an
/// escape's backslash. `None` when the two cannot be aligned that way (another escape).
fn align(raw: &str, value: &str) -> Option<Vec<usize>> {
    let mut map = Vec::with_capacity(value.len() + 1);
    let mut chars = raw.char_indices().peekable();
    let mut in_header = true;
    let mut last_end = 0;
    for c in value.chars() {
        loop {
            let (at, r) = chars.next()?;
            if r == c {
                map.extend((0..c.len_utf8()).map(|k| at + k));
                last_end = at + r.len_utf8();
                in_header = false;
                break;
            }
            let header = in_header && matches!(r, '|' | '>' | '+' | '-' | '0'..='9');
            if r == '\n' {
                in_header = false;
            }
            if !(header || matches!(r, ' ' | '\t' | '\r' | '\n' | '\\' | '"' | '\'')) {
                return None;
            }
        }
    }
    // What is left of the source is layout: trailing line breaks, indentation, the quote.
    if chars.any(|(_, r)| !matches!(r, ' ' | '\t' | '\r' | '\n' | '"' | '\'')) {
        return None;
    }
    map.push(last_end);
    Some(map)
}

/// Help for a parse error at `at` that is a doubled or reversed comparison operator
/// (`>>`, `><`, `=<`, `=>`, `<<`, `!!`), which the grammar reports as an unexpected token.
fn operator_help(text: &str, at: usize) -> Option<String> {
    let around = |k: usize| text.get(at.saturating_sub(k)..(at + 2 - k).min(text.len()));
    let pairs: [(&str, &str); 6] = [
        (">>", "`>` or `>=`"),
        ("<<", "`<` or `<=`"),
        ("><", "`>`, `<` or `!=`"),
        ("<>", "`!=`"),
        ("=>", "`>=`"),
        ("=<", "`<=`"),
    ];
    (0..=1).find_map(|k| {
        let op = around(k)?;
        pairs
            .iter()
            .find(|(p, _)| *p == op)
            .map(|(p, fix)| format!("`{p}` is not an operator: write {fix}"))
    })
}

#[cfg(test)]
mod tests {
    use super::{align, operator_help};

    /// The source text each value byte range maps to.
    fn at<'r>(raw: &'r str, value: &str, from: usize, to: usize) -> Option<&'r str> {
        let map = align(raw, value)?;
        raw.get(*map.get(from)?..*map.get(to)?)
    }

    #[test]
    fn values_align_with_their_source_through_layout_and_simple_escapes() {
        // Folded block: the line break between the lines became a space.
        let raw = ">\n    a > 1 &&\n    b >> 3\n  ";
        let value = "a > 1 && b >> 3\n";
        assert_eq!(at(raw, value, 11, 13), Some(">>"));
        // Literal block with a chomping and an indentation indicator.
        assert_eq!(
            at("|2-\n    x\n     && y", "  x\n   && y", 7, 9),
            Some("&&")
        );
        // Escaped quotes and backslashes, and `''` in a single-quoted string.
        assert_eq!(
            at(r#""t == \"a\" && z""#, r#"t == "a" && z"#, 9, 11),
            Some("&&")
        );
        assert_eq!(at(r#""a\\b c""#, r"a\b c", 4, 5), Some("c"));
        assert_eq!(at("'it''s' x", "it's' x", 6, 7), Some("x"));
        // Multi-byte characters keep their bytes together.
        assert_eq!(at("'é > x'", "é > x", 5, 6), Some("x"));
    }

    #[test]
    fn values_that_need_another_escape_do_not_align() {
        assert!(align(r#""a\tb""#, "a\tb").is_none());
        assert!(align(r#""\u00e9""#, "é").is_none());
        // Source left over that is not layout.
        assert!(align("'ab' c", "ab").is_none());
    }

    #[test]
    fn doubled_and_reversed_operators_get_a_fix() {
        assert_eq!(
            operator_help("a >> 3", 3).as_deref(),
            Some("`>>` is not an operator: write `>` or `>=`")
        );
        assert_eq!(
            operator_help("a => 3", 3).as_deref(),
            Some("`=>` is not an operator: write `>=`")
        );
        assert_eq!(operator_help("a > > 3", 4), None);
    }
}
