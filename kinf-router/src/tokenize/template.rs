//! The chat template, rendered like HF transformers' `apply_chat_template` (Jinja2 with
//! `trim_blocks`, `lstrip_blocks`, `loopcontrols`, `raise_exception`, `strftime_now` and its own
//! `tojson`), and vLLM 0.32's conversation preparation for text-only messages.

use std::sync::LazyLock;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use regex::Regex;

use super::pyfmt::{JsonOptions, str_into, strftime_utc, to_json};
use super::{ChatMessage, ContentFormat, TokenizeError};

/// Name of the one template in the environment.
const NAME: &str = "chat_template";

/// First line of a Claude Code system message that vLLM 0.32 drops
/// (`vllm/renderers/chat_utils.py`, `_strip_claude_code_billing_header`).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// A template loop over a message's content parts (`for part in message['content']`): vLLM then
/// passes content in the OpenAI format (`[{"type": "text", "text": ...}]`).
static CONTENT_LOOP: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"\bfor\s+\w+(?:\s*,\s*\w+)*\s+in\s+\(?\s*\w+\s*(?:\[\s*['"]content['"]\s*\]|\.content\b)"#,
    )
    .ok()
});

/// HF's `{% generation %}` / `{% endgeneration %}` (assistant-mask tracking; renders its body).
static GENERATION_TAG: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}").ok());

/// The error `raise_exception(message)` raises inside a template.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A compiled chat template and what vLLM derives from its source.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// How vLLM passes message content to this template.
    pub(crate) content_format: ContentFormat,
    /// Whether the template mentions the `developer` role (else vLLM maps it to `system`).
    pub(crate) supports_developer: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("content_format", &self.content_format)
            .field("supports_developer", &self.supports_developer)
            .finish_non_exhaustive()
    }
}

/// vLLM's content-format detection, as a textual approximation of its Jinja AST walk
/// (`vllm/renderers/hf.py`, `_detect_content_format`).
pub(crate) fn detect_content_format(source: &str) -> ContentFormat {
    match CONTENT_LOOP.as_ref() {
        Some(re) if re.is_match(source) => ContentFormat::OpenAi,
        _ => ContentFormat::String,
    }
}

/// `{% generation %}` → `{% if true %}` (same whitespace control), which minijinja understands.
fn rewrite_generation_tags(source: &str) -> String {
    match GENERATION_TAG.as_ref() {
        Some(re) => re
            .replace_all(source, |c: &regex::Captures<'_>| {
                let open = c.get(1).map_or("", |m| m.as_str());
                let close = c.get(3).map_or("", |m| m.as_str());
                let body = if c.get(2).is_some() {
                    "endif"
                } else {
                    "if true"
                };
                format!("{{%{open} {body} {close}%}}")
            })
            .into_owned(),
        None => source.to_owned(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception").with_source(Raised(message)))
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let positional = |i: usize| args.get(i).cloned();
    let pick = |i: usize, name: &str| -> Result<Option<Value>, Error> {
        match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Ok(Some(v)),
            None => Ok(positional(i)),
        }
    };
    if args.len() > 4 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = v.as_i64().unwrap_or(0).max(0);
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
    };
    let (mut item_sep, mut key_sep) = if indent.is_some() {
        (",".to_owned(), ": ".to_owned())
    } else {
        (", ".to_owned(), ": ".to_owned())
    };
    if let Some(seps) = pick(2, "separators")?
        && !seps.is_none()
        && !seps.is_undefined()
    {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if let [a, b] = parts.as_slice() {
            item_sep = a.as_str().unwrap_or_default().to_owned();
            key_sep = b.as_str().unwrap_or_default().to_owned();
        } else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        }
    }
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = JsonOptions {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    Ok(Value::from(to_json(value, &opts)?))
}

impl ChatTemplate {
    /// Compiles `source`; `clock` gives the Unix time `strftime_now` formats (UTC).
    pub(crate) fn new(source: &str, clock: fn() -> i64) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizeError::InvalidTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let mut s = String::new();
            str_into(value, &mut s)?;
            out.write_str(&s).map_err(Error::from)
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String| {
            strftime_utc(&format, clock())
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, rewrite_generation_tags(source))
            .map_err(|e| TokenizeError::InvalidTemplate(error_text(&e)))?;
        Ok(Self {
            env,
            content_format: detect_content_format(source),
            supports_developer: source.contains("\"developer\"") || source.contains("'developer'"),
        })
    }

    /// Renders the template with `messages` already in vLLM's conversation shape.
    pub(crate) fn render(&self, ctx: Value) -> Result<String, TokenizeError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::InvalidTemplate(error_text(&e)))?;
        tmpl.render(ctx).map_err(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if let Some(raised) = err.downcast_ref::<Raised>() {
                    return TokenizeError::TemplateRaised(raised.0.clone());
                }
                source = err.source();
            }
            TokenizeError::Render(error_text(&e))
        })
    }
}

/// A minijinja error with its location, on one line.
fn error_text(e: &Error) -> String {
    let mut s = e.to_string();
    if let (Some(name), Some(line)) = (e.name(), e.line()) {
        s.push_str(&format!(" (at {name}:{line})"));
    }
    s
}

/// vLLM 0.32's conversation for text-only messages (`parse_chat_messages` in
/// `vllm/renderers/chat_utils.py`; developer-role handling in `vllm/renderers/hf.py`,
/// `safe_apply_chat_template`).
pub(crate) fn conversation(
    messages: &[ChatMessage],
    format: ContentFormat,
    supports_developer: bool,
) -> Vec<Value> {
    let has_developer = messages.iter().any(|m| m.role == "developer");
    let convert_developer = has_developer && !supports_developer;

    // Each message: role and its text parts (0 or 1 here).
    let mut conv: Vec<(&str, Option<&str>)> = messages
        .iter()
        .map(|m| {
            let mut text = Some(m.content.as_str());
            if m.role == "system" && m.content.starts_with(BILLING_HEADER) {
                let rest = m.content.split_once('\n').map_or("", |(_, rest)| rest);
                text = (!rest.is_empty()).then_some(rest);
            }
            let role = if convert_developer && m.role == "developer" {
                "system"
            } else {
                m.role.as_str()
            };
            (role, text)
        })
        .collect();

    // `_consolidate_system_messages`: only after a developer → system conversion.
    let mut merged_system: Option<String> = None;
    if convert_developer {
        let needs = conv
            .iter()
            .enumerate()
            .any(|(i, (role, _))| *role == "system" && i > 0);
        if needs {
            let texts: Vec<&str> = conv
                .iter()
                .filter(|(role, _)| *role == "system")
                .filter_map(|(_, t)| *t)
                .filter(|t| !t.is_empty())
                .collect();
            merged_system = Some(texts.join("\n\n"));
            conv.retain(|(role, _)| *role != "system");
        }
    }

    let text_part =
        |t: &str| Value::from_pairs([("type", Value::from("text")), ("text", Value::from(t))]);
    let content_value = |role: &str, text: Option<&str>| -> Value {
        match format {
            ContentFormat::String => Value::from(text.unwrap_or("")),
            // Tool results are flattened back to a string.
            ContentFormat::OpenAi if role == "tool" => Value::from(text.unwrap_or("")),
            ContentFormat::OpenAi => {
                Value::from(text.map(text_part).into_iter().collect::<Vec<_>>())
            }
        }
    };
    let message = |role: &str, content: Value| -> Value {
        if role == "developer" {
            Value::from_pairs([
                ("role", Value::from(role)),
                ("content", content),
                ("tools", Value::from(())),
            ])
        } else {
            Value::from_pairs([("role", Value::from(role)), ("content", content)])
        }
    };

    let mut out = Vec::with_capacity(conv.len() + 1);
    if let Some(system) = merged_system {
        // The merged message always has string content.
        out.push(message("system", Value::from(system)));
    }
    out.extend(
        conv.into_iter()
            .map(|(role, text)| message(role, content_value(role, text))),
    );
    out
}
