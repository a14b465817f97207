//! The names a `when:` expression may compare `model`, `servedModel` and `destination` with:
//! the ones the pools a policy targets have (KINF0509).

use crate::check::Scope;
use crate::suggest::help_for;

/// Why `var == "value"` (or `!=`, `in`, `not in`) never changes: `(message, help)`. `None`
/// when `var` is not one of the name variables, when the targeted pools have the name, or when
/// they cannot tell: the scope is incomplete (a resource failed to load, or the policy targets
/// no pool, as when it is linted alone) or declares nothing of the kind.
pub(crate) fn unknown_name(var: &str, value: &str, scope: &Scope) -> Option<(String, String)> {
    if scope.incomplete {
        return None;
    }
    match var {
        "model" => {
            if scope.model_names.is_empty() || scope.model_names.contains(value) {
                return None;
            }
            let help = if scope.served_models.contains(value) {
                format!(
                    "\"{value}\" is the name sent upstream, not one clients ask for: compare \
                     `servedModel` with it, or `model` with a name the pools serve"
                )
            } else {
                help_for(value, sorted(scope.model_names.iter()), "models served")
            };
            Some((
                format!(
                    "`model` is never \"{value}\": no destination of the targeted pools serves \
                     a model or alias of that name"
                ),
                help,
            ))
        }
        "servedModel" => {
            if scope.served_models.is_empty() || scope.served_models.contains(value) {
                return None;
            }
            let help = if scope.model_names.contains(value) {
                format!(
                    "\"{value}\" is a name clients ask for, not the one sent upstream: compare \
                     `model` with it, or `servedModel` with a served name or `providerModel`"
                )
            } else {
                help_for(
                    value,
                    sorted(scope.served_models.iter()),
                    "models sent upstream",
                )
            };
            Some((
                format!(
                    "`servedModel` is never \"{value}\": no destination of the targeted pools \
                     sends a model of that name upstream"
                ),
                help,
            ))
        }
        "destination" => {
            if scope.dests.is_empty() || scope.dest_named(value).is_some() {
                return None;
            }
            let names = sorted(scope.dests.iter().map(|(n, _, _)| n));
            Some((
                format!(
                    "`destination` is never \"{value}\": the targeted pools have no worker set or \
                     provider of that name"
                ),
                help_for(value, names, "destinations"),
            ))
        }
        _ => None,
    }
}

/// The names, sorted (the sets are unordered; help lists them in a stable order).
fn sorted<'a, S: AsRef<str> + 'a>(names: impl Iterator<Item = &'a S>) -> Vec<&'a str> {
    let mut v: Vec<&str> = names.map(AsRef::as_ref).collect();
    v.sort_unstable();
    v.dedup();
    v
}
