//! Request tokens exactly as vLLM computes them, for precise KV-cache prefix matching.
//!
//! [`ChatTokenizer`] is built from the contents of a model's `tokenizer.json` and
//! `tokenizer_config.json` (the caller reads the files; this module does no I/O) and turns
//! `/v1/chat/completions` messages and `/v1/completions` prompts into the token ids vLLM 0.32
//! feeds its engine — the ids its KV events carry.
//!
//! # What vLLM 0.32 does, and what this module mirrors
//!
//! * **Chat** (`vllm/renderers/online_renderer.py`, `preprocess_chat`): the messages become a
//!   "conversation" (`vllm/renderers/chat_utils.py`, `parse_chat_messages`: content as a string,
//!   or as `[{"type": "text", "text": ...}]` when the template loops over content parts; the
//!   `x-anthropic-billing-header` line of a system message dropped), `developer` messages become
//!   `system` when the template has no developer role (`vllm/renderers/hf.py`,
//!   `safe_apply_chat_template`), then HF `apply_chat_template(conversation, tokenize=False,
//!   add_generation_prompt=True)` renders the text, and `tokenizer(text,
//!   add_special_tokens=request.add_special_tokens)` encodes it
//!   (`vllm/renderers/base.py`, `_tokenize_prompt`; `vllm/renderers/params.py`,
//!   `TokenizeParams.get_encode_kwargs`). `ChatCompletionRequest.add_special_tokens` defaults to
//!   **false** (`vllm/entrypoints/openai/chat_completion/protocol.py`: "the chat template takes
//!   care of adding the special tokens"), so the BOS comes from the template's `{{ bos_token }}`
//!   only; adding it again would give a double BOS and shift every block. [`ChatOptions`] carries
//!   the request's `add_generation_prompt`, `add_special_tokens` and `chat_template_kwargs`.
//! * **Completions**: `CompletionRequest.add_special_tokens` defaults to **true**
//!   (`vllm/entrypoints/openai/completion/protocol.py`), so the prompt gets what the
//!   `tokenizer.json` post-processor adds (e.g. Llama 3's `TemplateProcessing` BOS; nothing for a
//!   `ByteLevel` post-processor). transformers 5 (vLLM 0.32 pins `>=5.16.1,<5.20`) keeps the
//!   `tokenizer.json` post-processor for `PreTrainedTokenizerFast`, whatever `add_bos_token` says.
//! * Rendering follows transformers' Jinja environment (`trim_blocks`, `lstrip_blocks`,
//!   `loopcontrols`, `raise_exception`, `strftime_now` — UTC here, see
//!   [`ChatTokenizer::with_clock`] —, its own `tojson`, `{% generation %}`), with Python's
//!   formatting of printed values (`True`, `None`, `1.0`) and Python string methods
//!   (`minijinja-contrib` pycompat). The template context is what transformers passes:
//!   `messages`, `tools=None`, `documents=None`, `add_generation_prompt`, the named special tokens
//!   of `tokenizer_config.json` (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
//!   `pad_token`, `cls_token`, `mask_token`) and the request's template kwargs.
//!
//! Limits: vLLM truncates at `max_model_len − max_tokens + 1` tokens only to reject the request,
//! so no truncation happens here. Model-specific transformers tokenizer classes that rebuild the
//! pipeline instead of loading `tokenizer.json` (see [`ChatTokenizer::tokenizer_class`]) and
//! multimodal content are out of scope; check a new model against vLLM's `/tokenize` output.
//!
//! # Segment cache
//!
//! HF tokenizers treat added tokens (`<|eot_id|>`, ...) as atomic: the text between two of them
//! is encoded independently of the rest. The text is split there (see `split.rs`) and each
//! segment's ids are cached ([`CacheStats`]), so a long system prompt seen before costs a hash
//! and a copy instead of a BPE run. A Metaspace pre-tokenizer with `prepend_scheme: first`
//! treats the segment at offset 0 differently from the others; those are encoded with a
//! `prepend_scheme: never` copy of the tokenizer, and the variant is part of the cache key.
//! Tokenizers with a `single_word` added token are encoded whole (not cached).
//! [`ChatTokenizer::encode_text_uncached`] is the reference path; tests prove both agree.
//!
//! Segments that miss the cache go through a byte-level BPE fast path when the pipeline allows
//! it (`fast.rs`: the pre-tokenizer's splits found by hand-written matchers on ASCII text for the
//! GPT-2, Llama 3 and Qwen 2 patterns (`ascii_split.rs`) and by the regex without
//! `fancy-regex`'s backtracking elsewhere, then the ids of each split from a memo or the
//! tokenizer's own BPE model; same ids — see [`ChatTokenizer::uses_fast_path`]), else through HF
//! `encode`.
//!
//! Figures (release, idle 2-core x86_64 VM, tiny-llama, `benches/tokenize.rs`): a 16k-token chat
//! whose 15k-token system prompt was seen before, with a new 1k-token user message, ≈47 µs; the
//! same with the segment cache emptied ≈0.46 ms (≈2.2 ms before the split matchers and the
//! memo); fully warm ≈18 µs; a 1k-token chat cold ≈35 µs.
//!
//! `ChatTokenizer` is `Send + Sync`; share it behind an `Arc`. All methods take `&self`.

mod ascii_split;
mod cache;
mod fast;
mod pyfmt;
mod split;
mod template;

use std::str::FromStr;
use std::sync::Arc;

use minijinja::Value;
use serde::{Deserialize, Serialize};
use tokenizers::{AddedToken, Encoding, Token, Tokenizer};
use xxhash_rust::xxh3::xxh3_64;

pub use cache::CacheStats;
use cache::{Key, SegmentCache};
use fast::FastByteLevel;
use split::{Piece, Splitter};
use template::ChatTemplate;

/// Default byte budget of the segment cache (≈ 8 M cached tokens).
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

/// Errors of [`ChatTokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// `tokenizer.json` could not be loaded.
    #[error("invalid `tokenizer.json`: {0}")]
    InvalidTokenizer(String),
    /// `tokenizer_config.json` is not valid JSON or has unexpected field types.
    #[error("invalid `tokenizer_config.json`: {0}")]
    InvalidConfig(String),
    /// A chat request for a model without a chat template.
    #[error("the model has no chat template")]
    NoChatTemplate,
    /// The chat template does not compile.
    #[error("invalid chat template: {0}")]
    InvalidTemplate(String),
    /// The template called `raise_exception(message)` (vLLM answers 400 with this message).
    #[error("the chat template rejected the request: {0}")]
    TemplateRaised(String),
    /// Rendering failed otherwise.
    #[error("chat template rendering failed: {0}")]
    Render(String),
    /// No messages (transformers refuses an empty conversation).
    #[error("cannot apply the chat template to an empty conversation")]
    EmptyConversation,
    /// The tokenizer failed on the text.
    #[error("tokenization failed: {0}")]
    Encode(String),
}

/// One chat message (text content; array content is flattened by the caller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, `developer`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from its role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How vLLM passes message content to the template
/// (`--chat-template-content-format`, detected from the template by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentFormat {
    /// `content` is a string.
    String,
    /// `content` is `[{"type": "text", "text": ...}]` (templates that loop over parts).
    #[serde(rename = "openai")]
    OpenAi,
}

/// Per-request chat options (the vLLM request fields of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    /// Append the assistant header (vLLM default: true).
    pub add_generation_prompt: bool,
    /// Let the tokenizer's post-processor add its special tokens too (vLLM default: false).
    pub add_special_tokens: bool,
    /// `chat_template_kwargs`: extra template variables (e.g. `enable_thinking`).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            add_special_tokens: false,
            template_kwargs: serde_json::Map::new(),
        }
    }
}

/// What the post-processor adds around a single sequence when `add_special_tokens` is true.
#[derive(Debug, Clone)]
enum PostSpecials {
    /// Fixed ids before and after the sequence.
    Known { prefix: Vec<u32>, suffix: Vec<u32> },
    /// Not of that shape: encode whole texts with the tokenizer itself.
    Unknown,
}

/// Named special tokens transformers passes to chat templates.
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

fn system_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A model's tokenizer and chat template, with a segment cache.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    /// `prepend_scheme: never` copy for segments not at offset 0 (Metaspace `first` only).
    rest_tokenizer: Option<Tokenizer>,
    /// Equivalent faster encoder for byte-level BPE pipelines (see `fast.rs`).
    fast: Option<FastByteLevel>,
    splitter: Splitter,
    post: PostSpecials,
    template_source: Option<String>,
    template: Option<ChatTemplate>,
    content_format: Option<ContentFormat>,
    special_vars: Vec<(&'static str, String)>,
    tokenizer_class: Option<String>,
    clock: fn() -> i64,
    cache: SegmentCache,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("metaspace_first", &self.rest_tokenizer.is_some())
            .field("fast_byte_level", &self.fast.is_some())
            .field("template", &self.template)
            .field("special_vars", &self.special_vars)
            .field("tokenizer_class", &self.tokenizer_class)
            .field("cache", &self.cache.stats())
            .finish_non_exhaustive()
    }
}

/// Sets every Metaspace `prepend_scheme: first` in a pre-tokenizer JSON to `never`.
fn patch_metaspace_first(v: &mut serde_json::Value) -> bool {
    let Some(obj) = v.as_object_mut() else {
        return false;
    };
    match obj.get("type").and_then(serde_json::Value::as_str) {
        Some("Metaspace")
            if obj
                .get("prepend_scheme")
                .and_then(serde_json::Value::as_str)
                == Some("first") =>
        {
            obj.insert("prepend_scheme".into(), "never".into());
            true
        }
        Some("Sequence") => match obj.get_mut("pretokenizers") {
            Some(serde_json::Value::Array(items)) => {
                let mut any = false;
                for item in items {
                    any |= patch_metaspace_first(item);
                }
                any
            }
            _ => false,
        },
        _ => false,
    }
}

/// A special token of `tokenizer_config.json`: a string or `{"content": ..., ...}`.
fn config_token(v: &serde_json::Value) -> Option<AddedToken> {
    match v {
        serde_json::Value::String(s) => Some(AddedToken::from(s.clone(), true)),
        serde_json::Value::Object(o) => {
            let content = o.get("content")?.as_str()?.to_owned();
            let flag = |k: &str, default: bool| {
                o.get(k)
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(default)
            };
            Some(
                AddedToken::from(content, true)
                    .single_word(flag("single_word", false))
                    .lstrip(flag("lstrip", false))
                    .rstrip(flag("rstrip", false))
                    .normalized(flag("normalized", false)),
            )
        }
        _ => None,
    }
}

fn load_tokenizer(json: &str, missing: &[AddedToken]) -> Result<Tokenizer, TokenizeError> {
    let mut tok =
        Tokenizer::from_str(json).map_err(|e| TokenizeError::InvalidTokenizer(e.to_string()))?;
    tok.with_truncation(None)
        .map_err(|e| TokenizeError::InvalidTokenizer(e.to_string()))?;
    tok.with_padding(None);
    if !missing.is_empty() {
        tok.add_special_tokens(missing.iter().cloned())
            .map_err(|e| TokenizeError::InvalidTokenizer(e.to_string()))?;
    }
    Ok(tok)
}

/// The ids the post-processor puts around a one-token sequence.
fn post_specials(tok: &Tokenizer) -> PostSpecials {
    const SENTINEL: u32 = u32::MAX;
    let enc = Encoding::from_tokens(vec![Token::new(SENTINEL, String::new(), (0, 0))], 0);
    let Ok(out) = tok.post_process(enc, None, true) else {
        return PostSpecials::Unknown;
    };
    let ids = out.get_ids();
    let mut at = ids.iter().enumerate().filter(|(_, id)| **id == SENTINEL);
    match (at.next(), at.next()) {
        (Some((i, _)), None) => PostSpecials::Known {
            prefix: ids[..i].to_vec(),
            suffix: ids[i + 1..].to_vec(),
        },
        _ => PostSpecials::Unknown,
    }
}

/// The chat template of `tokenizer_config.json`: a string, or named templates (`default`).
fn config_template(v: &serde_json::Value) -> Result<Option<String>, TokenizeError> {
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => Ok(Some(s.clone())),
        serde_json::Value::Array(items) => {
            for item in items {
                if item.get("name").and_then(serde_json::Value::as_str) == Some("default")
                    && let Some(t) = item.get("template").and_then(serde_json::Value::as_str)
                {
                    return Ok(Some(t.to_owned()));
                }
            }
            Err(TokenizeError::InvalidConfig(
                "`chat_template` lists named templates but none is named `default`".into(),
            ))
        }
        _ => Err(TokenizeError::InvalidConfig(
            "`chat_template` must be a string or a list of named templates".into(),
        )),
    }
}

impl ChatTokenizer {
    /// Builds from the contents of `tokenizer.json` and, if the model has one,
    /// `tokenizer_config.json` (chat template, special tokens).
    pub fn from_files_content(
        tokenizer_json: &str,
        tokenizer_config_json: Option<&str>,
    ) -> Result<Self, TokenizeError> {
        let config: serde_json::Value = match tokenizer_config_json {
            Some(s) => {
                serde_json::from_str(s).map_err(|e| TokenizeError::InvalidConfig(e.to_string()))?
            }
            None => serde_json::Value::Null,
        };
        if !config.is_null() && !config.is_object() {
            return Err(TokenizeError::InvalidConfig("not a JSON object".into()));
        }

        // Named special tokens: template variables, and added to the vocabulary when missing
        // (transformers 5 `TokenizersBackend._post_init` does the same).
        let mut special_vars = Vec::new();
        let mut named = Vec::new();
        for name in SPECIAL_TOKEN_NAMES {
            if let Some(tok) = config.get(name).and_then(config_token) {
                special_vars.push((name, tok.content.clone()));
                named.push(tok);
            }
        }
        let base = load_tokenizer(tokenizer_json, &[])?;
        let have = base.get_added_vocabulary().get_vocab();
        let missing: Vec<AddedToken> = named
            .into_iter()
            .filter(|t| !have.contains_key(&t.content))
            .collect();
        let tokenizer = if missing.is_empty() {
            base
        } else {
            load_tokenizer(tokenizer_json, &missing)?
        };

        let mut json: serde_json::Value = serde_json::from_str(tokenizer_json)
            .map_err(|e| TokenizeError::InvalidTokenizer(e.to_string()))?;
        let patched = json
            .get_mut("pre_tokenizer")
            .is_some_and(patch_metaspace_first);
        let rest_tokenizer = if patched {
            let patched_json = serde_json::to_string(&json)
                .map_err(|e| TokenizeError::InvalidTokenizer(e.to_string()))?;
            Some(load_tokenizer(&patched_json, &missing)?)
        } else {
            None
        };

        let has_normalized_added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .any(|t| t.normalized);
        let fast = if has_normalized_added {
            None
        } else {
            FastByteLevel::from_json(&json)
        };
        let splitter = Splitter::new(&tokenizer).map_err(TokenizeError::InvalidTokenizer)?;
        let post = post_specials(&tokenizer);
        let template_source = match config.get("chat_template") {
            Some(v) => config_template(v)?,
            None => None,
        };
        let tokenizer_class = config
            .get("tokenizer_class")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let clock: fn() -> i64 = system_clock;
        let template = template_source
            .as_deref()
            .map(|s| ChatTemplate::new(s, clock))
            .transpose()?;
        Ok(Self {
            tokenizer,
            rest_tokenizer,
            fast,
            splitter,
            post,
            template_source,
            template,
            content_format: None,
            special_vars,
            tokenizer_class,
            clock,
            cache: SegmentCache::new(DEFAULT_CACHE_BYTES),
        })
    }

    /// Replaces the chat template (vLLM's `--chat-template`, or a `chat_template.jinja` file).
    pub fn with_chat_template(mut self, source: &str) -> Result<Self, TokenizeError> {
        self.template = Some(ChatTemplate::new(source, self.clock)?);
        self.template_source = Some(source.to_owned());
        Ok(self)
    }

    /// Sets the clock `strftime_now` reads (Unix seconds, formatted as UTC).
    pub fn with_clock(mut self, clock: fn() -> i64) -> Result<Self, TokenizeError> {
        self.clock = clock;
        if let Some(src) = &self.template_source {
            self.template = Some(ChatTemplate::new(src, clock)?);
        }
        Ok(self)
    }

    /// Pins the content format (vLLM's `--chat-template-content-format`); `None`: detect.
    pub fn with_content_format(mut self, format: Option<ContentFormat>) -> Self {
        self.content_format = format;
        self
    }

    /// Sets the segment cache's byte budget (0 disables caching); drops cached entries.
    pub fn with_cache_bytes(mut self, budget_bytes: usize) -> Self {
        self.cache = SegmentCache::new(budget_bytes);
        self
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The content format used for this template (pinned, or detected like vLLM).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
            .or_else(|| self.template.as_ref().map(|t| t.content_format))
            .unwrap_or(ContentFormat::String)
    }

    /// `tokenizer_class` of `tokenizer_config.json`. Only the generic classes
    /// (`PreTrainedTokenizerFast`, `TokenizersBackend`) are known to load `tokenizer.json`
    /// unchanged in transformers 5; others may rebuild the pipeline.
    pub fn tokenizer_class(&self) -> Option<&str> {
        self.tokenizer_class.as_deref()
    }

    /// The value of a named special token (`bos_token`, `eos_token`, ...) from the config.
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special_vars
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The id of a token string, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Whether segments are encoded by the byte-level fast path (`fast.rs`) instead of the
    /// generic HF pipeline; both give the same ids.
    pub fn uses_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Segment cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Empties the segment cache.
    pub fn clear_cache(&self) {
        self.cache.clear();
    }

    /// The prompt text vLLM renders for `messages` (default [`ChatOptions`]).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TokenizeError> {
        self.render_chat_with(messages, &ChatOptions::default())
    }

    /// The prompt text vLLM renders for `messages` with `options`.
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, TokenizeError> {
        let template = self
            .template
            .as_ref()
            .ok_or(TokenizeError::NoChatTemplate)?;
        if messages.is_empty() {
            return Err(TokenizeError::EmptyConversation);
        }
        let conv =
            template::conversation(messages, self.content_format(), template.supports_developer);
        const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];
        let mut ctx: Vec<(String, Value)> = Vec::with_capacity(
            RESERVED.len() + self.special_vars.len() + options.template_kwargs.len(),
        );
        for (name, value) in &self.special_vars {
            if !options.template_kwargs.contains_key(*name) {
                ctx.push(((*name).to_owned(), Value::from(value.as_str())));
            }
        }
        for (k, v) in &options.template_kwargs {
            if !RESERVED.contains(&k.as_str()) {
                ctx.push((k.clone(), Value::from(minijinja::value::Serde(v))));
            }
        }
        ctx.push(("messages".into(), Value::from(conv)));
        ctx.push(("tools".into(), Value::from(())));
        ctx.push(("documents".into(), Value::from(())));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(options.add_generation_prompt),
        ));
        template.render(Value::from_pairs(ctx))
    }

    /// Token ids of a `/v1/chat/completions` request with vLLM's defaults.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokenizeError> {
        self.encode_chat_with(messages, &ChatOptions::default())
    }

    /// Token ids of a `/v1/chat/completions` request with `options`.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<Vec<u32>, TokenizeError> {
        let text = self.render_chat_with(messages, options)?;
        self.encode_text(&text, options.add_special_tokens)
    }

    /// Token ids of a `/v1/completions` prompt (`add_special_tokens=True`, vLLM's default).
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>, TokenizeError> {
        self.encode_text(prompt, true)
    }

    /// `tokenizer(text, add_special_tokens=...)["input_ids"]`, using the segment cache.
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        if !self.splitter.exact {
            return self.encode_text_uncached(text, add_special_tokens);
        }
        let (prefix, suffix): (&[u32], &[u32]) = match (&self.post, add_special_tokens) {
            (_, false) => (&[], &[]),
            (PostSpecials::Known { prefix, suffix }, true) => (prefix, suffix),
            (PostSpecials::Unknown, true) => {
                return self.encode_text_uncached(text, add_special_tokens);
            }
        };
        let mut pieces = Vec::with_capacity(16);
        self.splitter.split(text, &mut pieces);
        let mut ids = Vec::with_capacity(prefix.len() + suffix.len() + text.len() / 3);
        ids.extend_from_slice(prefix);
        for piece in pieces {
            match piece {
                Piece::Added(id) => ids.push(id),
                Piece::Text { text, start } => self.encode_segment(text, start, &mut ids)?,
            }
        }
        ids.extend_from_slice(suffix);
        Ok(ids)
    }

    /// The same as [`Self::encode_text`] without the cache: one HF `encode` of the whole text.
    pub fn encode_text_uncached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Appends the ids of one segment (text without non-normalized added tokens).
    fn encode_segment(
        &self,
        text: &str,
        start: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let variant = u8::from(self.rest_tokenizer.is_some() && start > 0);
        if !self.cache.enabled() {
            return self.encode_piece(text, variant, out);
        }
        let key = Key {
            hash: xxh3_64(text.as_bytes()),
            len: text.len() as u64,
            variant,
        };
        if let Some(ids) = self.cache.get(&key) {
            out.extend_from_slice(&ids);
            return Ok(());
        }
        let from = out.len();
        self.encode_piece(text, variant, out)?;
        self.cache.insert(key, Arc::from(&out[from..]));
        Ok(())
    }

    /// Encodes one segment without the cache (variant 1: the Metaspace `never` tokenizer).
    fn encode_piece(
        &self,
        text: &str,
        variant: u8,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let tok = match &self.rest_tokenizer {
            Some(rest) if variant == 1 => rest,
            _ => &self.tokenizer,
        };
        if let Some(fast) = &self.fast
            && fast
                .encode(tok.get_model(), variant, text, out)
                .map_err(TokenizeError::Encode)?
        {
            return Ok(());
        }
        let enc = tok
            .encode_fast(text, false)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ChatTokenizer>();
    }

    #[test]
    fn metaspace_patch_finds_nested_first() {
        let mut v = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split"}, {"type": "Metaspace", "prepend_scheme": "first"}]});
        assert!(patch_metaspace_first(&mut v));
        assert_eq!(v["pretokenizers"][1]["prepend_scheme"], "never");
        let mut always = serde_json::json!({"type": "Metaspace", "prepend_scheme": "always"});
        assert!(!patch_metaspace_first(&mut always));
    }
}
