//! The variables and functions of `when:` expressions, by context.
//!
//! Indices are part of the contract with the decision engine, which evaluates expressions by
//! index: keep the order of these tables stable.

use kinf_grammar::{Env, FnSig, Type};

/// Request variables, in index order.
pub const REQUEST_VARS: &[(&str, Type)] = &[
    ("promptTokens", Type::Int),
    ("maxTokens", Type::Int),
    ("tenant", Type::String),
    ("model", Type::String),
    ("qos", Type::String),
    ("stream", Type::Bool),
    ("messages", Type::Int),
];

/// Endpoint variables, available in `drop.when` after the request variables.
pub const ENDPOINT_VARS: &[(&str, Type)] = &[
    ("queuedPrompts", Type::Float),
    ("runningPrompts", Type::Float),
    ("kvCacheUsage", Type::Float),
    ("predictedTTFT", Type::Duration),
    ("backend", Type::String),
    ("destination", Type::String),
    ("servedModel", Type::String),
    ("cachedPromptTokens", Type::Int),
];

/// Index of `promptTokens`.
pub const VAR_PROMPT_TOKENS: usize = 0;
/// Index of `maxTokens`.
pub const VAR_MAX_TOKENS: usize = 1;
/// Index of `tenant`.
pub const VAR_TENANT: usize = 2;
/// Index of `model`.
pub const VAR_MODEL: usize = 3;
/// Index of `qos`.
pub const VAR_QOS: usize = 4;
/// Index of `stream`.
pub const VAR_STREAM: usize = 5;
/// Index of `messages`.
pub const VAR_MESSAGES: usize = 6;
/// Index of `queuedPrompts`.
pub const VAR_QUEUED: usize = 7;
/// Index of `runningPrompts`.
pub const VAR_RUNNING: usize = 8;
/// Index of `kvCacheUsage`.
pub const VAR_KV_USAGE: usize = 9;
/// Index of `predictedTTFT`.
pub const VAR_PREDICTED_TTFT: usize = 10;
/// Index of `backend`.
pub const VAR_BACKEND: usize = 11;
/// Index of `destination`.
pub const VAR_DESTINATION: usize = 12;
/// Index of `servedModel`.
pub const VAR_SERVED_MODEL: usize = 13;
/// Index of `cachedPromptTokens`.
pub const VAR_CACHED_TOKENS: usize = 14;

/// Index of `tag(name) -> bool`.
pub const FN_TAG: usize = 0;
/// Index of `header(name) -> string` (empty when absent).
pub const FN_HEADER: usize = 1;
/// Index of `hasHeader(name) -> bool`.
pub const FN_HAS_HEADER: usize = 2;

fn funcs() -> Vec<FnSig> {
    let sig = |name: &str, params: Vec<Type>, ret: Type| FnSig {
        name: name.to_string(),
        params,
        ret,
    };
    vec![
        sig("tag", vec![Type::String], Type::Bool),
        sig("header", vec![Type::String], Type::String),
        sig("hasHeader", vec![Type::String], Type::Bool),
    ]
}

/// The environment of `matches[].when` and `exclude[].if.when` (built once).
pub fn request_env() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(build_request_env)
}

/// The environment of `exclude[].drop.when` (built once).
pub fn endpoint_env() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(build_endpoint_env)
}

fn build_request_env() -> Env {
    Env {
        vars: REQUEST_VARS
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect(),
        funcs: funcs(),
    }
}

fn build_endpoint_env() -> Env {
    Env {
        vars: REQUEST_VARS
            .iter()
            .chain(ENDPOINT_VARS)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect(),
        funcs: funcs(),
    }
}
