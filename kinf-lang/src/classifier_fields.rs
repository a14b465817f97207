//! Fields of a GatewayBackend's `spec.classifiers` that the server never reads, or whose value
//! can never make a difference (KINF0410). What the server does with each field:
//!
//! - the built-in classifiers (`Pii`, `Complexity`) run in the gateway's process and cannot fail
//!   or time out: only `type`, `entities` (`Pii`) and `thresholds` (`Complexity`) are read, so
//!   `url`, `tags`, `timeout`, `failureMode` and `failureTag` have no effect on them;
//! - `entities` is read for `Pii` classifiers only;
//! - an `External` classifier with `failureMode: FailOpen` adds nothing when it fails, so its
//!   `failureTag` is never added;
//! - a front door has one complexity estimator: the last `Complexity` classifier, so the ones
//!   before it (and their `thresholds`) are not used;
//! - several `Pii` classifiers detect the union of their entities, so next to one without
//!   `entities` (every entity) another one's `entities` add nothing.
//!
//! `thresholds` on a classifier that is not `Complexity` is an error of its own (KINF0106).

use kinf_policy::{ClassifierSpec, ClassifierType, FailureMode};

use crate::check::Checker;
use crate::codes::Code;
use crate::fpath;

fn type_name(t: ClassifierType) -> &'static str {
    match t {
        ClassifierType::Pii => "Pii",
        ClassifierType::Complexity => "Complexity",
        ClassifierType::External => "External",
    }
}

/// Reports the classifier fields of the GatewayBackend in document `doc` that have no effect.
pub(crate) fn check(ck: &mut Checker<'_>, doc: usize, classifiers: &[ClassifierSpec]) {
    let last_complexity = classifiers
        .iter()
        .rposition(|c| c.type_ == ClassifierType::Complexity);
    let every_entity = classifiers
        .iter()
        .position(|c| c.type_ == ClassifierType::Pii && c.entities.is_empty());
    for (i, c) in classifiers.iter().enumerate() {
        let base = fpath!["spec", "classifiers", i];
        let ty = type_name(c.type_);
        match c.type_ {
            ClassifierType::Pii | ClassifierType::Complexity => {
                let produced = if c.type_ == ClassifierType::Pii {
                    "`pii-detected` and `pii-<entity>`"
                } else {
                    "`complexity-low`, `complexity-medium` or `complexity-high`"
                };
                let not_external = [
                    (
                        "url",
                        c.url.is_some(),
                        format!("a `{ty}` classifier runs in the gateway and calls no service"),
                    ),
                    (
                        "tags",
                        !c.tags.is_empty(),
                        format!("a `{ty}` classifier produces {produced}, whatever `tags` lists"),
                    ),
                    (
                        "timeout",
                        c.timeout.is_some(),
                        format!("a `{ty}` classifier runs in the gateway and cannot time out"),
                    ),
                    (
                        "failureMode",
                        c.failure_mode.is_some(),
                        format!("a `{ty}` classifier runs in the gateway and cannot fail"),
                    ),
                    (
                        "failureTag",
                        c.failure_tag.is_some(),
                        format!(
                            "a `{ty}` classifier runs in the gateway and cannot fail, so the tag \
                             is never added"
                        ),
                    ),
                ];
                for (key, set, why) in not_external {
                    if set {
                        ck.report_key(
                            doc,
                            &base.key(key),
                            Code::IgnoredField,
                            format!("`{key}` of classifier `{}` is not read: {why}", c.name),
                            "not read",
                            Some(format!(
                                "remove `{key}`: `url`, `tags`, `timeout`, `failureMode` and \
                                 `failureTag` are read for `External` classifiers only"
                            )),
                        );
                    }
                }
            }
            ClassifierType::External => {
                if c.failure_mode == Some(FailureMode::FailOpen) && c.failure_tag.is_some() {
                    ck.report_key(
                        doc,
                        &base.key("failureTag"),
                        Code::IgnoredField,
                        format!(
                            "`failureTag` of classifier `{}` is never added: with \
                             `failureMode: FailOpen` a failed classifier adds no tag",
                            c.name
                        ),
                        "never added",
                        Some(
                            "remove `failureTag`, or set `failureMode: FailClosed` to add it \
                             when the classifier fails"
                                .into(),
                        ),
                    );
                }
            }
        }
        if c.type_ != ClassifierType::Pii && !c.entities.is_empty() {
            ck.report_key(
                doc,
                &base.key("entities"),
                Code::IgnoredField,
                format!(
                    "`entities` of classifier `{}` is not read: only `Pii` classifiers detect \
                     entities, and this one is `{ty}`",
                    c.name
                ),
                "not read",
                Some("remove `entities`, or declare a classifier of `type: Pii` for them".into()),
            );
        }
        if c.type_ == ClassifierType::Pii
            && !c.entities.is_empty()
            && let Some(all) = every_entity
        {
            let other = &classifiers[all].name;
            ck.report_key(
                doc,
                &base.key("entities"),
                Code::IgnoredField,
                format!(
                    "`entities` of classifier `{}` has no effect: classifier `{other}` sets no \
                     `entities` and detects every entity",
                    c.name
                ),
                "no effect",
                Some(format!(
                    "several `Pii` classifiers detect the union of their entities: remove `{}`, \
                     or list in `{other}` the entities it should detect",
                    c.name
                )),
            );
        }
        if c.type_ == ClassifierType::Complexity
            && let Some(last) = last_complexity
            && last != i
        {
            let used = &classifiers[last].name;
            let (key, help) = if c.thresholds.is_some() {
                (
                    "thresholds",
                    format!(
                        "remove `{}`, and give `{used}` the thresholds meant",
                        c.name
                    ),
                )
            } else {
                ("type", format!("remove `{}`", c.name))
            };
            ck.report_key(
                doc,
                &base.key(key),
                Code::IgnoredField,
                format!(
                    "classifier `{}` is not used: a request gets one complexity level, from the \
                     last `Complexity` classifier, `{used}`",
                    c.name
                ),
                "not used",
                Some(help),
            );
        }
    }
}
