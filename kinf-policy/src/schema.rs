//! JSON Schemas (for offline validation) and CRD manifests (for the API server).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
    ResourceKind,
};

/// The JSON Schema (draft 2020-12, subschemas inlined) of a whole resource document:
/// `apiVersion`, `kind`, `metadata`, `spec` and `status`.
pub fn json_schema(kind: ResourceKind) -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let schema = match kind {
        ResourceKind::InferenceWorkerSet => generator.into_root_schema_for::<InferenceWorkerSet>(),
        ResourceKind::InferenceProvider => generator.into_root_schema_for::<InferenceProvider>(),
        ResourceKind::InferencePool => generator.into_root_schema_for::<InferencePool>(),
        ResourceKind::InferencePolicy => generator.into_root_schema_for::<InferencePolicy>(),
        ResourceKind::GatewayBackend => generator.into_root_schema_for::<GatewayBackend>(),
    };
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.insert(
            "$id".into(),
            Value::String(format!(
                "https://kinference.ai/schemas/v1alpha1/{}.json",
                kind.as_str()
            )),
        );
    }
    value
}

/// The CRD manifest of a kind, as applied to a cluster.
///
/// Its schema marks no field `nullable`, although optional fields are `Option`s (which
/// kube-derive marks so): the API server then prunes an explicit `field: null` (as Helm or
/// Kustomize render an unset value) before validation, so the object is stored, and compiled, as
/// if the field were absent. With `nullable` it stored the `null` on create (an update's
/// merge patch deletes it instead), and the compiler refused it.
pub fn crd(kind: ResourceKind) -> CustomResourceDefinition {
    let crd = match kind {
        ResourceKind::InferenceWorkerSet => InferenceWorkerSet::crd(),
        ResourceKind::InferenceProvider => InferenceProvider::crd(),
        ResourceKind::InferencePool => InferencePool::crd(),
        ResourceKind::InferencePolicy => InferencePolicy::crd(),
        ResourceKind::GatewayBackend => GatewayBackend::crd(),
    };
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    strip_nullable(&mut value);
    enumerate_selector_operators(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// The operators of a label selector's `matchExpressions`, as the API server accepts them for
/// core objects.
pub const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// Gives every `matchExpressions[].operator` of a CRD schema the enum of
/// [`SELECTOR_OPERATORS`]: the API server then refuses `in` or `Equals` when the object is
/// applied, as it does for a pod selector, instead of storing a selector that matches nothing.
/// (The compiler reports the same mistake as KINF0103, with a suggestion, for offline checks.)
fn enumerate_selector_operators(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(op) = map
                .get_mut("matchExpressions")
                .and_then(|m| m.pointer_mut("/items/properties/operator"))
                .and_then(Value::as_object_mut)
            {
                op.insert("enum".into(), SELECTOR_OPERATORS.into());
            }
            map.values_mut().for_each(enumerate_selector_operators);
        }
        Value::Array(items) => items.iter_mut().for_each(enumerate_selector_operators),
        _ => {}
    }
}

/// Removes every `nullable` keyword.
fn strip_nullable(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("nullable");
            map.values_mut().for_each(strip_nullable);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nullable),
        _ => {}
    }
}
