//! The last good policy across restarts: the leader keeps the objects of the policy in force
//! in a ConfigMap beside its Lease (`<lease>-last-good`), and a replica that starts while the
//! cluster's current bundle is refused serves those objects instead of nothing (`/readyz` 503
//! for every replica after a rolling update during a bad edit).
//!
//! Only the resources' `spec`s are kept: endpoints are selected from the current pods and
//! Secret values read from the current Secrets whenever the kept policy is compiled, exactly as
//! for the policy in force of a running replica while a newer bundle is refused.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kinf_policy::ResourceKind;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::store::{ObjectKey, StoredObject};
use super::{FIELD_MANAGER, REQUEST_TIMEOUT};

/// The ConfigMap key holding the objects (JSON).
pub const DATA_KEY: &str = "objects.json";

/// Largest content written: a ConfigMap holds at most 1 MiB, with room for its metadata.
pub const MAX_BYTES: usize = 900 * 1024;

/// The ConfigMap's name for Lease `lease_name`.
pub fn config_map_name(lease_name: &str) -> String {
    format!("{lease_name}-last-good")
}

/// One kept object.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    kind: String,
    namespace: String,
    name: String,
    spec: serde_json::Value,
    /// `metadata.creationTimestamp` (front doors are ordered by it), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<String>,
}

/// The JSON kept for `objects` (sorted by kind, namespace and name).
pub fn encode(objects: &[StoredObject]) -> Result<String, String> {
    let mut kept: Vec<Kept> = objects
        .iter()
        .map(|o| Kept {
            kind: o.key.kind.as_str().to_owned(),
            namespace: o.key.namespace.clone(),
            name: o.key.name.clone(),
            spec: o.spec.clone(),
            created: o.created.map(|t| t.to_string()),
        })
        .collect();
    kept.sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    serde_json::to_string(&kept).map_err(|e| format!("the policy in force cannot be kept: {e}"))
}

/// The objects of a kept JSON, or why it cannot be read.
pub fn decode(text: &str) -> Result<Vec<StoredObject>, String> {
    let kept: Vec<Kept> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    kept.into_iter()
        .map(|k| {
            let kind =
                ResourceKind::parse(&k.kind).ok_or_else(|| format!("unknown kind `{}`", k.kind))?;
            let mut o = StoredObject::new(
                ObjectKey {
                    kind,
                    namespace: k.namespace,
                    name: k.name,
                },
                None,
                k.spec,
                serde_json::Value::Null,
            );
            o.created = match k.created {
                Some(t) => Some(t.parse().map_err(|e| format!("`{t}`: {e}"))?),
                None => None,
            };
            Ok(o)
        })
        .collect()
}

/// Reads the kept objects: `Ok(None)` when the ConfigMap or its key does not exist.
pub async fn read(api: &Api<ConfigMap>, name: &str) -> Result<Option<Vec<StoredObject>>, String> {
    let got = tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(name))
        .await
        .map_err(|_| format!("reading ConfigMap `{name}` timed out"))?
        .map_err(|e| format!("reading ConfigMap `{name}`: {e}"))?;
    let Some(text) = got
        .and_then(|cm| cm.data)
        .and_then(|d| d.get(DATA_KEY).cloned())
    else {
        return Ok(None);
    };
    decode(&text)
        .map(Some)
        .map_err(|e| format!("ConfigMap `{name}` key `{DATA_KEY}`: {e}"))
}

/// Writes `json` (from [`encode`]) with a server-side apply (creates the ConfigMap when
/// missing).
pub async fn write(api: &Api<ConfigMap>, name: &str, json: &str) -> Result<(), String> {
    if json.len() > MAX_BYTES {
        return Err(format!(
            "the policy in force is {} bytes, more than a ConfigMap holds ({MAX_BYTES}); not kept",
            json.len()
        ));
    }
    let cm = ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "kinference".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(DATA_KEY.to_owned(), json.to_owned())])),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&cm).map_err(|e| e.to_string())?;
    if let Some(m) = value.as_object_mut() {
        m.insert("apiVersion".into(), "v1".into());
        m.insert("kind".into(), "ConfigMap".into());
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        api.patch(name, &params, &Patch::Apply(&value)),
    )
    .await
    .map_err(|_| format!("writing ConfigMap `{name}` timed out"))?
    .map(|_| ())
    .map_err(|e| format!("writing ConfigMap `{name}`: {e}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kept_objects_read_back_as_the_same_sources() {
        let mut door = StoredObject::new(
            ObjectKey {
                kind: ResourceKind::GatewayBackend,
                namespace: "llm".into(),
                name: "front".into(),
            },
            Some(3),
            serde_json::json!({"hosts": ["a.example"]}),
            serde_json::json!({"conditions": []}),
        );
        door.created = Some("2026-11-30T10:00:00Z".parse().unwrap());
        let ws = StoredObject::new(
            ObjectKey {
                kind: ResourceKind::InferenceWorkerSet,
                namespace: "llm".into(),
                name: "vllm".into(),
            },
            Some(1),
            serde_json::json!({"selector": {"matchLabels": {"app": "vllm"}}}),
            serde_json::Value::Null,
        );
        let back = decode(&encode(&[door.clone(), ws.clone()]).unwrap()).unwrap();
        assert_eq!(back.len(), 2);
        for (orig, got) in [(&door, &back[0]), (&ws, &back[1])] {
            assert_eq!(got.key, orig.key);
            assert_eq!(got.spec, orig.spec);
            assert_eq!(got.source, orig.source, "the compiled source is the same");
            assert_eq!(got.created, orig.created);
            // Status and generation are the cluster's, not kept.
            assert_eq!(got.status, serde_json::Value::Null);
        }
        assert!(
            decode("[{\"kind\":\"Nope\",\"namespace\":\"a\",\"name\":\"b\",\"spec\":{}}]")
                .unwrap_err()
                .contains("unknown kind `Nope`")
        );
        assert!(decode("not json").is_err());
    }
}
