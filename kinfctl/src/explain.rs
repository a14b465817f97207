//! `kinfctl explain`: decide one request and say why, like the seeds' "Reading the policy".

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kinf_router::decision::{StagesTrace, Trace};
use kinf_router::{Decider, Decision, Outcome};

use crate::EXIT_OK;
use crate::cli::Format;
use crate::report;
use crate::scenario::{RequestFile, StateFile, read_request, read_state};

/// The JSON form of a decision (also what `kinfctl test` compares against).
pub fn decision_json(d: &Decision) -> serde_json::Value {
    let mut v = serde_json::json!({
        "outcome": match d.outcome { Outcome::Route(_) => "route", Outcome::Reject(_) => "reject" },
        "policy": d.policy,
        "rule": d.rule,
        "backendType": null, "endpoint": null, "destination": null, "model": null,
        "status": null, "code": null, "message": null,
        "stages": d.trace,
    });
    match &d.outcome {
        Outcome::Route(r) => {
            v["backendType"] = serde_json::json!(r.backend_type.as_str());
            v["endpoint"] = serde_json::json!(r.endpoint);
            v["destination"] = serde_json::json!(r.destination);
            v["model"] = serde_json::json!(r.model);
            v["rewriteModel"] = serde_json::json!(r.rewrite_model);
            v["predictedTtftSeconds"] = serde_json::json!(r.predicted_ttft_s);
            v["cachedTokens"] = serde_json::json!(r.cached_tokens);
        }
        Outcome::Reject(r) => {
            v["status"] = serde_json::json!(r.status);
            v["code"] = serde_json::json!(r.code);
            v["message"] = serde_json::json!(r.message);
        }
    }
    v
}

fn stages_text(out: &mut String, s: &StagesTrace) {
    let _ = writeln!(out, "  consider: {} candidate(s)", s.considered.len());
    for c in &s.considered {
        let load = match (c.queued_prompts, c.running_prompts, c.kv_cache_usage) {
            (Some(q), Some(r), Some(k)) => {
                format!("queued {q:.1}, running {r:.1}, KV {:.0}%, ", k * 100.0)
            }
            _ => String::new(),
        };
        let p = &c.predicted_ttft;
        // `minimize: PredictedTTFT` ranks by the TTFT plus what the choice costs the requests
        // in flight there; say so whenever that changes the number compared.
        let rank = if p.recompute_s > 0.0 || p.decode_s > 0.0 {
            format!(
                "; ranked {:.3}s = TTFT + recompute cost {:.3} + decode cost {:.3}",
                p.rank_s(),
                p.recompute_s,
                p.decode_s
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "    {} ({}, model {}): {load}cached {} tokens, predicted TTFT {:.3}s = wait {:.3} + prefill {:.3} + overhead {:.3}{rank}",
            c.id,
            c.backend_type.as_str(),
            c.model,
            c.cached_prompt_tokens,
            p.total_s,
            p.wait_s,
            p.prefill_s,
            p.overhead_s
        );
    }
    for u in &s.unavailable {
        let _ = writeln!(out, "    not a candidate: {u}");
    }
    for d in &s.dropped {
        let _ = writeln!(
            out,
            "  exclude `{}` dropped {} ({})",
            d.filter, d.candidate, d.reason
        );
    }
    for (i, t) in s.tiers.iter().enumerate() {
        match &t.picked {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "  select tier {} ({}): picked {} of [{}]",
                    i + 1,
                    t.tier,
                    p,
                    t.candidates
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            None => {
                let _ = writeln!(out, "  select tier {} ({}): no candidate", i + 1, t.tier);
            }
        }
    }
    if s.result != "route" {
        let _ = writeln!(out, "  on empty: {}", s.result);
    }
}

/// The human form of a decision.
pub fn decision_text(d: &Decision) -> String {
    let mut out = String::new();
    match &d.outcome {
        Outcome::Route(r) => {
            let rewrite = if r.rewrite_model {
                " (body `model` rewritten)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "route → {} ({}, {}), model `{}`{rewrite}",
                r.endpoint,
                r.destination,
                r.backend_type.as_str(),
                r.model
            );
        }
        Outcome::Reject(r) => {
            let _ = writeln!(
                out,
                "reject → HTTP {} `{}`: {}",
                r.status, r.code, r.message
            );
        }
    }
    match (&d.policy, &d.rule) {
        (Some(p), Some(r)) => {
            let _ = writeln!(out, "decided by rule `{r}` of policy `{p}`");
        }
        _ => match &d.outcome {
            Outcome::Reject(r) if r.code == "model_not_found" || r.code == "unknown_pool" => {
                let _ = writeln!(
                    out,
                    "decided before any rule: the request names nothing the pool serves"
                );
            }
            _ => {
                let _ = writeln!(out, "decided by the default route (no rule decided)");
            }
        },
    }
    trace_text(&mut out, &d.trace);
    out
}

fn trace_text(out: &mut String, t: &Trace) {
    let _ = writeln!(out, "\npool {}", t.pool);
    for r in &t.rules {
        if !r.matched {
            let _ = writeln!(
                out,
                "rule `{}` ({}): matches do not hold, next rule",
                r.rule, r.policy
            );
            continue;
        }
        let _ = writeln!(out, "rule `{}` ({}): matches", r.rule, r.policy);
        if let Some(s) = &r.stages {
            stages_text(out, s);
        }
    }
    if let Some(s) = &t.default {
        let _ = writeln!(
            out,
            "default route: requested model, Local by PredictedTTFT, then Provider by PredictedTTFT"
        );
        stages_text(out, s);
    }
}

/// Compiles the policies; errors are reported as [`crate::report`] does for `format`, and the
/// exit code returned.
pub fn load_policy(
    paths: &[PathBuf],
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<std::sync::Arc<kinf_lang::CompiledPolicy>, i32> {
    let json = format == Format::Json;
    let sources = crate::load::read_sources(paths).map_err(|e| report::error(json, out, err, e))?;
    let c = kinf_lang::compile(&sources);
    match c.policy {
        Some(p) => Ok(p),
        None => Err(report::compile_errors(
            json,
            out,
            err,
            &sources,
            &c.diagnostics,
            "the policies do not compile; fix them first (`kinfctl lint`)",
        )),
    }
}

/// Decides one scenario. A request with `prompt` is first classified as the server would: by
/// the built-in classifiers of the GatewayBackend in front of its pool, whose tags join the
/// request's own.
pub fn decide_files(
    policy: &kinf_lang::CompiledPolicy,
    request: &RequestFile,
    state: &StateFile,
) -> Result<Decision, report::Error> {
    let st = state.to_state(policy)?;
    let mut req = request.to_request();
    req.tags.extend(prompt_tags(policy, request));
    req.tags.sort_unstable();
    req.tags.dedup();
    Ok(Decider::decide(policy, &req, &st))
}

/// The tags the built-in classifiers (`Pii`, `Complexity`) of the GatewayBackend serving the
/// request's pool give its `prompt` (none without a prompt or such a GatewayBackend). External
/// classifiers are services, not called offline.
pub fn prompt_tags(policy: &kinf_lang::CompiledPolicy, request: &RequestFile) -> Vec<Arc<str>> {
    let Some(text) = request.prompt.as_deref() else {
        return Vec::new();
    };
    let Some(pool) = policy.find_pool(request.pool.as_deref()) else {
        return Vec::new();
    };
    let message = [kinf_router::classify::Message::new("user", text)];
    // Without any GatewayBackend the gateway runs its default classifiers on every request.
    if policy.gateways.is_empty() {
        return kinf_router::classify::Classifiers::default()
            .classify(&message)
            .tags;
    }
    let Some(g) = policy.gateways.iter().find(|g| {
        policy
            .pools
            .get(g.pool)
            .is_some_and(|p| p.namespace == pool.namespace && p.name == pool.name)
    }) else {
        return Vec::new();
    };
    kinf_router::classify::Classifiers::from_specs(&g.spec.classifiers)
        .classify(&message)
        .tags
}

/// Warnings about the request's own `tags` that no classifier in front of its pool produces
/// ([`kinf_lang::CompiledPolicy::producible_tags`]): the gateway never sets them, so the
/// scenario describes a request that cannot happen (often a misspelt tag, which matches
/// nothing). One message per such tag, with the closest tag produced or the list of them.
pub fn tag_warnings(policy: &kinf_lang::CompiledPolicy, request: &RequestFile) -> Vec<String> {
    let Some(pool) = policy.find_pool(request.pool.as_deref()) else {
        return Vec::new();
    };
    let produced = policy.producible_tags(pool);
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for tag in &request.tags {
        if produced.iter().any(|p| **p == **tag) || seen.contains(&tag.as_str()) {
            continue;
        }
        seen.push(tag);
        let help =
            kinf_lang::suggest::help_for(tag, produced.iter().map(|t| &**t), "tags produced");
        let by = if policy.gateways.is_empty() {
            "none of the default classifiers (the bundle has no GatewayBackend)".to_string()
        } else {
            format!(
                "no classifier in front of pool `{}/{}`",
                pool.namespace, pool.name
            )
        };
        out.push(format!(
            "request tag `{tag}` is produced by {by}: the gateway never sets it, so no real \
             request carries it; {help}"
        ));
    }
    out
}

/// `kinfctl explain`.
pub fn run(
    paths: &[PathBuf],
    request: &Path,
    state: Option<&Path>,
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let json = format == Format::Json;
    let policy = match load_policy(paths, format, out, err) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let req = read_request(request);
    let st = state.map(read_state).transpose();
    let (req, st) = match (req, st) {
        (Ok(r), Ok(s)) => (r, s.unwrap_or_default()),
        (r, s) => {
            // Every error of both files.
            let errors: Vec<report::Error> = r.err().into_iter().chain(s.err()).flatten().collect();
            return report::errors(json, out, err, &errors);
        }
    };
    let d = match decide_files(&policy, &req, &st) {
        Ok(d) => d,
        Err(e) => return report::error(json, out, err, e),
    };
    let classified = prompt_tags(&policy, &req);
    let warnings = tag_warnings(&policy, &req);
    match format {
        Format::Json => {
            let mut v = decision_json(&d);
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "promptTags".into(),
                    serde_json::json!(classified.iter().map(|t| &**t).collect::<Vec<_>>()),
                );
                o.insert("warnings".into(), serde_json::json!(warnings));
            }
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
        }
        Format::Human => {
            for w in &warnings {
                let _ = writeln!(err, "warning: {w}");
            }
            if req.prompt.is_some() {
                let tags: Vec<&str> = classified.iter().map(|t| &**t).collect();
                let _ = writeln!(
                    out,
                    "prompt classified (built-in classifiers of the pool's GatewayBackend, or the \
                     default ones without any): {}",
                    if tags.is_empty() {
                        "no tags".to_string()
                    } else {
                        tags.join(", ")
                    }
                );
            }
            let _ = write!(out, "{}", decision_text(&d));
        }
    }
    EXIT_OK
}
