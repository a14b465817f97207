//! `kinf-bench report`: runs the benchmark matrix (with `--run`) into JSON files, then reads
//! every JSON result in the results directory (including `kinf-bench live` results,
//! `live-*.json`) and regenerates `bench/RESULTS.md` and the PNG plots in `docs/benchmarks/`.

mod plots;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Args;
use serde_json::Value;

use crate::sim::{LoadSpec, RouterKind, SimConfig, WorkloadKind, run};

/// `kinf-bench report` arguments.
#[derive(Args, Clone)]
pub struct ReportArgs {
    /// Run the simulations first (otherwise only read the results directory).
    #[arg(long)]
    pub run: bool,
    /// Also run the scale series (3 → 1,000 workers; minutes).
    #[arg(long)]
    pub scale: bool,
    /// Simulated seconds of every scale run (default: ≈ 20,000 requests per run).
    #[arg(long)]
    pub scale_duration: Option<f64>,
    /// Also run the scale target itself: `kinference` and `epp` on 1,000 workers at 10,000
    /// req/s for 600 simulated seconds (6 million requests each). Last measured
    /// (bench/analysis.md): `kinference` 539 s (9 min) alone, peak memory 4.7 GB (about twice
    /// the time when the VM is slower); `epp` 1,807 s (30 min), 13.4 GB (an older build). With
    /// the default two jobs they run side by side: about 30 minutes and 18 GB.
    #[arg(long)]
    pub scale_full: bool,
    /// JSON results directory.
    #[arg(long, default_value = "bench/results")]
    pub results: PathBuf,
    /// The Markdown report.
    #[arg(long, default_value = "bench/RESULTS.md")]
    pub out: PathBuf,
    /// Where the PNG plots go.
    #[arg(long, default_value = "docs/benchmarks")]
    pub plots: PathBuf,
    /// Parallel simulations.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Seeds of the light-load and capacity runs (figures are means over them).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
}

/// Concurrency levels of the capacity runs (NOTES.md §4).
pub const CONCURRENCY: [usize; 5] = [4, 8, 16, 24, 32];

/// Workers of the eight-worker series (`sim-fleet8-*`): the capacity runs' workloads on a
/// larger fleet, where one popular prefix's traffic is more than one worker's share.
pub const FLEET_WORKERS: usize = 8;
/// Its clients: 32 per 3 workers, the capacity runs' peak, rounded.
pub const FLEET_CONCURRENCY: usize = 85;
/// Its workloads.
const FLEET_WORKLOADS: [WorkloadKind; 3] = [
    WorkloadKind::SharedPrefix,
    WorkloadKind::Multiturn,
    WorkloadKind::Hotspot,
];

fn fleet_file(w: &str, r: &str, seed: u64) -> String {
    format!("sim-fleet8-{w}-{r}-s{seed}.json")
}

/// One planned simulation and the file it writes.
struct Job {
    file: String,
    cfg: SimConfig,
}

/// A capacity run: a closed loop of `c` clients for 900 s, the first 120 s unmeasured.
fn capacity_run(w: WorkloadKind, r: RouterKind, c: usize, seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(w, r);
    cfg.seed = seed;
    cfg.load = LoadSpec::Concurrency(c);
    cfg.duration_s = 900.0;
    cfg.warmup_s = 120.0;
    cfg
}

fn plan(args: &ReportArgs) -> Vec<Job> {
    let mut jobs = Vec::new();
    for w in WorkloadKind::ALL {
        for r in RouterKind::ALL {
            for seed in 1..=args.seeds.max(1) {
                let mut cfg = SimConfig::new(w, r);
                cfg.seed = seed;
                cfg.cdf_points = if seed == 1 { 201 } else { 0 };
                cfg.trace_every = if seed == 1 && r == RouterKind::Kinference {
                    25
                } else {
                    0
                };
                jobs.push(Job {
                    file: format!("sim-light-{}-{}-s{seed}.json", w.name(), r.name()),
                    cfg,
                });
            }
            for c in CONCURRENCY {
                for seed in 1..=args.seeds.max(1) {
                    let mut cfg = capacity_run(w, r, c, seed);
                    cfg.trace_every = if seed == 1 && r == RouterKind::Kinference {
                        50
                    } else {
                        0
                    };
                    jobs.push(Job {
                        file: cap_file(w.name(), r.name(), c, seed),
                        cfg,
                    });
                }
            }
        }
    }
    // Eight workers, at the capacity peak's clients per worker.
    for w in FLEET_WORKLOADS {
        for r in RouterKind::ALL {
            for seed in 1..=args.seeds.max(1) {
                let mut cfg = capacity_run(w, r, FLEET_CONCURRENCY, seed);
                cfg.workers = FLEET_WORKERS;
                jobs.push(Job {
                    file: fleet_file(w.name(), r.name(), seed),
                    cfg,
                });
            }
        }
    }
    if args.scale {
        for n in [3usize, 30, 100, 300, 1000] {
            for r in [
                RouterKind::Random,
                RouterKind::Epp,
                RouterKind::Dynamo,
                RouterKind::Kinference,
            ] {
                let mut cfg = SimConfig::new(WorkloadKind::Chat, r);
                cfg.workers = n;
                cfg.profile = "h100-llama70b".into();
                cfg.load = LoadSpec::Poisson(10.0 * n as f64);
                // ≈ 20,000 requests per run (5 s at least); at 1,000 workers 10 s, and 3 s for
                // `dynamo`, whose decisions cost milliseconds there. `--scale-duration`
                // overrides.
                cfg.duration_s = args.scale_duration.unwrap_or(match (n, r) {
                    (1000, RouterKind::Dynamo) => 3.0,
                    (1000, _) => 10.0,
                    _ => (20_000.0 / (10.0 * n as f64)).clamp(5.0, 600.0),
                });
                cfg.warmup_s = 0.0;
                jobs.push(Job {
                    file: format!("sim-scale-{}-w{n}.json", r.name()),
                    cfg,
                });
            }
        }
    }
    if args.scale_full {
        // Kinference and the best peer at scale; first, so that the longest jobs do not start
        // last.
        for (i, r) in [RouterKind::Kinference, RouterKind::Epp]
            .into_iter()
            .enumerate()
        {
            let mut cfg = SimConfig::new(WorkloadKind::Chat, r);
            cfg.workers = 1000;
            cfg.profile = "h100-llama70b".into();
            cfg.load = LoadSpec::Poisson(10_000.0);
            cfg.duration_s = 600.0;
            cfg.warmup_s = 0.0;
            jobs.insert(
                i,
                Job {
                    file: format!("sim-scale-full-{}-w1000.json", r.name()),
                    cfg,
                },
            );
        }
    }
    jobs
}

/// Runs the matrix, `jobs` at a time, writing one JSON file per simulation.
fn run_all(args: &ReportArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.results)
        .map_err(|e| format!("{}: {e}", args.results.display()))?;
    let jobs = plan(args);
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    let total = jobs.len();
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let path = args.results.join(&job.file);
                    let out = run(&job.cfg).and_then(|r| {
                        serde_json::to_string(&r)
                            .map_err(|e| e.to_string())
                            .and_then(|t| {
                                std::fs::write(&path, t)
                                    .map_err(|e| format!("{}: {e}", path.display()))
                            })
                            .map(|()| r.wall_s)
                    });
                    match out {
                        Ok(w) => eprintln!("[{}/{total}] {} ({w:.1} s)", i + 1, job.file),
                        Err(e) => {
                            if let Ok(mut v) = errors.lock() {
                                v.push(format!("{}: {e}", job.file));
                            }
                        }
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap_or_default();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Every JSON result in `dir`, by file name.
fn load(dir: &Path) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if let Some(v) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        {
            out.insert(name, v);
        }
    }
    out
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// Mean of a field over runs.
fn mean(runs: &[&Value], k: &str) -> f64 {
    let xs: Vec<f64> = runs
        .iter()
        .map(|v| f(v, k))
        .filter(|x| x.is_finite())
        .collect();
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Light-load runs of a workload and router (all seeds).
fn light<'a>(all: &'a BTreeMap<String, Value>, w: &str, r: &str) -> Vec<&'a Value> {
    let prefix = format!("sim-light-{w}-{r}-s");
    all.iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| v)
        .collect()
}

/// The file of a capacity run: seed 1 keeps the name it had before capacity runs had seeds
/// (`sim-cap-W-R-cC.json`, with the kinference decision traces); seed N > 1 adds `-sN`.
fn cap_file(w: &str, r: &str, c: usize, seed: u64) -> String {
    if seed <= 1 {
        format!("sim-cap-{w}-{r}-c{c}.json")
    } else {
        format!("sim-cap-{w}-{r}-c{c}-s{seed}.json")
    }
}

/// The runs of one configuration, seed 1, 2, … up to the first seed without a `file`.
fn seed_runs(all: &BTreeMap<String, Value>, file: impl Fn(u64) -> String) -> Vec<&Value> {
    (1..).map_while(|seed| all.get(&file(seed))).collect()
}

/// Figures of a capacity point that the report averages over seeds.
const CAP_MEANS: [&str; 5] = [
    "goodput_rpm",
    "slo_attainment",
    "cache_hit_rate",
    "output_tok_s",
    "throughput_rpm",
];

/// Capacity point of a workload, router and concurrency: the mean over its seeds' runs of
/// [`CAP_MEANS`], with `slo_met` when the mean SLO attainment is at least 90 % and `seeds`
/// the number of runs. A single seed's goodput varies by several percent (which prefixes the
/// clients draw), more than the margins between the cache-aware routers.
fn cap(all: &BTreeMap<String, Value>, w: &str, r: &str, c: usize) -> Option<Value> {
    let runs = seed_runs(all, |seed| cap_file(w, r, c, seed));
    if runs.is_empty() {
        return None;
    }
    let mut v = serde_json::Map::new();
    for k in CAP_MEANS {
        v.insert(k.into(), serde_json::json!(mean(&runs, k)));
    }
    let met = mean(&runs, "slo_attainment") >= 0.9;
    v.insert("slo_met".into(), Value::Bool(met));
    v.insert("seeds".into(), serde_json::json!(runs.len()));
    Some(Value::Object(v))
}

/// Peak goodput over the concurrency levels, and the concurrency where it was reached.
fn peak_goodput(all: &BTreeMap<String, Value>, w: &str, r: &str) -> (f64, usize) {
    let mut best = (f64::NAN, 0);
    for c in CONCURRENCY {
        if let Some(v) = cap(all, w, r, c) {
            let g = f(&v, "goodput_rpm");
            if best.0.is_nan() || g > best.0 {
                best = (g, c);
            }
        }
    }
    best
}

fn pct(new: f64, old: f64) -> String {
    if old.is_finite() && old > 0.0 && new.is_finite() {
        format!("{:+.0} %", 100.0 * (new - old) / old)
    } else {
        "n/a".into()
    }
}

fn yes(b: bool) -> &'static str {
    if b { "**met**" } else { "**not met**" }
}

/// The report's Markdown.
fn markdown(all: &BTreeMap<String, Value>, args: &ReportArgs, analysis: &str) -> String {
    use std::fmt::Write as _;
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Kinference benchmark results\n\n\
         Generated by `kinf-bench report` from the JSON results in `{}` — do not edit by hand \
         (the analysis section comes from `bench/analysis.md`). Method, workloads, routers and \
         metric definitions: [`docs/benchmarks/README.md`](../docs/benchmarks/README.md).\n\n\
         Reproduce from scratch (release build; the matrix takes ≈ 4 min and `--scale` ≈ 2 min more on an idle 2-core VM):\n\n\
         ```sh\ncargo run --release -p kinf-bench -- report --run            # light load + capacity\n\
         cargo run --release -p kinf-bench -- report --run --scale    # also the 3 → 1,000-worker series\n\
         cargo run --release -p kinf-bench -- report --run --scale --scale-full    # and the 600 s, 1,000-worker target runs (≈ 30 min more, ≈ 18 GB)\n```\n\n\
         One run by hand, e.g.:\n\n```sh\n\
         cargo run --release -p kinf-bench -- sim --workload shared-prefix --router kinference --seed 1 --format md\n\
         cargo run --release -p kinf-bench -- sim --workload hotspot --router dynamo --load concurrency:24 --format json\n```\n\n\
         All latencies and throughputs are **simulated time** on the `kinf-sim` engine \
         (`l40s-qwen27b-fp8` profile, calibrated to the published benchmark, 3 workers unless \
         stated): deterministic for a seed, identical on any machine. Wall-clock figures \
         (decision µs, run seconds) were measured on a shared, contended 2-vCPU VM and are \
         indicative only.\n",
        args.results.display()
    );

    // Reproduction.
    let med = |w: &str, r: &str| mean(&light(all, w, r), "ttft_p50_s");
    let e2e = |w: &str, r: &str| mean(&light(all, w, r), "e2e_p50_s");
    let _ = writeln!(
        m,
        "## Reproduction of the published benchmark (NOTES.md §4)\n"
    );
    let _ = writeln!(
        m,
        "Light Poisson load; each figure is the mean over 3 seeds of the run's median.\n\n\
         | workload | metric | published random → Kinference | simulated random → kinference | change | target | |\n|---|---|---|---|---|---|---|"
    );
    let rs = med("shared-prefix", "random");
    let ks = med("shared-prefix", "kinference");
    let _ = writeln!(
        m,
        "| shared-prefix | TTFT p50 | 6.88 s → 0.31 s (−95 %) | {rs:.2} s → {ks:.2} s | {} | random within 15 % of 6.88 s; ≥ 95 % lower | {} / {} |",
        pct(ks, rs),
        yes((rs - 6.88).abs() / 6.88 <= 0.15),
        yes(ks <= 0.05 * rs)
    );
    let re = e2e("shared-prefix", "random");
    let ke = e2e("shared-prefix", "kinference");
    let _ = writeln!(
        m,
        "| shared-prefix | e2e p50 | 20.5 s → 11.3 s (−45 %) | {re:.2} s → {ke:.2} s | {} | (not a target) | |",
        pct(ke, re)
    );
    let rm = med("multiturn", "random");
    let km = med("multiturn", "kinference");
    let _ = writeln!(
        m,
        "| multiturn | TTFT p50 | 1.70 s → 0.59 s (−65 %) | {rm:.2} s → {km:.2} s | {} | ≥ 65 % lower | {} |",
        pct(km, rm),
        yes(km <= 0.35 * rm)
    );
    let ri = med("independent", "random");
    let ki = med("independent", "kinference");
    let _ = writeln!(
        m,
        "| independent | TTFT p50 | 6.92 s vs 6.83 s | {ri:.2} s vs {ki:.2} s | {} | within 5 % | {} |",
        pct(ki, ri),
        yes(ri.is_finite() && ki.is_finite() && (ki - ri).abs() / ri <= 0.05)
    );
    let (rg, _) = peak_goodput(all, "shared-prefix", "random");
    let (kg, _) = peak_goodput(all, "shared-prefix", "kinference");
    let (rgm, _) = peak_goodput(all, "multiturn", "random");
    let (kgm, _) = peak_goodput(all, "multiturn", "kinference");
    let _ = writeln!(
        m,
        "| shared-prefix | peak goodput | 14.0 → 103.0 req/min (7.4×) | {rg:.1} → {kg:.1} req/min ({:.1}×) | | (not a target) | |",
        kg / rg
    );
    let _ = writeln!(
        m,
        "| multiturn | peak goodput | 23.8 → 82.7 req/min (3.5×) | {rgm:.1} → {kgm:.1} req/min ({:.1}×) | | (not a target) | |\n",
        kgm / rgm
    );

    // Beyond.
    let _ = writeln!(
        m,
        "## Kinference against every peer router\n\n\
         Target: on shared-prefix, multiturn and hotspot, lower median and p90 TTFT (light load, \
         mean over seeds) and higher peak goodput (capacity runs) than every peer; ≥ 20 % better \
         than the best peer on hotspot. \"best peer\" is the best of the seven others on that \
         metric.\n\n\
         | workload | metric | kinference | best peer | margin | beats every peer |\n|---|---|---|---|---|---|"
    );
    let peers: Vec<RouterKind> = RouterKind::ALL
        .iter()
        .copied()
        .filter(|r| *r != RouterKind::Kinference)
        .collect();
    for w in ["shared-prefix", "multiturn", "hotspot"] {
        for (metric, key) in [("TTFT p50", "ttft_p50_s"), ("TTFT p90", "ttft_p90_s")] {
            let k = mean(&light(all, w, "kinference"), key);
            let best = peers
                .iter()
                .map(|r| (mean(&light(all, w, r.name()), key), r.name()))
                .filter(|(x, _)| x.is_finite())
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((b, name)) = best {
                let _ = writeln!(
                    m,
                    "| {w} | {metric} | {k:.3} s | {b:.3} s ({name}) | {} | {} |",
                    pct(k, b),
                    if k < b { "yes" } else { "**no**" }
                );
            }
        }
        let (k, kc) = peak_goodput(all, w, "kinference");
        let best = peers
            .iter()
            .map(|r| (peak_goodput(all, w, r.name()), r.name()))
            .filter(|((x, _), _)| x.is_finite())
            .max_by(|a, b| a.0.0.total_cmp(&b.0.0));
        if let Some(((b, bc), name)) = best {
            let _ = writeln!(
                m,
                "| {w} | peak goodput | {k:.1} req/min (c={kc}) | {b:.1} req/min ({name}, c={bc}) | {} | {} |",
                pct(k, b),
                if k > b { "yes" } else { "**no**" }
            );
        }
    }
    let _ = writeln!(m);

    // Light-load tables.
    let _ = writeln!(m, "## Light load (Poisson, mean over seeds)\n");
    for w in WorkloadKind::ALL {
        let any = light(all, w.name(), "random");
        let Some(first) = any.first() else { continue };
        let _ = writeln!(
            m,
            "### {} — {} , {} seed(s), SLO TTFT ≤ {} s\n\n\
             ![TTFT CDF](../docs/benchmarks/ttft-cdf-{}.png)\n\n\
             | router | requests | TTFT p50 s | TTFT p90 s | TTFT p99 s | e2e p50 s | e2e p90 s | cache hit | SLO attainment | busiest worker / mean | decision µs (mean, wall) |\n|---|---|---|---|---|---|---|---|---|---|---|",
            w.name(),
            s(first, "load"),
            any.len(),
            f(first, "slo_ttft_s"),
            w.name()
        );
        for r in RouterKind::ALL {
            let runs = light(all, w.name(), r.name());
            if runs.is_empty() {
                continue;
            }
            let _ = writeln!(
                m,
                "| {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.1} % | {:.1} % | {:.2} | {:.1} |",
                r.name(),
                mean(&runs, "requests"),
                mean(&runs, "ttft_p50_s"),
                mean(&runs, "ttft_p90_s"),
                mean(&runs, "ttft_p99_s"),
                mean(&runs, "e2e_p50_s"),
                mean(&runs, "e2e_p90_s"),
                100.0 * mean(&runs, "cache_hit_rate"),
                100.0 * mean(&runs, "slo_attainment"),
                mean(&runs, "load_imbalance"),
                mean(&runs, "decision_us_mean"),
            );
        }
        let _ = writeln!(m);
    }

    // Capacity.
    let _ = writeln!(
        m,
        "## Capacity (closed loop, 900 s, first 120 s unmeasured, mean over seeds)\n\n\
         Goodput = measured requests with TTFT ≤ the SLO threshold per minute; a point meets the \
         SLO when ≥ 90 % of its requests do, on average over the seeds (marked ✓). Each figure \
         is the mean over the seeds' runs (one seed's goodput varies by several percent with the \
         prefixes its clients draw). Peak goodput = the highest goodput over the five \
         concurrency levels.\n"
    );
    for w in WorkloadKind::ALL {
        if cap(all, w.name(), "random", 4).is_none() {
            continue;
        }
        let _ = writeln!(
            m,
            "### {}\n\n![goodput](../docs/benchmarks/goodput-{}.png)\n\n\
             | router | c=4 | c=8 | c=16 | c=24 | c=32 | peak goodput | cache hit at peak | output tok/s at peak |\n|---|---|---|---|---|---|---|---|---|",
            w.name(),
            w.name()
        );
        for r in RouterKind::ALL {
            let mut row = format!("| {} |", r.name());
            for c in CONCURRENCY {
                match cap(all, w.name(), r.name(), c) {
                    Some(v) => {
                        let _ = write!(
                            row,
                            " {:.1}{} |",
                            f(&v, "goodput_rpm"),
                            if v.get("slo_met").and_then(Value::as_bool) == Some(true) {
                                " ✓"
                            } else {
                                ""
                            }
                        );
                    }
                    None => row.push_str(" – |"),
                }
            }
            let (p, pc) = peak_goodput(all, w.name(), r.name());
            let at = cap(all, w.name(), r.name(), pc);
            let _ = writeln!(
                m,
                "{row} {p:.1} (c={pc}) | {:.1} % | {:.0} |",
                at.as_ref()
                    .map_or(f64::NAN, |v| 100.0 * f(v, "cache_hit_rate")),
                at.as_ref().map_or(f64::NAN, |v| f(v, "output_tok_s"))
            );
        }
        let _ = writeln!(m);
    }

    // Eight workers.
    let fleet_runs = |w: &str, r: &str| seed_runs(all, |seed| fleet_file(w, r, seed));
    if FLEET_WORKLOADS
        .iter()
        .any(|w| !fleet_runs(w.name(), "kinference").is_empty())
    {
        let _ = writeln!(
            m,
            "## Eight workers (closed loop, c={FLEET_CONCURRENCY}, 900 s, first 120 s unmeasured, \
             mean over seeds)\n\n\
             The capacity runs' workloads on {FLEET_WORKERS} workers with the clients per worker of \
             their peak (32 per 3 workers). With 8 workers the most popular hotspot prefix (27 % of \
             requests) is more than two workers' share, so a router that keeps a prefix on the \
             worker that holds it overloads that worker. Per workload: goodput (req/min), TTFT \
             p90 (s) and the busiest worker's requests over the mean.\n\n\
             | router | shared-prefix goodput | p90 | busiest | multiturn goodput | p90 | busiest | hotspot goodput | p90 | busiest |\n\
             |---|---|---|---|---|---|---|---|---|---|"
        );
        for r in RouterKind::ALL {
            let mut row = format!("| {} |", r.name());
            for w in FLEET_WORKLOADS {
                let runs = fleet_runs(w.name(), r.name());
                if runs.is_empty() {
                    row.push_str(" – | – | – |");
                    continue;
                }
                let _ = write!(
                    row,
                    " {:.1} | {:.3} | {:.2} |",
                    mean(&runs, "goodput_rpm"),
                    mean(&runs, "ttft_p90_s"),
                    mean(&runs, "load_imbalance")
                );
            }
            let _ = writeln!(m, "{row}");
        }
        let _ = writeln!(m);
    }

    // Scale.
    let scale: Vec<&Value> = all
        .iter()
        .filter(|(k, _)| k.starts_with("sim-scale-"))
        .map(|(_, v)| v)
        .collect();
    if !scale.is_empty() {
        let _ = writeln!(
            m,
            "## Scale (chat workload: 2,048-token prompts, `h100-llama70b`, 10 req/s per worker)\n\n\
             Wall seconds and decision µs are wall-clock on the shared 2-vCPU VM, one simulation per \
             core.\n\n\
             | router | workers | req/s | simulated s | requests | TTFT p50 s | TTFT p90 s | within SLO (4 s) | cache hit | busiest / mean | decision µs mean | p99 | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let mut rows: Vec<&&Value> = scale.iter().collect();
        rows.sort_by_key(|v| {
            (
                s(v, "router").to_string(),
                v.get("workers").and_then(Value::as_u64),
            )
        });
        for v in &rows {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.1} % | {:.1} % | {:.2} | {:.1} | {:.1} | {:.1} |",
                s(v, "router"),
                f(v, "workers"),
                s(v, "load"),
                f(v, "duration_s"),
                f(v, "requests"),
                f(v, "ttft_p50_s"),
                f(v, "ttft_p90_s"),
                100.0 * f(v, "slo_attainment"),
                100.0 * f(v, "cache_hit_rate"),
                f(v, "load_imbalance"),
                f(v, "decision_us_mean"),
                f(v, "decision_us_p99"),
                f(v, "wall_s"),
            );
        }
        let _ = writeln!(m);
        scale_wall_table(&mut m, &rows);
    }

    // Live.
    let live: Vec<(&String, &Value)> = all.iter().filter(|(k, _)| k.starts_with("live-")).collect();
    let _ = writeln!(m, "## Live runs (`kinf-bench live`)\n");
    if live.is_empty() {
        let _ = writeln!(
            m,
            "No `live-*.json` in the results directory: run `kinf-bench live` (real processes, \
             scaled down) and then `kinf-bench report` to include them.\n"
        );
    } else {
        let compressed = compressed_schedules(&live);
        let _ = writeln!(
            m,
            "| file | workload | router | requests | TTFT p50 s | TTFT p90 s | e2e p50 s | goodput req/min | cache hit | run s |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for (k, v) in &live {
            let mark = if compressed.contains(&k.as_str()) {
                " †"
            } else {
                ""
            };
            let _ = writeln!(
                m,
                "| {k} | {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} % | {:.1}{mark} |",
                s(v, "workload"),
                s(v, "router"),
                v.get("requests").map(|x| x.to_string()).unwrap_or_default(),
                f(v, "ttft_p50_s"),
                f(v, "ttft_p90_s"),
                f(v, "e2e_p50_s"),
                f(v, "goodput_rpm"),
                100.0 * f(v, "cache_hit_rate"),
                f(v, "duration_s"),
            );
        }
        let _ = writeln!(
            m,
            "\n\"run s\" is the run's simulated duration. Poisson runs of one workload, client, load \
             and seed send on the same schedule, so their durations agree; † marks a run more than \
             {:.0} % shorter than the median of its group, or whose client recorded a request sent \
             more than {MAX_SCHEDULE_LAG_S} s (wall) after its scheduled start (GuideLLM's \
             `client_info.schedule.lag_max_s`): the client fell behind its schedule and sent the \
             late requests at once (GuideLLM does this now and then on a 2-vCPU VM), so its \
             latencies are not comparable. Rerun it (`scripts/bench/live.sh` reruns such GuideLLM \
             runs by itself).\n",
            100.0 * (1.0 - COMPRESSED_BELOW)
        );
    }
    if !analysis.is_empty() {
        let _ = writeln!(m, "{analysis}");
    }
    m
}

/// The scale runs' wall time per request, by part (`wall_breakdown`), against the budget of
/// the scale target. Runs without a breakdown (older results) are left out.
fn scale_wall_table(m: &mut String, rows: &[&&Value]) {
    use std::fmt::Write as _;
    const PARTS: [&str; 7] = [
        "engine_s",
        "decide_s",
        "observe_s",
        "scrape_s",
        "workload_s",
        "setup_s",
        "other_s",
    ];
    let with: Vec<&&&Value> = rows
        .iter()
        .filter(|v| v.get("wall_breakdown").is_some_and(Value::is_object))
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "Where the wall time goes, µs per request sent (`wall_breakdown` ÷ `submitted`): the \
         simulated engines, the router's decisions (`route`), the router taking in engine \
         outputs (`observe`: KV events, first tokens, completions), metrics scrapes, \
         generating prompts, building the fleet, and the rest. The scale target (10,000 req/s for 600 simulated \
         seconds in ≤ 60 s) allows **10 µs per request for all of it**.\n\n\
         | router | workers | simulated s | engine | decide | observe | scrape | workload | setup | other | total |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
    );
    for v in with {
        let n = f(v, "submitted");
        let b = v.get("wall_breakdown");
        let us = |k: &str| {
            1e6 * b
                .and_then(|b| b.get(k))
                .and_then(Value::as_f64)
                .unwrap_or(f64::NAN)
                / n
        };
        let mut row = format!(
            "| {} | {} | {:.0} |",
            s(v, "router"),
            f(v, "workers"),
            f(v, "duration_s")
        );
        for k in PARTS {
            let _ = write!(row, " {:.1} |", us(k));
        }
        let _ = write!(row, " {:.1} |", 1e6 * f(v, "wall_s") / n);
        let _ = writeln!(m, "{row}");
    }
    let _ = writeln!(m);
}

/// A live Poisson run shorter than this share of its group's median duration sent on a
/// compressed schedule.
const COMPRESSED_BELOW: f64 = 0.93;

/// A client that sent a request later than this after its scheduled start (wall seconds) fell
/// behind its schedule. `scripts/bench/live.sh` uses the same limit (`LIVE_MAX_LAG`).
const MAX_SCHEDULE_LAG_S: f64 = 1.0;

/// The live Poisson runs whose duration is below [`COMPRESSED_BELOW`] × the median of the runs
/// with the same workload, client, load and seed (groups of three runs or more), and the runs
/// whose client recorded a schedule lag above [`MAX_SCHEDULE_LAG_S`].
fn compressed_schedules<'a>(live: &[(&'a String, &Value)]) -> Vec<&'a str> {
    let key = |v: &Value| -> Option<String> {
        let load = s(v, "load");
        load.starts_with("poisson").then(|| {
            format!(
                "{}|{}|{load}|{}",
                s(v, "workload"),
                s(v, "client"),
                v.get("seed").map(|x| x.to_string()).unwrap_or_default()
            )
        })
    };
    let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (_, v) in live {
        if let Some(k) = key(v) {
            groups.entry(k).or_default().push(f(v, "duration_s"));
        }
    }
    // Each group's median duration, for groups large enough to tell.
    let medians: BTreeMap<String, f64> = groups
        .into_iter()
        .filter(|(_, ds)| ds.len() >= 3)
        .map(|(k, mut ds)| {
            ds.sort_by(f64::total_cmp);
            let median = ds.get(ds.len() / 2).copied().unwrap_or(f64::NAN);
            (k, median)
        })
        .collect();
    let lagged = |v: &Value| {
        v.pointer("/client_info/schedule/lag_max_s")
            .and_then(Value::as_f64)
            .is_some_and(|lag| lag > MAX_SCHEDULE_LAG_S)
    };
    live.iter()
        .filter(|(_, v)| {
            lagged(v)
                || key(v)
                    .and_then(|k| medians.get(&k))
                    .is_some_and(|m| f(v, "duration_s") < COMPRESSED_BELOW * m)
        })
        .map(|(k, _)| k.as_str())
        .collect()
}

/// Runs `kinf-bench report`.
pub fn main(args: &ReportArgs) -> Result<(), String> {
    if args.run {
        run_all(args)?;
    }
    let all = load(&args.results);
    if all.is_empty() {
        return Err(format!(
            "no JSON results in {} (use --run)",
            args.results.display()
        ));
    }
    std::fs::create_dir_all(&args.plots).map_err(|e| format!("{}: {e}", args.plots.display()))?;
    let mut written = Vec::new();
    for w in WorkloadKind::ALL {
        let series: Vec<(String, Vec<f64>)> = RouterKind::ALL
            .iter()
            .filter_map(|r| {
                let v = all.get(&format!("sim-light-{}-{}-s1.json", w.name(), r.name()))?;
                let cdf: Vec<f64> = v
                    .get("ttft_cdf")?
                    .as_array()?
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                (!cdf.is_empty()).then(|| (r.name().to_string(), cdf))
            })
            .collect();
        if !series.is_empty() {
            let p = args.plots.join(format!("ttft-cdf-{}.png", w.name()));
            plots::cdf(
                &p,
                &format!("TTFT CDF, {} (light load, seed 1)", w.name()),
                &series,
            )?;
            written.push(p);
        }
        let series: Vec<(String, Vec<(f64, f64)>)> = RouterKind::ALL
            .iter()
            .map(|r| {
                let pts = CONCURRENCY
                    .iter()
                    .filter_map(|&c| {
                        cap(&all, w.name(), r.name(), c).map(|v| (c as f64, f(&v, "goodput_rpm")))
                    })
                    .collect::<Vec<_>>();
                (r.name().to_string(), pts)
            })
            .filter(|(_, p)| !p.is_empty())
            .collect();
        if !series.is_empty() {
            let p = args.plots.join(format!("goodput-{}.png", w.name()));
            plots::goodput(
                &p,
                &format!(
                    "Goodput vs concurrency, {} (SLO TTFT <= {} s)",
                    w.name(),
                    w.slo_ttft_s()
                ),
                &series,
            )?;
            written.push(p);
        }
    }
    let analysis = std::fs::read_to_string("bench/analysis.md").unwrap_or_default();
    let md = markdown(&all, args, &analysis);
    std::fs::write(&args.out, md).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!(
        "wrote {} and {} plots from {} results",
        args.out.display(),
        written.len(),
        all.len()
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(router: &str, client: &str, load: &str, duration: f64) -> Value {
        json!({"workload": "shared-prefix", "router": router, "client": client, "load": load,
               "seed": 1, "duration_s": duration})
    }

    #[test]
    fn a_poisson_run_far_shorter_than_its_group_is_marked_compressed() {
        let runs: Vec<(String, Value)> = vec![
            (
                "a".into(),
                run("kinference", "guidellm", "poisson:1.2", 70.1),
            ),
            ("b".into(), run("smg", "guidellm", "poisson:1.2", 86.5)),
            ("c".into(), run("vllm", "guidellm", "poisson:1.2", 86.4)),
            ("d".into(), run("random", "guidellm", "poisson:1.2", 86.4)),
            // A few percent shorter: a faster last request, not a compressed schedule.
            (
                "e".into(),
                run("kinference", "builtin", "poisson:1.2", 82.0),
            ),
            ("f".into(), run("smg", "builtin", "poisson:1.2", 86.0)),
            ("g".into(), run("random", "builtin", "poisson:1.2", 87.5)),
            // Closed loops end when their requests do; not compared.
            (
                "h".into(),
                run("kinference", "builtin", "concurrency:12", 30.0),
            ),
            ("i".into(), run("smg", "builtin", "concurrency:12", 60.0)),
            ("j".into(), run("random", "builtin", "concurrency:12", 90.0)),
            // Too few runs to tell.
            (
                "k".into(),
                run("kinference", "guidellm", "poisson:3.6", 10.0),
            ),
            ("l".into(), run("smg", "guidellm", "poisson:3.6", 29.0)),
        ];
        let live: Vec<(&String, &Value)> = runs.iter().map(|(k, v)| (k, v)).collect();
        assert_eq!(compressed_schedules(&live), vec!["a"]);

        // GuideLLM's own record of its lag marks a run that no group can judge.
        let lag = |lag_max: f64| {
            let mut v = run("kinference", "guidellm", "poisson:3.6", 29.0);
            v["client_info"] = json!({"schedule": {"lag_max_s": lag_max}});
            v
        };
        let runs: Vec<(String, Value)> = vec![("m".into(), lag(2.5)), ("n".into(), lag(0.12))];
        let live: Vec<(&String, &Value)> = runs.iter().map(|(k, v)| (k, v)).collect();
        assert_eq!(compressed_schedules(&live), vec!["m"]);
    }

    #[test]
    fn the_scale_wall_table_gives_microseconds_per_request_and_skips_runs_without_a_breakdown() {
        let with = json!({"router": "kinference", "workers": 1000, "submitted": 100_000,
            "duration_s": 10.0, "wall_s": 9.0, "wall_breakdown": {"engine_s": 2.5, "decide_s": 3.0,
            "observe_s": 1.25, "workload_s": 0.5, "setup_s": 0.25, "scrape_s": 0.0,
            "other_s": 1.5}});
        let without = json!({"router": "epp", "workers": 1000, "submitted": 6_000_000,
            "wall_s": 700.0});
        let mut m = String::new();
        scale_wall_table(&mut m, &[&&with, &&without]);
        assert!(
            m.contains(
                "| kinference | 1000 | 10 | 25.0 | 30.0 | 12.5 | 0.0 | 5.0 | 2.5 | 15.0 | 90.0 |"
            ),
            "{m}"
        );
        assert!(!m.contains("| epp |"), "{m}");
        // No run with a breakdown: no table at all.
        let mut m = String::new();
        scale_wall_table(&mut m, &[&&without]);
        assert!(m.is_empty(), "{m}");
    }
}
