//! Namespace isolation, as a property over random sequences of bundles: after every apply,
//! each namespace serves exactly the objects of this bundle (when it has no errors) or the
//! objects it had in force (when it has some), and the outcome says which namespaces were
//! refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kube_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kinf_handler::ApplyOutcome;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::kube::isolation::{InForce, NamespaceMerge};
use kinf_handler::kube::store::ClusterStore;
use kinf_policy::ResourceKind;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use kube_support::{in_namespace, obj};
use proptest::prelude::*;
use serde_json::json;

const NAMESPACES: [&str; 3] = ["a", "b", "c"];

/// What one namespace holds in a bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ns {
    /// No objects.
    Absent,
    /// Valid objects; the policy's queue limit is the version.
    Valid(i64),
    /// Objects whose policy has an unknown field (KINF0101).
    Broken,
}

fn ns_state() -> impl Strategy<Value = Ns> {
    prop_oneof![
        Just(Ns::Absent),
        (1i64..4).prop_map(Ns::Valid),
        Just(Ns::Broken)
    ]
}

/// A worker set with a static endpoint, its pool and a policy, in namespace `ns`.
fn objects(ns: &str, state: Ns) -> Vec<(ResourceKind, DynamicObject)> {
    let (limit, key) = match state {
        Ns::Absent => return Vec::new(),
        Ns::Valid(v) => (v, "if"),
        Ns::Broken => (99, "iff"),
    };
    vec![
        (
            ResourceKind::InferenceWorkerSet,
            obj(
                ResourceKind::InferenceWorkerSet,
                "w",
                1,
                json!({"endpoints": ["10.0.0.1:8000"], "models": [{"name": format!("m-{ns}")}]}),
            ),
        ),
        (
            ResourceKind::InferencePool,
            obj(
                ResourceKind::InferencePool,
                "pool",
                1,
                json!({"destinations": [{"kind": "InferenceWorkerSet", "name": "w"}]}),
            ),
        ),
        (
            ResourceKind::InferencePolicy,
            obj(
                ResourceKind::InferencePolicy,
                "routing",
                1,
                json!({"rules": [{"name": "r", "route": {
                    "exclude": [{"name": "busy", key: {"model": format!("m-{ns}")},
                                 "drop": {"queuedPrompts": {"greaterThan": limit}}}],
                    "select": [{"type": "Local", "minimize": "PredictedTTFT"}]}}]}),
            ),
        ),
    ]
    .into_iter()
    .map(|(k, o)| (k, in_namespace(o, ns)))
    .collect()
}

/// A store holding exactly the objects of `states`.
fn store(states: &[Ns]) -> ClusterStore {
    let mut s = ClusterStore::new();
    for kind in ResourceKind::ALL {
        s.apply_object_event(kind, Event::Init);
        for (ns, state) in NAMESPACES.iter().zip(states) {
            for (k, o) in objects(ns, *state) {
                if k == kind {
                    s.apply_object_event(kind, Event::InitApply(o));
                }
            }
        }
        s.apply_object_event(kind, Event::InitDone);
    }
    s.apply_pod_event(Event::Init);
    s.apply_pod_event(Event::InitDone);
    s
}

/// Sources named `Kind/namespace/name`, by namespace: name → text.
type ByNamespace = BTreeMap<String, BTreeMap<String, String>>;

fn by_namespace(sources: &kinf_lang::Sources) -> ByNamespace {
    let mut out = ByNamespace::new();
    for (_, f) in sources.iter() {
        let ns = f.name.split('/').nth(1).unwrap().to_owned();
        out.entry(ns)
            .or_default()
            .insert(f.name.clone(), f.text.to_string());
    }
    out
}

/// The sources in force, by namespace.
fn in_force_by_namespace(gw: &Gateway) -> ByNamespace {
    gw.store
        .current()
        .map(|c| by_namespace(&c.sources))
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn each_namespace_serves_its_new_objects_or_the_ones_it_had(
        bundles in prop::collection::vec(prop::collection::vec(ns_state(), 3), 1..5)
    ) {
        let gw = Gateway::new(GatewayOptions::default());
        let in_force = InForce::default();
        for states in &bundles {
            let s = store(states);
            let mut bundle = s.bundle();
            bundle.resolved.isolation = Some(Arc::new(NamespaceMerge::new(
                Arc::new(s.objects().cloned().collect()),
                in_force.clone(),
                Default::default(),
                s.pods_snapshot(),
            )));
            let before = in_force_by_namespace(&gw);
            let (outcome, _) = gw.apply_bundle(&bundle);
            let after = in_force_by_namespace(&gw);
            let new = by_namespace(&bundle.sources);

            let broken: BTreeSet<String> = NAMESPACES
                .iter()
                .zip(states)
                .filter(|(_, s)| **s == Ns::Broken)
                .map(|(ns, _)| (*ns).to_owned())
                .collect();
            // Every namespace with objects in the bundle or in force.
            let all: BTreeSet<String> = new.keys().chain(before.keys()).cloned().collect();
            if broken.is_empty() {
                prop_assert!(
                    matches!(outcome, ApplyOutcome::Applied { .. } | ApplyOutcome::Unchanged),
                    "{outcome:?}"
                );
                prop_assert_eq!(&after, &new);
            } else if broken == all {
                prop_assert!(matches!(outcome, ApplyOutcome::Refused { .. }), "{outcome:?}");
                prop_assert_eq!(&after, &before, "nothing changes");
            } else {
                let refused = outcome.refused_namespaces().map(|n| n.to_vec());
                prop_assert_eq!(refused, Some(broken.iter().cloned().collect::<Vec<_>>()));
                for ns in &all {
                    let want = if broken.contains(ns) { before.get(ns) } else { new.get(ns) };
                    prop_assert_eq!(after.get(ns), want, "namespace {}", ns);
                }
                let r = gw.store.last_rejected().unwrap();
                prop_assert_eq!(r.namespaces.as_ref(), Some(&broken.iter().cloned().collect::<Vec<_>>()));
            }
            // What the controller holds in force is what the gateway compiled.
            let held = by_namespace(&kinf_handler::kube::store::sources_of(
                in_force.lock().clone().unwrap_or_default().iter(),
            ));
            if gw.store.is_ready() {
                prop_assert_eq!(&held, &after);
            }
        }
    }
}
