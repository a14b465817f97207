//! The rule DAG of a pool: match → consider → exclude → select stages of every rule, the
//! edges between them, and the default route. Built with petgraph, checked (acyclic,
//! reachability), and rendered as text or Graphviz.

use std::fmt::Write as _;

use kinf_policy::OnEmpty;
use petgraph::algo::{has_path_connecting, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::compiled::{CompiledPolicy, CompiledPool, ConsiderEntry, SelectTier};

/// A stage of the DAG.
#[derive(Clone, Debug, PartialEq)]
pub enum Stage {
    /// Where evaluation starts.
    Entry,
    /// Rule `i`'s `matches`.
    Match(usize),
    /// Rule `i`'s `consider`.
    Consider(usize),
    /// Rule `i`'s exclude filter `k`.
    Exclude(usize, usize),
    /// Rule `i`'s select tier `t`.
    Select(usize, usize),
    /// Rule `i`'s `onEmpty`.
    OnEmpty(usize),
    /// The default route when no rule decides.
    Default,
    /// A candidate was picked.
    Route,
    /// The request is rejected.
    Reject,
}

/// Why an edge is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// Unconditional flow to the next stage.
    Next,
    /// The rule's matches hold.
    Matched,
    /// The rule's matches do not hold.
    NoMatch,
    /// A tier picked a candidate.
    Picked,
    /// A tier had no candidate.
    Empty,
}

/// The DAG of one pool.
#[derive(Debug)]
pub struct RuleDag {
    /// The graph.
    pub graph: DiGraph<Stage, Edge>,
    /// The entry node.
    pub entry: NodeIndex,
    /// Match node of each rule.
    pub matches: Vec<NodeIndex>,
}

impl RuleDag {
    /// Builds the DAG of a pool.
    pub fn build(pool: &CompiledPool) -> RuleDag {
        let mut g = DiGraph::new();
        let entry = g.add_node(Stage::Entry);
        let route = g.add_node(Stage::Route);
        let reject = g.add_node(Stage::Reject);
        let default = g.add_node(Stage::Default);
        g.add_edge(default, route, Edge::Picked);
        g.add_edge(default, reject, Edge::Empty);
        let matches: Vec<NodeIndex> = (0..pool.rules.len())
            .map(|i| g.add_node(Stage::Match(i)))
            .collect();
        g.add_edge(
            entry,
            matches.first().copied().unwrap_or(default),
            Edge::Next,
        );
        for (i, rule) in pool.rules.iter().enumerate() {
            let next_rule = matches.get(i + 1).copied().unwrap_or(default);
            let m = matches[i];
            let catch_all =
                rule.matches.is_empty() || rule.matches.iter().any(|c| c.is_unconditional());
            if !catch_all {
                g.add_edge(m, next_rule, Edge::NoMatch);
            }
            let consider = g.add_node(Stage::Consider(i));
            g.add_edge(m, consider, Edge::Matched);
            let mut prev = consider;
            for k in 0..rule.exclude.len() {
                let x = g.add_node(Stage::Exclude(i, k));
                g.add_edge(prev, x, Edge::Next);
                prev = x;
            }
            for t in 0..rule.select.len() {
                let s = g.add_node(Stage::Select(i, t));
                g.add_edge(prev, s, if t == 0 { Edge::Next } else { Edge::Empty });
                g.add_edge(s, route, Edge::Picked);
                prev = s;
            }
            let on_empty = g.add_node(Stage::OnEmpty(i));
            g.add_edge(
                prev,
                on_empty,
                if rule.select.is_empty() {
                    Edge::Next
                } else {
                    Edge::Empty
                },
            );
            match rule.on_empty {
                OnEmpty::Reject => g.add_edge(on_empty, reject, Edge::Next),
                OnEmpty::NextRule => g.add_edge(on_empty, next_rule, Edge::Next),
            };
        }
        RuleDag {
            graph: g,
            entry,
            matches,
        }
    }

    /// Whether the graph is acyclic (always true for graphs built by [`RuleDag::build`]).
    pub fn is_acyclic(&self) -> bool {
        toposort(&self.graph, None).is_ok()
    }

    /// Whether rule `i` can be reached from the entry.
    pub fn rule_reachable(&self, i: usize) -> bool {
        self.matches
            .get(i)
            .is_some_and(|&m| has_path_connecting(&self.graph, self.entry, m, None))
    }

    /// For every rule, whether it can be reached from the entry (one traversal).
    pub fn reachable_rules(&self) -> Vec<bool> {
        let mut seen = vec![false; self.graph.node_count()];
        let mut dfs = petgraph::visit::Dfs::new(&self.graph, self.entry);
        while let Some(n) = dfs.next(&self.graph) {
            if let Some(s) = seen.get_mut(n.index()) {
                *s = true;
            }
        }
        self.matches
            .iter()
            .map(|m| seen.get(m.index()).copied().unwrap_or(false))
            .collect()
    }

    /// Graphviz rendering.
    pub fn to_dot(&self, pool: &CompiledPool, policy: &CompiledPolicy) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "digraph \"{}/{}\" {{", pool.namespace, pool.name);
        let _ = writeln!(
            out,
            "  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];"
        );
        for idx in self.graph.node_indices() {
            let label = dot_escape(&stage_label(&self.graph[idx], pool, policy));
            let shape = match self.graph[idx] {
                Stage::Entry | Stage::Route | Stage::Reject => "ellipse",
                Stage::Match(_) => "diamond",
                _ => "box",
            };
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\", shape={}];",
                idx.index(),
                label,
                shape
            );
        }
        for e in self.graph.edge_references() {
            let label = match e.weight() {
                Edge::Next => "",
                Edge::Matched => "match",
                Edge::NoMatch => "no match",
                Edge::Picked => "picked",
                Edge::Empty => "empty",
            };
            let _ = writeln!(
                out,
                "  n{} -> n{} [label=\"{}\"];",
                e.source().index(),
                e.target().index(),
                label
            );
        }
        out.push_str("}\n");
        out
    }
}

/// A label as the text of a DOT string: backslashes and quotes escaped (a name ending in `\`
/// would otherwise end the string early), line breaks as DOT's `\n`.
fn dot_escape(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    for c in label.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn stage_label(stage: &Stage, pool: &CompiledPool, policy: &CompiledPolicy) -> String {
    let rule = |i: usize| pool.rules.get(i);
    match stage {
        Stage::Entry => "request".into(),
        Stage::Route => "route".into(),
        Stage::Reject => "reject".into(),
        Stage::Default => "default route".into(),
        Stage::Match(i) => rule(*i)
            .map(|r| format!("{}: {}", r.name, match_text(r)))
            .unwrap_or_default(),
        Stage::Consider(i) => rule(*i)
            .map(|r| format!("consider {}", consider_text(&r.consider, policy)))
            .unwrap_or_default(),
        Stage::Exclude(i, k) => rule(*i)
            .and_then(|r| r.exclude.get(*k))
            .map(|f| format!("exclude {}: drop {}", f.name, f.drop.text))
            .unwrap_or_default(),
        Stage::Select(i, t) => rule(*i)
            .and_then(|r| r.select.get(*t))
            .map(|s| format!("select {}", tier_text(s, policy)))
            .unwrap_or_default(),
        Stage::OnEmpty(i) => rule(*i)
            .map(|r| format!("on empty: {:?}", r.on_empty))
            .unwrap_or_default(),
    }
}

fn match_text(r: &crate::compiled::CompiledRule) -> String {
    if r.matches.is_empty() {
        "any request".into()
    } else {
        r.matches
            .iter()
            .map(|m| format!("({})", m.text))
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// Text of a consider list.
pub fn consider_text(c: &[ConsiderEntry], policy: &CompiledPolicy) -> String {
    if c.is_empty() {
        return "destinations serving the requested model".into();
    }
    c.iter()
        .map(|e| {
            let mut parts = Vec::new();
            match &e.models {
                Some(m) => parts.push(format!(
                    "models [{}]",
                    m.iter().map(|s| &**s).collect::<Vec<_>>().join(", ")
                )),
                None => parts.push("requested model".into()),
            }
            if let Some(b) = e.backend {
                parts.push(format!("type {}", b.as_str()));
            }
            if let Some(d) = e.destination.and_then(|d| policy.destination(d)) {
                parts.push(format!("destination {}", d.name));
            }
            parts.join(", ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Text of a select tier.
pub fn tier_text(s: &SelectTier, _policy: &CompiledPolicy) -> String {
    s.text.to_string()
}

/// A readable text rendering of a pool's compiled rules (used by `kinfctl graph` and the golden
/// DAG snapshots).
pub fn render_pool(pool: &CompiledPool, policy: &CompiledPolicy) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pool {}/{}", pool.namespace, pool.name);
    out.push_str("  destinations:\n");
    for id in &pool.destinations {
        if let Some(d) = policy.destination(*id) {
            let extra = match (&d.worker_set, &d.provider) {
                (Some(w), _) => {
                    let eps = if w.endpoints.is_empty() {
                        format!(
                            "selector {}",
                            w.selector
                                .iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(",")
                        )
                    } else {
                        format!("{} endpoint(s)", w.endpoints.len())
                    };
                    let kv = if w.kv_events.is_some() {
                        "kv events"
                    } else {
                        "approximate prefix tracking"
                    };
                    format!("{eps}, {kv}")
                }
                (None, Some(p)) => format!("{:?} {}", p.protocol, p.url),
                _ => String::new(),
            };
            let _ = writeln!(out, "    {} ({}; {})", d.name, d.backend.as_str(), extra);
        }
    }
    out.push_str("  models:\n");
    for name in pool.model_names() {
        let targets = pool.models.get(name).map(|v| {
            v.iter()
                .filter_map(|(d, up)| policy.destination(*d).map(|d| format!("{}:{}", d.name, up)))
                .collect::<Vec<_>>()
                .join(", ")
        });
        let _ = writeln!(out, "    {name} -> {}", targets.unwrap_or_default());
    }
    for (i, r) in pool.rules.iter().enumerate() {
        let _ = writeln!(out, "  rule {} {} (policy {})", i + 1, r.name, r.policy);
        let _ = writeln!(out, "    match    {}", match_text(r));
        let _ = writeln!(out, "    consider {}", consider_text(&r.consider, policy));
        for f in &r.exclude {
            let cond = f
                .condition
                .as_ref()
                .map(|c| format!(" if {}", c.text))
                .unwrap_or_default();
            // The window matters only to the load measures the filter reads.
            let window = if f.drop.reads_load() {
                format!(" (window {}s)", f.window.as_secs_f64())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "    exclude  {}:{} drop {}{window}",
                f.name, cond, f.drop.text
            );
        }
        for (t, s) in r.select.iter().enumerate() {
            let _ = writeln!(out, "    select {} {}", t + 1, tier_text(s, policy));
        }
        let _ = writeln!(out, "    on empty {:?}", r.on_empty);
    }
    out.push_str("  default: requested model; Local minimize PredictedTTFT, then Provider minimize PredictedTTFT; else Reject\n");
    out
}

#[cfg(test)]
mod tests {
    use super::dot_escape;

    #[test]
    fn dot_labels_cannot_end_their_string_early() {
        assert_eq!(dot_escape(r#"a\"#), r#"a\\"#);
        assert_eq!(
            dot_escape(r#"a"b} -> x [label="pwn"#),
            r#"a\"b} -> x [label=\"pwn"#
        );
        assert_eq!(dot_escape("a\nb"), r"a\nb");
    }
}
