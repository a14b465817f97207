//! Protocol translation of requests and whole (non-streamed) responses, through a small
//! canonical form: system text, text messages, sampling limits; a response's text, finish
//! reason and usage.

use kinf_policy::MaxTokensField;
use kinf_router::usage::TokenUsage;
use serde_json::{Map, Value, json};

use crate::gateway::errors::Api;

/// Default `max_tokens` when the client set none and the provider requires one (Anthropic).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Why a response ended, in canonical terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Natural end of turn.
    EndTurn,
    /// A stop sequence matched.
    StopSequence,
    /// The token limit was reached.
    Length,
    /// The model called a tool.
    ToolUse,
    /// Content filtered or refused.
    ContentFilter,
}

impl Finish {
    /// From an OpenAI `finish_reason`.
    pub fn from_openai(s: &str) -> Self {
        match s {
            "length" => Finish::Length,
            "tool_calls" | "function_call" => Finish::ToolUse,
            "content_filter" => Finish::ContentFilter,
            _ => Finish::EndTurn,
        }
    }

    /// From an OpenAI-compatible choice (`finish_reason`), with the stop sequence that ended
    /// it when the provider names it: vLLM's `stop_reason`, a string when a stop sequence
    /// matched (a token id for a stop token). OpenAI's `stop` covers both.
    pub fn from_openai_choice(c: &Value) -> Option<(Self, Option<String>)> {
        let f = c.get("finish_reason").and_then(Value::as_str)?;
        let matched = c
            .get("stop_reason")
            .and_then(Value::as_str)
            .filter(|_| f == "stop");
        Some(match matched {
            Some(s) => (Finish::StopSequence, Some(s.to_string())),
            None => (Finish::from_openai(f), None),
        })
    }

    /// From an Anthropic `stop_reason`.
    pub fn from_anthropic(s: &str) -> Self {
        match s {
            "max_tokens" | "model_context_window_exceeded" => Finish::Length,
            "stop_sequence" => Finish::StopSequence,
            "tool_use" => Finish::ToolUse,
            "refusal" => Finish::ContentFilter,
            _ => Finish::EndTurn,
        }
    }

    /// From a Bedrock `stopReason`.
    pub fn from_bedrock(s: &str) -> Self {
        match s {
            "max_tokens" | "model_context_window_exceeded" => Finish::Length,
            "stop_sequence" => Finish::StopSequence,
            "tool_use" => Finish::ToolUse,
            "guardrail_intervened" | "content_filtered" => Finish::ContentFilter,
            _ => Finish::EndTurn,
        }
    }

    /// As an OpenAI `finish_reason`.
    pub fn openai(&self) -> &'static str {
        match self {
            Finish::EndTurn | Finish::StopSequence => "stop",
            Finish::Length => "length",
            Finish::ToolUse => "tool_calls",
            Finish::ContentFilter => "content_filter",
        }
    }

    /// As an Anthropic `stop_reason`.
    pub fn anthropic(&self) -> &'static str {
        match self {
            Finish::EndTurn => "end_turn",
            Finish::StopSequence => "stop_sequence",
            Finish::Length => "max_tokens",
            Finish::ToolUse => "tool_use",
            Finish::ContentFilter => "refusal",
        }
    }
}

/// A text message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Msg {
    /// `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub text: String,
    /// Prompt-cache breakpoints the client set in it (Anthropic `cache_control` on a content
    /// block): byte offsets into `text` where a prefix to cache ends (see [`ChatRequest`]).
    pub cache: Vec<usize>,
}

/// A request in canonical form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatRequest {
    /// System text (OpenAI `system`/`developer` messages, Anthropic `system`).
    pub system: Vec<String>,
    /// The conversation.
    pub messages: Vec<Msg>,
    /// Output token limit.
    pub max_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Prompt-cache breakpoints the client set in `system` (Anthropic `cache_control` on a
    /// system block): `(index into system, byte offset into that text)` where a prefix to
    /// cache ends. Sent to Bedrock as `cachePoint` blocks (see [`bedrock_caches`]); other
    /// protocols have no such marker (OpenAI caches prefixes by itself).
    pub system_cache: Vec<(usize, usize)>,
}

impl ChatRequest {
    /// Drops the prompt-cache breakpoints (for a model that refuses them).
    pub fn forget_cache_points(&mut self) {
        self.system_cache.clear();
        for m in &mut self.messages {
            m.cache.clear();
        }
    }
}

/// A translation the gateway cannot make (the request uses a feature outside the canonical
/// form: tools, images, `n > 1`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untranslatable {
    /// The field at fault.
    pub param: String,
    /// Why.
    pub message: String,
}

fn untranslatable(param: impl Into<String>, message: impl Into<String>) -> Untranslatable {
    Untranslatable {
        param: param.into(),
        message: message.into(),
    }
}

/// Text of an OpenAI or Anthropic `content` (a string, or text parts joined by newlines, as
/// the gateway reads them, so that words of adjacent parts do not run together).
fn content_text(v: &Value, param: &str) -> Result<String, Untranslatable> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut texts: Vec<&str> = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") => {
                        texts.push(p.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    other => {
                        return Err(untranslatable(
                            format!("{param}[{i}].type"),
                            format!(
                                "content parts of type `{}` cannot be translated to this provider's protocol",
                                other.unwrap_or("?")
                            ),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(untranslatable(
            param,
            "`content` must be a string or an array",
        )),
    }
}

/// Whether an Anthropic `cache_control` asks to cache (`{"type": "ephemeral"}`, the only
/// kind there is).
fn asks_cache(cache_control: Option<&Value>) -> bool {
    cache_control
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
        == Some("ephemeral")
}

/// The prompt-cache breakpoints of an Anthropic `content` (or `system`) whose text is `full`
/// (as [`content_text`] reads it): for each block with `cache_control`, the byte length of
/// the text up to and including that block, read by [`content_text`] too, so that the offset
/// is where that block's text ends in `full` however blocks are joined. A block that ends no
/// text (nothing before it, or an offset that is not where `full` has that prefix) is skipped.
fn cache_breaks(content: &Value, param: &str, full: &str) -> Vec<usize> {
    let Value::Array(parts) = content else {
        return Vec::new();
    };
    parts
        .iter()
        .enumerate()
        .filter(|(_, p)| asks_cache(p.get("cache_control")))
        .filter_map(|(i, _)| {
            let prefix = content_text(&Value::Array(parts.get(..=i)?.to_vec()), param).ok()?;
            (!prefix.is_empty() && full.starts_with(&prefix)).then_some(prefix.len())
        })
        .collect()
}

fn stop_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Reads a client request into canonical form.
pub fn parse_client(api: Api, body: &Map<String, Value>) -> Result<ChatRequest, Untranslatable> {
    let mut r = ChatRequest {
        temperature: body.get("temperature").and_then(Value::as_f64),
        top_p: body.get("top_p").and_then(Value::as_f64),
        ..ChatRequest::default()
    };
    // No tools (absent, `null` or an empty list, which Anthropic's SDK users send when a
    // tool list comes out empty) and a `tool_choice` that calls none (`none`, `auto`) is a
    // plain text request; anything else needs tool calling, which is not translated.
    let no_tools = |key: &str| {
        body.get(key)
            .is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
    };
    for key in ["tools", "functions"] {
        if !no_tools(key) {
            return Err(untranslatable(
                key,
                format!("`{key}` cannot be translated to this provider's protocol"),
            ));
        }
    }
    for key in ["tool_choice", "function_call"] {
        let calls_none = |v: &Value| {
            let mode = v.as_str().or_else(|| v.get("type").and_then(Value::as_str));
            v.is_null() || matches!(mode, Some("none" | "auto"))
        };
        if body.get(key).is_some_and(|v| !calls_none(v)) {
            return Err(untranslatable(
                key,
                format!("`{key}` cannot be translated to this provider's protocol"),
            ));
        }
    }
    // Parameters that change what comes back (a format, extra fields, reasoning) cannot be
    // dropped without the client noticing too late; sampling tweaks (`seed`, penalties,
    // `top_k`) are dropped, as providers.md says.
    let changes_output = |key: &str, v: &Value| match key {
        "response_format" => v.get("type").and_then(Value::as_str) != Some("text"),
        "logprobs" => v.as_bool() == Some(true) || v.as_u64().is_some_and(|n| n > 0),
        "top_logprobs" => v.as_u64().is_some_and(|n| n > 0),
        "thinking" => v.get("type").and_then(Value::as_str) != Some("disabled"),
        // Legacy completions: the prompt echoed back, text inserted before a suffix.
        "echo" => v.as_bool() == Some(true),
        "suffix" => v.as_str().is_some_and(|s| !s.is_empty()),
        _ => false,
    };
    for key in [
        "response_format",
        "logprobs",
        "top_logprobs",
        "thinking",
        "echo",
        "suffix",
    ] {
        if let Some(v) = body.get(key).filter(|v| !v.is_null())
            && changes_output(key, v)
        {
            return Err(untranslatable(
                key,
                format!("`{key}` cannot be translated to this provider's protocol"),
            ));
        }
    }
    match api {
        Api::Chat | Api::Completions => {
            if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
                return Err(untranslatable("n", "`n` > 1 cannot be translated"));
            }
            // As the gateway reads it for admission: `max_completion_tokens` when set (not
            // `null`), else `max_tokens`.
            r.max_tokens = ["max_completion_tokens", "max_tokens"]
                .iter()
                .find_map(|k| body.get(*k).filter(|v| !v.is_null()))
                .and_then(Value::as_u64);
            r.stop = stop_list(body.get("stop"));
            if api == Api::Completions {
                let prompt = match body.get("prompt") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                        a[0].as_str().unwrap_or("").to_string()
                    }
                    _ => {
                        return Err(untranslatable(
                            "prompt",
                            "only a single string `prompt` can be translated",
                        ));
                    }
                };
                r.messages.push(Msg {
                    role: "user".into(),
                    text: prompt,
                    ..Msg::default()
                });
                return Ok(r);
            }
            let msgs = body
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| untranslatable("messages", "`messages` is required"))?;
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                let param = format!("messages[{i}].content");
                for key in ["tool_calls", "function_call"] {
                    // `"tool_calls": []` (some clients send it on every assistant turn) calls
                    // nothing.
                    if m.get(key)
                        .is_some_and(|v| !v.is_null() && !v.as_array().is_some_and(Vec::is_empty))
                    {
                        return Err(untranslatable(
                            format!("messages[{i}].{key}"),
                            "tool calls cannot be translated to this provider's protocol",
                        ));
                    }
                }
                let text = content_text(m.get("content").unwrap_or(&Value::Null), &param)?;
                match role {
                    "system" | "developer" => r.system.push(text),
                    "user" | "assistant" => r.messages.push(Msg {
                        role: role.into(),
                        text,
                        ..Msg::default()
                    }),
                    other => {
                        return Err(untranslatable(
                            format!("messages[{i}].role"),
                            format!("messages of role `{other}` cannot be translated"),
                        ));
                    }
                }
            }
        }
        Api::Messages => {
            r.max_tokens = body.get("max_tokens").and_then(Value::as_u64);
            r.stop = stop_list(body.get("stop_sequences"));
            match body.get("system") {
                None | Some(Value::Null) => {}
                Some(s) => {
                    let text = content_text(s, "system")?;
                    let i = r.system.len();
                    r.system_cache
                        .extend(cache_breaks(s, "system", &text).into_iter().map(|c| (i, c)));
                    r.system.push(text);
                }
            }
            let msgs = body
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| untranslatable("messages", "`messages` is required"))?;
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                if role != "user" && role != "assistant" {
                    return Err(untranslatable(
                        format!("messages[{i}].role"),
                        format!("messages of role `{role}` cannot be translated"),
                    ));
                }
                let content = m.get("content").unwrap_or(&Value::Null);
                let param = format!("messages[{i}].content");
                let text = content_text(content, &param)?;
                r.messages.push(Msg {
                    role: role.into(),
                    cache: cache_breaks(content, &param, &text),
                    text,
                });
            }
            // Automatic caching (a top-level `cache_control`): a breakpoint after the last
            // block, which is the end of the last message with text.
            if asks_cache(body.get("cache_control"))
                && let Some(m) = r
                    .messages
                    .iter_mut()
                    .rev()
                    .find(|m| !m.text.trim().is_empty())
            {
                m.cache.push(m.text.len());
            }
        }
    }
    Ok(r)
}

/// The OpenAI chat request body for `r`, its output token limit under `max_tokens_field` (the
/// provider's `spec.maxTokensField`).
pub fn to_openai(
    r: &ChatRequest,
    model: &str,
    stream: bool,
    max_tokens_field: MaxTokensField,
) -> Map<String, Value> {
    let mut messages: Vec<Value> = r
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    messages.extend(
        r.messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.text})),
    );
    let mut b = Map::new();
    b.insert("model".into(), model.into());
    b.insert("messages".into(), Value::Array(messages));
    if let Some(n) = r.max_tokens {
        b.insert(max_tokens_field.as_str().into(), n.into());
    }
    if let Some(t) = r.temperature {
        b.insert("temperature".into(), t.into());
    }
    if let Some(t) = r.top_p {
        b.insert("top_p".into(), t.into());
    }
    if !r.stop.is_empty() {
        b.insert("stop".into(), json!(r.stop));
    }
    b.insert("stream".into(), stream.into());
    if stream {
        b.insert("stream_options".into(), json!({"include_usage": true}));
    }
    b
}

/// Puts the output token limit of an OpenAI chat request `body` (passed through from an OpenAI
/// client) under `field`, the one its provider takes, and removes the other field (a provider
/// that requires one refuses the other). The limit is read as the gateway reads it for
/// admission: `max_completion_tokens` when set, else `max_tokens`. A body that sets neither
/// (absent or `null`) is left as it is.
pub fn set_max_tokens_field(body: &mut Map<String, Value>, field: MaxTokensField) {
    let set = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let completion = body.remove(MaxTokensField::MaxCompletionTokens.as_str());
    let plain = body.remove(MaxTokensField::MaxTokens.as_str());
    match set(&completion).or_else(|| set(&plain)) {
        Some(limit) => {
            body.insert(field.as_str().into(), limit);
        }
        None => {
            // Nothing to move: put back what was there (`null`s included).
            for (k, v) in [
                (MaxTokensField::MaxCompletionTokens, completion),
                (MaxTokensField::MaxTokens, plain),
            ] {
                if let Some(v) = v {
                    body.insert(k.as_str().into(), v);
                }
            }
        }
    }
}

/// One turn of a conversation as Anthropic's and Bedrock's APIs take it (see [`alternating`]).
#[derive(Debug)]
struct Turn<'a> {
    role: &'a str,
    text: String,
    /// Prompt-cache breakpoints: byte offsets into `text`.
    cache: Vec<usize>,
}

/// `r`'s messages as Anthropic's and Bedrock's APIs take them: empty texts left out (both
/// refuse an empty text block), a run of messages of one role joined into one with blank
/// lines (Bedrock Converse refuses two user or two assistant turns in a row), their
/// prompt-cache breakpoints moved along with their text, and a final assistant turn (a
/// prefill) without trailing whitespace.
fn alternating(r: &ChatRequest) -> Vec<Turn<'_>> {
    let mut out: Vec<Turn<'_>> = Vec::new();
    for m in r.messages.iter().filter(|m| !m.text.trim().is_empty()) {
        match out.last_mut() {
            Some(t) if t.role == m.role.as_str() => {
                t.text.push_str("\n\n");
                let shift = t.text.len();
                t.text.push_str(&m.text);
                t.cache.extend(m.cache.iter().map(|c| c + shift));
            }
            _ => out.push(Turn {
                role: m.role.as_str(),
                text: m.text.clone(),
                cache: m.cache.clone(),
            }),
        }
    }
    // A last assistant turn is a prefill of the answer, and Anthropic's models refuse one that
    // ends in whitespace ("final assistant content cannot end with trailing whitespace").
    if let Some(last) = out.last_mut().filter(|t| t.role == "assistant") {
        let kept = last.text.trim_end().len();
        last.text.truncate(kept);
        for c in &mut last.cache {
            *c = (*c).min(kept);
        }
    }
    out
}

/// An OpenAI `temperature` (0–2) as Anthropic's and Bedrock's (0–1) take it: capped at 1.
fn capped_temperature(t: f64) -> f64 {
    t.min(1.0)
}

/// `top_p` as Anthropic and Bedrock get it: not sent when it is 1 (no nucleus cut, what
/// OpenAI clients send by default) and a temperature is set, as recent Claude models refuse
/// both at once ("temperature and top_p cannot both be specified"); sent as given otherwise.
fn sent_top_p(r: &ChatRequest) -> Option<f64> {
    r.top_p.filter(|p| !(*p >= 1.0 && r.temperature.is_some()))
}

/// Stop sequences Anthropic and Bedrock accept: those with a non-whitespace character (they
/// refuse a whitespace-only one such as `"\n"` with a 400).
fn visible_stops(r: &ChatRequest) -> Vec<&str> {
    r.stop
        .iter()
        .map(String::as_str)
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// System texts Anthropic and Bedrock accept: blank ones (an empty OpenAI system message)
/// left out, as Bedrock refuses a blank system block.
fn visible_system(r: &ChatRequest) -> Vec<&str> {
    r.system
        .iter()
        .map(String::as_str)
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// The Anthropic Messages request body for `r`.
pub fn to_anthropic(r: &ChatRequest, model: &str, stream: bool) -> Map<String, Value> {
    let mut b = Map::new();
    b.insert("model".into(), model.into());
    let system = visible_system(r);
    if !system.is_empty() {
        b.insert("system".into(), system.join("\n\n").into());
    }
    b.insert(
        "messages".into(),
        Value::Array(
            alternating(r)
                .into_iter()
                .map(|t| json!({"role": t.role, "content": t.text}))
                .collect(),
        ),
    );
    b.insert(
        "max_tokens".into(),
        r.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).into(),
    );
    if let Some(t) = r.temperature {
        b.insert("temperature".into(), capped_temperature(t).into());
    }
    if let Some(t) = sent_top_p(r) {
        b.insert("top_p".into(), t.into());
    }
    let stops = visible_stops(r);
    if !stops.is_empty() {
        b.insert("stop_sequences".into(), json!(stops));
    }
    if stream {
        b.insert("stream".into(), true.into());
    }
    b
}

/// Whether Bedrock Converse can take `r`'s conversation: it refuses one whose first turn (after
/// empty ones are left out) is not the user's ("A conversation must start with a user
/// message"), and one with no turn at all. Checked before anything is sent, so that the
/// decision can move on to a candidate that takes it rather than answer the provider's 400.
pub fn check_bedrock(r: &ChatRequest) -> Result<(), Untranslatable> {
    match alternating(r).first().map(|t| t.role) {
        Some("user") => Ok(()),
        Some(role) => Err(untranslatable(
            "messages",
            format!(
                "Bedrock needs the conversation to start with a user turn; this one starts \
                 with an `{role}` turn"
            ),
        )),
        None => Err(untranslatable(
            "messages",
            "Bedrock needs at least one user turn with text; every message is empty",
        )),
    }
}

/// Whether Anthropic's API can take `r`'s conversation: it refuses one without any message
/// with text (`messages: []`). Checked before anything is sent, as [`check_bedrock`] is.
pub fn check_anthropic(r: &ChatRequest) -> Result<(), Untranslatable> {
    if alternating(r).is_empty() {
        return Err(untranslatable(
            "messages",
            "Anthropic needs at least one message with text; every message is empty",
        ));
    }
    Ok(())
}

/// The Bedrock request asks Claude to name the stop sequence it stopped on (Converse returns
/// `additionalModelResponseFields.stop_sequence` only when asked), when stop sequences are
/// sent to a Claude model.
pub fn ask_claude_stop_sequence(body: &mut Map<String, Value>, model: &str) {
    let sends_stops = body
        .get("inferenceConfig")
        .and_then(|c| c.get("stopSequences"))
        .is_some();
    if sends_stops && model.to_ascii_lowercase().contains("anthropic.claude-") {
        body.insert(
            "additionalModelResponseFieldPaths".into(),
            json!(["/stop_sequence"]),
        );
    }
}

/// OpenAI's limit on `stop` entries (its API refuses a fifth with a 400).
pub const OPENAI_MAX_STOPS: usize = 4;

/// Bedrock Converse's limit on `inferenceConfig.stopSequences` entries.
pub const BEDROCK_MAX_STOPS: usize = 2500;

/// Whether `protocol`'s API takes as many stop sequences as the request for `r` carries
/// (see [`sent_stops`]): OpenAI's at most [`OPENAI_MAX_STOPS`], Bedrock Converse's at most
/// [`BEDROCK_MAX_STOPS`]; Anthropic documents no limit. Checked before anything is sent, so
/// that the decision can move on to a candidate that takes them rather than answer the
/// provider's 400. `api` is the client's, whose field is named (`stop_sequences` or `stop`).
pub fn check_stop_count(
    r: &ChatRequest,
    api: Api,
    protocol: kinf_policy::ProviderType,
) -> Result<(), Untranslatable> {
    use kinf_policy::ProviderType as P;
    let (max, name) = match protocol {
        P::OpenAI => (OPENAI_MAX_STOPS, "OpenAI"),
        P::Bedrock => (BEDROCK_MAX_STOPS, "Bedrock"),
        P::Anthropic => return Ok(()),
    };
    let n = sent_stops(r, protocol).len();
    if n <= max {
        return Ok(());
    }
    let param = if api == Api::Messages {
        "stop_sequences"
    } else {
        "stop"
    };
    Err(untranslatable(
        param,
        format!("{name} takes at most {max} stop sequences; this request has {n}"),
    ))
}

/// Whether Bedrock takes prompt-cache points (`cachePoint` blocks) for `model` (a model id,
/// an inference profile id or ARN): Anthropic Claude models from Claude 3.5 Sonnet v2 and
/// 3.5 Haiku on, and Amazon Nova models. Bedrock refuses a request with a cache point for a
/// model without prompt caching (Llama, Mistral, older Claude models: "You invoked an
/// unsupported model or your request did not allow prompt caching"), and an id that does not
/// name its model (an application inference profile, a provisioned model ARN) cannot be told
/// apart, so only these get them; for the others `cache_control` is dropped, as before.
pub fn bedrock_caches(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    // Claude models Bedrock has no prompt caching for.
    const UNCACHED_CLAUDE: [&str; 6] = [
        "claude-v",
        "claude-instant",
        "claude-3-sonnet-",
        "claude-3-haiku-",
        "claude-3-opus-",
        "claude-3-5-sonnet-20240620",
    ];
    let claude = m.contains("anthropic.claude-") && !UNCACHED_CLAUDE.iter().any(|o| m.contains(o));
    claude || m.contains("amazon.nova-")
}

/// A Bedrock prompt-cache point: the content before it (system, messages) is cached.
fn cache_point() -> Value {
    json!({"cachePoint": {"type": "default"}})
}

/// `text` as Bedrock text blocks (`system[]` or a message's `content[]`), with a cache point
/// after each byte offset in `cuts`. Blank pieces are left out (Bedrock refuses a blank text
/// block), as is a cache point with no text before it in `text` or right after another.
fn bedrock_blocks(text: &str, cuts: &[usize]) -> Vec<Value> {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|&c| c > 0 && text.is_char_boundary(c))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::with_capacity(cuts.len() * 2 + 1);
    let mut from = 0;
    for c in cuts {
        let Some(piece) = text.get(from..c) else {
            continue;
        };
        if !piece.trim().is_empty() {
            out.push(json!({"text": piece}));
        }
        if out.last().is_some_and(|b| b.get("text").is_some()) {
            out.push(cache_point());
        }
        from = c;
    }
    if let Some(rest) = text.get(from..).filter(|t| !t.trim().is_empty()) {
        out.push(json!({"text": rest}));
    }
    out
}

/// The Bedrock Converse request body for `r` (the model goes in the path). Prompt-cache
/// breakpoints become `cachePoint` blocks right after the text they end (call
/// [`ChatRequest::forget_cache_points`] first for a model without prompt caching, see
/// [`bedrock_caches`]).
pub fn to_bedrock(r: &ChatRequest) -> Map<String, Value> {
    let mut b = Map::new();
    let system: Vec<Value> = r
        .system
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.trim().is_empty())
        .flat_map(|(i, s)| {
            let cuts: Vec<usize> = r
                .system_cache
                .iter()
                .filter(|(j, _)| *j == i)
                .map(|(_, c)| *c)
                .collect();
            bedrock_blocks(s, &cuts)
        })
        .collect();
    if !system.is_empty() {
        b.insert("system".into(), Value::Array(system));
    }
    b.insert(
        "messages".into(),
        Value::Array(
            alternating(r)
                .into_iter()
                .map(|t| json!({"role": t.role, "content": bedrock_blocks(&t.text, &t.cache)}))
                .collect(),
        ),
    );
    let mut cfg = Map::new();
    if let Some(n) = r.max_tokens {
        cfg.insert("maxTokens".into(), n.into());
    }
    if let Some(t) = r.temperature {
        cfg.insert("temperature".into(), capped_temperature(t).into());
    }
    if let Some(t) = sent_top_p(r) {
        cfg.insert("topP".into(), t.into());
    }
    let stops = visible_stops(r);
    if !stops.is_empty() {
        cfg.insert("stopSequences".into(), json!(stops));
    }
    if !cfg.is_empty() {
        b.insert("inferenceConfig".into(), Value::Object(cfg));
    }
    b
}

/// A whole response in canonical form.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatResponse {
    /// The provider's id of the response, when it gave one.
    pub id: Option<String>,
    /// The text.
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// Token usage (zeros when the provider reported none).
    pub usage: TokenUsage,
    /// Whether the provider reported usage: when not, the gateway estimates what was used
    /// rather than charge nothing.
    pub usage_reported: bool,
    /// The stop sequence that ended it, when known (see [`matched_stop`]).
    pub stop_sequence: Option<String>,
}

/// The stop sequence to report (Anthropic's `stop_sequence`) for a response that ended with
/// `finish`: the one the provider named, else, when the request sent exactly one, that one.
/// `None` unless `finish` is [`Finish::StopSequence`].
pub fn matched_stop(finish: &Finish, named: Option<String>, sent: &[String]) -> Option<String> {
    if *finish != Finish::StopSequence {
        return None;
    }
    named.or_else(|| match sent {
        [only] => Some(only.clone()),
        _ => None,
    })
}

/// The stop sequences the request body for `protocol` carries for `r` (whitespace-only ones
/// are not sent to Anthropic and Bedrock).
pub fn sent_stops(r: &ChatRequest, protocol: kinf_policy::ProviderType) -> Vec<String> {
    match protocol {
        kinf_policy::ProviderType::OpenAI => r.stop.clone(),
        _ => visible_stops(r).into_iter().map(str::to_string).collect(),
    }
}

fn n(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or(0)
}

/// Usage of an OpenAI `usage` object (`prompt_tokens` include the cached ones).
pub fn usage_openai(u: &Value) -> TokenUsage {
    TokenUsage::from_openai(
        n(u, "/prompt_tokens"),
        n(u, "/prompt_tokens_details/cached_tokens"),
        n(u, "/completion_tokens"),
    )
}

/// Folds the `usage` of an Anthropic `message_delta` into the one `message_start` gave: each
/// count the delta reports (non-null) replaces the start's. Anthropic's API reports the prompt
/// counts at the start, vLLM its cache reads only in the delta.
pub fn merge_anthropic_usage(acc: &mut Value, delta: &Value) {
    if let (Value::Object(acc), Value::Object(delta)) = (acc, delta) {
        for (k, v) in delta {
            if !v.is_null() {
                acc.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Usage of an Anthropic `usage` object: `input_tokens` and `cache_creation_input_tokens` are
/// uncached (the latter also counted as cache writes), `cache_read_input_tokens` cached.
pub fn usage_anthropic(u: &Value) -> TokenUsage {
    let writes = n(u, "/cache_creation_input_tokens");
    TokenUsage {
        cached_prompt_tokens: n(u, "/cache_read_input_tokens"),
        uncached_prompt_tokens: n(u, "/input_tokens").saturating_add(writes),
        cache_write_prompt_tokens: writes,
        output_tokens: n(u, "/output_tokens"),
    }
}

/// Usage of a Bedrock `usage` object: `inputTokens` and `cacheWriteInputTokens` are uncached
/// (the latter also counted as cache writes), `cacheReadInputTokens` cached.
pub fn usage_bedrock(u: &Value) -> TokenUsage {
    let writes = n(u, "/cacheWriteInputTokens");
    TokenUsage {
        cached_prompt_tokens: n(u, "/cacheReadInputTokens"),
        uncached_prompt_tokens: n(u, "/inputTokens").saturating_add(writes),
        cache_write_prompt_tokens: writes,
        output_tokens: n(u, "/outputTokens"),
    }
}

/// Reads a provider's whole response.
pub fn parse_provider_response(
    protocol: kinf_policy::ProviderType,
    v: &Value,
) -> Option<ChatResponse> {
    use kinf_policy::ProviderType as P;
    match protocol {
        P::OpenAI => {
            let c = v.pointer("/choices/0")?;
            let text = c
                .pointer("/message/content")
                .or_else(|| c.get("text"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let (finish, stop_sequence) =
                Finish::from_openai_choice(c).unwrap_or((Finish::EndTurn, None));
            Some(ChatResponse {
                id: v.get("id").and_then(Value::as_str).map(str::to_string),
                text,
                finish,
                usage: v.get("usage").map(usage_openai).unwrap_or_default(),
                usage_reported: v.get("usage").is_some_and(|u| !u.is_null()),
                stop_sequence,
            })
        }
        P::Anthropic => {
            let text = v
                .get("content")?
                .as_array()?
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<String>();
            Some(ChatResponse {
                id: v.get("id").and_then(Value::as_str).map(str::to_string),
                text,
                finish: Finish::from_anthropic(
                    v.get("stop_reason").and_then(Value::as_str).unwrap_or(""),
                ),
                usage: v.get("usage").map(usage_anthropic).unwrap_or_default(),
                usage_reported: v.get("usage").is_some_and(|u| !u.is_null()),
                stop_sequence: v
                    .get("stop_sequence")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        }
        P::Bedrock => {
            let text = v
                .pointer("/output/message/content")?
                .as_array()?
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<String>();
            Some(ChatResponse {
                id: None,
                text,
                finish: Finish::from_bedrock(
                    v.get("stopReason").and_then(Value::as_str).unwrap_or(""),
                ),
                usage: v.get("usage").map(usage_bedrock).unwrap_or_default(),
                usage_reported: v.get("usage").is_some_and(|u| !u.is_null()),
                // Claude on Bedrock names it here when asked to.
                stop_sequence: v
                    .pointer("/additionalModelResponseFields/stop_sequence")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        }
    }
}

/// OpenAI `usage` of `u`.
pub fn openai_usage_json(u: &TokenUsage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens(),
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total_tokens(),
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    })
}

/// Anthropic `usage` of `u`: as Anthropic counts, `input_tokens` excludes both the cache reads
/// and the cache writes, which have fields of their own.
pub fn anthropic_usage_json(u: &TokenUsage) -> Value {
    let writes = u.cache_write_prompt_tokens.min(u.uncached_prompt_tokens);
    json!({
        "input_tokens": u.uncached_prompt_tokens - writes,
        "cache_read_input_tokens": u.cached_prompt_tokens,
        "cache_creation_input_tokens": writes,
        "output_tokens": u.output_tokens,
    })
}

/// Seconds since the epoch, for `created`.
pub fn now_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A response id when the provider gave none.
pub fn fresh_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{:x}{:04x}",
        nanos,
        SEQ.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

/// The client-shaped whole response.
pub fn client_response(api: Api, r: &ChatResponse, model: &str) -> Value {
    match api {
        Api::Chat => json!({
            "id": r.id.clone().unwrap_or_else(|| fresh_id("chatcmpl-")),
            "object": "chat.completion",
            "created": now_epoch(),
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": r.text},
                "finish_reason": r.finish.openai(),
                "logprobs": null,
            }],
            "usage": openai_usage_json(&r.usage),
        }),
        Api::Completions => json!({
            "id": r.id.clone().unwrap_or_else(|| fresh_id("cmpl-")),
            "object": "text_completion",
            "created": now_epoch(),
            "model": model,
            "choices": [{
                "index": 0,
                "text": r.text,
                "finish_reason": r.finish.openai(),
                "logprobs": null,
            }],
            "usage": openai_usage_json(&r.usage),
        }),
        Api::Messages => json!({
            "id": r.id.clone().filter(|i| i.starts_with("msg_")).unwrap_or_else(|| fresh_id("msg_")),
            "type": "message",
            "role": "assistant",
            "model": model,
            // No text is no block, as in a stream (Anthropic refuses an empty text block
            // that a client sends back in its history).
            "content": if r.text.is_empty() { json!([]) } else { json!([{"type": "text", "text": r.text}]) },
            "stop_reason": r.finish.anthropic(),
            "stop_sequence": r.stop_sequence.as_ref().filter(|_| r.finish == Finish::StopSequence),
            "usage": anthropic_usage_json(&r.usage),
        }),
    }
}

/// The message of a provider's error body, when it has one.
pub fn provider_error_message(v: &Value) -> Option<String> {
    v.pointer("/error/message")
        .or_else(|| v.get("message"))
        .or_else(|| v.get("Message"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic)]

    use super::*;

    #[test]
    fn anthropic_and_bedrock_get_alternating_turns_capped_temperature_and_visible_stops() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "first"},
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "second"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "third"},
                {"role": "assistant", "content": "ok"},
            ],
            "temperature": 1.7, "stop": ["\n", "END", "  "],
        });
        let Value::Object(body) = body else { return };
        let r = parse_client(Api::Chat, &body);
        let Ok(r) = r else {
            assert!(r.is_ok(), "{r:?}");
            return;
        };
        let a = Value::Object(to_anthropic(&r, "claude", false));
        assert_eq!(
            a["messages"],
            json!([
                {"role": "user", "content": "first\n\nsecond\n\nthird"},
                {"role": "assistant", "content": "ok"},
            ])
        );
        assert_eq!(a["temperature"], 1.0);
        assert_eq!(a["stop_sequences"], json!(["END"]));
        let b = Value::Object(to_bedrock(&r));
        assert_eq!(
            b["messages"][0]["content"][0]["text"],
            "first\n\nsecond\n\nthird"
        );
        assert_eq!(b["messages"][1]["role"], "assistant");
        assert_eq!(b["messages"].as_array().map(Vec::len), Some(2));
        assert_eq!(b["inferenceConfig"]["temperature"], 1.0);
        assert_eq!(b["inferenceConfig"]["stopSequences"], json!(["END"]));
    }

    fn chat_request(body: Value) -> ChatRequest {
        let Value::Object(body) = body else {
            panic!("not an object")
        };
        parse_client(Api::Chat, &body).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// A last assistant turn is a prefill: Anthropic's models refuse one ending in whitespace.
    #[test]
    fn a_final_assistant_turn_loses_its_trailing_whitespace() {
        let r = chat_request(json!({"model": "m", "messages": [
            {"role": "user", "content": "List three fruits.  "},
            {"role": "assistant", "content": "Sure:\n"},
        ]}));
        let a = Value::Object(to_anthropic(&r, "claude", false));
        assert_eq!(a["messages"][0]["content"], "List three fruits.  ");
        assert_eq!(a["messages"][1]["content"], "Sure:");
        let b = Value::Object(to_bedrock(&r));
        assert_eq!(b["messages"][1]["content"][0]["text"], "Sure:");
    }

    /// OpenAI clients send `top_p: 1` with a temperature by default; recent Claude models
    /// refuse both at once. A `top_p` that cuts is sent as it is.
    #[test]
    fn a_top_p_of_one_beside_a_temperature_is_not_sent() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let r = chat_request(json!({"model": "m", "messages": m, "temperature": 0.7, "top_p": 1}));
        let a = to_anthropic(&r, "claude", false);
        assert!(!a.contains_key("top_p"), "{a:?}");
        assert_eq!(a["temperature"], 0.7);
        let b = to_bedrock(&r);
        assert!(b["inferenceConfig"].get("topP").is_none(), "{b:?}");
        let r =
            chat_request(json!({"model": "m", "messages": m, "temperature": 0.7, "top_p": 0.9}));
        assert_eq!(to_anthropic(&r, "claude", false)["top_p"], 0.9);
        let r = chat_request(json!({"model": "m", "messages": m, "top_p": 1}));
        assert_eq!(to_anthropic(&r, "claude", false)["top_p"], 1.0);
    }

    /// Anthropic refuses `messages: []`: refused before sending, so the decision can move on.
    #[test]
    fn anthropic_needs_a_message_with_text() {
        let only_system = chat_request(json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "  "},
        ]}));
        let e = check_anthropic(&only_system).err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.message.contains("at least one message with text")),
            "{e:?}"
        );
        let ok =
            chat_request(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        assert!(check_anthropic(&ok).is_ok());
    }

    /// Converse names the stop sequence Claude stopped on only when asked.
    #[test]
    fn bedrock_asks_claude_for_the_matched_stop_sequence() {
        let with_stops = chat_request(json!({"model": "m", "stop": ["END", "STOP"],
            "messages": [{"role": "user", "content": "hi"}]}));
        let mut b = to_bedrock(&with_stops);
        ask_claude_stop_sequence(&mut b, "us.anthropic.claude-sonnet-4-5-20250929-v1:0");
        assert_eq!(
            b["additionalModelResponseFieldPaths"],
            json!(["/stop_sequence"])
        );
        let mut other = to_bedrock(&with_stops);
        ask_claude_stop_sequence(&mut other, "meta.llama3-3-70b-instruct-v1:0");
        assert!(!other.contains_key("additionalModelResponseFieldPaths"));
        let without =
            chat_request(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let mut b = to_bedrock(&without);
        ask_claude_stop_sequence(&mut b, "anthropic.claude-3-haiku-20240307-v1:0");
        assert!(!b.contains_key("additionalModelResponseFieldPaths"));
    }

    /// An answer without text has no text block (Anthropic refuses an empty one sent back).
    #[test]
    fn an_empty_answer_has_no_content_block() {
        let r = ChatResponse {
            id: None,
            text: String::new(),
            finish: Finish::Length,
            usage: TokenUsage::default(),
            usage_reported: true,
            stop_sequence: None,
        };
        assert_eq!(
            client_response(Api::Messages, &r, "m")["content"],
            json!([])
        );
        let r = ChatResponse {
            text: "hi".into(),
            ..r
        };
        assert_eq!(
            client_response(Api::Messages, &r, "m")["content"],
            json!([{"type": "text", "text": "hi"}])
        );
    }

    #[test]
    fn a_response_without_usage_says_so() {
        use kinf_policy::ProviderType as P;
        for (p, with, without) in [
            (
                P::OpenAI,
                json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
                json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}),
            ),
            (
                P::Anthropic,
                json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                       "usage": {"input_tokens": 3, "output_tokens": 1}}),
                json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}),
            ),
            (
                P::Bedrock,
                json!({"output": {"message": {"content": [{"text": "hi"}]}}, "stopReason": "end_turn",
                       "usage": {"inputTokens": 3, "outputTokens": 1}}),
                json!({"output": {"message": {"content": [{"text": "hi"}]}}, "stopReason": "end_turn"}),
            ),
        ] {
            let r = parse_provider_response(p, &with);
            assert!(
                r.as_ref()
                    .is_some_and(|r| r.usage_reported && r.usage.output_tokens == 1),
                "{p:?}"
            );
            let r = parse_provider_response(p, &without);
            assert!(
                r.as_ref().is_some_and(|r| !r.usage_reported),
                "{p:?}: charged zero instead of estimated"
            );
        }
    }

    #[test]
    fn openai_chat_to_anthropic_and_bedrock() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
            "max_tokens": 7, "stop": "END", "temperature": 0.5,
        });
        let Value::Object(body) = body else { return };
        let r = parse_client(Api::Chat, &body);
        assert!(r.is_ok());
        let Ok(r) = r else { return };
        let a = Value::Object(to_anthropic(&r, "claude", true));
        assert_eq!(a["system"], "be brief");
        assert_eq!(a["messages"][0]["content"], "hi");
        assert_eq!(a["stop_sequences"][0], "END");
        assert_eq!(a["max_tokens"], 7);
        let b = Value::Object(to_bedrock(&r));
        assert_eq!(b["system"][0]["text"], "be brief");
        assert_eq!(b["inferenceConfig"]["maxTokens"], 7);
        assert_eq!(b["messages"][0]["content"][0]["text"], "hi");
    }

    #[test]
    fn the_token_limit_moves_to_the_providers_field() {
        let moved = |body: Value, field| {
            let Value::Object(mut b) = body else {
                return Value::Null;
            };
            set_max_tokens_field(&mut b, field);
            Value::Object(b)
        };
        use MaxTokensField::{MaxCompletionTokens, MaxTokens};
        assert_eq!(
            moved(json!({"max_tokens": 5}), MaxCompletionTokens),
            json!({"max_completion_tokens": 5})
        );
        assert_eq!(
            moved(json!({"max_completion_tokens": 5}), MaxTokens),
            json!({"max_tokens": 5})
        );
        // Both: the one the gateway reads (`max_completion_tokens`), in the provider's field.
        assert_eq!(
            moved(
                json!({"max_tokens": 9, "max_completion_tokens": 5}),
                MaxTokens
            ),
            json!({"max_tokens": 5})
        );
        // A `null` sets no limit: it does not hide the other field's.
        assert_eq!(
            moved(
                json!({"max_tokens": 9, "max_completion_tokens": null}),
                MaxCompletionTokens
            ),
            json!({"max_completion_tokens": 9})
        );
        // No limit at all: left as sent.
        assert_eq!(
            moved(json!({"max_tokens": null, "n": 1}), MaxCompletionTokens),
            json!({"max_tokens": null, "n": 1})
        );
        assert_eq!(moved(json!({}), MaxTokens), json!({}));
    }

    #[test]
    fn text_parts_and_system_blocks_are_joined_by_newlines_not_run_together() {
        let body = json!({
            "model": "m", "max_tokens": 5,
            "system": [{"type": "text", "text": "SYSA"}, {"type": "text", "text": "SYSB"}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}]}],
        });
        let Value::Object(body) = body else { return };
        let r = parse_client(Api::Messages, &body);
        assert!(r.is_ok());
        let Ok(r) = r else { return };
        let o = Value::Object(to_openai(&r, "gpt", false, MaxTokensField::MaxTokens));
        assert_eq!(o["messages"][0]["content"], "SYSA\nSYSB");
        assert_eq!(o["messages"][1]["content"], "p1\np2");
    }

    #[test]
    fn parameters_that_change_the_output_are_refused_and_sampling_tweaks_dropped() {
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]});
            if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
                b.extend(e);
            }
            let Value::Object(b) = b else { unreachable!() };
            b
        };
        for (api, extra, param) in [
            (
                Api::Chat,
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (Api::Chat, json!({"logprobs": true}), "logprobs"),
            (Api::Chat, json!({"top_logprobs": 2}), "top_logprobs"),
            (Api::Completions, json!({"echo": true}), "echo"),
            (Api::Completions, json!({"suffix": "}"}), "suffix"),
            (
                Api::Messages,
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "thinking",
            ),
        ] {
            let r = parse_client(api, &base(extra));
            assert!(
                r.as_ref().is_err_and(|e| e.param == param),
                "{param}: {r:?}"
            );
        }
        for (api, extra) in [
            (
                Api::Chat,
                json!({"response_format": {"type": "text"}, "logprobs": false, "seed": 7, "presence_penalty": 0.5}),
            ),
            (
                Api::Messages,
                json!({"thinking": {"type": "disabled"}, "top_k": 5}),
            ),
        ] {
            assert!(parse_client(api, &base(extra)).is_ok());
        }
    }

    #[test]
    fn usage_is_exact_across_shapes() {
        let u = usage_anthropic(&json!({
            "input_tokens": 10, "cache_read_input_tokens": 90,
            "cache_creation_input_tokens": 5, "output_tokens": 3
        }));
        assert_eq!((u.uncached_prompt_tokens, u.cached_prompt_tokens), (15, 90));
        assert_eq!(u.cache_write_prompt_tokens, 5);
        let o = openai_usage_json(&u);
        assert_eq!(o["prompt_tokens"], 105);
        // OpenAI's usage has no cache writes: they stay in the prompt count.
        assert_eq!(
            usage_openai(&o),
            TokenUsage {
                cache_write_prompt_tokens: 0,
                ..u
            }
        );
        // Anthropic's has: its own fields round-trip.
        let a = anthropic_usage_json(&u);
        assert_eq!(
            (
                a["input_tokens"].as_u64(),
                a["cache_creation_input_tokens"].as_u64()
            ),
            (Some(10), Some(5))
        );
        assert_eq!(usage_anthropic(&a), u);
        let b =
            usage_bedrock(&json!({"inputTokens": 4, "outputTokens": 2, "cacheReadInputTokens": 6}));
        assert_eq!(b.prompt_tokens(), 10);
        // Bedrock's cache writes reach an Anthropic client as Anthropic's.
        let b = usage_bedrock(&json!({
            "inputTokens": 4, "outputTokens": 2, "cacheReadInputTokens": 6,
            "cacheWriteInputTokens": 7
        }));
        assert_eq!(
            (b.uncached_prompt_tokens, b.cache_write_prompt_tokens),
            (11, 7)
        );
        let a = anthropic_usage_json(&b);
        assert_eq!(
            (
                a["input_tokens"].as_u64(),
                a["cache_creation_input_tokens"].as_u64(),
                a["cache_read_input_tokens"].as_u64()
            ),
            (Some(4), Some(7), Some(6))
        );
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// `"max_completion_tokens": null` sets no limit (as the gateway reads it for admission):
    /// the request's `max_tokens` is the one sent, not Anthropic's default.
    #[test]
    fn a_null_max_completion_tokens_does_not_hide_max_tokens() {
        let body = obj(json!({
            "model": "m", "max_completion_tokens": null, "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}],
        }));
        let r = parse_client(Api::Chat, &body);
        assert_eq!(r.as_ref().map(|r| r.max_tokens), Ok(Some(50)), "{r:?}");
        let Ok(r) = r else { return };
        assert_eq!(to_anthropic(&r, "claude", false)["max_tokens"], 50);
        assert_eq!(to_bedrock(&r)["inferenceConfig"]["maxTokens"], 50);
    }

    /// No tools (an empty list) and a `tool_choice` that calls none is a plain text request;
    /// anything that may call a tool is refused naming its field.
    #[test]
    fn no_tools_and_a_tool_choice_that_calls_none_are_plain_requests() {
        let with = |extra: Value| {
            let mut b = obj(json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "ok", "tool_calls": []},
                             {"role": "user", "content": "again"}]}));
            b.extend(obj(extra));
            b
        };
        for (api, extra) in [
            (Api::Messages, json!({"tools": []})),
            (
                Api::Messages,
                json!({"tools": [], "tool_choice": {"type": "none"}}),
            ),
            (Api::Messages, json!({"tool_choice": {"type": "auto"}})),
            (Api::Chat, json!({"tool_choice": "none", "tools": null})),
            (Api::Chat, json!({"tool_choice": "auto", "functions": []})),
            (Api::Chat, json!({"function_call": "none"})),
        ] {
            let mut b = with(extra.clone());
            if api == Api::Messages {
                // Anthropic messages carry no `tool_calls`.
                b.insert(
                    "messages".into(),
                    json!([{"role": "user", "content": "hi"}]),
                );
            }
            let r = parse_client(api, &b);
            assert!(r.is_ok(), "{extra}: {r:?}");
        }
        for (api, extra, param) in [
            (Api::Messages, json!({"tools": [{"name": "f"}]}), "tools"),
            (
                Api::Messages,
                json!({"tool_choice": {"type": "any"}}),
                "tool_choice",
            ),
            (Api::Chat, json!({"tool_choice": "required"}), "tool_choice"),
            (
                Api::Chat,
                json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                "tool_choice",
            ),
            (
                Api::Chat,
                json!({"functions": [{"name": "f"}]}),
                "functions",
            ),
            (
                Api::Chat,
                json!({"function_call": {"name": "f"}}),
                "function_call",
            ),
            (
                Api::Chat,
                json!({"messages": [{"role": "assistant", "content": null,
                    "function_call": {"name": "f", "arguments": "{}"}}]}),
                "messages[0].function_call",
            ),
            (
                Api::Chat,
                json!({"messages": [{"role": "assistant", "content": null,
                    "tool_calls": [{"id": "c", "type": "function"}]}]}),
                "messages[0].tool_calls",
            ),
        ] {
            let r = parse_client(api, &with(extra.clone()));
            assert!(
                r.as_ref().is_err_and(|e| e.param == param),
                "{extra}: {r:?}"
            );
        }
    }

    /// An empty OpenAI system message is not sent as a blank system block (Bedrock refuses
    /// one).
    #[test]
    fn a_blank_system_text_is_left_out() {
        let body = obj(json!({"model": "m", "messages": [
            {"role": "system", "content": ""},
            {"role": "user", "content": "hi"},
        ]}));
        let r = parse_client(Api::Chat, &body);
        assert!(r.is_ok(), "{r:?}");
        let Ok(r) = r else { return };
        assert!(to_bedrock(&r).get("system").is_none());
        assert!(to_anthropic(&r, "claude", false).get("system").is_none());
        let body = obj(json!({"model": "m", "messages": [
            {"role": "system", "content": " "},
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ]}));
        let r = parse_client(Api::Chat, &body);
        assert!(r.is_ok(), "{r:?}");
        let Ok(r) = r else { return };
        assert_eq!(to_bedrock(&r)["system"], json!([{"text": "be brief"}]));
        assert_eq!(to_anthropic(&r, "claude", false)["system"], "be brief");
    }

    /// An Anthropic client is told which stop sequence ended the response: the one the
    /// provider names (vLLM's `stop_reason`, Claude on Bedrock's
    /// `additionalModelResponseFields`), else the only one it sent.
    #[test]
    fn the_stop_sequence_that_ended_a_response_is_named() {
        use kinf_policy::ProviderType as P;
        let vllm = json!({"id": "cmpl-1", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "a"},
            "finish_reason": "stop", "stop_reason": "###"}]});
        let eos = json!({"id": "cmpl-1", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "a"},
            "finish_reason": "stop", "stop_reason": 128009}]});
        let bedrock = json!({"output": {"message": {"content": [{"text": "a"}]}},
            "stopReason": "stop_sequence"});
        let bedrock_named = json!({"output": {"message": {"content": [{"text": "a"}]}},
            "stopReason": "stop_sequence",
            "additionalModelResponseFields": {"stop_sequence": "END"}});
        let sent = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (p, v, stops, reason, seq) in [
            (
                P::OpenAI,
                &vllm,
                sent(&["###", "END"]),
                "stop_sequence",
                json!("###"),
            ),
            (P::OpenAI, &eos, sent(&["###"]), "end_turn", Value::Null),
            (
                P::Bedrock,
                &bedrock,
                sent(&["END"]),
                "stop_sequence",
                json!("END"),
            ),
            (
                P::Bedrock,
                &bedrock,
                sent(&["END", "STOP"]),
                "stop_sequence",
                Value::Null,
            ),
            (
                P::Bedrock,
                &bedrock_named,
                sent(&["END", "STOP"]),
                "stop_sequence",
                json!("END"),
            ),
        ] {
            let r = parse_provider_response(p, v);
            assert!(r.is_some(), "{v}: unreadable");
            let Some(mut r) = r else { return };
            r.stop_sequence = matched_stop(&r.finish, r.stop_sequence.take(), &stops);
            let a = client_response(Api::Messages, &r, "m");
            assert_eq!(
                (&a["stop_reason"], &a["stop_sequence"]),
                (&json!(reason), &seq),
                "{v}"
            );
            let o = client_response(Api::Chat, &r, "m");
            assert_eq!(o["choices"][0]["finish_reason"], "stop", "{v}");
        }
    }

    /// More stop sequences than the provider's API takes (OpenAI: 4) are refused before
    /// sending, naming the client's field, rather than answered with the provider's 400.
    #[test]
    fn more_stop_sequences_than_the_provider_takes_are_untranslatable() {
        use kinf_policy::ProviderType as P;
        let with_stops = |api: Api, n: usize| {
            let stops: Vec<String> = (0..n).map(|i| format!("STOP{i}")).collect();
            let key = if api == Api::Messages {
                "stop_sequences"
            } else {
                "stop"
            };
            let mut b = obj(json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]}));
            b.insert(key.into(), json!(stops));
            parse_client(api, &b)
        };
        let parsed = (
            with_stops(Api::Messages, OPENAI_MAX_STOPS),
            with_stops(Api::Messages, OPENAI_MAX_STOPS + 1),
            with_stops(Api::Chat, BEDROCK_MAX_STOPS + 1),
        );
        assert!(matches!(parsed, (Ok(_), Ok(_), Ok(_))), "{parsed:?}");
        let (Ok(four), Ok(five), Ok(many)) = parsed else {
            return;
        };
        assert_eq!(check_stop_count(&four, Api::Messages, P::OpenAI), Ok(()));
        let e = check_stop_count(&five, Api::Messages, P::OpenAI);
        assert!(
            e.as_ref()
                .is_err_and(|e| e.param == "stop_sequences" && e.message.contains("at most 4")),
            "{e:?}"
        );
        // Bedrock and Anthropic take five.
        assert_eq!(check_stop_count(&five, Api::Messages, P::Bedrock), Ok(()));
        assert_eq!(check_stop_count(&five, Api::Messages, P::Anthropic), Ok(()));
        // Bedrock Converse's own limit, named as the OpenAI client's field.
        let e = check_stop_count(&many, Api::Chat, P::Bedrock);
        assert!(e.as_ref().is_err_and(|e| e.param == "stop"), "{e:?}");
        // Whitespace-only ones are not sent to Bedrock, so they do not count there.
        let mut blank = five.clone();
        blank.stop = vec![" ".into(); BEDROCK_MAX_STOPS + 1];
        assert_eq!(check_stop_count(&blank, Api::Messages, P::Bedrock), Ok(()));
    }

    /// Anthropic `cache_control` (on system blocks, on content blocks, and the top-level
    /// automatic one) becomes a Bedrock `cachePoint` right after the text it ends; before, it
    /// was dropped. Pieces of one message stay in order, and nothing else changes.
    #[test]
    fn cache_control_becomes_bedrock_cache_points() {
        let eph = json!({"type": "ephemeral"});
        let body = obj(json!({
            "model": "m", "max_tokens": 5,
            "system": [
                {"type": "text", "text": "You are a librarian.", "cache_control": eph},
                {"type": "text", "text": "Today is Monday."},
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "BOOK TEXT", "cache_control": eph},
                    {"type": "text", "text": "Who wrote it?"},
                ]},
                {"role": "assistant", "content": "Ann."},
                {"role": "user", "content": [
                    {"type": "text", "text": "And when?", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                ]},
                {"role": "user", "content": "Briefly."},
            ],
            "cache_control": eph,
        }));
        let r = parse_client(Api::Messages, &body);
        assert!(r.is_ok(), "{r:?}");
        let Ok(r) = r else { return };
        let cp = json!({"cachePoint": {"type": "default"}});
        let b = Value::Object(to_bedrock(&r));
        assert_eq!(
            b["system"],
            json!([{"text": "You are a librarian."}, cp, {"text": "\nToday is Monday."}])
        );
        assert_eq!(
            b["messages"],
            json!([
                {"role": "user", "content": [{"text": "BOOK TEXT"}, cp, {"text": "\nWho wrote it?"}]},
                {"role": "assistant", "content": [{"text": "Ann."}]},
                // Two user turns joined (Converse refuses two in a row): each breakpoint
                // stays at the end of its text; the top-level one is after the last block.
                {"role": "user", "content": [{"text": "And when?"}, cp, {"text": "\n\nBriefly."}, cp]},
            ])
        );
        // The text the model reads is the same as without caching.
        let mut plain = r.clone();
        plain.forget_cache_points();
        let p = Value::Object(to_bedrock(&plain));
        assert_eq!(
            p["messages"][0]["content"],
            json!([{"text": "BOOK TEXT\nWho wrote it?"}])
        );
        assert_eq!(
            p["system"],
            json!([{"text": "You are a librarian.\nToday is Monday."}])
        );
        // Other protocols have no cache points: their bodies are unchanged.
        let o = Value::Object(to_openai(&r, "gpt", false, MaxTokensField::MaxTokens));
        assert!(!o.to_string().contains("cache"), "{o}");
        // A breakpoint on the last block of a message needs no empty text after it.
        let body = obj(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": eph}]}]}));
        let r = parse_client(Api::Messages, &body);
        assert!(r.is_ok(), "{r:?}");
        let Ok(r) = r else { return };
        assert_eq!(
            to_bedrock(&r)["messages"][0]["content"],
            json!([{"text": "hi"}, cp])
        );
    }

    /// Bedrock refuses a cache point for a model without prompt caching: only Claude (3.5
    /// Haiku, 3.5 Sonnet v2 and later) and Nova ids get them.
    #[test]
    fn only_models_with_prompt_caching_get_cache_points() {
        for m in [
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "global.anthropic.claude-opus-4-5-20251101-v1:0",
            "anthropic.claude-3-7-sonnet-20250219-v1:0",
            "anthropic.claude-3-5-sonnet-20241022-v2:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "us.amazon.nova-pro-v1:0",
        ] {
            assert!(bedrock_caches(m), "{m}");
        }
        for m in [
            "meta.llama3-3-70b-instruct-v1:0",
            "mistral.mistral-large-2407-v1:0",
            "anthropic.claude-v2:1",
            "anthropic.claude-instant-v1",
            "anthropic.claude-3-haiku-20240307-v1:0",
            "anthropic.claude-3-5-sonnet-20240620-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123",
        ] {
            assert!(!bedrock_caches(m), "{m}");
        }
    }

    #[test]
    fn tools_are_refused() {
        let Value::Object(body) = json!({"messages": [], "tools": [{}]}) else {
            return;
        };
        assert!(parse_client(Api::Chat, &body).is_err());
    }

    #[test]
    fn bedrock_needs_a_conversation_that_starts_with_a_user_turn() {
        let msg = |role: &str, text: &str| Msg {
            role: role.into(),
            text: text.into(),
            ..Msg::default()
        };
        let req = |messages: Vec<Msg>| ChatRequest {
            system: vec!["be brief".into()],
            messages,
            ..ChatRequest::default()
        };
        // A greeting first, as chat front-ends send it.
        let opened_by_assistant = check_bedrock(&req(vec![
            msg("assistant", "How can I help?"),
            msg("user", "Hi"),
        ]));
        assert!(
            matches!(&opened_by_assistant, Err(e) if e.param == "messages" && e.message.contains("`assistant`")),
            "{opened_by_assistant:?}"
        );
        // Only text-less turns: nothing to send.
        assert!(check_bedrock(&req(vec![msg("user", "  ")])).is_err());
        // An empty assistant turn before the user's is left out, so it is fine.
        assert_eq!(
            check_bedrock(&req(vec![msg("assistant", ""), msg("user", "Hi")])),
            Ok(())
        );
    }
}
