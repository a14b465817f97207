//! The live policy: an immutable [`CompiledPolicy`] behind an atomic pointer. A new bundle
//! replaces it only when it compiles without errors; otherwise the last good policy stays in
//! force and the rejection (with its diagnostics) is kept for `/readyz`, the admin status and
//! metrics. Readers never block and never see a half-applied policy.
//!
//! The store is the one record of the last refusal: a bundle refused before it is compiled
//! (directory mode: for an API key file that cannot be loaded) is recorded here too
//! ([`PolicyStore::record_refusal`]), and so is one with a file that could not be read
//! ([`crate::config_dir::read_dir_for_reload`]: not UTF-8, too large, gone while read).
//!
//! Kubernetes mode isolates namespaces ([`crate::bundle::NamespaceIsolation`]): a bundle with
//! errors in some namespaces applies every other namespace's objects, and each refused
//! namespace keeps the objects it has in force.

use std::collections::BTreeSet;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use kinf_lang::{CompiledPolicy, Diagnostic, Severity, Sources};

/// The policy in force and how it got there.
#[derive(Debug)]
pub struct Applied {
    /// The compiled policy.
    pub policy: Arc<CompiledPolicy>,
    /// Its fingerprint: a hash of the sources, and of what was resolved beside them when
    /// anything was ([`crate::bundle::Resolved::fingerprint`]: endpoints, Secret values, API
    /// key files).
    pub fingerprint: u64,
    /// Warnings of its compilation, rendered `file:line:col: warning[CODE]: message`.
    pub warnings: Vec<String>,
    /// How many bundles were applied before, counting this one.
    pub generation: u64,
    /// The sources it was compiled from: when a newer bundle is refused, these are compiled
    /// again with the newer bundle's endpoints and Secret values
    /// ([`PolicyStore::reapply_in_force`]).
    pub sources: Sources,
}

/// The last bundle that was refused.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// Fingerprint of the refused sources.
    pub fingerprint: u64,
    /// Its errors, rendered `file:line:col: error[CODE]: message` with help.
    pub errors: Vec<String>,
    /// The codes of its errors.
    pub codes: Vec<&'static str>,
    /// Kubernetes mode: the namespaces whose objects were refused while every other
    /// namespace's were applied; `None` when the whole bundle was refused.
    pub namespaces: Option<Vec<String>>,
}

/// What [`PolicyStore::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The bundle compiled and is now in force.
    Applied {
        /// The new generation.
        generation: u64,
    },
    /// The bundle is identical to the one in force; nothing changed.
    Unchanged,
    /// The bundle has errors; the previous policy (if any) stays in force.
    Refused {
        /// Number of errors.
        errors: usize,
    },
    /// Kubernetes mode: the bundle has errors in some namespaces only. Every other
    /// namespace's objects are in force; each refused namespace keeps the objects it had in
    /// force (none, if it had none).
    PartlyApplied {
        /// The generation in force.
        generation: u64,
        /// Whether the policy in force changed (a new generation).
        changed: bool,
        /// Number of errors.
        errors: usize,
        /// The refused namespaces, sorted.
        namespaces: Vec<String>,
    },
}

impl ApplyOutcome {
    /// Whether the bundle's objects are in force: all of them, or (partly applied) those
    /// outside the refused namespaces.
    pub fn in_force(&self) -> bool {
        !matches!(self, ApplyOutcome::Refused { .. })
    }

    /// The namespaces whose objects were refused while the others were applied.
    pub fn refused_namespaces(&self) -> Option<&[String]> {
        match self {
            ApplyOutcome::PartlyApplied { namespaces, .. } => Some(namespaces),
            _ => None,
        }
    }
}

/// Holds the policy in force and the last refusal.
#[derive(Debug, Default)]
pub struct PolicyStore {
    current: ArcSwapOption<Applied>,
    rejected: ArcSwapOption<Rejected>,
}

impl PolicyStore {
    /// An empty store (not ready until a bundle is applied).
    pub fn new() -> Self {
        Self::default()
    }

    /// The policy in force, if any. Wait-free.
    pub fn current(&self) -> Option<Arc<Applied>> {
        self.current.load_full()
    }

    /// The last refused bundle, cleared when a bundle is applied (or found unchanged).
    pub fn last_rejected(&self) -> Option<Arc<Rejected>> {
        self.rejected.load_full()
    }

    /// Records the refusal of a bundle that was refused for something the store does not see
    /// (directory mode: an API key file of the bundle that cannot be read or parsed), or
    /// replaces the one recorded with more errors. It replaces any refusal recorded before and
    /// is cleared like one recorded by [`PolicyStore::apply`]; the policy in force stays.
    pub fn record_refusal(&self, rejected: Rejected) {
        self.rejected.store(Some(Arc::new(rejected)));
    }

    /// Whether a policy is in force.
    pub fn is_ready(&self) -> bool {
        self.current.load().is_some()
    }

    /// Compiles `sources` and swaps the result in if it has no errors.
    pub fn apply(&self, sources: &Sources) -> ApplyOutcome {
        self.apply_resolved(sources, &crate::bundle::Resolved::default())
            .0
    }

    /// Like [`PolicyStore::apply`], with what the source resolved beside the resources: the
    /// discovered endpoints of selector-mode worker sets are filled into the compiled policy
    /// (so that the cluster state and live ingestion see them like static endpoints), and a
    /// change of endpoints, Secret values or (directory mode) API key files counts as a change:
    /// a new generation. Also returns every diagnostic of the compilation (for Kubernetes
    /// status).
    ///
    /// With [`crate::bundle::Resolved::isolation`], a bundle whose errors all belong to
    /// objects of some namespaces is applied without them: those namespaces keep the objects
    /// they have in force (see `isolate`). The refusal is recorded all the same, with the
    /// namespaces. The isolation is then told what the outcome put in force
    /// ([`crate::bundle::NamespaceIsolation::settle`]), before the next bundle is applied.
    pub fn apply_resolved(
        &self,
        sources: &Sources,
        resolved: &crate::bundle::Resolved,
    ) -> (ApplyOutcome, Vec<Diagnostic>) {
        let (outcome, diagnostics) = self.compile_and_apply(sources, resolved);
        if let Some(iso) = &resolved.isolation {
            iso.settle(&outcome);
        }
        (outcome, diagnostics)
    }

    fn compile_and_apply(
        &self,
        sources: &Sources,
        resolved: &crate::bundle::Resolved,
    ) -> (ApplyOutcome, Vec<Diagnostic>) {
        // Directory mode: a file that could not be read (not UTF-8, too large, gone) is in the
        // sources as its error. The rest is not compiled: without that file it could compile,
        // and applying it would drop whatever the file holds.
        let unreadable = crate::config_dir::unreadable(sources);
        if !unreadable.is_empty() {
            let errors = unreadable.len();
            self.record_refusal(Rejected {
                fingerprint: crate::bundle::sources_hash(sources),
                errors: unreadable,
                codes: Vec::new(),
                namespaces: None,
            });
            return (ApplyOutcome::Refused { errors }, Vec::new());
        }
        let c = compile_resolved(sources, resolved);
        if c.policy.is_none()
            && let Some((merged, mc, kept)) = isolate(&c, sources, resolved)
        {
            let prev = self.current().map(|a| a.generation);
            let outcome = self.apply_compilation(&merged, &mc, false);
            // The recorded refusal: the bundle's own errors (those of the refused namespaces).
            self.record_compile_refusal(sources, &c, Some(kept.iter().cloned().collect()));
            let generation = match outcome {
                ApplyOutcome::Applied { generation } => generation,
                _ => prev.unwrap_or(0),
            };
            let outcome = ApplyOutcome::PartlyApplied {
                generation,
                changed: matches!(outcome, ApplyOutcome::Applied { .. }),
                errors: error_count(&c),
                namespaces: kept.into_iter().collect(),
            };
            return (outcome, c.diagnostics);
        }
        let outcome = self.apply_compilation(sources, &c, true);
        (outcome, c.diagnostics)
    }

    /// Compiles the sources of the policy in force again with `resolved` and swaps the result
    /// in when it differs (`Applied`) — the last good *sources* stay in force while a newer
    /// bundle is refused, but the cluster's current endpoints and Secret values (a pod
    /// replaced, a tenant key revoked), or in directory mode the content of the API key files
    /// the policy in force names, still reach the policy. The recorded refusal is kept.
    /// `None` when no policy is in force (or, which cannot happen, when its sources no longer
    /// compile).
    ///
    /// With no policy in force, the last good sources kept in the cluster
    /// ([`crate::bundle::Resolved::last_good`]) take their place: a replica that starts while
    /// the bundle is refused serves the policy the others serve.
    pub fn reapply_in_force(&self, resolved: &crate::bundle::Resolved) -> Option<ApplyOutcome> {
        let sources = match self.current() {
            Some(current) => current.sources.clone(),
            None => resolved.last_good.clone()?,
        };
        let c = compile_resolved(&sources, &resolved.for_policy_in_force());
        c.policy.as_ref()?;
        Some(self.apply_compilation(&sources, &c, false))
    }

    /// Swaps in the compilation's policy when it has one; `clear_rejected`: a successful
    /// compilation also clears the recorded refusal (not when it re-applies the sources in
    /// force after a refusal).
    fn apply_compilation(
        &self,
        sources: &Sources,
        c: &kinf_lang::Compilation,
        clear_rejected: bool,
    ) -> ApplyOutcome {
        match c.policy.clone() {
            Some(policy) => {
                let fingerprint = policy.fingerprint;
                let prev = self.current.load();
                if prev.as_ref().is_some_and(|p| p.fingerprint == fingerprint) {
                    if clear_rejected {
                        self.rejected.store(None);
                    }
                    return ApplyOutcome::Unchanged;
                }
                let generation = prev.as_ref().map_or(0, |p| p.generation) + 1;
                self.current.store(Some(Arc::new(Applied {
                    policy,
                    fingerprint,
                    warnings: rendered(c, sources, Severity::Warning),
                    generation,
                    sources: sources.clone(),
                })));
                if clear_rejected {
                    self.rejected.store(None);
                }
                ApplyOutcome::Applied { generation }
            }
            None => {
                self.record_compile_refusal(sources, c, None);
                ApplyOutcome::Refused {
                    errors: error_count(c),
                }
            }
        }
    }

    /// Records the refusal of `sources` (compiled to `c`); `namespaces`: the refused
    /// namespaces when every other one was applied.
    fn record_compile_refusal(
        &self,
        sources: &Sources,
        c: &kinf_lang::Compilation,
        namespaces: Option<Vec<String>>,
    ) {
        let errors = rendered(c, sources, Severity::Error);
        let codes = c
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| d.code.as_str())
            .collect();
        self.record_refusal(Rejected {
            fingerprint: crate::bundle::sources_hash(sources),
            errors,
            codes,
            namespaces,
        });
    }
}

/// The diagnostics of `c` of one severity, rendered `file:line:col: severity[CODE]: message`.
fn rendered(c: &kinf_lang::Compilation, sources: &Sources, severity: Severity) -> Vec<String> {
    c.diagnostics
        .iter()
        .filter(|d| d.severity == severity)
        .map(|d| d.render_plain(sources))
        .collect()
}

fn error_count(c: &kinf_lang::Compilation) -> usize {
    c.diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count()
}

/// Namespace isolation of a refused bundle: the namespaces with errors keep the objects they
/// have in force and every other namespace's objects are compiled beside them. When that
/// has errors in namespaces not kept yet, those are kept too and the merge is compiled
/// again; each round keeps at least one more namespace, so the loop ends. Returns the merged
/// sources, their compilation and the kept namespaces; `None` (the whole bundle is refused)
/// without [`crate::bundle::Resolved::isolation`], when an error belongs to no single
/// object, when an error appears in a namespace already kept (its objects in force no longer
/// compile beside the others'), or when every namespace would be kept.
fn isolate(
    full: &kinf_lang::Compilation,
    sources: &Sources,
    resolved: &crate::bundle::Resolved,
) -> Option<(Sources, kinf_lang::Compilation, BTreeSet<String>)> {
    let iso = resolved.isolation.as_ref()?;
    let all = iso.namespaces();
    let mut kept = BTreeSet::new();
    let mut round: Option<(Sources, kinf_lang::Compilation)> = None;
    loop {
        let (diag_sources, c) = match &round {
            Some((s, c)) => (s, c),
            None => (sources, full),
        };
        if c.policy.is_some() {
            let (merged, mc) = round?;
            return Some((merged, mc, kept));
        }
        let mut more = BTreeSet::new();
        for d in c
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
        {
            let ns = iso.namespace_of(d, diag_sources)?;
            if kept.contains(&ns) {
                return None;
            }
            more.insert(ns);
        }
        if more.is_empty() {
            // No policy and no error: nothing to isolate.
            return None;
        }
        kept.extend(more);
        if kept.is_superset(&all) {
            return None;
        }
        let merged = iso.merge(&kept);
        let mc = compile_resolved(&merged, &resolved.keeping(&kept));
        round = Some((merged, mc));
    }
}

/// Compiles `sources` and fills in what the source resolved: the discovered endpoints of
/// selector-mode worker sets; a change of endpoints, Secret values or API key files changes the
/// fingerprint.
fn compile_resolved(
    sources: &Sources,
    resolved: &crate::bundle::Resolved,
) -> kinf_lang::Compilation {
    let mut c = kinf_lang::compile(sources);
    if let Some(policy) = c.policy.as_mut()
        && !resolved.is_empty()
        && let Some(p) = Arc::get_mut(policy)
    {
        for d in &mut p.destinations {
            if let Some(w) = d.worker_set.as_mut()
                && w.endpoints.is_empty()
                && let Some(found) = resolved
                    .endpoints
                    .get(&format!("{}/{}", d.namespace, d.name))
            {
                w.endpoints = found.iter().map(|a| Arc::from(a.as_str())).collect();
            }
        }
        p.fingerprint = p.fingerprint.rotate_left(1) ^ resolved.fingerprint();
    }
    c
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bundle::{NamespaceIsolation, Resolved};

    /// A worker set of namespace `ns`; `broken`: with an unknown field (KINF0101).
    fn worker_set(ns: &str, broken: bool) -> String {
        format!(
            "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\n\
             metadata: {{ name: w, namespace: {ns} }}\nspec:\n  endpoints: [\"10.0.0.1:8000\"]\n  \
             models: [ {{ name: m }} ]\n{}",
            if broken { "  endpointz: []\n" } else { "" }
        )
    }

    /// Sources named `namespace/w`, one per `(namespace, broken)`.
    fn sources(of: &[(&str, bool)]) -> Sources {
        let mut s = Sources::new();
        for (ns, broken) in of {
            s.add(format!("{ns}/w"), worker_set(ns, *broken));
        }
        s
    }

    /// Namespaces are the first segment of a source's name; `merge` answers from a table
    /// keyed by the kept namespaces (joined with `,`).
    #[derive(Debug)]
    struct Scripted {
        all: BTreeSet<String>,
        merges: BTreeMap<String, Sources>,
        merged: parking_lot::Mutex<Vec<String>>,
        settled: parking_lot::Mutex<Vec<ApplyOutcome>>,
    }

    impl NamespaceIsolation for Scripted {
        fn namespaces(&self) -> BTreeSet<String> {
            self.all.clone()
        }
        fn namespace_of(&self, d: &Diagnostic, sources: &Sources) -> Option<String> {
            let (span, _) = d.primary.as_ref()?;
            let name = &sources.get(span.file)?.name;
            Some(name.split('/').next()?.to_owned())
        }
        fn merge(&self, kept: &BTreeSet<String>) -> Sources {
            let key = kept.iter().cloned().collect::<Vec<_>>().join(",");
            self.merged.lock().push(key.clone());
            self.merges.get(&key).cloned().unwrap_or_default()
        }
        fn endpoints_in_force(&self) -> Option<BTreeMap<String, Vec<String>>> {
            None
        }
        fn settle(&self, outcome: &ApplyOutcome) {
            self.settled.lock().push(outcome.clone());
        }
    }

    fn resolved(s: Scripted) -> (Resolved, Arc<Scripted>) {
        let s = Arc::new(s);
        let r = Resolved {
            kubernetes: true,
            isolation: Some(s.clone()),
            ..Resolved::default()
        };
        (r, s)
    }

    fn scripted(all: &[&str], merges: Vec<(&str, Sources)>) -> Scripted {
        Scripted {
            all: all.iter().map(|s| (*s).to_owned()).collect(),
            merges: merges.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            merged: parking_lot::Mutex::new(Vec::new()),
            settled: parking_lot::Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn a_merge_that_breaks_another_namespace_refuses_it_too_in_a_second_round() {
        let bundle = sources(&[("a", true), ("b", false), ("c", false)]);
        let (r, s) = resolved(scripted(
            &["a", "b", "c"],
            vec![
                // Keeping `a` breaks `b` (in the real merge: an object in force that no longer
                // compiles beside the others); keeping `a` and `b` compiles.
                ("a", sources(&[("b", true), ("c", false)])),
                ("a,b", sources(&[("c", false)])),
            ],
        ));
        let store = PolicyStore::new();
        let (outcome, _) = store.apply_resolved(&bundle, &r);
        assert_eq!(
            outcome,
            ApplyOutcome::PartlyApplied {
                generation: 1,
                changed: true,
                errors: 1,
                namespaces: vec!["a".into(), "b".into()],
            }
        );
        assert_eq!(*s.merged.lock(), vec!["a", "a,b"]);
        assert_eq!(*s.settled.lock(), vec![outcome], "told what is in force");
        let names: Vec<String> = store
            .current()
            .unwrap()
            .sources
            .iter()
            .map(|(_, f)| f.name.clone())
            .collect();
        assert_eq!(names, vec!["c/w"]);
        let refusal = store.last_rejected().unwrap();
        assert_eq!(refusal.namespaces, Some(vec!["a".into(), "b".into()]));
        assert_eq!(refusal.errors.len(), 1, "the bundle's own errors");
    }

    #[test]
    fn an_error_in_a_kept_namespace_or_every_namespace_kept_refuses_the_whole_bundle() {
        // Keeping `a` leaves `a`'s objects in force failing: no further round can help.
        let bundle = sources(&[("a", true), ("b", false)]);
        let (r, s) = resolved(scripted(
            &["a", "b", "c"],
            vec![("a", sources(&[("a", true), ("b", false)]))],
        ));
        let store = PolicyStore::new();
        assert_eq!(
            store.apply_resolved(&bundle, &r).0,
            ApplyOutcome::Refused { errors: 1 }
        );
        assert_eq!(*s.merged.lock(), vec!["a"]);
        assert_eq!(store.last_rejected().unwrap().namespaces, None);
        assert!(!store.is_ready());

        // Every namespace has errors: nothing to merge.
        let bundle = sources(&[("a", true), ("b", true)]);
        let (r, s) = resolved(scripted(&["a", "b"], vec![]));
        assert_eq!(
            store.apply_resolved(&bundle, &r).0,
            ApplyOutcome::Refused { errors: 2 }
        );
        assert!(s.merged.lock().is_empty());
    }

    #[test]
    fn without_isolation_a_bundle_with_errors_is_refused_whole() {
        let bundle = sources(&[("a", true), ("b", false)]);
        let store = PolicyStore::new();
        assert_eq!(
            store.apply_resolved(&bundle, &Resolved::default()).0,
            ApplyOutcome::Refused { errors: 1 }
        );
    }
}
