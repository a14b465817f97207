//! Status of every object, computed by a pure function: objects + the bundle's diagnostics +
//! live counts → the server-side-apply body of each object's `/status`.
//!
//! Conditions (reasons are listed in `docs/reference/kubernetes.md`):
//! - `Accepted`: the object's current generation is part of the policy in force. False with
//!   reason `Invalid` when it has errors (each written as `kinfctl lint` writes it, with the
//!   field path instead of a file position, and the help), `NamespaceRefused` when only other
//!   objects of its namespace have errors (that namespace keeps the objects it has in force;
//!   every other namespace's are applied), `BundleRefused` when the whole bundle is refused
//!   (an error that belongs to no single object, or one that namespace isolation cannot
//!   contain; the last good policy stays in force).
//! - `ResolvedRefs`: names and Secrets it refers to exist (`RefNotFound`, `SecretNotFound`,
//!   `SecretUnreadable`; true with `SecretStale` when a Secret read before cannot be read
//!   again and its value read before stays in use).
//! - `Ready`: it serves traffic (worker sets: ready endpoints; providers: healthy; pools: a
//!   ready destination; policies and front doors: in force). An object whose current
//!   generation is refused but an earlier one is in the policy in force still serves: `Ready`
//!   stays true and its message names the generation not applied.

use std::collections::{BTreeMap, BTreeSet};

use kinf_lang::path::{FieldPath, Seg};
use kinf_lang::yaml::{Node, Value as YValue};
use kinf_lang::{CompiledPolicy, Diagnostic, Severity, Sources, Span};
use kinf_policy::{API_VERSION, ResourceKind};
use serde_json::{Value, json};

use super::store::{ObjectKey, StoredObject};

/// Largest condition message written (the API server's limit is 32768 bytes).
pub const MAX_MESSAGE: usize = 8192;

/// Live state of one worker set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerSetLive {
    /// Pods matching the selector (`None` for static endpoints).
    pub selected_pods: Option<u32>,
    /// Endpoints tracked (ready pods with an IP, or static endpoints).
    pub endpoints: u32,
    /// Endpoints passing health checks.
    pub ready_endpoints: u32,
    /// KV-event streams expected (one per endpoint with `kvEvents`).
    pub kv_streams: u32,
    /// KV-event streams connected.
    pub kv_connected: u32,
}

/// Live counts from the replica that writes status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// By worker set `namespace/name`.
    pub worker_sets: BTreeMap<String, WorkerSetLive>,
    /// Provider `namespace/name` → healthy.
    pub providers: BTreeMap<String, bool>,
    /// Provider `namespace/name` → why its credentials were not resolved (e.g. `env`/`file`
    /// refused in Kubernetes mode).
    pub provider_credential_errors: BTreeMap<String, String>,
    /// Front door `namespace/name` → why its tenant identity could not be built (the API-key
    /// Secret's content is refused, `apiKeys.file` in Kubernetes mode, …): every request to it
    /// gets 503 `tenant_identity_unavailable`. Never holds a key.
    pub front_door_errors: BTreeMap<String, String>,
}

/// What is known of a referenced Secret: `None` not found, `Some(keys)` found with these keys.
/// Secrets not in the map were not read yet.
pub type SecretKeys = BTreeMap<(String, String), Option<BTreeSet<String>>>;

/// Everything the status of the objects depends on.
#[derive(Clone, Copy, Debug)]
pub struct StatusInput<'a> {
    /// The objects of the bundle.
    pub objects: &'a [StoredObject],
    /// The bundle's sources (one per object, named `Kind/namespace/name`).
    pub sources: &'a Sources,
    /// Every diagnostic of its compilation.
    pub diagnostics: &'a [Diagnostic],
    /// Whether this bundle is the policy in force (applied, or unchanged; partly applied:
    /// outside [`StatusInput::refused_namespaces`]).
    pub in_force: bool,
    /// The namespaces refused while every other namespace's objects were applied; `None`
    /// when the bundle was applied or refused as a whole.
    pub refused_namespaces: Option<&'a BTreeSet<String>>,
    /// Generation of the policy in force, if any.
    pub generation: Option<u64>,
    /// The policy in force, if any.
    pub policy: Option<&'a CompiledPolicy>,
    /// The sources the policy in force was compiled from (named `Kind/namespace/name`), if
    /// any: tells which objects, and which of their versions, serve.
    pub in_force_sources: Option<&'a Sources>,
    /// Live counts.
    pub live: &'a LiveCounts,
    /// Referenced Secrets.
    pub secrets: &'a SecretKeys,
    /// Why the latest read of a referenced Secret failed (timeout, server error), until a read
    /// succeeds: `SecretUnreadable` for a Secret never read, `SecretStale` (the value read
    /// before stays in use) for one read before.
    pub secret_errors: &'a BTreeMap<(String, String), String>,
    /// The time written as `lastTransitionTime` of conditions that change (RFC 3339).
    pub now: &'a str,
}

impl StatusInput<'_> {
    /// Why the latest read of Secret `namespace/name` failed, if it did.
    fn secrets_error(&self, namespace: &str, name: &str) -> Option<&str> {
        self.secret_errors
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(String::as_str)
    }
}

/// The server-side-apply body of one object's `/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPatch {
    /// The object.
    pub key: ObjectKey,
    /// `{"apiVersion", "kind", "metadata": {"name", "namespace"}, "status": {...}}`.
    pub body: Value,
}

impl StatusPatch {
    /// The `status` part.
    pub fn status(&self) -> &Value {
        &self.body["status"]
    }
}

/// One diagnostic as a status line: `error[KINF0301] spec.rules[0].route: message (help: …)`.
pub fn diagnostic_line(d: &Diagnostic, path: Option<&FieldPath>) -> String {
    let mut s = format!("{}[{}]", d.severity.as_str(), d.code);
    if let Some(p) = path.filter(|p| !p.0.is_empty()) {
        s.push_str(&format!(" {p}"));
    }
    s.push_str(&format!(": {}", d.message));
    if let Some(h) = &d.help {
        s.push_str(&format!(" (help: {h})"));
    }
    s
}

/// The object a diagnostic belongs to: its `resource`, else the source file of its span.
pub fn diagnostic_object(d: &Diagnostic, sources: &Sources) -> Option<ObjectKey> {
    d.resource
        .as_deref()
        .and_then(ObjectKey::parse_label)
        .or_else(|| {
            let (span, _) = d.primary.as_ref()?;
            ObjectKey::parse_label(&sources.get(span.file)?.name)
        })
}

/// The field path of a diagnostic: its own, else the deepest node of its source holding the
/// start of its span.
pub fn diagnostic_path(d: &Diagnostic, sources: &Sources) -> Option<FieldPath> {
    if let Some(p) = &d.field_path {
        return Some(p.clone());
    }
    let (span, _) = d.primary.as_ref()?;
    path_at(sources, *span)
}

/// The path of the deepest node whose key or value holds `span.start`.
pub fn path_at(sources: &Sources, span: Span) -> Option<FieldPath> {
    let file = sources.get(span.file)?;
    let mut diags = Vec::new();
    let docs = kinf_lang::yaml::parse_documents(span.file, file, &mut diags);
    let doc = docs
        .iter()
        .find(|d| d.root.span.start <= span.start && span.start <= d.root.span.end)?;
    let mut path = FieldPath::root();
    let mut node: &Node = &doc.root;
    loop {
        let next = match &node.value {
            YValue::Map(entries) => entries.iter().find_map(|e| {
                let inside = |s: Span| s.start <= span.start && span.start < s.end.max(s.start + 1);
                (inside(e.key_span) || inside(e.value.span))
                    .then(|| (Seg::Key(e.key.clone().into()), &e.value))
            }),
            YValue::Seq(items) => items.iter().enumerate().find_map(|(i, n)| {
                (n.span.start <= span.start && span.start < n.span.end.max(n.span.start + 1))
                    .then_some((Seg::Index(i), n))
            }),
            _ => None,
        };
        match next {
            Some((seg, n)) => {
                path.0.push(seg);
                node = n;
            }
            None => return Some(path),
        }
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn condition(
    previous: &Value,
    generation: Option<i64>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: &str,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == type_ && c["status"] == status)
        })
        .and_then(|c| c.get("lastTransitionTime"))
        .and_then(Value::as_str)
        .unwrap_or(now);
    let mut c = json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": truncate(message),
        "lastTransitionTime": since,
    });
    if let Some(g) = generation {
        c["observedGeneration"] = json!(g);
    }
    c
}

struct Findings {
    errors: Vec<String>,
    warnings: Vec<String>,
    unresolved: Vec<String>,
}

fn is_reference(d: &Diagnostic) -> bool {
    matches!(d.code.as_str(), "KINF0301" | "KINF0302" | "KINF0303")
}

/// Computes the status of every object.
pub fn compute(input: &StatusInput<'_>) -> Vec<StatusPatch> {
    let mut by_object: BTreeMap<ObjectKey, Findings> = BTreeMap::new();
    let mut unowned: Vec<String> = Vec::new();
    for d in input.diagnostics {
        let path = diagnostic_path(d, input.sources);
        let mut line = diagnostic_line(d, path.as_ref());
        for (span, label) in &d.related {
            let Some(f) = input.sources.get(span.file) else {
                continue;
            };
            let at = path_at(input.sources, *span)
                .map(|p| format!(" {p}"))
                .unwrap_or_default();
            line.push_str(&format!(" (note: {label}: {}{at})", f.name));
        }
        match diagnostic_object(d, input.sources) {
            Some(k) => {
                let f = by_object.entry(k).or_insert_with(|| Findings {
                    errors: Vec::new(),
                    warnings: Vec::new(),
                    unresolved: Vec::new(),
                });
                if d.severity == Severity::Error {
                    if is_reference(d) {
                        f.unresolved.push(line.clone());
                    }
                    f.errors.push(line);
                } else {
                    f.warnings.push(line);
                }
            }
            None if d.severity == Severity::Error => unowned.push(line),
            None => {}
        }
    }
    let error_objects: Vec<(&ObjectKey, &Findings)> = by_object
        .iter()
        .filter(|(_, f)| !f.errors.is_empty())
        .collect();
    let total_errors: usize = error_objects
        .iter()
        .map(|(_, f)| f.errors.len())
        .sum::<usize>()
        + unowned.len();
    // The first three objects with errors (with their first error), and the errors that
    // belong to no object.
    let summary = |objects: &[&(&ObjectKey, &Findings)], unowned: &[String]| {
        let mut parts: Vec<String> = objects
            .iter()
            .take(3)
            .map(|(k, f)| format!("{} ({})", k.label(), f.errors[0]))
            .collect();
        if objects.len() > 3 {
            parts.push(format!("and {} more", objects.len() - 3));
        }
        parts.extend(unowned.iter().cloned());
        parts.join("; ")
    };
    let refused_summary = summary(&error_objects.iter().collect::<Vec<_>>(), &unowned);
    // Messages name no gateway policy generation: each replica counts its own, and every change
    // of the selected pods makes a new one, so naming it would rewrite every object's status
    // on each pod change and each change of leader (`/readyz` and `/admin/status` show it).
    let kept = match input.generation {
        Some(_) => "the last good policy stays in force".to_owned(),
        None => "no policy is in force yet".to_owned(),
    };
    let bundle_ok = input.in_force && total_errors == 0;
    // Partly applied: the refused namespaces keep their objects in force.
    let refused_ns = |ns: &str| input.refused_namespaces.is_some_and(|r| r.contains(ns));
    let kept_ns = |ns: &str| {
        format!(
            "namespace `{ns}` keeps the objects it has in force and every other namespace's \
             are applied"
        )
    };

    let mut out = Vec::new();
    for o in input.objects {
        let findings = by_object.get(&o.key);
        let own_errors = findings.map_or(&[][..], |f| f.errors.as_slice());
        let warnings = findings.map_or(&[][..], |f| f.warnings.as_slice());
        let gen_ = o.generation;
        let prev = &o.status;
        let partly = input.refused_namespaces.is_some();
        let (accepted, reason, message) = if !own_errors.is_empty() {
            let kept = if partly {
                kept_ns(&o.key.namespace)
            } else {
                kept.clone()
            };
            let mut m = format!(
                "{} error{} (not applied; {kept}):\n{}",
                own_errors.len(),
                if own_errors.len() == 1 { "" } else { "s" },
                own_errors.join("\n")
            );
            if !warnings.is_empty() {
                m.push_str(&format!("\nwarnings:\n{}", warnings.join("\n")));
            }
            (false, "Invalid", m)
        } else if partly && refused_ns(&o.key.namespace) {
            let here: Vec<&(&ObjectKey, &Findings)> = error_objects
                .iter()
                .filter(|(k, _)| k.namespace == o.key.namespace)
                .collect();
            let n: usize = here.iter().map(|(_, f)| f.errors.len()).sum();
            let why = if n == 0 {
                // Refused in a later round: its objects did not compile beside those that
                // other namespaces keep in force.
                "not applied: its namespace's objects do not compile beside the objects other \
                 namespaces keep in force"
                    .to_owned()
            } else {
                format!(
                    "not applied: its namespace has {n} error{} in other resources: {}",
                    if n == 1 { "" } else { "s" },
                    summary(&here, &[])
                )
            };
            (
                false,
                "NamespaceRefused",
                format!("{why}; {}", kept_ns(&o.key.namespace)),
            )
        } else if !bundle_ok && !partly {
            (
                false,
                "BundleRefused",
                format!(
                    "not applied: the bundle has {total_errors} error{} in other resources: \
                     {refused_summary}; {kept}",
                    if total_errors == 1 { "" } else { "s" }
                ),
            )
        } else if !warnings.is_empty() {
            (
                true,
                "AcceptedWithWarnings",
                format!(
                    "in force with {} warning{}:\n{}",
                    warnings.len(),
                    if warnings.len() == 1 { "" } else { "s" },
                    warnings.join("\n")
                ),
            )
        } else {
            (true, "Accepted", "in force".to_owned())
        };

        // References: names (compiler) and Secrets (controller).
        let mut unresolved: Vec<String> = findings.map_or(Vec::new(), |f| f.unresolved.clone());
        let mut secret_problem = None;
        let mut secret_stale = None;
        if let Some((name, key, path)) = secret_ref(o) {
            let state = input
                .secrets
                .get(&(o.key.namespace.clone(), name.to_owned()));
            // `(ResolvedRefs reason, message)`.
            let problem = match (state, key) {
                (None, _) => input
                    .secrets_error(&o.key.namespace, name)
                    .map(|e| {
                        let m = format!(
                            "{path}: Secret `{}/{name}` cannot be read: {e} (help: the controller retries every 30 s)",
                            o.key.namespace
                        );
                        ("SecretUnreadable", m)
                    }),
                (Some(None), _) => Some((
                    "SecretNotFound",
                    match input.secrets_error(&o.key.namespace, name) {
                        // Not found when last read; the reads since have failed, so it may
                        // exist by now: say so, rather than a stale "not found" alone.
                        Some(e) => format!(
                            "{path}: Secret `{}/{name}` not found when last read; it cannot be read again: {e} (help: create it in that namespace; the controller retries every 30 s)",
                            o.key.namespace
                        ),
                        None => format!(
                            "{path}: Secret `{}/{name}` not found (help: create it in that namespace)",
                            o.key.namespace
                        ),
                    },
                )),
                (Some(Some(keys)), Some(k)) if !keys.contains(k) => Some((
                    "SecretNotFound",
                    format!(
                        "{path}: Secret `{}/{name}` has no key `{k}` (help: it has: {})",
                        o.key.namespace,
                        keys.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )),
                _ => None,
            };
            // Read before, and fine then, but the latest read failed: the value read before
            // stays in use (a transient failure drops no key), and the owner is told.
            if problem.is_none()
                && let Some(Some(_)) = state
                && let Some(e) = input.secrets_error(&o.key.namespace, name)
            {
                secret_stale = Some(format!(
                    "{path}: Secret `{}/{name}` cannot be read again: {e}; the value read before \
                     stays in use (help: the controller retries every 30 s)",
                    o.key.namespace
                ));
            }
            secret_problem = problem;
        }
        let (refs_ok, refs_reason, refs_message) = if !unresolved.is_empty() {
            if let Some((_, p)) = &secret_problem {
                unresolved.push(p.clone());
            }
            if let Some(p) = &secret_stale {
                unresolved.push(p.clone());
            }
            (false, "RefNotFound", unresolved.join("\n"))
        } else if let Some((reason, p)) = &secret_problem {
            (false, *reason, p.clone())
        } else if let Some(p) = &secret_stale {
            (true, "SecretStale", p.clone())
        } else {
            (true, "ResolvedRefs", "every reference resolves".to_owned())
        };

        let mut status = json!({});
        if let Some(g) = gen_ {
            status["observedGeneration"] = json!(g);
        }
        let serving = if accepted {
            Serving::Current
        } else {
            serving(o, input.in_force_sources)
        };
        let (mut ready, mut ready_reason, mut ready_message) =
            ready_condition(o, serving, secret_problem.is_some(), input, &mut status);
        // A front door without hosts behind an earlier one without hosts gets no request.
        let no_hosts = o
            .spec
            .get("hosts")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if ready
            && o.key.kind == ResourceKind::GatewayBackend
            && no_hosts
            && let Some(w) = warnings.iter().find(|w| w.starts_with("warning[KINF0508]"))
        {
            ready = false;
            ready_reason = "Shadowed";
            ready_message = w.clone();
        }
        if ready {
            match (serving, gen_) {
                (Serving::Current, _) if !accepted && refused_ns(&o.key.namespace) => ready_message
                    .push_str(
                        "; this generation is in force (its namespace's newer objects were \
                         refused, see Accepted)",
                    ),
                (Serving::Current, _) if !accepted => ready_message.push_str(
                    "; this generation is in force (a newer bundle was refused, see Accepted)",
                ),
                (Serving::Earlier, Some(g)) => ready_message.push_str(&format!(
                    "; generation {g} not applied (see Accepted): an earlier generation is in \
                     force"
                )),
                (Serving::Earlier, None) => ready_message.push_str(
                    "; this version is not applied (see Accepted): an earlier one is in force",
                ),
                _ => {}
            }
        }
        status["conditions"] = json!([
            condition(prev, gen_, "Accepted", accepted, reason, message, input.now),
            condition(
                prev,
                gen_,
                "ResolvedRefs",
                refs_ok,
                refs_reason,
                refs_message,
                input.now
            ),
            condition(
                prev,
                gen_,
                "Ready",
                ready,
                ready_reason,
                ready_message,
                input.now
            ),
        ]);
        out.push(StatusPatch {
            key: o.key.clone(),
            body: json!({
                "apiVersion": API_VERSION,
                "kind": o.key.kind.as_str(),
                "metadata": {"name": o.key.name, "namespace": o.key.namespace},
                "status": status,
            }),
        });
    }
    out
}

/// The Secret an object refers to: `(name, key, field path)`.
fn secret_ref(o: &StoredObject) -> Option<(&str, Option<&str>, &'static str)> {
    match o.key.kind {
        ResourceKind::InferenceProvider => {
            let r = o.spec.pointer("/credentials/secretRef")?;
            Some((
                r.get("name")?.as_str()?,
                Some(r.get("key").and_then(Value::as_str).unwrap_or("apiKey")),
                "spec.credentials.secretRef",
            ))
        }
        ResourceKind::GatewayBackend => {
            let r = o.spec.pointer("/tenants/apiKeys/secretRef")?;
            Some((
                r.get("name")?.as_str()?,
                None,
                "spec.tenants.apiKeys.secretRef",
            ))
        }
        _ => None,
    }
}

fn names(v: &Value, field: &str) -> Vec<String> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|m| m.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Which version of an object serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serving {
    /// This version is in the policy in force.
    Current,
    /// An earlier version is (this one was not applied).
    Earlier,
    /// The object is not in the policy in force.
    No,
}

/// Which version of `o` the policy in force was compiled from.
fn serving(o: &StoredObject, in_force: Option<&Sources>) -> Serving {
    let label = o.key.label();
    let Some(f) = in_force.and_then(|s| s.iter().map(|(_, f)| f).find(|f| f.name == label)) else {
        return Serving::No;
    };
    if f.text == o.source {
        Serving::Current
    } else {
        Serving::Earlier
    }
}

fn ready_condition(
    o: &StoredObject,
    serving: Serving,
    secret_missing: bool,
    input: &StatusInput<'_>,
    status: &mut Value,
) -> (bool, &'static str, String) {
    let key = format!("{}/{}", o.key.namespace, o.key.name);
    let ws_ready = |k: &str| {
        input
            .live
            .worker_sets
            .get(k)
            .is_some_and(|w| w.ready_endpoints > 0)
    };
    match o.key.kind {
        ResourceKind::InferenceWorkerSet => {
            let models = names(&o.spec, "models");
            if !models.is_empty() {
                status["models"] = json!(models.join(","));
            }
            let live = input
                .live
                .worker_sets
                .get(&key)
                .cloned()
                .unwrap_or_default();
            status["readyEndpoints"] = json!(live.ready_endpoints);
            status["kvEventStreams"] = json!(live.kv_connected);
            let pods = live
                .selected_pods
                .map(|n| {
                    format!(
                        "{} of {n} selected pods ready and addressable; ",
                        live.endpoints
                    )
                })
                .unwrap_or_default();
            let kv = if o.spec.get("kvEvents").is_some_and(|k| !k.is_null()) {
                format!(
                    "; {} of {} KV-event streams connected",
                    live.kv_connected, live.kv_streams
                )
            } else {
                "; no kvEvents: approximate prefix tracking".to_owned()
            };
            let msg = format!(
                "{pods}{} of {} endpoints pass health checks{kv}",
                live.ready_endpoints, live.endpoints
            );
            if live.ready_endpoints > 0 {
                (true, "EndpointsReady", msg)
            } else {
                let help = if live.selected_pods == Some(0) {
                    " (help: no pod in the namespace matches `spec.selector`)"
                } else {
                    ""
                };
                (false, "NoReadyEndpoints", format!("{msg}{help}"))
            }
        }
        ResourceKind::InferenceProvider => {
            if secret_missing {
                (
                    false,
                    "CredentialsUnavailable",
                    "the credentials Secret cannot be read (see ResolvedRefs)".to_owned(),
                )
            } else if let Some(e) = input.live.provider_credential_errors.get(&key) {
                (false, "CredentialsUnavailable", e.clone())
            } else if serving == Serving::No {
                (
                    false,
                    "NotAccepted",
                    "not in force (see Accepted)".to_owned(),
                )
            } else if input.live.providers.get(&key).copied().unwrap_or(false) {
                (true, "Ready", "healthy".to_owned())
            } else {
                (
                    false,
                    "ProviderUnavailable",
                    if input.live.providers.contains_key(&key) {
                        "failing health probes or circuit breaker open".to_owned()
                    } else {
                        "no health information yet (the pool counts it as not ready)".to_owned()
                    },
                )
            }
        }
        ResourceKind::InferencePool => {
            let dests: Vec<(String, String)> = o
                .spec
                .get("destinations")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| {
                            Some((
                                d.get("kind")?.as_str()?.to_owned(),
                                d.get("name")?.as_str()?.to_owned(),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            status["destinations"] = json!(dests.len());
            if let Some(p) = input
                .policy
                .and_then(|p| p.pool(&o.key.namespace, &o.key.name))
            {
                status["models"] = json!(p.model_names().join(","));
            }
            let ready: Vec<&str> = dests
                .iter()
                .filter(|(kind, name)| {
                    let k = format!("{}/{name}", o.key.namespace);
                    if kind == "InferenceProvider" {
                        input.live.providers.get(&k).copied().unwrap_or(false)
                    } else {
                        ws_ready(&k)
                    }
                })
                .map(|(_, n)| n.as_str())
                .collect();
            if ready.is_empty() {
                (
                    false,
                    "NoReadyDestinations",
                    format!("none of {} destinations is ready", dests.len()),
                )
            } else {
                (
                    true,
                    "Ready",
                    format!(
                        "{} of {} destinations ready: {}",
                        ready.len(),
                        dests.len(),
                        ready.join(", ")
                    ),
                )
            }
        }
        ResourceKind::InferencePolicy => {
            let rules = o
                .spec
                .get("rules")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            status["rules"] = json!(rules);
            let mut pools: Vec<String> = match o.spec.get("targetRefs").and_then(Value::as_array) {
                Some(t) if !t.is_empty() => t
                    .iter()
                    .filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_owned))
                    .collect(),
                _ => input
                    .objects
                    .iter()
                    .filter(|p| {
                        p.key.kind == ResourceKind::InferencePool
                            && p.key.namespace == o.key.namespace
                    })
                    .map(|p| p.key.name.clone())
                    .collect(),
            };
            pools.sort();
            status["pools"] = json!(pools.join(","));
            if serving != Serving::No {
                (
                    true,
                    "InForce",
                    format!("{rules} rules in force for pools: {}", pools.join(", ")),
                )
            } else {
                (
                    false,
                    "NotAccepted",
                    "not in force (see Accepted)".to_owned(),
                )
            }
        }
        ResourceKind::GatewayBackend => {
            if secret_missing {
                (
                    false,
                    "TenantKeysUnavailable",
                    "the API-key Secret cannot be read: every request gets 503 \
                     `tenant_identity_unavailable` (see ResolvedRefs)"
                        .to_owned(),
                )
            } else if let Some(e) = input.live.front_door_errors.get(&key) {
                (
                    false,
                    "TenantIdentityUnavailable",
                    format!(
                        "{e}: every request gets 503 `tenant_identity_unavailable` (help: fix \
                         the API-key Secret or `spec.tenants`)"
                    ),
                )
            } else if serving != Serving::No {
                (true, "InForce", "serving".to_owned())
            } else {
                (
                    false,
                    "NotAccepted",
                    "not in force (see Accepted)".to_owned(),
                )
            }
        }
    }
}

/// Whether an object's stored status already equals the patch (ignoring fields the patch does
/// not set), so that nothing needs to be written.
pub fn up_to_date(current: &Value, patch: &StatusPatch) -> bool {
    covers(current, patch.status())
}

/// Whether `current` holds every field of `wanted` with the same value.
pub fn covers(current: &Value, wanted: &Value) -> bool {
    subset(wanted, current)
}

fn subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| subset(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| subset(a, b))
        }
        (w, h) => w == h,
    }
}
