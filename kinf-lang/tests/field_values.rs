//! Values a field cannot hold (out of its type's range, not finite, not whole) are reported at
//! the field, in the user's terms. Accept changed snapshots with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[macro_use]
mod support;

/// Every diagnostic of a compilation of `text`, plain.
fn lint(text: &str) -> String {
    support::lint("v.yaml", text)
}

const CLUSTER: &str = cluster!();

fn provider(max_concurrency: &str) -> String {
    format!(
        "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: cloud, namespace: inference }}\nspec:\n  type: OpenAI\n  url: https://api.example.com\n  credentials: {{ secretRef: {{ name: key }} }}\n  models: [{{ name: m, providerModel: m }}]\n  maxConcurrency: {max_concurrency}\n"
    )
}

fn policy(spec: &str) -> String {
    format!(
        "---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {{ name: p, namespace: inference }}\nspec:\n{spec}"
    )
}

#[test]
fn the_bundle_without_bad_values_is_clean() {
    let text = format!(
        "{CLUSTER}{}{}",
        provider("64"),
        policy(
            "  priority: -5\n  rules:\n  - name: r\n    matches: [ { promptTokens: { greaterThan: 1e3 } } ]\n  limits:\n  - { name: l, tokensPerMinute: 9223372036854775807 }\n"
        )
    );
    assert_eq!(lint(&text), "");
}

#[test]
fn integers_out_of_their_range_are_reported_at_the_field() {
    let text = format!(
        "{CLUSTER}{}{}{}",
        provider("4294967296"),
        policy("  priority: 2147483648\n  rules: [ { name: r } ]\n"),
        policy("  priority: -2147483649\n  rules: [ { name: r } ]\n  limits:\n  - { name: l, tokensPerMinute: 99999999999999999999 }\n")
            .replace("name: p,", "name: q,"),
    );
    insta::assert_snapshot!("integers_out_of_range", lint(&text));
}

#[test]
fn fractions_for_integers_are_reported_at_the_field() {
    let text = format!(
        "{CLUSTER}{}{}",
        provider("64.0"),
        policy("  priority: 1e3\n  rules: [ { name: r } ]\n")
    );
    insta::assert_snapshot!("fractions_for_integers", lint(&text));
}

#[test]
fn numbers_that_are_not_finite_are_reported_as_such() {
    let text = format!(
        "{CLUSTER}{}",
        policy(
            "  rules:\n  - name: a\n    matches: [ { promptTokens: { greaterThan: .inf } } ]\n  - name: b\n    matches: [ { promptTokens: { greaterThan: .nan } } ]\n  - name: c\n    matches: [ { promptTokens: { lessThan: -1e400 } } ]\n"
        )
    );
    insta::assert_snapshot!("not_finite", lint(&text));
}

#[test]
fn a_spec_that_does_not_deserialize_says_where() {
    // Below the schema: the typed deserialization, which the schema's bounds now keep from
    // failing in a compilation. Its errors know the failing node and its path.
    let mut sources = kinf_lang::Sources::new();
    let id = sources.add(
        "v.yaml",
        "rules: [ { name: r } ]\nlimits:\n- { name: l, tokensPerMinute: 1.5 }\npriority: 2147483648\n",
    );
    let mut diags = Vec::new();
    let docs = kinf_lang::yaml::parse_documents(id, sources.get(id).unwrap(), &mut diags);
    let err = kinf_lang::yaml_view::from_node::<kinf_policy::InferencePolicySpec>(&docs[0].root)
        .unwrap_err();
    assert_eq!(err.path().to_string(), "limits[0].tokensPerMinute", "{err}");
    let (_, line, col) = sources.locate(err.span().unwrap()).unwrap();
    assert_eq!((line, col), (3, 31), "{err}");
    let id = sources.add("w.yaml", "rules: [ { name: r } ]\npriority: 2147483648\n");
    let docs = kinf_lang::yaml::parse_documents(id, sources.get(id).unwrap(), &mut diags);
    let err = kinf_lang::yaml_view::from_node::<kinf_policy::InferencePolicySpec>(&docs[0].root)
        .unwrap_err();
    assert_eq!(err.path().to_string(), "priority", "{err}");
    let (_, line, col) = sources.locate(err.span().unwrap()).unwrap();
    assert_eq!((line, col), (2, 11), "{err}");
}

#[test]
fn diagnostics_have_the_same_lines_whatever_the_line_endings() {
    let text = format!(
        "{CLUSTER}{}",
        policy("  priority: 2147483648\n  rules:\n  - name: r\n    matches: [ { model: nope } ]\n")
    );
    let lf = lint(&text);
    assert!(lf.contains("v.yaml:15:13: error[KINF0105]"), "{lf}");
    assert_eq!(lint(&text.replace('\n', "\r\n")), lf);
    assert_eq!(lint(&text.replace('\n', "\r")), lf);
}

#[test]
fn tempting_shapes_get_a_help_that_shows_the_right_one() {
    // A list of values where a request match takes one, a list where `limits[].matches` is one
    // mapping, a quantity where a limit is a plain integer, and a string where a list is
    // expected.
    let text = format!(
        "{CLUSTER}{}",
        policy(
            "  rules:\n  - name: r\n    matches:\n    - tenant: [acme, globex]\n      qos: [batch, deferrable]\n    - tag: [pii-email, pii-phone]\n    route:\n      exclude:\n      - name: x\n        if: { tenant: [a, b] }\n        drop: { backend: { type: Local } }\n      select: [ { order: workers } ]\n  limits:\n  - name: l\n    matches:\n    - tenant: free\n    tokensPerMinute: 20k\n    requestsPerMinute: lots\n"
        )
    );
    insta::assert_snapshot!("tempting_shapes", lint(&text));
}

#[test]
fn signed_hexadecimal_and_octal_integers_are_not_numbers() {
    // YAML's `0x` and `0o` integers take no sign: `0x-5` is a string (as `0xZZ` is), so an
    // integer field holding one is reported at the field, not read as -5.
    let text = format!(
        "{CLUSTER}{}{}",
        provider("0o+7"),
        policy(
            "  priority: 0x-5\n  rules: [ { name: r } ]\n  limits:\n  - { name: l, tokensPerMinute: 0x+1F }\n  - { name: m, tokensPerMinute: -0o10 }\n"
        )
    );
    insta::assert_snapshot!("signed_radix_integers", lint(&text));
    // Unsigned, they are numbers.
    let text = format!(
        "{CLUSTER}{}{}",
        provider("0o7"),
        policy(
            "  priority: 0x5\n  rules: [ { name: r } ]\n  limits:\n  - { name: l, tokensPerMinute: 0x1F }\n"
        )
    );
    assert_eq!(lint(&text), "");
}

#[test]
fn signed_radix_integers_past_i64_get_the_same_help() {
    // A signed `0x`/`0o` integer is a string whatever its size: the help gives the decimal of
    // one past `i64` too, and says to write it in decimal when it is too long to convert.
    let limits = |value: &str| {
        format!(
            "{CLUSTER}{}",
            policy(&format!(
                "  rules: [ {{ name: r }} ]\n  limits:\n  - {{ name: l, tokensPerMinute: {value} }}\n"
            ))
        )
    };
    let out = lint(&limits("0x-10000000000000000"));
    assert!(
        out.contains("hexadecimal integer (`0x`) takes no sign")
            && out.contains("write `-18446744073709551616`"),
        "{out}"
    );
    let out = lint(&limits("-0o1000000000000000000000"));
    assert!(
        out.contains("octal integer (`0o`) takes no sign")
            && out.contains("write `-9223372036854775808`"),
        "{out}"
    );
    let huge = format!("0x+{}", "F".repeat(40));
    let out = lint(&limits(&huge));
    assert!(
        out.contains(
            "hexadecimal integer (`0x`) takes no sign, so YAML reads it as a string; write it \
             in decimal"
        ),
        "{out}"
    );
}

#[test]
fn hexadecimal_and_octal_integers_past_i64_are_too_large_as_decimal_ones_are() {
    // YAML's core schema sets no size on `0x` / `0o` integers: one past `i64` is a number, read
    // as a float, as a decimal one is, and so reported as out of range (KINF0105) at the field,
    // not as a string (KINF0102).
    let limits = |value: &str| {
        format!(
            "{CLUSTER}{}",
            policy(&format!(
                "  rules: [ {{ name: r }} ]\n  limits:\n  - {{ name: l, tokensPerMinute: {value} }}\n"
            ))
        )
    };
    let code_and_place = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| !l.starts_with(' '))
            .map(|l| l.split(": ").take(2).collect::<Vec<_>>().join(": "))
            .collect()
    };
    let decimal = lint(&limits("18446744073709551616"));
    assert!(decimal.contains("error[KINF0105]"), "{decimal}");
    for value in [
        "0x10000000000000000",
        "0x8000000000000000",
        "0o1000000000000000000000",
    ] {
        let out = lint(&limits(value));
        assert_eq!(
            code_and_place(&out),
            code_and_place(&decimal),
            "{value}: {out}"
        );
    }
    insta::assert_snapshot!(
        "radix_integers_past_i64",
        [
            lint(&limits("0x10000000000000000")),
            lint(&limits("0o1000000000000000000000")),
            lint(&limits(&format!("0x{}", "F".repeat(300)))),
        ]
        .join("\n")
    );
}
