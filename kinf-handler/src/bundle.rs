//! What a configuration source hands the server: a [`ConfigBundle`] — the resources as YAML
//! sources plus what only the platform can resolve beside them (pod endpoints of selector-mode
//! worker sets, Secret values). Directory mode ([`crate::config_dir`]) and Kubernetes mode
//! ([`crate::kube`]) both produce bundles; [`crate::gateway::Gateway::apply_bundle`] compiles
//! and applies them the same way (a bundle with errors is not applied; the last good one stays).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kinf_lang::Sources;

use crate::providers::credentials::Secret;
use crate::tenants::identity::KeyFiles;

/// Secret values: `(namespace, name)` → key → value.
pub type SecretValues = BTreeMap<(String, String), BTreeMap<String, Secret>>;

/// Kubernetes mode: a bundle's namespaces are compiled apart when some of them have errors.
/// References never cross a namespace (a pool's destinations, a policy's `targetRefs`, a
/// front door's `pool` all name objects of their own namespace), so a bundle refused for
/// errors in some namespaces can still apply every other namespace's objects, while each
/// refused namespace keeps the objects it has in force
/// ([`crate::policy_store::PolicyStore::apply_resolved`]).
pub trait NamespaceIsolation: Send + Sync + std::fmt::Debug {
    /// Every namespace of the bundle's objects and of the policy in force's.
    fn namespaces(&self) -> BTreeSet<String>;
    /// The namespace of the object a diagnostic of a compilation of `sources` belongs to;
    /// `None` when it belongs to no single object.
    fn namespace_of(&self, d: &kinf_lang::Diagnostic, sources: &Sources) -> Option<String>;
    /// The sources with the namespaces in `kept` holding the objects of the policy in force
    /// (none, for a namespace that has none in force) and every other namespace the
    /// bundle's objects.
    fn merge(&self, kept: &BTreeSet<String>) -> Sources;
    /// The endpoints that the worker sets of the objects in force select, by `namespace/name`,
    /// read when called (the bundle is being applied); `None` when nothing is in force.
    fn endpoints_in_force(&self) -> Option<BTreeMap<String, Vec<String>>>;
    /// Records what applying the bundle put in force ([`crate::ApplyOutcome`]): its objects
    /// (applied or unchanged), the merge (partly applied) or nothing new (refused).
    fn settle(&self, outcome: &crate::ApplyOutcome);
}

/// What a source resolved beside the resources.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// `host:port` of the ready pods of each selector-mode worker set, by `namespace/name`
    /// (Kubernetes mode). Static `endpoints` are in the sources and not repeated here.
    pub endpoints: BTreeMap<String, Vec<String>>,
    /// Secrets referenced by providers (`credentials.secretRef`) and front doors
    /// (`tenants.apiKeys.secretRef`). Empty in directory mode.
    pub secrets: Arc<SecretValues>,
    /// Whether `secretRef`s resolve against [`Resolved::secrets`] (Kubernetes mode); without,
    /// they are refused as unsupported (directory mode).
    pub kubernetes: bool,
    /// Kubernetes mode: the endpoints that the worker sets *of the policy in force* select
    /// among the current pods (their selector and port may differ from the bundle's). When
    /// the bundle is refused and the policy in force is re-applied with the current cluster
    /// state, these are its endpoints: a refused edit of a worker set must not take effect
    /// through them. `None`: the same as [`Resolved::endpoints`].
    pub in_force_endpoints: Option<BTreeMap<String, Vec<String>>>,
    /// Kubernetes mode, before any bundle was in force in this process: the sources of the
    /// last good policy kept in the cluster ([`crate::kube::last_good`]). When this bundle is
    /// refused and no policy is in force, these are compiled (with
    /// [`Resolved::for_policy_in_force`]) and served instead of nothing.
    pub last_good: Option<Sources>,
    /// Kubernetes mode: how to apply the bundle's namespaces without errors when others have
    /// some. `None` (directory mode): a bundle with errors is refused as a whole.
    pub isolation: Option<Arc<dyn NamespaceIsolation>>,
    /// Directory mode: the API key files (`GatewayBackend` `tenants.apiKeys.file`) that the
    /// bundle's front doors name, read and checked by
    /// [`crate::gateway::Gateway::apply_bundle`] before the bundle is applied (the runtime is
    /// built with them as read). They are to directory mode what referenced Secrets are to
    /// Kubernetes mode: a change of their content is a change of the policy (a new
    /// generation). `None` in Kubernetes mode.
    pub key_files: Option<Arc<KeyFiles>>,
    /// Directory mode: a digest of the content of the provider credential files
    /// (`InferenceProvider` `spec.credentials.file`) that the bundle names
    /// ([`crate::config_dir::files_digest`]), so that rotating a provider's key by editing only
    /// its file applies the policy again (the provider pool is rebuilt with the new key).
    /// `None` when the bundle names none, and in Kubernetes mode. Never shown: it hashes secrets.
    pub credential_files: Option<u64>,
}

impl Resolved {
    /// A hash of the endpoints, the secret values, the API key files' and the provider
    /// credential files' content (never logged), so that a change of any re-applies the
    /// policy.
    pub fn fingerprint(&self) -> u64 {
        let mut h = ahash::AHasher::default();
        self.endpoints.hash(&mut h);
        self.in_force_endpoints.hash(&mut h);
        for ((ns, name), data) in self.secrets.iter() {
            ns.hash(&mut h);
            name.hash(&mut h);
            for (k, v) in data {
                k.hash(&mut h);
                v.expose().hash(&mut h);
            }
        }
        if let Some(kf) = &self.key_files {
            kf.fingerprint().hash(&mut h);
        }
        if let Some(d) = self.credential_files {
            d.hash(&mut h);
        }
        h.finish()
    }

    /// Whether anything was resolved beside the resources (endpoints, Secret values, API key
    /// files or provider credential files): only then does [`Resolved::fingerprint`] count in the policy's fingerprint.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
            && self.secrets.is_empty()
            && self.key_files.as_ref().is_none_or(|kf| kf.is_empty())
            && self.credential_files.is_none()
    }

    /// The cluster state to re-apply the policy in force with, when this bundle is refused:
    /// its Secrets, and the endpoints its own worker sets select.
    pub fn for_policy_in_force(&self) -> Resolved {
        let mut r = self.clone();
        if let Some(e) = self.endpoints_in_force() {
            r.endpoints = e;
        }
        r
    }

    /// The endpoints that the worker sets of the policy in force select: read from
    /// [`Resolved::isolation`] when the bundle is applied (a bundle made while the one before
    /// it was being applied would otherwise see the objects in force before that one), else
    /// [`Resolved::in_force_endpoints`].
    fn endpoints_in_force(&self) -> Option<BTreeMap<String, Vec<String>>> {
        match &self.isolation {
            Some(iso) => iso.endpoints_in_force(),
            None => self.in_force_endpoints.clone(),
        }
    }

    /// The cluster state to apply a bundle with when the namespaces in `kept` keep the objects
    /// of the policy in force: their worker sets' endpoints are those the policy in force's
    /// worker sets select, every other one's the bundle's.
    pub fn keeping(&self, kept: &BTreeSet<String>) -> Resolved {
        let Some(in_force) = self.endpoints_in_force() else {
            return self.clone();
        };
        let in_kept = |key: &String| key.split_once('/').is_some_and(|(ns, _)| kept.contains(ns));
        let mut r = self.clone();
        r.endpoints.retain(|k, _| !in_kept(k));
        r.endpoints.extend(
            in_force
                .iter()
                .filter(|(k, _)| in_kept(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        r
    }

    /// The value of one key of a Secret.
    pub fn secret(&self, namespace: &str, name: &str, key: &str) -> Option<&Secret> {
        self.secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .and_then(|d| d.get(key))
    }
}

/// One complete configuration.
#[derive(Clone, Debug, Default)]
pub struct ConfigBundle {
    /// Every resource, as YAML sources (one file per resource in Kubernetes mode, named
    /// `Kind/namespace/name`).
    pub sources: Sources,
    /// Endpoints and Secrets resolved by the source.
    pub resolved: Resolved,
    /// A number the source gives each bundle it publishes (increasing), so that it can find
    /// what the bundle was made of when the outcome comes back.
    pub revision: u64,
}

impl ConfigBundle {
    /// A bundle of sources alone (directory mode).
    pub fn from_sources(sources: Sources) -> Self {
        ConfigBundle {
            sources,
            resolved: Resolved::default(),
            revision: 0,
        }
    }
}

/// The sending side of a source: the newest bundle (older unapplied ones are replaced).
pub type BundleSender = tokio::sync::watch::Sender<Option<Arc<ConfigBundle>>>;

/// What happened to one bundle: it is passed back to the source after each apply.
pub type AfterApply = Arc<
    dyn Fn(
            &Arc<crate::gateway::Gateway>,
            &ConfigBundle,
            &crate::ApplyOutcome,
            &[kinf_lang::Diagnostic],
        ) + Send
        + Sync,
>;

/// A source of configuration bundles (a directory, or the Kubernetes API). It runs until the
/// server stops and publishes each new complete bundle; [`apply_loop`] compiles and applies
/// the newest one through [`crate::gateway::Gateway::apply_bundle`].
pub trait ConfigSource: Send + 'static {
    /// Runs the source, publishing bundles on `tx`.
    fn run(
        self: Box<Self>,
        tx: BundleSender,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

/// Applies every bundle published on `rx` (the newest when several arrived meanwhile): compile
/// on the blocking pool, swap in when it has no errors, run `on_applied` (live ingestion) when
/// the policy in force changed (also when a refused Kubernetes bundle re-applied it with new
/// endpoints), then `after` with the outcome. Returns when the sender is dropped.
pub async fn apply_loop(
    gw: Arc<crate::gateway::Gateway>,
    mut rx: tokio::sync::watch::Receiver<Option<Arc<ConfigBundle>>>,
    on_applied: crate::serve::OnApplied,
    after: Option<AfterApply>,
) {
    while rx.changed().await.is_ok() {
        let Some(bundle) = rx.borrow_and_update().clone() else {
            continue;
        };
        let gw2 = gw.clone();
        let b2 = bundle.clone();
        let before = gw.store.current().map(|a| a.generation);
        let (outcome, diags) = match tokio::task::spawn_blocking(move || gw2.apply_bundle(&b2))
            .await
        {
            Ok(r) => r,
            // A panic while compiling or applying (a bug): the policy in force stays (it is
            // swapped only whole), and the bundle is refused visibly — logged, in `lastRefused`
            // and `/readyz`, counted — rather than dropped without a word.
            Err(e) => {
                let why = panic_message(e);
                tracing::error!(revision = bundle.revision, panic = %why, "applying the bundle panicked: refused, the policy in force stays");
                gw.store.record_refusal(crate::policy_store::Rejected {
                    fingerprint: sources_hash(&bundle.sources),
                    errors: vec![format!(
                        "error: applying the bundle failed inside Kinference (a bug; please report it): {why}"
                    )],
                    codes: Vec::new(),
                    namespaces: None,
                });
                gw.metrics.set_policy_refused(true, 0);
                continue;
            }
        };
        // A refused Kubernetes bundle may still re-apply the policy in force with new
        // endpoints: live ingestion follows whenever the generation in force changed.
        if let Some(applied) = gw.store.current()
            && before != Some(applied.generation)
        {
            on_applied(&gw, &applied.policy);
        }
        if let Some(after) = &after {
            after(&gw, &bundle, &outcome, &diags);
        }
    }
}

/// The message of a task's panic (or why it did not finish).
fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => crate::panic_message(&*p),
        Err(e) => e.to_string(),
    }
}

/// A hash of the sources' names and texts (what directory polling compares, with the API key
/// files they name: [`crate::config_dir::Watch`]).
pub fn sources_hash(sources: &Sources) -> u64 {
    let mut h = FNV_OFFSET;
    for (_, f) in sources.iter() {
        h = fnv(h, f.name.as_bytes());
        h = fnv(h, &[0]);
        h = fnv(h, f.text.as_bytes());
        h = fnv(h, &[0]);
    }
    h
}

/// FNV-1a's offset basis (the hash of nothing).
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, continuing from `h`.
pub(crate) fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// How long a changed configuration directory must read the same before it is published
/// ([`DirSource`]): a file caught mid-save (truncated then written, deleted then created again,
/// a ConfigMap's `..data` swapped before its new files' links exist) reads differently a
/// moment later, and is not applied.
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Directory mode as a [`ConfigSource`]: every `every`, the directory is read
/// ([`crate::config_dir::Watch`]) and published when its content changed since `last`: the
/// content of its YAML files and of every API key file they name (`apiKeys.file`, in the
/// directory or not), so that an edit of a key file alone is applied like an edit of the YAML
/// ([`crate::gateway::Gateway::apply_bundle`] reads and checks the key files before anything
/// is applied). A change is published only once it has settled: read again [`SETTLE`] later,
/// the content is the same (else it is read again at the next poll). A YAML file that cannot
/// be read (or the directory) is published as its error, which refuses the bundle
/// ([`crate::config_dir::read_dir_for_reload`]): the last good policy stays in force.
#[derive(Clone, Debug)]
pub struct DirSource {
    /// The directory (or one file).
    pub dir: std::path::PathBuf,
    /// Polling interval.
    pub every: std::time::Duration,
    /// Hash ([`crate::config_dir::Watch::read`]) of the content already applied, if any.
    pub last: Option<u64>,
}

impl ConfigSource for DirSource {
    fn run(
        self: Box<Self>,
        tx: BundleSender,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            let DirSource {
                dir,
                every,
                mut last,
            } = *self;
            let mut tick = tokio::time::interval(every);
            // Settling takes time of its own: the next poll is `every` after it, not a burst.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let watch = Arc::new(parking_lot::Mutex::new(crate::config_dir::Watch::new(&dir)));
            loop {
                tick.tick().await;
                let w = watch.clone();
                // Two reads at most: a change still under way is read again at the next poll.
                let read =
                    tokio::task::spawn_blocking(move || w.lock().read_settled(last, 2, SETTLE));
                let (sources, h) = match read.await {
                    Ok(Ok(crate::config_dir::Settled::Changed(sources, h))) => (sources, h),
                    Ok(Ok(crate::config_dir::Settled::Unchanged)) | Err(_) => continue,
                    Ok(Ok(crate::config_dir::Settled::Changing)) => {
                        tracing::debug!(
                            "the configuration is changing; it is read again at the next poll"
                        );
                        continue;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "cannot read the configuration; the last good policy stays in force");
                        continue;
                    }
                };
                last = Some(h);
                if tx
                    .send(Some(Arc::new(ConfigBundle::from_sources(sources))))
                    .is_err()
                {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    #[tokio::test]
    async fn a_panics_message_is_what_the_refusal_shows() {
        let e = tokio::task::spawn_blocking(|| panic!("index out of range: {}", 7))
            .await
            .unwrap_err();
        assert_eq!(super::panic_message(e), "index out of range: 7");
        let e = tokio::task::spawn_blocking(|| std::panic::panic_any(3u8))
            .await
            .unwrap_err();
        assert_eq!(super::panic_message(e), "(no message)");
    }
}
