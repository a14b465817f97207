//! The compiler never panics: arbitrary text, arbitrary YAML-shaped documents, and mutations of
//! valid bundles; well-typed generated bundles compile without errors.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use proptest::prelude::*;

fn compile(text: &str) -> kinf_lang::Compilation {
    kinf_lang::compile_str("p.yaml", text).1
}

const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "spec",
    "rules",
    "matches",
    "route",
    "consider",
    "exclude",
    "select",
    "onEmpty",
    "drop",
    "backend",
    "type",
    "queuedPrompts",
    "kvCacheUsage",
    "greaterThan",
    "lessThan",
    "models",
    "names",
    "order",
    "minimize",
    "when",
    "if",
    "tag",
    "model",
    "destinations",
    "endpoints",
    "pool",
    "targetRefs",
];
const VALUES: &[&str] = &[
    "kinference.buoyant.io/v1alpha1",
    "InferencePolicy",
    "InferencePool",
    "InferenceWorkerSet",
    "Local",
    "Provider",
    "PredictedTTFT",
    "Reject",
    "NextRule",
    "2",
    "0.7",
    "70%",
    "-1",
    "30s",
    "x",
    "'promptTokens > 3 &&'",
    "[a, b]",
    "{ }",
    "[ ]",
    "null",
    "true",
    "\"10.0.0.1:8000\"",
    "'tag(\"pii-detected\")'",
    "*glob[",
];

fn yamlish() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        (
            0usize..6,
            proptest::sample::select(KEYS),
            proptest::sample::select(VALUES),
            any::<bool>(),
        ),
        1..40,
    )
    .prop_map(|lines| {
        let mut s = String::new();
        for (indent, k, v, nested) in lines {
            s.push_str(&"  ".repeat(indent));
            if nested {
                s.push_str(&format!("- {k}: {v}\n"));
            } else {
                s.push_str(&format!("{k}: {v}\n"));
            }
            if indent == 0 && k == "name" {
                s.push_str("---\n");
            }
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,400}") {
        let c = compile(&s);
        prop_assert!(c.policy.is_some() || c.errors() > 0);
    }

    #[test]
    fn yaml_shaped_input_never_panics_and_errors_are_sorted(s in yamlish()) {
        let c = compile(&s);
        let keys: Vec<_> = c.diagnostics.iter().map(|d| d.sort_key()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        prop_assert_eq!(keys, sorted);
        for d in &c.diagnostics {
            prop_assert!(d.primary.is_some(), "diagnostic without a location: {:?}", d);
        }
    }

    #[test]
    fn mutated_valid_bundles_never_panic(cut in 0usize..4000, insert in proptest::sample::select(VALUES)) {
        let base = kinf_lang::synthetic::synthetic_bundle(4, 3);
        let cut = cut.min(base.len());
        let cut = (0..=cut).rev().find(|i| base.is_char_boundary(*i)).unwrap_or(0);
        let text = format!("{}{}{}", &base[..cut], insert, &base[cut..]);
        let _ = compile(&text);
    }

    #[test]
    fn generated_bundles_compile_clean(rules in 1usize..30, ws in 1usize..12) {
        let c = compile(&kinf_lang::synthetic::synthetic_bundle(rules, ws));
        prop_assert_eq!(c.errors(), 0);
        let policy = c.policy.unwrap();
        prop_assert_eq!(policy.pools[0].rules.len(), rules);
        let dag = kinf_lang::dag::RuleDag::build(&policy.pools[0]);
        prop_assert!(dag.is_acyclic());
    }
}

#[test]
fn reports_every_error_at_once() {
    let text = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec:\n  rules:\n  - name: a\n    route:\n      select: [ { type: Locl } ]\n      onEmpty: Rejct\n  - route:\n      exclude: [ { name: f, drop: { queuedPrompt: { greaterThan: 1 } } } ]\n";
    let c = compile(text);
    let codes: Vec<&str> = c.diagnostics.iter().map(|d| d.code.as_str()).collect();
    assert!(codes.len() >= 3, "{codes:?}");
    assert!(codes.contains(&"KINF0103"), "{codes:?}");
    assert!(codes.contains(&"KINF0101"), "{codes:?}");
}

#[test]
fn a_non_string_for_a_field_with_allowed_names_is_one_error_listing_them() {
    let text = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec:\n  rules:\n  - name: a\n    route:\n      select: [ { type: Local, minimize: PredictedTTFT } ]\n      onEmpty: 3\n";
    let c = compile(text);
    let on_empty: Vec<(&str, Option<&str>)> = c
        .diagnostics
        .iter()
        .filter(|d| d.message.contains("onEmpty"))
        .map(|d| (d.code.as_str(), d.help.as_deref()))
        .collect();
    assert_eq!(
        on_empty,
        vec![("KINF0103", Some("allowed values: `Reject`, `NextRule`"))],
        "{:?}",
        c.diagnostics
    );
}

#[test]
fn a_tier_after_one_that_always_picks_its_candidates_is_reported() {
    let never_pick = |select: &str| -> Vec<String> {
        let c = compile(&pool_with_provider(select));
        assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
        c.diagnostics
            .iter()
            .filter(|d| d.code.as_str() == "KINF0503")
            .map(|d| d.message.clone())
            .collect()
    };
    // An untyped tier picks whenever anything survives: the provider fallback is dead.
    let m = never_pick("[ { minimize: PredictedTTFT }, { type: Provider, order: [cloud] } ]");
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].starts_with("select tier 2 of rule `r` can never pick"),
        "{m:?}"
    );
    // A second Local tier after a Local one that minimizes is dead too.
    let m = never_pick(
        "[ { type: Local, minimize: PredictedTTFT }, { type: Local, minimize: QueuedPrompts } ]",
    );
    assert_eq!(m.len(), 1, "{m:?}");
    // Local first, then Provider: a real fallback; an `order` tier does not always pick.
    assert!(never_pick("[ { type: Local, minimize: PredictedTTFT }, { type: Provider, minimize: PredictedTTFT } ]").is_empty());
    assert!(never_pick("[ { order: [cloud] }, { minimize: PredictedTTFT } ]").is_empty());
}

/// A pool of a worker set `w` and a provider `cloud`, both serving `m`, and one rule with `select`.
fn pool_with_provider(select: &str) -> String {
    format!(
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{ name: w }}\nspec:\n  endpoints: [\"10.0.0.1:8000\"]\n  models: [ {{ name: m }} ]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: cloud }}\nspec:\n  type: OpenAI\n  url: https://api.example.com/v1\n  models: [ {{ name: m, providerModel: gpt }} ]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {{ name: p }}\nspec:\n  destinations:\n  - {{ kind: InferenceWorkerSet, name: w }}\n  - {{ kind: InferenceProvider, name: cloud }}\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {{ name: q }}\nspec:\n  rules:\n  - name: r\n    route:\n      select: {select}\n"
    )
}

#[test]
fn a_load_measure_minimized_over_providers_is_reported() {
    let warned = |select: &str| {
        let c = compile(&pool_with_provider(select));
        assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
        c.diagnostics
            .iter()
            .filter(|d| d.code.as_str() == "KINF0409")
            .count()
    };
    assert_eq!(warned("[ { minimize: QueuedPrompts } ]"), 1);
    assert_eq!(warned("[ { type: Provider, minimize: KvCacheUsage } ]"), 1);
    assert_eq!(
        warned(
            "[ { type: Local, minimize: RunningPrompts }, { type: Provider, minimize: PredictedTTFT } ]"
        ),
        0
    );
    assert_eq!(warned("[ { minimize: PredictedTTFT } ]"), 0);
}

#[test]
fn a_rule_whose_matched_model_no_considered_destination_serves_is_reported() {
    let text = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: { name: w }\nspec:\n  endpoints: [\"10.0.0.1:8000\"]\n  models: [ { name: local-only } ]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: { name: cloud }\nspec:\n  type: OpenAI\n  url: https://api.example.com/v1\n  models: [ { name: m, providerModel: gpt } ]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: { name: p }\nspec:\n  destinations:\n  - { kind: InferenceWorkerSet, name: w }\n  - { kind: InferenceProvider, name: cloud }\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: q }\nspec:\n  rules:\n  - name: MODEL-to-cloud\n    matches: [ { model: MODEL } ]\n    route:\n      consider: [ { type: Provider } ]\n";
    let empty = |model: &str| {
        let c = compile(&text.replace("MODEL", model));
        assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
        c.diagnostics
            .iter()
            .filter(|d| d.code.as_str() == "KINF0504")
            .count()
    };
    // Only the worker set serves `local-only`: a Provider-only rule for it never has one.
    assert_eq!(empty("local-only"), 1);
    // The provider serves `m`.
    assert_eq!(empty("m"), 0);
}

#[test]
fn a_threshold_below_zero_is_refused() {
    let c = compile(&pool_with_provider(
        "[ { minimize: PredictedTTFT } ]\n      exclude: [ { name: never, drop: { predictedTTFT: { lessThan: 0s } } } ]",
    ));
    let codes: Vec<&str> = c.diagnostics.iter().map(|d| d.code.as_str()).collect();
    assert!(codes.contains(&"KINF0206"), "{codes:?}");
    let ok = compile(&pool_with_provider(
        "[ { minimize: PredictedTTFT } ]\n      exclude: [ { name: fast, drop: { predictedTTFT: { lessThan: 100ms } } } ]",
    ));
    assert_eq!(ok.errors(), 0, "{:?}", ok.diagnostics);
}

#[test]
fn a_load_filter_on_a_provider_named_in_backend_is_reported() {
    let warned = |backend: &str| {
        let c = compile(&pool_with_provider(&format!(
            "[ {{ minimize: PredictedTTFT }} ]\n      exclude: [ {{ name: busy, drop: {{ backend: {{ {backend} }}, queuedPrompts: {{ greaterThan: 2 }} }} }} ]"
        )));
        assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
        c.diagnostics
            .iter()
            .filter(|d| d.code.as_str() == "KINF0409" && d.message.contains("filter `busy`"))
            .count()
    };
    assert_eq!(warned("name: cloud"), 1);
    assert_eq!(warned("type: Provider"), 1);
    assert_eq!(warned("name: w"), 0);
}
