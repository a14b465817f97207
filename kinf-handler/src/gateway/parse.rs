//! Parsing of OpenAI and Anthropic request bodies into what the gateway needs: the model, the
//! stream flags, `max_tokens`, and the text every message carries (for tokenization and
//! classification). Errors name the field at fault. The body itself is kept as a JSON object so
//! that it can be forwarded with only `model` and `stream_options` changed.

use serde_json::{Map, Value};

use super::errors::{Api, ApiError};
use kinf_router::classify::Message;
use kinf_router::classify::eval::{Piece, part_pieces, tool_call_texts};
use kinf_router::tokenize::ChatMessage;

/// Default output budget assumed for estimates when a chat or Anthropic request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// vLLM's (and OpenAI's) `max_tokens` of a completions request that sets none, or `null`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// The prompt of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Chat messages (chat completions, Anthropic messages with `system` first).
    Chat(Vec<ChatMessage>),
    /// A completions prompt as text.
    Text(String),
    /// A completions prompt given as token ids.
    Tokens(Vec<u32>),
}

/// A parsed inference request.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The API it came in on.
    pub api: Api,
    /// The body, to be forwarded after mutation.
    pub body: Map<String, Value>,
    /// Body `model`.
    pub model: String,
    /// Body `stream`.
    pub stream: bool,
    /// Whether the client asked for the usage chunk (`stream_options.include_usage`).
    pub client_wants_usage: bool,
    /// The output limit per sequence, when given: `max_completion_tokens`, else `max_tokens`
    /// (chat); `max_tokens` (completions, whose vLLM API knows no `max_completion_tokens`,
    /// and Anthropic messages).
    pub max_tokens: Option<u32>,
    /// Sequences generated per prompt: `n` (1 when unset, and for Anthropic messages).
    pub choices: u32,
    /// Prompts: those of a completions batch (`prompt: ["a", "b"]`, `[[1, 2], [3]]`), else 1.
    pub prompts: u32,
    /// Estimated prompt tokens of a completions batch's prompts after the first (which alone
    /// is tokenized): exact for token ids, one per 4 bytes of text (the stand-in tokenizer's
    /// ratio).
    pub later_prompt_tokens: u64,
    /// The prompt.
    pub prompt: Prompt,
    /// Text the model also reads that `prompt` leaves out, for the classifiers only (it is not
    /// tokenized for placement): the names and arguments of tool calls (chat `tool_calls`,
    /// Anthropic `tool_use` blocks' `input`), and the prompts of a completions batch after the
    /// first.
    pub also_seen: Vec<ChatMessage>,
}

impl Parsed {
    /// The most tokens each sequence may generate, as the worker applies it: `max_tokens`,
    /// else vLLM's default of 16 for completions, else [`DEFAULT_MAX_TOKENS`] (vLLM lets a chat
    /// request without a limit fill the context, which the gateway does not know).
    pub fn max_output_tokens(&self) -> u32 {
        if self.output_limit_unknown() {
            return DEFAULT_MAX_TOKENS;
        }
        self.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)
    }

    /// Whether the worker applies no known output limit: a chat or messages request without
    /// `max_tokens` (a completion without one gets vLLM's 16). Its
    /// [`max_output_tokens`](Self::max_output_tokens) is then an estimate, which the gateway
    /// replaces with what it learned of the model ([`OutputLengths`]).
    ///
    /// [`OutputLengths`]: super::output_lengths::OutputLengths
    pub fn output_limit_unknown(&self) -> bool {
        self.max_tokens.is_none() && self.api != Api::Completions
    }

    /// Sequences the request generates: `n` for each prompt of the batch.
    pub fn sequences(&self) -> u64 {
        u64::from(self.choices) * u64::from(self.prompts)
    }

    /// Number of messages (1 for completions).
    pub fn message_count(&self) -> usize {
        match &self.prompt {
            Prompt::Chat(m) => m.len(),
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
        }
    }

    /// Every message the classifiers read: the prompt's (a completions prompt as one user
    /// message; token ids carry no text), then [`also_seen`](Self::also_seen), marked so
    /// (text of another message, not a turn of its own).
    pub fn classified_messages(&self) -> impl Iterator<Item = Message<'_>> {
        let prompt: Vec<Message<'_>> = match &self.prompt {
            Prompt::Chat(msgs) => msgs
                .iter()
                .map(|m| Message::new(&m.role, &m.content))
                .collect(),
            Prompt::Text(t) => vec![Message::new("user", t)],
            Prompt::Tokens(_) => Vec::new(),
        };
        prompt.into_iter().chain(
            self.also_seen
                .iter()
                .map(|m| Message::also_seen(&m.role, &m.content)),
        )
    }

    /// Total bytes of prompt text (an estimate of size when no tokenizer is known).
    pub fn prompt_bytes(&self) -> usize {
        match &self.prompt {
            Prompt::Chat(m) => m.iter().map(|m| m.content.len() + m.role.len() + 2).sum(),
            Prompt::Text(t) => t.len(),
            Prompt::Tokens(t) => t.len() * 4,
        }
    }
}

/// Parses a request body for `api`.
pub fn parse(api: Api, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(body) = value else {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    let model = match body.get("model") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(ApiError::invalid("model", "`model` is empty")),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("stream", "`stream` must be a boolean")),
    };
    let client_wants_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options.include_usage",
                    "`stream_options.include_usage` must be a boolean",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    let max_tokens = max_tokens(&body, api)?;
    sampling(&body, api)?;
    let choices = match api {
        // Checked by `sampling`: an integer of at least 1 (or one above `i64::MAX`).
        Api::Chat | Api::Completions => body
            .get("n")
            .and_then(Value::as_u64)
            .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        Api::Messages => 1,
    };
    let (prompt, prompts, later_prompt_tokens) = match api {
        Api::Chat => (Prompt::Chat(chat_messages(&body)?), 1, 0),
        Api::Completions => completion_prompt(&body)?,
        Api::Messages => (Prompt::Chat(anthropic_messages(&body)?), 1, 0),
    };
    let also_seen = match api {
        Api::Chat | Api::Messages => tool_texts(&body),
        Api::Completions => later_batch_prompts(&body),
    };
    Ok(Parsed {
        api,
        body,
        model,
        stream,
        client_wants_usage,
        max_tokens,
        choices,
        prompts,
        later_prompt_tokens,
        prompt,
        also_seen,
    })
}

/// Checks, without parsing, that `bytes` nests arrays and objects at most `max` levels deep
/// (`limits.maxJsonDepth`): a 400 `json_too_deep` naming the top-level member where the limit
/// was passed (`body` when there is none). Linear in the body size, no allocation; strings
/// (escapes included) are skipped, so brackets inside them do not count.
pub fn check_json_depth(bytes: &[u8], max: usize) -> Result<(), ApiError> {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    let mut str_start = 0;
    // The last string closed at depth 1, and the top-level member it named (a `:` followed).
    let mut last_d1: Option<(usize, usize)> = None;
    let mut member: Option<(usize, usize)> = None;
    for (i, &b) in bytes.iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
                if depth == 1 {
                    last_d1 = Some((str_start, i));
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_str = true;
                str_start = i + 1;
            }
            b':' if depth == 1 => member = last_d1,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    let field = member
                        .and_then(|(a, z)| std::str::from_utf8(&bytes[a..z]).ok())
                        .filter(|k| k.len() <= 64 && !k.contains('\\'))
                        .unwrap_or("body");
                    let mut e = ApiError::invalid(
                        field,
                        format!(
                            "the body nests arrays and objects more than {max} levels deep (in `{field}`); the limit is {max} (limits.maxJsonDepth)"
                        ),
                    );
                    e.code = "json_too_deep";
                    return Err(e);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// [`parse`] after [`check_json_depth`] with `max_depth`.
pub fn parse_limited(api: Api, bytes: &[u8], max_depth: usize) -> Result<Parsed, ApiError> {
    check_json_depth(bytes, max_depth)?;
    parse(api, bytes)
}

fn max_tokens(body: &Map<String, Value>, api: Api) -> Result<Option<u32>, ApiError> {
    // Anthropic's Messages API knows only `max_tokens` (a `max_completion_tokens` there is no
    // limit, and would reach the worker without the one it requires); so do vLLM's
    // completions (OpenAI's legacy API): a `max_completion_tokens` there is ignored by vLLM,
    // which generates its default of 16.
    let fields: &[&str] = match api {
        Api::Messages | Api::Completions => &["max_tokens"],
        Api::Chat => &["max_completion_tokens", "max_tokens"],
    };
    for &field in fields {
        match body.get(field) {
            None | Some(Value::Null) => {}
            // Anthropic's `max_tokens` is at least 1. vLLM refuses 0 with a schema error that
            // its `/v1/messages` answers in OpenAI's shape: refused here in Anthropic's.
            Some(v) if api == Api::Messages => {
                let n = v.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                    ApiError::invalid(field, format!("`{field}` must be an integer of at least 1"))
                })?;
                return Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)));
            }
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| {
                    ApiError::invalid(field, format!("`{field}` must be a non-negative integer"))
                })?;
                return Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)));
            }
        }
    }
    if api == Api::Messages {
        return Err(ApiError::invalid("max_tokens", "`max_tokens` is required"));
    }
    Ok(None)
}

/// What a sampling parameter must be.
#[derive(Clone, Copy)]
enum Want {
    /// A number in `[min, max]`.
    Number(f64, f64),
    /// An integer in `[min, max]`.
    Integer(i64, i64),
    /// A string, or a list of strings.
    Strings,
    /// A list of strings.
    StringList,
}

/// The sampling parameters of the OpenAI APIs whose type (and, where the API fixes one,
/// range) the gateway checks, so that a wrong value is refused in the caller's shape naming
/// the field rather than by the worker in its own. The bounds are the widest OpenAI and vLLM
/// accept (vLLM takes temperatures above OpenAI's 2, and `top_k` -1 for "all"). Parameters not
/// listed pass through unchecked.
const OPENAI_SAMPLING: &[(&str, Want)] = &[
    ("temperature", Want::Number(0.0, f64::MAX)),
    ("top_p", Want::Number(0.0, 1.0)),
    ("frequency_penalty", Want::Number(-2.0, 2.0)),
    ("presence_penalty", Want::Number(-2.0, 2.0)),
    ("n", Want::Integer(1, i64::MAX)),
    ("seed", Want::Integer(i64::MIN, i64::MAX)),
    ("top_k", Want::Integer(-1, i64::MAX)),
    ("stop", Want::Strings),
];

/// The same for Anthropic's Messages API.
const ANTHROPIC_SAMPLING: &[(&str, Want)] = &[
    ("temperature", Want::Number(0.0, 1.0)),
    ("top_p", Want::Number(0.0, 1.0)),
    ("top_k", Want::Integer(0, i64::MAX)),
    ("stop_sequences", Want::StringList),
];

/// Checks the sampling parameters `body` sets (`null` is unset) against the API's table.
fn sampling(body: &Map<String, Value>, api: Api) -> Result<(), ApiError> {
    let table = match api {
        Api::Messages => ANTHROPIC_SAMPLING,
        Api::Chat | Api::Completions => OPENAI_SAMPLING,
    };
    for &(field, want) in table {
        let Some(v) = body.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let bad = |what: String| {
            Err(ApiError::invalid(
                field,
                format!("`{field}` must be {what}"),
            ))
        };
        match want {
            Want::Number(lo, hi) => match v.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => {}
                Some(_) if hi == f64::MAX => return bad(format!("at least {lo}")),
                Some(_) => return bad(format!("between {lo} and {hi}")),
                None => return bad("a number".into()),
            },
            Want::Integer(lo, hi) => match v.as_i64() {
                Some(x) if (lo..=hi).contains(&x) => {}
                Some(_) if hi == i64::MAX => return bad(format!("an integer of at least {lo}")),
                Some(_) => return bad(format!("an integer between {lo} and {hi}")),
                // Above `i64::MAX`: within every open-ended range.
                None if v.is_u64() && hi == i64::MAX => {}
                None => return bad("an integer".into()),
            },
            Want::Strings => match v {
                Value::String(_) => {}
                Value::Array(a) if a.iter().all(Value::is_string) => {}
                _ => return bad("a string or a list of strings".into()),
            },
            Want::StringList => match v {
                Value::Array(a) if a.iter().all(Value::is_string) => {}
                _ => return bad("a list of strings".into()),
            },
        }
    }
    Ok(())
}

/// The text of a `content` value: a string, or an array of parts whose text is joined by
/// newlines, as vLLM joins text parts for a chat template. A part contributes what
/// [`part_pieces`] finds (as `kinfctl classify` reads it): its `text`; the `title`, `context`
/// and text source (`data`, or `content`) of a `document` block; the `title`, `source` and
/// `content` of a `search_result` block; the `content` of a `tool_result` block (read the same
/// way). Images and documents without text (a PDF, a URL) contribute nothing. A member of the
/// wrong type is a 400 naming its path (`messages[0].content[1].source.data`).
fn content_text(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut texts: Vec<String> = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter().enumerate() {
                if !p.is_object() {
                    return Err(ApiError::invalid(
                        format!("{field}[{i}]"),
                        format!("`{field}[{i}]` must be an object"),
                    ));
                }
                let pieces = part_pieces(p).map_err(|b| {
                    ApiError::invalid(
                        format!("{field}[{i}]{}", b.at),
                        format!("`{field}[{i}]{}` must be {}", b.at, b.expected),
                    )
                })?;
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => texts.push(t.to_owned()),
                        Piece::Content(c, at) => {
                            texts.push(content_text(c, &format!("{field}[{i}]{at}"))?);
                        }
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid(
            field,
            format!("`{field}` must be a string or an array of content parts"),
        )),
    }
}

fn messages_array(body: &Map<String, Value>) -> Result<&Vec<Value>, ApiError> {
    match body.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => Ok(a),
        Some(Value::Array(_)) => Err(ApiError::invalid("messages", "`messages` is empty")),
        Some(_) => Err(ApiError::invalid("messages", "`messages` must be an array")),
        None => Err(ApiError::invalid("messages", "`messages` is required")),
    }
}

fn one_message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let Value::Object(o) = m else {
        return Err(ApiError::invalid(
            format!("messages[{i}]"),
            format!("`messages[{i}]` must be an object"),
        ));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) => r.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("`messages[{i}].role` must be a string"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("`messages[{i}].role` is required"),
            ));
        }
    };
    let content = match o.get("content") {
        Some(c) => content_text(c, &format!("messages[{i}].content"))?,
        None => String::new(),
    };
    Ok(ChatMessage { role, content })
}

/// The tool calls of a chat or Anthropic request's messages, as the messages' roles said them
/// ([`tool_call_texts`]: the chat API's `tool_calls` and deprecated `function_call`, Anthropic's
/// `tool_use` blocks; `tool_result` blocks need nothing here: their `content` is part of their
/// message's text).
fn tool_texts(body: &Map<String, Value>) -> Vec<ChatMessage> {
    let Some(Value::Array(msgs)) = body.get("messages") else {
        return Vec::new();
    };
    msgs.iter()
        .flat_map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("assistant");
            tool_call_texts(m).map(move |t| ChatMessage::new(role, t))
        })
        .collect()
}

/// The prompts of a completions batch (`prompt: ["a", "b"]`) after the first, which alone
/// decides placement.
fn later_batch_prompts(body: &Map<String, Value>) -> Vec<ChatMessage> {
    match body.get("prompt") {
        Some(Value::Array(items)) => items
            .iter()
            .skip(1)
            .filter_map(Value::as_str)
            .map(|s| ChatMessage::new("user", s))
            .collect(),
        _ => Vec::new(),
    }
}

fn chat_messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    messages_array(body)?
        .iter()
        .enumerate()
        .map(|(i, m)| one_message(i, m))
        .collect()
}

fn anthropic_messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(sys) = body.get("system") {
        let text = content_text(sys, "system")?;
        if !text.is_empty() {
            out.push(ChatMessage::new("system", text));
        }
    }
    for (i, m) in messages_array(body)?.iter().enumerate() {
        let msg = one_message(i, m)?;
        if msg.role != "user" && msg.role != "assistant" {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "`messages[{i}].role` must be `user` or `assistant`, not `{}`",
                    msg.role
                ),
            ));
        }
        out.push(msg);
    }
    Ok(out)
}

/// The token ids of `items` (each an integer from 0 to `u32::MAX`), else `None`.
fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// A completions `prompt` in any of the forms OpenAI's API and vLLM take: a string, an array of
/// strings, an array of token ids, or an array of arrays of token ids (a batch). Returns the
/// prompt that decides placement (a batch's first), the number of prompts, and the estimated
/// tokens of the others ([`Parsed::later_prompt_tokens`]).
fn completion_prompt(body: &Map<String, Value>) -> Result<(Prompt, u32, u64), ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, an array of strings, an array of token ids, or an array \
             of arrays of token ids",
        )
    };
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    match body.get("prompt") {
        None => Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok((Prompt::Text(s.clone()), 1, 0)),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(ApiError::invalid("prompt", "`prompt` is empty"))
        }
        Some(Value::Array(items)) => {
            if items.iter().all(Value::is_string) {
                // Several prompts are several sequences; the first decides placement.
                let later = items
                    .iter()
                    .skip(1)
                    .filter_map(Value::as_str)
                    .map(|s| s.len().div_ceil(4) as u64)
                    .sum();
                Ok((
                    Prompt::Text(items[0].as_str().map(str::to_owned).unwrap_or_default()),
                    count(items.len()),
                    later,
                ))
            } else if items.iter().all(Value::is_array) {
                // A batch of token-id prompts, likewise.
                let mut batch = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let ids = item.as_array().and_then(|a| token_ids(a)).ok_or_else(|| {
                        ApiError::invalid(
                            format!("prompt[{i}]"),
                            format!(
                                "`prompt[{i}]` must be an array of token ids (integers from 0 \
                                 to {})",
                                u32::MAX
                            ),
                        )
                    })?;
                    batch.push(ids);
                }
                let later = batch.iter().skip(1).map(|ids| ids.len() as u64).sum();
                let n = count(batch.len());
                let first = batch.into_iter().next().unwrap_or_default();
                Ok((Prompt::Tokens(first), n, later))
            } else {
                Ok((Prompt::Tokens(token_ids(items).ok_or_else(bad)?), 1, 0))
            }
        }
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    fn err(api: Api, body: &str) -> ApiError {
        match parse(api, body.as_bytes()) {
            Ok(_) => panic!("expected an error for {body}"),
            Err(e) => e,
        }
    }

    #[test]
    fn sampling_parameters_of_the_wrong_type_or_range_are_refused_naming_the_field() {
        let chat = |extra: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],{extra}}}"#)
        };
        for (extra, field, says) in [
            (r#""temperature":"hot""#, "temperature", "a number"),
            (r#""temperature":-0.5"#, "temperature", "at least 0"),
            (r#""top_p":1.5"#, "top_p", "between 0 and 1"),
            (
                r#""presence_penalty":3"#,
                "presence_penalty",
                "between -2 and 2",
            ),
            (r#""n":0"#, "n", "an integer of at least 1"),
            (r#""n":1.5"#, "n", "an integer"),
            (r#""seed":"7""#, "seed", "an integer"),
            (r#""stop":[1]"#, "stop", "a string or a list of strings"),
        ] {
            let e = err(Api::Chat, &chat(extra));
            assert_eq!(e.param.as_deref(), Some(field), "{extra}");
            assert!(e.message.ends_with(says), "{extra}: {}", e.message);
        }
        // In range, unset or null: accepted; vLLM's wider ranges are not narrowed to OpenAI's.
        for extra in [
            r#""temperature":3,"top_p":1,"n":2,"seed":-1,"stop":"END","top_k":-1"#,
            r#""temperature":null,"stop":["a","b"],"seed":18446744073709551615"#,
            r#""logit_bias":{"1":2},"user":"u""#,
        ] {
            assert!(parse(Api::Chat, chat(extra).as_bytes()).is_ok(), "{extra}");
        }
        let messages = |extra: &str| {
            format!(
                r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":"x"}}],{extra}}}"#
            )
        };
        let e = err(Api::Messages, &messages(r#""temperature":1.5"#));
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = err(Api::Messages, &messages(r#""stop_sequences":"end""#));
        assert_eq!(e.param.as_deref(), Some("stop_sequences"));
        assert!(
            parse(
                Api::Messages,
                messages(r#""top_k":5,"stop_sequences":["x"]"#).as_bytes()
            )
            .is_ok()
        );
        let e = err(
            Api::Completions,
            r#"{"model":"m","prompt":"x","frequency_penalty":"high"}"#,
        );
        assert_eq!(e.param.as_deref(), Some("frequency_penalty"));
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(err(Api::Chat, "{").param.as_deref(), Some("body"));
        assert_eq!(err(Api::Chat, "[]").param.as_deref(), Some("body"));
        assert_eq!(
            err(Api::Chat, r#"{"messages":[]}"#).param.as_deref(),
            Some("model")
        );
        assert_eq!(
            err(Api::Chat, r#"{"model":"m"}"#).param.as_deref(),
            Some("messages")
        );
        assert_eq!(
            err(Api::Chat, r#"{"model":"m","messages":[{"content":"x"}]}"#)
                .param
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            err(
                Api::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#
            )
            .param
            .as_deref(),
            Some("stream")
        );
        assert_eq!(
            err(
                Api::Messages,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#
            )
            .param
            .as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            err(Api::Completions, r#"{"model":"m","prompt":{}}"#)
                .param
                .as_deref(),
            Some("prompt")
        );
    }

    #[test]
    fn json_depth_is_limited_and_names_the_member() {
        let deep = |n: usize| {
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"[[{{"}}],"x":{}1{}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        // 1 (body) + n arrays: within 64 when n = 63, over it when n = 64.
        assert!(check_json_depth(deep(63).as_bytes(), 64).is_ok());
        let e = match check_json_depth(deep(64).as_bytes(), 64) {
            Err(e) => e,
            Ok(()) => panic!("65 levels passed a limit of 64"),
        };
        assert_eq!(e.code, "json_too_deep");
        assert_eq!(e.param.as_deref(), Some("x"));
        assert!(e.message.contains("64"), "{}", e.message);
        // Brackets in strings (escaped quotes included) do not count.
        let s = format!(r#"{{"model":"m\"{}","x":1}}"#, "[".repeat(500));
        assert!(check_json_depth(s.as_bytes(), 2).is_ok());
        // A top-level array names the body.
        let e = check_json_depth(b"[[[[1]]]]", 3).err();
        assert_eq!(e.and_then(|e| e.param).as_deref(), Some("body"));
        // serde_json's own limit is never reached first with the default.
        assert!(
            parse_limited(Api::Chat, deep(200).as_bytes(), 64)
                .is_err_and(|e| e.code == "json_too_deep")
        );
    }

    #[test]
    fn anthropic_system_comes_first_and_blocks_are_joined() {
        let p = parse(
            Api::Messages,
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"be brief"}],
                 "messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            p.prompt,
            Prompt::Chat(vec![
                ChatMessage::new("system", "be brief"),
                // Joined by a newline, as vLLM joins text parts for the chat template.
                ChatMessage::new("user", "a\nb")
            ])
        );
        assert_eq!(p.max_tokens, Some(5));
    }

    /// What the classifiers read of a request: `(role, text, also_seen)`.
    fn classified(api: Api, body: &str) -> Vec<(String, String, bool)> {
        parse(api, body.as_bytes())
            .unwrap_or_else(|e| panic!("{e:?}"))
            .classified_messages()
            .map(|m| (m.role.to_owned(), m.content.to_owned(), m.also_seen))
            .collect()
    }

    fn read(role: &str, text: &str, also_seen: bool) -> (String, String, bool) {
        (role.to_owned(), text.to_owned(), also_seen)
    }

    /// Anthropic `tool_use` blocks' `name` and `input` are read after the messages, as the
    /// chat API's `tool_calls` are (`name arguments`), and `tool_result` content is part of its
    /// message; neither is tokenized for placement.
    #[test]
    fn anthropic_tool_use_and_tool_result_reach_the_classifiers() {
        let body = r#"{"model":"m","max_tokens":5,"system":"be brief","messages":[
            {"role":"user","content":"Charge my card."},
            {"role":"assistant","content":[
                {"type":"text","text":"Charging."},
                {"type":"tool_use","id":"t1","name":"charge","input":{"card":"4111 1111 1111 1111","cvv":123}},
                {"type":"server_tool_use","id":"s1","name":"web_search","input":{"query":"jane@example.com"}}
            ]},
            {"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"SSN 123-45-6789"}]},
                {"type":"tool_result","tool_use_id":"s1","content":"done"}
            ]}
        ]}"#;
        assert_eq!(
            classified(Api::Messages, body),
            [
                read("system", "be brief", false),
                read("user", "Charge my card.", false),
                read("assistant", "Charging.", false),
                read("user", "SSN 123-45-6789\ndone", false),
                read(
                    "assistant",
                    r#"charge {"card":"4111 1111 1111 1111","cvv":123}"#,
                    true
                ),
                read(
                    "assistant",
                    r#"web_search {"query":"jane@example.com"}"#,
                    true
                ),
            ]
        );
        // The prompt itself (what is tokenized) is unchanged: the calls are not in it.
        let p = parse(Api::Messages, body.as_bytes()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.message_count(), 4);
        // The chat API reads `tool_calls` the same way.
        let chat = r#"{"model":"m","messages":[
            {"role":"assistant","content":null,"tool_calls":[
                {"id":"c1","type":"function","function":{"name":"charge","arguments":"{\"card\": 1}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"ok"}]}"#;
        assert_eq!(
            classified(Api::Chat, chat),
            [
                read("assistant", "", false),
                read("tool", "ok", false),
                read("assistant", r#"charge {"card": 1}"#, true),
            ]
        );
        // A later prompt of a completions batch is read, but is no message of the prompt.
        assert_eq!(
            classified(Api::Completions, r#"{"model":"m","prompt":["a","b"]}"#),
            [read("user", "a", false), read("user", "b", true)]
        );
    }

    /// Anthropic `document` blocks with a text source (`text`, `content`) are read like text:
    /// their `title` and `context`, then the source's text, for the classifiers and the prompt
    /// (what is tokenized) alike, in a message or inside a `tool_result`. A PDF or a URL has no
    /// text here and is accepted. `search_result` blocks are read with their `title` and
    /// `source`. Before, a document's text reached neither, so PII in one went unseen.
    #[test]
    fn anthropic_document_and_search_result_blocks_reach_the_classifiers() {
        let body = r#"{"model":"m","max_tokens":5,"messages":[
            {"role":"user","content":[
                {"type":"text","text":"Summarize these."},
                {"type":"document","source":{"type":"text","media_type":"text/plain","data":"SSN 123-45-6789"},
                 "title":"HR record","context":"from the HR system","citations":{"enabled":true}},
                {"type":"document","source":{"type":"content","content":[
                    {"type":"text","text":"mail jane@example.com"},
                    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}},
                {"type":"document","source":{"type":"content","content":"a plain string"},"title":null},
                {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQ="}},
                {"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}},
                {"type":"search_result","source":"https://example.com/r","title":"Result",
                 "content":[{"type":"text","text":"card 4111 1111 1111 1111"}]}
            ]},
            {"role":"assistant","content":[
                {"type":"tool_use","id":"t1","name":"fetch","input":{}}]},
            {"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":[
                    {"type":"document","source":{"type":"text","media_type":"text/plain","data":"IBAN inside"}}]}]}
        ]}"#;
        let first = "Summarize these.\nHR record\nfrom the HR system\nSSN 123-45-6789\n\
                     mail jane@example.com\na plain string\n\
                     Result\nhttps://example.com/r\ncard 4111 1111 1111 1111";
        assert_eq!(
            classified(Api::Messages, body),
            [
                read("user", first, false),
                read("assistant", "", false),
                read("user", "IBAN inside", false),
                read("assistant", "fetch {}", true),
            ]
        );
        // The same text is the prompt that is tokenized (the prompt token estimate).
        let p = parse(Api::Messages, body.as_bytes()).unwrap_or_else(|e| panic!("{e:?}"));
        let Prompt::Chat(msgs) = &p.prompt else {
            panic!("{:?}", p.prompt)
        };
        assert_eq!(msgs[0].content, first);
        assert_eq!(msgs[2].content, "IBAN inside");
    }

    /// A `document` or `search_result` block of the wrong shape is a 400 naming the member,
    /// as a `text` that is not a string is.
    #[test]
    fn a_malformed_document_block_is_refused_naming_the_member() {
        let body = |block: &str| {
            format!(
                r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":[{{"type":"text","text":"x"}},{block}]}}]}}"#
            )
        };
        for (block, param, says) in [
            (
                r#"{"type":"document","source":{"type":"text","media_type":"text/plain","data":5}}"#,
                "messages[0].content[1].source.data",
                "a string",
            ),
            (
                r#"{"type":"document","source":{"type":"text","media_type":"text/plain"}}"#,
                "messages[0].content[1].source.data",
                "a string",
            ),
            (
                r#"{"type":"document","title":"t"}"#,
                "messages[0].content[1].source",
                "an object",
            ),
            (
                r#"{"type":"document","source":"https://example.com/a.pdf"}"#,
                "messages[0].content[1].source",
                "an object",
            ),
            (
                r#"{"type":"document","title":["t"],"source":{"type":"url","url":"https://x"}}"#,
                "messages[0].content[1].title",
                "a string",
            ),
            (
                r#"{"type":"document","context":{},"source":{"type":"url","url":"https://x"}}"#,
                "messages[0].content[1].context",
                "a string",
            ),
            (
                r#"{"type":"document","source":{"type":"content","content":[{"type":"text","text":1}]}}"#,
                "messages[0].content[1].source.content[0].text",
                "a string",
            ),
            (
                r#"{"type":"document","source":{"type":"content","content":7}}"#,
                "messages[0].content[1].source.content",
                "a string or an array of content parts",
            ),
            (
                r#"{"type":"search_result","source":1,"title":"t","content":[]}"#,
                "messages[0].content[1].source",
                "a string",
            ),
            (
                r#"{"type":"search_result","source":"s","title":"t","content":[{"type":"text","text":null}]}"#,
                "messages[0].content[1].content[0].text",
                "a string",
            ),
        ] {
            let e = err(Api::Messages, &body(block));
            assert_eq!(e.param.as_deref(), Some(param), "{block}: {e:?}");
            assert_eq!(e.message, format!("`{param}` must be {says}"), "{block}");
            assert_eq!(e.status, 400, "{block}");
        }
    }

    #[test]
    fn stream_options_and_token_prompts() {
        let p = parse(
            Api::Completions,
            br#"{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true},"max_tokens":7}"#,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(p.stream && p.client_wants_usage);
        assert_eq!(p.prompt, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(p.max_tokens, Some(7));
    }

    /// A completions batch (strings or token-id arrays) is placed by its first prompt; the
    /// others and `n` count for what the request may use. Output limits are read per API as
    /// vLLM reads them.
    #[test]
    fn batches_choices_and_output_limits() {
        let ok = |api: Api, body: &str| {
            parse(api, body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e:?}"))
        };
        let p = ok(
            Api::Completions,
            r#"{"model":"m","prompt":[[1,2,3],[4,5,6,7],[]],"n":2}"#,
        );
        assert_eq!(p.prompt, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!((p.prompts, p.choices, p.later_prompt_tokens), (3, 2, 4));
        assert_eq!(p.sequences(), 6);
        let p = ok(
            Api::Completions,
            r#"{"model":"m","prompt":["abcd","abcdefgh","a"]}"#,
        );
        assert_eq!(p.prompt, Prompt::Text("abcd".into()));
        assert_eq!((p.prompts, p.later_prompt_tokens, p.sequences()), (3, 3, 3));
        let e = err(
            Api::Completions,
            r#"{"model":"m","prompt":[[1],[2,4294967296]]}"#,
        );
        assert_eq!(e.param.as_deref(), Some("prompt[1]"));
        assert_eq!(
            err(Api::Completions, r#"{"model":"m","prompt":[[1],"a"]}"#)
                .param
                .as_deref(),
            Some("prompt")
        );
        // Completions: `max_tokens` only, vLLM's 16 without it.
        for body in [
            r#"{"model":"m","prompt":"x"}"#,
            r#"{"model":"m","prompt":"x","max_tokens":null,"max_completion_tokens":500}"#,
        ] {
            let p = ok(Api::Completions, body);
            assert_eq!((p.max_tokens, p.max_output_tokens()), (None, 16), "{body}");
        }
        // Chat: `max_completion_tokens`, else `max_tokens`, else the gateway's default.
        let chat = |extra: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#)
        };
        assert_eq!(
            ok(
                Api::Chat,
                &chat(r#","max_completion_tokens":5,"max_tokens":9"#)
            )
            .max_output_tokens(),
            5
        );
        assert_eq!(
            ok(Api::Chat, &chat(r#","max_tokens":9,"n":4"#)).sequences(),
            4
        );
        assert_eq!(
            ok(Api::Chat, &chat("")).max_output_tokens(),
            DEFAULT_MAX_TOKENS
        );
        // Anthropic: at least 1.
        for bad in ["0", "-1", "1.5", "\"5\""] {
            let e = err(
                Api::Messages,
                &format!(
                    r#"{{"model":"m","max_tokens":{bad},"messages":[{{"role":"user","content":"a"}}]}}"#
                ),
            );
            assert_eq!(e.param.as_deref(), Some("max_tokens"), "{bad}");
            assert_eq!(
                e.message, "`max_tokens` must be an integer of at least 1",
                "{bad}"
            );
        }
    }

    #[test]
    fn messages_require_max_tokens_itself() {
        let body = br#"{"model":"m","max_completion_tokens":5,"messages":[{"role":"user","content":"a"}]}"#;
        // OpenAI's newer name counts on the chat API...
        let p = parse(Api::Chat, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.max_tokens, Some(5));
        // ...but is no `max_tokens` for Anthropic's, which requires that one.
        let e = parse(Api::Messages, body)
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.message, "`max_tokens` is required");
    }
}
