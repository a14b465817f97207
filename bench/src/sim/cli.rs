//! The `kinf-bench sim` command line.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{LoadSpec, MultiturnSizes, RouterKind, SimConfig, SimResult, WorkloadKind, run};

/// Output format of `kinf-bench sim`.
#[derive(Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum SimFormat {
    /// One JSON object.
    #[default]
    Json,
    /// A Markdown table row with its header.
    Md,
}

/// `kinf-bench sim` arguments.
#[derive(Args, Clone)]
pub struct SimArgs {
    /// Workload.
    #[arg(long, value_enum)]
    pub workload: WorkloadKind,
    /// Router.
    #[arg(long, value_enum)]
    pub router: RouterKind,
    /// Simulated engines.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Engine profile (`kinf-sim profiles`).
    #[arg(long, default_value = "l40s-qwen27b-fp8")]
    pub profile: String,
    /// `poisson:RATE` (sessions/s) or `concurrency:C`; default: the workload's light Poisson
    /// rate.
    #[arg(long)]
    pub load: Option<String>,
    /// Sending period, simulated seconds (default 4000 for Poisson, 900 for closed loop).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Unmeasured start, simulated seconds (default 0 for Poisson, 120 for closed loop).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Kinference policy bundle directory.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// Keep one Kinference decision trace every N decisions.
    #[arg(long, default_value_t = 0)]
    pub trace_every: u64,
    /// TTFT quantiles to keep for CDF plots.
    #[arg(long, default_value_t = 0)]
    pub cdf_points: usize,
    /// Multiturn conversation sizes in tokens, `FIRST,USER,OUTPUT`: the first user turn, each
    /// later user turn and each answer (default: the sizes fitted to the published medians).
    #[arg(long, value_name = "FIRST,USER,OUTPUT")]
    pub multiturn_sizes: Option<MultiturnSizes>,
    /// Divide every token count by this (smoke tests with the `tiny` profile).
    #[arg(long, default_value_t = 1, hide = true)]
    pub scale: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: SimFormat,
}

impl SimArgs {
    /// The configuration these arguments describe.
    pub fn config(&self) -> Result<SimConfig, String> {
        let mut c = SimConfig::new(self.workload, self.router);
        c.workers = self.workers;
        c.profile = self.profile.clone();
        c.load = match &self.load {
            Some(s) => LoadSpec::parse(s)?,
            None => LoadSpec::Poisson(self.workload.light_rate(self.workers)),
        };
        let closed = matches!(c.load, LoadSpec::Concurrency(_));
        c.duration_s = self.duration.unwrap_or(if closed { 900.0 } else { 4000.0 });
        c.warmup_s = self.warmup.unwrap_or(if closed { 120.0 } else { 0.0 });
        if c.warmup_s >= c.duration_s {
            return Err("--warmup must be shorter than --duration".into());
        }
        c.seed = self.seed;
        c.scale = self.scale;
        if let Some(d) = &self.policy_dir {
            c.policy_dir = d.clone();
        }
        c.trace_every = self.trace_every;
        c.cdf_points = self.cdf_points;
        if let Some(sizes) = self.multiturn_sizes {
            if self.workload != WorkloadKind::Multiturn {
                return Err("--multiturn-sizes applies only to --workload multiturn".into());
            }
            c.multiturn = sizes;
        }
        Ok(c)
    }
}

/// The Markdown header of [`md_row`].
pub const MD_HEADER: &str = "| workload | router | workers | load | seed | requests | TTFT p50 s | TTFT p90 s | e2e p50 s | e2e p90 s | goodput req/min | SLO attainment | cache hit | output tok/s | decision µs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// One Markdown row.
pub fn md_row(r: &SimResult) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {:.1} | {:.1} % | {:.1} % | {:.0} | {:.1} |",
        r.workload,
        r.router,
        r.workers,
        r.load,
        r.seed,
        r.requests,
        r.ttft_p50_s,
        r.ttft_p90_s,
        r.e2e_p50_s,
        r.e2e_p90_s,
        r.goodput_rpm,
        100.0 * r.slo_attainment,
        100.0 * r.cache_hit_rate,
        r.output_tok_s,
        r.decision_us_mean
    )
}

/// Runs `kinf-bench sim` and prints the result.
pub fn main(args: &SimArgs) -> Result<(), String> {
    let cfg = args.config()?;
    let r = run(&cfg)?;
    match args.format {
        SimFormat::Json => println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?),
        SimFormat::Md => println!("{MD_HEADER}\n{}", md_row(&r)),
    }
    Ok(())
}
