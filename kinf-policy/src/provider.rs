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
    /// The request field that carries the output token limit when Kinference writes it in
    /// OpenAI shape (`OpenAI` type only): `max_tokens` or `max_completion_tokens` (which
    /// OpenAI's o-series and gpt-5 models require). Absent: `max_tokens` in translated requests,
    /// and OpenAI clients' requests passed through as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_field: Option<MaxTokensField>,
}

/// The request field of an OpenAI-compatible API that carries the output token limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MaxTokensField {
    /// `max_tokens`: the field every OpenAI-compatible server knew first (some older ones know
    /// only it).
    #[default]
    #[serde(rename = "max_tokens")]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models (o-series, gpt-5) require;
    /// they refuse `max_tokens`.
    #[serde(rename = "max_completion_tokens")]
    MaxCompletionTokens,
}

impl MaxTokensField {
    /// The field name, as sent to the provider and written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(max_tokens_field: Option<&str>) -> Result<InferenceProviderSpec, serde_json::Error> {
        let mut v = serde_json::json!({
            "type": "OpenAI",
            "url": "https://api.openai.com/v1",
            "models": [{"name": "gpt", "providerModel": "gpt-5"}],
        });
        if let Some(f) = max_tokens_field {
            v["maxTokensField"] = f.into();
        }
        serde_json::from_value(v)
    }

    #[test]
    fn max_tokens_field_takes_the_two_openai_field_names() {
        assert_eq!(spec(None).unwrap().max_tokens_field, None);
        assert_eq!(MaxTokensField::default(), MaxTokensField::MaxTokens);
        for f in [
            MaxTokensField::MaxTokens,
            MaxTokensField::MaxCompletionTokens,
        ] {
            let s = spec(Some(f.as_str())).unwrap();
            assert_eq!(s.max_tokens_field, Some(f));
            // Written back as read.
            let v = serde_json::to_value(&s).unwrap();
            assert_eq!(v["maxTokensField"], f.as_str());
        }
        // Unset is not written.
        let v = serde_json::to_value(spec(None).unwrap()).unwrap();
        assert!(v.get("maxTokensField").is_none(), "{v}");
    }

    #[test]
    fn a_bad_max_tokens_field_is_refused_listing_the_allowed_values() {
        for bad in [
            "max_completion_token",
            "maxTokens",
            "MaxCompletionTokens",
            "",
        ] {
            let e = spec(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{bad}`"))
                    && e.contains("`max_tokens`")
                    && e.contains("`max_completion_tokens`"),
                "{bad}: {e}"
            );
        }
    }

    /// The values a schema allows: its `enum` and `const` values, nested ones included (the
    /// JSON Schema writes an optional documented enum as `anyOf` of `oneOf` of `const`s).
    fn allowed(schema: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
        match schema {
            serde_json::Value::Object(m) => {
                out.extend(m.get("const").cloned());
                out.extend(
                    m.get("enum")
                        .and_then(|e| e.as_array())
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                for (k, v) in m {
                    if k != "const" && k != "enum" {
                        allowed(v, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| allowed(v, out)),
            _ => {}
        }
    }

    #[test]
    fn schema_and_crd_enumerate_max_tokens_field() {
        let want = vec![
            serde_json::json!("max_tokens"),
            serde_json::json!("max_completion_tokens"),
        ];
        let schema = crate::schema::json_schema(crate::ResourceKind::InferenceProvider);
        let field = &schema["properties"]["spec"]["properties"]["maxTokensField"];
        let mut values = Vec::new();
        allowed(field, &mut values);
        assert_eq!(values, want, "{field}");
        let crd = serde_json::to_value(crate::schema::crd(crate::ResourceKind::InferenceProvider))
            .unwrap();
        let field = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["maxTokensField"];
        let mut values = Vec::new();
        allowed(field, &mut values);
        assert_eq!(values, want, "{field}");
    }
}
