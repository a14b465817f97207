//! Fault injection end to end: the gateway with live ingestion in front of `kinf-sim` workers
//! (real HTTP and ZMQ sockets; one worker is a separate process that is killed), checked
//! against the simulator's ground truth.
//!
//! - KV events lost and reordered, then a publisher restart: after replay the gateway's index
//!   holds exactly the blocks the worker's cache holds (`GET /sim/cache`).
//! - A worker process killed mid-stream: the client gets a well-formed error event and
//!   `[DONE]`; what was streamed is accounted as an incomplete request.
//! - A worker unreachable before the first byte: the request is retried on another one.
//! - `/metrics` hanging: the endpoint goes stale, decisions pass it over while a fresh one is
//!   ready, and it comes back when scrapes succeed again.
//!
//! Invalid configuration pushed live, Redis unavailable and provider timeouts are covered in
//! gateway_http.rs, tenants_redis.rs and providers_protocols.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::Gateway;
use kinf_router::prefix_index::EndpointId;
use kinf_router::state::PrefixTracking;
use serde_json::{Value, json};
use support::*;

const NS: &str = "faults";
const WS: &str = "tiny";

/// One worker set over `endpoints` with KV events (ports discovered) and fast scrapes.
fn config(endpoints: &[String]) -> String {
    let eps = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: {WS}, namespace: {NS} }}
spec:
  endpoints: [{eps}]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
  kvEvents: {{}}
  metrics: {{ interval: 200ms }}
  blockSize: 16
  tokenizer: {{ path: {tok} }}
  cost: {{ uncachedPromptPerMillion: 1.0, cachedPromptPerMillion: 0.5, outputPerMillion: 4.0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: {NS} }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: {WS} }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: fastest, namespace: {NS} }}
spec:
  rules:
  - name: fastest
    matches: [ {{ model: tiny }} ]
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
"#,
        tok = tiny_tokenizer()
    )
}

async fn sim_worker(extra: &[&str]) -> kinf_sim::serve::Server {
    let tok = tiny_tokenizer();
    let mut args = vec![
        "--block-size",
        "16",
        "--max-model-len",
        "8192",
        "--kv-events-port",
        "0",
        "--replay-port",
        "0",
        "--tokenizer",
        &tok,
    ];
    args.extend_from_slice(extra);
    tiny_sim("20", &args).await
}

async fn get_json(url: &str) -> Value {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client.get(url.parse().unwrap()).await.unwrap();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&b).unwrap_or(Value::Null)
}

/// The gateway's `/metrics` lines of `family`.
async fn metrics_text(addr: SocketAddr, family: &str) -> String {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .get(format!("http://{addr}/metrics").parse().unwrap())
        .await
        .unwrap();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&b)
        .lines()
        .filter(|l| l.starts_with(family))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn set_faults(worker: SocketAddr, faults: Value) {
    let (s, _, v) = post_json(worker, "/sim/faults", &faults, &[]).await;
    assert_eq!(s, 200, "{v}");
}

/// The worker's prefix cache (ground truth).
async fn truth(worker: SocketAddr) -> HashSet<u64> {
    let v = get_json(&format!("http://{worker}/sim/cache")).await;
    v["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

/// The engine hashes the gateway's index holds for `address`.
fn index_view(gw: &Gateway, address: &str) -> HashSet<u64> {
    gw.state.with(|st| {
        let ws = st.worker_set(NS, WS).unwrap();
        let id: EndpointId = ws.index_id(address).unwrap();
        match &ws.prefix {
            PrefixTracking::Exact(i) => i.engine_hashes(id).into_iter().collect(),
            PrefixTracking::Approximate(_) => panic!("KV events are configured: exact tracking"),
        }
    })
}

/// Waits until the gateway's index for `worker` equals the worker's cache.
async fn index_converges(gw: &Gateway, worker: SocketAddr, what: &str) -> usize {
    let address = worker.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let t = truth(worker).await;
        let held = index_view(gw, &address);
        if held == t {
            return t.len();
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{what}: the index has {} blocks, the worker {}; {} missing, {} extra",
                held.len(),
                t.len(),
                t.difference(&held).count(),
                held.difference(&t).count()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of every number (or `true`) under `key` anywhere in `v`.
fn sum_key(v: &Value, key: &str) -> f64 {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, x)| match (k == key, x) {
                (true, Value::Number(n)) => n.as_f64().unwrap_or(0.0),
                (true, Value::Bool(b)) => f64::from(u8::from(*b)),
                _ => sum_key(x, key),
            })
            .sum(),
        Value::Array(a) => a.iter().map(|x| sum_key(x, key)).sum(),
        _ => 0.0,
    }
}

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": "tiny", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": text}]})
}

/// A prompt of a few hundred tokens: `shared` words of a common document, then `own`.
fn prompt(shared: usize, own: &str) -> String {
    let mut s = String::new();
    for i in 0..shared {
        s.push_str(&format!(
            "section {i} of the shared handbook says the quick brown fox. "
        ));
    }
    s.push_str(own);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_equals_the_workers_cache_after_lost_reordered_events_and_a_restart() {
    // A small cache (evictions happen) and a publisher that loses and reorders messages.
    let w = sim_worker(&[
        "--num-gpu-blocks",
        "96",
        "--fault-kv-drop-rate",
        "0.3",
        "--fault-kv-reorder-rate",
        "0.2",
    ])
    .await;
    let dir = temp_dir("faults-kv");
    std::fs::write(dir.join("c.yaml"), config(&[w.http.to_string()])).unwrap();
    let (gw, addr) = gateway(&dir).await;
    let ingestion = |key: &str| {
        gw.live
            .load_full()
            .map(|l| sum_key(&l.status_json(), key))
            .unwrap_or(0.0)
    };
    assert!(
        eventually(Duration::from_secs(10), || ingestion("connected") >= 1.0).await,
        "the KV subscriber connects"
    );

    for i in 0..24 {
        let p = prompt(10 + (i % 4) * 6, &format!("question {i}: why?"));
        let (s, _, v) = post_json(addr, "/v1/chat/completions", &chat(&p, 4), &[]).await;
        assert_eq!(s, 200, "{v}");
    }
    // Repair the publisher; one more request publishes a message after any trailing gap, so
    // the subscriber notices it and replays.
    set_faults(w.http, json!({"kv_drop_rate": 0.0, "kv_reorder_rate": 0.0})).await;
    let (s, _, _) = post_json(addr, "/v1/chat/completions", &chat("flush", 2), &[]).await;
    assert_eq!(s, 200);
    let n = index_converges(&gw, w.http, "after drops and reorders").await;
    assert!(n > 0, "the worker cached something");
    assert!(ingestion("gaps") >= 1.0, "lost messages were seen as gaps");
    assert!(ingestion("replays") >= 1.0, "gaps were filled by replay");

    // A restart: the sequence starts again and the cache is cleared; the index follows.
    let (s, _, v) = post_json(w.http, "/sim/restart_publisher", &json!({}), &[]).await;
    assert_eq!(s, 200, "{v}");
    for i in 0..6 {
        let p = prompt(8, &format!("after restart {i}"));
        let (s, _, _) = post_json(addr, "/v1/chat/completions", &chat(&p, 2), &[]).await;
        assert_eq!(s, 200);
    }
    let n = index_converges(&gw, w.http, "after the publisher restarted").await;
    assert!(n > 0);
}

/// The `kinf-sim` binary next to this test's binary (cargo and nextest build the workspace's
/// binaries into the same profile directory).
fn sim_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("kinf-sim");
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") {
        panic!("{} not built (cargo build -p kinf-sim)", p.display());
    }
    eprintln!("SKIPPED: {} not built", p.display());
    None
}

/// Starts `kinf-sim serve` as a process; its child handle and HTTP address.
fn sim_process(bin: &PathBuf, extra: &[&str]) -> (Child, SocketAddr) {
    let mut c = Command::new(bin)
        .args([
            "serve",
            "--port",
            "0",
            "--model",
            "tiny-llama",
            "--profile",
            "tiny",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    (c, v["http"].as_str().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_stream_ends_the_stream_cleanly_and_is_accounted() {
    let Some(bin) = sim_binary() else { return };
    // Slow generation (real time) so that the kill lands mid-stream.
    let (mut child, worker) = sim_process(&bin, &["--speed", "0.2", "--max-model-len", "8192"]);
    let dir = temp_dir("faults-kill");
    std::fs::write(
        dir.join("c.yaml"),
        config(&[worker.to_string()]).replace("  kvEvents: {}\n", ""),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;

    let mut body = chat("tell me a long story", 3000);
    body["stream"] = json!(true);
    let resp = post_response(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    let mut text = String::new();
    let mut killed = false;
    while let Some(frame) = stream.frame().await {
        let frame = frame.expect("the gateway ends the stream cleanly");
        if let Some(d) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(d));
        }
        if !killed && text.matches("\"content\"").count() >= 5 {
            child.kill().unwrap();
            let _ = child.wait();
            killed = true;
        }
    }
    assert!(killed, "the stream ended before the kill: {text}");
    let events: Vec<&str> = text.split_inclusive("\n\n").collect();
    let n = events.len();
    assert!(n >= 3, "{text}");
    assert_eq!(events[n - 1], "data: [DONE]\n\n", "{text}");
    let err: Value =
        serde_json::from_str(events[n - 2].strip_prefix("data: ").unwrap().trim_end()).unwrap();
    assert!(err["error"]["message"].is_string(), "{err}");
    assert!(err["error"]["type"].is_string(), "{err}");
    let streamed = events[..n - 2]
        .iter()
        .filter(|e| e.contains("\"content\""))
        .count() as f64;

    let labels = [
        ("tenant", "anonymous"),
        ("model", "tiny"),
        ("destination", WS),
        ("destination_namespace", NS),
    ];
    let value = |name: &str, extra: &[(&'static str, &'static str)]| {
        let mut l = labels.to_vec();
        l.extend_from_slice(extra);
        gw.metrics.value(name, &l)
    };
    assert!(
        eventually(Duration::from_secs(5), || value(
            "kinference_tenant_requests_total",
            &[("outcome", "incomplete"), ("code", "200")]
        ) == Some(1.0))
        .await,
        "the request is accounted as incomplete: {}",
        metrics_text(addr, "kinference_tenant_requests_total").await
    );
    let output = value("kinference_tenant_tokens_total", &[("kind", "output")]).unwrap();
    // One output token per token-carrying event (the role chunk may carry an empty content).
    assert!(
        (output - streamed).abs() <= 1.0,
        "accounted {output} output tokens, streamed {streamed} content events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_worker_is_retried_on_another_before_the_first_byte() {
    let live = sim_worker(&[]).await;
    // A port nobody listens on.
    let dead = format!("127.0.0.1:{}", free_port());
    let dir = temp_dir("faults-dead");
    std::fs::write(
        dir.join("c.yaml"),
        config(&[dead.clone(), live.http.to_string()]).replace("  kvEvents: {}\n", ""),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;
    let _ = &gw;
    for i in 0..6 {
        let (s, h, v) = post_json(
            addr,
            "/v1/chat/completions",
            &chat(&format!("hello {i}"), 3),
            &[],
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            h["x-kinference-endpoint"].to_str().unwrap(),
            live.http.to_string()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_metrics_make_an_endpoint_stale_and_decisions_pass_it_over() {
    let a = sim_worker(&[]).await;
    let b = sim_worker(&[]).await;
    let dir = temp_dir("faults-stale");
    std::fs::write(
        dir.join("c.yaml"),
        config(&[a.http.to_string(), b.http.to_string()]).replace("  kvEvents: {}\n", ""),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;
    let stale = |gw: &Gateway, ep: SocketAddr| {
        gw.state.with(|st| {
            st.worker_set(NS, WS)
                .unwrap()
                .endpoints
                .iter()
                .find(|e| *e.address == *ep.to_string())
                .map(|e| (e.ready, e.stale))
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || stale(&gw, a.http)
            == Some((true, false))
            && stale(&gw, b.http) == Some((true, false)))
        .await
    );
    // A's /metrics hangs far longer than the scrape timeout.
    set_faults(a.http, json!({"metrics_delay_ms": 10_000})).await;
    assert!(
        eventually(Duration::from_secs(5), || stale(&gw, a.http)
            == Some((true, true)))
        .await,
        "three missed scrapes make A stale (health still passes, so it stays ready)"
    );
    for i in 0..5 {
        let (s, h, v) = post_json(
            addr,
            "/v1/chat/completions",
            &chat(&format!("stale {i}"), 2),
            &[],
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            h["x-kinference-endpoint"].to_str().unwrap(),
            b.http.to_string(),
            "a stale endpoint is passed over while a fresh one is ready"
        );
    }
    // Repaired: the next successful scrape clears it.
    set_faults(a.http, json!({"metrics_delay_ms": 0})).await;
    assert!(
        eventually(Duration::from_secs(5), || stale(&gw, a.http)
            == Some((true, false)))
        .await,
        "A is fresh again"
    );
}
