//! GuideLLM as the load generator: the run's prompts written to a JSON-lines file, `guidellm
//! run` against the router, and its JSON report's per-request timings turned into the same
//! records as the built-in client's.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use super::client::{Load, Record};
use super::workload::Session;

/// The default `guidellm` executable: `$KINF_GUIDELLM_VENV` or
/// `~/.cache/kinference/guidellm-venv`, `bin/guidellm` (scripts/peers/setup-guidellm.sh).
pub fn default_bin() -> PathBuf {
    if let Some(v) = std::env::var_os("KINF_GUIDELLM_VENV") {
        return PathBuf::from(v).join("bin/guidellm");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/kinference/guidellm-venv/bin/guidellm")
}

/// One GuideLLM run.
pub struct GuidellmRun<'a> {
    /// `guidellm` executable.
    pub bin: PathBuf,
    /// `http://HOST:PORT` of the router.
    pub target: String,
    /// Served model name.
    pub model: String,
    /// Tokenizer directory (GuideLLM counts tokens with it).
    pub tokenizer: PathBuf,
    /// The prompts (single-turn sessions).
    pub sessions: &'a [Session],
    /// Offered load (rates in simulated seconds).
    pub load: Load,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// Requests to send.
    pub requests: usize,
    /// Wall-clock limit.
    pub duration_wall_s: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// Scratch directory (data file, report, log).
    pub work: PathBuf,
}

/// What a GuideLLM run gave.
pub struct GuidellmResult {
    /// Per-request records (wall seconds).
    pub records: Vec<Record>,
    /// Wall time from the first request's start to the last one's end.
    pub wall_s: f64,
    /// Version and argv.
    pub info: Value,
}

/// The data file: one JSON object per line with the prompt and its output length.
pub fn data_lines(sessions: &[Session]) -> String {
    let mut s = String::new();
    for x in sessions {
        if let Some(t) = x.turns.first() {
            s.push_str(
                &json!({"prompt": t.content, "output_tokens_count": t.max_tokens}).to_string(),
            );
            s.push('\n');
        }
    }
    s
}

/// The `guidellm run` arguments. Backend validation (`GET /health` before the run) is off:
/// the `kinference` gateway answers `/healthz`, not vLLM's `/health`, and every router is
/// driven the same way.
pub fn argv(r: &GuidellmRun<'_>, data: &str, report: &str) -> Vec<String> {
    let profile = match r.load {
        Load::Poisson(rate) => format!("kind=poisson,rate={}", rate * r.speed),
        Load::Concurrency(c) => format!("kind=concurrent,streams={c}"),
    };
    let mut v = vec![
        "run".to_owned(),
        "--backend".into(),
        format!(
            "kind=openai_http,target={},model={},request_format=/v1/chat/completions,validate_backend=false",
            r.target, r.model
        ),
        "--tokenizer".into(),
        format!("kind=huggingface_auto,model={}", r.tokenizer.display()),
        "--data".into(),
        format!("kind=json_file,path={data}"),
        "--profile".into(),
        profile,
        "--constraint".into(),
        format!("kind=max_requests,count={}", r.requests),
        "--seed".into(),
        format!("kind=static,value={}", r.seed),
        "--output".into(),
        format!("kind=json,path={report}"),
        "--disable-console-interactive".into(),
    ];
    if let Some(d) = r.duration_wall_s {
        v.push("--constraint".into());
        v.push(format!("kind=max_duration,duration={d}"));
    }
    v
}

/// Per-request records from GuideLLM's JSON report.
pub fn parse_report(report: &Value) -> Result<(Vec<Record>, f64), String> {
    let b = report["benchmarks"]
        .get(0)
        .ok_or("GuideLLM report has no benchmarks")?;
    let mut records = Vec::new();
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    for (kind, failed) in [
        ("successful", false),
        ("errored", true),
        ("incomplete", true),
    ] {
        let Some(list) = b["requests"][kind].as_array() else {
            continue;
        };
        for q in list {
            let start = q["request_start_time"].as_f64();
            let end = q["request_end_time"].as_f64();
            let ttft_ms = q["time_to_first_token_ms"].as_f64();
            let (Some(s), Some(e)) = (start, end) else {
                records.push(Record {
                    error: Some(format!("{kind} request without timings")),
                    ..Record::default()
                });
                continue;
            };
            first = first.min(s);
            last = last.max(e);
            records.push(Record {
                session: records.len(),
                sent_s: s,
                ttft_s: ttft_ms.map(|x| x / 1000.0),
                e2e_s: e - s,
                prompt_tokens: q["prompt_tokens"].as_u64(),
                cached_tokens: q["cached_tokens"].as_u64(),
                output_tokens: q["output_tokens"].as_u64().unwrap_or(0),
                error: failed.then(|| q["info"]["error"].as_str().unwrap_or(kind).to_owned()),
                ..Record::default()
            });
        }
    }
    for r in &mut records {
        r.sent_s -= first;
    }
    let wall = if last > first { last - first } else { 0.0 };
    Ok((records, wall))
}

/// How well GuideLLM kept its arrival schedule, from each request's `info.timings`
/// (`request_start` against `targeted_start`, wall seconds): the span of the targeted starts
/// and the median and largest lag. A client that falls behind its Poisson schedule sends the
/// late requests in a burst, which compresses the run and biases it against the router under
/// test. `None` when the report has no such timings (older GuideLLM).
pub fn schedule_of(report: &Value) -> Option<Value> {
    let b = report["benchmarks"].get(0)?;
    let mut targeted = Vec::new();
    let mut lags = Vec::new();
    for kind in ["successful", "errored", "incomplete"] {
        for q in b["requests"][kind].as_array().into_iter().flatten() {
            let t = &q["info"]["timings"];
            if let (Some(target), Some(start)) =
                (t["targeted_start"].as_f64(), t["request_start"].as_f64())
            {
                targeted.push(target);
                lags.push(start - target);
            }
        }
    }
    if lags.is_empty() {
        return None;
    }
    lags.sort_by(f64::total_cmp);
    let span = targeted.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - targeted.iter().copied().fold(f64::INFINITY, f64::min);
    let r4 = |x: f64| (x * 10_000.0).round() / 10_000.0;
    Some(json!({
        "targeted_span_s": r4(span),
        "lag_p50_s": r4(lags[lags.len() / 2]),
        "lag_max_s": r4(lags[lags.len() - 1]),
    }))
}

/// Runs GuideLLM and reads its report.
pub async fn run(r: &GuidellmRun<'_>) -> Result<GuidellmResult, String> {
    if !r.bin.exists() {
        return Err(format!(
            "{} not found (run scripts/peers/setup-guidellm.sh)",
            r.bin.display()
        ));
    }
    let data = r.work.join("guidellm-data.jsonl");
    std::fs::write(&data, data_lines(r.sessions)).map_err(|e| e.to_string())?;
    let report = r.work.join("guidellm-report.json");
    let args = argv(
        r,
        &data.display().to_string(),
        &report.display().to_string(),
    );
    let log = r.work.join("guidellm.log");
    let bin = r.bin.clone();
    let log2 = log.clone();
    let args2 = args.clone();
    let t0 = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::create(&log2).map_err(|e| e.to_string())?;
        let f2 = f.try_clone().map_err(|e| e.to_string())?;
        Command::new(&bin)
            .args(&args2)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL", "WARNING")
            .stdout(f)
            .stderr(f2)
            .status()
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())??;
    let ran_s = t0.elapsed().as_secs_f64();
    if !status.success() {
        return Err(format!(
            "guidellm exited with {status} (log {}: {})",
            log.display(),
            crate::procs::log_tail(&log, 8)
        ));
    }
    let text =
        std::fs::read_to_string(&report).map_err(|e| format!("{}: {e}", report.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("GuideLLM report: {e}"))?;
    let (records, wall_s) = parse_report(&v)?;
    let schedule = schedule_of(&v);
    let version = Command::new(r.bin.with_file_name("python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('guidellm'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let mut argv = vec![r.bin.display().to_string()];
    argv.extend(args);
    Ok(GuidellmResult {
        records,
        wall_s,
        info: json!({"program": "guidellm", "version": version, "argv": argv,
                     "process_wall_s": (ran_s * 1000.0).round() / 1000.0,
                     "schedule": schedule}),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::live::workload::Turn;

    #[test]
    fn report_requests_become_records() {
        // The fields GuideLLM 0.8.1 writes per request (trimmed from a real report).
        let ok = |start: f64, end: f64, ttft_ms: f64| {
            json!({"request_start_time": start, "request_end_time": end,
                   "time_to_first_token_ms": ttft_ms, "prompt_tokens": 138, "cached_tokens": 64,
                   "output_tokens": 8, "info": {"error": null}})
        };
        let report = json!({"benchmarks": [{"requests": {
            "successful": [ok(100.0, 100.5, 20.0), ok(100.25, 101.0, 40.0)],
            "errored": [{"request_start_time": 100.5, "request_end_time": 100.6,
                         "time_to_first_token_ms": null, "info": {"error": "HTTP 503"}}],
            "incomplete": [],
            "total": null,
        }}]});
        let (r, wall) = parse_report(&report).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(wall, 1.0);
        assert_eq!(r[0].ttft_s, Some(0.02));
        assert_eq!(r[1].sent_s, 0.25);
        assert_eq!(r[1].e2e_s, 0.75);
        assert_eq!(r[0].cached_tokens, Some(64));
        assert_eq!(r[0].output_tokens, 8);
        assert!(r[0].error.is_none());
        assert_eq!(r[2].error.as_deref(), Some("HTTP 503"));
        assert!(parse_report(&json!({"benchmarks": []})).is_err());
    }

    #[test]
    fn schedule_lag_is_read_from_the_request_timings() {
        let req = |target: f64, start: f64| json!({"info": {"timings": {"targeted_start": target, "request_start": start}}});
        // On schedule, except one request sent 2.5 s late (a client that fell behind).
        let report = json!({"benchmarks": [{"requests": {
            "successful": [req(10.0, 10.01), req(11.0, 11.02), req(12.0, 14.5)],
            "errored": [req(13.0, 13.03)],
            "incomplete": [],
        }}]});
        let s = schedule_of(&report).unwrap();
        assert_eq!(s["targeted_span_s"], json!(3.0));
        assert_eq!(s["lag_p50_s"], json!(0.03));
        assert_eq!(s["lag_max_s"], json!(2.5));
        // Without timings (older GuideLLM), nothing is claimed.
        let old = json!({"benchmarks": [{"requests": {"successful": [{"info": {}}]}}]});
        assert!(schedule_of(&old).is_none());
    }

    #[test]
    fn data_file_and_arguments() {
        let sessions = vec![Session {
            prefix: Some(0),
            turns: vec![Turn {
                content: "cache data".into(),
                max_tokens: 32,
            }],
        }];
        let lines = data_lines(&sessions);
        let v: Value = serde_json::from_str(lines.trim()).unwrap();
        assert_eq!(
            v,
            json!({"prompt": "cache data", "output_tokens_count": 32})
        );
        let run = GuidellmRun {
            bin: "guidellm".into(),
            target: "http://127.0.0.1:1".into(),
            model: "m".into(),
            tokenizer: "/tok".into(),
            sessions: &sessions,
            load: Load::Poisson(0.5),
            speed: 8.0,
            requests: 1,
            duration_wall_s: None,
            seed: 3,
            work: "/tmp".into(),
        };
        let a = argv(&run, "/d.jsonl", "/r.json").join(" ");
        assert!(a.contains("--profile kind=poisson,rate=4 "), "{a}");
        assert!(a.contains("--seed kind=static,value=3"), "{a}");
        assert!(a.contains("--constraint kind=max_requests,count=1"), "{a}");
        let c = GuidellmRun {
            load: Load::Concurrency(16),
            ..run
        };
        assert!(
            argv(&c, "/d", "/r")
                .join(" ")
                .contains("kind=concurrent,streams=16")
        );
    }
}
