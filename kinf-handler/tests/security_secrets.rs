//! Secrets never leak: the `kinference` binary at debug log level, under mixed traffic (valid
//! and invalid API keys, provider calls that succeed and fail, PII prompts, malformed bodies),
//! never writes a tenant's API key, a provider credential, a rejected key, prompt text or PII
//! into its logs, its `/metrics`, its admin status, or any response it sends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/fake_provider.rs"]
mod fake_provider;
mod support;

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

use bytes::Bytes;
use fake_provider::{Fake, Mode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use support::*;

const ACME_KEY: &str = "sk-acme-c0ffee-LEAKCHECK-1111";
const GLOBEX_KEY: &str = "sk-globex-beef-LEAKCHECK-2222";
const WRONG_KEY: &str = "sk-wrong-dead-LEAKCHECK-3333";
const PROMPT_MARK: &str = "zebra-quartz-LEAKCHECK-prompt";
const EMAIL: &str = "jane.leakcheck@example.org";

/// The `kinference` process, killed on drop.
struct Kinference(Child);

impl Drop for Kinference {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn get(url: &str) -> (u16, String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    match client.get(url.parse().unwrap()).await {
        Ok(r) => {
            let s = r.status().as_u16();
            let b = r.into_body().collect().await.unwrap().to_bytes();
            (s, String::from_utf8_lossy(&b).into_owned())
        }
        Err(_) => (0, String::new()),
    }
}

/// Everything a client can see of one response: status line, headers and body.
async fn exchange(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> String {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = client
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let mut seen = format!("{}\n", r.status());
    for (k, v) in r.headers() {
        seen.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("")));
    }
    let b = r.into_body().collect().await.unwrap().to_bytes();
    seen.push_str(&String::from_utf8_lossy(&b));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_prompt_or_pii_in_logs_metrics_status_or_responses() {
    let worker = sim(&[
        "--port",
        "0",
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--profile",
        "tiny",
        "--speed",
        "50",
    ])
    .await;
    let provider = Fake::start().await;
    let dir = temp_dir("secrets");
    std::fs::write(dir.join("databricks.token"), fake_provider::OPENAI_KEY).unwrap();
    std::fs::write(
        dir.join("keys.txt"),
        format!("acme: {ACME_KEY}\nglobex: {GLOBEX_KEY}\n"),
    )
    .unwrap();
    let cluster =
        std::fs::read_to_string(root().join("testdata/policies/pii-stays-local/cluster.yaml"))
            .unwrap()
            .replace(
                r#"["10.0.0.1:8000", "10.0.0.2:8000"]"#,
                &format!(r#"["{}"]"#, worker.http),
            )
            .replace("kvEvents: { port: 5557 }", "metrics: { interval: 200ms }")
            .replace(
                "https://example.cloud.databricks.com/serving-endpoints",
                &format!("{}/v1", provider.url),
            )
            .replace(
                "secretRef: { name: databricks-token, key: token }",
                "file: databricks.token",
            );
    assert!(cluster.contains("kind: GatewayBackend"), "{cluster}");
    let cluster = cluster.replace(
        "  classifiers:",
        "  tenants:\n    apiKeys: { file: keys.txt }\n  classifiers:",
    );
    std::fs::write(dir.join("cluster.yaml"), cluster).unwrap();
    std::fs::copy(
        root().join("testdata/policies/pii-stays-local/policy.yaml"),
        dir.join("policy.yaml"),
    )
    .unwrap();

    let port = free_port();
    let admin_port = free_port();
    let log_path = dir.join("kinference.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kinference"))
        .args(["serve", "--config"])
        .arg(&dir)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args(["--log-format", "json"])
        .env("KINFERENCE_LOG", "debug")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let _guard = Kinference(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut ready = false;
    for _ in 0..200 {
        if get(&format!("http://{addr}/readyz")).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ready,
        "kinference did not become ready:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );

    let model = "llama-70b";
    let plain = json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": format!("{PROMPT_MARK}: what is a KV cache?")}]})
    .to_string();
    let pii = json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": format!("{PROMPT_MARK} mail {EMAIL} please")}]})
    .to_string();
    let streamed = json!({"model": model, "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": format!("{PROMPT_MARK} stream")}]})
    .to_string();
    let acme = format!("Bearer {ACME_KEY}");
    let wrong = format!("Bearer {WRONG_KEY}");
    let mut seen = String::new();
    for round in 0..6 {
        if round == 3 {
            // The provider starts failing: errors must not carry its credential either.
            *provider.mode.lock() = Mode::Fail500;
        }
        for (body, headers) in [
            (&plain, vec![("authorization", acme.as_str())]),
            (&pii, vec![("authorization", acme.as_str())]),
            (&streamed, vec![("x-api-key", GLOBEX_KEY)]),
            (&plain, vec![("authorization", wrong.as_str())]),
            (&plain, vec![("x-api-key", WRONG_KEY)]),
            (&plain, vec![]),
            (
                &format!("{{\"model\": \"{PROMPT_MARK}\", \"messages\": ["),
                vec![("authorization", acme.as_str())],
            ),
        ] {
            seen.push_str(&exchange(addr, "/v1/chat/completions", body, &headers).await);
            seen.push_str(&exchange(addr, "/v1/messages", body, &headers).await);
        }
    }
    // The traffic really happened: served, refused, provider used and failing.
    assert!(seen.contains("200 OK"), "{seen}");
    assert!(seen.contains("invalid_api_key"), "{seen}");
    assert!(
        !provider.requests.lock().is_empty(),
        "the provider was used: {}",
        &seen[..seen.len().min(3000)]
    );
    let provider_auth: Vec<String> = provider
        .requests
        .lock()
        .iter()
        .flat_map(|r| r.headers.iter().filter(|(k, _)| k == "authorization"))
        .map(|(_, v)| v.clone())
        .collect();
    assert!(
        provider_auth
            .iter()
            .all(|v| v.contains(fake_provider::OPENAI_KEY)),
        "the credential was sent to the provider (and only there)"
    );
    assert!(
        provider
            .requests
            .lock()
            .iter()
            .all(|r| !r.body.to_string().contains(EMAIL)),
        "PII never reached the provider"
    );

    // Tenant isolation: every tenant's usage is on /metrics, which clients cannot reach when
    // an admin listener is configured.
    assert_eq!(get(&format!("http://{addr}/metrics")).await.0, 404);
    assert_eq!(get(&format!("http://{addr}/admin/status")).await.0, 404);
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let (_, metrics) = get(&format!("http://{admin}/metrics")).await;
    let (_, status) = get(&format!("http://{admin}/admin/status")).await;
    assert!(
        metrics.contains("kinference_tenant_requests_total"),
        "{metrics}"
    );
    assert!(status.contains("\"policy\""), "{status}");
    // Give the log writer a moment, then read everything it wrote.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        logs.lines().count() > 20,
        "debug logging is on and wrote per-request lines:\n{logs}"
    );
    let _: Value = serde_json::from_str(logs.lines().next().unwrap()).unwrap();

    for (what, text) in [
        ("logs", &logs),
        ("/metrics", &metrics),
        ("/admin/status", &status),
        ("responses", &seen),
    ] {
        for secret in [
            ACME_KEY,
            GLOBEX_KEY,
            WRONG_KEY,
            fake_provider::OPENAI_KEY,
            EMAIL,
            // Distinctive fragments, in case a secret is truncated or split.
            "c0ffee-LEAKCHECK",
            "dead-LEAKCHECK",
        ] {
            assert!(!text.contains(secret), "{what} contain `{secret}`");
        }
        if what != "responses" {
            // The worker echoes nothing of the prompt, but a client may see its own prompt in
            // an error (a malformed body); the server's own outputs never carry it.
            assert!(!text.contains(PROMPT_MARK), "{what} contain prompt text");
        }
    }
}
