//! `kinf-bench live`: the simulation's workloads, scaled down, on real processes — `kinf-sim
//! serve` workers (time-scaled by `--speed`) behind one router (the `kinference` gateway or a
//! peer), with load from the built-in streaming client or from GuideLLM.
//!
//! Scaling: every token count of a workload is divided by `--scale` (default 8: shared-prefix
//! prompts are 2,000 + 32 tokens, 32 output tokens) and so is the workers' KV-cache capacity
//! (`--num-gpu-blocks`, default the profile's ÷ scale), so that the cache holds the same share
//! of the working set as at full scale. Times are reported in simulated seconds of the scaled
//! workload (wall × `--speed`; the fields the simulation uses) and in wall seconds (`wall`).
//! The TTFT SLO is the published one ÷ scale (8 s → 1 s for shared-prefix at scale 8), and
//! the default Poisson rate the simulation's light load × scale (same utilisation).
//!
//! Ports plan (`--base-port B`, 0: any free port): the router listens on B, its Prometheus
//! exporter (peers) on B+1; worker i serves HTTP on B+10+i, publishes KV events on B+40+i and
//! replays them on B+70+i. Everything binds 127.0.0.1. Workers are started afresh (cold caches,
//! seeds 0..N) for every run.

pub mod client;
pub mod guidellm;
pub mod routers;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::procs::{Http, Proc, get, http_client, sibling, spawn_with_line, wait_until};
use client::{Driver, Load, Record};
use routers::{Router, RouterCtx, Worker};
use workload::{Shape, Workload};

/// Which program generates the load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientKind {
    /// The built-in streaming client (chat completions; multiturn supported).
    #[default]
    Builtin,
    /// GuideLLM (`guidellm run`, PyPI `guidellm`; scripts/peers/setup-guidellm.sh), fed the same
    /// prompts from a file; single-turn workloads only.
    Guidellm,
}

impl ClientKind {
    fn name(self) -> &'static str {
        match self {
            ClientKind::Builtin => "builtin",
            ClientKind::Guidellm => "guidellm",
        }
    }
}

/// How `kinf-bench live` prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LiveFormat {
    /// A Markdown table row with a header.
    #[default]
    Md,
    /// One JSON object.
    Json,
}

/// The options of `kinf-bench live`.
#[derive(clap::Args, Clone, Debug)]
pub struct LiveArgs {
    /// Workload.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// Router in front of the workers.
    #[arg(long, value_enum)]
    pub router: Router,
    /// `kinf-sim serve` workers.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Simulated seconds per wall second (`kinf-sim --speed`). Higher is faster but adds the
    /// routers' and the client's own wall time × speed to every simulated figure, and shrinks
    /// the gateway's 30 s (wall) load window relative to the workload.
    #[arg(long, default_value_t = 4.0)]
    pub speed: f64,
    /// Token counts and KV-cache capacity divided by this.
    #[arg(long, default_value_t = 8)]
    pub scale: usize,
    /// Requests to send (multiturn: rounded up to whole conversations).
    #[arg(long, default_value_t = 120)]
    pub requests: usize,
    /// Stop starting sessions after this much simulated time (`90`, `90s`, `2m`).
    #[arg(long)]
    pub duration: Option<String>,
    /// `poisson:RATE` (requests per simulated second) or `concurrency:C` (closed loop).
    /// Default: the simulation's light load × scale × workers / 3 (times shrink with the token
    /// counts, so the rate grows to keep the same utilisation).
    #[arg(long)]
    pub load: Option<String>,
    /// Seed of the prompts and arrival times (the workers use seeds 0..N).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Load generator.
    #[arg(long, value_enum, default_value_t)]
    pub client: ClientKind,
    /// Engine profile of the workers.
    #[arg(long, default_value = "l40s-qwen27b-fp8")]
    pub profile: String,
    /// KV block size of the workers.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV-cache blocks per worker (default: the profile's ÷ scale).
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    /// First port of the plan (see the module docs); 0: any free ports.
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// Tokenizer directory of the workers, the gateway and GuideLLM.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// `kinference` binary (default: next to this one).
    #[arg(long)]
    pub kinference: Option<PathBuf>,
    /// `kinf-sim` binary (default: next to this one).
    #[arg(long)]
    pub kinf_sim: Option<PathBuf>,
    /// `vllm-router` executable (default: the peers venv's).
    #[arg(long)]
    pub vllm_router: Option<PathBuf>,
    /// `smg` (sglang-router) executable (default: the peers venv's).
    #[arg(long)]
    pub sglang_router: Option<PathBuf>,
    /// `guidellm` executable (default: `$KINF_GUIDELLM_VENV` or
    /// `~/.cache/kinference/guidellm-venv`, `bin/guidellm`).
    #[arg(long)]
    pub guidellm: Option<PathBuf>,
    /// Also write the JSON result to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Include every request's record in the JSON (`requests_detail`).
    #[arg(long)]
    pub detail: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: LiveFormat,
}

/// Parses a duration in seconds: `90`, `90s`, `2m`, `1h`.
pub fn parse_duration_s(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x * mul),
        _ => Err(format!("bad duration {s:?}")),
    }
}

/// Runs `kinf-bench live`; `Err` is a message for stderr (exit 1).
pub fn main(args: LiveArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let work = std::env::temp_dir().join(format!("kinf-bench-live-{}", std::process::id()));
    let out = rt.block_on(run(&args, &work));
    let out = match out {
        Ok(v) => v,
        Err(e) => return Err(format!("{e} (logs in {})", work.display())),
    };
    // Logs are kept only when the run failed.
    let _ = std::fs::remove_dir_all(&work);
    if let Some(p) = &args.out {
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
        std::fs::write(p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    match args.format {
        LiveFormat::Json => println!("{out}"),
        LiveFormat::Md => print!("{}", markdown(&[out])),
    }
    Ok(())
}

/// The profile's step constants, from `kinf-sim profiles --format json`.
struct Profile {
    num_gpu_blocks: usize,
    per_prefill_token_s: f64,
    fixed_s: f64,
}

fn read_profile(sim: &Path, name: &str) -> Result<Profile, String> {
    let out = Command::new(sim)
        .args(["profiles", "--format", "json"])
        .output()
        .map_err(|e| format!("{}: {e}", sim.display()))?;
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("kinf-sim profiles --format json: {e}"))?;
    let p = v
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .ok_or_else(|| format!("kinf-sim has no profile {name:?}"))?;
    Ok(Profile {
        num_gpu_blocks: p["num_gpu_blocks"].as_u64().unwrap_or(10_000) as usize,
        per_prefill_token_s: p["step"]["per_prefill_token_s"].as_f64().unwrap_or(0.0003),
        fixed_s: p["step"]["base_s"].as_f64().unwrap_or(0.0)
            + p["frontend"]["fixed_s"].as_f64().unwrap_or(0.0),
    })
}

/// Sums of the counters this run reads from each worker's `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub queries: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub hits: f64,
    /// `vllm:request_success_total`, all reasons.
    pub requests: f64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: f64,
}

/// Reads the counters from Prometheus text (label sets summed).
pub fn parse_counters(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or("");
        let Ok(x) = value.parse::<f64>() else {
            continue;
        };
        match name {
            "vllm:prefix_cache_queries_total" => c.queries += x,
            "vllm:prefix_cache_hits_total" => c.hits += x,
            "vllm:request_success_total" => c.requests += x,
            "vllm:num_preemptions_total" => c.preemptions += x,
            _ => {}
        }
    }
    c
}

async fn scrape(client: &Http, workers: &[Worker]) -> Result<Vec<Counters>, String> {
    let mut v = Vec::new();
    for w in workers {
        let Some((200, body)) = get(client, &format!("http://{}/metrics", w.http)).await else {
            return Err(format!("GET http://{}/metrics failed", w.http));
        };
        v.push(parse_counters(&String::from_utf8_lossy(&body)));
    }
    Ok(v)
}

fn start_workers(
    args: &LiveArgs,
    sim: &Path,
    tok: &Path,
    blocks: usize,
    work: &Path,
) -> Result<(Vec<Proc>, Vec<Worker>), String> {
    let mut procs = Vec::new();
    let mut workers = Vec::new();
    let port = |off: u16, i: usize| -> String {
        if args.base_port == 0 {
            "0".into()
        } else {
            (u32::from(args.base_port) + u32::from(off) + i as u32).to_string()
        }
    };
    for i in 0..args.workers.max(1) {
        let mut cmd = Command::new(sim);
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port(10, i)])
            .args(["--model", MODEL, "--profile", &args.profile])
            .args(["--speed", &args.speed.to_string()])
            .args(["--kv-events-port", &port(40, i)])
            .args(["--replay-port", &port(70, i)])
            .args(["--block-size", &args.block_size.to_string()])
            .args(["--num-gpu-blocks", &blocks.to_string()])
            .args(["--seed", &i.to_string()])
            .arg("--tokenizer")
            .arg(tok)
            .env("RUST_LOG", "warn");
        let (p, line) = spawn_with_line(
            "kinf-sim",
            cmd,
            &work.join(format!("sim-{i}.log")),
            Duration::from_secs(30),
        )?;
        procs.push(p);
        workers.push(Worker {
            http: line["http"].as_str().unwrap_or_default().to_owned(),
            kv_events: line["kv_events"].as_str().map(str::to_owned),
            replay: line["replay"].as_str().map(str::to_owned),
        });
    }
    Ok((procs, workers))
}

/// The served model name.
const MODEL: &str = "tiny-llama";

fn default_tokenizer() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/tokenizers/tiny-llama"
    ))
}

async fn run(args: &LiveArgs, work: &Path) -> Result<Value, String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    eprintln!(
        "kinf-bench live: {} via {} ({}), logs in {}",
        args.workload.name(),
        args.router.name(),
        args.client.name(),
        work.display()
    );
    let scale = args.scale.max(1);
    let load_text = args.load.clone().unwrap_or_else(|| {
        let r = args.workload.light_rate_full() * scale as f64 * args.workers.max(1) as f64 / 3.0;
        format!("poisson:{}", (r * 1000.0).round() / 1000.0)
    });
    let load = Load::parse(&load_text)?;
    let duration_sim_s = args.duration.as_deref().map(parse_duration_s).transpose()?;
    if args.client == ClientKind::Guidellm && args.workload == Workload::Multiturn {
        return Err("--client guidellm runs single-turn workloads only".into());
    }
    let tok = args.tokenizer.clone().unwrap_or_else(default_tokenizer);
    let tok = tok
        .canonicalize()
        .map_err(|e| format!("tokenizer {}: {e}", tok.display()))?;
    let sim_bin = args.kinf_sim.clone().unwrap_or_else(|| sibling("kinf-sim"));
    let gw_bin = args
        .kinference
        .clone()
        .unwrap_or_else(|| sibling("kinference"));
    let profile = read_profile(&sim_bin, &args.profile)?;
    let blocks = args
        .num_gpu_blocks
        .unwrap_or((profile.num_gpu_blocks / scale).max(64));
    let shape = Shape::full(args.workload).scaled(scale);
    let sessions = Arc::new(workload::sessions(
        args.workload,
        shape,
        args.requests,
        args.seed,
    ));
    let turns = shape.turns.max(1) as f64;
    let arrivals = match load {
        Load::Poisson(rate) => workload::poisson_arrivals(sessions.len(), rate / turns, args.seed),
        Load::Concurrency(_) => Vec::new(),
    };

    let (mut procs, workers) = start_workers(args, &sim_bin, &tok, blocks, work)?;
    let client = http_client();
    for w in &workers {
        let ok = wait_until(Duration::from_secs(20), || async {
            get(&client, &format!("http://{}/health", w.http))
                .await
                .is_some_and(|(s, _)| s == 200)
        })
        .await;
        if !ok {
            return Err(format!("kinf-sim {} not healthy", w.http));
        }
    }
    let ctx = RouterCtx {
        workers: &workers,
        model: MODEL,
        block_size: args.block_size,
        tokenizer: &tok,
        port: args.base_port,
        metrics_port: if args.base_port == 0 {
            0
        } else {
            args.base_port + 1
        },
        work,
        prefill_tokens_per_s: args.speed / profile.per_prefill_token_s.max(1e-9),
        overhead_s: profile.fixed_s / args.speed,
        kinference: &gw_bin,
        vllm_router: args.vllm_router.as_deref(),
        sglang_router: args.sglang_router.as_deref(),
    };
    let started = routers::start(&ctx, args.router, &client).await?;
    let router_info = started.info.clone();
    let addr = started.addr.clone();
    procs.push(started.proc);

    let before = scrape(&client, &workers).await?;
    let (records, wall_s, client_info) = match args.client {
        ClientKind::Builtin => {
            let driver = Arc::new(Driver {
                client: client.clone(),
                url: format!("http://{addr}/v1/chat/completions"),
                model: MODEL.into(),
                speed: args.speed,
                timeout: Duration::from_secs(300),
            });
            let (r, w) = driver
                .run(sessions.clone(), load, arrivals, duration_sim_s)
                .await;
            (
                r,
                w,
                json!({"program": "kinf-bench builtin streaming chat client"}),
            )
        }
        ClientKind::Guidellm => {
            let g = guidellm::run(&guidellm::GuidellmRun {
                bin: args.guidellm.clone().unwrap_or_else(guidellm::default_bin),
                target: format!("http://{addr}"),
                model: MODEL.into(),
                tokenizer: tok.clone(),
                sessions: &sessions,
                load,
                speed: args.speed,
                requests: sessions.len(),
                duration_wall_s: duration_sim_s.map(|d| d / args.speed),
                seed: args.seed,
                work: work.to_path_buf(),
            })
            .await?;
            (g.records, g.wall_s, g.info)
        }
    };
    // Let the last responses' counters land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = scrape(&client, &workers).await?;
    // The gateway's view at the end (per endpoint: readiness, prefix tracking, the TTFT
    // model's observations), to explain its decisions.
    let router_state = if args.router == Router::Kinference {
        get(&client, &format!("http://{addr}/admin/status"))
            .await
            .and_then(|(_, b)| serde_json::from_slice::<Value>(&b).ok())
            .map_or(Value::Null, |v| v["endpoints"].clone())
    } else {
        Value::Null
    };
    drop(procs);

    let planned = match args.client {
        ClientKind::Builtin => sessions.iter().map(|s| s.turns.len()).sum::<usize>(),
        ClientKind::Guidellm => records.len(),
    };
    let mut out = summarize(
        &records,
        wall_s,
        args.speed,
        args.workload.slo_ttft_full_s() / scale as f64,
        &before,
        &after,
    );
    out["bench"] = json!("live");
    out["workload"] = json!(args.workload.name());
    out["router"] = json!(args.router.name());
    out["client"] = json!(args.client.name());
    out["load"] = json!(load_text);
    out["load_tag"] = json!(load.tag());
    out["seed"] = json!(args.seed);
    out["workers"] = json!(workers.len());
    out["speed"] = json!(args.speed);
    out["scale"] = json!(scale);
    out["planned_requests"] = json!(planned);
    out["params"] = json!({
        "profile": args.profile, "block_size": args.block_size, "num_gpu_blocks": blocks,
        "shape": shape.to_json(), "full_shape": Shape::full(args.workload).to_json(),
        "requests": args.requests, "duration": args.duration, "base_port": args.base_port,
        "model": MODEL, "tokenizer": tok.display().to_string(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
    });
    out["router_info"] = router_info;
    out["router_state"] = router_state;
    out["client_info"] = client_info;
    if args.detail {
        out["requests_detail"] = records
            .iter()
            .map(|r| {
                json!({"session": r.session, "turn": r.turn, "sent_s": r.sent_s, "ttft_s": r.ttft_s,
                       "e2e_s": r.e2e_s, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                       "output_tokens": r.output_tokens, "endpoint": r.endpoint, "error": r.error})
            })
            .collect();
    }
    Ok(out)
}

/// Nearest-rank percentile of sorted values (`None` when empty).
fn pct(sorted: &[f64], q: f64) -> Option<f64> {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
}

fn r4(x: Option<f64>) -> Value {
    match x {
        Some(x) if x.is_finite() => json!((x * 1e4).round() / 1e4),
        _ => Value::Null,
    }
}

/// The result's figures from the records (wall seconds) and the workers' counters.
pub fn summarize(
    records: &[Record],
    wall_s: f64,
    speed: f64,
    slo_ttft_s: f64,
    before: &[Counters],
    after: &[Counters],
) -> Value {
    let ok: Vec<&Record> = records
        .iter()
        .filter(|r| r.error.is_none() && r.ttft_s.is_some())
        .collect();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e_s).collect();
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    let sim = |x: Option<f64>| x.map(|x| x * speed);
    let errors = records.len() - ok.len();
    let duration_sim = wall_s * speed;
    let met = ok
        .iter()
        .filter(|r| r.ttft_s.is_some_and(|t| t * speed <= slo_ttft_s))
        .count();
    let out_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
    let d = |f: fn(&Counters) -> f64| -> f64 {
        after
            .iter()
            .zip(before)
            .map(|(a, b)| (f(a) - f(b)).max(0.0))
            .sum()
    };
    let (q, h) = (d(|c| c.queries), d(|c| c.hits));
    let per_worker: Vec<Value> = after
        .iter()
        .zip(before)
        .map(|(a, b)| {
            let q = a.queries - b.queries;
            json!({"requests": a.requests - b.requests,
                   "cache_hit_rate": r4((q > 0.0).then(|| (a.hits - b.hits) / q)),
                   "preemptions": a.preemptions - b.preemptions})
        })
        .collect();
    let prompt: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
    let cached: u64 = ok.iter().filter_map(|r| r.cached_tokens).sum();
    let n = records.len();
    json!({
        "requests": ok.len(),
        "errors": errors,
        "first_error": records.iter().find_map(|r| r.error.clone()),
        "ttft_p50_s": r4(sim(pct(&ttft, 0.5))),
        "ttft_p90_s": r4(sim(pct(&ttft, 0.9))),
        "e2e_p50_s": r4(sim(pct(&e2e, 0.5))),
        "e2e_p90_s": r4(sim(pct(&e2e, 0.9))),
        "slo_ttft_s": r4(Some(slo_ttft_s)),
        "slo_attainment": r4((n > 0).then(|| met as f64 / n as f64)),
        "goodput_rpm": r4((duration_sim > 0.0).then(|| met as f64 / (duration_sim / 60.0))),
        "throughput_rpm": r4((duration_sim > 0.0).then(|| ok.len() as f64 / (duration_sim / 60.0))),
        "output_tok_s": r4((duration_sim > 0.0).then(|| out_tokens as f64 / duration_sim)),
        "cache_hit_rate": r4((q > 0.0).then(|| h / q)),
        "usage_cached_fraction": r4((prompt > 0).then(|| cached as f64 / prompt as f64)),
        "prompt_tokens_mean": r4((!ok.is_empty()).then(|| prompt as f64 / ok.len() as f64)),
        "duration_s": r4(Some(duration_sim)),
        "per_worker": per_worker,
        "wall": {
            "ttft_p50_s": r4(pct(&ttft, 0.5)), "ttft_p90_s": r4(pct(&ttft, 0.9)),
            "ttft_p99_s": r4(pct(&ttft, 0.99)),
            "e2e_p50_s": r4(pct(&e2e, 0.5)), "e2e_p90_s": r4(pct(&e2e, 0.9)),
            "duration_s": r4(Some(wall_s)),
        },
    })
}

/// A Markdown table of results (one row each).
pub fn markdown(rows: &[Value]) -> String {
    let f = |x: &Value, d: usize| x.as_f64().map_or("–".to_owned(), |x| format!("{x:.d$}"));
    let mut s = String::from(
        "| workload | router | client | load | TTFT p50 s | TTFT p90 s | e2e p50 s | e2e p90 s | goodput rpm | SLO att. | cache hit | out tok/s | requests | errors | wall TTFT p50 ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for v in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v["workload"].as_str().unwrap_or("?"),
            v["router"].as_str().unwrap_or("?"),
            v["client"].as_str().unwrap_or("?"),
            v["load"].as_str().unwrap_or("?"),
            f(&v["ttft_p50_s"], 3),
            f(&v["ttft_p90_s"], 3),
            f(&v["e2e_p50_s"], 3),
            f(&v["e2e_p90_s"], 3),
            f(&v["goodput_rpm"], 1),
            f(&v["slo_attainment"], 3),
            f(&v["cache_hit_rate"], 3),
            f(&v["output_tok_s"], 1),
            v["requests"],
            v["errors"],
            f(
                &json!(v["wall"]["ttft_p50_s"].as_f64().map(|x| x * 1000.0)),
                1
            ),
        ));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rec(ttft: f64, e2e: f64, out: u64) -> Record {
        Record {
            ttft_s: Some(ttft),
            e2e_s: e2e,
            output_tokens: out,
            prompt_tokens: Some(100),
            cached_tokens: Some(50),
            ..Record::default()
        }
    }

    #[test]
    fn summary_converts_to_simulated_seconds_and_counts_the_slo() {
        let mut rs: Vec<Record> = (1..=10).map(|i| rec(0.01 * i as f64, 0.2, 4)).collect();
        rs.push(Record {
            error: Some("HTTP 500".into()),
            ..Record::default()
        });
        let before = vec![Counters::default(); 2];
        let after = vec![
            Counters {
                queries: 1000.0,
                hits: 600.0,
                requests: 6.0,
                preemptions: 0.0,
            },
            Counters {
                queries: 1000.0,
                hits: 200.0,
                requests: 5.0,
                preemptions: 0.0,
            },
        ];
        // speed 10: TTFTs 0.1..1.0 simulated s; SLO 0.5 s → 5 of 11 met.
        let v = summarize(&rs, 6.0, 10.0, 0.5, &before, &after);
        assert_eq!(v["requests"], 10);
        assert_eq!(v["errors"], 1);
        assert_eq!(v["ttft_p50_s"], 0.6); // rank round(9 × 0.5) = 5 → 0.06 wall
        assert_eq!(v["ttft_p90_s"], 0.9);
        assert_eq!(v["wall"]["ttft_p50_s"], 0.06);
        assert_eq!(v["e2e_p50_s"], 2.0);
        assert_eq!(v["slo_attainment"], 0.4545);
        // 5 met over 60 simulated s = 1 minute.
        assert_eq!(v["goodput_rpm"], 5.0);
        assert_eq!(v["output_tok_s"], 0.6667);
        assert_eq!(v["cache_hit_rate"], 0.4);
        assert_eq!(v["per_worker"][0]["cache_hit_rate"], 0.6);
        assert_eq!(v["usage_cached_fraction"], 0.5);
        let md = markdown(&[v]);
        assert!(md.contains("| 0.600 | 0.900 |"), "{md}");
    }

    #[test]
    fn counters_parse_prometheus_text_and_durations_parse() {
        let text = "# HELP x\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 320.0\n\
                    vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 160\n\
                    vllm:prefix_cache_hits_created{engine=\"0\"} 17e8\n\
                    vllm:request_success_total{finished_reason=\"length\"} 3\n\
                    vllm:request_success_total{finished_reason=\"stop\"} 1\n";
        let c = parse_counters(text);
        assert_eq!(c.queries, 320.0);
        assert_eq!(c.hits, 160.0);
        assert_eq!(c.requests, 4.0);
        assert_eq!(parse_duration_s("90").unwrap(), 90.0);
        assert_eq!(parse_duration_s("2m").unwrap(), 120.0);
        assert_eq!(parse_duration_s("500ms").unwrap(), 0.5);
        assert!(parse_duration_s("-1s").is_err());
    }

    #[test]
    fn the_gateway_config_compiles() {
        let tok = default_tokenizer();
        let workers: Vec<Worker> = (0..3)
            .map(|i| Worker {
                http: format!("127.0.0.1:{}", 18010 + i),
                kv_events: None,
                replay: None,
            })
            .collect();
        let ctx = RouterCtx {
            workers: &workers,
            model: MODEL,
            block_size: 16,
            tokenizer: &tok,
            port: 0,
            metrics_port: 0,
            work: Path::new("/nonexistent"),
            prefill_tokens_per_s: 23_809.5,
            overhead_s: 0.0119,
            kinference: Path::new("kinference"),
            vllm_router: None,
            sglang_router: None,
        };
        let text = routers::kinference_config(&ctx);
        assert!(text.contains("prefillTokensPerSecond: 23810"), "{text}");
        assert!(text.contains("overhead: 12ms"), "{text}");
        let mut sources = kinf_lang::Sources::new();
        sources.add("live.yaml", text);
        let c = kinf_lang::compile(&sources);
        assert_eq!(
            c.errors(),
            0,
            "generated gateway configuration must compile"
        );
    }
}
