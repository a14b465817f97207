//! Whole-bundle name resolution, type checking and lowering into a [`CompiledPolicy`].

use std::sync::Arc;
use std::time::Duration;

use ahash::{AHashMap, AHashSet};
use kinf_policy::{
    BackendType, ClassifierType, GatewayBackendSpec, InferencePolicySpec, OnEmpty, PiiEntity,
    Quantity, RequestMatch, Threshold, TokenCount,
};

use crate::bundle::{Bundle, Res};
use crate::codes::Code;
use crate::compiled::*;
use crate::diagnostic::Diagnostic;
use crate::fpath;
use crate::path::FieldPath;
use crate::source::{Sources, Span};
use crate::suggest::help_for;
use crate::{env, expr};

/// Default averaging window of load measures.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

pub(crate) struct Checker<'a> {
    pub bundle: &'a Bundle,
    pub sources: &'a Sources,
    pub diags: &'a mut Vec<Diagnostic>,
    /// Resource label (`Kind/ns/name`) per document.
    labels: AHashMap<usize, String>,
    /// Rules (document, path) whose lowering reported an error, or whose names could not all be
    /// resolved: the whole-pool analyses skip them rather than warn about a partial rule.
    pub(crate) broken_rules: AHashSet<(usize, FieldPath)>,
}

/// What lowering produced for one policy, before it is attached to pools.
struct LoweredPolicy {
    key: (i32, Arc<str>),
    pools: Vec<usize>,
    rules: Vec<(Arc<CompiledRule>, usize /*doc*/, FieldPath)>,
    limits: Vec<Arc<CompiledLimit>>,
}

impl<'a> Checker<'a> {
    pub fn new(bundle: &'a Bundle, sources: &'a Sources, diags: &'a mut Vec<Diagnostic>) -> Self {
        Checker {
            bundle,
            sources,
            diags,
            labels: AHashMap::new(),
            broken_rules: AHashSet::new(),
        }
    }

    fn label(&mut self, doc: usize, kind: &str, ns: &str, name: &str) {
        self.labels.insert(doc, format!("{kind}/{ns}/{name}"));
    }

    pub fn report(
        &mut self,
        doc: usize,
        path: &FieldPath,
        code: Code,
        msg: String,
        label: &str,
        help: Option<String>,
    ) {
        self.report_at(doc, path, false, code, msg, label, help);
    }

    pub(crate) fn report_key(
        &mut self,
        doc: usize,
        path: &FieldPath,
        code: Code,
        msg: String,
        label: &str,
        help: Option<String>,
    ) {
        self.report_at(doc, path, true, code, msg, label, help);
    }

    /// Reports on a list item that lacks a field: at the item's first key (one line), not over
    /// the whole item.
    fn report_item(
        &mut self,
        doc: usize,
        path: &FieldPath,
        code: Code,
        msg: String,
        label: &str,
        help: Option<String>,
    ) {
        let first_key = self.bundle.node(doc, path).and_then(|n| match &n.value {
            crate::yaml::Value::Map(entries) => entries.first().map(|e| e.key_span),
            _ => None,
        });
        self.report_at(doc, path, false, code, msg, label, help);
        if let (Some(span), Some(d)) = (first_key, self.diags.last_mut())
            && let Some((s, _)) = &mut d.primary
        {
            *s = span;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn report_at(
        &mut self,
        doc: usize,
        path: &FieldPath,
        key: bool,
        code: Code,
        msg: String,
        label: &str,
        help: Option<String>,
    ) {
        let span = if key {
            self.bundle.key_span(doc, path)
        } else {
            self.bundle.value_span(doc, path)
        };
        let mut d = Diagnostic::new(code, msg)
            .with_path(path.clone())
            .with_help_opt(help);
        if let Some(span) = span {
            d = d.at(span, label);
        }
        if let Some(l) = self.labels.get(&doc) {
            d = d.with_resource(l.clone());
        }
        self.diags.push(d);
    }

    /// The resource label (`Kind/ns/name`) of document `doc`, when it is known.
    pub(crate) fn resource_label(&self, doc: usize) -> Option<String> {
        self.labels.get(&doc).cloned()
    }

    pub(crate) fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// KINF0508: a request goes to the first front door naming its host, else to the first
    /// door naming no hosts. A later door naming a host an earlier one names never gets it,
    /// and a second door without `hosts` never gets anything: both are reported on the later
    /// door, naming the earlier one.
    fn check_overlapping_hosts(&mut self, doors: &[(usize, String, &Vec<String>)]) {
        let mut catch_all: Option<(usize, &str)> = None;
        let mut named: Vec<(String, usize, usize, &str)> = Vec::new();
        for &(doc, ref name, hosts) in doors {
            if hosts.is_empty() {
                match catch_all {
                    Some((first_doc, first)) => {
                        self.report_key(
                            doc,
                            &crate::fpath!["spec"],
                            Code::OverlappingHosts,
                            format!(
                                "front door `{name}` names no `hosts`, and neither does \
                                 `{first}`: requests for hosts that no door names all go to \
                                 `{first}`, so `{name}` serves nothing"
                            ),
                            "never used",
                            Some(
                                "give each front door its own `spec.hosts`; at most one may \
                                 leave them out"
                                    .into(),
                            ),
                        );
                        let span = self.bundle.key_span(first_doc, &crate::fpath!["spec"]);
                        self.relate_last(span, &format!("`{first}` answers every host"));
                    }
                    None => catch_all = Some((doc, name.as_str())),
                }
                continue;
            }
            for (i, h) in hosts.iter().enumerate() {
                let key = h.to_ascii_lowercase();
                if let Some((_, first_doc, first_i, first)) =
                    named.iter().find(|(k, ..)| *k == key).cloned()
                {
                    if first == name.as_str() {
                        continue;
                    }
                    self.report(
                        doc,
                        &crate::fpath!["spec", "hosts", i],
                        Code::OverlappingHosts,
                        format!(
                            "host `{h}` of front door `{name}` is also named by `{first}`: its \
                             requests go to `{first}`"
                        ),
                        "never used",
                        Some("name each host on one front door only".into()),
                    );
                    let span = self
                        .bundle
                        .value_span(first_doc, &crate::fpath!["spec", "hosts", first_i]);
                    self.relate_last(span, &format!("named by `{first}` first"));
                } else {
                    named.push((key, doc, i, name.as_str()));
                }
            }
        }
    }

    /// Adds a related span to the diagnostic reported last.
    pub(crate) fn relate_last(&mut self, span: Option<Span>, label: &str) {
        if let (Some(span), Some(d)) = (span, self.diags.last_mut()) {
            d.related.push((span, label.to_string()));
        }
    }

    fn error_count(&self) -> usize {
        self.diags
            .iter()
            .filter(|d| d.severity == crate::Severity::Error)
            .count()
    }

    fn source_ref(&self, doc: usize, path: &FieldPath) -> SourceRef {
        let span = self.bundle.key_span(doc, path);
        match span.and_then(|s| self.sources.locate(s)) {
            Some((file, line, _)) => SourceRef {
                file: file.into(),
                line: line as u32,
            },
            None => SourceRef {
                file: "<unknown>".into(),
                line: 0,
            },
        }
    }

    pub(crate) fn duration_pub(
        &mut self,
        doc: usize,
        path: &FieldPath,
        text: Option<&str>,
        default: Duration,
    ) -> Duration {
        self.duration(doc, path, text, default)
    }

    /// Like [`duration_pub`](Self::duration_pub) for a field where zero makes no sense (a
    /// timeout every request would hit, a polling interval): `0s` is KINF0201 and the default
    /// is used.
    pub(crate) fn positive_duration(
        &mut self,
        doc: usize,
        path: &FieldPath,
        text: Option<&str>,
        default: Duration,
        why: &str,
    ) -> Duration {
        let d = self.duration(doc, path, text, default);
        if !d.is_zero() {
            return d;
        }
        self.report(
            doc,
            path,
            Code::InvalidDuration,
            format!("`{}` is zero: {why}", text.unwrap_or("0s")),
            "zero",
            Some(format!(
                "write a duration above zero, or leave the field out for the default of {}",
                kinf_grammar::format_duration(default)
            )),
        );
        default
    }

    pub(crate) fn source_ref_pub(&self, doc: usize, path: &FieldPath) -> SourceRef {
        self.source_ref(doc, path)
    }

    fn duration(
        &mut self,
        doc: usize,
        path: &FieldPath,
        text: Option<&str>,
        default: Duration,
    ) -> Duration {
        let Some(text) = text else {
            return default;
        };
        match kinf_grammar::parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                self.sub_error(
                    doc,
                    path,
                    Code::InvalidDuration,
                    format!("invalid duration `{text}`: {}", e.message),
                    e.span.start,
                    e.span.end,
                    Some(e.help.unwrap_or_else(|| {
                        "write a duration such as `500ms`, `30s` or `1m30s`".into()
                    })),
                );
                default
            }
        }
    }

    /// Lowers the whole bundle.
    pub fn run(mut self) -> CompiledPolicy {
        let b = self.bundle;
        for r in &b.worker_sets {
            self.label(r.doc, "InferenceWorkerSet", &r.namespace, &r.name);
        }
        for r in &b.providers {
            self.label(r.doc, "InferenceProvider", &r.namespace, &r.name);
        }
        for r in &b.pools {
            self.label(r.doc, "InferencePool", &r.namespace, &r.name);
        }
        for r in &b.policies {
            self.label(r.doc, "InferencePolicy", &r.namespace, &r.name);
        }
        for r in &b.gateways {
            self.label(r.doc, "GatewayBackend", &r.namespace, &r.name);
        }

        let mut out = CompiledPolicy::default();
        crate::destinations::lower_destinations(&mut self, &mut out);
        self.lower_pools(&mut out);
        self.lower_gateways(&mut out);
        let mut lowered: Vec<LoweredPolicy> = Vec::new();
        for p in &b.policies {
            if let Some(l) = self.lower_policy(p, &out) {
                lowered.push(l);
            }
        }
        lowered.sort_by(|a, b| a.key.cmp(&b.key));
        let mut per_pool: Vec<Vec<(Arc<CompiledRule>, usize, FieldPath)>> =
            vec![Vec::new(); out.pools.len()];
        for l in lowered {
            for &pi in &l.pools {
                if let Some(pool) = out.pools.get_mut(pi) {
                    pool.limits.extend(l.limits.iter().cloned());
                }
                if let Some(list) = per_pool.get_mut(pi) {
                    list.extend(l.rules.iter().cloned());
                }
            }
        }
        for (pi, rules) in per_pool.into_iter().enumerate() {
            crate::analysis::check_pool_rules(&mut self, &out, pi, &rules);
            if let Some(pool) = out.pools.get_mut(pi) {
                pool.rules = rules.into_iter().map(|(r, _, _)| r).collect();
            }
        }
        out
    }

    fn lower_pools(&mut self, out: &mut CompiledPolicy) {
        let b = self.bundle;
        for p in &b.pools {
            let mut dests = Vec::new();
            for (i, d) in p.spec.destinations.iter().enumerate() {
                let path = fpath!["spec", "destinations", i, "name"];
                let backend = match d.kind {
                    kinf_policy::DestinationKind::InferenceWorkerSet => BackendType::Local,
                    kinf_policy::DestinationKind::InferenceProvider => BackendType::Provider,
                };
                let found = out.destinations.iter().find(|x| {
                    x.namespace == p.namespace && *x.name == d.name && x.backend == backend
                });
                match found {
                    Some(x) => {
                        if dests.contains(&x.id) {
                            self.report(
                                p.doc,
                                &path,
                                Code::UnknownDestination,
                                format!("destination `{}` is listed twice", d.name),
                                "listed again",
                                Some("remove the duplicate entry".into()),
                            );
                        } else {
                            dests.push(x.id);
                        }
                    }
                    None if self
                        .bundle
                        .failed(destination_kind(d.kind), &p.namespace, &d.name) => {}
                    None => {
                        let kind_name = format!("{:?}", d.kind);
                        let same_kind: Vec<&str> = out
                            .destinations
                            .iter()
                            .filter(|x| x.namespace == p.namespace && x.backend == backend)
                            .map(|x| &*x.name)
                            .collect();
                        let other = out
                            .destinations
                            .iter()
                            .find(|x| x.namespace == p.namespace && *x.name == d.name);
                        let help = match other {
                            Some(o) => format!(
                                "`{}` is an {}; set `kind: {}`",
                                d.name,
                                if o.backend == BackendType::Local {
                                    "InferenceWorkerSet"
                                } else {
                                    "InferenceProvider"
                                },
                                if o.backend == BackendType::Local {
                                    "InferenceWorkerSet"
                                } else {
                                    "InferenceProvider"
                                }
                            ),
                            None => help_for(
                                &d.name,
                                same_kind.iter().copied(),
                                &format!("{kind_name}s in namespace `{}`", p.namespace),
                            ),
                        };
                        self.report(
                            p.doc,
                            &path,
                            Code::UnknownDestination,
                            format!(
                                "{kind_name} `{}` not found in namespace `{}`",
                                d.name, p.namespace
                            ),
                            "does not resolve",
                            Some(help),
                        );
                    }
                }
            }
            let mut models: AHashMap<Arc<str>, ModelTargets> = AHashMap::new();
            for &id in &dests {
                if let Some(d) = out.destination(id) {
                    for m in &d.models {
                        for n in &m.client_names {
                            let e = models.entry(n.clone()).or_default();
                            if !e.iter().any(|(x, _)| *x == id) {
                                e.push((id, m.upstream.clone()));
                            }
                        }
                    }
                }
            }
            out.pools.push(CompiledPool {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                destinations: dests,
                models,
                rules: Vec::new(),
                limits: Vec::new(),
                source: self.source_ref(p.doc, &fpath!["metadata", "name"]),
            });
        }
    }

    fn lower_gateways(&mut self, out: &mut CompiledPolicy) {
        let b = self.bundle;
        // `(doc, namespace/name, hosts)` of each front door, in the order requests pick them.
        let mut doors: Vec<(usize, String, &Vec<String>)> = Vec::new();
        for g in &b.gateways {
            let pool = out
                .pools
                .iter()
                .position(|p| p.namespace == g.namespace && *p.name == g.spec.pool);
            let Some(pool) = pool else {
                if b.failed(
                    kinf_policy::ResourceKind::InferencePool,
                    &g.namespace,
                    &g.spec.pool,
                ) {
                    continue;
                }
                self.unknown_pool(
                    out,
                    g.doc,
                    &fpath!["spec", "pool"],
                    &g.spec.pool,
                    &g.namespace,
                );
                continue;
            };
            self.check_gateway(g);
            doors.push((g.doc, format!("{}/{}", g.namespace, g.name), &g.spec.hosts));
            out.gateways.push(CompiledGateway {
                namespace: g.namespace.clone(),
                name: g.name.clone(),
                pool,
                tags: classifier_tags(&g.spec),
                spec: g.spec.clone(),
            });
        }
        self.check_overlapping_hosts(&doors);
    }

    /// Reports a reference to a pool that is not in the bundle.
    fn unknown_pool(
        &mut self,
        out: &CompiledPolicy,
        doc: usize,
        path: &FieldPath,
        name: &str,
        namespace: &str,
    ) {
        let names: Vec<&str> = out
            .pools
            .iter()
            .filter(|p| &*p.namespace == namespace)
            .map(|p| &*p.name)
            .collect();
        self.report(
            doc,
            path,
            Code::UnknownPool,
            format!("InferencePool `{name}` not found in namespace `{namespace}`"),
            "does not resolve",
            Some(help_for(name, names.iter().copied(), "pools")),
        );
    }

    fn check_complexity_thresholds(
        &mut self,
        doc: usize,
        base: &FieldPath,
        c: &kinf_policy::ClassifierSpec,
        t: &kinf_policy::ComplexityThresholds,
    ) {
        let path = base.key("thresholds");
        if c.type_ != ClassifierType::Complexity {
            self.report_key(
                doc,
                &path,
                Code::InvalidValue,
                format!(
                    "classifier `{}` is not of type `Complexity`: `thresholds` has no effect",
                    c.name
                ),
                "ignored",
                Some("remove `thresholds`, or set `type: Complexity`".into()),
            );
            return;
        }
        for (key, v) in [
            ("tokens", &t.tokens),
            ("turns", &t.turns),
            ("codeLines", &t.code_lines),
            ("math", &t.math),
            ("steps", &t.steps),
            ("questions", &t.questions),
        ] {
            if let Some(v) = v
                && v.windows(2).any(|w| w[0] > w[1])
            {
                self.report(
                    doc,
                    &path.key(key),
                    Code::EmptyThreshold,
                    format!("`{key}` thresholds must not decrease: {v:?}"),
                    "decreasing",
                    Some("list the thresholds from the 1-point value up".into()),
                );
            }
        }
        let medium = t.medium_at.unwrap_or(2);
        let high = t.high_at.unwrap_or(5);
        if medium >= high {
            self.report(
                doc,
                &path,
                Code::EmptyThreshold,
                format!("`mediumAt` ({medium}) must be below `highAt` ({high})"),
                "levels overlap",
                Some("a score from `mediumAt` is medium and from `highAt` high".into()),
            );
        }
    }

    fn check_gateway(&mut self, g: &Res<GatewayBackendSpec>) {
        let mut names = AHashSet::new();
        for (i, c) in g.spec.classifiers.iter().enumerate() {
            let base = fpath!["spec", "classifiers", i];
            if !names.insert(c.name.clone()) {
                self.report(
                    g.doc,
                    &base.key("name"),
                    Code::InvalidValue,
                    format!("duplicate classifier name `{}`", c.name),
                    "repeated",
                    Some("give each classifier a unique name".into()),
                );
            }
            if c.type_ == ClassifierType::External && c.url.is_none() {
                self.report_key(
                    g.doc,
                    &base.key("type"),
                    Code::MissingField,
                    format!("classifier `{}` of type `External` needs `url`", c.name),
                    "external classifier",
                    Some("add `url:` with the classifier's HTTP endpoint".into()),
                );
            }
            self.positive_duration(
                g.doc,
                &base.key("timeout"),
                c.timeout.as_deref(),
                Duration::from_millis(50),
                "every request would time out",
            );
            if let Some(t) = &c.thresholds {
                self.check_complexity_thresholds(g.doc, &base, c, t);
            }
        }
        crate::classifier_fields::check(self, g.doc, &g.spec.classifiers);
        if let Some(t) = &g.spec.tenants
            && let Some(k) = &t.api_keys
            && k.secret_ref.is_some() == k.file.is_some()
        {
            self.report_key(
                g.doc,
                &fpath!["spec", "tenants", "apiKeys"],
                Code::CredentialSource,
                "`apiKeys` needs exactly one of `secretRef` and `file`".into(),
                if k.secret_ref.is_some() {
                    "both sources set"
                } else {
                    "no source"
                },
                Some(
                    "set `secretRef` (a Kubernetes Secret) or `file` (standalone mode), not both"
                        .into(),
                ),
            );
        }
        if let Some(l) = &g.spec.limits
            && let Some(q) = &l.max_body_bytes
        {
            let _ = self.quantity(
                g.doc,
                &fpath!["spec", "limits", "maxBodyBytes"],
                q,
                Unit::Count,
            );
        }
    }

    fn lower_policy(
        &mut self,
        p: &Res<InferencePolicySpec>,
        out: &CompiledPolicy,
    ) -> Option<LoweredPolicy> {
        let b = self.bundle;
        let policy_name: Arc<str> = format!("{}/{}", p.namespace, p.name).into();
        // Target pools.
        let mut pools = Vec::new();
        if p.spec.target_refs.is_empty() {
            pools.extend(
                out.pools
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.namespace == p.namespace)
                    .map(|(i, _)| i),
            );
            if pools.is_empty() && !b.namespace_failed(&p.namespace) {
                let at = if self
                    .bundle
                    .node(p.doc, &fpath!["metadata", "namespace"])
                    .is_some()
                {
                    fpath!["metadata", "namespace"]
                } else {
                    fpath!["metadata", "name"]
                };
                self.report(p.doc, &at, Code::UnusedPolicy,
                    format!("policy `{}` applies to no pool: namespace `{}` has no InferencePool", p.name, p.namespace),
                    "no InferencePool in this namespace",
                    Some(format!("add an InferencePool to namespace `{}`, or move the policy to the namespace of its pool", p.namespace)));
            }
        } else {
            for (i, t) in p.spec.target_refs.iter().enumerate() {
                crate::target_refs::check_group(self, p.doc, i, t);
                // A pool named twice would run the policy's rules twice for each request.
                if let Some(first) = p.spec.target_refs[..i]
                    .iter()
                    .position(|f| f.name == t.name)
                {
                    self.report(
                        p.doc,
                        &fpath!["spec", "targetRefs", i, "name"],
                        Code::InvalidValue,
                        format!("policy `{}` targets pool `{}` twice", p.name, t.name),
                        "targeted again here",
                        Some("remove the repeated entry of `targetRefs`".into()),
                    );
                    let first_span = self
                        .bundle
                        .value_span(p.doc, &fpath!["spec", "targetRefs", first, "name"]);
                    self.relate_last(first_span, "first targeted here");
                    continue;
                }
                match out
                    .pools
                    .iter()
                    .position(|x| x.namespace == p.namespace && *x.name == t.name)
                {
                    Some(pi) => pools.push(pi),
                    None if b.failed(
                        kinf_policy::ResourceKind::InferencePool,
                        &p.namespace,
                        &t.name,
                    ) => {}
                    None => self.unknown_pool(
                        out,
                        p.doc,
                        &fpath!["spec", "targetRefs", i, "name"],
                        &t.name,
                        &p.namespace,
                    ),
                }
            }
        }
        let mut scope = Scope::new(out, &pools);
        // A resource of the namespace failed to load: names it would have defined do not
        // resolve, and the error to fix is the one already reported.
        // The same holds when the policy targets no pool at all (already reported).
        scope.incomplete = b.namespace_failed(&p.namespace) || pools.is_empty();
        // Names first, in order (duplicates are a property of the whole list); then each rule
        // is lowered on its own, in parallel for large policies.
        let mut names: Vec<(Arc<str>, bool)> = Vec::with_capacity(p.spec.rules.len());
        // The index of the first rule of each name (its path is built only for a duplicate).
        let mut seen: AHashMap<&str, usize> = AHashMap::new();
        for (i, rule) in p.spec.rules.iter().enumerate() {
            let errors_before = self.error_count();
            let name: Arc<str> = match &rule.name {
                Some(n) => {
                    if let Some(&first) = seen.get(n.as_str()) {
                        let base = fpath!["spec", "rules", i];
                        let first_span = self
                            .bundle
                            .value_span(p.doc, &fpath!["spec", "rules", first, "name"]);
                        let span = self.bundle.value_span(p.doc, &base.key("name"));
                        let mut d = Diagnostic::new(Code::DuplicateRuleName, format!("duplicate rule name `{n}` in policy `{}`", p.name))
                            .with_path(base.key("name"))
                            .with_help("rule names identify decisions in traces, metrics and reject messages: make them unique");
                        if let Some(s) = span {
                            d = d.at(s, "used again here");
                        }
                        if let Some(s) = first_span {
                            d = d.with_related(s, "first used here");
                        }
                        self.push(d);
                    } else {
                        seen.insert(n.as_str(), i);
                    }
                    self.check_name(p, &fpath!["spec", "rules", i, "name"], "rule", i, n);
                    n.as_str().into()
                }
                None => {
                    self.report_item(p.doc, &fpath!["spec", "rules", i], Code::MissingRuleName,
                        format!("rule {} of policy `{}` has no name", i + 1, p.name), "rule without `name`",
                        Some("add `name:`; rule names appear in decisions, metrics and reject messages".into()));
                    format!("rule-{}", i + 1).into()
                }
            };
            names.push((name, self.error_count() > errors_before));
        }
        let rules = self.lower_rules(p, &policy_name, names, &scope);
        let mut limits = Vec::new();
        let mut limit_names: AHashMap<String, FieldPath> = AHashMap::new();
        for (i, l) in p.spec.limits.iter().enumerate() {
            let base = fpath!["spec", "limits", i];
            if let Some(first) = limit_names.get(&l.name) {
                let first_span = self.bundle.value_span(p.doc, first);
                self.report(p.doc, &base.key("name"), Code::DuplicateLimitName,
                    format!("duplicate limit name `{}` in policy `{}`", l.name, p.name), "used again",
                    Some("limit names appear in 429 responses and metrics: make them unique within the policy".into()));
                self.relate_last(first_span, "first used here");
            } else {
                limit_names.insert(l.name.clone(), base.key("name"));
            }
            self.check_name(p, &base.key("name"), "limit", i, &l.name);
            if l.name.contains('/') {
                self.report(
                    p.doc,
                    &base.key("name"),
                    Code::InvalidValue,
                    format!(
                        "limit name `{}` in policy `{}` contains `/`",
                        l.name, p.name
                    ),
                    "`/` in a limit name",
                    Some(
                        "a limit is known as `policy/limit` (`namespace/policy/limit` outside \
                         `default`) in responses and in the key of its budgets: a `/` of its own \
                         could make two limits one. Use `-` or `.` instead"
                            .into(),
                    ),
                );
            }
            if l.tokens_per_minute.is_none()
                && l.requests_per_minute.is_none()
                && l.concurrent_requests.is_none()
            {
                self.report(
                    p.doc,
                    &base,
                    Code::EmptyThreshold,
                    format!("limit `{}` sets no bound", l.name),
                    "no bound",
                    Some(
                        "set `tokensPerMinute`, `requestsPerMinute` or `concurrentRequests`".into(),
                    ),
                );
            }
            let condition = l
                .matches
                .as_ref()
                .and_then(|m| self.request_cond(p.doc, &base.key("matches"), m, &scope));
            // Budgets are keyed by this name in a store every pool shares: outside `default`
            // it carries the namespace, or `team-a/p`'s and `team-b/p`'s limits of one name
            // would spend one budget. (Names hold no `/`, so the forms cannot collide.)
            let name = if &*p.namespace == "default" {
                format!("{}/{}", p.name, l.name)
            } else {
                format!("{}/{}/{}", p.namespace, p.name, l.name)
            };
            limits.push(Arc::new(CompiledLimit {
                name: name.into(),
                condition,
                tokens_per_minute: l.tokens_per_minute,
                count: l.count.unwrap_or(TokenCount::Total),
                requests_per_minute: l.requests_per_minute,
                concurrent_requests: l.concurrent_requests,
                when_exceeded: l.when_exceeded.unwrap_or_default(),
            }));
        }
        Some(LoweredPolicy {
            key: (p.spec.priority.unwrap_or(0), policy_name),
            pools,
            rules,
            limits,
        })
    }

    /// Checks the name of rule or limit `i` of policy `p` (`what`): it is sent in HTTP headers
    /// (`x-kinference-rule`), reject messages and metric labels, so it must be non-empty
    /// printable ASCII ([`valid_name`]).
    fn check_name(
        &mut self,
        p: &Res<InferencePolicySpec>,
        path: &FieldPath,
        what: &str,
        i: usize,
        name: &str,
    ) {
        let Err(problem) = valid_name(name) else {
            return;
        };
        let code = if name.is_empty() && what == "rule" {
            Code::MissingRuleName
        } else {
            Code::InvalidValue
        };
        let msg = if name.is_empty() {
            format!("{what} {} of policy `{}` has an empty name", i + 1, p.name)
        } else {
            format!(
                "{what} name \"{}\" in policy `{}` {problem}",
                name.escape_debug(),
                p.name
            )
        };
        self.report(
            p.doc,
            path,
            code,
            msg,
            "invalid name",
            Some(format!(
                "a {what} name appears in HTTP responses (headers and reject messages) and in \
                 metric labels: write 1 to {MAX_NAME_LEN} printable ASCII characters (letters, \
                 digits, punctuation, inner spaces), e.g. `{}`",
                if what == "rule" {
                    "batch-to-idle-gpus"
                } else {
                    "tokens-per-tenant"
                }
            )),
        );
    }

    /// Lowers every rule of `p` (their names and name errors already settled), in order.
    /// Policies with many rules are split into contiguous chunks lowered on scoped threads,
    /// each with its own diagnostics; the chunks' diagnostics and broken rules are appended in
    /// rule order, so the result is the same as lowering them one after the other.
    fn lower_rules(
        &mut self,
        p: &Res<InferencePolicySpec>,
        policy_name: &Arc<str>,
        names: Vec<(Arc<str>, bool)>,
        scope: &Scope,
    ) -> Vec<(Arc<CompiledRule>, usize, FieldPath)> {
        let n = names.len();
        let threads = lowering_threads(n);
        let items: Vec<(usize, (Arc<str>, bool))> = names.into_iter().enumerate().collect();
        if threads <= 1 {
            return items
                .into_iter()
                .map(|(i, (name, name_error))| {
                    self.lower_rule(p, policy_name, i, name, name_error, scope)
                })
                .collect();
        }
        let chunk = n.div_ceil(threads);
        let (bundle, sources, labels) = (self.bundle, self.sources, &self.labels);
        let lower_chunk = |part: &[(usize, (Arc<str>, bool))]| {
            let mut diags = Vec::new();
            let mut sub = Checker {
                bundle,
                sources,
                diags: &mut diags,
                labels: labels.clone(),
                broken_rules: AHashSet::new(),
            };
            let rules: Vec<_> = part
                .iter()
                .map(|(i, (name, name_error))| {
                    sub.lower_rule(p, policy_name, *i, name.clone(), *name_error, scope)
                })
                .collect();
            let broken = std::mem::take(&mut sub.broken_rules);
            (rules, diags, broken)
        };
        let parts: Vec<_> = std::thread::scope(|s| {
            let mut chunks = items.chunks(chunk);
            // The first chunk runs on this thread, the others on scoped threads.
            let first = chunks.next().unwrap_or(&[]);
            let handles: Vec<_> = chunks.map(|c| s.spawn(move || lower_chunk(c))).collect();
            let mut parts = vec![lower_chunk(first)];
            for h in handles {
                match h.join() {
                    Ok(part) => parts.push(part),
                    // A panic in lowering is a bug; re-raise it on the caller's thread.
                    Err(e) => std::panic::resume_unwind(e),
                }
            }
            parts
        });
        let mut rules = Vec::with_capacity(n);
        for (r, diags, broken) in parts {
            rules.extend(r);
            self.diags.extend(diags);
            self.broken_rules.extend(broken);
        }
        rules
    }

    /// Lowers rule `i` of `p`; `name_error`: its name was reported (missing or duplicate).
    fn lower_rule(
        &mut self,
        p: &Res<InferencePolicySpec>,
        policy_name: &Arc<str>,
        i: usize,
        name: Arc<str>,
        name_error: bool,
        scope: &Scope,
    ) -> (Arc<CompiledRule>, usize, FieldPath) {
        let rule = &p.spec.rules[i];
        let base = fpath!["spec", "rules", i];
        let errors_before = self.error_count();
        let matches_path = base.key("matches");
        let matches = rule
            .matches
            .iter()
            .enumerate()
            .filter_map(|(j, m)| self.request_cond(p.doc, &matches_path.index(j), m, scope))
            .collect();
        let route = &rule.route;
        let route_path = base.key("route");
        let consider_path = route_path.key("consider");
        let consider = route
            .consider
            .iter()
            .enumerate()
            .map(|(j, c)| self.consider(p.doc, &consider_path.index(j), c, scope))
            .collect();
        let exclude = self.filters(p.doc, &route_path.key("exclude"), &route.exclude, scope);
        let select = self.tiers(p.doc, &route_path.key("select"), &route.select, scope);
        let on_empty = route.on_empty.unwrap_or(OnEmpty::Reject);
        let reject_message = self.reject_message(p.doc, &route_path, route, on_empty);
        let compiled = CompiledRule {
            policy: policy_name.clone(),
            name,
            matches,
            consider,
            exclude,
            select,
            on_empty,
            reject_message,
            source: self.source_ref(p.doc, &base.key("name")),
        };
        if scope.incomplete || name_error || self.error_count() > errors_before {
            self.broken_rules.insert((p.doc, base.clone()));
        }
        (Arc::new(compiled), p.doc, base)
    }

    /// A rule's `route.rejectMessage`: refused (KINF0106) with a control character (the
    /// length is the schema's), not read (KINF0410) with `onEmpty: NextRule`.
    fn reject_message(
        &mut self,
        doc: usize,
        route_path: &FieldPath,
        route: &kinf_policy::Route,
        on_empty: OnEmpty,
    ) -> Option<Arc<str>> {
        let msg = route.reject_message.as_deref()?;
        let path = route_path.key("rejectMessage");
        if let Some(c) = msg.chars().find(|c| c.is_control()) {
            self.report(
                doc,
                &path,
                Code::InvalidValue,
                format!(
                    "`rejectMessage` contains the control character {:?}: it is sent to \
                     clients in an error message, on one line",
                    c
                ),
                "control character",
                Some("write the message on one line, without tabs or control characters".into()),
            );
            return None;
        }
        if on_empty == OnEmpty::NextRule {
            self.report_key(
                doc,
                &path,
                Code::IgnoredField,
                "`rejectMessage` is not read: with `onEmpty: NextRule` this rule never rejects"
                    .into(),
                "not read",
                Some(
                    "remove `rejectMessage`, or set `onEmpty: Reject` if the rule should fail \
                     closed"
                        .into(),
                ),
            );
        }
        Some(Arc::from(msg))
    }

    pub(crate) fn request_cond(
        &mut self,
        doc: usize,
        path: &FieldPath,
        m: &RequestMatch,
        scope: &Scope,
    ) -> Option<RequestCond> {
        let mut c = RequestCond::default();
        // The condition's text, its parts joined by ` and ` (written in place, no part strings).
        let mut text = String::new();
        if let Some(model) = &m.model {
            // The path only for a diagnostic.
            let mp = || path.key("model");
            if model.contains(['*', '?', '[']) {
                match kinf_grammar::Glob::parse(model) {
                    Ok(g) => {
                        if !scope.incomplete && !scope.model_names.iter().any(|n| g.matches(n)) {
                            let mut names: Vec<&str> =
                                scope.model_names.iter().map(|s| &**s).collect();
                            names.sort_unstable();
                            self.report(doc, &mp(), Code::UnknownModel,
                                format!("model glob `{model}` matches no model served by the targeted pools"),
                                "matches nothing", Some(help_for(model, names.iter().copied(), "models served")));
                        }
                        c.model = Some(ModelPattern::Glob(g));
                    }
                    Err(e) => {
                        self.sub_error(
                            doc,
                            &mp(),
                            Code::InvalidGlob,
                            format!("invalid model glob `{model}`: {}", e.message),
                            e.span.start,
                            e.span.end,
                            e.help,
                        );
                    }
                }
            } else {
                if !scope.incomplete && !scope.model_names.contains(model.as_str()) {
                    self.check_model(doc, &mp(), model, scope);
                }
                c.model = Some(ModelPattern::Exact(model.as_str().into()));
            }
            join_part(&mut text, format_args!("model == {model}"));
        }
        if let Some(tag) = &m.tag {
            if !scope.tags.contains(tag.as_str()) {
                self.unknown_tag(doc, &path.key("tag"), tag, scope);
            }
            c.tag = Some(tag.as_str().into());
            join_part(&mut text, format_args!("tag {tag}"));
        }
        if let Some(t) = &m.tenant {
            c.tenant = Some(t.as_str().into());
            join_part(&mut text, format_args!("tenant == {t}"));
        }
        if let Some(q) = m.qos {
            c.qos = Some(q);
            join_part(&mut text, format_args!("qos == {}", q.as_str()));
        }
        if let Some(t) = &m.prompt_tokens {
            c.prompt_tokens = self.range(doc, &path.key("promptTokens"), t, Unit::Count);
            if let Some(r) = &c.prompt_tokens {
                join_part(&mut text, format_args!("promptTokens {r}"));
            }
        }
        if let Some(h) = &m.header {
            if !valid_header_name(&h.name) {
                self.report(
                    doc,
                    &path.key("header").key("name"),
                    Code::InvalidValue,
                    format!(
                        "{:?} is not an HTTP header name: no request has such a header, so \
                         the condition never holds",
                        h.name
                    ),
                    "not a header name",
                    Some(
                        "write the header's name alone, e.g. `x-team`: letters, digits and \
                         punctuation such as `-`, without spaces, `:` or the value"
                            .into(),
                    ),
                );
            }
            c.header = Some((h.name.to_ascii_lowercase().into(), h.value.as_str().into()));
            join_part(
                &mut text,
                format_args!("header {}: {}", h.name.to_ascii_lowercase(), h.value),
            );
        }
        if let Some(w) = &m.when {
            let wp = path.key("when");
            c.when = expr::check(self, doc, &wp, w, env::request_env(), scope);
            if let Some(e) = &c.when {
                crate::constant_when::check_request_when(self, doc, &wp, e.expr());
                join_part(&mut text, format_args!("when {e}"));
            }
        }
        c.text = if text.is_empty() {
            "any request".into()
        } else {
            text.into()
        };
        Some(c)
    }

    pub(crate) fn unknown_tag(&mut self, doc: usize, path: &FieldPath, tag: &str, scope: &Scope) {
        if scope.incomplete {
            return;
        }
        self.report(
            doc,
            path,
            Code::UnknownTag,
            format!("no configured classifier produces tag `{tag}`"),
            "never set",
            Some(scope.unknown_tag_help(tag)),
        );
    }

    fn check_model(&mut self, doc: usize, path: &FieldPath, model: &str, scope: &Scope) {
        if !scope.incomplete && !scope.model_names.contains(model) {
            let mut names: Vec<&str> = scope.model_names.iter().map(|s| &**s).collect();
            names.sort_unstable();
            self.report(
                doc,
                path,
                Code::UnknownModel,
                format!("no destination of the targeted pools serves model `{model}`"),
                "unknown model",
                Some(help_for(model, names.iter().copied(), "models served")),
            );
        }
    }

    fn destination(
        &mut self,
        doc: usize,
        path: &FieldPath,
        name: &str,
        scope: &Scope,
        backend: Option<BackendType>,
    ) -> Option<DestId> {
        let found = scope.dest_named(name);
        match found {
            Some((_, id, b)) => {
                if let Some(want) = backend
                    && *b != want
                {
                    self.report(
                        doc,
                        path,
                        Code::UnreachableTier,
                        format!(
                            "`{name}` is a {} destination, not {}",
                            b.as_str(),
                            want.as_str()
                        ),
                        "never selected here",
                        Some(format!(
                            "remove `{name}`, or change `type` to `{}`",
                            b.as_str()
                        )),
                    );
                }
                Some(*id)
            }
            None if scope.incomplete => None,
            None => {
                let names: Vec<&str> = scope.dests.iter().map(|(n, _, _)| &**n).collect();
                self.report(
                    doc,
                    path,
                    Code::UnknownDestination,
                    format!("no destination named `{name}` in the targeted pools"),
                    "does not resolve",
                    Some(help_for(name, names.iter().copied(), "destinations")),
                );
                None
            }
        }
    }

    fn consider(
        &mut self,
        doc: usize,
        path: &FieldPath,
        c: &kinf_policy::Consider,
        scope: &Scope,
    ) -> ConsiderEntry {
        let mut e = ConsiderEntry {
            backend: c.type_,
            ..Default::default()
        };
        if let Some(ms) = &c.models {
            let mut v = Vec::new();
            for (i, n) in ms.names.iter().enumerate() {
                // The path only for a model that `check_model` reports.
                if !scope.incomplete && !scope.model_names.contains(n.as_str()) {
                    self.check_model(doc, &path.key("models").key("names").index(i), n, scope);
                }
                v.push(Arc::from(n.as_str()));
            }
            e.models = Some(v);
        }
        if let Some(d) = &c.destination {
            e.destination = self.destination(doc, &path.key("destination"), d, scope, None);
        }
        e
    }

    fn filters(
        &mut self,
        doc: usize,
        path: &FieldPath,
        filters: &[kinf_policy::ExcludeFilter],
        scope: &Scope,
    ) -> Vec<ExcludeFilter> {
        let mut out = Vec::new();
        // The index of the first filter of each name (its path is built only for a duplicate).
        let mut names: AHashMap<&str, usize> = AHashMap::new();
        for (i, f) in filters.iter().enumerate() {
            let fp = path.index(i);
            let name: Arc<str> = match &f.name {
                Some(n) => {
                    if let Some(&first) = names.get(n.as_str()) {
                        let first_span =
                            self.bundle.value_span(doc, &path.index(first).key("name"));
                        self.report(doc, &fp.key("name"), Code::FilterName,
                            format!("duplicate exclude filter name `{n}`"), "used again",
                            Some("give each filter of a rule a unique name; traces name the filter that dropped a candidate".into()));
                        self.relate_last(first_span, "first used here");
                    } else {
                        names.insert(n.as_str(), i);
                    }
                    n.as_str().into()
                }
                None => {
                    self.report_item(
                        doc,
                        &fp,
                        Code::FilterName,
                        format!("exclude filter {} has no name", i + 1),
                        "filter without `name`",
                        Some("add `name:`; traces name the filter that dropped a candidate".into()),
                    );
                    format!("filter-{}", i + 1).into()
                }
            };
            let condition = f
                .if_
                .as_ref()
                .and_then(|m| self.request_cond(doc, &fp.key("if"), m, scope));
            // `duration` reads the path only for a written window.
            let window = match f.window.as_deref() {
                Some(w) => self.duration(doc, &fp.key("window"), Some(w), DEFAULT_WINDOW),
                None => DEFAULT_WINDOW,
            };
            let Some(d) = &f.drop else {
                let at = if f.name.is_some() {
                    fp.key("name")
                } else {
                    fp.clone()
                };
                self.report(doc, &at, Code::MissingDrop, format!("exclude filter `{name}` has no `drop`"), "no `drop`",
                    Some("add `drop:` with the condition a candidate must meet to be dropped, e.g. `drop: { queuedPrompts: { greaterThan: 2 } }`".into()));
                continue;
            };
            let dp = fp.key("drop");
            let mut drop = DropCond::default();
            let mut text = String::new();
            if let Some(b) = &d.backend {
                drop.backend = b.type_;
                if let Some(t) = b.type_ {
                    join_part(&mut text, format_args!("backend {}", t.as_str()));
                }
                if let Some(n) = &b.name {
                    drop.destination =
                        self.destination(doc, &dp.key("backend").key("name"), n, scope, None);
                    join_part(&mut text, format_args!("destination {n}"));
                }
                if b.type_.is_none() && b.name.is_none() {
                    self.report(doc, &dp.key("backend"), Code::EmptyDrop, "`backend` sets neither `type` nor `name`".into(), "empty",
                        Some("set `type: Local`, `type: Provider` or the `name` of a destination, or remove `backend`".into()));
                }
            }
            if let Some(t) = &d.queued_prompts {
                drop.queued_prompts = self.range(doc, &dp.key("queuedPrompts"), t, Unit::Count);
                if let Some(r) = drop.queued_prompts {
                    join_part(&mut text, format_args!("queuedPrompts {r}"));
                }
            }
            if let Some(t) = &d.running_prompts {
                drop.running_prompts = self.range(doc, &dp.key("runningPrompts"), t, Unit::Count);
                if let Some(r) = drop.running_prompts {
                    join_part(&mut text, format_args!("runningPrompts {r}"));
                }
            }
            if let Some(t) = &d.kv_cache_usage {
                drop.kv_cache_usage = self.range(doc, &dp.key("kvCacheUsage"), t, Unit::Ratio);
                drop.kv_cache_usage_percent = [&t.greater_than, &t.less_than]
                    .into_iter()
                    .any(|q| matches!(q, Some(Quantity::Text(t)) if t.trim_end().ends_with('%')));
                if let Some(r) = drop.kv_cache_usage {
                    join_part(&mut text, format_args!("kvCacheUsage {r}"));
                }
            }
            if let Some(t) = &d.predicted_ttft {
                drop.predicted_ttft = self.range(doc, &dp.key("predictedTTFT"), t, Unit::Seconds);
                if let Some(r) = drop.predicted_ttft {
                    join_part(&mut text, format_args!("predictedTTFT {r}s"));
                }
            }
            if let Some(w) = &d.when {
                let wp = dp.key("when");
                drop.when = expr::check(self, doc, &wp, w, env::endpoint_env(), scope);
                if let Some(e) = &drop.when {
                    let alone = d.backend.is_none()
                        && d.queued_prompts.is_none()
                        && d.running_prompts.is_none()
                        && d.kv_cache_usage.is_none()
                        && d.predicted_ttft.is_none();
                    // A filter whose `if` never holds never applies: KINF0412 says so at the
                    // `if`, and what its `drop` would do is moot.
                    let never_applies = condition
                        .as_ref()
                        .and_then(|c| c.when.as_ref())
                        .is_some_and(|w| crate::constant_when::constant(w.expr()) == Some(false));
                    if !never_applies {
                        crate::constant_when::check_drop_when(
                            self,
                            doc,
                            &wp,
                            &name,
                            e.expr(),
                            alone,
                            f.if_.is_some(),
                        );
                    }
                    let when_text: Arc<str> = e.to_string().into();
                    join_part(&mut text, format_args!("when {when_text}"));
                    drop.when_text = Some(when_text);
                }
            }
            let has_load = d.queued_prompts.is_some()
                || d.running_prompts.is_some()
                || d.kv_cache_usage.is_some();
            // A provider named in `backend.name` is as load-less as `type: Provider`.
            let named_provider = d
                .backend
                .as_ref()
                .and_then(|b| b.name.as_deref())
                .filter(|n| {
                    scope
                        .dest_named(n)
                        .is_some_and(|(_, _, b)| *b == BackendType::Provider)
                });
            if has_load && (drop.backend == Some(BackendType::Provider) || named_provider.is_some())
            {
                let measure = if d.queued_prompts.is_some() {
                    "queuedPrompts"
                } else if d.running_prompts.is_some() {
                    "runningPrompts"
                } else {
                    "kvCacheUsage"
                };
                let on = match named_provider {
                    Some(n) => format!("provider `{n}`, which reports none"),
                    None => "`Provider` backends, which report none".to_string(),
                };
                self.report_key(doc, &dp.key(measure), Code::MeasureUnavailable,
                    format!("filter `{name}` tests queue or KV-cache load on {on}; it never drops anything"),
                    "providers do not report this", Some("load measures exist for `Local` workers only; use `predictedTTFT` for providers".into()));
            }
            if d.backend.is_none()
                && d.queued_prompts.is_none()
                && d.running_prompts.is_none()
                && d.kv_cache_usage.is_none()
                && d.predicted_ttft.is_none()
                && d.when.is_none()
            {
                self.report(doc, &dp, Code::EmptyDrop, format!("`drop` of filter `{name}` has no condition: it would drop every candidate"),
                    "empty", Some("add a condition such as `backend: { type: Provider }` or `queuedPrompts: { greaterThan: 2 }`".into()));
                continue;
            }
            drop.text = text.into();
            out.push(ExcludeFilter {
                name,
                condition,
                drop,
                window,
            });
        }
        out
    }

    fn tiers(
        &mut self,
        doc: usize,
        path: &FieldPath,
        tiers: &[kinf_policy::SelectTier],
        scope: &Scope,
    ) -> Vec<SelectTier> {
        let mut out = Vec::new();
        for (i, t) in tiers.iter().enumerate() {
            let tp = path.index(i);
            let pick = match (&t.order, t.minimize) {
                (Some(_), Some(_)) => {
                    self.report(doc, &tp, Code::AmbiguousTier,
                        format!("select tier {} has both `order` and `minimize`", i + 1), "ambiguous tier",
                        Some("a tier picks either by a fixed `order` of destinations or by `minimize`; split it into two tiers".into()));
                    continue;
                }
                (Some(order), None) => {
                    let mut ids = Vec::new();
                    for (j, n) in order.iter().enumerate() {
                        if let Some(id) =
                            self.destination(doc, &tp.key("order").index(j), n, scope, t.type_)
                        {
                            ids.push(id);
                        }
                    }
                    Pick::Order(ids)
                }
                (None, m) => Pick::Minimize(m.unwrap_or(kinf_policy::Measure::PredictedTtft)),
            };
            let name_of = |id: DestId| scope.dest_name(id);
            out.push(SelectTier::new(t.type_, pick, name_of));
        }
        if out.is_empty() && tiers.is_empty() {
            out.push(SelectTier::new(
                None,
                Pick::Minimize(kinf_policy::Measure::PredictedTtft),
                |_| None,
            ));
        }
        out
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the span inside the value comes as start and end"
    )]
    fn sub_error(
        &mut self,
        doc: usize,
        path: &FieldPath,
        code: Code,
        msg: String,
        start: usize,
        end: usize,
        help: Option<String>,
    ) {
        let span = self.bundle.node(doc, path).map(|n| {
            let s = n.content_start();
            Span::new(
                n.span.file,
                s + start,
                (s + end)
                    .max(s + start + 1)
                    .min(n.span.end.max(s + start + 1)),
            )
        });
        let mut d = Diagnostic::new(code, msg)
            .with_path(path.clone())
            .with_help_opt(help);
        if let Some(s) = span {
            d = d.at(s, "here");
        }
        if let Some(l) = self.labels.get(&doc) {
            d = d.with_resource(l.clone());
        }
        self.diags.push(d);
    }

    fn quantity(&mut self, doc: usize, path: &FieldPath, q: &Quantity, unit: Unit) -> Option<f64> {
        let v = match q {
            Quantity::Number(n) => *n,
            Quantity::Text(t) => {
                let parsed = match unit {
                    Unit::Count => kinf_grammar::parse_quantity(t).map(|v| v as f64),
                    Unit::Ratio => kinf_grammar::parse_ratio(t),
                    Unit::Seconds => kinf_grammar::parse_duration(t).map(|d| d.as_secs_f64()),
                };
                match parsed {
                    Ok(v) => v,
                    Err(e) => {
                        let what = match unit {
                            Unit::Count => "a count such as `8000` or `16Ki`",
                            Unit::Ratio => "a ratio such as `0.7` or `70%`",
                            Unit::Seconds => "a duration such as `2s` or `500ms`",
                        };
                        let noun = match unit {
                            Unit::Count => "count",
                            Unit::Ratio => "ratio",
                            Unit::Seconds => "duration",
                        };
                        self.sub_error(
                            doc,
                            path,
                            Code::InvalidQuantity,
                            format!("invalid {noun} `{t}`: {}", e.message),
                            e.span.start,
                            e.span.end,
                            Some(e.help.unwrap_or_else(|| format!("write {what}"))),
                        );
                        return None;
                    }
                }
            }
        };
        if !v.is_finite() || v < 0.0 {
            self.report(
                doc,
                path,
                Code::OutOfRange,
                format!(
                    "`{}` must be a non-negative number, found {v}",
                    path.last_key().unwrap_or("value")
                ),
                "out of range",
                Some(
                    "thresholds are counts, ratios or durations: write a value of 0 or more".into(),
                ),
            );
            return None;
        }
        if unit == Unit::Ratio && v > 1.0 {
            self.report(
                doc,
                path,
                Code::OutOfRange,
                format!(
                    "`{}` is a fraction between 0 and 1, found {v}",
                    path.parent().last_key().unwrap_or("value")
                ),
                "must be within 0..1",
                Some(format!("write `{}` or `{}%`", v / 100.0, v)),
            );
            return None;
        }
        Some(v)
    }

    pub(crate) fn range(
        &mut self,
        doc: usize,
        path: &FieldPath,
        t: &Threshold,
        unit: Unit,
    ) -> Option<Range> {
        let field = path.last_key().unwrap_or("threshold").to_string();
        if t.greater_than.is_none() && t.less_than.is_none() {
            self.report(
                doc,
                path,
                Code::EmptyThreshold,
                format!("`{field}` sets neither `greaterThan` nor `lessThan`"),
                "no bound",
                Some("write e.g. `{ greaterThan: 2 }`".into()),
            );
            return None;
        }
        let gt = match &t.greater_than {
            Some(q) => Some(self.quantity(doc, &path.key("greaterThan"), q, unit)?),
            None => None,
        };
        let lt = match &t.less_than {
            Some(q) => Some(self.quantity(doc, &path.key("lessThan"), q, unit)?),
            None => None,
        };
        if let (Some(g), Some(l)) = (gt, lt)
            && g >= l
        {
            self.report(
                doc,
                path,
                Code::EmptyThreshold,
                format!("`{field}` can never hold: greater than {g} and less than {l}"),
                "empty interval",
                Some("`greaterThan` must be below `lessThan`".into()),
            );
            return None;
        }
        // Every measure a threshold tests (counts, tokens, durations, ratios) is at least 0.
        if let Some(l) = lt
            && l <= 0.0
        {
            self.report(
                doc,
                &path.key("lessThan"),
                Code::EmptyThreshold,
                format!("`{field}` can never be less than {l}: it is never negative"),
                "never holds",
                Some("use a positive bound, or remove the condition".into()),
            );
            return None;
        }
        if unit == Unit::Ratio && gt == Some(1.0) {
            self.report(
                doc,
                path,
                Code::EmptyThreshold,
                format!("`{field}` can never be greater than 1"),
                "never holds",
                Some(format!(
                    "`{field}` is at most 1 (100%): use a lower bound, e.g. `0.9` or `90%`"
                )),
            );
        }
        Some(Range {
            greater_than: gt,
            less_than: lt,
        })
    }
}

/// Whether `name` is an HTTP header name (RFC 9110 `token`: one or more letters, digits and
/// ``!#$%&'*+-.^_`|~``), which a request header can have.
pub fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The longest rule or limit name.
pub const MAX_NAME_LEN: usize = 253;

/// Whether a rule or limit name can be sent as it is in an HTTP header value and a metric
/// label: 1 to [`MAX_NAME_LEN`] printable ASCII characters (space to `~`), not starting or
/// ending with a space. Otherwise, what is wrong with it (the end of a sentence).
pub fn valid_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if let Some(c) = name.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(match c {
            '\n' | '\r' => "contains a line break",
            '\t' => "contains a tab",
            c if c.is_control() => "contains a control character",
            _ => "contains a character that is not ASCII",
        });
    }
    if name.starts_with(' ') || name.ends_with(' ') {
        return Err("starts or ends with a space");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("is longer than 253 characters");
    }
    Ok(())
}

/// Appends one part of a condition's text, after ` and ` when it is not the first.
fn join_part(text: &mut String, part: std::fmt::Arguments<'_>) {
    use std::fmt::Write as _;
    if !text.is_empty() {
        text.push_str(" and ");
    }
    // Writing to a `String` cannot fail.
    let _ = text.write_fmt(part);
}

/// Units of thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A count (tokens, prompts): numbers or `16Ki`.
    Count,
    /// A fraction 0..1: `0.7` or `70%`.
    Ratio,
    /// Seconds: numbers or `2s`.
    Seconds,
}

/// The resource kind a pool destination refers to.
fn destination_kind(k: kinf_policy::DestinationKind) -> kinf_policy::ResourceKind {
    match k {
        kinf_policy::DestinationKind::InferenceWorkerSet => {
            kinf_policy::ResourceKind::InferenceWorkerSet
        }
        kinf_policy::DestinationKind::InferenceProvider => {
            kinf_policy::ResourceKind::InferenceProvider
        }
    }
}

/// The tag the gateway sets on requests over a `whenExceeded: Tag` limit.
pub const OVER_LIMIT_TAG: &str = "over-limit";

/// Names visible to a policy: models, destinations and tags of its target pools.
/// Threads to lower `n` rules with: one below [`PARALLEL_RULES_MIN`], otherwise up to the
/// CPUs available (at most [`MAX_LOWERING_THREADS`], at least 128 rules each).
fn lowering_threads(n: usize) -> usize {
    #[cfg(test)]
    if let Some(t) = tests::FORCE_LOWERING_THREADS.with(|c| c.get()) {
        return t.clamp(1, n.max(1));
    }
    if n < PARALLEL_RULES_MIN {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .clamp(1, MAX_LOWERING_THREADS)
        .min(n / (PARALLEL_RULES_MIN / 2))
}

/// Policies with at least this many rules are lowered on several threads.
const PARALLEL_RULES_MIN: usize = 256;
/// The most threads lowering one policy's rules.
const MAX_LOWERING_THREADS: usize = 4;

pub(crate) struct Scope {
    pub model_names: AHashSet<Arc<str>>,
    /// The names the destinations send upstream (`servedModel`): served names and provider
    /// model ids.
    pub served_models: AHashSet<Arc<str>>,
    pub dests: Vec<(Arc<str>, DestId, BackendType)>,
    /// Index in `dests` of the first destination of each name (rules name destinations
    /// thousands of times: no scan of `dests` each time).
    dest_index: AHashMap<Arc<str>, usize>,
    /// Index in `dests` of each destination.
    id_index: AHashMap<DestId, usize>,
    pub tags: AHashSet<Arc<str>>,
    /// The bundle has no GatewayBackend: the gateway classifies every request with its
    /// default classifiers, whose tags are in `tags` (see [`default_classifier_tags`]).
    pub default_classifiers: bool,
    /// Some resource that could define names failed to load: unresolved names are not reported.
    pub incomplete: bool,
}

impl Scope {
    /// The first destination named `name` (as a scan of `dests` would find it).
    pub(crate) fn dest_named(&self, name: &str) -> Option<&(Arc<str>, DestId, BackendType)> {
        self.dest_index.get(name).and_then(|&i| self.dests.get(i))
    }

    /// The help of KINF0502 for `tag`: the closest tag produced (or the list of them), why
    /// the targeted pools have the tags they have, or that no classifier serves them.
    pub(crate) fn unknown_tag_help(&self, tag: &str) -> String {
        let mut known: Vec<&str> = self.tags.iter().map(|s| &**s).collect();
        known.sort_unstable();
        if known.iter().all(|t| *t == OVER_LIMIT_TAG) {
            // Only the gateway's own `over-limit`: no classifier at all.
            return "no GatewayBackend serving the targeted pools configures a classifier; add one under `spec.classifiers` (e.g. `type: Pii`)".to_string();
        }
        let help = help_for(tag, known.iter().copied(), "tags produced");
        if self.default_classifiers {
            format!(
                "{help} (the bundle has no GatewayBackend, so the gateway runs its default classifiers: `Pii` with every entity and `Complexity`)"
            )
        } else {
            help
        }
    }

    /// The name of destination `id`.
    fn dest_name(&self, id: DestId) -> Option<&str> {
        self.id_index
            .get(&id)
            .and_then(|&i| self.dests.get(i))
            .map(|(n, _, _)| &**n)
    }

    fn new(out: &CompiledPolicy, pools: &[usize]) -> Scope {
        let mut model_names = AHashSet::new();
        let mut served_models = AHashSet::new();
        let mut dests: Vec<(Arc<str>, DestId, BackendType)> = Vec::new();
        // Set by the gateway on requests over a `whenExceeded: Tag` limit.
        let mut tags: AHashSet<Arc<str>> = [Arc::from(OVER_LIMIT_TAG)].into_iter().collect();
        for &pi in pools {
            let Some(pool) = out.pools.get(pi) else {
                continue;
            };
            model_names.extend(pool.models.keys().cloned());
            for &id in &pool.destinations {
                if let Some(d) = out.destination(id)
                    && !dests.iter().any(|(_, x, _)| *x == id)
                {
                    dests.push((d.name.clone(), id, d.backend));
                    served_models.extend(d.models.iter().map(|m| m.upstream.clone()));
                }
            }
            for g in out.gateways.iter().filter(|g| g.pool == pi) {
                tags.extend(g.tags.iter().cloned());
            }
        }
        // Without any GatewayBackend the server classifies every request with its defaults
        // (one front door for all pools, `Classifiers::default()`).
        let default_classifiers = out.gateways.is_empty();
        if default_classifiers {
            tags.extend(default_classifier_tags());
        }
        let mut dest_index = AHashMap::with_capacity(dests.len());
        let mut id_index = AHashMap::with_capacity(dests.len());
        for (i, (name, id, _)) in dests.iter().enumerate() {
            dest_index.entry(name.clone()).or_insert(i);
            id_index.entry(*id).or_insert(i);
        }
        Scope {
            model_names,
            served_models,
            dests,
            dest_index,
            id_index,
            tags,
            default_classifiers,
            incomplete: false,
        }
    }
}

/// The tags the classifiers of a gateway backend can produce.
pub fn classifier_tags(spec: &GatewayBackendSpec) -> Vec<Arc<str>> {
    let mut tags: Vec<Arc<str>> = Vec::new();
    for c in &spec.classifiers {
        match c.type_ {
            ClassifierType::Pii => {
                let entities: &[PiiEntity] = if c.entities.is_empty() {
                    &PiiEntity::ALL
                } else {
                    &c.entities
                };
                tags.extend(pii_tags(entities));
            }
            ClassifierType::Complexity => tags.extend(COMPLEXITY_TAGS.map(Arc::from)),
            ClassifierType::External => {
                tags.extend(c.tags.iter().map(|t| Arc::from(t.as_str())));
                // Added when the classifier fails, unless it fails open. The built-in
                // classifiers cannot fail: their `failureTag` is never added (KINF0410).
                if c.failure_mode != Some(kinf_policy::FailureMode::FailOpen)
                    && let Some(t) = &c.failure_tag
                {
                    tags.push(t.as_str().into());
                }
            }
        }
    }
    tags.sort();
    tags.dedup();
    tags
}

/// The tags of the classifiers the gateway runs when the bundle has no GatewayBackend (the
/// server's `Classifiers::default()`): `Pii` with every entity, and `Complexity`.
pub fn default_classifier_tags() -> Vec<Arc<str>> {
    let mut tags: Vec<Arc<str>> = pii_tags(&PiiEntity::ALL).collect();
    tags.extend(COMPLEXITY_TAGS.map(Arc::from));
    tags.sort();
    tags
}

/// The tags of the `Complexity` classifier.
const COMPLEXITY_TAGS: [&str; 3] = ["complexity-low", "complexity-medium", "complexity-high"];

/// The tags of a `Pii` classifier detecting `entities`: `pii-detected` and `pii-<entity>`.
fn pii_tags(entities: &[PiiEntity]) -> impl Iterator<Item = Arc<str>> + '_ {
    std::iter::once(Arc::from("pii-detected")).chain(
        entities
            .iter()
            .map(|e| Arc::from(format!("pii-{}", e.as_str()))),
    )
}

#[cfg(test)]
#[allow(clippy::panic)] // Test assertions.
mod tests {
    use std::cell::Cell;

    thread_local! {
        /// Overrides [`super::lowering_threads`] on this thread (tests only).
        pub(super) static FORCE_LOWERING_THREADS: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// Compiles `text` with rules lowered on `threads` threads: the rendered diagnostics and
    /// the compiled policy's debug form.
    fn compile_with(text: &str, threads: usize) -> (Vec<String>, String) {
        FORCE_LOWERING_THREADS.with(|c| c.set(Some(threads)));
        let (sources, c) = crate::compile_str("bundle.yaml", text);
        FORCE_LOWERING_THREADS.with(|c| c.set(None));
        let diags = c
            .diagnostics
            .iter()
            .map(|d| d.render_plain(&sources))
            .collect();
        // The DAG as `kinfctl graph` prints it and every lowered rule (the policy's model maps
        // are hash maps, whose debug form is in no fixed order).
        let policy = c.policy.as_ref().map_or_else(String::new, |p| {
            p.pools
                .iter()
                .map(|pool| format!("{}\n{:?}\n", crate::dag::render_pool(pool, p), pool.rules))
                .collect()
        });
        (diags, policy)
    }

    /// Asserts `a == b`, showing where they first differ (the texts are megabytes long).
    fn same(a: &str, b: &str, threads: usize) {
        if let Some(i) = a.bytes().zip(b.bytes()).position(|(x, y)| x != y) {
            let from = i.saturating_sub(300);
            panic!(
                "{threads} threads: first difference at byte {i}:\n{}\n---- sequential:\n{}",
                &a[from..(i + 300).min(a.len())],
                &b[from..(i + 300).min(b.len())]
            );
        }
        assert_eq!(a.len(), b.len(), "{threads} threads: lengths differ");
    }

    #[test]
    fn parallel_lowering_gives_the_sequential_result() {
        let clean = crate::synthetic::synthetic_bundle(600, 20);
        let (d1, p1) = compile_with(&clean, 1);
        assert!(d1.is_empty(), "{d1:#?}");
        assert!(p1.contains("rule-599"));
        for threads in [2, 3, 4] {
            let (d, p) = compile_with(&clean, threads);
            assert_eq!(d, d1, "{threads} threads");
            same(&p, &p1, threads);
        }
        // Errors in rules that land in different chunks: a duplicate name, a `when:` that does
        // not parse, one that does not type-check, an unknown provider in a tier.
        let broken = clean
            .replace("  - name: rule-300\n", "  - name: rule-299\n")
            .replace("'promptTokens < 8100 &&", "'promptTokens <<< 8100 &&")
            .replace("[\"t450\", \"u450\"]'", "[\"t450\", \"u450\"] && nosuch(1)'")
            .replace(
                "  - name: rule-599\n",
                "  - name: rule-599\n    matches: []\n    route: { consider: [ { models: { names: [model-0] } } ], select: [ { type: Provider, order: [cloud-z] } ] }\n  - name: rule-599-b\n",
            );
        let (d1, p1) = compile_with(&broken, 1);
        assert!(d1.len() >= 4, "{d1:#?}");
        for needle in ["KINF0402", "KINF0204", "KINF0205", "KINF0302"] {
            assert!(
                d1.iter().any(|d| d.contains(needle)),
                "{needle} missing: {d1:#?}"
            );
        }
        for threads in [2, 3, 4] {
            let (d, p) = compile_with(&broken, threads);
            assert_eq!(d, d1, "{threads} threads");
            same(&p, &p1, threads);
        }
    }
}
