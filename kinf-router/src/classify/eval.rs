//! Request parsing shared by `kinfctl classify` and the corpus test, and the evaluation of the
//! classifiers against a labelled JSONL file.

use serde::Serialize;
use serde_json::Value;

use super::{Classifiers, Message};

/// A message with owned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedMessage {
    /// Role.
    pub role: String,
    /// Text; array contents are read as [`messages_from_json`] says.
    pub content: String,
    /// Text the model also reads that is no message of its own (a tool call, a later prompt
    /// of a batch): not a conversation turn (see [`Message`]).
    pub also_seen: bool,
}

impl OwnedMessage {
    /// The borrowed form.
    pub fn as_message(&self) -> Message<'_> {
        if self.also_seen {
            Message::also_seen(&self.role, &self.content)
        } else {
            Message::new(&self.role, &self.content)
        }
    }

    /// A message.
    pub fn new(role: &str, content: String) -> Self {
        OwnedMessage {
            role: role.to_string(),
            content,
            also_seen: false,
        }
    }

    fn extra(role: &str, content: String) -> Self {
        OwnedMessage {
            also_seen: true,
            ..OwnedMessage::new(role, content)
        }
    }
}

/// The messages of a request, read as the gateway reads them for its classifiers:
///
/// - `{"text": "..."}`: one user message;
/// - a chat request, OpenAI or Anthropic: Anthropic's top-level `system` (when not empty)
///   first, then every message of `messages` (a missing `role` is `user`), then, for each
///   tool call of a message, an entry of its `tool_calls` or its deprecated `function_call`
///   (OpenAI) or a `tool_use` block of
///   its `content` (Anthropic), a message of that role holding the tool's name and arguments
///   (`name arguments`, `name input`), marked `also_seen`;
/// - a completions request: each string of `prompt` (a string or an array of strings; token
///   ids carry no text) as a user message, those after the first marked `also_seen`.
///
/// A `content` is a string, `null`, or an array of parts whose text, as [`part_pieces`] finds
/// it (a part's `text`; the `title`, `context` and text source of an Anthropic `document`
/// block; the `title`, `source` and `content` of a `search_result` block; the `content` of a
/// `tool_result` block, read the same way), is joined by newlines; parts without text (images,
/// audio, documents from a PDF, a URL or a file) add nothing.
pub fn messages_from_json(v: &Value) -> Result<Vec<OwnedMessage>, String> {
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        return Ok(vec![OwnedMessage::new("user", t.to_string())]);
    }
    if let Some(prompt) = v.get("prompt") {
        return match prompt {
            Value::String(s) => Ok(vec![OwnedMessage::new("user", s.clone())]),
            Value::Array(items) => Ok(items
                .iter()
                .filter_map(Value::as_str)
                .enumerate()
                .map(|(i, s)| match i {
                    0 => OwnedMessage::new("user", s.to_string()),
                    _ => OwnedMessage::extra("user", s.to_string()),
                })
                .collect()),
            _ => Err("`prompt`: expected a string or an array".into()),
        };
    }
    let Some(msgs) = v.get("messages").and_then(Value::as_array) else {
        return Err(
            "expected `text` (a string), `messages` (an array) or `prompt` (a completions prompt)"
                .into(),
        );
    };
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if let Some(sys) = v.get("system") {
        let text = content_text(sys, "system")?;
        if !text.is_empty() {
            out.push(OwnedMessage::new("system", text));
        }
    }
    let mut calls = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = match m.get("content") {
            Some(c) => content_text(c, &format!("messages[{i}].content"))?,
            None => String::new(),
        };
        out.push(OwnedMessage::new(role, content));
        calls.extend(tool_call_texts(m).map(|t| OwnedMessage::extra(role, t)));
    }
    out.extend(calls);
    Ok(out)
}

/// The tool calls one message of a request carries, each as [`tool_call_text`]: the chat API's
/// `tool_calls` (`function.name function.arguments`) and its deprecated single
/// `function_call`, and Anthropic's tool-use content blocks ([`is_tool_use`]: `name input`).
/// The model reads them through its chat template and a provider is sent them, so the
/// classifiers read them too; the gateway and `kinfctl classify` both read them here.
pub fn tool_call_texts(message: &Value) -> impl Iterator<Item = String> + '_ {
    let chat_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("function"))
        .map(|f| tool_call_text(f, "arguments"));
    // The deprecated single call of the chat API, still sent on to providers.
    let function_call = message
        .get("function_call")
        .filter(|f| f.is_object())
        .map(|f| tool_call_text(f, "arguments"));
    let tool_uses = message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| is_tool_use(b))
        .map(|b| tool_call_text(b, "input"));
    chat_calls.chain(function_call).chain(tool_uses)
}

/// Whether a content block is an Anthropic tool call (`tool_use`, and the `server_tool_use` and
/// `mcp_tool_use` blocks of server and MCP tools): its `name` and `input` are read.
pub fn is_tool_use(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("tool_use" | "server_tool_use" | "mcp_tool_use")
    )
}

/// `name arguments` of a tool call: its `name` and its `args` member (`arguments`, a JSON
/// string, for OpenAI; `input`, an object, for Anthropic), a string as it is and any other
/// value as compact JSON.
pub fn tool_call_text(call: &Value, args: &str) -> String {
    let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
    let args = match call.get(args) {
        Some(Value::String(s)) => s.clone(),
        Some(v) if !v.is_null() => v.to_string(),
        _ => String::new(),
    };
    format!("{name} {args}")
}

/// A piece of the text of a content part, as [`part_pieces`] finds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Piece<'a> {
    /// Text, as it is.
    Text(&'a str),
    /// A `content` value nested in the part (a string, `null`, or an array of parts, read as
    /// the message's own `content` is), and where it is below the part: `.content` (a
    /// `tool_result` or `search_result` block), `.source.content` (a `document` block).
    Content(&'a Value, &'static str),
}

/// A member of a content part of the wrong type: where it is below the part (`.text`,
/// `.source.data`) and what it must be (`a string`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadMember {
    /// The member's path below the part, starting with `.`.
    pub at: &'static str,
    /// What it must be, as in "must be {expected}".
    pub expected: &'static str,
}

/// The text a content part (an element of a `content` array) carries, in the order the model
/// reads it, for the classifiers, the prompt token estimate and `kinfctl classify` alike:
///
/// - an Anthropic `document` block: its `title` and `context`, then the text of its `source`:
///   `data` of a `text` source (plain text), `content` of a `content` source (a string or text
///   blocks); a `base64`, `url` or `file` source (a PDF, a document to fetch) has no text to
///   read here and adds nothing;
/// - an Anthropic `search_result` block: its `title`, its `source` (a URL or name) and its
///   `content` (text blocks);
/// - any other part with `text` (`text`, `input_text`): that string;
/// - any other part with `content` (a `tool_result` block): that content;
/// - anything else (images, audio, files), and a part that is not an object: nothing.
///
/// `title`, `context` and a `search_result`'s `source` may be absent or `null`; a `document`'s
/// `source` must be an object and a `text` source's `data` a string, as the Anthropic API
/// requires.
pub fn part_pieces(part: &Value) -> Result<Vec<Piece<'_>>, BadMember> {
    let Value::Object(o) = part else {
        return Ok(Vec::new());
    };
    let opt_str = |key: &str, at: &'static str| match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Piece::Text(s))),
        Some(_) => Err(BadMember {
            at,
            expected: "a string",
        }),
    };
    let mut out = Vec::new();
    match o.get("type").and_then(Value::as_str) {
        Some("document") => {
            out.extend(opt_str("title", ".title")?);
            out.extend(opt_str("context", ".context")?);
            let Some(Value::Object(source)) = o.get("source") else {
                return Err(BadMember {
                    at: ".source",
                    expected: "an object",
                });
            };
            match source.get("type").and_then(Value::as_str) {
                Some("text") => match source.get("data") {
                    Some(Value::String(d)) => out.push(Piece::Text(d)),
                    _ => {
                        return Err(BadMember {
                            at: ".source.data",
                            expected: "a string",
                        });
                    }
                },
                Some("content") => {
                    if let Some(c) = source.get("content") {
                        out.push(Piece::Content(c, ".source.content"));
                    }
                }
                // `base64` (a PDF), `url`, `file`: no text here.
                _ => {}
            }
        }
        Some("search_result") => {
            out.extend(opt_str("title", ".title")?);
            out.extend(opt_str("source", ".source")?);
            if let Some(c) = o.get("content") {
                out.push(Piece::Content(c, ".content"));
            }
        }
        _ => match o.get("text") {
            Some(Value::String(t)) => out.push(Piece::Text(t)),
            Some(_) => {
                return Err(BadMember {
                    at: ".text",
                    expected: "a string",
                });
            }
            None => {
                if let Some(c) = o.get("content") {
                    out.push(Piece::Content(c, ".content"));
                }
            }
        },
    }
    Ok(out)
}

/// The text of a `content` value (see [`messages_from_json`]).
fn content_text(v: &Value, field: &str) -> Result<String, String> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter().enumerate() {
                let pieces = part_pieces(p)
                    .map_err(|b| format!("{field}[{i}]{}: expected {}", b.at, b.expected))?;
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => texts.push(t.to_string()),
                        Piece::Content(c, at) => {
                            texts.push(content_text(c, &format!("{field}[{i}]{at}"))?);
                        }
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(format!("{field}: expected a string or an array")),
    }
}

/// One labelled example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// 1-based line number in the file.
    pub line: usize,
    /// Messages.
    pub messages: Vec<OwnedMessage>,
    /// Expected tags.
    pub tags: Vec<String>,
}

/// Parses a labelled JSONL file: one request object per line, read by [`messages_from_json`],
/// plus its expected `tags`.
/// Blank lines are skipped.
pub fn parse_jsonl(text: &str) -> Result<Vec<Example>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let messages = messages_from_json(&v).map_err(|e| format!("line {}: {e}", i + 1))?;
        let tags = match v.get("tags") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("line {}: tags must be strings", i + 1))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
            Some(_) => return Err(format!("line {}: `tags` must be an array", i + 1)),
        };
        out.push(Example {
            line: i + 1,
            messages,
            tags,
        });
    }
    Ok(out)
}

/// Counts for one tag.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TagStats {
    /// The tag.
    pub tag: String,
    /// Expected and produced.
    pub tp: usize,
    /// Produced, not expected.
    pub fp: usize,
    /// Expected, not produced.
    #[serde(rename = "fn")]
    pub fn_: usize,
    /// tp / (tp + fp); 1 when nothing was produced.
    pub precision: f64,
    /// tp / (tp + fn); 1 when nothing was expected.
    pub recall: f64,
}

/// A wrong answer on one example.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mistake {
    /// Line in the file.
    pub line: usize,
    /// The tag.
    pub tag: String,
    /// `fp` or `fn`.
    pub kind: &'static str,
}

/// The evaluation result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalReport {
    /// Examples read.
    pub examples: usize,
    /// Per tag, sorted by tag.
    pub tags: Vec<TagStats>,
    /// Every false positive and false negative.
    pub mistakes: Vec<Mistake>,
}

impl EvalReport {
    /// The stats of a tag.
    pub fn tag(&self, tag: &str) -> Option<&TagStats> {
        self.tags.iter().find(|t| t.tag == tag)
    }
}

const FAMILIES: [&str; 2] = ["pii-", "complexity-"];

/// Scores the classifiers on labelled examples. Only `pii-*` and `complexity-*` tags are
/// scored, and a family only when at least one example expects a tag of it (so a file labelled
/// for PII alone is not penalised for complexity tags).
pub fn evaluate(classifiers: &Classifiers, examples: &[Example]) -> EvalReport {
    let families: Vec<&str> = FAMILIES
        .iter()
        .copied()
        .filter(|f| {
            examples
                .iter()
                .any(|e| e.tags.iter().any(|t| t.starts_with(f)))
        })
        .collect();
    let scored = |t: &str| families.iter().any(|f| t.starts_with(f));
    let mut stats: std::collections::BTreeMap<String, (usize, usize, usize)> = Default::default();
    let mut mistakes = Vec::new();
    for ex in examples {
        let msgs: Vec<Message<'_>> = ex.messages.iter().map(OwnedMessage::as_message).collect();
        let got: Vec<String> = classifiers
            .classify(&msgs)
            .tags
            .iter()
            .map(|t| t.to_string())
            .filter(|t| scored(t))
            .collect();
        let want: Vec<&String> = ex.tags.iter().filter(|t| scored(t)).collect();
        for t in &got {
            let s = stats.entry(t.clone()).or_default();
            if want.contains(&t) {
                s.0 += 1;
            } else {
                s.1 += 1;
                mistakes.push(Mistake {
                    line: ex.line,
                    tag: t.clone(),
                    kind: "fp",
                });
            }
        }
        for t in want {
            if !got.contains(t) {
                stats.entry(t.clone()).or_default().2 += 1;
                mistakes.push(Mistake {
                    line: ex.line,
                    tag: t.clone(),
                    kind: "fn",
                });
            }
        }
    }
    let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    EvalReport {
        examples: examples.len(),
        tags: stats
            .into_iter()
            .map(|(tag, (tp, fp, fn_))| TagStats {
                tag,
                tp,
                fp,
                fn_,
                precision: ratio(tp, tp + fp),
                recall: ratio(tp, tp + fn_),
            })
            .collect(),
        mistakes,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every kind of tool call a message carries, in one reader for the gateway and `kinfctl
    /// classify`: chat `tool_calls`, the deprecated `function_call`, Anthropic tool-use blocks
    /// (not `tool_result`, whose content is the message's text).
    #[test]
    fn tool_call_texts_reads_every_kind_of_call() {
        let m = serde_json::json!({
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}],
            "function_call": {"name": "g", "arguments": "x"},
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "tool_use", "name": "h", "input": {"b": 2}},
                {"type": "server_tool_use", "name": "web", "input": {"q": "z"}},
                {"type": "tool_result", "content": "r"}
            ]
        });
        let texts: Vec<String> = tool_call_texts(&m).collect();
        assert_eq!(
            texts,
            ["f {\"a\":1}", "g x", "h {\"b\":2}", "web {\"q\":\"z\"}"]
        );
        // `function_call` that is not an object, and content that is a string: nothing.
        let m = serde_json::json!({"function_call": "auto", "content": "text"});
        assert_eq!(tool_call_texts(&m).count(), 0);
    }

    /// `kinfctl classify --file` and `test-classifiers` read `document` and `search_result`
    /// blocks as the gateway does (the text of a text or content source, with `title` and
    /// `context`; a PDF or URL adds nothing), and name the member of a wrong shape.
    #[test]
    fn document_and_search_result_blocks_are_read_as_the_gateway_reads_them() {
        let v = serde_json::json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [
                {"type": "document", "title": "HR record", "context": "from HR",
                 "source": {"type": "text", "media_type": "text/plain", "data": "SSN 123-45-6789"}},
                {"type": "document", "source": {"type": "content", "content": [
                    {"type": "text", "text": "mail jane@example.com"}]}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
                {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
                {"type": "search_result", "source": "https://example.com/r", "title": "Result",
                 "content": [{"type": "text", "text": "found"}]}
            ]}
        ]});
        let msgs = messages_from_json(&v).unwrap();
        assert_eq!(
            msgs,
            [OwnedMessage::new(
                "user",
                "HR record\nfrom HR\nSSN 123-45-6789\nmail jane@example.com\n\
                 Result\nhttps://example.com/r\nfound"
                    .to_string()
            )]
        );
        let bad = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"},
            {"type": "document", "source": {"type": "text", "data": 1}}]}]});
        assert_eq!(
            messages_from_json(&bad),
            Err("messages[0].content[1].source.data: expected a string".to_string())
        );
        let bad = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "content", "content": [{"text": 2}]}}]}]});
        assert_eq!(
            messages_from_json(&bad),
            Err("messages[0].content[0].source.content[0].text: expected a string".to_string())
        );
    }
}
