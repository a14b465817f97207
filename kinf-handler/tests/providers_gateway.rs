//! The seed's burst and PII policies through the gateway, with a live kinf-sim worker and fake
//! providers (Bedrock and an OpenAI-compatible Databricks endpoint) that check credentials and
//! SigV4 signatures: excess traffic bursts to Bedrock when the worker's queue is over the
//! policy's limit, to Databricks when Bedrock fails, and PII never leaves the cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/fake_provider.rs"]
mod fake_provider;
mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fake_provider::{Fake, Mode};
use serde_json::{Value, json};
use support::*;

async fn post(addr: SocketAddr, body: &Value) -> (u16, hyper::HeaderMap, Value) {
    post_json(addr, "/v1/chat/completions", body, &[]).await
}

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": "llama-70b", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": text}]})
}

/// The seed cluster with its worker set on `worker`, its providers on the fakes, and
/// credentials from files in `dir`.
fn cluster(dir: &std::path::Path, worker: &str, bedrock: &Fake, databricks: &Fake) -> String {
    std::fs::write(
        dir.join("bedrock.creds"),
        format!(
            "aws_access_key_id = {}\naws_secret_access_key = {}\n",
            fake_provider::AWS_ID,
            fake_provider::AWS_SECRET
        ),
    )
    .unwrap();
    std::fs::write(dir.join("databricks.token"), fake_provider::OPENAI_KEY).unwrap();
    std::fs::read_to_string(root().join("testdata/policies/burst-to-cloud/cluster.yaml"))
        .unwrap()
        .replace(
            r#"["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]"#,
            &format!(r#"["{worker}"]"#),
        )
        .replace(
            "kvEvents: { port: 5557, replayPort: 5558 }",
            "metrics: { interval: 200ms }",
        )
        .replace(
            "https://bedrock-runtime.us-east-1.amazonaws.com",
            &bedrock.url,
        )
        .replace(
            "region: us-east-1",
            &format!("region: {}", fake_provider::REGION),
        )
        .replace(
            "https://example.cloud.databricks.com/serving-endpoints",
            &format!("{}/v1", databricks.url),
        )
        .replace(
            "secretRef: { name: bedrock-credentials }",
            "file: bedrock.creds",
        )
        .replace(
            "secretRef: { name: databricks-token, key: token }",
            "file: databricks.token",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_bursts_to_bedrock_then_databricks_and_pii_stays_local() {
    let worker = sim(&[
        "--port",
        "0",
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--profile",
        "tiny",
        "--speed",
        "0.2",
        "--seed",
        "7",
    ])
    .await;
    let bedrock = Fake::start().await;
    let databricks = Fake::start().await;
    let dir = temp_dir("burst");
    std::fs::write(
        dir.join("cluster.yaml"),
        cluster(&dir, &worker.http.to_string(), &bedrock, &databricks),
    )
    .unwrap();
    std::fs::copy(
        root().join("testdata/policies/burst-to-cloud/policy.yaml"),
        dir.join("policy.yaml"),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;

    // Idle: served locally.
    let (s, h, v) = post(addr, &chat("hello", 2)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], worker.http.to_string().as_str());

    // Saturate the worker (8 running, the rest queued) straight from the side.
    let w = worker.http;
    let mut load = Vec::new();
    for _ in 0..14 {
        load.push(tokio::spawn(async move { post(w, &json!({"model": "meta-llama/Llama-3.3-70B-Instruct", "max_tokens": 400, "messages": [{"role": "user", "content": "busy"}]})).await }));
    }
    let queued = |gw: &kinf_handler::gateway::Gateway| {
        gw.state.with(|st| {
            let ws = st.worker_set("inference", "llama-workers").unwrap();
            ws.endpoints[0]
                .load
                .average(Duration::from_secs(30), st.now_ms)
                .queued_prompts
        })
    };
    assert!(
        eventually(Duration::from_secs(30), || queued(&gw) > 2.0).await,
        "the worker never looked saturated: {}",
        queued(&gw)
    );

    // Saturated: the excess goes to Bedrock (SigV4-signed, checked by the fake).
    let (s, h, v) = post(addr, &chat("hello again", 5)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], bedrock.url.as_str());
    assert!(
        bedrock.last().path.contains("/converse"),
        "{:?}",
        bedrock.last().path
    );
    assert_eq!(v["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(bedrock.auth_failures.load(Ordering::Relaxed), 0);

    // Bedrock down: Databricks (OpenAI-compatible, Bearer token) takes it.
    bedrock.set_mode(Mode::Fail500);
    let (s, h, v) = post(addr, &chat("and again", 5)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        h["x-kinference-endpoint"],
        format!("{}/v1", databricks.url).as_str()
    );
    assert_eq!(
        databricks.last().body["model"],
        "databricks-meta-llama-3-3-70b-instruct"
    );
    assert_eq!(databricks.auth_failures.load(Ordering::Relaxed), 0);
    for l in load {
        let _ = l.await;
    }
}

/// The seed PII bundle with its worker set on `worker`, Databricks on the fake (token from a
/// file) and, optionally, one more classifier (a YAML flow mapping).
fn pii_bundle(
    tag: &str,
    worker: SocketAddr,
    databricks: &Fake,
    extra_classifier: Option<&str>,
) -> std::path::PathBuf {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("databricks.token"), fake_provider::OPENAI_KEY).unwrap();
    let mut cluster =
        std::fs::read_to_string(root().join("testdata/policies/pii-stays-local/cluster.yaml"))
            .unwrap()
            .replace(
                r#"["10.0.0.1:8000", "10.0.0.2:8000"]"#,
                &format!(r#"["{worker}"]"#),
            )
            .replace("kvEvents: { port: 5557 }", "metrics: { interval: 200ms }")
            .replace(
                "https://example.cloud.databricks.com/serving-endpoints",
                &format!("{}/v1", databricks.url),
            )
            .replace(
                "secretRef: { name: databricks-token, key: token }",
                "file: databricks.token",
            );
    if let Some(c) = extra_classifier {
        cluster = cluster.replace(
            "  - { name: pii, type: Pii }",
            &format!("  - {{ name: pii, type: Pii }}\n  - {c}"),
        );
    }
    std::fs::write(dir.join("cluster.yaml"), cluster).unwrap();
    std::fs::copy(
        root().join("testdata/policies/pii-stays-local/policy.yaml"),
        dir.join("policy.yaml"),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pii_never_leaves_and_is_rejected_when_no_local_worker_can_take_it() {
    let worker = sim(&[
        "--port",
        "0",
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--profile",
        "tiny",
        "--speed",
        "20",
    ])
    .await;
    let databricks = Fake::start().await;
    let dir = pii_bundle("pii", worker.http, &databricks, None);
    let (gw, addr) = gateway(&dir).await;

    // No PII: the policy prefers the provider.
    let (s, h, v) = post(addr, &chat("What is a KV cache?", 5)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        h["x-kinference-endpoint"],
        format!("{}/v1", databricks.url).as_str()
    );
    let sent = databricks.requests.lock().len();

    // PII: served locally, never sent out.
    let pii = chat(
        "Card 4111 1111 1111 1111, SSN 123-45-6789. Summarize my account.",
        5,
    );
    let (s, h, v) = post(addr, &pii).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], worker.http.to_string().as_str());

    // PII only in what the model reads besides the messages' content: a tool call's
    // arguments, or a later prompt of a completions batch. Served locally all the same.
    let in_tool_call = json!({"model": "llama-70b", "max_tokens": 5, "messages": [
        {"role": "user", "content": "Look up my account."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"card\": \"4111 1111 1111 1111\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "user", "content": "Summarize it."}]});
    let (s, h, v) = post(addr, &in_tool_call).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], worker.http.to_string().as_str());
    let in_batch = json!({"model": "llama-70b", "max_tokens": 5,
        "prompt": ["What is a KV cache?", "SSN 123-45-6789, card 4111 1111 1111 1111"]});
    let (s, h, v) = post_json(addr, "/v1/completions", &in_batch, &[]).await;
    assert_eq!(
        h["x-kinference-endpoint"],
        worker.http.to_string().as_str(),
        "{s} {v}"
    );
    assert_eq!(
        databricks.requests.lock().len(),
        sent,
        "a PII request reached the provider"
    );

    // The local worker goes away: PII is rejected (fail closed), still never sent out.
    worker.stop();
    gw.state.with(|st| {
        for ws in st.worker_sets.values_mut() {
            for i in 0..ws.endpoints.len() {
                ws.set_ready(i, false);
            }
        }
    });
    let (s, _, v) = post(addr, &pii).await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "policy_rejected");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("serve"),
        "{v}"
    );
    assert_eq!(
        databricks.requests.lock().len(),
        sent,
        "a PII request reached the provider"
    );
}

/// The seed PII policy with an External classifier that times out, under concurrent load: the
/// classifier fails closed (its failure tag is `pii-detected`), so no request reaches the
/// provider; all are served locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_classifier_timing_out_fails_closed_under_load() {
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
    let databricks = Fake::start().await;
    // A classifier that never answers in time.
    let classifier = {
        let app = axum::Router::new().route(
            "/classify",
            axum::routing::post(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                axum::Json(json!({"tags": []}))
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        addr
    };
    let external = format!(
        "{{ name: dlp, type: External, url: \"http://{classifier}/classify\", tags: [pii-detected], timeout: 50ms, failureMode: FailClosed, failureTag: pii-detected }}"
    );
    let dir = pii_bundle("pii-ext", worker.http, &databricks, Some(&external));
    let (_gw, addr) = gateway(&dir).await;
    let mut load = Vec::new();
    for i in 0..24 {
        load.push(tokio::spawn(async move {
            post(addr, &chat(&format!("What is a KV cache? ({i})"), 3)).await
        }));
    }
    for l in load {
        let (s, h, v) = l.await.unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            h["x-kinference-endpoint"],
            worker.http.to_string().as_str(),
            "a request the classifier could not clear left the cluster"
        );
    }
    assert!(
        databricks.requests.lock().is_empty(),
        "the provider received a request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_stream_cut_short_is_accounted_with_its_whole_prompt_uncached() {
    let worker = sim(&[
        "--port",
        "0",
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--profile",
        "tiny",
    ])
    .await;
    let databricks = Fake::start().await;
    *databricks.mode.lock() = Mode::DieMidStream;
    let dir = pii_bundle("provider-cut", worker.http, &databricks, None);
    let (gw, addr) = gateway(&dir).await;
    let mut body = chat("What is a KV cache?", 5);
    body["stream"] = json!(true);
    let (s, h, raw) = post_raw(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(
        h["x-kinference-endpoint"],
        format!("{}/v1", databricks.url).as_str()
    );
    assert!(String::from_utf8_lossy(&raw).contains("\"error\""));
    let value = |kind: &'static str| {
        gw.metrics.value(
            "kinference_tenant_tokens_total",
            &[
                ("tenant", "anonymous"),
                ("model", "llama-70b"),
                ("destination", "databricks"),
                ("destination_namespace", "inference"),
                ("kind", kind),
            ],
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || value("uncached_prompt")
            .is_some())
        .await,
        "the cut stream is accounted"
    );
    // A provider holds nothing of the prompt for us: the estimate charges it all as uncached.
    assert!(value("uncached_prompt").unwrap() > 0.0);
    assert_eq!(value("cached_prompt").unwrap_or(0.0), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_provider_fails_the_client_gets_the_last_providers_error() {
    // No local worker can take it (nothing listens there), so the seed's rule goes to its
    // providers, Bedrock then Databricks.
    let dead = format!("127.0.0.1:{}", free_port());
    let bedrock = Fake::start().await;
    let databricks = Fake::start().await;
    let dir = temp_dir("all-fail");
    std::fs::write(
        dir.join("cluster.yaml"),
        cluster(&dir, &dead, &bedrock, &databricks),
    )
    .unwrap();
    std::fs::copy(
        root().join("testdata/policies/burst-to-cloud/policy.yaml"),
        dir.join("policy.yaml"),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;

    // Both rate-limited: the client gets the provider's 429 and its own retry-after, not a
    // policy rejection telling it to come back in a second.
    bedrock.set_mode(Mode::Fail429(7));
    databricks.set_mode(Mode::Fail429(7));
    let (s, h, v) = post(addr, &chat("hello", 5)).await;
    assert_eq!(s, 429, "{v}");
    assert_eq!(v["error"]["code"], "provider_rate_limited", "{v}");
    assert_eq!(h["retry-after"], "7");
    assert!(
        !databricks.requests.lock().is_empty(),
        "Databricks was tried after Bedrock"
    );
    // Accounted against the first destination tried (the unreachable local worker set), with
    // the code sent.
    assert_eq!(
        gw.metrics.value(
            "kinference_tenant_requests_total",
            &[
                ("tenant", "anonymous"),
                ("model", "llama-70b"),
                ("destination", "llama-workers"),
                ("destination_namespace", "inference"),
                ("outcome", "upstream_error"),
                ("code", "provider_rate_limited"),
            ]
        ),
        Some(1.0)
    );

    // Both failing: the last one's 502.
    bedrock.set_mode(Mode::Fail500);
    databricks.set_mode(Mode::Fail500);
    let (s, _, v) = post(addr, &chat("hello again", 5)).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["code"], "provider_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("answered 500"),
        "{v}"
    );
}

/// A request the provider's protocol cannot carry (`n` > 1 to Bedrock) is refused before
/// anything is sent: 400 naming the field, and its token reservation given back (it used
/// nothing). Before, the reservation stayed charged, so a second such request got 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untranslatable_request_names_its_field_and_is_not_charged() {
    let bedrock = Fake::start().await;
    let dir = temp_dir("untranslatable");
    std::fs::write(
        dir.join("bedrock.creds"),
        format!(
            "aws_access_key_id = {}\naws_secret_access_key = {}\n",
            fake_provider::AWS_ID,
            fake_provider::AWS_SECRET
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: bedrock, namespace: t }}
spec:
  type: Bedrock
  url: {url}
  region: {region}
  credentials: {{ file: bedrock.creds }}
  models:
  - {{ name: llama-70b, providerModel: meta.llama3-3-70b-instruct-v1:0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceProvider, name: bedrock }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p, namespace: t }}
spec:
  rules:
  - name: cloud
    route:
      select: [ {{ type: Provider, order: [bedrock] }} ]
  limits:
  - name: budget
    tokensPerMinute: 200
"#,
            url = bedrock.url,
            region = fake_provider::REGION,
        ),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    // Each reserves its prompt plus 2 × 60 of the 200 tokens: a second would not fit if the
    // first stayed charged. (A request over the whole 200 would be refused as too large.)
    let mut body = chat("hello", 60);
    body["n"] = json!(2);
    for attempt in 0..3 {
        let (s, _, v) = post(addr, &body).await;
        assert_eq!(s, 400, "attempt {attempt}: {v}");
        assert_eq!(v["error"]["code"], "provider_untranslatable", "{v}");
        assert_eq!(v["error"]["param"], "n", "{v}");
    }
    assert!(bedrock.requests.lock().is_empty(), "nothing was sent");
    // The budget is whole: a translatable request goes through.
    let (s, _, v) = post(addr, &chat("hello", 60)).await;
    assert_eq!(s, 200, "{v}");
}

/// An OpenAI-type provider with `maxTokensField: max_completion_tokens` (OpenAI's o-series and
/// gpt-5 refuse `max_tokens`): an Anthropic client's request is translated with its limit in
/// `max_completion_tokens`, and an OpenAI client's `max_tokens` is moved there. Before, both
/// reached the provider as `max_tokens` (and the field was refused as unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_provider_gets_the_token_limit_in_its_configured_field() {
    let openai = Fake::start().await;
    let dir = temp_dir("max-tokens-field");
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
  maxTokensField: max_completion_tokens
  models:
  - {{ name: llama-70b, providerModel: gpt-5 }}
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

    let (s, _, v) = post_json(addr, "/v1/messages", &chat("hello", 60), &[]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["content"][0]["text"], "Hello world", "{v}");
    let got = openai.last().body;
    assert_eq!(got["model"], "gpt-5", "{got}");
    assert_eq!(got["max_completion_tokens"], 60, "{got}");
    assert!(got.get("max_tokens").is_none(), "{got}");

    let (s, _, v) = post(addr, &chat("hello", 70)).await;
    assert_eq!(s, 200, "{v}");
    let got = openai.last().body;
    assert_eq!(got["max_completion_tokens"], 70, "{got}");
    assert!(got.get("max_tokens").is_none(), "{got}");
}

/// Rotating a provider's key by editing only its `credentials.file` (no YAML change) takes
/// effect at the next reloads, as an API key file's edit does: the file's content is part of
/// the policy (a new generation), and the provider pool is rebuilt with the new key. Before,
/// the old key stayed in use until the YAML changed or the process restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_provider_key_file_takes_effect_without_a_yaml_change() {
    let openai = Fake::start().await;
    let dir = temp_dir("provider-key-rotation");
    std::fs::write(dir.join("openai.token"), "sk-expired-key-000\n").unwrap();
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
  - {{ name: llama-70b, providerModel: gpt-5 }}
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
    let (gw, addr) = gateway(&dir).await;
    let every = Duration::from_millis(100);
    let last = kinf_handler::serve::reload(&gw, &dir, None, &kinf_handler::live_hook());
    let _watcher = kinf_handler::serve::watch_directory(
        gw.clone(),
        dir.clone(),
        every,
        last,
        kinf_handler::live_hook(),
    );
    let generation = gw.store.current().unwrap().generation;

    let (s, _, v) = post(addr, &chat("hello", 8)).await;
    assert_ne!(s, 200, "the expired key is refused by the provider: {v}");

    std::fs::write(dir.join("openai.token"), fake_provider::OPENAI_KEY).unwrap();
    let mut ok = false;
    for _ in 0..100 {
        let (s, _, _) = post(addr, &chat("hello", 8)).await;
        if s == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(every).await;
    }
    assert!(ok, "the rotated key is still not in use after 100 tries");
    assert_eq!(
        openai
            .last()
            .headers
            .iter()
            .find(|(k, _)| k == "authorization"),
        Some(&(
            "authorization".to_string(),
            format!("Bearer {}", fake_provider::OPENAI_KEY)
        ))
    );
    assert!(
        gw.store.current().unwrap().generation > generation,
        "the key file's edit is a new generation"
    );
}

/// An OpenAI-type provider (`openai`, serving `llama-70b` and `solo`) and a Bedrock one
/// (`bedrock`, serving `llama-70b`), tried in that order, with credentials in `dir`.
fn openai_then_bedrock(dir: &std::path::Path, openai: &Fake, bedrock: &Fake) -> String {
    std::fs::write(dir.join("openai.token"), fake_provider::OPENAI_KEY).unwrap();
    std::fs::write(
        dir.join("bedrock.creds"),
        format!(
            "aws_access_key_id = {}\naws_secret_access_key = {}\n",
            fake_provider::AWS_ID,
            fake_provider::AWS_SECRET
        ),
    )
    .unwrap();
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: openai, namespace: t }}
spec:
  type: OpenAI
  url: {openai}/v1
  credentials: {{ file: openai.token }}
  models:
  - {{ name: llama-70b, providerModel: gpt-4.1 }}
  - {{ name: solo, providerModel: gpt-4.1 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: bedrock, namespace: t }}
spec:
  type: Bedrock
  url: {bedrock}
  region: {region}
  credentials: {{ file: bedrock.creds }}
  models:
  - {{ name: llama-70b, providerModel: us.anthropic.claude-sonnet-4-20250514-v1:0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations:
  - {{ kind: InferenceProvider, name: openai }}
  - {{ kind: InferenceProvider, name: bedrock }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p, namespace: t }}
spec:
  rules:
  - name: cloud
    route:
      select: [ {{ type: Provider, order: [openai, bedrock] }} ]
"#,
        openai = openai.url,
        bedrock = bedrock.url,
        region = fake_provider::REGION,
    )
}

/// An Anthropic client's stream translated from OpenAI's: `message_start` carries the
/// gateway's prompt estimate (it said 0: the provider's counts come only in its last chunk),
/// `message_delta` the provider's counts (what an SDK's final message takes), and the tenant
/// is charged the provider's counts, not the estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_anthropic_stream_reports_an_estimate_first_and_the_providers_usage_last() {
    let openai = Fake::start().await;
    let bedrock = Fake::start().await;
    let dir = temp_dir("translated-usage");
    std::fs::write(
        dir.join("c.yaml"),
        openai_then_bedrock(&dir, &openai, &bedrock),
    )
    .unwrap();
    let (gw, addr) = gateway(&dir).await;
    let mut body = chat("What is a KV cache? Answer in one sentence, please.", 20);
    body["stream"] = json!(true);
    let (s, h, raw) = post_raw(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(
        h["x-kinference-endpoint"],
        format!("{}/v1", openai.url).as_str()
    );
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let event = |name: &str| -> Value {
        raw.split("\n\n")
            .find_map(|ev| ev.strip_prefix(&format!("event: {name}\ndata: ")))
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_else(|| panic!("no {name}: {raw}"))
    };
    let estimate = event("message_start")["message"]["usage"]["input_tokens"].clone();
    assert!(estimate.as_u64().is_some_and(|n| n > 0), "{raw}");
    // The fake's usage: 12 prompt tokens, 4 of them cached, 2 output tokens.
    assert_eq!(
        event("message_delta")["usage"],
        json!({"input_tokens": 8, "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 0, "output_tokens": 2}),
        "{raw}"
    );
    let value = |kind: &'static str| {
        gw.metrics.value(
            "kinference_tenant_tokens_total",
            &[
                ("tenant", "anonymous"),
                ("model", "llama-70b"),
                ("destination", "openai"),
                ("destination_namespace", "t"),
                ("kind", kind),
            ],
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || value("output").is_some()).await,
        "the stream is accounted"
    );
    assert_eq!(
        (
            value("uncached_prompt"),
            value("cached_prompt"),
            value("output")
        ),
        (Some(8.0), Some(4.0), Some(2.0))
    );
}

/// More `stop_sequences` than OpenAI takes: the OpenAI-type provider is skipped before
/// anything is sent and the next one (Bedrock) serves the request; where no other provider
/// serves the model, the client's 400 names `stop_sequences`. Before, OpenAI's own 400 came
/// back (`provider_rejected`, no fall-through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_openai_cannot_take_move_on_to_the_next_provider() {
    let openai = Fake::start().await;
    let bedrock = Fake::start().await;
    let dir = temp_dir("too-many-stops");
    std::fs::write(
        dir.join("c.yaml"),
        openai_then_bedrock(&dir, &openai, &bedrock),
    )
    .unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let stops = json!(["A1", "A2", "A3", "A4", "A5"]);
    let mut body = chat("hello", 20);
    body["stop_sequences"] = stops.clone();
    let (s, h, v) = post_json(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], bedrock.url.as_str());
    assert_eq!(v["content"][0]["text"], "Hello world", "{v}");
    assert_eq!(
        bedrock.last().body["inferenceConfig"]["stopSequences"],
        stops
    );
    assert!(openai.requests.lock().is_empty(), "OpenAI got the request");

    body["model"] = json!("solo");
    let (s, _, v) = post_json(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("`stop_sequences`")),
        "{v}"
    );
    assert!(openai.requests.lock().is_empty(), "OpenAI got the request");
}
