//! Types shared by several resources.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a candidate endpoint runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BackendType {
    /// A vLLM pod of an `InferenceWorkerSet` in the cluster.
    Local,
    /// An off-cluster `InferenceProvider`.
    Provider,
}

impl BackendType {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendType::Local => "Local",
            BackendType::Provider => "Provider",
        }
    }
}

/// A model served by a worker set: its served name and the aliases clients may use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServedModel {
    /// The name vLLM serves the model under (`--served-model-name`); sent upstream.
    pub name: String,
    /// Other names clients may request. Several worker sets may share an alias.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

/// Prices used for per-tenant cost attribution, per million tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cost {
    /// ISO 4217 currency code of the prices. Default `USD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Price per million prompt tokens that had to be computed (not served from cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub uncached_prompt_per_million: Option<f64>,
    /// Price per million prompt tokens served from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cached_prompt_per_million: Option<f64>,
    /// Price per million generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub output_per_million: Option<f64>,
}

/// A reference to a key of a Kubernetes Secret in the resource's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key inside the Secret. Default depends on the referring field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A threshold on a number: `{greaterThan: 2}`, `{lessThan: 0.5}` or both (an open interval).
///
/// Values are numbers, or strings in the quantity language (`70%`, `2s`) where the measured
/// field allows them.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Threshold {
    /// Holds when the measured value is strictly greater than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greater_than: Option<Quantity>,
    /// Holds when the measured value is strictly less than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub less_than: Option<Quantity>,
}

/// A number, or a string in the quantity language (`70%`, `0.7`, `2s`, `16Ki`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    /// A plain number.
    Number(f64),
    /// A string such as `70%`, `30s` or `16Ki`.
    Text(String),
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number, or a string such as `70%`, `30s` or `16Ki`.",
            "x-kubernetes-preserve-unknown-fields": true,
            "anyOf": [{ "type": "number" }, { "type": "string" }]
        })
    }
}

/// A duration in the quantity language: `30s`, `500ms`, `1m30s`.
pub type DurationString = String;
