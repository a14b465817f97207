//! `kinf-bench`: benchmarks whose figures can be compared across commits (`--format json`).
//!
//! - `kinf-bench decide --endpoints N --prompt-tokens T`: decision latency p50/p99.
//! - `kinf-bench compile --rules R --worker-sets W`: compile time of a synthetic bundle.
//! - `kinf-bench lint-e2e --kinfctl PATH --rules R --worker-sets W`: `kinfctl lint` wall time,
//!   process start included.
//! - `kinf-bench proxy`: latency the gateway adds over a zero-delay worker, and throughput,
//!   next to vllm-router (see `proxy`).
//! - `kinf-bench sim`: routers compared on a simulated vLLM fleet (`kinf_bench::sim`).
//! - `kinf-bench report`: runs the benchmark matrix and regenerates `bench/RESULTS.md` and the
//!   plots in `docs/benchmarks/` (`kinf_bench::report`).
//! - `kinf-bench live --workload W --router R`: the simulation's workloads, scaled down, on real
//!   `kinf-sim serve` workers behind the gateway or a peer router (see `live`).

/// mimalloc, as in `kinference` and `kinfctl`: `kinf-bench compile` measures policy compilation
/// with the allocator the gateway compiles with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};

mod live;
mod procs;
mod proxy;
mod soak;

#[derive(Parser)]
#[command(name = "kinf-bench", about = "Kinference benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
enum Format {
    #[default]
    Human,
    Json,
}

/// `kinf-bench decide --trace`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
enum TraceArg {
    #[default]
    Full,
    Summary,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decision latency (prefix lookup included, tokenization excluded).
    Decide {
        #[arg(long, default_value_t = 8)]
        endpoints: usize,
        #[arg(long, default_value_t = 1024)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 20000)]
        iterations: usize,
        /// What the trace records: `full` (every candidate, as `kinfctl explain`) or
        /// `summary` (rules, tiers and picks, as the gateway decides).
        #[arg(long, value_enum, default_value_t)]
        trace: TraceArg,
        /// The request carries its prompt's block hashes, computed before timing, as the
        /// gateway computes them outside its state lock: what is timed is the decision's work
        /// under the lock.
        #[arg(long)]
        hashed: bool,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Compile time of a synthetic bundle.
    Compile {
        #[arg(long, default_value_t = 1000)]
        rules: usize,
        #[arg(long, default_value_t = 200)]
        worker_sets: usize,
        #[arg(long, default_value_t = 30)]
        iterations: usize,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// End-to-end `kinfctl lint` of a synthetic bundle written to a temporary file.
    LintE2e {
        #[arg(long)]
        kinfctl: std::path::PathBuf,
        #[arg(long, default_value_t = 1000)]
        rules: usize,
        #[arg(long, default_value_t = 200)]
        worker_sets: usize,
        #[arg(long, default_value_t = 15)]
        iterations: usize,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Latency the gateway adds over a zero-delay kinf-sim worker, and throughput, next to
    /// vllm-router (scripts/peers/setup.sh installs it).
    Proxy(proxy::ProxyArgs),
    /// The gateway under steady load for a long time (default 30 min at 80% of the simulated
    /// fleet's capacity): memory, file descriptors, accounting drift and added latency.
    Soak(soak::SoakArgs),
    /// Scaled-down workloads on real processes: `kinf-sim serve` workers behind `kinference`
    /// or a peer router, load from the built-in client or GuideLLM.
    Live(live::LiveArgs),
    /// Routers compared on a simulated vLLM fleet (deterministic for a seed).
    Sim(kinf_bench::sim::cli::SimArgs),
    /// Runs the benchmark matrix (--run) and regenerates bench/RESULTS.md and the plots.
    Report(kinf_bench::report::ReportArgs),
}

fn percentiles(mut ns: Vec<u128>) -> (u128, u128, u128) {
    ns.sort_unstable();
    let at = |q: f64| {
        ns.get(((ns.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    (at(0.5), at(0.99), at(0.0))
}

fn report(name: &str, params: serde_json::Value, ns: Vec<u128>, format: Format) {
    let n = ns.len();
    let (p50, p99, min) = percentiles(ns);
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({"bench": name, "params": params, "iterations": n, "p50_ns": p50, "p99_ns": p99, "min_ns": min})
        ),
        Format::Human => println!(
            "{name} {params}: p50 {:.3} ms, p99 {:.3} ms, min {:.3} ms over {n} runs",
            p50 as f64 / 1e6,
            p99 as f64 / 1e6,
            min as f64 / 1e6
        ),
    }
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Sim(args) => {
            if let Err(e) = kinf_bench::sim::cli::main(&args) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Report(args) => {
            if let Err(e) = kinf_bench::report::main(&args) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Soak(args) => {
            if let Err(e) = soak::main(args) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Proxy(args) => {
            if let Err(e) = proxy::main(args) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Live(args) => {
            if let Err(e) = live::main(args) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Decide {
            endpoints,
            prompt_tokens,
            iterations,
            trace,
            hashed,
            format,
        } => {
            let detail = match trace {
                TraceArg::Full => kinf_router::TraceDetail::Full,
                TraceArg::Summary => kinf_router::TraceDetail::Summary,
            };
            let Some((policy, mut req, state)) =
                kinf_router::synthetic::decide_scenario(endpoints, prompt_tokens)
            else {
                eprintln!("error: scenario did not compile");
                std::process::exit(2);
            };
            if hashed {
                req.hash_prompt(kinf_router::synthetic::BLOCK_SIZE);
            }
            for _ in 0..iterations / 10 {
                black_box(kinf_router::Decider::decide_with(
                    &policy, &req, &state, detail,
                ));
            }
            let mut ns = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                black_box(kinf_router::Decider::decide_with(
                    &policy,
                    black_box(&req),
                    &state,
                    detail,
                ));
                ns.push(t.elapsed().as_nanos());
            }
            report(
                "decide",
                serde_json::json!({
                    "endpoints": endpoints,
                    "prompt_tokens": prompt_tokens,
                    "trace": format!("{trace:?}").to_lowercase(),
                    "hashed": hashed,
                }),
                ns,
                format,
            );
        }
        Cmd::Compile {
            rules,
            worker_sets,
            iterations,
            format,
        } => {
            let text = kinf_lang::synthetic::synthetic_bundle(rules, worker_sets);
            let mut sources = kinf_lang::Sources::new();
            sources.add("bundle.yaml", text);
            let first = Instant::now();
            let c = kinf_lang::compile(&sources);
            let cold = first.elapsed().as_nanos();
            if c.errors() > 0 {
                eprintln!("error: synthetic bundle has {} errors", c.errors());
                std::process::exit(2);
            }
            let mut ns = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                black_box(kinf_lang::compile(black_box(&sources)));
                ns.push(t.elapsed().as_nanos());
            }
            report(
                "compile",
                serde_json::json!({"rules": rules, "worker_sets": worker_sets, "first_run_ns": cold}),
                ns,
                format,
            );
        }
        Cmd::LintE2e {
            kinfctl,
            rules,
            worker_sets,
            iterations,
            format,
        } => {
            let dir = std::env::temp_dir().join(format!("kinf-bench-{}", std::process::id()));
            let file = dir.join("bundle.yaml");
            if std::fs::create_dir_all(&dir)
                .and_then(|_| {
                    std::fs::write(
                        &file,
                        kinf_lang::synthetic::synthetic_bundle(rules, worker_sets),
                    )
                })
                .is_err()
            {
                eprintln!("error: cannot write {}", file.display());
                std::process::exit(2);
            }
            let mut ns = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                let status = std::process::Command::new(&kinfctl)
                    .arg("lint")
                    .arg(&file)
                    .arg("--format")
                    .arg("json")
                    .stdout(std::process::Stdio::null())
                    .status();
                ns.push(t.elapsed().as_nanos());
                if !status.is_ok_and(|s| s.success()) {
                    eprintln!("error: `{} lint` failed", kinfctl.display());
                    std::process::exit(2);
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            report(
                "lint_e2e",
                serde_json::json!({"rules": rules, "worker_sets": worker_sets}),
                ns,
                format,
            );
        }
    }
}
