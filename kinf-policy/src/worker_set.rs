//! `InferenceWorkerSet`: a homogeneous group of vLLM pods.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Cost, DurationString, ServedModel};
use crate::status::WorkerSetStatus;

/// A homogeneous group of vLLM pods serving the same models with the same settings.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinference.buoyant.io",
    version = "v1alpha1",
    kind = "InferenceWorkerSet",
    namespaced,
    status = "WorkerSetStatus",
    shortname = "iws",
    category = "kinference",
    doc = "A homogeneous group of vLLM pods serving the same models.",
    printcolumn(name = "Models", type_ = "string", json_path = ".status.models"),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyEndpoints"
    ),
    printcolumn(
        name = "KV events",
        type_ = "integer",
        json_path = ".status.kvEventStreams"
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
pub struct InferenceWorkerSetSpec {
    /// Pods of the set, by label. Exactly one of `selector` and `endpoints` must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Static `host:port` addresses of vLLM servers (standalone mode, or workers outside the
    /// cluster). Exactly one of `selector` and `endpoints` must be set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// The HTTP port of vLLM in selected pods. Default, per pod: its first container port named
    /// `http`, else 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// The models every worker of the set serves.
    #[schemars(length(min = 1))]
    pub models: Vec<ServedModel>,
    /// Where the workers publish vLLM KV-cache events. Absent: approximate prefix tracking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventsConfig>,
    /// How the workers' `/metrics` are scraped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// KV-cache block size in tokens. Absent: discovered from `vllm:cache_config_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub block_size: Option<u32>,
    /// Where to load the model's `tokenizer.json` and chat template for precise prefix matching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerSource>,
    /// A prior for the TTFT predictor, refined online from observed TTFTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance: Option<PerformancePrior>,
    /// Prices for cost attribution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// vLLM's ZMQ KV-event publisher settings (`--kv-events-config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvEventsConfig {
    /// The PUB socket port on each worker. Absent: discovered from each worker's
    /// `GET /kv_event_sources` (vLLM ≥ 0.32), which also gives the replay port and topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// The ROUTER socket port for replaying missed events. Absent: gaps reset the endpoint's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub replay_port: Option<u32>,
    /// ZMQ topic. Default `""` (vLLM's default: every message of the publisher).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// Metrics scraping settings.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsConfig {
    /// HTTP path. Default `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Scrape interval. Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationString>,
}

/// Where a model's tokenizer files come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenizerSource {
    /// A directory holding `tokenizer.json` and `tokenizer_config.json` (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A ConfigMap holding `tokenizer.json` and `tokenizer_config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<String>,
}

/// Performance prior of one worker, used until enough TTFTs have been observed.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerformancePrior {
    /// Prefill throughput of one worker, in prompt tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub prefill_tokens_per_second: Option<f64>,
    /// Decode throughput of one sequence, in output tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub decode_tokens_per_second: Option<f64>,
    /// Fixed per-request overhead (scheduling, network). Default `20ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<DurationString>,
}
