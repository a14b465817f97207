//! A real Prometheus server scrapes a running gateway during an end-to-end load against
//! in-process kinf-sim workers with two tenants: the per-tenant token and cost totals it stores
//! equal what the worker reported to the clients (nothing lost, nothing double-counted), and cost
//! equals tokens × the worker set's prices.
//!
//! Skipped (loudly) when `prometheus` is not on PATH, unless `KINF_REQUIRE_E2E=1`
//! (scripts/test.sh installs the Debian package `prometheus`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use support::*;

async fn post(addr: SocketAddr, body: &Value, key: &str) -> (u16, Bytes) {
    let auth = format!("Bearer {key}");
    let (status, _, bytes) = post_raw(
        addr,
        "/v1/chat/completions",
        body,
        &[("authorization", &auth)],
    )
    .await;
    (status, bytes)
}

/// Prices of the worker set, USD per million tokens.
const UNCACHED: f64 = 1.0;
const CACHED: f64 = 0.5;
const OUTPUT: f64 = 4.0;

/// A `prometheus` child process, killed (and its data removed) on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(bin: &PathBuf, target: SocketAddr) -> Prometheus {
        let dir = temp_dir("prometheus");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n- job_name: kinference\n  metrics_path: /metrics\n  \
             static_configs:\n  - targets: ['{target}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// Runs an instant query; the result vector as (labels, value).
    async fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let (s, v) = get(&format!(
            "http://127.0.0.1:{}/api/v1/query?query={}",
            self.port,
            urlencode(q)
        ))
        .await;
        assert_eq!(s, 200, "{q}: {v}");
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["metric"].clone(),
                    r["value"][1].as_str().unwrap().parse::<f64>().unwrap(),
                )
            })
            .collect()
    }

    /// `sum by (tenant) (...)` as a map tenant → value.
    async fn by_tenant(&self, q: &str) -> BTreeMap<String, f64> {
        self.query(q)
            .await
            .into_iter()
            .map(|(m, v)| (m["tenant"].as_str().unwrap_or("").to_string(), v))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// GET `url`: (status, JSON body or Null); status 0 when the connection failed.
async fn get(url: &str) -> (u16, Value) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let Ok(resp) = client.request(req).await else {
        return (0, Value::Null);
    };
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Usage as the client saw it: (prompt, cached prompt, output) tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Usage {
    prompt: u64,
    cached: u64,
    output: u64,
}

impl Usage {
    fn from_json(u: &Value) -> Usage {
        Usage {
            prompt: u["prompt_tokens"].as_u64().unwrap(),
            cached: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            output: u["completion_tokens"].as_u64().unwrap(),
        }
    }

    fn add(&mut self, o: Usage) {
        self.prompt += o.prompt;
        self.cached += o.cached;
        self.output += o.output;
    }

    fn cost(&self) -> f64 {
        ((self.prompt - self.cached) as f64 * UNCACHED
            + self.cached as f64 * CACHED
            + self.output as f64 * OUTPUT)
            / 1e6
    }
}

/// Sends one chat request (streamed or not) and returns the usage the worker reported.
async fn one(addr: SocketAddr, key: &str, i: usize, stream: bool, max_tokens: u64) -> Usage {
    // A long shared prefix so that the prefix cache serves part of later prompts (cached
    // tokens have their own price).
    let content = format!(
        "{} Question {i} from {key}: what is {i} times {max_tokens}?",
        "You are a careful assistant that answers briefly and precisely.".repeat(8)
    );
    let mut body = json!({"model": "tiny", "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": content}]});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let (s, bytes) = post(addr, &body, key).await;
    let text = String::from_utf8_lossy(&bytes).to_string();
    assert_eq!(s, 200, "{text}");
    if !stream {
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        return Usage::from_json(&v["usage"]);
    }
    let usages: Vec<Usage> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.trim() != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|v| v["usage"].is_object())
        .map(|v| Usage::from_json(&v["usage"]))
        .collect();
    assert_eq!(usages.len(), 1, "one usage chunk expected: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    usages[0]
}

fn config(worker: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
  cost: {{ uncachedPromptPerMillion: {UNCACHED:?}, cachedPromptPerMillion: {CACHED:?}, outputPerMillion: {OUTPUT:?} }}
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
"#
    )
}

fn rendered_output(gw: &kinf_handler::gateway::Gateway, tenant: &str) -> u64 {
    let mut m = String::new();
    gw.metrics.render(&mut m);
    m.lines()
        .filter(|l| {
            l.starts_with("kinference_tenant_tokens_total{")
                && l.contains(&format!("tenant=\"{tenant}\""))
                && l.contains("kind=\"output\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_exact_per_tenant_tokens_and_cost() {
    let Some(bin) = required_bin("prometheus", "a real Prometheus server scrapes the gateway")
    else {
        return;
    };
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("prom");
    std::fs::write(
        dir.join("keys.txt"),
        "acme: sk-acme-1\nglobex: sk-globex-2\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.yaml"), config(worker.http)).unwrap();
    let (gw, addr) = gateway(&dir).await;
    let prom = Prometheus::start(&bin, addr);

    // Prometheus is up and has scraped the gateway once before the load.
    let mut ready = false;
    for _ in 0..300 {
        if get(&format!("http://127.0.0.1:{}/-/ready", prom.port))
            .await
            .0
            == 200
            && prom.query("up{job=\"kinference\"} == 1").await.len() == 1
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "Prometheus never scraped the gateway:\n{}",
        prom.log()
    );

    // The load: N requests per tenant, concurrently, plain and streamed, various max_tokens.
    const N: usize = 12;
    const TENANTS: [(&str, &str); 2] = [("acme", "sk-acme-1"), ("globex", "sk-globex-2")];
    let mut tasks = Vec::new();
    for (t, (tenant, key)) in TENANTS.iter().enumerate() {
        for i in 0..N {
            let stream = (i + t) % 2 == 0;
            let max_tokens = 3 + ((i * 7 + t * 5) % 40) as u64;
            tasks.push(tokio::spawn(async move {
                (*tenant, one(addr, key, i, stream, max_tokens).await)
            }));
            // Spread over a few scrapes.
            tokio::time::sleep(Duration::from_millis(80)).await;
        }
    }
    let mut expected: BTreeMap<String, Usage> = BTreeMap::new();
    for t in tasks {
        let (tenant, u) = t.await.unwrap();
        expected.entry(tenant.to_string()).or_default().add(u);
    }
    assert_eq!(expected.len(), 2);
    assert!(
        expected.values().all(|u| u.output > 0 && u.prompt > 0),
        "{expected:?}"
    );

    // Responses are accounted when they end: let the gateway settle, then wait for a
    // Prometheus scrape that started after that.
    let settled = eventually(Duration::from_secs(10), || {
        expected
            .iter()
            .all(|(t, u)| rendered_output(&gw, t) == u.output)
    })
    .await;
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut scraped = false;
    let mut polls = 0;
    for _ in 0..200 {
        polls += 1;
        // `timestamp` of a plain selector is the scrape's time (of an expression, it would be
        // the evaluation time).
        let r = prom.query("timestamp(up{job=\"kinference\"})").await;
        if r.first().is_some_and(|(_, ts)| *ts > after) {
            scraped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(scraped, "no scrape after the load:\n{}", prom.log());
    let up = prom.query("up{job=\"kinference\"}").await;
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].1, 1.0, "the last scrape failed:\n{}", prom.log());

    // What Prometheus holds, per tenant, equals what the worker reported.
    let output = prom
        .by_tenant(r#"sum by (tenant) (kinference_tenant_tokens_total{kind="output"})"#)
        .await;
    let uncached = prom
        .by_tenant(r#"sum by (tenant) (kinference_tenant_tokens_total{kind="uncached_prompt"})"#)
        .await;
    let cached = prom
        .by_tenant(r#"sum by (tenant) (kinference_tenant_tokens_total{kind="cached_prompt"})"#)
        .await;
    let prompt = prom
        .by_tenant(r#"sum by (tenant) (kinference_tenant_tokens_total{kind=~".*_prompt"})"#)
        .await;
    let cost = prom
        .by_tenant("sum by (tenant) (kinference_tenant_cost_usd_total)")
        .await;
    let completed = prom
        .by_tenant(r#"sum by (tenant) (kinference_tenant_requests_total{outcome="completed"})"#)
        .await;
    let requests = prom
        .by_tenant("sum by (tenant) (kinference_tenant_requests_total)")
        .await;
    let estimated = prom
        .by_tenant("sum by (tenant) (kinference_tenant_usage_estimated_total)")
        .await;
    let report = format!(
        "settled in the gateway: {settled}; polls for the next scrape: {polls}\nexpected {expected:?}\noutput {output:?}\n\
         uncached {uncached:?}\ncached {cached:?}\ncost {cost:?}\nrequests {requests:?}"
    );
    let _ = writeln!(std::io::stderr(), "{report}");
    // No other tenant (e.g. `anonymous`) was accounted.
    for m in [&output, &uncached, &prompt, &cost, &requests] {
        assert!(
            m.keys().all(|t| expected.contains_key(t)),
            "unexpected tenant\n{report}"
        );
    }
    let get0 = |m: &BTreeMap<String, f64>, t: &str| m.get(t).copied().unwrap_or(0.0);
    for (t, u) in &expected {
        assert_eq!(get0(&output, t), u.output as f64, "{t} output\n{report}");
        assert_eq!(get0(&prompt, t), u.prompt as f64, "{t} prompt\n{report}");
        assert_eq!(
            get0(&uncached, t),
            (u.prompt - u.cached) as f64,
            "{t} uncached prompt\n{report}"
        );
        assert_eq!(get0(&cached, t), u.cached as f64, "{t} cached\n{report}");
        assert!(
            close(get0(&cost, t), u.cost()),
            "{t} cost {} != {}\n{report}",
            get0(&cost, t),
            u.cost()
        );
        // Cost equals tokens × prices computed from Prometheus's own token totals too.
        let from_tokens =
            (get0(&uncached, t) * UNCACHED + get0(&cached, t) * CACHED + get0(&output, t) * OUTPUT)
                / 1e6;
        assert!(close(get0(&cost, t), from_tokens), "{t}\n{report}");
        assert_eq!(get0(&completed, t), N as f64, "{t} completed\n{report}");
        assert_eq!(get0(&requests, t), N as f64, "{t} requests\n{report}");
        assert_eq!(get0(&estimated, t), 0.0, "{t} estimated\n{report}");
    }
    assert!(
        settled,
        "the gateway's own /metrics never settled\n{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
