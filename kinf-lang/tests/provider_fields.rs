//! `spec.maxTokensField` of a provider that is not OpenAI-shaped is not read (KINF0410).
//! Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

fn provider(type_: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{ name: cloud, namespace: inference }}
spec:
  type: {type_}
  url: https://api.example.com
  credentials: {{ secretRef: {{ name: key }} }}
  models: [{{ name: m, providerModel: m }}]
{extra}"#
    )
}

#[test]
fn max_tokens_field_is_clean_on_openai_providers() {
    for field in ["max_tokens", "max_completion_tokens"] {
        let text = provider("OpenAI", &format!("  maxTokensField: {field}\n"));
        assert_eq!(support::lint("p.yaml", &text), "", "{field}");
    }
    assert_eq!(support::lint("p.yaml", &provider("Anthropic", "")), "");
}

#[test]
fn max_tokens_field_on_other_providers_is_not_read() {
    let mut out = String::new();
    for type_ in ["Anthropic", "Bedrock"] {
        let text = provider(
            type_,
            "  region: us-east-1\n  maxTokensField: max_completion_tokens\n",
        );
        let lint = support::lint("p.yaml", &text);
        assert_eq!(lint.matches("warning[KINF0410]").count(), 1, "{lint}");
        out.push_str(&lint);
        out.push('\n');
    }
    insta::assert_snapshot!("max_tokens_field_not_openai", out);
}
