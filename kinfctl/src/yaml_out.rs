//! A small block-style YAML emitter for JSON values (CRD manifests).

use serde_json::Value;

/// Renders a value as a YAML document (without the leading `---`).
pub fn to_yaml(v: &Value) -> String {
    let mut out = String::new();
    emit(v, 0, &mut out, true);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn emit(v: &Value, indent: usize, out: &mut String, top: bool) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(map) if !map.is_empty() => {
            let mut first = true;
            for (k, val) in map {
                // Every key is indented, except the first of a mapping that starts a line.
                if !(top && first) {
                    out.push_str(&pad);
                }
                first = false;
                out.push_str(&scalar_key(k));
                out.push(':');
                write_value(val, indent, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                out.push_str(&pad);
                out.push_str("- ");
                match item {
                    Value::Object(m) if !m.is_empty() => {
                        let mut inner = String::new();
                        emit(item, indent + 2, &mut inner, true);
                        out.push_str(inner.trim_start_matches(' '));
                    }
                    Value::Array(a) if !a.is_empty() => {
                        out.push('\n');
                        emit(item, indent + 2, out, false);
                    }
                    _ => {
                        out.push_str(&scalar(item));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            out.push_str(&pad);
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn write_value(val: &Value, indent: usize, out: &mut String) {
    match val {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            emit(val, indent + 2, out, false);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            emit(val, indent, out, false);
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar(val));
            out.push('\n');
        }
    }
}

fn scalar_key(k: &str) -> String {
    if needs_quotes(k) {
        quote(k)
    } else {
        k.to_string()
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            if needs_quotes(s) {
                quote(s)
            } else {
                s.clone()
            }
        }
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

fn needs_quotes(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let special_start = s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@` ".contains(c));
    let reserved = matches!(
        s.to_ascii_lowercase().as_str(),
        "true" | "false" | "null" | "~" | "yes" | "no" | "on" | "off" | "y" | "n"
    );
    let numeric = s.parse::<f64>().is_ok() || s.starts_with("0x") || s.starts_with("0o");
    special_start
        || reserved
        || numeric
        || s.contains(": ")
        || s.contains(" #")
        || s.contains('\n')
        || s.ends_with(' ')
        || s.ends_with(':')
        || s.contains('\t')
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_nested_block_yaml() {
        let v =
            serde_json::json!({"a": {"b": [1, {"c": "x: y", "d": []}], "e": "true"}, "f": "plain"});
        assert_eq!(
            to_yaml(&v),
            "a:\n  b:\n  - 1\n  - c: \"x: y\"\n    d: []\n  e: \"true\"\nf: plain\n"
        );
    }
}
