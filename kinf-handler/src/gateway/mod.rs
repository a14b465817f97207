//! The HTTP gateway: OpenAI- and Anthropic-compatible endpoints in front of vLLM workers.
//!
//! Per request: read the body (size-limited), parse it ([`parse`]), classify and tokenize it,
//! decide with [`kinf_router::Decider`] on the live [`SharedState`], rewrite the body's model,
//! forward to the chosen endpoint ([`forward`]) and pass the response through, observing
//! first-token time, inter-token gaps and usage on the way ([`sse_tap`]); what was observed
//! feeds the TTFT predictor and the metrics.

pub mod count_tokens;
pub mod errors;
pub mod external;
pub mod forward;
pub mod output_lengths;
pub mod parse;
pub mod runtime;
pub mod sse_tap;
pub mod streams;
pub mod tokens;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::live::SharedState;
use crate::metrics::Metrics;
use crate::policy_store::{ApplyOutcome, PolicyStore};
use crate::tenants::identity::KeyFiles;
use errors::{Api, ApiError};
use runtime::{Runtime, TokenizerCache};

/// Status of the live-state ingestion, for `/admin/status` and `/metrics`; implemented by the
/// ingestion supervisor.
pub trait LiveStatus: Send + Sync {
    /// A JSON view of every endpoint's ingestion state.
    fn status_json(&self) -> serde_json::Value;
    /// Appends ingestion metrics in the text exposition format.
    fn render_metrics(&self, out: &mut String);
}

/// Status of the Kubernetes controller (Kubernetes mode), for `/admin/status`; implemented by
/// [`crate::kube::Controller`].
pub trait ControllerStatus: Send + Sync {
    /// A JSON view of the controller: identity, Lease, watches, Secrets, last bundle.
    fn status_json(&self) -> serde_json::Value;
}

/// Gateway settings.
#[derive(Clone)]
pub struct GatewayOptions {
    /// Directory relative tokenizer paths are resolved against.
    pub base_dir: PathBuf,
    /// Longest wait for an upstream's response headers.
    pub upstream_timeout: Duration,
    /// Where token-rate-limit budgets live (in memory, or Redis shared by replicas).
    pub limit_store: Arc<dyn crate::tenants::LimitStore>,
    /// Longest wait for a client's whole request body (408 past it).
    pub body_read_timeout: Duration,
    /// Kubernetes mode: the namespaces whose Bedrock providers may sign with this process's
    /// own `AWS_*` credentials (`--ambient-aws-credentials`; default none).
    pub ambient_aws: crate::providers::credentials::AmbientAws,
    /// Where a request goes whose host no front door answers (`--unknown-hosts`).
    pub unknown_hosts: runtime::UnknownHosts,
}

impl std::fmt::Debug for GatewayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayOptions")
            .field("base_dir", &self.base_dir)
            .field("upstream_timeout", &self.upstream_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            base_dir: PathBuf::from("."),
            upstream_timeout: Duration::from_secs(600),
            limit_store: Arc::new(crate::tenants::MemoryStore::new()),
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            ambient_aws: crate::providers::credentials::AmbientAws::default(),
            unknown_hosts: runtime::UnknownHosts::default(),
        }
    }
}

/// Default longest wait for a client's whole request body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything a request handler needs.
pub struct Gateway {
    /// Streamed responses in flight per tenant (`limits.maxConcurrentStreamsPerTenant`).
    pub streams: Arc<streams::StreamCounter>,
    /// The policy store (the last good policy and the last refusal).
    pub store: PolicyStore,
    runtime: ArcSwapOption<Runtime>,
    tokenizers: parking_lot::Mutex<TokenizerCache>,
    /// Live cluster state.
    pub state: Arc<SharedState>,
    /// Metrics.
    pub metrics: Metrics,
    /// Ingestion status, when ingestion runs.
    pub live: ArcSwapOption<Box<dyn LiveStatus>>,
    /// The Kubernetes controller's status, in Kubernetes mode.
    pub controller: std::sync::OnceLock<Arc<dyn ControllerStatus>>,
    client: forward::UpstreamClient,
    /// Requests between arrival and response head (decides where large bodies are admitted).
    admitting: std::sync::atomic::AtomicUsize,
    /// Provider clients, rebuilt with each policy (unchanged providers keep their state).
    pub providers: arc_swap::ArcSwap<crate::providers::ProviderPool>,
    /// Shutting down: `/readyz` answers 503 so that load balancers stop sending requests,
    /// while requests still arriving are served.
    draining: std::sync::atomic::AtomicBool,
    /// What requests without `max_tokens` generate, per model (their estimate once known).
    pub output_lengths: output_lengths::OutputLengths,
    options: GatewayOptions,
}

/// How often providers are probed actively (`GET /v1/models`).
pub const PROVIDER_PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Provider credentials. In standalone mode (no Secrets): environment variables, and files with
/// relative paths resolved against the configuration directory. In Kubernetes mode (Secrets
/// given): Secrets only, refusing `env` and `file` (see
/// [`CredentialError::LocalInKubernetes`](crate::providers::credentials::CredentialError::LocalInKubernetes)),
/// and Bedrock's fallback on the process's own `AWS_*` variables outside the namespaces the
/// third field allows (see
/// [`CredentialError::AmbientAwsRefused`](crate::providers::credentials::CredentialError::AmbientAwsRefused)).
struct DirCredentials(
    PathBuf,
    Option<Arc<crate::bundle::SecretValues>>,
    crate::providers::credentials::AmbientAws,
);

impl crate::providers::credentials::CredentialSource for DirCredentials {
    fn aws_env(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<
        Option<crate::providers::credentials::Secret>,
        crate::providers::credentials::CredentialError,
    > {
        if self.1.is_some() && !self.2.allows(namespace) {
            return Err(
                crate::providers::credentials::CredentialError::AmbientAwsRefused(
                    namespace.to_owned(),
                ),
            );
        }
        crate::providers::credentials::StandaloneCredentials.aws_env(namespace, name)
    }

    fn resolve(
        &self,
        namespace: &str,
        r: &kinf_lang::compiled::CredentialRef,
    ) -> Result<crate::providers::credentials::Secret, crate::providers::credentials::CredentialError>
    {
        use crate::providers::credentials::CredentialError;
        match r {
            kinf_lang::compiled::CredentialRef::File(path) if self.1.is_some() => {
                Err(CredentialError::LocalInKubernetes(format!("file `{path}`")))
            }
            kinf_lang::compiled::CredentialRef::Env(var) if self.1.is_some() => Err(
                CredentialError::LocalInKubernetes(format!("environment variable `{var}`")),
            ),
            kinf_lang::compiled::CredentialRef::File(path) => {
                let full = self.0.join(&**path);
                let resolved =
                    kinf_lang::compiled::CredentialRef::File(full.to_string_lossy().into());
                crate::providers::credentials::StandaloneCredentials.resolve(namespace, &resolved)
            }
            kinf_lang::compiled::CredentialRef::Secret { name, key } if self.1.is_some() => self
                .1
                .as_ref()
                .and_then(|s| s.get(&(namespace.to_owned(), name.to_string())))
                .and_then(|d| d.get(&**key))
                .cloned()
                .ok_or_else(|| {
                    crate::providers::credentials::CredentialError::SecretMissing(format!(
                        "{namespace}/{name}/{key}"
                    ))
                }),
            other => crate::providers::credentials::StandaloneCredentials.resolve(namespace, other),
        }
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway with no policy yet.
    pub fn new(options: GatewayOptions) -> Arc<Self> {
        Arc::new(Gateway {
            streams: streams::StreamCounter::new(),
            store: PolicyStore::new(),
            runtime: ArcSwapOption::empty(),
            tokenizers: parking_lot::Mutex::new(TokenizerCache::default()),
            state: SharedState::new(kinf_router::ClusterState::default()),
            metrics: Metrics::new(),
            live: ArcSwapOption::empty(),
            controller: std::sync::OnceLock::new(),
            client: forward::UpstreamClient::new(),
            admitting: std::sync::atomic::AtomicUsize::new(0),
            providers: arc_swap::ArcSwap::from_pointee(
                crate::providers::ProviderPool::from_providers(
                    std::iter::empty(),
                    &crate::providers::credentials::StandaloneCredentials,
                    &crate::providers::PoolOptions::default(),
                    None,
                ),
            ),
            draining: std::sync::atomic::AtomicBool::new(false),
            output_lengths: output_lengths::OutputLengths::default(),
            options,
        })
    }

    /// Starts draining for shutdown: `/readyz` answers 503 (`"draining": true`) from now on;
    /// requests are still served.
    pub fn begin_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Gateway::begin_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The runtime in force.
    pub fn runtime(&self) -> Option<Arc<Runtime>> {
        self.runtime.load_full()
    }

    /// Compiles and applies a bundle. On success the runtime and the cluster state are rebuilt
    /// for the new policy (keeping what was learned about unchanged endpoints); on failure the
    /// last good policy stays in force and the refusal is recorded
    /// ([`PolicyStore::last_rejected`]).
    ///
    /// Directory mode (a bundle not from Kubernetes): the API key files that the bundle's front
    /// doors name (`tenants.apiKeys.file`) are read first, and one that cannot be read or
    /// parsed refuses the bundle like an error in its YAML. Their content is part of the
    /// policy as referenced Secrets are in Kubernetes mode
    /// ([`crate::bundle::Resolved::key_files`]): an edit of a key file alone applies the
    /// policy again (a new generation, the runtime built with their new content), and while a
    /// bundle is refused the policy in force is applied again with the new content of its own
    /// key files.
    pub fn apply(&self, sources: &kinf_lang::Sources) -> ApplyOutcome {
        self.apply_resolved(sources, &crate::bundle::Resolved::default())
            .0
    }

    /// Applies a bundle from a [`crate::bundle::ConfigSource`] (see [`Gateway::apply`]); also
    /// returns the compilation's diagnostics.
    pub fn apply_bundle(
        &self,
        bundle: &crate::bundle::ConfigBundle,
    ) -> (ApplyOutcome, Vec<kinf_lang::Diagnostic>) {
        self.apply_resolved(&bundle.sources, &bundle.resolved)
    }

    fn apply_resolved(
        &self,
        sources: &kinf_lang::Sources,
        resolved: &crate::bundle::Resolved,
    ) -> (ApplyOutcome, Vec<kinf_lang::Diagnostic>) {
        // Directory mode: the key files are read once, checked, and used as read.
        let with_key_files;
        let resolved = if resolved.kubernetes {
            resolved
        } else {
            let kf = KeyFiles::read(
                &self.options.base_dir,
                crate::config_dir::key_files(sources),
            );
            let errors = kf.errors();
            if !errors.is_empty() {
                return self.refuse_for_key_files(sources, resolved, errors);
            }
            with_key_files = crate::bundle::Resolved {
                key_files: Some(Arc::new(kf)),
                credential_files: crate::config_dir::files_digest(
                    &self.options.base_dir,
                    &crate::config_dir::credential_files(sources),
                ),
                ..resolved.clone()
            };
            &with_key_files
        };
        let (outcome, diagnostics) = self.store.apply_resolved(sources, resolved);
        let result = match &outcome {
            ApplyOutcome::Applied { .. } => "applied",
            ApplyOutcome::Unchanged => "unchanged",
            ApplyOutcome::Refused { .. } => "refused",
            ApplyOutcome::PartlyApplied { .. } => "partly_applied",
        };
        self.metrics.policy_reload(result);
        match &outcome {
            ApplyOutcome::Applied { generation } => {
                self.install_current(resolved);
                tracing::info!(generation, "policy applied");
                self.metrics.set_policy_generation(*generation);
                self.metrics.set_policy_refused(false, 0);
            }
            ApplyOutcome::Unchanged => {
                self.metrics.set_policy_refused(false, 0);
            }
            ApplyOutcome::PartlyApplied {
                generation,
                changed,
                errors,
                namespaces,
            } => {
                self.log_refused_errors();
                tracing::error!(
                    errors,
                    namespaces = %namespaces.join(","),
                    "policy bundle refused in these namespaces; they keep the objects in force, \
                     every other namespace's are applied"
                );
                if *changed {
                    self.install_current(resolved);
                    tracing::info!(generation, "policy applied (partly)");
                    self.metrics.set_policy_generation(*generation);
                }
                self.metrics.set_policy_refused(true, namespaces.len());
            }
            ApplyOutcome::Refused { errors } => {
                self.log_refused_errors();
                tracing::error!(
                    errors,
                    "policy bundle refused; the last good policy stays in force"
                );
                self.metrics.set_policy_refused(true, 0);
                let broken = self.reapply_in_force(resolved);
                if !broken.is_empty() {
                    for e in &broken {
                        tracing::error!("{e}");
                    }
                    tracing::error!(
                        errors = broken.len(),
                        "an API key file of the policy in force cannot be loaded; its keys in \
                         force stay"
                    );
                    // The refusal shown names them too (the store records the YAML's errors).
                    if let Some(r) = self.store.last_rejected() {
                        let mut r = (*r).clone();
                        r.errors.extend(broken);
                        self.store.record_refusal(r);
                    }
                }
            }
        }
        (outcome, diagnostics)
    }

    /// Directory mode: refuses a bundle one of whose API key files cannot be read or parsed,
    /// as a bundle with errors in its YAML is refused: nothing of it is applied, the policy in
    /// force stays (applied again when its own key files changed and load:
    /// [`Gateway::reapply_in_force`]), and the errors (the key files', then the YAML's own,
    /// then those of key files of the policy in force that the bundle does not name, if any)
    /// are logged, recorded in the store for `/readyz` and `/admin/status` (`lastRefused`,
    /// [`PolicyStore::record_refusal`]) and counted.
    fn refuse_for_key_files(
        &self,
        sources: &kinf_lang::Sources,
        resolved: &crate::bundle::Resolved,
        key_errors: Vec<String>,
    ) -> (ApplyOutcome, Vec<kinf_lang::Diagnostic>) {
        // Compiled only to report the YAML's own errors along with the key files'.
        let c = kinf_lang::compile(sources);
        let yaml_errors = c
            .diagnostics
            .iter()
            .filter(|d| d.severity == kinf_lang::Severity::Error);
        let codes = yaml_errors.clone().map(|d| d.code.as_str()).collect();
        let mut errors = key_errors;
        errors.extend(yaml_errors.map(|d| d.render_plain(sources)));
        for e in self.reapply_in_force(resolved) {
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
        let count = errors.len();
        self.store.record_refusal(crate::policy_store::Rejected {
            fingerprint: crate::bundle::sources_hash(sources),
            errors,
            codes,
            namespaces: None,
        });
        self.metrics.policy_reload("refused");
        self.log_refused_errors();
        tracing::error!(
            errors = count,
            "policy bundle refused; the last good policy stays in force"
        );
        self.metrics.set_policy_refused(true, 0);
        (ApplyOutcome::Refused { errors: count }, c.diagnostics)
    }

    /// The newest bundle refused: the sources in force are compiled again with what is
    /// resolved now, and applied (a new generation, the runtime rebuilt) when that changed
    /// them, so that pod changes and rotated or revoked keys are not frozen by an unrelated
    /// error. Kubernetes mode: with the refused bundle's endpoints and Secret values
    /// ([`PolicyStore::reapply_in_force`]). Directory mode: with the API key files that the
    /// policy in force names, read again; returns what is wrong with those that cannot be
    /// loaded (nothing is applied again then; not logged here).
    fn reapply_in_force(&self, resolved: &crate::bundle::Resolved) -> Vec<String> {
        let with_key_files;
        let resolved = if resolved.kubernetes {
            resolved
        } else {
            let Some(applied) = self.store.current() else {
                return Vec::new();
            };
            let kf = KeyFiles::read(
                &self.options.base_dir,
                crate::tenants::identity::key_files_named(
                    applied.policy.gateways.iter().map(|g| &g.spec),
                ),
            );
            let errors = kf.errors();
            if !errors.is_empty() {
                return errors;
            }
            with_key_files = crate::bundle::Resolved {
                key_files: Some(Arc::new(kf)),
                credential_files: crate::config_dir::files_digest(
                    &self.options.base_dir,
                    &crate::config_dir::credential_files(&applied.sources),
                ),
                ..resolved.clone()
            };
            &with_key_files
        };
        if let Some(ApplyOutcome::Applied { generation }) = self.store.reapply_in_force(resolved) {
            self.install_current(resolved);
            tracing::info!(
                generation,
                "the policy in force was re-applied with the current endpoints, Secrets and \
                 API key files"
            );
            self.metrics.set_policy_generation(generation);
        }
        Vec::new()
    }

    /// Logs each error of the recorded refusal.
    fn log_refused_errors(&self) {
        if let Some(r) = self.store.last_rejected() {
            for e in &r.errors {
                tracing::error!("{e}");
            }
        }
    }

    /// Rebuilds the runtime, the cluster state and the provider pool for the policy in force
    /// (after it was swapped in), with the Secret values and the API key files of `resolved`
    /// (directory mode: read and checked before the policy was applied).
    fn install_current(&self, resolved: &crate::bundle::Resolved) {
        if let Some(applied) = self.store.current() {
            let mut rt = Runtime::build_with_key_files(
                applied.clone(),
                &self.options.base_dir,
                &mut self.tokenizers.lock(),
                &self.options.limit_store,
                &resolved.secrets,
                resolved.key_files.as_deref(),
                resolved.kubernetes,
            );
            rt.unknown_hosts = self.options.unknown_hosts;
            for p in &rt.problems {
                tracing::warn!(problem = %p, "policy runtime");
            }
            self.state.with(|st| {
                let mut fresh = kinf_router::ClusterState::from_policy(&applied.policy, 32);
                fresh.carry_over_from(std::mem::take(st));
                *st = fresh;
            });
            self.runtime.store(Some(Arc::new(rt)));
            let previous = self.providers.load_full();
            let pool = Arc::new(crate::providers::ProviderPool::from_policy(
                &applied.policy,
                &DirCredentials(
                    self.options.base_dir.clone(),
                    resolved.kubernetes.then(|| resolved.secrets.clone()),
                    self.options.ambient_aws.clone(),
                ),
                &crate::providers::PoolOptions::default(),
                Some(&previous),
            ));
            if tokio::runtime::Handle::try_current().is_ok() {
                pool.spawn_prober(PROVIDER_PROBE_INTERVAL);
            }
            self.providers.store(pool);
            for w in &applied.warnings {
                tracing::warn!("{w}");
            }
        }
    }

    /// The client-facing routes (`/v1/*`, `/healthz` (also as vLLM's `/health`), `/readyz`);
    /// unknown paths and methods get a 404 or 405 in the caller's shape.
    pub fn router(self: &Arc<Self>) -> Router {
        with_error_fallbacks(self.client_routes())
    }

    fn client_routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/v1/messages", post(messages))
            .route(count_tokens::PATH, post(count_tokens_route))
            .route("/v1/models", get(models))
            // Model names may contain `/` (`meta-llama/Llama-3.1-8B`): the rest of the path.
            .route("/v1/models/{*id}", get(model))
            .route("/healthz", get(healthz))
            // vLLM's liveness path, which clients such as GuideLLM probe before a run.
            .route("/health", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(self.clone())
    }

    /// The client-facing routes plus `/admin/status` and `/metrics` (when no separate admin
    /// listener is used). With an admin listener, `/metrics` (which carries every tenant's
    /// usage and cost) is served there only, so that clients cannot read other tenants' usage.
    pub fn router_with_admin(self: &Arc<Self>) -> Router {
        with_error_fallbacks(
            self.client_routes().merge(
                Router::new()
                    .route("/admin/status", get(admin_status))
                    .route("/metrics", get(metrics))
                    .with_state(self.clone()),
            ),
        )
    }

    /// The admin routes (`/admin/status`, plus `/healthz`, `/readyz`, `/metrics`).
    pub fn admin_router(self: &Arc<Self>) -> Router {
        with_error_fallbacks(
            Router::new()
                .route("/admin/status", get(admin_status))
                .route("/healthz", get(healthz))
                .route("/readyz", get(readyz))
                .route("/metrics", get(metrics))
                .with_state(self.clone()),
        )
    }
}

/// `router` with a 404 for unknown paths and a 405 (axum adds `Allow`) for unsupported
/// methods, each with an error body in the caller's shape. Added last: the 405 fallback
/// applies to the routes registered before it.
fn with_error_fallbacks(router: Router) -> Router {
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_request(authority_as_host))
}

/// HTTP/2 carries the host in the `:authority` pseudo-header (the request URI), and clients
/// send no `Host` header with it: copy it into `Host` so that the front door is chosen by host
/// on HTTP/2 as on HTTP/1.1. A `Host` the client did send is kept.
async fn authority_as_host(mut req: axum::extract::Request) -> axum::extract::Request {
    if !req.headers().contains_key(header::HOST)
        && let Some(a) = req.uri().authority()
        // Without any `user@` (not a host, and not allowed in `:authority` anyway).
        && let Some(h) = a.as_str().rsplit('@').next()
        && let Ok(v) = axum::http::HeaderValue::from_str(h)
    {
        req.headers_mut().insert(header::HOST, v);
    }
    req
}

/// The error shape for a path no handler answered: Anthropic under `/v1/messages`, else
/// OpenAI.
fn shape_of(path: &str) -> Api {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Api::Messages
    } else {
        Api::Chat
    }
}

async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no such endpoint: {method} {path}"),
    )
    .into_response_for(shape_of(path))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{path} does not accept {method}; the `allow` header lists what it accepts"),
    )
    .into_response_for(shape_of(path))
}

async fn count_tokens_route(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    count_tokens::handle(gw, headers, body).await
}

async fn chat(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    forward::handle(gw, Api::Chat, headers, body).await
}

async fn completions(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    forward::handle(gw, Api::Completions, headers, body).await
}

async fn messages(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    forward::handle(gw, Api::Messages, headers, body).await
}

/// The pools the front door of `headers` serves: its pool, else every pool; 404
/// `unknown_host` for a host no door answers under `--unknown-hosts reject`.
fn door_pools<'a>(
    rt: &'a Runtime,
    headers: &HeaderMap,
) -> Result<Vec<&'a kinf_lang::compiled::CompiledPool>, ApiError> {
    let door = rt.door_for(host(headers))?;
    let policy = &rt.applied.policy;
    let pool = match &door.pool {
        Some(p) => p.split_once('/').and_then(|(ns, n)| policy.pool(ns, n)),
        None => policy.find_pool(None),
    };
    Ok(match pool {
        Some(p) => vec![p],
        None => policy.pools.iter().collect(),
    })
}

/// Every client-facing name (model names and aliases) of `pools`, sorted, without duplicates.
fn model_names<'a>(pools: &[&'a kinf_lang::compiled::CompiledPool]) -> Vec<&'a str> {
    let mut names: Vec<&str> = pools.iter().flat_map(|p| p.model_names()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The smallest `max_model_len` that the workers behind client-facing `name` report (read by
/// live ingestion into the decision state, [`kinf_router::state::WorkerSetState::context_limit`],
/// which routing uses too), over every worker set of `pools` serving it; `None` when none
/// reported one (or it is served by providers only, or ingestion does not run).
fn max_model_len(
    state: &kinf_router::ClusterState,
    policy: &kinf_lang::CompiledPolicy,
    pools: &[&kinf_lang::compiled::CompiledPool],
    name: &str,
) -> Option<u64> {
    pools
        .iter()
        .filter_map(|p| p.models.get(name))
        .flatten()
        .filter_map(|(dest, upstream)| {
            let d = policy.destinations.get(dest.0 as usize)?;
            d.worker_set.as_ref()?;
            state
                .worker_set(&d.namespace, &d.name)?
                .context_limit(upstream)
        })
        .min()
}

/// The OpenAI model object of `name`, with vLLM's `max_model_len` when the workers reported
/// one.
fn model_object(name: &str, max_model_len: Option<u64>) -> serde_json::Value {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut o =
        json!({"id": name, "object": "model", "created": created, "owned_by": "kinference"});
    if let (Some(n), Some(m)) = (max_model_len, o.as_object_mut()) {
        m.insert("max_model_len".into(), n.into());
    }
    o
}

/// Whether a request on a path both APIs share (`/v1/models`) comes from an Anthropic client:
/// Anthropic's API requires `anthropic-version` on every request (its SDKs always send it),
/// OpenAI's clients never send it.
fn anthropic_client(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

/// The API whose shapes a `/v1/models` request gets: Anthropic's for an Anthropic client
/// ([`anthropic_client`]), else OpenAI's.
fn models_api(headers: &HeaderMap) -> Api {
    if anthropic_client(headers) {
        Api::Messages
    } else {
        Api::Chat
    }
}

/// `created_at` of Anthropic model objects: when the model was released, which the gateway
/// does not know; Anthropic's API documents the epoch for an unknown date.
const ANTHROPIC_UNKNOWN_DATE: &str = "1970-01-01T00:00:00Z";

/// Anthropic's model object (`ModelInfo`) of client-facing `name`.
fn anthropic_model_object(name: &str) -> serde_json::Value {
    json!({
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": ANTHROPIC_UNKNOWN_DATE,
    })
}

/// Default and largest page of Anthropic's `GET /v1/models` (its `limit`).
const ANTHROPIC_PAGE: (usize, usize) = (20, 1000);

/// One page of Anthropic's `GET /v1/models` over the sorted `names`: `limit` (1 to 1000,
/// default 20) names after `after_id` or before `before_id` (a cursor need not be listed any
/// more: the page starts where it would sort), with `has_more`, `first_id` and `last_id`.
fn anthropic_models_page(
    names: &[&str],
    query: &std::collections::HashMap<String, String>,
) -> Result<serde_json::Value, ApiError> {
    let limit = match query.get("limit") {
        None => ANTHROPIC_PAGE.0,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=ANTHROPIC_PAGE.1).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!(
                        "`limit` must be an integer from 1 to {}, not `{v}`",
                        ANTHROPIC_PAGE.1
                    ),
                )
            })?,
    };
    let at = |id: &str| match names.binary_search(&id) {
        Ok(i) | Err(i) => i,
    };
    let (page, has_more) = match (query.get("after_id"), query.get("before_id")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "before_id",
                "give `after_id` or `before_id`, not both",
            ));
        }
        (None, Some(before)) => {
            let end = at(before);
            let start = end.saturating_sub(limit);
            (&names[start..end], start > 0)
        }
        (after, None) => {
            let start = after.map_or(0, |a| {
                let i = at(a);
                i + usize::from(names.get(i) == Some(&a.as_str()))
            });
            let end = start.saturating_add(limit).min(names.len());
            (&names[start..end], end < names.len())
        }
    };
    Ok(json!({
        "data": page.iter().map(|n| anthropic_model_object(n)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": page.first(),
        "last_id": page.last(),
    }))
}

/// `GET /v1/models`: every client-facing name (model names and aliases) of the front door's
/// pool, sorted; in Anthropic's Models API shape, paginated, for an Anthropic client
/// ([`anthropic_client`]).
async fn models(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    query: Result<
        axum::extract::Query<std::collections::HashMap<String, String>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Response {
    let api = models_api(&headers);
    let Some(rt) = gw.runtime() else {
        return not_ready(api);
    };
    let pools = match door_pools(&rt, &headers) {
        Ok(p) => p,
        Err(e) => return e.into_response_for(api),
    };
    if api == Api::Messages {
        let page = query
            .map_err(|e| ApiError::invalid("query", format!("the query is invalid: {e}")))
            .and_then(|q| anthropic_models_page(&model_names(&pools), &q.0));
        return match page {
            Ok(page) => axum::Json(page).into_response(),
            Err(e) => e.into_response_for(api),
        };
    }
    let data: Vec<_> = gw.state.with(|st| {
        model_names(&pools)
            .into_iter()
            .map(|n| model_object(n, max_model_len(st, &rt.applied.policy, &pools, n)))
            .collect()
    });
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}` (OpenAI `models.retrieve`, Anthropic `models.retrieve` for an
/// Anthropic client): the model object of a name `/v1/models` lists, else 404
/// `model_not_found`.
async fn model(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    id: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let api = models_api(&headers);
    let Some(rt) = gw.runtime() else {
        return not_ready(api);
    };
    let id = match id {
        Ok(axum::extract::Path(id)) => id,
        Err(e) => {
            return ApiError::invalid("model", format!("the model id in the path is invalid: {e}"))
                .into_response_for(api);
        }
    };
    let pools = match door_pools(&rt, &headers) {
        Ok(p) => p,
        Err(e) => return e.into_response_for(api),
    };
    let names = model_names(&pools);
    if names.binary_search(&id.as_str()).is_ok() {
        if api == Api::Messages {
            return axum::Json(anthropic_model_object(&id)).into_response();
        }
        let len = gw
            .state
            .with(|st| max_model_len(st, &rt.applied.policy, &pools, &id));
        return axum::Json(model_object(&id, len)).into_response();
    }
    let mut shown = names;
    shown.truncate(20);
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        "model_not_found",
        format!(
            "the model `{id}` does not exist; available: {}",
            shown.join(", ")
        ),
    );
    e.param = Some("model".into());
    e.into_response_for(api)
}

async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: 200 once a policy is in force; the body says which generation and whether
/// the newest bundle was refused (with its errors).
async fn readyz(State(gw): State<Arc<Gateway>>) -> Response {
    let current = gw.store.current();
    let rejected = gw.store.last_rejected();
    let draining = gw.is_draining();
    let ready = current.is_some() && !draining;
    let mut body = json!({
        "ready": ready,
        "generation": current.as_ref().map(|c| c.generation),
        "lastRefused": rejected.as_ref().map(refusal_json),
    });
    if draining {
        body["draining"] = json!(true);
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// The last refusal as `/readyz` and `/admin/status` show it: its errors and codes, and in
/// Kubernetes mode the refused namespaces when every other namespace was applied.
fn refusal_json(r: &Arc<crate::policy_store::Rejected>) -> serde_json::Value {
    let mut v = json!({"errors": r.errors, "codes": r.codes});
    if let Some(ns) = &r.namespaces {
        v["namespaces"] = json!(ns);
    }
    v
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut out = String::with_capacity(8192);
    gw.metrics.sample_state(&gw.state);
    gw.metrics.render(&mut out);
    if let Some(live) = gw.live.load_full() {
        live.render_metrics(&mut out);
    }
    render_limiter_metrics(&gw.options.limit_store.stats().snapshot(), &mut out);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// The token-rate limiter's counters in the text exposition format.
fn render_limiter_metrics(s: &crate::tenants::StoreStatsSnapshot, out: &mut String) {
    use std::fmt::Write as _;
    for (name, help, v) in [
        (
            "kinference_ratelimit_admitted_total",
            "Requests admitted by the limiter (at least one limit applying).",
            s.admitted,
        ),
        (
            "kinference_ratelimit_rejected_total",
            "Requests refused with 429 by a limit.",
            s.rejected,
        ),
        (
            "kinference_ratelimit_store_errors_total",
            "Failed limiter store operations (Redis unreachable or erroring).",
            s.redis_errors,
        ),
        (
            "kinference_ratelimit_fail_open_total",
            "Requests admitted unlimited because the store failed (fail mode open).",
            s.fail_open_admits,
        ),
        (
            "kinference_ratelimit_fail_closed_total",
            "Requests refused with 503 because the store failed (fail mode closed).",
            s.fail_closed_rejects,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
}

/// `GET /admin/status`: the policy in force, the last refusal, runtime problems, every
/// endpoint's state and the ingestion status.
async fn admin_status(State(gw): State<Arc<Gateway>>) -> Response {
    let current = gw.store.current();
    let rejected = gw.store.last_rejected();
    let rt = gw.runtime();
    let endpoints = gw.state.with(|st| {
        let mut v: Vec<serde_json::Value> = st
            .worker_sets
            .iter()
            .flat_map(|(k, ws)| {
                ws.endpoints.iter().map(move |e| {
                    json!({
                        "workerSet": &**k,
                        "endpoint": &*e.address,
                        "ready": e.ready,
                        "stale": e.stale,
                        "prefixTracking": ws.prefix.mode(),
                        "blockSize": ws.block_size,
                        "ttftObservations": e.ttft.observations(),
                    })
                })
            })
            .collect();
        v.sort_by_key(|x| x.to_string());
        v
    });
    let body = json!({
        "policy": current.as_ref().map(|c| json!({
            "generation": c.generation,
            "fingerprint": format!("{:016x}", c.fingerprint),
            "warnings": c.warnings,
        })),
        "lastRefused": rejected.as_ref().map(refusal_json),
        "problems": rt.as_ref().map(|r| r.problems.clone()).unwrap_or_default(),
        "tokenizers": rt.as_ref().map(|r| {
            let mut v: Vec<&str> = r.tokenizers.keys().map(|k| &**k).collect();
            v.sort_unstable();
            v.into_iter().map(str::to_owned).collect::<Vec<_>>()
        }).unwrap_or_default(),
        "endpoints": endpoints,
        "outputEstimates": gw.output_lengths.snapshot().into_iter().map(|(model, l)| json!({
            "model": &*model,
            "meanOutputTokens": l.mean,
            "observations": l.observations,
            "estimate": l.estimate(),
        })).collect::<Vec<_>>(),
        "ingestion": gw.live.load_full().map(|l| l.status_json()),
        "kubernetes": gw.controller.get().map(|c| c.status_json()),
    });
    axum::Json(body).into_response()
}

/// The `Host` header.
pub(crate) fn host(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

pub(crate) fn not_ready(api: Api) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "no policy is in force yet; see /readyz",
    )
    .into_response_for(api)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::providers::credentials::{AmbientAws, CredentialError, CredentialSource};
    use kinf_lang::compiled::CredentialRef;

    #[test]
    fn kubernetes_mode_reads_provider_credentials_from_secrets_only() {
        let dir = std::env::temp_dir().join(format!("kinf-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "controller-service-account-token\n").unwrap();
        let file = CredentialRef::File(dir.join("token").to_string_lossy().into());
        let env = CredentialRef::Env("PATH".into());
        // Standalone: the operator's own files and environment.
        let standalone = DirCredentials(dir.clone(), None, AmbientAws::Nowhere);
        assert_eq!(
            standalone.resolve("llm", &file).unwrap().expose(),
            "controller-service-account-token"
        );
        assert!(standalone.resolve("llm", &env).is_ok());
        // Kubernetes: whoever writes an InferenceProvider must not make the controller read
        // its own token or environment and send it to the provider's URL.
        let mut secrets = crate::bundle::SecretValues::new();
        secrets.insert(
            ("llm".into(), "keys".into()),
            [(
                "apiKey".to_owned(),
                crate::providers::credentials::Secret::new("sk-1"),
            )]
            .into(),
        );
        let kube = DirCredentials(dir.clone(), Some(Arc::new(secrets)), AmbientAws::Nowhere);
        for r in [&file, &env] {
            let e = kube.resolve("llm", r).unwrap_err();
            assert!(matches!(e, CredentialError::LocalInKubernetes(_)), "{e}");
            assert!(e.to_string().contains("credentials.secretRef"), "{e}");
        }
        let secret = CredentialRef::Secret {
            name: "keys".into(),
            key: "apiKey".into(),
        };
        assert_eq!(kube.resolve("llm", &secret).unwrap().expose(), "sk-1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kubernetes_mode_signs_bedrock_with_the_controllers_aws_identity_only_where_allowed() {
        use crate::providers::credentials::resolve_aws;
        let dir = std::env::temp_dir();
        let kube = |ambient| {
            DirCredentials(
                dir.clone(),
                Some(Arc::new(crate::bundle::SecretValues::new())),
                ambient,
            )
        };
        // No `credentials`, and `env: AWS_ACCESS_KEY_ID` (which reads the standard trio):
        // both fall back on the process's own AWS identity.
        let standard = CredentialRef::Env("AWS_ACCESS_KEY_ID".into());
        for r in [None, Some(&standard)] {
            let e = resolve_aws(&kube(AmbientAws::Nowhere), "team-a", r).unwrap_err();
            assert_eq!(e, CredentialError::AmbientAwsRefused("team-a".into()));
            assert!(
                e.to_string().contains("--ambient-aws-credentials team-a"),
                "{e}"
            );
            assert!(e.to_string().contains("credentials.secretRef"), "{e}");
            let only_b = kube(AmbientAws::parse("team-b").unwrap());
            assert_eq!(
                resolve_aws(&only_b, "team-a", r).unwrap_err(),
                CredentialError::AmbientAwsRefused("team-a".into())
            );
            // Allowed: the variables are read (what they hold is the environment's business;
            // a refusal would come before any read).
            for allowed in [
                kube(AmbientAws::parse("team-a").unwrap()),
                kube(AmbientAws::Everywhere),
            ] {
                assert!(
                    !matches!(
                        resolve_aws(&allowed, "team-a", r),
                        Err(CredentialError::AmbientAwsRefused(_))
                    ),
                    "refused although allowed"
                );
            }
        }
        // Standalone: one operator writes the whole configuration; the fallback stays.
        let standalone = DirCredentials(dir.clone(), None, AmbientAws::Nowhere);
        assert!(!matches!(
            resolve_aws(&standalone, "team-a", None),
            Err(CredentialError::AmbientAwsRefused(_))
        ));
    }
}
