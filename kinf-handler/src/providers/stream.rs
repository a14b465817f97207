//! Streaming translation: a provider's stream (SSE or AWS event stream) decoded into canonical
//! events, and canonical events encoded as the client's SSE.

use bytes::{Buf, Bytes, BytesMut};
use kinf_policy::ProviderType;
use kinf_router::usage::TokenUsage;
use serde_json::{Value, json};

use super::translate::{
    Finish, anthropic_usage_json, fresh_id, matched_stop, merge_anthropic_usage, now_epoch,
    openai_usage_json, usage_anthropic, usage_bedrock, usage_openai,
};
use crate::gateway::errors::Api;
use crate::gateway::sse_tap::find_event_end;

/// One canonical stream event.
#[derive(Clone, Debug, PartialEq)]
pub enum Ev {
    /// Generated text.
    Text(String),
    /// Why generation ended.
    Finish(Finish),
    /// The stop sequence that ended it, when the provider names it.
    StopSequence(String),
    /// Token usage (the whole request's).
    Usage(TokenUsage),
    /// The provider ended the stream properly.
    Done,
    /// The provider reported an error in the stream.
    Error(String),
}

/// Splits SSE bytes into `(event name, data)` pairs.
#[derive(Debug, Default)]
struct SseSplitter {
    buf: BytesMut,
}

impl SseSplitter {
    fn feed(&mut self, chunk: &[u8]) -> Vec<(Option<String>, String)> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = find_event_end(&self.buf) {
            let ev = self.buf.split_to(end);
            let mut name = None;
            let mut data = String::new();
            for line in ev[..].split(|b| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let line = String::from_utf8_lossy(line);
                if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                } else if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_string());
                }
            }
            if !data.is_empty() || name.is_some() {
                out.push((name, data));
            }
        }
        out
    }
}

/// Decodes one provider's stream into canonical events.
#[derive(Debug)]
pub struct ProviderDecoder {
    protocol: ProviderType,
    sse: SseSplitter,
    frames: BytesMut,
    eventstream: aws_smithy_eventstream::frame::MessageFrameDecoder,
    anthropic_usage: Value,
}

impl ProviderDecoder {
    /// A decoder for `protocol`'s stream.
    pub fn new(protocol: ProviderType) -> Self {
        ProviderDecoder {
            protocol,
            sse: SseSplitter::default(),
            frames: BytesMut::new(),
            eventstream: aws_smithy_eventstream::frame::MessageFrameDecoder::new(),
            anthropic_usage: json!({}),
        }
    }

    /// Events decoded from `chunk` (and what was buffered before it).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Ev> {
        match self.protocol {
            ProviderType::OpenAI => {
                let mut out = Vec::new();
                for (_, data) in self.sse.feed(chunk) {
                    openai_event(&data, &mut out);
                }
                out
            }
            ProviderType::Anthropic => {
                let mut out = Vec::new();
                for (name, data) in self.sse.feed(chunk) {
                    self.anthropic_event(name.as_deref(), &data, &mut out);
                }
                out
            }
            ProviderType::Bedrock => self.bedrock_feed(chunk),
        }
    }

    fn anthropic_event(&mut self, name: Option<&str>, data: &str, out: &mut Vec<Ev>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = v.get("type").and_then(Value::as_str).or(name).unwrap_or("");
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.anthropic_usage = u.clone();
                }
            }
            "content_block_delta" => {
                if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                    out.push(Ev::Text(t.to_string()));
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_sequence").and_then(Value::as_str) {
                    out.push(Ev::StopSequence(s.to_string()));
                }
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    out.push(Ev::Finish(Finish::from_anthropic(s)));
                }
                if let Some(u) = v.get("usage") {
                    merge_anthropic_usage(&mut self.anthropic_usage, u);
                }
            }
            "message_stop" => {
                // No usage seen (neither `message_start`'s nor `message_delta`'s): none is
                // reported, so that the gateway estimates it instead of charging nothing.
                if self
                    .anthropic_usage
                    .as_object()
                    .is_some_and(|u| !u.is_empty())
                {
                    out.push(Ev::Usage(usage_anthropic(&self.anthropic_usage)));
                }
                out.push(Ev::Done);
            }
            "error" => out.push(Ev::Error(
                super::translate::provider_error_message(&v)
                    .unwrap_or_else(|| "the provider reported an error".into()),
            )),
            _ => {}
        }
    }

    fn bedrock_feed(&mut self, chunk: &[u8]) -> Vec<Ev> {
        use aws_smithy_eventstream::frame::DecodedFrame;
        self.frames.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            match self.eventstream.decode_frame(&mut self.frames) {
                Ok(DecodedFrame::Complete(msg)) => bedrock_message(&msg, &mut out),
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => {
                    out.push(Ev::Error(format!("malformed event stream: {e}")));
                    self.frames.clear();
                    break;
                }
            }
        }
        if self.frames.remaining() == 0 {
            self.frames.clear();
        }
        out
    }
}

fn openai_event(data: &str, out: &mut Vec<Ev>) {
    if data.trim() == "[DONE]" {
        out.push(Ev::Done);
        return;
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return;
    };
    // `"error": null` is no error (some OpenAI-compatible servers send it on every chunk).
    if v.get("error").is_some_and(|e| !e.is_null()) {
        out.push(Ev::Error(
            super::translate::provider_error_message(&v)
                .unwrap_or_else(|| "the provider reported an error".into()),
        ));
        return;
    }
    if let Some(c) = v.pointer("/choices/0") {
        let text = c
            .pointer("/delta/content")
            .or_else(|| c.get("text"))
            .and_then(Value::as_str);
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            out.push(Ev::Text(t.to_string()));
        }
        if let Some((f, matched)) = Finish::from_openai_choice(c) {
            if let Some(s) = matched {
                out.push(Ev::StopSequence(s));
            }
            out.push(Ev::Finish(f));
        }
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        out.push(Ev::Usage(usage_openai(u)));
    }
}

fn header_str<'a>(msg: &'a aws_smithy_types::event_stream::Message, name: &str) -> Option<&'a str> {
    msg.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str())
}

fn bedrock_message(msg: &aws_smithy_types::event_stream::Message, out: &mut Vec<Ev>) {
    let payload: Value = serde_json::from_slice(msg.payload()).unwrap_or(Value::Null);
    match header_str(msg, ":message-type") {
        Some("event") => {}
        _ => {
            let kind = header_str(msg, ":exception-type")
                .or_else(|| header_str(msg, ":error-code"))
                .unwrap_or("error");
            let m = super::translate::provider_error_message(&payload).unwrap_or_default();
            out.push(Ev::Error(format!("{kind}: {m}")));
            return;
        }
    }
    match header_str(msg, ":event-type").unwrap_or("") {
        "contentBlockDelta" => {
            if let Some(t) = payload.pointer("/delta/text").and_then(Value::as_str) {
                out.push(Ev::Text(t.to_string()));
            }
        }
        "messageStop" => {
            if let Some(s) = payload
                .pointer("/additionalModelResponseFields/stop_sequence")
                .and_then(Value::as_str)
            {
                out.push(Ev::StopSequence(s.to_string()));
            }
            if let Some(s) = payload.get("stopReason").and_then(Value::as_str) {
                out.push(Ev::Finish(Finish::from_bedrock(s)));
            }
        }
        "metadata" => {
            if let Some(u) = payload.get("usage") {
                out.push(Ev::Usage(usage_bedrock(u)));
            }
            out.push(Ev::Done);
        }
        _ => {}
    }
}

/// Encodes canonical events as the client's SSE.
#[derive(Debug)]
pub struct ClientEncoder {
    api: Api,
    model: String,
    id: String,
    created: u64,
    started: bool,
    block_open: bool,
    finish: Option<Finish>,
    stop_sequence: Option<String>,
    /// The stop sequences the request sent (to name the one that matched when the provider
    /// does not).
    sent_stops: Vec<String>,
    usage: Option<TokenUsage>,
    /// The gateway's estimate of the prompt's tokens, for `message_start`.
    prompt_estimate: Option<u64>,
    send_usage: bool,
    /// The stream was ended properly.
    pub done: bool,
}

impl ClientEncoder {
    /// An encoder for `api`; `send_usage` sends the OpenAI usage chunk (the client asked for
    /// `stream_options.include_usage`).
    pub fn new(api: Api, model: &str, send_usage: bool) -> Self {
        ClientEncoder {
            api,
            model: model.to_string(),
            id: fresh_id(match api {
                Api::Chat => "chatcmpl-",
                Api::Completions => "cmpl-",
                Api::Messages => "msg_",
            }),
            created: now_epoch(),
            started: false,
            block_open: false,
            finish: None,
            stop_sequence: None,
            sent_stops: Vec::new(),
            usage: None,
            prompt_estimate: None,
            send_usage,
            done: false,
        }
    }

    /// The gateway's estimate of the prompt's tokens: an Anthropic client's `message_start`
    /// reports it as `input_tokens` (Anthropic reports the prompt there, but a translated
    /// stream's counts come only at its end), and `message_delta` then carries the provider's
    /// counts, which replace it in the SDKs' accumulated message. Without it, 0.
    pub fn with_prompt_estimate(mut self, tokens: Option<u64>) -> Self {
        self.prompt_estimate = tokens;
        self
    }

    /// The stop sequences the provider request carried: when the stream ends on a stop
    /// sequence the provider does not name, and it was the only one, an Anthropic client is
    /// told it in `stop_sequence`.
    pub fn with_sent_stops(mut self, stops: Vec<String>) -> Self {
        self.sent_stops = stops;
        self
    }

    /// The usage seen so far.
    pub fn usage(&self) -> Option<TokenUsage> {
        self.usage
    }

    fn data(out: &mut BytesMut, v: &Value) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(v.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    fn event(out: &mut BytesMut, name: &str, v: &Value) {
        out.extend_from_slice(format!("event: {name}\ndata: {v}\n\n").as_bytes());
    }

    fn openai_chunk(&self, choice: Value) -> Value {
        json!({
            "id": self.id,
            "object": if self.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    fn start(&mut self, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        match self.api {
            Api::Chat => {
                let c = self.openai_chunk(
                    json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
                );
                Self::data(out, &c);
            }
            Api::Completions => {}
            Api::Messages => Self::event(
                out,
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": self.prompt_estimate.unwrap_or(0), "output_tokens": 0},
                }}),
            ),
        }
    }

    /// Bytes for `ev`.
    pub fn encode(&mut self, ev: &Ev, out: &mut BytesMut) {
        if self.done {
            return;
        }
        match ev {
            Ev::Text(t) => {
                self.start(out);
                match self.api {
                    Api::Chat => {
                        let c = self.openai_chunk(
                            json!({"index": 0, "delta": {"content": t}, "finish_reason": null}),
                        );
                        Self::data(out, &c);
                    }
                    Api::Completions => {
                        let c = self.openai_chunk(
                            json!({"index": 0, "text": t, "finish_reason": null, "logprobs": null}),
                        );
                        Self::data(out, &c);
                    }
                    Api::Messages => {
                        if !self.block_open {
                            self.block_open = true;
                            Self::event(
                                out,
                                "content_block_start",
                                &json!({"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}),
                            );
                        }
                        Self::event(
                            out,
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": 0,
                                "delta": {"type": "text_delta", "text": t}}),
                        );
                    }
                }
            }
            Ev::Finish(f) => self.finish = Some(f.clone()),
            Ev::StopSequence(s) => self.stop_sequence = Some(s.clone()),
            Ev::Usage(u) => self.usage = Some(*u),
            Ev::Done => self.end(out),
            Ev::Error(_) => {}
        }
    }

    /// Ends the stream properly: the finish reason, usage and terminator.
    fn end(&mut self, out: &mut BytesMut) {
        self.start(out);
        let finish = self.finish.clone().unwrap_or(Finish::EndTurn);
        let usage = self.usage.unwrap_or_default();
        match self.api {
            Api::Chat | Api::Completions => {
                let choice = if self.api == Api::Chat {
                    json!({"index": 0, "delta": {}, "finish_reason": finish.openai()})
                } else {
                    json!({"index": 0, "text": "", "finish_reason": finish.openai(), "logprobs": null})
                };
                let c = self.openai_chunk(choice);
                Self::data(out, &c);
                if self.send_usage {
                    let mut c = self.openai_chunk(Value::Null);
                    c["choices"] = json!([]);
                    c["usage"] = openai_usage_json(&usage);
                    Self::data(out, &c);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Api::Messages => {
                if self.block_open {
                    Self::event(
                        out,
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": 0}),
                    );
                }
                let stop_sequence =
                    matched_stop(&finish, self.stop_sequence.take(), &self.sent_stops);
                // The provider's counts, cumulative as Anthropic's `message_delta` usage is:
                // recent SDKs replace `message_start`'s counts with each one present. Without
                // them, only the output count Anthropic requires (0), so that the estimate in
                // `message_start` stands.
                let usage = match self.usage {
                    Some(u) => anthropic_usage_json(&u),
                    None => json!({"output_tokens": 0}),
                };
                Self::event(
                    out,
                    "message_delta",
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": finish.anthropic(), "stop_sequence": stop_sequence},
                        "usage": usage}),
                );
                Self::event(out, "message_stop", &json!({"type": "message_stop"}));
            }
        }
        self.done = true;
    }
}

/// Bytes of a chunk, for tests.
pub fn collect(chunks: &[Bytes]) -> String {
    chunks
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evs of a whole SSE body.
    fn decode(protocol: ProviderType, src: &str) -> Vec<Ev> {
        let mut d = ProviderDecoder::new(protocol);
        d.feed(src.as_bytes())
    }

    /// One AWS event-stream frame of `event_type`.
    fn frame(event_type: &str, payload: &Value) -> Vec<u8> {
        use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
        let msg = Message::new(Bytes::from(payload.to_string()))
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("event".into()),
            ))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String(event_type.to_string().into()),
            ));
        let mut buf = Vec::new();
        let _ = aws_smithy_eventstream::frame::write_message_to(&msg, &mut buf);
        buf
    }

    /// The `message_delta` an Anthropic client gets for `src`.
    fn anthropic_message_delta(protocol: ProviderType, src: &[u8], sent: &[&str]) -> Value {
        let mut d = ProviderDecoder::new(protocol);
        let mut enc = ClientEncoder::new(Api::Messages, "m", false)
            .with_sent_stops(sent.iter().map(|s| s.to_string()).collect());
        let mut out = BytesMut::new();
        for e in d.feed(src) {
            enc.encode(&e, &mut out);
        }
        assert!(enc.done, "{}", String::from_utf8_lossy(&out));
        String::from_utf8_lossy(&out)
            .split("\n\n")
            .filter_map(|ev| ev.strip_prefix("event: message_delta\ndata: "))
            .find_map(|d| serde_json::from_str(d).ok())
            .unwrap_or(Value::Null)
    }

    /// The `(event, data)` pairs an Anthropic client gets for a `protocol` stream `src`, with
    /// the gateway's prompt estimate `estimate`.
    fn anthropic_client_events(
        protocol: ProviderType,
        src: &[u8],
        estimate: Option<u64>,
    ) -> Vec<(String, Value)> {
        let mut d = ProviderDecoder::new(protocol);
        let mut enc = ClientEncoder::new(Api::Messages, "m", false).with_prompt_estimate(estimate);
        let mut out = BytesMut::new();
        for e in d.feed(src) {
            enc.encode(&e, &mut out);
        }
        assert!(enc.done, "{}", String::from_utf8_lossy(&out));
        String::from_utf8_lossy(&out)
            .split("\n\n")
            .filter_map(|ev| {
                let (name, data) = ev.strip_prefix("event: ")?.split_once("\ndata: ")?;
                Some((name.to_string(), serde_json::from_str(data).ok()?))
            })
            .collect()
    }

    /// The usage an Anthropic SDK ends with (`anthropic` 0.125's `accumulate_event`):
    /// `message_start`'s, then each count a `message_delta` carries (cumulative) replaces it.
    fn sdk_final_usage(events: &[(String, Value)]) -> Value {
        let mut usage = json!({});
        for (name, v) in events {
            match name.as_str() {
                "message_start" => usage = v["message"]["usage"].clone(),
                "message_delta" => merge_anthropic_usage(&mut usage, &v["usage"]),
                _ => {}
            }
        }
        usage
    }

    /// A translated stream's prompt counts come only at its end (OpenAI's usage chunk,
    /// Bedrock's `metadata`): an Anthropic client's `message_start` has the gateway's estimate
    /// of the prompt, and `message_delta` the provider's counts, which an SDK's final message
    /// takes. Before, `message_start` said 0 input tokens; a stream without usage now keeps
    /// the estimate instead of a `message_delta` that reset it to 0.
    #[test]
    fn anthropic_clients_get_an_estimate_first_and_the_providers_counts_last() {
        let openai = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,",
            "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut bedrock = frame(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": "a"}}),
        );
        bedrock.extend(frame("messageStop", &json!({"stopReason": "end_turn"})));
        bedrock.extend(frame(
            "metadata",
            &json!({"usage": {"inputTokens": 8, "outputTokens": 2, "cacheReadInputTokens": 4}}),
        ));
        for (protocol, src) in [
            (ProviderType::OpenAI, openai.as_bytes()),
            (ProviderType::Bedrock, &bedrock[..]),
        ] {
            let evs = anthropic_client_events(protocol, src, Some(11));
            let start = &evs[0];
            assert_eq!(start.0, "message_start", "{evs:?}");
            assert_eq!(
                start.1["message"]["usage"]["input_tokens"], 11,
                "{protocol:?}"
            );
            let delta = evs.iter().find(|(n, _)| n == "message_delta");
            assert_eq!(
                delta.map(|(_, v)| &v["usage"]),
                Some(&json!({"input_tokens": 8, "cache_read_input_tokens": 4,
                    "cache_creation_input_tokens": 0, "output_tokens": 2})),
                "{protocol:?}"
            );
            let u = sdk_final_usage(&evs);
            assert_eq!(
                (
                    &u["input_tokens"],
                    &u["cache_read_input_tokens"],
                    &u["output_tokens"]
                ),
                (&json!(8), &json!(4), &json!(2)),
                "{protocol:?}: {u}"
            );
        }
        // No usage from the provider (an OpenAI-compatible server that ignores
        // `stream_options`): the estimate stands.
        let bare = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let evs = anthropic_client_events(ProviderType::OpenAI, bare.as_bytes(), Some(11));
        let u = sdk_final_usage(&evs);
        assert_eq!(
            (&u["input_tokens"], &u["output_tokens"]),
            (&json!(11), &json!(0)),
            "{evs:?}"
        );
        // No estimate either: 0, as before.
        let evs = anthropic_client_events(ProviderType::OpenAI, bare.as_bytes(), None);
        assert_eq!(sdk_final_usage(&evs)["input_tokens"], 0, "{evs:?}");
    }

    /// A stream that ended on a stop sequence names it to an Anthropic client
    /// (`message_delta.delta.stop_sequence`): the one the provider named, else the only one
    /// the request sent.
    #[test]
    fn a_streamed_stop_sequence_is_named_to_anthropic_clients() {
        let vllm = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":\"###\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let d = anthropic_message_delta(ProviderType::OpenAI, vllm.as_bytes(), &["###", "END"]);
        assert_eq!(d["delta"]["stop_reason"], "stop_sequence", "{d}");
        assert_eq!(d["delta"]["stop_sequence"], "###", "{d}");

        let bedrock = |stop: Value| {
            let mut b = frame(
                "contentBlockDelta",
                &json!({"contentBlockIndex": 0, "delta": {"text": "a"}}),
            );
            b.extend(frame("messageStop", &stop));
            b.extend(frame(
                "metadata",
                &json!({"usage": {"inputTokens": 3, "outputTokens": 1}}),
            ));
            b
        };
        let plain = bedrock(json!({"stopReason": "stop_sequence"}));
        let d = anthropic_message_delta(ProviderType::Bedrock, &plain, &["END"]);
        assert_eq!(d["delta"]["stop_reason"], "stop_sequence", "{d}");
        assert_eq!(d["delta"]["stop_sequence"], "END", "{d}");
        let d = anthropic_message_delta(ProviderType::Bedrock, &plain, &["END", "STOP"]);
        assert_eq!(d["delta"]["stop_sequence"], Value::Null, "ambiguous: {d}");
        let named = bedrock(json!({"stopReason": "stop_sequence",
            "additionalModelResponseFields": {"stop_sequence": "STOP"}}));
        let d = anthropic_message_delta(ProviderType::Bedrock, &named, &["END", "STOP"]);
        assert_eq!(d["delta"]["stop_sequence"], "STOP", "{d}");
        let ended = bedrock(json!({"stopReason": "end_turn"}));
        let d = anthropic_message_delta(ProviderType::Bedrock, &ended, &["END"]);
        assert_eq!(
            (&d["delta"]["stop_reason"], &d["delta"]["stop_sequence"]),
            (&json!("end_turn"), &Value::Null),
            "{d}"
        );
    }

    #[test]
    fn a_null_error_member_is_no_error() {
        let evs = decode(
            ProviderType::OpenAI,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"error\":null}\n\n",
        );
        assert!(
            evs.iter().any(|e| matches!(e, Ev::Text(t) if t == "hi")),
            "{evs:?}"
        );
        assert!(!evs.iter().any(|e| matches!(e, Ev::Error(_))), "{evs:?}");
        let evs = decode(
            ProviderType::OpenAI,
            "data: {\"error\":{\"message\":\"overloaded\"}}\n\n",
        );
        assert!(evs.iter().any(|e| matches!(e, Ev::Error(_))), "{evs:?}");
    }

    #[test]
    fn an_anthropic_stream_without_usage_reports_none() {
        let evs = decode(
            ProviderType::Anthropic,
            concat!(
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
        );
        assert!(evs.iter().any(|e| matches!(e, Ev::Done)), "{evs:?}");
        assert!(!evs.iter().any(|e| matches!(e, Ev::Usage(_))), "{evs:?}");
    }

    #[test]
    fn anthropic_sse_to_openai_chunks() {
        let mut d = ProviderDecoder::new(ProviderType::Anthropic);
        let src = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let mut evs = Vec::new();
        for b in src.as_bytes().chunks(7) {
            evs.extend(d.feed(b));
        }
        let text: String = evs
            .iter()
            .filter_map(|e| match e {
                Ev::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Hello");
        let mut enc = ClientEncoder::new(Api::Chat, "m", false);
        let mut out = BytesMut::new();
        for e in &evs {
            enc.encode(e, &mut out);
        }
        let s = String::from_utf8_lossy(&out);
        assert!(s.contains("\"finish_reason\":\"length\""));
        assert!(s.ends_with("data: [DONE]\n\n"));
        assert!(!s.contains("\"usage\""));
        assert_eq!(
            enc.usage(),
            Some(TokenUsage {
                cached_prompt_tokens: 2,
                uncached_prompt_tokens: 5,
                cache_write_prompt_tokens: 0,
                output_tokens: 9
            })
        );
    }
}
