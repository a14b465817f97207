//! Status subresources: conditions plus per-kind counts.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Status of an `InferenceWorkerSet`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSetStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `ResolvedRefs`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Served model names, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<String>,
    /// Endpoints that pass health checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_endpoints: Option<u32>,
    /// Connected KV-event streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_event_streams: Option<u32>,
}

/// Status of an `InferenceProvider`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `ResolvedRefs`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Status of an `InferencePool`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `ResolvedRefs`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Number of resolved destinations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destinations: Option<u32>,
    /// Model names and aliases clients can request, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<String>,
}

/// Status of an `InferencePolicy`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `ResolvedRefs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Number of rules in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<u32>,
    /// Pools the policy applies to, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<String>,
}

/// Status of a `GatewayBackend`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `ResolvedRefs`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
