//! Fixtures of the Kubernetes-mode tests: objects as the API server returns them.

#![allow(dead_code)]

use k8s_openapi::api::core::v1::{Pod, Secret};
use kinf_policy::ResourceKind;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// A Kinference object as watched.
pub fn obj(kind: ResourceKind, name: &str, generation: i64, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kinference.buoyant.io/v1alpha1",
        "kind": kind.as_str(),
        "metadata": {"name": name, "namespace": "llm", "generation": generation,
                     "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": spec,
    }))
    .unwrap()
}

/// A pod with labels, IP, readiness and a named container port.
pub fn pod(name: &str, app: &str, ip: Option<&str>, ready: bool, http_port: Option<i32>) -> Pod {
    let ports: Vec<Value> = http_port
        .map(|p| vec![json!({"name": "http", "containerPort": p})])
        .unwrap_or_default();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "llm", "labels": {"app": app}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "ports": ports}]},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    }))
    .unwrap()
}

/// A Secret with string values.
pub fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    let mut d = serde_json::Map::new();
    for (k, v) in data {
        d.insert((*k).to_owned(), json!(base64(v)));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "llm"},
        "data": d,
    }))
    .unwrap()
}

fn base64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The worker set selecting `app=vllm` pods.
pub fn worker_set() -> DynamicObject {
    obj(
        ResourceKind::InferenceWorkerSet,
        "vllm",
        1,
        json!({
            "selector": {"matchLabels": {"app": "vllm"}},
            "models": [{"name": "Qwen/Qwen3-8B", "aliases": ["qwen"]}],
            "blockSize": 16,
        }),
    )
}

/// A provider whose API key is in the Secret `openai-key`.
pub fn provider() -> DynamicObject {
    obj(
        ResourceKind::InferenceProvider,
        "openai",
        1,
        json!({
            "type": "OpenAI",
            "url": "https://api.openai.com/v1",
            "credentials": {"secretRef": {"name": "openai-key"}},
            "models": [{"name": "qwen", "providerModel": "gpt-5-mini"}],
        }),
    )
}

/// The pool of both.
pub fn pool() -> DynamicObject {
    obj(
        ResourceKind::InferencePool,
        "pool",
        1,
        json!({"destinations": [
            {"kind": "InferenceWorkerSet", "name": "vllm"},
            {"kind": "InferenceProvider", "name": "openai"},
        ]}),
    )
}

/// A policy; `exclude_key` is the key of the exclude filter's condition (`if` is right).
pub fn policy(generation: i64, exclude_key: &str) -> DynamicObject {
    obj(
        ResourceKind::InferencePolicy,
        "routing",
        generation,
        json!({"rules": [
            {"name": "local-first", "matches": [{"model": "qwen"}],
             "route": {
                "exclude": [{"name": "busy", exclude_key: {"tag": "pii-detected"},
                             "drop": {"queuedPrompts": {"greaterThan": 8}}}],
                "select": [{"type": "Local", "minimize": "PredictedTTFT"},
                           {"type": "Provider", "order": ["openai"]}],
                "onEmpty": "Reject"}},
        ]}),
    )
}

/// The front door.
pub fn gateway() -> DynamicObject {
    obj(
        ResourceKind::GatewayBackend,
        "front",
        1,
        json!({"pool": "pool", "classifiers": [{"name": "pii", "type": "Pii"}]}),
    )
}

/// `o` moved to namespace `ns` (with a uid of its own there).
pub fn in_namespace(mut o: DynamicObject, ns: &str) -> DynamicObject {
    o.metadata.namespace = Some(ns.into());
    o.metadata.uid = Some(format!("uid-{ns}-{}", o.metadata.name.clone().unwrap()));
    o
}

/// A second team's namespace, `team-b`: a worker set with a static endpoint, its pool, a
/// policy (at `generation`, whose queued-prompts limit is the generation; `exclude_key` as in
/// [`policy`]) and a front door on host `b.example`.
pub fn team_b_objects(generation: i64, exclude_key: &str) -> Vec<(ResourceKind, DynamicObject)> {
    let ws = obj(
        ResourceKind::InferenceWorkerSet,
        "vllm",
        1,
        json!({"endpoints": ["10.1.0.1:8000"],
               "models": [{"name": "llama", "aliases": []}], "blockSize": 16}),
    );
    let pool = obj(
        ResourceKind::InferencePool,
        "pool",
        1,
        json!({"destinations": [{"kind": "InferenceWorkerSet", "name": "vllm"}]}),
    );
    let pol = obj(
        ResourceKind::InferencePolicy,
        "routing",
        generation,
        json!({"rules": [
            {"name": "fastest", "matches": [{"model": "llama"}],
             "route": {
                "exclude": [{"name": "busy", exclude_key: {"model": "llama"},
                             "drop": {"queuedPrompts": {"greaterThan": generation}}}],
                "select": [{"type": "Local", "minimize": "PredictedTTFT"}],
                "onEmpty": "Reject"}},
        ]}),
    );
    let door = obj(
        ResourceKind::GatewayBackend,
        "front",
        1,
        json!({"pool": "pool", "hosts": ["b.example"]}),
    );
    [
        (ResourceKind::InferenceWorkerSet, ws),
        (ResourceKind::InferencePool, pool),
        (ResourceKind::InferencePolicy, pol),
        (ResourceKind::GatewayBackend, door),
    ]
    .into_iter()
    .map(|(k, o)| (k, in_namespace(o, "team-b")))
    .collect()
}

/// The text of source `label` (`Kind/namespace/name`) in `gw`'s policy in force.
pub fn in_force_text(gw: &kinf_handler::gateway::Gateway, label: &str) -> Option<String> {
    let current = gw.store.current()?;
    current
        .sources
        .iter()
        .find(|(_, f)| f.name == label)
        .map(|(_, f)| f.text.to_string())
}
