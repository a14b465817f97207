//! Fault switches, determinism, `--tokenizer` and the binary's startup line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod serve_common;

use std::io::BufRead;
use std::time::{Duration, Instant};

use serve_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_switches() {
    let server = start(&[]).await;
    // Fail every request.
    let r = http(&server, "POST", "/sim/faults", Some(r#"{"fail_rate":1.0}"#)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["fail_rate"], 1.0);
    let e = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("x", 2, false)),
    )
    .await;
    assert_eq!(e.status, 500);
    assert_eq!(e.json()["error"]["type"], "InternalServerError");
    assert_eq!(e.json()["error"]["code"], 500);
    // Die after two tokens: no [DONE], the chunked body is not terminated.
    http(
        &server,
        "POST",
        "/sim/faults",
        Some(r#"{"fail_rate":0.0,"die_after_tokens":2}"#),
    )
    .await;
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("x", 8, true)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.complete, "{}", r.body);
    assert!(!r.body.contains("[DONE]"));
    let chunks = sse_data(&r.body);
    assert_eq!(chunks.len(), 3, "role chunk + 2 tokens: {chunks:?}");
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("x", 8, false)),
    )
    .await;
    // The connection closes before a complete response (hyper may not even send the headers).
    assert!(
        !(r.body.contains("choices") || (r.status == 200 && r.complete)),
        "{r:?}"
    );
    // Short responses are not cut.
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("x", 1, true)),
    )
    .await;
    assert!(r.complete && r.body.contains("[DONE]"));
    // Broken /metrics.
    http(
        &server,
        "POST",
        "/sim/faults",
        Some(r#"{"die_after_tokens":null,"metrics_broken":"error"}"#),
    )
    .await;
    assert_eq!(http(&server, "GET", "/metrics", None).await.status, 500);
    http(
        &server,
        "POST",
        "/sim/faults",
        Some(r#"{"metrics_broken":"garbage"}"#),
    )
    .await;
    let g = http(&server, "GET", "/metrics", None).await;
    assert_eq!(g.status, 200);
    assert!(!g.body.contains("# HELP"));
    // Slow /metrics.
    http(
        &server,
        "POST",
        "/sim/faults",
        Some(r#"{"metrics_broken":null,"metrics_delay_ms":300}"#),
    )
    .await;
    let t = Instant::now();
    let m = http(&server, "GET", "/metrics", None).await;
    assert_eq!(m.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    let f = http(&server, "GET", "/sim/faults", None).await.json();
    assert_eq!(f["metrics_delay_ms"], 300);
    assert!(f["die_after_tokens"].is_null());
    // Bad patches are refused.
    let bad = http(&server, "POST", "/sim/faults", Some(r#"{"fail_rate":2}"#)).await;
    assert_eq!(bad.status, 400);
    let bad = http(&server, "POST", "/sim/faults", Some(r#"{"nope":1}"#)).await;
    assert_eq!(bad.status, 400);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_drop_and_reorder_faults_make_gaps() {
    let server = start(&["--fault-kv-drop-rate", "0.5"]).await;
    let mut sub = subscriber(&server).await;
    for i in 0..6 {
        http(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(&chat_body(&format!("{i} {}", long_text(12)), 2, false)),
        )
        .await;
    }
    let got = collect(&mut sub, Duration::from_millis(400)).await;
    let seqs: Vec<i64> = got.iter().map(|b| b.seq).collect();
    assert!(!seqs.is_empty());
    assert!(seqs.windows(2).all(|w| w[1] > w[0]));
    let max = *seqs.last().unwrap();
    assert!(
        (seqs.len() as i64) < max + 1,
        "some sequence numbers are missing: {seqs:?}"
    );

    let server2 = start(&["--fault-kv-reorder-rate", "1.0"]).await;
    let mut sub = subscriber(&server2).await;
    for i in 0..4 {
        http(
            &server2,
            "POST",
            "/v1/chat/completions",
            Some(&chat_body(&format!("{i} {}", long_text(12)), 2, false)),
        )
        .await;
    }
    let got = collect(&mut sub, Duration::from_millis(400)).await;
    let seqs: Vec<i64> = got.iter().map(|b| b.seq).collect();
    assert!(seqs.windows(2).any(|w| w[1] < w[0]), "reordered: {seqs:?}");
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), seqs.len(), "nothing lost or duplicated");
    server.stop();
    server2.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_deterministic_with_seed() {
    let a = start(&[]).await;
    let b = start(&[]).await;
    let body = chat_body("the same prompt", 6, false);
    let ra = http(&a, "POST", "/v1/chat/completions", Some(&body))
        .await
        .json();
    let rb = http(&b, "POST", "/v1/chat/completions", Some(&body))
        .await
        .json();
    assert_eq!(
        ra["choices"][0]["message"]["content"],
        rb["choices"][0]["message"]["content"]
    );
    let c = start(&["--seed", "8"]).await;
    let rc = http(&c, "POST", "/v1/chat/completions", Some(&body))
        .await
        .json();
    assert_ne!(
        ra["choices"][0]["message"]["content"],
        rc["choices"][0]["message"]["content"]
    );
    a.stop();
    b.stop();
    c.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hf_tokenizer_counts_prompt_tokens_like_vllm() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tokenizers/tiny-llama");
    let server = start(&["--tokenizer", dir.to_str().unwrap()]).await;
    let tok = kinf_router::tokenize::ChatTokenizer::from_files_content(
        &std::fs::read_to_string(dir.join("tokenizer.json")).unwrap(),
        Some(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()),
    )
    .unwrap();
    let expected = tok
        .encode_chat(&[kinf_router::tokenize::ChatMessage::new(
            "user",
            "Hello, world!",
        )])
        .unwrap()
        .len();
    let r = http(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body("Hello, world!", 2, false)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], expected as u64);
    let p = http(
        &server,
        "POST",
        "/v1/completions",
        Some(r#"{"model":"tiny-llama","prompt":"Hello, world!","max_tokens":2}"#),
    )
    .await;
    assert_eq!(
        p.json()["usage"]["prompt_tokens"],
        tok.encode_prompt("Hello, world!").unwrap().len() as u64
    );
    server.stop();
}

#[test]
fn binary_prints_startup_line_and_serves() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kinf-sim"))
        .args([
            "serve",
            "--port",
            "0",
            "--model",
            "m",
            "--kv-events-port",
            "0",
            "--profile",
            "tiny",
            "--speed",
            "20",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = v["http"].as_str().unwrap().to_owned();
    assert!(
        v["kv_events"]
            .as_str()
            .unwrap()
            .starts_with("tcp://127.0.0.1:")
    );
    assert!(v["replay"].is_null());
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    child.kill().unwrap();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_the_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(&["--speed", "1"]).await;
    let body = chat_body("a long answer please", 400, true);
    let mut s = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(n > 0);
    drop(s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = http(&server, "GET", "/metrics", None).await.body;
    assert!(
        m.contains("vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"tiny-llama\"} 1.0"),
        "{m}"
    );
    assert!(m.contains("vllm:num_requests_running{engine=\"0\",model_name=\"tiny-llama\"} 0.0"));
    server.stop();
}
