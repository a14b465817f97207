//! Provider clients against the fake provider: every client→provider protocol pair, plain and
//! streamed; auth and SigV4 checked by the fake; timeouts, breaker, concurrency, redaction.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/fake_provider.rs"]
mod fake_provider;

use std::sync::Arc;
use std::time::Duration;

use fake_provider::{Fake, Mode};
use futures_util::StreamExt;
use kinf_handler::gateway::errors::Api;
use kinf_handler::providers::credentials::StandaloneCredentials;
use kinf_handler::providers::health::BreakerState;
use kinf_handler::providers::{PoolOptions, ProviderErrorKind, ProviderPool, ProviderResponse};
use kinf_lang::compiled::{CredentialRef, ProviderInfo};
use kinf_policy::{MaxTokensField, ProviderType};
use kinf_router::usage::TokenUsage;
use serde_json::{Map, Value, json};

const EXPECTED: TokenUsage = TokenUsage {
    cached_prompt_tokens: 4,
    uncached_prompt_tokens: 8,
    cache_write_prompt_tokens: 0,
    output_tokens: 2,
};

fn secret_file(name: &str, content: &str) -> Arc<str> {
    let p = std::env::temp_dir().join(format!("kinf-prov-{}-{name}", std::process::id()));
    std::fs::write(&p, content).unwrap();
    p.to_string_lossy().into()
}

fn info(fake: &Fake, protocol: ProviderType, timeout: Duration, max: Option<u32>) -> ProviderInfo {
    let creds = match protocol {
        ProviderType::OpenAI => secret_file("openai", &format!("{}\n", fake_provider::OPENAI_KEY)),
        ProviderType::Anthropic => secret_file("anthropic", fake_provider::ANTHROPIC_KEY),
        ProviderType::Bedrock => secret_file(
            "aws",
            &format!(
                "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
                fake_provider::AWS_ID,
                fake_provider::AWS_SECRET
            ),
        ),
    };
    ProviderInfo {
        protocol,
        url: if protocol == ProviderType::OpenAI {
            format!("{}/v1", fake.url).into()
        } else {
            fake.url.clone().into()
        },
        region: Some(fake_provider::REGION.into()),
        timeout,
        max_concurrency: max,
        expected_ttft: Duration::from_millis(500),
        credentials: Some(CredentialRef::File(creds)),
        max_tokens_field: None,
    }
}

fn pool_of(infos: Vec<(&str, ProviderInfo)>, opts: PoolOptions) -> ProviderPool {
    ProviderPool::from_providers(
        infos
            .into_iter()
            .map(|(n, i)| (Arc::from("ns"), Arc::from(n), i)),
        &StandaloneCredentials,
        &opts,
        None,
    )
}

fn client_body(api: Api, stream: bool, include_usage: bool) -> Map<String, Value> {
    let mut v = match api {
        Api::Messages => json!({
            "model": "client-model", "max_tokens": 50, "system": "be brief",
            "messages": [{"role": "user", "content": "Say hello"}],
        }),
        Api::Chat => json!({
            "model": "client-model", "max_tokens": 50,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hello"}],
        }),
        Api::Completions => {
            json!({"model": "client-model", "prompt": "Say hello", "max_tokens": 50})
        }
    };
    if stream {
        v["stream"] = json!(true);
        if include_usage {
            v["stream_options"] = json!({"include_usage": true});
        }
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

async fn read_all(r: ProviderResponse) -> (String, kinf_handler::providers::ProviderOutcome) {
    let mut body = r.body;
    let mut s = String::new();
    while let Some(c) = body.next().await {
        s.push_str(&String::from_utf8_lossy(&c.unwrap()));
    }
    drop(body);
    (s, r.outcome.await.unwrap())
}

/// The text of a client-shaped body (JSON or SSE).
fn text_of(api: Api, body: &str, stream: bool) -> String {
    if !stream {
        let v: Value = serde_json::from_str(body).unwrap();
        return match api {
            Api::Chat => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .into(),
            Api::Completions => v["choices"][0]["text"].as_str().unwrap().into(),
            Api::Messages => v["content"][0]["text"].as_str().unwrap().into(),
        };
    }
    let mut out = String::new();
    for line in body.lines() {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).unwrap();
        let t = match api {
            Api::Chat => v.pointer("/choices/0/delta/content"),
            Api::Completions => v.pointer("/choices/0/text"),
            Api::Messages => v.pointer("/delta/text"),
        };
        if let Some(t) = t.and_then(Value::as_str) {
            out.push_str(t);
        }
    }
    out
}

#[tokio::test]
async fn every_protocol_pair_plain_and_streamed() {
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let pool = pool_of(
        vec![
            ("openai", info(&fake, ProviderType::OpenAI, t, None)),
            ("anthropic", info(&fake, ProviderType::Anthropic, t, None)),
            ("bedrock", info(&fake, ProviderType::Bedrock, t, None)),
        ],
        PoolOptions::default(),
    );
    for provider in ["openai", "anthropic", "bedrock"] {
        for api in [Api::Chat, Api::Messages, Api::Completions] {
            for stream in [false, true] {
                let ctx = format!("{api:?} -> {provider} stream={stream}");
                let r = pool
                    .forward(
                        &format!("ns/{provider}"),
                        api,
                        client_body(api, stream, false),
                        "provider-model:v1",
                        stream,
                        false,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let (body, outcome) = read_all(r).await;
                assert_eq!(text_of(api, &body, stream), "Hello world", "{ctx}: {body}");
                assert_eq!(outcome.usage, Some(EXPECTED), "{ctx}: usage");
                assert!(outcome.completed, "{ctx}");
                if stream {
                    assert!(outcome.ttft_s.is_some(), "{ctx}");
                    if api != Api::Messages {
                        assert!(body.ends_with("data: [DONE]\n\n"), "{ctx}: {body}");
                        assert!(
                            !body.contains("\"usage\""),
                            "{ctx}: usage chunk not stripped: {body}"
                        );
                    } else {
                        assert!(body.contains("event: message_stop"), "{ctx}");
                    }
                }
                let last = fake.last();
                match provider {
                    "bedrock" => {
                        let suffix = if stream {
                            "converse-stream"
                        } else {
                            "converse"
                        };
                        assert_eq!(
                            last.path,
                            format!("/model/provider-model%3Av1/{suffix}"),
                            "{ctx}"
                        );
                        if api != Api::Completions {
                            assert_eq!(last.body["system"][0]["text"], "be brief", "{ctx}");
                        }
                    }
                    _ => assert_eq!(last.body["model"], "provider-model:v1", "{ctx}"),
                }
                if provider == "openai" && stream {
                    assert_eq!(last.body["stream_options"]["include_usage"], true, "{ctx}");
                }
            }
        }
    }
    assert_eq!(
        fake.auth_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "every request passed the fake's auth / SigV4 check"
    );
    let snap = pool.state_snapshot();
    assert!(
        snap.iter()
            .all(|(_, s)| s.ready && s.in_flight == 0 && s.ttft_s.is_some())
    );
}

/// `spec.maxTokensField` of an OpenAI-type provider: a request translated to OpenAI's shape
/// carries its output token limit in that field (`max_tokens` when unset), and an OpenAI chat
/// client's request has its limit moved there when it is set (passed through as sent when
/// unset). The legacy completions API has only `max_tokens`.
#[tokio::test]
async fn the_token_limit_goes_in_the_field_the_provider_takes() {
    use MaxTokensField::{MaxCompletionTokens, MaxTokens};
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let with = |field| ProviderInfo {
        max_tokens_field: field,
        ..info(&fake, ProviderType::OpenAI, t, None)
    };
    let pool = pool_of(
        vec![
            ("unset", with(None)),
            ("plain", with(Some(MaxTokens))),
            ("completion", with(Some(MaxCompletionTokens))),
        ],
        PoolOptions::default(),
    );
    // Provider, client API, the client's limit fields, the fields the provider received.
    let cases = [
        (
            "unset",
            Api::Messages,
            json!({"max_tokens": 50}),
            json!({"max_tokens": 50}),
        ),
        (
            "plain",
            Api::Messages,
            json!({"max_tokens": 50}),
            json!({"max_tokens": 50}),
        ),
        (
            "completion",
            Api::Messages,
            json!({"max_tokens": 50}),
            json!({"max_completion_tokens": 50}),
        ),
        (
            "unset",
            Api::Chat,
            json!({"max_tokens": 50}),
            json!({"max_tokens": 50}),
        ),
        (
            "unset",
            Api::Chat,
            json!({"max_completion_tokens": 40}),
            json!({"max_completion_tokens": 40}),
        ),
        (
            "completion",
            Api::Chat,
            json!({"max_tokens": 50}),
            json!({"max_completion_tokens": 50}),
        ),
        (
            "completion",
            Api::Chat,
            json!({"max_completion_tokens": 40}),
            json!({"max_completion_tokens": 40}),
        ),
        // Both: the limit the gateway admitted the request with (`max_completion_tokens`).
        (
            "completion",
            Api::Chat,
            json!({"max_tokens": 50, "max_completion_tokens": 40}),
            json!({"max_completion_tokens": 40}),
        ),
        (
            "plain",
            Api::Chat,
            json!({"max_tokens": 50, "max_completion_tokens": 40}),
            json!({"max_tokens": 40}),
        ),
        (
            "plain",
            Api::Chat,
            json!({"max_completion_tokens": 40}),
            json!({"max_tokens": 40}),
        ),
        ("completion", Api::Chat, json!({}), json!({})),
        (
            "completion",
            Api::Completions,
            json!({"max_tokens": 50}),
            json!({"max_tokens": 50}),
        ),
    ];
    for stream in [false, true] {
        for (provider, api, sent, want) in &cases {
            let ctx = format!("{api:?} {sent} -> {provider} stream={stream}");
            let mut body = client_body(*api, stream, false);
            body.remove("max_tokens");
            body.extend(sent.as_object().unwrap().clone());
            let r = pool
                .forward(
                    &format!("ns/{provider}"),
                    *api,
                    body,
                    "gpt-5",
                    stream,
                    false,
                )
                .await
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let (out, _) = read_all(r).await;
            assert_eq!(text_of(*api, &out, stream), "Hello world", "{ctx}: {out}");
            let got = fake.last().body;
            for field in ["max_tokens", "max_completion_tokens"] {
                assert_eq!(
                    got.get(field),
                    want.get(field),
                    "{ctx}: `{field}` received: {got}"
                );
            }
        }
    }
}

#[tokio::test]
async fn usage_chunk_kept_when_the_client_asked() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![
            (
                "openai",
                info(&fake, ProviderType::OpenAI, Duration::from_secs(5), None),
            ),
            (
                "bedrock",
                info(&fake, ProviderType::Bedrock, Duration::from_secs(5), None),
            ),
        ],
        PoolOptions::default(),
    );
    for p in ["ns/openai", "ns/bedrock"] {
        let r = pool
            .forward(
                p,
                Api::Chat,
                client_body(Api::Chat, true, true),
                "m",
                true,
                true,
            )
            .await
            .unwrap();
        let (body, outcome) = read_all(r).await;
        assert!(body.contains("\"prompt_tokens\":12"), "{p}: {body}");
        assert!(body.contains("\"cached_tokens\":4"), "{p}: {body}");
        assert_eq!(outcome.usage, Some(EXPECTED));
    }
}

#[tokio::test]
async fn wrong_credentials_are_refused_and_never_echoed() {
    let fake = Fake::start().await;
    let mut i = info(&fake, ProviderType::OpenAI, Duration::from_secs(5), None);
    i.credentials = Some(CredentialRef::File(secret_file(
        "bad",
        "sk-wrong-secret-value",
    )));
    let mut b = info(&fake, ProviderType::Bedrock, Duration::from_secs(5), None);
    b.credentials = Some(CredentialRef::File(secret_file(
        "badaws",
        "aws_access_key_id=AKIDFAKEEXAMPLE\naws_secret_access_key=not-the-right-secret\n",
    )));
    let pool = pool_of(vec![("openai", i), ("bedrock", b)], PoolOptions::default());
    for p in ["ns/openai", "ns/bedrock"] {
        let e = pool
            .forward(
                p,
                Api::Chat,
                client_body(Api::Chat, false, false),
                "m",
                false,
                false,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Status(401));
        assert!(e.before_first_byte && e.fall_through);
        let shown = format!("{e} {e:?} {:?} {pool:?}", e.to_api_error().body(Api::Chat));
        for s in [
            "sk-wrong-secret-value",
            "not-the-right-secret",
            fake_provider::OPENAI_KEY,
        ] {
            assert!(!shown.contains(s), "{s} leaked: {shown}");
        }
    }
    let missing = ProviderInfo {
        credentials: Some(CredentialRef::Env("KINF_TEST_SURELY_UNSET_VAR".into())),
        ..info(&fake, ProviderType::Anthropic, Duration::from_secs(5), None)
    };
    let pool = pool_of(vec![("a", missing)], PoolOptions::default());
    let e = pool
        .forward(
            "ns/a",
            Api::Messages,
            client_body(Api::Messages, false, false),
            "m",
            false,
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Credentials);
    assert!(!pool.state_snapshot()[0].1.ready);
}

#[tokio::test]
async fn timeout_is_an_error_before_the_first_byte() {
    let fake = Fake::start().await;
    fake.set_mode(Mode::Hang(Duration::from_secs(3)));
    let pool = pool_of(
        vec![(
            "a",
            info(
                &fake,
                ProviderType::Anthropic,
                Duration::from_millis(200),
                None,
            ),
        )],
        PoolOptions::default(),
    );
    let started = std::time::Instant::now();
    for stream in [false, true] {
        let e = pool
            .forward(
                "ns/a",
                Api::Chat,
                client_body(Api::Chat, stream, false),
                "m",
                stream,
                false,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Timeout);
        assert!(e.before_first_byte && e.fall_through);
        assert_eq!(e.to_api_error().status.as_u16(), 504);
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// Which provider statuses are the provider's failure (fall through to the next, count for
/// the breaker) and which the client's (passed on, no fall-through).
#[tokio::test]
async fn provider_statuses_are_the_providers_or_the_clients_fault() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![(
            "o",
            info(&fake, ProviderType::OpenAI, Duration::from_secs(5), None),
        )],
        PoolOptions {
            failure_threshold: 100,
            ..PoolOptions::default()
        },
    );
    for (status, code, fall_through) in [
        (404, "provider_error", true),
        (424, "provider_error", true),
        (408, "provider_error", true),
        (503, "provider_error", true),
        (400, "provider_rejected", false),
        (422, "provider_rejected", false),
    ] {
        fake.set_mode(Mode::FailWith(status));
        let e = pool
            .forward(
                "ns/o",
                Api::Chat,
                client_body(Api::Chat, false, false),
                "m",
                false,
                false,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Status(status));
        assert_eq!((e.code, e.fall_through), (code, fall_through), "{status}");
    }
}

/// A stream whose first event is the provider's error (it is overloaded) has sent the client
/// nothing yet: it fails like an error status, and may fall through to the next provider,
/// rather than answer 200 and an error event.
#[tokio::test]
async fn an_error_before_any_token_falls_through() {
    let fake = Fake::start().await;
    fake.set_mode(Mode::StreamErrorFirst);
    for (protocol, api) in [
        (ProviderType::Anthropic, Api::Messages),
        (ProviderType::OpenAI, Api::Chat),
        // Translated: an OpenAI client to Anthropic.
        (ProviderType::Anthropic, Api::Chat),
    ] {
        let pool = pool_of(
            vec![("p", info(&fake, protocol, Duration::from_secs(5), None))],
            PoolOptions::default(),
        );
        let r = pool
            .forward("ns/p", api, client_body(api, true, false), "m", true, false)
            .await;
        let Err(e) = r else {
            panic!("{protocol:?} from {api:?}: answered instead of failing");
        };
        assert_eq!(
            (e.code, e.fall_through, e.before_first_byte),
            ("provider_error", true, true),
            "{protocol:?} from {api:?}: {e:?}"
        );
    }
}

#[tokio::test]
async fn breaker_opens_after_failures_and_half_opens() {
    let fake = Fake::start().await;
    fake.set_mode(Mode::Fail500);
    let opts = PoolOptions {
        failure_threshold: 3,
        cool_down: Duration::from_millis(300),
        ..PoolOptions::default()
    };
    let pool = pool_of(
        vec![(
            "o",
            info(&fake, ProviderType::OpenAI, Duration::from_secs(5), None),
        )],
        opts,
    );
    let go = || {
        pool.forward(
            "ns/o",
            Api::Chat,
            client_body(Api::Chat, false, false),
            "m",
            false,
            false,
        )
    };
    for _ in 0..3 {
        let e = go().await.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Status(500));
        assert!(e.fall_through);
    }
    let snap = &pool.state_snapshot()[0].1;
    assert_eq!(snap.breaker, BreakerState::Open);
    assert!(!snap.ready);
    let n = fake.requests.lock().len();
    let e = go().await.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::CircuitOpen);
    assert_eq!(
        fake.requests.lock().len(),
        n,
        "an open breaker sends nothing"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(pool.state_snapshot()[0].1.breaker, BreakerState::HalfOpen);
    // The probe fails: open again.
    assert_eq!(go().await.unwrap_err().kind, ProviderErrorKind::Status(500));
    assert_eq!(pool.state_snapshot()[0].1.breaker, BreakerState::Open);
    tokio::time::sleep(Duration::from_millis(350)).await;
    fake.set_mode(Mode::Normal);
    let (_, o) = read_all(go().await.unwrap()).await;
    assert!(o.completed);
    assert_eq!(pool.state_snapshot()[0].1.breaker, BreakerState::Closed);
}

#[tokio::test]
async fn mid_stream_death_ends_with_an_error_event_and_counts_as_failure() {
    let fake = Fake::start().await;
    fake.set_mode(Mode::DieMidStream);
    let pool = pool_of(
        vec![(
            "b",
            info(&fake, ProviderType::Bedrock, Duration::from_secs(5), None),
        )],
        PoolOptions::default(),
    );
    let r = pool
        .forward(
            "ns/b",
            Api::Messages,
            client_body(Api::Messages, true, false),
            "m",
            true,
            false,
        )
        .await
        .unwrap();
    let (body, o) = read_all(r).await;
    assert!(!o.completed);
    assert!(body.contains("event: error"), "{body}");
    assert_eq!(pool.state_snapshot()[0].1.consecutive_failures, 1);
    assert_eq!(
        (o.usage, o.token_events),
        (None, 0),
        "no token before the cut"
    );

    // Cut after both deltas, before the usage: the tokens seen are counted, so that the
    // gateway charges them (it charged none before).
    fake.set_mode(Mode::DieBeforeLast);
    let r = pool
        .forward(
            "ns/b",
            Api::Messages,
            client_body(Api::Messages, true, false),
            "m",
            true,
            false,
        )
        .await
        .unwrap();
    let (body, o) = read_all(r).await;
    assert!(!o.completed && body.contains("event: error"), "{body}");
    assert_eq!((o.usage, o.token_events), (None, 2), "{body}");
}

/// A client that closes a provider stream half way is reported as gone (its latency counts
/// for no objective, as on the worker path); one read to the end is not.
#[tokio::test]
async fn a_stream_the_client_abandons_is_reported_as_client_gone() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![(
            "b",
            info(&fake, ProviderType::Bedrock, Duration::from_secs(5), None),
        )],
        PoolOptions::default(),
    );
    let forward = || {
        pool.forward(
            "ns/b",
            Api::Messages,
            client_body(Api::Messages, true, false),
            "m",
            true,
            false,
        )
    };
    let (_, o) = read_all(forward().await.unwrap()).await;
    assert!(o.completed && !o.client_gone, "{o:?}");
    let r = forward().await.unwrap();
    let mut body = r.body;
    assert!(body.next().await.is_some());
    drop(body);
    let o = r.outcome.await.unwrap();
    assert!(!o.completed && o.client_gone, "{o:?}");
}

#[tokio::test]
async fn concurrency_limit_makes_the_provider_busy() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![(
            "o",
            info(&fake, ProviderType::OpenAI, Duration::from_secs(5), Some(1)),
        )],
        PoolOptions::default(),
    );
    let held = pool
        .forward(
            "ns/o",
            Api::Chat,
            client_body(Api::Chat, true, false),
            "m",
            true,
            false,
        )
        .await
        .unwrap();
    let snap = &pool.state_snapshot()[0].1;
    assert_eq!(snap.in_flight, 1);
    assert!(!snap.ready, "full means not ready");
    let e = pool
        .forward(
            "ns/o",
            Api::Chat,
            client_body(Api::Chat, true, false),
            "m",
            true,
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Busy);
    assert_eq!(e.to_api_error().status.as_u16(), 503);
    let _ = read_all(held).await;
    let snap = &pool.state_snapshot()[0].1;
    assert_eq!(snap.in_flight, 0);
    assert!(snap.ready);
    let mut st = kinf_router::ClusterState::default();
    pool.apply_to(&mut st);
    assert!(
        st.providers
            .get("ns/o")
            .is_some_and(|p| p.ready && p.ttft_s.is_some())
    );
}

#[tokio::test]
async fn a_400_from_the_provider_does_not_fall_through() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![(
            "a",
            info(&fake, ProviderType::Anthropic, Duration::from_secs(5), None),
        )],
        PoolOptions::default(),
    );
    // Tools cannot be translated: refused before sending.
    let mut body = client_body(Api::Chat, false, false);
    body.insert("tools".into(), json!([{"type": "function"}]));
    let e = pool
        .forward("ns/a", Api::Chat, body, "m", false, false)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Untranslatable);
    assert!(fake.requests.lock().is_empty());
}

/// Active health: OpenAI-compatible and Anthropic providers answer `GET /v1/models`; three
/// failed probes in a row make a provider not ready, one good probe makes it ready again.
/// Bedrock has no cheap probe and is left to passive health.
#[tokio::test]
async fn active_probes_make_a_failing_provider_not_ready() {
    let fake = Fake::start().await;
    let pool = pool_of(
        vec![
            (
                "oa",
                info(&fake, ProviderType::OpenAI, Duration::from_secs(2), None),
            ),
            (
                "an",
                info(&fake, ProviderType::Anthropic, Duration::from_secs(2), None),
            ),
            (
                "br",
                info(&fake, ProviderType::Bedrock, Duration::from_secs(2), None),
            ),
        ],
        PoolOptions::default(),
    );
    let ready = |pool: &ProviderPool, name: &str| {
        pool.state_snapshot()
            .into_iter()
            .find(|(k, _)| **k == format!("ns/{name}"))
            .map(|(_, s)| s.ready)
            .unwrap()
    };
    assert_eq!(
        pool.probe_once().await,
        0,
        "healthy providers pass their probes"
    );
    fake.set_mode(Mode::Fail500);
    for _ in 0..kinf_handler::providers::PROBE_FAILURES_UNREADY {
        assert_eq!(pool.probe_once().await, 2, "bedrock is not probed");
    }
    assert!(!ready(&pool, "oa") && !ready(&pool, "an"));
    assert!(ready(&pool, "br"), "passive health only for bedrock");
    fake.set_mode(Mode::Normal);
    assert_eq!(pool.probe_once().await, 0);
    assert!(ready(&pool, "oa") && ready(&pool, "an"));
    assert!(
        fake.requests.lock().is_empty(),
        "probes are read-only GETs, not inference"
    );
}

/// `"max_completion_tokens": null` sets no limit: the request's `max_tokens` (the limit the
/// gateway admitted it with) is the one a translated request carries, not Anthropic's
/// default of 4096 or Bedrock's model maximum.
#[tokio::test]
async fn a_null_max_completion_tokens_does_not_hide_max_tokens() {
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let pool = pool_of(
        vec![
            ("anthropic", info(&fake, ProviderType::Anthropic, t, None)),
            ("bedrock", info(&fake, ProviderType::Bedrock, t, None)),
        ],
        PoolOptions::default(),
    );
    for (provider, pointer) in [
        ("anthropic", "/max_tokens"),
        ("bedrock", "/inferenceConfig/maxTokens"),
    ] {
        let mut body = client_body(Api::Chat, false, false);
        body.insert("max_completion_tokens".into(), Value::Null);
        let r = pool
            .forward(
                &format!("ns/{provider}"),
                Api::Chat,
                body,
                "m",
                false,
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("{provider}: {e}"));
        let (out, _) = read_all(r).await;
        assert_eq!(text_of(Api::Chat, &out, false), "Hello world", "{out}");
        let got = fake.last().body;
        assert_eq!(got.pointer(pointer), Some(&json!(50)), "{provider}: {got}");
    }
}

/// An empty tool list and a `tool_choice` that calls no tool make a plain text request,
/// translated like one; a request that may call a tool is refused before sending, with a 400
/// in the client's shape naming the field.
#[tokio::test]
async fn no_tools_is_a_plain_request_and_tool_calling_is_refused_naming_the_field() {
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let pool = pool_of(
        vec![
            ("openai", info(&fake, ProviderType::OpenAI, t, None)),
            ("bedrock", info(&fake, ProviderType::Bedrock, t, None)),
        ],
        PoolOptions::default(),
    );
    for provider in ["openai", "bedrock"] {
        let mut body = client_body(Api::Messages, false, false);
        body.insert("tools".into(), json!([]));
        body.insert("tool_choice".into(), json!({"type": "none"}));
        let r = pool
            .forward(
                &format!("ns/{provider}"),
                Api::Messages,
                body,
                "m",
                false,
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("{provider}: {e}"));
        let (out, _) = read_all(r).await;
        assert_eq!(text_of(Api::Messages, &out, false), "Hello world", "{out}");
        let got = fake.last().body;
        assert!(
            got.get("tools").is_none() && got.get("toolConfig").is_none(),
            "{provider}: {got}"
        );
    }
    let sent = fake.requests.lock().len();
    let mut body = client_body(Api::Messages, false, false);
    body.insert("tool_choice".into(), json!({"type": "any"}));
    let e = pool
        .forward("ns/openai", Api::Messages, body, "m", false, false)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Untranslatable);
    let shown = e.to_api_error();
    assert_eq!(shown.status.as_u16(), 400);
    let b = shown.body(Api::Messages);
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tool_choice")),
        "{b}"
    );
    let mut body = client_body(Api::Chat, false, false);
    body.insert("tool_choice".into(), json!("required"));
    let e = pool
        .forward("ns/bedrock", Api::Chat, body, "m", false, false)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_api_error().body(Api::Chat)["error"]["param"],
        "tool_choice"
    );
    assert_eq!(fake.requests.lock().len(), sent, "nothing was sent");
}

/// Anthropic `cache_control` reaches Bedrock as `cachePoint` blocks after the text it ends,
/// for a model Bedrock caches prompts for; a model without prompt caching (Bedrock refuses a
/// cache point for it) gets the same request without them. Before, `cache_control` was
/// always dropped.
#[tokio::test]
async fn cache_control_reaches_bedrock_as_cache_points_where_the_model_caches() {
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let pool = pool_of(
        vec![("bedrock", info(&fake, ProviderType::Bedrock, t, None))],
        PoolOptions::default(),
    );
    let eph = json!({"type": "ephemeral"});
    let body = json!({
        "model": "client-model", "max_tokens": 50,
        "system": [{"type": "text", "text": "be brief", "cache_control": eph}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "A long document.", "cache_control": eph},
            {"type": "text", "text": "Say hello"}]}],
    });
    let cp = json!({"cachePoint": {"type": "default"}});
    for stream in [false, true] {
        for (model, cached) in [
            ("us.anthropic.claude-sonnet-4-20250514-v1:0", true),
            ("meta.llama3-3-70b-instruct-v1:0", false),
        ] {
            let ctx = format!("{model} stream={stream}");
            let mut b = body.as_object().unwrap().clone();
            b.insert("stream".into(), json!(stream));
            let r = pool
                .forward("ns/bedrock", Api::Messages, b, model, stream, false)
                .await
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let (out, outcome) = read_all(r).await;
            assert_eq!(text_of(Api::Messages, &out, stream), "Hello world", "{ctx}");
            assert!(outcome.completed, "{ctx}");
            let got = fake.last().body;
            if cached {
                assert_eq!(got["system"], json!([{"text": "be brief"}, cp]), "{ctx}");
                assert_eq!(
                    got["messages"][0]["content"],
                    json!([{"text": "A long document."}, cp, {"text": "\nSay hello"}]),
                    "{ctx}"
                );
            } else {
                assert_eq!(got["system"], json!([{"text": "be brief"}]), "{ctx}");
                assert_eq!(
                    got["messages"][0]["content"],
                    json!([{"text": "A long document.\nSay hello"}]),
                    "{ctx}"
                );
            }
        }
    }
}

/// More stop sequences than OpenAI's API takes (4) are refused before sending, as
/// untranslatable (the decision moves on), naming the Anthropic client's `stop_sequences`;
/// Bedrock takes them. Before, the request reached the provider and got its 400.
#[tokio::test]
async fn more_stop_sequences_than_openai_takes_are_refused_before_sending() {
    let fake = Fake::start().await;
    let t = Duration::from_secs(5);
    let pool = pool_of(
        vec![
            ("openai", info(&fake, ProviderType::OpenAI, t, None)),
            ("bedrock", info(&fake, ProviderType::Bedrock, t, None)),
        ],
        PoolOptions::default(),
    );
    let with_stops = |n: usize| {
        let mut b = client_body(Api::Messages, false, false);
        b.insert(
            "stop_sequences".into(),
            json!((0..n).map(|i| format!("END{i}")).collect::<Vec<_>>()),
        );
        b
    };
    let (out, _) = read_all(
        pool.forward("ns/openai", Api::Messages, with_stops(4), "m", false, false)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text_of(Api::Messages, &out, false), "Hello world", "{out}");
    assert_eq!(fake.last().body["stop"].as_array().map(Vec::len), Some(4));
    let sent = fake.requests.lock().len();
    let e = pool
        .forward("ns/openai", Api::Messages, with_stops(5), "m", false, false)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Untranslatable);
    assert!(e.fall_through && e.before_first_byte, "{e:?}");
    assert_eq!(e.param.as_deref(), Some("stop_sequences"), "{e:?}");
    let b = e.to_api_error().body(Api::Messages);
    assert_eq!(e.to_api_error().status.as_u16(), 400);
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("`stop_sequences`")),
        "{b}"
    );
    assert_eq!(fake.requests.lock().len(), sent, "nothing was sent");
    let (out, _) = read_all(
        pool.forward(
            "ns/bedrock",
            Api::Messages,
            with_stops(5),
            "m",
            false,
            false,
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(text_of(Api::Messages, &out, false), "Hello world", "{out}");
    assert_eq!(
        fake.last().body["inferenceConfig"]["stopSequences"]
            .as_array()
            .map(Vec::len),
        Some(5)
    );
}
