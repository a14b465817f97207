//! Namespace isolation: when a bundle has errors in some namespaces, every other namespace's
//! objects are still applied and each refused namespace keeps the objects it has in force
//! ([`crate::bundle::NamespaceIsolation`]). One team's invalid object no longer holds back
//! every other team's changes.

use std::collections::BTreeSet;
use std::sync::Arc;

use kinf_lang::{Diagnostic, Sources};
use parking_lot::Mutex;

use super::status::diagnostic_object;
use super::store::{Pods, StoredObject, select_pods, sources_of};
use crate::ApplyOutcome;

/// The objects of the policy in force (`None`: none), as the controller keeps them. Read when
/// a bundle is applied, not when it is made: bundles are applied one after the other, and the
/// policy store updates this as it applies each one
/// ([`crate::bundle::NamespaceIsolation::settle`]), so a bundle made while the one before was
/// being applied still merges with what that one left in force.
pub type InForce = Arc<Mutex<Option<Arc<Vec<StoredObject>>>>>;

/// A hash ([`endpoints_hash`]) of the endpoints that the worker sets in force were compiled
/// with (`None`: no bundle applied yet). Set when each bundle is applied; the apply loop
/// publishes a new bundle when the pods those worker sets select now hash otherwise.
pub type CompiledWith = Arc<Mutex<Option<u64>>>;

/// A hash of worker sets' endpoints (`namespace/name` → addresses).
pub fn endpoints_hash(endpoints: &std::collections::BTreeMap<String, Vec<String>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = ahash::AHasher::default();
    endpoints.hash(&mut h);
    h.finish()
}

/// The objects of a bundle, those of the policy in force, and the pods the bundle was made
/// with.
#[derive(Debug, Clone)]
pub struct NamespaceMerge {
    bundle: Arc<Vec<StoredObject>>,
    in_force: InForce,
    compiled_with: CompiledWith,
    pods: Pods,
}

impl NamespaceMerge {
    /// The bundle's objects, the policy in force's (and the hash of the endpoints they are
    /// compiled with, both updated when the bundle is applied) and the pods the bundle's
    /// endpoints were selected from.
    pub fn new(
        bundle: Arc<Vec<StoredObject>>,
        in_force: InForce,
        compiled_with: CompiledWith,
        pods: Pods,
    ) -> Self {
        NamespaceMerge {
            bundle,
            in_force,
            compiled_with,
            pods,
        }
    }

    /// The hash of the endpoints the worker sets among `objects` select among the bundle's
    /// pods.
    fn selected_hash(&self, objects: &[StoredObject]) -> u64 {
        endpoints_hash(
            &select_pods(&self.pods, objects.iter())
                .into_iter()
                .map(|(k, v)| (k, v.endpoints))
                .collect(),
        )
    }

    /// The objects with the namespaces in `kept` taken from the policy in force and every
    /// other namespace from the bundle ([`merge_objects`]).
    pub fn objects(&self, kept: &BTreeSet<String>) -> Vec<StoredObject> {
        let in_force = self.in_force.lock().clone();
        merge_objects(&self.bundle, in_force.as_deref().map(Vec::as_slice), kept)
    }
}

/// `bundle`'s objects outside the namespaces in `kept`, and `in_force`'s inside them.
pub fn merge_objects(
    bundle: &[StoredObject],
    in_force: Option<&[StoredObject]>,
    kept: &BTreeSet<String>,
) -> Vec<StoredObject> {
    let mut out: Vec<StoredObject> = bundle
        .iter()
        .filter(|o| !kept.contains(&o.key.namespace))
        .cloned()
        .collect();
    out.extend(
        in_force
            .unwrap_or_default()
            .iter()
            .filter(|o| kept.contains(&o.key.namespace))
            .cloned(),
    );
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

impl crate::bundle::NamespaceIsolation for NamespaceMerge {
    fn namespaces(&self) -> BTreeSet<String> {
        let in_force = self.in_force.lock().clone();
        self.bundle
            .iter()
            .chain(in_force.iter().flat_map(|v| v.iter()))
            .map(|o| o.key.namespace.clone())
            .collect()
    }

    fn namespace_of(&self, d: &Diagnostic, sources: &Sources) -> Option<String> {
        diagnostic_object(d, sources).map(|k| k.namespace)
    }

    fn merge(&self, kept: &BTreeSet<String>) -> Sources {
        sources_of(self.objects(kept).iter())
    }

    fn endpoints_in_force(&self) -> Option<std::collections::BTreeMap<String, Vec<String>>> {
        let in_force = self.in_force.lock().clone()?;
        Some(
            select_pods(&self.pods, in_force.iter())
                .into_iter()
                .map(|(k, v)| (k, v.endpoints))
                .collect(),
        )
    }

    fn settle(&self, outcome: &ApplyOutcome) {
        let mut in_force = self.in_force.lock();
        match outcome {
            // The policy in force was compiled again, with the endpoints its own worker sets
            // select among this bundle's pods.
            ApplyOutcome::Refused { .. } => {}
            ApplyOutcome::PartlyApplied { namespaces, .. } => {
                let kept = namespaces.iter().cloned().collect();
                let merged =
                    merge_objects(&self.bundle, in_force.as_deref().map(Vec::as_slice), &kept);
                *in_force = Some(Arc::new(merged));
            }
            ApplyOutcome::Applied { .. } | ApplyOutcome::Unchanged => {
                *in_force = Some(self.bundle.clone());
            }
        }
        *self.compiled_with.lock() = in_force.as_deref().map(|o| self.selected_hash(o));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::kube::store::ObjectKey;
    use kinf_policy::ResourceKind;

    fn obj(ns: &str, name: &str, text: &str) -> StoredObject {
        StoredObject {
            key: ObjectKey {
                kind: ResourceKind::InferencePool,
                namespace: ns.into(),
                name: name.into(),
            },
            generation: Some(1),
            spec: serde_json::Value::Null,
            status: serde_json::Value::Null,
            source: Arc::from(text),
            uid: None,
            resource_version: None,
            created: None,
        }
    }

    #[test]
    fn kept_namespaces_come_from_the_policy_in_force_and_the_others_from_the_bundle() {
        let bundle = vec![
            obj("a", "p", "a-new"),
            obj("b", "p", "b-new"),
            obj("c", "p", "c-new"),
        ];
        let in_force = vec![
            obj("a", "p", "a-old"),
            obj("b", "p", "b-old"),
            obj("d", "p", "d-old"),
        ];
        let kept: BTreeSet<String> = ["b".to_owned(), "c".to_owned(), "d".to_owned()].into();
        let got: Vec<(String, String)> = merge_objects(&bundle, Some(&in_force), &kept)
            .into_iter()
            .map(|o| (o.key.namespace, o.source.to_string()))
            .collect();
        // `a` from the bundle; `b` and `d` as in force; `c` has nothing in force, so nothing.
        assert_eq!(
            got,
            vec![
                ("a".into(), "a-new".into()),
                ("b".into(), "b-old".into()),
                ("d".into(), "d-old".into()),
            ]
        );
        // Nothing kept: the bundle as it is, and no policy in force adds nothing.
        assert_eq!(merge_objects(&bundle, None, &BTreeSet::new()).len(), 3);
        assert!(
            merge_objects(&bundle, None, &["a".into(), "b".into(), "c".into()].into()).is_empty()
        );
    }
}
