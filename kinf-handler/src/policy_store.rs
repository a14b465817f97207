//! The live policy: an immutable [`CompiledPolicy`] behind an atomic pointer. A new bundle
//! replaces it only when it compiles without errors; otherwise the last good policy stays in
//! force and the rejection (with its diagnostics) is kept for `/readyz`, the admin status and
//! metrics. Readers never block and never see a half-applied policy.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use kinf_lang::{CompiledPolicy, Diagnostic, Severity, Sources};

/// The policy in force and how it got there.
#[derive(Debug)]
pub struct Applied {
    /// The compiled policy.
    pub policy: Arc<CompiledPolicy>,
    /// Its fingerprint (a hash of the sources).
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

    /// The last refused bundle, cleared when a bundle is applied.
    pub fn last_rejected(&self) -> Option<Arc<Rejected>> {
        self.rejected.load_full()
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
    /// change of endpoints or Secret values counts as a change. Also returns every diagnostic
    /// of the compilation (for Kubernetes status).
    pub fn apply_resolved(
        &self,
        sources: &Sources,
        resolved: &crate::bundle::Resolved,
    ) -> (ApplyOutcome, Vec<Diagnostic>) {
        let c = compile_resolved(sources, resolved);
        let outcome = self.apply_compilation(sources, &c, true);
        (outcome, c.diagnostics)
    }

    /// Compiles the sources of the policy in force again with `resolved` and swaps the result
    /// in when it differs (`Applied`) — the last good *sources* stay in force while a newer
    /// bundle is refused, but the cluster's current endpoints and Secret values (a pod
    /// replaced, a tenant key revoked) still reach the policy. The recorded refusal is kept.
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
        let render = |sev: Severity| -> Vec<String> {
            c.diagnostics
                .iter()
                .filter(|d| d.severity == sev)
                .map(|d: &Diagnostic| d.render_plain(sources))
                .collect()
        };
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
                    warnings: render(Severity::Warning),
                    generation,
                    sources: sources.clone(),
                })));
                if clear_rejected {
                    self.rejected.store(None);
                }
                ApplyOutcome::Applied { generation }
            }
            None => {
                let errors = render(Severity::Error);
                let codes = c
                    .diagnostics
                    .iter()
                    .filter(|d| d.severity == Severity::Error)
                    .map(|d| d.code.as_str())
                    .collect();
                let n = errors.len();
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for (_, f) in sources.iter() {
                    for b in f.name.bytes().chain(f.text.bytes()) {
                        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                    }
                }
                self.rejected.store(Some(Arc::new(Rejected {
                    fingerprint: h,
                    errors,
                    codes,
                })));
                ApplyOutcome::Refused { errors: n }
            }
        }
    }
}

/// Compiles `sources` and fills in what the source resolved: the discovered endpoints of
/// selector-mode worker sets; a change of endpoints or Secret values changes the fingerprint.
fn compile_resolved(
    sources: &Sources,
    resolved: &crate::bundle::Resolved,
) -> kinf_lang::Compilation {
    let mut c = kinf_lang::compile(sources);
    if let Some(policy) = c.policy.as_mut()
        && (!resolved.endpoints.is_empty() || !resolved.secrets.is_empty())
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
