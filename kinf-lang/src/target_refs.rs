//! A policy's `targetRefs[].group` (KINF0413): policies target Kinference InferencePools only,
//! and a reference is resolved by its name alone, so any other group is ignored.

use kinf_policy::{GROUP, TargetRef};

use crate::check::Checker;
use crate::codes::Code;
use crate::fpath;

/// The API groups of the Gateway API Inference Extension, whose `InferencePool` a policy
/// written for it names.
const INFERENCE_EXTENSION_GROUPS: [&str; 2] = [
    "inference.networking.k8s.io",
    "inference.networking.x-k8s.io",
];

/// Reports entry `i` of the `targetRefs` of the policy in document `doc` when it names a group
/// other than [`GROUP`].
pub(crate) fn check_group(ck: &mut Checker<'_>, doc: usize, i: usize, t: &TargetRef) {
    let Some(group) = t.group.as_deref() else {
        return;
    };
    if group == GROUP {
        return;
    }
    let help = if INFERENCE_EXTENSION_GROUPS.contains(&group) {
        format!(
            "Kinference does not read the Gateway API Inference Extension's InferencePools: \
             name a Kinference InferencePool, and remove `group` (it defaults to `{GROUP}`)"
        )
    } else {
        format!("remove `group` (it defaults to `{GROUP}`), or set `group: {GROUP}`")
    };
    ck.report(
        doc,
        &fpath!["spec", "targetRefs", i, "group"],
        Code::IgnoredTargetGroup,
        format!(
            "group `{group}` is ignored: policies target only InferencePools of `{GROUP}`, so \
             this entry names the InferencePool `{}` of that group",
            t.name
        ),
        "ignored",
        Some(help),
    );
}
