//! `kinfctl classify`: run the built-in classifiers on a prompt, or evaluate them against a
//! labelled JSONL file.

use std::io::Write;
use std::path::{Path, PathBuf};

use kinf_router::classify::eval::{self, OwnedMessage};
use kinf_router::classify::{Classification, Classifiers, Message};

use crate::EXIT_OK;
use crate::cli::Format;
use crate::report::{self, Error, ErrorKind};

/// What to classify.
#[derive(Debug)]
pub enum Input<'a> {
    /// Literal text, one user message.
    Text(&'a str),
    /// Plain text, or a JSON request (chat, Anthropic messages or completions), read as the
    /// gateway reads it.
    File(&'a Path),
    /// A labelled JSONL file to evaluate.
    Eval(&'a Path),
}

/// Runs the command.
pub fn run(
    input: Input<'_>,
    config: Option<&PathBuf>,
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let json = format == Format::Json;
    let classifiers = match config {
        None => Classifiers::default(),
        Some(dir) => match from_config(dir, json, out, err) {
            Ok(c) => c,
            Err(code) => return code,
        },
    };
    match input {
        Input::Text(t) => {
            let msgs = vec![OwnedMessage::new("user", t.to_string())];
            print_one(&classifiers, &msgs, format, out)
        }
        Input::File(p) => {
            let text = match std::fs::read_to_string(p) {
                Ok(t) => t,
                Err(e) => return report::error(json, out, err, Error::cannot_read(p, e)),
            };
            let msgs = match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) if v.is_object() => match eval::messages_from_json(&v) {
                    Ok(m) => m,
                    Err(e) => return report::error(json, out, err, invalid(p, &e)),
                },
                _ => vec![OwnedMessage::new("user", text)],
            };
            print_one(&classifiers, &msgs, format, out)
        }
        Input::Eval(p) => {
            let text = match std::fs::read_to_string(p) {
                Ok(t) => t,
                Err(e) => return report::error(json, out, err, Error::cannot_read(p, e)),
            };
            let examples = match eval::parse_jsonl(&text) {
                Ok(x) => x,
                Err(e) => return report::error(json, out, err, invalid(p, &e)),
            };
            let report = eval::evaluate(&classifiers, &examples);
            match format {
                Format::Json => {
                    let _ = writeln!(
                        out,
                        "{}",
                        serde_json::to_string_pretty(&report).unwrap_or_default()
                    );
                }
                Format::Human => {
                    let _ = writeln!(out, "{} examples", report.examples);
                    let _ = writeln!(
                        out,
                        "{:<20} {:>5} {:>5} {:>5} {:>9} {:>7}",
                        "tag", "tp", "fp", "fn", "precision", "recall"
                    );
                    for t in &report.tags {
                        let _ = writeln!(
                            out,
                            "{:<20} {:>5} {:>5} {:>5} {:>9.3} {:>7.3}",
                            t.tag, t.tp, t.fp, t.fn_, t.precision, t.recall
                        );
                    }
                    for m in &report.mistakes {
                        let _ = writeln!(out, "line {}: {} {}", m.line, m.kind, m.tag);
                    }
                }
            }
            EXIT_OK
        }
    }
}

/// A request body or evaluation file that cannot be used: `FILE: CAUSE` (the cause, from the
/// gateway's reader, may start with `line N: `).
fn invalid(path: &Path, cause: &str) -> Error {
    Error::new(ErrorKind::Input, format!("`{}`: {cause}", path.display()))
}

/// The built-in classifiers of the first `GatewayBackend` of the bundle in `dir`; errors are
/// reported as [`crate::report`] does (a bundle that does not compile, with `json`, as its
/// diagnostics), and the exit code returned.
fn from_config(
    dir: &Path,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Classifiers, i32> {
    let sources = crate::load::read_sources(&[dir.to_path_buf()])
        .map_err(|e| report::error(json, out, err, e))?;
    let c = kinf_lang::compile(&sources);
    let Some(policy) = c.policy else {
        let e = report::not_compiled(c.errors());
        return Err(report::compile_errors_brief(
            json,
            out,
            err,
            &sources,
            &c.diagnostics,
            e,
        ));
    };
    let Some(g) = policy.gateways.first() else {
        let e = Error::new(ErrorKind::Bundle, "the bundle has no GatewayBackend");
        return Err(report::error(json, out, err, e));
    };
    Ok(Classifiers::from_specs(&g.spec.classifiers))
}

fn print_one(
    classifiers: &Classifiers,
    msgs: &[OwnedMessage],
    format: Format,
    out: &mut dyn Write,
) -> i32 {
    let borrowed: Vec<Message<'_>> = msgs.iter().map(OwnedMessage::as_message).collect();
    // As the gateway: a request without text (a prompt of token ids) gets no tag at all.
    let c = if borrowed.is_empty() {
        Classification::default()
    } else {
        classifiers.classify(&borrowed)
    };
    match format {
        Format::Json => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&c).unwrap_or_default()
            );
        }
        Format::Human => {
            let tags: Vec<&str> = c.tags.iter().map(|t| &**t).collect();
            let _ = writeln!(out, "tags: {}", tags.join(", "));
            for m in &c.matches {
                let _ = writeln!(
                    out,
                    "  {} message {} [{}..{}] {}",
                    m.tag, m.message_index, m.start, m.end, m.redacted
                );
            }
        }
    }
    EXIT_OK
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::EXIT_USAGE;

    fn root() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    fn run_json(input: Input<'_>, config: Option<&PathBuf>) -> (i32, serde_json::Value) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(input, config, Format::Json, &mut out, &mut err);
        let v = serde_json::from_slice(&out).unwrap_or(serde_json::Value::Null);
        (code, v)
    }

    #[test]
    fn text_json_output() {
        let (code, v) = run_json(Input::Text("mail bob@example.com, SSN 123-45-6789"), None);
        assert_eq!(code, EXIT_OK);
        let tags: Vec<&str> = v["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(
            tags,
            ["complexity-low", "pii-detected", "pii-email", "pii-ssn"]
        );
        assert_eq!(v["matches"][0]["redacted"], "b*************m");
        assert_eq!(v["matches"][1]["entity"], "ssn");
    }

    #[test]
    fn config_uses_first_gateway_pii_only() {
        let cfg = root().join("testdata/policies/pii-stays-local");
        let (code, v) = run_json(Input::Text("call (555) 123-4567"), Some(&cfg));
        assert_eq!(code, EXIT_OK);
        assert_eq!(v["tags"], serde_json::json!(["pii-detected", "pii-phone"]));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let missing = root().join("testdata/classify/no-such-dir");
        let code = run(
            Input::Text("x"),
            Some(&missing),
            Format::Json,
            &mut out,
            &mut err,
        );
        assert_eq!(code, EXIT_USAGE);
    }

    #[test]
    fn chat_file_reads_every_message() {
        let f = root().join("testdata/classify/chat.json");
        let (code, v) = run_json(Input::File(&f), None);
        assert_eq!(code, EXIT_OK);
        assert_eq!(v["matches"][0]["tag"], "pii-iban");
        assert_eq!(v["matches"][0]["message_index"], 2);
    }

    /// An Anthropic request: the top-level `system` and the `tool_result` blocks are read; a
    /// prompt of token ids gets no tag, as through the gateway.
    #[test]
    fn anthropic_file_reads_system_and_tool_results() {
        let dir = std::env::temp_dir().join(format!("kinfctl-classify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("anthropic.json");
        let body = serde_json::json!({
            "model": "claude", "max_tokens": 16,
            "system": "Account holder: jane@example.com",
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "SSN 123-45-6789"}
            ]}]
        });
        std::fs::write(&f, body.to_string()).unwrap();
        let (code, v) = run_json(Input::File(&f), None);
        assert_eq!(code, EXIT_OK);
        assert_eq!(v["matches"][0]["tag"], "pii-email");
        assert_eq!(v["matches"][0]["message_index"], 0);
        assert_eq!(v["matches"][1]["tag"], "pii-ssn");
        assert_eq!(v["matches"][1]["message_index"], 1);
        std::fs::write(&f, r#"{"model": "m", "prompt": [1, 2, 3]}"#).unwrap();
        let (code, v) = run_json(Input::File(&f), None);
        assert_eq!(code, EXIT_OK);
        assert_eq!(
            v["tags"],
            serde_json::json!([]),
            "token ids: no text, no tag"
        );
        std::fs::write(&f, r#"{"model": "m"}"#).unwrap();
        let (code, _) = run_json(Input::File(&f), None);
        assert_eq!(code, EXIT_USAGE);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An Anthropic `tool_use` block's `input` is read, after the messages, as the gateway
    /// reads it.
    #[test]
    fn anthropic_file_reads_tool_use_input() {
        let dir = std::env::temp_dir().join(format!("kinfctl-tool-use-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("anthropic.json");
        let body = serde_json::json!({
            "model": "claude", "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "Refund my last order."},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t", "name": "refund",
                     "input": {"iban": "DE89 3704 0044 0532 0130 00"}}
                ]}
            ]
        });
        std::fs::write(&f, body.to_string()).unwrap();
        let (code, v) = run_json(Input::File(&f), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(code, EXIT_OK);
        assert_eq!(v["matches"][0]["tag"], "pii-iban");
        assert_eq!(v["matches"][0]["message_index"], 2);
    }

    #[test]
    fn eval_corpus() {
        let corpus = root().join("testdata/classify/corpus.jsonl");
        let (code, v) = run_json(Input::Eval(&corpus), None);
        assert_eq!(code, EXIT_OK);
        let d = v["tags"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tag"] == "pii-detected")
            .unwrap();
        assert!(d["recall"].as_f64().unwrap() >= 0.98);
        assert!(d["precision"].as_f64().unwrap() >= 0.95);
    }
}
