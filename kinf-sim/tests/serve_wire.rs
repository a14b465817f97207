//! Wire compatibility of `kinf-sim serve` with the vLLM 0.32 captures in
//! `testdata/vllm-0.32.0-cpu/`: SSE and JSON shapes, `/metrics` names/types/labels, KV-event
//! frames decoded with kinf-router's decoder, prefix caching, replay.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod serve_common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use kinf_router::kv_events::KvEvent;
use serde_json::Value;
use serve_common::*;

/// Compares the JSON shape of `ours` with `cap`: same object keys (except `extra` keys that
/// `ours` may add), same value kinds; `null` on either side matches anything.
fn same_shape(ours: &Value, cap: &Value, path: &str, extra: &[&str]) {
    match (ours, cap) {
        (Value::Null, _) | (_, Value::Null) => {}
        (Value::Object(a), Value::Object(b)) => {
            let ka: BTreeSet<&String> = a.keys().filter(|k| !extra.contains(&k.as_str())).collect();
            let kb: BTreeSet<&String> = b.keys().filter(|k| !extra.contains(&k.as_str())).collect();
            assert_eq!(ka, kb, "keys differ at {path}");
            for (k, v) in b.iter().filter(|(k, _)| a.contains_key(*k)) {
                same_shape(&a[k], v, &format!("{path}.{k}"), extra);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if let (Some(x), Some(y)) = (a.first(), b.first()) {
                same_shape(x, y, &format!("{path}[0]"), extra);
            }
            assert_eq!(a.is_empty(), b.is_empty(), "emptiness differs at {path}");
        }
        (Value::String(_), Value::String(_))
        | (Value::Number(_), Value::Number(_))
        | (Value::Bool(_), Value::Bool(_)) => {}
        _ => panic!("kinds differ at {path}: {ours} vs {cap}"),
    }
}

/// Top-level key order of a JSON object text (byte-shape check).
fn key_order(text: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(text).unwrap();
    let Value::Object(m) = v else { return vec![] };
    let mut keys: Vec<(usize, String)> = m
        .keys()
        .map(|k| {
            (
                text.find(&format!("\"{k}\":")).unwrap_or(usize::MAX),
                k.clone(),
            )
        })
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

fn classify(chunks: &[String]) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    for c in chunks {
        if c == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(c).unwrap();
        let choice = &v["choices"][0];
        let kind = if v["choices"].as_array().is_some_and(Vec::is_empty) {
            "usage"
        } else if choice["delta"].get("role").is_some() {
            "role"
        } else if choice["finish_reason"].is_null() {
            "token"
        } else {
            "finish"
        };
        out.entry(kind).or_insert_with(|| c.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_stream_shapes_match_captures() {
    let server = start(&[]).await;
    for (path, capture, body) in [
        (
            "/v1/chat/completions",
            "chat_stream.txt",
            chat_body("hello there, how are you?", 6, true),
        ),
        (
            "/v1/completions",
            "completion_stream.txt",
            serde_json::json!({"model":"tiny-llama","prompt":"once upon a time","max_tokens":6,
                "stream":true,"stream_options":{"include_usage":true}})
            .to_string(),
        ),
    ] {
        let r = http(&server, "POST", path, Some(&body)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.header("content-type")
                .unwrap()
                .starts_with("text/event-stream")
        );
        assert!(r.complete);
        assert!(r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
        let ours = sse_data(&r.body);
        let cap = sse_data(&read_fixture(capture));
        assert_eq!(ours.last().unwrap(), "[DONE]");
        let (ko, kc) = (classify(&ours), classify(&cap));
        assert_eq!(
            ko.keys().collect::<Vec<_>>(),
            kc.keys().collect::<Vec<_>>(),
            "{path}"
        );
        for (kind, c) in &kc {
            let o = &ko[kind];
            let extra: &[&str] = if *kind == "usage" {
                &["prompt_tokens_details"]
            } else {
                &[]
            };
            same_shape(
                &serde_json::from_str(o).unwrap(),
                &serde_json::from_str(c).unwrap(),
                &format!("{path} {kind}"),
                extra,
            );
            assert_eq!(key_order(o), key_order(c), "{path} {kind} key order");
        }
        let usage: Value = serde_json::from_str(&ko["usage"]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 6);
        assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
        let tokens = ours.len() - 1 - usize::from(path.contains("chat")) - 1;
        assert_eq!(tokens, 6, "{path}: one chunk per token");
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_json_shapes_match_captures() {
    let server = start(&[]).await;
    let chat = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("hi", 4, false)),
    )
    .await;
    assert_eq!(chat.status, 200);
    assert!(
        chat.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    let cap = read_fixture("chat1.json");
    same_shape(
        &chat.json(),
        &serde_json::from_str(&cap).unwrap(),
        "chat",
        &[],
    );
    assert_eq!(key_order(&chat.body), key_order(&cap));
    assert_eq!(chat.json()["usage"]["completion_tokens"], 4);

    let comp = http(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"model":"tiny-llama","prompt":"abc def","max_tokens":3}"#),
    )
    .await;
    let cap = read_fixture("comp1.json");
    same_shape(
        &comp.json(),
        &serde_json::from_str(&cap).unwrap(),
        "comp",
        &[],
    );
    assert_eq!(key_order(&comp.body), key_order(&cap));

    let msg = http(
        &server,
        "POST",
        "/v1/messages",
        Some(
            r#"{"model":"tiny-llama","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
    .await;
    let cap = read_fixture("messages_nonstream.json");
    same_shape(
        &msg.json(),
        &serde_json::from_str(&cap).unwrap(),
        "messages",
        &[],
    );
    assert_eq!(key_order(&msg.body), key_order(&cap));

    let models = http(&server, "GET", "/v1/models", None).await;
    let cap = read_fixture("models.json");
    same_shape(
        &models.json(),
        &serde_json::from_str(&cap).unwrap(),
        "models",
        &[],
    );
    assert_eq!(models.json()["data"][0]["id"], "tiny-llama");
    assert_eq!(models.json()["data"][0]["root"], "/models/tiny-llama");

    let src = http(&server, "GET", "/kv_event_sources", None).await;
    let cap = read_fixture("kv_event_sources.json");
    same_shape(
        &src.json(),
        &serde_json::from_str(&cap).unwrap(),
        "kv_event_sources",
        &[],
    );
    assert_eq!(key_order(&src.body), key_order(&cap));
    let port = server
        .kv_events
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    assert!(
        src.json()["0"]["endpoint"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{port}"))
    );

    let health = http(&server, "GET", "/health", None).await;
    assert_eq!((health.status, health.body.as_str()), (200, ""));

    // Errors.
    let e = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#),
    )
    .await;
    assert_eq!(e.status, 404);
    assert_eq!(e.json()["error"]["type"], "NotFoundError");
    assert_eq!(e.json()["error"]["code"], 404);
    // Invalid JSON fails FastAPI's request validation: vLLM's `"Bad Request"` type.
    let e = http(&server, "POST", "/v1/chat/completions", Some("{not json")).await;
    assert_eq!(e.status, 400);
    assert_eq!(e.json()["error"]["type"], "Bad Request");
    assert_eq!(e.json()["error"]["param"], "body.1");
    let e = http(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"model":"tiny-llama","prompt":"x","max_tokens":100000}"#),
    )
    .await;
    assert_eq!(e.status, 400);
    assert_eq!(e.json()["error"]["param"], "max_tokens");
    assert!(
        e.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot be greater than max_model_len")
    );
    // A count near 2^64 must not wrap around the context check (it made the worker generate
    // for hours).
    for huge in ["18446744073709551615", "18446744073709551600"] {
        let body = format!(r#"{{"model":"tiny-llama","prompt":"x","max_tokens":{huge}}}"#);
        let e = http(&server, "POST", "/v1/completions", Some(&body)).await;
        assert_eq!(e.status, 400, "{huge}: {}", e.body);
        assert!(
            e.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot be greater than max_model_len"),
            "{}",
            e.body
        );
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stream_matches_capture() {
    let server = start(&[]).await;
    let body = r#"{"model":"tiny-llama","max_tokens":4,"stream":true,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}]}"#;
    let r = http(&server, "POST", "/v1/messages", Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let ours = sse_events(&r.body);
    let cap = sse_events(&read_fixture("messages_stream.txt"));
    let names = |v: &[(String, String)]| {
        let mut n: Vec<String> = v.iter().map(|(e, _)| e.clone()).collect();
        n.dedup();
        n
    };
    assert_eq!(names(&ours), names(&cap));
    assert_eq!(
        ours.iter()
            .filter(|(e, _)| e == "content_block_delta")
            .count(),
        4
    );
    for (event, data) in &cap {
        let (_, o) = ours.iter().find(|(e, _)| e == event).unwrap();
        same_shape(
            &serde_json::from_str(o).unwrap(),
            &serde_json::from_str(data).unwrap(),
            event,
            &[],
        );
        assert_eq!(key_order(o), key_order(data), "{event}");
    }
    assert!(
        r.body
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );
    server.stop();
}

/// Sample-level signature of an exposition: `(sample name, label keys, le, finished_reason)`.
fn signature(text: &str, families: &BTreeSet<String>) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, rest) = l.split_once('{')?;
            let fam = families.iter().find(|f| name.starts_with(f.as_str()))?;
            let _ = fam;
            let labels = rest.rsplit_once('}')?.0;
            let mut keys: Vec<String> = Vec::new();
            for kv in labels.split("\",") {
                let (k, v) = kv.split_once("=\"")?;
                let v = v.trim_end_matches('"');
                if k == "le" || k == "finished_reason" {
                    keys.push(format!("{k}={v}"));
                } else {
                    keys.push(k.to_owned());
                }
            }
            Some(format!("{name}{{{}}}", keys.join(",")))
        })
        .collect()
}

fn families(text: &str) -> BTreeMap<String, (String, String)> {
    let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
    for l in text.lines() {
        if let Some(r) = l.strip_prefix("# TYPE ") {
            let (n, t) = r.split_once(' ').unwrap();
            out.entry(n.to_owned()).or_default().0 = t.to_owned();
        } else if let Some(r) = l.strip_prefix("# HELP ") {
            let (n, h) = r.split_once(' ').unwrap();
            out.entry(n.to_owned()).or_default().1 = h.to_owned();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_capture_names_types_labels() {
    let server = start(&["--block-size", "32", "--num-gpu-blocks", "64"]).await;
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&long_text(60), 5, false)),
    )
    .await;
    assert_eq!(r.status, 200);
    let m = http(&server, "GET", "/metrics", None).await;
    assert_eq!(m.status, 200);
    assert!(
        m.header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let cap_text = read_fixture("metrics_raw.txt");
    let ours = families(&m.body);
    let cap = families(&cap_text);
    for required in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:cache_config_info",
    ] {
        assert!(ours.contains_key(required), "missing {required}");
    }
    for (name, th) in &ours {
        assert_eq!(Some(th), cap.get(name), "type/help of {name}");
    }
    let names: BTreeSet<String> = ours.keys().cloned().collect();
    let sig_ours = signature(&m.body, &names);
    // Only the capture's samples of the families we export.
    let sig_cap: BTreeSet<String> = signature(&cap_text, &names)
        .into_iter()
        .filter(|s| {
            let n = s.split('{').next().unwrap();
            names.iter().any(|f| {
                n == f
                    || n.strip_prefix(f.as_str())
                        .is_some_and(|r| ["_bucket", "_count", "_sum"].contains(&r))
            })
        })
        .collect();
    assert_eq!(sig_ours, sig_cap);
    assert!(m.body.contains("block_size=\"32\""));
    assert!(m.body.contains("num_gpu_blocks=\"64\""));
    assert!(
        m.body
            .contains("vllm:generation_tokens_total{engine=\"0\",model_name=\"tiny-llama\"} 5.0")
    );
    assert!(m.body.contains(
        "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"tiny-llama\"} 1.0"
    ));
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_decode_and_chain_with_prefix_reuse() {
    let server = start(&[]).await;
    let mut sub = subscriber(&server).await;
    let shared = long_text(30);
    let a = format!("{shared} first tail words here");
    let b = format!("{shared} another different ending");
    let ra = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&a, 3, false)),
    )
    .await;
    assert_eq!(ra.status, 200);
    let batches_a = collect(&mut sub, Duration::from_millis(500)).await;
    let rb = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&b, 3, false)),
    )
    .await;
    assert_eq!(rb.status, 200);
    let cached = rb.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= 4 * 8,
        "shared prefix should hit the cache: {cached}"
    );
    let batches_b = collect(&mut sub, Duration::from_millis(500)).await;
    assert!(!batches_a.is_empty() && !batches_b.is_empty());
    let all: Vec<_> = batches_a.iter().chain(&batches_b).collect();
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m.seq, i as i64, "sequence numbers from 0 without gaps");
        assert_eq!(m.topic, "kv-events");
        assert_eq!(m.dp_rank, Some(0));
    }
    let mut known: HashSet<u64> = HashSet::new();
    let mut tokens_a: Vec<u32> = Vec::new();
    for (i, m) in all.iter().enumerate() {
        for e in &m.events {
            let KvEvent::BlockStored(s) = e else {
                panic!("unexpected event {e:?}")
            };
            assert_eq!(s.block_size, 4);
            assert_eq!(s.token_ids.len(), s.block_hashes.len() * 4);
            if let Some(p) = s.parent {
                assert!(known.contains(&p), "parent {p} must be a stored block");
            }
            known.extend(s.block_hashes.iter().copied());
            if i < batches_a.len() {
                tokens_a.extend_from_slice(&s.token_ids);
            }
        }
    }
    // Request A's stored tokens are its prompt, tokenized by the built-in tokenizer.
    let prompt_a =
        kinf_sim::serve::tokens::builtin_encode(&format!("<|user|>\n{a}\n<|assistant|>\n"), 1000);
    let n = prompt_a.len().min(tokens_a.len());
    assert!(n >= 32);
    assert_eq!(&tokens_a[..n], &prompt_a[..n]);
    // B's first stored block continues A's chain (prefix reuse).
    let KvEvent::BlockStored(first_b) = &batches_b[0].events[0] else {
        panic!()
    };
    assert!(first_b.parent.is_some());
    server.stop();
}

async fn replay(
    dealer: &mut zeromq::DealerSocket,
    start: i64,
) -> Vec<kinf_router::kv_events::EventBatch> {
    use zeromq::{SocketRecv, SocketSend};
    let frames = kinf_router::kv_events::replay_request_frames(start);
    let msg = zeromq::ZmqMessage::try_from(
        frames
            .into_iter()
            .map(bytes::Bytes::from)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    dealer.send(msg).await.unwrap();
    let mut got = Vec::new();
    loop {
        let reply = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
            .await
            .unwrap()
            .unwrap();
        let frames = reply.into_vec();
        assert_eq!(frames.len(), 4, "[\"\", topic, seq, payload]");
        let refs: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
        match kinf_router::kv_events::decode_replay_reply(&refs).unwrap() {
            kinf_router::kv_events::ReplayItem::Batch(b) => got.push(b),
            kinf_router::kv_events::ReplayItem::End => {
                assert!(frames[0].is_empty() && frames[1].is_empty() && frames[3].is_empty());
                break;
            }
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_returns_missed_messages() {
    use zeromq::Socket;
    let server = start(&["--fault-kv-drop-rate", "1.0"]).await;
    let mut sub = subscriber(&server).await;
    for i in 0..2 {
        let r = http(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(&chat_body(&format!("{i} {}", long_text(20)), 2, false)),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    assert!(
        collect(&mut sub, Duration::from_millis(300))
            .await
            .is_empty()
    );
    let mut dealer = zeromq::DealerSocket::new();
    dealer
        .connect(server.replay.as_deref().unwrap())
        .await
        .unwrap();
    let all = replay(&mut dealer, 0).await;
    assert!(all.len() >= 2, "{}", all.len());
    for (i, b) in all.iter().enumerate() {
        assert_eq!(b.seq, i as i64);
        assert_eq!(b.topic, "kv-events");
        assert!(!b.events.is_empty());
    }
    let tail = replay(&mut dealer, 1).await;
    assert_eq!(tail.len(), all.len() - 1);
    assert_eq!(tail[0].seq, 1);
    // vLLM 0.32 reads the start as an unsigned integer: -1 (ff×8) is past every message.
    assert!(replay(&mut dealer, -1).await.is_empty());
    // A request without the empty delimiter (the pre-0.26 shape) gets no answer at all, as
    // from vLLM (it logs "Invalid replay request"); the socket keeps serving proper ones.
    {
        use zeromq::{SocketRecv, SocketSend};
        let legacy = zeromq::ZmqMessage::from(bytes::Bytes::from(0i64.to_be_bytes().to_vec()));
        dealer.send(legacy).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_millis(500), dealer.recv()).await;
        assert!(answer.is_err(), "no reply to [start_seq]: {answer:?}");
    }
    assert_eq!(replay(&mut dealer, 0).await.len(), all.len());
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_publisher_and_reset_prefix_cache() {
    let server = start(&[]).await;
    let mut sub = subscriber(&server).await;
    let text = long_text(20);
    http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&text, 2, false)),
    )
    .await;
    let before = collect(&mut sub, Duration::from_millis(300)).await;
    assert!(!before.is_empty());
    let r = http(&server, "POST", "/sim/restart_publisher", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["restarted"], true);
    let after = collect(&mut sub, Duration::from_millis(300)).await;
    assert_eq!(after[0].seq, 0);
    assert_eq!(after[0].events, vec![KvEvent::AllBlocksCleared]);
    // The cache was really cleared: the same prompt is a miss.
    let again = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&text, 2, false)),
    )
    .await;
    assert_eq!(
        again.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let stored = collect(&mut sub, Duration::from_millis(300)).await;
    assert_eq!(stored[0].seq, 1);
    // Repeat: now a hit; then POST /reset_prefix_cache publishes AllBlocksCleared.
    let hit = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(&text, 2, false)),
    )
    .await;
    assert!(
        hit.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let _ = collect(&mut sub, Duration::from_millis(200)).await;
    let r = http(&server, "POST", "/reset_prefix_cache", None).await;
    assert_eq!(r.status, 200);
    let cleared = collect(&mut sub, Duration::from_millis(300)).await;
    assert!(
        cleared
            .iter()
            .any(|b| b.events.contains(&KvEvent::AllBlocksCleared))
    );
    server.stop();
}

/// `POST /tokenize` returns the ids the engine uses: the same count the chat reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_matches_the_prompt_the_engine_sees() {
    let server = start(&[]).await;
    let messages = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a KV cache, in one line?"}]"#;
    let t = http(
        &server,
        "POST",
        "/tokenize",
        Some(&format!(
            r#"{{"model":"tiny-llama","messages":{messages}}}"#
        )),
    )
    .await;
    assert_eq!(t.status, 200, "{}", t.body);
    let t = t.json();
    let chat = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&format!(
            r#"{{"model":"tiny-llama","messages":{messages},"max_tokens":1}}"#
        )),
    )
    .await
    .json();
    assert_eq!(t["count"], chat["usage"]["prompt_tokens"]);
    assert_eq!(
        t["tokens"].as_array().map(Vec::len),
        t["count"].as_u64().map(|n| n as usize)
    );
    let p = http(
        &server,
        "POST",
        "/tokenize",
        Some(r#"{"model":"tiny-llama","prompt":"hello world"}"#),
    )
    .await
    .json();
    assert!(p["count"].as_u64().unwrap() > 0);
    let bad = http(
        &server,
        "POST",
        "/tokenize",
        Some(r#"{"model":"tiny-llama"}"#),
    )
    .await;
    assert_eq!(bad.status, 400);
}
