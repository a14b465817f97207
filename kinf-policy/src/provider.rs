//! `InferenceProvider`: an off-cluster inference provider.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Cost, DurationString, SecretKeyRef};
use crate::status::ProviderStatus;

/// An off-cluster inference provider that local traffic can burst to.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinference.buoyant.io",
    version = "v1alpha1",
    kind = "InferenceProvider",
    namespaced,
    status = "ProviderStatus",
    shortname = "iprov",
    category = "kinference",
    doc = "An off-cluster inference provider.",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
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
pub struct InferenceProviderSpec {
    /// The provider's wire protocol.
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// Base URL of the API, e.g. `https://api.example.com/v1`.
    pub url: String,
    /// AWS region (Bedrock only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Where the API key or signing credentials come from. Never logged or echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// The models this provider can serve.
    #[schemars(length(min = 1))]
    pub models: Vec<ProviderModel>,
    /// Time allowed for the whole request. Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
    /// Requests in flight at most; further requests treat the provider as unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<u32>,
    /// Prices for cost attribution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// Expected time to first token until observed values exist. Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ttft: Option<DurationString>,
}

/// Wire protocol of a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProviderType {
    /// OpenAI-compatible API (OpenAI, Databricks serving endpoints, a remote vLLM).
    OpenAI,
    /// Anthropic Messages API.
    Anthropic,
    /// AWS Bedrock Converse API, SigV4-signed.
    Bedrock,
}

/// A model the provider can serve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderModel {
    /// The client-facing model name (or alias) this entry serves.
    pub name: String,
    /// The model id sent upstream to the provider.
    pub provider_model: String,
}

/// Credentials of a provider; exactly one source must be set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    /// A key of a Secret (default key `apiKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    /// An environment variable of the Kinference process (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// A file readable by the Kinference process (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}
