//! Helpers shared by the decision tests.
#![allow(dead_code, clippy::panic)]

use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_router::decision::Trace;

/// Compiles one bundle; panics with the rendered diagnostics if it does not compile.
pub fn compile(text: &str) -> Arc<CompiledPolicy> {
    let (sources, c) = kinf_lang::compile_str("p.yaml", text);
    let msgs: Vec<String> = c
        .diagnostics
        .iter()
        .map(|d| d.render_plain(&sources))
        .collect();
    c.policy
        .unwrap_or_else(|| panic!("does not compile: {msgs:#?}"))
}

/// A full trace without the per-candidate lists a summary trace leaves empty (`considered`,
/// `dropped`, `survivors`, each tier's `candidates`).
pub fn without_candidate_lists(trace: &Trace) -> Trace {
    let mut t = trace.clone();
    for s in t
        .rules
        .iter_mut()
        .filter_map(|r| r.stages.as_mut())
        .chain(t.default.as_mut())
    {
        s.considered.clear();
        s.dropped.clear();
        s.survivors.clear();
        for tier in &mut s.tiers {
            tier.candidates.clear();
        }
    }
    t
}
