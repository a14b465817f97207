//! Lowering of worker sets and providers into [`Destination`]s.

use std::sync::Arc;
use std::time::Duration;

use kinf_policy::{BackendType, Cost};

use crate::check::Checker;
use crate::codes::Code;
use crate::compiled::*;
use crate::fpath;
use crate::path::FieldPath;

fn cost(c: Option<&Cost>) -> CostInfo {
    c.map(|c| CostInfo {
        uncached_prompt: c.uncached_prompt_per_million.unwrap_or(0.0),
        cached_prompt: c.cached_prompt_per_million.unwrap_or(0.0),
        output: c.output_per_million.unwrap_or(0.0),
        priced: true,
    })
    .unwrap_or_default()
}

/// Reports a `cost.currency` other than `USD` (KINF0414): prices are used as given and every
/// cost (`kinference_tenant_cost_usd_total`, `minimize: Cost`) is counted in US dollars, so a
/// price in another currency is silently taken for dollars. `kind` and `name` name the
/// destination (`worker set`, `w`).
fn check_currency(ck: &mut Checker<'_>, doc: usize, kind: &str, name: &str, c: Option<&Cost>) {
    let Some(currency) = c.and_then(|c| c.currency.as_deref()) else {
        return;
    };
    if currency.trim().eq_ignore_ascii_case("USD") {
        return;
    }
    ck.report(
        doc,
        &fpath!["spec", "cost", "currency"],
        Code::NonUsdCurrency,
        format!(
            "currency `{currency}` of {kind} `{name}` is not converted: its prices are counted \
             as US dollars"
        ),
        "not converted",
        Some(
            "costs are always accounted in USD (`kinference_tenant_cost_usd_total`, \
             `minimize: Cost`): give the prices in US dollars and remove `currency` (or set \
             `currency: USD`)"
                .into(),
        ),
    );
}

fn port(p: u32) -> u16 {
    u16::try_from(p).unwrap_or(u16::MAX)
}

/// Whether `s` looks like `host:port` with a port in 1..=65535.
pub fn valid_endpoint(s: &str) -> bool {
    let Some((host, p)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    // Digits only: `parse` would also take a sign (`+8000`), which no URL can carry.
    host_ok && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|p| p > 0)
}

/// The operators of a Kubernetes label selector's `matchExpressions` (the CRD's enum too).
use kinf_policy::schema::SELECTOR_OPERATORS;

/// Checks one `spec.selector.matchExpressions[i]` as the API server checks selectors of core
/// objects: a known operator; `values` non-empty for `In`/`NotIn`, absent or empty for
/// `Exists`/`DoesNotExist`. (Otherwise the selector would silently select nothing.)
fn check_selector_requirement(
    ck: &mut Checker<'_>,
    doc: usize,
    i: usize,
    operator: &str,
    values: Option<&[String]>,
) {
    let has_values = values.is_some_and(|v| !v.is_empty());
    match operator {
        "In" | "NotIn" if !has_values => {
            let (path, label) = if values.is_some() {
                (
                    fpath!["spec", "selector", "matchExpressions", i, "values"],
                    "empty",
                )
            } else {
                (
                    fpath!["spec", "selector", "matchExpressions", i],
                    "no `values`",
                )
            };
            ck.report(
                doc,
                &path,
                Code::MissingField,
                format!("label-selector operator `{operator}` needs at least one value"),
                label,
                Some("add `values: [...]`, or use `Exists` to match any value".into()),
            );
        }
        "Exists" | "DoesNotExist" if has_values => ck.report(
            doc,
            &fpath!["spec", "selector", "matchExpressions", i, "values"],
            Code::InvalidValue,
            format!("label-selector operator `{operator}` takes no values"),
            "not allowed here",
            Some("remove `values`, or use `In` / `NotIn` to compare values".into()),
        ),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        other => {
            let suggestion = SELECTOR_OPERATORS
                .iter()
                .find(|o| o.eq_ignore_ascii_case(other))
                .map(|o| format!("did you mean `{o}`? "))
                .unwrap_or_default();
            ck.report(
                doc,
                &fpath!["spec", "selector", "matchExpressions", i, "operator"],
                Code::UnknownEnumValue,
                format!("`{other}` is not a label-selector operator"),
                "unknown operator",
                Some(format!(
                    "{suggestion}operators are `In`, `NotIn`, `Exists` and `DoesNotExist`"
                )),
            );
        }
    }
}

pub(crate) fn lower_destinations(ck: &mut Checker<'_>, out: &mut CompiledPolicy) {
    let b = ck.bundle;
    for w in &b.worker_sets {
        let s = &w.spec;
        let doc = w.doc;
        match (&s.selector, s.endpoints.is_empty()) {
            (Some(_), false) => ck.report(doc, &fpath!["spec", "endpoints"], Code::SelectorOrEndpoints,
                format!("worker set `{}` sets both `selector` and `endpoints`", w.name), "conflicts with `selector`",
                Some("use `selector` to find pods in Kubernetes, or `endpoints` for fixed addresses, not both".into())),
            (None, true) => ck.report(doc, &fpath!["spec"], Code::SelectorOrEndpoints,
                format!("worker set `{}` sets neither `selector` nor `endpoints`", w.name), "no workers",
                Some("add `selector: { matchLabels: { app: vllm } }` or `endpoints: [\"10.0.0.1:8000\"]`".into())),
            _ => {}
        }
        for (i, e) in s.endpoints.iter().enumerate() {
            if let Some(first) = s.endpoints[..i]
                .iter()
                .position(|f| f.eq_ignore_ascii_case(e))
            {
                report_repeat(
                    ck,
                    doc,
                    fpath!["spec", "endpoints", i],
                    fpath!["spec", "endpoints", first],
                    format!("endpoint `{e}` is listed twice in worker set `{}`", w.name),
                    "remove the repeated address: listed twice, one worker would be two candidates",
                );
            }
            if !valid_endpoint(e) {
                ck.report(
                    doc,
                    &fpath!["spec", "endpoints", i],
                    Code::InvalidEndpoint,
                    format!("`{e}` is not a `host:port` address"),
                    "invalid address",
                    Some("write `host:port`, e.g. `10.0.0.12:8000` or `[fd00::1]:8000`".into()),
                );
            }
        }
        let interval = ck.positive_duration(
            doc,
            &fpath!["spec", "metrics", "interval"],
            s.metrics.as_ref().and_then(|m| m.interval.as_deref()),
            Duration::from_secs(1),
            "the endpoint would be scraped in a busy loop",
        );
        let mut prior = PerformancePrior::default();
        if let Some(p) = &s.performance {
            if let Some(v) = p.prefill_tokens_per_second.filter(|v| *v > 0.0) {
                prior.prefill_tokens_per_second = v;
            }
            if let Some(v) = p.decode_tokens_per_second.filter(|v| *v > 0.0) {
                prior.decode_tokens_per_second = v;
            }
            prior.overhead = ck_duration(
                ck,
                doc,
                &fpath!["spec", "performance", "overhead"],
                p.overhead.as_deref(),
                prior.overhead,
            );
        }
        let mut selector = Vec::new();
        if let Some(sel) = &s.selector
            && sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
        {
            ck.report(
                doc,
                &fpath!["spec", "selector"],
                Code::EmptySelector,
                format!(
                    "the selector of worker set `{}` is empty: every pod of its namespace \
                     would be scraped, health-checked and sent requests",
                    w.name
                ),
                "selects every pod",
                Some(
                    "select the vLLM pods by a label they carry, e.g. \
                     `selector: { matchLabels: { app: vllm-llama-70b } }`"
                        .into(),
                ),
            );
        }
        if let Some(sel) = &s.selector {
            if let Some(ml) = &sel.match_labels {
                selector.extend(ml.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
                check_selector_requirement(ck, doc, i, &e.operator, e.values.as_deref());
            }
        }
        if let Some(t) = &s.tokenizer
            && t.config_map_ref.is_some()
        {
            let help = if t.path.is_some() {
                "remove it: `tokenizer.path` is the one used"
            } else {
                "mount the tokenizer files into the gateway's pods (or bake them into the image) \
                 and set `tokenizer.path` to their directory"
            };
            ck.report(
                doc,
                &fpath!["spec", "tokenizer", "configMapRef"],
                Code::IgnoredField,
                format!(
                    "`tokenizer.configMapRef` of worker set `{}` is not read: without \
                     `tokenizer.path` its prompts are matched by approximate prefix tracking",
                    w.name
                ),
                "not read",
                Some(help.into()),
            );
        }
        check_currency(ck, doc, "worker set", &w.name, s.cost.as_ref());
        check_model_names(
            ck,
            doc,
            &format!("worker set `{}`", w.name),
            s.models
                .iter()
                .map(|m| (m.name.as_str(), m.aliases.as_slice())),
        );
        let models = s
            .models
            .iter()
            .map(|m| {
                let mut names: Vec<Arc<str>> = vec![m.name.as_str().into()];
                for a in &m.aliases {
                    if !names.iter().any(|n| **n == **a) {
                        names.push(a.as_str().into());
                    }
                }
                ServedModel {
                    upstream: m.name.as_str().into(),
                    client_names: names,
                }
            })
            .collect();
        let id = DestId(out.destinations.len() as u32);
        out.destinations.push(Destination {
            id,
            namespace: w.namespace.clone(),
            name: w.name.clone(),
            backend: BackendType::Local,
            models,
            worker_set: Some(WorkerSetInfo {
                endpoints: s.endpoints.iter().map(|e| Arc::from(e.as_str())).collect(),
                selector,
                port: port(s.port.unwrap_or(8000)),
                kv_events: s.kv_events.as_ref().map(|k| KvEventsInfo {
                    port: k.port.map(port),
                    replay_port: k.replay_port.map(port),
                    topic: k.topic.as_deref().unwrap_or("").into(),
                }),
                metrics_path: s
                    .metrics
                    .as_ref()
                    .and_then(|m| m.path.as_deref())
                    .unwrap_or("/metrics")
                    .into(),
                metrics_interval: interval,
                block_size: s.block_size,
                tokenizer: s
                    .tokenizer
                    .as_ref()
                    .and_then(|t| t.path.as_deref())
                    .map(Arc::from),
                prior,
            }),
            provider: None,
            cost: cost(s.cost.as_ref()),
            source: source_ref(ck, doc),
        });
    }
    for p in &b.providers {
        let s = &p.spec;
        let doc = p.doc;
        let timeout = ck.positive_duration(
            doc,
            &fpath!["spec", "timeout"],
            s.timeout.as_deref(),
            Duration::from_secs(60),
            "every request would time out",
        );
        let expected_ttft = ck_duration(
            ck,
            doc,
            &fpath!["spec", "expectedTtft"],
            s.expected_ttft.as_deref(),
            Duration::from_secs(1),
        );
        let credentials = s.credentials.as_ref().and_then(|c| {
            let set: Vec<&str> = [("secretRef", c.secret_ref.is_some()), ("env", c.env.is_some()), ("file", c.file.is_some())]
                .into_iter()
                .filter_map(|(k, on)| on.then_some(k))
                .collect();
            if set.len() != 1 {
                let (msg, label) = if set.is_empty() {
                    (format!("`credentials` of provider `{}` sets no source", p.name), "no source")
                } else {
                    (format!("`credentials` of provider `{}` sets {} sources: `{}`", p.name, set.len(), set.join("`, `")), "more than one source")
                };
                ck.report_key(doc, &fpath!["spec", "credentials"], Code::CredentialSource, msg, label,
                    Some("set exactly one of `secretRef` (a Kubernetes Secret), `env` (an environment variable) or `file` (a file path); the last two are for standalone mode".into()));
            }
            if let Some(r) = &c.secret_ref {
                Some(CredentialRef::Secret { name: r.name.as_str().into(), key: r.key.as_deref().unwrap_or("apiKey").into() })
            } else if let Some(e) = &c.env {
                Some(CredentialRef::Env(e.as_str().into()))
            } else {
                c.file.as_deref().map(|f| CredentialRef::File(f.into()))
            }
        });
        if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
            ck.report(
                doc,
                &fpath!["spec", "url"],
                Code::InvalidValue,
                format!(
                    "provider URL `{}` must start with `http://` or `https://`",
                    s.url
                ),
                "invalid URL",
                Some(format!(
                    "write the full base URL with its scheme, e.g. `https://{}`",
                    s.url.split("://").last().unwrap_or(&s.url)
                )),
            );
        }
        check_currency(ck, doc, "provider", &p.name, s.cost.as_ref());
        if let Some(field) = s.max_tokens_field
            && s.type_ != kinf_policy::ProviderType::OpenAI
        {
            ck.report_key(
                doc,
                &fpath!["spec", "maxTokensField"],
                Code::IgnoredField,
                format!(
                    "`maxTokensField` of provider `{}` is not read: it names a field of \
                     OpenAI-shaped requests, and this provider is `{:?}`",
                    p.name, s.type_
                ),
                "not read",
                Some(format!(
                    "remove `maxTokensField: {}`: the gateway always sends {:?} the limit in \
                     `{}`",
                    field.as_str(),
                    s.type_,
                    match s.type_ {
                        kinf_policy::ProviderType::Bedrock => "inferenceConfig.maxTokens",
                        _ => "max_tokens",
                    }
                )),
            );
        }
        check_model_names(
            ck,
            doc,
            &format!("provider `{}`", p.name),
            s.models.iter().map(|m| (m.name.as_str(), &[][..])),
        );
        let mut models: Vec<ServedModel> = Vec::new();
        for m in &s.models {
            models.push(ServedModel {
                upstream: m.provider_model.as_str().into(),
                client_names: vec![m.name.as_str().into()],
            });
        }
        let id = DestId(out.destinations.len() as u32);
        out.destinations.push(Destination {
            id,
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            backend: BackendType::Provider,
            models,
            worker_set: None,
            provider: Some(ProviderInfo {
                protocol: s.type_,
                url: s.url.as_str().into(),
                region: s.region.as_deref().map(Arc::from),
                timeout,
                max_concurrency: s.max_concurrency,
                expected_ttft,
                credentials,
                max_tokens_field: s.max_tokens_field,
            }),
            cost: cost(s.cost.as_ref()),
            source: source_ref(ck, doc),
        });
    }
}

/// Reports an entry of a list that repeats an earlier one (KINF0106), at the repeat, with the
/// first shown as related.
fn report_repeat(
    ck: &mut Checker<'_>,
    doc: usize,
    at: FieldPath,
    first: FieldPath,
    msg: String,
    help: &str,
) {
    ck.report(
        doc,
        &at,
        Code::InvalidValue,
        msg,
        "repeated here",
        Some(help.into()),
    );
    let first_span = ck.bundle.value_span(doc, &first);
    ck.relate_last(first_span, "first here");
}

/// Reports a model name or alias that names two models of one destination (`owner`): a
/// request for it would have the destination twice among its candidates. (An alias equal to
/// its own model's name, or repeated within one model, is ignored, as documented.)
fn check_model_names<'m>(
    ck: &mut Checker<'_>,
    doc: usize,
    owner: &str,
    models: impl Iterator<Item = (&'m str, &'m [String])>,
) {
    let mut seen: Vec<(&str, usize, FieldPath)> = Vec::new();
    for (i, (name, aliases)) in models.enumerate() {
        let mut names = vec![(name, fpath!["spec", "models", i, "name"])];
        for (j, a) in aliases.iter().enumerate() {
            if names.iter().all(|(n, _)| *n != a.as_str()) {
                names.push((a.as_str(), fpath!["spec", "models", i, "aliases", j]));
            }
        }
        for (n, path) in names {
            if let Some((_, first_model, first)) = seen.iter().find(|(s, _, _)| *s == n) {
                let first_model = *first_model;
                report_repeat(
                    ck,
                    doc,
                    path,
                    first.clone(),
                    format!(
                        "`{n}` names two models of {owner} (`models[{first_model}]` and `models[{i}]`)"
                    ),
                    "give each model its own names: a request for this name would have the \
                     destination twice among its candidates",
                );
            } else {
                seen.push((n, i, path));
            }
        }
    }
}

fn ck_duration(
    ck: &mut Checker<'_>,
    doc: usize,
    path: &crate::path::FieldPath,
    text: Option<&str>,
    default: Duration,
) -> Duration {
    ck.duration_pub(doc, path, text, default)
}

fn source_ref(ck: &Checker<'_>, doc: usize) -> SourceRef {
    ck.source_ref_pub(doc, &fpath!["metadata", "name"])
}
