//! Tenants through the gateway: API keys mapped to tenants (held as hashes), spoofing refused,
//! a tenant over its token budget gets 429 with OpenAI-style rate-limit headers while the other
//! is unaffected, and every request is accounted to the right tenant. Editing only the key file
//! revokes or adds keys at the next reloads (a new policy generation); a broken key file keeps
//! the last good keys and is the store's last refusal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::post_json as post;
use support::*;

fn config(worker: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
  cost: {{ uncachedPromptPerMillion: 1.0, cachedPromptPerMillion: 0.5, outputPerMillion: 4.0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: t }}
spec:
  pool: pool
  tenants:
    apiKeys: {{ file: keys.txt }}
    trustedHeader: x-tenant
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  limits:
  - name: acme-budget
    matches: {{ tenant: acme }}
    tokensPerMinute: 200
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_identity_and_accounting_per_tenant() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("tenants");
    // One key in plain text, one as its SHA-256 hash.
    let globex_hash = kinf_handler::tenants::identity::hash_for_file("sk-globex-2");
    std::fs::write(
        dir.join("keys.txt"),
        format!("acme: sk-acme-1\nglobex: {globex_hash}\n"),
    )
    .unwrap();
    let cfg = config(worker.http);
    std::fs::write(dir.join("c.yaml"), &cfg).unwrap();
    let (gw, addr) = gateway(&dir).await;
    let chat = json!({"model": "tiny", "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello there"}]});

    // Identity: keys map to tenants; spoofing is refused.
    let acme = [("authorization", "Bearer sk-acme-1")];
    let globex = [("x-api-key", "sk-globex-2")];
    let (s, _, v) = post(addr, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("missing_api_key")),
        "{v}"
    );
    let (s, _, v) = post(
        addr,
        "/v1/chat/completions",
        &chat,
        &[("authorization", "Bearer sk-nope")],
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key")),
        "{v}"
    );
    assert!(!v.to_string().contains("sk-nope"), "the key is echoed: {v}");
    let (s, _, v) = post(
        addr,
        "/v1/chat/completions",
        &chat,
        &[("x-api-key", "sk-globex-2"), ("x-tenant", "acme")],
    )
    .await;
    assert_eq!(
        s, 401,
        "a forged tenant header with another tenant's key: {v}"
    );
    let (s, _, v) = post(
        addr,
        "/v1/messages",
        &json!({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
        &[("x-api-key", "sk-nope")],
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (401, Some("authentication_error")),
        "{v}"
    );

    // acme has 200 tokens per minute; each request reserves its prompt + 40.
    let mut ok = 0;
    let mut limited = None;
    for _ in 0..6 {
        let (s, h, v) = post(addr, "/v1/chat/completions", &chat, &acme).await;
        match s {
            200 => {
                ok += 1;
                assert!(h.contains_key("x-ratelimit-remaining-tokens"), "{h:?}");
            }
            429 => {
                limited = Some((h, v));
                break;
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    let (h, v) = limited.expect("acme was never limited");
    assert!(ok >= 1, "acme got nothing through");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "tokens", "{v}");
    assert_eq!(h["x-ratelimit-limit-tokens"], "200");
    assert!(h.contains_key("x-ratelimit-reset-tokens"));
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");

    // globex is unaffected.
    for _ in 0..4 {
        let (s, _, v) = post(addr, "/v1/chat/completions", &chat, &globex).await;
        assert_eq!(s, 200, "{v}");
    }

    // Accounting per tenant equals what the worker reported.
    let mut m = String::new();
    gw.metrics.render(&mut m);
    let output = |tenant: &str| -> f64 {
        m.lines()
            .filter(|l| {
                l.starts_with("kinference_tenant_tokens_total{")
                    && l.contains(&format!("tenant=\"{tenant}\""))
                    && l.contains("kind=\"output\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(output("acme"), 40.0 * ok as f64, "{m}");
    assert_eq!(output("globex"), 160.0, "{m}");
}

/// A request whose estimate exceeds the tenant's whole `tokensPerMinute` can never be admitted:
/// it is refused at once with a 400 in the caller's shape naming the limit, without
/// `retry-after` (a 429 would have clients retry it forever), and the tenant's other requests
/// keep their whole budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_larger_than_the_budget_is_refused_at_once() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("oversize");
    std::fs::write(dir.join("keys.txt"), "acme: sk-acme-1\n").unwrap();
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let acme = [("authorization", "Bearer sk-acme-1")];
    let big = json!({"model": "tiny", "max_tokens": 500,
                     "messages": [{"role": "user", "content": "hello there"}]});
    let (s, h, v) = post(addr, "/v1/chat/completions", &big, &acme).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "request_over_token_limit", "{v}");
    assert_eq!(v["error"]["type"], "tokens", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("acme-budget") && msg.contains("limit 200") && msg.contains("max_tokens"),
        "{msg}"
    );
    assert!(
        !h.contains_key("retry-after") && !h.contains_key("retry-after-ms"),
        "{h:?}"
    );
    let (s, h, v) = post(
        addr,
        "/v1/messages",
        &json!({"model": "tiny", "max_tokens": 500,
                "messages": [{"role": "user", "content": "hello there"}]}),
        &[("x-api-key", "sk-acme-1")],
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("acme-budget"),
        "{v}"
    );
    assert!(!h.contains_key("retry-after"), "{h:?}");
    // The budget is whole: a request within it goes through, with 200 minus its estimate left.
    let chat = json!({"model": "tiny", "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello there"}]});
    let (s, h, v) = post(addr, "/v1/chat/completions", &chat, &acme).await;
    assert_eq!(s, 200, "{v}");
    let left: u64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((100..160).contains(&left), "{left}");
}

/// A limit with `whenExceeded: Tag` does not refuse: over-limit requests go through uncharged,
/// tagged `over-limit`, and a rule routes them to a cheaper model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_traffic_is_routed_elsewhere_when_the_policy_says_so() {
    let main = tiny_sim("50", &[]).await;
    let cheap = sim(&[
        "--port",
        "0",
        "--model",
        "tiny-small",
        "--profile",
        "tiny",
        "--speed",
        "50",
    ])
    .await;
    let dir = temp_dir("overlimit");
    std::fs::write(dir.join("keys.txt"), "acme: sk-acme-1\n").unwrap();
    let cfg = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: main, namespace: t }}
spec:
  endpoints: ["{main}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: cheap, namespace: t }}
spec:
  endpoints: ["{cheap}"]
  models: [ {{ name: tiny-small }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: main }}, {{ kind: InferenceWorkerSet, name: cheap }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: t }}
spec:
  pool: pool
  tenants: {{ apiKeys: {{ file: keys.txt }} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  rules:
  - name: over-budget-to-cheap
    matches: [ {{ tag: over-limit }} ]
    route:
      consider: [ {{ models: {{ names: [tiny-small] }} }} ]
  limits:
  - name: acme-premium
    matches: {{ tenant: acme }}
    tokensPerMinute: 150
    whenExceeded: Tag
"#,
        main = main.http,
        cheap = cheap.http
    );
    std::fs::write(dir.join("c.yaml"), cfg).unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let chat = json!({"model": "tiny", "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello there"}]});
    let acme = [("authorization", "Bearer sk-acme-1")];
    let mut served_by = Vec::new();
    for _ in 0..5 {
        let (s, h, v) = post(addr, "/v1/chat/completions", &chat, &acme).await;
        assert_eq!(s, 200, "over-limit requests are not refused: {v}");
        served_by.push(h["x-kinference-model"].to_str().unwrap().to_owned());
    }
    assert_eq!(
        served_by[0], "tiny-llama",
        "within budget: the requested model"
    );
    assert!(
        served_by.iter().any(|m| m == "tiny-small"),
        "over budget: the cheaper model: {served_by:?}"
    );
    let last = served_by.last().unwrap();
    assert_eq!(last, "tiny-small", "{served_by:?}");
    // Larger than the whole budget: over a `Tag` limit it is tagged and served elsewhere too,
    // not refused as too large.
    let big = json!({"model": "tiny", "max_tokens": 200,
                     "messages": [{"role": "user", "content": "hello there"}]});
    let (s, h, v) = post(addr, "/v1/chat/completions", &big, &acme).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h["x-kinference-model"], "tiny-small");
}

/// How often the key-file tests' directory is polled (`--reload-interval`).
const RELOAD: Duration = Duration::from_millis(100);

/// Starts the gateway on `dir` as `kinference serve` does in directory mode: the configuration
/// applied once, then polled every [`RELOAD`].
async fn watched_gateway(
    dir: &Path,
) -> (
    std::sync::Arc<kinf_handler::gateway::Gateway>,
    SocketAddr,
    tokio::task::JoinHandle<()>,
) {
    let (gw, addr) = gateway(dir).await;
    // What `serve` hands the poller: the hash of what is in force.
    let last = kinf_handler::serve::reload(&gw, dir, None, &kinf_handler::live_hook());
    assert!(last.is_some());
    let watcher = kinf_handler::serve::watch_directory(
        gw.clone(),
        dir.to_path_buf(),
        RELOAD,
        last,
        kinf_handler::live_hook(),
    );
    (gw, addr, watcher)
}

/// The status of a chat completion presenting `key`.
async fn status_with_key(addr: SocketAddr, key: &str) -> (u16, serde_json::Value) {
    let chat = json!({"model": "tiny", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (s, _, v) = post(
        addr,
        "/v1/chat/completions",
        &chat,
        &[("authorization", &format!("Bearer {key}"))],
    )
    .await;
    (s, v)
}

/// Polls until a request with `key` gets `want`; false when `within` passed first.
async fn until_status(addr: SocketAddr, key: &str, want: u16, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if status_with_key(addr, key).await.0 == want {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `/readyz`: its status and body.
async fn readyz(addr: SocketAddr) -> (u16, serde_json::Value) {
    let (s, body) = get_text(addr, "/readyz").await;
    (s, serde_json::from_str(&body).unwrap())
}

/// Revoking or adding a key by editing only the key file (no YAML change) takes effect at the
/// next reloads; the other keys keep working. The key file's content is part of the policy (as
/// a Secret's is in Kubernetes mode): each edit is a new generation, which `/admin/status` and
/// `kinference_policy_generation` show, while polls that find nothing changed apply nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_only_the_key_file_revokes_and_adds_keys_within_a_few_reload_intervals() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("key-reload");
    std::fs::write(
        dir.join("keys.txt"),
        "team-a: sk-team-a-1\nteam-b: sk-team-b-1\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let (gw, addr, watcher) = watched_gateway(&dir).await;
    let generation = gw.store.current().unwrap().generation;
    for key in ["sk-team-a-1", "sk-team-b-1"] {
        let (s, v) = status_with_key(addr, key).await;
        assert_eq!(s, 200, "{key}: {v}");
    }
    assert_eq!(status_with_key(addr, "sk-team-c-1").await.0, 401);

    // Revoke team-b's key: its line removed from the key file, nothing else touched.
    std::fs::write(dir.join("keys.txt"), "team-a: sk-team-a-1\n").unwrap();
    assert!(
        until_status(addr, "sk-team-b-1", 401, RELOAD * 30).await,
        "the revoked key still works {:?} after the edit",
        RELOAD * 30
    );
    let (s, v) = status_with_key(addr, "sk-team-b-1").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key")),
        "{v}"
    );
    let (s, v) = status_with_key(addr, "sk-team-a-1").await;
    assert_eq!(s, 200, "the remaining key: {v}");

    // Add a key the same way.
    std::fs::write(
        dir.join("keys.txt"),
        "team-a: sk-team-a-1\nteam-c: sk-team-c-1\n",
    )
    .unwrap();
    assert!(
        until_status(addr, "sk-team-c-1", 200, RELOAD * 30).await,
        "the added key is still refused"
    );
    assert_eq!(status_with_key(addr, "sk-team-a-1").await.0, 200);
    assert_eq!(status_with_key(addr, "sk-team-b-1").await.0, 401);
    // The YAML did not change, but the keys did: a new generation per edit, shown by
    // /admin/status and the generation gauge; nothing was refused.
    let now = gw.store.current().unwrap().generation;
    assert!(now >= generation + 2, "{generation} -> {now}");
    let (s, body) = get_text(addr, "/admin/status").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (s, status["policy"]["generation"].as_u64()),
        (200, Some(now))
    );
    assert_eq!(
        gw.metrics.value("kinference_policy_generation", &[]),
        Some(now as f64)
    );
    assert!(gw.store.last_rejected().is_none());
    // Nothing changes any more: the polls apply nothing (no new generation, no rebuild).
    let rt = gw.runtime().unwrap();
    let applied = gw
        .metrics
        .value("kinference_policy_reloads_total", &[("result", "applied")]);
    tokio::time::sleep(RELOAD * 5).await;
    assert_eq!(gw.store.current().unwrap().generation, now);
    assert!(
        std::sync::Arc::ptr_eq(&rt, &gw.runtime().unwrap()),
        "rebuilt"
    );
    assert_eq!(
        gw.metrics
            .value("kinference_policy_reloads_total", &[("result", "applied")]),
        applied
    );
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A key file outside the configuration directory (absolute path) that becomes invalid or
/// unreadable is refused like an invalid YAML edit: the last good keys keep working, `/readyz`
/// stays ready and names the file and line (never a key) under `lastRefused`, the store's last
/// refusal is it, and `kinference_policy_refused` is 1. Fixed, it is applied (a new generation)
/// and the refusal cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_or_missing_key_file_keeps_the_last_good_keys() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("key-corrupt");
    let outside = temp_dir("key-corrupt-keys");
    let keys = outside.join("keys.txt");
    std::fs::write(&keys, "team-a: sk-team-a-1\nteam-b: sk-team-b-1\n").unwrap();
    std::fs::write(
        dir.join("c.yaml"),
        config(worker.http).replace("file: keys.txt", &format!("file: \"{}\"", keys.display())),
    )
    .unwrap();
    let (gw, addr, watcher) = watched_gateway(&dir).await;
    assert!(
        gw.store.last_rejected().is_none(),
        "{:?}",
        gw.store.last_rejected()
    );
    let generation = gw.store.current().unwrap().generation;
    let refused = |gw: &kinf_handler::gateway::Gateway| {
        gw.metrics
            .value("kinference_policy_reloads_total", &[("result", "refused")])
            .unwrap_or(0.0)
    };
    assert_eq!(refused(&gw), 0.0);
    for key in ["sk-team-a-1", "sk-team-b-1"] {
        assert_eq!(status_with_key(addr, key).await.0, 200, "{key}");
    }

    // Corrupted: team-b's line removed, and line 2 is not `tenant: key`.
    std::fs::write(&keys, "team-a: sk-team-a-1\nsk-team-c-1\n").unwrap();
    assert!(
        eventually(RELOAD * 30, || gw.store.last_rejected().is_some()).await,
        "the corrupted key file was not refused"
    );
    // The store holds the refusal: file and line, no KINF code, never a key.
    let rejected = gw.store.last_rejected().unwrap();
    assert!(
        rejected
            .errors
            .iter()
            .any(|e| e.contains(&keys.display().to_string()) && e.contains("line 2")),
        "{rejected:?}"
    );
    assert!(rejected.codes.is_empty(), "{rejected:?}");
    assert!(
        !rejected.errors.iter().any(|e| e.contains("sk-team")),
        "never a key"
    );
    assert!(refused(&gw) >= 1.0);
    assert_eq!(gw.store.current().unwrap().generation, generation);
    let (s, body) = readyz(addr).await;
    assert_eq!(s, 200, "the last good policy stays in force: {body}");
    let errors = body["lastRefused"]["errors"].to_string();
    assert!(
        errors.contains(&keys.display().to_string()) && errors.contains("line 2"),
        "names the file and the line: {body}"
    );
    assert!(!errors.contains("sk-team"), "never a key: {body}");
    assert_eq!(
        gw.metrics.value("kinference_policy_refused", &[]),
        Some(1.0)
    );
    // Nothing of the broken file is applied: every last good key still works.
    for key in ["sk-team-a-1", "sk-team-b-1"] {
        let (s, v) = status_with_key(addr, key).await;
        assert_eq!(s, 200, "{key}: {v}");
    }
    assert_eq!(status_with_key(addr, "sk-team-c-1").await.0, 401);

    // Unreadable (gone): the same.
    std::fs::remove_file(&keys).unwrap();
    assert!(
        eventually(RELOAD * 30, || gw.store.last_rejected().is_some_and(|r| r
            .errors
            .iter()
            .any(|e| e.contains("cannot read API key file"))))
        .await,
        "the missing key file was not refused: {:?}",
        gw.store.last_rejected()
    );
    assert_eq!(gw.store.current().unwrap().generation, generation);
    for key in ["sk-team-a-1", "sk-team-b-1"] {
        assert_eq!(status_with_key(addr, key).await.0, 200, "{key}");
    }

    // A FIFO in its place: refused at once (opening it would block the reload until someone
    // writes to it), the last good keys kept.
    let made = std::process::Command::new("mkfifo")
        .arg(&keys)
        .status()
        .unwrap();
    assert!(made.success());
    assert!(
        eventually(RELOAD * 30, || gw.store.last_rejected().is_some_and(|r| r
            .errors
            .iter()
            .any(
                |e| e.contains("cannot read API key file") && e.contains("not a regular file")
            )))
        .await,
        "the FIFO was not refused: {:?}",
        gw.store.last_rejected()
    );
    assert_eq!(gw.store.current().unwrap().generation, generation);
    assert_eq!(status_with_key(addr, "sk-team-a-1").await.0, 200);
    std::fs::remove_file(&keys).unwrap();

    // Fixed (team-b revoked): applied, the refusal cleared.
    std::fs::write(&keys, "team-a: sk-team-a-1\n").unwrap();
    assert!(
        until_status(addr, "sk-team-b-1", 401, RELOAD * 30).await,
        "the fixed key file was not applied"
    );
    assert_eq!(status_with_key(addr, "sk-team-a-1").await.0, 200);
    let (s, body) = readyz(addr).await;
    assert_eq!((s, &body["lastRefused"]), (200, &serde_json::Value::Null));
    assert!(gw.store.last_rejected().is_none());
    assert!(gw.store.current().unwrap().generation > generation);
    assert_eq!(
        gw.metrics.value("kinference_policy_refused", &[]),
        Some(0.0)
    );
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&outside);
}

/// While an unrelated YAML edit is refused, a key revoked in the key file is revoked all the
/// same (the policy in force is applied again with its key file's new content: a new
/// generation), and the YAML's refusal stays the store's last refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_yaml_edit_does_not_hold_back_a_revocation() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("key-refused-yaml");
    std::fs::write(
        dir.join("keys.txt"),
        "team-a: sk-team-a-1\nteam-b: sk-team-b-1\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let (gw, addr, watcher) = watched_gateway(&dir).await;
    let generation = gw.store.current().unwrap().generation;
    assert_eq!(status_with_key(addr, "sk-team-b-1").await.0, 200);

    std::fs::write(
        dir.join("c.yaml"),
        config(worker.http).replace("tokensPerMinute: 200", "tokensPerMinut: 200"),
    )
    .unwrap();
    assert!(
        eventually(RELOAD * 30, || gw.store.last_rejected().is_some()).await,
        "the broken YAML was not refused"
    );
    std::fs::write(dir.join("keys.txt"), "team-a: sk-team-a-1\n").unwrap();
    assert!(
        until_status(addr, "sk-team-b-1", 401, RELOAD * 30).await,
        "the revocation waits for the YAML"
    );
    assert_eq!(status_with_key(addr, "sk-team-a-1").await.0, 200);
    let now = gw.store.current().unwrap().generation;
    assert!(now > generation, "{generation} -> {now}");
    assert_eq!(
        gw.metrics.value("kinference_policy_generation", &[]),
        Some(now as f64)
    );
    let (s, body) = readyz(addr).await;
    assert_eq!((s, body["generation"].as_u64()), (200, Some(now)));
    assert!(
        body["lastRefused"]["errors"].to_string().contains("c.yaml"),
        "the YAML's refusal is still shown: {body}"
    );
    assert!(
        gw.store
            .last_rejected()
            .is_some_and(|r| r.errors.iter().any(|e| e.contains("c.yaml"))),
        "{:?}",
        gw.store.last_rejected()
    );
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// At startup, a key file that cannot be loaded refuses the bundle: nothing is in force, so the
/// gateway is not ready, and `/readyz` names the file. Created, it is applied at the next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_file_at_startup_is_refused_until_it_appears() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("key-startup");
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let gw = kinf_handler::gateway::Gateway::new(kinf_handler::gateway::GatewayOptions {
        base_dir: dir.clone(),
        ..Default::default()
    });
    let last = kinf_handler::serve::reload(&gw, &dir, None, &kinf_handler::live_hook());
    assert!(!gw.store.is_ready());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    let (s, body) = readyz(addr).await;
    assert_eq!(s, 503, "{body}");
    assert!(
        body["lastRefused"]["errors"]
            .to_string()
            .contains("cannot read API key file"),
        "{body}"
    );
    assert!(
        gw.store.last_rejected().is_some_and(|r| r
            .errors
            .iter()
            .any(|e| e.contains("cannot read API key file"))),
        "the store holds the refusal: {:?}",
        gw.store.last_rejected()
    );
    let watcher = kinf_handler::serve::watch_directory(
        gw.clone(),
        dir.clone(),
        RELOAD,
        last,
        kinf_handler::live_hook(),
    );
    std::fs::write(dir.join("keys.txt"), "team-a: sk-team-a-1\n").unwrap();
    assert!(
        until_status(addr, "sk-team-a-1", 200, RELOAD * 30).await,
        "the key file that appeared was not applied"
    );
    let (s, body) = readyz(addr).await;
    assert_eq!((s, &body["lastRefused"]), (200, &serde_json::Value::Null));
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
