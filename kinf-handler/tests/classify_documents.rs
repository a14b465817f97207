//! The seed's "PII never leaves the cluster" policy through the gateway, for PII that an
//! Anthropic client sends only inside a `document` (or `search_result`) block: classified as
//! the same text in a plain message is, so it stays on the local worker set and never reaches
//! the Anthropic provider. Before, a document's text reached no classifier, and such a request
//! went to the provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/fake_provider.rs"]
mod fake_provider;
mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use fake_provider::Fake;
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::*;

/// A local worker answering `/v1/messages`, recording the bodies it gets.
async fn worker(seen: Arc<Mutex<Vec<Value>>>) -> SocketAddr {
    let app = Router::new().route(
        "/v1/messages",
        post(move |body: Bytes| {
            let seen = seen.clone();
            async move {
                seen.lock().push(serde_json::from_slice(&body).unwrap());
                axum::Json(json!({
                    "id": "msg_1", "type": "message", "role": "assistant", "model": "org/tiny",
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 5, "output_tokens": 1}
                }))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// The seed PII policy (testdata/policies/pii-stays-local) with a provider of type `ptype`
/// (`Anthropic`, `OpenAI`): the provider first, and no provider for a request tagged
/// `pii-detected`.
fn bundle(dir: &std::path::Path, worker: SocketAddr, provider: &Fake, ptype: &str) {
    let (key, url) = match ptype {
        "OpenAI" => (fake_provider::OPENAI_KEY, format!("{}/v1", provider.url)),
        _ => (fake_provider::ANTHROPIC_KEY, provider.url.clone()),
    };
    std::fs::write(dir.join("provider.key"), key).unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: workers, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models:
  - name: org/tiny
    aliases: [tiny]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud, namespace: t }}
spec:
  type: {ptype}
  url: {url}
  credentials: {{ file: provider.key }}
  models:
  - {{ name: tiny, providerModel: claude-tiny }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations:
  - {{ kind: InferenceWorkerSet, name: workers }}
  - {{ kind: InferenceProvider, name: cloud }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: front-door, namespace: t }}
spec:
  pool: pool
  classifiers:
  - {{ name: pii, type: Pii }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: pii-stays-local, namespace: t }}
spec:
  rules:
  - name: serve
    route:
      exclude:
      - name: pii-never-leaves-cluster
        if: {{ tag: pii-detected }}
        drop: {{ backend: {{ type: Provider }} }}
      select:
      - {{ type: Provider, order: [cloud] }}
      - {{ type: Local, minimize: PredictedTTFT }}
      onEmpty: Reject
"#
        ),
    )
    .unwrap();
}

fn messages(content: Value) -> Value {
    json!({"model": "tiny", "max_tokens": 5,
           "messages": [{"role": "user", "content": content}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pii_only_inside_a_document_block_stays_local_like_pii_in_text() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let local = worker(seen.clone()).await;
    let provider = Fake::start().await;
    let dir = temp_dir("pii-documents");
    bundle(&dir, local, &provider, "Anthropic");
    let (_gw, addr) = gateway(&dir).await;
    let send = |body: Value| async move {
        let (s, h, v) = post_json(addr, "/v1/messages", &body, &[]).await;
        assert_eq!(s, 200, "{body}: {v}");
        h["x-kinference-endpoint"].to_str().unwrap().to_owned()
    };
    let to_local = local.to_string();
    let to_provider = provider.url.clone();

    // Without PII, the provider; with it in plain text, the local worker set.
    let clean = "Summarize this record.";
    assert_eq!(send(messages(json!(clean))).await, to_provider);
    let ssn = "Employee SSN 123-45-6789, hired 2019.";
    let email = "Contact: jane.doe@example.com";
    assert_eq!(send(messages(json!(ssn))).await, to_local);
    assert_eq!(send(messages(json!(email))).await, to_local);
    let sent = provider.requests.lock().len();

    // The same PII only inside a document block: routed the same way.
    let text_source = |data: &str| {
        json!({"type": "document", "title": "Record",
               "source": {"type": "text", "media_type": "text/plain", "data": data}})
    };
    let with_pii = [
        messages(json!([{"type": "text", "text": clean}, text_source(ssn)])),
        messages(json!([{"type": "text", "text": clean},
            {"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": email}]}}])),
        messages(json!([{"type": "text", "text": clean},
            {"type": "document", "source": {"type": "content", "content": email}}])),
        // In a document's title or context, in a search result, in a tool result's document.
        messages(json!([{"type": "document", "title": email,
            "source": {"type": "url", "url": "https://example.com/a.pdf"}}])),
        messages(json!([{"type": "document", "context": ssn,
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}}])),
        messages(
            json!([{"type": "search_result", "source": "https://example.com/hr",
            "title": "HR", "content": [{"type": "text", "text": ssn}]}]),
        ),
        json!({"model": "tiny", "max_tokens": 5, "messages": [
            {"role": "user", "content": "Fetch the record."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "fetch", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [text_source(ssn)]}]}]}),
    ];
    for body in with_pii {
        assert_eq!(send(body.clone()).await, to_local, "{body}");
        // Forwarded as the client sent it (only `model` changed).
        let got = seen.lock().last().cloned().unwrap();
        assert_eq!(got["messages"], body["messages"]);
    }
    assert_eq!(
        provider.requests.lock().len(),
        sent,
        "a request with PII in a document reached the provider"
    );

    // A document without PII, or without text here (a PDF, a URL), is no reason to stay.
    assert_eq!(
        send(messages(json!([text_source("The quarterly plan.")]))).await,
        to_provider
    );
    assert_eq!(
        send(messages(json!([{"type": "text", "text": clean},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                "data": "JVBERi0xLjQ="}}])))
        .await,
        to_provider
    );

    // A document of the wrong shape: 400 in Anthropic's shape, naming the member.
    let (s, _, v) = post_json(
        addr,
        "/v1/messages",
        &messages(json!([{"type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": 123}}])),
        &[],
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`messages[0].content[0].source.data` must be a string"),
        "{v}"
    );
}

/// A document block the PII policy lets out, to a provider of another protocol (OpenAI): not
/// translated (the canonical form is text messages; a document's title, context and
/// citations have no faithful OpenAI form), as an image is not: the provider is passed over
/// for the next candidate, and with none left the client gets a 400 naming the block. Never
/// sent with the document silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_block_is_not_translated_for_another_protocols_provider() {
    let local = worker(Arc::new(Mutex::new(Vec::new()))).await;
    let provider = Fake::start().await;
    let dir = temp_dir("documents-untranslatable");
    bundle(&dir, local, &provider, "OpenAI");
    let (gw, addr) = gateway(&dir).await;
    let body = messages(json!([{"type": "text", "text": "Summarize this."},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
            "data": "The quarterly plan."}}]));
    // The provider cannot take it: the local worker set, next in the policy, does.
    let (s, h, v) = post_json(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-endpoint"], local.to_string().as_str());
    assert!(provider.requests.lock().is_empty(), "nothing was sent");
    // Text alone is translated and sent.
    let (s, h, v) = post_json(
        addr,
        "/v1/messages",
        &messages(json!("Summarize this.")),
        &[],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        h["x-kinference-endpoint"],
        format!("{}/v1", provider.url).as_str()
    );
    // Without the local worker set, the provider is the only candidate: 400 in Anthropic's
    // shape naming the block, and nothing sent.
    gw.state.with(|st| {
        for ws in st.worker_sets.values_mut() {
            for i in 0..ws.endpoints.len() {
                ws.set_ready(i, false);
            }
        }
    });
    let sent = provider.requests.lock().len();
    let (s, _, v) = post_json(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "Anthropic shape: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("`messages[0].content[1].type`: content parts of type `document`"),
        "{v}"
    );
    assert_eq!(provider.requests.lock().len(), sent, "nothing was sent");
}
