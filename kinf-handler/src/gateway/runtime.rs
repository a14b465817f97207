//! What the gateway derives from a compiled policy when it is applied, off the request path:
//! the tokenizer of each client-facing model, the classifiers (built-in and `External`) and
//! request limits of each front door. Swapped in together with the policy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ahash::AHashMap;
use kinf_lang::CompiledPolicy;
use kinf_policy::Quantity;
use kinf_router::classify::Classifiers;
use kinf_router::tokenize::ChatTokenizer;

use crate::policy_store::Applied;

/// Default request body limit when no `GatewayBackend` sets `limits.maxBodyBytes`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;
/// Default most messages per request when no `GatewayBackend` sets `limits.maxMessages`.
pub const DEFAULT_MAX_MESSAGES: u32 = 4096;
/// Default deepest JSON nesting when no `GatewayBackend` sets `limits.maxJsonDepth`.
pub const DEFAULT_MAX_JSON_DEPTH: usize = 64;
/// Deepest JSON nesting the parser accepts at all (serde_json's recursion limit).
pub const MAX_JSON_DEPTH: usize = 128;
/// Default most concurrent streams per tenant (`limits.maxConcurrentStreamsPerTenant`).
pub const DEFAULT_MAX_STREAMS_PER_TENANT: u32 = 1024;

/// One front door's settings, from a `GatewayBackend`.
#[derive(Debug)]
pub struct FrontDoor {
    /// `namespace/name` of the `GatewayBackend` (absent when the bundle declares none).
    pub gateway: Option<Arc<str>>,
    /// Host names it answers for; empty: every host.
    pub hosts: Vec<String>,
    /// `namespace/name` of the pool it serves.
    pub pool: Option<Arc<str>>,
    /// Its built-in classifiers.
    pub classifiers: Classifiers,
    /// Its `External` classifiers, called on the request path before the built-in ones.
    pub external: Vec<super::external::ExternalClassifier>,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Most messages per request.
    pub max_messages: Option<u32>,
    /// Deepest nesting of arrays and objects in a request body.
    pub max_json_depth: usize,
    /// Most streamed responses in flight per identified tenant.
    pub max_streams_per_tenant: u32,
    /// Most prompt tokens per request.
    pub max_prompt_tokens: Option<u64>,
    /// How tenants are identified; `Err`: the identity configuration could not be loaded
    /// (requests are refused rather than served with the wrong tenant).
    pub tenants: Result<crate::tenants::TenantResolver, String>,
    /// The token rate limits of the door's pool.
    pub limiter: Option<Arc<crate::tenants::Limiter>>,
}

/// Where a request goes whose `Host` no front door lists and no door without `hosts` catches
/// (`kinference serve --unknown-hosts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownHosts {
    /// To the first front door (the oldest in Kubernetes mode): single-door deployments that
    /// list hosts keep answering every other name they are reached by (a port-forward, the
    /// Service's DNS name).
    #[default]
    FirstDoor,
    /// Refused with 404 `unknown_host`, as the Gateway API does for a host no listener names.
    Reject,
}

impl std::str::FromStr for UnknownHosts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "first-door" => Ok(UnknownHosts::FirstDoor),
            "reject" => Ok(UnknownHosts::Reject),
            _ => Err(format!("`{s}`: expected `first-door` or `reject`")),
        }
    }
}

/// The policy in force and everything derived from it.
#[derive(Debug)]
pub struct Runtime {
    /// The applied policy.
    pub applied: Arc<Applied>,
    /// Tokenizer per client-facing model name (precise token counts and prefix matching).
    pub tokenizers: AHashMap<Arc<str>, Arc<ChatTokenizer>>,
    /// Front doors; the first is the default for hosts no door names.
    pub doors: Vec<FrontDoor>,
    /// Problems found while deriving (tokenizers that failed to load); shown in status.
    pub problems: Vec<String>,
    /// Where requests for a host no door answers go (a gateway option, not the policy's).
    pub unknown_hosts: UnknownHosts,
}

/// Loaded tokenizers by resolved directory, kept across policy generations.
#[derive(Debug, Default)]
pub struct TokenizerCache {
    loaded: AHashMap<PathBuf, Arc<ChatTokenizer>>,
}

impl TokenizerCache {
    /// The tokenizer in `dir` (`tokenizer.json`, optional `tokenizer_config.json`).
    pub fn load(&mut self, dir: &Path) -> Result<Arc<ChatTokenizer>, String> {
        if let Some(t) = self.loaded.get(dir) {
            return Ok(t.clone());
        }
        let tj = std::fs::read_to_string(dir.join("tokenizer.json"))
            .map_err(|e| format!("cannot read {}/tokenizer.json: {e}", dir.display()))?;
        let tc = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
        let t = ChatTokenizer::from_files_content(&tj, tc.as_deref())
            .map_err(|e| format!("cannot load the tokenizer in {}: {e}", dir.display()))?;
        let t = Arc::new(t);
        self.loaded.insert(dir.to_path_buf(), t.clone());
        Ok(t)
    }
}

fn quantity_bytes(q: &Quantity) -> Option<usize> {
    match q {
        Quantity::Number(n) if *n >= 0.0 => Some(*n as usize),
        Quantity::Number(_) => None,
        Quantity::Text(s) => kinf_grammar::parse_quantity(s)
            .ok()
            .and_then(|n| usize::try_from(n).ok()),
    }
}

/// Why a front door's `tenants.apiKeys.file` is not read in Kubernetes mode.
pub fn key_file_in_kubernetes(file: &str) -> String {
    format!(
        "API keys from file `{file}` are not read in Kubernetes mode (the controller's own files \
         are not for namespace users to authenticate with): put the keys in a Secret of the \
         front door's namespace and use `apiKeys.secretRef`"
    )
}

/// The identity of a front door without `tenants`: none configured, so requests are served
/// anonymously (no key required, keys ignored).
fn anonymous_tenants() -> Result<crate::tenants::TenantResolver, String> {
    crate::tenants::TenantResolver::from_spec_with_keys(
        &kinf_policy::TenantIdentity::default(),
        Vec::new(),
    )
}

impl Runtime {
    /// Derives the runtime of `applied`; relative tokenizer paths are resolved against
    /// `base_dir`.
    pub fn build(
        applied: Arc<Applied>,
        base_dir: &Path,
        cache: &mut TokenizerCache,
        limit_store: &Arc<dyn crate::tenants::LimitStore>,
    ) -> Self {
        Self::build_with_secrets(
            applied,
            base_dir,
            cache,
            limit_store,
            &crate::bundle::SecretValues::new(),
        )
    }

    /// Like [`Runtime::build`]; `tenants.apiKeys.secretRef` is read from `secrets` (Kubernetes
    /// mode: every key of the Secret is a tenant, its value the plain or hashed API key).
    pub fn build_with_secrets(
        applied: Arc<Applied>,
        base_dir: &Path,
        cache: &mut TokenizerCache,
        limit_store: &Arc<dyn crate::tenants::LimitStore>,
        secrets: &crate::bundle::SecretValues,
    ) -> Self {
        Self::build_with_key_files(applied, base_dir, cache, limit_store, secrets, None, false)
    }

    /// Like [`Runtime::build_with_secrets`]; `tenants.apiKeys.file` is taken from `key_files`
    /// when they hold it (directory mode reads and checks them before a bundle is applied, so
    /// that the keys checked are the keys used), else read from `base_dir`. In Kubernetes mode
    /// (`kubernetes`) no key file is read: the resources come from whoever may write a
    /// `GatewayBackend` in a watched namespace, and the controller's own files (its
    /// ServiceAccount token, files mounted for others) are not theirs to authenticate with; such
    /// a front door's identity is an error (every request gets 503).
    pub fn build_with_key_files(
        applied: Arc<Applied>,
        base_dir: &Path,
        cache: &mut TokenizerCache,
        limit_store: &Arc<dyn crate::tenants::LimitStore>,
        secrets: &crate::bundle::SecretValues,
        key_files: Option<&crate::tenants::identity::KeyFiles>,
        kubernetes: bool,
    ) -> Self {
        let policy: &CompiledPolicy = &applied.policy;
        let mut problems = Vec::new();
        let mut tokenizers = AHashMap::new();
        for pool in &policy.pools {
            for (name, targets) in &pool.models {
                for (dest, _) in targets {
                    let Some(ws) = policy
                        .destination(*dest)
                        .and_then(|d| d.worker_set.as_ref())
                    else {
                        continue;
                    };
                    let Some(path) = &ws.tokenizer else { continue };
                    let dir = base_dir.join(&**path);
                    match cache.load(&dir) {
                        Ok(t) => {
                            tokenizers.entry(name.clone()).or_insert(t);
                        }
                        Err(e) => problems.push(e),
                    }
                    break;
                }
            }
        }
        problems.sort();
        problems.dedup();
        let mut doors: Vec<FrontDoor> = policy
            .gateways
            .iter()
            .map(|g| {
                let limits = g.spec.limits.as_ref();
                let tenants = match &g.spec.tenants {
                    Some(t) => (match t.api_keys.as_ref().and_then(|k| k.secret_ref.as_ref()) {
                        Some(r) => secrets
                            .get(&(g.namespace.to_string(), r.name.clone()))
                            .ok_or_else(|| format!("Secret `{}/{}` not found", g.namespace, r.name))
                            .and_then(|data| {
                                crate::tenants::TenantResolver::from_spec_with_keys(
                                    t,
                                    data.iter()
                                        .map(|(k, v)| (k.clone(), v.expose().to_owned()))
                                        .collect(),
                                )
                            }),
                        None => match t.api_keys.as_ref().and_then(|k| k.file.as_deref()) {
                            Some(file) if kubernetes => Err(key_file_in_kubernetes(file)),
                            _ => crate::tenants::TenantResolver::from_spec_with_files(
                                t, base_dir, key_files,
                            ),
                        },
                    })
                    .map_err(|e| {
                        format!(
                            "GatewayBackend {}/{}: tenant identity: {e}",
                            g.namespace, g.name
                        )
                    }),
                    None => anonymous_tenants(),
                };
                if let Err(e) = &tenants {
                    problems.push(e.clone());
                }
                let (external, external_problems) = super::external::ExternalClassifier::from_specs(
                    &g.namespace,
                    &g.name,
                    &g.spec.classifiers,
                );
                problems.extend(
                    external_problems
                        .into_iter()
                        .map(|p| format!("GatewayBackend {}/{}: {p}", g.namespace, g.name)),
                );
                let limiter = policy
                    .pools
                    .get(g.pool)
                    .filter(|p| !p.limits.is_empty())
                    .map(|p| {
                        Arc::new(crate::tenants::Limiter::new(&p.limits, limit_store.clone()))
                    });
                FrontDoor {
                    tenants,
                    limiter,
                    pool: policy
                        .pools
                        .get(g.pool)
                        .map(|p| Arc::from(format!("{}/{}", p.namespace, p.name))),
                    classifiers: Classifiers::from_specs(&g.spec.classifiers),
                    external,
                    max_body_bytes: limits
                        .and_then(|l| l.max_body_bytes.as_ref())
                        .and_then(quantity_bytes)
                        .unwrap_or(DEFAULT_MAX_BODY_BYTES),
                    max_messages: Some(
                        limits
                            .and_then(|l| l.max_messages)
                            .unwrap_or(DEFAULT_MAX_MESSAGES),
                    ),
                    max_json_depth: limits
                        .and_then(|l| l.max_json_depth)
                        .map_or(DEFAULT_MAX_JSON_DEPTH, |d| d as usize)
                        .clamp(1, MAX_JSON_DEPTH),
                    max_streams_per_tenant: limits
                        .and_then(|l| l.max_concurrent_streams_per_tenant)
                        .unwrap_or(DEFAULT_MAX_STREAMS_PER_TENANT),
                    max_prompt_tokens: limits.and_then(|l| l.max_prompt_tokens),
                    gateway: Some(Arc::from(format!("{}/{}", g.namespace, g.name))),
                    hosts: g.spec.hosts.clone(),
                }
            })
            .collect();
        if doors.is_empty() {
            let limiter = (policy.pools.len() == 1)
                .then(|| policy.pools.first())
                .flatten()
                .filter(|p| !p.limits.is_empty())
                .map(|p| Arc::new(crate::tenants::Limiter::new(&p.limits, limit_store.clone())));
            doors.push(FrontDoor {
                tenants: anonymous_tenants(),
                limiter,
                gateway: None,
                hosts: Vec::new(),
                pool: None,
                classifiers: Classifiers::default(),
                external: Vec::new(),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                max_messages: Some(DEFAULT_MAX_MESSAGES),
                max_json_depth: DEFAULT_MAX_JSON_DEPTH,
                max_streams_per_tenant: DEFAULT_MAX_STREAMS_PER_TENANT,
                max_prompt_tokens: None,
            });
        }
        Runtime {
            applied,
            tokenizers,
            doors,
            problems,
            unknown_hosts: UnknownHosts::default(),
        }
    }

    /// The front door for a request's `Host` (port ignored): the first door naming the host,
    /// else the first door that names no hosts, else the first door.
    pub fn door(&self, host: Option<&str>) -> &FrontDoor {
        match self.named_or_catch_all(host) {
            Some(d) => d,
            // `build` always creates at least one door.
            None => &self.doors[0],
        }
    }

    /// Like [`Runtime::door`], but a host that no door names and no door without `hosts`
    /// catches is refused (404 `unknown_host`) under [`UnknownHosts::Reject`].
    pub fn door_for(&self, host: Option<&str>) -> Result<&FrontDoor, super::errors::ApiError> {
        match (self.named_or_catch_all(host), self.unknown_hosts) {
            (Some(d), _) => Ok(d),
            (None, UnknownHosts::FirstDoor) => Ok(self.door(host)),
            (None, UnknownHosts::Reject) => {
                let mut e = super::errors::ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "unknown_host",
                    match host {
                        Some(h) => format!(
                            "no front door answers for host `{h}` (GatewayBackend spec.hosts; \
                             this gateway runs with --unknown-hosts reject)"
                        ),
                        None => "the request names no host, and every front door lists its \
                                 hosts (GatewayBackend spec.hosts; this gateway runs with \
                                 --unknown-hosts reject)"
                            .to_owned(),
                    },
                );
                e.param = Some("host".into());
                Err(e)
            }
        }
    }

    /// The first door naming `host`, else the first door without `hosts`.
    fn named_or_catch_all(&self, host: Option<&str>) -> Option<&FrontDoor> {
        let host = host.map(strip_port);
        if let Some(h) = host
            && let Some(d) = self
                .doors
                .iter()
                .find(|d| d.hosts.iter().any(|x| x.eq_ignore_ascii_case(h)))
        {
            return Some(d);
        }
        self.doors.iter().find(|d| d.hosts.is_empty())
    }
}

/// A `Host` value without its port: `example.com:8080` → `example.com`, `[::1]:8080` →
/// `[::1]`; `[::1]` and `example.com` as they are.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((h, port)) if !port.contains(']') => h,
        _ => host,
    }
}
