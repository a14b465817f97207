//! `kinf-sim serve` against real vLLM 0.32 answers to the same requests
//! (`tests/data/vllm_0.32_serve_captures.json`, recorded with `tests/data/capture_vllm.py` from
//! a server with the repository's tiny-llama tokenizer, block size 32, `max_model_len` 2048 and
//! `--enable-prompt-tokens-details`). The simulator runs with the same tokenizer and sizes, so
//! prompt lengths, cache hits and the usage objects must be equal, and every JSON body must have
//! the same skeleton (keys in the same order, the same value kinds, `null` where vLLM has it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod serve_common;

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};
use serve_common::*;

/// The skeleton of a JSON text: keys in document order, values replaced by their kind.
struct Skel(String);

impl<'de> Deserialize<'de> for Skel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkelVisitor)
    }
}

struct SkelVisitor;

impl<'de> Visitor<'de> for SkelVisitor {
    type Value = Skel;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skel, E> {
        Ok(Skel("bool".into()))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skel, E> {
        Ok(Skel("num".into()))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skel, E> {
        Ok(Skel("num".into()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skel, E> {
        Ok(Skel("num".into()))
    }
    fn visit_str<E>(self, _: &str) -> Result<Skel, E> {
        Ok(Skel("str".into()))
    }
    fn visit_unit<E>(self) -> Result<Skel, E> {
        Ok(Skel("null".into()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skel, A::Error> {
        let mut items = Vec::new();
        while let Some(Skel(s)) = seq.next_element()? {
            items.push(s);
        }
        Ok(Skel(format!("[{}]", items.join(","))))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skel, A::Error> {
        let mut items = Vec::new();
        while let Some((k, Skel(v))) = map.next_entry::<String, Skel>()? {
            items.push(format!("{k}:{v}"));
        }
        Ok(Skel(format!("{{{}}}", items.join(","))))
    }
}

fn skel(text: &str) -> String {
    serde_json::from_str::<Skel>(text)
        .unwrap_or_else(|e| panic!("{e}: {text}"))
        .0
}

fn captures() -> BTreeMap<String, Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/vllm_0.32_serve_captures.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `(status, body)` of capture `name`.
fn cap(caps: &BTreeMap<String, Value>, name: &str) -> (u16, String) {
    let c = &caps[name];
    (
        c["status"].as_u64().unwrap() as u16,
        c["body"].as_str().unwrap().to_owned(),
    )
}

/// The prompt the capture script used for its long requests (347 chat / 332 completion tokens).
fn long() -> String {
    (0..60)
        .map(|i| format!("word{} and more", i % 50))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A simulator sized like the vLLM server of the captures.
async fn sim() -> kinf_sim::serve::Server {
    let tok = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/tokenizers/tiny-llama"
    );
    start(&[
        "--tokenizer",
        tok,
        "--block-size",
        "32",
        "--num-gpu-blocks",
        "512",
        "--max-model-len",
        "2048",
    ])
    .await
}

async fn post(server: &kinf_sim::serve::Server, path: &str, body: &Value) -> Resp {
    http(server, "POST", path, Some(&body.to_string())).await
}

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": "tiny-llama", "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn completion(prompt: &str, extra: Value) -> Value {
    let mut b = json!({"model": "tiny-llama", "prompt": prompt});
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn usage_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap()["usage"].clone()
}

/// Non-`[DONE]` `data:` payloads of an SSE body.
fn chunks(body: &str) -> Vec<String> {
    let d = sse_data(body);
    assert_eq!(d.last().map(String::as_str), Some("[DONE]"), "{body}");
    d[..d.len() - 1].to_vec()
}

/// Chunk skeletons compared in order; `multiset` for `n > 1`, whose choices interleave as
/// the engine happens to step them (each choice's own order is checked separately).
fn same_chunks(ours: &[String], theirs: &[String], what: &str, multiset: bool) {
    let mut a: Vec<String> = ours.iter().map(|c| skel(c)).collect();
    let mut b: Vec<String> = theirs.iter().map(|c| skel(c)).collect();
    if multiset {
        a.sort();
        b.sort();
    }
    assert_eq!(
        a, b,
        "{what}: chunk skeletons\nours: {ours:#?}\nvLLM: {theirs:#?}"
    );
}

/// Per choice index: the kinds of its chunks in order (`role`, `tok`, `fin`).
fn per_choice(chunks: &[String]) -> BTreeMap<u64, Vec<&'static str>> {
    let mut out: BTreeMap<u64, Vec<&'static str>> = BTreeMap::new();
    for c in chunks {
        let v: Value = serde_json::from_str(c).unwrap();
        let Some(ch) = v["choices"].as_array().and_then(|a| a.first()) else {
            continue;
        };
        let kind = if ch["delta"].get("role").is_some() {
            "role"
        } else if ch["finish_reason"].is_null() {
            "tok"
        } else {
            "fin"
        };
        out.entry(ch["index"].as_u64().unwrap())
            .or_default()
            .push(kind);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_usage_details_and_n_choices_match_vllm() {
    let caps = captures();
    let server = sim().await;
    // n = 2: two choices, prompt counted once, completion tokens summed.
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat("hello n two", json!({"max_tokens": 3, "n": 2})),
    )
    .await;
    let (_, v) = cap(&caps, "chat_n2_plain");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(skel(&r.body), skel(&v), "chat n=2\n{}\n{v}", r.body);
    assert_eq!(usage_of(&r.body), usage_of(&v));
    // A cold long prompt writes 320 tokens (10 full blocks) to the cache; the same prompt
    // again reads them (the last, partial block is recomputed).
    for name in ["chat_long_plain_1", "chat_long_plain_2"] {
        let r = post(
            &server,
            "/v1/chat/completions",
            &chat(&long(), json!({"max_tokens": 3})),
        )
        .await;
        let (_, v) = cap(&caps, name);
        assert_eq!(skel(&r.body), skel(&v), "{name}\n{}\n{v}", r.body);
        assert_eq!(usage_of(&r.body), usage_of(&v), "{name}");
    }
    // Completions: `created_cache_tokens` is null in the plain response.
    let r = post(
        &server,
        "/v1/completions",
        &completion(&long(), json!({"max_tokens": 3, "n": 2})),
    )
    .await;
    let (_, v) = cap(&caps, "comp_n2_plain");
    assert_eq!(skel(&r.body), skel(&v), "completion n=2\n{}\n{v}", r.body);
    let (ours, theirs) = (usage_of(&r.body), usage_of(&v));
    assert_eq!(ours["prompt_tokens"], theirs["prompt_tokens"]);
    assert_eq!(ours["completion_tokens"], theirs["completion_tokens"]);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_match_vllm_with_continuous_usage_fingerprint_and_n() {
    let caps = captures();
    let server = sim().await;
    // The capture's history: the long prompt was cached before the streamed requests.
    post(
        &server,
        "/v1/chat/completions",
        &chat(&long(), json!({"max_tokens": 1})),
    )
    .await;
    post(
        &server,
        "/v1/completions",
        &completion(&long(), json!({"max_tokens": 1})),
    )
    .await;
    let continuous = json!({"include_usage": true, "continuous_usage_stats": true});
    let cases = [
        (
            "chat_stream_continuous",
            "/v1/chat/completions",
            chat(
                &format!("{} x", long()),
                json!({"max_tokens": 3, "stream": true, "stream_options": continuous}),
            ),
            false,
        ),
        (
            "chat_stream_no_usage",
            "/v1/chat/completions",
            chat("no usage please", json!({"max_tokens": 3, "stream": true})),
            false,
        ),
        (
            "chat_stream_n2_continuous",
            "/v1/chat/completions",
            chat(
                "n two continuous",
                json!({"max_tokens": 2, "n": 2, "stream": true, "stream_options": continuous}),
            ),
            true,
        ),
        (
            "comp_stream_continuous",
            "/v1/completions",
            completion(
                &format!("{} y", long()),
                json!({"max_tokens": 3, "stream": true, "stream_options": continuous}),
            ),
            false,
        ),
        (
            "comp_stream_no_usage",
            "/v1/completions",
            completion("no usage", json!({"max_tokens": 3, "stream": true})),
            false,
        ),
        (
            "comp_stream_n2_usage",
            "/v1/completions",
            completion(
                "two of them",
                json!({"max_tokens": 2, "n": 2, "stream": true,
                    "stream_options": {"include_usage": true}}),
            ),
            true,
        ),
    ];
    for (name, path, body, n2) in cases {
        let r = post(&server, path, &body).await;
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        let (_, v) = cap(&caps, name);
        let (ours, theirs) = (chunks(&r.body), chunks(&v));
        same_chunks(&ours, &theirs, name, n2);
        assert_eq!(per_choice(&ours), per_choice(&theirs), "{name}: per choice");
        // Every usage object (per chunk with `continuous_usage_stats`, and the final one) is
        // vLLM's: same counts, same cache figures.
        let usages = |c: &[String]| -> Vec<Value> {
            let mut u: Vec<Value> = c.iter().map(|c| usage_of(c)).collect();
            u.sort_by_key(Value::to_string);
            u
        };
        assert_eq!(usages(&ours), usages(&theirs), "{name}: usage");
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_usage_splits_cache_reads_and_writes_like_vllm() {
    let caps = captures();
    let server = sim().await;
    // Cold: the prompt's full blocks are written to the cache (vLLM's `created_cache_tokens`
    // becomes `cache_creation_input_tokens`, and `input_tokens` is what is left).
    for stream in [false, true] {
        let text = format!("cold {stream} {}", long());
        let r = post(
            &server,
            "/v1/messages",
            &json!({"model": "tiny-llama", "max_tokens": 3, "stream": stream,
                "messages": [{"role": "user", "content": text}]}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let usage = if stream {
            let ev = sse_events(&r.body);
            let start: Value = serde_json::from_str(&ev[0].1).unwrap();
            let prompt = start["message"]["usage"]["input_tokens"].as_u64().unwrap();
            let (_, delta) = ev.iter().find(|(e, _)| e == "message_delta").unwrap();
            let u = serde_json::from_str::<Value>(delta).unwrap()["usage"].clone();
            assert_eq!(
                u["input_tokens"].as_u64().unwrap()
                    + u["cache_creation_input_tokens"].as_u64().unwrap()
                    + u["cache_read_input_tokens"].as_u64().unwrap(),
                prompt
            );
            u
        } else {
            r.json()["usage"].clone()
        };
        let created = usage["cache_creation_input_tokens"].as_u64().unwrap();
        assert_eq!(usage["cache_read_input_tokens"], 0, "{usage}");
        assert!(created >= 320 && created % 32 == 0, "{usage}");
        assert!(usage["input_tokens"].as_u64().unwrap() < 32, "{usage}");
    }
    // Warm, as in the capture: the long prefix was cached by an earlier chat request.
    post(
        &server,
        "/v1/chat/completions",
        &chat(&long(), json!({"max_tokens": 1})),
    )
    .await;
    for (name, stream, tail) in [
        ("messages_long_plain", false, " z"),
        ("messages_long_stream", true, " w"),
    ] {
        let r = post(
            &server,
            "/v1/messages",
            &json!({"model": "tiny-llama", "max_tokens": 3, "stream": stream,
                "messages": [{"role": "user", "content": format!("{}{tail}", long())}]}),
        )
        .await;
        let (_, v) = cap(&caps, name);
        if stream {
            let (ours, theirs) = (sse_events(&r.body), sse_events(&v));
            let names =
                |e: &[(String, String)]| e.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
            assert_eq!(names(&ours), names(&theirs), "{name}");
            for ((_, a), (_, b)) in ours.iter().zip(&theirs) {
                assert_eq!(skel(a), skel(b), "{name}");
            }
            let usage = |e: &[(String, String)], ev: &str| {
                let (_, d) = e.iter().find(|(n, _)| n == ev).unwrap();
                serde_json::from_str::<Value>(d).unwrap()
            };
            assert_eq!(
                usage(&ours, "message_start")["message"]["usage"],
                usage(&theirs, "message_start")["message"]["usage"]
            );
            assert_eq!(
                usage(&ours, "message_delta")["usage"],
                usage(&theirs, "message_delta")["usage"]
            );
        } else {
            assert_eq!(skel(&r.body), skel(&v), "{name}");
            assert_eq!(usage_of(&r.body), usage_of(&v), "{name}");
        }
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_and_length_limits_match_vllm() {
    const JSON: &str = "application/json";
    let caps = captures();
    let server = sim().await;
    let x = || json!([{"role": "user", "content": "x"}]);
    let ids = |from: u32, to: u32| (from..to).collect::<Vec<_>>();
    let one = |msgs: Value| json!({"model": "tiny-llama", "messages": msgs, "max_tokens": 1});
    let cases: Vec<(&str, &str, &str, Option<String>, &str)> = vec![
        (
            "err_chat_unknown_model",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "nope", "messages": x()}).to_string()),
            JSON,
        ),
        (
            "err_messages_unknown_model",
            "POST",
            "/v1/messages",
            Some(json!({"model": "nope", "max_tokens": 3, "messages": x()}).to_string()),
            JSON,
        ),
        (
            "err_messages_max_tokens_0",
            "POST",
            "/v1/messages",
            Some(json!({"model": "tiny-llama", "max_tokens": 0, "messages": x()}).to_string()),
            JSON,
        ),
        (
            "err_messages_missing_max_tokens",
            "POST",
            "/v1/messages",
            Some(json!({"model": "tiny-llama", "messages": x()}).to_string()),
            JSON,
        ),
        (
            "err_chat_max_tokens_over_model_len",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "tiny-llama", "messages": x(), "max_tokens": 100000}).to_string()),
            JSON,
        ),
        (
            "err_chat_max_completion_tokens_over_model_len",
            "POST",
            "/v1/chat/completions",
            Some(
                json!({"model": "tiny-llama", "messages": x(), "max_completion_tokens": 100000})
                    .to_string(),
            ),
            JSON,
        ),
        (
            "err_comp_prompt_too_long",
            "POST",
            "/v1/completions",
            Some(
                json!({"model": "tiny-llama", "prompt": ids(3, 2103), "max_tokens": 1}).to_string(),
            ),
            JSON,
        ),
        (
            "err_comp_prompt_fills_context",
            "POST",
            "/v1/completions",
            Some(
                json!({"model": "tiny-llama", "prompt": ids(3, 2051), "max_tokens": 1}).to_string(),
            ),
            JSON,
        ),
        (
            "err_chat_stream_options_without_stream",
            "POST",
            "/v1/chat/completions",
            Some(
                json!({"model": "tiny-llama", "messages": x(),
                    "stream_options": {"include_usage": true}})
                .to_string(),
            ),
            JSON,
        ),
        (
            "err_chat_n0",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "tiny-llama", "messages": x(), "n": 0}).to_string()),
            JSON,
        ),
        (
            "err_chat_max_tokens_0",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "tiny-llama", "messages": x(), "max_tokens": 0}).to_string()),
            JSON,
        ),
        (
            "err_chat_max_tokens_negative",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "tiny-llama", "messages": x(), "max_tokens": -3}).to_string()),
            JSON,
        ),
        (
            "err_chat_missing_messages",
            "POST",
            "/v1/chat/completions",
            Some(json!({"model": "tiny-llama"}).to_string()),
            JSON,
        ),
        (
            "err_chat_invalid_json",
            "POST",
            "/v1/chat/completions",
            Some("{not json".into()),
            JSON,
        ),
        (
            "err_comp_missing_prompt",
            "POST",
            "/v1/completions",
            Some(json!({"model": "tiny-llama"}).to_string()),
            JSON,
        ),
        (
            "err_comp_empty_prompt",
            "POST",
            "/v1/completions",
            Some(json!({"model": "tiny-llama", "prompt": ""}).to_string()),
            JSON,
        ),
        (
            "err_chat_text_plain",
            "POST",
            "/v1/chat/completions",
            Some(one(x()).to_string()),
            "text/plain",
        ),
        (
            "err_messages_text_plain",
            "POST",
            "/v1/messages",
            Some(one(x()).to_string()),
            "text/plain",
        ),
        (
            "ok_chat_json_charset",
            "POST",
            "/v1/chat/completions",
            Some(one(x()).to_string()),
            "Application/JSON; charset=utf-8",
        ),
        ("err_405", "GET", "/v1/chat/completions", None, JSON),
        ("err_404", "GET", "/nope", None, JSON),
        ("health", "GET", "/health", None, JSON),
    ];
    for (name, method, path, body, content_type) in cases {
        let r = http_with(&server, method, path, body.as_deref(), content_type).await;
        let (status, v) = cap(&caps, name);
        assert_eq!(r.status, status, "{name}: {}", r.body);
        if v.is_empty() {
            assert_eq!(r.body, v, "{name}");
            continue;
        }
        if status == 200 {
            assert_eq!(skel(&r.body), skel(&v), "{name}");
            continue;
        }
        assert_eq!(skel(&r.body), skel(&v), "{name}: {}\nvLLM: {v}", r.body);
        let (ours, theirs) = (r.json(), serde_json::from_str::<Value>(&v).unwrap());
        let schema = theirs["error"]["type"] == "Bad Request";
        if schema {
            // FastAPI's validation errors: vLLM's type, param and code (the message quotes
            // pydantic's internals).
            assert_eq!(ours["error"]["type"], theirs["error"]["type"], "{name}");
            assert_eq!(ours["error"]["param"], theirs["error"]["param"], "{name}");
            assert_eq!(ours["error"]["code"], theirs["error"]["code"], "{name}");
        } else {
            assert_eq!(ours, theirs, "{name}");
        }
    }
    // A `max_tokens` that only overflows the context together with the prompt is clamped to
    // what is left, not refused; an empty `stream_options` without `stream` is accepted.
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat(&long(), json!({"max_tokens": 2040})),
    )
    .await;
    let (status, v) = cap(&caps, "ok_chat_max_tokens_clamped");
    assert_eq!(r.status, status, "{}", r.body);
    let (ours, theirs) = (usage_of(&r.body), usage_of(&v));
    assert_eq!(ours["prompt_tokens"], theirs["prompt_tokens"]);
    assert_eq!(ours["completion_tokens"], theirs["completion_tokens"]);
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat("x", json!({"max_tokens": 1, "stream_options": {}})),
    )
    .await;
    assert_eq!(
        r.status,
        cap(&caps, "ok_chat_empty_stream_options_without_stream").0
    );
    server.stop();
}
