//! The gateway's own Prometheus metrics (`kinference_*`), rendered in the text exposition
//! format. Counters and histograms are keyed by a small label tuple; the maps are behind one
//! mutex each and updated once per request.

use std::fmt::Write as _;

use ahash::AHashMap;
use parking_lot::Mutex;

/// Bucket bounds (seconds) for latency histograms: decision time to end-to-end time.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];

/// A histogram with fixed buckets.
#[derive(Clone, Debug, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; LATENCY_BUCKETS.len()];
        }
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Default)]
struct Family {
    help: &'static str,
    kind: &'static str,
    counters: AHashMap<Labels, f64>,
    histograms: AHashMap<Labels, Histogram>,
}

/// The registry.
#[derive(Debug, Default)]
pub struct Metrics {
    families: Mutex<AHashMap<&'static str, Family>>,
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `v` to counter `name{labels}`.
    pub fn add(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        let mut f = self.families.lock();
        let fam = f.entry(name).or_insert_with(|| Family {
            help,
            kind: "counter",
            ..Family::default()
        });
        *fam.counters.entry(own(labels)).or_insert(0.0) += v;
    }

    /// Sets gauge `name{labels}` to `v`.
    pub fn set(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        let mut f = self.families.lock();
        let fam = f.entry(name).or_insert_with(|| Family {
            help,
            kind: "gauge",
            ..Family::default()
        });
        fam.counters.insert(own(labels), v);
    }

    /// Observes `v` seconds in histogram `name{labels}`.
    pub fn observe(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        v: f64,
    ) {
        let mut f = self.families.lock();
        let fam = f.entry(name).or_insert_with(|| Family {
            help,
            kind: "histogram",
            ..Family::default()
        });
        fam.histograms.entry(own(labels)).or_default().observe(v);
    }

    /// The value of a counter or gauge (tests and status).
    pub fn value(&self, name: &str, labels: &[(&'static str, &str)]) -> Option<f64> {
        let f = self.families.lock();
        f.get(name)?.counters.get(&own(labels)).copied()
    }

    /// Renders every family in the text exposition format, sorted by name and labels.
    pub fn render(&self, out: &mut String) {
        let f = self.families.lock();
        let mut names: Vec<&&str> = f.keys().collect();
        names.sort();
        for name in names {
            let Some(fam) = f.get(*name) else { continue };
            let _ = writeln!(out, "# HELP {name} {}", fam.help);
            let _ = writeln!(out, "# TYPE {name} {}", fam.kind);
            let mut rows: Vec<_> = fam.counters.iter().collect();
            rows.sort_by(|a, b| a.0.cmp(b.0));
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{} {}", fmt_labels(labels, None), fmt_value(*v));
            }
            let mut hs: Vec<_> = fam.histograms.iter().collect();
            hs.sort_by(|a, b| a.0.cmp(b.0));
            for (labels, h) in hs {
                for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
                    let c = h.counts.get(i).copied().unwrap_or(0);
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {c}",
                        fmt_labels(labels, Some(&b.to_string()))
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    fmt_labels(labels, Some("+Inf")),
                    h.count
                );
                let _ = writeln!(out, "{name}_sum{} {}", fmt_labels(labels, None), h.sum);
                let _ = writeln!(out, "{name}_count{} {}", fmt_labels(labels, None), h.count);
            }
        }
    }
}

fn own(labels: &[(&'static str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn fmt_labels(labels: &Labels, le: Option<&str>) -> String {
    if labels.is_empty() && le.is_none() {
        return String::new();
    }
    let mut s = String::from("{");
    let mut first = true;
    for (k, v) in labels {
        if !first {
            s.push(',');
        }
        first = false;
        let _ = write!(s, "{k}=\"{}\"", escape(v));
    }
    if let Some(le) = le {
        if !first {
            s.push(',');
        }
        let _ = write!(s, "le=\"{le}\"");
    }
    s.push('}');
    s
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let m = Metrics::new();
        m.add(
            "kinference_requests_total",
            "Requests.",
            &[("code", "200")],
            1.0,
        );
        m.add(
            "kinference_requests_total",
            "Requests.",
            &[("code", "200")],
            2.0,
        );
        m.set("kinference_policy_generation", "Generation.", &[], 3.0);
        m.observe("kinference_decision_seconds", "Decision time.", &[], 0.0007);
        let mut s = String::new();
        m.render(&mut s);
        assert!(
            s.contains("kinference_requests_total{code=\"200\"} 3\n"),
            "{s}"
        );
        assert!(s.contains(
            "# TYPE kinference_policy_generation gauge\nkinference_policy_generation 3\n"
        ));
        assert!(s.contains("kinference_decision_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(s.contains("kinference_decision_seconds_bucket{le=\"0.0005\"} 0\n"));
        assert!(s.contains("kinference_decision_seconds_count 1\n"));
        assert_eq!(
            m.value("kinference_requests_total", &[("code", "200")]),
            Some(3.0)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.add("x_total", "X.", &[("rule", "a\"b")], 1.0);
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains("x_total{rule=\"a\\\"b\"} 1"));
    }
}
