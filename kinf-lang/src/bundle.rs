//! Loading: documents → typed resources, with document-level checks (`apiVersion`, `kind`,
//! `metadata.name`, schema, duplicates).

use std::sync::Arc;

use kinf_policy::{
    API_VERSION, GROUP, GatewayBackendSpec, InferencePolicySpec, InferencePoolSpec,
    InferenceProviderSpec, InferenceWorkerSetSpec, ResourceKind,
};
use serde::de::DeserializeOwned;

use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::path::FieldPath;
use crate::schema_check;
use crate::source::{Sources, Span};
use crate::suggest::help_for;
use crate::yaml::{self, Document, Node};

/// Namespace of resources that name none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A loaded resource: identity, typed spec, and the document it came from.
#[derive(Debug)]
pub struct Res<T> {
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.namespace`, or `default`.
    pub namespace: Arc<str>,
    /// The typed spec.
    pub spec: T,
    /// Index into [`Bundle::docs`].
    pub doc: usize,
}

/// All resources given together.
#[derive(Debug, Default)]
pub struct Bundle {
    /// Every document, including the ones that failed to load.
    pub docs: Vec<Document>,
    /// Worker sets.
    pub worker_sets: Vec<Res<InferenceWorkerSetSpec>>,
    /// Providers.
    pub providers: Vec<Res<InferenceProviderSpec>>,
    /// Pools.
    pub pools: Vec<Res<InferencePoolSpec>>,
    /// Policies.
    pub policies: Vec<Res<InferencePolicySpec>>,
    /// Gateway backends.
    pub gateways: Vec<Res<GatewayBackendSpec>>,
    /// Resources (kind, namespace, name) that were reported as invalid and not loaded.
    /// References to them are not reported again: the first error is the one to fix.
    pub failed: Vec<(ResourceKind, Arc<str>, Arc<str>)>,
}

impl Bundle {
    /// The root node of a document.
    pub fn root(&self, doc: usize) -> Option<&Node> {
        self.docs.get(doc).map(|d| &d.root)
    }

    /// The span of the value at `path` in document `doc` (or of the deepest node reached).
    pub fn value_span(&self, doc: usize, path: &FieldPath) -> Option<Span> {
        self.root(doc).map(|r| r.lookup(path).node.span)
    }

    /// The span of the key at the end of `path` (or the value's, when there is no key).
    pub fn key_span(&self, doc: usize, path: &FieldPath) -> Option<Span> {
        self.root(doc).map(|r| {
            let l = r.lookup(path);
            l.key_span.unwrap_or(l.node.span)
        })
    }

    /// Whether a resource of this kind, namespace and name failed to load.
    pub fn failed(&self, kind: ResourceKind, namespace: &str, name: &str) -> bool {
        self.failed
            .iter()
            .any(|(k, ns, n)| *k == kind && &**ns == namespace && &**n == name)
    }

    /// Whether any resource of this namespace failed to load.
    pub fn namespace_failed(&self, namespace: &str) -> bool {
        self.failed.iter().any(|(_, ns, _)| &**ns == namespace)
    }

    /// The node at `path`, when the whole path exists.
    pub fn node(&self, doc: usize, path: &FieldPath) -> Option<&Node> {
        self.root(doc)
            .map(|r| r.lookup(path))
            .filter(|l| l.complete)
            .map(|l| l.node)
    }
}

/// Parses and loads every document of every source.
pub fn load(sources: &Sources, diags: &mut Vec<Diagnostic>) -> Bundle {
    let mut bundle = Bundle::default();
    for (id, file) in sources.iter() {
        bundle.docs.extend(yaml::parse_documents(id, file, diags));
    }
    let mut seen: Vec<(ResourceKind, Arc<str>, Arc<str>, Span)> = Vec::new();
    // Specs deserialize from the documents in place: hold them apart from the lists they fill.
    let docs = std::mem::take(&mut bundle.docs);
    for (doc, d) in docs.iter().enumerate() {
        let root = &d.root;
        let name: Arc<str> = root
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Node::as_str)
            .unwrap_or("")
            .into();
        let namespace: Arc<str> = root
            .get("metadata")
            .and_then(|m| m.get("namespace"))
            .and_then(Node::as_str)
            .unwrap_or(DEFAULT_NAMESPACE)
            .into();
        let Some(kind) = check_header(root, diags) else {
            if let Some(kind) = root
                .get("kind")
                .and_then(Node::as_str)
                .and_then(ResourceKind::parse)
            {
                bundle.failed.push((kind, namespace, name));
            }
            continue;
        };
        let text = sources.get(d.file).map_or("", |f| &*f.text);
        let errors = schema_check::validate(kind, root, text);
        let resource = describe(kind, root);
        if !errors.is_empty() {
            diags.extend(
                errors
                    .into_iter()
                    .map(|d| d.with_resource(resource.clone())),
            );
            bundle.failed.push((kind, namespace, name));
            continue;
        }
        let name_span = root.lookup(&crate::fpath!["metadata", "name"]).node.span;
        if let Some((_, _, _, first)) = seen
            .iter()
            .find(|(k, ns, n, _)| *k == kind && *ns == namespace && *n == name)
        {
            diags.push(
                Diagnostic::new(
                    Code::DuplicateResource,
                    format!("duplicate {kind} `{namespace}/{name}`"),
                )
                .at(name_span, "defined again here")
                .with_related(*first, "first defined here")
                .with_help("rename one of them, or remove the copy")
                .with_resource(resource.clone()),
            );
            continue;
        }
        seen.push((kind, namespace.clone(), name.clone(), name_span));
        let spec = root.get("spec").unwrap_or(&NULL);
        let root_span = root.span;
        let ok = match kind {
            ResourceKind::InferenceWorkerSet => {
                push(&mut bundle.worker_sets, spec, &name, &namespace, doc)
            }
            ResourceKind::InferenceProvider => {
                push(&mut bundle.providers, spec, &name, &namespace, doc)
            }
            ResourceKind::InferencePool => push(&mut bundle.pools, spec, &name, &namespace, doc),
            ResourceKind::InferencePolicy => {
                push(&mut bundle.policies, spec, &name, &namespace, doc)
            }
            ResourceKind::GatewayBackend => {
                push(&mut bundle.gateways, spec, &name, &namespace, doc)
            }
        };
        if let Err(e) = ok {
            bundle.failed.push((kind, namespace, name));
            diags.push(spec_error(&e, root_span).with_resource(resource));
        }
    }
    bundle.docs = docs;
    bundle
}

/// `spec` when a document has none (the schema requires one: only reached after an error).
static NULL: Node = Node {
    value: yaml::Value::Null,
    span: Span {
        file: crate::source::FileId(0),
        start: 0,
        end: 0,
    },
    style: yaml::Style::Plain,
};

/// Deserializes the typed spec straight from the YAML tree (as `serde_json::from_value` of
/// its JSON form would, with the same error messages).
fn push<T: DeserializeOwned>(
    list: &mut Vec<Res<T>>,
    spec: &Node,
    name: &Arc<str>,
    namespace: &Arc<str>,
    doc: usize,
) -> Result<(), crate::yaml_view::Error> {
    let spec = crate::yaml_view::from_node(spec)?;
    list.push(Res {
        name: name.clone(),
        namespace: namespace.clone(),
        spec,
        doc,
    });
    Ok(())
}

/// A spec that passed the schema but does not deserialize (the schema bounds what it can, so
/// this is a fallback): reported at the field that failed, by its path, in the user's terms
/// where the error is a known one.
fn spec_error(e: &crate::yaml_view::Error, root_span: Span) -> Diagnostic {
    let path = FieldPath(
        std::iter::once(crate::path::Seg::Key("spec".into()))
            .chain(e.path().0)
            .collect(),
    );
    let msg = e.message();
    let (code, message, label) = if let Some((value, ty)) = msg
        .strip_prefix("invalid value: integer `")
        .and_then(|rest| rest.split_once("`, expected "))
        && let Some((min, max)) = integer_range(ty)
    {
        (
            Code::OutOfRange,
            format!("`{path}` must be an integer from {min} to {max}, found {value}"),
            "out of range",
        )
    } else if let Some((value, ty)) = msg
        .strip_prefix("invalid type: floating point `")
        .and_then(|rest| rest.split_once("`, expected "))
        && integer_range(ty).is_some()
    {
        (
            Code::WrongType,
            format!("`{path}` must be an integer, found {value}"),
            "not an integer",
        )
    } else {
        let code = if msg.starts_with("invalid type") {
            Code::WrongType
        } else if msg.starts_with("missing field") {
            Code::MissingField
        } else {
            Code::InvalidValue
        };
        (code, format!("invalid `{path}`: {msg}"), "invalid")
    };
    Diagnostic::new(code, message)
        .at(e.span().unwrap_or(root_span), label)
        .with_path(path)
}

/// The range of a Rust integer type, as serde names it in its errors.
fn integer_range(ty: &str) -> Option<(i128, i128)> {
    Some(match ty {
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" => (i64::MIN.into(), i64::MAX.into()),
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" => (0, u64::MAX.into()),
        _ => return None,
    })
}

/// `Kind/namespace/name` for messages and status.
pub fn describe(kind: ResourceKind, root: &Node) -> String {
    let meta = root.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Node::as_str)
        .unwrap_or("?");
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Node::as_str)
        .unwrap_or(DEFAULT_NAMESPACE);
    format!("{kind}/{ns}/{name}")
}

/// Checks `apiVersion` and `kind`; returns the kind when the document is a Kinference resource.
fn check_header(root: &Node, diags: &mut Vec<Diagnostic>) -> Option<ResourceKind> {
    if !matches!(root.value, yaml::Value::Map(_)) {
        diags.push(
            Diagnostic::new(
                Code::NotAMapping,
                format!(
                    "a resource must be a mapping, found {}",
                    root.value.type_name()
                ),
            )
            .at(root.span, "not a mapping")
            .with_help(
                "each YAML document holds one resource: `apiVersion`, `kind`, `metadata`, `spec`",
            ),
        );
        return None;
    }
    let kinds: Vec<&str> = ResourceKind::ALL.iter().map(|k| k.as_str()).collect();
    let kind = match root.entry("kind") {
        None => {
            diags.push(
                Diagnostic::new(Code::UnknownKind, "missing `kind`")
                    .at(root.span, "this document")
                    .with_help(format!("add `kind:` with one of: `{}`", kinds.join("`, `"))),
            );
            None
        }
        Some(e) => match e.value.as_str().and_then(ResourceKind::parse) {
            Some(k) => Some(k),
            None => {
                let text = e.value.as_str().unwrap_or("");
                diags.push(
                    Diagnostic::new(
                        Code::UnknownKind,
                        format!("`{text}` is not a Kinference resource kind"),
                    )
                    .at(e.value.span, "unknown kind")
                    .with_help(help_for(text, kinds.iter().copied(), "kinds")),
                );
                None
            }
        },
    };
    match root.entry("apiVersion") {
        None => {
            diags.push(
                Diagnostic::new(Code::UnsupportedApiVersion, "missing `apiVersion`")
                    .at(
                        root.entry("kind").map_or(root.span, |e| e.key_span),
                        "in this resource",
                    )
                    .with_help(format!("add `apiVersion: {API_VERSION}`")),
            );
            None
        }
        Some(e) if e.value.as_str() == Some(API_VERSION) => kind,
        Some(e) => {
            let text = e.value.as_str().unwrap_or("");
            let help = if text.starts_with(GROUP) {
                format!("only `{API_VERSION}` is served; change the version after `{GROUP}/`")
            } else {
                format!("Kinference resources use `apiVersion: {API_VERSION}`")
            };
            diags.push(
                Diagnostic::new(
                    Code::UnsupportedApiVersion,
                    format!("unsupported apiVersion `{text}`"),
                )
                .at(e.value.span, "not supported")
                .with_help(help),
            );
            None
        }
    }
}
