//! Worker set `endpoints` are `host:port` addresses a URL can carry (KINF0207 otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kinf_lang::destinations::valid_endpoint;

#[test]
fn ports_are_digits() {
    for ok in [
        "10.0.0.1:8000",
        "vllm-0.vllm:8000",
        "[fd00::1]:8000",
        "h:1",
        "h:65535",
    ] {
        assert!(valid_endpoint(ok), "{ok}");
    }
    // A sign parses as a number, but no URL takes `http://h:+8000`.
    for bad in [
        "10.0.0.1:+8000",
        "h:-1",
        "h:0",
        "h:65536",
        "h:",
        "h",
        ":8000",
        "h:8000 ",
    ] {
        assert!(!valid_endpoint(bad), "{bad}");
    }
    let text = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: { name: w }\nspec: { endpoints: [\"10.0.0.1:+8000\"], models: [{ name: m }] }\n";
    let (sources, c) = kinf_lang::compile_str("w.yaml", text);
    let out: Vec<String> = c
        .diagnostics
        .iter()
        .map(|d| d.render_plain(&sources))
        .collect();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with(
            "w.yaml:4:21: error[KINF0207]: `10.0.0.1:+8000` is not a `host:port` address"
        ),
        "{out:?}"
    );
}
