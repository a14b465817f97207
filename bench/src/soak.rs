//! `kinf-bench soak`: the gateway under steady load for a long time, checked for leaks and
//! drift.
//!
//! Starts `--workers` `kinf-sim serve` processes (profile `tiny`, time-scaled by `--speed`,
//! KV events on) and one `kinference` process in front of them (three tenants with API keys,
//! `--admin-listen` for `/metrics`), all on loopback. It then
//! 1. measures the fleet's capacity: a closed loop at `--probe-concurrency` for
//!    `--probe-seconds` through the gateway (completed requests per second);
//! 2. offers `--load` × capacity as Poisson arrivals for `--duration` (tenants in turn, half the
//!    requests streamed, prompts sharing a few system prompts);
//! 3. every `--window`, samples the gateway's resident memory and open file descriptors
//!    (`/proc/PID`), the window's latencies, and the gateway's added latency: the mean
//!    end-to-end latency its clients saw minus the mean the workers report
//!    (`vllm:e2e_request_latency_seconds`, in simulated seconds, so divided by `--speed`) over
//!    the same window;
//! 4. at the end, once in-flight requests finished, compares the gateway's per-tenant totals
//!    (`kinference_tenant_tokens_total`, `kinference_tenant_requests_total`) with the workers'
//!    own counters (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
//!    `vllm:request_success_total`).
//!
//! Checks (all must hold for `"passed": true`; the exit status is 1 otherwise):
//! - memory: resident memory at the end within `--max-memory-growth` (5%) of its value after
//!   the warm-up (`--warmup`);
//! - file descriptors: the most open in the last third of the run at most 8 more than the most
//!   open in the first third after warm-up (connection pools breathe; a leak grows without
//!   bound);
//! - accounting: gateway totals equal the workers' totals exactly;
//! - errors: no failed request;
//! - overhead: the last window's mean added latency within 2× (+1 ms) of the first window's
//!   after warm-up.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::procs::{self, Http, Proc};

/// The options of `kinf-bench soak`.
#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// How long to offer load (e.g. `30m`, `90s`).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time after which memory and descriptors are taken as warmed up.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Sampling window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub window: Duration,
    /// Simulated workers.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Simulated seconds per wall second of the workers (lower: slower workers, less load).
    #[arg(long, default_value_t = 0.1)]
    pub speed: f64,
    /// Offered load as a fraction of the measured capacity.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Concurrency of the capacity probe.
    #[arg(long, default_value_t = 96)]
    pub probe_concurrency: usize,
    /// Seconds of the capacity probe.
    #[arg(long, default_value_t = 8.0)]
    pub probe_seconds: f64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Allowed growth of resident memory after warm-up (fraction).
    #[arg(long, default_value_t = 0.05)]
    pub max_memory_growth: f64,
    /// Seed of arrivals and prompts.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SoakFormat::Json)]
    pub format: SoakFormat,
}

/// Output formats.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoakFormat {
    /// One JSON object.
    Json,
    /// A markdown table.
    Md,
}

/// Durations as everywhere in Kinference (`90s`, `30m`, `250ms`, `1m30s`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    kinf_grammar::parse_duration(s).map_err(|e| e.to_string())
}

const TENANTS: [(&str, &str); 3] = [
    ("acme", "sk-soak-acme-1"),
    ("globex", "sk-soak-globex-2"),
    ("initech", "sk-soak-initech-3"),
];

/// Runs the soak and prints the report; an error when setting up failed or a check failed.
pub fn main(args: SoakArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let work = std::env::temp_dir().join(format!("kinf-bench-soak-{}", std::process::id()));
    let out = rt.block_on(run(&args, &work))?;
    let passed = out["passed"].as_bool().unwrap_or(false);
    match args.format {
        SoakFormat::Json => println!("{out}"),
        SoakFormat::Md => print!("{}", markdown(&out)),
    }
    if passed {
        let _ = std::fs::remove_dir_all(&work);
        Ok(())
    } else {
        Err(format!(
            "soak checks failed (logs kept in {})",
            work.display()
        ))
    }
}

fn config(workers: &[String]) -> String {
    let eps = workers
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: soak, namespace: soak }}
spec:
  endpoints: [{eps}]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
  kvEvents: {{}}
  metrics: {{ interval: 500ms }}
  cost: {{ uncachedPromptPerMillion: 1.0, cachedPromptPerMillion: 0.5, outputPerMillion: 4.0 }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: soak }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: soak }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: soak }}
spec:
  pool: pool
  tenants:
    apiKeys: {{ file: keys.txt }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: fastest, namespace: soak }}
spec:
  rules:
  - name: fastest
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
"#
    )
}

/// Resident memory (KiB) and open descriptors of `pid`.
fn proc_usage(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds)
}

/// Sum of the samples of `name` (exactly that name, any labels) whose label set contains
/// every `(key, value)` of `with`.
fn metric_sum(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.rfind('}')?;
                    (&r[..end], r[end + 1..].trim())
                }
                None if rest.starts_with(' ') => ("", rest.trim()),
                None => return None,
            };
            let ok = with
                .iter()
                .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
            let value = value.split_whitespace().next()?;
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

struct Fleet {
    _workers: Vec<Proc>,
    worker_urls: Vec<String>,
    gateway: Proc,
    listen: String,
    admin: String,
}

async fn start(args: &SoakArgs, work: &Path) -> Result<Fleet, String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    let sim = procs::sibling("kinf-sim");
    let mut workers = Vec::new();
    let mut urls = Vec::new();
    for i in 0..args.workers {
        let mut cmd = Command::new(&sim);
        cmd.args(["serve", "--port", "0", "--model", "tiny-llama"])
            .args(["--profile", "tiny", "--max-model-len", "4096"])
            .args(["--speed", &args.speed.to_string()])
            .args(["--kv-events-port", "0", "--replay-port", "0"])
            .args(["--seed", &(args.seed + i as u64).to_string()]);
        let (p, line) = procs::spawn_with_line(
            &format!("kinf-sim-{i}"),
            cmd,
            &work.join(format!("sim-{i}.log")),
            Duration::from_secs(20),
        )?;
        let http = line["http"]
            .as_str()
            .ok_or_else(|| format!("kinf-sim-{i}: no http address in {line}"))?
            .to_owned();
        urls.push(http);
        workers.push(p);
    }
    let dir = work.join("config");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("c.yaml"), config(&urls)).map_err(|e| e.to_string())?;
    let keys: String = TENANTS.iter().map(|(t, k)| format!("{t}: {k}\n")).collect();
    std::fs::write(dir.join("keys.txt"), keys).map_err(|e| e.to_string())?;
    let listen = format!("127.0.0.1:{}", procs::free_port()?);
    let admin = format!("127.0.0.1:{}", procs::free_port()?);
    let mut cmd = Command::new(procs::sibling("kinference"));
    cmd.args(["serve", "--config"])
        .arg(&dir)
        .args(["--listen", &listen, "--admin-listen", &admin])
        .env("KINFERENCE_LOG", "warn");
    let gateway = procs::spawn_logged("kinference", cmd, &work.join("kinference.log"))?;
    let client = procs::http_client();
    let ready_url = format!("http://{admin}/readyz");
    let ready = procs::wait_until(Duration::from_secs(30), || {
        let c = client.clone();
        let u = ready_url.clone();
        async move { matches!(procs::get(&c, &u).await, Some((200, _))) }
    })
    .await;
    if !ready {
        return Err(format!(
            "kinference did not become ready: {}",
            procs::log_tail(&work.join("kinference.log"), 5)
        ));
    }
    Ok(Fleet {
        _workers: workers,
        worker_urls: urls,
        gateway,
        listen,
        admin,
    })
}

/// The `i`-th request: tenant index, whether streamed, body.
fn request(i: u64, max_tokens: u32) -> (usize, bool, Bytes) {
    let tenant = (i % TENANTS.len() as u64) as usize;
    let stream = i % 2 == 1;
    let system = format!(
        "You are assistant number {} of the soak test. Answer briefly and politely.",
        i % 5
    );
    let body = json!({
        "model": "tiny",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Question {i}: what happens next?")}
        ]
    });
    (tenant, stream, Bytes::from(body.to_string()))
}

/// One request through the gateway; its end-to-end latency, or an error.
async fn send(client: &Http, url: &str, tenant: usize, body: Bytes) -> Result<f64, String> {
    let t = Instant::now();
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", TENANTS[tenant].1))
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != 200 {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ));
    }
    if body.windows(9).any(|w| w == b"\"error\":{") {
        return Err("error event in the stream".into());
    }
    Ok(t.elapsed().as_secs_f64())
}

#[derive(Default)]
struct Window {
    latencies: Vec<f64>,
    errors: u64,
    first_error: Option<String>,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn workers_metrics(client: &Http, urls: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for u in urls {
        let text = procs::get(client, &format!("http://{u}/metrics"))
            .await
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        out.push(text);
    }
    out
}

fn workers_sum(texts: &[String], name: &str) -> f64 {
    texts.iter().map(|t| metric_sum(t, name, &[])).sum()
}

async fn capacity(args: &SoakArgs, client: &Http, url: &str) -> Result<f64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(args.probe_seconds);
    let next = Arc::new(AtomicU64::new(1 << 40));
    let mut tasks = Vec::new();
    for _ in 0..args.probe_concurrency {
        let (client, url, done, next) =
            (client.clone(), url.to_owned(), done.clone(), next.clone());
        let max_tokens = args.max_tokens;
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let (tenant, _, body) = request(i, max_tokens);
                if send(&client, &url, tenant, body).await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let t = Instant::now();
    for task in tasks {
        let _ = task.await;
    }
    let rps = done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64();
    if rps <= 0.0 {
        return Err("the capacity probe completed no request".into());
    }
    Ok(rps)
}

async fn run(args: &SoakArgs, work: &Path) -> Result<Value, String> {
    eprintln!("kinf-bench soak: logs and config in {}", work.display());
    let fleet = start(args, work).await?;
    let client = procs::http_client();
    let url = format!("http://{}/v1/chat/completions", fleet.listen);
    let pid = fleet.gateway.child.id();

    let capacity_rps = capacity(args, &client, &url).await?;
    let rate = capacity_rps * args.load;
    eprintln!("capacity {capacity_rps:.1} req/s; offering {rate:.1} req/s");
    // The probe's traffic is in the counters too; the drift check compares totals, which
    // include it on both sides.

    let window = Arc::new(Mutex::new(Window::default()));
    let total = Arc::new(AtomicU64::new(0));
    let errors_total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let end = started + args.duration;
    let mut rng = kinf_sim::hash::Rng::new(args.seed);
    let mut windows: Vec<Value> = Vec::new();
    let mut next_sample = started + args.window;
    let mut prev_worker = workers_metrics(&client, &fleet.worker_urls).await;
    let mut in_flight = tokio::task::JoinSet::new();
    let mut i: u64 = 0;
    let mut next_arrival = started;
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_sample {
            let w = std::mem::take(&mut *window.lock().await);
            let cur_worker = workers_metrics(&client, &fleet.worker_urls).await;
            let d = |name: &str| workers_sum(&cur_worker, name) - workers_sum(&prev_worker, name);
            // The workers report simulated seconds: wall = simulated / speed.
            let worker_e2e = d("vllm:e2e_request_latency_seconds_sum")
                / d("vllm:e2e_request_latency_seconds_count").max(1.0)
                / args.speed;
            prev_worker = cur_worker;
            let (rss, fds) = proc_usage(pid);
            let mut lat = w.latencies;
            let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
            let n = lat.len();
            windows.push(json!({
                "t_s": (now - started).as_secs_f64().round(),
                "requests": n,
                "errors": w.errors,
                "first_error": w.first_error,
                "rps": n as f64 / args.window.as_secs_f64(),
                "e2e_p50_ms": percentile(&mut lat, 0.5) * 1e3,
                "e2e_p99_ms": percentile(&mut lat, 0.99) * 1e3,
                "added_mean_ms": (mean - worker_e2e) * 1e3,
                "rss_kib": rss,
                "fds": fds,
            }));
            eprintln!(
                "{}",
                windows.last().map(Value::to_string).unwrap_or_default()
            );
            next_sample += args.window;
        }
        if now < next_arrival {
            tokio::time::sleep((next_arrival - now).min(Duration::from_millis(20))).await;
            continue;
        }
        let (tenant, _, body) = request(i, args.max_tokens);
        i += 1;
        let (client, url, window, total, errors_total) = (
            client.clone(),
            url.clone(),
            window.clone(),
            total.clone(),
            errors_total.clone(),
        );
        in_flight.spawn(async move {
            let r = send(&client, &url, tenant, body).await;
            total.fetch_add(1, Ordering::Relaxed);
            let mut w = window.lock().await;
            match r {
                Ok(l) => w.latencies.push(l),
                Err(e) => {
                    w.errors += 1;
                    errors_total.fetch_add(1, Ordering::Relaxed);
                    w.first_error.get_or_insert(e);
                }
            }
        });
        while in_flight.try_join_next().is_some() {}
        // Exponential inter-arrival times.
        let gap = -(1.0 - rng.next_f64()).ln() / rate;
        next_arrival += Duration::from_secs_f64(gap);
    }
    while in_flight.join_next().await.is_some() {}
    // Let the workers' and the gateway's counters settle.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let admin_metrics = procs::get(&client, &format!("http://{}/metrics", fleet.admin))
        .await
        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let worker_texts = workers_metrics(&client, &fleet.worker_urls).await;
    let gw_tokens = |kind: &str| {
        metric_sum(
            &admin_metrics,
            "kinference_tenant_tokens_total",
            &[("kind", kind)],
        )
    };
    let gw_prompt = gw_tokens("uncached_prompt") + gw_tokens("cached_prompt");
    let gw_output = gw_tokens("output");
    let gw_requests = metric_sum(
        &admin_metrics,
        "kinference_tenant_requests_total",
        &[("outcome", "completed")],
    );
    let wk_prompt = workers_sum(&worker_texts, "vllm:prompt_tokens_total");
    let wk_output = workers_sum(&worker_texts, "vllm:generation_tokens_total");
    let wk_requests = workers_sum(&worker_texts, "vllm:request_success_total");
    let per_tenant: Vec<Value> = TENANTS
        .iter()
        .map(|(t, _)| {
            json!({
                "tenant": t,
                "requests": metric_sum(&admin_metrics, "kinference_tenant_requests_total", &[("tenant", t)]),
                "output_tokens": metric_sum(&admin_metrics, "kinference_tenant_tokens_total", &[("tenant", t), ("kind", "output")]),
            })
        })
        .collect();

    // Checks over the windows after warm-up.
    let warm: Vec<&Value> = windows
        .iter()
        .filter(|w| w["t_s"].as_f64().unwrap_or(0.0) >= args.warmup.as_secs_f64())
        .collect();
    let num = |w: &Value, k: &str| w[k].as_f64().unwrap_or(0.0);
    let (rss_warm, rss_end) = match (warm.first(), warm.last()) {
        (Some(a), Some(b)) => (num(a, "rss_kib"), num(b, "rss_kib")),
        _ => (0.0, 0.0),
    };
    let memory_growth = if rss_warm > 0.0 {
        (rss_end - rss_warm) / rss_warm
    } else {
        0.0
    };
    let third = (warm.len() / 3).max(1);
    let max_fds = |ws: &[&Value]| ws.iter().map(|w| num(w, "fds")).fold(0.0, f64::max);
    let fds_first = max_fds(&warm[..third.min(warm.len())]);
    let fds_last = max_fds(&warm[warm.len().saturating_sub(third)..]);
    let overhead_first = warm.first().map_or(0.0, |w| num(w, "added_mean_ms"));
    let overhead_last = warm.last().map_or(0.0, |w| num(w, "added_mean_ms"));
    let errors = errors_total.load(Ordering::Relaxed);
    let checks = json!({
        "memory": !warm.is_empty() && memory_growth <= args.max_memory_growth,
        "file_descriptors": !warm.is_empty() && fds_last <= fds_first + 8.0,
        "accounting": gw_prompt == wk_prompt && gw_output == wk_output && gw_requests == wk_requests && wk_requests > 0.0,
        "errors": errors == 0,
        "overhead": overhead_last <= 2.0 * overhead_first.max(0.0) + 1.0,
    });
    let passed = checks
        .as_object()
        .is_some_and(|m| m.values().all(|v| v.as_bool() == Some(true)));
    Ok(json!({
        "bench": "soak",
        "duration_s": args.duration.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "workers": args.workers,
        "speed": args.speed,
        "capacity_rps": capacity_rps,
        "offered_rps": rate,
        "requests": total.load(Ordering::Relaxed),
        "errors": errors,
        "memory": {"rss_after_warmup_kib": rss_warm, "rss_end_kib": rss_end, "growth": memory_growth},
        "file_descriptors": {"max_first_third": fds_first, "max_last_third": fds_last},
        "overhead_mean_ms": {"first_window": overhead_first, "last_window": overhead_last},
        "per_worker_requests": worker_texts
            .iter()
            .map(|t| metric_sum(t, "vllm:request_success_total", &[]))
            .collect::<Vec<_>>(),
        "accounting": {
            "gateway": {"prompt_tokens": gw_prompt, "output_tokens": gw_output, "requests": gw_requests},
            "workers": {"prompt_tokens": wk_prompt, "output_tokens": wk_output, "requests": wk_requests},
            "per_tenant": per_tenant,
        },
        "checks": checks,
        "passed": passed,
        "windows": windows,
    }))
}

fn markdown(v: &Value) -> String {
    let mut s = format!(
        "Soak: {} s at {:.1} req/s ({:.0}% of {:.1} req/s capacity), {} workers; {} requests, {} errors; passed: {}\n\n",
        v["duration_s"],
        v["offered_rps"].as_f64().unwrap_or(0.0),
        100.0 * v["offered_rps"].as_f64().unwrap_or(0.0)
            / v["capacity_rps"].as_f64().unwrap_or(1.0),
        v["capacity_rps"].as_f64().unwrap_or(0.0),
        v["workers"],
        v["requests"],
        v["errors"],
        v["passed"]
    );
    s.push_str("| t (s) | req/s | e2e p50 (ms) | e2e p99 (ms) | added mean (ms) | RSS (KiB) | fds |\n|---|---|---|---|---|---|---|\n");
    for w in v["windows"].as_array().into_iter().flatten() {
        let f = |k: &str| w[k].as_f64().unwrap_or(0.0);
        s.push_str(&format!(
            "| {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} |\n",
            f("t_s"),
            f("rps"),
            f("e2e_p50_ms"),
            f("e2e_p99_ms"),
            f("added_mean_ms"),
            f("rss_kib"),
            f("fds")
        ));
    }
    s.push_str(&format!("\nChecks: {}\n", v["checks"]));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_filters_by_name_and_labels() {
        let t = "# HELP x\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"2\"} 4\nx_total_other 9\nx_total 1\n";
        assert_eq!(metric_sum(t, "x_total", &[]), 8.0);
        assert_eq!(metric_sum(t, "x_total", &[("a", "1")]), 3.0);
        assert_eq!(metric_sum(t, "x_total", &[("b", "3")]), 0.0);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("3 weeks").is_err());
    }
}
