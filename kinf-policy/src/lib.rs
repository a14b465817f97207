//! The Kinference API: Rust types of the five resources of group `kinference.buoyant.io`,
//! version `v1alpha1`, with their JSON Schemas and Kubernetes CRD manifests.
//!
//! This crate is plain data: no I/O, no validation beyond what the types and schemas express.
//! The compiler (`kinf-lang`) checks a whole bundle of these resources and reports diagnostics.

// kube's `printcolumn(...)` attributes repeat by design (one per column).
#![allow(
    clippy::duplicated_attributes,
    reason = "kube printcolumn attributes repeat per column"
)]

pub mod common;
pub mod gateway;
pub mod policy;
pub mod pool;
pub mod provider;
pub mod schema;
pub mod status;
pub mod worker_set;

pub use common::*;
pub use gateway::*;
pub use policy::*;
pub use pool::*;
pub use provider::*;
pub use status::*;
pub use worker_set::*;

/// The API group of every Kinference resource.
pub const GROUP: &str = "kinference.buoyant.io";
/// The only API version served today.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in YAML.
pub const API_VERSION: &str = "kinference.buoyant.io/v1alpha1";

/// The five resource kinds, in the order the documentation lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// [`InferenceWorkerSet`]: a homogeneous group of vLLM pods.
    InferenceWorkerSet,
    /// [`InferenceProvider`]: an off-cluster provider.
    InferenceProvider,
    /// [`InferencePool`]: the set of destinations clients address.
    InferencePool,
    /// [`InferencePolicy`]: ordered routing rules and token limits.
    InferencePolicy,
    /// [`GatewayBackend`]: the front door.
    GatewayBackend,
}

impl ResourceKind {
    /// Every kind.
    pub const ALL: [ResourceKind; 5] = [
        ResourceKind::InferenceWorkerSet,
        ResourceKind::InferenceProvider,
        ResourceKind::InferencePool,
        ResourceKind::InferencePolicy,
        ResourceKind::GatewayBackend,
    ];

    /// The `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::InferenceWorkerSet => "InferenceWorkerSet",
            ResourceKind::InferenceProvider => "InferenceProvider",
            ResourceKind::InferencePool => "InferencePool",
            ResourceKind::InferencePolicy => "InferencePolicy",
            ResourceKind::GatewayBackend => "GatewayBackend",
        }
    }

    /// Parses a `kind` string (exact match).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
