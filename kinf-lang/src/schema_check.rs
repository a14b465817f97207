//! Validation of each document against the resource's JSON Schema (the `jsonschema` crate),
//! with errors mapped back to spans and turned into coded diagnostics.

use std::sync::OnceLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use kinf_policy::ResourceKind;
use serde_json::{Map, Value as J, json};

use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::path::{FieldPath, Seg};
use crate::suggest::help_for;
use crate::yaml::Node;
use crate::yaml_view::YamlJson;

/// The schema used by lint: the generated schema of the kind, with nullable wrappers removed,
/// `oneOf` of constants turned into `enum`, and `apiVersion`/`kind`/`metadata` added.
pub fn lint_schema(kind: ResourceKind) -> J {
    let mut schema = kinf_policy::schema::json_schema(kind);
    simplify(&mut schema);
    if let J::Object(root) = &mut schema {
        let props = root
            .entry("properties")
            .or_insert_with(|| J::Object(Map::new()));
        if let J::Object(props) = props {
            props.insert("apiVersion".into(), json!({"type": "string"}));
            props.insert("kind".into(), json!({"type": "string"}));
            props.insert(
                "metadata".into(),
                json!({
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "maxLength": 253,
                                 "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                        "namespace": {"type": "string", "maxLength": 63,
                                      "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                }),
            );
            props.remove("status");
        }
        root.insert("additionalProperties".into(), J::Bool(false));
        root.insert(
            "required".into(),
            json!(["apiVersion", "kind", "metadata", "spec"]),
        );
    }
    schema
}

fn simplify(v: &mut J) {
    match v {
        J::Object(map) => {
            for child in map.values_mut() {
                simplify(child);
            }
            // `type: [T, "null"]` → `type: T`
            if let Some(J::Array(types)) = map.get("type") {
                let non_null: Vec<J> = types
                    .iter()
                    .filter(|t| t.as_str() != Some("null"))
                    .cloned()
                    .collect();
                if non_null.len() == 1 {
                    map.insert("type".into(), non_null[0].clone());
                }
            }
            // `anyOf: [X, {type: null}]` → X (keeping the outer description)
            if let Some(J::Array(any)) = map.get("anyOf") {
                let non_null: Vec<&J> = any
                    .iter()
                    .filter(|s| s.get("type").and_then(J::as_str) != Some("null"))
                    .collect();
                if non_null.len() == 1
                    && any.len() == 2
                    && let J::Object(inner) = non_null[0].clone()
                {
                    map.remove("anyOf");
                    for (k, val) in inner {
                        map.entry(k).or_insert(val);
                    }
                }
            }
            // `format: int32` (and the others of Rust integers) → its range as `minimum` and
            // `maximum`, so that a number out of it is reported at the field, not by the typed
            // deserialization. 64-bit ones stop at the range of `i64`, which holds the integers
            // the YAML tree reads.
            if let Some((min, max)) = map
                .get("format")
                .and_then(J::as_str)
                .and_then(integer_format_range)
            {
                if map
                    .get("minimum")
                    .and_then(J::as_f64)
                    .is_none_or(|m| m < min as f64)
                {
                    map.insert("minimum".into(), J::from(min));
                }
                if map
                    .get("maximum")
                    .and_then(J::as_f64)
                    .is_none_or(|m| m > max as f64)
                {
                    map.insert("maximum".into(), J::from(max));
                }
            }
            // `oneOf` of constants → `enum`
            if let Some(J::Array(one)) = map.get("oneOf") {
                let consts: Option<Vec<J>> = one.iter().map(|s| s.get("const").cloned()).collect();
                if let Some(consts) = consts {
                    map.remove("oneOf");
                    map.insert("enum".into(), J::Array(consts));
                    map.insert("type".into(), J::String("string".into()));
                }
            }
        }
        J::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

/// The range of the integers of a schema `format` (as `schemars` writes Rust's integer types).
fn integer_format_range(format: &str) -> Option<(i64, i64)> {
    Some(match format {
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (i64::MIN, i64::MAX),
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" | "uint" => (0, i64::MAX),
        _ => return None,
    })
}

struct KindSchema {
    schema: J,
    validator: Option<jsonschema::Validator<YamlJson>>,
}

fn schemas() -> &'static [KindSchema] {
    static SCHEMAS: OnceLock<Vec<KindSchema>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        ResourceKind::ALL
            .iter()
            .map(|k| {
                let schema = lint_schema(*k);
                let validator = jsonschema::options_for::<YamlJson>().build(&schema).ok();
                KindSchema { schema, validator }
            })
            .collect()
    })
}

fn kind_schema(kind: ResourceKind) -> Option<&'static KindSchema> {
    let i = ResourceKind::ALL.iter().position(|k| *k == kind)?;
    schemas().get(i)
}

/// The subschema describing the value at `path`, following `properties`, `additionalProperties`
/// and `items`.
pub fn subschema<'a>(schema: &'a J, path: &FieldPath) -> Option<&'a J> {
    let mut s = schema;
    for seg in &path.0 {
        s = match seg {
            Seg::Key(k) => s
                .get("properties")
                .and_then(|p| p.get(k.as_ref()))
                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))?,
            Seg::Index(_) => s.get("items")?,
        };
    }
    Some(s)
}

/// Property names allowed at the object described by `schema`.
pub fn property_names(schema: &J) -> Vec<&str> {
    schema
        .get("properties")
        .and_then(J::as_object)
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Validates one document root against the kind's schema, reading the YAML tree in place;
/// `text` is the text of the document's file (messages quote values as written there).
/// Returns the diagnostics, in document order.
pub fn validate(kind: ResourceKind, root: &Node, text: &str) -> Vec<Diagnostic> {
    let Some(ks) = kind_schema(kind) else {
        return Vec::new();
    };
    let Some(validator) = &ks.validator else {
        return Vec::new();
    };
    if validator.is_valid(root) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for err in validator.iter_errors(root) {
        let path = FieldPath::from_json_pointer_in(err.instance_path().as_str(), root);
        map_error(&ks.schema, root, text, &path, err.kind(), &mut out);
    }
    // A value of a field with allowed names (`onEmpty: 3`) fails both the schema's `type` and
    // its `enum`: one problem, reported once, by the diagnostic that lists the allowed names
    // (the wrong-type help, "quote the value", would not fix it).
    let enum_paths: Vec<FieldPath> = out
        .iter()
        .filter(|d| d.code == Code::UnknownEnumValue)
        .filter_map(|d| d.field_path.clone())
        .collect();
    out.retain(|d| {
        d.code != Code::WrongType
            || d.field_path
                .as_ref()
                .is_none_or(|p| !enum_paths.contains(p))
    });
    out
}

fn field_name(path: &FieldPath) -> String {
    match path.0.last() {
        Some(Seg::Key(k)) => k.to_string(),
        Some(Seg::Index(_)) => {
            let parent = path.parent();
            format!("{} item", parent.last_key().unwrap_or("list"))
        }
        None => "document".to_string(),
    }
}

/// Help that lists the values a field accepts, when its schema has an `enum`.
fn allowed_values_help(schema: &J, path: &FieldPath) -> Option<String> {
    let values: Vec<String> = subschema(schema, path)?
        .get("enum")?
        .as_array()?
        .iter()
        .filter_map(J::as_str)
        .map(|v| format!("`{v}`"))
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// `metadata.name` problems (missing, not a string, not an RFC 1123 name) are KINF0006.
fn name_error(root: &Node, path: &FieldPath, kind: &ValidationErrorKind) -> Option<Diagnostic> {
    const NAME_HELP: &str = "a name is at most 253 lowercase letters, digits, `-` and `.`, starting and ending with a letter or digit (RFC 1123), e.g. `llama-workers`";
    let metadata = FieldPath(vec![Seg::Key("metadata".into())]);
    let name = metadata.key("name");
    let missing = match kind {
        ValidationErrorKind::Required { property } => {
            let prop = property.as_str().unwrap_or("");
            (path.0.is_empty() && prop == "metadata") || (*path == metadata && prop == "name")
        }
        _ => false,
    };
    if missing {
        // Point at `metadata:` when it is there, else at `kind:`.
        let span = root
            .entry("metadata")
            .or_else(|| root.entry("kind"))
            .map_or(root.span, |e| e.key_span);
        return Some(
            Diagnostic::new(Code::MissingName, "missing `metadata.name`")
                .at(span, "no name")
                .with_help(format!("add `metadata: {{ name: ... }}`; {NAME_HELP}"))
                .with_path(name),
        );
    }
    if *path != name {
        return None;
    }
    let node = root.lookup(path).node;
    let (message, help) = match &node.value {
        crate::yaml::Value::Str(s) => (
            format!("invalid resource name `{s}`"),
            NAME_HELP.to_string(),
        ),
        v => (
            format!("`metadata.name` must be a string, found {}", v.type_name()),
            format!(
                "quote a name that YAML would read as {}; {NAME_HELP}",
                v.type_name()
            ),
        ),
    };
    Some(
        Diagnostic::new(Code::MissingName, message)
            .at(node.span, "invalid name")
            .with_help(help)
            .with_path(name),
    )
}

/// Help for a number outside its range: the whole allowed range when the schema has both ends.
/// The bounds of 64-bit integers are left out, unless the value crossed them (`too_large`:
/// it is above the maximum).
fn range_help(schema: &J, path: &FieldPath, too_large: bool) -> Option<String> {
    let s = subschema(schema, path)?;
    let min = s
        .get("minimum")
        .or_else(|| s.get("exclusiveMinimum"))
        .filter(|m| too_large || m.as_i64() != Some(i64::MIN));
    let max = s
        .get("maximum")
        .or_else(|| s.get("exclusiveMaximum"))
        .filter(|m| too_large || m.as_i64() != Some(i64::MAX));
    let field = field_name(path);
    match (min, max) {
        (Some(min), Some(max)) => Some(format!("`{field}` takes values from {min} to {max}")),
        (Some(min), None) => Some(format!("`{field}` takes values of at least {min}")),
        (None, Some(max)) => Some(format!("`{field}` takes values of at most {max}")),
        (None, None) => None,
    }
}

/// A scalar as written in the source (`1e400`, `.inf`, `99999999999999999999`), else as JSON.
fn written(node: &Node, text: &str) -> String {
    match &node.value {
        crate::yaml::Value::Int(_) | crate::yaml::Value::Float(_) => text
            .get(node.span.start..node.span.end)
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.contains('\n'))
            .map_or_else(|| node.to_json().to_string(), str::to_string),
        _ => node.to_json().to_string(),
    }
}

fn map_error(
    schema: &J,
    root: &Node,
    text: &str,
    path: &FieldPath,
    kind: &ValidationErrorKind,
    out: &mut Vec<Diagnostic>,
) {
    if let Some(d) = name_error(root, path, kind) {
        out.push(d);
        return;
    }
    let found = root.lookup(path);
    let value_span = found.node.span;
    let field = field_name(path);
    // `.inf`, `.nan` and numbers beyond the range of a float (`1e400`) read as JSON `null`:
    // every number field refuses them, whatever its type says.
    if let crate::yaml::Value::Float(f) = found.node.value
        && !f.is_finite()
        && matches!(
            kind,
            ValidationErrorKind::Type { .. }
                | ValidationErrorKind::AnyOf { .. }
                | ValidationErrorKind::OneOfNotValid { .. }
        )
    {
        out.push(
            Diagnostic::new(
                Code::OutOfRange,
                format!(
                    "`{field}` must be a finite number, found `{}`",
                    written(found.node, text)
                ),
            )
            .at(value_span, "not a finite number")
            .with_help(
                "YAML reads `.inf`, `.nan` and numbers beyond about 1.8e308 as infinite or not \
                 a number; write a finite number",
            )
            .with_path(path.clone()),
        );
        return;
    }
    let diag = match kind {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let allowed = subschema(schema, path)
                .map(property_names)
                .unwrap_or_default();
            for key in unexpected {
                let at = root.lookup(&path.key(key.to_string()));
                let span = at.key_span.unwrap_or(value_span);
                let within = if path.0.is_empty() {
                    "the resource".to_string()
                } else {
                    format!("`{field}`")
                };
                out.push(
                    Diagnostic::new(
                        Code::UnknownField,
                        format!("unknown field `{key}` in {within}"),
                    )
                    .at(span, "unknown field")
                    .with_help(help_for(
                        key,
                        allowed.iter().copied(),
                        "fields allowed here",
                    ))
                    .with_path(path.key(key.to_string())),
                );
            }
            return;
        }
        ValidationErrorKind::Enum { options } => {
            let opts: Vec<&str> = options
                .as_array()
                .map(|a| a.iter().filter_map(J::as_str).collect())
                .unwrap_or_default();
            let value = found
                .node
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}", found.node.to_json()));
            Diagnostic::new(
                Code::UnknownEnumValue,
                format!("unknown value `{value}` for `{field}`"),
            )
            .at(value_span, "not an allowed value")
            .with_help(
                several_values_help(found.node, path)
                    .unwrap_or_else(|| help_for(&value, opts.iter().copied(), "allowed values")),
            )
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => type_words(&t.to_string()),
                TypeKind::Multiple(ts) => {
                    let words: Vec<String> =
                        ts.iter().map(|t| type_words(&t.to_string())).collect();
                    words.join(" or ")
                }
            };
            let found_text = match found.node.value {
                // `64.0` for an integer: the number, as written.
                crate::yaml::Value::Float(_) if expected == "an integer" => {
                    format!("`{}`", written(found.node, text))
                }
                ref v => v.type_name().to_string(),
            };
            Diagnostic::new(
                Code::WrongType,
                format!("`{field}` must be {expected}, found {found_text}"),
            )
            .at(value_span, format!("expected {expected}"))
            .with_help(type_help(&expected, found.node, path))
        }
        ValidationErrorKind::Required { property } => {
            let prop = property.as_str().unwrap_or("?");
            let span = found.key_span.unwrap_or(value_span);
            let within = if path.0.is_empty() {
                "the resource".to_string()
            } else {
                format!("`{path}`")
            };
            let help = match allowed_values_help(schema, &path.key(prop.to_string())) {
                Some(values) => format!("add `{prop}:` with one of: {values}"),
                None => format!("add `{prop}:`; see `kinfctl schema` for its type"),
            };
            Diagnostic::new(
                Code::MissingField,
                format!("missing required field `{prop}` in {within}"),
            )
            .at(span, format!("`{prop}` is required here"))
            .with_help(help)
            .with_path(path.key(prop.to_string()))
        }
        ValidationErrorKind::Minimum { limit }
        | ValidationErrorKind::ExclusiveMinimum { limit } => Diagnostic::new(
            Code::OutOfRange,
            format!(
                "`{field}` must be at least {limit}, found {}",
                written(found.node, text)
            ),
        )
        .at(value_span, "too small")
        .with_help_opt(range_help(schema, path, false)),
        ValidationErrorKind::Maximum { limit }
        | ValidationErrorKind::ExclusiveMaximum { limit } => Diagnostic::new(
            Code::OutOfRange,
            format!(
                "`{field}` must be at most {limit}, found {}",
                written(found.node, text)
            ),
        )
        .at(value_span, "too large")
        .with_help_opt(range_help(schema, path, true)),
        ValidationErrorKind::MinItems { limit } => Diagnostic::new(
            Code::OutOfRange,
            format!("`{field}` needs at least {limit} item(s)"),
        )
        .at(value_span, "too few items"),
        ValidationErrorKind::MaxItems { limit } => Diagnostic::new(
            Code::OutOfRange,
            format!("`{field}` allows at most {limit} item(s)"),
        )
        .at(value_span, "too many items"),
        ValidationErrorKind::Pattern { pattern } => {
            let help = if path.0.first() == Some(&Seg::Key("metadata".into()))
                && path.last_key() == Some("namespace")
            {
                "a namespace is at most 63 lowercase letters, digits and `-`, starting and ending with a letter or digit (RFC 1123 label)".to_string()
            } else {
                format!("the value must match `{pattern}`")
            };
            Diagnostic::new(Code::InvalidValue, format!("invalid value for `{field}`"))
                .at(value_span, "invalid")
                .with_help(help)
        }
        ValidationErrorKind::MinLength { limit } => Diagnostic::new(
            Code::InvalidValue,
            if *limit == 1 {
                format!("`{field}` must not be empty")
            } else {
                format!("`{field}` must be at least {limit} characters long")
            },
        )
        .at(value_span, "too short"),
        ValidationErrorKind::MaxLength { limit } => Diagnostic::new(
            Code::InvalidValue,
            format!("`{field}` must be at most {limit} characters long"),
        )
        .at(value_span, "too long"),
        ValidationErrorKind::AnyOf { .. } | ValidationErrorKind::OneOfNotValid { .. } => {
            Diagnostic::new(
                Code::WrongType,
                format!(
                    "`{field}` must be a number or a string such as `70%` or `2s`, found {}",
                    found.node.value.type_name()
                ),
            )
            .at(value_span, "expected a number or a string")
            .with_help(
                "write a number such as `2` or `0.7`, or a string such as `70%`, `2s` or `16Ki`",
            )
        }
        other => Diagnostic::new(
            Code::InvalidValue,
            format!("invalid value for `{field}`: {other:?}"),
        )
        .at(value_span, "invalid"),
    };
    out.push(diag.with_path(path.clone()));
}

fn type_words(t: &str) -> String {
    match t {
        "object" => "a mapping".into(),
        "array" => "a list".into(),
        "string" => "a string".into(),
        "integer" => "an integer".into(),
        "number" => "a number".into(),
        "boolean" => "a boolean".into(),
        "null" => "null".into(),
        other => other.to_string(),
    }
}

/// Fields holding a duration (`30s`); a bare number there is missing its unit.
const DURATION_FIELDS: &[&str] = &["timeout", "interval", "window", "overhead", "expectedTtft"];

/// Integer fields of `spec.limits[]`: plain integers, where a quantity such as `20k` is tempting.
const LIMIT_FIELDS: &[&str] = &["tokensPerMinute", "requestsPerMinute", "concurrentRequests"];

/// Fields of a request match that take one value, where a list of values is tempting.
const SINGLE_VALUE_MATCH_FIELDS: &[&str] = &["tenant", "model", "qos", "tag"];

/// The help for a list where a request match takes one value (`tenant: [a, b]`), or `None`
/// when `node` is not a list at such a field.
fn several_values_help(node: &Node, path: &FieldPath) -> Option<String> {
    let f = path.last_key()?;
    let crate::yaml::Value::Seq(items) = &node.value else {
        return None;
    };
    let in_match = path
        .0
        .iter()
        .any(|s| matches!(s, Seg::Key(k) if k == "matches" || k == "if"));
    if !SINGLE_VALUE_MATCH_FIELDS.contains(&f) || !in_match {
        return None;
    }
    let values: Vec<String> = items
        .iter()
        .map(|i| match i.as_str() {
            Some(s) => format!("\"{s}\""),
            None => i.to_json().to_string(),
        })
        .collect();
    let values = if values.is_empty() {
        vec!["\"a\"".to_string(), "\"b\"".to_string()]
    } else {
        values
    };
    let cond = if f == "tag" {
        let calls: Vec<String> = values.iter().map(|v| format!("tag({v})")).collect();
        calls.join(" || ")
    } else {
        format!("{f} in [{}]", values.join(", "))
    };
    let keys: Vec<&str> = path
        .0
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_ref()),
            Seg::Index(_) => None,
        })
        .collect();
    Some(if keys == ["spec", "rules", "matches", f] {
        format!(
            "`{f}` takes one value; to match any of several, write one `matches` entry per value \
             (the entries are OR-ed), or `when: '{cond}'`"
        )
    } else {
        format!("`{f}` takes one value; to match any of several, write `when: '{cond}'`")
    })
}

fn type_help(expected: &str, node: &Node, path: &FieldPath) -> String {
    let field = path.last_key();
    let is_duration = field.is_some_and(|f| DURATION_FIELDS.contains(&f));
    let keys: Vec<&str> = path
        .0
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_ref()),
            Seg::Index(_) => None,
        })
        .collect();
    let in_limit = keys.first() == Some(&"spec") && keys.get(1) == Some(&"limits");
    // `spec.limits[].matches` is one request match, unlike `spec.rules[].matches`.
    if in_limit
        && keys.len() == 3
        && field == Some("matches")
        && let crate::yaml::Value::Seq(_) = node.value
    {
        return "`limits[].matches` is a single request match, not a list (unlike \
                `rules[].matches`): remove the `- ` and write its fields directly, e.g. \
                `matches: { tenant: free }`"
            .into();
    }
    // `tenant: [a, b]` in a request match.
    if expected == "a string"
        && let Some(help) = several_values_help(node, path)
    {
        return help;
    }
    // `tokensPerMinute: 20k`.
    if expected == "an integer"
        && in_limit
        && let (Some(f), Some(text)) = (field, node.as_str())
        && LIMIT_FIELDS.contains(&f)
        && let Ok(n) = kinf_grammar::parse_quantity(text.trim())
    {
        return format!("limits are plain integers, without a suffix: write `{n}`");
    }
    // `0x-5`: a plain string, which looks like a number.
    if matches!(expected, "an integer" | "a number")
        && node.style == crate::yaml::Style::Plain
        && let Some(help) = node.as_str().and_then(signed_radix_help)
    {
        return help;
    }
    match (expected, &node.value) {
        ("a string", crate::yaml::Value::Int(_) | crate::yaml::Value::Float(_)) if is_duration => {
            format!("a duration needs a unit: write e.g. `{}s`", node.to_json())
        }
        ("a list", crate::yaml::Value::Map(_)) => {
            "write the entries as a list: start each with `- `".into()
        }
        ("a list", crate::yaml::Value::Str(s))
            if !s.is_empty() && !s.contains([',', '[', ']', '"']) =>
        {
            let plain = s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
            let item = if plain {
                s.to_string()
            } else {
                format!("\"{s}\"")
            };
            format!("write a list, even of one item: `[{item}]`, or one `- item` per line")
        }
        ("a list", crate::yaml::Value::Str(_)) => {
            "write a list: `[a, b]` or one `- item` per line".into()
        }
        (
            "a string",
            crate::yaml::Value::Int(_) | crate::yaml::Value::Float(_) | crate::yaml::Value::Bool(_),
        ) => "quote the value to make it a string".into(),
        ("a mapping", _) => "write `key: value` pairs, indented under the field".into(),
        ("an integer", crate::yaml::Value::Float(f)) if f.fract() == 0.0 && f.abs() < 1e15 => {
            format!("write it without a decimal point or exponent: `{f:.0}`")
        }
        ("an integer", crate::yaml::Value::Float(_)) => {
            "write a whole number, without a decimal point or exponent".into()
        }
        _ => format!("write {expected} here"),
    }
}

/// The help for a hexadecimal or octal integer with a sign, before or after its prefix (`0x-5`,
/// `-0x5`, `0o+7`), which YAML reads as a string: the integer in decimal. `None` for any other
/// text.
fn signed_radix_help(text: &str) -> Option<String> {
    let sign = |t: &str| match t.as_bytes().first() {
        Some(b'-') => Some(true),
        Some(b'+') => Some(false),
        _ => None,
    };
    let before = sign(text);
    let (radix, rest) = crate::yaml::radix_literal(text.get(usize::from(before.is_some())..)?)?;
    let after = sign(rest);
    // Exactly one sign.
    let negative = match (before, after) {
        (Some(n), None) | (None, Some(n)) => n,
        _ => return None,
    };
    let digits = rest.get(usize::from(after.is_some())..)?;
    if !crate::yaml::are_radix_digits(digits, radix) {
        return None;
    }
    let (name, prefix) = if radix == 16 {
        ("a hexadecimal", "0x")
    } else {
        ("an octal", "0o")
    };
    // Past `i64` too (the field then says it is too large); digits past `u128` are too many
    // to convert here.
    let fix = match u128::from_str_radix(digits, radix) {
        Ok(magnitude) => format!("write `{}{magnitude}`", if negative { "-" } else { "" }),
        Err(_) => "write it in decimal".into(),
    };
    Some(format!(
        "`{text}` is not a number: {name} integer (`{prefix}`) takes no sign, so YAML reads it \
         as a string; {fix}"
    ))
}
