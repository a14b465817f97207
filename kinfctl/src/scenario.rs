//! Request and state files of `kinfctl explain` and `kinfctl test`.
//!
//! Both are read from kinf-lang's YAML tree (see [`crate::input`]): every error says which
//! field is wrong, what it allows, and where it is (`FILE:LINE:COLUMN`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_lang::yaml::{Document, Entry, Node, Value};
use kinf_policy::Qos;
use kinf_router::state::LoadSample;
use kinf_router::{ClusterState, Request};

use crate::input::{Errors, Input, single_document};
use crate::report::{Error, ErrorKind, Place};

/// The fields of a request file.
pub const REQUEST_FIELDS: &[&str] = &[
    "model",
    "pool",
    "tenant",
    "tags",
    "qos",
    "promptTokens",
    "maxTokens",
    "n",
    "headers",
    "prompt",
    "stream",
];

/// The fields of a state file.
pub const STATE_FIELDS: &[&str] = &["endpoints", "providers"];

/// The fields of an endpoint in a state file.
pub const ENDPOINT_FIELDS: &[&str] = &[
    "ready",
    "queuedPrompts",
    "runningPrompts",
    "kvCacheUsage",
    "cachedPromptTokens",
    "maxModelLen",
];

/// The fields of a provider in a state file.
pub const PROVIDER_FIELDS: &[&str] = &["ready", "ttftSeconds"];

/// A request file.
#[derive(Clone, Debug, Default)]
pub struct RequestFile {
    /// Requested model.
    pub model: String,
    /// Pool (`name` or `namespace/name`); needed when the bundle has several.
    pub pool: Option<String>,
    /// Tenant.
    pub tenant: Option<String>,
    /// Tags set by classifiers.
    pub tags: Vec<String>,
    /// `interactive` (default), `batch` or `deferrable`.
    pub qos: Option<Qos>,
    /// Prompt size in tokens (default: estimated from `prompt`, else 1000).
    pub prompt_tokens: Option<u32>,
    /// `max_tokens` (default 256).
    pub max_tokens: Option<u32>,
    /// OpenAI's `n`: sequences generated (default 1).
    pub n: Option<u32>,
    /// Request headers, by lowercase name.
    pub headers: BTreeMap<String, String>,
    /// Prompt text (used to estimate `promptTokens` at 4 characters per token).
    pub prompt: Option<String>,
    /// Streaming.
    pub stream: bool,
}

/// One endpoint in a state file.
#[derive(Clone, Debug)]
pub struct EndpointFile {
    /// `host:port`.
    pub address: String,
    /// Passes health checks (default true).
    pub ready: bool,
    /// Average queued prompts (0 or more).
    pub queued_prompts: f64,
    /// Average running prompts (0 or more).
    pub running_prompts: f64,
    /// Average KV-cache usage, 0 to 1.
    pub kv_cache_usage: f64,
    /// How many of this request's prompt tokens the endpoint already holds.
    pub cached_prompt_tokens: u32,
    /// vLLM's `max_model_len` for the models of its worker set, as the gateway reads it from
    /// `GET /v1/models`; `None`: not reported.
    pub max_model_len: Option<u32>,
    /// The place of its key, for errors found later (`None` when not read from a file).
    pub at: Option<Place>,
}

impl EndpointFile {
    /// An endpoint that is ready, idle and cold.
    pub fn new(address: impl Into<String>) -> Self {
        EndpointFile {
            address: address.into(),
            ready: true,
            queued_prompts: 0.0,
            running_prompts: 0.0,
            kv_cache_usage: 0.0,
            cached_prompt_tokens: 0,
            max_model_len: None,
            at: None,
        }
    }
}

/// One provider in a state file.
#[derive(Clone, Debug)]
pub struct ProviderFile {
    /// Provider name or `namespace/name`.
    pub name: String,
    /// Healthy (default true).
    pub ready: bool,
    /// Observed TTFT in seconds (0 or more; default the provider's `expectedTtft`).
    pub ttft_seconds: Option<f64>,
    /// The place of its key, for errors found later (`None` when not read from a file).
    pub at: Option<Place>,
}

impl ProviderFile {
    /// A provider that is ready, with its expected TTFT.
    pub fn new(name: impl Into<String>) -> Self {
        ProviderFile {
            name: name.into(),
            ready: true,
            ttft_seconds: None,
            at: None,
        }
    }
}

/// A state file.
#[derive(Clone, Debug, Default)]
pub struct StateFile {
    /// Endpoints, in file order.
    pub endpoints: Vec<EndpointFile>,
    /// Providers, in file order.
    pub providers: Vec<ProviderFile>,
}

/// Reads a request file: one YAML (or JSON) document.
pub fn parse_request(name: &str, text: &str) -> Result<RequestFile, Errors> {
    let (input, docs) = Input::parse(name, text)?;
    request_of(input, &docs)
}

/// Reads a state file: one YAML (or JSON) document; an empty file is the default state.
pub fn parse_state(name: &str, text: &str) -> Result<StateFile, Errors> {
    let (input, docs) = Input::parse(name, text)?;
    state_of(input, &docs)
}

/// Reads a request file from disk.
pub fn read_request(path: &Path) -> Result<RequestFile, Errors> {
    let (input, docs) = Input::read(path)?;
    request_of(input, &docs)
}

/// Reads a state file from disk.
pub fn read_state(path: &Path) -> Result<StateFile, Errors> {
    let (input, docs) = Input::read(path)?;
    state_of(input, &docs)
}

fn request_of(mut input: Input, docs: &[Document]) -> Result<RequestFile, Errors> {
    let r = match single_document(&mut input, docs, "request") {
        Some(doc) => RequestFile::from_node(&mut input, &doc.root),
        None => {
            let start = input.start();
            input.error_last(
                start,
                "the request file is empty",
                Some("a request needs at least `model: NAME`".to_string()),
            );
            None
        }
    };
    input.finish(r)
}

fn state_of(mut input: Input, docs: &[Document]) -> Result<StateFile, Errors> {
    let st = match single_document(&mut input, docs, "state") {
        Some(doc) => StateFile::from_node(&mut input, &doc.root),
        None => Some(StateFile::default()),
    };
    input.finish(st)
}

impl RequestFile {
    /// Reads a request from a node (the root of a request file, or a case's `request`).
    /// Errors are recorded in `input`.
    pub fn from_node(input: &mut Input, node: &Node) -> Option<RequestFile> {
        let entries = input.mapping(node, "the request", REQUEST_FIELDS)?;
        let mut ok = true;
        let mut r = RequestFile::default();
        match input.required(
            entries,
            "model",
            node.span,
            "the request",
            "add `model: NAME`: the model the client asks for",
        ) {
            Some(n) => match input.non_empty(n, "`model`") {
                Some(m) => r.model = m,
                None => ok = false,
            },
            None => ok = false,
        }
        for e in entries {
            let n = &e.value;
            // `null` is the same as leaving an optional field out.
            if e.key == "model" || matches!(n.value, Value::Null) {
                continue;
            }
            let good = match e.key.as_str() {
                "pool" => input.non_empty(n, "`pool`").map(|v| r.pool = Some(v)),
                "tenant" => input.non_empty(n, "`tenant`").map(|v| r.tenant = Some(v)),
                "prompt" => input.string(n, "`prompt`").map(|v| r.prompt = Some(v)),
                "tags" => input.strings(n, "`tags`", "each tag").map(|v| r.tags = v),
                "qos" => qos(input, n).map(|v| r.qos = Some(v)),
                "promptTokens" => input
                    .count(n, "`promptTokens`")
                    .map(|v| r.prompt_tokens = Some(v)),
                "maxTokens" => input
                    .count(n, "`maxTokens`")
                    .map(|v| r.max_tokens = Some(v)),
                "n" => input.positive_count(n, "`n`").map(|v| r.n = Some(v)),
                "stream" => input.boolean(n, "`stream`").map(|v| r.stream = v),
                "headers" => headers(input, n).map(|v| r.headers = v),
                // Unknown fields were reported by `mapping`.
                _ => None,
            };
            ok &= good.is_some();
        }
        ok.then_some(r)
    }

    /// The engine's request.
    pub fn to_request(&self) -> Request {
        let prompt_tokens = self
            .prompt_tokens
            .or_else(|| {
                self.prompt.as_ref().map(|p| {
                    u32::try_from(p.chars().count())
                        .unwrap_or(u32::MAX)
                        .div_ceil(4)
                })
            })
            .unwrap_or(1000);
        let mut r = Request::new(&self.model, prompt_tokens);
        r.pool = self.pool.as_deref().map(Arc::from);
        r.tenant = self.tenant.as_deref().map(Arc::from);
        r.tags = self.tags.iter().map(|t| Arc::from(t.as_str())).collect();
        r.qos = self.qos.unwrap_or(Qos::Interactive);
        r.max_tokens = self.max_tokens.unwrap_or(256);
        r.sequences = self.n.unwrap_or(1);
        // As the gateway counts it; checked only against endpoints given a `maxModelLen`.
        r.required_context = Some(Request::context_needed(prompt_tokens, self.max_tokens));
        r.headers = self
            .headers
            .iter()
            .map(|(k, v)| (Arc::from(k.to_ascii_lowercase()), Arc::from(v.as_str())))
            .collect();
        r.stream = self.stream;
        r
    }
}

fn qos(input: &mut Input, node: &Node) -> Option<Qos> {
    const ALL: [Qos; 3] = [Qos::Interactive, Qos::Batch, Qos::Deferrable];
    if let Some(q) = node
        .as_str()
        .and_then(|s| ALL.into_iter().find(|q| q.as_str() == s))
    {
        return Some(q);
    }
    let found = input.found(node);
    let help = node.as_str().and_then(|s| {
        kinf_lang::suggest::did_you_mean(s, ALL.iter().map(|q| q.as_str()))
            .map(|q| format!("did you mean `{q}`?"))
    });
    input.error(
        node.span,
        format!("`qos` must be `interactive`, `batch` or `deferrable`, not {found}"),
        help,
    );
    None
}

fn headers(input: &mut Input, node: &Node) -> Option<BTreeMap<String, String>> {
    let Value::Map(entries) = &node.value else {
        let found = input.found(node);
        input.error(
            node.span,
            format!("`headers` must be a mapping of header names to values, not {found}"),
            None,
        );
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries {
        let what = format!("the value of header `{}`", e.key);
        let Some(v) = input.string(&e.value, &what) else {
            ok = false;
            continue;
        };
        if out.insert(e.key.as_str().to_ascii_lowercase(), v).is_some() {
            input.error(
                e.key_span,
                format!(
                    "header `{}` is given twice (header names are case-insensitive)",
                    e.key
                ),
                None,
            );
            ok = false;
        }
    }
    ok.then_some(out)
}

impl StateFile {
    /// Reads a state from a node (the root of a state file, or a case's `state`); `null` is the
    /// default state. Errors are recorded in `input`.
    pub fn from_node(input: &mut Input, node: &Node) -> Option<StateFile> {
        if matches!(node.value, Value::Null) {
            return Some(StateFile::default());
        }
        let entries = input.mapping(node, "the state", STATE_FIELDS)?;
        let mut ok = true;
        let mut st = StateFile::default();
        for e in entries {
            if matches!(e.value.value, Value::Null) {
                continue;
            }
            match e.key.as_str() {
                "endpoints" => match keyed(input, &e.value, "`endpoints`", "`host:port`") {
                    Some(list) => {
                        for item in list {
                            match endpoint(input, item) {
                                Some(ep) => st.endpoints.push(ep),
                                None => ok = false,
                            }
                        }
                    }
                    None => ok = false,
                },
                "providers" => match keyed(input, &e.value, "`providers`", "provider names") {
                    Some(list) => {
                        for item in list {
                            match provider(input, item) {
                                Some(p) => st.providers.push(p),
                                None => ok = false,
                            }
                        }
                    }
                    None => ok = false,
                },
                _ => ok = false,
            }
        }
        ok.then_some(st)
    }

    /// The cluster state: every static endpoint ready, idle and cold, every provider ready,
    /// then the values of this file. Unknown endpoints or providers are errors, at the place
    /// they are written.
    pub fn to_state(&self, policy: &CompiledPolicy) -> Result<ClusterState, Error> {
        let mut st = ClusterState::from_policy(policy, 32);
        for ws in st.worker_sets.values_mut() {
            for ep in &mut ws.endpoints {
                ep.assumed_cached_tokens = Some(0);
            }
        }
        for e in &self.endpoints {
            let mut found = false;
            for (key, ws) in st.worker_sets.iter_mut() {
                if let Some(len) = e.max_model_len
                    && ws.endpoints.iter().any(|ep| *ep.address == *e.address)
                {
                    // The length applies to every model the worker set serves.
                    let models: Vec<(Arc<str>, u64)> = policy
                        .destinations
                        .iter()
                        .filter(|d| format!("{}/{}", d.namespace, d.name) == **key)
                        .flat_map(|d| {
                            d.models
                                .iter()
                                .map(|m| (m.upstream.clone(), u64::from(len)))
                        })
                        .collect();
                    ws.set_max_model_lens(&e.address, models);
                }
                for ep in ws
                    .endpoints
                    .iter_mut()
                    .filter(|ep| *ep.address == *e.address)
                {
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
                // Sorted: the worker sets are in no particular order.
                let mut known: Vec<String> = st
                    .worker_sets
                    .values()
                    .flat_map(|w| w.endpoints.iter().map(|e| e.address.to_string()))
                    .collect();
                known.sort();
                known.dedup();
                return Err(Error::new(
                    ErrorKind::Input,
                    format!(
                        "state: `{}` is not an endpoint of any worker set (endpoints: {})",
                        e.address,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
                .at(e.at.clone()));
            }
        }
        // The endpoints' fields were set directly: bring each worker set's load floor up to date.
        for ws in st.worker_sets.values_mut() {
            ws.rebuild_floor();
        }
        for p in &self.providers {
            // Sorted, so that the first of two providers of the same name is always the same one
            // (the providers are in no particular order).
            let mut keys: Vec<&Arc<str>> = st.providers.keys().collect();
            keys.sort();
            let key = keys
                .iter()
                .find(|k| k.rsplit('/').next() == Some(p.name.as_str()) || ****k == *p.name)
                .map(|k| Arc::clone(k));
            let Some(key) = key else {
                let known: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                let help = kinf_lang::suggest::did_you_mean(
                    &p.name,
                    keys.iter().map(|k| k.rsplit('/').next().unwrap_or(k)),
                )
                .map(|s| format!("did you mean `{s}`?"));
                let err = Error::new(
                    ErrorKind::Input,
                    format!(
                        "state: `{}` is not a provider (providers: {})",
                        p.name,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
                .at(p.at.clone());
                return Err(match help {
                    Some(h) => err.with_help(h),
                    None => err,
                });
            };
            if let Some(ps) = st.providers.get_mut(&key) {
                ps.ready = p.ready;
                ps.ttft_s = p.ttft_seconds;
            }
        }
        Ok(st)
    }
}

/// The entries of `endpoints` or `providers`: a mapping from `keys` to fields.
fn keyed<'n>(input: &mut Input, node: &'n Node, what: &str, keys: &str) -> Option<&'n [Entry]> {
    match &node.value {
        Value::Map(entries) => Some(entries),
        _ => {
            let found = input.found(node);
            input.error(
                node.span,
                format!("{what} must be a mapping from {keys} to fields, not {found}"),
                None,
            );
            None
        }
    }
}

fn endpoint(input: &mut Input, item: &Entry) -> Option<EndpointFile> {
    let mut ep = EndpointFile::new(item.key.as_str());
    ep.at = input.at(item.key_span);
    // `"10.0.0.1:8000":` with nothing after it: ready, idle and cold.
    if matches!(item.value.value, Value::Null) {
        return Some(ep);
    }
    let what = format!("endpoint `{}`", item.key);
    let entries = input.mapping(&item.value, &what, ENDPOINT_FIELDS)?;
    let mut ok = true;
    for e in entries {
        let n = &e.value;
        let field = format!("`{}` of {what}", e.key);
        let good = match e.key.as_str() {
            "ready" => input.boolean(n, &field).map(|v| ep.ready = v),
            "queuedPrompts" => input
                .number(n, &field, 0.0, None)
                .map(|v| ep.queued_prompts = v),
            "runningPrompts" => input
                .number(n, &field, 0.0, None)
                .map(|v| ep.running_prompts = v),
            "kvCacheUsage" => {
                let v = input.number(n, &field, 0.0, Some(1.0));
                if v.is_none() {
                    kv_help(input, n);
                }
                v.map(|v| ep.kv_cache_usage = v)
            }
            "cachedPromptTokens" => input.count(n, &field).map(|v| ep.cached_prompt_tokens = v),
            "maxModelLen" => input
                .positive_count(n, &field)
                .map(|v| ep.max_model_len = Some(v)),
            _ => None,
        };
        ok &= good.is_some();
    }
    ok.then_some(ep)
}

/// `kvCacheUsage` is a fraction: says so after a value above 1, which may be a percentage.
fn kv_help(input: &mut Input, node: &Node) {
    let above_one = match node.value {
        Value::Int(i) => i > 1,
        Value::Float(f) => f.is_finite() && f > 1.0,
        _ => false,
    };
    if above_one {
        input.add_help(
            "`kvCacheUsage` is the used fraction of the KV cache: write 0.9 for 90%".to_string(),
        );
    }
}

fn provider(input: &mut Input, item: &Entry) -> Option<ProviderFile> {
    let mut p = ProviderFile::new(item.key.as_str());
    p.at = input.at(item.key_span);
    if matches!(item.value.value, Value::Null) {
        return Some(p);
    }
    let what = format!("provider `{}`", item.key);
    let entries = input.mapping(&item.value, &what, PROVIDER_FIELDS)?;
    let mut ok = true;
    for e in entries {
        let n = &e.value;
        let field = format!("`{}` of {what}", e.key);
        let good = match e.key.as_str() {
            "ready" => input.boolean(n, &field).map(|v| p.ready = v),
            "ttftSeconds" if matches!(n.value, Value::Null) => Some(()),
            "ttftSeconds" => input
                .number(n, &field, 0.0, None)
                .map(|v| p.ttft_seconds = Some(v)),
            _ => None,
        };
        ok &= good.is_some();
    }
    ok.then_some(p)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::{parse_request, parse_state};

    fn request_error(text: &str) -> String {
        lines(parse_request("r.yaml", text).unwrap_err())
    }

    fn state_error(text: &str) -> String {
        lines(parse_state("s.yaml", text).unwrap_err())
    }

    fn lines(errors: crate::input::Errors) -> String {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        text.join("\n")
    }

    #[test]
    fn suggests_the_closest_field() {
        let e = request_error("model: m\npromptToken: 5\n");
        assert_eq!(
            e,
            "r.yaml:2:1: unknown field `promptToken` in the request\n  help: did you mean `promptTokens`?"
        );
    }

    #[test]
    fn request_errors_name_the_field_the_place_and_what_is_allowed() {
        assert_eq!(
            request_error("{ model: llama-70b, promptTokens: -5 }\n"),
            "r.yaml:1:35: `promptTokens` must be a whole number from 0 to 4294967295, not `-5`"
        );
        assert_eq!(
            request_error("{ model: llama-70b, promptTokens: 99999999999999999999 }\n"),
            "r.yaml:1:35: `promptTokens` must be a whole number from 0 to 4294967295, not `99999999999999999999`"
        );
        assert_eq!(
            request_error("model: m\nmaxTokens: \"512\"\n"),
            "r.yaml:2:12: `maxTokens` must be a whole number from 0 to 4294967295, not `\"512\"`\n  help: write `512` without quotes"
        );
        assert_eq!(
            request_error("{ model: llama-70b, qos: BATCH }\n"),
            "r.yaml:1:26: `qos` must be `interactive`, `batch` or `deferrable`, not `BATCH`\n  help: did you mean `batch`?"
        );
        assert_eq!(
            request_error("model: m\nheaders: { X-A: 1 }\n"),
            "r.yaml:2:17: the value of header `X-A` must be a string, not `1`\n  help: quote it: `\"1\"`"
        );
        assert_eq!(
            request_error("tags: [a]\n"),
            "r.yaml:1:1: the request has no `model`\n  help: add `model: NAME`: the model the client asks for"
        );
        assert_eq!(
            request_error(""),
            "r.yaml:1:1: the request file is empty\n  help: a request needs at least `model: NAME`"
        );
        // Every error of the file, not only the first; columns count characters.
        assert_eq!(
            request_error("model: \"日本\"\ntags: [a, 1]\nstream: yes\n"),
            "r.yaml:2:11: each tag must be a string, not `1`\n  help: quote it: `\"1\"`\nr.yaml:3:9: `stream` must be `true` or `false`, not `yes`"
        );
        assert_eq!(
            request_error("{ model: m, model: n }\n"),
            "r.yaml:1:13: duplicate key `model`\n  note: r.yaml:1:3: first written here\n  help: remove one of the two keys; only the first would be used"
        );
    }

    #[test]
    fn max_model_len_leaves_out_worker_sets_whose_context_is_too_short() {
        let bundle = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: short }
spec: { endpoints: ["10.0.0.1:8000"], models: [{ name: m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: long }
spec: { endpoints: ["10.0.1.1:8000"], models: [{ name: m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p }
spec:
  destinations: [{ kind: InferenceWorkerSet, name: short }, { kind: InferenceWorkerSet, name: long }]
"#;
        let (_, c) = kinf_lang::compile_str("p.yaml", bundle);
        let policy = c.policy.unwrap();
        let st = parse_state(
            "s.yaml",
            "endpoints:\n  \"10.0.0.1:8000\": { maxModelLen: 4096 }\n  \"10.0.1.1:8000\": { maxModelLen: 32768, queuedPrompts: 3 }\n",
        )
        .unwrap()
        .to_state(&policy)
        .unwrap();
        let decide = |text: &str| {
            let req = parse_request("r.yaml", text).unwrap().to_request();
            kinf_router::Decider::decide(&policy, &req, &st)
        };
        let to = |d: &kinf_router::Decision| d.route().map(|r| r.endpoint.to_string());
        // 2,000 + 1 fits the idle `short`; 4,000 + 100 does not, and goes to the busy `long`.
        assert_eq!(
            to(&decide("model: m\npromptTokens: 2000\n")).as_deref(),
            Some("10.0.0.1:8000")
        );
        assert_eq!(
            to(&decide("model: m\npromptTokens: 4000\nmaxTokens: 100\n")).as_deref(),
            Some("10.0.1.1:8000")
        );
        let d = decide("model: m\npromptTokens: 40000\n");
        let kinf_router::Outcome::Reject(r) = &d.outcome else {
            panic!("{d:?}");
        };
        assert_eq!((r.status, r.code), (400, "context_length_exceeded"));
        assert_eq!(
            lines(
                parse_state(
                    "s.yaml",
                    "endpoints:\n  \"10.0.0.1:8000\": { maxModelLen: 0 }\n"
                )
                .unwrap_err()
            ),
            "s.yaml:2:35: `maxModelLen` of endpoint `10.0.0.1:8000` must be at least 1, not 0"
        );
    }

    #[test]
    fn n_sets_the_sequences_and_must_be_at_least_one() {
        assert_eq!(
            request_error("model: m\nn: 0\n"),
            "r.yaml:2:4: `n` must be at least 1, not 0"
        );
        assert_eq!(
            request_error("model: m\nn: -1\n"),
            "r.yaml:2:4: `n` must be a whole number from 0 to 4294967295, not `-1`"
        );
        let r = parse_request("r.yaml", "model: m\nmaxTokens: 10\nn: 3\n").unwrap();
        let req = r.to_request();
        assert_eq!((req.max_tokens, req.sequences), (10, 3));
        assert_eq!(req.decode_tokens(), 30.0);
        let one = parse_request("r.yaml", "model: m\n").unwrap().to_request();
        assert_eq!(one.sequences, 1);
    }

    #[test]
    fn a_second_request_or_state_document_is_an_error() {
        assert_eq!(
            request_error("{ model: a }\n---\n{ model: b }\n"),
            "r.yaml:3:1: a request file holds one YAML document; this is document 2 of 2\n  help: put each request in its own file; to decide several requests, write them as cases of `kinfctl test`"
        );
        assert_eq!(
            state_error("endpoints: {}\n---\nproviders: {}\n"),
            "s.yaml:3:1: a state file holds one YAML document; this is document 2 of 2\n  help: put each state in its own file"
        );
    }

    #[test]
    fn state_values_are_checked() {
        let e = state_error(
            "endpoints:\n  \"10.0.0.1:8000\": { queuedPrompts: -100, kvCacheUsage: 7 }\n  \"10.0.0.2:8000\": { runningPrompts: .nan, cachedPromptTokens: 1.5 }\nproviders:\n  bedrock: { ttftSeconds: -3, ready: \"false\" }\n",
        );
        assert_eq!(
            e,
            "s.yaml:2:37: `queuedPrompts` of endpoint `10.0.0.1:8000` must be a number, 0 or more, not `-100`
s.yaml:2:57: `kvCacheUsage` of endpoint `10.0.0.1:8000` must be a number from 0 to 1, not `7`
  help: `kvCacheUsage` is the used fraction of the KV cache: write 0.9 for 90%
s.yaml:3:38: `runningPrompts` of endpoint `10.0.0.2:8000` must be a number, 0 or more, not `.nan`
s.yaml:3:64: `cachedPromptTokens` of endpoint `10.0.0.2:8000` must be a whole number from 0 to 4294967295, not `1.5`
s.yaml:5:27: `ttftSeconds` of provider `bedrock` must be a number, 0 or more, not `-3`
s.yaml:5:38: `ready` of provider `bedrock` must be `true` or `false`, not `\"false\"`
  help: write `false` without quotes"
        );
        assert_eq!(
            state_error("endpoints:\n  \"10.0.0.1:8000\": { kvCacheUsage: .inf, queued: 1 }\n"),
            "s.yaml:2:36: `kvCacheUsage` of endpoint `10.0.0.1:8000` must be a number from 0 to 1, not `.inf`
s.yaml:2:42: unknown field `queued` in endpoint `10.0.0.1:8000`
  help: fields: `ready`, `queuedPrompts`, `runningPrompts`, `kvCacheUsage`, `cachedPromptTokens`, `maxModelLen`"
        );
        let st = parse_state(
            "s.yaml",
            "endpoints:\n  \"10.0.0.1:8000\": { kvCacheUsage: 1, queuedPrompts: 2.5 }\n  \"10.0.0.2:8000\":\n",
        )
        .unwrap();
        assert_eq!(st.endpoints.len(), 2);
        assert_eq!(st.endpoints[0].kv_cache_usage, 1.0);
        assert_eq!(st.endpoints[0].queued_prompts, 2.5);
        let at = st.endpoints[0].at.as_ref().unwrap();
        assert_eq!((at.file.as_str(), at.line, at.column), ("s.yaml", 2, 3));
        assert_eq!(at.to_string(), "s.yaml:2:3");
        assert!(st.endpoints[1].ready);
        assert!(parse_state("s.yaml", "").unwrap().endpoints.is_empty());
    }
}
