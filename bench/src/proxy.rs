//! `kinf-bench proxy`: what the gateway adds over going straight to a worker, next to the
//! `vllm-router` PyPI package doing the same job, in the same run.
//!
//! Starts N `kinf-sim serve` workers with (almost) zero engine time, `kinference serve` on a
//! generated configuration pointing at them, and (when installed) `vllm-router` pointing at the
//! same workers; then drives each target with a keep-alive hyper client: a latency run at
//! concurrency 1 and a throughput run at a fixed concurrency, for a small chat request and for
//! a ≈16k-token one (`max_tokens: 1`, not streamed).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::procs::{
    Http, Proc, free_port, get, http_client, peers_venv, post, sibling, spawn_with_line, wait_until,
};

/// How `kinf-bench proxy` prints its result.
#[derive(Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyFormat {
    /// Markdown tables.
    #[default]
    Md,
    /// One JSON object.
    Json,
}

/// The options of `kinf-bench proxy`.
#[derive(clap::Args, Clone)]
pub struct ProxyArgs {
    /// Simulated workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Timed requests of the small case, per target and run.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Timed requests of the ≈16k-token case, per target and run.
    #[arg(long, default_value_t = 100)]
    pub long_requests: usize,
    /// Untimed requests sent to each target before its first round, and a quarter as many
    /// before each later round (the long case: W/10, at least 5).
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Rounds: each target's requests are split into this many runs, taken in turn.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Concurrency of the throughput runs (the latency runs use 1).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Approximate prompt length of the long case (tokens).
    #[arg(long, default_value_t = 16000)]
    pub long_tokens: usize,
    /// Skip the long case.
    #[arg(long)]
    pub no_long: bool,
    /// Skip the small case.
    #[arg(long)]
    pub no_small: bool,
    /// Leave `kvEvents` out of the gateway's worker set (prefix tracking from its own routing
    /// only), to see what KV-event ingestion costs.
    #[arg(long)]
    pub no_kv_events: bool,
    /// `kinf-sim --speed` (simulated seconds per wall second; large = engine time ≈ 0).
    #[arg(long, default_value_t = 1e6)]
    pub speed: f64,
    /// `kinference` binary (default: next to this one).
    #[arg(long)]
    pub kinference: Option<PathBuf>,
    /// `kinf-sim` binary (default: next to this one).
    #[arg(long)]
    pub kinf_sim: Option<PathBuf>,
    /// `vllm-router` executable (default: `$KINF_PEERS_VENV` or
    /// `~/.cache/kinference/peers-venv`, `bin/vllm-router`; install with scripts/peers/setup.sh).
    #[arg(long)]
    pub vllm_router: Option<PathBuf>,
    /// vllm-router `--policy`.
    #[arg(long, default_value = "cache_aware")]
    pub vllm_router_policy: String,
    /// Fail when vllm-router cannot be run (otherwise its results are `null`, with a reason).
    #[arg(long)]
    pub require_peer: bool,
    /// Tokenizer directory used by the workers and the gateway.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Client runtime threads.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Extra argument for `kinference serve` (repeatable), e.g. `--gateway-arg=--busy-poll=200us`.
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    pub gateway_args: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: ProxyFormat,
}

/// The body of request `i` of a run.
type BodyFn = Arc<dyn Fn(usize) -> Bytes + Send + Sync>;

/// The chat request body of a case; `salt` makes each long prompt different (so that no cache
/// anywhere, tokenization included, can serve it).
fn chat_body(model: &str, content: &str) -> Bytes {
    Bytes::from(
        json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1})
            .to_string(),
    )
}

const WORDS: [&str; 32] = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "runs", "into",
    "forest", "where", "many", "other", "animals", "live", "together", "under", "tall", "green",
    "trees", "near", "river", "that", "flows", "down", "from", "high", "mountain", "peaks",
];

fn long_text(words: usize, salt: u64) -> String {
    let mut s = format!("Document {salt}:");
    let mut x = salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(' ');
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    s
}

/// The result of one run.
struct Run {
    ns: Vec<u64>,
    errors: usize,
    first_error: Option<String>,
    wall: Duration,
}

impl Run {
    fn empty() -> Self {
        Run {
            ns: Vec::new(),
            errors: 0,
            first_error: None,
            wall: Duration::ZERO,
        }
    }

    fn merge(&mut self, o: Run) {
        self.ns.extend(o.ns);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.wall += o.wall;
    }
}

/// Sends `n` requests (after `warmup`) at concurrency `c`; request `i` goes to
/// `urls[i % urls.len()]` with body `body(i)`.
async fn drive(
    client: &Http,
    urls: &[String],
    body: BodyFn,
    c: usize,
    warmup: usize,
    n: usize,
) -> Run {
    let urls: Arc<Vec<String>> = Arc::new(urls.to_vec());
    let client = client.clone();
    let one = move |i: usize| {
        let client = client.clone();
        let urls = urls.clone();
        let body = body.clone();
        async move {
            let b = body(i);
            let t = Instant::now();
            let r = post(&client, &urls[i % urls.len()], b).await;
            let ns = t.elapsed().as_nanos() as u64;
            match r {
                Ok((200, _)) => Ok(ns),
                Ok((s, b)) => Err(format!(
                    "HTTP {s}: {}",
                    String::from_utf8_lossy(&b[..b.len().min(300)])
                )),
                Err(e) => Err(e),
            }
        }
    };
    for i in 0..warmup {
        let _ = one(usize::MAX / 2 - i).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(c);
    for _ in 0..c.max(1) {
        let next = next.clone();
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut ns = Vec::new();
            let mut errors = 0;
            let mut first_error = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                match one(i).await {
                    Ok(x) => ns.push(x),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
            (ns, errors, first_error)
        }));
    }
    let mut run = Run {
        ns: Vec::with_capacity(n),
        errors: 0,
        first_error: None,
        wall: Duration::ZERO,
    };
    for t in tasks {
        if let Ok((ns, e, fe)) = t.await {
            run.ns.extend(ns);
            run.errors += e;
            if run.first_error.is_none() {
                run.first_error = fe;
            }
        }
    }
    run.wall = start.elapsed();
    run
}

fn pct(sorted: &[u64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .map_or(f64::NAN, |&x| x as f64 / 1e6)
}

fn r3(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

fn run_json(run: &Run, c: usize) -> Value {
    let mut ns = run.ns.clone();
    ns.sort_unstable();
    let mean = if ns.is_empty() {
        f64::NAN
    } else {
        ns.iter().map(|&x| x as f64).sum::<f64>() / ns.len() as f64 / 1e6
    };
    json!({
        "concurrency": c,
        "requests": ns.len(),
        "errors": run.errors,
        "first_error": run.first_error,
        "p50_ms": r3(pct(&ns, 0.5)),
        "p99_ms": r3(pct(&ns, 0.99)),
        "mean_ms": r3(mean),
        "min_ms": r3(pct(&ns, 0.0)),
        "rps": ((ns.len() as f64 / run.wall.as_secs_f64()) * 10.0).round() / 10.0,
    })
}

struct Target {
    name: &'static str,
    urls: Vec<String>,
    /// The proxy's process (its CPU time is measured); `None` for direct.
    pid: Option<u32>,
}

/// User + system CPU time of a process so far (Linux `/proc`), in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Runs `kinf-bench proxy`; `Err` is a message for stderr (exit 1).
pub fn main(args: ProxyArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let work = std::env::temp_dir().join(format!("kinf-bench-proxy-{}", std::process::id()));
    let out = rt.block_on(run(&args, &work))?;
    // Logs are kept only when the run failed.
    let _ = std::fs::remove_dir_all(&work);
    match args.format {
        ProxyFormat::Json => println!("{out}"),
        ProxyFormat::Md => print!("{}", markdown(&out)),
    }
    Ok(())
}

async fn run(args: &ProxyArgs, work: &Path) -> Result<Value, String> {
    std::fs::create_dir_all(work.join("config")).map_err(|e| e.to_string())?;
    eprintln!(
        "kinf-bench proxy: logs and config in {} (kept if the run fails)",
        work.display()
    );
    let tok = args.tokenizer.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/tokenizers/tiny-llama"
        ))
    });
    let tok = tok
        .canonicalize()
        .map_err(|e| format!("tokenizer {}: {e}", tok.display()))?;
    let sim_bin = args.kinf_sim.clone().unwrap_or_else(|| sibling("kinf-sim"));
    let gw_bin = args
        .kinference
        .clone()
        .unwrap_or_else(|| sibling("kinference"));
    let model = "tiny-llama";
    let block_size = 16;
    let max_model_len = (args.long_tokens * 2).max(4096);

    // Workers.
    let mut procs: Vec<Proc> = Vec::new();
    let mut workers = Vec::new();
    let mut kv_sources = Vec::new();
    for i in 0..args.workers.max(1) {
        let mut cmd = Command::new(&sim_bin);
        cmd.args([
            "serve",
            "--port",
            "0",
            "--model",
            model,
            "--profile",
            "tiny",
        ])
        .args(["--speed", &args.speed.to_string()])
        .args(["--kv-events-port", "0", "--replay-port", "0"])
        .args(["--block-size", &block_size.to_string()])
        .args(["--max-model-len", &max_model_len.to_string()])
        .args([
            "--num-gpu-blocks",
            &(max_model_len * 4 / block_size).to_string(),
        ])
        .args(["--seed", &i.to_string()])
        .arg("--tokenizer")
        .arg(&tok)
        .env("RUST_LOG", "warn");
        let (p, line) = spawn_with_line(
            "kinf-sim",
            cmd,
            &work.join(format!("sim-{i}.log")),
            Duration::from_secs(30),
        )?;
        procs.push(p);
        let http = line["http"].as_str().unwrap_or_default().to_owned();
        kv_sources.push((http.clone(), line["kv_events"].as_str().map(str::to_owned)));
        workers.push(http);
    }

    // Gateway.
    let eps: Vec<String> = workers.iter().map(|w| json!(w).to_string()).collect();
    let config = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: bench-workers, namespace: bench }}
spec:
  endpoints: [{eps}]
  models:
  - name: {model}
    aliases: [tiny]
{kv}  metrics: {{ interval: 1s }}
  blockSize: {block_size}
  tokenizer: {{ path: {tok} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: bench-pool, namespace: bench }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: bench-workers }} ]
"#,
        eps = eps.join(", "),
        kv = if args.no_kv_events {
            ""
        } else {
            "  kvEvents: {}\n"
        },
        tok = json!(tok.display().to_string()),
    );
    std::fs::write(work.join("config/bench.yaml"), config).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&gw_bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(work.join("config"))
        .args(["--listen", "127.0.0.1:0"])
        .args(&args.gateway_args)
        .env("KINFERENCE_LOG", "warn");
    let (p, line) = spawn_with_line(
        "kinference",
        cmd,
        &work.join("kinference.log"),
        Duration::from_secs(30),
    )?;
    let gw = line["listen"].as_str().unwrap_or_default().to_owned();
    let gw_pid = p.child.id();
    procs.push(p);

    let client: Http = http_client();

    for w in &workers {
        let ok = wait_until(Duration::from_secs(20), || async {
            get(&client, &format!("http://{w}/health"))
                .await
                .is_some_and(|(s, _)| s == 200)
        })
        .await;
        if !ok {
            return Err(format!("kinf-sim {w} not healthy"));
        }
    }
    // Ready, every endpoint ready (metrics scraped), KV streams connected.
    let nworkers = workers.len();
    let ready = wait_until(Duration::from_secs(30), || async {
        let Some((200, body)) = get(&client, &format!("http://{gw}/admin/status")).await else {
            return false;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            return false;
        };
        let eps = v["endpoints"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|e| e["ready"] == true && e["stale"] != true)
                .count()
        });
        let kv = v["ingestion"].as_array().map_or(0, |a| {
            a.iter().filter(|e| e["kv"]["connected"] == true).count()
        });
        eps == nworkers && (kv == nworkers || args.no_kv_events)
    })
    .await;
    if !ready {
        let status = get(&client, &format!("http://{gw}/admin/status"))
            .await
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
        return Err(format!(
            "kinference at {gw} did not become ready with {nworkers} endpoints: {status:?}"
        ));
    }

    // vllm-router.
    let vr_bin = args
        .vllm_router
        .clone()
        .unwrap_or_else(|| peers_venv().join("bin/vllm-router"));
    let mut vllm_router_info = Value::Null;
    let mut vllm_router_reason = Value::Null;
    let mut vr_addr = None;
    let mut vr_pid = None;
    match start_vllm_router(args, &vr_bin, &workers, work, &client, model).await {
        Ok((p, addr, info)) => {
            vr_pid = Some(p.child.id());
            procs.push(p);
            vr_addr = Some(addr);
            vllm_router_info = info;
        }
        Err(e) => {
            if args.require_peer {
                return Err(format!("vllm-router: {e}"));
            }
            eprintln!("kinf-bench proxy: vllm-router not measured: {e}");
            vllm_router_reason = json!(e);
        }
    }

    let mut targets = vec![
        Target {
            name: "direct",
            urls: workers
                .iter()
                .map(|w| format!("http://{w}/v1/chat/completions"))
                .collect(),
            pid: None,
        },
        Target {
            name: "kinference",
            urls: vec![format!("http://{gw}/v1/chat/completions")],
            pid: Some(gw_pid),
        },
    ];
    if let Some(a) = &vr_addr {
        targets.push(Target {
            name: "vllm_router",
            urls: vec![format!("http://{a}/v1/chat/completions")],
            pid: vr_pid,
        });
    }

    // Prompt sizes, as the worker counts them.
    let small_content = "Hello! Can you tell me a short joke about routers?";
    let prompt_tokens = |body: Bytes| {
        let client = client.clone();
        let url = targets[0].urls[0].clone();
        async move {
            post(&client, &url, body)
                .await
                .ok()
                .and_then(|(_, b)| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v["usage"]["prompt_tokens"].as_u64())
        }
    };
    let small_tokens = prompt_tokens(chat_body(model, small_content)).await;
    let mut long_words = args.long_tokens;
    let mut long_tokens = None;
    if !args.no_long {
        // One calibration step: scale the word count to the measured tokens per word.
        if let Some(t) = prompt_tokens(chat_body(model, &long_text(1000, 1))).await {
            long_words = (1000.0 * args.long_tokens as f64 / t as f64) as usize;
        }
        long_tokens = prompt_tokens(chat_body(model, &long_text(long_words, 2))).await;
    }

    let mut cases = serde_json::Map::new();
    let small_body = chat_body(model, small_content);
    let case_list: Vec<(&str, BodyFn, usize, Option<u64>)> = {
        let mut v: Vec<(&str, BodyFn, usize, Option<u64>)> = Vec::new();
        if !args.no_small {
            v.push((
                "small",
                Arc::new(move |_| small_body.clone()),
                args.requests,
                small_tokens,
            ));
        }
        if !args.no_long {
            // Every request a different document (its first words differ), so that neither a
            // tokenization cache nor the workers' prefix caches serve it.
            let bodies: Arc<Vec<Bytes>> = Arc::new(
                (0..64)
                    .map(|s| chat_body(model, &long_text(long_words, 1000 + s)))
                    .collect(),
            );
            let salt = Arc::new(AtomicUsize::new(0));
            v.push((
                "long",
                Arc::new(move |_| {
                    let k = salt.fetch_add(1, Ordering::Relaxed);
                    // Rotate the first bytes so that a 64-body pool still gives unique prompts.
                    let b = &bodies[k % bodies.len()];
                    let s = String::from_utf8_lossy(b).replacen(
                        "Document ",
                        &format!("Document {k}-"),
                        1,
                    );
                    Bytes::from(s)
                }),
                args.long_requests,
                long_tokens,
            ));
        }
        v
    };
    for (name, body, n, tokens) in case_list {
        let mut per = serde_json::Map::new();
        let warm = if name == "small" {
            args.warmup
        } else {
            (args.warmup / 10).max(5)
        };
        // Rounds: every target in turn, so that a machine whose load drifts (shared CPUs)
        // biases no target more than another.
        let rounds = args.rounds.clamp(1, n.max(1));
        let mut acc: Vec<(Run, Run)> = targets
            .iter()
            .map(|_| (Run::empty(), Run::empty()))
            .collect();
        // The proxy's CPU ticks during the latency runs and during the throughput runs.
        let mut cpu: Vec<(u64, u64)> = vec![(0, 0); targets.len()];
        for r in 0..rounds {
            let share = n / rounds + usize::from(r < n % rounds);
            for (k, (t, (lat, thr))) in targets.iter().zip(acc.iter_mut()).enumerate() {
                eprintln!(
                    "kinf-bench proxy: {name} → {} (round {}/{rounds})",
                    t.name,
                    r + 1
                );
                let w = if r == 0 { warm } else { warm / 4 };
                let ticks = || t.pid.and_then(cpu_ticks).unwrap_or(0);
                // Warm-up only (no timed requests).
                let _ = drive(&client, &t.urls, body.clone(), 1, w, 0).await;
                let t0 = ticks();
                lat.merge(drive(&client, &t.urls, body.clone(), 1, 0, share).await);
                let t1 = ticks();
                thr.merge(
                    drive(
                        &client,
                        &t.urls,
                        body.clone(),
                        args.concurrency,
                        0,
                        share * 2,
                    )
                    .await,
                );
                let t2 = ticks();
                cpu[k].0 += t1.saturating_sub(t0);
                cpu[k].1 += t2.saturating_sub(t1);
            }
        }
        for (k, (t, (lat, thr))) in targets.iter().zip(acc.iter()).enumerate() {
            let mut l = run_json(lat, 1);
            let mut h = run_json(thr, args.concurrency);
            if t.pid.is_some() {
                // Ticks are 10 ms: meaningful over hundreds of requests.
                let cpu_ms = |ticks: u64, n: usize| r3(ticks as f64 * 10.0 / n.max(1) as f64);
                l["proxy_cpu_ms_per_request"] = cpu_ms(cpu[k].0, lat.ns.len() + lat.errors);
                h["proxy_cpu_ms_per_request"] = cpu_ms(cpu[k].1, thr.ns.len() + thr.errors);
            }
            per.insert(t.name.to_owned(), json!({"latency": l, "throughput": h}));
        }
        // Added latency: via − direct, percentile by percentile.
        let d = per.get("direct").cloned().unwrap_or(Value::Null);
        for via in ["kinference", "vllm_router"] {
            let Some(v) = per.get_mut(via) else {
                continue;
            };
            for (run, pre) in [("latency", ""), ("throughput", "throughput_")] {
                for p in ["p50", "p99"] {
                    let k = format!("{p}_ms");
                    let added = match (v[run][&k].as_f64(), d[run][&k].as_f64()) {
                        (Some(a), Some(b)) => r3(a - b),
                        _ => Value::Null,
                    };
                    v[format!("{pre}added_{p}_ms")] = added;
                }
            }
            v["rps"] = v["throughput"]["rps"].clone();
        }
        if let Some(v) = per.get_mut("direct") {
            v["rps"] = v["throughput"]["rps"].clone();
        }
        if vr_addr.is_none() {
            per.insert("vllm_router".into(), Value::Null);
        }
        per.insert("prompt_tokens".into(), json!(tokens));
        cases.insert(name.to_owned(), Value::Object(per));
    }

    let targets_met = targets_check(&cases);
    drop(procs);
    Ok(json!({
        "bench": "proxy",
        "params": {
            "workers": workers.len(), "requests": args.requests, "long_requests": args.long_requests,
            "warmup": args.warmup, "concurrency": args.concurrency, "speed": args.speed,
            "profile": "tiny", "block_size": block_size, "max_tokens": 1, "stream": false,
            "client_threads": args.client_threads, "rounds": args.rounds, "gateway_kv_events": !args.no_kv_events, "gateway_args": args.gateway_args, "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        },
        "vllm_router": vllm_router_info,
        "vllm_router_reason": vllm_router_reason,
        "cases": cases,
        "targets": targets_met,
    }))
}

/// The issue's targets: small added p50 ≤ 0.2 ms and p99 ≤ 1 ms; long added p50 ≤ 2 ms;
/// throughput (small) not below vllm-router's.
fn targets_check(cases: &serde_json::Map<String, Value>) -> Value {
    let get = |c: &str, t: &str, k: &str| cases.get(c).and_then(|v| v[t][k].as_f64());
    let le = |x: Option<f64>, lim: f64| x.map(|x| x <= lim);
    let rps_ok = match (
        get("small", "kinference", "rps"),
        get("small", "vllm_router", "rps"),
    ) {
        (Some(a), Some(b)) => Some(a >= b),
        _ => None,
    };
    json!({
        "small_added_p50_le_0_2ms": le(get("small", "kinference", "added_p50_ms"), 0.2),
        "small_added_p99_le_1ms": le(get("small", "kinference", "added_p99_ms"), 1.0),
        "long_added_p50_le_2ms": le(get("long", "kinference", "added_p50_ms"), 2.0),
        "small_rps_ge_vllm_router": rps_ok,
    })
}

async fn start_vllm_router(
    args: &ProxyArgs,
    bin: &Path,
    workers: &[String],
    work: &Path,
    client: &Http,
    model: &str,
) -> Result<(Proc, String, Value), String> {
    if !bin.exists() {
        return Err(format!(
            "{} not found (run scripts/peers/setup.sh, or pass --vllm-router)",
            bin.display()
        ));
    }
    let version = Command::new(bin.with_file_name("python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('vllm-router'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let port = free_port()?;
    let prom = free_port()?;
    let log = work.join("vllm-router.log");
    let f = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let f2 = f.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--worker-urls")
        .args(workers.iter().map(|w| format!("http://{w}")))
        .args(["--policy", &args.vllm_router_policy])
        .args(["--disable-retries", "--disable-circuit-breaker"])
        .args(["--log-level", "warning"])
        .args(["--prometheus-port", &prom.to_string()])
        .args(["--worker-startup-check-interval", "1"])
        .args(["--worker-startup-timeout-secs", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(f))
        .stderr(Stdio::from(f2));
    let argv: Vec<String> = std::iter::once(bin.display().to_string())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let mut proc = Proc {
        name: "vllm-router".into(),
        child,
    };
    let addr = format!("127.0.0.1:{port}");
    let url = format!("http://{addr}/v1/chat/completions");
    let body = chat_body(model, "ping");
    let ok = wait_until(Duration::from_secs(60), || {
        let body = body.clone();
        let url = url.clone();
        async move {
            matches!(
                tokio::time::timeout(Duration::from_secs(5), post(client, &url, body)).await,
                Ok(Ok((200, _)))
            )
        }
    })
    .await;
    if !ok {
        let exited = proc.child.try_wait().ok().flatten();
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(format!(
            "{} did not answer on {addr} (exit: {exited:?}; log {}: {tail})",
            proc.name,
            log.display()
        ));
    }
    Ok((
        proc,
        addr,
        json!({"version": version, "policy": args.vllm_router_policy, "argv": argv}),
    ))
}

fn markdown(v: &Value) -> String {
    let mut s = String::new();
    let p = &v["params"];
    s.push_str(&format!(
        "## kinf-bench proxy\n\n{} kinf-sim workers (profile tiny, speed {}), block size {}, \
         `max_tokens: 1`, not streamed; latency at concurrency 1, throughput at concurrency {} \
         (@C); proxy CPU: the proxy process's CPU time per request at 1 / at C; {} CPUs.\n\n",
        p["workers"], p["speed"], p["block_size"], p["concurrency"], p["cpus"]
    ));
    match (&v["vllm_router"], &v["vllm_router_reason"]) {
        (Value::Null, r) => s.push_str(&format!("vllm-router: not measured ({r}).\n\n")),
        (i, _) => s.push_str(&format!(
            "vllm-router {} (policy `{}`).\n\n",
            i["version"].as_str().unwrap_or("?"),
            i["policy"].as_str().unwrap_or("?")
        )),
    }
    let f = |x: &Value| x.as_f64().map_or("–".to_owned(), |x| format!("{x:.3}"));
    let mut notes = String::new();
    for name in ["small", "long"] {
        let c = &v["cases"][name];
        if c.is_null() {
            continue;
        }
        s.push_str(&format!(
            "### {name} ({} prompt tokens)\n\n| target | p50 ms | p99 ms | added p50 ms | added p99 ms | p50 ms @C | p99 ms @C | rps @C | proxy CPU ms/req | errors |\n|---|---|---|---|---|---|---|---|---|---|\n",
            c["prompt_tokens"]
        ));
        for t in ["direct", "kinference", "vllm_router"] {
            let x = &c[t];
            if x.is_null() {
                s.push_str(&format!("| {t} | – | – | – | – | – | – | – | – | – |\n"));
                continue;
            }
            let errors = x["latency"]["errors"].as_u64().unwrap_or(0)
                + x["throughput"]["errors"].as_u64().unwrap_or(0);
            for run in ["latency", "throughput"] {
                if let Some(e) = x[run]["first_error"].as_str() {
                    notes.push_str(&format!("- {name}/{t}/{run}: first error: {e}\n"));
                }
            }
            s.push_str(&format!(
                "| {t} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {errors} |\n",
                f(&x["latency"]["p50_ms"]),
                f(&x["latency"]["p99_ms"]),
                f(&x["added_p50_ms"]),
                f(&x["added_p99_ms"]),
                f(&x["throughput"]["p50_ms"]),
                f(&x["throughput"]["p99_ms"]),
                x["rps"],
                f(&x["latency"]["proxy_cpu_ms_per_request"]),
                f(&x["throughput"]["proxy_cpu_ms_per_request"]),
            ));
        }
        s.push('\n');
    }
    s.push_str(&notes);
    s.push_str(&format!("\nTargets: {}\n", v["targets"]));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(vr: Value) -> Value {
        let t = |p50: f64, rps: f64, added: Option<f64>| {
            json!({"latency": {"p50_ms": p50, "p99_ms": p50 * 2.0, "errors": 0},
                   "throughput": {"p50_ms": p50, "p99_ms": p50, "errors": 0}, "rps": rps,
                   "added_p50_ms": added, "added_p99_ms": added})
        };
        json!({"params": {"workers": 2, "speed": 1e6, "block_size": 16, "concurrency": 16, "cpus": 2},
               "vllm_router": vr.clone(), "vllm_router_reason": if vr.is_null() { json!("not found") } else { Value::Null },
               "cases": {"small": {"prompt_tokens": 38, "direct": t(0.05, 100.0, None),
                                    "kinference": t(0.1, 90.0, Some(0.05)),
                                    "vllm_router": if vr.is_null() { Value::Null } else { t(0.4, 80.0, Some(0.35)) }}},
               "targets": {}})
    }

    #[test]
    fn targets_and_markdown_with_and_without_the_peer() {
        let with = result(json!({"version": "0.1.17", "policy": "cache_aware"}));
        let cases = with["cases"].as_object().cloned().unwrap_or_default();
        let t = targets_check(&cases);
        assert_eq!(t["small_added_p50_le_0_2ms"], json!(true));
        assert_eq!(t["small_rps_ge_vllm_router"], json!(true));
        assert_eq!(t["long_added_p50_le_2ms"], Value::Null);
        let md = markdown(&with);
        assert!(md.contains("| kinference | 0.100 |"), "{md}");
        assert!(md.contains("vllm-router 0.1.17"), "{md}");

        let without = result(Value::Null);
        let cases = without["cases"].as_object().cloned().unwrap_or_default();
        assert_eq!(
            targets_check(&cases)["small_rps_ge_vllm_router"],
            Value::Null
        );
        let md = markdown(&without);
        assert!(md.contains("not measured"), "{md}");
        assert!(md.contains("| vllm_router | – |"), "{md}");
    }

    #[test]
    fn long_documents_differ_and_percentiles_pick_ranks() {
        assert_ne!(long_text(50, 1), long_text(50, 2));
        assert_eq!(long_text(50, 1).split(' ').count(), 52);
        let v: Vec<u64> = (1..=100).map(|x| x * 1_000_000).collect();
        assert_eq!(pct(&v, 0.5), 51.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert!(pct(&[], 0.5).is_nan());
    }
}
