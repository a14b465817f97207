//! Watches a response as it passes through: splits SSE into events, removes the usage chunk
//! the gateway asked for on the client's behalf, and notes the first-token time, inter-token
//! gaps and usage. Complete events are passed on as soon as they arrive; only a trailing
//! partial event waits for the rest of its bytes.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kinf_router::usage::TokenUsage;
use serde_json::Value;

use super::errors::Api;
use crate::providers::translate::{merge_anthropic_usage, usage_anthropic, usage_openai};

/// When the tokens of one response arrived. A response with `n > 1` interleaves the chunks of
/// its `n` sequences (choices); inter-token gaps are measured within each sequence, so that
/// the mean gap is a sequence's, not `1/n` of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenTimes {
    /// When the first token (of any sequence) arrived.
    pub first_token_at: Option<Instant>,
    /// When the last token (of any sequence) arrived.
    pub last_token_at: Option<Instant>,
    /// Token-carrying events seen, all sequences together.
    pub token_events: u64,
    /// Sum of the gaps between consecutive tokens of the same sequence (seconds).
    pub gaps_sum_s: f64,
    /// Per sequence seen (choice index): when its last token arrived, and its tokens.
    last_per_sequence: Vec<(u64, Instant, u64)>,
}

impl TokenTimes {
    /// A token of sequence `choice` (0 for APIs with one sequence) arrived at `now`.
    pub fn token(&mut self, choice: u64, now: Instant) {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(now);
        }
        self.last_token_at = Some(now);
        self.token_events += 1;
        match self
            .last_per_sequence
            .iter_mut()
            .find(|(c, _, _)| *c == choice)
        {
            Some((_, last, n)) => {
                self.gaps_sum_s += now.duration_since(*last).as_secs_f64();
                *last = now;
                *n += 1;
            }
            None => self.last_per_sequence.push((choice, now, 1)),
        }
    }

    /// Sequences that produced a token.
    pub fn sequences(&self) -> u64 {
        self.last_per_sequence.len() as u64
    }

    /// The longest sequence's share of the tokens: 1 with one sequence (or none), 1/n with `n`
    /// of equal length. The decode time after the first token is the longest one's.
    pub fn longest_share(&self) -> f64 {
        let longest = self
            .last_per_sequence
            .iter()
            .map(|s| s.2)
            .max()
            .unwrap_or(0);
        if self.token_events == 0 {
            1.0
        } else {
            longest as f64 / self.token_events as f64
        }
    }

    /// Mean gap between consecutive tokens of a sequence (`None` without any gap).
    pub fn mean_itl_s(&self) -> Option<f64> {
        let gaps = self.token_events.saturating_sub(self.sequences());
        (gaps > 0).then(|| self.gaps_sum_s / gaps as f64)
    }
}

/// What was observed on one response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Token arrival times.
    pub tokens: TokenTimes,
    /// Usage reported by the upstream.
    pub usage: Option<TokenUsage>,
    /// The upstream ended the stream properly (`[DONE]` / `message_stop`).
    pub completed: bool,
    /// The upstream sent an error event (Anthropic `error`, an OpenAI chunk with `error`): the
    /// client has been told, so a stream that then ends early needs no second error.
    pub errored: bool,
}

impl Observed {
    /// What to append for the client when the upstream ended the stream early: `error`
    /// unless the upstream already sent one; after it, only OpenAI's `[DONE]` terminator.
    pub fn early_end(&self, api: Api, error: &super::errors::ApiError) -> String {
        match (self.errored, api) {
            (false, _) => error.sse_event(api),
            (true, Api::Messages) => String::new(),
            (true, Api::Chat | Api::Completions) => "data: [DONE]\n\n".into(),
        }
    }
}

/// The streaming tap.
#[derive(Debug)]
pub struct SseTap {
    api: Api,
    strip_usage_chunk: bool,
    pending: BytesMut,
    /// What was seen so far.
    pub observed: Observed,
    /// The Anthropic `usage` seen so far: `message_start`'s, with `message_delta`'s counts
    /// folded in ([`merge_anthropic_usage`]).
    anthropic_usage: Value,
}

impl SseTap {
    /// A tap for `api`; `strip_usage_chunk` removes the final usage-only chunk (OpenAI APIs).
    pub fn new(api: Api, strip_usage_chunk: bool) -> Self {
        SseTap {
            api,
            strip_usage_chunk,
            pending: BytesMut::new(),
            observed: Observed::default(),
            anthropic_usage: Value::Object(serde_json::Map::new()),
        }
    }

    /// Feeds bytes from upstream; returns the bytes to send to the client now.
    pub fn feed(&mut self, chunk: &[u8], now: Instant) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = find_event_end(&self.pending) {
            let event = self.pending.split_to(end);
            match self.keep(&event, now) {
                Kept::As => out.extend_from_slice(&event),
                Kept::Dropped => {}
                Kept::Replaced(e) => out.extend_from_slice(e.as_bytes()),
            }
        }
        out.freeze()
    }

    /// Whatever is left when the upstream ends (a partial event is passed on as is).
    pub fn finish(&mut self) -> Bytes {
        std::mem::take(&mut self.pending).freeze()
    }

    /// Drops the partial event left when the upstream failed, so that the error event that
    /// follows starts on a line of its own. An SSE client drops an event the stream ends
    /// inside of, so the client loses nothing it would have read.
    pub fn discard_partial(&mut self) {
        self.pending.clear();
    }

    /// Inspects one complete event (terminator included): what to send on in its place.
    fn keep(&mut self, event: &[u8], now: Instant) -> Kept {
        let mut event_name: Option<&[u8]> = None;
        let mut data: Option<&[u8]> = None;
        for line in event.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(v) = line.strip_prefix(b"data:") {
                data = Some(v.strip_prefix(b" ").unwrap_or(v));
            } else if let Some(v) = line.strip_prefix(b"event:") {
                event_name = Some(v.strip_prefix(b" ").unwrap_or(v));
            }
        }
        let Some(data) = data else {
            return Kept::As;
        };
        if data == b"[DONE]" {
            self.observed.completed = true;
            return Kept::As;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return Kept::As;
        };
        match self.api {
            Api::Chat | Api::Completions => {
                if self.openai_chunk(&v, now) {
                    Kept::As
                } else {
                    Kept::Dropped
                }
            }
            Api::Messages => self
                .anthropic_event(event_name, &v, now)
                .map_or(Kept::As, Kept::Replaced),
        }
    }

    fn openai_chunk(&mut self, v: &Value, now: Instant) -> bool {
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.observed.errored = true;
        }
        let choices = v.get("choices").and_then(Value::as_array);
        let choices_empty = choices.is_none_or(|c| c.is_empty());
        for c in choices.into_iter().flatten().filter(|c| carries_output(c)) {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            self.observed.tokens.token(index, now);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.observed.usage = Some(usage_openai(u));
            if choices_empty && self.strip_usage_chunk {
                return false;
            }
        }
        true
    }

    /// Notes what an Anthropic event says; returns the event to send instead, for an `error`
    /// event whose type is not one of Anthropic's
    /// ([`super::errors::anthropic_stream_error`]).
    fn anthropic_event(&mut self, name: Option<&[u8]>, v: &Value, now: Instant) -> Option<String> {
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .map(str::as_bytes)
            .or(name);
        match kind {
            Some(b"message_start") => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.anthropic_usage = u.clone();
                }
            }
            Some(b"content_block_delta") => self.observed.tokens.token(0, now),
            Some(b"message_delta") => {
                if let Some(u) = v.get("usage") {
                    merge_anthropic_usage(&mut self.anthropic_usage, u);
                    self.observed.usage = Some(usage_anthropic(&self.anthropic_usage));
                }
            }
            Some(b"message_stop") => self.observed.completed = true,
            Some(b"error") => {
                self.observed.errored = true;
                return super::errors::anthropic_stream_error(v)
                    .map(|e| e.sse_event(Api::Messages));
            }
            _ => {}
        }
        None
    }
}

/// What [`SseTap`] sends on in place of one event.
enum Kept {
    /// The event as it came.
    As,
    /// Nothing (the usage chunk the gateway asked for).
    Dropped,
    /// Another event (an error event in Anthropic's shape).
    Replaced(String),
}

/// Whether a streamed OpenAI choice carries a generated token. Only a chat stream's opening
/// delta does not: vLLM and OpenAI announce each choice's `role` with empty `content` in the same
/// engine step as, and just before, its first token, and counting it would shorten every
/// inter-token gap. A completion chunk with `text: ""` is a token (bytes the detokenizer holds
/// back, as vLLM's `completion_tokens` counts them).
fn carries_output(choice: &Value) -> bool {
    let Some(delta) = choice.get("delta") else {
        return true; // completions: one chunk per token
    };
    if delta.get("role").is_none() {
        return true;
    }
    let non_empty = |k: &str| {
        delta.get(k).is_some_and(|x| {
            !x.is_null() && x.as_str() != Some("") && x.as_array().is_none_or(|a| !a.is_empty())
        })
    };
    non_empty("content")
        || non_empty("reasoning_content")
        || non_empty("reasoning")
        || non_empty("tool_calls")
        || non_empty("refusal")
}

/// Usage of a complete (non-streaming) response body. Only `usage` is materialised; the rest
/// (choices, content) is skipped without building a tree. A `null` usage counts as none, as
/// in streams.
pub fn body_usage(api: Api, body: &[u8]) -> Option<TokenUsage> {
    /// The top level of a response, `usage` only.
    #[derive(serde::Deserialize)]
    struct Top {
        usage: Option<Value>,
    }
    let u = serde_json::from_slice::<Top>(body).ok()?.usage?;
    Some(match api {
        Api::Chat | Api::Completions => usage_openai(&u),
        Api::Messages => usage_anthropic(&u),
    })
}

/// End (exclusive) of the first complete SSE event: after a blank line (`\n\n` or
/// `\r\n\r\n`).
pub(crate) fn find_event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Usage with `uncached` prompt tokens, `cache_read` cached ones and `output` tokens.
    fn anthropic_usage(uncached: u64, cache_read: u64, output: u64) -> TokenUsage {
        TokenUsage {
            cached_prompt_tokens: cache_read,
            uncached_prompt_tokens: uncached,
            cache_write_prompt_tokens: 0,
            output_tokens: output,
        }
    }

    const CHAT: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/chat_stream.txt");
    const MESSAGES: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/messages_stream.txt");

    #[test]
    fn strips_the_injected_usage_chunk_and_keeps_the_rest_byte_for_byte() {
        let mut tap = SseTap::new(Api::Chat, true);
        let now = Instant::now();
        // Feed in awkward pieces: events must still come out whole.
        let mut out = Vec::new();
        for piece in CHAT.as_bytes().chunks(7) {
            out.extend_from_slice(&tap.feed(piece, now));
        }
        out.extend_from_slice(&tap.finish());
        let out = String::from_utf8(out).unwrap_or_default();
        assert!(
            !out.contains("\"usage\":{"),
            "usage chunk not stripped: {out}"
        );
        assert!(out.ends_with("data: [DONE]\n\n"));
        let usage = tap.observed.usage.unwrap_or_default();
        assert!(usage.prompt_tokens() > 0 && usage.output_tokens > 0);
        assert!(tap.observed.tokens.first_token_at.is_some());
        assert!(tap.observed.completed);
        // Without stripping, the stream passes through unchanged.
        let mut tap = SseTap::new(Api::Chat, false);
        let mut out = tap.feed(CHAT.as_bytes(), now).to_vec();
        out.extend_from_slice(&tap.finish());
        assert_eq!(out, CHAT.as_bytes());
    }

    #[test]
    fn token_events_are_the_generated_tokens_not_the_role_announcement() {
        // vLLM's chat stream: a role-only opening delta, then one chunk per token (8, as its
        // usage says); its completions stream: one chunk per token, some with empty text.
        const COMPLETIONS: &str =
            include_str!("../../../testdata/vllm-0.32.0-cpu/completion_stream.txt");
        for (api, stream, tokens) in [(Api::Chat, CHAT, 8), (Api::Completions, COMPLETIONS, 3)] {
            let mut tap = SseTap::new(api, false);
            let t0 = Instant::now();
            // One event per millisecond, so that the gaps say which events counted.
            for (i, event) in stream.split_inclusive("\n\n").enumerate() {
                let _ = tap.feed(
                    event.as_bytes(),
                    t0 + std::time::Duration::from_millis(i as u64),
                );
            }
            let o = &tap.observed;
            assert_eq!(o.tokens.token_events, tokens, "{api:?}");
            assert_eq!(o.usage.map(|u| u.output_tokens), Some(tokens), "{api:?}");
            // The first token is the first chunk with content; the gaps are between tokens.
            let first = if api == Api::Chat { 1 } else { 0 };
            assert_eq!(
                o.tokens.first_token_at,
                Some(t0 + std::time::Duration::from_millis(first))
            );
            assert!(
                (o.tokens.gaps_sum_s - (tokens - 1) as f64 * 0.001).abs() < 1e-9,
                "{o:?}"
            );
        }
        // A role announced together with content, or a tool call, is a token.
        let mut tap = SseTap::new(Api::Chat, false);
        let _ = tap.feed(
            concat!(
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0}]}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            )
            .as_bytes(),
            Instant::now(),
        );
        assert_eq!(tap.observed.tokens.token_events, 2);
    }

    #[test]
    fn gaps_of_parallel_sequences_are_measured_within_each_sequence() {
        // `n: 2`: the chunks of choices 0 and 1 interleave, 10 ms apart, while each choice
        // gets a token every 20 ms. The gap is each sequence's, 20 ms, not 10.
        let mut tap = SseTap::new(Api::Chat, false);
        let t0 = Instant::now();
        let ms = |k: u64| t0 + std::time::Duration::from_millis(k);
        let _ = tap.feed(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            ms(0),
        );
        for k in 0..8u64 {
            let chunk = format!(
                "data: {{\"choices\":[{{\"index\":{},\"delta\":{{\"content\":\"t\"}}}}]}}\n\n",
                k % 2
            );
            let _ = tap.feed(chunk.as_bytes(), ms(10 * (k + 1)));
        }
        let t = &tap.observed.tokens;
        assert_eq!((t.token_events, t.sequences()), (8, 2));
        assert_eq!(t.longest_share(), 0.5);
        assert_eq!(t.first_token_at, Some(ms(10)));
        assert_eq!(t.last_token_at, Some(ms(80)));
        let itl = t.mean_itl_s().unwrap();
        assert!((itl - 0.020).abs() < 1e-9, "{itl}");
        // vLLM's own `n: 2` stream (5 tokens per choice, chunks alternating), one event per
        // millisecond: each choice gets a token every 2 ms.
        const N2: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/chat_stream_n2.txt");
        let mut real = SseTap::new(Api::Chat, false);
        for (i, event) in N2.split_inclusive("\n\n").enumerate() {
            let _ = real.feed(event.as_bytes(), ms(i as u64));
        }
        let r = &real.observed;
        assert_eq!((r.tokens.token_events, r.tokens.sequences()), (10, 2));
        assert_eq!(r.usage.map(|u| u.output_tokens), Some(10));
        assert_eq!(
            r.tokens.first_token_at,
            Some(ms(2)),
            "after both role deltas"
        );
        let itl = r.tokens.mean_itl_s().unwrap();
        assert!((itl - 0.002).abs() < 1e-9, "{itl}");
        // One sequence: the plain mean gap; one token: none.
        let mut one = TokenTimes::default();
        one.token(0, ms(0));
        assert_eq!(one.mean_itl_s(), None);
        one.token(0, ms(30));
        one.token(0, ms(40));
        assert!((one.mean_itl_s().unwrap() - 0.020).abs() < 1e-9);
    }

    #[test]
    fn anthropic_usage_comes_from_start_and_delta() {
        let mut tap = SseTap::new(Api::Messages, false);
        let out = tap.feed(MESSAGES.as_bytes(), Instant::now());
        let mut all = out.to_vec();
        all.extend_from_slice(&tap.finish());
        assert_eq!(all, MESSAGES.as_bytes());
        let u = tap.observed.usage.unwrap_or_default();
        assert!(u.output_tokens > 0, "{u:?}");
        assert!(tap.observed.completed);
        assert!(tap.observed.tokens.token_events > 0);
    }

    #[test]
    fn anthropic_stream_usage_counts_cache_reads_and_writes_whichever_event_reports_them() {
        let usage_of = |stream: &str| {
            let mut tap = SseTap::new(Api::Messages, false);
            let _ = tap.feed(stream.as_bytes(), Instant::now());
            let _ = tap.finish();
            tap.observed.usage
        };
        // vLLM reports its cache reads only in the final `message_delta`.
        let vllm = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":14,\"output_tokens\":0}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":14,\"output_tokens\":20,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":32}}\n\n",
        );
        assert_eq!(usage_of(vllm), Some(anthropic_usage(14, 32, 20)));
        // Anthropic's API reports them in `message_start`; cache writes were computed.
        let anthropic = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\n\n",
        );
        let u = usage_of(anthropic).unwrap_or_default();
        assert_eq!(
            (
                u.uncached_prompt_tokens,
                u.cached_prompt_tokens,
                u.output_tokens
            ),
            (15, 3, 2)
        );
        let body = br#"{"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":3,"output_tokens":2}}"#;
        // The cache writes are uncached tokens, also counted as writes.
        assert_eq!(
            body_usage(Api::Messages, body),
            Some(TokenUsage {
                cache_write_prompt_tokens: 5,
                ..anthropic_usage(15, 3, 2)
            })
        );
        assert_eq!(u.cache_write_prompt_tokens, 5);
    }

    #[test]
    fn a_stream_the_upstream_ended_with_its_own_error_gets_no_second_one() {
        let err = crate::gateway::errors::ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "upstream_incomplete",
            "the upstream ended the stream before it was complete",
        );
        let observe = |api: Api, stream: &str| {
            let mut tap = SseTap::new(api, false);
            let _ = tap.feed(stream.as_bytes(), Instant::now());
            let _ = tap.finish();
            tap.observed
        };
        // Anthropic: the provider's `error` event is terminal; nothing is added.
        let o = observe(
            Api::Messages,
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        );
        assert!(o.errored && !o.completed);
        assert_eq!(o.early_end(Api::Messages, &err), "");
        // OpenAI: an error chunk, then only the terminator.
        let o = observe(Api::Chat, "data: {\"error\":{\"message\":\"boom\"}}\n\n");
        assert!(o.errored);
        assert_eq!(o.early_end(Api::Chat, &err), "data: [DONE]\n\n");
        // Cut short without an error of its own: the gateway's error event.
        let o = observe(
            Api::Chat,
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        );
        assert!(!o.errored);
        assert!(o.early_end(Api::Chat, &err).contains("upstream_incomplete"));
    }

    #[test]
    fn vllms_stream_errors_reach_anthropic_clients_with_anthropics_types() {
        // vLLM 0.32's `/v1/messages` stream converter on a failure (serving.py).
        let vllm = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"Invalid data format received\"}}\n\n";
        let mut tap = SseTap::new(Api::Messages, false);
        let out = tap.feed(vllm.as_bytes(), Instant::now());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "event: error\ndata: {\"error\":{\"message\":\"Invalid data format received\",\"type\":\"api_error\"},\"type\":\"error\"}\n\n"
        );
        assert!(tap.observed.errored);
        // Anthropic's own types pass as they are.
        let anthropic = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let mut tap = SseTap::new(Api::Messages, false);
        assert_eq!(
            tap.feed(anthropic.as_bytes(), Instant::now()),
            anthropic.as_bytes()
        );
    }

    #[test]
    fn body_usage_reads_real_responses_and_treats_null_as_none() {
        let chat = include_bytes!("../../../testdata/vllm-0.32.0-cpu/chat1.json");
        assert_eq!(
            body_usage(Api::Chat, chat),
            Some(TokenUsage::from_openai(86, 0, 16))
        );
        let msgs = include_bytes!("../../../testdata/vllm-0.32.0-cpu/messages_nonstream.json");
        assert_eq!(
            body_usage(Api::Messages, msgs),
            Some(anthropic_usage(13, 0, 3))
        );
        let cached = br#"{"choices":[{"message":{"content":"x"}}],
            "usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens":2}}"#;
        assert_eq!(
            body_usage(Api::Chat, cached),
            Some(TokenUsage::from_openai(10, 4, 2))
        );
        assert_eq!(body_usage(Api::Chat, br#"{"usage":null}"#), None);
        assert_eq!(body_usage(Api::Chat, br#"{"choices":[]}"#), None);
        assert_eq!(body_usage(Api::Chat, b"not json"), None);
    }
}
