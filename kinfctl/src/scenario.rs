//! Request and state files of `kinfctl explain` and `kinfctl test`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_policy::Qos;
use kinf_router::state::LoadSample;
use kinf_router::{ClusterState, Request};
use serde::Deserialize;

/// A request file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestFile {
    /// Requested model.
    pub model: String,
    /// Pool (`name` or `namespace/name`); needed when the bundle has several.
    #[serde(default)]
    pub pool: Option<String>,
    /// Tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Tags set by classifiers.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `interactive` (default), `batch` or `deferrable`.
    #[serde(default)]
    pub qos: Option<Qos>,
    /// Prompt size in tokens (default: estimated from `prompt`, else 1000).
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// `max_tokens` (default 256).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Prompt text (used to estimate `promptTokens` at 4 characters per token).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Streaming.
    #[serde(default)]
    pub stream: bool,
}

/// One endpoint in a state file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointFile {
    /// Passes health checks (default true).
    #[serde(default = "yes")]
    pub ready: bool,
    /// Average queued prompts.
    #[serde(default)]
    pub queued_prompts: f64,
    /// Average running prompts.
    #[serde(default)]
    pub running_prompts: f64,
    /// Average KV-cache usage 0..1.
    #[serde(default)]
    pub kv_cache_usage: f64,
    /// How many of this request's prompt tokens the endpoint already holds.
    #[serde(default)]
    pub cached_prompt_tokens: u32,
}

/// One provider in a state file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderFile {
    /// Healthy (default true).
    #[serde(default = "yes")]
    pub ready: bool,
    /// Observed TTFT.
    #[serde(default)]
    pub ttft_seconds: Option<f64>,
}

fn yes() -> bool {
    true
}

/// A state file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateFile {
    /// Endpoints by `host:port`.
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointFile>,
    /// Providers by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderFile>,
}

/// Parses a YAML (or JSON) file into `T`, with the file name in errors.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(name: &str, text: &str) -> Result<T, String> {
    let mut sources = kinf_lang::Sources::new();
    let id = sources.add(name, text);
    let mut diags = Vec::new();
    let file = sources.get(id).ok_or("internal: no source")?;
    let docs = kinf_lang::yaml::parse_documents(id, file, &mut diags);
    if let Some(d) = diags.first() {
        return Err(d.render_plain(&sources));
    }
    let json = docs
        .first()
        .map(|d| d.root.to_json())
        .unwrap_or(serde_json::Value::Null);
    serde_json::from_value(json).map_err(|e| {
        let msg = e.to_string();
        format!("{name}: {msg}{}", unknown_field_hint(&msg))
    })
}

/// Reads and parses a file.
pub fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    parse_yaml(&path.display().to_string(), &text)
}

impl RequestFile {
    /// The engine's request.
    pub fn to_request(&self) -> Request {
        let prompt_tokens = self
            .prompt_tokens
            .or_else(|| {
                self.prompt
                    .as_ref()
                    .map(|p| (p.chars().count() as u32).div_ceil(4))
            })
            .unwrap_or(1000);
        let mut r = Request::new(&self.model, prompt_tokens);
        r.pool = self.pool.as_deref().map(Arc::from);
        r.tenant = self.tenant.as_deref().map(Arc::from);
        r.tags = self.tags.iter().map(|t| Arc::from(t.as_str())).collect();
        r.qos = self.qos.unwrap_or(Qos::Interactive);
        r.max_tokens = self.max_tokens.unwrap_or(256);
        r.headers = self
            .headers
            .iter()
            .map(|(k, v)| (Arc::from(k.to_ascii_lowercase()), Arc::from(v.as_str())))
            .collect();
        r.stream = self.stream;
        r
    }
}

impl StateFile {
    /// The cluster state: every static endpoint ready, idle and cold, every provider ready,
    /// then the values of this file. Unknown endpoints or providers are errors.
    pub fn to_state(&self, policy: &CompiledPolicy) -> Result<ClusterState, String> {
        let mut st = ClusterState::from_policy(policy, 32);
        for ws in st.worker_sets.values_mut() {
            for ep in &mut ws.endpoints {
                ep.assumed_cached_tokens = Some(0);
            }
        }
        for (addr, e) in &self.endpoints {
            let mut found = false;
            for ws in st.worker_sets.values_mut() {
                for ep in ws.endpoints.iter_mut().filter(|ep| &*ep.address == addr) {
                    found = true;
                    ep.ready = e.ready;
                    ep.assumed_cached_tokens = Some(e.cached_prompt_tokens);
                    ep.load.push(LoadSample {
                        at_ms: 0,
                        queued: e.queued_prompts,
                        running: e.running_prompts,
                        kv_usage: e.kv_cache_usage,
                    });
                }
            }
            if !found {
                let known: Vec<String> = st
                    .worker_sets
                    .values()
                    .flat_map(|w| w.endpoints.iter().map(|e| e.address.to_string()))
                    .collect();
                return Err(format!(
                    "state: `{addr}` is not an endpoint of any worker set (endpoints: {})",
                    known.join(", ")
                ));
            }
        }
        // The endpoints' fields were set directly: bring each worker set's load floor up to date.
        for ws in st.worker_sets.values_mut() {
            ws.rebuild_floor();
        }
        for (name, p) in &self.providers {
            let key = st
                .providers
                .keys()
                .find(|k| k.rsplit('/').next() == Some(name.as_str()) || &***k == name)
                .cloned();
            let Some(key) = key else {
                let known: Vec<String> = st.providers.keys().map(|k| k.to_string()).collect();
                return Err(format!(
                    "state: `{name}` is not a provider (providers: {})",
                    known.join(", ")
                ));
            };
            if let Some(ps) = st.providers.get_mut(&key) {
                ps.ready = p.ready;
                ps.ttft_s = p.ttft_seconds;
            }
        }
        Ok(st)
    }
}

/// "did you mean" for serde's `unknown field `x`, expected one of `a`, `b`` messages.
fn unknown_field_hint(msg: &str) -> String {
    let Some(rest) = msg.strip_prefix("unknown field `") else {
        return String::new();
    };
    let Some((field, expected)) = rest.split_once('`') else {
        return String::new();
    };
    let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    match kinf_lang::suggest::did_you_mean(field, names.iter().copied()) {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn suggests_the_closest_field() {
        let e = super::parse_yaml::<super::RequestFile>("r.yaml", "model: m\npromptToken: 5\n")
            .unwrap_err();
        assert!(e.contains("did you mean `promptTokens`?"), "{e}");
    }
}
