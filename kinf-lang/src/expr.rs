//! Checking `when:` expressions: parse and type-check with the grammar crate, map errors onto
//! the YAML scalar that holds the expression.

use kinf_grammar::{Env, TypedExpr};

use crate::check::{Checker, Scope};
use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::path::FieldPath;
use crate::source::Span;
use crate::yaml::Style;

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
    // Offsets inside the expression map onto the file only for single-line plain or quoted
    // scalars without escapes; otherwise the whole value is labelled.
    let base = node.and_then(|n| {
        let exact = match n.style {
            Style::Plain => true,
            Style::Quoted => n.span.len() == text.len() + 2,
            Style::Block => false,
        };
        exact.then(|| (n.span.file, n.content_start()))
    });
    let whole = node.map(|n| n.span);
    let span_of = |start: usize, end: usize| -> Option<Span> {
        match base {
            Some((file, s)) => Some(Span::new(file, s + start, s + end.max(start + 1))),
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
            .with_help_opt(e.help.clone());
            if let Some(s) = span_of(e.span.start, e.span.end) {
                d = d.at(s, "here");
            }
            ck.push(d);
            return None;
        }
    };
    for (tag, start, end) in tag_literals(&expr) {
        if !scope.incomplete && !scope.tags.contains(tag.as_str()) {
            let mut known: Vec<&str> = scope.tags.iter().map(|s| &**s).collect();
            known.sort_unstable();
            let mut d = Diagnostic::new(
                Code::UnknownTag,
                format!("no configured classifier produces tag `{tag}`"),
            )
            .with_path(path.clone())
            .with_help(crate::suggest::help_for(
                &tag,
                known.iter().copied(),
                "tags produced",
            ));
            if let Some(s) = span_of(start, end) {
                d = d.at(s, "never set");
            }
            ck.push(d);
        }
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
                .with_help_opt(help);
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
