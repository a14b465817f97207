//! Synthetic bundles of any size, for benchmarks and property tests.

use std::fmt::Write as _;

/// A valid bundle with `worker_sets` worker sets (2 endpoints each, 2 models each), two
/// providers, one pool over all of them, a gateway with PII and complexity classifiers, and
/// one policy with `rules` rules exercising every stage. It lints without errors.
pub fn synthetic_bundle(rules: usize, worker_sets: usize) -> String {
    let mut s = String::with_capacity(rules * 600 + worker_sets * 400);
    let ws = worker_sets.max(1);
    for i in 0..ws {
        let _ = write!(
            s,
            "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{ name: ws-{i}, namespace: bench }}\nspec:\n  endpoints: [\"10.{a}.{b}.1:8000\", \"10.{a}.{b}.2:8000\"]\n  models:\n  - {{ name: org/model-{i}, aliases: [model-{i}, family-{f}] }}\n  kvEvents: {{ port: 5557 }}\n  performance: {{ prefillTokensPerSecond: 4000, decodeTokensPerSecond: 40 }}\n",
            a = i / 250,
            b = i % 250,
            f = i % 10
        );
    }
    for p in ["cloud-a", "cloud-b"] {
        let _ = write!(
            s,
            "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: {p}, namespace: bench }}\nspec:\n  type: OpenAI\n  url: https://{p}.example.com/v1\n  credentials: {{ env: {up}_KEY }}\n  models:\n{models}",
            models = (0..10)
                .map(|f| format!("  - {{ name: family-{f}, providerModel: remote-family-{f} }}\n"))
                .collect::<String>(),
            up = p.replace('-', "_").to_uppercase()
        );
    }
    s.push_str("---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: { name: bench-pool, namespace: bench }\nspec:\n  destinations:\n");
    for i in 0..ws {
        let _ = writeln!(s, "  - {{ kind: InferenceWorkerSet, name: ws-{i} }}");
    }
    s.push_str("  - { kind: InferenceProvider, name: cloud-a }\n  - { kind: InferenceProvider, name: cloud-b }\n");
    s.push_str("---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: GatewayBackend\nmetadata: { name: bench-gw, namespace: bench }\nspec:\n  pool: bench-pool\n  classifiers:\n  - { name: pii, type: Pii }\n  - { name: complexity, type: Complexity }\n");
    s.push_str("---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: bench-policy, namespace: bench }\nspec:\n  rules:\n");
    for r in 0..rules {
        let m = r % ws;
        let _ = write!(
            s,
            "  - name: rule-{r}\n    matches:\n    - model: model-{m}\n      tenant: tenant-{r}\n      promptTokens: {{ greaterThan: {gt} }}\n    - model: family-{f}\n      tag: complexity-low\n      when: 'promptTokens < {lt} && tenant in [\"t{r}\", \"u{r}\"]'\n    route:\n      consider:\n      - models: {{ names: [model-{m}, family-{f}] }}\n      exclude:\n      - name: pii-local\n        if: {{ tag: pii-detected }}\n        drop: {{ backend: {{ type: Provider }} }}\n      - name: busy\n        drop: {{ backend: {{ type: Local }}, queuedPrompts: {{ greaterThan: 4 }}, kvCacheUsage: {{ greaterThan: 80% }} }}\n      select:\n      - {{ type: Local, minimize: PredictedTTFT }}\n      - {{ type: Provider, order: [cloud-a, cloud-b] }}\n      onEmpty: {on_empty}\n",
            gt = r % 4000,
            lt = 8000 + r,
            f = r % 10,
            on_empty = if r % 2 == 0 { "Reject" } else { "NextRule" }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn synthetic_bundle_compiles_clean() {
        let (sources, c) = crate::compile_str("bench.yaml", &super::synthetic_bundle(20, 5));
        let rendered: Vec<String> = c
            .diagnostics
            .iter()
            .map(|d| d.render_plain(&sources))
            .collect();
        assert_eq!(c.errors(), 0, "{rendered:#?}");
        let p = c.policy.as_ref().map(|p| p.pools[0].rules.len());
        assert_eq!(p, Some(20));
    }
}
