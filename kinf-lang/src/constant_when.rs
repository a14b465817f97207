//! `when:` conditions whose value never changes (KINF0412): a `drop` whose only condition is a
//! `when` that is always true drops every candidate, and a `when` that is always false never
//! holds. A request condition that is always true is left alone: it is the same as no
//! condition.

use kinf_grammar::Expr;
use kinf_grammar::expr::{ExprKind, Literal, LogicalOp};

use crate::check::Checker;
use crate::codes::Code;
use crate::path::{FieldPath, Seg};

/// The value of `e` when it depends on neither the request nor the candidate: `true`, `false`,
/// and `!`, `&&` and `||` of such values; one operand is enough when it decides its `&&`
/// (`false`) or `||` (`true`) alone. `None` otherwise. (Recursion is bounded by the parser's
/// nesting limit.)
pub(crate) fn constant(e: &Expr) -> Option<bool> {
    match &e.kind {
        ExprKind::Literal(Literal::Bool(b)) => Some(*b),
        ExprKind::Not(inner) => constant(inner).map(|b| !b),
        ExprKind::Logical { op, operands } => {
            // `true` decides an `||`, `false` an `&&`.
            let decides = *op == LogicalOp::Or;
            let mut all_known = true;
            for o in operands {
                match constant(o) {
                    Some(b) if b == decides => return Some(decides),
                    Some(_) => {}
                    None => all_known = false,
                }
            }
            all_known.then_some(!decides)
        }
        _ => None,
    }
}

/// Reports the `when` at `path` (of a `matches` entry, an exclude filter's `if`, or a limit's
/// `matches`) when it is always false: the condition it belongs to never holds.
pub(crate) fn check_request_when(ck: &mut Checker<'_>, doc: usize, path: &FieldPath, when: &Expr) {
    if constant(when) != Some(false) {
        return;
    }
    // `path` ends in `when`; what holds it decides what never happens, and what to remove.
    let (effect, holder) = match path.0.as_slice() {
        [.., Seg::Key(k), Seg::Key(_)] if k == "if" => ("the filter never applies", "the filter"),
        [.., Seg::Key(l), Seg::Index(_), Seg::Key(m), Seg::Key(_)]
            if l == "limits" && m == "matches" =>
        {
            ("the limit never applies", "the limit")
        }
        [.., Seg::Key(m), Seg::Index(_), Seg::Key(_)] if m == "matches" => {
            ("this `matches` entry never matches a request", "the entry")
        }
        _ => ("the condition never holds", "the condition"),
    };
    ck.report(
        doc,
        path,
        Code::ConstantCondition,
        format!("`when` is always false, so {effect}"),
        "always false",
        Some(format!(
            "write the test that was meant (e.g. `promptTokens > 8000`), or remove {holder}"
        )),
    );
}

/// Reports the `when` at `path` of filter `name`'s `drop`: always true when it is the `drop`'s
/// only condition (`alone`), which then drops every candidate; always false, which never drops
/// any. `guarded`: the filter has an `if`.
pub(crate) fn check_drop_when(
    ck: &mut Checker<'_>,
    doc: usize,
    path: &FieldPath,
    name: &str,
    when: &Expr,
    alone: bool,
    guarded: bool,
) {
    match constant(when) {
        Some(true) if alone => {
            let which = if guarded {
                "each request its `if` holds for"
            } else {
                "each request it matches"
            };
            ck.report(
                doc,
                path,
                Code::ConstantCondition,
                format!(
                    "filter `{name}` drops every candidate: its `drop` has no condition but a \
                     `when` that is always true"
                ),
                "always true",
                Some(format!(
                    "with every candidate dropped the rule rejects {which} (with `onEmpty: \
                     NextRule`, passes it on); give `drop` the condition that was meant \
                     (`backend`, a load threshold, or a `when` on the candidate), or remove \
                     the filter"
                )),
            );
        }
        Some(false) => ck.report(
            doc,
            path,
            Code::ConstantCondition,
            format!("filter `{name}` never drops anything: its `when` is always false"),
            "always false",
            Some("write the condition that was meant, or remove the filter".into()),
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::constant;

    fn value(text: &str) -> Option<bool> {
        kinf_grammar::parse_expr(text)
            .ok()
            .as_ref()
            .and_then(constant)
    }

    #[test]
    fn only_conditions_without_variables_or_calls_are_constant() {
        assert_eq!(value("true"), Some(true));
        assert_eq!(value("not false"), Some(true));
        assert_eq!(value("(false || true) && !false"), Some(true));
        assert_eq!(value("queuedPrompts > 2 || true"), Some(true));
        assert_eq!(value("false && tag(\"pii-detected\")"), Some(false));
        assert_eq!(value("true && stream"), None);
        assert_eq!(value("false || stream"), None);
        assert_eq!(value("stream"), None);
        assert_eq!(value("1 < 2"), None);
    }
}
