//! What the compiler's diagnostic tests share: compiling a text and rendering its diagnostics,
//! and the small cluster they write policies against.
#![allow(dead_code, unused_macros)]

/// Every diagnostic of compiling `text` as the file `name`, rendered plain, one per line.
pub fn lint(name: &str, text: &str) -> String {
    let (sources, c) = kinf_lang::compile_str(name, text);
    c.diagnostics
        .iter()
        .map(|d| d.render_plain(&sources))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Worker set `w` serving model `m` at one endpoint, and pool `pool` over it, in namespace
/// `inference`.
macro_rules! cluster {
    () => {
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w, namespace: inference }
spec: { endpoints: ["10.0.0.1:8000"], models: [{ name: m }] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool, namespace: inference }
spec: { destinations: [{ kind: InferenceWorkerSet, name: w }] }
"#
    };
}

/// The head of policy `p` in namespace `inference`, up to its `spec:` line.
macro_rules! policy_head {
    () => {
        r#"---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: p, namespace: inference }
spec:
"#
    };
}
