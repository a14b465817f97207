//! Two gateway replicas sharing token budgets through a real `redis-server`: a burst of
//! concurrent requests alternating between them is admitted only up to the tenant's
//! `tokensPerMinute` (not twice it), the 429s carry the rate-limit headers, and when Redis goes
//! away fail mode `closed` answers 503 `rate_limiter_unavailable` while `open` admits.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::reload;
use kinf_handler::tenants::FailMode;
use serde_json::{Value, json};
use support::*;

async fn post(addr: SocketAddr, body: &Value, key: &str) -> (u16, hyper::HeaderMap, Value) {
    let auth = format!("Bearer {key}");
    post_json(
        addr,
        "/v1/chat/completions",
        body,
        &[("authorization", &auth)],
    )
    .await
}

/// The tenant's `tokensPerMinute`.
const L: u64 = 1000;

/// A `redis-server` child process without persistence, killed on drop.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start(bin: &Path) -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A gateway replica on the configuration in `dir` whose budgets live in Redis at `url`.
async fn replica(
    dir: &Path,
    url: &str,
    fail: FailMode,
    prefix: &str,
) -> (Arc<Gateway>, SocketAddr) {
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(60),
        limit_store: kinf_handler::tenants::store_from_flags(url, fail, Some(prefix)).unwrap(),
        ..Default::default()
    });
    reload(&gw, dir, None, &kinf_handler::live_hook());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    (gw, addr)
}

fn config(worker: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
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
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  limits:
  - name: per-tenant
    tokensPerMinute: {L}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_budgets_through_redis() {
    let Some(bin) = required_bin("redis-server", "replicas sharing budgets through Redis") else {
        return;
    };
    let mut redis = RedisServer::start(&bin);
    let worker = tiny_sim("5", &[]).await;
    let dir = temp_dir("replicas");
    std::fs::write(dir.join("keys.txt"), "acme: sk-acme-1\nprobe: sk-probe-2\n").unwrap();
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let prefix = format!("kinf:test:{}:", std::process::id());
    let url = redis.url();
    let (_a, a) = replica(&dir, &url, FailMode::Closed, &prefix).await;
    let (_b, b) = replica(&dir, &url, FailMode::Closed, &prefix).await;
    let (_c, c) = replica(&dir, &url, FailMode::Open, &prefix).await;

    let chat = json!({"model": "tiny", "max_tokens": 60,
                      "messages": [{"role": "user", "content": "hello there, how are you?"}]});

    // The estimate of one request, from the remaining budget of a fresh tenant (the limit has
    // no `matches`: every tenant has its own budget of L).
    let (s, h, v) = post(a, &chat, "sk-probe-2").await;
    assert_eq!(s, 200, "{v}");
    let remaining: u64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let est = L - remaining;
    assert!((60..L / 4).contains(&est), "estimate {est}");
    // Replica b connects to Redis too, and sees the probe's spending.
    let (s, h, v) = post(b, &chat, "sk-probe-2").await;
    assert_eq!(s, 200, "{v}");
    let remaining_b: u64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        remaining_b < remaining,
        "replica b did not see replica a's spending: {remaining_b} after {remaining}"
    );

    // A burst alternating between the replicas: far more than L in estimates.
    let n = 2 * (L / est) as usize + 10;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let addr = if i % 2 == 0 { a } else { b };
        let chat = chat.clone();
        tasks.push(tokio::spawn(async move {
            let (s, h, v) = post(addr, &chat, "sk-acme-1").await;
            (i % 2, s, h, v)
        }));
    }
    let mut admitted = [0u64; 2];
    let mut refused = [0u64; 2];
    let mut refunds = 0u64;
    for t in tasks {
        let (r, s, h, v) = t.await.unwrap();
        match s {
            200 => {
                admitted[r] += 1;
                assert_eq!(h["x-ratelimit-limit-tokens"], L.to_string().as_str());
                assert!(h.contains_key("x-ratelimit-remaining-tokens"), "{h:?}");
                // What reconciliation gave back when this request ended.
                let used = v["usage"]["prompt_tokens"].as_u64().unwrap()
                    + v["usage"]["completion_tokens"].as_u64().unwrap();
                refunds += est.saturating_sub(used);
            }
            429 => {
                refused[r] += 1;
                assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
                assert_eq!(v["error"]["type"], "tokens", "{v}");
                assert_eq!(h["x-ratelimit-limit-tokens"], L.to_string().as_str());
                assert!(h.contains_key("x-ratelimit-remaining-tokens"), "{h:?}");
                assert!(h.contains_key("x-ratelimit-reset-tokens"), "{h:?}");
                assert!(h.contains_key("retry-after-ms"), "{h:?}");
                let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=60).contains(&retry), "{retry}");
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The bucket refills at L per minute while the burst runs.
    let refill = (L as f64 * elapsed / 60.0).ceil() as u64;
    let sum = (admitted[0] + admitted[1]) * est;
    let report = format!(
        "L {L}, estimate {est}, {n} requests in {elapsed:.2}s: admitted {admitted:?}, \
         refused {refused:?}; admitted estimates {sum}, refill {refill}, refunds {refunds}"
    );
    let _ = writeln!(std::io::stderr(), "{report}");
    assert!(
        sum <= L + refill + refunds + 2 * est,
        "the replicas admitted more than the shared budget: {report}"
    );
    assert!(
        admitted[0] + admitted[1] >= L / est,
        "the budget was not used up: {report}"
    );
    // Both replicas refused: each saw the other's spending.
    assert!(refused[0] > 0 && refused[1] > 0, "{report}");
    assert_eq!(
        admitted[0] + admitted[1] + refused[0] + refused[1],
        n as u64
    );

    // Redis goes away: `closed` refuses with 503, `open` admits without limits.
    redis.kill();
    for addr in [a, b] {
        let (s, h, v) = post(addr, &chat, "sk-probe-2").await;
        assert_eq!(s, 503, "{v}");
        assert_eq!(v["error"]["code"], "rate_limiter_unavailable", "{v}");
        assert_eq!(h["retry-after"], "1", "{h:?}");
    }
    let (s, h, v) = post(c, &chat, "sk-acme-1").await;
    assert_eq!(s, 200, "fail mode open: {v}");
    assert!(
        !h.contains_key("x-ratelimit-limit-tokens"),
        "admitted unlimited without headers: {h:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
