//! A small, allocation-light parser of the Prometheus text exposition format (0.0.4), enough
//! for vLLM's `/metrics`.
//!
//! [`Samples`] iterates over the sample lines of a text, borrowing names, raw label blocks and
//! values from it; comments (`# HELP`, `# TYPE`, anything after `#`) and blank lines are
//! skipped. Label values are unescaped (`\\`, `\"`, `\n`) only when asked for
//! ([`Sample::label`]), and only then allocate, and only when they contain an escape. Values
//! accept `NaN`, `+Inf`, `-Inf` and any float; an optional integer timestamp (ms) may follow.
//! Errors name the 1-based line.
//!
//! [`parse_vllm`] extracts what the router needs from vLLM: the load gauges and the
//! `vllm:cache_config_info` labels.

use std::borrow::Cow;
use std::fmt;

/// A malformed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub what: &'static str,
    /// The line, truncated to 120 characters.
    pub text: String,
}

impl fmt::Display for PromError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: `{}`", self.line, self.what, self.text)
    }
}

impl std::error::Error for PromError {}

/// One sample line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// Metric name (with its `_total`/`_bucket`… suffix, as on the wire).
    pub name: &'a str,
    /// The text between `{` and `}` (empty when there are no labels), still escaped.
    pub raw_labels: &'a str,
    /// The value.
    pub value: f64,
    /// The optional timestamp (ms since the Unix epoch).
    pub timestamp_ms: Option<i64>,
}

impl<'a> Sample<'a> {
    /// The labels in order, values unescaped.
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            rest: self.raw_labels,
        }
    }

    /// The value of one label.
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over the `(name, value)` labels of a [`Sample`] (validated when the line was parsed).
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.rest.trim_start_matches([' ', '\t', ',']);
        if s.is_empty() {
            self.rest = s;
            return None;
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim();
        let after = s[eq + 1..].trim_start();
        let body = after.strip_prefix('"')?;
        let end = closing_quote(body)?;
        let raw = &body[..end];
        self.rest = &body[end + 1..];
        Some((name, unescape(raw)))
    }
}

/// Byte index of the closing quote of a label value starting after its opening quote.
fn closing_quote(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// Iterator over the samples of a text.
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
}

/// The samples of an exposition text.
pub fn samples(text: &str) -> Samples<'_> {
    Samples {
        lines: text.lines().enumerate(),
    }
}

impl<'a> Iterator for Samples<'a> {
    type Item = Result<Sample<'a>, PromError>;

    fn next(&mut self) -> Option<Self::Item> {
        for (i, line) in self.lines.by_ref() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            return Some(parse_line(l).map_err(|what| PromError {
                line: i + 1,
                what,
                text: line.chars().take(120).collect(),
            }));
        }
        None
    }
}

fn is_name_char(c: u8, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':' || (!first && c.is_ascii_digit())
}

fn parse_line(l: &str) -> Result<Sample<'_>, &'static str> {
    let b = l.as_bytes();
    let mut i = 0;
    while i < b.len() && is_name_char(b[i], i == 0) {
        i += 1;
    }
    if i == 0 {
        return Err("expected a metric name");
    }
    let name = &l[..i];
    let mut rest = &l[i..];
    let mut raw_labels = "";
    if let Some(after) = rest.strip_prefix('{') {
        let end = label_block_end(after)?;
        raw_labels = &after[..end];
        rest = &after[end + 1..];
    }
    if !rest.starts_with([' ', '\t']) {
        return Err("expected whitespace before the value");
    }
    let mut parts = rest.split_ascii_whitespace();
    let value = parse_value(parts.next().ok_or("missing value")?)?;
    let timestamp_ms = match parts.next() {
        None => None,
        Some(t) => Some(t.parse::<i64>().map_err(|_| "invalid timestamp")?),
    };
    if parts.next().is_some() {
        return Err("trailing text after the timestamp");
    }
    Ok(Sample {
        name,
        raw_labels,
        value,
        timestamp_ms,
    })
}

/// Validates a label block (after `{`) and returns the index of its closing `}`.
fn label_block_end(s: &str) -> Result<usize, &'static str> {
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b',') {
            i += 1;
        }
        match b.get(i) {
            None => return Err("unterminated label set"),
            Some(b'}') => return Ok(i),
            Some(_) => {}
        }
        let start = i;
        while i < b.len() && is_name_char(b[i], i == start) {
            i += 1;
        }
        if i == start {
            return Err("expected a label name");
        }
        while i < b.len() && matches!(b[i], b' ' | b'\t') {
            i += 1;
        }
        if b.get(i) != Some(&b'=') {
            return Err("expected `=` after a label name");
        }
        i += 1;
        while i < b.len() && matches!(b[i], b' ' | b'\t') {
            i += 1;
        }
        if b.get(i) != Some(&b'"') {
            return Err("expected a quoted label value");
        }
        i += 1;
        let end = closing_quote(&s[i..]).ok_or("unterminated label value")?;
        i += end + 1;
        match b.get(i) {
            Some(b',' | b'}' | b' ' | b'\t') => {}
            None => return Err("unterminated label set"),
            Some(_) => return Err("expected `,` or `}` after a label value"),
        }
    }
}

fn parse_value(s: &str) -> Result<f64, &'static str> {
    match s {
        "NaN" | "nan" => Ok(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Ok(f64::INFINITY),
        "-Inf" | "-inf" => Ok(f64::NEG_INFINITY),
        _ => s.parse::<f64>().map_err(|_| "invalid value"),
    }
}

/// Labels of `vllm:cache_config_info` the router uses.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheConfig {
    /// `block_size`.
    pub block_size: Option<u32>,
    /// `prefix_caching_hash_algo` (`sha256`, `sha256_cbor`, …).
    pub prefix_caching_hash_algo: Option<String>,
    /// `num_gpu_blocks`.
    pub num_gpu_blocks: Option<u64>,
    /// `enable_prefix_caching`.
    pub enable_prefix_caching: Option<bool>,
}

/// What one vLLM `/metrics` scrape says. A gauge is `None` (unknown) when it has no series,
/// or when one of its series is not a number (`NaN`, `±Inf`): a partial sum would understate
/// the load, and reading it as 0 would make a busy worker look idle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VllmMetrics {
    /// `vllm:num_requests_running`, summed over series (engines, models).
    pub running: Option<f64>,
    /// `vllm:num_requests_waiting`, summed over series.
    pub waiting: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (0..1), averaged over series (engines).
    pub kv_usage: Option<f64>,
    /// Number of `vllm:num_requests_running` series (engines × models).
    pub engines: u32,
    /// `vllm:cache_config_info` of the first engine, when exposed.
    pub cache_config: Option<CacheConfig>,
    /// `process_start_time_seconds` (Unix seconds), when exposed: a new value is a new worker
    /// process, whose cache is empty.
    pub process_start_s: Option<f64>,
}

/// Why a text is not a usable vLLM exposition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VllmMetricsError {
    /// A malformed line.
    Syntax(PromError),
    /// `vllm:num_requests_running` is absent (not a vLLM server, or a wrong path).
    NotVllm,
}

impl fmt::Display for VllmMetricsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VllmMetricsError::Syntax(e) => e.fmt(f),
            VllmMetricsError::NotVllm => f.write_str("no vllm:num_requests_running sample"),
        }
    }
}

impl std::error::Error for VllmMetricsError {}

/// Extracts the load gauges and cache configuration from a vLLM `/metrics` text.
pub fn parse_vllm(text: &str) -> Result<VllmMetrics, VllmMetricsError> {
    let mut m = VllmMetrics::default();
    let (mut running, mut waiting, mut kv) = (Gauge::default(), Gauge::default(), Gauge::default());
    for s in samples(text) {
        let s = s.map_err(VllmMetricsError::Syntax)?;
        if s.name == "process_start_time_seconds" && s.value.is_finite() {
            m.process_start_s = Some(s.value);
        }
        let Some(short) = s.name.strip_prefix("vllm:") else {
            continue;
        };
        match short {
            "num_requests_running" => running.add(s.value),
            "num_requests_waiting" => waiting.add(s.value),
            "kv_cache_usage_perc" => kv.add(s.value),
            "cache_config_info" if m.cache_config.is_none() => {
                let mut c = CacheConfig::default();
                for (k, v) in s.labels() {
                    match k {
                        "block_size" => c.block_size = v.parse().ok(),
                        "prefix_caching_hash_algo" => {
                            c.prefix_caching_hash_algo = Some(v.into_owned())
                        }
                        "num_gpu_blocks" => c.num_gpu_blocks = v.parse().ok(),
                        "enable_prefix_caching" => {
                            c.enable_prefix_caching = match &*v {
                                "True" | "true" => Some(true),
                                "False" | "false" => Some(false),
                                _ => None,
                            }
                        }
                        _ => {}
                    }
                }
                m.cache_config = Some(c);
            }
            _ => {}
        }
    }
    if running.series == 0 {
        return Err(VllmMetricsError::NotVllm);
    }
    m.engines = running.series;
    m.running = running.sum();
    m.waiting = waiting.sum();
    m.kv_usage = kv.sum().map(|sum| sum / f64::from(kv.series));
    Ok(m)
}

/// The series of one gauge.
#[derive(Default)]
struct Gauge {
    sum: f64,
    series: u32,
    not_a_number: bool,
}

impl Gauge {
    fn add(&mut self, v: f64) {
        self.series = self.series.saturating_add(1);
        if v.is_finite() {
            self.sum += v;
        } else {
            self.not_a_number = true;
        }
    }

    /// The sum; `None` without series or when one is not a number.
    fn sum(&self) -> Option<f64> {
        (self.series > 0 && !self.not_a_number).then_some(self.sum)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const RAW: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/metrics_raw.txt");
    const AFTER_GUIDELLM: &str =
        include_str!("../../../testdata/vllm-0.32.0-cpu/metrics_after_guidellm.txt");
    const EAGER_IDLE: &str =
        include_str!("../../../testdata/vllm-0.32.0-cpu/run3-eager/metrics_raw.txt");
    const EAGER_LOAD: &str =
        include_str!("../../../testdata/vllm-0.32.0-cpu/run3-eager/metrics_under_load.txt");
    const SMALL_CACHE: &str =
        include_str!("../../../testdata/vllm-0.32.0-cpu/run2-small-cache/metrics_raw.txt");

    #[test]
    fn every_fixture_line_parses() {
        for text in [RAW, AFTER_GUIDELLM, EAGER_IDLE, EAGER_LOAD, SMALL_CACHE] {
            let n = samples(text).filter(|s| s.is_ok()).count();
            assert!(samples(text).all(|s| s.is_ok()));
            let expected = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .count();
            assert_eq!(n, expected);
        }
    }

    #[test]
    fn idle_server() {
        let m = parse_vllm(RAW).unwrap();
        assert_eq!(
            (m.running, m.waiting, m.kv_usage, m.engines),
            (Some(0.0), Some(0.0), Some(0.0), 1)
        );
        let c = m.cache_config.unwrap();
        assert_eq!(c.block_size, Some(32));
        assert_eq!(c.prefix_caching_hash_algo.as_deref(), Some("sha256"));
        assert_eq!(c.num_gpu_blocks, Some(32768));
        assert_eq!(c.enable_prefix_caching, Some(true));
    }

    #[test]
    fn after_guidellm_uses_sha256_cbor() {
        let m = parse_vllm(AFTER_GUIDELLM).unwrap();
        let c = m.cache_config.unwrap();
        assert_eq!(c.prefix_caching_hash_algo.as_deref(), Some("sha256_cbor"));
        assert_eq!(c.block_size, Some(32));
    }

    #[test]
    fn under_load() {
        let m = parse_vllm(EAGER_LOAD).unwrap();
        assert_eq!(m.running, Some(7.0));
        assert_eq!(m.waiting, Some(1.0));
        assert!((m.kv_usage.unwrap() - 0.8888888888888888).abs() < 1e-12);
        assert_eq!(m.cache_config.unwrap().num_gpu_blocks, Some(64));
        let idle = parse_vllm(EAGER_IDLE).unwrap();
        assert_eq!(idle.running, Some(0.0));
        assert_eq!(parse_vllm(SMALL_CACHE).unwrap().engines, 1);
        // The API server's start time, which tells a restart.
        assert_eq!(m.process_start_s, Some(1.79596018162e9));
    }

    #[test]
    fn process_metrics_in_exponent_notation() {
        let s = samples(RAW)
            .map(|s| s.unwrap())
            .find(|s| s.name == "process_virtual_memory_bytes")
            .unwrap();
        assert_eq!(s.value, 4.799852544e9);
    }

    #[test]
    fn two_engines_sum_running_and_average_usage() {
        let text = "# HELP x\nvllm:num_requests_running{engine=\"0\"} 2\n\
                    vllm:num_requests_running{engine=\"1\"} 3\n\
                    vllm:num_requests_waiting{engine=\"0\"} 1\n\
                    vllm:num_requests_waiting{engine=\"1\"} 4\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
                    vllm:kv_cache_usage_perc{engine=\"1\"} 0.25 1700000000000\n";
        let m = parse_vllm(text).unwrap();
        assert_eq!(
            (m.running, m.waiting, m.kv_usage, m.engines),
            (Some(5.0), Some(5.0), Some(0.375), 2)
        );
    }

    #[test]
    fn not_a_number_and_missing_gauges_are_unknown_not_zero() {
        // One engine's queue is NaN: the sum is unknown (not the other engine's alone, and
        // not 0); the KV usage is not exposed at all.
        let text = "vllm:num_requests_running{engine=\"0\"} 2\n\
                    vllm:num_requests_running{engine=\"1\"} +Inf\n\
                    vllm:num_requests_waiting{engine=\"0\"} 1\n\
                    vllm:num_requests_waiting{engine=\"1\"} NaN\n";
        let m = parse_vllm(text).unwrap();
        assert_eq!(
            (m.running, m.waiting, m.kv_usage, m.engines),
            (None, None, None, 2)
        );
    }

    #[test]
    fn escapes_special_values_and_timestamps() {
        let text = "a{l=\"x\\\"y\\\\z\\n\",m=\"}\"} +Inf 123\nb -Inf\nc{} NaN\n";
        let v: Vec<Sample<'_>> = samples(text).map(|s| s.unwrap()).collect();
        assert_eq!(v[0].label("l").unwrap(), "x\"y\\z\n");
        assert_eq!(v[0].label("m").unwrap(), "}");
        assert_eq!(v[0].value, f64::INFINITY);
        assert_eq!(v[0].timestamp_ms, Some(123));
        assert_eq!(v[1].value, f64::NEG_INFINITY);
        assert!(v[2].value.is_nan());
        assert_eq!(v[2].labels().count(), 0);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "# c\nok 1\nbad{l=\"x} 1\n";
        let e = samples(text).find_map(|s| s.err()).unwrap();
        assert_eq!(e.line, 3);
        assert!(e.to_string().starts_with("line 3: "), "{e}");
        for bad in [
            "x 1 2 3",
            "x abc",
            "x",
            "x{l=1} 2",
            "{a=\"b\"} 1",
            "x{l=\"a\"b} 1",
        ] {
            assert!(samples(bad).next().unwrap().is_err(), "{bad}");
        }
        assert_eq!(
            parse_vllm("other_metric 1\n"),
            Err(VllmMetricsError::NotVllm)
        );
    }
}
