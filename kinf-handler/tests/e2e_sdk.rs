//! The official OpenAI and Anthropic Python SDKs through the gateway, on the quick-start
//! configuration (deploy/quickstart) with three in-process kinf-sim workers; and the same SDKs
//! straight at a kinf-sim worker. Needs `KINF_E2E_PYTHON`: a Python with `openai` and
//! `anthropic` (scripts/setup-python.sh).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/fake_provider.rs"]
mod fake_provider;
mod support;

use std::process::Command;

use support::*;

fn run_python(python: &str, script: &str, arg: &str) {
    let out = Command::new(python)
        .arg(root().join(script))
        .arg(arg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_through_the_gateway() {
    let Some(python) = required_env(
        "KINF_E2E_PYTHON",
        "a Python with the openai and anthropic SDKs",
    ) else {
        return;
    };
    let tok = root().join("testdata/tokenizers/tiny-llama");
    let tok = tok.to_str().unwrap();
    let mut sims = Vec::new();
    for (name, seed) in [
        ("Qwen/Qwen3.6-27B", "1"),
        ("Qwen/Qwen3.6-27B", "2"),
        ("zai-org/GLM-5.3", "3"),
    ] {
        sims.push(
            sim(&[
                "--port",
                "0",
                "--model",
                name,
                "--kv-events-port",
                "0",
                "--replay-port",
                "0",
                "--profile",
                "l40s-qwen27b-fp8",
                "--speed",
                "20",
                "--tokenizer",
                tok,
                "--block-size",
                "32",
                "--seed",
                seed,
            ])
            .await,
        );
    }
    // The quick-start configuration with the workers' actual addresses.
    let dir = temp_dir("sdk");
    let workers = std::fs::read_to_string(root().join("deploy/quickstart/workers.yaml"))
        .unwrap()
        .replace("127.0.0.1:18001", &sims[0].http.to_string())
        .replace("127.0.0.1:18002", &sims[1].http.to_string())
        .replace("127.0.0.1:18003", &sims[2].http.to_string())
        .replace("../../testdata/tokenizers/tiny-llama", tok);
    std::fs::write(dir.join("workers.yaml"), workers).unwrap();
    std::fs::copy(
        root().join("deploy/quickstart/policy.yaml"),
        dir.join("policy.yaml"),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;
    let base = format!("http://{addr}");
    let py = python.clone();
    tokio::task::spawn_blocking(move || run_python(&py, "scripts/e2e/sdk_check.py", &base))
        .await
        .unwrap();
    // The gateway learned from what it saw: tokens accounted, TTFTs observed.
    let mut m = String::new();
    gw.metrics.render(&mut m);
    assert!(m.contains("kinference_tokens_total{"), "{m}");
    assert!(m.contains("kinference_upstream_ttft_seconds_count{"), "{m}");

    // The SDKs straight at one worker.
    let direct = format!("http://{}", sims[2].http);
    tokio::task::spawn_blocking(move || {
        run_python(&python, "scripts/e2e/sim_sdk_check.py", &direct)
    })
    .await
    .unwrap();
}

/// The official Anthropic SDK through the gateway to an OpenAI-type provider (the tests' fake
/// provider), so that every answer is translated: a stream's final message has the provider's
/// usage (it had 0 input tokens when only `message_start` carried them), and more stop
/// sequences than OpenAI takes are refused naming `stop_sequences`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_through_a_translating_provider() {
    let Some(python) = required_env("KINF_E2E_PYTHON", "a Python with the anthropic SDK") else {
        return;
    };
    let openai = fake_provider::Fake::start().await;
    let dir = temp_dir("sdk-translated");
    std::fs::write(dir.join("openai.token"), fake_provider::OPENAI_KEY).unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: openai, namespace: t }}
spec:
  type: OpenAI
  url: {url}/v1
  credentials: {{ file: openai.token }}
  models:
  - {{ name: cloud, providerModel: gpt-4.1 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceProvider, name: openai }} ]
"#,
            url = openai.url,
        ),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let base = format!("http://{addr}");
    tokio::task::spawn_blocking(move || {
        run_python(&python, "scripts/e2e/sdk_translated_check.py", &base)
    })
    .await
    .unwrap();
    assert_eq!(
        openai.requests.lock().len(),
        2,
        "the refused request was not sent"
    );
}
