//! `InferencePool`: the destinations that clients address by model name.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::PoolStatus;

/// A set of destinations; clients address models, and the pool resolves names and aliases
/// across its destinations.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinference.buoyant.io",
    version = "v1alpha1",
    kind = "InferencePool",
    namespaced,
    status = "PoolStatus",
    shortname = "ipool",
    category = "kinference",
    doc = "A set of worker sets and providers that clients address by model name.",
    printcolumn(
        name = "Destinations",
        type_ = "integer",
        json_path = ".status.destinations"
    ),
    printcolumn(name = "Models", type_ = "string", json_path = ".status.models"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferencePoolSpec {
    /// The worker sets and providers of the pool.
    #[schemars(length(min = 1))]
    pub destinations: Vec<Destination>,
}

/// A reference to a worker set or a provider in the pool's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Destination {
    /// What is referenced.
    pub kind: DestinationKind,
    /// Its `metadata.name`.
    pub name: String,
}

/// The kinds a pool destination can reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DestinationKind {
    /// A local group of vLLM pods.
    InferenceWorkerSet,
    /// An off-cluster provider.
    InferenceProvider,
}
