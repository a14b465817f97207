//! Service objectives: a server-side list read from a YAML (or JSON) file, matched against each
//! request's tenant and requested model, and counted as `kinference_slo_requests_total` and
//! `kinference_slo_good_total` (attainment = good / requests).
//!
//! ```yaml
//! slos:                      # or the list alone at the top level
//! - name: chat-ttft          # optional; default `<metric>_p<quantile×100>_<threshold>`
//!   tenant: "team-*"         # optional glob (`*`, `?`); absent matches every tenant
//!   model: "llama-*"         # optional glob on the requested model
//!   metric: ttft             # ttft | itl | tpot | e2e
//!   quantile: 0.9            # target fraction of good requests, in (0, 1)
//!   threshold: 2s            # good = metric ≤ threshold; `250ms`, `2s`, `1.5s`, `1m`, or seconds
//! ```

use std::fmt;

use kinf_lang::yaml::{Node, Value, parse_documents};
use kinf_lang::{FileId, SourceFile};

/// What an objective measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SloMetric {
    /// Time from receiving the request to its first token.
    Ttft,
    /// Mean inter-token latency of the response.
    Itl,
    /// Time per output token after the first.
    Tpot,
    /// Time from receiving the request to the end of the response.
    E2e,
}

impl SloMetric {
    /// The label value (`ttft`, `itl`, `tpot`, `e2e`).
    pub fn label(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Itl => "itl",
            SloMetric::Tpot => "tpot",
            SloMetric::E2e => "e2e",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ttft" => SloMetric::Ttft,
            "itl" => SloMetric::Itl,
            "tpot" => SloMetric::Tpot,
            "e2e" => SloMetric::E2e,
            _ => return None,
        })
    }
}

/// One service objective.
#[derive(Clone, Debug, PartialEq)]
pub struct Slo {
    /// Name (the `slo` label).
    pub name: String,
    /// Tenant glob; `None` matches every tenant (anonymous included).
    pub tenant: Option<String>,
    /// Requested-model glob; `None` matches every model.
    pub model: Option<String>,
    /// What is measured.
    pub metric: SloMetric,
    /// Target fraction of good requests.
    pub quantile: f64,
    /// Good when the measured value is at most this many seconds.
    pub threshold_s: f64,
}

impl Slo {
    /// Whether the objective applies to a request of `tenant` for `model`.
    pub fn matches(&self, tenant: &str, model: &str) -> bool {
        self.tenant.as_deref().is_none_or(|g| glob(g, tenant))
            && self.model.as_deref().is_none_or(|g| glob(g, model))
    }
}

/// The objectives in force.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SloSet {
    slos: Vec<Slo>,
}

/// One problem of an SLO file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SloProblem {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Why an SLO file was refused: every problem found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SloError {
    /// The problems, in file order.
    pub problems: Vec<SloProblem>,
}

impl fmt::Display for SloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            // Line 0: a problem with the file as a whole (it cannot be read).
            if p.line == 0 {
                write!(f, "{}", p.message)?;
            } else {
                write!(f, "line {}:{}: {}", p.line, p.column, p.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for SloError {}

impl SloSet {
    /// Objectives from a list (names must be unique; not checked here).
    pub fn new(slos: Vec<Slo>) -> Self {
        SloSet { slos }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.slos.is_empty()
    }

    /// The objectives.
    pub fn iter(&self) -> impl Iterator<Item = &Slo> {
        self.slos.iter()
    }

    /// Reads and parses a file (see [`SloSet::from_yaml`]).
    pub fn from_file(path: &std::path::Path) -> Result<Self, SloError> {
        let text = std::fs::read_to_string(path).map_err(|e| SloError {
            problems: vec![SloProblem {
                line: 0,
                column: 0,
                message: format!("cannot read {}: {e}", path.display()),
            }],
        })?;
        Self::from_yaml(&text)
    }

    /// Parses objectives from YAML or JSON (see the module documentation). Every problem is
    /// reported with its line.
    pub fn from_yaml(text: &str) -> Result<Self, SloError> {
        let file = SourceFile::new("slo", text);
        let mut diags = Vec::new();
        let docs = parse_documents(FileId(0), &file, &mut diags);
        let mut problems: Vec<SloProblem> = Vec::new();
        let at = |byte: usize, message: String| {
            let (line, column) = file.line_col(byte);
            SloProblem {
                line,
                column,
                message,
            }
        };
        for d in &diags {
            let byte = d.primary.as_ref().map_or(0, |(s, _)| s.start);
            problems.push(at(byte, d.message.clone()));
        }
        if !problems.is_empty() {
            return Err(SloError { problems });
        }
        if let Some(extra) = docs.get(1) {
            problems.push(at(
                extra.root.span.start,
                format!(
                    "the file has {} YAML documents; objectives are read from one (put them all \
                     in one list)",
                    docs.len()
                ),
            ));
        }
        let mut slos = Vec::new();
        if let Some(doc) = docs.first() {
            let list = match &doc.root.value {
                Value::Null => None,
                Value::Seq(items) => Some(items.as_slice()),
                Value::Map(_) => match doc.root.get("slos") {
                    Some(Node {
                        value: Value::Seq(items),
                        ..
                    }) => Some(items.as_slice()),
                    Some(Node {
                        value: Value::Null, ..
                    }) => None,
                    Some(n) => {
                        problems.push(at(n.span.start, "`slos` must be a list".into()));
                        None
                    }
                    None => {
                        problems.push(at(
                            doc.root.span.start,
                            "expected a list of objectives, or a mapping with `slos`".into(),
                        ));
                        None
                    }
                },
                _ => {
                    problems.push(at(
                        doc.root.span.start,
                        format!(
                            "expected a list of objectives, found {}",
                            doc.root.value.type_name()
                        ),
                    ));
                    None
                }
            };
            if let Value::Map(entries) = &doc.root.value {
                for e in entries {
                    if e.key != "slos" {
                        problems.push(at(
                            e.key_span.start,
                            format!("unknown field `{}`; expected `slos`", e.key),
                        ));
                    }
                }
            }
            for item in list.unwrap_or(&[]) {
                match parse_one(item, &at) {
                    Ok((s, named)) => slos.push((s, named, item.span.start)),
                    Err(mut p) => problems.append(&mut p),
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (s, named, start) in &slos {
            if !seen.insert(s.name.clone()) {
                let why = if *named {
                    ""
                } else {
                    // Two objectives without `name` that differ only in `tenant` or `model`
                    // get the same default name: say where it came from.
                    " (the default name of an objective without `name`: \
                     `<metric>_p<quantile×100>_<threshold>`; give it a `name`)"
                };
                problems.push(at(
                    *start,
                    format!("objective `{}` is defined twice{why}", s.name),
                ));
            }
        }
        if !problems.is_empty() {
            problems.sort_by_key(|p| (p.line, p.column));
            return Err(SloError { problems });
        }
        Ok(SloSet {
            slos: slos.into_iter().map(|(s, _, _)| s).collect(),
        })
    }
}

/// One objective, and whether it has a `name` of its own (else its default name).
fn parse_one(
    item: &Node,
    at: &impl Fn(usize, String) -> SloProblem,
) -> Result<(Slo, bool), Vec<SloProblem>> {
    let mut problems = Vec::new();
    let Value::Map(entries) = &item.value else {
        return Err(vec![at(
            item.span.start,
            format!(
                "an objective must be a mapping, found {}",
                item.value.type_name()
            ),
        )]);
    };
    let mut name = None;
    let mut tenant = None;
    let mut model = None;
    let mut metric = None;
    let mut quantile = None;
    let mut threshold = None;
    for e in entries {
        let v = &e.value;
        let string = |problems: &mut Vec<SloProblem>| match &v.value {
            Value::Str(s) if !s.is_empty() => Some(s.to_string()),
            _ => {
                problems.push(at(
                    v.span.start,
                    format!("`{}` must be a non-empty string", e.key),
                ));
                None
            }
        };
        match e.key.as_str() {
            "name" => {
                name = string(&mut problems);
                if let Some(n) = &name
                    && !n
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c))
                {
                    problems.push(at(
                        v.span.start,
                        format!("name `{n}` may only hold letters, digits and `-_.:/`"),
                    ));
                }
            }
            "tenant" => tenant = string(&mut problems),
            "model" => model = string(&mut problems),
            "metric" => match &v.value {
                Value::Str(s) => match SloMetric::parse(s) {
                    Some(m) => metric = Some(m),
                    None => problems.push(at(
                        v.span.start,
                        format!("metric `{s}` is not one of ttft, itl, tpot, e2e"),
                    )),
                },
                _ => problems.push(at(
                    v.span.start,
                    "`metric` must be one of ttft, itl, tpot, e2e".into(),
                )),
            },
            "quantile" => {
                let q = match &v.value {
                    Value::Float(f) => Some(*f),
                    Value::Int(i) => Some(*i as f64),
                    _ => None,
                };
                match q {
                    Some(q) if q > 0.0 && q < 1.0 => quantile = Some(q),
                    _ => problems.push(at(
                        v.span.start,
                        "`quantile` must be a number between 0 and 1 (exclusive), e.g. 0.9".into(),
                    )),
                }
            }
            "threshold" => {
                let t = match &v.value {
                    Value::Float(f) => Some(*f),
                    Value::Int(i) => Some(*i as f64),
                    Value::Str(s) => parse_duration(s),
                    _ => None,
                };
                match t {
                    Some(t) if t > 0.0 && t.is_finite() => threshold = Some(t),
                    _ => problems.push(at(
                        v.span.start,
                        "`threshold` must be a positive duration: `500us`, `250ms`, `2s`, `1m`, or seconds"
                            .into(),
                    )),
                }
            }
            other => problems.push(at(
                e.key_span.start,
                format!(
                    "unknown field `{other}`; expected name, tenant, model, metric, quantile, threshold"
                ),
            )),
        }
    }
    for (field, missing) in [
        ("metric", metric.is_none()),
        ("quantile", quantile.is_none()),
        ("threshold", threshold.is_none()),
    ] {
        if missing && !entries.iter().any(|e| e.key == field) {
            problems.push(at(item.span.start, format!("missing field `{field}`")));
        }
    }
    match (metric, quantile, threshold) {
        (Some(metric), Some(quantile), Some(threshold_s)) if problems.is_empty() => {
            let named = name.is_some();
            let slo = Slo {
                name: name.unwrap_or_else(|| default_name(metric, quantile, threshold_s)),
                tenant,
                model,
                metric,
                quantile,
                threshold_s,
            };
            Ok((slo, named))
        }
        _ => Err(problems),
    }
}

fn default_name(metric: SloMetric, quantile: f64, threshold_s: f64) -> String {
    let q = format!("{}", (quantile * 1000.0).round() / 10.0);
    let t = if threshold_s < 1.0 {
        format!("{}ms", (threshold_s * 1000.0).round())
    } else {
        format!("{threshold_s}s")
    };
    format!("{}_p{}_{t}", metric.label(), q.replace('.', "_"))
}

/// Parses `250ms`, `2s`, `1.5s`, `1m`, `500us` into seconds.
pub fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    // Divided, not multiplied by 1e-3 or 1e-6 (not exact in binary): `1400 / 1000` is 1.4,
    // `1400 × 1e-3` is 1.4000000000000001 (in the threshold gauge and the default name), and
    // `5 × 1e-6` is below 5 µs.
    Some(match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "m" => n * 60.0,
        _ => return None,
    })
}

/// Glob match with `*` (any run) and `?` (one character).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(c) if *c == '?' || Some(c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Good and total counts of one objective over the last 5 minutes, in 30 slots of 10 s.
#[derive(Clone, Debug, Default)]
pub struct Rolling {
    slots: [(u64, u64, u64); SLOTS],
}

const SLOTS: usize = 30;
const SLOT_S: f64 = 10.0;

impl Rolling {
    /// Adds one request at `now_s`.
    pub fn add(&mut self, now_s: f64, good: bool) {
        let idx = (now_s / SLOT_S) as u64 + 1;
        let slot = &mut self.slots[(idx % SLOTS as u64) as usize];
        if slot.0 != idx {
            *slot = (idx, 0, 0);
        }
        slot.1 += 1;
        slot.2 += u64::from(good);
    }

    /// Good / total over the window ending at `now_s`; `None` when there was no request.
    pub fn attainment(&self, now_s: f64) -> Option<f64> {
        let idx = (now_s / SLOT_S) as u64 + 1;
        let (mut total, mut good) = (0u64, 0u64);
        for (i, t, g) in &self.slots {
            if *i != 0 && *i + (SLOTS as u64) > idx && *i <= idx {
                total += t;
                good += g;
            }
        }
        if total > 0 {
            Some(good as f64 / total as f64)
        } else {
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_yaml_and_json() {
        let s = SloSet::from_yaml(
            "slos:\n- name: chat-ttft\n  tenant: 'team-*'\n  metric: ttft\n  quantile: 0.9\n  threshold: 2s\n- metric: tpot\n  quantile: 0.99\n  threshold: 50ms\n",
        )
        .unwrap();
        let v: Vec<&Slo> = s.iter().collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "chat-ttft");
        assert_eq!(v[0].threshold_s, 2.0);
        assert!(v[0].matches("team-a", "x"));
        assert!(!v[0].matches("anonymous", "x"));
        assert_eq!(v[1].name, "tpot_p99_50ms");
        assert!((v[1].threshold_s - 0.05).abs() < 1e-12);
        let j =
            SloSet::from_yaml(r#"[{"metric": "e2e", "quantile": 0.95, "threshold": 30}]"#).unwrap();
        assert_eq!(j.iter().next().unwrap().name, "e2e_p95_30s");
        assert!(SloSet::from_yaml("").unwrap().is_empty());
    }

    #[test]
    fn problems_carry_lines() {
        let e = SloSet::from_yaml(
            "slos:\n- metric: ttfb\n  quantile: 1.5\n  threshold: soon\n  color: red\n- quantile: 0.9\n",
        )
        .unwrap_err();
        let lines: Vec<usize> = e.problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 6], "{e}");
        assert!(e.to_string().contains("line 2:"), "{e}");
        let dup = SloSet::from_yaml(
            "- {name: a, metric: e2e, quantile: 0.9, threshold: 1s}\n- {name: a, metric: ttft, quantile: 0.9, threshold: 1s}\n",
        )
        .unwrap_err();
        assert_eq!(dup.problems[0].line, 2, "{dup}");
        assert!(!dup.to_string().contains("default name"), "{dup}");
        // Two objectives without `name` that differ only in their tenant share the default
        // name: the error says so, and how to fix it.
        let unnamed = SloSet::from_yaml(
            "- {tenant: a, metric: ttft, quantile: 0.9, threshold: 2s}\n- {tenant: b, metric: ttft, quantile: 0.9, threshold: 2s}\n",
        )
        .unwrap_err();
        assert_eq!(unnamed.problems.len(), 1, "{unnamed}");
        assert_eq!(unnamed.problems[0].line, 2, "{unnamed}");
        let text = unnamed.to_string();
        assert!(
            text.contains("`ttft_p90_2s` is defined twice (the default name")
                && text.contains("give it a `name`"),
            "{text}"
        );
        assert!(SloSet::from_yaml("slos: [").is_err());
        // A second YAML document is not silently ignored.
        let two = SloSet::from_yaml(
            "- {metric: e2e, quantile: 0.9, threshold: 1s}\n---\n- {metric: ttft, quantile: 0.9, threshold: 1s}\n",
        )
        .unwrap_err();
        assert_eq!(two.problems.len(), 1, "{two}");
        assert_eq!(two.problems[0].line, 3, "{two}");
        assert!(two.to_string().contains("2 YAML documents"), "{two}");
        // A file that cannot be read names no line.
        let missing =
            SloSet::from_file(std::path::Path::new("/nonexistent/slos.yaml")).unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("cannot read /nonexistent/slos.yaml"),
            "{missing}"
        );
    }

    #[test]
    fn globs_and_durations() {
        assert!(glob("*", ""));
        assert!(glob("team-*", "team-a"));
        assert!(glob("a?c*", "abcdef"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("*-7b*", "llama-7b-chat"));
        assert_eq!(parse_duration("250ms"), Some(0.25));
        assert_eq!(parse_duration("1m"), Some(60.0));
        assert_eq!(parse_duration("1.5s"), Some(1.5));
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn rolling_window_forgets_old_slots() {
        let mut r = Rolling::default();
        r.add(1.0, true);
        r.add(2.0, false);
        assert_eq!(r.attainment(3.0), Some(0.5));
        r.add(200.0, true);
        assert_eq!(r.attainment(200.0), Some(2.0 / 3.0));
        assert_eq!(r.attainment(400.0), Some(1.0));
        assert_eq!(r.attainment(1000.0), None);
    }
}
