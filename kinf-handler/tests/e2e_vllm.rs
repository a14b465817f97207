//! The gateway on live state from two REAL vLLM 0.32 servers (CPU build, tiny random-weight
//! Llama, 128-block KV cache, ZMQ KV events with replay). Needs `KINF_VLLM_VENV`: a venv made by
//! scripts/vllm-cpu/setup.sh.
//!
//! A long prompt is sent twice: the repeat must go to the worker that reported its blocks and
//! hit its prefix cache. Then many different prompts fill that worker's cache until vLLM evicts
//! the first prompt's blocks; the index must forget them too (and vLLM must agree).
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
    let (http, kv, replay) = (free_port(), free_port(), free_port());
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
    let a = start_vllm(&venv, &model, &work.join("vllm-a.log"));
    let b = start_vllm(&venv, &model, &work.join("vllm-b.log"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !(healthy(a.http).await && healthy(b.http).await) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "vLLM did not start; logs in {}",
            work.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

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
    drop((a, b));
}
