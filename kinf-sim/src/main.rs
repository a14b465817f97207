//! `kinf-sim`: the simulated vLLM engine's calibration report, speed benchmark and real-time
//! vLLM-compatible server (`kinf-sim serve`).
//!
//! Exit codes: 0 success, 1 the run failed (e.g. an invalid profile), 2 usage error.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kinf_sim::bench::{self, BenchSpec, BenchWorkload};
use kinf_sim::calibrate::{self, CalibrationSpec};
use kinf_sim::{PROFILE_NAMES, Profile};

#[derive(Debug, Parser)]
#[command(
    name = "kinf-sim",
    version,
    about = "Simulated vLLM engine: calibration, speed and a real-time vLLM-compatible server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    Chat,
    SharedPrefix,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print TTFT/ITL for cold and warm 16k-token prompts at light load, and prefix-cache hit
    /// rate vs cache size, for a profile.
    Calibrate {
        /// Profile name (l40s-qwen27b-fp8, h100-llama70b, tiny).
        #[arg(long)]
        profile: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        /// Requests per light-load run (default: 600).
        #[arg(long)]
        requests: Option<usize>,
        /// Light-load arrival rate over the three workers, requests per second (default: by
        /// profile, 0.15 for the 16k-token workload, 30 for `tiny`'s scaled-down one).
        #[arg(long)]
        rate: Option<f64>,
        /// Seed (default: 1).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Measure simulated requests per minute of wall time.
    Bench {
        /// Profile name.
        #[arg(long, default_value = "l40s-qwen27b-fp8")]
        profile: String,
        /// Engines.
        #[arg(long, default_value_t = 100)]
        workers: usize,
        /// Requests to simulate.
        #[arg(long, default_value_t = 1_000_000)]
        requests: usize,
        /// Workload.
        #[arg(long, value_enum, default_value = "chat")]
        workload: Workload,
        /// Arrival rate per worker, requests per second.
        #[arg(long, default_value_t = 1.0)]
        rate_per_worker: f64,
        /// Build KV events (as a router consuming them would need).
        #[arg(long)]
        kv_events: bool,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Serve vLLM 0.32's HTTP API, /metrics and ZMQ KV events from a simulated engine in real
    /// time. Prints `{"http":…,"kv_events":…,"replay":…}` on stdout once bound.
    Serve(Box<kinf_sim::serve::ServeArgs>),
    /// Print the built-in profiles' constants.
    Profiles {
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
}

fn profile(name: &str) -> Result<Profile, String> {
    Profile::by_name(name).ok_or_else(|| {
        format!(
            "unknown profile `{name}` (known: {})",
            PROFILE_NAMES.join(", ")
        )
    })
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| e.to_string())
}

fn run(cli: Cli) -> Result<String, String> {
    match cli.command {
        Command::Calibrate {
            profile: name,
            format,
            requests,
            rate,
            seed,
        } => {
            let p = profile(&name)?;
            let mut spec = CalibrationSpec::for_profile(&p);
            if let Some(n) = requests {
                spec.requests = n;
            }
            if let Some(r) = rate {
                spec.rate_per_s = r;
            }
            if let Some(s) = seed {
                spec.seed = s;
            }
            let report = calibrate::report(&p, &spec).map_err(|e| e.to_string())?;
            match format {
                Format::Human => Ok(calibrate::render_human(&report)),
                Format::Json => json(&report),
            }
        }
        Command::Bench {
            profile: name,
            workers,
            requests,
            workload,
            rate_per_worker,
            kv_events,
            seed,
            format,
        } => {
            let spec = BenchSpec {
                profile: profile(&name)?,
                workers,
                requests,
                workload: match workload {
                    Workload::Chat => BenchWorkload::Chat,
                    Workload::SharedPrefix => BenchWorkload::SharedPrefix,
                },
                rate_per_worker,
                kv_events,
                seed,
            };
            let report = bench::run(&spec).map_err(|e| e.to_string())?;
            match format {
                Format::Human => Ok(bench::render_human(&report)),
                Format::Json => json(&report),
            }
        }
        Command::Serve(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(kinf_sim::serve::run(*args))?;
            Ok(String::new())
        }
        Command::Profiles { format } => {
            let all: Vec<Profile> = PROFILE_NAMES
                .iter()
                .filter_map(|n| Profile::by_name(n))
                .collect();
            match format {
                Format::Json => json(&all),
                Format::Human => Ok(all
                    .iter()
                    .map(|p| format!("{}: {}\n", p.name, p.description))
                    .collect()),
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
    }
    match run(cli) {
        Ok(text) if text.is_empty() => ExitCode::SUCCESS,
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
