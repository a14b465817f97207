//! A small block-style YAML writer for compiling objects read from the API server: one key
//! per line, so that every diagnostic span (and so every field path) is precise. Strings are
//! written as JSON strings, which YAML reads as double-quoted scalars.

use serde_json::Value;

/// `value` as block YAML (a mapping at the top level), ending in a newline.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    write_node(value, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(a) if a.is_empty() => "[]".to_owned(),
        Value::Object(o) if o.is_empty() => "{}".to_owned(),
        _ => String::new(),
    }
}

fn is_scalar(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => true,
    }
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !k.starts_with(['-', '.']);
    if plain {
        k.to_owned()
    } else {
        Value::String(k.to_owned()).to_string()
    }
}

fn write_node(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) if !o.is_empty() => {
            for (k, val) in o {
                if is_scalar(val) {
                    out.push_str(&format!("{pad}{}: {}\n", key(k), scalar(val)));
                } else {
                    out.push_str(&format!("{pad}{}:\n", key(k)));
                    write_node(val, indent + 2, out);
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for item in a {
                if is_scalar(item) {
                    out.push_str(&format!("{pad}- {}\n", scalar(item)));
                } else {
                    // The item's first line follows `- `; the rest is indented under it.
                    let mut inner = String::new();
                    write_node(item, indent + 2, &mut inner);
                    let trimmed = inner.get(indent + 2..).unwrap_or("");
                    out.push_str(&format!("{pad}- {trimmed}"));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn round_trips_through_the_compiler_parser() {
        let v = serde_json::json!({
            "a": {"b": [1, {"c": "x: y", "d": [[], {}]}, [2, 3]], "e": null},
            "weird key": true,
            "f": []
        });
        let text = to_yaml(&v);
        let mut sources = kinf_lang::Sources::new();
        let id = sources.add("t", text.as_str());
        let mut diags = Vec::new();
        let docs = kinf_lang::yaml::parse_documents(id, sources.get(id).unwrap(), &mut diags);
        assert!(diags.is_empty(), "{diags:?}\n{text}");
        assert_eq!(docs[0].root.to_json(), v, "{text}");
    }
}
