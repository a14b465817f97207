//! `GatewayBackend`: the front door — which pool a listener serves, who the tenants are,
//! which classifiers run, request-size limits.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{DurationString, SecretKeyRef};
use crate::status::GatewayStatus;

/// The front door of a pool.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinference.buoyant.io",
    version = "v1alpha1",
    kind = "GatewayBackend",
    namespaced,
    status = "GatewayStatus",
    shortname = "igw",
    category = "kinference",
    doc = "The front door: which pool a listener serves, tenant identity, classifiers, limits.",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
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
pub struct GatewayBackendSpec {
    /// The `InferencePool` this front door serves.
    pub pool: String,
    /// Host names this backend answers for. Absent: every host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// How tenants are identified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantIdentity>,
    /// Classifiers that tag requests before policies are evaluated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classifiers: Vec<ClassifierSpec>,
    /// Request-size limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RequestLimits>,
}

/// How a request's tenant is determined.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantIdentity {
    /// API keys (`Authorization: Bearer` or `x-api-key`) mapped to tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<ApiKeySource>,
    /// A header set by a trusted upstream gateway that names the tenant. Only honoured when
    /// configured here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_header: Option<String>,
    /// Tenant of requests without credentials. Absent: such requests get 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_tenant: Option<String>,
}

/// Where the API-key → tenant map comes from; exactly one source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeySource {
    /// A Secret whose keys are tenant names and values the hashed or plain API keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    /// A file of `tenant: key` lines (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// One classifier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassifierSpec {
    /// Unique within the backend.
    pub name: String,
    /// Which classifier.
    #[serde(rename = "type")]
    pub type_: ClassifierType,
    /// `Pii` only: the entities to detect. Default: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<PiiEntity>,
    /// `External` only: the URL receiving `{"messages": [...]}` and answering `{"tags": [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `External` only: the tags it may produce (used by lint to check policies' tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// `External` only: time allowed. Default `50ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
    /// What happens when the classifier fails or times out. Default `FailClosed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
    /// With `FailClosed`: the tag added on failure. Absent: the request is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_tag: Option<String>,
    /// `Complexity` only: thresholds of its features and levels. Absent fields keep their
    /// defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ComplexityThresholds>,
}

/// Thresholds of the `Complexity` classifier. Each feature scores 1 point at its first value,
/// 2 at its second (and 3 at the third, for `tokens`); the sum of the points decides the level.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComplexityThresholds {
    /// Estimated prompt tokens (bytes / 4). Default `[256, 1024, 4096]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3))]
    pub tokens: Option<Vec<u32>>,
    /// Non-system messages. Default `[4, 10]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    pub turns: Option<Vec<u32>>,
    /// Code lines (5 per fenced block). Default `[3, 20]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    pub code_lines: Option<Vec<u32>>,
    /// Math markers. Default `[2, 6]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    pub math: Option<Vec<u32>>,
    /// Multi-step markers. Default `[3, 6]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    pub steps: Option<Vec<u32>>,
    /// Question marks. Default `[2, 5]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    pub questions: Option<Vec<u32>>,
    /// Score from which a request is `complexity-medium`. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium_at: Option<u32>,
    /// Score from which a request is `complexity-high`. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_at: Option<u32>,
}

/// Classifier implementations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ClassifierType {
    /// Built-in PII detector: tags `pii-detected` and `pii-<entity>`.
    Pii,
    /// Built-in complexity estimator: tags `complexity-low|medium|high`.
    Complexity,
    /// An external HTTP classifier.
    External,
}

/// Entities the built-in PII classifier knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PiiEntity {
    /// E-mail addresses.
    Email,
    /// Phone numbers.
    Phone,
    /// US social security numbers.
    Ssn,
    /// Payment card numbers (Luhn-checked).
    CreditCard,
    /// IBANs (checksum-checked).
    Iban,
    /// IPv4 and IPv6 addresses.
    IpAddress,
    /// Cloud access keys, bearer tokens, JWTs, private-key blocks.
    Credential,
}

impl PiiEntity {
    /// Every entity.
    pub const ALL: [PiiEntity; 7] = [
        PiiEntity::Email,
        PiiEntity::Phone,
        PiiEntity::Ssn,
        PiiEntity::CreditCard,
        PiiEntity::Iban,
        PiiEntity::IpAddress,
        PiiEntity::Credential,
    ];

    /// The YAML spelling, also the suffix of the entity's tag (`pii-<entity>`).
    pub fn as_str(self) -> &'static str {
        match self {
            PiiEntity::Email => "email",
            PiiEntity::Phone => "phone",
            PiiEntity::Ssn => "ssn",
            PiiEntity::CreditCard => "credit-card",
            PiiEntity::Iban => "iban",
            PiiEntity::IpAddress => "ip-address",
            PiiEntity::Credential => "credential",
        }
    }
}

/// Behaviour of a classifier that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailureMode {
    /// Add `failureTag`, or reject the request when none is set.
    FailClosed,
    /// Continue without tags from this classifier.
    FailOpen,
}

/// Request-size limits; violations get a 4xx in the caller's API shape.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestLimits {
    /// Largest request body (`16Mi`). Default `32Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<crate::common::Quantity>,
    /// Most messages in one chat request. Default 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_messages: Option<u32>,
    /// Largest prompt in tokens. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_prompt_tokens: Option<u64>,
    /// Deepest nesting of arrays and objects in the JSON body. Default 64; at most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 128))]
    pub max_json_depth: Option<u32>,
    /// Most streamed responses one tenant may have in flight at once (429 past it). Default
    /// 1024; requests without an identified tenant are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_streams_per_tenant: Option<u32>,
}
