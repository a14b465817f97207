//! A file saved with a UTF-8 byte order mark (as some Windows editors do) gets the same
//! diagnostics, at the same characters, lines and columns, as the file without it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Every diagnostic as `line:col: code: message`, with the text its primary span covers.
fn located(text: &str) -> Vec<String> {
    let (sources, c) = kinf_lang::compile_str("p.yaml", text);
    c.diagnostics
        .iter()
        .map(|d| {
            let (span, _) = d.primary.as_ref().expect("located");
            let (_, line, col) = sources.locate(*span).expect("in the file");
            let covered = &sources.get(span.file).unwrap().text[span.start..span.end];
            format!("{line}:{col}: {}: {covered:?}", d.code.as_str())
        })
        .collect()
}

const BOM: &str = "\u{feff}";

#[test]
fn a_byte_order_mark_moves_no_label_and_no_column() {
    // Line 1 holds the whole resource (flow style), so every span is on the BOM's line; the
    // anchor takes the full parser, the plain file the fast one.
    let cases = [
        // KINF0101 at the key `x`.
        r#"{ apiVersion: kinference.buoyant.io/v1alpha1, kind: InferencePolicy, metadata: { name: p, namespace: inference }, spec: { rules: [] }, x: &a 1 }"#,
        // KINF0505 at the namespace, KINF0205 in the condition.
        r#"{ apiVersion: kinference.buoyant.io/v1alpha1, kind: InferencePolicy, metadata: { name: p, namespace: inference }, spec: { rules: [ { name: r, matches: [ { when: "tenant == 5" } ] } ] } }"#,
        // KINF0001 at an unknown alias.
        r#"{ apiVersion: kinference.buoyant.io/v1alpha1, kind: InferencePolicy, metadata: { name: p, namespace: inference }, spec: *nope }"#,
    ];
    for plain in cases {
        let expected = located(&format!("{plain}\n"));
        assert!(!expected.is_empty(), "{plain}");
        assert_eq!(located(&format!("{BOM}{plain}\n")), expected, "{plain}");
    }
    // The key itself is marked, not the space before it.
    let out = located(&format!("{BOM}{}\n", cases[0]));
    assert!(out[0].ends_with(r#"KINF0101: "x""#), "{out:?}");
    // A BOM before a block mapping: the first line's key, and lines below, as without it.
    let block = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p, namespace: inference }\nspec: { rulez: [] }\n";
    let expected = located(block);
    assert_eq!(located(&format!("{BOM}{block}")), expected);
    let wrong_version = block.replace("v1alpha1", "v9");
    let out = located(&format!("{BOM}{wrong_version}"));
    assert_eq!(out, located(&wrong_version));
    assert!(out[0].starts_with("1:13: "), "{out:?}");
}
