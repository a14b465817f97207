//! The Kinference policy compiler.
//!
//! YAML sources (files, multi-document files, directories — all given together form one
//! bundle) are parsed with spans, validated against the generated JSON Schemas, deserialized
//! into the typed resources of `kinf-policy`, resolved and type-checked as a whole, arranged
//! into a rule DAG per pool, and lowered into a flat, immutable [`CompiledPolicy`].
//!
//! Every finding is a [`Diagnostic`] with a stable code (`KINF` + 4 digits), a span and help.
//! The compiler never panics and never stops at the first error. It does no I/O: callers read
//! files and pass their text in [`Sources`].
//!
//! ```
//! let mut sources = kinf_lang::Sources::new();
//! sources.add("policy.yaml", "apiVersion: kinference.buoyant.io/v1alpha1\nkind: Nope\n");
//! let out = kinf_lang::compile(&sources);
//! assert!(out.policy.is_none());
//! assert_eq!(out.diagnostics[0].code.as_str(), "KINF0005");
//! ```

pub mod analysis;
pub mod bundle;
pub mod check;
mod classifier_fields;
pub mod codes;
pub mod compiled;
mod constant_when;
pub mod dag;
pub mod destinations;
pub mod diagnostic;
pub mod env;
pub mod expr;
pub mod path;
pub mod schema_check;
pub mod source;
pub mod suggest;
pub mod synthetic;
mod target_refs;
mod when_names;
pub mod yaml;
pub mod yaml_fast;
pub mod yaml_view;

use std::hash::{Hash, Hasher};
use std::sync::Arc;

pub use codes::Code;
pub use compiled::CompiledPolicy;
pub use diagnostic::{Diagnostic, Severity};
pub use source::{FileId, SourceFile, Sources, Span};

/// The result of compiling a bundle.
#[derive(Debug)]
pub struct Compilation {
    /// Every diagnostic, ordered by file and position.
    pub diagnostics: Vec<Diagnostic>,
    /// The compiled policy; `None` when there is any error (warnings do not prevent it).
    pub policy: Option<Arc<CompiledPolicy>>,
}

impl Compilation {
    /// Number of errors.
    pub fn errors(&self) -> usize {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
    }

    /// Number of warnings.
    pub fn warnings(&self) -> usize {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .count()
    }
}

/// Compiles every document of every source as one bundle.
pub fn compile(sources: &Sources) -> Compilation {
    let mut diagnostics = Vec::new();
    let bundle = bundle::load(sources, &mut diagnostics);
    let mut policy = check::Checker::new(&bundle, sources, &mut diagnostics).run();
    let mut h = ahash::AHasher::default();
    for (_, f) in sources.iter() {
        f.name.hash(&mut h);
        f.text.hash(&mut h);
    }
    policy.fingerprint = h.finish();
    // A value that aliases repeat is checked at each place, but an error in it is reported
    // once, at the anchored value, with notes at the aliases.
    let repeated = diagnostic::merge_repeats(&mut diagnostics);
    yaml::note_aliases(&mut diagnostics, &repeated, &bundle.docs, sources);
    let failed = diagnostics.iter().any(|d| d.severity == Severity::Error);
    Compilation {
        diagnostics,
        policy: (!failed).then(|| Arc::new(policy)),
    }
}

/// Compiles one in-memory text (convenience for tests and tools).
pub fn compile_str(name: &str, text: &str) -> (Sources, Compilation) {
    let mut sources = Sources::new();
    sources.add(name, text);
    let c = compile(&sources);
    (sources, c)
}
